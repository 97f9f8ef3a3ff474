// Matrix products for every CUDA family (the linear layers, the input
// projections and weight gradients of GRU and LSTM, a Mamba block's
// projections): cuBLASLt, never a hand-written GEMM. Launchers call only
// this header for a product, so the CPU emulator (test/emu) supplies its
// own implementation (a plain f64-accumulating loop) and runs the same
// launchers. The implementation is c_src/cuda/blas.cu (cuBLASLt) and, shared
// with the emulator, c_src/cuda/blas_kernels.cu (the checks, the epilogues
// cuBLASLt lacks, the column sums).
//
// Row-major throughout, as fusex's tensors are:
//
//   C[m, n] = alpha * opA(A) · opB(B) + beta * C    (then the epilogue)
//
// with opA(A) [m, k] (A stored [m, k], or [k, m] when ta is kT) and opB(B)
// [k, n] (B stored [k, n], or [n, k] when tb is kT: a weight W [out, in]
// used as x · Wᵀ). `lda`, `ldb`, `ldc` are the stored rows' strides in
// elements. `batch` > 1 runs that many products at strides `stride_*`
// (elements) apart, the same bias for each. beta 0 never reads C.
//
// Numerics: f32 inputs multiply in f32 and accumulate in f32
// (CUBLAS_COMPUTE_32F) unless `allow_tf32`; bf16 and f16 run on tensor
// cores accumulating in f32; the epilogue computes in f32 and C is rounded
// once where cuBLASLt fuses it (bias, relu, gelu), twice (the product, then
// the activation) where a kernel of ours follows. Every algorithm is
// deterministic: the same shapes, types and alignments always choose the
// same one, and no split-K reduction accumulates in the output's type or
// through atomics.
#ifndef FX_CUDA_BLAS_CUH
#define FX_CUDA_BLAS_CUH

#include <stdint.h>

#include "cuda/common.cuh"
#include "fusex_activation.h"

namespace fx::cuda::blas {

enum class Trans { kN = 0, kT = 1 };

// What runs on C after the product, fused where cuBLASLt has the epilogue
// (bias, relu, gelu), a kernel of ours after it otherwise (silu, tanh,
// sigmoid; and a bias whose type is not C's).
enum class Epilogue {
    kNone = 0,
    kBias,        // + bias[n]
    kBiasRelu,    // relu(. + bias[n])
    kBiasGelu,    // gelu (tanh form) (. + bias[n])
    kBiasSilu,    // silu(. + bias[n])
    kBiasTanh,    // tanh(. + bias[n])
    kBiasSigmoid, // sigmoid(. + bias[n])
    kRelu,        // the same without a bias
    kGelu,
    kSilu,
    kTanh,
    kSigmoid,
};

// The epilogue applying `act` (fx_activation) after adding a bias or not.
Epilogue epilogue_of(bool bias, int act);
// Whether it adds the bias, and the activation it applies (fx_activation).
bool epilogue_has_bias(Epilogue e);
int epilogue_activation(Epilogue e);

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
    const void *bias = nullptr; // [n], of bias_type (any float type)
    fx_dtype bias_type = FX_F32;
    // Where given, the pre-activation (alpha·AB + beta·C + bias) is written
    // here too, in C's type and layout (ldc, stride_c): what a backward
    // needs of an activation whose gradient is not a function of its output.
    void *aux = nullptr;
    // f32 inputs: exact f32 products unless the caller asks for TF32.
    bool allow_tf32 = false;
    int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// Enqueues the product on the context's stream, workspace from its scratch
// (at most workspace_bytes(), which the families add to their scratch
// queries). Fails with a clear message, naming `what`, for shapes or types
// it cannot do. Empty products (m or n 0) enqueue nothing; k 0 gives
// epilogue(beta * C).
int gemm(const Run &r, const Gemm &g, const char *what, fx_status *st);

// The most scratch one gemm() asks of the context: a piece of this many
// bytes (fx_scratch_piece it, and add FX_SCRATCH_ALIGN for an arena's start
// once per op).
size_t workspace_bytes();

// A bias gradient: dst[j] = sum over the `rows` rows i of src[i * ld + j],
// j < cols, summed in f32 in an order fixed by the shape (deterministic:
// per-block partial sums in scratch, then added in block order). src and
// dst may be any float type.
struct ColumnSums {
    const void *src = nullptr;
    fx_dtype src_type = FX_F32;
    int64_t rows = 0, cols = 0, ld = 0;
    void *dst = nullptr;
    fx_dtype dst_type = FX_F32;
};

int column_sums(const Run &r, const ColumnSums &s, const char *what, fx_status *st);

// The scratch column_sums asks for (its partial sums, one piece, 0 when it
// sums in one pass): from the sizes alone.
size_t column_sums_scratch(int64_t rows, int64_t cols);

// Releases the per-device cuBLASLt handles and cached heuristics (the
// backend's shutdown).
void shutdown();

} // namespace fx::cuda::blas

#endif
