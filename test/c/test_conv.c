/* causal_conv1d: forward, backward and step through the op layer's `_into`
 * ops into poisoned outputs, against an independent f64 reference written
 * here (dim 1 and 37, widths 1 to 16, sequences of 1, 2, width - 1 and
 * across the CUDA kernels' chunks, every option), CUDA against the CPU
 * backend in every type, a forward split in two (the state carried) and a
 * chain of steps equal to one forward, the CPU's gradients against central
 * differences of its own f64 forward, the allocating forms and their
 * contexts, a caller's context with exactly the queried scratch, empty
 * shapes, and every bad input with its message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/conv.h"
#include "core/ops.h"
#include "fusex_dtype.h"
#include "layers.h"
#include "testutil.h"

enum {
    OPT_BIAS = 1,
    OPT_INIT = 2,    /* an initial state */
    OPT_SILU = 4,
    OPT_DFINAL = 8,  /* the final state returned, and a gradient for it */
    OPT_ALL = 15,
};

typedef struct conv_case {
    int64_t batch, seqlen, dim, width;
    fx_dtype type, w_type;
    unsigned opts;
} conv_case;

static const char *conv_text(const conv_case *c)
{
    static char buf[160];
    snprintf(buf, sizeof buf, "B%lld L%lld D%lld W%lld %s w %s opts %#x", (long long)c->batch, (long long)c->seqlen,
             (long long)c->dim, (long long)c->width, fx_dtype_name(c->type), fx_dtype_name(c->w_type), c->opts);
    return buf;
}

static bool has(const conv_case *c, unsigned opt) { return (c->opts & opt) != 0; }
static int64_t n_x(const conv_case *c) { return c->batch * c->seqlen * c->dim; }
static int64_t n_state(const conv_case *c) { return c->batch * c->dim * (c->width - 1); }

typedef struct conv_host {
    conv_case c;
    double *x, *w, *bias, *init, *dy, *dfinal;
} conv_host;

static conv_host conv_random(conv_case c)
{
    conv_host h = {.c = c};
    h.x = fx_lt_normal(n_x(&c), c.type);
    h.w = fx_lt_uniform(c.dim * c.width, -0.7, 0.7, c.w_type);
    h.bias = fx_lt_uniform(c.dim, -0.5, 0.5, c.w_type);
    h.init = fx_lt_normal(n_state(&c), c.type);
    h.dy = fx_lt_normal(n_x(&c), c.type);
    h.dfinal = fx_lt_normal(n_state(&c), c.type);
    return h;
}

static void conv_host_free(conv_host *h)
{
    double *all[] = {h->x, h->w, h->bias, h->init, h->dy, h->dfinal};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

typedef struct conv_out {
    double *y, *final, *dx, *dw, *db, *dinit;
} conv_out;

static void conv_out_free(conv_out *o)
{
    double *all[] = {o->y, o->final, o->dx, o->dw, o->db, o->dinit};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* ---- an independent reference: the sequence padded in front ---- */

static double ref_sigmoid(double u) { return 1.0 / (1.0 + exp(-u)); }

/* The padded sequence of (b, d): xp[i] = x_{i-(W-1)}, i < L + W - 1. */
static void padded(const conv_host *h, int64_t b, int64_t d, double *xp)
{
    const conv_case *c = &h->c;
    const int64_t W = c->width, L = c->seqlen, D = c->dim;
    for (int64_t i = 0; i < W - 1; i++)
        xp[i] = has(c, OPT_INIT) ? h->init[(b * D + d) * (W - 1) + i] : 0.0;
    for (int64_t t = 0; t < L; t++)
        xp[W - 1 + t] = h->x[(b * L + t) * D + d];
}

static conv_out conv_reference(const conv_host *h)
{
    const conv_case *c = &h->c;
    const int64_t B = c->batch, L = c->seqlen, D = c->dim, W = c->width;
    conv_out o = {fx_lt_alloc(n_x(c)), fx_lt_alloc(n_state(c)), fx_lt_alloc(n_x(c)), fx_lt_alloc(D * W),
                  fx_lt_alloc(D), fx_lt_alloc(n_state(c))};
    double *xp = fx_lt_alloc(L + W), *dxp = fx_lt_alloc(L + W), *g = fx_lt_alloc(L);
    for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++) {
            padded(h, b, d, xp);
            for (int64_t i = 0; i < L + W - 1; i++)
                dxp[i] = 0;
            for (int64_t t = 0; t < L; t++) {
                double pre = has(c, OPT_BIAS) ? h->bias[d] : 0.0;
                for (int64_t k = 0; k < W; k++)
                    pre += h->w[d * W + k] * xp[t + k];
                const double sg = ref_sigmoid(pre);
                o.y[(b * L + t) * D + d] = has(c, OPT_SILU) ? pre * sg : pre;
                g[t] = h->dy[(b * L + t) * D + d] * (has(c, OPT_SILU) ? sg * (1 + pre * (1 - sg)) : 1.0);
                o.db[d] += g[t];
                for (int64_t k = 0; k < W; k++) {
                    o.dw[d * W + k] += g[t] * xp[t + k];
                    dxp[t + k] += g[t] * h->w[d * W + k];
                }
            }
            /* the final state: the last W - 1 of the padded sequence */
            for (int64_t k = 0; k < W - 1; k++) {
                o.final[(b * D + d) * (W - 1) + k] = xp[L + k];
                if (has(c, OPT_DFINAL))
                    dxp[L + k] += h->dfinal[(b * D + d) * (W - 1) + k];
            }
            for (int64_t i = 0; i < W - 1; i++)
                o.dinit[(b * D + d) * (W - 1) + i] = dxp[i];
            for (int64_t t = 0; t < L; t++)
                o.dx[(b * L + t) * D + d] = dxp[W - 1 + t];
        }
    free(xp);
    free(dxp);
    free(g);
    return o;
}

/* ---- device tensors ---- */

typedef struct conv_dev {
    fx_tensor x, w, bias, init, dy, dfinal, y, final, dx, dw, db, dinit;
    fx_conv_inputs in;
} conv_dev;

static void conv_upload(fx_device *dev, const conv_host *h, conv_dev *t)
{
    const conv_case *c = &h->c;
    memset(t, 0, sizeof *t);
    const int64_t xd[3] = {c->batch, c->seqlen, c->dim}, wd[2] = {c->dim, c->width}, bd[1] = {c->dim},
                  sd[3] = {c->batch, c->dim, c->width - 1};
    fx_test_tensor(dev, c->type, 3, xd, h->x, &t->x);
    fx_test_tensor(dev, c->w_type, 2, wd, h->w, &t->w);
    fx_test_tensor(dev, c->w_type, 1, bd, h->bias, &t->bias);
    fx_test_tensor(dev, c->type, 3, sd, h->init, &t->init);
    fx_test_tensor(dev, c->type, 3, xd, h->dy, &t->dy);
    fx_test_tensor(dev, c->type, 3, sd, h->dfinal, &t->dfinal);
    fx_test_poisoned(dev, c->type, 3, xd, &t->y);
    fx_test_poisoned(dev, c->type, 3, sd, &t->final);
    fx_test_poisoned(dev, c->type, 3, xd, &t->dx);
    fx_test_poisoned(dev, c->w_type, 2, wd, &t->dw);
    fx_test_poisoned(dev, c->w_type, 1, bd, &t->db);
    fx_test_poisoned(dev, c->type, 3, sd, &t->dinit);
    t->in = (fx_conv_inputs){.x = &t->x, .w = &t->w, .bias = has(c, OPT_BIAS) ? &t->bias : NULL,
                             .initial_state = has(c, OPT_INIT) ? &t->init : NULL,
                             .activation = has(c, OPT_SILU) ? FX_ACT_SILU : FX_ACT_NONE};
}

static void conv_release(conv_dev *t)
{
    fx_tensor *all[] = {&t->x, &t->w, &t->bias, &t->init, &t->dy, &t->dfinal,
                        &t->y, &t->final, &t->dx, &t->dw, &t->db, &t->dinit};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
}

static fx_conv_grad_outs conv_grads(conv_dev *t)
{
    return (fx_conv_grad_outs){.dx = &t->dx, .dw = &t->dw, .dbias = t->in.bias ? &t->db : NULL,
                               .dinitial_state = t->in.initial_state ? &t->dinit : NULL};
}

static void conv_run(const fx_exec *ex, conv_dev *t, bool dfinal)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_conv_forward_into(ex, &t->in, &t->y, &t->final, &st);
    ck_assert_msg(st.code == FX_OK, "causal_conv1d forward: %s", st.msg);
    const fx_conv_grad_outs g = conv_grads(t);
    fx_op_conv_backward_into(ex, &t->in, &t->dy, dfinal ? &t->dfinal : NULL, &g, &st);
    ck_assert_msg(st.code == FX_OK, "causal_conv1d backward: %s", st.msg);
}

static conv_out conv_read(const conv_dev *t)
{
    conv_out o = {fx_test_read(&t->y),  fx_test_read(&t->final), fx_test_read(&t->dx),
                  fx_test_read(&t->dw), fx_test_read(&t->db),    fx_test_read(&t->dinit)};
    return o;
}

static double summed_tolerance(double tol, int64_t terms)
{
    const double scale = sqrt((double)terms) / 4.0;
    return tol * (scale > 1.0 ? scale : 1.0);
}

static void conv_compare(const conv_case *c, const conv_out *got, const conv_out *want, double tol)
{
    const char *name = conv_text(c);
    FX_LT_CLOSE("y", got->y, want->y, n_x(c), tol, name);
    FX_LT_CLOSE("final_state", got->final, want->final, n_state(c), c->type == FX_F64 ? tol : 1e-7, name);
    FX_LT_CLOSE("dx", got->dx, want->dx, n_x(c), tol, name);
    const double wtol = fmax(tol, fx_lt_tolerance(c->w_type));
    FX_LT_CLOSE_SUM("dw", got->dw, want->dw, c->dim * c->width, c->batch * c->seqlen, summed_tolerance(wtol, c->batch * c->seqlen), name);
    if (has(c, OPT_BIAS))
        FX_LT_CLOSE_SUM("dbias", got->db, want->db, c->dim, c->batch * c->seqlen, summed_tolerance(wtol, c->batch * c->seqlen), name);
    if (has(c, OPT_INIT))
        FX_LT_CLOSE("dinitial_state", got->dinit, want->dinit, n_state(c), tol, name);
}

static double conv_tolerance(const conv_case *c) { return c->type == FX_F64 ? 1e-10 : fx_lt_tolerance(c->type); }

static void check_conv_case(conv_case c)
{
    fx_device *dev = fx_test_device();
    conv_host h = conv_random(c);
    conv_out want = conv_reference(&h);
    conv_dev t;
    conv_upload(dev, &h, &t);
    conv_run(NULL, &t, has(&c, OPT_DFINAL));
    conv_out got = conv_read(&t);
    conv_compare(&c, &got, &want, conv_tolerance(&c));
    conv_out_free(&got);
    conv_out_free(&want);
    conv_release(&t);
    conv_host_free(&h);
}

static conv_case conv_of(int64_t batch, int64_t seqlen, int64_t dim, int64_t width, fx_dtype type, unsigned opts)
{
    conv_case c = {.batch = batch, .seqlen = seqlen, .dim = dim, .width = width, .type = type, .w_type = type,
                   .opts = opts};
    return c;
}

START_TEST(matches_reference)
{
    const int64_t widths[] = {1, 3, 4, 7, 16};
    const int64_t dims[] = {1, 37, 64};
    int count = 0;
    for (size_t wi = 0; wi < 5; wi++) {
        const int64_t W = widths[wi];
        /* 1, 2, W - 1 and W steps, and across the kernels' chunks (32 and 128 steps) */
        const int64_t lens[] = {1, 2, W > 1 ? W - 1 : 3, W, 200};
        for (size_t li = 0; li < 5; li++)
            for (size_t di = 0; di < 3; di++) {
                const unsigned opts = (unsigned)(count * 7) % 16;
                const int64_t batch = count % 2 ? 2 : 1;
                count++;
                if (lens[li] == 200 && dims[di] == 1 && count % 2)
                    continue; /* a long sequence of one channel now and then is enough */
                check_conv_case(conv_of(batch, lens[li], dims[di], W, FX_F32, opts));
            }
    }
    /* every option at once at the widths a Mamba block uses */
    check_conv_case(conv_of(3, 300, 96, 4, FX_F32, OPT_ALL));
    check_conv_case(conv_of(2, 129, 40, 2, FX_F32, OPT_ALL));
}
END_TEST

START_TEST(every_type)
{
    fx_device *dev = fx_test_device();
    const fx_dtype types[] = {FX_BF16, FX_F16, FX_F64};
    for (size_t t = 0; t < 3; t++) {
        if (types[t] == FX_F64 && dev->kind != FX_DEVICE_CPU)
            continue;
        const int64_t widths[] = {4, 5, 1};
        for (size_t w = 0; w < 3; w++) {
            conv_case c = conv_of(2, 150, w == 1 ? 37 : 64, widths[w], types[t], OPT_ALL);
            if (types[t] != FX_F64 && w == 0)
                c.w_type = FX_F32; /* f32 weights with 16-bit inputs */
            check_conv_case(c);
        }
    }
}
END_TEST

/* x one element past an aligned start: the packed kernels give way to the
 * channel-at-a-time ones, with the same answers. */
START_TEST(unaligned_views)
{
    fx_device *dev = fx_test_device();
    conv_case c = conv_of(2, 70, 64, 4, FX_F32, OPT_ALL);
    conv_host h = conv_random(c);
    conv_out want = conv_reference(&h);
    conv_dev t;
    conv_upload(dev, &h, &t);
    double *shifted = fx_lt_alloc(n_x(&c) + 1);
    memcpy(shifted + 1, h.x, sizeof(double) * (size_t)n_x(&c));
    const int64_t bd[1] = {n_x(&c) + 1};
    fx_tensor big;
    fx_test_tensor(dev, FX_F32, 1, bd, shifted, &big);
    fx_tensor view = t.x;
    view.data = (char *)big.data + sizeof(float);
    view.buffer = big.buffer;
    t.in.x = &view;
    conv_run(NULL, &t, true);
    conv_out got = conv_read(&t);
    conv_compare(&c, &got, &want, 1e-5);
    conv_out_free(&got);
    conv_out_free(&want);
    fx_tensor_release(&big);
    free(shifted);
    conv_release(&t);
    conv_host_free(&h);
}
END_TEST

START_TEST(cuda_matches_cpu)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return; /* the sweeps compare the CPU with the reference */
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int64_t widths[] = {4, 3, 9};
    for (size_t t = 0; t < 3; t++)
        for (size_t w = 0; w < 3; w++) {
            conv_case c = conv_of(2, 140, w == 1 ? 37 : 128, widths[w], types[t], OPT_ALL);
            conv_host h = conv_random(c);
            conv_dev d, cpu;
            conv_upload(dev, &h, &d);
            conv_upload(fx_test_oracle(), &h, &cpu);
            conv_run(NULL, &d, true);
            conv_run(NULL, &cpu, true);
            conv_out got = conv_read(&d), want = conv_read(&cpu);
            conv_compare(&c, &got, &want, conv_tolerance(&c));
            conv_out_free(&got);
            conv_out_free(&want);
            conv_release(&d);
            conv_release(&cpu);
            conv_host_free(&h);
        }
}
END_TEST

/* The first part's final state as the second part's initial state: the
 * two outputs are the one call's, and so is the last state. */
START_TEST(split_forward_equals_one_call)
{
    fx_device *dev = fx_test_device();
    const int64_t widths[] = {4, 7, 1, 16};
    const int64_t cuts[] = {70, 2, 5, 9};
    for (size_t i = 0; i < 4; i++) {
        conv_case c = conv_of(2, 100, 37, widths[i], FX_F32, OPT_BIAS | OPT_INIT | OPT_SILU);
        conv_host h = conv_random(c);
        conv_out want = conv_reference(&h);
        const int64_t cut = cuts[i], D = c.dim;
        conv_case c1 = c, c2 = c;
        c1.seqlen = cut;
        c2.seqlen = c.seqlen - cut;
        conv_host h1 = conv_random(c1), h2 = conv_random(c2);
        for (int64_t b = 0; b < c.batch; b++) {
            memcpy(h1.x + b * cut * D, h.x + b * c.seqlen * D, sizeof(double) * (size_t)(cut * D));
            memcpy(h2.x + b * c2.seqlen * D, h.x + (b * c.seqlen + cut) * D, sizeof(double) * (size_t)(c2.seqlen * D));
        }
        memcpy(h1.w, h.w, sizeof(double) * (size_t)(D * c.width));
        memcpy(h2.w, h.w, sizeof(double) * (size_t)(D * c.width));
        memcpy(h1.bias, h.bias, sizeof(double) * (size_t)D);
        memcpy(h2.bias, h.bias, sizeof(double) * (size_t)D);
        memcpy(h1.init, h.init, sizeof(double) * (size_t)n_state(&c));
        conv_dev t1, t2;
        conv_upload(dev, &h1, &t1);
        conv_upload(dev, &h2, &t2);
        fx_status st;
        fx_status_clear(&st);
        fx_op_conv_forward_into(NULL, &t1.in, &t1.y, &t1.final, &st);
        FX_CK_OK(st);
        t2.in.initial_state = &t1.final;
        fx_op_conv_forward_into(NULL, &t2.in, &t2.y, &t2.final, &st);
        FX_CK_OK(st);
        double *y1 = fx_test_read(&t1.y), *y2 = fx_test_read(&t2.y), *f2 = fx_test_read(&t2.final);
        double *y = fx_lt_alloc(n_x(&c));
        for (int64_t b = 0; b < c.batch; b++) {
            memcpy(y + b * c.seqlen * D, y1 + b * cut * D, sizeof(double) * (size_t)(cut * D));
            memcpy(y + (b * c.seqlen + cut) * D, y2 + b * c2.seqlen * D, sizeof(double) * (size_t)(c2.seqlen * D));
        }
        FX_LT_CLOSE("y", y, want.y, n_x(&c), 1e-5, conv_text(&c));
        FX_LT_CLOSE("final_state", f2, want.final, n_state(&c), 1e-7, conv_text(&c));
        free(y);
        free(y1);
        free(y2);
        free(f2);
        conv_release(&t1);
        conv_release(&t2);
        conv_host_free(&h1);
        conv_host_free(&h2);
        conv_out_free(&want);
        conv_host_free(&h);
    }
}
END_TEST

START_TEST(steps_equal_one_call)
{
    fx_device *dev = fx_test_device();
    const int64_t widths[] = {4, 1, 2, 7, 16};
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F32, FX_F16, FX_F32};
    for (size_t i = 0; i < 5; i++) {
        conv_case c = conv_of(3, 9, 37, widths[i], types[i], i % 2 ? OPT_INIT | OPT_SILU : OPT_ALL);
        conv_host h = conv_random(c);
        conv_out want = conv_reference(&h);
        conv_dev t;
        conv_upload(dev, &h, &t);
        const int64_t B = c.batch, L = c.seqlen, D = c.dim;
        /* the state starts as the initial state (or zeros) and is updated in place */
        double *init = fx_lt_alloc(n_state(&c));
        if (has(&c, OPT_INIT))
            memcpy(init, h.init, sizeof(double) * (size_t)n_state(&c));
        fx_tensor state;
        const int64_t sd[3] = {B, D, c.width - 1}, xd[2] = {B, D};
        fx_test_tensor(dev, c.type, 3, sd, init, &state);
        double *y = fx_lt_alloc(n_x(&c)), *xt = fx_lt_alloc(B * D);
        fx_conv_inputs in = t.in;
        in.initial_state = NULL;
        for (int64_t s = 0; s < L; s++) {
            for (int64_t b = 0; b < B; b++)
                memcpy(xt + b * D, h.x + (b * L + s) * D, sizeof(double) * (size_t)D);
            fx_tensor x, yt;
            fx_test_tensor(dev, c.type, 2, xd, xt, &x);
            fx_test_poisoned(dev, c.type, 2, xd, &yt);
            in.x = &x;
            fx_status st;
            fx_status_clear(&st);
            fx_op_conv_step_into(NULL, &state, &in, &yt, &st);
            FX_CK_OK(st);
            double *got = fx_test_read(&yt);
            for (int64_t b = 0; b < B; b++)
                memcpy(y + (b * L + s) * D, got + b * D, sizeof(double) * (size_t)D);
            free(got);
            fx_tensor_release(&x);
            fx_tensor_release(&yt);
        }
        double *final = fx_test_read(&state);
        FX_LT_CLOSE("y of the steps", y, want.y, n_x(&c), fx_lt_tolerance(c.type), conv_text(&c));
        FX_LT_CLOSE("state after the steps", final, want.final, n_state(&c), c.type == FX_F32 ? 1e-7 : 1e-2,
                    conv_text(&c));
        free(final);
        free(y);
        free(xt);
        free(init);
        fx_tensor_release(&state);
        conv_release(&t);
        conv_out_free(&want);
        conv_host_free(&h);
    }
}
END_TEST

/* sum(dy * y) + sum(dfinal * final) of the CPU's f64 forward, one input nudged. */
static double cpu_loss(const conv_host *h, double *input, int64_t at, double delta)
{
    const double saved = input[at];
    input[at] = saved + delta;
    conv_dev t;
    conv_upload(fx_test_oracle(), h, &t);
    input[at] = saved;
    fx_status st;
    fx_status_clear(&st);
    fx_op_conv_forward_into(NULL, &t.in, &t.y, &t.final, &st);
    FX_CK_OK(st);
    double *y = fx_test_read(&t.y), *f = fx_test_read(&t.final), loss = 0;
    for (int64_t i = 0; i < n_x(&h->c); i++)
        loss += h->dy[i] * y[i];
    for (int64_t i = 0; i < n_state(&h->c); i++)
        loss += h->dfinal[i] * f[i];
    free(y);
    free(f);
    conv_release(&t);
    return loss;
}

START_TEST(cpu_gradients_match_finite_differences)
{
    const int64_t widths[] = {1, 3, 4};
    const int64_t lens[] = {5, 2, 1};
    for (size_t i = 0; i < 3; i++)
        for (int silu = 0; silu < 2; silu++) {
            conv_case c = conv_of(2, lens[i], 3, widths[i], FX_F64, OPT_BIAS | OPT_INIT | OPT_DFINAL | (silu ? OPT_SILU : 0));
            conv_host h = conv_random(c);
            conv_dev t;
            conv_upload(fx_test_oracle(), &h, &t);
            conv_run(NULL, &t, true);
            conv_out got = conv_read(&t);
            struct {
                const char *name;
                double *input;
                const double *grad;
                int64_t n;
            } checks[] = {
                {"dx", h.x, got.dx, n_x(&c)},
                {"dw", h.w, got.dw, c.dim * c.width},
                {"dbias", h.bias, got.db, c.dim},
                {"dinitial_state", h.init, got.dinit, n_state(&c)},
            };
            for (size_t k = 0; k < 4; k++)
                for (int64_t j = 0; j < checks[k].n; j++) {
                    const double step = 1e-6;
                    const double fd = (cpu_loss(&h, checks[k].input, j, step) - cpu_loss(&h, checks[k].input, j, -step)) /
                                      (2 * step);
                    ck_assert_msg(fabs(fd - checks[k].grad[j]) <= 1e-6 * (1 + fabs(fd)),
                                  "%s: %s[%lld] %.10g, central difference %.10g (seed %llu)", conv_text(&c),
                                  checks[k].name, (long long)j, checks[k].grad[j], fd,
                                  (unsigned long long)fx_test_seed());
                }
            conv_out_free(&got);
            conv_release(&t);
            conv_host_free(&h);
        }
}
END_TEST

START_TEST(contexts_hold_the_inputs)
{
    fx_device *dev = fx_test_device();
    conv_case c = conv_of(2, 33, 24, 4, FX_F32, OPT_ALL);
    conv_host h = conv_random(c);
    conv_out want = conv_reference(&h);
    conv_dev t;
    conv_upload(dev, &h, &t);
    fx_status st;
    fx_status_clear(&st);
    fx_tensor y, final;
    fx_conv_ctx *ctx = NULL;
    fx_op_conv_forward(&t.in, true, &y, &final, &ctx, &st);
    FX_CK_OK(st);
    fx_tensor dy, dfinal;
    const int64_t xd[3] = {2, 33, 24}, sd[3] = {2, 24, 3};
    fx_test_tensor(dev, FX_F32, 3, xd, h.dy, &dy);
    fx_test_tensor(dev, FX_F32, 3, sd, h.dfinal, &dfinal);
    conv_release(&t); /* the context keeps its own references */
    fx_conv_grads g;
    fx_op_conv_backward(ctx, &dy, &dfinal, &g, &st);
    FX_CK_OK(st);
    conv_out got = {fx_test_read(&y), fx_test_read(&final), fx_test_read(&g.dx), fx_test_read(&g.dw),
                    fx_test_read(&g.dbias), fx_test_read(&g.dinitial_state)};
    conv_compare(&c, &got, &want, 1e-5);
    conv_out_free(&got);
    fx_conv_grads_release(&g);
    fx_tensor_release(&dy);
    fx_tensor_release(&dfinal);
    fx_tensor_release(&y);
    fx_tensor_release(&final);
    fx_conv_ctx_free(ctx);
    conv_out_free(&want);
    conv_host_free(&h);
}
END_TEST

START_TEST(callers_context_with_exact_scratch)
{
    fx_device *dev = fx_test_device();
    const int64_t widths[] = {4, 6};
    for (size_t i = 0; i < 2; i++) {
        conv_case c = conv_of(2, 300, 64, widths[i], i ? FX_BF16 : FX_F32, OPT_ALL);
        conv_host h = conv_random(c);
        conv_out want = conv_reference(&h);
        conv_dev t;
        conv_upload(dev, &h, &t);
        const fx_conv_grad_outs g = conv_grads(&t);
        fx_lt_own_stream_done(dev);
        fx_lt_caller fwd, bwd;
        fx_status st;
        fx_status_clear(&st);
        fx_lt_caller_open(dev, fx_op_conv_forward_scratch(NULL, &t.in, &t.y, &t.final), &fwd);
        fx_op_conv_forward_into(&fwd.ex, &t.in, &t.y, &t.final, &st);
        FX_CK_OK(st);
        fx_lt_caller_close(&fwd);
        fx_lt_caller_open(dev, fx_op_conv_backward_scratch(NULL, &t.in, &t.dy, &t.dfinal, &g), &bwd);
        fx_op_conv_backward_into(&bwd.ex, &t.in, &t.dy, &t.dfinal, &g, &st);
        FX_CK_OK(st);
        fx_lt_caller_close(&bwd);
        conv_out got = conv_read(&t);
        conv_compare(&c, &got, &want, conv_tolerance(&c));
        conv_out_free(&got);
        conv_out_free(&want);
        conv_release(&t);
        conv_host_free(&h);
    }
}
END_TEST

START_TEST(empty_shapes)
{
    /* no steps: the final state is the initial one and its gradient passes
     * straight back; no sequences, no channels: nothing */
    check_conv_case(conv_of(2, 0, 5, 4, FX_F32, OPT_ALL));
    check_conv_case(conv_of(0, 7, 5, 4, FX_F32, OPT_ALL));
    check_conv_case(conv_of(2, 7, 0, 3, FX_F32, OPT_ALL));
}
END_TEST

static void tensor_of(fx_device *dev, fx_dtype t, int rank, const int64_t *dims, fx_tensor *out)
{
    double v[512] = {0};
    fx_test_tensor(dev, t, rank, dims, v, out);
}

START_TEST(validation_messages)
{
    fx_device *dev = fx_test_device();
    conv_case c = conv_of(2, 5, 8, 4, FX_F32, OPT_ALL);
    conv_host h = conv_random(c);
    conv_dev t;
    conv_upload(dev, &h, &t);
    fx_tensor w17, w7, b5, s2, x2, ints, bf;
    const int64_t d817[2] = {8, 17}, d74[2] = {7, 4}, d5[1] = {5}, d282[3] = {2, 8, 2}, d28[2] = {2, 8},
                  d258[3] = {2, 5, 8};
    tensor_of(dev, FX_F32, 2, d817, &w17);
    tensor_of(dev, FX_F32, 2, d74, &w7);
    tensor_of(dev, FX_F32, 1, d5, &b5);
    tensor_of(dev, FX_F32, 3, d282, &s2);
    tensor_of(dev, FX_F32, 2, d28, &x2);
    tensor_of(dev, FX_S32, 3, d258, &ints);
    tensor_of(dev, FX_BF16, 3, d282, &bf);
    fx_status st;
    fx_conv_inputs in;
#define FWD_ERROR(msg)                                                                                  \
    do {                                                                                                \
        fx_status_clear(&st);                                                                           \
        fx_lt_expect_error(fx_op_conv_forward_into(NULL, &in, &t.y, NULL, &st), &st, msg);              \
    } while (0)
    in = t.in, in.x = &ints;
    FWD_ERROR(dev->kind == FX_DEVICE_CPU ? "x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                                         : "x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    in = t.in, in.x = &x2;
    FWD_ERROR("x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,8}");
    in = t.in, in.w = &w7;
    FWD_ERROR("w: expected shape {8,4} [dim, width], got {7,4}");
    in = t.in, in.w = &w17, in.initial_state = NULL;
    FWD_ERROR("w: expected a width of 1 to 16 [dim, width], got shape {8,17}");
    in = t.in, in.bias = &b5;
    FWD_ERROR("bias: expected shape {8} [dim], got {5}");
    in = t.in, in.initial_state = &s2;
    FWD_ERROR("initial_state: expected shape {2,8,3} [batch, dim, width - 1], got {2,8,2}");
    in = t.in, in.initial_state = &bf;
    FWD_ERROR("initial_state: expected type {f,32}, got {bf,16}");
    in = t.in, in.activation = FX_ACT_GELU;
    FWD_ERROR("activation: expected none or silu, got gelu");
    in = t.in;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_conv_forward_into(NULL, &in, &t.y, &s2, &st), &st,
                       "final_state: expected shape {2,8,3} [batch, dim, width - 1], got {2,8,2}");
    fx_conv_grad_outs g = conv_grads(&t);
    g.dinitial_state = NULL;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_conv_backward_into(NULL, &in, &t.dy, NULL, &g, &st), &st,
                       "dinitial_state: expected a gradient tensor (its input was given), got none");
    g = conv_grads(&t);
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_conv_backward_into(NULL, &in, &t.dy, &s2, &g, &st), &st,
                       "dfinal_state: expected shape {2,8,3} [batch, dim, width - 1], got {2,8,2}");
    /* the step */
    fx_tensor state, yt;
    const int64_t sd[3] = {2, 8, 3};
    tensor_of(dev, FX_F32, 3, sd, &state);
    tensor_of(dev, FX_F32, 2, d28, &yt);
    in = t.in;
    in.x = &x2;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_conv_step_into(NULL, &state, &in, &yt, &st), &st,
                       "initial_state: expected none (a step's state is `state`), got a tensor");
    in.initial_state = NULL;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_conv_step_into(NULL, &s2, &in, &yt, &st), &st,
                       "state: expected shape {2,8,3} [batch, dim, width - 1], got {2,8,2}");
    /* a state over its own input: it would read what it has written */
    fx_tensor alias = state;
    alias.rank = 2;
    alias.dims[0] = 2;
    alias.dims[1] = 8;
    alias.numel = 16;
    alias.nbytes = 64;
    in.x = &alias;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_conv_step_into(NULL, &state, &in, &yt, &st), &st,
                       "state: expected memory apart from x's (it is written in place while x is read), got an overlap "
                       "of their bytes");
#undef FWD_ERROR
    fx_tensor *all[] = {&w17, &w7, &b5, &s2, &x2, &ints, &bf, &state, &yt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    conv_release(&t);
    conv_host_free(&h);
}
END_TEST

Suite *fx_suite_conv(void)
{
    Suite *s = suite_create("conv");
    TCase *tc = tcase_create("causal_conv1d");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, matches_reference);
    tcase_add_test(tc, every_type);
    tcase_add_test(tc, unaligned_views);
    tcase_add_test(tc, cuda_matches_cpu);
    tcase_add_test(tc, split_forward_equals_one_call);
    tcase_add_test(tc, steps_equal_one_call);
    tcase_add_test(tc, cpu_gradients_match_finite_differences);
    tcase_add_test(tc, contexts_hold_the_inputs);
    tcase_add_test(tc, callers_context_with_exact_scratch);
    tcase_add_test(tc, empty_shapes);
    tcase_add_test(tc, validation_messages);
    suite_add_tcase(s, tc);
    return s;
}
