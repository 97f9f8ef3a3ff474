/* GRU and LSTM layers (include/fusex_rnn.h): the CPU backend against a
 * reference written here (f64, PyTorch's equations as nn.GRU / nn.LSTM
 * document them), every gradient against central differences of that
 * reference, step chains against the forward, and on CUDA (a GPU or the
 * emulator of its kernels) every output and gradient against the CPU in
 * f32, bf16 and f16 through each kernel path (stepwise, persistent with and
 * without the layer wavefront, tensor cores). Outputs are poisoned before
 * every op; callers' contexts get arenas of exactly the queried scratch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "core/rnn.h"
#include "fusex_cpu.h"
#include "fusex_dtype.h"
#include "testutil.h"

#define MAXL 10

/* ---- a case ---- */

typedef struct rnn_case {
    int cell;
    int64_t layers, B, L, I, H;
    fx_dtype dtype;
    int h0, c0;     /* given */
    int bias;       /* 0: none, 1: x's type, 2: the state type */
    int state_f32;  /* h0, c0, dh_n, dc_n of the state type (else x's) */
    int dy, dh_n, dc_n; /* cotangents given to the backward */
    int path;
} rnn_case;

static const char *describe(const rnn_case *c)
{
    static char text[256];
    snprintf(text, sizeof text, "%s x%lld B%lld L%lld I%lld H%lld %s h0=%d c0=%d bias=%d state_f32=%d dy=%d dh_n=%d "
             "dc_n=%d path=%#x",
             fx_rnn_cell_name(c->cell), (long long)c->layers, (long long)c->B, (long long)c->L, (long long)c->I,
             (long long)c->H, fx_dtype_name(c->dtype), c->h0, c->c0, c->bias, c->state_f32, c->dy, c->dh_n,
             c->dc_n, (unsigned)c->path);
    return text;
}

static int64_t gates(const rnn_case *c) { return fx_rnn_gates(c->cell); }
static int64_t rows_of(const rnn_case *c) { return gates(c) * c->H; }
static int64_t width_of(const rnn_case *c, int64_t l) { return l == 0 ? c->I : c->H; }
static bool lstm(const rnn_case *c) { return c->cell == FX_RNN_LSTM; }
static fx_dtype state_type(const rnn_case *c) { return fx_rnn_state_type(c->dtype); }
static fx_dtype init_type(const rnn_case *c) { return c->state_f32 ? state_type(c) : c->dtype; }
static fx_dtype bias_type(const rnn_case *c) { return c->bias == 2 ? state_type(c) : c->dtype; }

static double tolerance(fx_dtype t) { return t == FX_F64 ? 1e-12 : t == FX_F32 ? 1e-5 : 1e-2; }

static double *zeros(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* ---- host values (f64, already rounded to the types they travel in) ---- */

typedef struct rnn_host {
    double *x, *h0, *c0, *dy, *dh_n, *dc_n;
    double *w[MAXL][4]; /* w_ih, w_hh, b_ih, b_hh */
} rnn_host;

static int64_t param_count(const rnn_case *c, int64_t l, int p)
{
    return p == 0 ? rows_of(c) * width_of(c, l) : p == 1 ? rows_of(c) * c->H : rows_of(c);
}

static bool param_given(const rnn_case *c, int p) { return p < 2 || c->bias; }

static fx_dtype param_type(const rnn_case *c, int p) { return p < 2 ? c->dtype : bias_type(c); }

static void round_all(fx_dtype t, double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double one;
        fx_store_f64(&one, t, 0, v[i]);
        v[i] = fx_load_f64(&one, t, 0);
    }
}

static double *random_values(int64_t n, double scale, fx_dtype t)
{
    double *v = zeros(n);
    fx_fill_uniform(v, n, -scale, scale);
    round_all(t, v, n);
    return v;
}

static int64_t seq_count(const rnn_case *c) { return c->B * c->L * c->H; }
static int64_t state_count(const rnn_case *c) { return c->layers * c->B * c->H; }

static void host_random(const rnn_case *c, rnn_host *x)
{
    memset(x, 0, sizeof *x);
    /* weights a little past PyTorch's U(-1/sqrt(H), 1/sqrt(H)), so the gates
     * leave their linear range */
    const double ws = 1.5 / sqrt((double)c->H);
    x->x = random_values(c->B * c->L * c->I, 1.0, c->dtype);
    for (int64_t l = 0; l < c->layers; l++)
        for (int p = 0; p < 4; p++)
            if (param_given(c, p))
                x->w[l][p] = random_values(param_count(c, l, p), p < 2 ? ws : 0.5, param_type(c, p));
    if (c->h0)
        x->h0 = random_values(state_count(c), 1.0, init_type(c));
    if (c->c0 && lstm(c))
        x->c0 = random_values(state_count(c), 1.0, init_type(c));
    if (c->dy)
        x->dy = random_values(seq_count(c), 1.0, c->dtype);
    if (c->dh_n)
        x->dh_n = random_values(state_count(c), 1.0, init_type(c));
    if (c->dc_n && lstm(c))
        x->dc_n = random_values(state_count(c), 1.0, init_type(c));
}

static void host_free(rnn_host *x)
{
    free(x->x);
    free(x->h0);
    free(x->c0);
    free(x->dy);
    free(x->dh_n);
    free(x->dc_n);
    for (int l = 0; l < MAXL; l++)
        for (int p = 0; p < 4; p++)
            free(x->w[l][p]);
}

/* ---- the reference: PyTorch's equations, f64 ---- */

typedef struct ref_out {
    double *y, *h_n, *c_n;
} ref_out;

static double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }

static void reference_forward(const rnn_case *c, const rnn_host *x, ref_out *o)
{
    const int64_t B = c->B, L = c->L, H = c->H, G = gates(c);
    o->y = zeros(B * L * H);
    o->h_n = zeros(state_count(c));
    o->c_n = zeros(state_count(c));
    double *in = zeros(B * L * (c->I > H ? c->I : H)), *out = zeros(B * L * H);
    memcpy(in, x->x, sizeof(double) * (size_t)(B * L * c->I));
    double *pre = zeros(2 * G * H), *h = zeros(H), *cc = zeros(H);
    for (int64_t l = 0; l < c->layers; l++) {
        const int64_t K = width_of(c, l);
        const double *w_ih = x->w[l][0], *w_hh = x->w[l][1], *b_ih = x->w[l][2], *b_hh = x->w[l][3];
        for (int64_t b = 0; b < B; b++) {
            for (int64_t j = 0; j < H; j++) {
                h[j] = x->h0 ? x->h0[(l * B + b) * H + j] : 0;
                cc[j] = x->c0 ? x->c0[(l * B + b) * H + j] : 0;
            }
            for (int64_t t = 0; t < L; t++) {
                const double *xt = in + (b * L + t) * K;
                for (int64_t r = 0; r < G * H; r++) {
                    double sx = b_ih ? b_ih[r] : 0, sh = b_hh ? b_hh[r] : 0;
                    for (int64_t k = 0; k < K; k++)
                        sx += w_ih[r * K + k] * xt[k];
                    for (int64_t k = 0; k < H; k++)
                        sh += w_hh[r * H + k] * h[k];
                    pre[r] = sx;
                    pre[G * H + r] = sh;
                }
                const double *px = pre, *ph = pre + G * H;
                for (int64_t j = 0; j < H; j++) {
                    if (c->cell == FX_RNN_GRU) {
                        double r = sigm(px[j] + ph[j]), z = sigm(px[H + j] + ph[H + j]);
                        double n = tanh(px[2 * H + j] + r * ph[2 * H + j]);
                        h[j] = (1 - z) * n + z * h[j];
                    } else {
                        double i = sigm(px[j] + ph[j]), f = sigm(px[H + j] + ph[H + j]);
                        double g = tanh(px[2 * H + j] + ph[2 * H + j]), ot = sigm(px[3 * H + j] + ph[3 * H + j]);
                        cc[j] = f * cc[j] + i * g;
                        h[j] = ot * tanh(cc[j]);
                    }
                }
                memcpy(out + (b * L + t) * H, h, sizeof(double) * (size_t)H);
            }
            memcpy(o->h_n + (l * B + b) * H, h, sizeof(double) * (size_t)H);
            memcpy(o->c_n + (l * B + b) * H, cc, sizeof(double) * (size_t)H);
        }
        memcpy(in, out, sizeof(double) * (size_t)(B * L * H));
    }
    memcpy(o->y, out, sizeof(double) * (size_t)(B * L * H));
    free(in);
    free(out);
    free(pre);
    free(h);
    free(cc);
}

static void ref_free(ref_out *o)
{
    free(o->y);
    free(o->h_n);
    free(o->c_n);
}

/* The scalar the gradients are of: <dy, y> + <dh_n, h_n> + <dc_n, c_n>. */
static double reference_loss(const rnn_case *c, const rnn_host *x)
{
    ref_out o;
    reference_forward(c, x, &o);
    double loss = 0;
    for (int64_t i = 0; x->dy && i < seq_count(c); i++)
        loss += x->dy[i] * o.y[i];
    for (int64_t i = 0; i < state_count(c); i++) {
        if (x->dh_n)
            loss += x->dh_n[i] * o.h_n[i];
        if (x->dc_n)
            loss += x->dc_n[i] * o.c_n[i];
    }
    ref_free(&o);
    return loss;
}

/* ---- tensors of a case on a device ---- */

typedef struct rnn_dev {
    fx_tensor x, h0, c0, dy, dh_n, dc_n;
    fx_tensor w[MAXL][4];
    fx_rnn_layer layer[MAXL];
    fx_rnn_inputs in;
} rnn_dev;

static void upload(fx_device *dev, fx_dtype t, int rank, const int64_t *dims, const double *v, fx_tensor *out)
{
    memset(out, 0, sizeof *out);
    if (v)
        fx_test_tensor(dev, t, rank, dims, v, out);
}

static const fx_tensor *given(const fx_tensor *t) { return t->buffer ? t : NULL; }

static void dev_make(fx_device *dev, const rnn_case *c, const rnn_host *x, rnn_dev *d)
{
    memset(d, 0, sizeof *d);
    const int64_t xd[3] = {c->B, c->L, c->I}, yd[3] = {c->B, c->L, c->H}, sd[3] = {c->layers, c->B, c->H};
    upload(dev, c->dtype, 3, xd, x->x, &d->x);
    upload(dev, init_type(c), 3, sd, x->h0, &d->h0);
    upload(dev, init_type(c), 3, sd, x->c0, &d->c0);
    upload(dev, c->dtype, 3, yd, x->dy, &d->dy);
    upload(dev, init_type(c), 3, sd, x->dh_n, &d->dh_n);
    upload(dev, init_type(c), 3, sd, x->dc_n, &d->dc_n);
    for (int64_t l = 0; l < c->layers; l++) {
        const int64_t ih[2] = {rows_of(c), width_of(c, l)}, hh[2] = {rows_of(c), c->H}, b[1] = {rows_of(c)};
        upload(dev, c->dtype, 2, ih, x->w[l][0], &d->w[l][0]);
        upload(dev, c->dtype, 2, hh, x->w[l][1], &d->w[l][1]);
        upload(dev, bias_type(c), 1, b, x->w[l][2], &d->w[l][2]);
        upload(dev, bias_type(c), 1, b, x->w[l][3], &d->w[l][3]);
        d->layer[l] = (fx_rnn_layer){&d->w[l][0], &d->w[l][1], given(&d->w[l][2]), given(&d->w[l][3])};
    }
    d->in = (fx_rnn_inputs){.cell = c->cell, .layers = c->layers, .layer = d->layer, .x = &d->x,
                            .h0 = given(&d->h0), .c0 = given(&d->c0), .path = c->path};
}

static void dev_free(rnn_dev *d)
{
    fx_tensor *all[] = {&d->x, &d->h0, &d->c0, &d->dy, &d->dh_n, &d->dc_n};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    for (int l = 0; l < MAXL; l++)
        for (int p = 0; p < 4; p++)
            fx_tensor_release(&d->w[l][p]);
}

/* ---- running the ops into poisoned outputs ---- */

typedef struct rnn_fwd {
    fx_tensor y, h_n, c_n, saved;
} rnn_fwd;

static void run_forward(fx_device *dev, const rnn_case *c, const rnn_dev *d, bool training, rnn_fwd *o)
{
    memset(o, 0, sizeof *o);
    const int64_t yd[3] = {c->B, c->L, c->H}, sd[3] = {c->layers, c->B, c->H};
    const fx_rnn_dims n = {c->cell, c->layers, c->B, c->L, c->I, c->H};
    int64_t saved[4];
    fx_rnn_saved_shape(&n, saved);
    fx_test_poisoned(dev, c->dtype, 3, yd, &o->y);
    fx_test_poisoned(dev, state_type(c), 3, sd, &o->h_n);
    if (lstm(c))
        fx_test_poisoned(dev, state_type(c), 3, sd, &o->c_n);
    if (training)
        fx_test_poisoned(dev, state_type(c), 4, saved, &o->saved);
    fx_status st;
    fx_status_clear(&st);
    fx_op_rnn_forward_into(NULL, &d->in, &o->y, &o->h_n, given(&o->c_n), given(&o->saved), &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
}

static void fwd_free(rnn_fwd *o)
{
    fx_tensor_release(&o->y);
    fx_tensor_release(&o->h_n);
    fx_tensor_release(&o->c_n);
    fx_tensor_release(&o->saved);
}

typedef struct rnn_bwd {
    fx_tensor dx, dh0, dc0;
    fx_tensor dw[MAXL][4];
} rnn_bwd;

static void poisoned_like(fx_device *dev, const fx_tensor *t, fx_tensor *out)
{
    memset(out, 0, sizeof *out);
    if (t && t->buffer)
        fx_test_poisoned(dev, t->dtype, t->rank, t->dims, out);
}

static void run_backward(fx_device *dev, const rnn_case *c, const rnn_dev *d, const fx_tensor *saved, rnn_bwd *o)
{
    memset(o, 0, sizeof *o);
    poisoned_like(dev, &d->x, &o->dx);
    poisoned_like(dev, &d->h0, &o->dh0);
    poisoned_like(dev, &d->c0, &o->dc0);
    fx_rnn_layer_grads g[MAXL];
    for (int64_t l = 0; l < c->layers; l++) {
        for (int p = 0; p < 4; p++)
            poisoned_like(dev, &d->w[l][p], &o->dw[l][p]);
        g[l] = (fx_rnn_layer_grads){&o->dw[l][0], &o->dw[l][1], given(&o->dw[l][2]), given(&o->dw[l][3])};
    }
    fx_rnn_grad_outs outs = {.dx = &o->dx, .dh0 = given(&o->dh0), .dc0 = given(&o->dc0), .layer = g};
    fx_status st;
    fx_status_clear(&st);
    fx_op_rnn_backward_into(NULL, &d->in, saved, given(&d->dy), given(&d->dh_n), given(&d->dc_n), &outs, &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
}

static void bwd_free(rnn_bwd *o)
{
    fx_tensor_release(&o->dx);
    fx_tensor_release(&o->dh0);
    fx_tensor_release(&o->dc0);
    for (int l = 0; l < MAXL; l++)
        for (int p = 0; p < 4; p++)
            fx_tensor_release(&o->dw[l][p]);
}

/* ---- comparing ---- */

static void expect_close(const rnn_case *c, const char *what, const fx_tensor *got, const double *want, int64_t n,
                         double tol)
{
    double *v = fx_test_read(got);
    ck_assert_int_eq(got->numel, n);
    double err = fx_rel_l2(v, want, n);
    if (err > tol && fx_l2(want, n) < 1e-30 && fx_l2(v, n) < 1e-30)
        err = 0; /* both zero (a gradient that cannot flow) */
    ck_assert_msg(err <= tol, "%s: %s rel-L2 %.3g > %.3g (seed %llu)", describe(c), what, err, tol,
                  (unsigned long long)fx_test_seed());
    free(v);
}

/* A parameter's gradient is a sum over batch and time: its rounding in
 * the type's accumulation grows with the count of terms (docs/TESTING.md). */
static double sum_tolerance(const rnn_case *c, double tol)
{
    const double terms = (double)(c->B * c->L);
    return tol * fmax(1.0, sqrt(terms) / 4.0);
}

/* The gradients are sums (dx, dh0, dc0 over the G * hidden gate rows; the
 * parameters' over batch and time): where a small one nearly cancels
 * (hidden 1: four terms of ~0.1 giving 1e-5), f32's rounding of the terms
 * (~1e-8 each) is large beside the result though small beside the terms.
 * Their f32 comparisons therefore pass within the relative tolerance of
 * the result plus an absolute floor of 1e-6 of the cotangents' typical
 * size an element (every other factor is of order 1): a wrong gate, row or
 * step is of the terms' own size, far past it. (docs/TESTING.md: the
 * linrec floors.) */
/* The cotangents' typical size an element: host_random draws them from
 * U(-1, 1) (mean square 1/3). */
static double cotangent_rms(void) { return sqrt(1.0 / 3.0); }

/* Within the relative tolerance plus an absolute floor of 1e-6 of `typical`
 * an element (f32 comparisons only). */
static void expect_terms_same(const rnn_case *c, const char *what, const fx_tensor *got, const fx_tensor *want,
                              double tol, double typical)
{
    double *g = fx_test_read(got), *w = fx_test_read(want);
    const int64_t n = want->numel;
    ck_assert_int_eq(got->numel, n);
    const double floor = tol > 0 && tol < 1e-4 ? 1e-6 * sqrt((double)n) * typical : 0;
    const double diff = fx_l2_diff(g, w, n), scale = fx_l2(w, n);
    ck_assert_msg(diff <= tol * scale + floor, "%s: %s |diff| %.3g > %.3g |ref| + %.3g (|ref| %.3g, seed %llu)",
                  describe(c), what, diff, tol, floor, scale, (unsigned long long)fx_test_seed());
    free(g);
    free(w);
}

static void expect_grad_same(const rnn_case *c, const char *what, const fx_tensor *got, const fx_tensor *want,
                             double tol)
{
    expect_terms_same(c, what, got, want, tol, cotangent_rms());
}

/* The forward's outputs likewise: each gate's pre-activation is a sum of
 * terms of order 1 (weights, inputs and states drawn from U(-1, 1)), which
 * at hidden 1 may nearly cancel, so its f32 rounding (~1e-7) can be 1e-5
 * of a small result. */
static void expect_fwd_same(const rnn_case *c, const rnn_fwd *got, const rnn_fwd *want, double tol)
{
    expect_terms_same(c, "y", &got->y, &want->y, tol, 1.0);
    expect_terms_same(c, "h_n", &got->h_n, &want->h_n, tol, 1.0);
    if (lstm(c))
        expect_terms_same(c, "c_n", &got->c_n, &want->c_n, tol, 1.0);
    if (got->saved.buffer)
        expect_terms_same(c, "saved", &got->saved, &want->saved, tol, 1.0);
}

static void expect_bwd_same(const rnn_case *c, const rnn_bwd *got, const rnn_bwd *want, double tol)
{
    static const char *names[4] = {"dw_ih", "dw_hh", "db_ih", "db_hh"};
    expect_grad_same(c, "dx", &got->dx, &want->dx, tol);
    if (got->dh0.buffer)
        expect_grad_same(c, "dh0", &got->dh0, &want->dh0, tol);
    if (got->dc0.buffer)
        expect_grad_same(c, "dc0", &got->dc0, &want->dc0, tol);
    for (int64_t l = 0; l < c->layers; l++)
        for (int p = 0; p < 4; p++)
            if (got->dw[l][p].buffer) {
                char what[48];
                snprintf(what, sizeof what, "layers[%lld].%s", (long long)l, names[p]);
                expect_grad_same(c, what, &got->dw[l][p], &want->dw[l][p], sum_tolerance(c, tol));
            }
}

/* ---- the CPU against the reference ---- */

static void cpu_case(const rnn_case *c)
{
    fx_device *cpu = fx_test_oracle();
    rnn_host x;
    host_random(c, &x);
    rnn_dev d;
    dev_make(cpu, c, &x, &d);
    rnn_fwd o;
    run_forward(cpu, c, &d, c->L % 2 == 1, &o);
    ref_out want;
    reference_forward(c, &x, &want);
    const double tol = tolerance(c->dtype);
    expect_close(c, "y", &o.y, want.y, seq_count(c), tol);
    /* states are f32 (f64 for f64 inputs): f32's rounding only */
    const double stol = c->dtype == FX_F64 ? 1e-12 : 1e-6;
    expect_close(c, "h_n", &o.h_n, want.h_n, state_count(c), stol);
    if (lstm(c))
        expect_close(c, "c_n", &o.c_n, want.c_n, state_count(c), stol);
    ref_free(&want);
    fwd_free(&o);
    dev_free(&d);
    host_free(&x);
}

START_TEST(cpu_matches_reference)
{
    typedef struct {
        int cell;
        int64_t layers, B, L, I, H;
    } shape;
    static const shape shapes[] = {
        {FX_RNN_GRU, 1, 1, 1, 1, 1},    {FX_RNN_LSTM, 1, 1, 1, 1, 1},   {FX_RNN_GRU, 3, 3, 61, 5, 37},
        {FX_RNN_LSTM, 3, 3, 61, 37, 37}, {FX_RNN_GRU, 1, 1, 7, 20, 513}, {FX_RNN_LSTM, 2, 3, 3, 513, 13},
        {FX_RNN_GRU, 2, 3, 1, 2, 1},    {FX_RNN_LSTM, 3, 1, 61, 1, 2},  {FX_RNN_GRU, 1, 3, 5, 0, 4},
    };
    static const fx_dtype types[] = {FX_F64, FX_F32, FX_BF16, FX_F16};
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++)
        for (int k = 0; k < 4; k++) {
            const shape *s = &shapes[i];
            rnn_case c = {s->cell, s->layers, s->B, s->L, s->I, s->H, types[(i + k) % 4], (i + k) % 2,
                          (i + k / 2) % 2, (i + k) % 3, k % 2, 0, 0, 0, 0};
            cpu_case(&c);
        }
}
END_TEST

/* ---- every gradient against central differences of the reference ---- */

/* `count` indices of n to check: all of them when few, else a spread. */
static int64_t probe(int64_t n, int64_t k, int64_t count)
{
    return count >= n ? k : (k * 7919 + (k * k) % 13) % n;
}

static void fd_check(const rnn_case *c, const char *what, double *v, int64_t n, const fx_tensor *grad,
                     rnn_host *x)
{
    const int64_t count = n < 24 ? n : 24;
    double *g = fx_test_read(grad), *fd = zeros(count), *an = zeros(count);
    for (int64_t k = 0; k < count; k++) {
        const int64_t i = probe(n, k, count);
        const double saved = v[i], eps = 1e-5 * fmax(1.0, fabs(saved));
        v[i] = saved + eps;
        const double up = reference_loss(c, x);
        v[i] = saved - eps;
        const double down = reference_loss(c, x);
        v[i] = saved;
        fd[k] = (up - down) / (2 * eps);
        an[k] = g[i];
    }
    /* central differences in f64 are good to ~1e-10 of the loss's scale
     * (its rounding over the step): a gradient that vanished over a long
     * sequence is held to that, not to its own tiny size */
    const double diff = fx_l2_diff(an, fd, count), scale = fx_l2(fd, count);
    ck_assert_msg(diff <= 1e-6 * scale + 1e-8 * sqrt((double)count),
                  "%s: %s against central differences: |diff| %.3g, |fd| %.3g (seed %llu)", describe(c), what, diff,
                  scale, (unsigned long long)fx_test_seed());
    free(g);
    free(fd);
    free(an);
}

static void gradient_case(const rnn_case *c)
{
    fx_device *cpu = fx_test_oracle();
    rnn_host x;
    host_random(c, &x);
    rnn_dev d;
    dev_make(cpu, c, &x, &d);
    rnn_fwd o;
    run_forward(cpu, c, &d, true, &o);
    rnn_bwd g;
    run_backward(cpu, c, &d, &o.saved, &g);
    fd_check(c, "dx", x.x, c->B * c->L * c->I, &g.dx, &x);
    if (x.h0)
        fd_check(c, "dh0", x.h0, state_count(c), &g.dh0, &x);
    if (x.c0)
        fd_check(c, "dc0", x.c0, state_count(c), &g.dc0, &x);
    static const char *names[4] = {"dw_ih", "dw_hh", "db_ih", "db_hh"};
    for (int64_t l = 0; l < c->layers; l++)
        for (int p = 0; p < 4; p++)
            if (x.w[l][p]) {
                char what[48];
                snprintf(what, sizeof what, "layers[%lld].%s", (long long)l, names[p]);
                fd_check(c, what, x.w[l][p], param_count(c, l, p), &g.dw[l][p], &x);
            }
    bwd_free(&g);
    fwd_free(&o);
    dev_free(&d);
    host_free(&x);
}

START_TEST(gradients_match_finite_differences)
{
    typedef struct {
        int cell;
        int64_t layers, B, L, I, H;
    } shape;
    static const shape shapes[] = {
        {FX_RNN_GRU, 1, 1, 1, 1, 1},   {FX_RNN_LSTM, 1, 1, 1, 1, 1},  {FX_RNN_GRU, 3, 3, 5, 4, 3},
        {FX_RNN_LSTM, 3, 2, 6, 3, 4},  {FX_RNN_GRU, 2, 1, 61, 3, 2},  {FX_RNN_LSTM, 1, 3, 4, 2, 1},
        {FX_RNN_GRU, 1, 3, 4, 6, 37},  {FX_RNN_LSTM, 2, 1, 3, 37, 5}, {FX_RNN_GRU, 1, 1, 2, 3, 513},
        {FX_RNN_LSTM, 1, 1, 61, 2, 3},
    };
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++)
        for (int k = 0; k < 2; k++) {
            const shape *s = &shapes[i];
            /* the cotangents turn through every combination; at least one given */
            const int which = 1 + (i + 3 * k) % 7;
            rnn_case c = {s->cell, s->layers, s->B, s->L, s->I, s->H, FX_F64, (i + k) % 2, (i / 2 + k) % 2,
                          (i + k) % 3, 1, which & 1, (which >> 1) & 1, (which >> 2) & 1, 0};
            if (!lstm(&c) && !c.dy && !c.dh_n)
                c.dy = 1;
            gradient_case(&c);
        }
}
END_TEST

/* ---- steps chained equal the forward ---- */

static void step_chain_case(fx_device *dev, const rnn_case *c)
{
    rnn_host x;
    host_random(c, &x);
    rnn_dev d;
    dev_make(dev, c, &x, &d);
    rnn_fwd o;
    run_forward(dev, c, &d, false, &o);
    double *y = fx_test_read(&o.y), *h_n = fx_test_read(&o.h_n), *c_n = lstm(c) ? fx_test_read(&o.c_n) : NULL;
    /* the states start as h0, c0 (zeros where absent), in the state type */
    const int64_t sd[3] = {c->layers, c->B, c->H}, xd[2] = {c->B, c->I}, yd[2] = {c->B, c->H};
    double *h0 = x.h0 ? x.h0 : zeros(state_count(c)), *c0 = x.c0 ? x.c0 : zeros(state_count(c));
    fx_tensor h, cs, xt, yt;
    fx_test_tensor(dev, state_type(c), 3, sd, h0, &h);
    memset(&cs, 0, sizeof cs);
    if (lstm(c))
        fx_test_tensor(dev, state_type(c), 3, sd, c0, &cs);
    double *frame = zeros(c->B * c->I), *want = zeros(c->B * c->H);
    const double tol = tolerance(c->dtype);
    for (int64_t t = 0; t < c->L; t++) {
        for (int64_t b = 0; b < c->B; b++) {
            memcpy(frame + b * c->I, x.x + (b * c->L + t) * c->I, sizeof(double) * (size_t)c->I);
            memcpy(want + b * c->H, y + (b * c->L + t) * c->H, sizeof(double) * (size_t)c->H);
        }
        fx_test_tensor(dev, c->dtype, 2, xd, frame, &xt);
        fx_test_poisoned(dev, c->dtype, 2, yd, &yt);
        fx_rnn_inputs in = d.in;
        in.x = &xt;
        fx_status st;
        fx_status_clear(&st);
        fx_op_rnn_step_into(NULL, &in, &h, lstm(c) ? &cs : NULL, &yt, &st);
        ck_assert_msg(st.code == FX_OK, "%s: step %lld: %s", describe(c), (long long)t, st.msg);
        expect_close(c, "a step's y", &yt, want, c->B * c->H, tol);
        fx_tensor_release(&xt);
        fx_tensor_release(&yt);
    }
    expect_close(c, "the stepped h", &h, h_n, state_count(c), tol);
    if (lstm(c))
        expect_close(c, "the stepped c", &cs, c_n, state_count(c), tol);
    fx_tensor_release(&h);
    fx_tensor_release(&cs);
    if (!x.h0)
        free(h0);
    if (!x.c0)
        free(c0);
    free(frame);
    free(want);
    free(y);
    free(h_n);
    free(c_n);
    fwd_free(&o);
    dev_free(&d);
    host_free(&x);
}

START_TEST(steps_equal_the_forward)
{
    fx_device *dev = fx_test_device();
    typedef struct {
        int cell;
        int64_t layers, B, L, I, H;
    } shape;
    static const shape shapes[] = {
        {FX_RNN_GRU, 1, 1, 1, 1, 1},   {FX_RNN_LSTM, 3, 3, 7, 5, 37},  {FX_RNN_GRU, 2, 3, 6, 37, 13},
        {FX_RNN_LSTM, 1, 1, 5, 16, 64}, {FX_RNN_GRU, 3, 1, 4, 2, 33},  {FX_RNN_LSTM, 2, 2, 3, 4, 3},
        {FX_RNN_GRU, 2, 2, 3, 0, 6},
    };
    static const fx_dtype cpu_types[] = {FX_F64, FX_F32}, cuda_types[] = {FX_F32, FX_BF16, FX_F16};
    const bool on_cuda = dev->kind == FX_DEVICE_CUDA;
    if (on_cuda) {
        /* a step whose weights do not fit shared memory: the persistent
         * kernel reads them in place; and the stepwise step, forced */
        rnn_case wide = {FX_RNN_GRU, 1, 1, 3, 16, 2048, FX_F32, 1, 0, 1, 0, 0, 0, 0, 0};
        step_chain_case(dev, &wide);
        rnn_case forced = {FX_RNN_LSTM, 2, 3, 4, 5, 37, FX_BF16, 1, 1, 2, 1, 0, 0, 0, FX_RNN_PATH_STEPWISE};
        step_chain_case(dev, &forced);
    }
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++)
        for (int k = 0; k < 2; k++) {
            const shape *s = &shapes[i];
            rnn_case c = {s->cell, s->layers, s->B, s->L, s->I, s->H, on_cuda ? cuda_types[(i + k) % 3] : cpu_types[k],
                          (i + k) % 2, (i / 2 + k + 1) % 2, (i + k) % 3, 0, 0, 0, 0, 0};
            step_chain_case(dev, &c);
        }
}
END_TEST

/* ---- CUDA against the CPU ---- */

static void compare_with_cpu(fx_device *dev, const rnn_case *c)
{
    fx_device *cpu = fx_test_oracle();
    rnn_host x;
    host_random(c, &x);
    rnn_dev dd, dc;
    dev_make(dev, c, &x, &dd);
    dev_make(cpu, c, &x, &dc);
    const double tol = tolerance(c->dtype);
    /* inference: nothing kept */
    rnn_fwd got, want;
    run_forward(dev, c, &dd, false, &got);
    run_forward(cpu, c, &dc, false, &want);
    expect_fwd_same(c, &got, &want, tol);
    fwd_free(&got);
    fwd_free(&want);
    /* training, then the backward from each side's own saved tensor */
    run_forward(dev, c, &dd, true, &got);
    run_forward(cpu, c, &dc, true, &want);
    expect_fwd_same(c, &got, &want, tol);
    rnn_bwd gg, gw;
    run_backward(dev, c, &dd, &got.saved, &gg);
    run_backward(cpu, c, &dc, &want.saved, &gw);
    expect_bwd_same(c, &gg, &gw, tol);
    bwd_free(&gg);
    bwd_free(&gw);
    fwd_free(&got);
    fwd_free(&want);
    dev_free(&dd);
    dev_free(&dc);
    host_free(&x);
}

typedef struct cuda_shape {
    int cell;
    int64_t layers, B, L, I, H;
} cuda_shape;

static void sweep(fx_device *dev, const cuda_shape *shapes, int count, const int *paths, int npaths, int rounds)
{
    static const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    for (int i = 0; i < count; i++)
        for (int k = 0; k < rounds; k++) {
            const cuda_shape *s = &shapes[i];
            const int v = i + k;
            int path = paths[(i + 2 * k) % npaths];
            fx_dtype t = types[(i + k) % 3];
            /* A gradient of a handful of elements can be a near-cancellation
             * (dx = dax W_ih over four gate terms at hidden 1), which the
             * 16-bit rounding of dax, a GEMM operand, moves by its own
             * rounding times the cancellation: such shapes run in f32 (the
             * tensor-core path on the CUDA cores), the 16-bit types on the
             * larger ones. So does the stack of 9 layers, whose 16-bit
             * gradients go through 9 roundings of their GEMM operands (it
             * is there for the launches it takes). */
            if (s->B * s->L * s->H <= 4 || s->layers > 3) {
                t = FX_F32;
                if (FX_RNN_PATH_KIND(path) == FX_RNN_PATH_PERSISTENT_MMA)
                    path = FX_RNN_PATH_PERSISTENT | (path & FX_RNN_PATH_NO_WAVEFRONT);
            }
            if (FX_RNN_PATH_KIND(path) == FX_RNN_PATH_PERSISTENT_MMA && t == FX_F32)
                t = k % 2 ? FX_F16 : FX_BF16;
            const int which = 1 + v % 7;
            rnn_case c = {s->cell, s->layers, s->B, s->L, s->I, s->H, t, v % 2, (v / 2) % 2, v % 3, (v / 3) % 2,
                          which & 1, (which >> 1) & 1, (which >> 2) & 1, path};
            if (!lstm(&c) && !c.dy && !c.dh_n)
                c.dy = 1;
            compare_with_cpu(dev, &c);
        }
}

/* Small shapes through every path, forced: stepwise (a GEMM and a gate
 * kernel a step), the persistent kernel as a wavefront over the layers and
 * one layer a launch, and its tensor-core products (16-bit types). Each
 * fits the persistent kernel on the smallest device the tests run on (the
 * emulator's 4 SMs). */
START_TEST(cuda_matches_cpu_every_path)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return; /* the CPU is the reference */
    static const cuda_shape shapes[] = {
        {FX_RNN_GRU, 1, 1, 1, 1, 1},   {FX_RNN_LSTM, 1, 1, 1, 1, 1},  {FX_RNN_GRU, 3, 3, 9, 5, 13},
        {FX_RNN_LSTM, 3, 3, 7, 13, 13}, {FX_RNN_GRU, 1, 1, 61, 37, 37}, {FX_RNN_LSTM, 2, 3, 5, 2, 37},
        {FX_RNN_GRU, 2, 9, 4, 8, 16},  {FX_RNN_LSTM, 1, 17, 3, 3, 5}, {FX_RNN_GRU, 1, 2, 3, 64, 48},
        /* more layers than one wavefront launch takes (8): two launches */
        {FX_RNN_LSTM, 9, 2, 3, 3, 2},
        /* an input of width 0: the projection is the bias alone */
        {FX_RNN_GRU, 2, 3, 5, 0, 8},
    };
    static const int paths[] = {
        FX_RNN_PATH_STEPWISE,
        FX_RNN_PATH_PERSISTENT,
        FX_RNN_PATH_PERSISTENT | FX_RNN_PATH_NO_WAVEFRONT,
        FX_RNN_PATH_PERSISTENT_MMA,
        FX_RNN_PATH_PERSISTENT_MMA | FX_RNN_PATH_NO_WAVEFRONT,
        FX_RNN_PATH_AUTO,
    };
    const int rounds = fx_test_quick() ? 2 : 6;
    sweep(dev, shapes, (int)(sizeof shapes / sizeof shapes[0]), paths, (int)(sizeof paths / sizeof paths[0]),
          rounds);
}
END_TEST

/* The paths the backend picks itself, on awkward and on large shapes: the
 * issue's (hidden 512, two layers, batch 1 and 64), hidden 2048 and past
 * it. On the emulator, whose kernels run at a CPU's pace, the large ones
 * shrink to a few steps and rows. */
START_TEST(cuda_matches_cpu_auto)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return;
    const bool small = fx_test_emulated() || fx_test_quick();
    const cuda_shape full[] = {
        {FX_RNN_GRU, 2, 1, 60, 512, 512}, {FX_RNN_LSTM, 2, 64, 60, 512, 512}, {FX_RNN_GRU, 1, 16, 33, 1024, 1024},
        {FX_RNN_LSTM, 1, 2, 5, 100, 2048}, {FX_RNN_GRU, 1, 1, 3, 7, 2500},     {FX_RNN_GRU, 3, 3, 61, 37, 513},
    };
    const cuda_shape reduced[] = {
        {FX_RNN_GRU, 2, 1, 4, 512, 512}, {FX_RNN_LSTM, 2, 3, 2, 64, 512}, {FX_RNN_GRU, 1, 1, 2, 16, 2048},
        {FX_RNN_LSTM, 1, 1, 2, 5, 2049}, {FX_RNN_GRU, 3, 3, 5, 37, 513},
    };
    const int paths[] = {FX_RNN_PATH_AUTO};
    if (small)
        sweep(dev, reduced, (int)(sizeof reduced / sizeof reduced[0]), paths, 1, 1);
    else
        sweep(dev, full, (int)(sizeof full / sizeof full[0]), paths, 1, 2);
}
END_TEST

/* ---- a caller's context: its stream, an arena of exactly the scratch
 * each op's query names ---- */

typedef struct arena_lane {
    fx_device *dev;
    void *stream;
    fx_tensor memory;
    fx_scratch_arena arena;
    fx_exec ex;
} arena_lane;

static const fx_exec *lane_with(arena_lane *l, size_t bytes)
{
    fx_status st;
    fx_status_clear(&st);
    fx_tensor_release(&l->memory);
    ck_assert_msg(bytes != SIZE_MAX, "a scratch query failed");
    const int64_t dims[1] = {(int64_t)(bytes ? bytes : 1)};
    ck_assert_int_eq(fx_tensor_alloc(l->dev, FX_U8, 1, dims, &l->memory, &st), FX_OK);
    l->arena = (fx_scratch_arena){.base = l->memory.data, .size = bytes, .used = 0};
    l->ex.device = l->dev->ordinal;
    l->ex.stream = l->stream;
    l->ex.scratch = fx_scratch_arena_use(&l->arena);
    l->ex.cache = NULL;
    return &l->ex;
}

static void lane_wait(arena_lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    if (l->stream)
        l->dev->backend->stream_synchronize(l->dev->ordinal, l->stream, &st);
    FX_CK_OK(st);
}

static void arena_case(fx_device *dev, const rnn_case *c)
{
    arena_lane l = {.dev = dev};
    fx_status st;
    fx_status_clear(&st);
    if (dev->backend->stream_create) {
        dev->backend->stream_create(dev->ordinal, &l.stream, &st);
        FX_CK_OK(st);
    }
    l.ex.device = dev->ordinal;
    l.ex.stream = l.stream;
    rnn_host x;
    host_random(c, &x);
    rnn_dev d;
    dev_make(dev, c, &x, &d);
    rnn_fwd want, got;
    run_forward(dev, c, &d, true, &want);
    rnn_bwd gwant, ggot;
    run_backward(dev, c, &d, &want.saved, &gwant);
    fx_op_synchronize(dev, &st);
    FX_CK_OK(st);
    /* the forward, in training, on the lane */
    memset(&got, 0, sizeof got);
    const int64_t yd[3] = {c->B, c->L, c->H}, sd[3] = {c->layers, c->B, c->H};
    fx_test_poisoned(dev, c->dtype, 3, yd, &got.y);
    fx_test_poisoned(dev, state_type(c), 3, sd, &got.h_n);
    if (lstm(c))
        fx_test_poisoned(dev, state_type(c), 3, sd, &got.c_n);
    fx_test_poisoned(dev, state_type(c), want.saved.rank, want.saved.dims, &got.saved);
    fx_op_synchronize(dev, &st);
    FX_CK_OK(st);
    const fx_exec *ex = lane_with(&l, fx_op_rnn_forward_scratch(&l.ex, &d.in, true));
    fx_op_rnn_forward_into(ex, &d.in, &got.y, &got.h_n, given(&got.c_n), &got.saved, &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
    lane_wait(&l);
    expect_fwd_same(c, &got, &want, 0);
    /* the backward */
    memset(&ggot, 0, sizeof ggot);
    poisoned_like(dev, &d.x, &ggot.dx);
    poisoned_like(dev, &d.h0, &ggot.dh0);
    poisoned_like(dev, &d.c0, &ggot.dc0);
    fx_rnn_layer_grads g[MAXL];
    for (int64_t k = 0; k < c->layers; k++) {
        for (int p = 0; p < 4; p++)
            poisoned_like(dev, &d.w[k][p], &ggot.dw[k][p]);
        g[k] = (fx_rnn_layer_grads){&ggot.dw[k][0], &ggot.dw[k][1], given(&ggot.dw[k][2]), given(&ggot.dw[k][3])};
    }
    fx_op_synchronize(dev, &st);
    fx_rnn_grad_outs outs = {.dx = &ggot.dx, .dh0 = given(&ggot.dh0), .dc0 = given(&ggot.dc0), .layer = g};
    ex = lane_with(&l, fx_op_rnn_backward_scratch(&l.ex, &d.in, c->dy, c->dh_n, c->dc_n && lstm(c)));
    fx_op_rnn_backward_into(ex, &d.in, &got.saved, given(&d.dy), given(&d.dh_n), given(&d.dc_n), &outs, &st);
    ck_assert_msg(st.code == FX_OK, "%s: %s", describe(c), st.msg);
    lane_wait(&l);
    expect_bwd_same(c, &ggot, &gwant, 0);
    /* one step */
    const int64_t xd[2] = {c->B, c->I}, y2[2] = {c->B, c->H};
    fx_tensor xt, yt, h, cs;
    memset(&cs, 0, sizeof cs);
    fx_test_tensor(dev, c->dtype, 2, xd, x.x, &xt);
    fx_test_poisoned(dev, c->dtype, 2, y2, &yt);
    double *zero_state = zeros(state_count(c));
    fx_test_tensor(dev, state_type(c), 3, sd, zero_state, &h);
    if (lstm(c))
        fx_test_tensor(dev, state_type(c), 3, sd, zero_state, &cs);
    fx_op_synchronize(dev, &st);
    fx_rnn_inputs in = d.in;
    in.x = &xt;
    ex = lane_with(&l, fx_op_rnn_step_scratch(&l.ex, &in));
    fx_op_rnn_step_into(ex, &in, &h, given(&cs), &yt, &st);
    ck_assert_msg(st.code == FX_OK, "%s: step: %s", describe(c), st.msg);
    lane_wait(&l);
    fx_tensor_release(&xt);
    fx_tensor_release(&yt);
    fx_tensor_release(&h);
    fx_tensor_release(&cs);
    free(zero_state);
    fx_tensor_release(&l.memory);
    if (l.stream)
        dev->backend->stream_destroy(dev->ordinal, l.stream);
    bwd_free(&gwant);
    bwd_free(&ggot);
    fwd_free(&want);
    fwd_free(&got);
    dev_free(&d);
    host_free(&x);
}

/* The same results as on the device's own context, bit for bit: the
 * scratch does not choose the kernels. */
START_TEST(caller_contexts_with_exact_scratch)
{
    fx_device *dev = fx_test_device();
    static const rnn_case cases[] = {
        {FX_RNN_GRU, 2, 3, 5, 4, 13, FX_F32, 1, 0, 1, 0, 1, 1, 0, FX_RNN_PATH_AUTO},
        {FX_RNN_LSTM, 1, 2, 4, 3, 7, FX_F32, 1, 1, 2, 1, 1, 0, 1, FX_RNN_PATH_STEPWISE},
        {FX_RNN_GRU, 3, 1, 3, 9, 8, FX_BF16, 0, 0, 0, 0, 1, 0, 0, FX_RNN_PATH_PERSISTENT},
        {FX_RNN_LSTM, 2, 2, 3, 5, 16, FX_F16, 1, 1, 1, 0, 0, 1, 1, FX_RNN_PATH_PERSISTENT_MMA},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rnn_case c = cases[i];
        if (dev->kind == FX_DEVICE_CPU) {
            c.path = 0;
            if (c.dtype != FX_F32)
                c.dtype = FX_F64;
        }
        arena_case(dev, &c);
    }
}
END_TEST

/* ---- empty problems ---- */

START_TEST(empty_shapes)
{
    fx_device *dev = fx_test_device();
    static const rnn_case cases[] = {
        {FX_RNN_GRU, 2, 0, 5, 3, 4, FX_F32, 1, 0, 1, 0, 1, 1, 0, 0},
        {FX_RNN_LSTM, 1, 3, 0, 3, 4, FX_F32, 1, 1, 1, 1, 1, 1, 1, 0},
        {FX_RNN_GRU, 1, 2, 0, 2, 5, FX_F32, 0, 0, 0, 0, 1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const rnn_case *c = &cases[i];
        rnn_host x;
        host_random(c, &x);
        rnn_dev d;
        dev_make(dev, c, &x, &d);
        rnn_fwd o;
        run_forward(dev, c, &d, true, &o);
        /* the final states are the initial ones */
        double *h0 = x.h0 ? x.h0 : zeros(state_count(c));
        expect_close(c, "h_n", &o.h_n, h0, state_count(c), 0);
        if (lstm(c)) {
            double *c0 = x.c0 ? x.c0 : zeros(state_count(c));
            expect_close(c, "c_n", &o.c_n, c0, state_count(c), 0);
            if (!x.c0)
                free(c0);
        }
        if (!x.h0)
            free(h0);
        rnn_bwd g;
        run_backward(dev, c, &d, &o.saved, &g);
        for (int64_t l = 0; l < c->layers; l++)
            for (int p = 0; p < 4; p++)
                if (g.dw[l][p].buffer) {
                    double *z = zeros(g.dw[l][p].numel);
                    expect_close(c, "a parameter's gradient", &g.dw[l][p], z, g.dw[l][p].numel, 0);
                    free(z);
                }
        if (g.dh0.buffer) {
            double *want = x.dh_n ? x.dh_n : zeros(state_count(c));
            expect_close(c, "dh0", &g.dh0, want, state_count(c), 0);
            if (!x.dh_n)
                free(want);
        }
        bwd_free(&g);
        fwd_free(&o);
        dev_free(&d);
        host_free(&x);
    }
}
END_TEST

/* ---- validation: the exact messages ---- */

static struct {
    fx_tensor t[24];
    int used;
} vt;

static fx_tensor *vtensor(fx_dtype type, int rank, const int64_t *dims)
{
    fx_device *dev = fx_test_device();
    fx_tensor *t = &vt.t[vt.used++];
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    double *v = zeros(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = 0.125;
    fx_test_tensor(dev, type, rank, dims, v, t);
    free(v);
    return t;
}

static void release_validation_tensors(void)
{
    for (int i = 0; i < vt.used; i++)
        fx_tensor_release(&vt.t[i]);
    vt.used = 0;
}

#define EXPECT_BADARG(call, text)                                                                          \
    do {                                                                                                   \
        fx_status st_;                                                                                     \
        fx_status_clear(&st_);                                                                             \
        fx_status *stp_ = &st_;                                                                            \
        (void)stp_;                                                                                        \
        int rc_ = (call);                                                                                  \
        ck_assert_msg(rc_ == FX_EBADARG, "expected a badarg, got %d: %s", rc_, st_.msg);                   \
        ck_assert_str_eq(st_.msg, (text));                                                                 \
    } while (0)

START_TEST(validation_messages)
{
    fx_device *dev = fx_test_device();
    const bool cpu = dev->kind == FX_DEVICE_CPU;
    const int64_t x3[3] = {2, 3, 4}, wih[2] = {15, 4}, whh[2] = {15, 5}, whh_bad[2] = {15, 4}, b[1] = {15},
                  b_bad[1] = {16}, st3[3] = {2, 2, 5}, st_bad[3] = {2, 2, 4}, w1[2] = {15, 5}, y3[3] = {2, 3, 5},
                  x2[2] = {2, 4}, y2[2] = {2, 5}, lw_hh[2] = {20, 5}, lw_ih[2] = {20, 4};
    fx_tensor *x = vtensor(FX_F32, 3, x3), *w_ih = vtensor(FX_F32, 2, wih), *w_hh = vtensor(FX_F32, 2, whh);
    fx_tensor *w_hh_bad = vtensor(FX_F32, 2, whh_bad), *w_hh_f16 = vtensor(FX_F16, 2, whh);
    fx_tensor *bias = vtensor(FX_F32, 1, b), *bias_bad = vtensor(FX_F32, 1, b_bad), *ints = vtensor(FX_S32, 3, x3);
    fx_tensor *h0 = vtensor(FX_F32, 3, st3), *h0_bad = vtensor(FX_F32, 3, st_bad), *w1_ih = vtensor(FX_F32, 2, w1);
    fx_tensor *y = vtensor(FX_F32, 3, y3), *y_bad = vtensor(FX_F16, 3, y3), *xs = vtensor(FX_F32, 2, x2);
    fx_tensor *ys = vtensor(FX_F32, 2, y2), *hs = vtensor(FX_F32, 3, st3), *hs16 = vtensor(FX_F16, 3, st3);
    fx_tensor *lstm_hh = vtensor(FX_F32, 2, lw_hh), *lstm_ih = vtensor(FX_F32, 2, lw_ih);
    fx_rnn_layer two[2] = {{w_ih, w_hh, bias, bias}, {w1_ih, w_hh, NULL, NULL}};
    fx_rnn_layer bad1[2] = {{w_ih, w_hh, bias, bias}, {w1_ih, w_hh_bad, NULL, NULL}};
    fx_rnn_inputs in = {.cell = FX_RNN_GRU, .layers = 2, .layer = two, .x = x};
#define WITH(field, value) (in2 = in, in2.field = (value), &in2)
    fx_rnn_inputs in2;
    fx_rnn_dims n;
    fx_status ok;
    fx_status_clear(&ok);
    ck_assert_int_eq(fx_rnn_check_forward(&in, &n, &ok), FX_OK);
    ck_assert_int_eq(n.hidden, 5);
    ck_assert_int_eq(n.input, 4);

    EXPECT_BADARG(fx_rnn_check_forward(WITH(cell, 7), &n, stp_), "cell: expected gru or lstm, got 7");
    EXPECT_BADARG(fx_rnn_check_forward(WITH(layers, 0), &n, stp_), "layers: expected at least one layer, got 0");
    EXPECT_BADARG(fx_rnn_check_forward(WITH(x, ints), &n, stp_),
                  cpu ? "x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                      : "x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    EXPECT_BADARG(fx_rnn_check_forward(WITH(x, xs), &n, stp_),
                  "x: expected rank 3 [batch, seqlen, input], got rank 2 shape {2,4}");
    EXPECT_BADARG(fx_rnn_check_forward(WITH(layer, bad1), &n, stp_),
                  "layers[1].w_hh: expected shape {15,5} ([3*hidden, hidden]), got {15,4}");
    fx_rnn_layer bad2[1] = {{w_ih, w_hh_f16, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward((in2 = in, in2.layers = 1, in2.layer = bad2, &in2), &n, stp_),
                  "layers[0].w_hh: expected type {f,32}, got {f,16}");
    fx_rnn_layer bad3[1] = {{w1_ih, w_hh, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward((in2 = in, in2.layers = 1, in2.layer = bad3, &in2), &n, stp_),
                  "layers[0].w_ih: expected shape {15,4} ([3*hidden, input]), got {15,5}");
    fx_rnn_layer bad4[2] = {{w_ih, w_hh, bias, bias}, {w_ih, w_hh, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward(WITH(layer, bad4), &n, stp_),
                  "layers[1].w_ih: expected shape {15,5} ([3*hidden, hidden]), got {15,4}");
    fx_rnn_layer bad5[2] = {{w_ih, w_hh, bias, bias_bad}, {w1_ih, w_hh, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward(WITH(layer, bad5), &n, stp_),
                  "layers[0].b_hh: expected shape {15} ([3*hidden]), got {16}");
    fx_rnn_layer bad6[1] = {{w_ih, NULL, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward((in2 = in, in2.layers = 1, in2.layer = bad6, &in2), &n, stp_),
                  "layers[0].w_hh: expected a tensor [3*hidden, hidden], got none");
    EXPECT_BADARG(fx_rnn_check_forward(WITH(h0, h0_bad), &n, stp_),
                  "h0: expected shape {2,2,5} ([layers, batch, hidden]), got {2,2,4}");
    EXPECT_BADARG(fx_rnn_check_forward(WITH(c0, h0), &n, stp_),
                  "c0: expected no tensor for a gru (it has no cell state), got one");
    /* an LSTM's gates are four blocks */
    fx_rnn_layer lstm1[1] = {{lstm_ih, w_hh, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward((in2 = in, in2.cell = FX_RNN_LSTM, in2.layers = 1, in2.layer = lstm1, &in2),
                                       &n, stp_),
                  "layers[0].w_hh: expected shape {20,5} ([4*hidden, hidden]), got {15,5}");
    fx_rnn_layer lstm2[1] = {{lstm_ih, lstm_hh, NULL, NULL}};
    EXPECT_BADARG(fx_rnn_check_forward((in2 = in, in2.cell = FX_RNN_LSTM, in2.layers = 1, in2.layer = lstm2,
                                        in2.h0 = NULL, in2.c0 = h0_bad, &in2),
                                       &n, stp_),
                  "c0: expected shape {1,2,5} ([layers, batch, hidden]), got {2,2,4}");
    /* outputs */
    EXPECT_BADARG(fx_op_rnn_forward_into(NULL, &in, y_bad, NULL, NULL, NULL, stp_),
                  "y: expected type {f,32}, got {f,16}");
    EXPECT_BADARG(fx_op_rnn_forward_into(NULL, &in, y, h0_bad, NULL, NULL, stp_),
                  "h_n: expected shape {2,2,5} ([layers, batch, hidden]), got {2,2,4}");
    EXPECT_BADARG(fx_op_rnn_forward_into(NULL, &in, y, NULL, NULL, y, stp_),
                  "saved: expected shape {2,2,3,25} ([layers, batch, seqlen, saved width], what a training forward "
                  "keeps), got {2,3,5}");
    /* the backward needs the saved tensor */
    fx_rnn_layer_grads lg[2] = {{0}};
    fx_rnn_grad_outs go = {.dx = x, .layer = lg};
    EXPECT_BADARG(fx_op_rnn_backward_into(NULL, &in, NULL, y, NULL, NULL, &go, stp_),
                  "saved: expected the tensor a training forward keeps ([layers, batch, seqlen, saved width], what "
                  "a training forward keeps), got none");
    /* step states */
    fx_rnn_inputs step = {.cell = FX_RNN_GRU, .layers = 2, .layer = two, .x = xs};
    EXPECT_BADARG(fx_op_rnn_step_into(NULL, &step, hs16, NULL, ys, stp_), "h: expected type {f,32}, got {f,16}");
    EXPECT_BADARG(fx_op_rnn_step_into(NULL, &step, hs, hs, ys, stp_),
                  "c: expected no tensor for a gru (it has no cell state), got one");
    EXPECT_BADARG(fx_op_rnn_step_into(NULL, &step, x, NULL, ys, stp_),
                  "h: expected shape {2,2,5} ([layers, batch, hidden]), got {2,3,4}");
    EXPECT_BADARG(fx_op_rnn_step_into(NULL, &step, hs, NULL, hs, stp_),
                  "y: expected shape {2,5} ([batch, hidden]), got {2,2,5}");
    /* in place: the states share no byte with what the step reads or writes */
    fx_tensor alias = *hs;
    alias.rank = 2;
    alias.dims[0] = 2;
    alias.dims[1] = 5;
    alias.numel = 10;
    alias.nbytes = 40;
    EXPECT_BADARG(fx_op_rnn_step_into(NULL, &step, hs, NULL, &alias, stp_),
                  "y: expected memory apart from h's (it is written in place while h is read), got an overlap of "
                  "their bytes");
    fx_tensor weight_alias = *w_hh;
    weight_alias.rank = 3;
    weight_alias.dims[0] = 2;
    weight_alias.dims[1] = 2;
    weight_alias.dims[2] = 5;
    weight_alias.numel = 20;
    weight_alias.nbytes = 80;
    EXPECT_BADARG(fx_op_rnn_step_into(NULL, &step, &weight_alias, NULL, ys, stp_),
                  "h: expected memory apart from layers[0].w_hh's (it is written in place while layers[0].w_hh is "
                  "read), got an overlap of their bytes");
#undef WITH
    release_validation_tensors();
}
END_TEST

/* The checks read shapes and types alone: tensors without data (what the
 * surfaces' check entries hand over) pass and fail as real ones do, and
 * the saved tensor's shape follows from them. */
START_TEST(checks_on_shape_only_tensors)
{
    fx_device *dev = fx_test_device();
    fx_tensor x = {.dtype = FX_BF16, .rank = 3, .dims = {4, 60, 100}, .device = dev};
    fx_tensor w_ih0 = {.dtype = FX_BF16, .rank = 2, .dims = {2048, 100}, .device = dev};
    fx_tensor w_ih1 = {.dtype = FX_BF16, .rank = 2, .dims = {2048, 512}, .device = dev};
    fx_tensor w_hh = {.dtype = FX_BF16, .rank = 2, .dims = {2048, 512}, .device = dev};
    fx_tensor b = {.dtype = FX_F32, .rank = 1, .dims = {2048}, .device = dev};
    fx_tensor h0 = {.dtype = FX_F32, .rank = 3, .dims = {2, 4, 512}, .device = dev};
    fx_rnn_layer layers[2] = {{&w_ih0, &w_hh, &b, &b}, {&w_ih1, &w_hh, NULL, NULL}};
    fx_rnn_inputs in = {.cell = FX_RNN_LSTM, .layers = 2, .layer = layers, .x = &x, .h0 = &h0, .c0 = &h0};
    fx_rnn_dims n;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_rnn_check_forward(&in, &n, &st), FX_OK);
    int64_t saved[4];
    ck_assert_int_eq(fx_rnn_saved_shape(&n, saved), 4);
    ck_assert_int_eq(saved[0], 2);
    ck_assert_int_eq(saved[1], 4);
    ck_assert_int_eq(saved[2], 60);
    ck_assert_int_eq(saved[3], 6 * 512);
    ck_assert_uint_ne(fx_op_rnn_forward_scratch(NULL, &in, true), SIZE_MAX);
    in.cell = FX_RNN_GRU;
    in.c0 = NULL;
    EXPECT_BADARG(fx_rnn_check_forward(&in, &n, stp_),
                  "layers[0].w_ih: expected shape {1536,100} ([3*hidden, input]), got {2048,100}");
}
END_TEST

static bool caller_gone(void *arg)
{
    (*(int *)arg)++;
    return false;
}

/* A caller that is gone stops the CPU recurrences early. */
START_TEST(cpu_stops_when_its_caller_is_gone)
{
    rnn_case c = {FX_RNN_GRU, 1, 1, 20000, 2, 3, FX_F32, 0, 0, 1, 0, 1, 0, 0, 0};
    fx_device *cpu = fx_test_oracle();
    rnn_host x;
    host_random(&c, &x);
    rnn_dev d;
    dev_make(cpu, &c, &x, &d);
    rnn_fwd o;
    run_forward(cpu, &c, &d, true, &o);
    int calls = 0;
    fx_cpu_watch_caller(caller_gone, &calls);
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_rnn_forward_into(NULL, &d.in, &o.y, NULL, NULL, &o.saved, &st), FX_EINTERNAL);
    ck_assert_str_eq(st.msg, "cancelled: the process that called gru exited before it finished");
    ck_assert_int_ge(calls, 1);
    fx_rnn_layer_grads g[1];
    fx_tensor dx, dw[4];
    poisoned_like(cpu, &d.x, &dx);
    for (int p = 0; p < 4; p++)
        poisoned_like(cpu, &d.w[0][p], &dw[p]);
    g[0] = (fx_rnn_layer_grads){&dw[0], &dw[1], &dw[2], &dw[3]};
    fx_rnn_grad_outs outs = {.dx = &dx, .layer = g};
    fx_status_clear(&st);
    calls = 0;
    ck_assert_int_eq(fx_op_rnn_backward_into(NULL, &d.in, &o.saved, &d.dy, NULL, NULL, &outs, &st), FX_EINTERNAL);
    ck_assert_str_eq(st.msg, "cancelled: the process that called gru_backward exited before it finished");
    ck_assert_int_ge(calls, 1);
    fx_cpu_unwatch_caller();
    fx_tensor_release(&dx);
    for (int p = 0; p < 4; p++)
        fx_tensor_release(&dw[p]);
    fwd_free(&o);
    dev_free(&d);
    host_free(&x);
}
END_TEST

Suite *fx_suite_rnn(void)
{
    Suite *s = suite_create("rnn");
    TCase *tc = tcase_create("gru and lstm");
    tcase_set_timeout(tc, 1800);
    tcase_add_checked_fixture(tc, NULL, release_validation_tensors);
    tcase_add_test(tc, cpu_matches_reference);
    tcase_add_test(tc, gradients_match_finite_differences);
    tcase_add_test(tc, steps_equal_the_forward);
    tcase_add_test(tc, cuda_matches_cpu_every_path);
    tcase_add_test(tc, cuda_matches_cpu_auto);
    tcase_add_test(tc, caller_contexts_with_exact_scratch);
    tcase_add_test(tc, empty_shapes);
    tcase_add_test(tc, validation_messages);
    tcase_add_test(tc, checks_on_shape_only_tensors);
    tcase_add_test(tc, cpu_stops_when_its_caller_is_gone);
    suite_add_tcase(s, tc);
    return s;
}
