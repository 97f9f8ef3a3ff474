/*
 * Linear layers and the matrix product under them: argument structs and the
 * ops table a backend fills. Row-major throughout.
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

struct fx_linear_ops {
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
