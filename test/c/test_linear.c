/* Linear layers and the matrix product under them.
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
    suite_add_tcase(s, tc);
    return s;
}
