// RMSNorm and LayerNorm kernels (include/fusex_norm.h says what they
// compute). Two shapes of kernel each way:
//
//   rows    a group of TPR threads (a power of two from 32 to 1024) holds a
//           row in registers, NV packs of VEC elements a thread; the row's
//           sums go through warp shuffles and, past a warp, shared memory.
//           RPB = 256 / TPR rows a block side by side. Memory-bound: every
//           input is read once and every output written once.
//   long    any row length: a block a row, three passes over the row in
//           global memory (it stays in L2), element by element.
//
// x, gate, y, dy, dx, dgate have the storage type T; residual, residual_out
// (s), weight, bias and the residual's gradients come in a type of their
// own, read and written as packs of a run-time type (cuda/pack.cuh).
// Statistics are f32, computed from the unrounded s. The backward's
// weight and bias gradients are summed in registers over the rows a block
// handles, the block's row groups added in order through shared memory,
// one row of partial sums a block into scratch; launch_sums then adds the
// blocks' rows in order: deterministic, no atomics.
#ifndef FX_CUDA_NORM_KERNELS_CUH
#define FX_CUDA_NORM_KERNELS_CUH

#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/pack.cuh"

namespace fx::cuda::norm {

constexpr int kBlockThreads = 256;  // the rows kernels' block
constexpr int kLongThreads = 512;   // the long kernels' block

struct FwdParams {
    const void *x, *residual, *weight, *bias, *gate;
    void *y, *s;
    float *mean, *rstd;
    int residual_type, s_type, weight_type, bias_type;
    int64_t rows, hidden;
    float eps;
    bool layer;
};

struct BwdParams {
    const void *xs, *weight, *bias, *gate, *dy, *dres_out;
    const float *mean, *rstd;
    void *dx, *dres, *dgate;
    float *dw_part, *db_part; // [blocks, hidden]; db_part nullptr without a bias
    int xs_type, weight_type, bias_type, dres_out_type, dres_type;
    int64_t rows, hidden;
    bool layer;
};

// The block's dynamic shared memory (the backward's column sums).
__device__ __forceinline__ float *block_smem()
{
#ifdef FX_CUDA_EMULATION
    return static_cast<float *>(fx_emu_dynamic_smem());
#else
    extern __shared__ __align__(16) float smem[];
    return smem;
#endif
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// Sums each of the N values over the `tpr` threads of a row; every thread
// of the row gets the sums (the same bits: the butterfly adds the same
// pairs on every lane). Every thread of the block calls it (barriers past
// one warp a row); `red` holds N * 32 floats.
template <int N> __device__ __forceinline__ void row_sums(float (&v)[N], int tpr, float *red)
{
#pragma unroll
    for (int k = 0; k < N; k++)
        v[k] = warp_sum(v[k]);
    if (tpr == 32)
        return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); // red is free: the last call's readers are done
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < N; k++)
            red[k * 32 + warp] = v[k];
    __syncthreads();
    const int per_row = tpr / 32, first = (threadIdx.x / tpr) * per_row;
#pragma unroll
    for (int k = 0; k < N; k++) {
        float sum = 0.0f;
        for (int w = 0; w < per_row; w++)
            sum += red[k * 32 + first + w];
        v[k] = sum;
    }
}

// The block-wide version for the long kernels (one row a block).
template <int N> __device__ __forceinline__ void block_sums(float (&v)[N], float *red)
{
    row_sums<N>(v, blockDim.x, red);
}

__device__ __forceinline__ float load_elem(const void *p, int type, int64_t i) { return load_any(p, type, i); }

// ---- forward ----

template <typename T, int VEC, int NV> __global__ void __launch_bounds__(kBlockThreads) forward_rows(const FwdParams p, int tpr)
{
    __shared__ float red[32];
    const int lane = threadIdx.x % tpr, group = threadIdx.x / tpr, groups = blockDim.x / tpr;
    const int64_t H = p.hidden;
    const float inv_h = 1.0f / (float)H;
    for (int64_t base = (int64_t)blockIdx.x * groups; base < p.rows; base += (int64_t)gridDim.x * groups) {
        const int64_t row = base + group;
        const bool live = row < p.rows;
        const int64_t at0 = row * H;
        float v[NV][VEC];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t col = ((int64_t)j * tpr + lane) * VEC;
            if (live && col < H) {
                load_pack<T, VEC>(static_cast<const T *>(p.x), at0 + col, v[j]);
                if (p.residual) {
                    float r[VEC];
                    load_pack_any<VEC>(p.residual, p.residual_type, at0 + col, r);
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        v[j][k] += r[k];
                }
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    v[j][k] = 0.0f;
            }
        }
        float mean = 0.0f;
        if (p.layer) {
            float sum[1] = {0.0f};
#pragma unroll
            for (int j = 0; j < NV; j++)
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    sum[0] += v[j][k];
            row_sums<1>(sum, tpr, red);
            mean = sum[0] * inv_h;
        }
        float sq[1] = {0.0f};
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t col = ((int64_t)j * tpr + lane) * VEC;
            if (col < H)
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    sq[0] += (v[j][k] - mean) * (v[j][k] - mean);
        }
        row_sums<1>(sq, tpr, red);
        const float rstd = rsqrtf(sq[0] * inv_h + p.eps);
        if (!live)
            continue;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t col = ((int64_t)j * tpr + lane) * VEC;
            if (col >= H)
                continue;
            if (p.s)
                store_pack_any<VEC>(p.s, p.s_type, at0 + col, v[j]);
            float w[VEC], b[VEC], o[VEC];
            load_pack_any<VEC>(p.weight, p.weight_type, col, w);
            if (p.bias)
                load_pack_any<VEC>(p.bias, p.bias_type, col, b);
#pragma unroll
            for (int k = 0; k < VEC; k++)
                o[k] = (v[j][k] - mean) * rstd * w[k] + (p.bias ? b[k] : 0.0f);
            if (p.gate) {
                float g[VEC];
                load_pack<T, VEC>(static_cast<const T *>(p.gate), at0 + col, g);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    o[k] *= act::silu(g[k]);
            }
            store_pack<T, VEC>(static_cast<T *>(p.y), at0 + col, o);
        }
        if (lane == 0) {
            if (p.mean)
                p.mean[row] = mean;
            if (p.rstd)
                p.rstd[row] = rstd;
        }
    }
}

// s at element i of the row starting at at0.
template <typename T> __device__ __forceinline__ float long_s(const FwdParams &p, int64_t i)
{
    float v = Elem<T>::load(static_cast<const T *>(p.x)[i]);
    if (p.residual)
        v += load_elem(p.residual, p.residual_type, i);
    return v;
}

template <typename T> __global__ void __launch_bounds__(kLongThreads) forward_long(const FwdParams p)
{
    __shared__ float red[32];
    const int64_t H = p.hidden;
    const float inv_h = 1.0f / (float)H;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
        const int64_t at0 = row * H;
        float mean = 0.0f;
        if (p.layer) {
            float sum[1] = {0.0f};
            for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
                sum[0] += long_s<T>(p, at0 + j);
            block_sums<1>(sum, red);
            mean = sum[0] * inv_h;
        }
        float sq[1] = {0.0f};
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
            const float d = long_s<T>(p, at0 + j) - mean;
            sq[0] += d * d;
        }
        block_sums<1>(sq, red);
        const float rstd = rsqrtf(sq[0] * inv_h + p.eps);
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
            const float s = long_s<T>(p, at0 + j);
            if (p.s)
                store_any(p.s, p.s_type, at0 + j, s);
            float o = (s - mean) * rstd * load_elem(p.weight, p.weight_type, j) +
                      (p.bias ? load_elem(p.bias, p.bias_type, j) : 0.0f);
            if (p.gate)
                o *= act::silu(Elem<T>::load(static_cast<const T *>(p.gate)[at0 + j]));
            static_cast<T *>(p.y)[at0 + j] = Elem<T>::store(o);
        }
        if (threadIdx.x == 0) {
            if (p.mean)
                p.mean[row] = mean;
            if (p.rstd)
                p.rstd[row] = rstd;
        }
    }
}

// ---- backward ----

// One element's share: its normalised value n, do (dy after the gate) and
// dgate.
struct ElemGrad {
    float n, dout, dgate;
};

__device__ __forceinline__ ElemGrad element_grad(float xs, float mean, float rstd, float dy, bool gated, float g,
                                                 float w, float b)
{
    ElemGrad e;
    e.n = (xs - mean) * rstd;
    e.dout = dy;
    e.dgate = 0.0f;
    if (gated) {
        const float sg = act::sigmoid(g), o = e.n * w + b;
        e.dout = dy * g * sg;
        e.dgate = dy * o * sg * (1.0f + g * (1.0f - sg));
    }
    return e;
}

// Adds a block's row groups' column sums (acc, the group's columns) in
// group order in shared memory and writes them as the block's row of
// partial sums. Every thread of the block calls it.
template <int VEC, int NV>
__device__ __forceinline__ void write_block_sums(const float (&acc)[NV][VEC], int tpr, int64_t H, float *part)
{
    const int lane = threadIdx.x % tpr, group = threadIdx.x / tpr, groups = blockDim.x / tpr;
    if (groups == 1) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t col = ((int64_t)j * tpr + lane) * VEC;
            if (col < H)
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    part[col + k] = acc[j][k];
        }
        return;
    }
    float *sums = block_smem();
    for (int g = 0; g < groups; g++) {
        if (group == g)
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int64_t col = ((int64_t)j * tpr + lane) * VEC;
                if (col < H)
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        sums[col + k] = g == 0 ? acc[j][k] : sums[col + k] + acc[j][k];
            }
        __syncthreads();
    }
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x)
        part[c] = sums[c];
    __syncthreads(); // the next call reuses sums
}

template <typename T, int VEC, int NV> __global__ void __launch_bounds__(kBlockThreads) backward_rows(const BwdParams p, int tpr)
{
    __shared__ float red[2 * 32];
    const int lane = threadIdx.x % tpr, group = threadIdx.x / tpr, groups = blockDim.x / tpr;
    const int64_t H = p.hidden;
    const float inv_h = 1.0f / (float)H;
    float dw[NV][VEC], db[NV][VEC];
#pragma unroll
    for (int j = 0; j < NV; j++)
#pragma unroll
        for (int k = 0; k < VEC; k++)
            dw[j][k] = db[j][k] = 0.0f;
    for (int64_t base = (int64_t)blockIdx.x * groups; base < p.rows; base += (int64_t)gridDim.x * groups) {
        const int64_t row = base + group;
        const bool live = row < p.rows;
        const int64_t at0 = row * H;
        const float mean = live && p.mean ? p.mean[row] : 0.0f, rstd = live ? p.rstd[row] : 0.0f;
        float n[NV][VEC], dn[NV][VEC];
        float sums[2] = {0.0f, 0.0f}; // sum of dn * n, sum of dn
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t col = ((int64_t)j * tpr + lane) * VEC;
            const bool ok = live && col < H;
            float xs[VEC], dy[VEC], g[VEC], w[VEC], b[VEC], dg[VEC];
            if (ok) {
                load_pack_any<VEC>(p.xs, p.xs_type, at0 + col, xs);
                load_pack<T, VEC>(static_cast<const T *>(p.dy), at0 + col, dy);
                load_pack_any<VEC>(p.weight, p.weight_type, col, w);
                if (p.gate) {
                    load_pack<T, VEC>(static_cast<const T *>(p.gate), at0 + col, g);
                    if (p.bias)
                        load_pack_any<VEC>(p.bias, p.bias_type, col, b);
                }
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                if (!ok) {
                    n[j][k] = dn[j][k] = 0.0f;
                    continue;
                }
                const ElemGrad e = element_grad(xs[k], mean, rstd, dy[k], p.gate != nullptr, p.gate ? g[k] : 0.0f, w[k],
                                                p.gate && p.bias ? b[k] : 0.0f);
                n[j][k] = e.n;
                dn[j][k] = e.dout * w[k];
                dg[k] = e.dgate;
                dw[j][k] += e.dout * e.n;
                db[j][k] += e.dout;
                sums[0] += dn[j][k] * e.n;
                sums[1] += dn[j][k];
            }
            if (ok && p.dgate)
                store_pack<T, VEC>(static_cast<T *>(p.dgate), at0 + col, dg);
        }
        row_sums<2>(sums, tpr, red);
        if (!live)
            continue;
        const float mean_dnn = sums[0] * inv_h, mean_dn = p.layer ? sums[1] * inv_h : 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t col = ((int64_t)j * tpr + lane) * VEC;
            if (col >= H)
                continue;
            float ds[VEC], extra[VEC];
            if (p.dres_out)
                load_pack_any<VEC>(p.dres_out, p.dres_out_type, at0 + col, extra);
#pragma unroll
            for (int k = 0; k < VEC; k++)
                ds[k] = rstd * (dn[j][k] - mean_dn - n[j][k] * mean_dnn) + (p.dres_out ? extra[k] : 0.0f);
            store_pack<T, VEC>(static_cast<T *>(p.dx), at0 + col, ds);
            if (p.dres)
                store_pack_any<VEC>(p.dres, p.dres_type, at0 + col, ds);
        }
    }
    write_block_sums<VEC, NV>(dw, tpr, H, p.dw_part + blockIdx.x * H);
    if (p.db_part)
        write_block_sums<VEC, NV>(db, tpr, H, p.db_part + blockIdx.x * H);
}

template <typename T> __device__ __forceinline__ ElemGrad long_grad(const BwdParams &p, int64_t at, int64_t j, float mean,
                                                                    float rstd)
{
    const bool gated = p.gate != nullptr;
    return element_grad(load_elem(p.xs, p.xs_type, at), mean, rstd, Elem<T>::load(static_cast<const T *>(p.dy)[at]),
                        gated, gated ? Elem<T>::load(static_cast<const T *>(p.gate)[at]) : 0.0f,
                        load_elem(p.weight, p.weight_type, j),
                        gated && p.bias ? load_elem(p.bias, p.bias_type, j) : 0.0f);
}

// Block b takes rows b, b + gridDim.x, ...: its row of partial sums is
// written by its first row and added to by the next, each column by the
// same thread in row order.
template <typename T> __global__ void __launch_bounds__(kLongThreads) backward_long(const BwdParams p)
{
    __shared__ float red[2 * 32];
    const int64_t H = p.hidden;
    const float inv_h = 1.0f / (float)H;
    float *dw_part = p.dw_part + blockIdx.x * H, *db_part = p.db_part ? p.db_part + blockIdx.x * H : nullptr;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
        const bool first = row == blockIdx.x;
        const int64_t at0 = row * H;
        const float mean = p.mean ? p.mean[row] : 0.0f, rstd = p.rstd[row];
        float sums[2] = {0.0f, 0.0f};
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
            const ElemGrad e = long_grad<T>(p, at0 + j, j, mean, rstd);
            const float dn = e.dout * load_elem(p.weight, p.weight_type, j);
            sums[0] += dn * e.n;
            sums[1] += dn;
        }
        block_sums<2>(sums, red);
        const float mean_dnn = sums[0] * inv_h, mean_dn = p.layer ? sums[1] * inv_h : 0.0f;
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
            const int64_t at = at0 + j;
            const ElemGrad e = long_grad<T>(p, at, j, mean, rstd);
            const float dn = e.dout * load_elem(p.weight, p.weight_type, j);
            const float ds = rstd * (dn - mean_dn - e.n * mean_dnn) +
                             (p.dres_out ? load_elem(p.dres_out, p.dres_out_type, at) : 0.0f);
            static_cast<T *>(p.dx)[at] = Elem<T>::store(ds);
            if (p.dres)
                store_any(p.dres, p.dres_type, at, ds);
            if (p.dgate)
                static_cast<T *>(p.dgate)[at] = Elem<T>::store(e.dgate);
            dw_part[j] = first ? e.dout * e.n : dw_part[j] + e.dout * e.n;
            if (db_part)
                db_part[j] = first ? e.dout : db_part[j] + e.dout;
        }
    }
}

} // namespace fx::cuda::norm

#endif
