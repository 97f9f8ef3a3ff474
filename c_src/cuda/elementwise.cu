// Elementwise kernels: dtype cast, add/sub/mul, scale. Memory-bound
// grid-stride loops; they exist for tensor plumbing (dtype changes, the
// benchmarks' trivial op), not as the library's hot path.
#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/families.h"
#include "cuda/launch.cuh"

namespace fx::cuda {

// Casts go through f64 with the CPU backend's rules (integers saturate,
// NaN becomes 0; 16-bit floats round from f32), so both give identical bits.
template <typename T> __device__ __forceinline__ double to_f64(T v) { return (double)v; }
template <> __device__ __forceinline__ double to_f64(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ double to_f64(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f64(double v) { return (T)v; }
template <> __device__ __forceinline__ float from_f64(double v) { return (float)v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f64(double v)
{
    return __float2bfloat16_rn((float)v);
}
template <> __device__ __forceinline__ __half from_f64(double v) { return __float2half_rn((float)v); }

__device__ __forceinline__ double saturate(double v, double lo, double hi)
{
    return isnan(v) ? 0.0 : v <= lo ? lo : v >= hi ? hi : v;
}
template <> __device__ __forceinline__ int32_t from_f64(double v)
{
    return (int32_t)saturate(v, -2147483648.0, 2147483647.0);
}
template <> __device__ __forceinline__ int64_t from_f64(double v)
{
    return (int64_t)saturate(v, -9223372036854775808.0, 9223372036854774784.0);
}
template <> __device__ __forceinline__ uint8_t from_f64(double v)
{
    return (uint8_t)saturate(v, 0.0, 255.0);
}

template <typename S, typename D>
__global__ void cast_kernel(const S *__restrict__ src, D *__restrict__ dst, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_f64<D>(to_f64(src[i]));
}

// Threads a block of the elementwise kernels.
constexpr int kThreads = 256;

int cast(const fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    const unsigned grid = grid_for(r.d, src->numel, kThreads);
    return FX_DISPATCH_ANY(S, src->dtype, "cast source", st, [&] {
        return FX_DISPATCH_ANY(D, dst->dtype, "cast destination", st, [&] {
            return launch<cast_kernel<S, D>>(r, grid, kThreads, "cast kernel", st, (const S *)src->data,
                                             (D *)dst->data, src->numel);
        });
    });
}

// Arithmetic type per storage type: float for the 16-bit floats, the type
// itself for f32/f64, wrapping 64-bit unsigned maths for the integers.
template <typename T> struct Arith { typedef T type; };
template <> struct Arith<__nv_bfloat16> { typedef float type; };
template <> struct Arith<__half> { typedef float type; };
template <> struct Arith<int32_t> { typedef uint64_t type; };
template <> struct Arith<int64_t> { typedef uint64_t type; };
template <> struct Arith<uint8_t> { typedef uint64_t type; };

template <typename T> __device__ __forceinline__ typename Arith<T>::type up(T v)
{
    return (typename Arith<T>::type)v;
}
template <> __device__ __forceinline__ float up(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float up(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ uint64_t up(int32_t v) { return (uint64_t)(int64_t)v; }
template <> __device__ __forceinline__ uint64_t up(int64_t v) { return (uint64_t)v; }

template <typename T> __device__ __forceinline__ T down(typename Arith<T>::type v) { return (T)v; }
template <> __device__ __forceinline__ __nv_bfloat16 down(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half down(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void binary_kernel(int op, const T *__restrict__ a, const T *__restrict__ b,
                              T *__restrict__ out, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        typename Arith<T>::type x = up(a[i]), y = up(b[i]);
        out[i] = down<T>(op == FX_ADD ? x + y : op == FX_SUB ? x - y : x * y);
    }
}

int binary(const fx_exec *ex, fx_binop op, const fx_tensor *a, const fx_tensor *b,
                   const fx_tensor *out, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    const unsigned grid = grid_for(r.d, a->numel, kThreads);
    return FX_DISPATCH_ANY(T, a->dtype, "binary op", st, [&] {
        return launch<binary_kernel<T>>(r, grid, kThreads, "binary kernel", st, (int)op, (const T *)a->data,
                                        (const T *)b->data, (T *)out->data, a->numel);
    });
}

template <typename T, typename M>
__global__ void scale_kernel(const T *__restrict__ src, M factor, T *__restrict__ dst, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = Elem<T>::store(Elem<T>::load(src[i]) * factor);
}

int scale(const fx_exec *ex, const fx_tensor *src, double factor, const fx_tensor *dst,
                  fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    const unsigned grid = grid_for(r.d, src->numel, kThreads);
    if (src->dtype == FX_F64)
        return launch<scale_kernel<double, double>>(r, grid, kThreads, "scale kernel", st,
                                                            (const double *)src->data, factor,
                                                            (double *)dst->data, src->numel);
    return FX_DISPATCH_FLOAT(T, src->dtype, "scale", st, [&] {
        return launch<scale_kernel<T, float>>(r, grid, kThreads, "scale kernel", st, (const T *)src->data,
                                              (float)factor, (T *)dst->data, src->numel);
    });
}

} // namespace fx::cuda
