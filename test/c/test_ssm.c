/* Selective scan: hand-computed cases, the device under test against the
 * CPU reference (f64) over a sweep of awkward shapes, split scans and
 * single steps against one call, CPU gradients against central finite
 * differences, device gradients against the CPU's, saved contexts, and
 * every bad input with its message.
 *
 * On cpu the sweeps compare the backend against the naive loops in this
 * file (an independent implementation); on cuda against the CPU backend on
 * the same inputs (their values rounded to the type under test, the
 * reference computing in f64 on f64 copies). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"
#include "core/ops.h"
#include "core/op.h"
#include "core/ssm.h"
#include "cpu/cpu.h"
#include "fusex_ssm.h"
#include "testutil.h"

enum {
    OPT_D = 1,
    OPT_Z = 2,
    OPT_BIAS = 4,
    OPT_SOFTPLUS = 8,
    OPT_H0 = 16,
    OPT_RANK4 = 32, /* b, c as [batch, seqlen, groups, dstate] even for one group */
    OPT_ALL = OPT_D | OPT_Z | OPT_BIAS | OPT_SOFTPLUS | OPT_H0,
};

typedef struct spec {
    int64_t batch, seqlen, dim, dstate, groups;
    unsigned opts;
} spec;

/* ---- host inputs (f64, rounded to the types under test) ---- */

typedef struct host_inputs {
    spec s;
    double *x, *dt, *a, *b, *c, *d, *z, *bias, *h0;
} host_inputs;

static int64_t n_btd(const spec *s) { return s->batch * s->seqlen * s->dim; }
static int64_t n_bc(const spec *s) { return s->batch * s->seqlen * s->groups * s->dstate; }
static int64_t n_state(const spec *s) { return s->batch * s->dim * s->dstate; }

static double *alloc_f64(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static double round_to(fx_dtype t, double v)
{
    char buf[8];
    fx_store_f64(buf, t, 0, v);
    return fx_load_f64(buf, t, 0);
}

static void fill(double *v, int64_t n, double lo, double hi, fx_dtype t)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = round_to(t, fx_rand_uniform(lo, hi));
}

static void fill_normal(double *v, int64_t n, fx_dtype t)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = round_to(t, fx_rand_normal());
}

/* Values in Mamba's ranges: decays exp(delta * a) from ~1 to ~1e-3 per step
 * with deltas of 0.01 to 1.5. Options not in s.opts stay NULL. */
static void host_random(host_inputs *h, spec s, fx_dtype type, fx_dtype param_type)
{
    memset(h, 0, sizeof *h);
    h->s = s;
    int64_t btd = n_btd(&s), bc = n_bc(&s), D = s.dim, N = s.dstate;
    h->x = alloc_f64(btd);
    h->dt = alloc_f64(btd);
    h->a = alloc_f64(D * N);
    h->b = alloc_f64(bc);
    h->c = alloc_f64(bc);
    fill_normal(h->x, btd, type);
    if (s.opts & OPT_SOFTPLUS)
        fill(h->dt, btd, -4.0, 1.0, type);
    else
        fill(h->dt, btd, 0.01, 0.6, type);
    fill(h->a, D * N, -3.0, -0.05, param_type);
    fill_normal(h->b, bc, type);
    fill_normal(h->c, bc, type);
    if (s.opts & OPT_D) {
        h->d = alloc_f64(D);
        fill_normal(h->d, D, param_type);
    }
    if (s.opts & OPT_Z) {
        h->z = alloc_f64(btd);
        fill_normal(h->z, btd, type);
    }
    if (s.opts & OPT_BIAS) {
        h->bias = alloc_f64(D);
        fill(h->bias, D, -1.0, 0.5, param_type);
        if (!(s.opts & OPT_SOFTPLUS)) /* keep deltas positive without softplus */
            for (int64_t i = 0; i < D; i++)
                h->bias[i] = round_to(param_type, fx_rand_uniform(0.0, 0.3));
    }
    if (s.opts & OPT_H0) {
        h->h0 = alloc_f64(n_state(&s));
        fill_normal(h->h0, n_state(&s), param_type);
    }
}

static void host_free(host_inputs *h)
{
    double *all[] = {h->x, h->dt, h->a, h->b, h->c, h->d, h->z, h->bias, h->h0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* ---- device tensors ---- */

typedef struct dev_inputs {
    fx_tensor x, dt, a, b, c, d, z, bias, h0;
    fx_ssm_inputs in;
} dev_inputs;

static void upload(fx_device *dev, fx_dtype t, int rank, const int64_t *dims, const double *v,
                   fx_tensor *out, const fx_tensor **slot)
{
    memset(out, 0, sizeof *out);
    *slot = NULL;
    if (!v)
        return;
    fx_test_tensor(dev, t, rank, dims, v, out);
    *slot = out;
}

static void dev_upload(fx_device *dev, fx_dtype type, fx_dtype param_type, const host_inputs *h,
                       dev_inputs *t)
{
    const spec *s = &h->s;
    int64_t xd[3] = {s->batch, s->seqlen, s->dim}, ad[2] = {s->dim, s->dstate};
    int64_t bd4[4] = {s->batch, s->seqlen, s->groups, s->dstate};
    int64_t bd3[3] = {s->batch, s->seqlen, s->dstate}, ch[1] = {s->dim};
    int64_t sd[3] = {s->batch, s->dim, s->dstate};
    bool rank4 = s->groups > 1 || (s->opts & OPT_RANK4);
    memset(t, 0, sizeof *t);
    upload(dev, type, 3, xd, h->x, &t->x, &t->in.x);
    upload(dev, type, 3, xd, h->dt, &t->dt, &t->in.dt);
    upload(dev, param_type, 2, ad, h->a, &t->a, &t->in.a);
    upload(dev, type, rank4 ? 4 : 3, rank4 ? bd4 : bd3, h->b, &t->b, &t->in.b);
    upload(dev, type, rank4 ? 4 : 3, rank4 ? bd4 : bd3, h->c, &t->c, &t->in.c);
    upload(dev, param_type, 1, ch, h->d, &t->d, &t->in.d);
    upload(dev, type, 3, xd, h->z, &t->z, &t->in.z);
    upload(dev, param_type, 1, ch, h->bias, &t->bias, &t->in.dt_bias);
    upload(dev, param_type, 3, sd, h->h0, &t->h0, &t->in.h0);
    t->in.dt_softplus = (s->opts & OPT_SOFTPLUS) != 0;
}

static void dev_release(dev_inputs *t)
{
    fx_tensor *all[] = {&t->x, &t->dt, &t->a, &t->b, &t->c, &t->d, &t->z, &t->bias, &t->h0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
}

/* ---- the forward that keeps a context and its backward, through the op
 * layer's descriptions (core/op.h) as the NIF runs them ---- */

enum { IN_X, IN_DT, IN_A, IN_B, IN_C, IN_D, IN_Z, IN_DT_BIAS, IN_H0, IN_SAVED, IN_DY, IN_DSTATE };

/* One gradient per input; no buffer for options that were not given. */
typedef struct ssm_grads {
    fx_tensor x, dt, a, b, c, d, z, dt_bias, h0;
} ssm_grads;

static void ssm_grads_release(ssm_grads *g)
{
    fx_tensor *all[] = {&g->x, &g->dt, &g->a, &g->b, &g->c, &g->d, &g->z, &g->dt_bias, &g->h0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
}

/* Runs the forward: y and, when asked, the final state; with `ctx`
 * non-NULL also keeps a context (fx_op_ctx_free). On failure nothing is
 * left allocated. */
static int forward_ctx(const fx_ssm_inputs *in, bool return_state, fx_tensor *y, fx_tensor *state,
                       fx_op_ctx **ctx, fx_status *st)
{
    const fx_op_desc *d = fx_op_find("selective_scan_fwd");
    fx_op_call c;
    fx_op_call_init(&c, d, in->x->device);
    const fx_tensor *t[] = {in->x, in->dt, in->a, in->b, in->c, in->d, in->z, in->dt_bias, in->h0};
    for (int i = 0; i <= IN_H0; i++)
        c.in[i] = t[i];
    c.attrs[fx_op_attr_index(d, "dt_softplus")] = in->dt_softplus;
    c.attrs[fx_op_attr_index(d, "has_d")] = in->d != NULL;
    c.attrs[fx_op_attr_index(d, "has_z")] = in->z != NULL;
    c.attrs[fx_op_attr_index(d, "has_dt_bias")] = in->dt_bias != NULL;
    c.attrs[fx_op_attr_index(d, "has_h0")] = in->h0 != NULL;
    c.attrs[fx_op_attr_index(d, "return_state")] = return_state;
    c.attrs[fx_op_attr_index(d, "save")] = ctx && d->saves_on(c.dev);
    fx_tensor outs[FX_OP_MAX_IO];
    if (ctx)
        *ctx = NULL;
    if (fx_op_run(&c, outs, st) || (ctx && fx_op_ctx_new(&c, ctx, st))) {
        for (int r = 0; r < FX_OP_MAX_IO; r++)
            fx_tensor_release(&outs[r]);
        return st->code;
    }
    *y = outs[0];
    *state = outs[1];
    fx_tensor_release(&outs[2]); /* the saved states: the context keeps them */
    return FX_OK;
}

/* The gradients of every input given to the forward, from dy and the
 * optional gradient of the final state. */
static int backward_ctx(const fx_op_ctx *ctx, const fx_tensor *dy, const fx_tensor *dstate, ssm_grads *g,
                        fx_status *st)
{
    const fx_tensor *cotangents[FX_OP_MAX_IO] = {0};
    cotangents[IN_DY] = dy;
    cotangents[IN_DSTATE] = dstate;
    fx_op_call c;
    fx_tensor outs[FX_OP_MAX_IO];
    memset(g, 0, sizeof *g);
    if (fx_op_ctx_backward(ctx, cotangents, &c, st) || fx_op_run(&c, outs, st))
        return st->code;
    fx_tensor *all[] = {&g->x, &g->dt, &g->a, &g->b, &g->c, &g->d, &g->z, &g->dt_bias, &g->h0};
    for (int i = 0; i <= IN_H0; i++)
        *all[i] = outs[i];
    return FX_OK;
}

/* ---- runners ---- */

typedef struct fwd_out {
    double *y, *state; /* state NULL unless asked */
} fwd_out;

static void fwd_out_free(fwd_out *o)
{
    free(o->y);
    free(o->state);
}

/* The backend's forward into outputs poisoned with NaN, so that an element
 * it forgets to write fails the comparison. */
static fwd_out forward_poisoned(fx_device *dev, const dev_inputs *t, bool want_state)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_dims n;
    ck_assert_int_eq(fx_ssm_check_forward(&t->in, &n, &st), FX_OK);
    fx_tensor y, state;
    int64_t sd[3] = {n.batch, n.dim, n.dstate};
    fx_test_poisoned(dev, t->x.dtype, 3, t->x.dims, &y);
    if (want_state)
        fx_test_poisoned(dev, fx_ssm_state_dtype(t->x.dtype), 3, sd, &state);
    fx_ssm_fwd_args args = {
        .n = n, .x = t->in.x, .dt = t->in.dt, .a = t->in.a, .b = t->in.b, .c = t->in.c,
        .d = t->in.d, .z = t->in.z, .dt_bias = t->in.dt_bias, .h0 = t->in.h0,
        .dt_softplus = t->in.dt_softplus, .y = &y, .state = want_state ? &state : NULL,
    };
    fx_exec ex;
    ck_assert_ptr_nonnull(fx_exec_resolve(dev, NULL, &ex, &st));
    dev->backend->ssm->forward(&ex, &args, &st);
    FX_CK_OK(st);
    fwd_out o = {fx_test_read(&y), want_state ? fx_test_read(&state) : NULL};
    fx_tensor_release(&y);
    if (want_state)
        fx_tensor_release(&state);
    return o;
}

/* The same inputs as f64 tensors on the CPU, through the op layer. */
static fwd_out forward_reference(const host_inputs *h, bool want_state)
{
    dev_inputs t;
    dev_upload(fx_test_oracle(), FX_F64, FX_F64, h, &t);
    fwd_out o = forward_poisoned(fx_test_oracle(), &t, want_state);
    dev_release(&t);
    return o;
}

/* delta of element i (channel d): dt + dt_bias, through softplus if asked. */
static double naive_delta(const host_inputs *h, int64_t i, int64_t d)
{
    double u = h->dt[i] + (h->bias ? h->bias[d] : 0.0);
    return (h->s.opts & OPT_SOFTPLUS) ? (u > 20 ? u : log(1.0 + exp(u))) : u;
}

/* The states h_0..h_L of one channel, into hist[(L + 1) * N]. */
static void channel_states(const host_inputs *h, int64_t b, int64_t d, double *hist)
{
    const spec *s = &h->s;
    int64_t L = s->seqlen, D = s->dim, N = s->dstate, G = s->groups, g = d / (D / G);
    for (int64_t k = 0; k < N; k++)
        hist[k] = h->h0 ? h->h0[(b * D + d) * N + k] : 0.0;
    for (int64_t t = 0; t < L; t++) {
        int64_t i = (b * L + t) * D + d, row = ((b * L + t) * G + g) * N;
        double delta = naive_delta(h, i, d);
        for (int64_t k = 0; k < N; k++)
            hist[(t + 1) * N + k] = exp(delta * h->a[d * N + k]) * hist[t * N + k] +
                                    delta * h->b[row + k] * h->x[i];
    }
}

/* An independent forward: the equations as plain loops, one channel at a
 * time. The cpu backend is checked against it. */
static fwd_out forward_naive(const host_inputs *h)
{
    const spec *s = &h->s;
    int64_t B = s->batch, L = s->seqlen, D = s->dim, N = s->dstate, G = s->groups;
    fwd_out o = {alloc_f64(n_btd(s)), alloc_f64(n_state(s))};
    double *hist = alloc_f64((L + 1) * N);
    for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++) {
            int64_t g = d / (D / G);
            channel_states(h, b, d, hist);
            memcpy(o.state + (b * D + d) * N, hist + L * N, sizeof(double) * (size_t)N);
            for (int64_t t = 0; t < L; t++) {
                int64_t i = (b * L + t) * D + d, row = ((b * L + t) * G + g) * N;
                double y = 0.0;
                for (int64_t k = 0; k < N; k++)
                    y += h->c[row + k] * hist[(t + 1) * N + k];
                if (h->d)
                    y += h->d[d] * h->x[i];
                if (h->z)
                    y *= h->z[i] / (1.0 + exp(-h->z[i]));
                o.y[i] = y;
            }
        }
    free(hist);
    return o;
}

static double type_tolerance(fx_dtype t)
{
    return t == FX_F64 ? 1e-12 : t == FX_F32 ? 1e-5 : 1e-2;
}

static const char *spec_text(const spec *s, fx_dtype t)
{
    static char buf[160];
    snprintf(buf, sizeof buf, "B%lld L%lld D%lld N%lld G%lld opts %#x %s", (long long)s->batch,
             (long long)s->seqlen, (long long)s->dim, (long long)s->dstate, (long long)s->groups,
             s->opts, fx_dtype_name(t));
    return buf;
}

#define CHECK_CLOSE(what, got, want, n, tol, s, t)                                          \
    do {                                                                                    \
        double err_ = fx_rel_l2((got), (want), (n));                                        \
        ck_assert_msg(err_ <= (tol), "%s: rel-L2 %.3g > %.3g for %s (seed %llu)", (what),   \
                      err_, (double)(tol), spec_text((s), (t)),                             \
                      (unsigned long long)fx_test_seed());                                  \
    } while (0)

/* How far the outputs may move when each decay exp(delta * a) carries a
 * relative error of one f32 ulp: the first-order sensitivities, with every
 * term's magnitude, of y and of the final state. A channel that remembers
 * K steps (decays near 1 - 1/K) amplifies its decays' rounding ~K-fold: any
 * f32 implementation, however exact its exp, differs from the f64 oracle
 * by ~K * 6e-8 there (e.g. delta 0.02, a -0.05: K ~ 1000, 6e-5), so the
 * 1e-5 of the f32 sweep is judged on top of this floor. */
static fwd_out decay_sensitivity(const host_inputs *h)
{
    const spec *s = &h->s;
    int64_t B = s->batch, L = s->seqlen, D = s->dim, N = s->dstate;
    const double ulp = 0x1p-23;
    fwd_out o = {alloc_f64(n_btd(s)), alloc_f64(n_state(s))};
    double *hist = alloc_f64((L + 1) * N), *sens = alloc_f64(N);
    for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++) {
            int64_t g = d / (D / s->groups);
            channel_states(h, b, d, hist);
            memset(sens, 0, sizeof(double) * (size_t)N);
            for (int64_t t = 0; t < L; t++) {
                int64_t i = (b * L + t) * D + d, row = ((b * L + t) * s->groups + g) * N;
                double delta = naive_delta(h, i, d), y = 0.0;
                for (int64_t k = 0; k < N; k++) {
                    double decay = exp(delta * h->a[d * N + k]);
                    sens[k] = decay * (sens[k] + ulp * fabs(hist[t * N + k]));
                    y += fabs(h->c[row + k]) * sens[k];
                }
                o.y[i] = h->z ? y * fabs(h->z[i] / (1.0 + exp(-h->z[i]))) : y;
            }
            memcpy(o.state + (b * D + d) * N, sens, sizeof(double) * (size_t)N);
        }
    free(hist);
    free(sens);
    return o;
}

/* ||got - want|| <= tol ||want|| + 4 ||floor||: the decays' exp may be off
 * by a few ulps (ex2.approx: 2), each moving the outputs by `floor`. */
static void check_conditioned(const char *what, const double *got, const double *want,
                              const double *floor, int64_t n, double tol, const spec *s,
                              fx_dtype t)
{
    double diff = fx_l2_diff(got, want, n);
    double scale = fx_l2(want, n), bound = tol * scale + 4.0 * fx_l2(floor, n);
    ck_assert_msg(diff <= bound,
                  "%s: ||got - want|| %.3g > %.3g (rel-L2 %.3g, tolerance %.3g, decay floor %.3g) for %s (seed %llu)",
                  what, diff, bound, scale > 0 ? diff / scale : diff, tol, fx_l2(floor, n),
                  spec_text(s, t), (unsigned long long)fx_test_seed());
}

/* Forward on the device under test vs the reference for one case. */
static void check_forward_case(spec s, fx_dtype type, fx_dtype param_type)
{
    fx_device *dev = fx_test_device();
    host_inputs h;
    host_random(&h, s, type, param_type);
    dev_inputs t;
    dev_upload(dev, type, param_type, &h, &t);
    fwd_out got = forward_poisoned(dev, &t, true);
    fwd_out want = dev->kind == FX_DEVICE_CPU ? forward_naive(&h) : forward_reference(&h, true);
    double tol = type_tolerance(type);
    if (dev->kind == FX_DEVICE_CPU && type == FX_F64)
        tol = 1e-10; /* two f64 implementations summing in different orders */
    if (type == FX_F64) {
        CHECK_CLOSE("y", got.y, want.y, n_btd(&s), tol, &s, type);
        CHECK_CLOSE("state", got.state, want.state, n_state(&s), tol, &s, type);
    } else { /* f32 arithmetic inside; the state is f32 whatever the input type */
        fwd_out floor = decay_sensitivity(&h);
        check_conditioned("y", got.y, want.y, floor.y, n_btd(&s), tol, &s, type);
        check_conditioned("state", got.state, want.state, floor.state, n_state(&s), 1e-5, &s, type);
        fwd_out_free(&floor);
    }
    fwd_out_free(&got);
    fwd_out_free(&want);
    dev_release(&t);
    host_free(&h);
}

/* ---- hand-computed cases ---- */

/* Runs the forward of a tiny case given as literal f64 arrays. */
static fwd_out forward_literal(fx_device *dev, fx_dtype type, spec s, double *x, double *dt,
                               double *a, double *b, double *c, double *d, double *z,
                               double *bias)
{
    host_inputs h = {.s = s, .x = x, .dt = dt, .a = a, .b = b, .c = c, .d = d, .z = z, .bias = bias};
    dev_inputs t;
    dev_upload(dev, type, type, &h, &t);
    fwd_out o = forward_poisoned(dev, &t, true);
    dev_release(&t);
    return o;
}

START_TEST(hand_computed_cases)
{
    fx_device *dev = fx_test_device();
    fx_dtype types[2] = {FX_F32, FX_F64};
    int ntypes = dev->kind == FX_DEVICE_CPU ? 2 : 1;
    for (int k = 0; k < ntypes; k++) {
        fx_dtype t = types[k];
        double tol = t == FX_F64 ? 1e-14 : 1e-6;
        /* One channel, one state, no options:
         *   h1 = 0.5*2*1 = 1            y1 = 1*h1 + 0        = 1
         *   h2 = e^-1 * 1 + 1*1*2       y2 = 3*h2            = 6 + 3/e */
        {
            spec s = {1, 2, 1, 1, 1, 0};
            double x[] = {1, 2}, dt[] = {0.5, 1.0}, a[] = {-1}, b[] = {2, 1}, c[] = {1, 3};
            fwd_out o = forward_literal(dev, t, s, x, dt, a, b, c, NULL, NULL, NULL);
            double y[] = {1.0, 6.0 + 3.0 * exp(-1.0)}, hs[] = {2.0 + exp(-1.0)};
            fx_assert_close(o.y, y, 2, tol);
            fx_assert_close(o.state, hs, 1, tol);
            fwd_out_free(&o);
        }
        /* With d = 0.5 and gate z = [0, 1]: silu(0) = 0, silu(1) = 1/(1+e^-1):
         *   y1 = (1 + 0.5*1) * 0 = 0     y2 = (6 + 3/e + 0.5*2) / (1 + 1/e) */
        {
            spec s = {1, 2, 1, 1, 1, OPT_D | OPT_Z};
            double x[] = {1, 2}, dt[] = {0.5, 1.0}, a[] = {-1}, b[] = {2, 1}, c[] = {1, 3};
            double d[] = {0.5}, z[] = {0, 1};
            fwd_out o = forward_literal(dev, t, s, x, dt, a, b, c, d, z, NULL);
            double y[] = {0.0, (7.0 + 3.0 * exp(-1.0)) / (1.0 + exp(-1.0))};
            fx_assert_close(o.y, y, 2, tol);
            fwd_out_free(&o);
        }
        /* softplus(0 + ln(e - 1)) = ln(e) = 1, so delta = 1; two states:
         *   h[0] = 1*1*3 = 3, h[1] = 1*(-1)*3 = -3;  y = 2*3 + 0.5*(-3) = 4.5 */
        {
            spec s = {1, 1, 1, 2, 1, OPT_BIAS | OPT_SOFTPLUS};
            double x[] = {3}, dt[] = {0}, a[] = {-0.5, -2}, b[] = {1, -1}, c[] = {2, 0.5};
            double bias[] = {log(exp(1.0) - 1.0)};
            fwd_out o = forward_literal(dev, t, s, x, dt, a, b, c, NULL, NULL, bias);
            double y[] = {4.5}, hs[] = {3.0, -3.0};
            fx_assert_close(o.y, y, 1, tol);
            fx_assert_close(o.state, hs, 2, tol);
            fwd_out_free(&o);
        }
        /* Two groups, one channel each: channel 0 reads b[.,.,0,.] = 2, channel
         * 1 reads b[.,.,1,.] = 5; x = [1, 1], delta = 1, c = [1, 1]:
         *   y = [2, 5] */
        {
            spec s = {1, 1, 2, 1, 2, 0};
            double x[] = {1, 1}, dt[] = {1, 1}, a[] = {-1, -1}, b[] = {2, 5}, c[] = {1, 1};
            fwd_out o = forward_literal(dev, t, s, x, dt, a, b, c, NULL, NULL, NULL);
            double y[] = {2.0, 5.0};
            fx_assert_close(o.y, y, 2, tol);
            fwd_out_free(&o);
        }
    }
}
END_TEST

/* ---- sweeps ---- */

static const int64_t sweep_seqlen[] = {1, 2, 31, 32, 33, 257, 2049, 4097};
static const int64_t sweep_dim[] = {1, 3, 64, 130};
static const int64_t sweep_dstate[] = {1, 4, 16, 64};
static const unsigned sweep_opts[] = {
    0, OPT_ALL, OPT_D, OPT_Z, OPT_BIAS | OPT_SOFTPLUS, OPT_SOFTPLUS | OPT_RANK4, OPT_H0 | OPT_Z,
    OPT_D | OPT_BIAS | OPT_H0,
};
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* The i-th case of the sweep over seqlen x dim x dstate, with batch,
 * options and groups rotating so that every value meets every other. */
static spec sweep_case(int i)
{
    int nd = COUNT(sweep_dim), nn = COUNT(sweep_dstate);
    spec s;
    s.seqlen = sweep_seqlen[i / (nd * nn)];
    s.dim = sweep_dim[(i / nn) % nd];
    s.dstate = sweep_dstate[i % nn];
    s.batch = 1 + i % 4;
    s.opts = sweep_opts[(i / 3) % COUNT(sweep_opts)];
    s.groups = s.dim % 4 == 0 && i % 2 == 0 ? 4 : 1;
    return s;
}

static const spec quick_cases[] = {
    {2, 33, 64, 16, 4, OPT_ALL},
    {1, 1, 3, 1, 1, OPT_Z},
    {3, 257, 130, 64, 1, OPT_D | OPT_BIAS | OPT_SOFTPLUS},
    {1, 32, 64, 4, 1, OPT_H0 | OPT_RANK4},
    {4, 70, 8, 256, 2, OPT_ALL},
    {2, 40, 64, 128, 2, OPT_ALL}, /* cuda: the sliced forward */
};

/* On the CPU emulator of the CUDA kernels (test/emu) the sweeps keep every
 * length, dim, dstate and option but leave out the cases past 2^21
 * state-steps (batch x seqlen x dim x dstate): 14 long and wide ones that
 * hold ~96 % of the forward sweep's work, the f64 reference's above all. */
static bool too_big_to_emulate(spec s)
{
    return fx_test_emulated() && (int64_t)s.batch * s.seqlen * s.dim * s.dstate > (1 << 21);
}

START_TEST(forward_sweep_f32)
{
    fx_device *dev = fx_test_device();
    /* 4 and 8 chunks of 16 steps: the warp-specialized forward's staging
     * loop, unrolled by its ring of 4, ends after a whole round (the sweep's
     * lengths never give a multiple of 4 chunks) */
    check_forward_case((spec){2, 64, 128, 16, 4, OPT_ALL}, FX_F32, FX_F32); /* 32 channels a group */
    check_forward_case((spec){1, 128, 32, 16, 1, OPT_D | OPT_Z}, FX_F32, FX_F32);
    if (fx_test_quick()) {
        for (int i = 0; i < COUNT(quick_cases); i++)
            check_forward_case(quick_cases[i], FX_F32, FX_F32);
        return;
    }
    int total = COUNT(sweep_seqlen) * COUNT(sweep_dim) * COUNT(sweep_dstate);
    for (int i = 0; i < total; i++) {
        spec s = sweep_case(i);
        /* On cpu the reference is the single-threaded naive loop: keep to
         * the short sequences there, plus one long thin one. */
        if (dev->kind == FX_DEVICE_CPU && (s.seqlen > 257 || s.dim > 64 || s.dstate > 16))
            continue;
        if (too_big_to_emulate(s))
            continue;
        check_forward_case(s, FX_F32, FX_F32);
    }
    if (dev->kind == FX_DEVICE_CPU)
        check_forward_case((spec){2, 4097, 3, 4, 1, OPT_ALL}, FX_F32, FX_F32);
    /* dstate above 64 up to the CUDA limit, uneven groups of channels */
    check_forward_case((spec){2, 40, 12, 128, 3, OPT_ALL}, FX_F32, FX_F32);
    check_forward_case((spec){1, 37, 6, 256, 2, OPT_D | OPT_Z}, FX_F32, FX_F32);
    check_forward_case((spec){1, 5, 130, 100, 2, OPT_SOFTPLUS}, FX_F32, FX_F32);
    /* on cuda the sliced forward: whole groups of 32 channels, dstate a
     * multiple of 16 above 32 (but f32 at 64; 16-bit inputs from 32), as
     * slices of 16 states whose parts of y are summed (odd numbers of slices
     * at 48 and 80) */
    check_forward_case((spec){2, 100, 64, 128, 2, OPT_ALL}, FX_F32, FX_F32);
    check_forward_case((spec){1, 37, 32, 256, 1, OPT_D | OPT_Z}, FX_F32, FX_F32);
    check_forward_case((spec){3, 70, 96, 80, 1, OPT_H0 | OPT_SOFTPLUS | OPT_BIAS}, FX_F32, FX_F32);
    check_forward_case((spec){1, 1, 32, 48, 1, OPT_ALL}, FX_F32, FX_F32);
}
END_TEST

/* 16-bit inputs (f32 arithmetic inside), parameters in f32 or in the input
 * type; f64 on cpu. */
START_TEST(forward_sweep_other_types)
{
    fx_device *dev = fx_test_device();
    spec cases[] = {
        {2, 33, 64, 16, 4, OPT_ALL}, {1, 257, 130, 16, 1, OPT_D | OPT_Z},
        {3, 31, 3, 4, 1, OPT_SOFTPLUS | OPT_BIAS}, {1, 2049, 64, 64, 1, OPT_ALL},
        {4, 1, 64, 1, 4, OPT_H0}, {1, 64, 32, 16, 1, OPT_ALL},
        /* dstate above 64: on cuda two channels a tile up to 128 (4-byte
         * rows of x: the cp.async path for whole tiles, the plain one for
         * the odd groups of 3 channels), one above, whose 2-byte rows take
         * the plain path; b and c copied by rows (100: element by element) */
        {2, 40, 12, 128, 3, OPT_ALL}, {1, 21, 6, 128, 2, OPT_ALL}, {1, 37, 6, 256, 2, OPT_D | OPT_Z},
        {1, 5, 130, 100, 2, OPT_SOFTPLUS},
        {2, 40, 64, 128, 2, OPT_ALL}, {1, 33, 32, 256, 1, OPT_D | OPT_Z}, /* sliced */
        {2, 35, 64, 32, 2, OPT_ALL}, /* sliced, 2 slices */
    };
    int count = fx_test_quick() ? 2 : COUNT(cases);
    for (int i = 0; i < count; i++) {
        if (dev->kind == FX_DEVICE_CPU && cases[i].seqlen > 257)
            cases[i].seqlen = 129;
        check_forward_case(cases[i], FX_BF16, FX_F32);
        check_forward_case(cases[i], FX_F16, FX_F16);
        check_forward_case(cases[i], FX_BF16, FX_BF16);
        if (dev->kind == FX_DEVICE_CPU)
            check_forward_case(cases[i], FX_F64, FX_F64);
    }
}
END_TEST

/* Scanning [0, split) and then [split, L) from the carried state equals one
 * scan over [0, L). */
static void check_split(spec s, int64_t split, fx_dtype type)
{
    fx_device *dev = fx_test_device();
    /* parameters (h0 among them: the first half's state) in f32 for 16-bit
     * inputs, so that the carried state is not rounded on its way */
    fx_dtype ptype = type == FX_F64 ? FX_F64 : FX_F32;
    host_inputs h;
    host_random(&h, s, type, ptype);
    dev_inputs whole;
    dev_upload(dev, type, ptype, &h, &whole);
    fwd_out one = forward_poisoned(dev, &whole, true);

    /* The two halves as host arrays, the second starting from the state. */
    spec s1 = s, s2 = s;
    s1.seqlen = split;
    s2.seqlen = s.seqlen - split;
    s2.opts |= OPT_H0;
    host_inputs h1 = h, h2 = h;
    h1.s = s1;
    h2.s = s2;
    int64_t B = s.batch, L = s.seqlen, D = s.dim, GN = s.groups * s.dstate;
    double *parts[2][5];
    double *src[5] = {h.x, h.dt, h.z, h.b, h.c};
    int64_t width[5] = {D, D, D, GN, GN};
    for (int k = 0; k < 5; k++) {
        parts[0][k] = src[k] ? alloc_f64(B * split * width[k]) : NULL;
        parts[1][k] = src[k] ? alloc_f64(B * (L - split) * width[k]) : NULL;
        if (!src[k])
            continue;
        for (int64_t b = 0; b < B; b++) {
            memcpy(parts[0][k] + b * split * width[k], src[k] + b * L * width[k],
                   sizeof(double) * (size_t)(split * width[k]));
            memcpy(parts[1][k] + b * (L - split) * width[k], src[k] + (b * L + split) * width[k],
                   sizeof(double) * (size_t)((L - split) * width[k]));
        }
    }
    h1.x = parts[0][0], h1.dt = parts[0][1], h1.z = parts[0][2], h1.b = parts[0][3], h1.c = parts[0][4];
    h2.x = parts[1][0], h2.dt = parts[1][1], h2.z = parts[1][2], h2.b = parts[1][3], h2.c = parts[1][4];
    dev_inputs first;
    dev_upload(dev, type, ptype, &h1, &first);
    fwd_out o1 = forward_poisoned(dev, &first, true);
    h2.h0 = o1.state;
    dev_inputs second;
    dev_upload(dev, type, ptype, &h2, &second);
    fwd_out o2 = forward_poisoned(dev, &second, true);

    double *joined = alloc_f64(B * L * D);
    for (int64_t b = 0; b < B; b++) {
        memcpy(joined + b * L * D, o1.y + b * split * D, sizeof(double) * (size_t)(split * D));
        memcpy(joined + (b * L + split) * D, o2.y + b * (L - split) * D,
               sizeof(double) * (size_t)((L - split) * D));
    }
    double tol = type == FX_F64 ? 1e-12 : type == FX_F32 ? 1e-5 : 1e-2;
    CHECK_CLOSE("split y", joined, one.y, B * L * D, tol, &s, type);
    CHECK_CLOSE("split state", o2.state, one.state, n_state(&s), type == FX_F64 ? 1e-12 : 1e-5, &s,
                type);
    free(joined);
    for (int k = 0; k < 5; k++) {
        free(parts[0][k]);
        free(parts[1][k]);
    }
    fwd_out_free(&one);
    fwd_out_free(&o1);
    fwd_out_free(&o2);
    dev_release(&whole);
    dev_release(&first);
    dev_release(&second);
    host_free(&h);
}

START_TEST(split_scan_equals_one_call)
{
    fx_device *dev = fx_test_device();
    fx_dtype t = dev->kind == FX_DEVICE_CPU ? FX_F64 : FX_F32;
    check_split((spec){2, 65, 64, 16, 4, OPT_ALL}, 33, t);
    check_split((spec){1, 2, 3, 4, 1, OPT_D | OPT_Z}, 1, t);
    check_split((spec){3, 100, 130, 64, 1, OPT_SOFTPLUS | OPT_BIAS}, 64, FX_F32);
    check_split((spec){2, 90, 64, 128, 2, OPT_ALL}, 41, FX_F32); /* sliced */
    check_split((spec){1, 70, 32, 32, 1, OPT_ALL}, 29, FX_BF16); /* sliced, 2 slices */
    if (!fx_test_quick())
        check_split((spec){2, 2049, 64, 16, 1, OPT_ALL}, 1000, FX_F32);
}
END_TEST

/* ---- single steps ---- */

/* Steps a state through every time step of `h` on `dev`, returning y as
 * [batch, seqlen, dim] and leaving the final state in *state_out. */
static double *run_steps(fx_device *dev, const host_inputs *h, fx_dtype type, double **state_out)
{
    const spec *s = &h->s;
    int64_t B = s->batch, L = s->seqlen, D = s->dim, N = s->dstate, G = s->groups;
    fx_dtype state_type = fx_ssm_state_dtype(type);
    int64_t sd[3] = {B, D, N}, xd[2] = {B, D}, bd[3] = {B, G, N}, ad[2] = {D, N}, ch[1] = {D};
    double *init = alloc_f64(B * D * N);
    if (h->h0)
        memcpy(init, h->h0, sizeof(double) * (size_t)(B * D * N));
    fx_tensor state, a, d = {0}, bias = {0};
    fx_test_tensor(dev, state_type, 3, sd, init, &state);
    fx_test_tensor(dev, type, 2, ad, h->a, &a);
    if (h->d)
        fx_test_tensor(dev, type, 1, ch, h->d, &d);
    if (h->bias)
        fx_test_tensor(dev, type, 1, ch, h->bias, &bias);
    double *y = alloc_f64(B * L * D);
    double *xs = alloc_f64(B * D), *dts = alloc_f64(B * D), *zs = alloc_f64(B * D);
    double *bs = alloc_f64(B * G * N), *cs = alloc_f64(B * G * N);
    for (int64_t t = 0; t < L; t++) {
        for (int64_t b = 0; b < B; b++) {
            int64_t row = (b * L + t) * D, brow = (b * L + t) * G * N;
            memcpy(xs + b * D, h->x + row, sizeof(double) * (size_t)D);
            memcpy(dts + b * D, h->dt + row, sizeof(double) * (size_t)D);
            if (h->z)
                memcpy(zs + b * D, h->z + row, sizeof(double) * (size_t)D);
            memcpy(bs + b * G * N, h->b + brow, sizeof(double) * (size_t)(G * N));
            memcpy(cs + b * G * N, h->c + brow, sizeof(double) * (size_t)(G * N));
        }
        fx_tensor tx, tdt, tz = {0}, tb, tc, ty;
        fx_test_tensor(dev, type, 2, xd, xs, &tx);
        fx_test_tensor(dev, type, 2, xd, dts, &tdt);
        if (h->z)
            fx_test_tensor(dev, type, 2, xd, zs, &tz);
        /* one group as [batch, dstate], several as [batch, groups, dstate] */
        int64_t bd2[2] = {B, N};
        fx_test_tensor(dev, type, G > 1 ? 3 : 2, G > 1 ? bd : bd2, bs, &tb);
        fx_test_tensor(dev, type, G > 1 ? 3 : 2, G > 1 ? bd : bd2, cs, &tc);
        fx_test_poisoned(dev, type, 2, xd, &ty);
        fx_status st;
        fx_status_clear(&st);
        fx_ssm_step_args args = {
            .n = {B, 1, D, N, G}, .state = &state, .x = &tx, .dt = &tdt, .a = &a, .b = &tb, .c = &tc,
            .d = h->d ? &d : NULL, .z = h->z ? &tz : NULL, .dt_bias = h->bias ? &bias : NULL,
            .dt_softplus = (s->opts & OPT_SOFTPLUS) != 0, .y = &ty,
        };
        fx_exec ex;
        ck_assert_ptr_nonnull(fx_exec_resolve(dev, NULL, &ex, &st));
        dev->backend->ssm->step(&ex, &args, &st);
        FX_CK_OK(st);
        double *yt = fx_test_read(&ty);
        for (int64_t b = 0; b < B; b++)
            memcpy(y + (b * L + t) * D, yt + b * D, sizeof(double) * (size_t)D);
        free(yt);
        fx_tensor *all[] = {&tx, &tdt, &tz, &tb, &tc, &ty};
        for (int k = 0; k < 6; k++)
            fx_tensor_release(all[k]);
    }
    *state_out = fx_test_read(&state);
    fx_tensor *all[] = {&state, &a, &d, &bias};
    for (int k = 0; k < 4; k++)
        fx_tensor_release(all[k]);
    free(init);
    free(xs);
    free(dts);
    free(zs);
    free(bs);
    free(cs);
    return y;
}

static void check_steps(spec s, fx_dtype type)
{
    fx_device *dev = fx_test_device();
    host_inputs h;
    host_random(&h, s, type, type);
    dev_inputs t;
    dev_upload(dev, type, type, &h, &t);
    fwd_out one = forward_poisoned(dev, &t, true);
    double *state;
    double *y = run_steps(dev, &h, type, &state);
    double tol = type == FX_F64 ? 1e-12 : type == FX_F32 ? 1e-5 : 1e-2;
    CHECK_CLOSE("steps y", y, one.y, n_btd(&s), tol, &s, type);
    CHECK_CLOSE("steps state", state, one.state, n_state(&s), type == FX_F64 ? 1e-12 : 1e-5, &s, type);
    free(y);
    free(state);
    fwd_out_free(&one);
    dev_release(&t);
    host_free(&h);
}

START_TEST(steps_equal_one_call)
{
    fx_device *dev = fx_test_device();
    check_steps((spec){2, 9, 64, 16, 4, OPT_ALL}, FX_F32);
    check_steps((spec){1, 5, 3, 1, 1, OPT_SOFTPLUS}, FX_F32);
    check_steps((spec){3, 4, 130, 64, 2, OPT_D | OPT_Z}, FX_F32);
    check_steps((spec){1, 3, 16, 256, 1, OPT_ALL}, FX_F32);
    check_steps((spec){1, 5, 32, 128, 1, OPT_ALL}, FX_F32); /* the sliced forward */
    check_steps((spec){2, 6, 64, 16, 1, OPT_ALL}, FX_BF16);
    if (dev->kind == FX_DEVICE_CPU)
        check_steps((spec){2, 7, 5, 3, 1, OPT_ALL}, FX_F64);
}
END_TEST

/* ---- gradients ---- */

typedef struct grads_out {
    double *g[9]; /* x, dt, a, b, c, d, z, dt_bias, h0; NULL when not given */
} grads_out;

static void grads_free(grads_out *g)
{
    for (int k = 0; k < 9; k++)
        free(g->g[k]);
}

/* The backward through the op layer on `dev` (forward with a saved
 * context, then backward); dy and dstate as f64 host arrays. */
/* With it set, backward_on passes dy as a view one element into a larger
 * tensor, so that its rows do not start on 16 bytes (as a view of foreign
 * memory may not). */
static bool dy_shifted;

static grads_out backward_on(fx_device *dev, const host_inputs *h, fx_dtype type,
                             fx_dtype param_type, const double *dy, const double *dstate)
{
    const spec *s = &h->s;
    dev_inputs t;
    dev_upload(dev, type, param_type, h, &t);
    fx_status st;
    fx_status_clear(&st);
    fx_tensor y, state, tdy, tds = {0}, whole = {0};
    fx_op_ctx *ctx;
    ck_assert_int_eq(forward_ctx(&t.in, false, &y, &state, &ctx, &st), FX_OK);
    int64_t xd[3] = {s->batch, s->seqlen, s->dim}, sd[3] = {s->batch, s->dim, s->dstate};
    if (dy_shifted) {
        int64_t n = n_btd(s), wd[1] = {n + 1};
        double *vals = alloc_f64(n + 1);
        memcpy(vals + 1, dy, sizeof(double) * (size_t)n);
        fx_test_tensor(dev, type, 1, wd, vals, &whole);
        free(vals);
        tdy = whole;
        tdy.data = (char *)whole.data + fx_dtype_size(type);
        tdy.rank = 3;
        memcpy(tdy.dims, xd, sizeof xd);
        tdy.numel = n;
        tdy.nbytes = (size_t)n * fx_dtype_size(type);
    } else {
        fx_test_tensor(dev, type, 3, xd, dy, &tdy);
    }
    if (dstate)
        fx_test_tensor(dev, param_type, 3, sd, dstate, &tds);
    /* The inputs may go: the context holds its own references. */
    dev_release(&t);
    ssm_grads g;
    backward_ctx(ctx, &tdy, dstate ? &tds : NULL, &g, &st);
    FX_CK_OK(st);
    grads_out out;
    fx_tensor *gt[9] = {&g.x, &g.dt, &g.a, &g.b, &g.c, &g.d, &g.z, &g.dt_bias, &g.h0};
    for (int k = 0; k < 9; k++)
        out.g[k] = gt[k]->buffer ? fx_test_read(gt[k]) : NULL;
    ssm_grads_release(&g);
    fx_op_ctx_free(ctx);
    fx_tensor_release(&y);
    fx_tensor_release(dy_shifted ? &whole : &tdy);
    fx_tensor_release(&tds);
    return out;
}

/* sum(y * dy) + sum(state * dstate), in f64 on the CPU. */
static double loss_of(const host_inputs *h, const double *dy, const double *dstate)
{
    fwd_out o = forward_reference(h, true);
    double sum = 0.0;
    for (int64_t i = 0; i < n_btd(&h->s); i++)
        sum += o.y[i] * dy[i];
    for (int64_t i = 0; dstate && i < n_state(&h->s); i++)
        sum += o.state[i] * dstate[i];
    fwd_out_free(&o);
    return sum;
}

static const char *const input_names[9] = {"x", "dt", "a", "b", "c", "d", "z", "dt_bias", "h0"};

/* Central differences for every element of every input (up to FD_MAX per
 * input, then a random sample), against the CPU backward in f64. */
#define FD_MAX 400
static void check_gradients(spec s, bool with_dstate)
{
    host_inputs h;
    host_random(&h, s, FX_F64, FX_F64);
    double *dy = alloc_f64(n_btd(&s)), *dstate = with_dstate ? alloc_f64(n_state(&s)) : NULL;
    fill_normal(dy, n_btd(&s), FX_F64);
    if (dstate)
        fill_normal(dstate, n_state(&s), FX_F64);
    grads_out g = backward_on(fx_test_oracle(), &h, FX_F64, FX_F64, dy, dstate);
    double *inputs[9] = {h.x, h.dt, h.a, h.b, h.c, h.d, h.z, h.bias, h.h0};
    int64_t sizes[9] = {n_btd(&s), n_btd(&s), s.dim * s.dstate, n_bc(&s), n_bc(&s),
                        s.dim, n_btd(&s), s.dim, n_state(&s)};
    const double eps = 1e-5;
    for (int k = 0; k < 9; k++) {
        ck_assert_msg((inputs[k] != NULL) == (g.g[k] != NULL), "gradient of %s %s", input_names[k],
                      inputs[k] ? "missing" : "present but the input was not given");
        if (!inputs[k])
            continue;
        int count = sizes[k] < FD_MAX ? (int)sizes[k] : FD_MAX;
        double fd[FD_MAX], an[FD_MAX];
        for (int j = 0; j < count; j++) {
            int64_t e = sizes[k] <= FD_MAX ? j : (int64_t)fx_rand_uniform(0, (double)sizes[k]);
            double keep = inputs[k][e];
            inputs[k][e] = keep + eps;
            double up = loss_of(&h, dy, dstate);
            inputs[k][e] = keep - eps;
            double down = loss_of(&h, dy, dstate);
            inputs[k][e] = keep;
            fd[j] = (up - down) / (2 * eps);
            an[j] = g.g[k][e];
        }
        double err = fx_rel_l2(an, fd, count);
        ck_assert_msg(err <= 1e-6, "d%s: rel-L2 %.3g against finite differences for %s (seed %llu)",
                      input_names[k], err, spec_text(&s, FX_F64), (unsigned long long)fx_test_seed());
    }
    grads_free(&g);
    free(dy);
    free(dstate);
    host_free(&h);
}

START_TEST(cpu_gradients_match_finite_differences)
{
    check_gradients((spec){2, 5, 4, 3, 1, OPT_ALL}, true);
    check_gradients((spec){1, 7, 4, 2, 2, OPT_D | OPT_Z}, false);
    check_gradients((spec){2, 4, 3, 2, 1, OPT_SOFTPLUS | OPT_BIAS | OPT_H0}, true);
    check_gradients((spec){1, 6, 2, 1, 1, 0}, false);
    check_gradients((spec){2, 3, 4, 2, 4, OPT_ALL | OPT_RANK4}, true);
    /* past the CPU backward's 64-step checkpoints */
    check_gradients((spec){1, 150, 2, 2, 1, OPT_ALL}, true);
}
END_TEST

/* ---- an independent backward for the gradients that are sums ----
 *
 * a, d and dt_bias sum terms over batch and time, b and c over the channels
 * of a group. A float sum of terms t_i is off by about eps * ||t||, however
 * small the sum: when the terms cancel (one element when dim is 1), its
 * relative error says nothing of the kernel. This backward, plain loops in
 * f64 like forward_naive, gives each such gradient with the squares of its
 * terms, so that the check can judge the error against max(|sum|, ||t||). */
enum { G_A = 2, G_B = 3, G_C = 4, G_D = 5, G_BIAS = 7 };
static const int sum_grad_index[] = {G_A, G_B, G_C, G_D, G_BIAS};

typedef struct sum_grads {
    double *g[9], *sq[9]; /* indexed as input_names; NULL where not a sum */
} sum_grads;

static void sum_add(sum_grads *r, int k, int64_t e, double term)
{
    r->g[k][e] += term;
    r->sq[k][e] += term * term;
}

/* Walks one channel backwards from dstate, adding every term. */
static void channel_backward(const host_inputs *h, int64_t b, int64_t d, const double *dy,
                             const double *dstate, const double *hist, double *dh, sum_grads *r)
{
    const spec *s = &h->s;
    int64_t L = s->seqlen, D = s->dim, N = s->dstate, G = s->groups, g = d / (D / G);
    for (int64_t k = 0; k < N; k++)
        dh[k] = dstate ? dstate[(b * D + d) * N + k] : 0.0;
    for (int64_t t = L - 1; t >= 0; t--) {
        int64_t i = (b * L + t) * D + d, row = ((b * L + t) * G + g) * N;
        double u = h->dt[i] + (h->bias ? h->bias[d] : 0.0), x = h->x[i];
        double delta = naive_delta(h, i, d);
        double dsoftplus = (s->opts & OPT_SOFTPLUS) && u <= 20 ? 1.0 / (1.0 + exp(-u)) : 1.0;
        double gate = h->z ? h->z[i] / (1.0 + exp(-h->z[i])) : 1.0, gy = dy[i] * gate;
        double ddelta = 0.0;
        for (int64_t k = 0; k < N; k++) {
            double a = h->a[d * N + k], decay = exp(delta * a), prev = hist[t * N + k];
            dh[k] += h->c[row + k] * gy;
            sum_add(r, G_A, d * N + k, dh[k] * decay * delta * prev);
            sum_add(r, G_B, row + k, dh[k] * delta * x);
            sum_add(r, G_C, row + k, gy * hist[(t + 1) * N + k]);
            ddelta += dh[k] * (a * decay * prev + h->b[row + k] * x);
            dh[k] *= decay;
        }
        sum_add(r, G_D, d, gy * x);
        sum_add(r, G_BIAS, d, ddelta * dsoftplus);
    }
}

static sum_grads backward_sums_naive(const host_inputs *h, const double *dy, const double *dstate)
{
    const spec *s = &h->s;
    int64_t sizes[9] = {0, 0, s->dim * s->dstate, n_bc(s), n_bc(s), s->dim, 0, s->dim, 0};
    sum_grads r = {0};
    for (int j = 0; j < 5; j++) {
        int k = sum_grad_index[j];
        r.g[k] = alloc_f64(sizes[k]);
        r.sq[k] = alloc_f64(sizes[k]);
    }
    double *hist = alloc_f64((s->seqlen + 1) * s->dstate), *dh = alloc_f64(s->dstate);
    for (int64_t b = 0; b < s->batch; b++)
        for (int64_t d = 0; d < s->dim; d++) {
            channel_states(h, b, d, hist);
            channel_backward(h, b, d, dy, dstate, hist, dh, &r);
        }
    free(hist);
    free(dh);
    return r;
}

static void sum_grads_free(sum_grads *r)
{
    for (int k = 0; k < 9; k++) {
        free(r->g[k]);
        free(r->sq[k]);
    }
}

/* ||got - want|| / max(||want||, ||terms||): rel-L2, but a sum that
 * cancelled is judged against the size of what it summed. */
static double sum_rel_l2(const double *got, const double *want, const double *sq, int64_t n)
{
    double diff = 0, ref = 0, terms = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i]))
            return INFINITY;
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        ref += want[i] * want[i];
        terms += sq[i];
    }
    double scale = fmax(ref, terms);
    if (scale == 0)
        return diff == 0 ? 0 : INFINITY;
    return sqrt(diff / scale);
}

/* The device backward against the CPU backward on f64 copies of the same
 * values (on cpu: f32 and 16-bit inputs against f64). */
static void check_backward_case(spec s, fx_dtype type, fx_dtype param_type, bool with_dstate)
{
    fx_device *dev = fx_test_device();
    host_inputs h;
    host_random(&h, s, type, param_type);
    double *dy = alloc_f64(n_btd(&s)), *dstate = with_dstate ? alloc_f64(n_state(&s)) : NULL;
    fill_normal(dy, n_btd(&s), type);
    if (dstate)
        fill_normal(dstate, n_state(&s), param_type);
    grads_out got = backward_on(dev, &h, type, param_type, dy, dstate);
    grads_out want = backward_on(fx_test_oracle(), &h, FX_F64, FX_F64, dy, dstate);
    int64_t sizes[9] = {n_btd(&s), n_btd(&s), s.dim * s.dstate, n_bc(&s), n_bc(&s),
                        s.dim, n_btd(&s), s.dim, n_state(&s)};
    double tol = type_tolerance(type);
    /* The sums' terms, from an independent backward that must agree with
     * the CPU backward first. */
    sum_grads sums = backward_sums_naive(&h, dy, dstate);
    for (int j = 0; j < COUNT(sum_grad_index); j++) {
        int k = sum_grad_index[j];
        if (!want.g[k] || sizes[k] == 0)
            continue;
        double err = sum_rel_l2(want.g[k], sums.g[k], sums.sq[k], sizes[k]);
        ck_assert_msg(err <= 1e-10, "d%s: cpu backward vs plain loops: %.3g for %s (seed %llu)",
                      input_names[k], err, spec_text(&s, FX_F64), (unsigned long long)fx_test_seed());
    }
    /* A sum of n terms in f32 rounds n times: the tolerance of the sums
     * grows with sqrt(n) (beyond 16 terms). */
    double terms[9] = {1, 1, (double)(s.batch * s.seqlen), (double)(s.dim / s.groups),
                       (double)(s.dim / s.groups), (double)(s.batch * s.seqlen), 1,
                       (double)(s.batch * s.seqlen), 1};
    for (int k = 0; k < 9; k++) {
        ck_assert((got.g[k] != NULL) == (want.g[k] != NULL));
        if (!got.g[k] || sizes[k] == 0)
            continue;
        /* Parameters keep their own type: a 16-bit parameter's gradient is
         * rounded to it. */
        bool param = k == 2 || k == 5 || k == 7 || k == 8;
        double t = (param ? fmax(type_tolerance(param_type), tol) : tol) * fmax(1.0, sqrt(terms[k]) / 4);
        double err = sums.sq[k] ? sum_rel_l2(got.g[k], want.g[k], sums.sq[k], sizes[k])
                                : fx_rel_l2(got.g[k], want.g[k], sizes[k]);
        ck_assert_msg(err <= t, "d%s: rel-L2 %.3g > %.3g for %s (seed %llu)", input_names[k], err,
                      t, spec_text(&s, type), (unsigned long long)fx_test_seed());
    }
    sum_grads_free(&sums);
    grads_free(&got);
    grads_free(&want);
    free(dy);
    free(dstate);
    host_free(&h);
}

static const spec backward_quick[] = {
    {2, 70, 64, 16, 4, OPT_ALL},
    {1, 1, 3, 1, 1, OPT_Z},
    {2, 33, 130, 64, 1, OPT_D | OPT_SOFTPLUS | OPT_BIAS},
    {2, 41, 64, 128, 2, OPT_ALL}, /* cuda: states saved by the sliced forward */
};

START_TEST(backward_matches_cpu)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU) {
        /* CPU vs CPU would prove nothing in f64: check the other types'
         * conversions against f64 on small cases. */
        check_backward_case((spec){2, 40, 8, 4, 2, OPT_ALL}, FX_F32, FX_F32, true);
        check_backward_case((spec){1, 20, 6, 3, 1, OPT_ALL}, FX_BF16, FX_F32, false);
        check_backward_case((spec){1, 20, 6, 3, 1, OPT_D | OPT_BIAS}, FX_F16, FX_F16, true);
        return;
    }
    if (fx_test_quick()) {
        for (int i = 0; i < COUNT(backward_quick); i++)
            check_backward_case(backward_quick[i], FX_F32, FX_F32, i % 2 == 0);
        check_backward_case(backward_quick[0], FX_BF16, FX_F32, true);
        return;
    }
    int total = COUNT(sweep_seqlen) * COUNT(sweep_dim) * COUNT(sweep_dstate);
    for (int i = 0; i < total; i++) {
        spec s = sweep_case(i);
        /* every length, but the longest ones only on narrower shapes */
        if ((s.seqlen >= 2049 && s.dim * s.dstate > 64 * 16) || too_big_to_emulate(s))
            continue;
        check_backward_case(s, FX_F32, FX_F32, i % 3 == 0);
    }
    check_backward_case((spec){2, 100, 12, 128, 3, OPT_ALL}, FX_F32, FX_F32, true);
    check_backward_case((spec){1, 45, 6, 256, 2, OPT_ALL}, FX_F32, FX_F32, true);
    /* the sliced backward from states the sliced forward saved 16 steps
     * apart (at 80: 5 slices) */
    check_backward_case((spec){2, 100, 64, 128, 2, OPT_ALL}, FX_F32, FX_F32, true);
    check_backward_case((spec){1, 47, 32, 80, 1, OPT_ALL}, FX_F32, FX_F32, false);
    check_backward_case((spec){1, 40, 64, 128, 1, OPT_ALL}, FX_BF16, FX_F32, true);
    dy_shifted = true; /* (the sliced backward copies such a dy first) */
    check_backward_case((spec){1, 37, 32, 128, 1, OPT_ALL}, FX_F32, FX_F32, false);
    check_backward_case((spec){1, 37, 32, 80, 1, OPT_ALL}, FX_BF16, FX_F32, false);
    check_backward_case((spec){1, 37, 32, 16, 1, OPT_ALL}, FX_F32, FX_F32, false); /* (the plain path) */
    dy_shifted = false;
    /* at 32: 16-bit states the sliced forward saved 16 steps apart, read by
     * the configuration's backward (8 x 4) */
    check_backward_case((spec){2, 50, 64, 32, 2, OPT_ALL}, FX_BF16, FX_F32, true);
    check_backward_case((spec){1, 40, 32, 32, 1, OPT_ALL}, FX_F16, FX_F16, false);
    /* at 64: the tile forward's states 8 steps apart, the configuration's backward */
    check_backward_case((spec){1, 50, 32, 64, 1, OPT_ALL}, FX_BF16, FX_F32, false);
    check_backward_case((spec){2, 33, 32, 48, 1, OPT_ALL}, FX_F32, FX_F32, true);
    check_backward_case((spec){2, 257, 64, 16, 4, OPT_ALL}, FX_BF16, FX_F32, true);
    check_backward_case((spec){2, 257, 64, 16, 1, OPT_ALL}, FX_F16, FX_F16, false);
    check_backward_case((spec){1, 130, 130, 16, 2, OPT_ALL}, FX_BF16, FX_BF16, true);
    /* 16-bit inputs above dstate 64 (as in the forward sweep: at 128 whole
     * tiles and odd groups, plain paths above) */
    check_backward_case((spec){2, 100, 12, 128, 3, OPT_ALL}, FX_BF16, FX_F32, true);
    check_backward_case((spec){1, 21, 6, 128, 2, OPT_ALL}, FX_BF16, FX_BF16, true);
    check_backward_case((spec){1, 45, 6, 256, 2, OPT_ALL}, FX_F16, FX_F16, false);
    check_backward_case((spec){1, 33, 10, 100, 2, OPT_ALL}, FX_BF16, FX_BF16, true);
}
END_TEST

/* ---- contexts, empty shapes, validation ---- */

START_TEST(context_holds_inputs_and_saved_states)
{
    fx_device *dev = fx_test_device();
    spec s = {2, 100, 64, 16, 1, OPT_ALL};
    host_inputs h;
    host_random(&h, s, FX_F32, FX_F32);
    dev_inputs t;
    dev_upload(dev, FX_F32, FX_F32, &h, &t);
    long long before = atomic_load(&dev->allocated);
    fx_status st;
    fx_status_clear(&st);
    fx_tensor y, state;
    fx_op_ctx *ctx;
    ck_assert_int_eq(forward_ctx(&t.in, true, &y, &state, &ctx, &st), FX_OK);
    fx_ssm_dims n = {s.batch, s.seqlen, s.dim, s.dstate, s.groups};
    int64_t every = fx_ssm_save_every(&n, FX_F32);
    int64_t nsaved = dev->backend->ssm->reads_saved ? (s.seqlen + every - 1) / every - 1 : 0;
    size_t saved = (size_t)(s.batch * nsaved * s.dim * s.dstate) * sizeof(float);
    ck_assert_uint_eq(fx_op_ctx_saved_bytes(ctx), saved);
    ck_assert_int_eq(atomic_load(&dev->allocated) - before,
                     (long long)(y.nbytes + state.nbytes + saved));
    /* The inputs stay alive in the context after the caller drops them. */
    fx_buffer *xbuf = t.x.buffer;
    ck_assert_int_eq(atomic_load(&xbuf->refs), 2);
    fx_tensor_release(&y);
    fx_tensor_release(&state);
    fx_op_ctx_free(ctx);
    ck_assert_int_eq(atomic_load(&xbuf->refs), 1);
    ck_assert_int_eq(atomic_load(&dev->allocated), before);
    dev_release(&t);
    host_free(&h);
}
END_TEST

START_TEST(empty_shapes)
{
    fx_device *dev = fx_test_device();
    spec cases[] = {{2, 0, 3, 4, 1, OPT_ALL}, {0, 5, 3, 4, 1, OPT_ALL}, {2, 5, 0, 4, 1, OPT_D | OPT_H0}};
    for (int i = 0; i < COUNT(cases); i++) {
        spec s = cases[i];
        host_inputs h;
        host_random(&h, s, FX_F32, FX_F32);
        dev_inputs t;
        dev_upload(dev, FX_F32, FX_F32, &h, &t);
        fwd_out o = forward_poisoned(dev, &t, true);
        /* seqlen 0: the final state is h0 */
        fwd_out want = forward_naive(&h);
        CHECK_CLOSE("empty state", o.state, want.state, n_state(&s), 0.0, &s, FX_F32);
        fwd_out_free(&o);
        fwd_out_free(&want);
        double *dy = alloc_f64(n_btd(&s)), *ds = alloc_f64(n_state(&s));
        fill_normal(ds, n_state(&s), FX_F32);
        grads_out g = backward_on(dev, &h, FX_F32, FX_F32, dy, ds);
        int64_t sizes[9] = {n_btd(&s), n_btd(&s), s.dim * s.dstate, n_bc(&s), n_bc(&s),
                            s.dim, n_btd(&s), s.dim, n_state(&s)};
        for (int k = 0; k < 9; k++) {
            if (!g.g[k])
                continue;
            if (k == 8) { /* no step ran: dh0 is the final state's gradient */
                CHECK_CLOSE("empty dh0", g.g[8], ds, sizes[8], 0.0, &s, FX_F32);
                continue;
            }
            for (int64_t e = 0; e < sizes[k]; e++) /* nothing to differentiate: zeros */
                ck_assert_msg(g.g[k][e] == 0.0, "d%s[%lld] = %g for %s", input_names[k],
                              (long long)e, g.g[k][e], spec_text(&s, FX_F32));
        }
        grads_free(&g);
        free(dy);
        free(ds);
        dev_release(&t);
        host_free(&h);
    }
}
END_TEST

/* The CPU backend's scratch counts combine dimensions of several tensors
 * (batch of x, dim * dstate of a), which no one shape bounds: where they
 * overflow, or the scratch cannot be had, the op fails with FX_ENOMEM and
 * touches no memory (the tensors here have none). */
START_TEST(cpu_scratch_overflow_is_out_of_memory)
{
    fx_device *cpu = fx_test_oracle();
    fx_exec ex;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(cpu->backend->exec_default(cpu->ordinal, &ex, &st), FX_OK);
    fx_tensor none;
    memset(&none, 0, sizeof none);
    fx_ssm_bwd_args bwd;
    memset(&bwd, 0, sizeof bwd);
    bwd.fwd.n = (fx_ssm_dims){(int64_t)1 << 40, 1, (int64_t)1 << 8, (int64_t)1 << 40, 1};
    ck_assert_int_eq(fx_cpu_ssm_ops.backward(&ex, &bwd, &st), FX_ENOMEM);
    ck_assert_str_eq(st.msg, "out of host memory: the op's scratch does not fit in the address space");
    /* one channel whose states do not fit in memory */
    fx_ssm_fwd_args fwd;
    memset(&fwd, 0, sizeof fwd);
    fwd.n = (fx_ssm_dims){1, 1, 1, (int64_t)1 << 48, 1};
    fwd.x = fwd.dt = fwd.a = fwd.b = fwd.c = fwd.y = &none;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_cpu_ssm_ops.forward(&ex, &fwd, &st), FX_ENOMEM);
    ck_assert_ptr_nonnull(strstr(st.msg, "out of host memory for "));
    ck_assert_ptr_nonnull(strstr(st.msg, " bytes of scratch"));
}
END_TEST

static int alive_calls;
static bool caller_gone(void *arg)
{
    (void)arg;
    alive_calls++;
    return false;
}
static bool caller_here(void *arg)
{
    (void)arg;
    alive_calls++;
    return true;
}

/* A caller that is gone stops the CPU scans early (forward and backward),
 * failing them; one that is still there sees them through. */
START_TEST(cpu_scan_stops_when_its_caller_is_gone)
{
    fx_device *cpu = fx_test_oracle();
    int64_t xd[3] = {1, 4096, 2}, ad[2] = {2, 4}, bd[3] = {1, 4096, 4};
    double *v = calloc(4096 * 4, sizeof(double));
    fx_tensor x, a, b;
    fx_test_tensor(cpu, FX_F32, 3, xd, v, &x);
    fx_test_tensor(cpu, FX_F32, 2, ad, v, &a);
    fx_test_tensor(cpu, FX_F32, 3, bd, v, &b);
    fx_ssm_inputs in = {.x = &x, .dt = &x, .a = &a, .b = &b, .c = &b};
    for (int gone = 1; gone >= 0; gone--) {
        alive_calls = 0;
        fx_cpu_watch_caller(gone ? caller_gone : caller_here, NULL);
        fx_status st;
        fx_status_clear(&st);
        fx_tensor y, state, dy;
        fx_op_ctx *ctx = NULL;
        int rc = forward_ctx(&in, false, &y, &state, &ctx, &st);
        ck_assert_int_ge(alive_calls, 1);
        if (gone) {
            ck_assert_int_eq(rc, FX_EINTERNAL);
            ck_assert_str_eq(st.msg, "cancelled: the process that called selective_scan exited before it finished");
            /* the context of an earlier, complete forward */
            fx_cpu_unwatch_caller();
            fx_status_clear(&st);
            ck_assert_int_eq(forward_ctx(&in, false, &y, &state, &ctx, &st), FX_OK);
            fx_cpu_watch_caller(caller_gone, NULL);
        } else {
            FX_CK_OK(st);
        }
        fx_test_tensor(cpu, FX_F32, 3, xd, v, &dy);
        ssm_grads g;
        alive_calls = 0;
        rc = backward_ctx(ctx, &dy, NULL, &g, &st);
        ck_assert_int_ge(alive_calls, 1);
        if (gone) {
            ck_assert_int_eq(rc, FX_EINTERNAL);
            ck_assert_str_eq(st.msg,
                             "cancelled: the process that called selective_scan_backward exited before it finished");
        } else {
            FX_CK_OK(st);
            ssm_grads_release(&g);
        }
        fx_cpu_unwatch_caller();
        fx_tensor_release(&dy);
        fx_tensor_release(&y);
        fx_op_ctx_free(ctx);
    }
    fx_tensor_release(&x);
    fx_tensor_release(&a);
    fx_tensor_release(&b);
    free(v);
}
END_TEST

/* Runs the forward on modified inputs and expects `msg`. */
static void expect_fwd_error(const fx_ssm_inputs *in, const char *msg)
{
    fx_status st;
    fx_status_clear(&st);
    fx_tensor y, state;
    ck_assert_int_eq(fx_op_ssm_forward(in, true, &y, &state, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, msg);
}

static void tensor_of(fx_device *dev, fx_dtype t, int rank, const int64_t *dims, fx_tensor *out)
{
    double v[4096] = {0};
    fx_test_tensor(dev, t, rank, dims, v, out);
}

START_TEST(validation_messages)
{
    fx_device *dev = fx_test_device();
    spec s = {2, 3, 8, 4, 1, OPT_ALL};
    host_inputs h;
    host_random(&h, s, FX_F32, FX_F32);
    dev_inputs t;
    dev_upload(dev, FX_F32, FX_F32, &h, &t);
    fx_ssm_inputs in;
    fx_tensor bad2, bad3, bad4, badb, ints, bad_a, short_a;
    int64_t d23[2] = {2, 3}, d238[3] = {2, 3, 7}, d4[4] = {2, 3, 3, 4}, db[3] = {2, 3, 5};
    int64_t da[2] = {8, 0}, dshort[2] = {7, 4};
    tensor_of(dev, FX_F32, 2, d23, &bad2);
    tensor_of(dev, FX_F32, 3, d238, &bad3);
    tensor_of(dev, FX_F32, 4, d4, &bad4);
    tensor_of(dev, FX_F32, 3, db, &badb);
    tensor_of(dev, FX_S32, 3, t.x.dims, &ints);
    tensor_of(dev, FX_F32, 2, da, &bad_a);
    tensor_of(dev, FX_F32, 2, dshort, &short_a);

    in = t.in, in.x = &bad2;
    expect_fwd_error(&in, "x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,3}");
    in = t.in, in.x = &ints;
    expect_fwd_error(&in, dev->kind == FX_DEVICE_CPU
                              ? "x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                              : "x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    in = t.in, in.dt = &bad3;
    expect_fwd_error(&in, "dt: expected shape {2,3,8} [batch, seqlen, dim], got {2,3,7}");
    in = t.in, in.dt = &ints;
    expect_fwd_error(&in, "dt: expected type {f,32}, got {s,32}");
    in = t.in, in.a = &short_a;
    expect_fwd_error(&in, "a: expected shape {8,4} [dim, dstate], got {7,4}");
    in = t.in, in.a = &bad_a;
    expect_fwd_error(&in, "a: expected dstate >= 1 [dim, dstate], got shape {8,0}");
    in = t.in, in.b = &bad2;
    expect_fwd_error(&in, "b: expected rank 3 [batch, seqlen, dstate] or rank 4 [batch, seqlen, groups, dstate], got rank 2 shape {2,3}");
    in = t.in, in.b = &badb;
    expect_fwd_error(&in, "b: expected shape {2,3,4} [batch, seqlen, dstate], got {2,3,5}");
    in = t.in, in.b = &bad4, in.c = &bad4;
    expect_fwd_error(&in, "b: expected a number of groups that divides dim 8 [batch, seqlen, groups, dstate], got 3");
    in = t.in, in.c = &badb;
    expect_fwd_error(&in, "c: expected shape {2,3,4} (the shape of b), got {2,3,5}");
    in = t.in, in.d = &short_a;
    expect_fwd_error(&in, "d: expected shape {8} [dim], got {7,4}");
    in = t.in, in.z = &bad3;
    expect_fwd_error(&in, "z: expected shape {2,3,8} [batch, seqlen, dim], got {2,3,7}");
    in = t.in, in.dt_bias = &bad2;
    expect_fwd_error(&in, "dt_bias: expected shape {8} [dim], got {2,3}");
    in = t.in, in.h0 = &bad3;
    expect_fwd_error(&in, "h0: expected shape {2,8,4} [batch, dim, dstate], got {2,3,7}");
    in = t.in, in.h0 = &ints;
    expect_fwd_error(&in, dev->kind == FX_DEVICE_CPU
                              ? "h0: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                              : "h0: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    if (dev->kind != FX_DEVICE_CPU) {
        fx_tensor host, big_a, f64;
        tensor_of(fx_cpu_device(), FX_F32, 3, t.x.dims, &host);
        in = t.in, in.dt = &host;
        expect_fwd_error(&in, "dt: expected a tensor on cuda:0 (where x is), got one on cpu");
        int64_t dbig[2] = {8, 257};
        tensor_of(dev, FX_F32, 2, dbig, &big_a);
        in = t.in, in.a = &big_a;
        expect_fwd_error(&in, "a: expected dstate <= 256 on cuda:0 [dim, dstate], got 257");
        tensor_of(dev, FX_F64, 3, t.x.dims, &f64);
        in = t.in, in.x = &f64;
        expect_fwd_error(&in, "x: expected type {f,32}, {bf,16} or {f,16} on cuda:0 ({f,64} runs on cpu only), got {f,64}");
        fx_tensor_release(&host);
        fx_tensor_release(&big_a);
        fx_tensor_release(&f64);
    }

    /* backward: dy and dstate */
    fx_status st;
    fx_status_clear(&st);
    fx_tensor y, state;
    fx_op_ctx *ctx;
    ck_assert_int_eq(forward_ctx(&t.in, false, &y, &state, &ctx, &st), FX_OK);
    ssm_grads g;
    ck_assert_int_eq(backward_ctx(ctx, &bad3, NULL, &g, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "dy: expected shape {2,3,8} [batch, seqlen, dim], got {2,3,7}");
    fx_status_clear(&st);
    ck_assert_int_eq(backward_ctx(ctx, &t.x, &bad3, &g, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "dstate: expected shape {2,8,4} [batch, dim, dstate], got {2,3,7}");
    fx_tensor_release(&y);
    fx_op_ctx_free(ctx);

    /* step: the state's type and shape, the inputs' ranks */
    int64_t sd[3] = {2, 8, 4}, xd[2] = {2, 8}, bd[2] = {2, 4};
    fx_tensor st16, stw, sx, sdt, sb, sc, sy;
    tensor_of(dev, FX_BF16, 3, sd, &st16);
    tensor_of(dev, FX_F32, 3, d238, &stw);
    tensor_of(dev, FX_F32, 2, xd, &sx);
    tensor_of(dev, FX_F32, 2, xd, &sdt);
    tensor_of(dev, FX_F32, 2, bd, &sb);
    tensor_of(dev, FX_F32, 2, bd, &sc);
    fx_ssm_inputs step = {.x = &sx, .dt = &sdt, .a = &t.a, .b = &sb, .c = &sc};
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_ssm_step(&st16, &step, &sy, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, dev->kind == FX_DEVICE_CPU
                                 ? "state: expected type {f,32} or {f,64}, got {bf,16}"
                                 : "state: expected type {f,32}, got {bf,16}");
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_ssm_step(&stw, &step, &sy, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "state: expected shape {2,8,4} [batch, dim, dstate], got {2,3,7}");
    fx_status_clear(&st);
    step.x = &t.x;
    ck_assert_int_eq(fx_op_ssm_step(&stw, &step, &sy, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "x: expected rank 2 [batch, dim], got rank 3 shape {2,3,8}");
    step.x = &sx;
    step.b = &badb;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_ssm_step(&stw, &step, &sy, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "b: expected shape {2,3,4} [batch, groups, dstate], got {2,3,5}");

    fx_tensor *all[] = {&bad2, &bad3, &bad4, &badb, &ints, &bad_a, &short_a,
                        &st16, &stw, &sx, &sdt, &sb, &sc};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        fx_tensor_release(all[k]);
    dev_release(&t);
    host_free(&h);
}
END_TEST

Suite *fx_suite_ssm(void)
{
    Suite *s = suite_create("ssm");
    TCase *tc = tcase_create("selective scan");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, hand_computed_cases);
    tcase_add_test(tc, forward_sweep_f32);
    tcase_add_test(tc, forward_sweep_other_types);
    tcase_add_test(tc, split_scan_equals_one_call);
    tcase_add_test(tc, steps_equal_one_call);
    tcase_add_test(tc, cpu_gradients_match_finite_differences);
    tcase_add_test(tc, backward_matches_cpu);
    tcase_add_test(tc, context_holds_inputs_and_saved_states);
    tcase_add_test(tc, empty_shapes);
    tcase_add_test(tc, cpu_scratch_overflow_is_out_of_memory);
    tcase_add_test(tc, cpu_scan_stops_when_its_caller_is_gone);
    tcase_add_test(tc, validation_messages);
    suite_add_tcase(s, tc);
    return s;
}
