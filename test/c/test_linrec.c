/* Linear recurrences (generic scan, MinGRU, MinLSTM, Liquid): hand-computed
 * cases, CPU gradients against central finite differences in f64, the
 * scan's identities (reverse = flipped input, split with carried state =
 * one call, steps = one call) on the device under test, and on CUDA every
 * forward and backward against the CPU over awkward shapes, through both
 * the single-tile path and the multi-tile (look-back) path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"
#include "core/linrec.h"
#include "core/ops.h"
#include "fusex_cpu.h"
#include "testutil.h"

/* ---- a test case: what to run and on what ---- */

typedef struct lr_case {
    int kind;
    int64_t B, L, H;
    fx_dtype dtype;
    int reverse, cand_g;
    int h0;        /* 0: none, 1: of the sequence dtype, 2: of the state dtype */
    int dstate;    /* backward: 0 none, 1 sequence dtype, 2 state dtype */
    int dt_tensor; /* liquid: dt as a [batch, seqlen, 1] tensor */
    double dt_value;
    int max_tile; /* fx_linrec_*_args.max_tile_steps */
} lr_case;

static const char *kind_name(int kind) { return fx_linrec_op_name(kind); }

static const char *describe(const lr_case *c)
{
    static char text[256];
    snprintf(text, sizeof text, "%s B%lld L%lld H%lld %s%s%s h0=%d dstate=%d%s tile=%d",
             kind_name(c->kind), (long long)c->B, (long long)c->L, (long long)c->H,
             fx_dtype_name(c->dtype), c->reverse ? " reverse" : "", c->cand_g ? " g" : "", c->h0,
             c->dstate, c->kind == FX_LINREC_LIQUID ? (c->dt_tensor ? " dt=tensor" : " dt=scalar") : "",
             c->max_tile);
    return text;
}

static double tolerance(fx_dtype t)
{
    return t == FX_F64 ? 1e-12 : t == FX_F32 ? 1e-5 : 1e-2;
}

static fx_dtype state_type(const lr_case *c) { return fx_linrec_state_dtype(c->dtype); }
static fx_dtype h0_type(const lr_case *c) { return c->h0 == 2 ? state_type(c) : c->dtype; }
static fx_dtype dstate_type(const lr_case *c) { return c->dstate == 2 ? state_type(c) : c->dtype; }

/* ---- host inputs, f64 ---- */

typedef struct lr_host {
    double *seq[FX_LINREC_MAX_SEQ], *tau, *lam, *dt, *h0;
} lr_host;

static int64_t seq_len(const lr_case *c) { return c->B * c->L * c->H; }

static double *alloc_values(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* Inputs in the ranges the ops see in practice: the generic scan's a in
 * [0.9, 1) keeps a long memory, so carries travel across many tiles. */
static void fill_seq(const lr_case *c, int k, double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int is_cand = (c->kind == FX_LINREC_MINGRU && k == 1) || (c->kind == FX_LINREC_MINLSTM && k == 2);
        if (c->kind == FX_LINREC_SCAN)
            v[i] = k == 0 ? fx_rand_uniform(0.9, 1.0) : fx_rand_uniform(-1, 1);
        else if (is_cand)
            v[i] = fx_rand_uniform(-2, 2);
        else
            v[i] = 2.0 * fx_rand_normal();
    }
}

static void host_random(const lr_case *c, lr_host *x)
{
    memset(x, 0, sizeof *x);
    int64_t n = seq_len(c);
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++) {
        x->seq[k] = alloc_values(n);
        fill_seq(c, k, x->seq[k], n);
    }
    if (c->kind == FX_LINREC_LIQUID) {
        x->tau = alloc_values(c->H);
        x->lam = alloc_values(c->H);
        fx_fill_uniform(x->tau, c->H, 0.5, 3.0);
        fx_fill_uniform(x->lam, c->H, -2, 2);
        if (c->dt_tensor) {
            x->dt = alloc_values(c->B * c->L);
            fx_fill_uniform(x->dt, c->B * c->L, 0.05, 1.0);
        }
    }
    if (c->h0) {
        x->h0 = alloc_values(c->B * c->H);
        fx_fill_uniform(x->h0, c->B * c->H, -1, 1);
    }
}

static void host_free(lr_host *x)
{
    for (int k = 0; k < FX_LINREC_MAX_SEQ; k++)
        free(x->seq[k]);
    free(x->tau);
    free(x->lam);
    free(x->dt);
    free(x->h0);
}

/* ---- device tensors for a case ---- */

typedef struct lr_dev {
    fx_linrec_tensors in;
    fx_linrec_inputs p;
} lr_dev;

static void dev_make(fx_device *dev, const lr_case *c, const lr_host *x, lr_dev *d)
{
    memset(d, 0, sizeof *d);
    int64_t sdims[3] = {c->B, c->L, c->H}, hdims[1] = {c->H}, tdims[3] = {c->B, c->L, 1},
            bdims[2] = {c->B, c->H};
    d->p.kind = c->kind;
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++) {
        fx_test_tensor(dev, c->dtype, 3, sdims, x->seq[k], &d->in.seq[k]);
        d->p.seq[k] = &d->in.seq[k];
    }
    if (c->kind == FX_LINREC_LIQUID) {
        fx_test_tensor(dev, c->dtype, 1, hdims, x->tau, &d->in.tau);
        fx_test_tensor(dev, c->dtype, 1, hdims, x->lam, &d->in.lam);
        d->p.tau = &d->in.tau;
        d->p.lam = &d->in.lam;
        if (c->dt_tensor) {
            fx_test_tensor(dev, c->dtype, 3, tdims, x->dt, &d->in.dt);
            d->p.dt = &d->in.dt;
        }
        d->p.dt_value = c->dt_value;
    }
    if (c->h0) {
        fx_test_tensor(dev, h0_type(c), 2, bdims, x->h0, &d->in.h0);
        d->p.h0 = &d->in.h0;
    }
    d->p.candidate_g = c->cand_g;
    d->p.reverse = c->reverse;
}

/* Overwrites every byte with 0xFF (NaN in every float type). */
static void poison(const fx_tensor *t)
{
    if (!t->buffer || t->nbytes == 0)
        return;
    void *ones = malloc(t->nbytes);
    memset(ones, 0xff, t->nbytes);
    fx_status st;
    fx_status_clear(&st);
    t->device->backend->upload(t->device->ordinal, t->data, ones, t->nbytes, &st);
    free(ones);
    FX_CK_OK(st);
}

/* ---- runs ---- */

typedef struct lr_fwd {
    double *h, *state;
} lr_fwd;

static void fwd_free(lr_fwd *f)
{
    free(f->h);
    free(f->state);
}

/* Forward of `c` on `dev` into poisoned outputs; h and state as f64. */
static void run_forward(fx_device *dev, const lr_case *c, const lr_host *x, lr_fwd *out)
{
    lr_dev d;
    dev_make(dev, c, x, &d);
    int64_t hdims[3] = {c->B, c->L, c->H}, sdims[2] = {c->B, c->H};
    fx_tensor h, s;
    fx_test_poisoned(dev, c->dtype, 3, hdims, &h);
    fx_test_poisoned(dev, state_type(c), 2, sdims, &s);
    fx_status st;
    fx_status_clear(&st);
    fx_op_linrec_forward_into(NULL, &d.p, c->max_tile, &h, &s, &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
    out->h = fx_test_read(&h);
    out->state = fx_test_read(&s);
    fx_tensor_release(&h);
    fx_tensor_release(&s);
    fx_linrec_tensors_release(&d.in);
}

typedef struct lr_bwd {
    double *seq[FX_LINREC_MAX_SEQ], *tau, *lam, *dt, *h0;
} lr_bwd;

static void bwd_free(lr_bwd *b)
{
    for (int k = 0; k < FX_LINREC_MAX_SEQ; k++)
        free(b->seq[k]);
    free(b->tau);
    free(b->lam);
    free(b->dt);
    free(b->h0);
}

static double *read_if(const fx_tensor *t) { return t->buffer ? fx_test_read(t) : NULL; }

/* Forward then backward of `c` on `dev`, the gradients into poisoned
 * tensors. `dh` has the sequence's size; `dstate` B*H values (used when
 * c->dstate). */
static void run_backward(fx_device *dev, const lr_case *c, const lr_host *x, const double *dh,
                         const double *dstate, lr_bwd *out)
{
    lr_dev d;
    dev_make(dev, c, x, &d);
    int64_t hdims[3] = {c->B, c->L, c->H}, sdims[2] = {c->B, c->H};
    fx_tensor h, tdh, tds = {0};
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_tensor_alloc(dev, c->dtype, 3, hdims, &h, &st), FX_OK);
    fx_op_linrec_forward_into(NULL, &d.p, c->max_tile, &h, NULL, &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
    fx_test_tensor(dev, c->dtype, 3, hdims, dh, &tdh);
    if (c->dstate)
        fx_test_tensor(dev, dstate_type(c), 2, sdims, dstate, &tds);
    fx_linrec_grads g;
    ck_assert_int_eq(fx_linrec_grads_alloc(&d.p, &g, &st), FX_OK);
    for (int k = 0; k < FX_LINREC_MAX_SEQ; k++)
        poison(&g.seq[k]);
    poison(&g.tau);
    poison(&g.lam);
    poison(&g.dt);
    poison(&g.h0);
    fx_linrec_grad_outs outs = fx_linrec_grad_outs_of(&g);
    fx_op_linrec_backward_into(NULL, &d.p, &h, &tdh, c->dstate ? &tds : NULL, c->max_tile, &outs, &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
    for (int k = 0; k < FX_LINREC_MAX_SEQ; k++)
        out->seq[k] = read_if(&g.seq[k]);
    out->tau = read_if(&g.tau);
    out->lam = read_if(&g.lam);
    out->dt = read_if(&g.dt);
    out->h0 = read_if(&g.h0);
    fx_linrec_tensors_release(&g);
    fx_tensor_release(&h);
    fx_tensor_release(&tdh);
    fx_tensor_release(&tds);
    fx_linrec_tensors_release(&d.in);
}

static void expect_close(const char *what, const lr_case *c, const double *got,
                         const double *want, int64_t n, double tol)
{
    double err = fx_rel_l2(got, want, n);
    ck_assert_msg(err <= tol, "%s of %s: rel-L2 %.3g > %.3g (FUSEX_SEED=%llu)", what, describe(c),
                  err, tol, (unsigned long long)fx_test_seed());
}

/* Two runs of the same sums in different orders agree to the last bits of
 * f32; stored as a 16-bit type, such a difference now and then moves a
 * value across a rounding boundary: one step of that type, no more. */
static void expect_same_rounded(const char *what, const lr_case *c, const double *got,
                                const double *want, int64_t n)
{
    if (c->dtype != FX_F16 && c->dtype != FX_BF16) {
        expect_close(what, c, got, want, n, 1e-6);
        return;
    }
    int mantissa = c->dtype == FX_F16 ? 10 : 7;
    double smallest = c->dtype == FX_F16 ? ldexp(1.0, -24) : 0.0;
    for (int64_t i = 0; i < n; i++) {
        int exp2;
        frexp(want[i], &exp2);
        double step = want[i] == 0 ? smallest : fmax(ldexp(1.0, exp2 - 1 - mantissa), smallest);
        ck_assert_msg(fabs(got[i] - want[i]) <= step, "%s of %s: element %lld is %.9g, %.9g wanted "
                      "(more than one rounding step; FUSEX_SEED=%llu)", what, describe(c), (long long)i,
                      got[i], want[i], (unsigned long long)fx_test_seed());
    }
}

static void expect_grads_close(const lr_case *c, const lr_bwd *got, const lr_bwd *want, double tol)
{
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++)
        expect_close(fx_linrec_seq_name(c->kind, k), c, got->seq[k], want->seq[k], seq_len(c), tol);
    if (c->kind == FX_LINREC_LIQUID) {
        expect_close("dtau", c, got->tau, want->tau, c->H, tol);
        expect_close("da", c, got->lam, want->lam, c->H, tol);
        if (c->dt_tensor)
            expect_close("ddt", c, got->dt, want->dt, c->B * c->L, tol);
    }
    if (c->h0)
        expect_close("dh0", c, got->h0, want->h0, c->B * c->H, tol);
}

/* ---- hand-computed cases ---- */

static fx_dtype exact_type(fx_device *dev) { return dev->kind == FX_DEVICE_CPU ? FX_F64 : FX_F32; }

typedef struct hand_case {
    const char *name;
    lr_case c;
    double seq[3][6], tau[2], lam[2], h0[2];
    double want_h[6], want_state[2];
} hand_case;

START_TEST(hand_computed_cases)
{
    fx_device *dev = fx_test_device();
    fx_dtype t = exact_type(dev);
    const double s2 = 0.11920292202211755; /* sigmoid(-2) */
    const hand_case cases[] = {
        /* h = [2,1] -> (a=[.5,2], b=[1,0]) [2,2] -> (a=[.5,-1], b=[1,1]) [2,-1] -> (a=[2,0], b=[0,3]) [4,3] */
        {"scan with h0", {FX_LINREC_SCAN, 1, 3, 2, t, 0, 0, 1, 0, 0, 0, 0},
         {{0.5, 2, 0.5, -1, 2, 0}, {1, 0, 1, 1, 0, 3}}, {0}, {0}, {2, 1},
         {2, 2, 2, -1, 4, 3}, {4, 3}},
        /* from the end: row 2 -> [0,3], row 1 -> [1,-2], row 0 -> [1.5,-4] */
        {"scan reversed", {FX_LINREC_SCAN, 1, 3, 2, t, 1, 0, 0, 0, 0, 0, 0},
         {{0.5, 2, 0.5, -1, 2, 0}, {1, 0, 1, 1, 0, 3}}, {0}, {0}, {0},
         {1.5, -4, 1, -2, 0, 3}, {1.5, -4}},
        /* z = 1/2: h = h/2 + c/2 over c = 2, -2, 4 */
        {"mingru", {FX_LINREC_MINGRU, 1, 3, 1, t, 0, 0, 0, 0, 0, 0, 0},
         {{0, 0, 0}, {2, -2, 4}}, {0}, {0}, {0}, {1, -0.5, 1.75}, {1.75}},
        /* g(2) = 2.5, g(-2) = sigmoid(-2), g(4) = 4.5 */
        {"mingru g", {FX_LINREC_MINGRU, 1, 3, 1, t, 0, 1, 0, 0, 0, 0, 0},
         {{0, 0, 0}, {2, -2, 4}}, {0}, {0}, {0},
         {1.25, 0.625 + s2 / 2, (0.625 + s2 / 2) / 2 + 2.25}, {(0.625 + s2 / 2) / 2 + 2.25}},
        /* sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4: f' = 3/4, i' = 1/4 */
        {"minlstm", {FX_LINREC_MINLSTM, 1, 2, 1, t, 0, 0, 0, 0, 0, 0, 0},
         {{log(3.0), log(3.0)}, {-log(3.0), -log(3.0)}, {4, 8}}, {0}, {0}, {0},
         {1, 2.75}, {2.75}},
        /* equal logits: f' = i' = 1/2 whatever their size */
        {"minlstm equal gates", {FX_LINREC_MINLSTM, 1, 2, 1, t, 0, 0, 1, 0, 0, 0, 0},
         {{-120, 30}, {-120, 30}, {2, 6}}, {0}, {0}, {1}, {1.5, 3.75}, {3.75}},
        /* f = 1/2, tau = 1, A = 2, dt = 1: den = 5/2, a = 2/5, b = 2/5 */
        {"liquid", {FX_LINREC_LIQUID, 1, 2, 1, t, 0, 0, 1, 0, 0, 1.0, 0},
         {{0, 0}}, {1}, {2}, {1}, {0.8, 0.72}, {0.72}},
        /* dt = 1/2: den = 7/4, a = 4/7, b = 2/7 */
        {"liquid dt 0.5", {FX_LINREC_LIQUID, 1, 2, 1, t, 0, 0, 1, 0, 0, 0.5, 0},
         {{0, 0}}, {1}, {2}, {1}, {6.0 / 7, 24.0 / 49 + 2.0 / 7}, {24.0 / 49 + 2.0 / 7}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hand_case *hc = &cases[i];
        lr_host x = {0};
        for (int k = 0; k < fx_linrec_nseq(hc->c.kind); k++)
            x.seq[k] = (double *)hc->seq[k];
        x.tau = (double *)hc->tau;
        x.lam = (double *)hc->lam;
        x.h0 = hc->c.h0 ? (double *)hc->h0 : NULL;
        lr_fwd f;
        run_forward(dev, &hc->c, &x, &f);
        double tol = t == FX_F64 ? 1e-14 : 1e-6;
        expect_close(hc->name, &hc->c, f.h, hc->want_h, seq_len(&hc->c), tol);
        expect_close(hc->name, &hc->c, f.state, hc->want_state, hc->c.B * hc->c.H, tol);
        fwd_free(&f);
    }
}
END_TEST

/* Liquid with dt as a tensor: dt = [1, 1/2] over two steps gives the two
 * hand cases above chained. */
START_TEST(hand_computed_liquid_dt_tensor)
{
    fx_device *dev = fx_test_device();
    lr_case c = {FX_LINREC_LIQUID, 1, 2, 1, exact_type(dev), 0, 0, 1, 0, 1, 0, 0};
    double f[2] = {0, 0}, tau[1] = {1}, lam[1] = {2}, h0[1] = {1}, dt[2] = {1, 0.5};
    lr_host x = {{f}, tau, lam, dt, h0};
    lr_fwd out;
    run_forward(dev, &c, &x, &out);
    double want[2] = {0.8, 0.8 * 4.0 / 7 + 2.0 / 7};
    expect_close("h", &c, out.h, want, 2, c.dtype == FX_F64 ? 1e-14 : 1e-6);
    fwd_free(&out);
}
END_TEST

/* ---- gradients vs central differences (CPU, f64) ---- */

/* The loss sum(wh .* H) + sum(ws .* state), computed from a forward. */
static double loss_of(fx_device *cpu, const lr_case *c, const lr_host *x, const double *wh,
                      const double *ws)
{
    lr_fwd f;
    run_forward(cpu, c, x, &f);
    double loss = 0;
    for (int64_t i = 0; i < seq_len(c); i++)
        loss += wh[i] * f.h[i];
    if (ws)
        for (int64_t i = 0; i < c->B * c->H; i++)
            loss += ws[i] * f.state[i];
    fwd_free(&f);
    return loss;
}

static void fd_check(fx_device *cpu, const lr_case *c, lr_host *x, double *values, int64_t n,
                     const double *analytic, const double *wh, const double *ws, const char *what)
{
    const double eps = 1e-5;
    double *numeric = alloc_values(n);
    for (int64_t i = 0; i < n; i++) {
        double keep = values[i];
        values[i] = keep + eps;
        double up = loss_of(cpu, c, x, wh, ws);
        values[i] = keep - eps;
        double down = loss_of(cpu, c, x, wh, ws);
        values[i] = keep;
        numeric[i] = (up - down) / (2 * eps);
    }
    double err = fx_rel_l2(analytic, numeric, n);
    ck_assert_msg(err <= 1e-6, "d%s of %s: rel-L2 %.3g against finite differences (FUSEX_SEED=%llu)",
                  what, describe(c), err, (unsigned long long)fx_test_seed());
    free(numeric);
}

static void gradient_case(const lr_case *c)
{
    fx_device *cpu = fx_test_oracle();
    lr_host x;
    host_random(c, &x);
    int64_t n = seq_len(c), nb = c->B * c->H;
    double *wh = alloc_values(n), *ws = alloc_values(nb);
    fx_fill_uniform(wh, n, -1, 1);
    fx_fill_uniform(ws, nb, -1, 1);
    lr_bwd g;
    run_backward(cpu, c, &x, wh, ws, &g);
    const double *state_w = c->dstate ? ws : NULL;
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++)
        fd_check(cpu, c, &x, x.seq[k], n, g.seq[k], wh, state_w, fx_linrec_seq_name(c->kind, k));
    if (c->kind == FX_LINREC_LIQUID) {
        fd_check(cpu, c, &x, x.tau, c->H, g.tau, wh, state_w, "tau");
        fd_check(cpu, c, &x, x.lam, c->H, g.lam, wh, state_w, "a");
        if (c->dt_tensor)
            fd_check(cpu, c, &x, x.dt, c->B * c->L, g.dt, wh, state_w, "dt");
    }
    if (c->h0)
        fd_check(cpu, c, &x, x.h0, nb, g.h0, wh, state_w, "h0");
    bwd_free(&g);
    free(wh);
    free(ws);
    host_free(&x);
}

START_TEST(gradients_match_finite_differences)
{
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
        for (int variant = 0; variant < 4; variant++) {
            lr_case c = {kind, 2, 5, 3, FX_F64, variant & 1, 0, 0, 0, 0, 0.7, 0};
            int extra = variant >> 1; /* candidate g, or dt as a tensor */
            c.cand_g = extra && (kind == FX_LINREC_MINGRU || kind == FX_LINREC_MINLSTM);
            c.dt_tensor = extra && kind == FX_LINREC_LIQUID;
            c.h0 = variant == 1 || variant == 2 ? 1 : 0;
            c.dstate = variant >= 2 ? 2 : 0;
            gradient_case(&c);
        }
}
END_TEST

/* ---- identities on the device under test ---- */

static void flip_time(const lr_case *c, const double *in, double *out, int64_t width)
{
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->L; t++)
            memcpy(out + (b * c->L + (c->L - 1 - t)) * width, in + (b * c->L + t) * width,
                   sizeof(double) * (size_t)width);
}

static void flip_inputs(const lr_case *c, const lr_host *x, lr_host *flipped)
{
    *flipped = *x;
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++) {
        flipped->seq[k] = alloc_values(seq_len(c));
        flip_time(c, x->seq[k], flipped->seq[k], c->H);
    }
    if (x->dt) {
        flipped->dt = alloc_values(c->B * c->L);
        flip_time(c, x->dt, flipped->dt, 1);
    }
}

static void free_flipped(const lr_case *c, lr_host *flipped)
{
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++)
        free(flipped->seq[k]);
    free(flipped->dt);
}

static lr_case identity_case(int kind, int i, fx_device *dev)
{
    static const fx_dtype gpu_types[] = {FX_F32, FX_BF16, FX_F16};
    fx_dtype t = dev->kind == FX_DEVICE_CPU ? (i % 2 ? FX_F32 : FX_F64) : gpu_types[i % 3];
    lr_case c = {kind, 1 + i % 3, 9 + 13 * i, 5 + 19 * i, t, 0, i % 2, 1 + i % 2, 2, i % 2,
                 0.4, 0};
    if (dev->kind != FX_DEVICE_CPU)
        c.max_tile = (int[]){0, 1, 6, 40}[i % 4];
    return c;
}

START_TEST(reverse_is_the_scan_of_the_flipped_input)
{
    fx_device *dev = fx_test_device();
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
        for (int i = 0; i < 4; i++) {
            lr_case c = identity_case(kind, i, dev), fc;
            lr_host x, fx_in;
            host_random(&c, &x);
            flip_inputs(&c, &x, &fx_in);
            c.reverse = 1;
            fc = c;
            fc.reverse = 0;
            lr_fwd r, f;
            run_forward(dev, &c, &x, &r);
            run_forward(dev, &fc, &fx_in, &f);
            double *back = alloc_values(seq_len(&c));
            flip_time(&c, f.h, back, c.H);
            expect_same_rounded("h", &c, r.h, back, seq_len(&c));
            expect_close("state", &c, r.state, f.state, c.B * c.H, 1e-6);

            /* backward: the gradients of the flipped run, flipped back */
            double *dh = alloc_values(seq_len(&c)), *fdh = alloc_values(seq_len(&c));
            double *ds = alloc_values(c.B * c.H);
            fx_fill_uniform(dh, seq_len(&c), -1, 1);
            fx_fill_uniform(ds, c.B * c.H, -1, 1);
            flip_time(&c, dh, fdh, c.H);
            lr_bwd gr, gf;
            run_backward(dev, &c, &x, dh, ds, &gr);
            run_backward(dev, &fc, &fx_in, fdh, ds, &gf);
            for (int k = 0; k < fx_linrec_nseq(kind); k++) {
                flip_time(&c, gf.seq[k], back, c.H);
                memcpy(gf.seq[k], back, sizeof(double) * (size_t)seq_len(&c));
            }
            if (gf.dt) {
                flip_time(&c, gf.dt, back, 1);
                memcpy(gf.dt, back, sizeof(double) * (size_t)(c.B * c.L));
            }
            /* tau and a are sums over time: the order changes, so do the last bits
             * (and with them, for 16-bit gradients, a rounding step now and then) */
            expect_grads_close(&c, &gr, &gf, c.dtype == FX_F64 ? 1e-12 : c.dtype == FX_F32 ? 1e-5 : tolerance(c.dtype));
            bwd_free(&gr);
            bwd_free(&gf);
            free(dh);
            free(fdh);
            free(ds);
            free(back);
            fwd_free(&r);
            fwd_free(&f);
            free_flipped(&c, &fx_in);
            host_free(&x);
        }
}
END_TEST

/* The rows [from, from + len) of a [B, L, width] array. */
static double *time_slice(const lr_case *c, const double *v, int64_t from, int64_t len, int64_t width)
{
    double *out = alloc_values(c->B * len * width);
    for (int64_t b = 0; b < c->B; b++)
        memcpy(out + b * len * width, v + (b * c->L + from) * width, sizeof(double) * (size_t)(len * width));
    return out;
}

static void slice_inputs(const lr_case *c, const lr_host *x, int64_t from, int64_t len, lr_host *part)
{
    *part = *x;
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++)
        part->seq[k] = time_slice(c, x->seq[k], from, len, c->H);
    part->dt = x->dt ? time_slice(c, x->dt, from, len, 1) : NULL;
}

static void free_slice(const lr_case *c, lr_host *part)
{
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++)
        free(part->seq[k]);
    free(part->dt);
}

/* Runs the sequence in two calls, the second starting from the first's
 * state (for reverse, the first call takes the later rows), and the
 * backward the same way with dh0 of the second call as dstate of the
 * first; both must equal one call. */
START_TEST(split_with_carried_state_is_one_call)
{
    fx_device *dev = fx_test_device();
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
        for (int i = 0; i < 4; i++) {
            lr_case c = identity_case(kind, i, dev);
            c.reverse = i >= 2;
            c.h0 = 1 + i % 2;
            c.dstate = 2;
            c.L = c.L < 2 ? 2 : c.L;
            lr_host x;
            host_random(&c, &x);
            int64_t cut = c.L / 3 + 1, rest = c.L - cut;
            /* scan order: the first call covers `first` rows */
            int64_t first_from = c.reverse ? rest : 0, first_len = c.reverse ? cut : cut;
            int64_t second_from = c.reverse ? 0 : cut, second_len = rest;
            lr_case c1 = c, c2 = c;
            c1.L = first_len;
            c2.L = second_len;
            c2.h0 = 2; /* the carried state has the state dtype */
            lr_host x1, x2;
            slice_inputs(&c, &x, first_from, first_len, &x1);
            slice_inputs(&c, &x, second_from, second_len, &x2);
            lr_fwd whole, f1, f2;
            run_forward(dev, &c, &x, &whole);
            run_forward(dev, &c1, &x1, &f1);
            x2.h0 = f1.state;
            run_forward(dev, &c2, &x2, &f2);
            double *joined = alloc_values(seq_len(&c));
            for (int64_t b = 0; b < c.B; b++) {
                memcpy(joined + (b * c.L + first_from) * c.H, f1.h + b * first_len * c.H,
                       sizeof(double) * (size_t)(first_len * c.H));
                memcpy(joined + (b * c.L + second_from) * c.H, f2.h + b * second_len * c.H,
                       sizeof(double) * (size_t)(second_len * c.H));
            }
            double tol = tolerance(c.dtype);
            expect_close("h", &c, joined, whole.h, seq_len(&c), tol);
            expect_close("state", &c, f2.state, whole.state, c.B * c.H, tol);

            /* backward in two calls */
            double *dh = alloc_values(seq_len(&c)), *ds = alloc_values(c.B * c.H);
            fx_fill_uniform(dh, seq_len(&c), -1, 1);
            fx_fill_uniform(ds, c.B * c.H, -1, 1);
            double *dh1 = time_slice(&c, dh, first_from, first_len, c.H);
            double *dh2 = time_slice(&c, dh, second_from, second_len, c.H);
            lr_bwd gw, g1, g2;
            run_backward(dev, &c, &x, dh, ds, &gw);
            run_backward(dev, &c2, &x2, dh2, ds, &g2);
            run_backward(dev, &c1, &x1, dh1, g2.h0, &g1); /* g2.h0 has the state dtype */
            expect_close("dh0", &c, g1.h0, gw.h0, c.B * c.H, tol);
            for (int k = 0; k < fx_linrec_nseq(kind); k++) {
                double *part = time_slice(&c, gw.seq[k], first_from, first_len, c.H);
                expect_close("first part's dseq", &c1, g1.seq[k], part, c.B * first_len * c.H, tol);
                free(part);
                part = time_slice(&c, gw.seq[k], second_from, second_len, c.H);
                expect_close("second part's dseq", &c2, g2.seq[k], part, c.B * second_len * c.H, tol);
                free(part);
            }
            if (kind == FX_LINREC_LIQUID) {
                double sum_tau[512], sum_lam[512];
                ck_assert_int_le(c.H, 512);
                for (int64_t h = 0; h < c.H; h++) {
                    sum_tau[h] = g1.tau[h] + g2.tau[h];
                    sum_lam[h] = g1.lam[h] + g2.lam[h];
                }
                expect_close("dtau", &c, sum_tau, gw.tau, c.H, tol);
                expect_close("da", &c, sum_lam, gw.lam, c.H, tol);
            }
            bwd_free(&gw);
            bwd_free(&g1);
            bwd_free(&g2);
            free(dh);
            free(ds);
            free(dh1);
            free(dh2);
            free(joined);
            fwd_free(&whole);
            fwd_free(&f1);
            fwd_free(&f2);
            free_slice(&c, &x1);
            free_slice(&c, &x2);
            host_free(&x);
        }
}
END_TEST

/* One step per frame, the state updated in place, equals one call. */
static void steps_case(fx_device *dev, const lr_case *c, fx_dtype state_dtype)
{
    lr_host x;
    host_random(c, &x);
    lr_fwd whole;
    run_forward(dev, c, &x, &whole);
    int64_t bdims[2] = {c->B, c->H}, dtdims[2] = {c->B, 1}, hdims[1] = {c->H};
    fx_tensor state, tau = {0}, lam = {0};
    double *zeros = alloc_values(c->B * c->H);
    fx_test_tensor(dev, state_dtype, 2, bdims, c->h0 ? x.h0 : zeros, &state);
    if (c->kind == FX_LINREC_LIQUID) {
        fx_test_tensor(dev, c->dtype, 1, hdims, x.tau, &tau);
        fx_test_tensor(dev, c->dtype, 1, hdims, x.lam, &lam);
    }
    double *stepped = alloc_values(seq_len(c));
    for (int64_t t = 0; t < c->L; t++) {
        fx_linrec_inputs p = {.kind = c->kind, .candidate_g = c->cand_g, .dt_value = c->dt_value};
        fx_tensor frame[FX_LINREC_MAX_SEQ] = {{0}}, dt = {0}, h;
        for (int k = 0; k < fx_linrec_nseq(c->kind); k++) {
            double *v = time_slice(c, x.seq[k], t, 1, c->H);
            fx_test_tensor(dev, c->dtype, 2, bdims, v, &frame[k]);
            p.seq[k] = &frame[k];
            free(v);
        }
        if (c->kind == FX_LINREC_LIQUID) {
            p.tau = &tau;
            p.lam = &lam;
            if (c->dt_tensor) {
                double *v = time_slice(c, x.dt, t, 1, 1);
                fx_test_tensor(dev, c->dtype, 2, dtdims, v, &dt);
                p.dt = &dt;
                free(v);
            }
        }
        fx_status st;
        fx_status_clear(&st);
        fx_op_linrec_step(&p, &state, &h, &st);
        ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
        double *got = fx_test_read(&h);
        for (int64_t b = 0; b < c->B; b++)
            memcpy(stepped + (b * c->L + t) * c->H, got + b * c->H, sizeof(double) * (size_t)c->H);
        free(got);
        fx_tensor_release(&h);
        fx_tensor_release(&dt);
        for (int k = 0; k < FX_LINREC_MAX_SEQ; k++)
            fx_tensor_release(&frame[k]);
    }
    double tol = state_dtype == c->dtype && c->dtype != FX_F32 && c->dtype != FX_F64
                     ? 3e-2 /* a 16-bit state rounds at every step */
                     : tolerance(c->dtype);
    expect_close("stepped h", c, stepped, whole.h, seq_len(c), tol);
    double *final = fx_test_read(&state);
    expect_close("stepped state", c, final, whole.state, c->B * c->H, tol);
    free(final);
    free(stepped);
    free(zeros);
    fwd_free(&whole);
    fx_tensor_release(&state);
    fx_tensor_release(&tau);
    fx_tensor_release(&lam);
    host_free(&x);
}

START_TEST(steps_are_one_call)
{
    fx_device *dev = fx_test_device();
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
        for (int i = 0; i < 4; i++) {
            lr_case c = identity_case(kind, i, dev);
            c.L = 1 + i * 3;
            c.reverse = 0;
            steps_case(dev, &c, state_type(&c));
            if (i == 1) { /* a state of the sequence dtype, short */
                c.L = 3;
                steps_case(dev, &c, c.dtype);
            }
        }
}
END_TEST

/* ---- CUDA against the CPU ---- */

typedef struct shape3 {
    int64_t B, L, H;
} shape3;

/* Awkward shapes: 1, odd, primes, not multiples of 32, long. */
static const shape3 sweep_shapes[] = {
    {1, 1, 1},   {1, 2, 33},   {2, 5, 7},     {3, 17, 31},   {1, 31, 64},  {2, 64, 65},
    {1, 97, 2},  {4, 127, 100}, {1, 257, 96}, {2, 300, 129}, {1, 1000, 32}, {1, 1031, 1},
    {5, 33, 1027}, {1, 4097, 3}, {2, 2049, 64}, {1, 4097, 67},
};

/* ---- the f32 rounding floor ---- */

/* Every output of a case's forward and backward, with its length. */
#define LR_OUTPUTS (2 + FX_LINREC_MAX_SEQ + 4)

typedef struct lr_outputs {
    const char *name[LR_OUTPUTS];
    const double *values[LR_OUTPUTS];
    int64_t n[LR_OUTPUTS];
    int count;
} lr_outputs;

static void outputs_add(lr_outputs *o, const char *name, const double *values, int64_t n)
{
    o->name[o->count] = name;
    o->values[o->count] = values;
    o->n[o->count] = n;
    o->count++;
}

static lr_outputs outputs_of(const lr_case *c, const lr_fwd *f, const lr_bwd *g)
{
    lr_outputs o = {0};
    outputs_add(&o, "h", f->h, seq_len(c));
    outputs_add(&o, "state", f->state, c->B * c->H);
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++)
        outputs_add(&o, fx_linrec_seq_name(c->kind, k), g->seq[k], seq_len(c));
    if (c->kind == FX_LINREC_LIQUID) {
        outputs_add(&o, "dtau", g->tau, c->H);
        outputs_add(&o, "da", g->lam, c->H);
        if (c->dt_tensor)
            outputs_add(&o, "ddt", g->dt, c->B * c->L);
    }
    if (c->h0)
        outputs_add(&o, "dh0", g->h0, c->B * c->H);
    return o;
}

/* One f32 ulp up or down, at random. */
static void nudge(double *v, int64_t n)
{
    for (int64_t i = 0; v && i < n; i++)
        v[i] = nextafterf((float)v[i], fx_rand_uniform(0, 1) < 0.5 ? -INFINITY : INFINITY);
}

static double *nudged_copy(const double *v, int64_t n)
{
    if (!v)
        return NULL;
    double *out = alloc_values(n);
    memcpy(out, v, sizeof(double) * (size_t)(n > 0 ? n : 1));
    nudge(out, n);
    return out;
}

static int is_logits(int kind, int k)
{
    return (kind == FX_LINREC_MINGRU && k == 0) || (kind == FX_LINREC_MINLSTM && k < 2) ||
           (kind == FX_LINREC_LIQUID && k == 0);
}

/* A logit also moves (away from 0) by what moves its sigmoid by one f32 ulp
 * of 1: the kernels form sigmoid(-x) as 1 - sigmoid(x), as torch's sigmoid
 * backward does, exact to that ulp (capped at 32: sigmoid is 1 in f32 by
 * then). */
static void nudge_sigmoid(double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double s = 1 / (1 + exp(-v[i]));
        v[i] = (float)(v[i] + copysign(fmin(ldexp(1.0, -24) / (s * (1 - s)), 32.0), v[i]));
    }
}

/* A few-element output can be a near-cancellation (h = a h0 + b with
 * a h0 ~ -b; an adjoint dh + dstate ~ 0), or a logit's gradient at a large
 * logit, whose relative error in f32 is large. `floor` gets, for each
 * output, the largest move of the CPU's result under three draws of
 * one-ulp nudges to every input (and of its sigmoid to every logit): what
 * an f32 implementation may be off by (docs/TESTING.md). */
static void rounding_floor(const lr_case *c, const lr_host *x, const double *dh, const double *ds,
                           const lr_outputs *want, double *floor)
{
    fx_device *cpu = fx_test_oracle();
    for (int i = 0; i < want->count; i++)
        floor[i] = 0;
    for (int draw = 0; draw < 3; draw++) {
        lr_host xn;
        for (int k = 0; k < FX_LINREC_MAX_SEQ; k++) {
            xn.seq[k] = nudged_copy(x->seq[k], seq_len(c));
            if (xn.seq[k] && is_logits(c->kind, k))
                nudge_sigmoid(xn.seq[k], seq_len(c));
        }
        xn.tau = nudged_copy(x->tau, c->H);
        xn.lam = nudged_copy(x->lam, c->H);
        xn.dt = nudged_copy(x->dt, c->B * c->L);
        xn.h0 = nudged_copy(x->h0, c->B * c->H);
        double *dhn = nudged_copy(dh, seq_len(c)), *dsn = nudged_copy(ds, c->B * c->H);
        lr_fwd f;
        lr_bwd g;
        run_forward(cpu, c, &xn, &f);
        run_backward(cpu, c, &xn, dhn, dsn, &g);
        lr_outputs moved = outputs_of(c, &f, &g);
        for (int i = 0; i < want->count; i++) {
            double move = fx_l2_diff(moved.values[i], want->values[i], want->n[i]);
            ck_assert_msg(isfinite(move), "%s of %s: the reference on nudged inputs is not finite",
                          want->name[i], describe(c)); /* a floor of inf would pass anything */
            floor[i] = fmax(floor[i], move);
        }
        fwd_free(&f);
        bwd_free(&g);
        host_free(&xn);
        free(dhn);
        free(dsn);
    }
}

/* rel-L2 within tol, past a rounding floor where f32 has one. */
static void expect_outputs_close(const lr_case *c, const lr_outputs *got, const lr_outputs *want,
                                 const double *floor, double tol)
{
    for (int i = 0; i < want->count; i++) {
        double err = fx_l2_diff(got->values[i], want->values[i], want->n[i]);
        double norm = fx_l2(want->values[i], want->n[i]);
        ck_assert_msg(err <= tol * norm + 8 * floor[i],
                      "%s of %s: rel-L2 %.3g > %.3g, rounding floor %.3g (FUSEX_SEED=%llu)",
                      want->name[i], describe(c), err / norm, tol, floor[i] / norm,
                      (unsigned long long)fx_test_seed());
    }
}

static void compare_with_cpu(fx_device *dev, const lr_case *c)
{
    fx_device *cpu = fx_test_oracle();
    lr_host x;
    host_random(c, &x);
    lr_fwd got, want;
    run_forward(dev, c, &x, &got);
    run_forward(cpu, c, &x, &want);
    double *dh = alloc_values(seq_len(c)), *ds = alloc_values(c->B * c->H);
    fx_fill_uniform(dh, seq_len(c), -1, 1);
    fx_fill_uniform(ds, c->B * c->H, -1, 1);
    lr_bwd gg, gw;
    run_backward(dev, c, &x, dh, ds, &gg);
    run_backward(cpu, c, &x, dh, ds, &gw);
    lr_outputs out_got = outputs_of(c, &got, &gg), out_want = outputs_of(c, &want, &gw);
    double floor[LR_OUTPUTS] = {0};
    if (c->dtype == FX_F32) /* 16-bit tolerances are far above any such floor */
        rounding_floor(c, &x, dh, c->dstate ? ds : NULL, &out_want, floor);
    expect_outputs_close(c, &out_got, &out_want, floor, tolerance(c->dtype));
    bwd_free(&gg);
    bwd_free(&gw);
    free(dh);
    free(ds);
    fwd_free(&got);
    fwd_free(&want);
    host_free(&x);
}

START_TEST(cuda_matches_cpu)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return; /* the CPU is the reference: nothing to compare */
    static const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    static const int tiles[] = {0, 1, 5, 48, FX_LINREC_TILES_STREAM};
    int nshapes = (int)(sizeof sweep_shapes / sizeof sweep_shapes[0]);
    int quick = fx_test_quick();
    int runs = 0;
    for (int s = 0; s < nshapes; s++) {
        if (quick && s % 4 != 1)
            continue;
        for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
            for (int k = 0; k < (quick ? 2 : 4); k++) {
                /* quick: two of the four variants, turning with the shape,
                 * so that candidate g and the dt tensor run too */
                int v = quick ? (s / 4 + k) % 4 : k;
                int mix = s + kind + v;
                lr_case c = {kind, sweep_shapes[s].B, sweep_shapes[s].L, sweep_shapes[s].H,
                             types[mix % 3], v & 1, (v >> 1) & 1, mix % 3, (mix + 1) % 3,
                             (v >> 1) & 1, 0.3, tiles[(s + v) % 5]};
                if (quick && c.L > 300)
                    c.L = 300;
                /* on the CPU emulator (test/emu) every shape, its sequence
                 * cut to at most 2^15 elements */
                if (fx_test_emulated() && c.B * c.L * c.H > (1 << 15))
                    c.L = (1 << 15) / (c.B * c.H) > 1 ? (1 << 15) / (c.B * c.H) : 1;
                compare_with_cpu(dev, &c);
                runs++;
            }
    }
    ck_assert_int_gt(runs, 0);
}
END_TEST

/* Small shapes through every path of the CUDA kernels, against the CPU:
 * time tiles forced down to 1 to 40 steps (the look-back across many
 * tiles, on short sequences) and the backend's own tiling without the
 * streaming kernels (FX_LINREC_TILES_NO_STREAM), over the scalar and the
 * two vector layouts (hidden odd, a multiple of 4: 8 lanes a row for f32,
 * 16 for the 16-bit types), with reverse, candidate g, h0 and dstate of
 * either type and Liquid's dt tensor turning through every dtype; then the
 * streaming kernels (FX_LINREC_TILES_STREAM), every op in f32 and in a
 * 16-bit type, forward and reversed. Cheap enough for the sanitizer and
 * for the CPU emulator of the kernels (test/emu), which runs it with its
 * blocks interleaved at random. */
START_TEST(cuda_matches_cpu_small_tilings)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return;
    static const shape3 shapes[] = {{1, 1, 1},   {1, 2, 36},   {2, 5, 7},    {3, 17, 28},
                                    {1, 31, 64}, {2, 64, 66},  {1, 97, 4},   {1, 130, 40},
                                    {2, 300, 3}, {1, 520, 36}, {2, 45, 136}, {1, 7, 72}};
    /* hidden a multiple of 8: every dtype can stream */
    static const shape3 streamed[] = {{1, 31, 64}, {1, 130, 40}, {2, 45, 136}, {3, 66, 8}};
    static const int tiles[] = {0, 1, 2, 3, 5, 17, 40, FX_LINREC_TILES_NO_STREAM};
    static const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]), ntiles = (int)(sizeof tiles / sizeof tiles[0]);
    const int quick = fx_test_quick();
    for (int i = 0; i < (quick ? 20 : 64); i++) {
        const shape3 *s = &shapes[(i / 4 + i) % nshapes];
        lr_case c = {i % FX_LINREC_KIND_COUNT, s->B, s->L, s->H, types[(i / 3) % 3], (i / 2) % 2, (i / 3) % 2,
                     (i / 5) % 3, (i / 7 + 1) % 3, (i / 6) % 2, 0.3, tiles[(i / 4 + 3 * i) % ntiles]};
        compare_with_cpu(dev, &c);
    }
    for (int j = 0; j < (quick ? 4 : 8); j++) {
        const shape3 *s = &streamed[j % 4];
        lr_case c = {j % FX_LINREC_KIND_COUNT, s->B, s->L, s->H, types[(j / 2) % 3], (j + j / 4) % 2, j / 4,
                     j % 3, (j + 1) % 3, j / 4, 0.3, FX_LINREC_TILES_STREAM};
        compare_with_cpu(dev, &c);
    }
}
END_TEST

/* Large enough that the backend's own tiling uses several time tiles and
 * many channel tiles, as in the benchmarks but smaller. Launches of 2^20
 * elements or more take the large-launch kernels (MinGRU f32: the staged
 * forward): the first shape chains its tiles, the last fits one time tile
 * (5 steps a thread, 8 warps: 40 KB staged, which with the scan's own
 * shared memory is past the 48 KB a block gets without opting in). The one
 * before it has columns of channels enough for the f32 streaming forward on
 * a GPU of up to 146 SMs (16 x 32 warps, the last column partly past
 * hidden; its last stage short). The quick (sanitizer) run keeps these
 * three, the first at its smallest large size; the CPU emulator of the
 * kernels (test/emu) too, with two ops each: MinGRU (staged) and Liquid
 * on the first and the last, the scan and MinLSTM streaming the middle. */
START_TEST(cuda_matches_cpu_auto_tiling)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return;
    const shape3 shapes[] = {{2, 3000, 256}, {1, 20000, 32}, {8, 600, 520}, {16, 70, 1000}, {56, 150, 128}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    const int emulated = fx_test_emulated(), few = fx_test_quick() || emulated;
    for (int s = 0; s < nshapes; s++) {
        if (few && s != 0 && s < nshapes - 2)
            continue;
        for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++) {
            /* the emulator: two ops a shape, the staged MinGRU among them */
            if (emulated && (kind + s) % 2 == 0)
                continue;
            lr_case c = {kind, shapes[s].B, shapes[s].L, shapes[s].H, s == 1 ? FX_BF16 : FX_F32,
                         s == 2, kind % 2, 1, 2, kind == FX_LINREC_LIQUID, 0.2, 0};
            if (s == nshapes - 1 && kind >= FX_LINREC_MINLSTM)
                c.dtype = FX_BF16;
            if (few && s == 0)
                c.L = 2048; /* 2^20 elements */
            /* the emulator's 4 SMs would stream the first and the last
             * shape: the tiled kernels as on a GPU (MinGRU staged, chained
             * and in one time tile) */
            if (emulated && (s == 0 || s == nshapes - 1))
                c.max_tile = FX_LINREC_TILES_NO_STREAM;
            compare_with_cpu(dev, &c);
        }
    }
}
END_TEST

/* ---- validation ---- */

/* The validation test's tensors live here, not on its stack: an assertion
 * that fails ends the test early (a longjmp in no-fork mode), and the
 * checked teardown still releases them, so a failure leaks nothing on the
 * device either. Releasing twice is harmless. */
static struct {
    fx_tensor x, y, wrong_shape, ints, f16, r2, r2b, r1, r1b, t3, t2, st32, f16_2, bf16_2;
    fx_tensor h, fs, host, host64, gpu64, out1, out2;
    fx_linrec_grads g;
} vm;

static void release_validation_tensors(void)
{
    fx_tensor *all[] = {&vm.x,     &vm.y,      &vm.wrong_shape, &vm.ints, &vm.f16,  &vm.r2,
                        &vm.r2b,   &vm.r1,     &vm.r1b,         &vm.t3,   &vm.t2,   &vm.st32,
                        &vm.f16_2, &vm.bf16_2, &vm.h,           &vm.fs,   &vm.host, &vm.host64,
                        &vm.gpu64, &vm.out1,   &vm.out2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    fx_linrec_tensors_release(&vm.g);
}

/* `call` must fail with `text`; whatever it allocated if it did not is
 * released before the assertion. */
#define EXPECT_BADARG(call, text)                                                   \
    do {                                                                            \
        fx_status st_;                                                              \
        fx_status_clear(&st_);                                                      \
        int rc_ = (call);                                                           \
        fx_tensor_release(&vm.out1);                                                \
        fx_tensor_release(&vm.out2);                                                \
        fx_linrec_tensors_release(&vm.g);                                             \
        ck_assert_msg(rc_ == FX_EBADARG, "expected a badarg for: %s", text);        \
        ck_assert_str_eq(st_.msg, text);                                            \
    } while (0)

/* The allocating ops with h0 given beside the inputs, as the validation
 * cases below write them. */
static int forward_h0(fx_linrec_inputs *in, const fx_tensor *h0, bool want_state, int tiles, fx_tensor *h,
                      fx_tensor *state, fx_status *st)
{
    in->h0 = h0;
    return fx_op_linrec_forward(in, want_state, tiles, h, state, st);
}

static int backward_h0(fx_linrec_inputs *in, const fx_tensor *h0, const fx_tensor *h, const fx_tensor *dh,
                       const fx_tensor *dstate, int tiles, fx_linrec_grads *g, fx_status *st)
{
    in->h0 = h0;
    return fx_op_linrec_backward(in, h, dh, dstate, tiles, g, st);
}

static int backward_into_h0(const fx_exec *ex, fx_linrec_inputs *in, const fx_tensor *h0, const fx_tensor *h,
                            const fx_tensor *dh, const fx_tensor *dstate, int tiles, const fx_linrec_grad_outs *g,
                            fx_status *st)
{
    in->h0 = h0;
    return fx_op_linrec_backward_into(ex, in, h, dh, dstate, tiles, g, st);
}

START_TEST(validation_messages)
{
    fx_device *dev = fx_test_device();
    double v[256] = {0};
    for (int i = 0; i < 256; i++)
        v[i] = 0.25;
    int64_t d3[3] = {2, 3, 4}, d3b[3] = {2, 3, 5}, d2[2] = {2, 4}, d2b[2] = {2, 5}, d1[1] = {4},
            d1b[1] = {5}, dt3[3] = {2, 3, 1}, dt2[2] = {2, 1};
    fx_tensor *x = &vm.x, *y = &vm.y, *wrong_shape = &vm.wrong_shape, *ints = &vm.ints, *f16 = &vm.f16,
              *r2 = &vm.r2, *r2b = &vm.r2b, *r1 = &vm.r1, *r1b = &vm.r1b, *t3 = &vm.t3, *t2 = &vm.t2,
              *st32 = &vm.st32, *o1 = &vm.out1, *o2 = &vm.out2;
    fx_test_tensor(dev, FX_F32, 3, d3, v, x);
    fx_test_tensor(dev, FX_F32, 3, d3, v, y);
    fx_test_tensor(dev, FX_F32, 3, d3b, v, wrong_shape);
    fx_test_tensor(dev, FX_S32, 3, d3, v, ints);
    fx_test_tensor(dev, FX_F16, 3, d3, v, f16);
    fx_test_tensor(dev, FX_F32, 2, d2, v, r2);
    fx_test_tensor(dev, FX_F32, 2, d2b, v, r2b);
    fx_test_tensor(dev, FX_F32, 1, d1, v, r1);
    fx_test_tensor(dev, FX_F32, 1, d1b, v, r1b);
    fx_test_tensor(dev, FX_F32, 3, dt3, v, t3);
    fx_test_tensor(dev, FX_F32, 2, dt2, v, t2);
    fx_test_tensor(dev, FX_F16, 2, d2, v, st32); /* an f16 state for f32 inputs */

    fx_linrec_inputs p;
#define SCAN(a, b) (p = (fx_linrec_inputs){.kind = FX_LINREC_SCAN, .seq = {(a), (b)}}, &p)
#define GRU(z, c) (p = (fx_linrec_inputs){.kind = FX_LINREC_MINGRU, .seq = {(z), (c)}}, &p)
#define LSTM(f, i, c) (p = (fx_linrec_inputs){.kind = FX_LINREC_MINLSTM, .seq = {(f), (i), (c)}}, &p)
#define LIQ(F, TAU, A, DT) \
    (p = (fx_linrec_inputs){.kind = FX_LINREC_LIQUID, .seq = {(F)}, .tau = (TAU), .lam = (A), .dt = (DT), .dt_value = 1}, &p)

    /* {f,64} runs on the cpu only, and the message lists what the device takes */
    EXPECT_BADARG(forward_h0(SCAN(ints, y), NULL, false, 0, o1, o2, &st_),
                  dev->kind == FX_DEVICE_CPU
                      ? "a: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                      : "a: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    EXPECT_BADARG(forward_h0(SCAN(r2, y), NULL, false, 0, o1, o2, &st_),
                  "a: expected rank 3 [batch, seqlen, hidden], got rank 2 shape {2,4}");
    EXPECT_BADARG(forward_h0(SCAN(x, wrong_shape), NULL, false, 0, o1, o2, &st_),
                  "b: expected shape {2,3,4} ([batch, seqlen, hidden], as a), got {2,3,5}");
    EXPECT_BADARG(forward_h0(GRU(x, f16), NULL, false, 0, o1, o2, &st_),
                  "cand: expected type {f,32}, got {f,16}");
    EXPECT_BADARG(forward_h0(LSTM(x, y, r2), NULL, false, 0, o1, o2, &st_),
                  "cand: expected shape {2,3,4} ([batch, seqlen, hidden], as f_logits), got {2,4}");
    EXPECT_BADARG(forward_h0(GRU(x, y), r2b, false, 0, o1, o2, &st_),
                  "h0: expected shape {2,4} ([batch, hidden]), got {2,5}");
    EXPECT_BADARG(forward_h0(GRU(x, y), st32, false, 0, o1, o2, &st_),
                  "h0: expected type {f,32}, got {f,16}");
    EXPECT_BADARG(forward_h0(GRU(f16, f16), x, false, 0, o1, o2, &st_),
                  "h0: expected shape {2,4} ([batch, hidden]), got {2,3,4}");
    EXPECT_BADARG(forward_h0(LIQ(x, r1b, r1, NULL), NULL, false, 0, o1, o2, &st_),
                  "tau: expected shape {4} ([hidden]), got {5}");
    EXPECT_BADARG(forward_h0(LIQ(x, r1, r2, NULL), NULL, false, 0, o1, o2, &st_),
                  "a: expected shape {4} ([hidden]), got {2,4}");
    EXPECT_BADARG(forward_h0(LIQ(x, r1, r1, t2), NULL, false, 0, o1, o2, &st_),
                  "dt: expected shape {2,3,1} ([batch, seqlen, 1]), got {2,1}");
    EXPECT_BADARG(fx_op_linrec_step(LIQ(r2, r1, r1, t3), r2, o1, &st_),
                  "dt: expected shape {2,1} ([batch, 1]), got {2,3,1}");
    /* a scalar dt that is not a positive number (the NIF refuses it first;
     * an XLA custom call passes it as an attribute) */
    p = (fx_linrec_inputs){.kind = FX_LINREC_LIQUID, .seq = {x}, .tau = r1, .lam = r1, .dt_value = -0.5};
    EXPECT_BADARG(forward_h0(&p, NULL, false, 0, o1, o2, &st_),
                  "dt: expected a positive number or a tensor ([batch, seqlen, 1]), got -0.5");
    p = (fx_linrec_inputs){.kind = FX_LINREC_LIQUID, .seq = {r2}, .tau = r1, .lam = r1, .dt_value = NAN};
    EXPECT_BADARG(fx_op_linrec_step(&p, r2, o1, &st_), "dt: expected a positive number or a tensor ([batch, 1]), got nan");
    EXPECT_BADARG(fx_op_linrec_step(GRU(r2, r2), r2b, o1, &st_),
                  "state: expected shape {2,4} ([batch, hidden]), got {2,5}");
    EXPECT_BADARG(fx_op_linrec_step(GRU(x, x), r2, o1, &st_),
                  "z_logits: expected rank 2 [batch, hidden], got rank 3 shape {2,3,4}");

    /* f16 inputs: h0 may be f16 or f32, nothing else */
    fx_test_tensor(dev, FX_F16, 2, d2, v, &vm.f16_2);
    fx_test_tensor(dev, FX_BF16, 2, d2, v, &vm.bf16_2);
    EXPECT_BADARG(forward_h0(GRU(f16, f16), &vm.bf16_2, false, 0, o1, o2, &st_),
                  "h0: expected type {f,16} or {f,32}, got {bf,16}");

    /* backward: dh and dstate */
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(forward_h0(GRU(x, y), NULL, true, 0, &vm.h, &vm.fs, &st), FX_OK);
    fx_linrec_inputs saved = p;
    EXPECT_BADARG(backward_h0(&saved, NULL, &vm.h, wrong_shape, NULL, 0, &vm.g, &st_),
                  "dh: expected shape {2,3,4} ([batch, seqlen, hidden], as the forward's output), got {2,3,5}");
    EXPECT_BADARG(backward_h0(&saved, NULL, &vm.h, f16, NULL, 0, &vm.g, &st_),
                  "dh: expected type {f,32}, got {f,16}");
    EXPECT_BADARG(backward_h0(&saved, NULL, &vm.h, y, r2b, 0, &vm.g, &st_),
                  "dstate: expected shape {2,4} ([batch, hidden]), got {2,5}");
    /* the backward into the caller's outputs checks the forward's inputs,
     * its output and the gradients' presence */
    {
        fx_linrec_grads g;
        fx_status_clear(&st);
        ck_assert_int_eq(fx_linrec_grads_alloc(&saved, &g, &st), FX_OK);
        fx_linrec_grad_outs outs = fx_linrec_grad_outs_of(&g);
        EXPECT_BADARG(backward_into_h0(NULL, &saved, NULL, wrong_shape, y, NULL, 0, &outs, &st_),
                      "h: expected shape {2,3,4} ([batch, seqlen, hidden], the forward's output), got {2,3,5}");
        EXPECT_BADARG(backward_into_h0(NULL, GRU(x, f16), NULL, &vm.h, y, NULL, 0, &outs, &st_),
                      "cand: expected type {f,32}, got {f,16}");
        outs.seq[1] = NULL;
        EXPECT_BADARG(backward_into_h0(NULL, &saved, NULL, &vm.h, y, NULL, 0, &outs, &st_),
                      "dcand: expected a gradient tensor (its input was given)");
        outs = fx_linrec_grad_outs_of(&g);
        outs.h0 = y;
        EXPECT_BADARG(backward_into_h0(NULL, &saved, NULL, &vm.h, y, NULL, 0, &outs, &st_),
                      "dh0: expected a gradient tensor only where its input was given");
        fx_linrec_tensors_release(&g);
    }

    if (dev->kind != FX_DEVICE_CPU) {
        fx_test_tensor(fx_cpu_device(), FX_F32, 3, d3, v, &vm.host);
        fx_test_tensor(fx_cpu_device(), FX_F64, 3, d3, v, &vm.host64);
        EXPECT_BADARG(forward_h0(GRU(x, &vm.host), NULL, false, 0, o1, o2, &st_),
                      "cand: expected a tensor on cuda:0 (where z_logits is), got one on cpu");
        EXPECT_BADARG(backward_h0(&saved, NULL, &vm.h, &vm.host, NULL, 0, &vm.g, &st_),
                      "dh: expected a tensor on cuda:0 (where the saved context is), got one on cpu");
        fx_op_copy_to(&vm.host64, dev, &vm.gpu64, &st);
        FX_CK_OK(st);
        EXPECT_BADARG(forward_h0(SCAN(&vm.gpu64, &vm.gpu64), NULL, false, 0, o1, o2, &st_),
                      "a: expected type {f,32}, {bf,16} or {f,16} on cuda:0 ({f,64} runs on cpu only), got {f,64}");
    }
    release_validation_tensors();
#undef SCAN
#undef GRU
#undef LSTM
#undef LIQ
}
END_TEST

/* `v` as a tensor of `dtype` holds it: rounded to that type. */
static void round_to(fx_dtype dtype, const double *v, double *out, int64_t n)
{
    double one;
    for (int64_t i = 0; i < n; i++) {
        fx_store_f64(&one, dtype, 0, v[i]);
        out[i] = fx_load_f64(&one, dtype, 0);
    }
}

/* seqlen 0: H is empty and the state is h0, exactly (h0 converted to the
 * state type, which holds it without rounding); its backward gives dh0 =
 * dstate, exactly. batch 0 and hidden 0 give empty results. */
START_TEST(empty_shapes)
{
    fx_device *dev = fx_test_device();
    fx_dtype t = dev->kind == FX_DEVICE_CPU ? FX_F64 : FX_F32;
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++) {
        for (int h0 = 1; h0 <= 2; h0++) {
            /* f32 inputs with an f32 h0 (the state type), bf16 ones with a bf16 h0 */
            fx_dtype dtype = h0 == 1 && t == FX_F32 ? FX_BF16 : t;
            lr_case c = {kind, 2, 0, 3, dtype, 0, 0, h0, 1, kind == FX_LINREC_LIQUID, 1.0, 0};
            lr_host x;
            host_random(&c, &x);
            lr_fwd f;
            run_forward(dev, &c, &x, &f);
            double want[6], ds[6] = {1.25, -2, 3.5, -4, 5, -6.75}; /* exact in every type */
            round_to(h0_type(&c), x.h0, want, 6); /* the h0 tensor holds these */
            expect_close("state", &c, f.state, want, 6, 0);
            lr_bwd g;
            run_backward(dev, &c, &x, NULL, ds, &g);
            expect_close("dh0", &c, g.h0, ds, 6, 0);
            if (kind == FX_LINREC_LIQUID) {
                double zeros[3] = {0, 0, 0};
                expect_close("dtau", &c, g.tau, zeros, 3, 0);
            }
            bwd_free(&g);
            fwd_free(&f);
            host_free(&x);
        }
        lr_host x;
        lr_fwd f;
        lr_bwd g;

        /* Liquid's tau, a and dt gradients are sums over what was not
         * scanned: zeros, whatever their tensors held before (they are
         * poisoned), dt's of hidden 0 too. */
        const shape3 empties[] = {{0, 4, 3}, {2, 4, 0}};
        for (int e = 0; e < 2; e++) {
            lr_case ce = {kind, empties[e].B, empties[e].L, empties[e].H, t, 0, 0, 1, 1,
                          kind == FX_LINREC_LIQUID, 1.0, 0};
            host_random(&ce, &x);
            run_forward(dev, &ce, &x, &f);
            run_backward(dev, &ce, &x, NULL, NULL, &g);
            double zeros[8] = {0};
            if (kind == FX_LINREC_LIQUID) {
                expect_close("empty dtau", &ce, g.tau, zeros, ce.H, 0);
                expect_close("empty da", &ce, g.lam, zeros, ce.H, 0);
                expect_close("empty ddt", &ce, g.dt, zeros, ce.B * ce.L, 0);
            }
            bwd_free(&g);
            fwd_free(&f);
            host_free(&x);
        }
    }
}
END_TEST

static bool caller_gone(void *arg)
{
    (*(int *)arg)++;
    return false;
}

/* A caller that is gone stops the CPU scans early, forward and backward. */
START_TEST(cpu_scan_stops_when_its_caller_is_gone)
{
    fx_device *cpu = fx_test_oracle();
    int64_t dims[3] = {1, 8192, 2};
    double *v = calloc(8192 * 2, sizeof(double));
    fx_tensor a, b, h, state, dh;
    fx_test_tensor(cpu, FX_F32, 3, dims, v, &a);
    fx_test_tensor(cpu, FX_F32, 3, dims, v, &b);
    fx_test_tensor(cpu, FX_F32, 3, dims, v, &dh);
    fx_linrec_inputs p = {.kind = FX_LINREC_SCAN, .seq = {&a, &b}};
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(forward_h0(&p, NULL, false, 0, &h, &state, &st), FX_OK);
    int calls = 0;
    fx_cpu_watch_caller(caller_gone, &calls);
    fx_tensor h2, state2;
    ck_assert_int_eq(forward_h0(&p, NULL, false, 0, &h2, &state2, &st), FX_EINTERNAL);
    ck_assert_str_eq(st.msg, "cancelled: the process that called a linrec forward exited before it finished");
    ck_assert_int_ge(calls, 1);
    fx_linrec_grads g;
    fx_status_clear(&st);
    calls = 0;
    ck_assert_int_eq(backward_h0(&p, NULL, &h, &dh, NULL, 0, &g, &st), FX_EINTERNAL);
    ck_assert_str_eq(st.msg, "cancelled: the process that called a linrec backward exited before it finished");
    ck_assert_int_ge(calls, 1);
    fx_cpu_unwatch_caller();
    fx_tensor_release(&a);
    fx_tensor_release(&b);
    fx_tensor_release(&dh);
    fx_tensor_release(&h);
    free(v);
}
END_TEST

Suite *fx_suite_linrec(void)
{
    Suite *s = suite_create("linrec");
    TCase *tc = tcase_create("linear recurrences");
    tcase_set_timeout(tc, 900);
    tcase_add_checked_fixture(tc, NULL, release_validation_tensors);
    tcase_add_test(tc, hand_computed_cases);
    tcase_add_test(tc, hand_computed_liquid_dt_tensor);
    tcase_add_test(tc, gradients_match_finite_differences);
    tcase_add_test(tc, reverse_is_the_scan_of_the_flipped_input);
    tcase_add_test(tc, split_with_carried_state_is_one_call);
    tcase_add_test(tc, steps_are_one_call);
    tcase_add_test(tc, cuda_matches_cpu);
    tcase_add_test(tc, cuda_matches_cpu_small_tilings);
    tcase_add_test(tc, cuda_matches_cpu_auto_tiling);
    tcase_add_test(tc, validation_messages);
    tcase_add_test(tc, empty_shapes);
    tcase_add_test(tc, cpu_scan_stops_when_its_caller_is_gone);
    suite_add_tcase(s, tc);
    return s;
}
