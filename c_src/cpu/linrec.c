/* The CPU reference for the linear recurrences: one scan over (a, b)
 * pairs, per-op coefficient and gradient functions, f64 throughout.
 *
 * Work is split into tasks of (batch row, block of hidden channels); each
 * task walks the sequence once with its block's states in an f64 array,
 * so the inner loop runs along contiguous hidden channels. Everything a
 * task writes belongs to it alone (per-task partial sums are reduced in a
 * fixed order afterwards), so results do not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"
#include "cpu/cpu.h"
#include "fusex_linrec.h"

#define HBLOCK 64

typedef struct affine {
    double a, b;
} affine;

/* One step's inputs for one channel, as f64. */
typedef struct step_in {
    double x[FX_LINREC_MAX_SEQ];
    double tau, lam, dt;
} step_in;

static double sigmoid(double x)
{
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static double softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

/* g(x) = x + 1/2 for x >= 0, sigmoid(x) below: continuous at 0. */
static double cand_value(int use_g, double x)
{
    if (!use_g)
        return x;
    return x >= 0 ? x + 0.5 : sigmoid(x);
}

static double cand_slope(int use_g, double x)
{
    if (!use_g || x >= 0)
        return 1.0;
    double s = sigmoid(x);
    return s * (1.0 - s);
}

/* MinLSTM's normalised gates in a form that stays finite for any logits:
 * f' = f/(f+i) = sigmoid(log f - log i) with log sigmoid(x) = -softplus(-x). */
static double minlstm_d(double fl, double il) { return softplus(-il) - softplus(-fl); }

static affine coeff(const fx_linrec_problem *p, const step_in *in)
{
    switch (p->kind) {
    case FX_LINREC_SCAN: return (affine){in->x[0], in->x[1]};
    case FX_LINREC_MINGRU: {
        double z = sigmoid(in->x[0]);
        return (affine){sigmoid(-in->x[0]), z * cand_value(p->candidate_g, in->x[1])};
    }
    case FX_LINREC_MINLSTM: {
        double d = minlstm_d(in->x[0], in->x[1]);
        return (affine){sigmoid(d), sigmoid(-d) * cand_value(p->candidate_g, in->x[2])};
    }
    default: { /* liquid */
        double f = sigmoid(in->x[0]);
        double den = 1.0 + in->dt * (1.0 / in->tau + f);
        return (affine){1.0 / den, in->dt * f * in->lam / den};
    }
    }
}

/* Gradients of one step's inputs given g = dL/dh_t (everything reaching
 * h_t) and h_{t-1}. dx gets the sequence inputs' gradients; dtau, dlam and
 * ddt get liquid's contributions (to be summed by the caller). */
static void step_grad(const fx_linrec_problem *p, const step_in *in, double hprev, double g,
                      double dx[FX_LINREC_MAX_SEQ], double *dtau, double *dlam, double *ddt)
{
    switch (p->kind) {
    case FX_LINREC_SCAN:
        dx[0] = g * hprev;
        dx[1] = g;
        break;
    case FX_LINREC_MINGRU: {
        double z = sigmoid(in->x[0]), c = cand_value(p->candidate_g, in->x[1]);
        dx[0] = g * (c - hprev) * z * (1.0 - z);
        dx[1] = g * z * cand_slope(p->candidate_g, in->x[1]);
        break;
    }
    case FX_LINREC_MINLSTM: {
        double d = minlstm_d(in->x[0], in->x[1]);
        double fp = sigmoid(d), ip = sigmoid(-d);
        double c = cand_value(p->candidate_g, in->x[2]);
        double dd = g * (hprev - c) * fp * ip; /* dL/dd */
        dx[0] = dd * sigmoid(-in->x[0]);        /* dd/dfl = 1 - sigmoid(fl) */
        dx[1] = -dd * sigmoid(-in->x[1]);       /* dd/dil = -(1 - sigmoid(il)) */
        dx[2] = g * ip * cand_slope(p->candidate_g, in->x[2]);
        break;
    }
    default: { /* liquid: h = (hprev + dt f A) / den */
        double f = sigmoid(in->x[0]);
        double inv_tau = 1.0 / in->tau;
        double den = 1.0 + in->dt * (inv_tau + f);
        double h = (hprev + in->dt * f * in->lam) / den;
        double gd = g / den;
        dx[0] = gd * in->dt * (in->lam - h) * f * (1.0 - f);
        *dtau += gd * h * in->dt * inv_tau * inv_tau;
        *dlam += gd * in->dt * f;
        *ddt += gd * (f * in->lam - h * (inv_tau + f));
        break;
    }
    }
}

/* ---- element access ---- */

static double at(const fx_tensor *t, int64_t i) { return fx_load_f64(t->data, t->dtype, i); }
static void put(const fx_tensor *t, int64_t i, double v) { fx_store_f64(t->data, t->dtype, i, v); }

/* Time row of the s-th step in scan order. */
static int64_t row_of(const fx_linrec_problem *p, int64_t s)
{
    return p->reverse ? p->seqlen - 1 - s : s;
}

static void load_step(const fx_linrec_problem *p, int64_t b, int64_t row, int64_t h, step_in *in)
{
    int64_t i = (b * p->seqlen + row) * p->hidden + h;
    for (int k = 0; k < p->nseq; k++)
        in->x[k] = at(p->seq[k], i);
    if (p->kind == FX_LINREC_LIQUID) {
        in->tau = at(p->tau, h);
        in->lam = at(p->lam, h);
        in->dt = p->dt ? at(p->dt, b * p->seqlen + row) : p->dt_value;
    }
}

typedef struct task {
    int64_t b, h_lo, h_hi;
} task;

static int64_t task_count(const fx_linrec_problem *p, int64_t block)
{
    return p->batch * ((p->hidden + block - 1) / block);
}

static task task_at(const fx_linrec_problem *p, int64_t block, int64_t i)
{
    int64_t per_row = (p->hidden + block - 1) / block;
    task t = {i / per_row, (i % per_row) * block, 0};
    t.h_hi = t.h_lo + block < p->hidden ? t.h_lo + block : p->hidden;
    return t;
}

/* ---- forward ---- */

static void forward_task(const fx_linrec_fwd_args *a, task tk, fx_watch *w)
{
    const fx_linrec_problem *p = &a->p;
    double state[HBLOCK];
    int64_t width = tk.h_hi - tk.h_lo;
    for (int64_t j = 0; j < width; j++)
        state[j] = a->h0 ? at(a->h0, tk.b * p->hidden + tk.h_lo + j) : 0.0;
    for (int64_t s = 0; s < p->seqlen; s++) {
        if (fx_watch_gone(w))
            return;
        int64_t row = row_of(p, s);
        for (int64_t j = 0; j < width; j++) {
            step_in in;
            load_step(p, tk.b, row, tk.h_lo + j, &in);
            affine m = coeff(p, &in);
            state[j] = m.a * state[j] + m.b;
            put(a->h, (tk.b * p->seqlen + row) * p->hidden + tk.h_lo + j, state[j]);
        }
    }
    if (a->state)
        for (int64_t j = 0; j < width; j++)
            put(a->state, tk.b * p->hidden + tk.h_lo + j, state[j]);
}

static int cpu_forward(const fx_exec *ex, const fx_linrec_fwd_args *a, fx_status *st)
{
    (void)ex;
    const fx_linrec_problem *p = &a->p;
    int64_t n = task_count(p, HBLOCK);
    int64_t work = p->batch * p->seqlen * p->hidden;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < n && !fx_watch_gone(&w); lo = fx_piece_end(lo, n)) {
        const int64_t hi = fx_piece_end(lo, n);
#pragma omp parallel for schedule(dynamic) if (work > FX_CPU_PARALLEL_MIN)
        for (int64_t i = lo; i < hi; i++)
            if (!fx_watch_gone(&w))
                forward_task(a, task_at(p, HBLOCK, i), &w);
    }
    return fx_watch_end(&w, "a linrec forward", st);
}

/* ---- backward ----
 * With g_t = dL/dh_t in total, u_t = a_t g_t is what flows on to h_{t-1}:
 *   g_t = dh_t + u_{t+1},  u_{T} = dstate,  dh0 = u_0,
 * walked from the last step of the scan to the first. h_{t-1} is read from
 * the forward's output (or h0 at the first step). */

typedef struct bwd_sums {
    double *dtau, *dlam; /* [batch][hidden], each (b, h) written by one task */
    double *ddt;         /* [batch][seqlen], each batch row summed by one thread */
} bwd_sums;

static void backward_task(const fx_linrec_bwd_args *a, task tk, bwd_sums *sums, fx_watch *w)
{
    const fx_linrec_problem *p = &a->p;
    double u[HBLOCK];
    int64_t width = tk.h_hi - tk.h_lo, L = p->seqlen, H = p->hidden;
    for (int64_t j = 0; j < width; j++)
        u[j] = a->dstate ? at(a->dstate, tk.b * H + tk.h_lo + j) : 0.0;
    double *dtau = sums->dtau ? sums->dtau + tk.b * H : NULL;
    double *dlam = sums->dlam ? sums->dlam + tk.b * H : NULL;
    for (int64_t s = L - 1; s >= 0; s--) {
        if (fx_watch_gone(w))
            return;
        int64_t row = row_of(p, s), prev_row = s > 0 ? row_of(p, s - 1) : -1;
        double ddt = 0;
        for (int64_t j = 0; j < width; j++) {
            int64_t h = tk.h_lo + j, i = (tk.b * L + row) * H + h;
            step_in in;
            load_step(p, tk.b, row, h, &in);
            double hprev = prev_row >= 0 ? at(a->h, (tk.b * L + prev_row) * H + h)
                           : a->h0     ? at(a->h0, tk.b * H + h)
                                       : 0.0;
            double g = at(a->dh, i) + u[j];
            double dx[FX_LINREC_MAX_SEQ] = {0}, dt_ = 0, dl_ = 0;
            step_grad(p, &in, hprev, g, dx, &dt_, &dl_, &ddt);
            for (int k = 0; k < p->nseq; k++)
                put(a->dseq[k], i, dx[k]);
            if (dtau) {
                dtau[h] += dt_;
                dlam[h] += dl_;
            }
            u[j] = coeff(p, &in).a * g;
        }
        if (sums->ddt)
            sums->ddt[tk.b * L + row] += ddt;
    }
    if (a->dh0)
        for (int64_t j = 0; j < width; j++)
            put(a->dh0, tk.b * H + tk.h_lo + j, u[j]);
}

/* Liquid's per-batch sums: dtau and dlam [batch][hidden], ddt [batch][seqlen]. */
static size_t backward_sums_bytes(const fx_linrec_bwd_args *a)
{
    const fx_linrec_problem *p = &a->p;
    if (p->kind != FX_LINREC_LIQUID)
        return 0;
    size_t doubles = fx_size_add(fx_size_mul(2 * p->batch, p->hidden),
                                 a->ddt ? fx_size_mul(p->batch, p->seqlen) : 0);
    return fx_size_mul((int64_t)doubles, sizeof(double));
}

static size_t cpu_forward_scratch(const fx_exec *ex, const fx_linrec_fwd_args *a)
{
    (void)ex;
    (void)a;
    return 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_linrec_bwd_args *a)
{
    (void)ex;
    size_t bytes = backward_sums_bytes(a);
    return bytes ? fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(bytes)) : 0;
}

static int cpu_backward(const fx_exec *ex, const fx_linrec_bwd_args *a, fx_status *st)
{
    const fx_linrec_problem *p = &a->p;
    int64_t B = p->batch, L = p->seqlen, H = p->hidden;
    bwd_sums sums = {0};
    int liquid = p->kind == FX_LINREC_LIQUID;
    if (liquid) {
        size_t bytes = backward_sums_bytes(a);
        if (fx_scratch_alloc(ex, bytes, (void **)&sums.dtau, st))
            return st->code;
        memset(sums.dtau, 0, bytes);
        sums.dlam = sums.dtau + B * H;
        sums.ddt = a->ddt ? sums.dlam + B * H : NULL;
    }
    /* With a dt tensor, ddt sums over every channel of a row: one thread
     * takes all of a batch row's channel blocks, so no two threads share a
     * sum. */
    int64_t work = B * L * H;
    fx_watch w;
    fx_watch_begin(&w);
    if (a->ddt) {
        for (int64_t b0 = 0; b0 < B && !fx_watch_gone(&w); b0 = fx_piece_end(b0, B)) {
            const int64_t b1 = fx_piece_end(b0, B);
#pragma omp parallel for schedule(dynamic) if (work > FX_CPU_PARALLEL_MIN)
            for (int64_t b = b0; b < b1; b++)
                for (int64_t lo = 0; lo < H && !fx_watch_gone(&w); lo += HBLOCK)
                    backward_task(a, (task){b, lo, lo + HBLOCK < H ? lo + HBLOCK : H}, &sums, &w);
        }
    } else {
        int64_t n = task_count(p, HBLOCK);
        for (int64_t lo = 0; lo < n && !fx_watch_gone(&w); lo = fx_piece_end(lo, n)) {
            const int64_t hi = fx_piece_end(lo, n);
#pragma omp parallel for schedule(dynamic) if (work > FX_CPU_PARALLEL_MIN)
            for (int64_t i = lo; i < hi; i++)
                if (!fx_watch_gone(&w))
                    backward_task(a, task_at(p, HBLOCK, i), &sums, &w);
        }
    }
    if (fx_watch_end(&w, "a linrec backward", st)) {
        if (liquid)
            fx_scratch_release(ex, sums.dtau);
        return st->code;
    }
    if (liquid) {
        for (int64_t h = 0; h < H; h++) {
            double dtau = 0, dlam = 0;
            for (int64_t b = 0; b < B; b++) {
                dtau += sums.dtau[b * H + h];
                dlam += sums.dlam[b * H + h];
            }
            put(a->dtau, h, dtau);
            put(a->dlam, h, dlam);
        }
        if (a->ddt)
            for (int64_t i = 0; i < B * L; i++)
                put(a->ddt, i, sums.ddt[i]);
        fx_scratch_release(ex, sums.dtau);
    }
    return FX_OK;
}

/* ---- step: a forward of one frame whose h0 and final state are the
 * same tensor (each task reads its channels' states before writing them) */

static int cpu_step(const fx_exec *ex, const fx_linrec_step_args *a, fx_status *st)
{
    fx_linrec_fwd_args f = {.p = a->p, .h0 = a->state, .h = a->h, .state = a->state};
    f.p.seqlen = 1;
    f.p.reverse = 0;
    return cpu_forward(ex, &f, st);
}

const struct fx_linrec_ops fx_cpu_linrec_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
};
