/* The fast RMSNorm and LayerNorm (fusex_norm.h): f32 arithmetic, a row a
 * task (rows split over the pool), each row's passes vectorised along the
 * hidden axis with the statistics summed in vector lanes. The backward's
 * weight and bias gradients are a pass of their own over column blocks,
 * each block one thread's, summed over the rows in row order in f64, so
 * results do not depend on the threads. bf16/f16 rows convert on load. */
#include <stdatomic.h>

#include "cpu/fast/fast.h"
#include "fusex_norm.h"

#define COLS 256 /* columns a block of the weight gradients' pass */

static int64_t call_work(const fx_norm_dims *n)
{
    const size_t s = fx_size_mul(n->rows, n->hidden);
    return s > (size_t)(INT64_MAX / 8) ? INT64_MAX / 8 : (int64_t)s;
}

/* A row's f32 arrays: the normalised input, the weight, the bias, the gate
 * and conversion buffers, hidden floats each. */
enum { R_S, R_W, R_B, R_G, R_BUF1, R_BUF2, R_BUF3, R_ROWS };

static float *row_scratch(int64_t hidden)
{
    const size_t bytes = fx_size_mul((int64_t)fx_size_mul(R_ROWS, hidden > 0 ? hidden : 1), sizeof(float));
    return bytes == SIZE_MAX ? NULL : fx_fast_scratch(bytes);
}

/* The per-column tensors (weight, bias) as f32 rows, once a task. */
static const float *column_row(const fx_tensor *t, int64_t H, float *buf)
{
    return t ? fx_fast_load(t, 0, H, buf) : NULL;
}

/* ---- forward ---- */

typedef struct fwd_job {
    const fx_norm_fwd_args *a;
    fx_watch *w;
    atomic_bool out_of_memory;
} fwd_job;

/* mean and rstd of s over H (rms: mean 0). */
FX_INLINE void statistics(int kind, int64_t H, double eps, const float *restrict s, float *mean, float *rstd)
{
    float mu = 0.0f;
    if (kind == FX_NORM_LAYER) {
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < H; j++)
            sum += s[j];
        mu = sum / (float)H;
    }
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < H; j++)
        sq += (s[j] - mu) * (s[j] - mu);
    *mean = mu;
    *rstd = 1.0f / sqrtf(sq / (float)H + (float)eps);
}

FX_FAST_KERNEL
static void forward_row(const fx_norm_fwd_args *a, int64_t r, float *k, const float *w, const float *bias)
{
    const int64_t H = a->n.hidden, i0 = r * H;
    float *restrict s = k + R_S * H;
    const float *x = fx_fast_load(a->x, i0, H, k + R_BUF1 * H);
    if (a->residual) {
        const float *restrict res = fx_fast_load(a->residual, i0, H, k + R_BUF2 * H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++)
            s[j] = x[j] + res[j];
        fx_fast_store(a->residual_out, i0, H, s);
    } else {
        memcpy(s, x, sizeof(float) * (size_t)H);
    }
    float mean, rstd;
    statistics(a->kind, H, a->eps, s, &mean, &rstd);
    float *restrict y = fx_fast_out(a->y, i0, k + R_BUF1 * H);
    if (bias) {
#pragma omp simd
        for (int64_t j = 0; j < H; j++)
            y[j] = (s[j] - mean) * rstd * w[j] + bias[j];
    } else {
#pragma omp simd
        for (int64_t j = 0; j < H; j++)
            y[j] = (s[j] - mean) * rstd * w[j];
    }
    if (a->gate) {
        const float *restrict g = fx_fast_load(a->gate, i0, H, k + R_BUF3 * H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++)
            y[j] *= fx_fast_silu(g[j]);
    }
    if (y == k + R_BUF1 * H)
        fx_fast_store(a->y, i0, H, y);
    if (a->mean)
        fx_store_f64(a->mean->data, a->mean->dtype, r, mean);
    if (a->rstd)
        fx_store_f64(a->rstd->data, a->rstd->dtype, r, rstd);
}

/* A worker's row scratch and the weight and bias rows as f32 in it; false
 * (the job's out_of_memory set) where the scratch cannot be had. */
static bool row_setup(const fx_tensor *weight, const fx_tensor *bias, int64_t H, atomic_bool *out_of_memory,
                      float **k, const float **w, const float **b)
{
    *k = row_scratch(H);
    if (!*k) {
        atomic_store(out_of_memory, true);
        return false;
    }
    *w = column_row(weight, H, *k + R_W * H);
    *b = column_row(bias, H, *k + R_B * H);
    return true;
}

static void fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    fwd_job *job = ctx;
    const int64_t H = job->a->n.hidden;
    float *k;
    const float *w, *b;
    if (!row_setup(job->a->weight, job->a->bias, H, &job->out_of_memory, &k, &w, &b))
        return;
    for (int64_t r = lo; r < hi; r++) {
        if (r % 64 == 63 && fx_watch_gone(job->w))
            return;
        forward_row(job->a, r, k, w, b);
    }
}

static int fast_forward(const fx_norm_fwd_args *a, fx_status *st)
{
    fx_watch w;
    fx_watch_begin(&w);
    fwd_job job = {a, &w, false};
    fx_pool_run(a->n.rows, 1, call_work(&a->n) * 2, fwd_range, &job);
    if (atomic_load(&job.out_of_memory))
        return fx_fail(st, FX_ENOMEM, "out of host memory for a norm's rows of %lld", (long long)a->n.hidden);
    return fx_watch_end(&w, a->kind == FX_NORM_RMS ? "an rms_norm" : "a layer_norm", st);
}

/* ---- backward ---- */

typedef struct bwd_job {
    const fx_norm_bwd_args *a;
    fx_watch *w;
    atomic_bool out_of_memory;
} bwd_job;

/* Columns [c0, c0 + cw) of row r: the normalised values n and do (the
 * output's gradient with the gate's factor: dy silu(gate)); dgate where
 * asked. w and bias start at column c0. */
FX_INLINE void row_terms(const fx_norm_bwd_args *a, int64_t r, int64_t c0, int64_t cw, float *k, const float *w,
                         const float *bias, float *restrict nrow, float *restrict dout)
{
    const int64_t H = a->n.hidden, i0 = r * H + c0;
    const float mean = a->mean ? (float)fx_load_f64(a->mean->data, a->mean->dtype, r) : 0.0f;
    const float rstd = (float)fx_load_f64(a->rstd->data, a->rstd->dtype, r);
    const float *restrict xs = fx_fast_load(a->xs, i0, cw, k + R_BUF1 * H);
#pragma omp simd
    for (int64_t j = 0; j < cw; j++)
        nrow[j] = (xs[j] - mean) * rstd;
    const float *restrict dy = fx_fast_load(a->dy, i0, cw, k + R_BUF2 * H);
    if (!a->gate) {
        memcpy(dout, dy, sizeof(float) * (size_t)cw);
        return;
    }
    const float *restrict g = fx_fast_load(a->gate, i0, cw, k + R_BUF3 * H);
    float *restrict dg = a->dgate ? fx_fast_out(a->dgate, i0, k + R_BUF1 * H) : NULL;
#pragma omp simd
    for (int64_t j = 0; j < cw; j++) {
        const float o = nrow[j] * w[j] + (bias ? bias[j] : 0.0f);
        if (dg)
            dg[j] = dy[j] * o * fx_fast_silu_grad(g[j]);
        dout[j] = dy[j] * fx_fast_silu(g[j]);
    }
    if (dg && dg == k + R_BUF1 * H)
        fx_fast_store(a->dgate, i0, cw, dg);
}

FX_FAST_KERNEL
static void backward_row(const fx_norm_bwd_args *a, int64_t r, float *k, const float *w, const float *bias)
{
    const int64_t H = a->n.hidden, i0 = r * H;
    float *restrict nrow = k + R_S * H, *restrict dn = k + R_G * H;
    row_terms(a, r, 0, H, k, w, bias, nrow, dn);
    float sum_dn = 0.0f, sum_dnn = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dnn)
    for (int64_t j = 0; j < H; j++) {
        dn[j] *= w[j];
        sum_dn += dn[j];
        sum_dnn += dn[j] * nrow[j];
    }
    const float rstd = (float)fx_load_f64(a->rstd->data, a->rstd->dtype, r);
    const float mean_dn = a->kind == FX_NORM_LAYER ? sum_dn / (float)H : 0.0f, mean_dnn = sum_dnn / (float)H;
    const float *restrict dres = a->dresidual_out ? fx_fast_load(a->dresidual_out, i0, H, k + R_BUF2 * H) : NULL;
    float *restrict ds = fx_fast_out(a->dx, i0, k + R_BUF3 * H);
#pragma omp simd
    for (int64_t j = 0; j < H; j++)
        ds[j] = rstd * (dn[j] - mean_dn - nrow[j] * mean_dnn) + (dres ? dres[j] : 0.0f);
    if (ds == k + R_BUF3 * H)
        fx_fast_store(a->dx, i0, H, ds);
    if (a->dresidual)
        fx_fast_store(a->dresidual, i0, H, ds);
}

static void bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    bwd_job *job = ctx;
    const int64_t H = job->a->n.hidden;
    float *k;
    const float *w, *b;
    if (!row_setup(job->a->weight, job->a->bias, H, &job->out_of_memory, &k, &w, &b))
        return;
    for (int64_t r = lo; r < hi; r++) {
        if (r % 64 == 63 && fx_watch_gone(job->w))
            return;
        backward_row(job->a, r, k, w, b);
    }
}

/* dweight and dbias of columns [c0, c1): do * n and do summed over the
 * rows in order, in f64. */
FX_FAST_KERNEL
static void weight_block(const fx_norm_bwd_args *a, int64_t c0, int64_t c1, float *k, const float *w,
                         const float *bias)
{
    const int64_t H = a->n.hidden, cw = c1 - c0;
    double dw[COLS] = {0}, db[COLS] = {0};
    float *nrow = k + R_S * H, *dout = k + R_G * H;
    const float *wc = w + c0, *bc = bias ? bias + c0 : NULL;
    for (int64_t r = 0; r < a->n.rows; r++) {
        row_terms(a, r, c0, cw, k, wc, bc, nrow, dout);
        const float *restrict nn = nrow, *restrict dd = dout;
#pragma omp simd
        for (int64_t j = 0; j < cw; j++) {
            dw[j] += (double)(dd[j] * nn[j]);
            db[j] += (double)dd[j];
        }
    }
    for (int64_t j = 0; j < cw; j++) {
        fx_store_f64(a->dweight->data, a->dweight->dtype, c0 + j, dw[j]);
        if (a->dbias)
            fx_store_f64(a->dbias->data, a->dbias->dtype, c0 + j, db[j]);
    }
}

static void weight_range(void *ctx, int64_t lo, int64_t hi)
{
    bwd_job *job = ctx;
    const fx_norm_bwd_args *a = job->a;
    const int64_t H = a->n.hidden;
    float *k;
    const float *w, *b;
    if (!row_setup(a->weight, a->bias, H, &job->out_of_memory, &k, &w, &b))
        return;
    /* the dgate of row_terms is written by the rows' pass: not again here */
    fx_norm_bwd_args quiet = *a;
    quiet.dgate = NULL;
    for (int64_t blk = lo; blk < hi && !fx_watch_gone(job->w); blk++)
        weight_block(&quiet, blk * COLS, blk * COLS + COLS < H ? blk * COLS + COLS : H, k, w, b);
}

static int fast_backward(const fx_norm_bwd_args *a, fx_status *st)
{
    fx_watch w;
    fx_watch_begin(&w);
    bwd_job job = {a, &w, false};
    fx_pool_run(a->n.rows, 1, call_work(&a->n) * 4, bwd_range, &job);
    const int64_t blocks = (a->n.hidden + COLS - 1) / COLS;
    if (!atomic_load(&job.out_of_memory) && !fx_watch_gone(&w))
        fx_pool_run(blocks, 1, call_work(&a->n) * 4, weight_range, &job);
    if (atomic_load(&job.out_of_memory))
        return fx_fail(st, FX_ENOMEM, "out of host memory for a norm backward's rows of %lld",
                       (long long)a->n.hidden);
    return fx_watch_end(&w, a->kind == FX_NORM_RMS ? "an rms_norm backward" : "a layer_norm backward", st);
}

/* ---- the table: the oracle for f64 and for the reference device ---- */

static bool oracle(const fx_exec *ex, fx_dtype x_type)
{
    return ex->device == FX_CPU_REFERENCE || x_type == FX_F64;
}

static int cpu_forward(const fx_exec *ex, const fx_norm_fwd_args *a, fx_status *st)
{
    return oracle(ex, a->x->dtype) ? fx_cpu_norm_ops.forward(ex, a, st) : fast_forward(a, st);
}

static int cpu_backward(const fx_exec *ex, const fx_norm_bwd_args *a, fx_status *st)
{
    return oracle(ex, a->xs->dtype) ? fx_cpu_norm_ops.backward(ex, a, st) : fast_backward(a, st);
}

/* The fast path's rows are its threads' own (fx_fast_scratch). A query
 * without a context (NULL: the device's, either) answers for the oracle. */
static size_t cpu_forward_scratch(const fx_exec *ex, const fx_norm_fwd_args *a)
{
    return !ex || oracle(ex, a->x->dtype) ? fx_cpu_norm_ops.forward_scratch(ex, a) : 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_norm_bwd_args *a)
{
    return !ex || oracle(ex, a->xs->dtype) ? fx_cpu_norm_ops.backward_scratch(ex, a) : 0;
}

const struct fx_norm_ops fx_cpu_fast_norm_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
};
