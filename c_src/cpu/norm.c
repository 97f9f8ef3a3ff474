/* The CPU RMSNorm and LayerNorm (include/fusex_norm.h): the reference the
 * CUDA backend is tested against. Every value is read into f64 and all
 * arithmetic is f64, a row at a time (OpenMP over rows where it pays). The
 * backward's weight and bias gradients are summed column by column over
 * the rows in row order, a pass of their own, so the sums do not depend on
 * how rows were shared among threads. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu/activation.h"
#include "cpu/cpu.h"
#include "fusex_dtype.h"
#include "fusex_norm.h"

#define COLUMN_BLOCK 64 /* columns a task of the weight gradients' pass */

static double ld(const fx_tensor *t, int64_t i) { return fx_load_f64(t->data, t->dtype, i); }
static void st64(const fx_tensor *t, int64_t i, double v) { fx_store_f64(t->data, t->dtype, i, v); }

static bool parallel_rows(const fx_norm_dims *n) { return n->rows > 1 && n->rows * n->hidden > FX_CPU_PARALLEL_MIN; }

/* A row of hidden doubles for each thread (two in the backward). */
static size_t rows_bytes(const fx_norm_dims *n, int per_thread)
{
    return fx_size_mul(fx_size_mul(n->hidden, (int64_t)per_thread * fx_cpu_threads()), (int64_t)sizeof(double));
}

static size_t scratch_of(size_t bytes) { return bytes ? fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(bytes)) : 0; }

static size_t cpu_forward_scratch(const fx_exec *ex, const fx_norm_fwd_args *a)
{
    (void)ex;
    return scratch_of(rows_bytes(&a->n, 1));
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_norm_bwd_args *a)
{
    (void)ex;
    return scratch_of(rows_bytes(&a->n, 2));
}

/* mean and 1 / sqrt(var + eps) (rms: 0 and 1 / sqrt(mean(s^2) + eps)). */
static void row_statistics(const double *s, int64_t hidden, int kind, double eps, double *mean, double *rstd)
{
    double mu = 0.0;
    if (kind == FX_NORM_LAYER) {
        for (int64_t j = 0; j < hidden; j++)
            mu += s[j];
        mu /= (double)hidden;
    }
    double sq = 0.0;
    for (int64_t j = 0; j < hidden; j++)
        sq += (s[j] - mu) * (s[j] - mu);
    *mean = mu;
    *rstd = 1.0 / sqrt(sq / (double)hidden + eps);
}

static void forward_row(const fx_norm_fwd_args *a, int64_t r, double *s)
{
    const int64_t H = a->n.hidden, base = r * H;
    for (int64_t j = 0; j < H; j++)
        s[j] = ld(a->x, base + j) + (a->residual ? ld(a->residual, base + j) : 0.0);
    double mean, rstd;
    row_statistics(s, H, a->kind, a->eps, &mean, &rstd);
    for (int64_t j = 0; j < H; j++) {
        if (a->residual_out)
            st64(a->residual_out, base + j, s[j]);
        double o = (s[j] - mean) * rstd * ld(a->weight, j) + (a->bias ? ld(a->bias, j) : 0.0);
        if (a->gate)
            o *= fx_activate64(FX_ACT_SILU, ld(a->gate, base + j));
        st64(a->y, base + j, o);
    }
    if (a->mean)
        st64(a->mean, r, mean);
    if (a->rstd)
        st64(a->rstd, r, rstd);
}

static int cpu_forward(const fx_exec *ex, const fx_norm_fwd_args *a, fx_status *st)
{
    double *work = NULL;
    if (fx_scratch_alloc(ex, rows_bytes(&a->n, 1), (void **)&work, st))
        return st->code;
    const int64_t rows = a->n.rows;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < rows && !fx_watch_gone(&w); lo = fx_piece_end(lo, rows)) {
        const int64_t hi = fx_piece_end(lo, rows);
#pragma omp parallel for if (parallel_rows(&a->n)) schedule(static)
        for (int64_t r = lo; r < hi; r++)
            forward_row(a, r, work + (size_t)omp_get_thread_num() * (size_t)a->n.hidden);
    }
    fx_scratch_release(ex, work);
    return fx_watch_end(&w, a->kind == FX_NORM_RMS ? "an rms_norm" : "a layer_norm", st);
}

/* The normalised value and what scales the output (do) at element j of
 * row r: n, and do = dy * silu(gate) with dgate's factor. */
typedef struct elem_grad {
    double n, dout, dgate;
} elem_grad;

static elem_grad element(const fx_norm_bwd_args *a, int64_t r, int64_t j)
{
    const int64_t at = r * a->n.hidden + j;
    const double mean = a->mean ? ld(a->mean, r) : 0.0, rstd = ld(a->rstd, r);
    elem_grad e;
    e.n = (ld(a->xs, at) - mean) * rstd;
    const double dy = ld(a->dy, at);
    e.dout = dy;
    e.dgate = 0.0;
    if (a->gate) {
        const double g = ld(a->gate, at);
        const double o = e.n * ld(a->weight, j) + (a->bias ? ld(a->bias, j) : 0.0);
        e.dout = dy * fx_activate64(FX_ACT_SILU, g);
        e.dgate = dy * o * fx_activate64_grad(FX_ACT_SILU, g);
    }
    return e;
}

static void backward_row(const fx_norm_bwd_args *a, int64_t r, double *nrow, double *dn)
{
    const int64_t H = a->n.hidden, base = r * H;
    double sum_dn = 0.0, sum_dnn = 0.0;
    for (int64_t j = 0; j < H; j++) {
        const elem_grad e = element(a, r, j);
        nrow[j] = e.n;
        dn[j] = e.dout * ld(a->weight, j);
        sum_dn += dn[j];
        sum_dnn += dn[j] * e.n;
        if (a->dgate)
            st64(a->dgate, base + j, e.dgate);
    }
    const double rstd = ld(a->rstd, r);
    const double mean_dn = a->kind == FX_NORM_LAYER ? sum_dn / (double)H : 0.0, mean_dnn = sum_dnn / (double)H;
    for (int64_t j = 0; j < H; j++) {
        double ds = rstd * (dn[j] - mean_dn - nrow[j] * mean_dnn);
        if (a->dresidual_out)
            ds += ld(a->dresidual_out, base + j);
        st64(a->dx, base + j, ds);
        if (a->dresidual)
            st64(a->dresidual, base + j, ds);
    }
}

/* dweight and dbias for the columns [c0, c1), summed over the rows in order. */
static void weight_columns(const fx_norm_bwd_args *a, int64_t c0, int64_t c1)
{
    double dw[COLUMN_BLOCK] = {0}, db[COLUMN_BLOCK] = {0};
    for (int64_t r = 0; r < a->n.rows; r++)
        for (int64_t j = c0; j < c1; j++) {
            const elem_grad e = element(a, r, j);
            dw[j - c0] += e.dout * e.n;
            db[j - c0] += e.dout;
        }
    for (int64_t j = c0; j < c1; j++) {
        st64(a->dweight, j, dw[j - c0]);
        if (a->dbias)
            st64(a->dbias, j, db[j - c0]);
    }
}

static int cpu_backward(const fx_exec *ex, const fx_norm_bwd_args *a, fx_status *st)
{
    double *work = NULL;
    if (fx_scratch_alloc(ex, rows_bytes(&a->n, 2), (void **)&work, st))
        return st->code;
    const int64_t rows = a->n.rows, H = a->n.hidden;
    const bool parallel = parallel_rows(&a->n);
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < rows && !fx_watch_gone(&w); lo = fx_piece_end(lo, rows)) {
        const int64_t hi = fx_piece_end(lo, rows);
#pragma omp parallel for if (parallel) schedule(static)
        for (int64_t r = lo; r < hi; r++) {
            double *mine = work + (size_t)omp_get_thread_num() * 2 * (size_t)H;
            backward_row(a, r, mine, mine + H);
        }
    }
    const int64_t blocks = (H + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    if (!fx_watch_gone(&w)) {
#pragma omp parallel for if (parallel) schedule(static)
        for (int64_t b = 0; b < blocks; b++)
            weight_columns(a, b * COLUMN_BLOCK, b * COLUMN_BLOCK + COLUMN_BLOCK < H ? b * COLUMN_BLOCK + COLUMN_BLOCK : H);
    }
    fx_scratch_release(ex, work);
    return fx_watch_end(&w, a->kind == FX_NORM_RMS ? "an rms_norm backward" : "a layer_norm backward", st);
}

const struct fx_norm_ops fx_cpu_norm_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
};
