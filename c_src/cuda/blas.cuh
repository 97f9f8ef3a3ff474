// Matrix products for every CUDA family (the linear layers, the input
// projections and weight gradients of GRU and LSTM, a Mamba block's
// projections): cuBLASLt, never a hand-written GEMM. Launchers call only
// this header for a product, so the CPU emulator (test/emu) supplies its
// own implementation (a plain f64-accumulating loop) and runs the same
// launchers. The implementation is c_src/cuda/blas.cu.
//
// Row-major throughout, as fusex's tensors are:
//
//   C[m, n] = alpha * opA(A) · opB(B) + beta * C    (then the epilogue)
//
// with opA(A) [m, k] (A stored [m, k], or [k, m] when ta is kT) and opB(B)
// [k, n] (B stored [k, n], or [n, k] when tb is kT: a weight W [out, in]
// used as x · Wᵀ). `lda`, `ldb`, `ldc` are the stored rows' strides in
// elements. `batch` > 1 runs that many products at strides `stride_*`
// (elements) apart.
#ifndef FX_CUDA_BLAS_CUH
#define FX_CUDA_BLAS_CUH

#include <stdint.h>

#include "cuda/common.cuh"

namespace fx::cuda::blas {

enum class Trans { kN = 0, kT = 1 };

// What runs on C after the product, fused where cuBLASLt has the epilogue.
enum class Epilogue {
    kNone = 0,
    kBias,      // + bias[n]
    kBiasRelu,  // relu(. + bias[n])
    kBiasGelu,  // gelu (tanh form) (. + bias[n])
    kBiasSilu,  // silu(. + bias[n]): no cuBLASLt epilogue, a kernel of ours after it
    kBiasTanh,  // tanh(. + bias[n]): likewise
    kBiasSigmoid, // sigmoid(. + bias[n]): likewise
};

struct Gemm {
    Trans ta = Trans::kN, tb = Trans::kN;
    int64_t m = 0, n = 0, k = 0;
    const void *a = nullptr;
    int64_t lda = 0;
    const void *b = nullptr;
    int64_t ldb = 0;
    void *c = nullptr;
    int64_t ldc = 0;
    fx_dtype ab_type = FX_F32; // A's and B's element type (f32, bf16, f16)
    fx_dtype c_type = FX_F32;  // C's (f32, or ab_type)
    float alpha = 1.0f, beta = 0.0f;
    Epilogue epilogue = Epilogue::kNone;
    const void *bias = nullptr; // [n], of bias_type
    fx_dtype bias_type = FX_F32;
    // f32 inputs: exact f32 products unless the caller asks for TF32.
    bool allow_tf32 = false;
    int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// Enqueues the product on the context's stream, workspace from its scratch
// (at most workspace_bytes(), which the families add to their scratch
// queries). Fails with a clear message for shapes or types it cannot do.
int gemm(const Run &r, const Gemm &g, const char *what, fx_status *st);

// The most scratch one gemm() asks of the context.
size_t workspace_bytes();

} // namespace fx::cuda::blas

#endif
