/* The fast linear recurrences (fusex_linrec.h): f32 state and arithmetic,
 * the inner loops along contiguous channels of one batch row (the layout's
 * innermost axis), so each step of a segment of channels is one vectorised
 * loop over its coefficients and the recurrence.
 *
 * Work is the batch x hidden columns split in contiguous chunks over the
 * pool; a chunk walks its columns in segments of at most SEG channels of
 * one batch row, each segment the whole sequence with its states in L1.
 * Every column is one thread's, so results do not depend on the thread
 * count; liquid's sums over batch are reduced in a fixed order after. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include "cpu/fast/fast.h"
#include "fusex_linrec.h"

#define SEG 256  /* channels a segment: states and rows of a step sit in L1 */
#define POLL 64  /* steps between looks at the caller's watch */

/* Elements of a call (batch x seqlen x hidden), saturated. */
static int64_t call_work(const fx_linrec_problem *p)
{
    return (int64_t)fx_size_mul(p->batch * p->seqlen, p->hidden) > INT64_MAX / 2
               ? INT64_MAX / 2
               : p->batch * p->seqlen * p->hidden;
}

static int64_t row_of(const fx_linrec_problem *p, int64_t s)
{
    return p->reverse ? p->seqlen - 1 - s : s;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- forward ---- */

typedef struct fwd_job {
    const fx_linrec_fwd_args *a;
    fx_watch *w;
} fwd_job;

/* Per-channel values of a segment: liquid's 1/tau and A. */
typedef struct seg_consts {
    float inv_tau[SEG], lam[SEG];
} seg_consts;

static void load_consts(const fx_linrec_problem *p, int64_t h0, int64_t w, seg_consts *k)
{
    if (p->kind != FX_LINREC_LIQUID)
        return;
    float buf[SEG];
    const float *tau = fx_fast_load(p->tau, h0, w, buf);
    for (int64_t j = 0; j < w; j++)
        k->inv_tau[j] = 1.0f / tau[j];
    const float *lam = fx_fast_load(p->lam, h0, w, buf);
    memcpy(k->lam, lam, sizeof(float) * (size_t)w);
}

static float step_dt(const fx_linrec_problem *p, int64_t b, int64_t row)
{
    return p->dt ? (float)fx_load_f64(p->dt->data, p->dt->dtype, b * p->seqlen + row) : (float)p->dt_value;
}

/* c~ and dc~/dcand. */
FX_INLINE float cand_value(int g, float c) { return g ? (c >= 0.0f ? c + 0.5f : fx_fast_sigmoid(c)) : c; }

FX_INLINE float cand_slope(int g, float c)
{
    if (!g)
        return 1.0f;
    float s = fx_fast_sigmoid(c);
    return c >= 0.0f ? 1.0f : s * (1.0f - s);
}


/* The gated kinds' loops, unswitched on candidate_g (a constant once
 * inlined): without g no sigmoid of the candidate is computed. */
FX_INLINE void mingru_fwd(int64_t w, int g, const float *restrict zl, const float *restrict cand,
                          float *restrict st, float *restrict h)
{
#pragma omp simd
    for (int64_t j = 0; j < w; j++) {
        float v = zl[j], e = fx_fast_exp(-fabsf(v)), r = 1.0f / (1.0f + e);
        float z = v >= 0.0f ? r : e * r, a = v >= 0.0f ? e * r : r;
        h[j] = st[j] = a * st[j] + z * cand_value(g, cand[j]);
    }
}

FX_INLINE void minlstm_fwd(int64_t w, int g, const float *restrict fl, const float *restrict il,
                           const float *restrict cand, float *restrict st, float *restrict h)
{
#pragma omp simd
    for (int64_t j = 0; j < w; j++) {
        float d = fx_fast_softplus_any(-il[j]) - fx_fast_softplus_any(-fl[j]);
        float e = fx_fast_exp(-fabsf(d)), r = 1.0f / (1.0f + e);
        float a = d >= 0.0f ? r : e * r, i = d >= 0.0f ? e * r : r; /* sigmoid(d), sigmoid(-d) */
        h[j] = st[j] = a * st[j] + i * cand_value(g, cand[j]);
    }
}

/* One step of a segment: st = a * st + b, h = st. */
FX_INLINE void fwd_step(const fx_linrec_problem *p, int64_t w, const float *const *x, float dt,
                            const seg_consts *k, float *restrict st, float *restrict h)
{
    const int g = p->candidate_g;
    switch (p->kind) {
    case FX_LINREC_SCAN: {
        const float *restrict xa = x[0], *restrict xb = x[1];
#pragma omp simd
        for (int64_t j = 0; j < w; j++)
            h[j] = st[j] = xa[j] * st[j] + xb[j];
        break;
    }
    case FX_LINREC_MINGRU:
        if (g)
            mingru_fwd(w, 1, x[0], x[1], st, h);
        else
            mingru_fwd(w, 0, x[0], x[1], st, h);
        break;
    case FX_LINREC_MINLSTM:
        if (g)
            minlstm_fwd(w, 1, x[0], x[1], x[2], st, h);
        else
            minlstm_fwd(w, 0, x[0], x[1], x[2], st, h);
        break;
    default: { /* liquid */
        const float *restrict fl = x[0];
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
            float f = fx_fast_sigmoid(fl[j]);
            float inv_den = 1.0f / (1.0f + dt * (k->inv_tau[j] + f));
            h[j] = st[j] = (st[j] + dt * f * k->lam[j]) * inv_den;
        }
        break;
    }
    }
}

FX_FAST_KERNEL
static void fwd_segment(const fwd_job *job, int64_t b, int64_t h0, int64_t w)
{
    const fx_linrec_fwd_args *a = job->a;
    const fx_linrec_problem *p = &a->p;
    const int64_t L = p->seqlen, H = p->hidden;
    _Alignas(64) float st[SEG], hbuf[SEG], xbuf[FX_LINREC_MAX_SEQ][SEG];
    seg_consts k;
    load_consts(p, h0, w, &k);
    if (a->h0)
        memcpy(st, fx_fast_load(a->h0, b * H + h0, w, hbuf), sizeof(float) * (size_t)w);
    else
        memset(st, 0, sizeof(float) * (size_t)w);
    for (int64_t s = 0; s < L; s++) {
        if (s % POLL == POLL - 1 && fx_watch_gone(job->w))
            return;
        const int64_t row = row_of(p, s), i0 = (b * L + row) * H + h0;
        const float *x[FX_LINREC_MAX_SEQ];
        for (int q = 0; q < p->nseq; q++)
            x[q] = fx_fast_load(p->seq[q], i0, w, xbuf[q]);
        float *h = fx_fast_out(a->h, i0, hbuf);
        fwd_step(p, w, x, p->kind == FX_LINREC_LIQUID ? step_dt(p, b, row) : 0.0f, &k, st, h);
        if (h == hbuf)
            fx_fast_store(a->h, i0, w, h);
    }
    if (a->state)
        fx_fast_store(a->state, b * H + h0, w, st);
}

static void fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    const fwd_job *job = ctx;
    const int64_t H = job->a->p.hidden;
    for (int64_t c = lo; c < hi && !fx_watch_gone(job->w);) {
        int64_t b = c / H, h0 = c % H, w = min64(min64(SEG, H - h0), hi - c);
        fwd_segment(job, b, h0, w);
        c += w;
    }
}

static int fast_forward(const fx_linrec_fwd_args *a, fx_status *st)
{
    const fx_linrec_problem *p = &a->p;
    fx_watch w;
    fx_watch_begin(&w);
    fwd_job job = {a, &w};
    fx_pool_run(p->batch * p->hidden, 16, call_work(p), fwd_range, &job);
    return fx_watch_end(&w, "a linrec forward", st);
}

/* ---- backward ----
 * g_t = dh_t + u_{t+1} (u_T = dstate), u_t = a_t g_t, dh0 = u_0; h_{t-1}
 * read from the forward's output (h0 at the first step). */

typedef struct bwd_job {
    const fx_linrec_bwd_args *a;
    fx_watch *w;
    double *dtau, *dlam; /* liquid: [batch][hidden], each column one thread's */
    atomic_bool out_of_memory; /* a thread found no memory for its row sums */
} bwd_job;

/* Liquid's per-step sums of a segment, kept in f32 for POLL steps, then
 * added into f64 (the sums run over the whole sequence). */
typedef struct seg_sums {
    float tau[SEG], lam[SEG];
    double tau64[SEG], lam64[SEG];
    double *ddt; /* [seqlen] of this batch row, or NULL */
} seg_sums;

FX_INLINE void mingru_bwd(int64_t w, int gflag, const float *restrict zl, const float *restrict cand,
                          const float *restrict dh, const float *restrict hp, float *restrict u,
                          float *restrict dz, float *restrict dc)
{
#pragma omp simd
    for (int64_t j = 0; j < w; j++) {
        float v = zl[j], e = fx_fast_exp(-fabsf(v)), r = 1.0f / (1.0f + e);
        float z = v >= 0.0f ? r : e * r, a = v >= 0.0f ? e * r : r;
        float g = dh[j] + u[j], c = cand_value(gflag, cand[j]);
        dz[j] = g * (c - hp[j]) * z * a;
        dc[j] = g * z * cand_slope(gflag, cand[j]);
        u[j] = a * g;
    }
}

FX_INLINE void minlstm_bwd(int64_t w, int gflag, const float *restrict fl, const float *restrict il,
                           const float *restrict cand, const float *restrict dh, const float *restrict hp,
                           float *restrict u, float *restrict dfl, float *restrict dil, float *restrict dc)
{
#pragma omp simd
    for (int64_t j = 0; j < w; j++) {
        float d = fx_fast_softplus_any(-il[j]) - fx_fast_softplus_any(-fl[j]);
        float e = fx_fast_exp(-fabsf(d)), r = 1.0f / (1.0f + e);
        float fp = d >= 0.0f ? r : e * r, ip = d >= 0.0f ? e * r : r;
        float g = dh[j] + u[j], c = cand_value(gflag, cand[j]);
        float dd = g * (hp[j] - c) * fp * ip;
        dfl[j] = dd * fx_fast_sigmoid(-fl[j]);
        dil[j] = -dd * fx_fast_sigmoid(-il[j]);
        dc[j] = g * ip * cand_slope(gflag, cand[j]);
        u[j] = fp * g;
    }
}

/* One step of a segment backward: reads u (what reached h_t from later
 * steps) and leaves what reaches h_{t-1}; the sequence gradients in dx. */
FX_INLINE void bwd_step(const fx_linrec_problem *p, int64_t w, const float *const *x, float dt,
                            const seg_consts *k, const float *restrict dh, const float *restrict hp,
                            float *restrict u, float *const *dx, seg_sums *sums, int64_t row)
{
    const int gflag = p->candidate_g;
    switch (p->kind) {
    case FX_LINREC_SCAN: {
        const float *restrict xa = x[0];
        float *restrict da = dx[0], *restrict db = dx[1];
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
            float g = dh[j] + u[j];
            da[j] = g * hp[j];
            db[j] = g;
            u[j] = xa[j] * g;
        }
        break;
    }
    case FX_LINREC_MINGRU:
        if (gflag)
            mingru_bwd(w, 1, x[0], x[1], dh, hp, u, dx[0], dx[1]);
        else
            mingru_bwd(w, 0, x[0], x[1], dh, hp, u, dx[0], dx[1]);
        break;
    case FX_LINREC_MINLSTM:
        if (gflag)
            minlstm_bwd(w, 1, x[0], x[1], x[2], dh, hp, u, dx[0], dx[1], dx[2]);
        else
            minlstm_bwd(w, 0, x[0], x[1], x[2], dh, hp, u, dx[0], dx[1], dx[2]);
        break;
    default: { /* liquid: h = (hprev + dt f A) / den */
        const float *restrict fl = x[0];
        float *restrict dfl = dx[0];
        float ddt = 0.0f;
#pragma omp simd reduction(+ : ddt)
        for (int64_t j = 0; j < w; j++) {
            float f = fx_fast_sigmoid(fl[j]), it = k->inv_tau[j], lam = k->lam[j];
            float inv_den = 1.0f / (1.0f + dt * (it + f));
            float h = (hp[j] + dt * f * lam) * inv_den;
            float gd = (dh[j] + u[j]) * inv_den;
            dfl[j] = gd * dt * (lam - h) * f * (1.0f - f);
            sums->tau[j] += gd * h * dt * it * it;
            sums->lam[j] += gd * dt * f;
            ddt += gd * (f * lam - h * (it + f));
            u[j] = gd;
        }
        if (sums->ddt)
            sums->ddt[row] += ddt;
        break;
    }
    }
}

static void flush_sums(seg_sums *s, int64_t w)
{
    for (int64_t j = 0; j < w; j++) {
        s->tau64[j] += s->tau[j];
        s->lam64[j] += s->lam[j];
        s->tau[j] = s->lam[j] = 0.0f;
    }
}

FX_FAST_KERNEL
static void bwd_segment(const bwd_job *job, int64_t b, int64_t h0, int64_t w, double *ddt_row)
{
    const fx_linrec_bwd_args *a = job->a;
    const fx_linrec_problem *p = &a->p;
    const int64_t L = p->seqlen, H = p->hidden;
    const int liquid = p->kind == FX_LINREC_LIQUID;
    _Alignas(64) float u[SEG], zero[SEG], hbuf[SEG], dhbuf[SEG];
    _Alignas(64) float xbuf[FX_LINREC_MAX_SEQ][SEG], dxbuf[FX_LINREC_MAX_SEQ][SEG];
    seg_consts k;
    seg_sums sums;
    load_consts(p, h0, w, &k);
    memset(&sums, 0, offsetof(seg_sums, ddt));
    sums.ddt = ddt_row;
    memset(zero, 0, sizeof zero);
    if (a->dstate)
        memcpy(u, fx_fast_load(a->dstate, b * H + h0, w, hbuf), sizeof(float) * (size_t)w);
    else
        memset(u, 0, sizeof(float) * (size_t)w);
    for (int64_t s = L - 1; s >= 0; s--) {
        if (s % POLL == 0) {
            if (liquid)
                flush_sums(&sums, w);
            if (fx_watch_gone(job->w))
                return;
        }
        const int64_t row = row_of(p, s), i0 = (b * L + row) * H + h0;
        const float *x[FX_LINREC_MAX_SEQ];
        float *dx[FX_LINREC_MAX_SEQ];
        for (int q = 0; q < p->nseq; q++) {
            x[q] = fx_fast_load(p->seq[q], i0, w, xbuf[q]);
            dx[q] = fx_fast_out(a->dseq[q], i0, dxbuf[q]);
        }
        const float *hp = s > 0    ? fx_fast_load(a->h, (b * L + row_of(p, s - 1)) * H + h0, w, hbuf)
                          : a->h0 ? fx_fast_load(a->h0, b * H + h0, w, hbuf)
                                  : zero;
        const float *dh = fx_fast_load(a->dh, i0, w, dhbuf);
        bwd_step(p, w, x, liquid ? step_dt(p, b, row) : 0.0f, &k, dh, hp, u, dx, &sums, row);
        for (int q = 0; q < p->nseq; q++)
            if (dx[q] == dxbuf[q])
                fx_fast_store(a->dseq[q], i0, w, dx[q]);
    }
    if (liquid) {
        flush_sums(&sums, w);
        memcpy(job->dtau + b * H + h0, sums.tau64, sizeof(double) * (size_t)w);
        memcpy(job->dlam + b * H + h0, sums.lam64, sizeof(double) * (size_t)w);
    }
    if (a->dh0)
        fx_fast_store(a->dh0, b * H + h0, w, u);
}

/* Columns [lo, hi); with a dt tensor whole batch rows (ddt sums over a
 * row's channels), summed in f64 per row. */
static void bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    const bwd_job *job = ctx;
    const fx_linrec_problem *p = &job->a->p;
    const int64_t H = p->hidden, L = p->seqlen;
    double *ddt = NULL;
    if (job->a->ddt) {
        ddt = fx_fast_scratch(sizeof(double) * (size_t)L);
        if (!ddt) {
            atomic_store(&job->out_of_memory, true);
            return;
        }
    }
    for (int64_t c = lo; c < hi && !fx_watch_gone(job->w);) {
        int64_t b = c / H, h0 = c % H, w = min64(min64(SEG, H - h0), hi - c);
        if (ddt && h0 == 0)
            memset(ddt, 0, sizeof(double) * (size_t)L);
        bwd_segment(job, b, h0, w, ddt);
        c += w;
        if (ddt && c % H == 0)
            for (int64_t t = 0; t < L; t++)
                fx_store_f64(job->a->ddt->data, job->a->ddt->dtype, b * L + t, ddt[t]);
    }
}

static size_t sums_bytes(const fx_linrec_bwd_args *a)
{
    const fx_linrec_problem *p = &a->p;
    if (p->kind != FX_LINREC_LIQUID)
        return 0;
    return fx_size_mul((int64_t)fx_size_mul(2 * p->batch, p->hidden), sizeof(double));
}

static int fast_backward(const fx_linrec_bwd_args *a, fx_status *st)
{
    const fx_linrec_problem *p = &a->p;
    const int64_t B = p->batch, H = p->hidden, L = p->seqlen;
    const int liquid = p->kind == FX_LINREC_LIQUID;
    bwd_job job = {a, NULL, NULL, NULL, false};
    if (liquid) {
        size_t bytes = sums_bytes(a);
        job.dtau = bytes == SIZE_MAX ? NULL : fx_fast_call_scratch(bytes);
        if (!job.dtau)
            return fx_fail(st, FX_ENOMEM, "out of host memory for a linrec backward's %zu bytes of sums", bytes);
        job.dlam = job.dtau + B * H;
    }
    fx_watch w;
    fx_watch_begin(&w);
    job.w = &w;
    fx_pool_run(B * H, a->ddt ? H : 16, call_work(p) * 2, bwd_range, &job);
    int rc = atomic_load(&job.out_of_memory)
                 ? fx_fail(st, FX_ENOMEM, "out of host memory for a linrec backward's %lld row sums", (long long)L)
                 : fx_watch_end(&w, "a linrec backward", st);
    if (rc)
        return rc;
    if (liquid) {
        for (int64_t h = 0; h < H; h++) {
            double dtau = 0, dlam = 0;
            for (int64_t b = 0; b < B; b++) {
                dtau += job.dtau[b * H + h];
                dlam += job.dlam[b * H + h];
            }
            fx_store_f64(a->dtau->data, a->dtau->dtype, h, dtau);
            fx_store_f64(a->dlam->data, a->dlam->dtype, h, dlam);
        }
    }
    return FX_OK;
}

/* ---- the table: the oracle for f64 and for the reference device ---- */

static bool oracle(const fx_exec *ex, const fx_linrec_problem *p)
{
    return ex->device == FX_CPU_REFERENCE || p->dtype == FX_F64;
}

static int cpu_forward(const fx_exec *ex, const fx_linrec_fwd_args *a, fx_status *st)
{
    return oracle(ex, &a->p) ? fx_cpu_linrec_ops.forward(ex, a, st) : fast_forward(a, st);
}

static int cpu_backward(const fx_exec *ex, const fx_linrec_bwd_args *a, fx_status *st)
{
    return oracle(ex, &a->p) ? fx_cpu_linrec_ops.backward(ex, a, st) : fast_backward(a, st);
}

/* A forward of one frame whose h0 and final state are the same tensor:
 * each segment reads its channels' states before it writes them. */
static int cpu_step(const fx_exec *ex, const fx_linrec_step_args *a, fx_status *st)
{
    if (oracle(ex, &a->p))
        return fx_cpu_linrec_ops.step(ex, a, st);
    fx_linrec_fwd_args f = {.p = a->p, .h0 = a->state, .h = a->h, .state = a->state};
    f.p.seqlen = 1;
    f.p.reverse = 0;
    return fast_forward(&f, st);
}

static size_t cpu_forward_scratch(const fx_exec *ex, const fx_linrec_fwd_args *a)
{
    return oracle(ex, &a->p) ? fx_cpu_linrec_ops.forward_scratch(ex, a) : 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_linrec_bwd_args *a)
{
    /* The fast path's workspaces are its threads' own (fx_fast_scratch). */
    return oracle(ex, &a->p) ? fx_cpu_linrec_ops.backward_scratch(ex, a) : 0;
}

const struct fx_linrec_ops fx_cpu_fast_linrec_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
};
