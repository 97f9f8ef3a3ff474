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
    if (!is_float(g->ab_type) || (g->c_type != g->ab_type && g->c_type != FX_F32) ||
        (g->bias && !is_float(g->bias_type)))
        return fx_fail(st, FX_EBADARG, "gemm: expected float A and B, C of their type or {f,32}, got %s, %s",
                       fx_dtype_name(g->ab_type), fx_dtype_name(g->c_type));
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

const struct fx_linear_ops fx_cpu_linear_ops = {
    .gemm = cpu_gemm,
    .gemm_scratch = cpu_gemm_scratch,
};
