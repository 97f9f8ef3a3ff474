/* The fast linear layer (fusex_linear.h): the products through the system
 * BLAS in f32 (fx_fast_gemm), the bias, the pre-activation and the
 * activation in one vectorised pass over each row after. bf16 and f16
 * operands are converted to f32 once a call, into the caller's scratch
 * (kept between calls). Without a BLAS, and for f64, the oracle runs. */
#include <limits.h>

#include "cpu/fast/fast.h"
#include "fusex_linear.h"

/* t's elements as f32: t's own memory where it is f32, else a converted copy. */
static const float *as_f32(fx_carve *c, const fx_tensor *t)
{
    if (t->dtype == FX_F32)
        return t->data;
    float *p = fx_carve_take(c, t->numel);
    if (p)
        fx_fast_load(t, 0, t->numel, p);
    return p;
}

/* Where an output is computed: t's memory where it is f32, else scratch. */
static float *out_f32(fx_carve *c, const fx_tensor *t)
{
    return t->dtype == FX_F32 ? (float *)t->data : fx_carve_take(c, t->numel);
}

/* The caller's scratch for `floats` f32 (never a zero-byte block). */
static float *call_floats(size_t floats)
{
    const size_t bytes = fx_size_mul((int64_t)(floats > 16 ? floats : 16), sizeof(float));
    return bytes == SIZE_MAX ? NULL : fx_fast_call_scratch(bytes);
}

static bool sizes_fit(const fx_linear_dims *n)
{
    return n->rows <= INT_MAX && n->in <= INT_MAX && n->out <= INT_MAX;
}

/* ---- forward ---- */

/* The epilogue of a row: pre = acc + bias; pre out where asked; y = act(pre). */
FX_FAST_KERNEL
static void epilogue_row(int act, int64_t n, const float *restrict bias, float *restrict acc, float *restrict pre)
{
    if (bias) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            acc[j] += bias[j];
    }
    if (pre)
        memcpy(pre, acc, sizeof(float) * (size_t)n);
    switch (act) { /* unswitched: each loop vectorises with its activation inlined */
    case FX_ACT_NONE: break;
#define ACT_LOOP(A)                                                                                                    \
    case A:                                                                                                            \
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) acc[j] = fx_fast_activate(A, acc[j]);                     \
        break;
        ACT_LOOP(FX_ACT_RELU)
        ACT_LOOP(FX_ACT_GELU)
        ACT_LOOP(FX_ACT_SILU)
        ACT_LOOP(FX_ACT_TANH)
        ACT_LOOP(FX_ACT_SIGMOID)
#undef ACT_LOOP
    default: break;
    }
}

static size_t forward_floats(const fx_linear_fwd_args *a, fx_carve *c, const float **x, const float **w,
                             const float **bias, float **y, float **pre)
{
    *x = as_f32(c, a->x);
    *w = as_f32(c, a->w);
    *bias = a->bias ? as_f32(c, a->bias) : NULL;
    *y = out_f32(c, a->y);
    *pre = a->pre ? out_f32(c, a->pre) : NULL;
    return c->floats;
}

static int fast_forward(const fx_linear_fwd_args *a, fx_status *st)
{
    const fx_linear_dims *n = &a->n;
    fx_carve size = {0};
    const float *x, *w, *bias;
    float *y, *pre;
    const size_t floats = forward_floats(a, &size, &x, &w, &bias, &y, &pre);
    fx_carve c = {call_floats(floats), 0};
    if (!c.next)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a linear layer's %zu f32 operands", floats);
    forward_floats(a, &c, &x, &w, &bias, &y, &pre);
    const fx_fast_gemm_args g = {.trans_b = true, .m = n->rows, .n = n->out, .k = n->in, .a = x, .lda = n->in,
                                 .b = w, .ldb = n->in, .c = y, .ldc = n->out};
    fx_fast_gemm(&g);
    for (int64_t r = 0; r < n->rows; r++)
        epilogue_row(a->activation, n->out, bias, y + r * n->out, pre ? pre + r * n->out : NULL);
    if (a->pre && pre != a->pre->data)
        fx_fast_store(a->pre, 0, a->pre->numel, pre);
    if (y != a->y->data)
        fx_fast_store(a->y, 0, a->y->numel, y);
    return FX_OK;
}

/* ---- backward ---- */

/* dpre = dy * act'(.) over n elements, from y or from pre as the
 * activation needs. */
FX_FAST_KERNEL
static void pre_gradient(int act, int64_t n, const float *restrict dy, const float *restrict y,
                         const float *restrict pre, float *restrict dpre)
{
    if (fx_linear_reads_output(act)) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            dpre[i] = dy[i] * fx_fast_activate_grad_at_output(act, y[i]);
    } else if (act == FX_ACT_GELU) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            dpre[i] = dy[i] * fx_fast_activate_grad(FX_ACT_GELU, pre[i]);
    } else if (act == FX_ACT_SILU) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            dpre[i] = dy[i] * fx_fast_silu_grad(pre[i]);
    } else {
        memcpy(dpre, dy, sizeof(float) * (size_t)n);
    }
}

/* dbias[o] = sum over rows of dpre[r, o], in f64 in row order. */
FX_FAST_KERNEL
static void bias_sums(int64_t rows, int64_t out, const float *restrict dpre, double *restrict sum)
{
    memset(sum, 0, sizeof(double) * (size_t)out);
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict row = dpre + r * out;
#pragma omp simd
        for (int64_t o = 0; o < out; o++)
            sum[o] += row[o];
    }
}

typedef struct bwd_arrays {
    const float *x, *w, *dy, *y, *pre;
    float *dpre, *dx, *dw;
    double *dbias;
} bwd_arrays;

static size_t backward_floats(const fx_linear_bwd_args *a, fx_carve *c, bwd_arrays *v)
{
    const fx_linear_fwd_args *f = &a->fwd;
    const fx_linear_dims *n = &f->n;
    v->x = as_f32(c, f->x);
    v->w = as_f32(c, f->w);
    v->dy = as_f32(c, a->dy);
    v->y = fx_linear_reads_output(f->activation) ? as_f32(c, f->y) : NULL;
    v->pre = fx_linear_reads_pre(f->activation) ? as_f32(c, f->pre) : NULL;
    v->dpre = fx_carve_take(c, n->rows * n->out);
    v->dx = out_f32(c, a->dx);
    v->dw = out_f32(c, a->dw);
    v->dbias = a->dbias ? (double *)fx_carve_take(c, 2 * n->out) : NULL;
    return c->floats;
}

static int fast_backward(const fx_linear_bwd_args *a, fx_status *st)
{
    const fx_linear_dims *n = &a->fwd.n;
    fx_carve size = {0};
    bwd_arrays v;
    const size_t floats = backward_floats(a, &size, &v);
    fx_carve c = {call_floats(floats), 0};
    if (!c.next)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a linear backward's %zu f32 operands", floats);
    backward_floats(a, &c, &v);
    pre_gradient(a->fwd.activation, n->rows * n->out, v.dy, v.y, v.pre, v.dpre);
    /* dx [rows, in] = dpre [rows, out] · w [out, in]; dw [out, in] = dpreᵀ · x [rows, in] */
    const fx_fast_gemm_args dx = {.m = n->rows, .n = n->in, .k = n->out, .a = v.dpre, .lda = n->out, .b = v.w,
                                  .ldb = n->in, .c = v.dx, .ldc = n->in};
    const fx_fast_gemm_args dw = {.trans_a = true, .m = n->out, .n = n->in, .k = n->rows, .a = v.dpre,
                                  .lda = n->out, .b = v.x, .ldb = n->in, .c = v.dw, .ldc = n->in};
    fx_fast_gemm(&dx);
    fx_fast_gemm(&dw);
    if (v.dx != a->dx->data)
        fx_fast_store(a->dx, 0, a->dx->numel, v.dx);
    if (v.dw != a->dw->data)
        fx_fast_store(a->dw, 0, a->dw->numel, v.dw);
    if (a->dbias) {
        bias_sums(n->rows, n->out, v.dpre, v.dbias);
        for (int64_t o = 0; o < n->out; o++)
            fx_store_f64(a->dbias->data, a->dbias->dtype, o, v.dbias[o]);
    }
    return FX_OK;
}

/* ---- the table: the oracle for f64, the reference device, and where no
 * BLAS was found ---- */

static bool oracle(const fx_exec *ex, const fx_linear_fwd_args *a)
{
    return ex->device == FX_CPU_REFERENCE || a->x->dtype == FX_F64 || a->w->dtype != a->x->dtype ||
           !sizes_fit(&a->n) || !fx_blas_available();
}

static int cpu_forward(const fx_exec *ex, const fx_linear_fwd_args *a, fx_status *st)
{
    return oracle(ex, a) ? fx_cpu_linear_ops.forward(ex, a, st) : fast_forward(a, st);
}

static int cpu_backward(const fx_exec *ex, const fx_linear_bwd_args *a, fx_status *st)
{
    return oracle(ex, &a->fwd) ? fx_cpu_linear_ops.backward(ex, a, st) : fast_backward(a, st);
}

/* The fast path's operands live in the caller's own scratch: it asks the
 * context for none. A query without a context (NULL: the device's, which
 * could be either) answers for the oracle, the larger. */
static size_t cpu_forward_scratch(const fx_exec *ex, const fx_linear_fwd_args *a)
{
    return !ex || oracle(ex, a) ? fx_cpu_linear_ops.forward_scratch(ex, a) : 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_linear_bwd_args *a)
{
    return !ex || oracle(ex, &a->fwd) ? fx_cpu_linear_ops.backward_scratch(ex, a) : 0;
}

/* The general product (every epilogue, any strides and batches) is the oracle's. */
static int cpu_gemm(const fx_exec *ex, const fx_gemm_args *g, fx_status *st)
{
    return fx_cpu_linear_ops.gemm(ex, g, st);
}

static size_t cpu_gemm_scratch(const fx_exec *ex, const fx_gemm_args *g)
{
    return fx_cpu_linear_ops.gemm_scratch(ex, g);
}

const struct fx_linear_ops fx_cpu_fast_linear_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
    .gemm = cpu_gemm,
    .gemm_scratch = cpu_gemm_scratch,
};
