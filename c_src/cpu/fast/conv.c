/* The fast causal depthwise conv1d (fusex_conv.h): f32 arithmetic, the
 * loops along contiguous channels of one batch row (the layout's innermost
 * axis). Forward and step split (batch, channel block) columns over the
 * pool; the backward splits channel blocks, each owning its channels' weight
 * and bias sums over batch and time (f32 partials of POLL steps added into
 * f64, in batch then time order), so results do not depend on the threads.
 * A block keeps its taps transposed to [width][channel] and the last
 * width - 1 inputs in a ring of rows. */
#include <stdatomic.h>

#include "cpu/fast/fast.h"
#include "fusex_conv.h"

#define SEG 256 /* channels a block */
#define POLL 64 /* steps between looks at the caller's watch (and sum flushes) */
#define WMAX FX_CONV_MAX_WIDTH

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t call_work(const fx_conv_dims *n)
{
    const size_t s = fx_size_mul(fx_size_mul(n->batch * n->seqlen, n->dim), n->width);
    return s > (size_t)(INT64_MAX / 4) ? INT64_MAX / 4 : (int64_t)s;
}

/* A block's taps [width][SEG] and bias. */
typedef struct taps {
    _Alignas(64) float w[WMAX][SEG];
    _Alignas(64) float bias[SEG];
} taps;

static void load_taps(const fx_tensor *w, const fx_tensor *bias, int64_t W, int64_t d0, int64_t cw, taps *t)
{
    for (int64_t k = 0; k < W; k++)
        fx_fast_load_strided(w, d0 * W + k, W, cw, t->w[k]);
    if (!bias) {
        memset(t->bias, 0, sizeof(float) * (size_t)cw);
        return;
    }
    const float *b = fx_fast_load(bias, d0, cw, t->bias);
    if (b != t->bias)
        memcpy(t->bias, b, sizeof(float) * (size_t)cw);
}

/* The last width - 1 inputs of a block as a ring of rows: row (pos + k) %
 * (width - 1) holds x_{t - (width - 1) + k}, oldest first from pos. */
typedef struct ring {
    _Alignas(64) float row[WMAX][SEG];
    int64_t pos, size;
} ring;

FX_INLINE float *ring_at(ring *r, int64_t k) { return r->row[(r->pos + k) % r->size]; }

/* From a state [.., channel, width - 1] (or zeros), channels d0.. of batch b. */
static void ring_load(ring *r, const fx_tensor *state, int64_t b, int64_t D, int64_t W, int64_t d0, int64_t cw)
{
    r->pos = 0;
    r->size = W - 1 > 0 ? W - 1 : 1;
    for (int64_t k = 0; k < W - 1; k++) {
        if (state)
            fx_fast_load_strided(state, (b * D + d0) * (W - 1) + k, W - 1, cw, r->row[k]);
        else
            memset(r->row[k], 0, sizeof(float) * (size_t)cw);
    }
}

static void ring_store(ring *r, const fx_tensor *state, int64_t b, int64_t D, int64_t W, int64_t d0, int64_t cw)
{
    for (int64_t k = 0; k < W - 1; k++)
        fx_fast_store_strided(state, (b * D + d0) * (W - 1) + k, W - 1, cw, ring_at(r, k));
}

/* The oldest row leaves, x enters. */
static void ring_push(ring *r, int64_t W, int64_t cw, const float *x)
{
    if (W < 2)
        return;
    memcpy(r->row[r->pos], x, sizeof(float) * (size_t)cw);
    r->pos = (r->pos + 1) % r->size;
}

/* acc = bias + sum_k w_k x_{t - (W-1) + k}: the ring's rows and x_t. */
FX_INLINE void pre_row(const taps *tp, ring *r, int64_t W, int64_t cw, const float *restrict x, float *restrict acc)
{
    const float *restrict wl = tp->w[W - 1];
#pragma omp simd
    for (int64_t c = 0; c < cw; c++)
        acc[c] = tp->bias[c] + wl[c] * x[c];
    for (int64_t k = 0; k < W - 1; k++) {
        const float *restrict wk = tp->w[k], *restrict xk = ring_at(r, k);
#pragma omp simd
        for (int64_t c = 0; c < cw; c++)
            acc[c] += wk[c] * xk[c];
    }
}

FX_INLINE void activate_row(int act, int64_t cw, float *restrict v)
{
    if (act == FX_ACT_SILU) {
#pragma omp simd
        for (int64_t c = 0; c < cw; c++)
            v[c] = fx_fast_silu(v[c]);
    }
}

/* ---- forward ---- */

typedef struct fwd_job {
    const fx_conv_fwd_args *a;
    fx_watch *w;
} fwd_job;

FX_FAST_KERNEL
static void fwd_block(const fwd_job *job, int64_t b, int64_t d0, int64_t cw)
{
    const fx_conv_fwd_args *a = job->a;
    const int64_t L = a->n.seqlen, D = a->n.dim, W = a->n.width;
    taps tp;
    ring r;
    _Alignas(64) float xbuf[SEG], ybuf[SEG];
    load_taps(a->w, a->bias, W, d0, cw, &tp);
    ring_load(&r, a->initial_state, b, D, W, d0, cw);
    for (int64_t t = 0; t < L; t++) {
        if (t % POLL == POLL - 1 && fx_watch_gone(job->w))
            return;
        const int64_t i0 = (b * L + t) * D + d0;
        const float *x = fx_fast_load(a->x, i0, cw, xbuf);
        float *y = fx_fast_out(a->y, i0, ybuf);
        pre_row(&tp, &r, W, cw, x, y);
        activate_row(a->activation, cw, y);
        if (y == ybuf)
            fx_fast_store(a->y, i0, cw, y);
        ring_push(&r, W, cw, x);
    }
    if (a->final_state)
        ring_store(&r, a->final_state, b, D, W, d0, cw);
}

static void fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    const fwd_job *job = ctx;
    const int64_t D = job->a->n.dim;
    for (int64_t c = lo; c < hi && !fx_watch_gone(job->w);) {
        const int64_t b = c / D, d0 = c % D, cw = min64(min64(SEG, D - d0), hi - c);
        fwd_block(job, b, d0, cw);
        c += cw;
    }
}

static int fast_forward(const fx_conv_fwd_args *a, fx_status *st)
{
    fx_watch w;
    fx_watch_begin(&w);
    fwd_job job = {a, &w};
    fx_pool_run(a->n.batch * a->n.dim, 16, call_work(&a->n), fwd_range, &job);
    return fx_watch_end(&w, "a causal_conv1d", st);
}

/* ---- step: a forward of one frame whose state is read and written ---- */

static int fast_step(const fx_conv_step_args *a, fx_status *st)
{
    (void)st;
    fx_conv_fwd_args f = {.n = a->n, .x = a->x, .w = a->w, .bias = a->bias, .initial_state = a->state,
                          .activation = a->activation, .y = a->y, .final_state = a->state};
    f.n.seqlen = 1;
    fx_watch w = {0}; /* nothing to watch: a frame's step is short */
    fwd_job job = {&f, &w};
    fx_pool_run(a->n.batch * a->n.dim, 16, call_work(&f.n), fwd_range, &job);
    return FX_OK;
}

/* ---- backward ----
 * Backwards in time per (batch, block): g_t = dy_t act'(pre_t) (pre
 * recomputed), dx_t = sum_k w_k g_{t + (W-1) - k} (+ the final state's
 * gradient for the last W - 1 inputs), dw_k += g_t x_{t - (W-1) + k},
 * dbias += g_t; the initial state's gradient is dx at t < 0. */

typedef struct bwd_job {
    const fx_conv_bwd_args *a;
    fx_watch *w;
    atomic_bool out_of_memory; /* a thread found no memory for its block */
} bwd_job;

/* The block's sums: f32 over POLL steps, then into f64. */
typedef struct sums {
    _Alignas(64) float w[WMAX][SEG], b[SEG];
    double w64[WMAX][SEG], b64[SEG];
} sums;

static void flush(sums *s, int64_t W, int64_t cw)
{
    for (int64_t k = 0; k < W; k++)
        for (int64_t c = 0; c < cw; c++) {
            s->w64[k][c] += s->w[k][c];
            s->w[k][c] = 0.0f;
        }
    for (int64_t c = 0; c < cw; c++) {
        s->b64[c] += s->b[c];
        s->b[c] = 0.0f;
    }
}

/* What a backward block keeps: the rows x_{t-(W-1)} .. x_t (through xs,
 * W of them, from x or the initial state) and g_t .. g_{t+W-1}. */
typedef struct bwd_rows {
    _Alignas(64) float init[WMAX][SEG];  /* the initial state's rows, oldest first */
    _Alignas(64) float buf[WMAX][SEG];   /* converted rows of x */
    _Alignas(64) float g[WMAX][SEG];     /* g_{t+j} at g[(t + j) % W] */
    _Alignas(64) float dfin[WMAX][SEG];  /* the final state's gradient rows */
} bwd_rows;

/* x_s of the block: the initial state's (or zeros) before the first input. */
static const float *x_row(const fx_conv_bwd_args *a, bwd_rows *r, int64_t b, int64_t d0, int64_t cw, int64_t s)
{
    const fx_conv_dims *n = &a->fwd.n;
    const int64_t W = n->width;
    if (s >= 0)
        return fx_fast_load(a->fwd.x, (b * n->seqlen + s) * n->dim + d0, cw, r->buf[(s % W + W) % W]);
    return r->init[s + W - 1];
}

FX_INLINE void load_state_rows(const fx_tensor *t, int64_t b, int64_t D, int64_t W, int64_t d0, int64_t cw,
                               float (*rows)[SEG])
{
    for (int64_t k = 0; k < W - 1; k++) {
        if (t)
            fx_fast_load_strided(t, (b * D + d0) * (W - 1) + k, W - 1, cw, rows[k]);
        else
            memset(rows[k], 0, sizeof(float) * (size_t)cw);
    }
}

/* g_t into its ring slot, and its sums. */
FX_INLINE void grad_row(const fx_conv_bwd_args *a, const taps *tp, bwd_rows *r, sums *sm, int64_t b, int64_t d0,
                        int64_t cw, int64_t t)
{
    const fx_conv_dims *n = &a->fwd.n;
    const int64_t W = n->width;
    _Alignas(64) float pre[SEG], dybuf[SEG];
    const float *xs[WMAX];
    for (int64_t k = 0; k < W; k++)
        xs[k] = x_row(a, r, b, d0, cw, t - (W - 1) + k);
    float *restrict g = r->g[t % W];
    const float *restrict dy = fx_fast_load(a->dy, (b * n->seqlen + t) * n->dim + d0, cw, dybuf);
    if (a->fwd.activation == FX_ACT_SILU) {
        memcpy(pre, tp->bias, sizeof(float) * (size_t)cw);
        for (int64_t k = 0; k < W; k++) {
            const float *restrict wk = tp->w[k], *restrict xk = xs[k];
#pragma omp simd
            for (int64_t c = 0; c < cw; c++)
                pre[c] += wk[c] * xk[c];
        }
#pragma omp simd
        for (int64_t c = 0; c < cw; c++)
            g[c] = dy[c] * fx_fast_silu_grad(pre[c]);
    } else {
        memcpy(g, dy, sizeof(float) * (size_t)cw);
    }
    for (int64_t k = 0; k < W; k++) {
        const float *restrict xk = xs[k];
        float *restrict sk = sm->w[k];
#pragma omp simd
        for (int64_t c = 0; c < cw; c++)
            sk[c] += g[c] * xk[c];
    }
#pragma omp simd
    for (int64_t c = 0; c < cw; c++)
        sm->b[c] += g[c];
}

/* dx_t for t in [-(W-1), L): the g ring holds g_t .. g_{t+W-1} (zero past L). */
FX_INLINE void dx_row(const fx_conv_bwd_args *a, const taps *tp, bwd_rows *r, int64_t t, int64_t cw,
                      float *restrict out)
{
    const fx_conv_dims *n = &a->fwd.n;
    const int64_t W = n->width, L = n->seqlen;
    memset(out, 0, sizeof(float) * (size_t)cw);
    for (int64_t k = 0; k < W; k++) {
        const int64_t s = t + (W - 1) - k;
        if (s < 0 || s >= L)
            continue;
        const float *restrict wk = tp->w[k], *restrict gs = r->g[s % W];
#pragma omp simd
        for (int64_t c = 0; c < cw; c++)
            out[c] += wk[c] * gs[c];
    }
    const int64_t j = t - (L - (W - 1)); /* the final state's slot holding x_t */
    if (a->dfinal_state && j >= 0 && j < W - 1) {
        const float *restrict df = r->dfin[j];
#pragma omp simd
        for (int64_t c = 0; c < cw; c++)
            out[c] += df[c];
    }
}

FX_FAST_KERNEL
static void bwd_batch_block(const bwd_job *job, const taps *tp, bwd_rows *r, sums *sm, int64_t b, int64_t d0,
                            int64_t cw)
{
    const fx_conv_bwd_args *a = job->a;
    const fx_conv_dims *n = &a->fwd.n;
    const int64_t L = n->seqlen, D = n->dim, W = n->width;
    _Alignas(64) float dxbuf[SEG];
    load_state_rows(a->fwd.initial_state, b, D, W, d0, cw, r->init);
    load_state_rows(a->dfinal_state, b, D, W, d0, cw, r->dfin);
    /* g for the W - 1 steps after t = L - 1 are zero: dx_row skips them */
    for (int64_t t = L - 1; t >= -(W - 1); t--) {
        if (t >= 0) {
            if ((L - 1 - t) % POLL == POLL - 1) {
                flush(sm, W, cw);
                if (fx_watch_gone(job->w))
                    return;
            }
            grad_row(a, tp, r, sm, b, d0, cw, t);
            const int64_t i0 = (b * L + t) * D + d0;
            float *dx = fx_fast_out(a->dx, i0, dxbuf);
            dx_row(a, tp, r, t, cw, dx);
            if (dx == dxbuf)
                fx_fast_store(a->dx, i0, cw, dx);
        } else if (a->dinitial_state) {
            dx_row(a, tp, r, t, cw, dxbuf);
            fx_fast_store_strided(a->dinitial_state, (b * D + d0) * (W - 1) + t + W - 1, W - 1, cw, dxbuf);
        }
    }
    flush(sm, W, cw);
}

static void bwd_block(const bwd_job *job, int64_t d0, int64_t cw, taps *tp, bwd_rows *r, sums *sm)
{
    const fx_conv_bwd_args *a = job->a;
    const int64_t W = a->fwd.n.width;
    load_taps(a->fwd.w, a->fwd.bias, W, d0, cw, tp);
    memset(sm, 0, sizeof *sm);
    for (int64_t b = 0; b < a->fwd.n.batch && !fx_watch_gone(job->w); b++)
        bwd_batch_block(job, tp, r, sm, b, d0, cw);
    for (int64_t k = 0; k < W; k++)
        for (int64_t c = 0; c < cw; c++)
            fx_store_f64(a->dw->data, a->dw->dtype, (d0 + c) * W + k, sm->w64[k][c]);
    if (a->dbias)
        for (int64_t c = 0; c < cw; c++)
            fx_store_f64(a->dbias->data, a->dbias->dtype, d0 + c, sm->b64[c]);
}

typedef struct bwd_work {
    taps tp;
    bwd_rows rows;
    sums sm;
} bwd_work;

static void bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    bwd_job *job = ctx;
    bwd_work *k = fx_fast_scratch(sizeof(bwd_work));
    if (!k) {
        atomic_store(&job->out_of_memory, true);
        return;
    }
    const int64_t D = job->a->fwd.n.dim;
    for (int64_t d0 = lo; d0 < hi && !fx_watch_gone(job->w);) {
        const int64_t cw = min64(min64(SEG, D - d0), hi - d0);
        bwd_block(job, d0, cw, &k->tp, &k->rows, &k->sm);
        d0 += cw;
    }
}

static int fast_backward(const fx_conv_bwd_args *a, fx_status *st)
{
    fx_watch w;
    fx_watch_begin(&w);
    bwd_job job = {a, &w, false};
    fx_pool_run(a->fwd.n.dim, 16, call_work(&a->fwd.n) * 3, bwd_range, &job);
    if (atomic_load(&job.out_of_memory))
        return fx_fail(st, FX_ENOMEM, "out of host memory for a causal_conv1d backward's %zu-byte block",
                       sizeof(bwd_work));
    return fx_watch_end(&w, "a causal_conv1d backward", st);
}

/* ---- the table: the oracle for f64 and for the reference device ---- */

static bool oracle(const fx_exec *ex, fx_dtype x_type)
{
    return ex->device == FX_CPU_REFERENCE || x_type == FX_F64;
}

static int cpu_forward(const fx_exec *ex, const fx_conv_fwd_args *a, fx_status *st)
{
    return oracle(ex, a->x->dtype) ? fx_cpu_conv_ops.forward(ex, a, st) : fast_forward(a, st);
}

static int cpu_backward(const fx_exec *ex, const fx_conv_bwd_args *a, fx_status *st)
{
    return oracle(ex, a->fwd.x->dtype) ? fx_cpu_conv_ops.backward(ex, a, st) : fast_backward(a, st);
}

static int cpu_step(const fx_exec *ex, const fx_conv_step_args *a, fx_status *st)
{
    return oracle(ex, a->x->dtype) ? fx_cpu_conv_ops.step(ex, a, st) : fast_step(a, st);
}

/* The fast path's workspaces are its threads' own (fx_fast_scratch). A
 * query without a context (NULL: the device's, either) answers for the oracle. */
static size_t cpu_forward_scratch(const fx_exec *ex, const fx_conv_fwd_args *a)
{
    return !ex || oracle(ex, a->x->dtype) ? fx_cpu_conv_ops.forward_scratch(ex, a) : 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_conv_bwd_args *a)
{
    return !ex || oracle(ex, a->fwd.x->dtype) ? fx_cpu_conv_ops.backward_scratch(ex, a) : 0;
}

const struct fx_conv_ops fx_cpu_fast_conv_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
};
