// Row losses of a model's training step (include/fusex_loss.h): one warp a
// row, each lane a strided slice of its classes, combined by a butterfly so
// that every lane holds the same bits and a row's sums follow one fixed
// order (the same losses and gradients run after run).
#include "cuda/common.cuh"
#include "cuda/families.h"
#include "cuda/launch.cuh"
#include "fusex_loss.h"

namespace fx::cuda {

constexpr int kLossThreads = 256;
constexpr int kRowsPerBlock = kLossThreads / 32;

template <typename T> __device__ __forceinline__ T warp_total(T v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

template <typename T> __device__ __forceinline__ T warp_top(T v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v = fmax(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

// Accumulates in double for f64 rows and in f32 for f32 rows (the CUDA
// kernels' rule); the host sums the rows in f64.
template <typename T>
__global__ void mse_rows_kernel(const T *__restrict__ y, const T *__restrict__ t, T *__restrict__ row_loss,
                                T *__restrict__ dy, T grad_scale, int64_t rows, int64_t classes)
{
    const int64_t row = blockIdx.x * (int64_t)kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const T *yr = y + row * classes, *tr = t + row * classes;
    T sum = 0;
    for (int64_t c = lane; c < classes; c += 32) {
        const T d = yr[c] - tr[c];
        sum += d * d;
        if (dy)
            dy[row * classes + c] = grad_scale * (T)2 * d;
    }
    sum = warp_total(sum);
    if (lane == 0)
        row_loss[row] = sum;
}

template <typename T>
__global__ void cross_entropy_rows_kernel(const T *__restrict__ y, const int32_t *__restrict__ labels,
                                          T *__restrict__ row_loss, T *__restrict__ dy, T grad_scale,
                                          int64_t rows, int64_t classes)
{
    const int64_t row = blockIdx.x * (int64_t)kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const T *yr = y + row * classes;
    T top = -INFINITY;
    for (int64_t c = lane; c < classes; c += 32)
        top = fmax(top, yr[c]);
    top = warp_top(top);
    T total = 0;
    for (int64_t c = lane; c < classes; c += 32)
        total += exp(yr[c] - top);
    total = warp_total(total);
    const int32_t label = labels[row];
    const bool valid = label >= 0 && label < classes;
    if (lane == 0)
        row_loss[row] = valid ? log(total) + top - yr[label] : (T)NAN;
    if (!dy)
        return;
    for (int64_t c = lane; c < classes; c += 32) {
        const T p = exp(yr[c] - top) / total;
        dy[row * classes + c] = valid ? grad_scale * (p - (T)(c == label)) : (T)NAN;
    }
}

template <typename T> static int loss_rows_typed(const Run &r, const fx_loss_args *a, fx_status *st)
{
    const int64_t grid = (a->rows + kRowsPerBlock - 1) / kRowsPerBlock;
    T *dy = a->dy ? (T *)a->dy->data : nullptr;
    if (a->kind == FX_LOSS_MSE)
        return launch<mse_rows_kernel<T>>(r, grid, kLossThreads, "mse rows kernel", st, (const T *)a->y->data,
                                          (const T *)a->targets->data, (T *)a->row_loss->data, dy,
                                          (T)a->grad_scale, a->rows, a->classes);
    return launch<cross_entropy_rows_kernel<T>>(r, grid, kLossThreads, "cross-entropy rows kernel", st,
                                                (const T *)a->y->data, (const int32_t *)a->targets->data,
                                                (T *)a->row_loss->data, dy, (T)a->grad_scale, a->rows,
                                                a->classes);
}

static int loss_rows(const fx_exec *ex, const fx_loss_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    if ((a->rows + kRowsPerBlock - 1) / kRowsPerBlock > 0x7fffffff)
        return fx_fail(st, FX_EBADARG, "y: expected at most %lld rows on CUDA, got %lld",
                       (long long)0x7fffffff * kRowsPerBlock, (long long)a->rows);
    return a->y->dtype == FX_F64 ? loss_rows_typed<double>(r, a, st) : loss_rows_typed<float>(r, a, st);
}

const struct fx_loss_ops loss_ops = {.rows = loss_rows};

} // namespace fx::cuda
