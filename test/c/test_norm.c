/* RMSNorm and LayerNorm with residual and gate: forward and backward
 * through the op layer's `_into` ops into poisoned outputs, against an
 * independent f64 reference written here (rows of 1 to 65,537 elements,
 * both kernels of the CUDA backend and its unaligned fallback), CUDA
 * against the CPU backend in every type, the CPU's gradients against
 * central differences of its own f64 forward, the allocating forms and
 * their contexts, a caller's context with exactly the queried scratch,
 * empty shapes, and every bad input with its message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/norm.h"
#include "core/ops.h"
#include "fusex_dtype.h"
#include "layers.h"
#include "testutil.h"

enum {
    OPT_BIAS = 1,
    OPT_RESIDUAL = 2,
    OPT_GATE = 4,
    OPT_DRES_OUT = 8,   /* a gradient reaches residual_out from the next block */
    OPT_RES_F32 = 16,   /* the residual itself in f32 */
    OPT_S_F32 = 32,     /* residual_in_f32 */
    OPT_ALL = OPT_BIAS | OPT_RESIDUAL | OPT_GATE | OPT_DRES_OUT,
};

typedef struct norm_case {
    int kind;
    int64_t rows, hidden;
    fx_dtype type, weight_type;
    unsigned opts;
} norm_case;

static const char *norm_text(const norm_case *c)
{
    static char buf[200];
    snprintf(buf, sizeof buf, "%s %lldx%lld %s weight %s opts %#x", c->kind == FX_NORM_LAYER ? "layer" : "rms",
             (long long)c->rows, (long long)c->hidden, fx_dtype_name(c->type), fx_dtype_name(c->weight_type), c->opts);
    return buf;
}

static bool has(const norm_case *c, unsigned opt)
{
    /* a gradient reaches residual_out only where there is one */
    if (opt == OPT_DRES_OUT && !(c->opts & OPT_RESIDUAL))
        return false;
    return (c->opts & opt) != 0;
}
static fx_dtype residual_type(const norm_case *c) { return has(c, OPT_RES_F32) ? FX_F32 : c->type; }
static fx_dtype s_type(const norm_case *c) { return has(c, OPT_S_F32) ? FX_F32 : residual_type(c); }
static fx_dtype stat_type(const norm_case *c) { return c->type == FX_F64 ? FX_F64 : FX_F32; }

typedef struct norm_host {
    norm_case c;
    double eps;
    double *x, *w, *b, *res, *gate, *dy, *dres_out;
} norm_host;

static norm_host norm_random(norm_case c)
{
    const int64_t n = c.rows * c.hidden;
    norm_host h = {.c = c, .eps = 1e-5};
    h.x = fx_lt_alloc(n);
    for (int64_t i = 0; i < n; i++) /* rows with an offset, so that the mean matters */
        h.x[i] = fx_lt_round(c.type, fx_rand_normal() + 0.5 * (double)((i / c.hidden) % 3));
    h.w = fx_lt_uniform(c.hidden, 0.5, 1.5, c.weight_type);
    h.b = fx_lt_uniform(c.hidden, -0.5, 0.5, c.weight_type);
    h.res = fx_lt_normal(n, residual_type(&c));
    h.gate = fx_lt_uniform(n, -3.0, 3.0, c.type);
    h.dy = fx_lt_normal(n, c.type);
    h.dres_out = fx_lt_normal(n, s_type(&c));
    return h;
}

static void norm_host_free(norm_host *h)
{
    double *all[] = {h->x, h->w, h->b, h->res, h->gate, h->dy, h->dres_out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

typedef struct norm_out {
    double *y, *s, *mean, *rstd, *dx, *dw, *db, *dres, *dgate;
    /* the reference's only: the size of the terms ds cancels, per element
     * (rstd (|dn| + |n| mean|dn n|)): what the statistics' rounding to f32
     * can move it by, relatively (a row of one element: ds is a difference
     * of nearly equal terms) */
    double *ds_scale;
} norm_out;

static void norm_out_free(norm_out *o)
{
    double *all[] = {o->y, o->s, o->mean, o->rstd, o->dx, o->dw, o->db, o->dres, o->dgate, o->ds_scale};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static double sigmoid(double u) { return 1.0 / (1.0 + exp(-u)); }

/* The equations of include/fusex_norm.h as loops in f64; the backward reads
 * s as the forward stored it (rounded to its type) and the statistics from
 * the unrounded s, as the backends do. */
static norm_out norm_reference(const norm_host *h)
{
    const norm_case *c = &h->c;
    const int64_t R = c->rows, H = c->hidden;
    norm_out o = {fx_lt_alloc(R * H), fx_lt_alloc(R * H), fx_lt_alloc(R), fx_lt_alloc(R), fx_lt_alloc(R * H),
                  fx_lt_alloc(H), fx_lt_alloc(H), fx_lt_alloc(R * H), fx_lt_alloc(R * H), fx_lt_alloc(R * H)};
    double *s = fx_lt_alloc(H), *n = fx_lt_alloc(H), *dn = fx_lt_alloc(H);
    for (int64_t r = 0; r < R; r++) {
        const double *x = h->x + r * H;
        for (int64_t j = 0; j < H; j++)
            s[j] = x[j] + (has(c, OPT_RESIDUAL) ? h->res[r * H + j] : 0.0);
        double mean = 0, var = 0;
        if (c->kind == FX_NORM_LAYER) {
            for (int64_t j = 0; j < H; j++)
                mean += s[j];
            mean /= (double)H;
        }
        for (int64_t j = 0; j < H; j++)
            var += (s[j] - mean) * (s[j] - mean);
        const double rstd = 1.0 / sqrt(var / (double)H + h->eps);
        o.mean[r] = mean;
        o.rstd[r] = rstd;
        double a = 0, bsum = 0, abs_dnn = 0;
        for (int64_t j = 0; j < H; j++) {
            const int64_t at = r * H + j;
            const double b = has(c, OPT_BIAS) ? h->b[j] : 0.0, g = h->gate[at];
            double out = (s[j] - mean) * rstd * h->w[j] + b;
            if (has(c, OPT_GATE))
                out *= g * sigmoid(g);
            o.y[at] = out;
            o.s[at] = fx_lt_round(s_type(c), s[j]);
            /* the backward's view of the row */
            const double xs = has(c, OPT_RESIDUAL) ? o.s[at] : x[j];
            n[j] = (xs - mean) * rstd;
            double dout = h->dy[at];
            o.dgate[at] = 0;
            if (has(c, OPT_GATE)) {
                const double sg = sigmoid(g);
                o.dgate[at] = h->dy[at] * (n[j] * h->w[j] + b) * (sg + g * sg * (1 - sg));
                dout = h->dy[at] * g * sg;
            }
            dn[j] = dout * h->w[j];
            a += dn[j] * n[j];
            abs_dnn += fabs(dn[j] * n[j]);
            bsum += dn[j];
            o.dw[j] += dout * n[j];
            o.db[j] += dout;
        }
        a /= (double)H;
        bsum = c->kind == FX_NORM_LAYER ? bsum / (double)H : 0.0;
        for (int64_t j = 0; j < H; j++) {
            const int64_t at = r * H + j;
            const double ds = rstd * (dn[j] - bsum - n[j] * a) + (has(c, OPT_DRES_OUT) ? h->dres_out[at] : 0.0);
            o.dx[at] = ds;
            o.dres[at] = ds;
            o.ds_scale[at] = rstd * (fabs(dn[j]) + fabs(n[j]) * abs_dnn / (double)H);
        }
    }
    free(s);
    free(n);
    free(dn);
    return o;
}

/* ---- device tensors ---- */

typedef struct norm_dev {
    fx_tensor x, w, b, res, gate, dy, dres_out;
    fx_tensor y, s, mean, rstd, dx, dw, db, dres, dgate;
    fx_norm_inputs in;
} norm_dev;

static void norm_upload(fx_device *dev, const norm_host *h, norm_dev *t)
{
    const norm_case *c = &h->c;
    memset(t, 0, sizeof *t);
    const int64_t xd[2] = {c->rows, c->hidden}, hd[1] = {c->hidden}, rd[1] = {c->rows};
    fx_test_tensor(dev, c->type, 2, xd, h->x, &t->x);
    fx_test_tensor(dev, c->weight_type, 1, hd, h->w, &t->w);
    fx_test_tensor(dev, c->weight_type, 1, hd, h->b, &t->b);
    fx_test_tensor(dev, residual_type(c), 2, xd, h->res, &t->res);
    fx_test_tensor(dev, c->type, 2, xd, h->gate, &t->gate);
    fx_test_tensor(dev, c->type, 2, xd, h->dy, &t->dy);
    fx_test_tensor(dev, s_type(c), 2, xd, h->dres_out, &t->dres_out);
    fx_test_poisoned(dev, c->type, 2, xd, &t->y);
    fx_test_poisoned(dev, s_type(c), 2, xd, &t->s);
    fx_test_poisoned(dev, stat_type(c), 1, rd, &t->mean);
    fx_test_poisoned(dev, stat_type(c), 1, rd, &t->rstd);
    fx_test_poisoned(dev, c->type, 2, xd, &t->dx);
    fx_test_poisoned(dev, c->weight_type, 1, hd, &t->dw);
    fx_test_poisoned(dev, c->weight_type, 1, hd, &t->db);
    fx_test_poisoned(dev, residual_type(c), 2, xd, &t->dres);
    fx_test_poisoned(dev, c->type, 2, xd, &t->dgate);
    t->in = (fx_norm_inputs){
        .kind = c->kind, .eps = h->eps, .x = &t->x, .weight = &t->w, .bias = has(c, OPT_BIAS) ? &t->b : NULL,
        .residual = has(c, OPT_RESIDUAL) ? &t->res : NULL, .gate = has(c, OPT_GATE) ? &t->gate : NULL,
        .residual_in_f32 = has(c, OPT_S_F32),
    };
}

static void norm_release(norm_dev *t)
{
    fx_tensor *all[] = {&t->x, &t->w, &t->b, &t->res, &t->gate, &t->dy, &t->dres_out, &t->y,
                        &t->s, &t->mean, &t->rstd, &t->dx, &t->dw, &t->db, &t->dres, &t->dgate};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
}

typedef struct norm_call {
    const fx_tensor *s, *mean, *rstd, *dres_out;
    fx_norm_grad_outs g;
} norm_call;

static norm_call norm_call_of(norm_dev *t)
{
    const fx_norm_inputs *in = &t->in;
    norm_call k = {
        .s = in->residual ? &t->s : NULL, .mean = in->kind == FX_NORM_LAYER ? &t->mean : NULL, .rstd = &t->rstd,
        .g = {.dx = &t->dx, .dweight = &t->dw, .dbias = in->bias ? &t->db : NULL,
              .dresidual = in->residual ? &t->dres : NULL, .dgate = in->gate ? &t->dgate : NULL},
    };
    return k;
}

/* Forward then backward on ex (NULL: the device's own). */
static void norm_run(const fx_exec *ex, norm_dev *t, bool dres_out)
{
    fx_status st;
    fx_status_clear(&st);
    norm_call k = norm_call_of(t);
    fx_op_norm_forward_into(ex, &t->in, &t->y, k.s, k.mean, k.rstd, &st);
    ck_assert_msg(st.code == FX_OK, "norm forward: %s", st.msg);
    fx_op_norm_backward_into(ex, &t->in, k.s, k.mean, k.rstd, &t->dy, dres_out ? &t->dres_out : NULL, &k.g, &st);
    ck_assert_msg(st.code == FX_OK, "norm backward: %s", st.msg);
}

static norm_out norm_read(const norm_dev *t)
{
    norm_out o = {fx_test_read(&t->y),  fx_test_read(&t->s),  fx_test_read(&t->mean),
                  fx_test_read(&t->rstd), fx_test_read(&t->dx), fx_test_read(&t->dw),
                  fx_test_read(&t->db), fx_test_read(&t->dres), fx_test_read(&t->dgate), NULL};
    return o;
}

static double summed_tolerance(double tol, int64_t terms)
{
    const double scale = sqrt((double)terms) / 4.0;
    return tol * (scale > 1.0 ? scale : 1.0);
}

/* ||got - ds|| <= tol ||ds|| + 16 eps ||ds_scale||, eps f32's (the
 * statistics and the arithmetic): ds is a difference of terms of that
 * size, and where they nearly cancel (a row of one element) a rounding of
 * them moves it by far more than tol of itself. A want that is not the
 * reference (the CPU backend's output) has no scale: plain rel-L2. */
static void check_ds(const char *what, const norm_case *c, const double *got, const norm_out *want, double tol)
{
    const int64_t n = c->rows * c->hidden;
    const double *ds = strcmp(what, "dx") == 0 ? want->dx : want->dres;
    if (!want->ds_scale) {
        FX_LT_CLOSE(what, got, ds, n, tol, norm_text(c));
        return;
    }
    const double eps = c->type == FX_F64 ? 0x1p-52 : 0x1p-24;
    const double diff = fx_l2_diff(got, ds, n), bound = tol * fx_l2(ds, n) + 16 * eps * fx_l2(want->ds_scale, n);
    ck_assert_msg(diff <= bound, "%s: ||got - want|| %.3g > %.3g (rel-L2 %.3g) for %s (seed %llu)", what, diff, bound,
                  fx_rel_l2(got, ds, n), norm_text(c), (unsigned long long)fx_test_seed());
}

static void norm_compare(const norm_case *c, const norm_out *got, const norm_out *want, double tol)
{
    const int64_t n = c->rows * c->hidden;
    const char *name = norm_text(c);
    FX_LT_CLOSE("y", got->y, want->y, n, tol, name);
    if (has(c, OPT_RESIDUAL))
        FX_LT_CLOSE("residual_out", got->s, want->s, n, s_type(c) == FX_F32 ? 1e-6 : tol, name);
    if (c->kind == FX_NORM_LAYER)
        FX_LT_CLOSE("mean", got->mean, want->mean, c->rows, 1e-5, name);
    FX_LT_CLOSE("rstd", got->rstd, want->rstd, c->rows, 1e-5, name);
    check_ds("dx", c, got->dx, want, tol);
    const double wtol = c->weight_type == FX_F32 && c->type != FX_F32 ? 1e-2 : tol;
    FX_LT_CLOSE_SUM("dweight", got->dw, want->dw, c->hidden, c->rows, summed_tolerance(fmax(wtol, fx_lt_tolerance(c->weight_type)), c->rows), name);
    if (has(c, OPT_BIAS))
        FX_LT_CLOSE_SUM("dbias", got->db, want->db, c->hidden, c->rows, summed_tolerance(fmax(wtol, fx_lt_tolerance(c->weight_type)), c->rows), name);
    if (has(c, OPT_RESIDUAL))
        check_ds("dresidual", c, got->dres, want, fmax(tol, fx_lt_tolerance(residual_type(c))));
    if (has(c, OPT_GATE))
        FX_LT_CLOSE("dgate", got->dgate, want->dgate, n, tol, name);
}

static double norm_tolerance(const norm_case *c) { return c->type == FX_F64 ? 1e-10 : fx_lt_tolerance(c->type); }

static void check_norm_case(norm_case c)
{
    fx_device *dev = fx_test_device();
    norm_host h = norm_random(c);
    norm_out want = norm_reference(&h);
    norm_dev t;
    norm_upload(dev, &h, &t);
    norm_run(NULL, &t, has(&c, OPT_DRES_OUT));
    norm_out got = norm_read(&t);
    norm_compare(&c, &got, &want, norm_tolerance(&c));
    norm_out_free(&got);
    norm_out_free(&want);
    norm_release(&t);
    norm_host_free(&h);
}

static norm_case norm_of(int kind, int64_t rows, int64_t hidden, fx_dtype type, unsigned opts)
{
    norm_case c = {.kind = kind, .rows = rows, .hidden = hidden, .type = type, .weight_type = type, .opts = opts};
    return c;
}

START_TEST(matches_reference)
{
    /* rows of one element, odd and prime lengths (no packs), a warp's two
     * packs, the rows kernel at every width, the long kernel past it */
    const int64_t hidden[] = {1, 37, 64, 256, 768, 1024, 1031, 2048, 4096, 8200};
    const int64_t rows[] = {3, 37, 300};
    int count = 0;
    for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
        for (int kind = 0; kind < 2; kind++) {
            const unsigned opts = (unsigned)(count * 5) % 16; /* every combination of the four options in turn */
            int64_t r = rows[(size_t)count % 3];
            if (fx_test_emulated() && hidden[i] * r > (1 << 18))
                r = 5;
            check_norm_case(norm_of(kind, r, hidden[i], FX_F32, opts));
            count++;
        }
    /* every option at once, and none */
    check_norm_case(norm_of(FX_NORM_LAYER, 17, 1024, FX_F32, OPT_ALL));
    check_norm_case(norm_of(FX_NORM_RMS, 17, 1024, FX_F32, OPT_ALL));
    check_norm_case(norm_of(FX_NORM_RMS, 1, 1024, FX_F32, 0));
}
END_TEST

START_TEST(rows_of_65537)
{
    /* a prime length past the rows kernel's reach: the long kernels, with
     * several rows a block */
    check_norm_case(norm_of(FX_NORM_LAYER, 200, 2053, FX_F32, OPT_ALL));
    for (int kind = 0; kind < 2; kind++)
        check_norm_case(norm_of(kind, 2, 65537, FX_F32, kind ? OPT_ALL : OPT_RESIDUAL | OPT_GATE));
}
END_TEST

START_TEST(every_type)
{
    fx_device *dev = fx_test_device();
    const fx_dtype types[] = {FX_BF16, FX_F16, FX_F64};
    const int64_t hidden[] = {1024, 768, 37, 4096};
    for (size_t t = 0; t < 3; t++) {
        if (types[t] == FX_F64 && dev->kind != FX_DEVICE_CPU)
            continue;
        for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
            for (int kind = 0; kind < 2; kind++) {
                norm_case c = norm_of(kind, 24, hidden[i], types[t], OPT_ALL);
                if (types[t] != FX_F64) {
                    if (i % 2 == 0)
                        c.weight_type = FX_F32; /* f32 weights with 16-bit activations */
                    if (i == 1)
                        c.opts |= OPT_RES_F32;  /* an f32 residual stream */
                    if (i == 2)
                        c.opts |= OPT_S_F32;    /* residual_in_f32 */
                }
                check_norm_case(c);
            }
    }
}
END_TEST

/* A view one element past an aligned start: the packs are off, the
 * unaligned kernel runs and gives the same answers. */
START_TEST(unaligned_views)
{
    fx_device *dev = fx_test_device();
    norm_case c = norm_of(FX_NORM_LAYER, 6, 256, FX_F32, OPT_ALL);
    norm_host h = norm_random(c);
    norm_out want = norm_reference(&h);
    norm_dev t;
    norm_upload(dev, &h, &t);
    /* x again, inside a larger tensor one element in */
    fx_tensor big;
    double *shifted = fx_lt_alloc(c.rows * c.hidden + 1);
    memcpy(shifted + 1, h.x, sizeof(double) * (size_t)(c.rows * c.hidden));
    const int64_t bd[1] = {c.rows * c.hidden + 1};
    fx_test_tensor(dev, FX_F32, 1, bd, shifted, &big);
    fx_tensor view = t.x;
    view.data = (char *)big.data + sizeof(float);
    view.buffer = big.buffer;
    t.in.x = &view;
    norm_run(NULL, &t, true);
    norm_out got = norm_read(&t);
    norm_compare(&c, &got, &want, 1e-5);
    norm_out_free(&got);
    norm_out_free(&want);
    fx_tensor_release(&big);
    free(shifted);
    norm_release(&t);
    norm_host_free(&h);
}
END_TEST

START_TEST(cuda_matches_cpu)
{
    fx_device *dev = fx_test_device();
    if (dev->kind == FX_DEVICE_CPU)
        return; /* the sweeps compare the CPU with the reference */
    const fx_dtype types[] = {FX_F32, FX_BF16, FX_F16};
    const int64_t hidden[] = {1024, 100, 5000};
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < 3; i++)
            for (int kind = 0; kind < 2; kind++) {
                norm_case c = norm_of(kind, 9, hidden[i], types[t], (unsigned)(i + 1) * 5 % 16 | OPT_RESIDUAL);
                norm_host h = norm_random(c);
                norm_dev d, cpu;
                norm_upload(dev, &h, &d);
                norm_upload(fx_test_oracle(), &h, &cpu);
                norm_run(NULL, &d, has(&c, OPT_DRES_OUT));
                norm_run(NULL, &cpu, has(&c, OPT_DRES_OUT));
                norm_out got = norm_read(&d), want = norm_read(&cpu);
                norm_compare(&c, &got, &want, norm_tolerance(&c));
                norm_out_free(&got);
                norm_out_free(&want);
                norm_release(&d);
                norm_release(&cpu);
                norm_host_free(&h);
            }
}
END_TEST

/* sum(dy * y) + sum(dres_out * s) of the CPU's f64 forward, one input nudged. */
static double cpu_loss(const norm_host *h, double **which, int64_t at, double delta)
{
    const double saved = (*which)[at];
    (*which)[at] = saved + delta;
    norm_dev t;
    norm_upload(fx_test_oracle(), h, &t);
    (*which)[at] = saved;
    fx_status st;
    fx_status_clear(&st);
    fx_op_norm_forward_into(NULL, &t.in, &t.y, t.in.residual ? &t.s : NULL, NULL, NULL, &st);
    FX_CK_OK(st);
    double *y = fx_test_read(&t.y), *s = fx_test_read(&t.s), loss = 0;
    const int64_t n = h->c.rows * h->c.hidden;
    for (int64_t i = 0; i < n; i++)
        loss += h->dy[i] * y[i] + (t.in.residual ? h->dres_out[i] * s[i] : 0.0);
    free(y);
    free(s);
    norm_release(&t);
    return loss;
}

START_TEST(cpu_gradients_match_finite_differences)
{
    for (int kind = 0; kind < 2; kind++)
        for (unsigned opts = 0; opts < 8; opts++) {
            norm_case c = norm_of(kind, 3, 6, FX_F64, opts | OPT_BIAS | ((opts & OPT_RESIDUAL) ? OPT_DRES_OUT : 0));
            norm_host h = norm_random(c);
            norm_dev t;
            norm_upload(fx_test_oracle(), &h, &t);
            norm_run(NULL, &t, has(&c, OPT_DRES_OUT));
            norm_out got = norm_read(&t);
            struct {
                const char *name;
                double **input;
                const double *grad;
                int64_t n;
                bool on;
            } checks[] = {
                {"dx", &h.x, got.dx, c.rows * c.hidden, true},
                {"dweight", &h.w, got.dw, c.hidden, true},
                {"dbias", &h.b, got.db, c.hidden, true},
                {"dresidual", &h.res, got.dres, c.rows * c.hidden, has(&c, OPT_RESIDUAL)},
                {"dgate", &h.gate, got.dgate, c.rows * c.hidden, has(&c, OPT_GATE)},
            };
            for (size_t k = 0; k < sizeof checks / sizeof checks[0]; k++)
                for (int64_t i = 0; checks[k].on && i < checks[k].n; i++) {
                    const double step = 1e-6;
                    const double fd =
                        (cpu_loss(&h, checks[k].input, i, step) - cpu_loss(&h, checks[k].input, i, -step)) / (2 * step);
                    ck_assert_msg(fabs(fd - checks[k].grad[i]) <= 1e-6 * (1 + fabs(fd)),
                                  "%s: %s[%lld] %.10g, central difference %.10g (seed %llu)", norm_text(&c),
                                  checks[k].name, (long long)i, checks[k].grad[i], fd,
                                  (unsigned long long)fx_test_seed());
                }
            norm_out_free(&got);
            norm_release(&t);
            norm_host_free(&h);
        }
}
END_TEST

START_TEST(contexts_keep_the_statistics)
{
    fx_device *dev = fx_test_device();
    for (int kind = 0; kind < 2; kind++) {
        norm_case c = norm_of(kind, 12, 96, FX_F32, OPT_ALL);
        norm_host h = norm_random(c);
        norm_out want = norm_reference(&h);
        norm_dev t;
        norm_upload(dev, &h, &t);
        fx_status st;
        fx_status_clear(&st);
        fx_tensor y, s;
        fx_norm_ctx *ctx = NULL;
        fx_op_norm_forward(&t.in, &y, &s, &ctx, &st);
        FX_CK_OK(st);
        ck_assert_uint_eq(fx_norm_ctx_saved_bytes(ctx), (kind == FX_NORM_LAYER ? 2 : 1) * 12 * sizeof(float));
        fx_norm_grads g;
        fx_op_norm_backward(ctx, &t.dy, &t.dres_out, &g, &st);
        FX_CK_OK(st);
        double *gy = fx_test_read(&y), *gs = fx_test_read(&s), *gdx = fx_test_read(&g.dx),
               *gdw = fx_test_read(&g.dweight), *gdr = fx_test_read(&g.dresidual), *gdg = fx_test_read(&g.dgate);
        const int64_t n = 12 * 96;
        FX_LT_CLOSE("y", gy, want.y, n, 1e-5, norm_text(&c));
        FX_LT_CLOSE("residual_out", gs, want.s, n, 1e-6, norm_text(&c));
        FX_LT_CLOSE("dx", gdx, want.dx, n, 1e-5, norm_text(&c));
        FX_LT_CLOSE("dweight", gdw, want.dw, 96, 1e-5, norm_text(&c));
        FX_LT_CLOSE("dresidual", gdr, want.dres, n, 1e-5, norm_text(&c));
        FX_LT_CLOSE("dgate", gdg, want.dgate, n, 1e-5, norm_text(&c));
        free(gy);
        free(gs);
        free(gdx);
        free(gdw);
        free(gdr);
        free(gdg);
        fx_norm_grads_release(&g);
        fx_tensor_release(&y);
        fx_tensor_release(&s);
        fx_norm_ctx_free(ctx);
        norm_out_free(&want);
        norm_release(&t);
        norm_host_free(&h);
    }
}
END_TEST

START_TEST(callers_context_with_exact_scratch)
{
    fx_device *dev = fx_test_device();
    const int64_t hidden[] = {1024, 300, 9000};
    for (size_t i = 0; i < 3; i++)
        for (int kind = 0; kind < 2; kind++) {
            norm_case c = norm_of(kind, i == 2 ? 3 : 40, hidden[i], i == 1 ? FX_BF16 : FX_F32, OPT_ALL);
            norm_host h = norm_random(c);
            norm_out want = norm_reference(&h);
            norm_dev t;
            norm_upload(dev, &h, &t);
            norm_call k = norm_call_of(&t);
            fx_lt_own_stream_done(dev);
            fx_lt_caller fwd, bwd;
            fx_status st;
            fx_status_clear(&st);
            fx_lt_caller_open(dev, fx_op_norm_forward_scratch(NULL, &t.in, &t.y, k.s, k.mean, k.rstd), &fwd);
            fx_op_norm_forward_into(&fwd.ex, &t.in, &t.y, k.s, k.mean, k.rstd, &st);
            FX_CK_OK(st);
            fx_lt_caller_close(&fwd);
            fx_lt_caller_open(dev, fx_op_norm_backward_scratch(NULL, &t.in, k.s, k.mean, k.rstd, &t.dy, &t.dres_out, &k.g),
                              &bwd);
            fx_op_norm_backward_into(&bwd.ex, &t.in, k.s, k.mean, k.rstd, &t.dy, &t.dres_out, &k.g, &st);
            FX_CK_OK(st);
            fx_lt_caller_close(&bwd);
            norm_out got = norm_read(&t);
            norm_compare(&c, &got, &want, norm_tolerance(&c));
            norm_out_free(&got);
            norm_out_free(&want);
            norm_release(&t);
            norm_host_free(&h);
        }
}
END_TEST

START_TEST(empty_rows)
{
    for (int kind = 0; kind < 2; kind++)
        check_norm_case(norm_of(kind, 0, 16, FX_F32, OPT_ALL));
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
    norm_case c = norm_of(FX_NORM_LAYER, 4, 8, FX_F32, OPT_ALL);
    norm_host h = norm_random(c);
    norm_dev t;
    norm_upload(dev, &h, &t);
    norm_call k = norm_call_of(&t);
    fx_tensor w7, ints, empty, scalar, r3, f16x, rows3;
    const int64_t d7[1] = {7}, d48[2] = {4, 8}, d40[2] = {4, 0}, d38[2] = {3, 8}, d3[1] = {3};
    tensor_of(dev, FX_F32, 1, d7, &w7);
    tensor_of(dev, FX_S32, 2, d48, &ints);
    tensor_of(dev, FX_F32, 2, d40, &empty);
    tensor_of(dev, FX_F32, 0, d7, &scalar);
    tensor_of(dev, FX_F32, 2, d38, &r3);
    tensor_of(dev, FX_F16, 2, d48, &f16x);
    tensor_of(dev, FX_F32, 1, d3, &rows3);
    fx_status st;
    fx_norm_inputs in;
#define FWD_ERROR(msg)                                                                                      \
    do {                                                                                                    \
        fx_status_clear(&st);                                                                               \
        fx_lt_expect_error(fx_op_norm_forward_into(NULL, &in, &t.y, in.residual ? &t.s : NULL, NULL, NULL, &st), \
                           &st, msg);                                                                        \
    } while (0)
    in = t.in, in.x = &ints;
    FWD_ERROR(dev->kind == FX_DEVICE_CPU ? "x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}"
                                         : "x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}");
    in = t.in, in.x = &scalar;
    FWD_ERROR("x: expected rank >= 1 [..., hidden], got rank 0 shape {}");
    in = t.in, in.x = &empty, in.residual = NULL, in.gate = NULL;
    FWD_ERROR("x: expected hidden >= 1 [..., hidden], got shape {4,0}");
    in = t.in, in.weight = &w7;
    FWD_ERROR("weight: expected shape {8} [hidden], got {7}");
    in = t.in, in.bias = &w7;
    FWD_ERROR("bias: expected shape {8} [hidden], got {7}");
    in = t.in, in.residual = &r3;
    FWD_ERROR("residual: expected shape {4,8} [..., hidden], got {3,8}");
    in = t.in, in.residual = &f16x;
    FWD_ERROR("residual: expected type {f,32}, got {f,16}");
    in = t.in, in.gate = &f16x;
    FWD_ERROR("gate: expected type {f,32}, got {f,16}");
    in = t.in, in.eps = -1;
    FWD_ERROR("eps: expected a finite number >= 0, got -1");
    in = t.in, in.kind = 7;
    FWD_ERROR("kind: expected rms (0) or layer (1), got 7");
    in = t.in;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_forward_into(NULL, &in, &t.y, NULL, NULL, NULL, &st), &st,
                       "s: expected a tensor (a residual is given), got none");
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_forward_into(NULL, &in, &t.y, &t.s, &rows3, NULL, &st), &st,
                       "mean: expected shape {4} [rows], got {3}");
    in.kind = FX_NORM_RMS;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_forward_into(NULL, &in, &t.y, &t.s, &t.mean, NULL, &st), &st,
                       "mean: expected none (rms_norm keeps no mean), got a tensor");
    in = t.in;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_backward_into(NULL, &in, k.s, NULL, k.rstd, &t.dy, NULL, &k.g, &st), &st,
                       "mean: expected a tensor (the forward's statistics [rows]), got none");
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_backward_into(NULL, &in, k.s, k.mean, k.rstd, &r3, NULL, &k.g, &st), &st,
                       "dy: expected shape {4,8} [..., hidden], got {3,8}");
    norm_call bad = k;
    bad.g.dgate = NULL;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_backward_into(NULL, &in, k.s, k.mean, k.rstd, &t.dy, NULL, &bad.g, &st), &st,
                       "dgate: expected a gradient tensor (its input was given), got none");
    in.residual = NULL;
    fx_status_clear(&st);
    fx_lt_expect_error(fx_op_norm_backward_into(NULL, &in, NULL, k.mean, k.rstd, &t.dy, &t.dres_out, &k.g, &st), &st,
                       "ds: expected none (no residual was given), got a tensor");
#undef FWD_ERROR
    fx_tensor *all[] = {&w7, &ints, &empty, &scalar, &r3, &f16x, &rows3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    norm_release(&t);
    norm_host_free(&h);
}
END_TEST

Suite *fx_suite_norm(void)
{
    Suite *s = suite_create("norm");
    TCase *tc = tcase_create("norm");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, matches_reference);
    tcase_add_test(tc, rows_of_65537);
    tcase_add_test(tc, every_type);
    tcase_add_test(tc, unaligned_views);
    tcase_add_test(tc, cuda_matches_cpu);
    tcase_add_test(tc, cpu_gradients_match_finite_differences);
    tcase_add_test(tc, contexts_keep_the_statistics);
    tcase_add_test(tc, callers_context_with_exact_scratch);
    tcase_add_test(tc, empty_rows);
    tcase_add_test(tc, validation_messages);
    suite_add_tcase(s, tc);
    return s;
}
