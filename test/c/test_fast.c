/* The CPU fast path (c_src/cpu/fast) against the f64 oracle (the CPU
 * backend's reference device) on the same inputs: the linear recurrences
 * and the selective scan, forward, backward and step, every option, awkward
 * shapes (ones, odd sizes, primes, a long sequence, widths across a
 * segment's and a block's edge), f32 within 1e-5 rel-L2 and bf16/f16
 * within 1e-2; outputs start poisoned (NaN), so one the fast path forgets
 * fails; a NaN input must come out NaN; the maths approximations within
 * their stated bounds; tiny calls, repeated calls (bit-identical) and
 * concurrent callers. Always on cpu, whatever FUSEX_DEVICE names. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/conv.h"
#include "core/linear.h"
#include "core/linrec.h"
#include "core/norm.h"
#include "core/optim.h"
#include "core/rnn.h"
#include "core/ssm.h"
#include "cpu/fast/fast.h"
#include "fusex_dtype.h"
#include "testutil.h"

static double tol_of(fx_dtype t) { return t == FX_F32 ? 1e-5 : 1e-2; }

static double round_to(fx_dtype t, double v)
{
    char buf[8];
    fx_store_f64(buf, t, 0, v);
    return fx_load_f64(buf, t, 0);
}

/* An input on both devices: the same values (rounded to its type). */
typedef struct pair {
    fx_tensor fast, ref;
    int64_t n;
} pair;

static void pair_make(pair *p, fx_dtype t, int rank, const int64_t *dims, double lo, double hi)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    ck_assert_ptr_nonnull(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = round_to(t, fx_rand_uniform(lo, hi));
    fx_test_tensor(fx_cpu_device(), t, rank, dims, v, &p->fast);
    fx_test_tensor(fx_test_oracle(), t, rank, dims, v, &p->ref);
    p->n = n;
    free(v);
}

/* An output on both devices, every byte 0xFF. */
static void pair_poisoned(pair *p, fx_dtype t, int rank, const int64_t *dims)
{
    fx_test_poisoned(fx_cpu_device(), t, rank, dims, &p->fast);
    fx_test_poisoned(fx_test_oracle(), t, rank, dims, &p->ref);
    p->n = p->fast.numel;
}

static void pair_release(pair *p)
{
    fx_tensor_release(&p->fast);
    fx_tensor_release(&p->ref);
}

/* The fast path's values against the oracle's. */
static void pair_compare(const pair *p, double tol, const char *what)
{
    double *got = fx_test_read(&p->fast), *want = fx_test_read(&p->ref);
    double err = fx_rel_l2(got, want, p->n);
    /* An all-zero reference (a gradient of nothing) compares absolutely;
     * so does a small one whose terms nearly cancel: within f32's rounding
     * of unit-scale terms (1e-6 an element), the fast path's arithmetic
     * whatever the storage type (an rms_norm over one element has a
     * gradient of eps's size, the difference of two near-ones). */
    const double diff = fx_l2_diff(got, want, p->n), ref = fx_l2(want, p->n);
    if (ref == 0.0)
        err = fx_l2(got, p->n);
    else if (!isnan(diff) && diff <= tol * ref + 1e-6 * sqrt((double)p->n))
        err = 0.0;
    free(got);
    free(want);
    ck_assert_msg(err <= tol, "%s: rel-L2 %.3g > %.3g (seed %llu)", what, err, tol,
                  (unsigned long long)fx_test_seed());
}

/* ---- the approximations ---- */

/* |got - want| in units of the last place of f32 at want. */
static double ulps(float got, double want)
{
    if (isnan(want))
        return isnan(got) ? 0.0 : INFINITY;
    if (isinf(want))
        return (double)got == want ? 0.0 : INFINITY;
    int e;
    frexp(want, &e); /* want = m 2^e, m in [0.5, 1): f32's step there is 2^(e - 24) */
    double ulp = fabs(want) < 1.17549435e-38 ? ldexp(1.0, -149) : ldexp(1.0, e - 24);
    return fabs((double)got - want) / ulp;
}

START_TEST(approximations_within_bounds)
{
    double worst_exp = 0, worst_log = 0, worst_sig = 0, worst_sp = 0, worst_spa = 0, worst_tanh = 0;
    for (int i = 0; i <= 400000; i++) {
        float x = (float)(-103.0 + 191.7 * i / 400000.0);
        double e = exp((double)x);
        if (e >= 1.17549435e-38) {
            double u = ulps(fx_fast_exp(x), e);
            worst_exp = u > worst_exp ? u : worst_exp;
        } else {
            ck_assert_msg(fabs(fx_fast_exp(x) - e) <= 1.5e-45, "exp(%g) = %g, want %g", x, fx_fast_exp(x), e);
        }
        float y = (float)exp(-80.0 + 160.0 * i / 400000.0);
        worst_log = fmax(worst_log, ulps(fx_fast_log(y), log((double)y)));
        float s = (float)(-60.0 + 120.0 * i / 400000.0);
        worst_sig = fmax(worst_sig, ulps(fx_fast_sigmoid(s), 1.0 / (1.0 + exp(-(double)s))));
        double sp = s > 20.0f ? (double)s : log1p(exp((double)s));
        worst_sp = fmax(worst_sp, ulps(fx_fast_softplus(s), sp));
        double spa = fmax((double)s, 0.0) + log1p(exp(-fabs((double)s)));
        worst_spa = fmax(worst_spa, ulps(fx_fast_softplus_any(s), spa));
        float th = (float)(-12.0 + 24.0 * i / 400000.0);
        worst_tanh = fmax(worst_tanh, ulps(fx_fast_tanh(th), tanh((double)th)));
    }
    fprintf(stderr, "fast maths, worst ulps: exp %.2f log %.2f sigmoid %.2f softplus %.2f softplus_any %.2f tanh %.2f\n",
            worst_exp, worst_log, worst_sig, worst_sp, worst_spa, worst_tanh);
    ck_assert_msg(worst_tanh <= 4.0, "tanh: %.2f ulp", worst_tanh);
    ck_assert(isnan(fx_fast_tanh(NAN)) && fx_fast_tanh(100.0f) == 1.0f && fx_fast_tanh(-100.0f) == -1.0f);
    ck_assert_msg(worst_exp <= 2.0, "exp: %.2f ulp", worst_exp);
    ck_assert_msg(worst_log <= 2.0, "log: %.2f ulp", worst_log);
    ck_assert_msg(worst_sig <= 4.0, "sigmoid: %.2f ulp", worst_sig);
    ck_assert_msg(worst_sp <= 4.0, "softplus: %.2f ulp", worst_sp);
    ck_assert_msg(worst_spa <= 4.0, "softplus_any: %.2f ulp", worst_spa);
    ck_assert(isnan(fx_fast_exp(NAN)) && isnan(fx_fast_log(NAN)) && isnan(fx_fast_sigmoid(NAN)));
    ck_assert(isnan(fx_fast_softplus(NAN)) && isnan(fx_fast_softplus_any(NAN)));
    ck_assert(fx_fast_exp(89.0f) == INFINITY && fx_fast_exp(-200.0f) == 0.0f && fx_fast_exp(0.0f) == 1.0f);
    ck_assert(fx_fast_sigmoid(-200.0f) == 0.0f && fx_fast_sigmoid(200.0f) == 1.0f);
}
END_TEST

/* ---- linear recurrences ---- */

typedef struct lr_case {
    int kind;
    int64_t B, L, H;
    fx_dtype type;
    bool g, reverse, h0, dt_tensor, dstate;
} lr_case;

typedef struct lr_set {
    pair seq[FX_LINREC_MAX_SEQ], tau, lam, dt, h0;
    int nseq;
} lr_set;

static void lr_make(const lr_case *c, lr_set *s, fx_linrec_inputs *fast, fx_linrec_inputs *ref, int64_t L)
{
    memset(s, 0, sizeof *s);
    memset(fast, 0, sizeof *fast);
    memset(ref, 0, sizeof *ref);
    int64_t d3[3] = {c->B, L, c->H}, d1[1] = {c->H}, ddt[3] = {c->B, L, 1}, d2[2] = {c->B, c->H};
    int steps = L == 0; /* a step's frames are [batch, hidden] */
    (void)steps;
    s->nseq = fx_linrec_nseq(c->kind);
    for (int q = 0; q < s->nseq; q++) {
        double lo = -3.0, hi = 3.0;
        if (c->kind == FX_LINREC_SCAN && q == 0)
            lo = 0.3, hi = 1.0; /* decays */
        if (L < 0)
            pair_make(&s->seq[q], c->type, 2, d2, lo, hi);
        else
            pair_make(&s->seq[q], c->type, 3, d3, lo, hi);
        fast->seq[q] = &s->seq[q].fast;
        ref->seq[q] = &s->seq[q].ref;
    }
    if (c->kind == FX_LINREC_LIQUID) {
        pair_make(&s->tau, c->type, 1, d1, 0.5, 2.0);
        pair_make(&s->lam, c->type, 1, d1, -1.5, 1.5);
        fast->tau = &s->tau.fast, ref->tau = &s->tau.ref;
        fast->lam = &s->lam.fast, ref->lam = &s->lam.ref;
        if (c->dt_tensor) {
            int64_t dts[2] = {c->B, 1};
            if (L < 0)
                pair_make(&s->dt, c->type, 2, dts, 0.05, 0.6);
            else
                pair_make(&s->dt, c->type, 3, ddt, 0.05, 0.6);
            fast->dt = &s->dt.fast, ref->dt = &s->dt.ref;
        } else {
            fast->dt_value = ref->dt_value = 0.3;
        }
    }
    if (c->h0 && L >= 0) {
        pair_make(&s->h0, c->type, 2, d2, -1.0, 1.0);
        fast->h0 = &s->h0.fast, ref->h0 = &s->h0.ref;
    }
    fast->kind = ref->kind = c->kind;
    fast->candidate_g = ref->candidate_g = c->g && (c->kind == FX_LINREC_MINGRU || c->kind == FX_LINREC_MINLSTM);
    fast->reverse = ref->reverse = c->reverse;
}

static void lr_release(lr_set *s)
{
    for (int q = 0; q < s->nseq; q++)
        pair_release(&s->seq[q]);
    if (s->tau.fast.buffer)
        pair_release(&s->tau), pair_release(&s->lam);
    if (s->dt.fast.buffer)
        pair_release(&s->dt);
    if (s->h0.fast.buffer)
        pair_release(&s->h0);
}

static void lr_check(const lr_case *c)
{
    char what[160];
    snprintf(what, sizeof what, "%s B%lld L%lld H%lld %s g%d rev%d h0%d dt%d ds%d", fx_linrec_op_name(c->kind),
             (long long)c->B, (long long)c->L, (long long)c->H, fx_dtype_name(c->type), c->g, c->reverse, c->h0,
             c->dt_tensor, c->dstate);
    double tol = tol_of(c->type);
    lr_set s;
    fx_linrec_inputs fin, rin;
    lr_make(c, &s, &fin, &rin, c->L);
    int64_t d3[3] = {c->B, c->L, c->H}, d2[2] = {c->B, c->H};
    fx_status st;
    fx_status_clear(&st);
    /* forward into poisoned outputs */
    pair h, state;
    pair_poisoned(&h, c->type, 3, d3);
    pair_poisoned(&state, FX_F32, 2, d2);
    ck_assert_int_eq(fx_op_linrec_forward_into(NULL, &fin, 0, &h.fast, &state.fast, &st), FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_linrec_forward_into(NULL, &rin, 0, &h.ref, &state.ref, &st), FX_OK);
    char w2[200];
    snprintf(w2, sizeof w2, "%s: h", what);
    pair_compare(&h, tol, w2);
    snprintf(w2, sizeof w2, "%s: state", what);
    pair_compare(&state, tol, w2);
    /* backward: gradients poisoned; h is the oracle's on both (the fast
     * path's own rounding of h is not what is measured) */
    pair dh, dstate = {0};
    pair_make(&dh, c->type, 3, d3, -1.0, 1.0);
    if (c->dstate)
        pair_make(&dstate, FX_F32, 2, d2, -1.0, 1.0);
    pair gseq[FX_LINREC_MAX_SEQ], gtau = {0}, glam = {0}, gdt = {0}, gh0 = {0};
    fx_linrec_grad_outs fg = {0}, rg = {0};
    for (int q = 0; q < s.nseq; q++) {
        pair_poisoned(&gseq[q], c->type, s.seq[q].fast.rank, s.seq[q].fast.dims);
        fg.seq[q] = &gseq[q].fast, rg.seq[q] = &gseq[q].ref;
    }
    if (c->kind == FX_LINREC_LIQUID) {
        pair_poisoned(&gtau, c->type, 1, s.tau.fast.dims);
        pair_poisoned(&glam, c->type, 1, s.lam.fast.dims);
        fg.tau = &gtau.fast, rg.tau = &gtau.ref, fg.lam = &glam.fast, rg.lam = &glam.ref;
        if (c->dt_tensor) {
            pair_poisoned(&gdt, c->type, 3, s.dt.fast.dims);
            fg.dt = &gdt.fast, rg.dt = &gdt.ref;
        }
    }
    if (c->h0) {
        pair_poisoned(&gh0, c->type, 2, d2);
        fg.h0 = &gh0.fast, rg.h0 = &gh0.ref;
    }
    fx_tensor href_on_fast;
    double *hv = fx_test_read(&h.ref);
    fx_test_tensor(fx_cpu_device(), c->type, 3, d3, hv, &href_on_fast);
    free(hv);
    ck_assert_int_eq(fx_op_linrec_backward_into(NULL, &fin, &href_on_fast, &dh.fast, c->dstate ? &dstate.fast : NULL,
                                                0, &fg, &st),
                     FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(
        fx_op_linrec_backward_into(NULL, &rin, &h.ref, &dh.ref, c->dstate ? &dstate.ref : NULL, 0, &rg, &st), FX_OK);
    FX_CK_OK(st);
    for (int q = 0; q < s.nseq; q++) {
        snprintf(w2, sizeof w2, "%s: d%s", what, fx_linrec_seq_name(c->kind, q));
        pair_compare(&gseq[q], tol, w2);
    }
    if (c->kind == FX_LINREC_LIQUID) {
        snprintf(w2, sizeof w2, "%s: dtau", what);
        pair_compare(&gtau, tol, w2);
        snprintf(w2, sizeof w2, "%s: da", what);
        pair_compare(&glam, tol, w2);
        if (c->dt_tensor) {
            snprintf(w2, sizeof w2, "%s: ddt", what);
            pair_compare(&gdt, tol, w2);
        }
    }
    if (c->h0) {
        snprintf(w2, sizeof w2, "%s: dh0", what);
        pair_compare(&gh0, tol, w2);
    }
    fx_tensor_release(&href_on_fast);
    for (int q = 0; q < s.nseq; q++)
        pair_release(&gseq[q]);
    if (gtau.fast.buffer)
        pair_release(&gtau), pair_release(&glam);
    if (gdt.fast.buffer)
        pair_release(&gdt);
    if (gh0.fast.buffer)
        pair_release(&gh0);
    pair_release(&dh);
    if (dstate.fast.buffer)
        pair_release(&dstate);
    pair_release(&h);
    pair_release(&state);
    lr_release(&s);
}

/* Three steps from one state on both paths. */
static void lr_check_step(const lr_case *c)
{
    int64_t d2[2] = {c->B, c->H};
    pair state;
    pair_make(&state, FX_F32, 2, d2, -1.0, 1.0);
    fx_status st;
    fx_status_clear(&st);
    for (int k = 0; k < 3; k++) {
        lr_set s;
        fx_linrec_inputs fin, rin;
        lr_make(c, &s, &fin, &rin, -1);
        pair h;
        pair_poisoned(&h, c->type, 2, d2);
        ck_assert_int_eq(fx_op_linrec_step_into(NULL, &fin, &state.fast, &h.fast, &st), FX_OK);
        FX_CK_OK(st);
        ck_assert_int_eq(fx_op_linrec_step_into(NULL, &rin, &state.ref, &h.ref, &st), FX_OK);
        char what[160];
        snprintf(what, sizeof what, "%s step %d B%lld H%lld %s", fx_linrec_op_name(c->kind), k, (long long)c->B,
                 (long long)c->H, fx_dtype_name(c->type));
        pair_compare(&h, tol_of(c->type), what);
        pair_compare(&state, tol_of(c->type), what);
        pair_release(&h);
        lr_release(&s);
    }
    pair_release(&state);
}

static const int64_t lr_shapes[][3] = {
    {1, 1, 1}, {1, 32, 512}, {3, 7, 5}, {2, 13, 257}, {1, 1200, 3}, {5, 1, 17}, {2, 3, 300}, {4, 64, 67},
};

START_TEST(linrec_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    int count = 0;
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
        for (size_t si = 0; si < sizeof lr_shapes / sizeof lr_shapes[0]; si++)
            for (int ti = 0; ti < 3; ti++)
                for (int opt = 0; opt < 4; opt++) {
                    /* options rotate with the shape so every one meets every kind and type */
                    int o = (opt + (int)si) % 4;
                    lr_case c = {kind, lr_shapes[si][0], lr_shapes[si][1], lr_shapes[si][2], types[ti],
                                 o & 1, (o >> 1) & 1, o != 0, o == 1 || o == 3, o >= 2};
                    if (ti > 0 && opt > 1)
                        continue;
                    lr_check(&c);
                    count++;
                }
    fprintf(stderr, "fast linrec: %d cases against the oracle\n", count);
}
END_TEST

START_TEST(linrec_steps_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {2, 257}, {1, 512}, {16, 33}};
    for (int kind = 0; kind < FX_LINREC_KIND_COUNT; kind++)
        for (int si = 0; si < 5; si++)
            for (int ti = 0; ti < 3; ti++) {
                lr_case c = {kind, shapes[si][0], 1, shapes[si][1], types[ti], si & 1, false, false, si & 1, false};
                lr_check_step(&c);
            }
}
END_TEST

/* ---- selective scan ---- */

enum { S_D = 1, S_Z = 2, S_BIAS = 4, S_SOFTPLUS = 8, S_H0 = 16, S_DSTATE = 32 };

typedef struct ssm_case {
    int64_t B, L, D, N, G;
    fx_dtype type;
    unsigned opts;
} ssm_case;

typedef struct ssm_set {
    pair x, dt, a, b, c, d, z, bias, h0;
} ssm_set;

/* L < 0: a step's frames. */
static void ssm_make(const ssm_case *k, ssm_set *s, fx_ssm_inputs *fi, fx_ssm_inputs *ri, bool step)
{
    memset(s, 0, sizeof *s);
    memset(fi, 0, sizeof *fi);
    memset(ri, 0, sizeof *ri);
    int64_t btd[3] = {k->B, k->L, k->D}, bd[2] = {k->B, k->D}, dn[2] = {k->D, k->N}, d1[1] = {k->D};
    int64_t bc[4] = {k->B, k->L, k->G, k->N}, bcs[3] = {k->B, k->G, k->N};
    pair_make(&s->x, k->type, step ? 2 : 3, step ? bd : btd, -1.5, 1.5);
    pair_make(&s->dt, k->type, step ? 2 : 3, step ? bd : btd, (k->opts & S_SOFTPLUS) ? -3.0 : 0.01,
              (k->opts & S_SOFTPLUS) ? 0.5 : 0.6);
    pair_make(&s->a, k->type, 2, dn, -4.0, -0.2);
    pair_make(&s->b, k->type, step ? 3 : 4, step ? bcs : bc, -1.0, 1.0);
    pair_make(&s->c, k->type, step ? 3 : 4, step ? bcs : bc, -1.0, 1.0);
    fi->x = &s->x.fast, ri->x = &s->x.ref, fi->dt = &s->dt.fast, ri->dt = &s->dt.ref;
    fi->a = &s->a.fast, ri->a = &s->a.ref, fi->b = &s->b.fast, ri->b = &s->b.ref;
    fi->c = &s->c.fast, ri->c = &s->c.ref;
    if (k->opts & S_D) {
        pair_make(&s->d, k->type, 1, d1, -1.0, 1.0);
        fi->d = &s->d.fast, ri->d = &s->d.ref;
    }
    if (k->opts & S_Z) {
        pair_make(&s->z, k->type, step ? 2 : 3, step ? bd : btd, -2.0, 2.0);
        fi->z = &s->z.fast, ri->z = &s->z.ref;
    }
    if (k->opts & S_BIAS) {
        pair_make(&s->bias, k->type, 1, d1, 0.0, 0.5); /* delta stays positive without softplus */
        fi->dt_bias = &s->bias.fast, ri->dt_bias = &s->bias.ref;
    }
    if ((k->opts & S_H0) && !step) {
        int64_t st3[3] = {k->B, k->D, k->N};
        pair_make(&s->h0, k->type, 3, st3, -1.0, 1.0);
        fi->h0 = &s->h0.fast, ri->h0 = &s->h0.ref;
    }
    fi->dt_softplus = ri->dt_softplus = (k->opts & S_SOFTPLUS) != 0;
}

static void ssm_release(ssm_set *s)
{
    pair *all[] = {&s->x, &s->dt, &s->a, &s->b, &s->c, &s->d, &s->z, &s->bias, &s->h0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->fast.buffer)
            pair_release(all[i]);
}

static void ssm_check(const ssm_case *k)
{
    char what[160], w2[200];
    snprintf(what, sizeof what, "ssm B%lld L%lld D%lld N%lld G%lld %s opts %#x", (long long)k->B, (long long)k->L,
             (long long)k->D, (long long)k->N, (long long)k->G, fx_dtype_name(k->type), k->opts);
    double tol = tol_of(k->type);
    ssm_set s;
    fx_ssm_inputs fi, ri;
    ssm_make(k, &s, &fi, &ri, false);
    int64_t btd[3] = {k->B, k->L, k->D}, st3[3] = {k->B, k->D, k->N};
    fx_status st;
    fx_status_clear(&st);
    pair y, state;
    pair_poisoned(&y, k->type, 3, btd);
    pair_poisoned(&state, FX_F32, 3, st3);
    ck_assert_int_eq(fx_op_ssm_forward_into(NULL, &fi, &y.fast, &state.fast, NULL, &st), FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_ssm_forward_into(NULL, &ri, &y.ref, &state.ref, NULL, &st), FX_OK);
    FX_CK_OK(st);
    snprintf(w2, sizeof w2, "%s: y", what);
    pair_compare(&y, tol, w2);
    snprintf(w2, sizeof w2, "%s: state", what);
    pair_compare(&state, tol, w2);
    /* backward into poisoned gradients */
    pair dy, dstate = {0};
    pair_make(&dy, k->type, 3, btd, -1.0, 1.0);
    if (k->opts & S_DSTATE)
        pair_make(&dstate, FX_F32, 3, st3, -1.0, 1.0);
    pair *ins[] = {&s.x, &s.dt, &s.a, &s.b, &s.c, &s.d, &s.z, &s.bias, &s.h0};
    const char *names[] = {"dx", "ddt", "da", "db", "dc", "dd", "dz", "ddt_bias", "dh0"};
    pair g[9];
    const fx_tensor *fo[9] = {0}, *ro[9] = {0};
    memset(g, 0, sizeof g);
    for (int i = 0; i < 9; i++)
        if (ins[i]->fast.buffer) {
            pair_poisoned(&g[i], k->type, ins[i]->fast.rank, ins[i]->fast.dims);
            fo[i] = &g[i].fast, ro[i] = &g[i].ref;
        }
    fx_ssm_grad_outs fg = {fo[0], fo[1], fo[2], fo[3], fo[4], fo[5], fo[6], fo[7], fo[8]};
    fx_ssm_grad_outs rg = {ro[0], ro[1], ro[2], ro[3], ro[4], ro[5], ro[6], ro[7], ro[8]};
    ck_assert_int_eq(
        fx_op_ssm_backward_into(NULL, &fi, NULL, &dy.fast, dstate.fast.buffer ? &dstate.fast : NULL, &fg, &st), FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(
        fx_op_ssm_backward_into(NULL, &ri, NULL, &dy.ref, dstate.ref.buffer ? &dstate.ref : NULL, &rg, &st), FX_OK);
    FX_CK_OK(st);
    for (int i = 0; i < 9; i++)
        if (fo[i]) {
            snprintf(w2, sizeof w2, "%s: %s", what, names[i]);
            pair_compare(&g[i], tol, w2);
            pair_release(&g[i]);
        }
    pair_release(&dy);
    if (dstate.fast.buffer)
        pair_release(&dstate);
    pair_release(&y);
    pair_release(&state);
    ssm_release(&s);
}

static void ssm_check_step(const ssm_case *k)
{
    int64_t st3[3] = {k->B, k->D, k->N}, bd[2] = {k->B, k->D};
    pair state;
    pair_make(&state, FX_F32, 3, st3, -1.0, 1.0);
    fx_status st;
    fx_status_clear(&st);
    for (int t = 0; t < 3; t++) {
        ssm_set s;
        fx_ssm_inputs fi, ri;
        ssm_make(k, &s, &fi, &ri, true);
        pair y;
        pair_poisoned(&y, k->type, 2, bd);
        ck_assert_int_eq(fx_op_ssm_step_into(NULL, &state.fast, &fi, &y.fast, &st), FX_OK);
        FX_CK_OK(st);
        ck_assert_int_eq(fx_op_ssm_step_into(NULL, &state.ref, &ri, &y.ref, &st), FX_OK);
        FX_CK_OK(st);
        char what[160];
        snprintf(what, sizeof what, "ssm step %d B%lld D%lld N%lld G%lld %s opts %#x", t, (long long)k->B,
                 (long long)k->D, (long long)k->N, (long long)k->G, fx_dtype_name(k->type), k->opts);
        pair_compare(&y, tol_of(k->type), what);
        pair_compare(&state, tol_of(k->type), what);
        pair_release(&y);
        ssm_release(&s);
    }
    pair_release(&state);
}

static const int64_t ssm_shapes[][5] = {
    /* B, L, D, N, G */
    {1, 1, 1, 1, 1},   {2, 7, 6, 5, 2},    {1, 129, 17, 3, 1}, {3, 37, 64, 16, 4},
    {1, 700, 8, 4, 1}, {2, 33, 130, 16, 1}, {1, 17, 96, 7, 3},  {2, 16, 33, 1, 1},
};

START_TEST(ssm_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const unsigned opt_sets[] = {0, S_D | S_Z | S_BIAS | S_SOFTPLUS | S_H0 | S_DSTATE, S_SOFTPLUS | S_Z,
                                 S_D | S_BIAS | S_H0, S_DSTATE | S_SOFTPLUS};
    int count = 0;
    for (size_t si = 0; si < sizeof ssm_shapes / sizeof ssm_shapes[0]; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int oi = 0; oi < 5; oi++) {
                if (ti > 0 && oi != (int)(si % 5) && oi != 1)
                    continue;
                ssm_case k = {ssm_shapes[si][0], ssm_shapes[si][1], ssm_shapes[si][2], ssm_shapes[si][3],
                              ssm_shapes[si][4], types[ti], opt_sets[oi]};
                ssm_check(&k);
                count++;
            }
    fprintf(stderr, "fast ssm: %d cases against the oracle\n", count);
}
END_TEST

START_TEST(ssm_steps_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 6, 5, 2}, {3, 64, 16, 4}, {1, 257, 16, 1}, {4, 17, 7, 17}};
    for (int si = 0; si < 5; si++)
        for (int ti = 0; ti < 3; ti++) {
            unsigned opts = si % 2 ? S_D | S_Z | S_BIAS | S_SOFTPLUS : S_SOFTPLUS;
            ssm_case k = {shapes[si][0], 1, shapes[si][1], shapes[si][2], shapes[si][3], types[ti], opts};
            ssm_check_step(&k);
        }
}
END_TEST

/* ---- linear layers ---- */

typedef struct lin_case {
    int64_t rows, in, out;
    fx_dtype type;
    int act;
    bool bias;
} lin_case;

static void lin_check(const lin_case *k)
{
    char what[160], w2[200];
    snprintf(what, sizeof what, "linear rows %lld in %lld out %lld %s %s bias%d", (long long)k->rows,
             (long long)k->in, (long long)k->out, fx_dtype_name(k->type), fx_activation_name(k->act), k->bias);
    const double tol = tol_of(k->type);
    const int64_t xd[2] = {k->rows, k->in}, wd[2] = {k->out, k->in}, bd[1] = {k->out}, yd[2] = {k->rows, k->out};
    pair x, w, b = {0}, y, pre, dy, dx, dw, db = {0};
    pair_make(&x, k->type, 2, xd, -1.5, 1.5);
    pair_make(&w, k->type, 2, wd, -0.5, 0.5);
    if (k->bias)
        pair_make(&b, k->type, 1, bd, -0.5, 0.5);
    pair_poisoned(&y, k->type, 2, yd);
    pair_poisoned(&pre, k->type, 2, yd);
    fx_linear_inputs fi = {&x.fast, &w.fast, k->bias ? &b.fast : NULL, k->act, false};
    fx_linear_inputs ri = {&x.ref, &w.ref, k->bias ? &b.ref : NULL, k->act, false};
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_linear_forward_into(NULL, &fi, &y.fast, &pre.fast, &st), FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_linear_forward_into(NULL, &ri, &y.ref, &pre.ref, &st), FX_OK);
    snprintf(w2, sizeof w2, "%s: y", what);
    pair_compare(&y, tol, w2);
    snprintf(w2, sizeof w2, "%s: pre", what);
    pair_compare(&pre, tol, w2);
    /* the backward from each path's own forward */
    pair_make(&dy, k->type, 2, yd, -1.0, 1.0);
    pair_poisoned(&dx, k->type, 2, xd);
    pair_poisoned(&dw, k->type, 2, wd);
    if (k->bias)
        pair_poisoned(&db, k->type, 1, bd);
    fx_linear_grad_outs fg = {&dx.fast, &dw.fast, k->bias ? &db.fast : NULL};
    fx_linear_grad_outs rg = {&dx.ref, &dw.ref, k->bias ? &db.ref : NULL};
    const bool out = fx_linear_reads_output(k->act), pa = fx_linear_reads_pre(k->act);
    ck_assert_int_eq(fx_op_linear_backward_into(NULL, &fi, out ? &y.fast : NULL, pa ? &pre.fast : NULL, &dy.fast,
                                                &fg, &st),
                     FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(
        fx_op_linear_backward_into(NULL, &ri, out ? &y.ref : NULL, pa ? &pre.ref : NULL, &dy.ref, &rg, &st), FX_OK);
    FX_CK_OK(st);
    snprintf(w2, sizeof w2, "%s: dx", what);
    pair_compare(&dx, tol, w2);
    snprintf(w2, sizeof w2, "%s: dw", what);
    pair_compare(&dw, tol, w2);
    if (k->bias) {
        snprintf(w2, sizeof w2, "%s: dbias", what);
        pair_compare(&db, tol, w2);
        pair_release(&db);
        pair_release(&b);
    }
    pair *all[] = {&x, &w, &y, &pre, &dy, &dx, &dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_release(all[i]);
}

START_TEST(linear_against_oracle)
{
    /* make test installs one; FUSEX_BLAS=none runs the oracle on both devices */
    const char *want = getenv("FUSEX_BLAS");
    ck_assert_msg(fx_blas_available() || (want && strcmp(want, "none") == 0), "no BLAS: %s", fx_blas_name());
    fprintf(stderr, "fast linear: BLAS %s\n", fx_blas_name());
    const int64_t shapes[][3] = {{1, 1, 1},    {1, 256, 512}, {3, 7, 5},  {17, 33, 129}, {1, 512, 16},
                                 {64, 13, 3}, {130, 64, 67}, {2, 1, 300}, {1, 16, 513}};
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    int count = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int act = 0; act < FX_ACT_COUNT; act++) {
                if (ti > 0 && act != (int)(si % FX_ACT_COUNT))
                    continue;
                lin_case k = {shapes[si][0], shapes[si][1], shapes[si][2], types[ti], act, (act + (int)si) % 2 == 0};
                lin_check(&k);
                count++;
            }
    fprintf(stderr, "fast linear: %d cases against the oracle\n", count);
}
END_TEST

/* ---- causal conv1d ---- */

enum { C_BIAS = 1, C_INIT = 2, C_FINAL = 4, C_SILU = 8, C_DFINAL = 16 };

typedef struct conv_case {
    int64_t B, L, D, W;
    fx_dtype type;
    unsigned opts;
} conv_case;

static void conv_check(const conv_case *k)
{
    char what[160], w2[200];
    snprintf(what, sizeof what, "conv B%lld L%lld D%lld W%lld %s opts %#x", (long long)k->B, (long long)k->L,
             (long long)k->D, (long long)k->W, fx_dtype_name(k->type), k->opts);
    const double tol = tol_of(k->type);
    const int64_t xd[3] = {k->B, k->L, k->D}, wd[2] = {k->D, k->W}, bd[1] = {k->D}, sd[3] = {k->B, k->D, k->W - 1};
    const bool has_state = k->W > 1;
    pair x, w, b = {0}, init = {0}, y, fin = {0}, dy, dfin = {0}, dx, dw, db = {0}, dinit = {0};
    pair_make(&x, k->type, 3, xd, -1.5, 1.5);
    pair_make(&w, k->type, 2, wd, -0.7, 0.7);
    if (k->opts & C_BIAS)
        pair_make(&b, k->type, 1, bd, -0.5, 0.5);
    const bool use_init = (k->opts & C_INIT) && has_state, use_final = (k->opts & C_FINAL) && has_state;
    if (use_init)
        pair_make(&init, k->type, 3, sd, -1.0, 1.0);
    pair_poisoned(&y, k->type, 3, xd);
    if (use_final)
        pair_poisoned(&fin, k->type, 3, sd);
    const int act = (k->opts & C_SILU) ? FX_ACT_SILU : FX_ACT_NONE;
    fx_conv_inputs fi = {&x.fast, &w.fast, b.fast.buffer ? &b.fast : NULL, use_init ? &init.fast : NULL, act};
    fx_conv_inputs ri = {&x.ref, &w.ref, b.ref.buffer ? &b.ref : NULL, use_init ? &init.ref : NULL, act};
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_conv_forward_into(NULL, &fi, &y.fast, use_final ? &fin.fast : NULL, &st), FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_conv_forward_into(NULL, &ri, &y.ref, use_final ? &fin.ref : NULL, &st), FX_OK);
    snprintf(w2, sizeof w2, "%s: y", what);
    pair_compare(&y, tol, w2);
    if (use_final) {
        snprintf(w2, sizeof w2, "%s: final_state", what);
        pair_compare(&fin, tol, w2);
    }
    pair_make(&dy, k->type, 3, xd, -1.0, 1.0);
    const bool use_dfinal = (k->opts & C_DFINAL) && has_state;
    if (use_dfinal)
        pair_make(&dfin, k->type, 3, sd, -1.0, 1.0);
    pair_poisoned(&dx, k->type, 3, xd);
    pair_poisoned(&dw, k->type, 2, wd);
    if (b.fast.buffer)
        pair_poisoned(&db, k->type, 1, bd);
    if (use_init)
        pair_poisoned(&dinit, k->type, 3, sd);
    fx_conv_grad_outs fg = {&dx.fast, &dw.fast, db.fast.buffer ? &db.fast : NULL, use_init ? &dinit.fast : NULL};
    fx_conv_grad_outs rg = {&dx.ref, &dw.ref, db.ref.buffer ? &db.ref : NULL, use_init ? &dinit.ref : NULL};
    ck_assert_int_eq(fx_op_conv_backward_into(NULL, &fi, &dy.fast, use_dfinal ? &dfin.fast : NULL, &fg, &st), FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_conv_backward_into(NULL, &ri, &dy.ref, use_dfinal ? &dfin.ref : NULL, &rg, &st), FX_OK);
    FX_CK_OK(st);
    pair *grads[] = {&dx, &dw, &db, &dinit};
    const char *names[] = {"dx", "dw", "dbias", "dinitial_state"};
    for (int i = 0; i < 4; i++)
        if (grads[i]->fast.buffer) {
            snprintf(w2, sizeof w2, "%s: %s", what, names[i]);
            pair_compare(grads[i], tol, w2);
        }
    pair *all[] = {&x, &w, &b, &init, &y, &fin, &dy, &dfin, &dx, &dw, &db, &dinit};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->fast.buffer)
            pair_release(all[i]);
}

/* Three steps from one state on both paths. */
static void conv_check_step(const conv_case *k)
{
    const int64_t xd[2] = {k->B, k->D}, wd[2] = {k->D, k->W}, bd[1] = {k->D}, sd[3] = {k->B, k->D, k->W - 1};
    pair state, w, b = {0};
    pair_make(&state, k->type, 3, sd, -1.0, 1.0);
    pair_make(&w, k->type, 2, wd, -0.7, 0.7);
    if (k->opts & C_BIAS)
        pair_make(&b, k->type, 1, bd, -0.5, 0.5);
    const int act = (k->opts & C_SILU) ? FX_ACT_SILU : FX_ACT_NONE;
    fx_status st;
    fx_status_clear(&st);
    for (int t = 0; t < 3; t++) {
        pair x, y;
        pair_make(&x, k->type, 2, xd, -1.5, 1.5);
        pair_poisoned(&y, k->type, 2, xd);
        fx_conv_inputs fi = {&x.fast, &w.fast, b.fast.buffer ? &b.fast : NULL, NULL, act};
        fx_conv_inputs ri = {&x.ref, &w.ref, b.ref.buffer ? &b.ref : NULL, NULL, act};
        ck_assert_int_eq(fx_op_conv_step_into(NULL, &state.fast, &fi, &y.fast, &st), FX_OK);
        FX_CK_OK(st);
        ck_assert_int_eq(fx_op_conv_step_into(NULL, &state.ref, &ri, &y.ref, &st), FX_OK);
        char what[160];
        snprintf(what, sizeof what, "conv step %d B%lld D%lld W%lld %s opts %#x", t, (long long)k->B,
                 (long long)k->D, (long long)k->W, fx_dtype_name(k->type), k->opts);
        pair_compare(&y, tol_of(k->type), what);
        pair_compare(&state, tol_of(k->type), what);
        pair_release(&x);
        pair_release(&y);
    }
    pair_release(&state);
    pair_release(&w);
    if (b.fast.buffer)
        pair_release(&b);
}

static const int64_t conv_shapes[][4] = {
    /* B, L, D, W */
    {1, 1, 1, 1}, {2, 7, 6, 4}, {1, 129, 17, 3}, {3, 37, 300, 4}, {1, 2, 8, 5}, {2, 33, 1, 16}, {1, 700, 5, 2},
};

START_TEST(conv_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const unsigned opt_sets[] = {0, C_BIAS | C_INIT | C_FINAL | C_SILU | C_DFINAL, C_SILU | C_FINAL, C_BIAS | C_INIT,
                                 C_DFINAL | C_SILU | C_BIAS};
    int count = 0;
    for (size_t si = 0; si < sizeof conv_shapes / sizeof conv_shapes[0]; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int oi = 0; oi < 5; oi++) {
                if (ti > 0 && oi != (int)(si % 5) && oi != 1)
                    continue;
                conv_case k = {conv_shapes[si][0], conv_shapes[si][1], conv_shapes[si][2], conv_shapes[si][3],
                               types[ti], opt_sets[oi]};
                conv_check(&k);
                count++;
            }
    fprintf(stderr, "fast conv: %d cases against the oracle\n", count);
}
END_TEST

START_TEST(conv_steps_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int64_t shapes[][3] = {{1, 1, 2}, {2, 6, 4}, {1, 512, 4}, {3, 257, 3}, {4, 17, 16}};
    for (int si = 0; si < 5; si++)
        for (int ti = 0; ti < 3; ti++) {
            conv_case k = {shapes[si][0], 1, shapes[si][1], shapes[si][2], types[ti], si % 2 ? C_BIAS | C_SILU : C_SILU};
            conv_check_step(&k);
        }
}
END_TEST

/* ---- norms ---- */

enum { N_BIAS = 1, N_RES = 2, N_GATE = 4, N_DRES = 8, N_RES32 = 16 };

typedef struct norm_case {
    int kind;
    int64_t rows, hidden;
    fx_dtype type;
    unsigned opts;
} norm_case;

static void norm_check(const norm_case *k)
{
    char what[160], w2[200];
    snprintf(what, sizeof what, "%s rows %lld hidden %lld %s opts %#x", k->kind == FX_NORM_RMS ? "rms" : "layer",
             (long long)k->rows, (long long)k->hidden, fx_dtype_name(k->type), k->opts);
    const double tol = tol_of(k->type);
    const int64_t xd[2] = {k->rows, k->hidden}, hd[1] = {k->hidden}, rd[1] = {k->rows};
    const bool bias = (k->opts & N_BIAS) && k->kind == FX_NORM_LAYER, res = k->opts & N_RES, gate = k->opts & N_GATE;
    const fx_dtype res_type = (k->opts & N_RES32) ? FX_F32 : k->type, stat = FX_F32;
    pair x, w, b = {0}, r = {0}, g = {0}, y, rout = {0}, mean = {0}, rstd;
    pair_make(&x, k->type, 2, xd, -2.0, 2.0);
    pair_make(&w, k->type, 1, hd, 0.5, 1.5);
    if (bias)
        pair_make(&b, k->type, 1, hd, -0.5, 0.5);
    if (res) {
        pair_make(&r, k->type, 2, xd, -1.0, 1.0);
        pair_poisoned(&rout, res_type, 2, xd);
    }
    if (gate)
        pair_make(&g, k->type, 2, xd, -2.0, 2.0);
    pair_poisoned(&y, k->type, 2, xd);
    if (k->kind == FX_NORM_LAYER)
        pair_poisoned(&mean, stat, 1, rd);
    pair_poisoned(&rstd, stat, 1, rd);
    fx_norm_inputs fi = {k->kind, 1e-5, &x.fast, &w.fast, bias ? &b.fast : NULL, res ? &r.fast : NULL,
                         gate ? &g.fast : NULL, (k->opts & N_RES32) != 0};
    fx_norm_inputs ri = {k->kind, 1e-5, &x.ref, &w.ref, bias ? &b.ref : NULL, res ? &r.ref : NULL,
                         gate ? &g.ref : NULL, (k->opts & N_RES32) != 0};
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_norm_forward_into(NULL, &fi, &y.fast, res ? &rout.fast : NULL,
                                             mean.fast.buffer ? &mean.fast : NULL, &rstd.fast, &st),
                     FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_norm_forward_into(NULL, &ri, &y.ref, res ? &rout.ref : NULL,
                                             mean.ref.buffer ? &mean.ref : NULL, &rstd.ref, &st),
                     FX_OK);
    FX_CK_OK(st);
    pair *outs[] = {&y, &rout, &mean, &rstd};
    const char *onames[] = {"y", "residual_out", "mean", "rstd"};
    for (int i = 0; i < 4; i++)
        if (outs[i]->fast.buffer) {
            snprintf(w2, sizeof w2, "%s: %s", what, onames[i]);
            pair_compare(outs[i], tol, w2);
        }
    /* the backward from each path's own forward */
    pair dy, dres_out = {0}, dx, dw, db = {0}, dres = {0}, dg = {0};
    pair_make(&dy, k->type, 2, xd, -1.0, 1.0);
    const bool dro = res && (k->opts & N_DRES);
    if (dro)
        pair_make(&dres_out, res_type, 2, xd, -1.0, 1.0);
    pair_poisoned(&dx, k->type, 2, xd);
    pair_poisoned(&dw, k->type, 1, hd);
    if (bias)
        pair_poisoned(&db, k->type, 1, hd);
    if (res)
        pair_poisoned(&dres, k->type, 2, xd);
    if (gate)
        pair_poisoned(&dg, k->type, 2, xd);
    fx_norm_grad_outs fg = {&dx.fast, &dw.fast, bias ? &db.fast : NULL, res ? &dres.fast : NULL, gate ? &dg.fast : NULL};
    fx_norm_grad_outs rg = {&dx.ref, &dw.ref, bias ? &db.ref : NULL, res ? &dres.ref : NULL, gate ? &dg.ref : NULL};
    ck_assert_int_eq(fx_op_norm_backward_into(NULL, &fi, res ? &rout.fast : NULL, mean.fast.buffer ? &mean.fast : NULL,
                                              &rstd.fast, &dy.fast, dro ? &dres_out.fast : NULL, &fg, &st),
                     FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_norm_backward_into(NULL, &ri, res ? &rout.ref : NULL, mean.ref.buffer ? &mean.ref : NULL,
                                              &rstd.ref, &dy.ref, dro ? &dres_out.ref : NULL, &rg, &st),
                     FX_OK);
    FX_CK_OK(st);
    pair *grads[] = {&dx, &dw, &db, &dres, &dg};
    const char *gnames[] = {"dx", "dweight", "dbias", "dresidual", "dgate"};
    for (int i = 0; i < 5; i++)
        if (grads[i]->fast.buffer) {
            snprintf(w2, sizeof w2, "%s: %s", what, gnames[i]);
            pair_compare(grads[i], tol, w2);
        }
    pair *all[] = {&x, &w, &b, &r, &g, &y, &rout, &mean, &rstd, &dy, &dres_out, &dx, &dw, &db, &dres, &dg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->fast.buffer)
            pair_release(all[i]);
}

START_TEST(norm_against_oracle)
{
    const int64_t shapes[][2] = {{1, 1}, {1, 256}, {3, 7}, {17, 33}, {2, 300}, {64, 13}, {5, 1031}, {130, 64}};
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const unsigned opt_sets[] = {0, N_BIAS | N_RES | N_GATE | N_DRES, N_RES | N_RES32 | N_DRES, N_GATE, N_BIAS | N_RES};
    int count = 0;
    for (int kind = 0; kind < 2; kind++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int ti = 0; ti < 3; ti++)
                for (int oi = 0; oi < 5; oi++) {
                    if (ti > 0 && oi != (int)(si % 5) && oi != 1)
                        continue;
                    norm_case k = {kind, shapes[si][0], shapes[si][1], types[ti], opt_sets[oi]};
                    norm_check(&k);
                    count++;
                }
    fprintf(stderr, "fast norms: %d cases against the oracle\n", count);
}
END_TEST

/* ---- GRU and LSTM ---- */

enum { R_BIAS = 1, R_H0 = 2, R_DHN = 4, R_DY = 8 };

typedef struct rnn_case {
    int cell;
    int64_t layers, B, L, input, H;
    fx_dtype type;
    unsigned opts;
} rnn_case;

typedef struct rnn_set {
    pair w_ih[3], w_hh[3], b_ih[3], b_hh[3], x, h0, c0;
    fx_rnn_layer fl[3], rl[3];
} rnn_set;

static void rnn_make(const rnn_case *k, rnn_set *s, bool step)
{
    memset(s, 0, sizeof *s);
    const int64_t rows = fx_rnn_gates(k->cell) * k->H, bound_hh[2] = {rows, k->H}, bd[1] = {rows};
    const double a = 1.0 / sqrt((double)k->H);
    for (int64_t l = 0; l < k->layers; l++) {
        const int64_t wd[2] = {rows, l == 0 ? k->input : k->H};
        pair_make(&s->w_ih[l], k->type, 2, wd, -a, a);
        pair_make(&s->w_hh[l], k->type, 2, bound_hh, -a, a);
        if (k->opts & R_BIAS) {
            pair_make(&s->b_ih[l], k->type, 1, bd, -a, a);
            pair_make(&s->b_hh[l], FX_F32, 1, bd, -a, a); /* a bias of another float type */
        }
        s->fl[l] = (fx_rnn_layer){&s->w_ih[l].fast, &s->w_hh[l].fast, s->b_ih[l].fast.buffer ? &s->b_ih[l].fast : NULL,
                                  s->b_hh[l].fast.buffer ? &s->b_hh[l].fast : NULL};
        s->rl[l] = (fx_rnn_layer){&s->w_ih[l].ref, &s->w_hh[l].ref, s->b_ih[l].ref.buffer ? &s->b_ih[l].ref : NULL,
                                  s->b_hh[l].ref.buffer ? &s->b_hh[l].ref : NULL};
    }
    const int64_t xd[3] = {k->B, k->L, k->input}, xs[2] = {k->B, k->input}, sd[3] = {k->layers, k->B, k->H};
    pair_make(&s->x, k->type, step ? 2 : 3, step ? xs : xd, -1.5, 1.5);
    if ((k->opts & R_H0) && !step) {
        pair_make(&s->h0, FX_F32, 3, sd, -1.0, 1.0);
        if (k->cell == FX_RNN_LSTM)
            pair_make(&s->c0, k->type, 3, sd, -1.0, 1.0);
    }
}

static void rnn_release(rnn_set *s)
{
    for (int l = 0; l < 3; l++) {
        pair *ps[] = {&s->w_ih[l], &s->w_hh[l], &s->b_ih[l], &s->b_hh[l]};
        for (int i = 0; i < 4; i++)
            if (ps[i]->fast.buffer)
                pair_release(ps[i]);
    }
    pair *rest[] = {&s->x, &s->h0, &s->c0};
    for (int i = 0; i < 3; i++)
        if (rest[i]->fast.buffer)
            pair_release(rest[i]);
}

static void rnn_check(const rnn_case *k)
{
    char what[160], w2[200];
    snprintf(what, sizeof what, "%s layers %lld B%lld L%lld in %lld H%lld %s opts %#x",
             k->cell == FX_RNN_GRU ? "gru" : "lstm", (long long)k->layers, (long long)k->B, (long long)k->L,
             (long long)k->input, (long long)k->H, fx_dtype_name(k->type), k->opts);
    const double tol = tol_of(k->type);
    const bool lstm = k->cell == FX_RNN_LSTM;
    rnn_set s;
    rnn_make(k, &s, false);
    fx_rnn_inputs fi = {k->cell, k->layers, s.fl, &s.x.fast, s.h0.fast.buffer ? &s.h0.fast : NULL,
                        s.c0.fast.buffer ? &s.c0.fast : NULL, 0};
    fx_rnn_inputs ri = {k->cell, k->layers, s.rl, &s.x.ref, s.h0.ref.buffer ? &s.h0.ref : NULL,
                        s.c0.ref.buffer ? &s.c0.ref : NULL, 0};
    const int64_t yd[3] = {k->B, k->L, k->H}, sd[3] = {k->layers, k->B, k->H};
    fx_rnn_dims n = {k->cell, k->layers, k->B, k->L, k->input, k->H};
    int64_t saved_dims[4];
    fx_rnn_saved_shape(&n, saved_dims);
    pair y, hn, cn = {0}, saved;
    pair_poisoned(&y, k->type, 3, yd);
    pair_poisoned(&hn, FX_F32, 3, sd);
    if (lstm)
        pair_poisoned(&cn, FX_F32, 3, sd);
    pair_poisoned(&saved, FX_F32, 4, saved_dims);
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_rnn_forward_into(NULL, &fi, &y.fast, &hn.fast, lstm ? &cn.fast : NULL, &saved.fast, &st),
                     FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_rnn_forward_into(NULL, &ri, &y.ref, &hn.ref, lstm ? &cn.ref : NULL, &saved.ref, &st),
                     FX_OK);
    FX_CK_OK(st);
    pair *outs[] = {&y, &hn, &cn, &saved};
    const char *onames[] = {"y", "h_n", "c_n", "saved"};
    for (int i = 0; i < 4; i++)
        if (outs[i]->fast.buffer) {
            snprintf(w2, sizeof w2, "%s: %s", what, onames[i]);
            pair_compare(outs[i], tol, w2);
        }
    /* the backward from each path's own forward */
    pair dy = {0}, dhn = {0}, dcn = {0}, dx, dh0 = {0}, dc0 = {0}, dw_ih[3], dw_hh[3], db_ih[3], db_hh[3];
    memset(db_ih, 0, sizeof db_ih);
    memset(db_hh, 0, sizeof db_hh);
    if (k->opts & R_DY)
        pair_make(&dy, k->type, 3, yd, -1.0, 1.0);
    if (k->opts & R_DHN) {
        pair_make(&dhn, FX_F32, 3, sd, -1.0, 1.0);
        if (lstm)
            pair_make(&dcn, FX_F32, 3, sd, -1.0, 1.0);
    }
    pair_poisoned(&dx, k->type, 3, (int64_t[3]){k->B, k->L, k->input});
    if (s.h0.fast.buffer)
        pair_poisoned(&dh0, FX_F32, 3, sd);
    if (s.c0.fast.buffer)
        pair_poisoned(&dc0, k->type, 3, sd);
    fx_rnn_layer_grads fgl[3], rgl[3];
    for (int64_t l = 0; l < k->layers; l++) {
        pair_poisoned(&dw_ih[l], k->type, 2, s.w_ih[l].fast.dims);
        pair_poisoned(&dw_hh[l], k->type, 2, s.w_hh[l].fast.dims);
        if (k->opts & R_BIAS) {
            pair_poisoned(&db_ih[l], k->type, 1, s.b_ih[l].fast.dims);
            pair_poisoned(&db_hh[l], FX_F32, 1, s.b_hh[l].fast.dims);
        }
        fgl[l] = (fx_rnn_layer_grads){&dw_ih[l].fast, &dw_hh[l].fast, db_ih[l].fast.buffer ? &db_ih[l].fast : NULL,
                                      db_hh[l].fast.buffer ? &db_hh[l].fast : NULL};
        rgl[l] = (fx_rnn_layer_grads){&dw_ih[l].ref, &dw_hh[l].ref, db_ih[l].ref.buffer ? &db_ih[l].ref : NULL,
                                      db_hh[l].ref.buffer ? &db_hh[l].ref : NULL};
    }
    fx_rnn_grad_outs fg = {&dx.fast, dh0.fast.buffer ? &dh0.fast : NULL, dc0.fast.buffer ? &dc0.fast : NULL, fgl};
    fx_rnn_grad_outs rg = {&dx.ref, dh0.ref.buffer ? &dh0.ref : NULL, dc0.ref.buffer ? &dc0.ref : NULL, rgl};
    ck_assert_int_eq(fx_op_rnn_backward_into(NULL, &fi, &saved.fast, dy.fast.buffer ? &dy.fast : NULL,
                                             dhn.fast.buffer ? &dhn.fast : NULL, dcn.fast.buffer ? &dcn.fast : NULL,
                                             &fg, &st),
                     FX_OK);
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_rnn_backward_into(NULL, &ri, &saved.ref, dy.ref.buffer ? &dy.ref : NULL,
                                             dhn.ref.buffer ? &dhn.ref : NULL, dcn.ref.buffer ? &dcn.ref : NULL, &rg,
                                             &st),
                     FX_OK);
    FX_CK_OK(st);
    pair *grads[] = {&dx, &dh0, &dc0};
    const char *gnames[] = {"dx", "dh0", "dc0"};
    for (int i = 0; i < 3; i++)
        if (grads[i]->fast.buffer) {
            snprintf(w2, sizeof w2, "%s: %s", what, gnames[i]);
            pair_compare(grads[i], tol, w2);
            pair_release(grads[i]);
        }
    for (int64_t l = 0; l < k->layers; l++) {
        pair *lg[] = {&dw_ih[l], &dw_hh[l], &db_ih[l], &db_hh[l]};
        const char *lnames[] = {"dw_ih", "dw_hh", "db_ih", "db_hh"};
        for (int i = 0; i < 4; i++)
            if (lg[i]->fast.buffer) {
                snprintf(w2, sizeof w2, "%s: layer %lld %s", what, (long long)l, lnames[i]);
                pair_compare(lg[i], tol, w2);
                pair_release(lg[i]);
            }
    }
    pair *rest[] = {&y, &hn, &cn, &saved, &dy, &dhn, &dcn};
    for (int i = 0; i < 7; i++)
        if (rest[i]->fast.buffer)
            pair_release(rest[i]);
    rnn_release(&s);
}

/* Three steps from one state on both paths. */
static void rnn_check_step(const rnn_case *k)
{
    const bool lstm = k->cell == FX_RNN_LSTM;
    const int64_t sd[3] = {k->layers, k->B, k->H}, yd[2] = {k->B, k->H};
    pair h, c = {0};
    pair_make(&h, FX_F32, 3, sd, -1.0, 1.0);
    if (lstm)
        pair_make(&c, FX_F32, 3, sd, -1.0, 1.0);
    fx_status st;
    fx_status_clear(&st);
    for (int t = 0; t < 3; t++) {
        rnn_set s;
        rnn_make(k, &s, true);
        fx_rnn_inputs fi = {k->cell, k->layers, s.fl, &s.x.fast, NULL, NULL, 0};
        fx_rnn_inputs ri = {k->cell, k->layers, s.rl, &s.x.ref, NULL, NULL, 0};
        pair y;
        pair_poisoned(&y, k->type, 2, yd);
        ck_assert_int_eq(fx_op_rnn_step_into(NULL, &fi, &h.fast, lstm ? &c.fast : NULL, &y.fast, &st), FX_OK);
        FX_CK_OK(st);
        ck_assert_int_eq(fx_op_rnn_step_into(NULL, &ri, &h.ref, lstm ? &c.ref : NULL, &y.ref, &st), FX_OK);
        FX_CK_OK(st);
        char what[160];
        snprintf(what, sizeof what, "%s step %d layers %lld B%lld in %lld H%lld %s", lstm ? "lstm" : "gru", t,
                 (long long)k->layers, (long long)k->B, (long long)k->input, (long long)k->H, fx_dtype_name(k->type));
        pair_compare(&y, tol_of(k->type), what);
        pair_compare(&h, tol_of(k->type), what);
        if (lstm)
            pair_compare(&c, tol_of(k->type), what);
        pair_release(&y);
        rnn_release(&s);
    }
    pair_release(&h);
    if (lstm)
        pair_release(&c);
}

static const int64_t rnn_shapes[][5] = {
    /* layers, B, L, input, H */
    {1, 1, 1, 1, 1}, {2, 3, 5, 7, 6}, {1, 2, 33, 17, 16}, {2, 1, 4, 3, 300}, {3, 4, 9, 5, 5}, {1, 5, 2, 64, 67},
};

START_TEST(rnn_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const unsigned opt_sets[] = {R_DY, R_BIAS | R_H0 | R_DHN | R_DY, R_DHN, R_BIAS | R_DY};
    int count = 0;
    for (int cell = 0; cell < FX_RNN_CELL_COUNT; cell++)
        for (size_t si = 0; si < sizeof rnn_shapes / sizeof rnn_shapes[0]; si++)
            for (int ti = 0; ti < 3; ti++)
                for (int oi = 0; oi < 4; oi++) {
                    if (ti > 0 && oi != (int)(si % 4) && oi != 1)
                        continue;
                    const int64_t *sh = rnn_shapes[si];
                    rnn_case k = {cell, sh[0], sh[1], sh[2], sh[3], sh[4], types[ti], opt_sets[oi]};
                    rnn_check(&k);
                    count++;
                }
    fprintf(stderr, "fast rnn: %d cases against the oracle\n", count);
}
END_TEST

START_TEST(rnn_steps_against_oracle)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 3, 5, 7}, {2, 1, 512, 512}, {1, 4, 17, 257}};
    for (int cell = 0; cell < FX_RNN_CELL_COUNT; cell++)
        for (int si = 0; si < 4; si++)
            for (int ti = 0; ti < 3; ti++) {
                rnn_case k = {cell, shapes[si][0], shapes[si][1], 1, shapes[si][2], shapes[si][3], types[ti],
                              si % 2 ? R_BIAS : 0};
                rnn_check_step(&k);
            }
}
END_TEST

/* ---- optimizers ---- */

/* A tensor's values as f64 (for a state's own tensors). The updates'
 * terms (parameters, gradients, their moments) are of order one, so an
 * element whose terms nearly cancel (a one-element tensor's momentum
 * 0.9 * m + g near zero, say) may differ by f32's rounding of the terms:
 * the comparison passes at `tol` relative to the result or, per element,
 * to terms of size one. NaN never passes. */
static void compare_tensors(const fx_tensor *fast, const fx_tensor *ref, double tol, const char *what)
{
    double *got = fx_test_read(fast), *want = fx_test_read(ref);
    const int64_t n = fast->numel;
    double err = fx_l2(want, n) == 0.0 ? fx_l2(got, n) : fx_rel_l2(got, want, n);
    const double per_element = n ? fx_l2_diff(got, want, n) / sqrt((double)n) : 0.0;
    free(got);
    free(want);
    ck_assert_msg(err <= tol || per_element <= tol, "%s: rel-L2 %.3g > %.3g, per element %.3g (seed %llu)", what,
                  err, tol, per_element, (unsigned long long)fx_test_seed());
}

typedef struct optim_case {
    fx_optim_kind kind;
    fx_dtype param, grad;
    bool clip, amsgrad, maximize, nesterov, momentum, nonfinite;
} optim_case;

static void optim_check(const optim_case *c)
{
    /* three tensors: one element, an odd size, and more than two chunks */
    const int64_t sizes[3] = {1, 1001, 2 * FX_OPTIM_CHUNK + 77};
    pair p[3], g[3];
    fx_tensor fp[3], rp[3], fg[3], rg[3];
    for (int i = 0; i < 3; i++) {
        pair_make(&p[i], c->param, 1, &sizes[i], -1.0, 1.0);
        fp[i] = p[i].fast, rp[i] = p[i].ref;
    }
    fx_optim_hyper h = fx_optim_default_hyper(c->kind);
    h.lr = 0.01;
    h.clip = c->clip;
    h.max_grad_norm = 0.5;
    h.skip_nonfinite = c->nonfinite;
    h.amsgrad = c->amsgrad;
    h.maximize = c->maximize;
    h.nesterov = c->nesterov;
    h.momentum = c->momentum ? 0.9 : 0.0;
    h.weight_decay = 0.01;
    fx_optim_config cfg = {h, c->param != FX_F32};
    fx_optim_state *sf, *sr;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_optim_init(c->kind, fp, 3, &cfg, &sf, &st), FX_OK);
    ck_assert_int_eq(fx_op_optim_init(c->kind, rp, 3, &cfg, &sr, &st), FX_OK);
    char what[160];
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < 3; i++) {
            pair_make(&g[i], c->grad, 1, &sizes[i], -2.0, 2.0);
            if (c->nonfinite && step == 2)
                fx_store_f64(g[i].fast.data, c->grad, 0, NAN), fx_store_f64(g[i].ref.data, c->grad, 0, NAN);
            fg[i] = g[i].fast, rg[i] = g[i].ref;
        }
        ck_assert_int_eq(fx_op_optim_step(sf, c->kind, fp, 3, fg, 3, &h, &st), FX_OK);
        FX_CK_OK(st);
        ck_assert_int_eq(fx_op_optim_step(sr, c->kind, rp, 3, rg, 3, &h, &st), FX_OK);
        fx_optim_info fi, ri;
        ck_assert_int_eq(fx_op_optim_info(sf, &fi, &st), FX_OK);
        ck_assert_int_eq(fx_op_optim_info(sr, &ri, &st), FX_OK);
        ck_assert_int_eq(fi.step, ri.step);
        ck_assert_int_eq(fi.skipped, ri.skipped);
        ck_assert_msg(fabs(fi.grad_norm - ri.grad_norm) <= 1e-5 * fabs(ri.grad_norm) || (isnan(fi.grad_norm) && isnan(ri.grad_norm)),
                      "grad norm %g against %g", fi.grad_norm, ri.grad_norm);
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "%s %s/%s clip%d ams%d max%d nest%d mom%d step %d tensor %d",
                     c->kind == FX_OPTIM_ADAMW ? "adamw" : "sgd", fx_dtype_name(c->param), fx_dtype_name(c->grad),
                     c->clip, c->amsgrad, c->maximize, c->nesterov, c->momentum, step, i);
            compare_tensors(&fp[i], &rp[i], tol_of(c->param), what);
            if (sf->master)
                compare_tensors(&sf->master_t[i], &sr->master_t[i], 1e-5, what);
            if (sf->buf0[i].buffer)
                compare_tensors(&sf->buf0[i], &sr->buf0[i], 1e-5, what);
            if (sf->buf1[i].buffer)
                compare_tensors(&sf->buf1[i], &sr->buf1[i], 1e-5, what);
            if (sf->buf2[i].buffer)
                compare_tensors(&sf->buf2[i], &sr->buf2[i], 1e-5, what);
            pair_release(&g[i]);
        }
    }
    fx_optim_state_free(sf);
    fx_optim_state_free(sr);
    for (int i = 0; i < 3; i++)
        pair_release(&p[i]);
}

START_TEST(optim_against_oracle)
{
    const optim_case cases[] = {
        {FX_OPTIM_ADAMW, FX_F32, FX_F32, false, false, false, false, false, false},
        {FX_OPTIM_ADAMW, FX_F32, FX_BF16, true, true, false, false, false, true},
        {FX_OPTIM_ADAMW, FX_BF16, FX_BF16, true, false, true, false, false, false},
        {FX_OPTIM_ADAMW, FX_F16, FX_F32, false, true, false, false, false, true},
        {FX_OPTIM_SGD, FX_F32, FX_F32, false, false, false, false, false, false},
        {FX_OPTIM_SGD, FX_F32, FX_F16, true, false, true, false, true, true},
        {FX_OPTIM_SGD, FX_BF16, FX_BF16, false, false, false, true, true, false},
        {FX_OPTIM_SGD, FX_F16, FX_F16, true, false, false, false, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        optim_check(&cases[i]);
}
END_TEST

/* ---- NaN, repeats, concurrent callers ---- */

START_TEST(nan_never_passes)
{
    /* A NaN in one step's input reaches that channel's later states. */
    lr_case c = {FX_LINREC_MINGRU, 2, 9, 40, FX_F32, false, false, false, false, false};
    lr_set s;
    fx_linrec_inputs fin, rin;
    lr_make(&c, &s, &fin, &rin, c.L);
    ((float *)s.seq[0].fast.data)[3 * 40 + 7] = NAN;
    int64_t d3[3] = {c.B, c.L, c.H};
    pair h;
    pair_poisoned(&h, FX_F32, 3, d3);
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_linrec_forward_into(NULL, &fin, 0, &h.fast, NULL, &st), FX_OK);
    const float *hv = h.fast.data;
    for (int64_t t = 3; t < c.L; t++)
        ck_assert_msg(isnan(hv[t * 40 + 7]), "step %lld: NaN lost", (long long)t);
    ck_assert(!isnan(hv[2 * 40 + 7]) && !isnan(hv[3 * 40 + 8]));
    double *got = fx_test_read(&h.fast);
    ck_assert(isinf(fx_rel_l2(got, got, h.fast.numel)));
    free(got);
    pair_release(&h);
    lr_release(&s);
}
END_TEST

typedef struct caller {
    const fx_linrec_inputs *in;
    fx_tensor h, state;
    int rc;
} caller;

static void *call_forward(void *arg)
{
    caller *c = arg;
    fx_status st;
    fx_status_clear(&st);
    c->rc = fx_op_linrec_forward(c->in, false, 0, &c->h, &c->state, &st);
    return NULL;
}

START_TEST(repeats_identical_and_callers_concurrent)
{
    /* Large enough to use the pool; tiny ones run inline. */
    const int64_t shapes[][3] = {{4, 256, 512}, {1, 1, 1}, {1, 32, 512}};
    for (int si = 0; si < 3; si++) {
        lr_case c = {FX_LINREC_MINGRU, shapes[si][0], shapes[si][1], shapes[si][2], FX_F32, false, false, true, false,
                     false};
        lr_set s;
        fx_linrec_inputs fin, rin;
        lr_make(&c, &s, &fin, &rin, c.L);
        caller one = {&fin, {0}, {0}, 0};
        call_forward(&one);
        ck_assert_int_eq(one.rc, FX_OK);
        caller many[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            many[i] = (caller){&fin, {0}, {0}, 0};
            ck_assert_int_eq(pthread_create(&th[i], NULL, call_forward, &many[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            ck_assert_int_eq(many[i].rc, FX_OK);
            ck_assert_msg(memcmp(many[i].h.data, one.h.data, one.h.nbytes) == 0,
                          "caller %d of shape %d: results differ", i, si);
            fx_tensor_release(&many[i].h);
        }
        fx_tensor_release(&one.h);
        lr_release(&s);
    }
}
END_TEST

START_TEST(devices_name_their_path)
{
    fx_device *fast = fx_cpu_device(), *ref = fx_test_oracle();
    ck_assert_ptr_ne(fast, ref);
    ck_assert_str_eq(fast->label, "cpu");
    ck_assert_str_eq(ref->label, "cpu:reference");
    fx_device_info info;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_device_query(fast, &info, &st), FX_OK);
    ck_assert_ptr_nonnull(strstr(info.name, "fast"));
    ck_assert_int_eq(info.threads, fx_pool_threads());
    ck_assert_int_eq(fx_device_query(ref, &info, &st), FX_OK);
    ck_assert_ptr_nonnull(strstr(info.name, "reference"));
}
END_TEST

Suite *fx_suite_fast(void)
{
    Suite *s = suite_create("fast");
    TCase *tc = tcase_create("the CPU fast path against the oracle");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, approximations_within_bounds);
    tcase_add_test(tc, devices_name_their_path);
    tcase_add_test(tc, linrec_against_oracle);
    tcase_add_test(tc, linrec_steps_against_oracle);
    tcase_add_test(tc, ssm_against_oracle);
    tcase_add_test(tc, ssm_steps_against_oracle);
    tcase_add_test(tc, linear_against_oracle);
    tcase_add_test(tc, conv_against_oracle);
    tcase_add_test(tc, conv_steps_against_oracle);
    tcase_add_test(tc, norm_against_oracle);
    tcase_add_test(tc, rnn_against_oracle);
    tcase_add_test(tc, rnn_steps_against_oracle);
    tcase_add_test(tc, optim_against_oracle);
    tcase_add_test(tc, nan_never_passes);
    tcase_add_test(tc, repeats_identical_and_callers_concurrent);
    suite_add_tcase(s, tc);
    return s;
}
