// From a run-time element type to a compile-time one: the host side of
// every launcher that instantiates its kernels per type.
//
//   return FX_DISPATCH_FLOAT(T, x->dtype, "linrec forward", st, [&] { return forward<T>(r, a, st); });
//
// calls the lambda with T an alias of x->dtype's storage type: float,
// __nv_bfloat16 or __half (FX_DISPATCH_FLOAT: the types a family computes
// in f32), or any element type fusex has (FX_DISPATCH_ANY: f64 and the
// integers too). The whole is an expression whose value is the lambda's, a
// status (an int: a size or any other value would be cut, so it goes out
// through a capture instead). A type with no case fails in `st` with
// no_kernel_for, naming the type and `what`. Dispatches nest, each with a
// name of its own (FX_DISPATCH_FLOAT(P, ..., [&] { return FX_DISPATCH_FLOAT(G, ...); })).
#ifndef FX_CUDA_DISPATCH_CUH
#define FX_CUDA_DISPATCH_CUH

#include <type_traits>

#include "cuda/common.cuh"

namespace fx::cuda {

// The answer of a dispatch for a type it has no kernel for: the op layer
// lets none through, so it is fusex's bug, and the message names the type
// and the op for the report.
static inline int no_kernel_for(fx_dtype dtype, const char *what, fx_status *st)
{
    return fx_fail(st, FX_EINTERNAL, "%s: no CUDA kernel for type %s", what, fx_dtype_name(dtype));
}

// A dispatch's body answers a status; anything else is refused here.
template <typename R> static inline int dispatch_status(R status)
{
    static_assert(std::is_same<R, int>::value, "a dispatch's body answers a status (int)");
    return status;
}

} // namespace fx::cuda

// One case of a dispatch: NAME the storage type of ENUM, then the body.
#define FX_DISPATCH_CASE_(ENUM, TYPE, NAME, ...)                                                          \
    case ENUM: {                                                                                         \
        typedef TYPE NAME;                                                                               \
        return ::fx::cuda::dispatch_status((__VA_ARGS__)());                                             \
    }

#define FX_DISPATCH_FLOAT_CASES_(NAME, ...)                                                             \
    FX_DISPATCH_CASE_(FX_F32, float, NAME, __VA_ARGS__)                                                 \
    FX_DISPATCH_CASE_(FX_BF16, __nv_bfloat16, NAME, __VA_ARGS__)                                        \
    FX_DISPATCH_CASE_(FX_F16, __half, NAME, __VA_ARGS__)

#define FX_DISPATCH_FLOAT(NAME, DTYPE, WHAT, ST, ...)                                                   \
    [&]() -> int {                                                                                       \
        const fx_dtype fx_dispatch_type_ = (DTYPE);                                                      \
        switch (fx_dispatch_type_) {                                                                     \
            FX_DISPATCH_FLOAT_CASES_(NAME, __VA_ARGS__)                                                  \
        default: return ::fx::cuda::no_kernel_for(fx_dispatch_type_, (WHAT), (ST));                     \
        }                                                                                                \
    }()

#define FX_DISPATCH_ANY(NAME, DTYPE, WHAT, ST, ...)                                                     \
    [&]() -> int {                                                                                       \
        const fx_dtype fx_dispatch_type_ = (DTYPE);                                                      \
        switch (fx_dispatch_type_) {                                                                     \
            FX_DISPATCH_FLOAT_CASES_(NAME, __VA_ARGS__)                                                  \
            FX_DISPATCH_CASE_(FX_F64, double, NAME, __VA_ARGS__)                                         \
            FX_DISPATCH_CASE_(FX_S32, int32_t, NAME, __VA_ARGS__)                                        \
            FX_DISPATCH_CASE_(FX_S64, int64_t, NAME, __VA_ARGS__)                                        \
            FX_DISPATCH_CASE_(FX_U8, uint8_t, NAME, __VA_ARGS__)                                         \
        default: return ::fx::cuda::no_kernel_for(fx_dispatch_type_, (WHAT), (ST));                     \
        }                                                                                                \
    }()

#endif
