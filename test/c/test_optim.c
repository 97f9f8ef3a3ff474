/* Optimizers: hand-computed two-step cases checked literally; 10 steps of
 * every option combination on awkward sizes against an independent f64
 * reference written here and, on CUDA, against the CPU backend on the same
 * inputs; the skip on non-finite gradients byte for byte; the reported
 * norm; misaligned tensors; every validation message. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"
#include "core/ops.h"
#include "core/optim.h"
#include "testutil.h"

/* ---- small helpers ---- */

static void release_list(fx_tensor *ts, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        fx_tensor_release(&ts[i]);
}

static fx_optim_state *init_ok(fx_optim_kind kind, const fx_tensor *params, unsigned n,
                               const fx_optim_config *cfg)
{
    fx_status st;
    fx_status_clear(&st);
    fx_optim_state *s = NULL;
    fx_op_optim_init(kind, params, n, cfg, &s, &st);
    FX_CK_OK(st);
    return s;
}

static void step_ok(fx_optim_state *s, const fx_tensor *params, const fx_tensor *grads,
                    unsigned n, const fx_optim_hyper *h)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_optim_step(s, s->kind, params, n, grads, n, h, &st);
    FX_CK_OK(st);
}

static void read_bytes(const fx_tensor *t, void *out)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_to_host(t, out, &st);
    FX_CK_OK(st);
}

static int64_t read_step(const fx_optim_state *s)
{
    int64_t v;
    read_bytes(&s->step, &v);
    return v;
}

static float read_norm(const fx_optim_state *s)
{
    float v;
    read_bytes(&s->grad_norm, &v);
    return v;
}

static int read_skipped(const fx_optim_state *s)
{
    uint8_t v;
    read_bytes(&s->skipped, &v);
    return v;
}

/* Element-wise |got - want| <= tol * |want| + 1e-9, naming the element. */
static void expect_values(const fx_tensor *t, const double *want, int64_t n, double tol,
                          const char *what)
{
    double *got = fx_test_read(t);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= tol * fabs(want[i]) + 1e-9,
                      "%s[%lld]: got %.10g, want %.10g", what, (long long)i, got[i], want[i]);
    free(got);
}

/* ---- hand-computed two-step cases ----
 * Params {1, -2, 0.5} and {3}; step 1 grads {0.1, -0.2, 0.3}, {1}; step 2
 * grads {-0.5, 0.25, 0}, {2}. The expected numbers are the formulas of
 * docs/OPTIMIZERS.md evaluated in f64 by hand (a calculator / Python
 * floats), e.g. AdamW lr 0.1, wd 0.1, step 1, first element:
 *   p = 1 * (1 - 0.1*0.1) = 0.99; m = 0.1*0.1 = 0.01; v = 0.001*0.01 = 1e-5
 *   denom = sqrt(1e-5)/sqrt(0.001) + 1e-8 = 0.1 + 1e-8
 *   p = 0.99 - (0.1/0.1) * 0.01/denom = 0.89000001 */

static const double lit_p0[4] = {1.0, -2.0, 0.5, 3.0};
static const double lit_g[2][4] = {{0.1, -0.2, 0.3, 1.0}, {-0.5, 0.25, 0.0, 2.0}};

static void literal_params(fx_device *dev, fx_tensor p[2])
{
    int64_t d0[1] = {3}, d1[2] = {1, 1};
    fx_test_tensor(dev, FX_F32, 1, d0, lit_p0, &p[0]);
    fx_test_tensor(dev, FX_F32, 2, d1, lit_p0 + 3, &p[1]);
}

static void literal_step(fx_optim_state *s, fx_tensor p[2], int k, const fx_optim_hyper *h)
{
    int64_t d0[1] = {3}, d1[2] = {1, 1};
    fx_tensor g[2];
    fx_test_tensor(s->device, FX_F32, 1, d0, lit_g[k], &g[0]);
    fx_test_tensor(s->device, FX_F32, 2, d1, lit_g[k] + 3, &g[1]);
    step_ok(s, p, g, 2, h);
    release_list(g, 2);
}

/* Checks a state array of both tensors against 4 expected numbers. */
static void expect_pair(const fx_tensor t[2], const double want[4], const char *what)
{
    expect_values(&t[0], want, 3, 1e-6, what);
    expect_values(&t[1], want + 3, 1, 1e-6, what);
}

START_TEST(adamw_two_steps_literal)
{
    fx_device *dev = fx_test_device();
    fx_tensor p[2];
    literal_params(dev, p);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    cfg.defaults.lr = 0.1;
    cfg.defaults.weight_decay = 0.1;
    fx_optim_state *s = init_ok(FX_OPTIM_ADAMW, p, 2, &cfg);
    ck_assert_int_eq(read_step(s), 0);
    ck_assert(read_norm(s) == -1.0f);

    literal_step(s, p, 0, &cfg.defaults);
    expect_pair(p, (double[]){0.890000009999999, -1.8800000049999999, 0.3950000033333332,
                              2.8700000009999997}, "p after step 1");
    expect_pair(s->buf0, (double[]){0.01, -0.02, 0.03, 0.1}, "exp_avg after step 1");
    expect_pair(s->buf1, (double[]){1e-5, 4e-5, 9e-5, 1e-3}, "exp_avg_sq after step 1");
    ck_assert_int_eq(read_step(s), 1);

    literal_step(s, p, 1, &cfg.defaults);
    expect_pair(p, (double[]){0.9409354264523341, -1.8774732303981743, 0.3240441810458211,
                              2.744781799018166}, "p after step 2");
    expect_pair(s->buf0, (double[]){-0.041, 0.007, 0.027, 0.29}, "exp_avg after step 2");
    expect_pair(s->buf1, (double[]){0.00025999, 0.00010246, 8.991e-05, 0.004999},
                "exp_avg_sq after step 2");
    ck_assert_int_eq(read_step(s), 2);
    ck_assert(read_norm(s) == -1.0f); /* no norm pass: not computed */
    ck_assert_int_eq(read_skipped(s), 0);
    fx_optim_state_free(s);
    release_list(p, 2);
}
END_TEST

/* amsgrad + maximize + clipping at 0.5: the norms are 1.0677078252031311
 * and 2.0766559657295187, the factors 0.46829... and 0.24077... */
START_TEST(adamw_amsgrad_maximize_clip_literal)
{
    fx_device *dev = fx_test_device();
    fx_tensor p[2];
    literal_params(dev, p);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    cfg.defaults.lr = 0.1;
    cfg.defaults.weight_decay = 0.1;
    cfg.defaults.amsgrad = true;
    cfg.defaults.maximize = true;
    cfg.defaults.clip = true;
    cfg.defaults.max_grad_norm = 0.5;
    fx_optim_state *s = init_ok(FX_OPTIM_ADAMW, p, 2, &cfg);

    literal_step(s, p, 0, &cfg.defaults);
    ck_assert_msg(fabs(read_norm(s) - 1.0677078252031311) < 1e-6, "norm %.9g", read_norm(s));
    expect_pair(p, (double[]){1.089999978645828, -2.079999989322913, 0.5949999928819417,
                              3.069999997864582}, "p after step 1");
    literal_step(s, p, 1, &cfg.defaults);
    ck_assert_msg(fabs(read_norm(s) - 2.0766559657295187) < 2e-6, "norm %.9g", read_norm(s));
    expect_pair(p, (double[]){1.0340250804321056, -2.0753136405319106, 0.6560223003340989,
                              3.1393629848669313}, "p after step 2");
    expect_pair(s->buf0, (double[]){0.007823947306725362, 0.002409974653766668,
                                    -0.012643896614258694, -0.09030064009344202},
                "exp_avg after step 2");
    expect_pair(s->buf1, (double[]){1.6683525035383736e-05, 1.2386326396215824e-05,
                                    1.9717068329687728e-05, 0.00045096237164322526},
                "exp_avg_sq after step 2");
    /* v only grew for elements 0, 1 and 3; element 2 keeps step 1's v. */
    expect_pair(s->buf2, (double[]){1.6683525035383736e-05, 1.2386326396215824e-05,
                                    1.973680513482255e-05, 0.00045096237164322526},
                "max_exp_avg_sq after step 2");
    ck_assert_int_eq(read_step(s), 2);
    ck_assert_int_eq(read_skipped(s), 0);
    fx_optim_state_free(s);
    release_list(p, 2);
}
END_TEST

/* SGD lr 0.1, momentum 0.9, dampening 0.1, wd 0.1. Step 1, first element:
 * g = 0.1 + 0.1*1 = 0.2; b = g = 0.2 (no dampening on the first step);
 * p = 1 - 0.1*0.2 = 0.98. */
START_TEST(sgd_two_steps_literal)
{
    fx_device *dev = fx_test_device();
    fx_tensor p[2];
    literal_params(dev, p);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_SGD), false};
    cfg.defaults.lr = 0.1;
    cfg.defaults.momentum = 0.9;
    cfg.defaults.dampening = 0.1;
    cfg.defaults.weight_decay = 0.1;
    fx_optim_state *s = init_ok(FX_OPTIM_SGD, p, 2, &cfg);
    literal_step(s, p, 0, &cfg.defaults);
    expect_pair(p, (double[]){0.98, -1.96, 0.465, 2.87}, "p after step 1");
    expect_pair(s->buf0, (double[]){0.2, -0.4, 0.35, 1.3}, "momentum_buffer after step 1");
    literal_step(s, p, 1, &cfg.defaults);
    expect_pair(p, (double[]){0.99818, -1.92886, 0.429315, 2.54717}, "p after step 2");
    expect_pair(s->buf0, (double[]){-0.1818, -0.3114, 0.35685, 3.2283},
                "momentum_buffer after step 2");
    ck_assert_int_eq(read_step(s), 2);
    fx_optim_state_free(s);
    release_list(p, 2);
}
END_TEST

START_TEST(sgd_nesterov_maximize_literal)
{
    fx_device *dev = fx_test_device();
    fx_tensor p[2];
    literal_params(dev, p);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_SGD), false};
    cfg.defaults.lr = 0.1;
    cfg.defaults.momentum = 0.9;
    cfg.defaults.weight_decay = 0.1;
    cfg.defaults.nesterov = true;
    cfg.defaults.maximize = true;
    fx_optim_state *s = init_ok(FX_OPTIM_SGD, p, 2, &cfg);
    literal_step(s, p, 0, &cfg.defaults);
    expect_pair(p, (double[]){1.0, -2.0, 0.5475, 3.133}, "p after step 1");
    literal_step(s, p, 1, &cfg.defaults);
    expect_pair(p, (double[]){0.886, -1.9145, 0.5573475, 3.510173}, "p after step 2");
    expect_pair(s->buf0, (double[]){0.6, -0.45, -0.17025, -2.3167}, "momentum_buffer after step 2");
    fx_optim_state_free(s);
    release_list(p, 2);
}
END_TEST

/* ---- an independent f64 reference for the sweeps ----
 * Written apart from c_src/cpu/optim.c: per tensor, the state in f32
 * arrays (as the library stores it) and the step in f64. */

typedef struct ref_model {
    unsigned n;
    const int64_t *sizes;
    float **p;                 /* the f32 param, or the master of a 16-bit one */
    float **m, **v, **vmax, **buf;
    int64_t t;
} ref_model;

static float **alloc_arrays(unsigned n, const int64_t *sizes)
{
    float **a = calloc(n, sizeof *a);
    for (unsigned i = 0; i < n; i++)
        a[i] = calloc((size_t)(sizes[i] ? sizes[i] : 1), sizeof(float));
    return a;
}

static void free_arrays(float **a, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        free(a[i]);
    free(a);
}

static void ref_init(ref_model *r, unsigned n, const int64_t *sizes, double **p0)
{
    r->n = n;
    r->sizes = sizes;
    r->t = 0;
    r->p = alloc_arrays(n, sizes);
    r->m = alloc_arrays(n, sizes);
    r->v = alloc_arrays(n, sizes);
    r->vmax = alloc_arrays(n, sizes);
    r->buf = alloc_arrays(n, sizes);
    for (unsigned i = 0; i < n; i++)
        for (int64_t j = 0; j < sizes[i]; j++)
            r->p[i][j] = (float)p0[i][j];
}

static void ref_free(ref_model *r)
{
    free_arrays(r->p, r->n);
    free_arrays(r->m, r->n);
    free_arrays(r->v, r->n);
    free_arrays(r->vmax, r->n);
    free_arrays(r->buf, r->n);
}

static double ref_norm(const ref_model *r, double **g, bool *finite)
{
    double sum = 0;
    *finite = true;
    for (unsigned i = 0; i < r->n; i++)
        for (int64_t j = 0; j < r->sizes[i]; j++) {
            *finite = *finite && isfinite(g[i][j]);
            sum += g[i][j] * g[i][j];
        }
    return sqrt(sum);
}

static void ref_adamw(ref_model *r, const fx_optim_hyper *h, double scale, double **g)
{
    double bc1 = 1 - pow(h->beta1, (double)r->t), bc2 = 1 - pow(h->beta2, (double)r->t);
    for (unsigned i = 0; i < r->n; i++)
        for (int64_t j = 0; j < r->sizes[i]; j++) {
            double grad = g[i][j] * scale * (h->maximize ? -1 : 1);
            double p = r->p[i][j] * (1 - h->lr * h->weight_decay);
            double m = h->beta1 * r->m[i][j] + (1 - h->beta1) * grad;
            double v = h->beta2 * r->v[i][j] + (1 - h->beta2) * grad * grad;
            double vu = v;
            if (h->amsgrad) {
                vu = fmax(v, (double)r->vmax[i][j]);
                r->vmax[i][j] = (float)vu;
            }
            p -= h->lr / bc1 * m / (sqrt(vu) / sqrt(bc2) + h->eps);
            r->p[i][j] = (float)p;
            r->m[i][j] = (float)m;
            r->v[i][j] = (float)v;
        }
}

static void ref_sgd(ref_model *r, const fx_optim_hyper *h, double scale, double **g)
{
    for (unsigned i = 0; i < r->n; i++)
        for (int64_t j = 0; j < r->sizes[i]; j++) {
            double p = r->p[i][j];
            double grad = g[i][j] * scale * (h->maximize ? -1 : 1) + h->weight_decay * p;
            if (h->momentum != 0) {
                double b = r->t == 1 ? grad
                                     : h->momentum * r->buf[i][j] + (1 - h->dampening) * grad;
                r->buf[i][j] = (float)b;
                grad = h->nesterov ? grad + h->momentum * b : b;
            }
            r->p[i][j] = (float)(p - h->lr * grad);
        }
}

/* Returns whether the step was skipped; *norm gets the norm when a norm
 * pass runs. */
static bool ref_step(ref_model *r, fx_optim_kind kind, const fx_optim_hyper *h, double **g,
                     double *norm)
{
    double scale = 1;
    if (h->clip || h->skip_nonfinite) {
        bool finite;
        *norm = ref_norm(r, g, &finite);
        if (!finite && h->skip_nonfinite)
            return true;
        if (h->clip)
            scale = fmin(1.0, h->max_grad_norm / (*norm + 1e-6));
    }
    r->t++;
    if (kind == FX_OPTIM_ADAMW)
        ref_adamw(r, h, scale, g);
    else
        ref_sgd(r, h, scale, g);
    return false;
}

/* ---- the sweep ---- */

typedef struct combo {
    fx_optim_kind kind;
    fx_dtype param_type, grad_type;
    fx_optim_hyper h;
} combo;

static const fx_dtype type_pairs[4][2] = {
    {FX_F32, FX_F32}, {FX_F32, FX_BF16}, {FX_BF16, FX_BF16}, {FX_F16, FX_F32}};

static int adamw_combos(combo *out, int tp)
{
    int k = 0;
    for (int bits = 0; bits < 32; bits++) {
        combo c = {FX_OPTIM_ADAMW, type_pairs[tp][0], type_pairs[tp][1],
                   fx_optim_default_hyper(FX_OPTIM_ADAMW)};
        c.h.lr = 0.01;
        c.h.amsgrad = bits & 1;
        c.h.maximize = bits & 2;
        c.h.weight_decay = bits & 4 ? 0.05 : 0;
        c.h.clip = bits & 8;
        c.h.skip_nonfinite = bits & 16;
        out[k++] = c;
    }
    return k;
}

static int sgd_combos(combo *out, int tp)
{
    /* momentum, dampening, nesterov: the valid corners */
    static const double mdn[4][3] = {{0, 0, 0}, {0.9, 0, 0}, {0.9, 0, 1}, {0.9, 0.2, 0}};
    int k = 0;
    for (int a = 0; a < 4; a++)
        for (int bits = 0; bits < 16; bits++) {
            combo c = {FX_OPTIM_SGD, type_pairs[tp][0], type_pairs[tp][1],
                       fx_optim_default_hyper(FX_OPTIM_SGD)};
            c.h.lr = 0.05;
            c.h.momentum = mdn[a][0];
            c.h.dampening = mdn[a][1];
            c.h.nesterov = mdn[a][2] != 0;
            c.h.maximize = bits & 1;
            c.h.weight_decay = bits & 2 ? 0.05 : 0;
            c.h.clip = bits & 4;
            c.h.skip_nonfinite = bits & 8;
            out[k++] = c;
        }
    return k;
}

/* Every combination: AdamW 32 x 4 type pairs, SGD 64 x 4. */
static int all_combos(combo *out)
{
    int k = 0;
    for (int tp = 0; tp < 4; tp++) {
        k += adamw_combos(out + k, tp);
        k += sgd_combos(out + k, tp);
    }
    return k;
}

/* A model on one device: params, and grads refilled in place or made anew. */
typedef struct model {
    fx_device *dev;
    unsigned n;
    fx_tensor *params, *grads;
    fx_optim_state *state;
} model;

static void model_init(model *md, fx_device *dev, const combo *c, unsigned n,
                       const int64_t *sizes, double **p0)
{
    md->dev = dev;
    md->n = n;
    md->params = calloc(n, sizeof *md->params);
    md->grads = calloc(n, sizeof *md->grads);
    for (unsigned i = 0; i < n; i++)
        fx_test_tensor(dev, c->param_type, 1, &sizes[i], p0[i], &md->params[i]);
    fx_optim_config cfg = {c->h, c->param_type != FX_F32};
    md->state = init_ok(c->kind, md->params, n, &cfg);
}

/* Steps 1-5 write new values into the same grad tensors (the device table
 * is reused), later steps use new tensors (it is rebuilt). */
static void model_step(model *md, const combo *c, int step, double **g)
{
    fx_status st;
    fx_status_clear(&st);
    for (unsigned i = 0; i < md->n; i++) {
        fx_tensor *t = &md->grads[i];
        if (step > 5 || !t->buffer) {
            fx_tensor_release(t);
            fx_test_tensor(md->dev, c->grad_type, 1, &md->params[i].numel, g[i], t);
        } else if (t->nbytes) {
            void *host = malloc(t->nbytes);
            for (int64_t j = 0; j < t->numel; j++)
                fx_store_f64(host, c->grad_type, j, g[i][j]);
            md->dev->backend->upload(md->dev->ordinal, t->data, host, t->nbytes, &st);
            free(host);
            FX_CK_OK(st);
        }
    }
    step_ok(md->state, md->params, md->grads, md->n, &c->h);
}

static void model_free(model *md)
{
    fx_optim_state_free(md->state);
    release_list(md->params, md->n);
    release_list(md->grads, md->n);
    free(md->params);
    free(md->grads);
}

/* The concatenation of one array over all tensors, as f64. */
static double *gather_tensors(const fx_tensor *ts, unsigned n, int64_t total)
{
    double *all = malloc(sizeof(double) * (size_t)(total ? total : 1));
    int64_t at = 0;
    for (unsigned i = 0; i < n; i++) {
        double *one = fx_test_read(&ts[i]);
        memcpy(all + at, one, sizeof(double) * (size_t)ts[i].numel);
        at += ts[i].numel;
        free(one);
    }
    return all;
}

/* The reference's array, rounded to `dtype` as the library would store it. */
static double *gather_ref(float **arrays, const ref_model *r, int64_t total, fx_dtype dtype)
{
    double *all = malloc(sizeof(double) * (size_t)(total ? total : 1));
    int64_t at = 0;
    uint16_t half;
    for (unsigned i = 0; i < r->n; i++)
        for (int64_t j = 0; j < r->sizes[i]; j++) {
            double v = arrays[i][j];
            if (dtype != FX_F32) {
                fx_store_f64(&half, dtype, 0, v);
                v = fx_load_f64(&half, dtype, 0);
            }
            all[at++] = v;
        }
    return all;
}

static void compare_array(const char *what, const combo *c, const fx_tensor *got_t, unsigned n,
                          int64_t total, double *want, double tol)
{
    double *got = gather_tensors(got_t, n, total);
    double err = fx_rel_l2(got, want, total);
    ck_assert_msg(err <= tol,
                  "%s %s params %s grads %s amsgrad %d maximize %d wd %g clip %d skip %d "
                  "momentum %g dampening %g nesterov %d: rel-L2 %.3g > %.3g (seed %llu)",
                  fx_optim_kind_name(c->kind), what, fx_dtype_name(c->param_type),
                  fx_dtype_name(c->grad_type), c->h.amsgrad, c->h.maximize, c->h.weight_decay,
                  c->h.clip, c->h.skip_nonfinite, c->h.momentum, c->h.dampening, c->h.nesterov,
                  err, tol, (unsigned long long)fx_test_seed());
    free(got);
}

/* The device's state against the reference and, when given, the CPU
 * backend's state (which saw the same inputs). */
static void compare_model(const model *md, const model *cpu, const ref_model *r, const combo *c,
                          int64_t total)
{
    unsigned n = md->n;
    const fx_optim_state *s = md->state;
    double *p = gather_ref(r->p, r, total, FX_F32);
    if (s->master) {
        compare_array("master", c, s->master_t, n, total, p, 1e-6);
        double *p16 = gather_ref(r->p, r, total, c->param_type);
        compare_array("params", c, md->params, n, total, p16, 1e-2);
        free(p16);
    } else {
        compare_array("params", c, md->params, n, total, p, 1e-6);
    }
    free(p);
    fx_tensor *arrays[3] = {s->buf0, s->buf1, s->buf2};
    float **ref_arrays[3] = {c->kind == FX_OPTIM_ADAMW ? r->m : r->buf, r->v, r->vmax};
    const char *names[3] = {"buf0", "exp_avg_sq", "max_exp_avg_sq"};
    for (int k = 0; k < 3; k++) {
        if (!arrays[k][0].buffer)
            continue;
        double *want = gather_ref(ref_arrays[k], r, total, FX_F32);
        /* f32's tolerance: with clipping, the gradients' norm is an f32 sum
         * whose order differs by backend, and exp_avg_sq holds its square */
        compare_array(names[k], c, arrays[k], n, total, want, 1e-5);
        free(want);
    }
    if (cpu) { /* the device against the CPU backend, array by array */
        const fx_optim_state *cs = cpu->state;
        double *want = gather_tensors(cs->master ? cs->master_t : cpu->params, n, total);
        compare_array("vs cpu: params/master", c, s->master ? s->master_t : md->params, n, total,
                      want, 1e-6);
        free(want);
        for (int k = 0; k < 3; k++) {
            fx_tensor *theirs = k == 0 ? cs->buf0 : k == 1 ? cs->buf1 : cs->buf2;
            if (!theirs[0].buffer)
                continue;
            want = gather_tensors(theirs, n, total);
            compare_array("vs cpu: state", c, arrays[k], n, total, want, 1e-5);
            free(want);
        }
        ck_assert_int_eq(read_step(md->state), read_step(cpu->state));
    }
}

/* Fresh grads for one step: normal, scaled per tensor so norms differ; on
 * `bad_step` one element is NaN, +Inf or -Inf. Rounded to the grad type so
 * the reference sees what the device sees. */
static void make_grads(double **g, unsigned n, const int64_t *sizes, fx_dtype type, bool bad)
{
    uint16_t half;
    for (unsigned i = 0; i < n; i++) {
        double scale = 0.05 + 0.1 * (i % 5);
        for (int64_t j = 0; j < sizes[i]; j++) {
            double v = fx_rand_normal() * scale;
            if (type != FX_F32) {
                fx_store_f64(&half, type, 0, v);
                v = fx_load_f64(&half, type, 0);
            } else {
                v = (float)v;
            }
            g[i][j] = v;
        }
    }
    if (bad) {
        unsigned i;
        do
            i = (unsigned)fx_rand_uniform(0, n);
        while (sizes[i] == 0);
        double what[3] = {NAN, INFINITY, -INFINITY};
        g[i][(int64_t)fx_rand_uniform(0, (double)sizes[i])] = what[(int)fx_rand_uniform(0, 3)];
    }
}

static double **alloc_values(unsigned n, const int64_t *sizes)
{
    double **v = calloc(n, sizeof *v);
    for (unsigned i = 0; i < n; i++)
        v[i] = calloc((size_t)(sizes[i] ? sizes[i] : 1), sizeof(double));
    return v;
}

static void free_values(double **v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* `steps` steps of one combination; with skip_nonfinite, step 4 holds a
 * non-finite gradient and must change nothing. */
static void run_combo(const combo *c0, unsigned n, const int64_t *sizes, int steps)
{
    fx_device *dev = fx_test_device(), *cpu_dev = fx_test_oracle();
    combo c = *c0;
    int64_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += sizes[i];
    double **p0 = alloc_values(n, sizes), **g = alloc_values(n, sizes);
    for (unsigned i = 0; i < n; i++)
        for (int64_t j = 0; j < sizes[i]; j++)
            p0[i][j] = fx_rand_uniform(-1, 1);
    if (c.param_type != FX_F32) /* the reference starts from the rounded params */
        for (unsigned i = 0; i < n; i++)
            for (int64_t j = 0; j < sizes[i]; j++) {
                uint16_t half;
                fx_store_f64(&half, c.param_type, 0, p0[i][j]);
                p0[i][j] = fx_load_f64(&half, c.param_type, 0);
            }
    /* Clip at about half the typical norm, so most steps clip. */
    c.h.max_grad_norm = 0.5 * sqrt((double)total) * 0.15 + 1e-3;
    model md, cpu;
    model_init(&md, dev, &c, n, sizes, p0);
    bool with_cpu = dev != cpu_dev;
    if (with_cpu)
        model_init(&cpu, cpu_dev, &c, n, sizes, p0);
    ref_model r;
    ref_init(&r, n, sizes, p0);
    for (int step = 1; step <= steps; step++) {
        bool bad = c.h.skip_nonfinite && step == 4 && total > 0;
        make_grads(g, n, sizes, c.grad_type, bad);
        double norm = -1;
        bool skipped = ref_step(&r, c.kind, &c.h, g, &norm);
        model_step(&md, &c, step, g);
        if (with_cpu)
            model_step(&cpu, &c, step, g);
        ck_assert_int_eq(read_skipped(md.state), skipped);
        float got_norm = read_norm(md.state);
        if (c.h.clip || c.h.skip_nonfinite) {
            if (isfinite(norm))
                /* an f32 sum of squares over every element, in the backend's order */
                ck_assert_msg(fabs(got_norm - norm) <= 1e-5 * norm + 1e-30,
                              "step %d norm %.9g, want %.9g", step, got_norm, norm);
            else
                ck_assert_msg(isnan(norm) ? isnan(got_norm) : isinf(got_norm),
                              "step %d norm %g, want %g", step, got_norm, norm);
        } else {
            ck_assert(got_norm == -1.0f);
        }
    }
    ck_assert_int_eq(read_step(md.state), r.t);
    compare_model(&md, with_cpu ? &cpu : NULL, &r, &c, total);
    model_free(&md);
    if (with_cpu)
        model_free(&cpu);
    ref_free(&r);
    free_values(p0, n);
    free_values(g, n);
}

#define MAX_COMBOS 512

/* Awkward sizes: 1, odd, 1023/1025, an empty tensor, one that crosses a
 * chunk boundary, several chunks with a ragged end. */
static const int64_t small_sizes[] = {1, 3, 1023, 0, 1025, FX_OPTIM_CHUNK + 1, 2 * FX_OPTIM_CHUNK + 233};

START_TEST(every_combination_on_awkward_sizes)
{
    combo *combos = malloc(sizeof *combos * MAX_COMBOS);
    int count = all_combos(combos);
    /* the CPU emulator of the CUDA kernels (test/emu): every fifth, 5 steps */
    int stride = fx_test_quick() ? 11 : fx_test_emulated() ? 5 : 1;
    unsigned nsizes = fx_test_quick() ? 5 : (unsigned)(sizeof small_sizes / sizeof small_sizes[0]);
    for (int k = 0; k < count; k += stride)
        run_combo(&combos[k], nsizes, small_sizes, fx_test_quick() || fx_test_emulated() ? 5 : 10);
    free(combos);
}
END_TEST

/* 2^20 + 7 elements in one tensor, beside a 1-element one. On the CPU the
 * reference is the bottleneck: a handful of combinations with every option
 * on; on a GPU every AdamW f32 combination, the four SGD momentum variants
 * in f32, and the other types with everything on. (Every combination of
 * every type runs on the smaller sizes above.) */
START_TEST(large_tensor)
{
    if (fx_test_quick())
        return;
    int64_t sizes[2] = {(1 << 20) + 7, 1};
    combo *combos = malloc(sizeof *combos * MAX_COMBOS);
    /* the CPU emulator of the CUDA kernels (test/emu): f32, AdamW and SGD
     * with every option on */
    bool emulated = fx_test_emulated(), gpu = fx_test_device()->kind != FX_DEVICE_CPU && !emulated;
    for (int tp = 0; tp < (emulated ? 1 : 4); tp++) {
        int count = adamw_combos(combos, tp);
        for (int k = 0; k < count; k++)
            if ((gpu && tp == 0) || k == count - 1)
                run_combo(&combos[k], 2, sizes, 10);
        count = sgd_combos(combos, tp); /* 4 momentum variants x 16 option sets */
        for (int k = 15; k < count; k += 16)
            if ((gpu && tp == 0) || k == count - 1)
                run_combo(&combos[k], 2, sizes, 10);
    }
    free(combos);
}
END_TEST

/* 1..200 tensors of random sizes: the table and the work list. */
START_TEST(many_tensors)
{
    unsigned counts[] = {1, 2, 7, 64, 200};
    int quick = fx_test_quick(), emulated = fx_test_emulated(); /* test/emu: every count, smaller */
    int ncounts = quick ? 2 : 5;
    combo *combos = malloc(sizeof *combos * MAX_COMBOS);
    int count = all_combos(combos);
    int64_t *sizes = malloc(sizeof *sizes * 200);
    for (int a = 0; a < ncounts; a++) {
        unsigned n = counts[quick ? a + 3 : a];
        for (unsigned i = 0; i < n; i++)
            sizes[i] = 1 + (int64_t)fx_rand_uniform(0, quick ? 300 : emulated ? 1000 : 5000);
        /* a few combinations per count, spread over kinds, types and options */
        for (int k = a; k < count; k += quick || emulated ? 97 : 37)
            run_combo(&combos[k], n, sizes, quick ? 3 : emulated ? 5 : 10);
    }
    free(sizes);
    free(combos);
}
END_TEST

/* More chunks than blocks: each block strides over several chunks (what
 * a model above FX_OPTIM_MAX_BLOCKS chunks, ~268M params, does), in both
 * passes, against the CPU backend. */
START_TEST(blocks_stride_over_chunks)
{
    fx_device *dev = fx_test_device(), *cpu = fx_test_oracle();
    int64_t sizes[3] = {3 * FX_OPTIM_CHUNK + 5, 7, 2 * FX_OPTIM_CHUNK};
    for (int kind = 0; kind < 2; kind++)
        for (int64_t blocks = 1; blocks <= 4; blocks++) {
            fx_tensor p[3], pc[3], g[3], gc[3];
            for (int i = 0; i < 3; i++) {
                double *v = malloc(sizeof(double) * (size_t)sizes[i]);
                fx_fill_uniform(v, sizes[i], -1, 1);
                fx_test_tensor(dev, FX_F32, 1, &sizes[i], v, &p[i]);
                fx_test_tensor(cpu, FX_F32, 1, &sizes[i], v, &pc[i]);
                free(v);
            }
            fx_optim_config cfg = {fx_optim_default_hyper((fx_optim_kind)kind), false};
            cfg.defaults.momentum = 0.9;
            cfg.defaults.clip = true;
            cfg.defaults.max_grad_norm = 5;
            fx_optim_state *s = init_ok((fx_optim_kind)kind, p, 3, &cfg);
            fx_optim_state *sc = init_ok((fx_optim_kind)kind, pc, 3, &cfg);
            ck_assert_int_eq(s->nchunks, 7);
            s->max_blocks = blocks;
            for (int step = 0; step < 3; step++) {
                for (int i = 0; i < 3; i++) {
                    double *v = malloc(sizeof(double) * (size_t)sizes[i]);
                    for (int64_t j = 0; j < sizes[i]; j++)
                        v[j] = fx_rand_normal() * 0.1;
                    fx_test_tensor(dev, FX_F32, 1, &sizes[i], v, &g[i]);
                    fx_test_tensor(cpu, FX_F32, 1, &sizes[i], v, &gc[i]);
                    free(v);
                }
                step_ok(s, p, g, 3, &cfg.defaults);
                step_ok(sc, pc, gc, 3, &cfg.defaults);
                ck_assert_msg(fabs(read_norm(s) - read_norm(sc)) <= 1e-6 * read_norm(sc),
                              "norm %.9g vs cpu %.9g with %lld blocks", read_norm(s), read_norm(sc),
                              (long long)blocks);
                release_list(g, 3);
                release_list(gc, 3);
            }
            for (int i = 0; i < 3; i++) {
                double *got = fx_test_read(&p[i]), *want = fx_test_read(&pc[i]);
                fx_assert_close(got, want, sizes[i], 1e-6);
                free(got);
                free(want);
            }
            ck_assert_int_eq(read_step(s), 3);
            fx_optim_state_free(s);
            fx_optim_state_free(sc);
            release_list(p, 3);
            release_list(pc, 3);
        }
}
END_TEST

/* ---- skip on non-finite gradients: not one byte changes ---- */

typedef struct snapshot {
    unsigned char *bytes;
    size_t len;
} snapshot;

static void append_bytes(snapshot *snap, const fx_tensor *t)
{
    if (!t->buffer || !t->nbytes)
        return;
    snap->bytes = realloc(snap->bytes, snap->len + t->nbytes);
    read_bytes(t, snap->bytes + snap->len);
    snap->len += t->nbytes;
}

/* Params, master copies, every moment and the step count. */
static snapshot take_snapshot(const fx_optim_state *s, const fx_tensor *params)
{
    snapshot snap = {NULL, 0};
    for (unsigned i = 0; i < s->n; i++) {
        append_bytes(&snap, &params[i]);
        append_bytes(&snap, &s->master_t[i]);
        append_bytes(&snap, &s->buf0[i]);
        append_bytes(&snap, &s->buf1[i]);
        append_bytes(&snap, &s->buf2[i]);
    }
    append_bytes(&snap, &s->step);
    return snap;
}

static void skip_case(fx_optim_kind kind, fx_dtype ptype, fx_dtype gtype, bool clip, double bad)
{
    fx_device *dev = fx_test_device();
    int64_t sizes[3] = {1025, 7, FX_OPTIM_CHUNK + 5};
    fx_tensor p[3], g[3];
    double *vals = malloc(sizeof(double) * (FX_OPTIM_CHUNK + 5));
    fx_optim_config cfg = {fx_optim_default_hyper(kind), ptype != FX_F32};
    cfg.defaults.skip_nonfinite = true;
    cfg.defaults.clip = clip;
    cfg.defaults.max_grad_norm = 1.0;
    cfg.defaults.momentum = kind == FX_OPTIM_SGD ? 0.9 : 0;
    cfg.defaults.amsgrad = kind == FX_OPTIM_ADAMW;
    for (int i = 0; i < 3; i++) {
        fx_fill_uniform(vals, sizes[i], -1, 1);
        fx_test_tensor(dev, ptype, 1, &sizes[i], vals, &p[i]);
    }
    fx_optim_state *s = init_ok(kind, p, 3, &cfg);
    for (int step = 0; step < 3; step++) { /* a clean step first, then two bad ones */
        for (int i = 0; i < 3; i++) {
            fx_fill_uniform(vals, sizes[i], -1, 1);
            if (step > 0 && i == 2)
                vals[step == 1 ? FX_OPTIM_CHUNK + 4 : 0] = bad;
            fx_test_tensor(dev, gtype, 1, &sizes[i], vals, &g[i]);
        }
        snapshot before = take_snapshot(s, p);
        step_ok(s, p, g, 3, &cfg.defaults);
        snapshot after = take_snapshot(s, p);
        ck_assert_uint_eq(before.len, after.len);
        if (step == 0) {
            ck_assert_int_eq(read_skipped(s), 0);
            ck_assert(memcmp(before.bytes, after.bytes, before.len) != 0);
        } else {
            ck_assert_int_eq(read_skipped(s), 1);
            ck_assert_msg(memcmp(before.bytes, after.bytes, before.len) == 0,
                          "a skipped %s step changed memory (%s params, %s grads, bad %g)",
                          fx_optim_kind_name(kind), fx_dtype_name(ptype), fx_dtype_name(gtype), bad);
            float norm = read_norm(s);
            ck_assert_msg(isnan(bad) ? isnan(norm) : isinf(norm), "norm %g with %g", norm, bad);
        }
        ck_assert_int_eq(read_step(s), 1);
        free(before.bytes);
        free(after.bytes);
        release_list(g, 3);
    }
    fx_optim_state_free(s);
    release_list(p, 3);
    free(vals);
}

START_TEST(skip_leaves_every_byte)
{
    double bad[3] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++)
        for (int clip = 0; clip < 2; clip++) {
            skip_case(FX_OPTIM_ADAMW, FX_F32, FX_F32, clip, bad[b]);
            skip_case(FX_OPTIM_SGD, FX_F32, FX_BF16, clip, bad[b]);
        }
    skip_case(FX_OPTIM_ADAMW, FX_BF16, FX_BF16, true, NAN);
    skip_case(FX_OPTIM_SGD, FX_F16, FX_F32, false, INFINITY);
}
END_TEST

/* Without skip_nonfinite a NaN passes through (as in torch): the step
 * counts and the touched elements become NaN. */
START_TEST(nonfinite_without_skip_propagates)
{
    fx_device *dev = fx_test_device();
    int64_t n = 5;
    double pv[5] = {1, 2, 3, 4, 5}, gv[5] = {0.1, NAN, 0.1, 0.1, 0.1};
    fx_tensor p, g;
    fx_test_tensor(dev, FX_F32, 1, &n, pv, &p);
    fx_test_tensor(dev, FX_F32, 1, &n, gv, &g);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    fx_optim_state *s = init_ok(FX_OPTIM_ADAMW, &p, 1, &cfg);
    step_ok(s, &p, &g, 1, &cfg.defaults);
    double *got = fx_test_read(&p);
    ck_assert(isnan(got[1]) && !isnan(got[0]) && !isnan(got[4]));
    free(got);
    ck_assert_int_eq(read_step(s), 1);
    ck_assert_int_eq(read_skipped(s), 0);
    fx_optim_state_free(s);
    fx_tensor_release(&p);
    fx_tensor_release(&g);
}
END_TEST

/* ---- the reported norm against one computed here ---- */

START_TEST(reported_norm_matches)
{
    fx_device *dev = fx_test_device();
    int64_t sizes[4] = {FX_OPTIM_CHUNK * 3 + 11, 1, 999, 4096};
    fx_tensor p[4], g[4];
    double sum = 0;
    for (int i = 0; i < 4; i++) {
        double *v = malloc(sizeof(double) * (size_t)sizes[i]);
        fx_fill_uniform(v, sizes[i], -1, 1);
        fx_test_tensor(dev, FX_F32, 1, &sizes[i], v, &p[i]);
        for (int64_t j = 0; j < sizes[i]; j++) {
            v[j] = (float)(fx_rand_normal() * (i + 1));
            sum += v[j] * v[j];
        }
        fx_test_tensor(dev, FX_F32, 1, &sizes[i], v, &g[i]);
        free(v);
    }
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_SGD), false};
    cfg.defaults.clip = true;
    cfg.defaults.max_grad_norm = 1.0;
    fx_optim_state *s = init_ok(FX_OPTIM_SGD, p, 4, &cfg);
    step_ok(s, p, g, 4, &cfg.defaults);
    double want = sqrt(sum);
    ck_assert_msg(fabs(read_norm(s) - want) <= 1e-6 * want, "norm %.9g, want %.9g", read_norm(s), want);
    /* skip_nonfinite alone also reports the norm */
    fx_optim_hyper h = cfg.defaults;
    h.clip = false;
    h.skip_nonfinite = true;
    step_ok(s, p, g, 4, &h);
    ck_assert_msg(fabs(read_norm(s) - want) <= 1e-6 * want, "norm %.9g, want %.9g", read_norm(s), want);
    fx_optim_state_free(s);
    release_list(p, 4);
    release_list(g, 4);
}
END_TEST

/* ---- tensors whose data is not 16-byte aligned (the scalar paths) ---- */

/* A view of `numel` elements starting one element into a fresh buffer. */
static void offset_tensor(fx_device *dev, fx_dtype type, int64_t numel, const double *vals,
                          fx_tensor *out)
{
    int64_t bigger = numel + 1;
    double *padded = calloc((size_t)bigger, sizeof(double));
    memcpy(padded + 1, vals, sizeof(double) * (size_t)numel);
    fx_test_tensor(dev, type, 1, &bigger, padded, out);
    free(padded);
    size_t size = fx_dtype_size(type);
    out->data = (char *)out->data + size;
    out->dims[0] = numel;
    out->numel = numel;
    out->nbytes -= size;
}

START_TEST(misaligned_tensors)
{
    fx_device *dev = fx_test_device(), *cpu = fx_test_oracle();
    int64_t n = 2 * FX_OPTIM_CHUNK + 37;
    double *pv = malloc(sizeof(double) * (size_t)n), *gv = malloc(sizeof(double) * (size_t)n);
    fx_fill_uniform(pv, n, -1, 1);
    for (int kind = 0; kind < 2; kind++) {
        fx_dtype ptypes[2] = {FX_F32, FX_BF16};
        for (int pt = 0; pt < 2; pt++) {
            fx_tensor p_dev, p_cpu, g_dev, g_cpu;
            offset_tensor(dev, ptypes[pt], n, pv, &p_dev);
            fx_test_tensor(cpu, ptypes[pt], 1, &n, pv, &p_cpu);
            fx_optim_config cfg = {fx_optim_default_hyper((fx_optim_kind)kind), pt == 1};
            cfg.defaults.momentum = 0.5;
            cfg.defaults.clip = true;
            cfg.defaults.max_grad_norm = 10;
            fx_optim_state *s_dev = init_ok((fx_optim_kind)kind, &p_dev, 1, &cfg);
            fx_optim_state *s_cpu = init_ok((fx_optim_kind)kind, &p_cpu, 1, &cfg);
            for (int step = 0; step < 3; step++) {
                for (int64_t j = 0; j < n; j++)
                    gv[j] = fx_rand_normal() * 0.1;
                offset_tensor(dev, FX_BF16, n, gv, &g_dev);
                fx_test_tensor(cpu, FX_BF16, 1, &n, gv, &g_cpu);
                step_ok(s_dev, &p_dev, &g_dev, 1, &cfg.defaults);
                step_ok(s_cpu, &p_cpu, &g_cpu, 1, &cfg.defaults);
                fx_tensor_release(&g_dev);
                fx_tensor_release(&g_cpu);
            }
            double *got = fx_test_read(&p_dev), *want = fx_test_read(&p_cpu);
            fx_assert_close(got, want, n, pt == 0 ? 1e-6 : 1e-2);
            free(got);
            free(want);
            fx_optim_state_free(s_dev);
            fx_optim_state_free(s_cpu);
            fx_tensor_release(&p_dev);
            fx_tensor_release(&p_cpu);
        }
    }
    free(pv);
    free(gv);
}
END_TEST

/* Only empty tensors: no work items, but the step still counts. */
START_TEST(empty_tensors_still_count)
{
    fx_device *dev = fx_test_device();
    int64_t zero[2] = {0, 3};
    fx_tensor p, g;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_zeros(dev, FX_F32, 2, zero, &p, &st), FX_OK);
    ck_assert_int_eq(fx_op_zeros(dev, FX_F32, 2, zero, &g, &st), FX_OK);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    cfg.defaults.clip = true;
    cfg.defaults.max_grad_norm = 1;
    fx_optim_state *s = init_ok(FX_OPTIM_ADAMW, &p, 1, &cfg);
    ck_assert_int_eq(s->nchunks, 0);
    step_ok(s, &p, &g, 1, &cfg.defaults);
    step_ok(s, &p, &g, 1, &cfg.defaults);
    ck_assert_int_eq(read_step(s), 2);
    ck_assert(read_norm(s) == 0.0f);
    fx_optim_state_free(s);
    fx_tensor_release(&p);
    fx_tensor_release(&g);
}
END_TEST

/* Same values, read back as f64 (the tensors' own bytes are f32). */
static void expect_same(const fx_tensor *a, const fx_tensor *b, const char *what)
{
    double *va = fx_test_read(a), *vb = fx_test_read(b);
    for (int64_t i = 0; i < a->numel; i++)
        ck_assert_msg(va[i] == vb[i], "%s[%lld]: %.10g against %.10g", what, (long long)i, va[i],
                      vb[i]);
    free(va);
    free(vb);
}

static bool try_step(fx_optim_state *s, const fx_tensor *params, const fx_tensor *grads,
                     const fx_optim_hyper *h)
{
    fx_status st;
    fx_status_clear(&st);
    bool done = true;
    ck_assert_int_eq(fx_op_optim_try_step(s, s->kind, params, 2, grads, 2, h, &done, &st), FX_OK);
    return done;
}

/* The step that must not wait (it runs on a normal scheduler): it does
 * nothing where it would wait (the state in use by another call; a
 * changed table that the backend cannot upload without waiting: always
 * on the CPU backend, which has no try_upload), never refuses an
 * unchanged table, and what it enqueues is the waiting step's work. */
START_TEST(try_step_never_waits)
{
    fx_device *dev = fx_test_device();
    fx_tensor p[2], q[2], g[2];
    int64_t d0[1] = {3}, d1[2] = {1, 1};
    literal_params(dev, p);
    literal_params(dev, q);
    fx_test_tensor(dev, FX_F32, 1, d0, lit_g[0], &g[0]);
    fx_test_tensor(dev, FX_F32, 2, d1, lit_g[0] + 3, &g[1]);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    cfg.defaults.lr = 0.1;
    fx_optim_state *s = init_ok(FX_OPTIM_ADAMW, p, 2, &cfg), *ref = init_ok(FX_OPTIM_ADAMW, q, 2, &cfg);

    pthread_mutex_lock(&s->lock);
    ck_assert(!try_step(s, p, g, &cfg.defaults));
    pthread_mutex_unlock(&s->lock);
    ck_assert_int_eq(read_step(s), 0);

    bool done = try_step(s, p, g, &cfg.defaults); /* the first table with grads */
    if (!dev->backend->try_upload)
        ck_assert(!done);
    ck_assert_int_eq(read_step(s), done ? 1 : 0);
    if (!done)
        step_ok(s, p, g, 2, &cfg.defaults);
    step_ok(ref, q, g, 2, &cfg.defaults);

    ck_assert(try_step(s, p, g, &cfg.defaults)); /* unchanged: never waits */
    step_ok(ref, q, g, 2, &cfg.defaults);
    ck_assert_int_eq(read_step(s), 2);
    ck_assert_int_eq(read_step(ref), 2);
    for (int i = 0; i < 2; i++) {
        expect_same(&p[i], &q[i], "param");
        expect_same(&s->buf0[i], &ref->buf0[i], "exp_avg");
        expect_same(&s->buf1[i], &ref->buf1[i], "exp_avg_sq");
    }
    fx_optim_state_free(s);
    fx_optim_state_free(ref);
    release_list(p, 2);
    release_list(q, 2);
    release_list(g, 2);
}
END_TEST

/* ---- validation: every message ---- */

static void expect_init_error(fx_optim_kind kind, const fx_tensor *params, unsigned n,
                              const fx_optim_config *cfg, const char *msg)
{
    fx_status st;
    fx_status_clear(&st);
    fx_optim_state *s = (fx_optim_state *)1;
    ck_assert_int_eq(fx_op_optim_init(kind, params, n, cfg, &s, &st), FX_EBADARG);
    ck_assert_ptr_null(s);
    ck_assert_str_eq(st.msg, msg);
}

static void expect_step_error(fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                              unsigned np, const fx_tensor *grads, unsigned ng,
                              const fx_optim_hyper *h, const char *msg)
{
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_optim_step(s, kind, params, np, grads, ng, h, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, msg);
}

START_TEST(init_validation)
{
    fx_device *dev = fx_test_device();
    int64_t d3[1] = {3}, d4[1] = {4};
    double v[4] = {1, 2, 3, 4};
    fx_tensor f32a, f32b, bf, f64, s32, view;
    fx_test_tensor(dev, FX_F32, 1, d3, v, &f32a);
    fx_test_tensor(dev, FX_F32, 1, d4, v, &f32b);
    fx_test_tensor(dev, FX_BF16, 1, d3, v, &bf);
    fx_test_tensor(dev, FX_S32, 1, d3, v, &s32);
    fx_test_tensor(fx_test_oracle(), FX_F64, 1, d3, v, &f64);
    fx_status st;
    fx_status_clear(&st);
    int64_t d31[2] = {3, 1};
    ck_assert_int_eq(fx_op_reshape(&f32a, 2, d31, &view, &st), FX_OK);

    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    expect_init_error(FX_OPTIM_ADAMW, NULL, 0, &cfg, "params: expected a non-empty list of tensors, got []");
    expect_init_error(FX_OPTIM_ADAMW, &bf, 1, &cfg,
                      "params[0]: expected type {f,32} ({bf,16} and {f,16} parameters need master_weights => true), got {bf,16}");
    expect_init_error(FX_OPTIM_ADAMW, &s32, 1, &cfg,
                      "params[0]: expected type {f,32}, or {bf,16}/{f,16} with master_weights => true, got {s,32}");
    expect_init_error(FX_OPTIM_SGD, &f64, 1, &cfg,
                      "params[0]: expected type {f,32}, or {bf,16}/{f,16} with master_weights => true, got {f,64}");
    fx_tensor mixed[2] = {f32a, bf};
    expect_init_error(FX_OPTIM_ADAMW, mixed, 2, &cfg,
                      "params[1]: expected type {f,32} (the type of params[0]), got {bf,16}");
    fx_tensor twice[3] = {f32a, f32b, view};
    expect_init_error(FX_OPTIM_ADAMW, twice, 3, &cfg,
                      "params[2]: expected a tensor distinct from params[0], got the same memory");
    fx_tensor shifted = f32b; /* f32b's last two elements, as a view at an offset */
    shifted.data = (float *)f32b.data + 1;
    shifted.dims[0] = shifted.numel = 2;
    shifted.nbytes = 2 * sizeof(float);
    fx_tensor overlapping[2] = {shifted, f32b};
    expect_init_error(FX_OPTIM_ADAMW, overlapping, 2, &cfg,
                      "params[0]: expected a tensor distinct from params[1], got overlapping memory");
    if (dev->kind != FX_DEVICE_CPU) {
        fx_tensor host;
        fx_test_tensor(fx_cpu_device(), FX_F32, 1, d3, v, &host);
        fx_tensor apart[2] = {f32a, host};
        expect_init_error(FX_OPTIM_ADAMW, apart, 2, &cfg,
                          "params[1]: expected a tensor on cuda:0 (where params[0] is), got one on cpu");
        fx_tensor_release(&host);
    }

    cfg.defaults.lr = -1;
    expect_init_error(FX_OPTIM_ADAMW, &f32a, 1, &cfg, "lr: expected a finite number >= 0, got -1");
    fx_tensor_release(&f32a);
    fx_tensor_release(&f32b);
    fx_tensor_release(&bf);
    fx_tensor_release(&s32);
    fx_tensor_release(&f64);
    fx_tensor_release(&view);
}
END_TEST

static void expect_hyper_error(fx_optim_kind kind, fx_optim_hyper h, const char *msg)
{
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_optim_check_hyper(kind, &h, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, msg);
}

START_TEST(hyper_validation)
{
    const fx_optim_hyper a = fx_optim_default_hyper(FX_OPTIM_ADAMW);
    const fx_optim_hyper s = fx_optim_default_hyper(FX_OPTIM_SGD);
    fx_optim_hyper h;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_optim_check_hyper(FX_OPTIM_ADAMW, &a, &st), FX_OK);
    ck_assert_int_eq(fx_optim_check_hyper(FX_OPTIM_SGD, &s, &st), FX_OK);
    h = a, h.lr = -1;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "lr: expected a finite number >= 0, got -1");
    h = a, h.lr = INFINITY;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "lr: expected a finite number >= 0, got inf");
    h = a, h.beta1 = 1;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "beta1: expected a number in [0, 1), got 1");
    h = a, h.beta2 = -0.1;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "beta2: expected a number in [0, 1), got -0.1");
    h = a, h.beta2 = NAN;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "beta2: expected a number in [0, 1), got nan");
    h = a, h.eps = -1e-8;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "eps: expected a finite number >= 0, got -1e-08");
    h = a, h.weight_decay = -0.5;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "weight_decay: expected a finite number >= 0, got -0.5");
    h = a, h.clip = true, h.max_grad_norm = 0;
    expect_hyper_error(FX_OPTIM_ADAMW, h, "max_grad_norm: expected a finite number > 0 or none, got 0");
    h = s, h.clip = true, h.max_grad_norm = -2;
    expect_hyper_error(FX_OPTIM_SGD, h, "max_grad_norm: expected a finite number > 0 or none, got -2");
    h = s, h.momentum = -0.1;
    expect_hyper_error(FX_OPTIM_SGD, h, "momentum: expected a finite number >= 0, got -0.1");
    h = s, h.dampening = 1.5;
    expect_hyper_error(FX_OPTIM_SGD, h, "dampening: expected a number in [0, 1], got 1.5");
    h = s, h.nesterov = true;
    expect_hyper_error(FX_OPTIM_SGD, h,
                       "nesterov: expected momentum > 0 and dampening 0 with nesterov => true, got momentum 0 and dampening 0");
    h = s, h.nesterov = true, h.momentum = 0.9, h.dampening = 0.1;
    expect_hyper_error(FX_OPTIM_SGD, h,
                       "nesterov: expected momentum > 0 and dampening 0 with nesterov => true, got momentum 0.9 and dampening 0.1");
}
END_TEST

START_TEST(step_validation)
{
    fx_device *dev = fx_test_device();
    int64_t d3[1] = {3}, d4[1] = {4};
    double v[4] = {1, 2, 3, 4};
    fx_tensor p[2], g[2], p4, g4, gbf, gs32, pbf;
    fx_test_tensor(dev, FX_F32, 1, d3, v, &p[0]);
    fx_test_tensor(dev, FX_F32, 1, d3, v, &p[1]);
    fx_test_tensor(dev, FX_F32, 1, d3, v, &g[0]);
    fx_test_tensor(dev, FX_F32, 1, d3, v, &g[1]);
    fx_test_tensor(dev, FX_F32, 1, d4, v, &p4);
    fx_test_tensor(dev, FX_F32, 1, d4, v, &g4);
    fx_test_tensor(dev, FX_BF16, 1, d3, v, &gbf);
    fx_test_tensor(dev, FX_S32, 1, d3, v, &gs32);
    fx_test_tensor(dev, FX_BF16, 1, d3, v, &pbf);
    fx_optim_config cfg = {fx_optim_default_hyper(FX_OPTIM_ADAMW), false};
    fx_optim_state *s = init_ok(FX_OPTIM_ADAMW, p, 2, &cfg);
    const fx_optim_hyper *h = &cfg.defaults;

    expect_step_error(s, FX_OPTIM_SGD, p, 2, g, 2, h,
                      "state: expected an SGD state (from sgd_init), got an AdamW state");
    expect_step_error(s, FX_OPTIM_ADAMW, p, 1, g, 1, h,
                      "params: expected a list of 2 tensors (as given to adamw_init), got 1");
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, g, 1, h,
                      "grads: expected a list of 2 tensors (one per param), got 1");
    fx_tensor wrong_type[2] = {p[0], pbf};
    expect_step_error(s, FX_OPTIM_ADAMW, wrong_type, 2, g, 2, h,
                      "params[1]: expected type {f,32} (as given to adamw_init), got {bf,16}");
    fx_tensor wrong_shape[2] = {p[0], p4};
    expect_step_error(s, FX_OPTIM_ADAMW, wrong_shape, 2, g, 2, h,
                      "params[1]: expected shape {3} (as given to adamw_init), got {4}");
    fx_tensor int_grads[2] = {gs32, g[1]};
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, int_grads, 2, h,
                      "grads[0]: expected type {f,32}, {bf,16} or {f,16}, got {s,32}");
    fx_tensor mixed_grads[2] = {g[0], gbf};
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, mixed_grads, 2, h,
                      "grads[1]: expected type {f,32} (the type of grads[0]), got {bf,16}");
    fx_tensor long_grads[2] = {g[0], g4};
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, long_grads, 2, h,
                      "grads[1]: expected shape {3} (the shape of params[1]), got {4}");
    fx_tensor alias_grads[2] = {g[0], p[0]};
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, alias_grads, 2, h,
                      "grads[1]: expected a tensor distinct from every param, got the memory of params[0]");
    fx_tensor same_params[2] = {p[1], p[1]};
    expect_step_error(s, FX_OPTIM_ADAMW, same_params, 2, g, 2, h,
                      "params[1]: expected a tensor distinct from params[0], got the same memory");
    fx_optim_hyper ams = *h;
    ams.amsgrad = true;
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, g, 2, &ams,
                      "amsgrad: expected false (fixed by adamw_init, which did not allocate max_exp_avg_sq), got true");
    fx_optim_hyper neg = *h;
    neg.eps = -1;
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, g, 2, &neg, "eps: expected a finite number >= 0, got -1");
    if (dev->kind != FX_DEVICE_CPU) {
        fx_tensor host;
        fx_test_tensor(fx_cpu_device(), FX_F32, 1, d3, v, &host);
        fx_tensor apart[2] = {host, p[1]};
        expect_step_error(s, FX_OPTIM_ADAMW, apart, 2, g, 2, h,
                          "params[0]: expected a tensor on cuda:0 (where the optimizer state is), got one on cpu");
        fx_tensor_release(&host);
    }
    /* nothing above touched the state; a good step still works */
    ck_assert_int_eq(read_step(s), 0);
    step_ok(s, p, g, 2, h);
    ck_assert_int_eq(read_step(s), 1);
    /* the aliasing checks again, now that the device table's params are
     * known (the state keeps them sorted) */
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, alias_grads, 2, h,
                      "grads[1]: expected a tensor distinct from every param, got the memory of params[0]");
    fx_tensor alias_other[2] = {p[1], g[1]};
    expect_step_error(s, FX_OPTIM_ADAMW, p, 2, alias_other, 2, h,
                      "grads[0]: expected a tensor distinct from every param, got the memory of params[1]");
    expect_step_error(s, FX_OPTIM_ADAMW, same_params, 2, g, 2, h,
                      "params[1]: expected a tensor distinct from params[0], got the same memory");
    fx_tensor swapped[2] = {p[1], p[0]}; /* a new table, its params sorted again */
    step_ok(s, swapped, g, 2, h);
    expect_step_error(s, FX_OPTIM_ADAMW, swapped, 2, alias_grads, 2, h,
                      "grads[1]: expected a tensor distinct from every param, got the memory of params[1]");
    step_ok(s, p, g, 2, h);
    ck_assert_int_eq(read_step(s), 3);
    fx_optim_state_free(s);

    fx_optim_config sgd = {fx_optim_default_hyper(FX_OPTIM_SGD), false};
    s = init_ok(FX_OPTIM_SGD, p, 2, &sgd);
    fx_optim_hyper mom = sgd.defaults;
    mom.momentum = 0.9;
    expect_step_error(s, FX_OPTIM_SGD, p, 2, g, 2, &mom,
                      "momentum: expected 0 (sgd_init was given momentum 0, so the state holds no momentum buffers), got 0.9");
    fx_optim_state_free(s);
    release_list(p, 2);
    release_list(g, 2);
    fx_tensor rest[5] = {p4, g4, gbf, gs32, pbf};
    release_list(rest, 5);
}
END_TEST

Suite *fx_suite_optim(void)
{
    Suite *s = suite_create("optim");
    TCase *lit = tcase_create("literal");
    tcase_add_test(lit, adamw_two_steps_literal);
    tcase_add_test(lit, adamw_amsgrad_maximize_clip_literal);
    tcase_add_test(lit, sgd_two_steps_literal);
    tcase_add_test(lit, sgd_nesterov_maximize_literal);
    suite_add_tcase(s, lit);
    TCase *sweep = tcase_create("sweep");
    tcase_set_timeout(sweep, 600);
    tcase_add_test(sweep, every_combination_on_awkward_sizes);
    tcase_add_test(sweep, large_tensor);
    tcase_add_test(sweep, many_tensors);
    suite_add_tcase(s, sweep);
    TCase *edges = tcase_create("edges");
    tcase_set_timeout(edges, 120);
    tcase_add_test(edges, skip_leaves_every_byte);
    tcase_add_test(edges, nonfinite_without_skip_propagates);
    tcase_add_test(edges, reported_norm_matches);
    tcase_add_test(edges, misaligned_tensors);
    tcase_add_test(edges, blocks_stride_over_chunks);
    tcase_add_test(edges, empty_tensors_still_count);
    tcase_add_test(edges, try_step_never_waits);
    tcase_add_test(edges, init_validation);
    tcase_add_test(edges, hyper_validation);
    tcase_add_test(edges, step_validation);
    suite_add_tcase(s, edges);
    return s;
}
