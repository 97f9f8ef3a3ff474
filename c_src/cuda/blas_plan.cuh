// How a blas::gemm (blas.cuh) is carried out, shared by the cuBLASLt
// implementation (blas.cu) and the CPU emulator's (test/emu/blas.cc), so
// that both split the work the same way: which part of the epilogue the
// product fuses (what cuBLASLt has: a bias of C's type, relu, gelu, gelu
// with the pre-activation kept) and which part a kernel of ours applies
// after it (blas_kernels.cu).
#ifndef FX_CUDA_BLAS_PLAN_CUH
#define FX_CUDA_BLAS_PLAN_CUH

#include "cuda/blas.cuh"

namespace fx::cuda::blas::detail {

struct Plan {
    bool has_bias;
    int activation;     // fx_activation of the whole epilogue
    // The product (k > 0): D = alpha·AB + beta·C, then what it fuses.
    bool product;
    void *product_out;  // D: C, or aux (the kernel then reads it)
    bool product_bias;  // + bias
    int product_act;    // FX_ACT_NONE, RELU or GELU
    bool product_aux;   // also writes its input to the activation to aux (gelu)
    // The kernel after it (or, for k = 0, instead of it: from beta·C).
    bool kernel;
    bool kernel_bias;
    int kernel_act;
};

// Sizes, strides, types and pointers gemm can take; a message naming
// `what` otherwise.
int check(const Gemm &g, const char *what, fx_status *st);

// The split of g's epilogue. `fuse` false: the product fuses nothing (a
// plain product, for a backend without the fused algorithm).
Plan plan(const Gemm &g, bool fuse);

// The kernel part of plan p, enqueued after the product.
int run_epilogue(const Run &r, const Gemm &g, const Plan &p, const char *what, fx_status *st);

// Elements from one row of a stored matrix to the next, as laid out, and
// the element sizes: for messages and the implementations' layouts.
static inline int64_t stored_rows(Trans t, int64_t rows, int64_t cols) { return t == Trans::kN ? rows : cols; }
static inline int64_t stored_cols(Trans t, int64_t rows, int64_t cols) { return t == Trans::kN ? cols : rows; }

} // namespace fx::cuda::blas::detail

#endif
