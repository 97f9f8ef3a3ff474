// One special-function-unit instruction each, in its flush-to-zero form,
// for every kernel family: the linrec gates (cuda/linrec/ops.cuh) and
// the selective scan (cuda/ssm/). Compiled for
// the CPU (the emulator, test/emu: no __CUDA_ARCH__), libm stands in.
//
// The ftz forms are one MUFU op; __frcp_rn is a dozen instructions, and
// __expf / __logf compile to the non-ftz ex2 / lg2, which wrap the MUFU op in
// ~3 more instructions to get denormal results right. The gates never need
// them (e^x is added to 1, the log's argument is in [1, 2]): sigmoid and
// softplus come out in the same bits as with __expf / __logf (checked on all
// of 2^30 inputs in [-200, 200) by dev/floor_bench), and the gated
// recurrences' streaming forwards lose 6 to 12 % of their instructions
// (bench/RESULTS.md).
#ifndef FX_CUDA_SFU_CUH
#define FX_CUDA_SFU_CUH

#include <math.h>

#include "cuda/common.cuh"

namespace fx::cuda {

enum SfuOp { kSfuRcp, kSfuEx2, kSfuLg2 };

// 1/x to within an ulp, 2^x (~2 ulp), log2(x); denormals to 0.
template <SfuOp OP> __device__ __forceinline__ float sfu(float x)
{
#ifdef __CUDA_ARCH__
    float r;
    if constexpr (OP == kSfuRcp)
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    else if constexpr (OP == kSfuEx2)
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    else
        asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return OP == kSfuRcp ? 1.f / x : OP == kSfuEx2 ? exp2f(x) : log2f(x);
#endif
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float fast_rcp(float x) { return sfu<kSfuRcp>(x); }
__device__ __forceinline__ float fast_exp2(float x) { return sfu<kSfuEx2>(x); }
__device__ __forceinline__ float fast_exp(float x) { return sfu<kSfuEx2>(x * kLog2e); }
__device__ __forceinline__ float fast_log(float x) { return sfu<kSfuLg2>(x) * kLn2; }

} // namespace fx::cuda

#endif
