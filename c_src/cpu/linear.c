/* The CPU linear layers and the matrix product under them: the reference
 * the CUDA backend is tested against. Every product goes through one
 * function, cpu_gemm (f64 accumulation, the epilogue in f64): the seam
 * where a fast f32 kernel plugs in without the layers changing. */
#include <omp.h>

#include "cpu/activation.h"
#include "cpu/cpu.h"
#include "fusex_dtype.h"
#include "fusex_linear.h"

/* Below this many multiply-adds a product runs on one thread. */
#define GEMM_PARALLEL_MIN ((int64_t)1 << 22)

static bool is_float(fx_dtype t) { return t == FX_F32 || t == FX_F64 || t == FX_BF16 || t == FX_F16; }

static int check_gemm(const fx_gemm_args *g, fx_status *st)
{
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 1)
        return fx_fail(st, FX_EBADARG, "gemm: expected m, n, k >= 0 and batch >= 1, got m %lld, n %lld, k %lld, batch %lld",
                       (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch);
    /* Everything is f64 inside: any float type in, any out. */
    if (!is_float(g->ab_type) || !is_float(g->c_type) || (g->bias && !is_float(g->bias_type)))
        return fx_fail(st, FX_EBADARG, "gemm: expected float types, got A and B %s, C %s", fx_dtype_name(g->ab_type),
                       fx_dtype_name(g->c_type));
    if (g->activation < 0 || g->activation >= FX_ACT_COUNT)
        return fx_fail(st, FX_EBADARG, "gemm: expected an activation 0..%d, got %d", FX_ACT_COUNT - 1, g->activation);
    const int64_t a_cols = g->trans_a ? g->m : g->k, b_cols = g->trans_b ? g->k : g->n;
    if (g->lda < (a_cols > 1 ? a_cols : 1) || g->ldb < (b_cols > 1 ? b_cols : 1) || g->ldc < (g->n > 1 ? g->n : 1))
        return fx_fail(st, FX_EBADARG, "gemm: expected lda >= %lld, ldb >= %lld, ldc >= %lld, got %lld, %lld, %lld",
                       (long long)a_cols, (long long)b_cols, (long long)g->n, (long long)g->lda, (long long)g->ldb,
                       (long long)g->ldc);
    return FX_OK;
}

/* A row of C accumulates in f64, one row of n a thread. */
static size_t gemm_workspace_doubles(const fx_gemm_args *g) { return fx_size_mul(g->n, fx_cpu_threads()); }

static size_t cpu_gemm_scratch(const fx_exec *ex, const fx_gemm_args *g)
{
    (void)ex;
    const size_t doubles = gemm_workspace_doubles(g);
    if (doubles == 0)
        return 0;
    return fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(fx_size_mul((int64_t)doubles, (int64_t)sizeof(double))));
}

static double a_at(const fx_gemm_args *g, int64_t base, int64_t i, int64_t kk)
{
    return fx_load_f64(g->a, g->ab_type, base + (g->trans_a ? kk * g->lda + i : i * g->lda + kk));
}

/* Row i of batch bt: acc[j] = sum_k opA(A)[i, k] opB(B)[k, j]. */
static void row_product(const fx_gemm_args *g, int64_t bt, int64_t i, double *acc)
{
    const int64_t sa = g->batch > 1 ? bt * g->stride_a : 0, sb = g->batch > 1 ? bt * g->stride_b : 0;
    if (g->trans_b) { /* B stored [n, k]: dot products */
        for (int64_t j = 0; j < g->n; j++) {
            double sum = 0.0;
            for (int64_t kk = 0; kk < g->k; kk++)
                sum += a_at(g, sa, i, kk) * fx_load_f64(g->b, g->ab_type, sb + j * g->ldb + kk);
            acc[j] = sum;
        }
        return;
    }
    for (int64_t j = 0; j < g->n; j++)
        acc[j] = 0.0;
    for (int64_t kk = 0; kk < g->k; kk++) {
        const double aik = a_at(g, sa, i, kk);
        const int64_t row = sb + kk * g->ldb;
        if (g->ab_type == FX_F32) {
            const float *b = (const float *)g->b + row;
            for (int64_t j = 0; j < g->n; j++)
                acc[j] += aik * b[j];
        } else {
            for (int64_t j = 0; j < g->n; j++)
                acc[j] += aik * fx_load_f64(g->b, g->ab_type, row + j);
        }
    }
}

/* The epilogue of row i: pre = alpha acc + beta C + bias; aux = pre; C = act(pre). */
static void row_epilogue(const fx_gemm_args *g, int64_t bt, int64_t i, const double *acc)
{
    const int64_t base = (g->batch > 1 ? bt * g->stride_c : 0) + i * g->ldc;
    for (int64_t j = 0; j < g->n; j++) {
        double pre = g->k > 0 ? (double)g->alpha * acc[j] : 0.0;
        if (g->beta != 0.0f)
            pre += (double)g->beta * fx_load_f64(g->c, g->c_type, base + j);
        if (g->bias)
            pre += fx_load_f64(g->bias, g->bias_type, j);
        if (g->aux)
            fx_store_f64(g->aux, g->c_type, base + j, pre);
        fx_store_f64(g->c, g->c_type, base + j, fx_activate64(g->activation, pre));
    }
}

/* The one product of the CPU backend (fusex_linear.h's gemm). */
static int cpu_gemm(const fx_exec *ex, const fx_gemm_args *g, fx_status *st)
{
    if (check_gemm(g, st))
        return st->code;
    if (g->m == 0 || g->n == 0)
        return FX_OK;
    const int64_t rows = g->batch * g->m;
    double *work = NULL;
    if (fx_scratch_alloc(ex, fx_size_mul((int64_t)gemm_workspace_doubles(g), (int64_t)sizeof(double)), (void **)&work,
                         st))
        return st->code;
    const bool parallel = rows > 1 && (double)rows * (double)g->n * (double)(g->k + 1) > (double)GEMM_PARALLEL_MIN;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < rows && !fx_watch_gone(&w); lo = fx_piece_end(lo, rows)) {
        const int64_t hi = fx_piece_end(lo, rows);
#pragma omp parallel for if (parallel) schedule(static)
        for (int64_t r = lo; r < hi; r++) {
            if (fx_watch_gone(&w))
                continue;
            double *acc = work + (size_t)omp_get_thread_num() * (size_t)g->n;
            const int64_t bt = r / g->m, i = r % g->m;
            if (g->k > 0)
                row_product(g, bt, i, acc);
            row_epilogue(g, bt, i, acc);
        }
    }
    fx_scratch_release(ex, work);
    return fx_watch_end(&w, "a gemm", st);
}

/* ---- the layer ---- */

static fx_gemm_args layer_product(const fx_linear_fwd_args *a)
{
    fx_gemm_args g = {
        .trans_b = true, .m = a->n.rows, .n = a->n.out, .k = a->n.in,
        .a = a->x->data, .lda = a->n.in > 0 ? a->n.in : 1, .b = a->w->data, .ldb = a->n.in > 0 ? a->n.in : 1,
        .c = a->y->data, .ldc = a->n.out > 0 ? a->n.out : 1, .ab_type = a->x->dtype, .c_type = a->y->dtype,
        .alpha = 1.0f, .beta = 0.0f, .bias = a->bias ? a->bias->data : NULL,
        .bias_type = a->bias ? a->bias->dtype : FX_F64, .activation = a->activation,
        .aux = a->pre ? a->pre->data : NULL, .batch = 1,
    };
    return g;
}

static int cpu_linear_forward(const fx_exec *ex, const fx_linear_fwd_args *a, fx_status *st)
{
    const fx_gemm_args g = layer_product(a);
    return cpu_gemm(ex, &g, st);
}

static size_t cpu_linear_forward_scratch(const fx_exec *ex, const fx_linear_fwd_args *a)
{
    const fx_gemm_args g = layer_product(a);
    return cpu_gemm_scratch(ex, &g);
}

/* The backward's f64 copies: dpre [rows, out], x [rows, in], w [out, in]. */
static size_t doubles_bytes(int64_t a, int64_t b) { return fx_size_mul(fx_size_mul(a, b), (int64_t)sizeof(double)); }

static size_t cpu_linear_backward_scratch(const fx_exec *ex, const fx_linear_bwd_args *a)
{
    const fx_linear_dims *n = &a->fwd.n;
    size_t total = FX_SCRATCH_ALIGN;
    total = fx_size_add(total, fx_scratch_piece(doubles_bytes(n->rows, n->out)));
    total = fx_size_add(total, fx_scratch_piece(doubles_bytes(n->rows, n->in)));
    total = fx_size_add(total, fx_scratch_piece(doubles_bytes(n->out, n->in)));
    /* each product's own rows, one after the other */
    fx_gemm_args dx = {.n = n->in}, dw = {.n = n->in};
    total = fx_size_add(total, cpu_gemm_scratch(ex, &dx));
    return fx_size_add(total, cpu_gemm_scratch(ex, &dw));
}

static void to_f64(const fx_tensor *t, double *out)
{
    for (int64_t i = 0; i < t->numel; i++)
        out[i] = fx_load_f64(t->data, t->dtype, i);
}

/* dpre = dy * act'(.), from y or from pre as the activation needs. */
static void pre_gradient(const fx_linear_bwd_args *a, double *dpre)
{
    const int act = a->fwd.activation;
    const int64_t n = a->dy->numel;
    for (int64_t i = 0; i < n; i++) {
        const double dy = fx_load_f64(a->dy->data, a->dy->dtype, i);
        double grad = 1.0;
        if (fx_linear_reads_output(act))
            grad = fx_activate64_grad_at_output(act, fx_load_f64(a->fwd.y->data, a->fwd.y->dtype, i));
        else if (fx_linear_reads_pre(act))
            grad = fx_activate64_grad(act, fx_load_f64(a->fwd.pre->data, a->fwd.pre->dtype, i));
        dpre[i] = dy * grad;
    }
}

static int cpu_linear_backward(const fx_exec *ex, const fx_linear_bwd_args *a, fx_status *st)
{
    const fx_linear_dims *n = &a->fwd.n;
    double *dpre = NULL, *x = NULL, *w = NULL;
    if (fx_scratch_alloc(ex, doubles_bytes(n->rows, n->out), (void **)&dpre, st) ||
        fx_scratch_alloc(ex, doubles_bytes(n->rows, n->in), (void **)&x, st) ||
        fx_scratch_alloc(ex, doubles_bytes(n->out, n->in), (void **)&w, st))
        goto done;
    pre_gradient(a, dpre);
    to_f64(a->fwd.x, x);
    to_f64(a->fwd.w, w);
    const int64_t in_ld = n->in > 0 ? n->in : 1, out_ld = n->out > 0 ? n->out : 1;
    /* dx [rows, in] = dpre [rows, out] · w [out, in] */
    fx_gemm_args dx = {.m = n->rows, .n = n->in, .k = n->out, .a = dpre, .lda = out_ld, .b = w, .ldb = in_ld,
                       .c = a->dx->data, .ldc = in_ld, .ab_type = FX_F64, .c_type = a->dx->dtype, .alpha = 1.0f,
                       .batch = 1};
    /* dw [out, in] = dpreᵀ [out, rows] · x [rows, in] */
    fx_gemm_args dw = {.trans_a = true, .m = n->out, .n = n->in, .k = n->rows, .a = dpre, .lda = out_ld, .b = x,
                       .ldb = in_ld, .c = a->dw->data, .ldc = in_ld, .ab_type = FX_F64, .c_type = a->dw->dtype,
                       .alpha = 1.0f, .batch = 1};
    if (cpu_gemm(ex, &dx, st) || cpu_gemm(ex, &dw, st))
        goto done;
    if (a->dbias)
        for (int64_t o = 0; o < n->out; o++) {
            double sum = 0.0;
            for (int64_t r = 0; r < n->rows; r++)
                sum += dpre[r * n->out + o];
            fx_store_f64(a->dbias->data, a->dbias->dtype, o, sum);
        }
done:
    fx_scratch_release(ex, w);
    fx_scratch_release(ex, x);
    fx_scratch_release(ex, dpre);
    return st->code;
}

const struct fx_linear_ops fx_cpu_linear_ops = {
    .forward = cpu_linear_forward,
    .backward = cpu_linear_backward,
    .forward_scratch = cpu_linear_forward_scratch,
    .backward_scratch = cpu_linear_backward_scratch,
    .gemm = cpu_gemm,
    .gemm_scratch = cpu_gemm_scratch,
};
