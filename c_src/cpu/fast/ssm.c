/* The fast selective scan (fusex_ssm.h): f32 states and arithmetic.
 *
 * Forward and backward hold a block of at most DC channels of one batch row
 * and one group, with states and A transposed to [dstate][channel]: each
 * state index is then one loop along contiguous channels (the exp of
 * delta * A, the update, y's sum), vectorised whatever dstate is. The
 * columns (batch x channels) are split in contiguous chunks over the pool.
 *
 * The backward saves nothing in the forward: per block it reruns the
 * forward keeping the state entering every CHUNK steps, then walks the
 * chunks backwards, recomputing each chunk's states and decays (in L1/L2)
 * and running the adjoint through them. Its tasks are (batch row, group):
 * a task owns its group's db and dc rows, summed over the group's channels
 * in f32 per step; da, d and dt_bias's sums per (batch, channel) go
 * through f64 and are reduced over batch in a fixed order after. The step
 * runs per channel along dstate (the state's own layout). */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu/fast/fast.h"
#include "fusex_ssm.h"

#define DC 64    /* forward: channels a block */
#define DCB 32   /* backward: channels a block (its chunk's states and decays stay in L2) */
#define CHUNK 16 /* backward: steps between recomputed states */
#define POLL 64

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t at_btd(const fx_ssm_dims *n, int64_t b, int64_t t, int64_t d)
{
    return (b * n->seqlen + t) * n->dim + d;
}

static int64_t at_btg(const fx_ssm_dims *n, int64_t b, int64_t t, int64_t g)
{
    return ((b * n->seqlen + t) * n->groups + g) * n->dstate;
}

/* State-steps of a call, saturated: the pool's measure of work. */
static int64_t state_steps(const fx_ssm_dims *n)
{
    size_t s = fx_size_mul(n->batch * n->seqlen * n->dim, n->dstate);
    return s > (size_t)(INT64_MAX / 4) ? INT64_MAX / 4 : (int64_t)s;
}

/* The block of columns [c, ...) of at most `most` channels that stays in
 * one batch row and one group. */
static int64_t block_width(const fx_ssm_dims *n, int64_t c, int64_t hi, int64_t most)
{
    int64_t d = c % n->dim, cpg = n->dim / n->groups, group_end = (d / cpg + 1) * cpg;
    return min64(min64(most, group_end - d), hi - c);
}

/* delta = softplus(dt + bias) (or dt + bias) of w channels; u keeps dt + bias. */
FX_INLINE void deltas(int64_t w, const float *restrict dt, const float *restrict bias, bool softplus,
                          float *restrict u, float *restrict delta)
{
#pragma omp simd
    for (int64_t c = 0; c < w; c++) {
        u[c] = dt[c] + bias[c];
        delta[c] = softplus ? fx_fast_softplus(u[c]) : u[c];
    }
}

/* Per-channel values of a block: A transposed, dt_bias, d. */
static void load_block_consts(const fx_tensor *A, const fx_tensor *bias, const fx_tensor *dskip, int64_t N,
                              int64_t d0, int64_t w, int64_t stride, float *At, float *b, float *ds)
{
    for (int64_t k = 0; k < N; k++)
        fx_fast_load_strided(A, d0 * N + k, N, w, At + k * stride);
    for (int64_t c = 0; c < w; c++) {
        b[c] = fx_fast_at(bias, d0 + c, 0.0f);
        ds[c] = fx_fast_at(dskip, d0 + c, 0.0f);
    }
}

/* States [N][stride] of w channels into t's [.., channel, N] at the row of
 * (channel 0) i0, through buf (w * N floats). */
static void store_states(const fx_tensor *t, int64_t i0, int64_t N, int64_t w, int64_t stride, const float *h,
                         float *buf)
{
    for (int64_t c = 0; c < w; c++)
        for (int64_t k = 0; k < N; k++)
            buf[c * N + k] = h[k * stride + c];
    fx_fast_store(t, i0, w * N, buf);
}

static void load_states(const fx_tensor *t, int64_t i0, int64_t N, int64_t w, int64_t stride, float *h)
{
    for (int64_t k = 0; k < N; k++) {
        if (t)
            fx_fast_load_strided(t, i0 + k, N, w, h + k * stride);
        else
            memset(h + k * stride, 0, sizeof(float) * (size_t)w);
    }
}

/* One step of a block's states in place: h = exp(delta A) h + delta x b,
 * and y += c h where y is given. */
FX_INLINE void scan_step(int64_t N, int64_t w, int64_t stride, const float *restrict At, const float *restrict delta,
                         const float *restrict dxb, const float *brow, const float *crow, float *restrict h,
                         float *restrict y)
{
    for (int64_t k = 0; k < N; k++) {
        const float bk = brow[k], ck = crow[k];
        const float *restrict Ak = At + k * stride;
        float *restrict hk = h + k * stride;
        if (y) {
#pragma omp simd
            for (int64_t c = 0; c < w; c++) {
                hk[c] = fx_fast_exp(delta[c] * Ak[c]) * hk[c] + dxb[c] * bk;
                y[c] += ck * hk[c];
            }
        } else {
#pragma omp simd
            for (int64_t c = 0; c < w; c++)
                hk[c] = fx_fast_exp(delta[c] * Ak[c]) * hk[c] + dxb[c] * bk;
        }
    }
}

/* The same from one array into another, keeping the decays in dec. */
FX_INLINE void scan_step_keep(int64_t N, int64_t w, int64_t stride, const float *restrict At,
                              const float *restrict delta, const float *restrict dxb, const float *brow,
                              const float *restrict from, float *restrict to, float *restrict dec)
{
    for (int64_t k = 0; k < N; k++) {
        const float bk = brow[k];
        const float *restrict Ak = At + k * stride, *restrict hp = from + k * stride;
        float *restrict hn = to + k * stride, *restrict dk = dec + k * stride;
#pragma omp simd
        for (int64_t c = 0; c < w; c++) {
            float e = fx_fast_exp(delta[c] * Ak[c]);
            dk[c] = e;
            hn[c] = e * hp[c] + dxb[c] * bk;
        }
    }
}

/* ---- forward ---- */

typedef struct fwd_job {
    const fx_ssm_fwd_args *a;
    fx_watch *w;
    atomic_bool out_of_memory;
} fwd_job;

/* The row stride of a block's [dstate][channel] arrays: DC, or fewer where
 * a group has fewer channels (a block never spans two groups). */
static int64_t fwd_stride(const fx_ssm_dims *n) { return min64(DC, n->dim / n->groups); }
static int64_t bwd_stride(const fx_ssm_dims *n) { return min64(DCB, n->dim / n->groups); }

static size_t fwd_scratch_floats(const fx_ssm_dims *n)
{
    return fx_size_add(fx_size_mul(3 * n->dstate, fwd_stride(n)), (size_t)(2 * n->dstate));
}

FX_FAST_KERNEL
/* y's w channels from i0, times silu(z) where z is given, stored in y's
 * type (a forward's step and a step alike). */
static void write_gated(const fx_tensor *yt, const fx_tensor *zt, int64_t i0, int64_t w, const float *y, float *ybuf,
                        float *zbuf)
{
    float *out = fx_fast_out(yt, i0, ybuf);
    if (zt) {
        const float *z = fx_fast_load(zt, i0, w, zbuf);
#pragma omp simd
        for (int64_t c = 0; c < w; c++)
            out[c] = y[c] * fx_fast_silu(z[c]);
    } else {
        memcpy(out, y, sizeof(float) * (size_t)w);
    }
    if (out == ybuf)
        fx_fast_store(yt, i0, w, out);
}

static void fwd_block(const fwd_job *job, int64_t b, int64_t d0, int64_t w, float *work)
{
    const fx_ssm_fwd_args *a = job->a;
    const fx_ssm_dims *n = &a->n;
    const int64_t N = n->dstate, L = n->seqlen, g = d0 / (n->dim / n->groups), S = fwd_stride(n);
    float *At = work, *h = At + N * S, *tbuf = h + N * S, *bbuf = tbuf + N * S, *cbuf = bbuf + N;
    _Alignas(64) float bias[DC], dskip[DC], u[DC], delta[DC], dxb[DC], y[DC];
    _Alignas(64) float xbuf[DC], dtbuf[DC], zbuf[DC], ybuf[DC];
    load_block_consts(a->a, a->dt_bias, a->d, N, d0, w, S, At, bias, dskip);
    load_states(a->h0, (b * n->dim + d0) * N, N, w, S, h);
    const int64_t nsaved = a->saved ? a->saved->dims[1] : 0;
    for (int64_t t = 0; t < L; t++) {
        if (t % POLL == POLL - 1 && fx_watch_gone(job->w))
            return;
        const int64_t i0 = at_btd(n, b, t, d0);
        const float *x = fx_fast_load(a->x, i0, w, xbuf);
        deltas(w, fx_fast_load(a->dt, i0, w, dtbuf), bias, a->dt_softplus, u, delta);
        const float *brow = fx_fast_load(a->b, at_btg(n, b, t, g), N, bbuf);
        const float *crow = fx_fast_load(a->c, at_btg(n, b, t, g), N, cbuf);
#pragma omp simd
        for (int64_t c = 0; c < w; c++) {
            dxb[c] = delta[c] * x[c];
            y[c] = dskip[c] * x[c];
        }
        scan_step(N, w, S, At, delta, dxb, brow, crow, h, y);
        write_gated(a->y, a->z, i0, w, y, ybuf, zbuf);
        if (nsaved && (t + 1) % a->save_every == 0 && (t + 1) / a->save_every <= nsaved)
            store_states(a->saved, ((b * nsaved + (t + 1) / a->save_every - 1) * n->dim + d0) * N, N, w, S, h,
                         tbuf);
    }
    if (a->state)
        store_states(a->state, (b * n->dim + d0) * N, N, w, S, h, tbuf);
}

static void fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    fwd_job *job = ctx;
    const fx_ssm_dims *n = &job->a->n;
    float *work = fx_fast_scratch(sizeof(float) * fwd_scratch_floats(n));
    if (!work) {
        atomic_store(&job->out_of_memory, true);
        return;
    }
    for (int64_t c = lo; c < hi && !fx_watch_gone(job->w);) {
        int64_t w = block_width(n, c, hi, DC);
        fwd_block(job, c / n->dim, c % n->dim, w, work);
        c += w;
    }
}

static int fast_forward(const fx_ssm_fwd_args *a, fx_status *st)
{
    const fx_ssm_dims *n = &a->n;
    fx_watch w;
    fx_watch_begin(&w);
    fwd_job job = {a, &w, false};
    fx_pool_run(n->batch * n->dim, 8, state_steps(n), fwd_range, &job);
    if (atomic_load(&job.out_of_memory))
        return fx_fail(st, FX_ENOMEM, "out of host memory for a selective_scan's %zu-byte block states",
                       sizeof(float) * fwd_scratch_floats(n));
    return fx_watch_end(&w, "selective_scan", st);
}

/* ---- step: per channel, along dstate ---- */

typedef struct step_job {
    const fx_ssm_step_args *a;
    atomic_bool out_of_memory;
} step_job;

/* One channel's states along dstate: h = exp(dl A) h + dx b; returns c · h. */
FX_INLINE float step_channel(int64_t N, float dl, float dx, const float *restrict A, const float *restrict bk,
                             const float *restrict ck, float *restrict h)
{
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t k = 0; k < N; k++) {
        h[k] = fx_fast_exp(dl * A[k]) * h[k] + dx * bk[k];
        acc += ck[k] * h[k];
    }
    return acc;
}

/* Channels [d0, d0 + w) of batch row b, one group: the per-channel values
 * (delta, the gate) vectorised over the block, then each channel's states
 * along dstate (the state's own layout), read in place where A and the
 * state are f32. */
FX_FAST_KERNEL
static void step_block(const fx_ssm_step_args *a, int64_t b, int64_t d0, int64_t w, float *buf)
{
    const fx_ssm_dims *n = &a->n;
    const int64_t N = n->dstate, D = n->dim, i0 = b * D + d0, row = (b * n->groups + d0 / (D / n->groups)) * N;
    _Alignas(64) float xbuf[DC], dtbuf[DC], zbuf[DC], bias[DC], dskip[DC], u[DC], delta[DC], y[DC], ybuf[DC];
    for (int64_t c = 0; c < w; c++) {
        bias[c] = fx_fast_at(a->dt_bias, d0 + c, 0.0f);
        dskip[c] = fx_fast_at(a->d, d0 + c, 0.0f);
    }
    const float *x = fx_fast_load(a->x, i0, w, xbuf);
    deltas(w, fx_fast_load(a->dt, i0, w, dtbuf), bias, a->dt_softplus, u, delta);
    const float *restrict bk = fx_fast_load(a->b, row, N, buf);
    const float *restrict ck = fx_fast_load(a->c, row, N, buf + N);
    const bool f32 = a->state->dtype == FX_F32 && a->a->dtype == FX_F32;
    if (f32) {
        const float *A = (const float *)a->a->data + d0 * N;
        float *h = (float *)a->state->data + i0 * N;
        for (int64_t c = 0; c < w; c++)
            y[c] = step_channel(N, delta[c], delta[c] * x[c], A + c * N, bk, ck, h + c * N) + dskip[c] * x[c];
    } else {
        for (int64_t c = 0; c < w; c++) {
            const float *A = fx_fast_load(a->a, (d0 + c) * N, N, buf + 2 * N);
            float *h = (float *)fx_fast_load(a->state, (i0 + c) * N, N, buf + 3 * N);
            y[c] = step_channel(N, delta[c], delta[c] * x[c], A, bk, ck, h) + dskip[c] * x[c];
            if (h == buf + 3 * N) /* a 16-bit state: its converted row goes back */
                fx_fast_store(a->state, (i0 + c) * N, N, h);
        }
    }
    write_gated(a->y, a->z, i0, w, y, ybuf, zbuf);
}

static void step_range(void *ctx, int64_t lo, int64_t hi)
{
    step_job *job = ctx;
    const fx_ssm_dims *n = &job->a->n;
    /* rows of dstate: b, c, A and the state, converted where not f32 */
    float *buf = fx_fast_scratch(sizeof(float) * (size_t)(4 * n->dstate));
    if (!buf) {
        atomic_store(&job->out_of_memory, true);
        return;
    }
    for (int64_t c = lo; c < hi;) {
        int64_t w = block_width(n, c, hi, DC);
        step_block(job->a, c / n->dim, c % n->dim, w, buf);
        c += w;
    }
}

static int fast_step(const fx_ssm_step_args *a, fx_status *st)
{
    const fx_ssm_dims *n = &a->n;
    step_job job = {a, false};
    fx_pool_run(n->batch * n->dim, 8, state_steps(n) * 2, step_range, &job);
    if (atomic_load(&job.out_of_memory))
        return fx_fail(st, FX_ENOMEM, "out of host memory for a selective_scan_step's rows");
    return FX_OK;
}

/* ---- backward ---- */

typedef struct bwd_job {
    const fx_ssm_bwd_args *a;
    fx_watch *w;
    double *da, *dd, *dbias; /* per batch row: [batch][dim][dstate], [batch][dim] twice */
    atomic_bool out_of_memory;
} bwd_job;

/* The per-thread workspace of a backward task, in floats (the f64 sums
 * counted twice). */
static size_t bwd_scratch_floats(const fx_ssm_dims *n)
{
    const int64_t N = n->dstate, L = n->seqlen, chunks = (L + CHUNK - 1) / CHUNK, S = bwd_stride(n);
    size_t rows = fx_size_mul(2 * L, N);                               /* db, dc sums */
    size_t ckpt = fx_size_mul((int64_t)fx_size_mul(chunks + 1, N), S); /* states entering each chunk */
    size_t chunk = fx_size_mul((2 * CHUNK + 1) * N, S);                /* a chunk's states and decays */
    size_t block = fx_size_add(fx_size_mul(6 * N, S), (size_t)(4 * N)); /* At, gs, da (f32 and f64), rows */
    return fx_size_add(fx_size_add(rows, ckpt), fx_size_add(chunk, block));
}

typedef struct bwd_work {
    float *db, *dc;      /* [L][N]: the group's sums */
    float *ck, *hs, *dec; /* states entering chunks; a chunk's states and decays */
    float *At, *gs, *daf, *bbuf, *cbuf;
    double *da;
} bwd_work;

static bwd_work carve(const fx_ssm_dims *n, float *p)
{
    const int64_t N = n->dstate, L = n->seqlen, chunks = (L + CHUNK - 1) / CHUNK, S = bwd_stride(n);
    bwd_work k;
    k.db = p;
    k.dc = k.db + L * N;
    k.ck = k.dc + L * N;
    k.hs = k.ck + (chunks + 1) * N * S;
    k.dec = k.hs + (CHUNK + 1) * N * S;
    k.At = k.dec + CHUNK * N * S;
    k.gs = k.At + N * S;
    k.daf = k.gs + N * S;
    /* an even number of floats before it keeps da 8-byte aligned: pad by one where needed */
    k.da = (double *)(k.daf + N * S + ((2 * L * N + (chunks + 1 + 2 * CHUNK + 1 + 3) * N * S) & 1));
    k.bbuf = (float *)(k.da + N * S);
    k.cbuf = k.bbuf + 2 * N;
    return k;
}

/* One step's per-channel inputs of a block. */
typedef struct step_rows {
    const float *x, *dy, *z;
    _Alignas(64) float u[DCB], delta[DCB], dxb[DCB];
    _Alignas(64) float xbuf[DCB], dtbuf[DCB], dybuf[DCB], zbuf[DCB];
} step_rows;

FX_INLINE void load_rows(const fx_ssm_fwd_args *f, int64_t i0, int64_t w, const float *bias, step_rows *r)
{
    r->x = fx_fast_load(f->x, i0, w, r->xbuf);
    deltas(w, fx_fast_load(f->dt, i0, w, r->dtbuf), bias, f->dt_softplus, r->u, r->delta);
    for (int64_t c = 0; c < w; c++)
        r->dxb[c] = r->delta[c] * r->x[c];
}

FX_FAST_KERNEL
static void bwd_block(const bwd_job *job, int64_t b, int64_t d0, int64_t w, bwd_work *k)
{
    const fx_ssm_bwd_args *a = job->a;
    const fx_ssm_fwd_args *f = &a->fwd;
    const fx_ssm_dims *n = &f->n;
    const int64_t N = n->dstate, L = n->seqlen, D = n->dim, g = d0 / (D / n->groups);
    const int64_t chunks = (L + CHUNK - 1) / CHUNK, sd = (b * D + d0) * N, S = bwd_stride(n), NB = N * S;
    _Alignas(64) float bias[DCB], dskip[DCB], dyp[DCB], dxv[DCB], ddelta[DCB], ddt[DCB], dz[DCB];
    _Alignas(64) float dxbuf[DCB], ddtbuf[DCB], dzbuf[DCB];
    double dd_sum[DCB] = {0}, dbias_sum[DCB] = {0};
    step_rows r;
    load_block_consts(f->a, f->dt_bias, f->d, N, d0, w, S, k->At, bias, dskip);
    load_states(f->h0, sd, N, w, S, k->ck);
    load_states(a->dstate, sd, N, w, S, k->gs);
    memset(k->da, 0, sizeof(double) * (size_t)NB);
    memset(k->daf, 0, sizeof(float) * (size_t)NB);
    /* The state entering every chunk: ck[c] for chunk c (hs the running state). */
    memcpy(k->hs, k->ck, sizeof(float) * (size_t)NB);
    for (int64_t t = 0; t < L; t++) {
        if (t % CHUNK == 0 && t > 0)
            memcpy(k->ck + (t / CHUNK) * NB, k->hs, sizeof(float) * (size_t)NB);
        if (t % POLL == POLL - 1 && fx_watch_gone(job->w))
            return;
        load_rows(f, at_btd(n, b, t, d0), w, bias, &r);
        const float *brow = fx_fast_load(f->b, at_btg(n, b, t, g), N, k->bbuf);
        scan_step(N, w, S, k->At, r.delta, r.dxb, brow, brow, k->hs, NULL);
    }
    for (int64_t c = chunks - 1; c >= 0; c--) {
        if (fx_watch_gone(job->w))
            return;
        const int64_t t0 = c * CHUNK, t1 = min64(t0 + CHUNK, L);
        memcpy(k->hs, k->ck + c * NB, sizeof(float) * (size_t)NB);
        for (int64_t t = t0; t < t1; t++) {
            load_rows(f, at_btd(n, b, t, d0), w, bias, &r);
            const float *brow = fx_fast_load(f->b, at_btg(n, b, t, g), N, k->bbuf);
            scan_step_keep(N, w, S, k->At, r.delta, r.dxb, brow, k->hs + (t - t0) * NB, k->hs + (t - t0 + 1) * NB,
                           k->dec + (t - t0) * NB);
        }
        for (int64_t t = t1 - 1; t >= t0; t--) {
            const int64_t i0 = at_btd(n, b, t, d0), s = t - t0;
            const float *prev = k->hs + s * NB, *cur = prev + NB, *dec = k->dec + s * NB;
            load_rows(f, i0, w, bias, &r);
            const float *brow = fx_fast_load(f->b, at_btg(n, b, t, g), N, k->bbuf);
            const float *crow = fx_fast_load(f->c, at_btg(n, b, t, g), N, k->cbuf);
            const float *dy = fx_fast_load(a->dy, i0, w, r.dybuf);
            if (f->z) {
                const float *z = fx_fast_load(f->z, i0, w, r.zbuf);
                _Alignas(64) float ypre[DCB];
                for (int64_t c2 = 0; c2 < w; c2++)
                    ypre[c2] = dskip[c2] * r.x[c2];
                for (int64_t q = 0; q < N; q++) {
                    const float cq = crow[q], *restrict hq = cur + q * S;
#pragma omp simd
                    for (int64_t c2 = 0; c2 < w; c2++)
                        ypre[c2] += cq * hq[c2];
                }
#pragma omp simd
                for (int64_t c2 = 0; c2 < w; c2++) {
                    float sg = fx_fast_sigmoid(z[c2]);
                    dyp[c2] = dy[c2] * z[c2] * sg;
                    dz[c2] = dy[c2] * ypre[c2] * sg * (1.0f + z[c2] * (1.0f - sg));
                }
            } else {
                memcpy(dyp, dy, sizeof(float) * (size_t)w);
            }
            for (int64_t c2 = 0; c2 < w; c2++) {
                dxv[c2] = dskip[c2] * dyp[c2];
                ddelta[c2] = 0.0f;
            }
            float *dbt = k->db + t * N, *dct = k->dc + t * N;
            for (int64_t q = 0; q < N; q++) {
                const float bq = brow[q], cq = crow[q];
                const float *restrict Aq = k->At + q * S, *restrict pq = prev + q * S;
                const float *restrict hq = cur + q * S, *restrict eq = dec + q * S;
                float *restrict gq = k->gs + q * S, *restrict daq = k->daf + q * S;
                const float *restrict delta = r.delta, *restrict x = r.x;
                float dcs = 0.0f, dbs = 0.0f;
#pragma omp simd reduction(+ : dcs, dbs)
                for (int64_t c2 = 0; c2 < w; c2++) {
                    float gg = cq * dyp[c2] + gq[c2]; /* dL/dh_t */
                    float ep = eq[c2] * pq[c2];
                    dcs += dyp[c2] * hq[c2];
                    ddelta[c2] += gg * (Aq[c2] * ep + bq * x[c2]);
                    daq[c2] += gg * delta[c2] * ep;
                    dbs += gg * delta[c2] * x[c2];
                    dxv[c2] += gg * delta[c2] * bq;
                    gq[c2] = eq[c2] * gg; /* dL/dh_{t-1} through h_t */
                }
                dct[q] += dcs;
                dbt[q] += dbs;
            }
#pragma omp simd
            for (int64_t c2 = 0; c2 < w; c2++)
                ddt[c2] = ddelta[c2] * (f->dt_softplus ? (r.u[c2] > 20.0f ? 1.0f : fx_fast_sigmoid(r.u[c2])) : 1.0f);
            for (int64_t c2 = 0; c2 < w; c2++) {
                dd_sum[c2] += dyp[c2] * r.x[c2];
                dbias_sum[c2] += ddt[c2];
            }
            float *o = fx_fast_out(a->dx, i0, dxbuf);
            memcpy(o, dxv, sizeof(float) * (size_t)w);
            if (o == dxbuf)
                fx_fast_store(a->dx, i0, w, o);
            o = fx_fast_out(a->ddt, i0, ddtbuf);
            memcpy(o, ddt, sizeof(float) * (size_t)w);
            if (o == ddtbuf)
                fx_fast_store(a->ddt, i0, w, o);
            if (a->dz) {
                o = fx_fast_out(a->dz, i0, dzbuf);
                memcpy(o, dz, sizeof(float) * (size_t)w);
                if (o == dzbuf)
                    fx_fast_store(a->dz, i0, w, o);
            }
        }
        for (int64_t i = 0; i < NB; i++) {
            k->da[i] += k->daf[i];
            k->daf[i] = 0.0f;
        }
    }
    for (int64_t c2 = 0; c2 < w; c2++) {
        for (int64_t q = 0; q < N; q++)
            job->da[sd + c2 * N + q] = k->da[q * S + c2];
        job->dd[b * D + d0 + c2] = dd_sum[c2];
        job->dbias[b * D + d0 + c2] = dbias_sum[c2];
    }
    if (a->dh0)
        store_states(a->dh0, sd, N, w, S, k->gs, k->hs);
}

/* Tasks [lo, hi) of (batch row, group). */
static void bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    bwd_job *job = ctx;
    const fx_ssm_fwd_args *f = &job->a->fwd;
    const fx_ssm_dims *n = &f->n;
    const int64_t N = n->dstate, L = n->seqlen, G = n->groups, cpg = n->dim / G;
    float *p = fx_fast_scratch(sizeof(float) * bwd_scratch_floats(n));
    if (!p) {
        atomic_store(&job->out_of_memory, true);
        return;
    }
    bwd_work k = carve(n, p);
    for (int64_t task = lo; task < hi && !fx_watch_gone(job->w); task++) {
        const int64_t b = task / G, g = task % G;
        memset(k.db, 0, sizeof(float) * (size_t)(2 * L * N));
        for (int64_t d = g * cpg; d < (g + 1) * cpg;) {
            int64_t w = min64(DCB, (g + 1) * cpg - d);
            bwd_block(job, b, d, w, &k);
            d += w;
        }
        for (int64_t t = 0; t < L; t++) {
            fx_fast_store(job->a->db, at_btg(n, b, t, g), N, k.db + t * N);
            fx_fast_store(job->a->dc, at_btg(n, b, t, g), N, k.dc + t * N);
        }
    }
}

static size_t sums_doubles(const fx_ssm_dims *n)
{
    return fx_size_add(fx_size_mul(n->batch * n->dim, n->dstate), fx_size_mul(2 * n->batch, n->dim));
}

static int fast_backward(const fx_ssm_bwd_args *a, fx_status *st)
{
    const fx_ssm_dims *n = &a->fwd.n;
    const int64_t B = n->batch, D = n->dim, N = n->dstate;
    bwd_job job = {a, NULL, NULL, NULL, NULL, false};
    if (B * D == 0)
        return FX_OK;
    const size_t sums_bytes = fx_size_mul((int64_t)sums_doubles(n), sizeof(double));
    job.da = sums_bytes == SIZE_MAX ? NULL : fx_fast_call_scratch(sums_bytes);
    if (!job.da)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a selective_scan_backward's %zu bytes of sums",
                       sums_bytes);
    job.dd = job.da + B * D * N;
    job.dbias = job.dd + B * D;
    fx_watch w;
    fx_watch_begin(&w);
    job.w = &w;
    fx_pool_run(B * n->groups, 1, state_steps(n) * 4, bwd_range, &job);
    int rc = atomic_load(&job.out_of_memory)
                 ? fx_fail(st, FX_ENOMEM, "out of host memory for a selective_scan_backward's %zu-byte workspace",
                           sizeof(float) * bwd_scratch_floats(n))
                 : fx_watch_end(&w, "selective_scan_backward", st);
    if (rc == FX_OK) {
        for (int64_t i = 0; i < D * N; i++) {
            double sum = 0.0;
            for (int64_t b = 0; b < B; b++)
                sum += job.da[b * D * N + i];
            fx_store_f64(a->da->data, a->da->dtype, i, sum);
        }
        for (int64_t d = 0; d < D; d++) {
            double dd = 0.0, dbias = 0.0;
            for (int64_t b = 0; b < B; b++) {
                dd += job.dd[b * D + d];
                dbias += job.dbias[b * D + d];
            }
            if (a->dd)
                fx_store_f64(a->dd->data, a->dd->dtype, d, dd);
            if (a->ddt_bias)
                fx_store_f64(a->ddt_bias->data, a->ddt_bias->dtype, d, dbias);
        }
    }
    return rc;
}

/* ---- the table: the oracle for f64 and for the reference device ---- */

static bool oracle(const fx_exec *ex, fx_dtype x_type)
{
    return ex->device == FX_CPU_REFERENCE || x_type == FX_F64;
}

static int cpu_forward(const fx_exec *ex, const fx_ssm_fwd_args *a, fx_status *st)
{
    return oracle(ex, a->x->dtype) ? fx_cpu_ssm_ops.forward(ex, a, st) : fast_forward(a, st);
}

static int cpu_backward(const fx_exec *ex, const fx_ssm_bwd_args *a, fx_status *st)
{
    return oracle(ex, a->fwd.x->dtype) ? fx_cpu_ssm_ops.backward(ex, a, st) : fast_backward(a, st);
}

static int cpu_step(const fx_exec *ex, const fx_ssm_step_args *a, fx_status *st)
{
    return oracle(ex, a->x->dtype) ? fx_cpu_ssm_ops.step(ex, a, st) : fast_step(a, st);
}

static size_t cpu_forward_scratch(const fx_exec *ex, const fx_ssm_fwd_args *a)
{
    return oracle(ex, a->x->dtype) ? fx_cpu_ssm_ops.forward_scratch(ex, a) : 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_ssm_bwd_args *a)
{
    /* The fast path's workspaces are its threads' own (fx_fast_scratch). */
    return oracle(ex, a->fwd.x->dtype) ? fx_cpu_ssm_ops.backward_scratch(ex, a) : 0;
}

const struct fx_ssm_ops fx_cpu_fast_ssm_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
    .reads_saved = false,
    .max_dstate = 0,
};
