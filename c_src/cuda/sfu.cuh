// One special-function-unit instruction each, in its flush-to-zero form,
// for every kernel family: the linrec gates (cuda/linrec/ops.cuh) and
// the selective scan (cuda/ssm/). Compiled for
// the CPU (tools/cuda_emu, tools/ssm_emu: no __CUDA_ARCH__), libm stands in.
//
// The ftz forms are one MUFU op; __frcp_rn is a dozen instructions, and
// __expf / __logf compile to the non-ftz ex2 / lg2, which wrap the MUFU op in
// ~3 more instructions to get denormal results right. The gates never need
// them (e^x is added to 1, the log's argument is in [1, 2]): sigmoid and
// softplus come out in the same bits as with __expf / __logf (checked on all
// of 2^30 inputs in [-200, 200) by tools/floor_bench), and the streaming
// MinGRU / MinLSTM forwards lose 6 / 12 % of their instructions
// (bench/RESULTS.md).
#ifndef FX_CUDA_SFU_CUH
#define FX_CUDA_SFU_CUH

#include <math.h>

#include "cuda/common.cuh"

enum fx_sfu_op { FX_SFU_RCP, FX_SFU_EX2, FX_SFU_LG2 };

// 1/x to within an ulp, 2^x (~2 ulp), log2(x); denormals to 0.
template <fx_sfu_op OP> __device__ __forceinline__ float fx_sfu(float x)
{
#ifdef __CUDA_ARCH__
    float r;
    if constexpr (OP == FX_SFU_RCP)
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    else if constexpr (OP == FX_SFU_EX2)
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    else
        asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return OP == FX_SFU_RCP ? 1.f / x : OP == FX_SFU_EX2 ? exp2f(x) : log2f(x);
#endif
}

constexpr float fx_log2e = 1.4426950408889634f;
constexpr float fx_ln2 = 0.6931471805599453f;

__device__ __forceinline__ float fx_fast_rcp(float x) { return fx_sfu<FX_SFU_RCP>(x); }
__device__ __forceinline__ float fx_fast_exp2(float x) { return fx_sfu<FX_SFU_EX2>(x); }
__device__ __forceinline__ float fx_fast_exp(float x) { return fx_sfu<FX_SFU_EX2>(x * fx_log2e); }
__device__ __forceinline__ float fx_fast_log(float x) { return fx_sfu<FX_SFU_LG2>(x) * fx_ln2; }

#endif
