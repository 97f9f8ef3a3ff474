/* Linear layers and the matrix product under them.
 *
 * The layer: forward and backward through the op layer's `_into` ops into
 * poisoned outputs, against an independent f64 reference written here
 * (on every device), CUDA against the CPU backend in every type, the CPU's
 * gradients against central differences of its own f64 forward, the
 * allocating forms and their contexts, a caller's context with exactly the
 * queried scratch, empty shapes, and every bad input with its message.
 *
 * gemm: the backend's product (the CPU's f64 loop; on CUDA cuBLASLt, or in
 * the emulator its stand-in with the real epilogue kernels) against an
 * independent f64 product written here, over shapes with k = 1 and k = 0,
 * odd and padded strides (the padding poisoned: read, it fails; and it
 * must stay untouched), every transpose, batches, every epilogue with and
 * without a bias and with the pre-activation kept, alpha and beta, every
 * type pair, and a caller's context with exactly the queried scratch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/linear.h"
#include "core/ops.h"
#include "fusex_dtype.h"
#include "fusex_linear.h"
#include "layers.h"
#include "testutil.h"

/* ---- an independent reference ---- */

static double ref_sigmoid(double u) { return 1.0 / (1.0 + exp(-u)); }

static double ref_activation(int act, double u)
{
    switch (act) {
    case FX_ACT_RELU: return u > 0 ? u : 0;
    case FX_ACT_GELU: {
        const double c = sqrt(2.0 / M_PI);
        return 0.5 * u * (1.0 + tanh(c * (u + 0.044715 * pow(u, 3))));
    }
    case FX_ACT_SILU: return u * ref_sigmoid(u);
    case FX_ACT_TANH: return tanh(u);
    case FX_ACT_SIGMOID: return ref_sigmoid(u);
    default: return u;
    }
}

/* d act / du, by hand */
static double ref_activation_grad(int act, double u)
{
    switch (act) {
    case FX_ACT_RELU: return u > 0 ? 1 : 0;
    case FX_ACT_GELU: {
        const double c = sqrt(2.0 / M_PI), inner = c * (u + 0.044715 * pow(u, 3)), th = tanh(inner);
        return 0.5 * (1.0 + th) + 0.5 * u * (1.0 / pow(cosh(inner), 2)) * c * (1.0 + 3 * 0.044715 * u * u);
    }
    case FX_ACT_SILU: return ref_sigmoid(u) + u * ref_sigmoid(u) * (1.0 - ref_sigmoid(u));
    case FX_ACT_TANH: return 1.0 / pow(cosh(u), 2);
    case FX_ACT_SIGMOID: return ref_sigmoid(u) * (1.0 - ref_sigmoid(u));
    default: return 1;
    }
}

/* ---- gemm ---- */

typedef struct gemm_case {
    int64_t m, n, k, batch;
    bool ta, tb;
    int64_t pad; /* extra elements at the end of every stored row (and between batches) */
    fx_dtype ab, c, bias_type;
    int act;
    bool bias, aux, tf32;
    float alpha, beta;
} gemm_case;

static const char *gemm_text(const gemm_case *g)
{
    static char buf[200];
    snprintf(buf, sizeof buf, "m%lld n%lld k%lld batch %lld %c%c pad %lld %s->%s act %s%s%s bias %s alpha %g beta %g%s",
             (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch, g->ta ? 'T' : 'N',
             g->tb ? 'T' : 'N', (long long)g->pad, fx_dtype_name(g->ab), fx_dtype_name(g->c),
             fx_activation_name(g->act), g->bias ? " +bias" : "", g->aux ? " +aux" : "",
             g->bias ? fx_dtype_name(g->bias_type) : "-", g->alpha, g->beta, g->tf32 ? " tf32" : "");
    return buf;
}

/* A stored matrix: rows x cols at ld, batches stride apart, padding NaN. */
typedef struct stored {
    int64_t rows, cols, ld, stride, total;
    double *v;
} stored;

static stored stored_make(int64_t rows, int64_t cols, int64_t pad, int64_t batch, fx_dtype t, bool values)
{
    stored s;
    s.rows = rows;
    s.cols = cols;
    s.ld = (cols > 0 ? cols : 1) + pad;
    s.stride = rows * s.ld + (batch > 1 ? pad : 0);
    s.total = s.stride * batch;
    s.v = fx_lt_alloc(s.total);
    for (int64_t i = 0; i < s.total; i++)
        s.v[i] = NAN;
    if (values)
        for (int64_t b = 0; b < batch; b++)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++)
                    s.v[b * s.stride + r * s.ld + c] = fx_lt_round(t, fx_rand_uniform(-1.0, 1.0));
    return s;
}

static void upload_flat(fx_device *dev, fx_dtype t, const double *v, int64_t n, fx_tensor *out)
{
    int64_t dims[1] = {n > 0 ? n : 1};
    double one = NAN;
    fx_test_tensor(dev, t, 1, dims, n > 0 ? v : &one, out);
}

static void gemm_reference(const gemm_case *g, const stored *a, const stored *b, const stored *c0, const double *bias,
                           double *want_c, double *want_aux)
{
    for (int64_t bt = 0; bt < g->batch; bt++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double acc = 0;
                for (int64_t kk = 0; kk < g->k; kk++) {
                    const double av = g->ta ? a->v[bt * a->stride + kk * a->ld + i] : a->v[bt * a->stride + i * a->ld + kk];
                    const double bv = g->tb ? b->v[bt * b->stride + j * b->ld + kk] : b->v[bt * b->stride + kk * b->ld + j];
                    acc += av * bv;
                }
                const int64_t at = bt * c0->stride + i * c0->ld + j;
                double pre = g->alpha * acc;
                if (g->beta != 0)
                    pre += g->beta * c0->v[at];
                if (g->bias)
                    pre += bias[j];
                want_aux[at] = pre;
                want_c[at] = ref_activation(g->act, pre);
            }
}

/* The valid elements of a stored C (its padding apart), and whether every
 * padding element is still NaN (the product wrote nothing there). */
static int64_t gather(const gemm_case *g, const stored *c, const double *all, double *out, bool *padding_intact)
{
    int64_t n = 0;
    *padding_intact = true;
    for (int64_t i = 0; i < c->total; i++) {
        const int64_t bt = i / c->stride, rem = i % c->stride, r = rem / c->ld, col = rem % c->ld;
        const bool valid = bt < g->batch && r < g->m && col < g->n;
        if (valid)
            out[n++] = all[i];
        else if (!isnan(all[i]))
            *padding_intact = false;
    }
    return n;
}

static void check_gemm_case(const gemm_case *g, bool caller_context)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    const int64_t a_rows = g->ta ? g->k : g->m, a_cols = g->ta ? g->m : g->k;
    const int64_t b_rows = g->tb ? g->n : g->k, b_cols = g->tb ? g->k : g->n;
    stored a = stored_make(a_rows, a_cols, g->pad, g->batch, g->ab, true);
    stored b = stored_make(b_rows, b_cols, g->pad, g->batch, g->ab, true);
    stored c0 = stored_make(g->m, g->n, g->pad, g->batch, g->c, g->beta != 0);
    double *bias = fx_lt_uniform(g->n, -0.5, 0.5, g->bias_type);
    double *want_c = fx_lt_alloc(c0.total), *want_aux = fx_lt_alloc(c0.total);
    gemm_reference(g, &a, &b, &c0, bias, want_c, want_aux);

    fx_tensor ta, tb, tc, taux, tbias;
    upload_flat(dev, g->ab, a.v, a.total, &ta);
    upload_flat(dev, g->ab, b.v, b.total, &tb);
    upload_flat(dev, g->c, c0.v, c0.total, &tc);
    double *poison = fx_lt_alloc(c0.total);
    for (int64_t i = 0; i < c0.total; i++) /* aux starts poisoned everywhere */
        poison[i] = NAN;
    upload_flat(dev, g->c, poison, c0.total, &taux);
    free(poison);
    upload_flat(dev, g->bias_type, bias, g->n, &tbias);
    fx_gemm_args args = {
        .trans_a = g->ta, .trans_b = g->tb, .m = g->m, .n = g->n, .k = g->k,
        .a = ta.data, .lda = a.ld, .b = tb.data, .ldb = b.ld, .c = tc.data, .ldc = c0.ld,
        .ab_type = g->ab, .c_type = g->c, .alpha = g->alpha, .beta = g->beta,
        .bias = g->bias ? tbias.data : NULL, .bias_type = g->bias_type, .activation = g->act,
        .aux = g->aux ? taux.data : NULL, .allow_tf32 = g->tf32,
        .batch = g->batch, .stride_a = a.stride, .stride_b = b.stride, .stride_c = c0.stride,
    };
    const struct fx_linear_ops *ops = dev->backend->linear;
    if (caller_context) {
        fx_lt_own_stream_done(dev);
        fx_lt_caller caller;
        fx_lt_caller_open(dev, ops->gemm_scratch(NULL, &args), &caller);
        ops->gemm(&caller.ex, &args, &st);
        fx_lt_caller_close(&caller);
    } else {
        fx_exec ex;
        ck_assert_ptr_nonnull(fx_exec_resolve(dev, NULL, &ex, &st));
        ops->gemm(&ex, &args, &st);
    }
    ck_assert_msg(st.code == FX_OK, "gemm %s: %s", gemm_text(g), st.msg);

    double *got_c = fx_test_read(&tc), *got_aux = fx_test_read(&taux);
    double *gc = fx_lt_alloc(c0.total), *wc = fx_lt_alloc(c0.total);
    bool intact, ignored;
    const int64_t n = gather(g, &c0, got_c, gc, &intact);
    gather(g, &c0, want_c, wc, &ignored);
    ck_assert_msg(intact, "gemm wrote C's padding for %s", gemm_text(g));
    const double tol = g->tf32 ? 5e-3 : fx_lt_tolerance(g->c);
    FX_LT_CLOSE("gemm C", gc, wc, n, tol, gemm_text(g));
    if (g->aux) {
        gather(g, &c0, got_aux, gc, &intact);
        gather(g, &c0, want_aux, wc, &ignored);
        ck_assert_msg(intact, "gemm wrote aux's padding for %s", gemm_text(g));
        FX_LT_CLOSE("gemm aux", gc, wc, n, tol, gemm_text(g));
    }
    free(gc);
    free(wc);
    free(got_c);
    free(got_aux);
    fx_tensor *all[] = {&ta, &tb, &tc, &taux, &tbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    free(a.v);
    free(b.v);
    free(c0.v);
    free(bias);
    free(want_c);
    free(want_aux);
}

static gemm_case gemm_plain(int64_t m, int64_t n, int64_t k)
{
    gemm_case g = {.m = m, .n = n, .k = k, .batch = 1, .tb = true, .ab = FX_F32, .c = FX_F32, .bias_type = FX_F32,
                   .alpha = 1.0f};
    return g;
}

START_TEST(gemm_every_epilogue)
{
    for (int act = 0; act < FX_ACT_COUNT; act++)
        for (int variant = 0; variant < 4; variant++) {
            gemm_case g = gemm_plain(7, 37, 13);
            g.act = act;
            g.bias = variant & 1;
            g.aux = variant & 2;
            check_gemm_case(&g, false);
        }
}
END_TEST

START_TEST(gemm_shapes_and_transposes)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 1}, {7, 37, 13}, {37, 1, 64}, {16, 24, 1000},
                                 {33, 65, 17}, {1, 300, 256}, {64, 64, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            gemm_case g = gemm_plain(shapes[s][0], shapes[s][1], shapes[s][2]);
            g.ta = t & 1;
            g.tb = t & 2;
            g.pad = (int64_t)((s + (size_t)t) % 3) * 3;
            g.bias = (s + (size_t)t) % 2 == 0;
            check_gemm_case(&g, false);
        }
}
END_TEST

START_TEST(gemm_types)
{
    const fx_dtype halves[] = {FX_BF16, FX_F16};
    const int acts[] = {FX_ACT_NONE, FX_ACT_GELU, FX_ACT_SILU};
    const int64_t shapes[][3] = {{17, 40, 64}, {16, 24, 1000}, {5, 9, 1}};
    int count = 0;
    for (size_t h = 0; h < 2; h++)
        for (int out = 0; out < 2; out++)
            for (int bias_f32 = 0; bias_f32 < 2; bias_f32++)
                for (size_t a = 0; a < 3; a++) {
                    const int64_t *s = shapes[(size_t)count++ % 3];
                    gemm_case g = gemm_plain(s[0], s[1], s[2]);
                    g.ab = halves[h];
                    g.c = out ? FX_F32 : halves[h];
                    g.bias = true;
                    g.bias_type = bias_f32 ? FX_F32 : halves[h];
                    g.act = acts[a];
                    g.aux = a == 2;
                    g.ta = count % 2;
                    g.pad = count % 3 == 0 ? 8 : 0;
                    check_gemm_case(&g, false);
                }
    /* f32 with TF32 allowed: within TF32's precision (exact f32 where the
     * backend has no TF32) */
    gemm_case g = gemm_plain(33, 64, 256);
    g.tf32 = true;
    check_gemm_case(&g, false);
}
END_TEST

START_TEST(gemm_batches_alpha_beta_and_empty_k)
{
    const fx_dtype types[] = {FX_F32, FX_BF16};
    for (size_t t = 0; t < 2; t++)
        for (int variant = 0; variant < 4; variant++) {
            gemm_case g = gemm_plain(9, 20, 31);
            g.ab = g.c = g.bias_type = types[t];
            g.batch = 3;
            g.pad = variant % 2 ? 4 : 0;
            g.tb = variant & 1;
            g.ta = variant & 2;
            g.alpha = 0.5f;
            g.beta = variant >= 2 ? 0.75f : 0.0f;
            g.bias = true;
            g.act = variant % 2 ? FX_ACT_GELU : FX_ACT_RELU;
            g.aux = variant != 0;
            check_gemm_case(&g, false);
        }
    /* batches of rows 130 wide through the epilogue kernel (silu, tanh:
     * no cuBLASLt epilogue), with and without the pre-activation kept */
    for (int variant = 0; variant < 4; variant++) {
        gemm_case g = gemm_plain(6, 130, 17);
        g.ab = g.c = g.bias_type = types[variant % 2];
        g.batch = 3;
        g.pad = variant >= 2 ? 2 : 0;
        g.beta = variant == 3 ? 0.5f : 0.0f;
        g.bias = variant != 1;
        g.act = variant % 2 ? FX_ACT_TANH : FX_ACT_SILU;
        g.aux = variant >= 1;
        check_gemm_case(&g, false);
    }
    /* k = 0: alpha·AB is nothing, C = act(beta C + bias) */
    for (int beta = 0; beta < 2; beta++) {
        gemm_case g = gemm_plain(5, 7, 0);
        g.beta = beta ? 0.5f : 0.0f;
        g.bias = true;
        g.act = FX_ACT_TANH;
        g.aux = true;
        check_gemm_case(&g, false);
    }
    /* m or n 0: nothing to write, nothing read */
    gemm_case none = gemm_plain(0, 7, 5);
    check_gemm_case(&none, false);
    none = gemm_plain(4, 0, 5);
    check_gemm_case(&none, false);
}
END_TEST

START_TEST(gemm_in_a_callers_context)
{
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    for (size_t t = 0; t < 3; t++) {
        gemm_case g = gemm_plain(12, 48, 40);
        g.ab = g.c = g.bias_type = types[t];
        g.bias = true;
        g.act = FX_ACT_SIGMOID;
        g.aux = true;
        g.batch = 2;
        check_gemm_case(&g, true);
    }
}
END_TEST

START_TEST(gemm_refuses_what_it_cannot_do)
{
    fx_device *dev = fx_test_device();
    fx_exec ex;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_ptr_nonnull(fx_exec_resolve(dev, NULL, &ex, &st));
    float buf[64] = {0};
    fx_gemm_args g = {.m = 2, .n = 3, .k = 4, .a = buf, .lda = 4, .b = buf, .ldb = 3, .c = buf, .ldc = 3,
                      .ab_type = FX_F32, .c_type = FX_F32, .alpha = 1, .batch = 1};
    fx_gemm_args bad = g;
    bad.ldb = 2;
    int rc = dev->backend->linear->gemm(&ex, &bad, &st);
    ck_assert_int_eq(rc, FX_EBADARG);
    ck_assert_msg(strstr(st.msg, "gemm: expected") == st.msg && strstr(st.msg, "ldb"), "got \"%s\"", st.msg);
    fx_status_clear(&st);
    bad = g;
    bad.ab_type = FX_S32;
    rc = dev->backend->linear->gemm(&ex, &bad, &st);
    ck_assert_int_eq(rc, FX_EBADARG);
    ck_assert_msg(strstr(st.msg, "gemm: expected") == st.msg && strstr(st.msg, "{s,32}"), "got \"%s\"", st.msg);
    fx_status_clear(&st);
    bad = g;
    bad.m = -1;
    rc = dev->backend->linear->gemm(&ex, &bad, &st);
    ck_assert_int_eq(rc, FX_EBADARG);
    ck_assert_str_eq(st.msg, "gemm: expected m, n, k >= 0 and batch >= 1, got m -1, n 3, k 4, batch 1");
}
END_TEST

/* ---- the layer ---- */

typedef struct lin_case {
    int nlead;
    int64_t lead[3]; /* x's leading dimensions */
    int64_t in, out;
    fx_dtype type, bias_type;
    int act;
    bool bias, tf32;
} lin_case;

static int64_t lin_rows(const lin_case *c)
{
    int64_t rows = 1;
    for (int i = 0; i < c->nlead; i++)
        rows *= c->lead[i];
    return rows;
}

static const char *lin_text(const lin_case *c)
{
    static char buf[200];
    char lead[64] = "";
    for (int i = 0; i < c->nlead; i++)
        snprintf(lead + strlen(lead), sizeof lead - strlen(lead), "%lldx", (long long)c->lead[i]);
    snprintf(buf, sizeof buf, "x %s%lld -> %lld %s act %s%s%s%s", lead, (long long)c->in, (long long)c->out,
             fx_dtype_name(c->type), fx_activation_name(c->act), c->bias ? " +bias " : "",
             c->bias ? fx_dtype_name(c->bias_type) : "", c->tf32 ? " tf32" : "");
    return buf;
}

typedef struct lin_host {
    lin_case c;
    int64_t rows;
    double *x, *w, *bias, *dy;
} lin_host;

static lin_host lin_random(lin_case c)
{
    lin_host h = {.c = c, .rows = lin_rows(&c)};
    const double scale = 1.0 / sqrt((double)(c.in > 0 ? c.in : 1));
    h.x = fx_lt_uniform(h.rows * c.in, -1.0, 1.0, c.type);
    h.w = fx_lt_uniform(c.out * c.in, -2.0 * scale, 2.0 * scale, c.type);
    h.bias = fx_lt_uniform(c.out, -0.5, 0.5, c.bias_type);
    h.dy = fx_lt_uniform(h.rows * c.out, -1.0, 1.0, c.type);
    return h;
}

static void lin_host_free(lin_host *h)
{
    free(h->x);
    free(h->w);
    free(h->bias);
    free(h->dy);
}

typedef struct lin_ref {
    double *pre, *y, *dx, *dw, *dbias;
} lin_ref;

/* The layer's equations as loops in f64. */
static lin_ref lin_reference(const lin_host *h)
{
    const lin_case *c = &h->c;
    const int64_t R = h->rows, I = c->in, O = c->out;
    lin_ref r = {fx_lt_alloc(R * O), fx_lt_alloc(R * O), fx_lt_alloc(R * I), fx_lt_alloc(O * I), fx_lt_alloc(O)};
    double *dpre = fx_lt_alloc(R * O);
    for (int64_t i = 0; i < R; i++)
        for (int64_t o = 0; o < O; o++) {
            double acc = c->bias ? h->bias[o] : 0.0;
            for (int64_t k = 0; k < I; k++)
                acc += h->x[i * I + k] * h->w[o * I + k];
            r.pre[i * O + o] = acc;
            r.y[i * O + o] = ref_activation(c->act, acc);
            dpre[i * O + o] = h->dy[i * O + o] * ref_activation_grad(c->act, acc);
        }
    for (int64_t i = 0; i < R; i++)
        for (int64_t k = 0; k < I; k++) {
            double acc = 0;
            for (int64_t o = 0; o < O; o++)
                acc += dpre[i * O + o] * h->w[o * I + k];
            r.dx[i * I + k] = acc;
        }
    for (int64_t o = 0; o < O; o++) {
        for (int64_t k = 0; k < I; k++) {
            double acc = 0;
            for (int64_t i = 0; i < R; i++)
                acc += dpre[i * O + o] * h->x[i * I + k];
            r.dw[o * I + k] = acc;
        }
        double sum = 0;
        for (int64_t i = 0; i < R; i++)
            sum += dpre[i * O + o];
        r.dbias[o] = sum;
    }
    free(dpre);
    return r;
}

static void lin_ref_free(lin_ref *r)
{
    free(r->pre);
    free(r->y);
    free(r->dx);
    free(r->dw);
    free(r->dbias);
}

/* Tensors of a case on one device, and poisoned outputs. */
typedef struct lin_dev {
    fx_tensor x, w, bias, dy, y, pre, dx, dw, dbias;
    fx_linear_inputs in;
    int rank_x;
    int64_t xdims[4], ydims[4];
} lin_dev;

static void lin_upload(fx_device *dev, const lin_host *h, fx_dtype type, fx_dtype bias_type, lin_dev *t)
{
    const lin_case *c = &h->c;
    memset(t, 0, sizeof *t);
    t->rank_x = c->nlead + 1;
    memcpy(t->xdims, c->lead, sizeof(int64_t) * (size_t)c->nlead);
    memcpy(t->ydims, c->lead, sizeof(int64_t) * (size_t)c->nlead);
    t->xdims[c->nlead] = c->in;
    t->ydims[c->nlead] = c->out;
    const int64_t wd[2] = {c->out, c->in}, bd[1] = {c->out};
    fx_test_tensor(dev, type, t->rank_x, t->xdims, h->x, &t->x);
    fx_test_tensor(dev, type, 2, wd, h->w, &t->w);
    fx_test_tensor(dev, bias_type, 1, bd, h->bias, &t->bias);
    fx_test_tensor(dev, type, t->rank_x, t->ydims, h->dy, &t->dy);
    fx_test_poisoned(dev, type, t->rank_x, t->ydims, &t->y);
    fx_test_poisoned(dev, type, t->rank_x, t->ydims, &t->pre);
    fx_test_poisoned(dev, type, t->rank_x, t->xdims, &t->dx);
    fx_test_poisoned(dev, type, 2, wd, &t->dw);
    fx_test_poisoned(dev, bias_type, 1, bd, &t->dbias);
    t->in = (fx_linear_inputs){.x = &t->x, .w = &t->w, .bias = c->bias ? &t->bias : NULL, .activation = c->act,
                               .allow_tf32 = c->tf32};
}

static void lin_release(lin_dev *t)
{
    fx_tensor *all[] = {&t->x, &t->w, &t->bias, &t->dy, &t->y, &t->pre, &t->dx, &t->dw, &t->dbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
}

static fx_linear_grad_outs lin_grads(lin_dev *t) { return (fx_linear_grad_outs){&t->dx, &t->dw, t->in.bias ? &t->dbias : NULL}; }

/* Forward (keeping pre) then backward on ex (NULL: the device's own). */
static void lin_run(const fx_exec *ex, lin_dev *t)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_linear_forward_into(ex, &t->in, &t->y, &t->pre, &st);
    ck_assert_msg(st.code == FX_OK, "linear forward: %s", st.msg);
    const fx_linear_grad_outs g = lin_grads(t);
    fx_op_linear_backward_into(ex, &t->in, fx_linear_reads_output(t->in.activation) ? &t->y : NULL,
                               fx_linear_reads_pre(t->in.activation) ? &t->pre : NULL, &t->dy, &g, &st);
    ck_assert_msg(st.code == FX_OK, "linear backward: %s", st.msg);
}

typedef struct lin_got {
    double *y, *pre, *dx, *dw, *dbias;
} lin_got;

static lin_got lin_read(const lin_dev *t)
{
    lin_got g = {fx_test_read(&t->y), fx_test_read(&t->pre), fx_test_read(&t->dx), fx_test_read(&t->dw),
                 fx_test_read(&t->dbias)};
    return g;
}

static void lin_got_free(lin_got *g)
{
    free(g->y);
    free(g->pre);
    free(g->dx);
    free(g->dw);
    free(g->dbias);
}

/* A gradient summed over the rows in f32 may cancel: its tolerance scales
 * with sqrt(terms) / 4 (docs/TESTING.md). */
static double summed_tolerance(double tol, int64_t terms)
{
    const double scale = sqrt((double)terms) / 4.0;
    return tol * (scale > 1.0 ? scale : 1.0);
}

static void lin_compare(const lin_case *c, int64_t rows, const lin_got *got, const double *y, const double *pre,
                        const double *dx, const double *dw, const double *dbias, double tol)
{
    const int64_t ny = rows * c->out;
    FX_LT_CLOSE("y", got->y, y, ny, tol, lin_text(c));
    FX_LT_CLOSE("pre", got->pre, pre, ny, tol, lin_text(c));
    FX_LT_CLOSE("dx", got->dx, dx, rows * c->in, tol, lin_text(c));
    FX_LT_CLOSE_SUM("dw", got->dw, dw, c->out * c->in, rows, summed_tolerance(tol, rows), lin_text(c));
    if (c->bias)
        FX_LT_CLOSE_SUM("dbias", got->dbias, dbias, c->out, rows, summed_tolerance(c->bias_type == FX_F32 && c->type != FX_F32 ? 1e-2 : tol, rows),
                    lin_text(c));
}

/* f64: two f64 implementations summing in different orders */
static double lin_tolerance(const lin_case *c) { return c->tf32 ? 5e-3 : c->type == FX_F64 ? 1e-10 : fx_lt_tolerance(c->type); }

/* The device under test against the f64 reference. */
static void check_layer_case(lin_case c)
{
    fx_device *dev = fx_test_device();
    lin_host h = lin_random(c);
    lin_ref want = lin_reference(&h);
    lin_dev t;
    lin_upload(dev, &h, c.type, c.bias_type, &t);
    lin_run(NULL, &t);
    lin_got got = lin_read(&t);
    lin_compare(&c, h.rows, &got, want.y, want.pre, want.dx, want.dw, want.dbias, lin_tolerance(&c));
    lin_got_free(&got);
    lin_release(&t);
    lin_ref_free(&want);
    lin_host_free(&h);
}

static lin_case lin_of(int64_t rows, int64_t in, int64_t out, fx_dtype type, int act, bool bias)
{
    lin_case c = {.nlead = 1, .lead = {rows}, .in = in, .out = out, .type = type, .bias_type = type, .act = act,
                  .bias = bias};
    return c;
}

START_TEST(layer_matches_reference)
{
    /* rows, in, out: K 1 and 1000, single rows and columns, odd sizes;
     * rows of 128 columns and more (CUDA's epilogue a row a block) */
    const int64_t shapes[][3] = {{7, 1, 16}, {37, 1000, 9}, {1, 37, 65}, {5, 16, 1}, {16, 64, 48}, {1, 256, 40},
                                 {5, 24, 200}, {3, 7, 129}};
    int count = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int act = 0; act < FX_ACT_COUNT; act++) {
            lin_case c = lin_of(shapes[s][0], shapes[s][1], shapes[s][2], FX_F32, act, (count++ % 3) != 0);
            check_layer_case(c);
        }
    /* x of rank 3, and rank 1 (one row) */
    lin_case c = lin_of(1, 20, 12, FX_F32, FX_ACT_SILU, true);
    c.nlead = 2;
    c.lead[0] = 3;
    c.lead[1] = 5;
    check_layer_case(c);
    c.nlead = 0;
    check_layer_case(c);
}
END_TEST

START_TEST(layer_every_type)
{
    fx_device *dev = fx_test_device();
    const fx_dtype types[] = {FX_BF16, FX_F16, FX_F64};
    const int acts[] = {FX_ACT_NONE, FX_ACT_RELU, FX_ACT_GELU, FX_ACT_SILU, FX_ACT_TANH, FX_ACT_SIGMOID};
    for (size_t t = 0; t < 3; t++) {
        if (types[t] == FX_F64 && dev->kind != FX_DEVICE_CPU)
            continue;
        for (size_t a = 0; a < 6; a++) {
            lin_case c = lin_of(a % 2 ? 24 : 7, a % 3 == 0 ? 1000 : 40, 33, types[t], acts[a], a != 1);
            if (a == 4)
                c.bias_type = FX_F32; /* a bias of another type than x's */
            check_layer_case(c);
        }
    }
    /* f32 with TF32 allowed: within TF32's precision */
    lin_case c = lin_of(32, 512, 64, FX_F32, FX_ACT_GELU, true);
    c.tf32 = true;
    check_layer_case(c);
}
END_TEST

/* The device under test against the CPU backend on the same inputs. */
START_TEST(cuda_matches_cpu)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return; /* the sweeps above compare the CPU with the reference */
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    for (size_t t = 0; t < 3; t++)
        for (int act = 0; act < FX_ACT_COUNT; act++) {
            lin_case c = lin_of(act % 2 ? 13 : 40, act == 2 ? 1000 : 48, 72, types[t], act, act != 3);
            lin_host h = lin_random(c);
            lin_dev d, cpu;
            lin_upload(dev, &h, c.type, c.bias_type, &d);
            lin_upload(fx_test_oracle(), &h, c.type, c.bias_type, &cpu);
            lin_run(NULL, &d);
            lin_run(NULL, &cpu);
            lin_got got = lin_read(&d), want = lin_read(&cpu);
            lin_compare(&c, h.rows, &got, want.y, want.pre, want.dx, want.dw, want.dbias, lin_tolerance(&c));
            lin_got_free(&got);
            lin_got_free(&want);
            lin_release(&d);
            lin_release(&cpu);
            lin_host_free(&h);
        }
}
END_TEST

/* sum(dy * y) of the CPU's f64 forward, with x, w or bias nudged. */
static double cpu_loss(const lin_host *h, int which, int64_t at, double delta)
{
    lin_host k = *h;
    double *nudged = NULL;
    const double *src = which == 0 ? h->x : which == 1 ? h->w : h->bias;
    const int64_t n = which == 0 ? h->rows * h->c.in : which == 1 ? h->c.out * h->c.in : h->c.out;
    nudged = fx_lt_alloc(n);
    memcpy(nudged, src, sizeof(double) * (size_t)n);
    nudged[at] += delta;
    if (which == 0)
        k.x = nudged;
    else if (which == 1)
        k.w = nudged;
    else
        k.bias = nudged;
    lin_dev t;
    lin_upload(fx_test_oracle(), &k, FX_F64, FX_F64, &t);
    fx_status st;
    fx_status_clear(&st);
    fx_op_linear_forward_into(NULL, &t.in, &t.y, NULL, &st);
    FX_CK_OK(st);
    double *y = fx_test_read(&t.y), loss = 0;
    for (int64_t i = 0; i < h->rows * h->c.out; i++)
        loss += h->dy[i] * y[i];
    free(y);
    free(nudged);
    lin_release(&t);
    return loss;
}

START_TEST(cpu_gradients_match_finite_differences)
{
    for (int act = 0; act < FX_ACT_COUNT; act++) {
        lin_case c = lin_of(3, 5, 4, FX_F64, act, true);
        lin_host h = lin_random(c);
        lin_dev t;
        lin_upload(fx_test_oracle(), &h, FX_F64, FX_F64, &t);
        lin_run(NULL, &t);
        lin_got got = lin_read(&t);
        const double *grads[3] = {got.dx, got.dw, got.dbias};
        const int64_t counts[3] = {h.rows * c.in, c.out * c.in, c.out};
        for (int which = 0; which < 3; which++)
            for (int64_t i = 0; i < counts[which]; i++) {
                const double step = 1e-6;
                const double fd = (cpu_loss(&h, which, i, step) - cpu_loss(&h, which, i, -step)) / (2 * step);
                ck_assert_msg(fabs(fd - grads[which][i]) <= 1e-6 * (1 + fabs(fd)),
                              "act %s: gradient %d[%lld] %.10g, central difference %.10g (seed %llu)",
                              fx_activation_name(act), which, (long long)i, grads[which][i], fd,
                              (unsigned long long)fx_test_seed());
            }
        lin_got_free(&got);
        lin_release(&t);
        lin_host_free(&h);
    }
}
END_TEST

START_TEST(contexts_keep_what_the_backward_reads)
{
    fx_device *dev = fx_test_device();
    for (int act = 0; act < FX_ACT_COUNT; act++) {
        lin_case c = lin_of(6, 10, 7, FX_F32, act, act % 2 == 0);
        lin_host h = lin_random(c);
        lin_ref want = lin_reference(&h);
        lin_dev t;
        lin_upload(dev, &h, c.type, c.bias_type, &t);
        fx_status st;
        fx_status_clear(&st);
        fx_tensor y;
        fx_linear_ctx *ctx = NULL;
        fx_op_linear_forward(&t.in, &y, &ctx, &st);
        FX_CK_OK(st);
        ck_assert_uint_eq(fx_linear_ctx_saved_bytes(ctx), fx_linear_reads_pre(act) ? y.nbytes : 0);
        lin_release(&t); /* the context holds its own references */
        fx_linear_grads g;
        fx_tensor dy;
        int64_t yd[2] = {6, 7};
        fx_test_tensor(dev, FX_F32, 2, yd, h.dy, &dy);
        fx_op_linear_backward(ctx, &dy, &g, &st);
        FX_CK_OK(st);
        ck_assert_int_eq(g.dbias.buffer != NULL, c.bias);
        double *gy = fx_test_read(&y), *gdx = fx_test_read(&g.dx), *gdw = fx_test_read(&g.dw);
        FX_LT_CLOSE("y", gy, want.y, 42, 1e-5, lin_text(&c));
        FX_LT_CLOSE("dx", gdx, want.dx, 60, 1e-5, lin_text(&c));
        FX_LT_CLOSE("dw", gdw, want.dw, 70, 1e-5, lin_text(&c));
        if (c.bias) {
            double *gdb = fx_test_read(&g.dbias);
            FX_LT_CLOSE("dbias", gdb, want.dbias, 7, 1e-5, lin_text(&c));
            free(gdb);
        }
        free(gy);
        free(gdx);
        free(gdw);
        fx_linear_grads_release(&g);
        fx_tensor_release(&dy);
        fx_tensor_release(&y);
        fx_linear_ctx_free(ctx);
        lin_ref_free(&want);
        lin_host_free(&h);
    }
}
END_TEST

START_TEST(callers_context_with_exact_scratch)
{
    fx_device *dev = fx_test_device();
    const fx_dtype types[] = {FX_F32, FX_BF16};
    for (size_t k = 0; k < 2; k++)
        for (int act = FX_ACT_NONE; act <= FX_ACT_SILU; act++) {
            lin_case c = lin_of(700, 24, 20, types[k], act, true); /* enough rows for the sums' partials */
            lin_host h = lin_random(c);
            lin_ref want = lin_reference(&h);
            lin_dev t;
            lin_upload(dev, &h, c.type, c.bias_type, &t);
            fx_lt_own_stream_done(dev);
            fx_lt_caller fwd, bwd;
            fx_lt_caller_open(dev, fx_op_linear_forward_scratch(NULL, &t.in, &t.y, &t.pre), &fwd);
            fx_status st;
            fx_status_clear(&st);
            fx_op_linear_forward_into(&fwd.ex, &t.in, &t.y, &t.pre, &st);
            FX_CK_OK(st);
            fx_lt_caller_close(&fwd);
            const fx_linear_grad_outs g = lin_grads(&t);
            const fx_tensor *y = fx_linear_reads_output(act) ? &t.y : NULL, *pre = fx_linear_reads_pre(act) ? &t.pre : NULL;
            fx_lt_caller_open(dev, fx_op_linear_backward_scratch(NULL, &t.in, y, pre, &t.dy, &g), &bwd);
            fx_op_linear_backward_into(&bwd.ex, &t.in, y, pre, &t.dy, &g, &st);
            FX_CK_OK(st);
            fx_lt_caller_close(&bwd);
            lin_got got = lin_read(&t);
            lin_compare(&c, h.rows, &got, want.y, want.pre, want.dx, want.dw, want.dbias, lin_tolerance(&c));
            lin_got_free(&got);
            lin_release(&t);
            lin_ref_free(&want);
            lin_host_free(&h);
        }
}
END_TEST

START_TEST(empty_shapes)
{
    /* no rows: empty outputs, zero dw and dbias; no inputs: y = act(bias);
     * no outputs: zero dx */
    const int64_t shapes[][3] = {{0, 5, 4}, {6, 0, 4}, {6, 5, 0}};
    for (size_t s = 0; s < 3; s++) {
        lin_case c = lin_of(shapes[s][0], shapes[s][1], shapes[s][2], FX_F32, FX_ACT_SIGMOID, true);
        check_layer_case(c);
    }
}
END_TEST

static void tensor_of(fx_device *dev, fx_dtype t, int rank, const int64_t *dims, fx_tensor *out)
{
    double v[256] = {0};
    fx_test_tensor(dev, t, rank, dims, v, out);
}

START_TEST(validation_messages)
{
    fx_device *dev = fx_test_device();
    lin_case c = lin_of(4, 8, 6, FX_F32, FX_ACT_GELU, true);
    lin_host h = lin_random(c);
    lin_dev t;
    lin_upload(dev, &h, FX_F32, FX_F32, &t);
    fx_tensor w7, w3, ints, b5, scalar, y5, bf;
    const int64_t d67[2] = {6, 7}, d3[1] = {3}, d5[1] = {5}, d45[2] = {4, 5}, dx[2] = {4, 8};
    tensor_of(dev, FX_F32, 2, d67, &w7);
    tensor_of(dev, FX_F32, 1, d3, &w3);
    tensor_of(dev, FX_S32, 2, dx, &ints);
    tensor_of(dev, FX_F32, 1, d5, &b5);
    tensor_of(dev, FX_F32, 0, d3, &scalar);
    tensor_of(dev, FX_F32, 2, d45, &y5);
    tensor_of(dev, FX_BF16, 2, dx, &bf);
    fx_status st;
    fx_linear_inputs in;
#define FWD_ERROR(msg)                                                                   \
    do {                                                                                 \
        fx_status_clear(&st);                                                            \
        fx_lt_expect_error(fx_op_linear_forward_into(NULL, &in, &t.y, NULL, &st), &st, msg); \
    } while (0)
    in = t.in, in.x = &ints;
    FWD_ERROR(dev->kind == FX_DEVICE_CPU ? "x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                                         : "x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    in = t.in, in.x = &scalar;
    FWD_ERROR("x: expected rank >= 1 [..., in], got rank 0 shape {}");
    in = t.in, in.w = &w3;
    FWD_ERROR("w: expected rank 2 [out, in], got rank 1 shape {3}");
    in = t.in, in.w = &w7;
    FWD_ERROR("w: expected shape {6,8} [out, in], got {6,7}");
    in = t.in, in.w = &bf;
    FWD_ERROR("w: expected type {f,32}, got {bf,16}");
    in = t.in, in.bias = &b5;
    FWD_ERROR("bias: expected shape {6} [out], got {5}");
    in = t.in, in.activation = 9;
    FWD_ERROR("activation: expected none, relu, gelu, silu, tanh or sigmoid (0..5), got 9");
    in = t.in;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_forward_into(NULL, &in, &y5, NULL, &st), &st,
                       "y: expected shape {4,6} [..., out], got {4,5}");
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_forward_into(NULL, &in, &t.y, &y5, &st), &st,
                       "pre: expected shape {4,6} [..., out], got {4,5}");
    fx_linear_grad_outs g = lin_grads(&t);
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_backward_into(NULL, &in, NULL, NULL, &t.dy, &g, &st), &st,
                       "pre: expected the forward's pre-activation (activation gelu's derivative reads it), got none");
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_backward_into(NULL, &in, &t.y, &t.pre, &t.dy, &g, &st), &st,
                       "y: expected none (activation gelu's derivative does not read it), got a tensor");
    in.activation = FX_ACT_TANH;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_backward_into(NULL, &in, NULL, NULL, &t.dy, &g, &st), &st,
                       "y: expected the forward's output (activation tanh's derivative reads it), got none");
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_backward_into(NULL, &in, &t.y, NULL, &y5, &g, &st), &st,
                       "dy: expected shape {4,6} [..., out], got {4,5}");
    g.dbias = NULL;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_backward_into(NULL, &in, &t.y, NULL, &t.dy, &g, &st), &st,
                       "dbias: expected a gradient tensor (a bias was given), got none");
    g = lin_grads(&t);
    g.dw = &w7;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_linear_backward_into(NULL, &in, &t.y, NULL, &t.dy, &g, &st), &st,
                       "dw: expected shape {6,8} [out, in], got {6,7}");
#undef FWD_ERROR
    fx_tensor *all[] = {&w7, &w3, &ints, &b5, &scalar, &y5, &bf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    lin_release(&t);
    lin_host_free(&h);
}
END_TEST

Suite *fx_suite_linear(void)
{
    Suite *s = suite_create("linear");
    TCase *tc = tcase_create("linear");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, gemm_every_epilogue);
    tcase_add_test(tc, gemm_shapes_and_transposes);
    tcase_add_test(tc, gemm_types);
    tcase_add_test(tc, gemm_batches_alpha_beta_and_empty_k);
    tcase_add_test(tc, gemm_in_a_callers_context);
    tcase_add_test(tc, gemm_refuses_what_it_cannot_do);
    tcase_add_test(tc, layer_matches_reference);
    tcase_add_test(tc, layer_every_type);
    tcase_add_test(tc, cuda_matches_cpu);
    tcase_add_test(tc, cpu_gradients_match_finite_differences);
    tcase_add_test(tc, contexts_keep_what_the_backward_reads);
    tcase_add_test(tc, callers_context_with_exact_scratch);
    tcase_add_test(tc, empty_shapes);
    tcase_add_test(tc, validation_messages);
    suite_add_tcase(s, tc);
    return s;
}
