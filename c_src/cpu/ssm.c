/* The CPU selective scan: the reference every other backend is tested
 * against. Every input type is read into f64 and all arithmetic is f64;
 * the code follows the equations in include/fusex_ssm.h as directly as it
 * can, with OpenMP over independent (batch, channel) blocks.
 *
 * The backward saves nothing in the forward: per channel it reruns the
 * forward keeping the state entering every CHECKPOINT steps, then walks the
 * chunks backwards, recomputing each chunk's states and running the adjoint
 * recurrence through them. Its scratch is O((seqlen / CHECKPOINT +
 * CHECKPOINT) * dstate) per channel, never [batch, seqlen, dim, dstate]. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "fusex_dtype.h"
#include "fusex_ssm.h"

#if defined(__x86_64__) && defined(__GLIBC__)
/* glibc's libmvec has vector versions of exp as accurate as the scalar one
 * (< 4 ulp): declaring exp simd lets the forward's exp loops compute two at
 * a time, ~3x faster than one call each (exp is most of the forward's time
 * on the CPU). The Makefile links libmvec on x86-64. (Only exp: other
 * vector functions need a newer glibc than some machines have.) */
#pragma omp declare simd notinbranch
double exp(double);
#endif

#define CHANNEL_BLOCK 64 /* channels per forward task: amortises reading b, c rows */
/* The forward runs on one core below this many state-steps (~5 ms of one
 * core): a fork-join waits a whole time slice whenever the OS preempts one
 * of its threads, which on a busy 2-core machine turned 0.65 ms into 8 ms. */
#define FORWARD_PARALLEL_MIN ((int64_t)1 << 21)
#define CHECKPOINT 64    /* steps between the backward's recomputed checkpoints */

static double load(const fx_tensor *t, int64_t i) { return fx_load_f64(t->data, t->dtype, i); }
static void store(const fx_tensor *t, int64_t i, double v) { fx_store_f64(t->data, t->dtype, i, v); }
static double load_or(const fx_tensor *t, int64_t i, double dflt) { return t ? load(t, i) : dflt; }

/* Elements [i0, i0 + n) as f64: one type dispatch per run, not per element. */
static void load_run(const fx_tensor *t, int64_t i0, int64_t n, double *out)
{
    switch (t->dtype) {
    case FX_F32:
        for (int64_t i = 0; i < n; i++)
            out[i] = ((const float *)t->data)[i0 + i];
        break;
    case FX_F64:
        memcpy(out, (const double *)t->data + i0, sizeof(double) * (size_t)n);
        break;
    default:
        for (int64_t i = 0; i < n; i++)
            out[i] = load(t, i0 + i);
    }
}

static void store_run(const fx_tensor *t, int64_t i0, int64_t n, const double *v)
{
    if (t->dtype == FX_F32) {
        for (int64_t i = 0; i < n; i++)
            ((float *)t->data)[i0 + i] = (float)v[i];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        store(t, i0 + i, v[i]);
}

static double sigmoid(double u) { return 1.0 / (1.0 + exp(-u)); }

/* softplus with PyTorch's threshold: the identity above 20. */
static double softplus(double u) { return u > 20.0 ? u : log1p(exp(u)); }
static double softplus_grad(double u) { return u > 20.0 ? 1.0 : sigmoid(u); }

static double silu(double z) { return z * sigmoid(z); }
static double silu_grad(double z)
{
    double s = sigmoid(z);
    return s * (1.0 + z * (1.0 - s));
}

/* Index of element (b, t, d) of a [batch, seqlen, dim] tensor, and of row
 * (b, t, g) of b and c. */
static int64_t at_btd(const fx_ssm_dims *n, int64_t b, int64_t t, int64_t d)
{
    return (b * n->seqlen + t) * n->dim + d;
}
static int64_t at_btg(const fx_ssm_dims *n, int64_t b, int64_t t, int64_t g)
{
    return ((b * n->seqlen + t) * n->groups + g) * n->dstate;
}

typedef struct channel_step {
    double x, u, delta; /* input, dt (+ bias), softplus(u) or u */
} channel_step;

static channel_step load_step(const fx_tensor *x, const fx_tensor *dt, const fx_tensor *dt_bias,
                              bool softplus_on, int64_t i, int64_t d)
{
    channel_step s;
    s.x = load(x, i);
    s.u = load(dt, i) + load_or(dt_bias, d, 0.0);
    s.delta = softplus_on ? softplus(s.u) : s.u;
    return s;
}

/* ---- forward ---- */

/* n consecutive states from h (f64) into t at element i0. */
static void store_states(const fx_tensor *t, int64_t i0, int64_t n, const double *h)
{
    for (int64_t k = 0; k < n; k++)
        store(t, i0 + k, h[k]);
}

/* Doubles a forward task's workspace holds (forward_block). */
static size_t forward_block_doubles(const fx_ssm_dims *n)
{
    int64_t nch = n->dim < CHANNEL_BLOCK ? n->dim : CHANNEL_BLOCK, N = n->dstate, G = n->groups;
    return fx_size_add(fx_size_add(fx_size_mul(2 * nch, N), fx_size_mul(2 * G, N)), (size_t)(N + 8 * nch));
}

/* Threads a parallel region of the CPU ops may use: workspaces are taken
 * per thread, so every region names its team size. */
static int team_size(bool parallel) { return parallel ? fx_cpu_threads() : 1; }

/* Channels [d0, d1) of batch b, for every step. Per step: the b and c rows,
 * then delta and the gate of every channel, then the states. The exps sit
 * in loops of their own, which glibc's vector exp computes two at a time. */
/* An AVX2 build of it where the CPU has AVX2 (picked at load time): four
 * exps per vector call. */
#if defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("avx2", "default")))
#endif
static void forward_block(const fx_ssm_fwd_args *a, int64_t b, int64_t d0, int64_t d1, double *h,
                          fx_watch *w)
{
    const fx_ssm_dims *n = &a->n;
    int64_t N = n->dstate, G = n->groups, cpg = n->dim / G, nch = d1 - d0;
    double *A = h + nch * N, *brow = A + nch * N, *crow = brow + G * N, *decay = crow + G * N;
    double *xs = decay + N, *us = xs + nch, *delta = us + nch, *zs = delta + nch;
    double *gate = zs + nch, *bias = gate + nch, *dskip = bias + nch, *ys = dskip + nch;
    for (int64_t d = d0; d < d1; d++) {
        bias[d - d0] = load_or(a->dt_bias, d, 0.0);
        dskip[d - d0] = load_or(a->d, d, 0.0);
        for (int64_t k = 0; k < N; k++) {
            A[(d - d0) * N + k] = load(a->a, d * N + k);
            h[(d - d0) * N + k] = load_or(a->h0, (b * n->dim + d) * N + k, 0.0);
        }
    }
    for (int64_t t = 0; t < n->seqlen; t++) {
        if (fx_watch_gone(w))
            return;
        load_run(a->b, at_btg(n, b, t, 0), G * N, brow);
        load_run(a->c, at_btg(n, b, t, 0), G * N, crow);
        int64_t i0 = at_btd(n, b, t, d0);
        load_run(a->x, i0, nch, xs);
        load_run(a->dt, i0, nch, us);
        for (int64_t c = 0; c < nch; c++)
            us[c] += bias[c];
        if (a->dt_softplus) { /* softplus(u) = log1p(exp(u)), u above 20 */
#pragma omp simd
            for (int64_t c = 0; c < nch; c++)
                delta[c] = exp(us[c]);
            for (int64_t c = 0; c < nch; c++)
                delta[c] = us[c] > 20.0 ? us[c] : log1p(delta[c]);
        } else {
            memcpy(delta, us, sizeof(double) * (size_t)nch);
        }
        if (a->z) {
            load_run(a->z, i0, nch, zs);
#pragma omp simd
            for (int64_t c = 0; c < nch; c++) /* silu(z) = z / (1 + exp(-z)) */
                gate[c] = zs[c] / (1.0 + exp(-zs[c]));
        }
        for (int64_t c = 0; c < nch; c++) {
            int64_t g = (d0 + c) / cpg;
            const double *bg = brow + g * N, *cg = crow + g * N;
            double *hd = h + c * N, *Ad = A + c * N, y = 0.0;
#pragma omp simd
            for (int64_t k = 0; k < N; k++)
                decay[k] = exp(delta[c] * Ad[k]);
            for (int64_t k = 0; k < N; k++) {
                hd[k] = decay[k] * hd[k] + delta[c] * bg[k] * xs[c];
                y += cg[k] * hd[k];
            }
            y += dskip[c] * xs[c];
            ys[c] = a->z ? y * gate[c] : y;
        }
        store_run(a->y, i0, nch, ys);
        if (a->saved && (t + 1) % a->save_every == 0 && (t + 1) / a->save_every <= a->saved->dims[1])
            store_states(a->saved, ((b * a->saved->dims[1] + (t + 1) / a->save_every - 1) * n->dim + d0) * N,
                         nch * N, h);
    }
    if (a->state)
        store_states(a->state, (b * n->dim + d0) * N, nch * N, h);
}

/* State-steps of the scan: x's elements (a shape, so within 2^48) times
 * dstate (a's), which may pass 2^63; saturated (it only picks a team). */
static size_t state_steps(const fx_ssm_dims *n)
{
    return fx_size_mul(n->batch * n->seqlen * n->dim, n->dstate);
}

static bool forward_parallel(const fx_ssm_dims *n)
{
    return state_steps(n) > (size_t)FORWARD_PARALLEL_MIN;
}

/* One workspace of forward_block_doubles a thread. */
static size_t cpu_ssm_forward_scratch(const fx_exec *ex, const fx_ssm_fwd_args *a)
{
    (void)ex;
    size_t per_task = fx_size_mul((int64_t)forward_block_doubles(&a->n), sizeof(double));
    return fx_size_add(FX_SCRATCH_ALIGN,
                       fx_size_mul(team_size(forward_parallel(&a->n)), (int64_t)fx_scratch_piece(per_task)));
}

static int cpu_ssm_forward(const fx_exec *ex, const fx_ssm_fwd_args *a, fx_status *st)
{
    const fx_ssm_dims *n = &a->n;
    int64_t blocks = (n->dim + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK, tasks = n->batch * blocks;
    if (tasks == 0)
        return FX_OK;
    const int threads = team_size(forward_parallel(n));
    const size_t per_task = fx_scratch_piece(fx_size_mul((int64_t)forward_block_doubles(n), sizeof(double)));
    char *work;
    if (fx_scratch_alloc(ex, fx_size_mul(threads, (int64_t)per_task), (void **)&work, st))
        return st->code;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < tasks && !fx_watch_gone(&w); lo = fx_piece_end(lo, tasks)) {
        const int64_t hi = fx_piece_end(lo, tasks);
#pragma omp parallel for schedule(dynamic) num_threads(threads)
        for (int64_t task = lo; task < hi; task++) {
            if (fx_watch_gone(&w))
                continue;
            int64_t b = task / blocks, d0 = (task % blocks) * CHANNEL_BLOCK;
            int64_t d1 = d0 + CHANNEL_BLOCK < n->dim ? d0 + CHANNEL_BLOCK : n->dim;
            forward_block(a, b, d0, d1, (double *)(work + (size_t)omp_get_thread_num() * per_task), &w);
        }
    }
    fx_scratch_release(ex, work);
    return fx_watch_end(&w, "selective_scan", st);
}

/* ---- backward ---- */

/* Sums over batch the backward accumulates per batch element first, so
 * that tasks never share a location. */
typedef struct partial_sums {
    double *da;      /* [batch, dim, dstate] */
    double *dd;      /* [batch, dim] */
    double *ddt_bias; /* [batch, dim] */
} partial_sums;

/* One channel's backward. bl, cl: this (batch, group)'s rows of b and c as
 * f64 [seqlen, dstate]; dbl, dcl: their gradients, summed over the group's
 * channels. ckpt: (chunks + 1) * dstate scratch, hs: (CHECKPOINT + 1) *
 * dstate, g: dstate. */
static void backward_channel(const fx_ssm_bwd_args *a, int64_t b, int64_t d, const double *bl,
                             const double *cl, double *dbl, double *dcl, double *ckpt, double *hs,
                             double *gs, const partial_sums *ps, fx_watch *w)
{
    const fx_ssm_fwd_args *f = &a->fwd;
    const fx_ssm_dims *n = &f->n;
    int64_t N = n->dstate, L = n->seqlen, sd = (b * n->dim + d) * N;
    double Dd = load_or(f->d, d, 0.0);
    double *A = hs + (CHECKPOINT + 1) * N; /* N more doubles after hs */
    for (int64_t k = 0; k < N; k++) {
        A[k] = load(f->a, d * N + k);
        ckpt[k] = load_or(f->h0, sd + k, 0.0);
        gs[k] = load_or(a->dstate, sd + k, 0.0);
    }
    /* The state entering every chunk. */
    int64_t chunks = (L + CHECKPOINT - 1) / CHECKPOINT;
    for (int64_t t = 0; t < L; t++) {
        if (fx_watch_gone(w))
            return;
        int64_t c = t / CHECKPOINT;
        double *from = ckpt + c * N, *to = ckpt + (c + 1) * N;
        if (t % CHECKPOINT == 0)
            memcpy(to, from, sizeof(double) * (size_t)N);
        channel_step s = load_step(f->x, f->dt, f->dt_bias, f->dt_softplus, at_btd(n, b, t, d), d);
        for (int64_t k = 0; k < N; k++)
            to[k] = exp(s.delta * A[k]) * to[k] + s.delta * bl[t * N + k] * s.x;
    }
    double dd_sum = 0.0, dbias_sum = 0.0;
    for (int64_t c = chunks - 1; c >= 0; c--) {
        if (fx_watch_gone(w))
            return;
        int64_t t0 = c * CHECKPOINT, t1 = t0 + CHECKPOINT < L ? t0 + CHECKPOINT : L;
        /* hs[s] = the state after step t0 + s - 1 (hs[0] enters the chunk). */
        memcpy(hs, ckpt + c * N, sizeof(double) * (size_t)N);
        for (int64_t t = t0; t < t1; t++) {
            channel_step s = load_step(f->x, f->dt, f->dt_bias, f->dt_softplus, at_btd(n, b, t, d), d);
            const double *prev = hs + (t - t0) * N;
            double *next = hs + (t - t0 + 1) * N;
            for (int64_t k = 0; k < N; k++)
                next[k] = exp(s.delta * A[k]) * prev[k] + s.delta * bl[t * N + k] * s.x;
        }
        for (int64_t t = t1 - 1; t >= t0; t--) {
            int64_t i = at_btd(n, b, t, d);
            channel_step s = load_step(f->x, f->dt, f->dt_bias, f->dt_softplus, i, d);
            const double *prev = hs + (t - t0) * N, *cur = prev + N;
            const double *bt = bl + t * N, *ct = cl + t * N;
            double dy = load(a->dy, i), dyp = dy;
            if (f->z) {
                double z = load(f->z, i), ypre = Dd * s.x;
                for (int64_t k = 0; k < N; k++)
                    ypre += ct[k] * cur[k];
                dyp = dy * silu(z);
                store(a->dz, i, dy * ypre * silu_grad(z));
            }
            double ddelta = 0.0, dx = Dd * dyp;
            for (int64_t k = 0; k < N; k++) {
                double decay = exp(s.delta * A[k]);
                double g = ct[k] * dyp + gs[k]; /* dL/dh_t */
                dcl[t * N + k] += dyp * cur[k];
                ddelta += g * (A[k] * decay * prev[k] + bt[k] * s.x);
                ps->da[sd + k] += g * s.delta * decay * prev[k];
                dbl[t * N + k] += g * s.delta * s.x;
                dx += g * s.delta * bt[k];
                gs[k] = decay * g; /* dL/dh_{t-1} through h_t */
            }
            double ddt = ddelta * (f->dt_softplus ? softplus_grad(s.u) : 1.0);
            store(a->dx, i, dx);
            store(a->ddt, i, ddt);
            dd_sum += dyp * s.x;
            dbias_sum += ddt;
        }
    }
    ps->dd[b * n->dim + d] = dd_sum;
    ps->ddt_bias[b * n->dim + d] = dbias_sum;
    if (a->dh0)
        for (int64_t k = 0; k < N; k++)
            store(a->dh0, sd + k, gs[k]);
}

/* Batch b, group g: owns the rows of db and dc of (b, g). */
static void backward_group(const fx_ssm_bwd_args *a, int64_t b, int64_t g, const partial_sums *ps,
                           double *bl, fx_watch *w)
{
    const fx_ssm_fwd_args *f = &a->fwd;
    const fx_ssm_dims *n = &f->n;
    int64_t N = n->dstate, L = n->seqlen, cpg = n->dim / n->groups;
    int64_t chunks = (L + CHECKPOINT - 1) / CHECKPOINT;
    size_t rows = (size_t)(L * N);
    memset(bl, 0, sizeof(double) * 4 * rows); /* dbl, dcl are sums */
    double *cl = bl + rows, *dbl = cl + rows, *dcl = dbl + rows, *ckpt = dcl + rows;
    double *gs = ckpt + (chunks + 1) * N, *hs = gs + N;
    for (int64_t t = 0; t < L; t++)
        for (int64_t k = 0; k < N; k++) {
            bl[t * N + k] = load(f->b, at_btg(n, b, t, g) + k);
            cl[t * N + k] = load(f->c, at_btg(n, b, t, g) + k);
        }
    for (int64_t d = g * cpg; d < (g + 1) * cpg && !fx_watch_gone(w); d++)
        backward_channel(a, b, d, bl, cl, dbl, dcl, ckpt, hs, gs, ps, w);
    for (int64_t t = 0; t < L; t++)
        for (int64_t k = 0; k < N; k++) {
            store(a->db, at_btg(n, b, t, g) + k, dbl[t * N + k]);
            store(a->dc, at_btg(n, b, t, g) + k, dcl[t * N + k]);
        }
}

/* Doubles a backward task's workspace holds (backward_group). */
static size_t backward_group_doubles(const fx_ssm_dims *n)
{
    int64_t N = n->dstate, L = n->seqlen, chunks = (L + CHECKPOINT - 1) / CHECKPOINT;
    return fx_size_add(fx_size_mul(4 * L, N), fx_size_mul(chunks + CHECKPOINT + 4, N));
}

static bool backward_parallel(const fx_ssm_dims *n)
{
    return state_steps(n) > (size_t)FX_CPU_PARALLEL_MIN;
}

/* The per-batch sums, then one workspace of backward_group_doubles a
 * thread. */
static size_t backward_sums_doubles(const fx_ssm_dims *n)
{
    return fx_size_add(fx_size_mul(n->batch * n->dim, n->dstate), fx_size_mul(2 * n->batch, n->dim));
}

static size_t cpu_ssm_backward_scratch(const fx_exec *ex, const fx_ssm_bwd_args *a)
{
    (void)ex;
    const fx_ssm_dims *n = &a->fwd.n;
    size_t sums = fx_scratch_piece(fx_size_mul((int64_t)backward_sums_doubles(n), sizeof(double)));
    size_t per_task = fx_scratch_piece(fx_size_mul((int64_t)backward_group_doubles(n), sizeof(double)));
    return fx_size_add(fx_size_add(FX_SCRATCH_ALIGN, sums),
                       fx_size_mul(team_size(backward_parallel(n)), (int64_t)per_task));
}

static int cpu_ssm_backward(const fx_exec *ex, const fx_ssm_bwd_args *a, fx_status *st)
{
    const fx_ssm_dims *n = &a->fwd.n;
    int64_t B = n->batch, D = n->dim, N = n->dstate, tasks = B * n->groups;
    const int threads = team_size(backward_parallel(n));
    const size_t sums_bytes = fx_size_mul((int64_t)backward_sums_doubles(n), sizeof(double));
    const size_t per_task = fx_scratch_piece(fx_size_mul((int64_t)backward_group_doubles(n), sizeof(double)));
    partial_sums ps;
    char *work;
    if (fx_scratch_alloc(ex, sums_bytes, (void **)&ps.da, st))
        return st->code;
    if (fx_scratch_alloc(ex, fx_size_mul(threads, (int64_t)per_task), (void **)&work, st)) {
        fx_scratch_release(ex, ps.da);
        return st->code;
    }
    memset(ps.da, 0, sums_bytes);
    ps.dd = ps.da + B * D * N;
    ps.ddt_bias = ps.dd + B * D;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < tasks && !fx_watch_gone(&w); lo = fx_piece_end(lo, tasks)) {
        const int64_t hi = fx_piece_end(lo, tasks);
#pragma omp parallel for schedule(dynamic) num_threads(threads)
        for (int64_t task = lo; task < hi; task++)
            if (!fx_watch_gone(&w))
                backward_group(a, task / n->groups, task % n->groups, &ps,
                               (double *)(work + (size_t)omp_get_thread_num() * per_task), &w);
    }
    if (fx_watch_end(&w, "selective_scan_backward", st)) {
        fx_scratch_release(ex, work);
        fx_scratch_release(ex, ps.da);
        return st->code;
    }
    for (int64_t i = 0; i < D * N; i++) {
        double sum = 0.0;
        for (int64_t b = 0; b < B; b++)
            sum += ps.da[b * D * N + i];
        store(a->da, i, sum);
    }
    for (int64_t d = 0; d < D; d++) {
        double dd = 0.0, dbias = 0.0;
        for (int64_t b = 0; b < B; b++) {
            dd += ps.dd[b * D + d];
            dbias += ps.ddt_bias[b * D + d];
        }
        if (a->dd)
            store(a->dd, d, dd);
        if (a->ddt_bias)
            store(a->ddt_bias, d, dbias);
    }
    fx_scratch_release(ex, work);
    fx_scratch_release(ex, ps.da);
    return FX_OK;
}

/* ---- step ---- */

static int cpu_ssm_step(const fx_exec *ex, const fx_ssm_step_args *a, fx_status *st)
{
    (void)ex;
    (void)st;
    const fx_ssm_dims *n = &a->n;
    int64_t N = n->dstate, D = n->dim, cpg = D / n->groups, channels = n->batch * D;
#pragma omp parallel for if (channels * N > FX_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < channels; i++) {
        int64_t b = i / D, d = i % D, row = (b * n->groups + d / cpg) * N;
        channel_step s = load_step(a->x, a->dt, a->dt_bias, a->dt_softplus, i, d);
        double y = load_or(a->d, d, 0.0) * s.x;
        for (int64_t k = 0; k < N; k++) {
            double h = load(a->state, i * N + k);
            h = exp(s.delta * load(a->a, d * N + k)) * h + s.delta * load(a->b, row + k) * s.x;
            store(a->state, i * N + k, h);
            y += load(a->c, row + k) * h;
        }
        if (a->z)
            y *= silu(load(a->z, i));
        store(a->y, i, y);
    }
    return FX_OK;
}

/* The backward recomputes from h0: a forward given saved states fills them
 * (the layout every backend shares, for callers that size them ahead), but
 * the op layer asks for none. */
const struct fx_ssm_ops fx_cpu_ssm_ops = {
    .forward = cpu_ssm_forward,
    .backward = cpu_ssm_backward,
    .step = cpu_ssm_step,
    .forward_scratch = cpu_ssm_forward_scratch,
    .backward_scratch = cpu_ssm_backward_scratch,
    .reads_saved = false,
    .max_dstate = 0,
};
