/*
 * Linear layers and the matrix product under them: argument structs and the
 * ops table a backend fills. Row-major throughout.
 *
 * The layer (`forward`, `backward`), over the last dimension of x:
 *
 *   x     [..., in]     rows = the product of the leading dimensions
 *   w     [out, in]     (PyTorch's and Axon's kernel transposed: y = x Wᵀ)
 *   bias  [out]         optional
 *   pre   = x Wᵀ + bias           [..., out]
 *   y     = act(pre)              [..., out]
 *
 * The backward reads, besides x, w and dy, what the activation's
 * derivative needs of the forward: nothing (none), the output y (relu,
 * tanh, sigmoid: act' is a function of act), or the pre-activation `pre`
 * (gelu, silu), which a forward for training writes (fx_linear_reads_*).
 *   dpre  = dy * act'(.)
 *   dx    = dpre W        dw = dpreᵀ x       dbias = the column sums of dpre
 * Types: x, w, y, pre, dy, dx, dw share x's type (f32, bf16, f16; f64 on
 * the CPU); the bias and its gradient any float type. On CUDA the products
 * are cuBLASLt's (exact f32 unless allow_tf32; 16-bit on tensor cores
 * accumulating in f32) and dbias sums in f32 in a fixed order.
 *
 * The product (`gemm`, every backend's general matrix product: the CPU's
 * f64 loop, CUDA's cuBLASLt through c_src/cuda/blas.cuh):
 *
 *   pre = alpha * opA(A) · opB(B) + beta * C (+ bias[n])     per batch
 *   C   = act(pre)                    (aux, when given, gets pre)
 *
 * with opA(A) [m, k] (A stored [m, k], or [k, m] when trans_a) and opB(B)
 * [k, n] (B stored [k, n], or [n, k] when trans_b: a weight W [out, in]
 * used as x · Wᵀ). lda, ldb, ldc are the stored rows' strides in elements;
 * `batch` products lie stride_a, stride_b, stride_c elements apart (the
 * same bias for every one). beta 0 never reads C (whatever it holds).
 * Types: A and B share ab_type (f32, bf16, f16; f64 on the CPU); C and aux
 * are c_type (f32, or ab_type); the bias any float type. f32 products are
 * exact f32 (f32 multiplies, f32 or better accumulation) unless allow_tf32;
 * 16-bit ones accumulate in f32.
 */
#ifndef FUSEX_LINEAR_H
#define FUSEX_LINEAR_H

#include <stdbool.h>

#include "fusex.h"
#include "fusex_activation.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fx_gemm_args {
    bool trans_a, trans_b;
    int64_t m, n, k;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    void *c;
    int64_t ldc;
    fx_dtype ab_type, c_type;
    float alpha, beta;
    const void *bias; /* [n] of bias_type, or NULL */
    fx_dtype bias_type;
    int activation;   /* fx_activation */
    void *aux;        /* the pre-activation, c_type at ldc (and stride_c), or NULL */
    bool allow_tf32;
    int64_t batch, stride_a, stride_b, stride_c;
} fx_gemm_args;

typedef struct fx_linear_dims {
    int64_t rows, in, out;
} fx_linear_dims;

typedef struct fx_linear_fwd_args {
    fx_linear_dims n;
    const fx_tensor *x, *w;
    const fx_tensor *bias; /* NULL when not given */
    int activation;        /* fx_activation */
    bool allow_tf32;
    const fx_tensor *y;    /* out [..., out] */
    const fx_tensor *pre;  /* out [..., out], or NULL: the pre-activation */
} fx_linear_fwd_args;

typedef struct fx_linear_bwd_args {
    /* The forward's inputs and, in y and pre, what it wrote that the
     * backward reads (fx_linear_reads_output / _pre; NULL otherwise). */
    fx_linear_fwd_args fwd;
    const fx_tensor *dy;
    const fx_tensor *dx, *dw; /* out */
    const fx_tensor *dbias;   /* out, where a bias was given; else NULL */
} fx_linear_bwd_args;

/* Whether the backward of `activation` reads the forward's output y
 * (relu, tanh, sigmoid) or its pre-activation (gelu, silu); none reads
 * neither. */
static inline bool fx_linear_reads_output(int activation)
{
    return activation == FX_ACT_RELU || activation == FX_ACT_TANH || activation == FX_ACT_SIGMOID;
}
static inline bool fx_linear_reads_pre(int activation)
{
    return activation == FX_ACT_GELU || activation == FX_ACT_SILU;
}

struct fx_linear_ops {
    int (*forward)(const fx_exec *ex, const fx_linear_fwd_args *args, fx_status *st);
    int (*backward)(const fx_exec *ex, const fx_linear_bwd_args *args, fx_status *st);
    /* The most scratch bytes forward and backward ask of `ex`, from the
     * shapes, types and options alone; SIZE_MAX where that overflows. */
    size_t (*forward_scratch)(const fx_exec *ex, const fx_linear_fwd_args *args);
    size_t (*backward_scratch)(const fx_exec *ex, const fx_linear_bwd_args *args);

    /* The product as above; the backend checks what it cannot do (a type,
     * a stride) and fails with a message naming `gemm`. */
    int (*gemm)(const fx_exec *ex, const fx_gemm_args *args, fx_status *st);
    /* The most scratch bytes gemm asks of `ex` (from the sizes alone). */
    size_t (*gemm_scratch)(const fx_exec *ex, const fx_gemm_args *args);
};

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_LINEAR_H */
