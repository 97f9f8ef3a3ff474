/* A bench driver for the rest of a Mamba block on a GPU, below Erlang:
 * causal_conv1d, rms_norm / layer_norm and the linear layer, through the op
 * layer's `_into` ops on device tensors, each op timed with device events
 * after a busy-wait (as fusex_bench does), plus the host side (the call and
 * a synchronize: what a one-frame caller waits for). bench/peers_mamba.py
 * times PyTorch's versions of the same rows in the same GPU call.
 *
 *   make -f dev/Makefile build/mamba_bench
 *   FUSEX_PRIV=priv build/mamba_bench [--case N | --cases N,M,...] [--reps N]
 *
 * Prints a markdown table: median kernel µs, the floor's bytes (each
 * input read once, each output written once: the column says which), GB/s
 * over them, % of the device-to-device copy bandwidth measured first,
 * TFLOP/s for the products, host µs. Profile one case with
 *
 *   FUSEX_PRIV=priv ncu --set full -c 4 build/mamba_bench --case 0 --reps 1 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/conv.h"
#include "core/linear.h"
#include "core/norm.h"
#include "core/ops.h"
#include "core/runtime.h"
#include "fusex_cpu.h"
#include "fusex_dtype.h"

typedef enum { FAM_CONV, FAM_CONV_STEP, FAM_NORM, FAM_LINEAR } family;
typedef enum { FWD, BWD, FWD_BWD } mode;

typedef struct bench_case {
    family fam;
    mode mode;
    fx_dtype dtype;
    int64_t a, b, c, d; /* conv: B L D W; norm: rows hidden; linear: rows in out */
    int kind;           /* norm: fx_norm_kind; linear and conv: the activation */
    unsigned opts;      /* norm: 1 residual, 2 gate, 4 bias; linear, conv: 1 bias */
    const char *target; /* the target for the row, or "" */
} bench_case;

static const bench_case cases[] = {
    {FAM_CONV, FWD, FX_F32, 8, 2048, 1536, 4, FX_ACT_SILU, 1, ">= 85 % copy"},
    {FAM_CONV, FWD_BWD, FX_F32, 8, 2048, 1536, 4, FX_ACT_SILU, 1, "<= 1.3x floor"},
    {FAM_CONV, BWD, FX_F32, 8, 2048, 1536, 4, FX_ACT_SILU, 1, ""},
    {FAM_CONV, FWD, FX_BF16, 8, 2048, 1536, 4, FX_ACT_SILU, 1, ""},
    {FAM_CONV, FWD, FX_F32, 8, 2048, 1536, 7, FX_ACT_NONE, 1, ""},
    {FAM_CONV_STEP, FWD, FX_F32, 1, 1, 1536, 4, FX_ACT_SILU, 1, "Erlang e2e <= 15 us"},
    {FAM_NORM, FWD, FX_F32, 65536, 1024, 0, 0, FX_NORM_RMS, 1, ">= 90 % copy; < 131.6 us"},
    {FAM_NORM, FWD_BWD, FX_F32, 65536, 1024, 0, 0, FX_NORM_RMS, 1, ">= 85 % copy"},
    {FAM_NORM, BWD, FX_F32, 65536, 1024, 0, 0, FX_NORM_RMS, 1, ""},
    {FAM_NORM, FWD, FX_F32, 65536, 1024, 0, 0, FX_NORM_LAYER, 0, ""},
    {FAM_NORM, FWD, FX_BF16, 65536, 1024, 0, 0, FX_NORM_RMS, 3, ""},
    {FAM_NORM, FWD_BWD, FX_BF16, 65536, 1024, 0, 0, FX_NORM_LAYER, 7, ""},
    {FAM_NORM, FWD, FX_F32, 256, 65537, 0, 0, FX_NORM_RMS, 1, ""},
    {FAM_LINEAR, FWD, FX_BF16, 16384, 768, 3072, 0, FX_ACT_NONE, 1, "within 3 % of torch"},
    {FAM_LINEAR, FWD, FX_BF16, 16384, 768, 3072, 0, FX_ACT_GELU, 1, ""},
    {FAM_LINEAR, FWD, FX_BF16, 16384, 768, 3072, 0, FX_ACT_SILU, 1, ""},
    {FAM_LINEAR, BWD, FX_BF16, 16384, 768, 3072, 0, FX_ACT_NONE, 1, ""},
    {FAM_LINEAR, FWD, FX_F32, 16384, 768, 3072, 0, FX_ACT_NONE, 1, ""},
    {FAM_LINEAR, FWD, FX_F32, 1, 256, 1024, 0, FX_ACT_NONE, 1, "Erlang e2e <= 15 us"},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static void die(const char *what, const fx_status *st)
{
    fprintf(stderr, "%s: %s\n", what, st->msg);
    exit(1);
}

static uint64_t rng = 88172645463325252ull;
static double uniform(double lo, double hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (double)(rng >> 11) / 9007199254740992.0;
}

static void random_tensor(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, double lo, double hi,
                          fx_tensor *out)
{
    fx_status st;
    fx_status_clear(&st);
    int64_t numel;
    size_t nbytes;
    if (fx_shape_nbytes("bench", dtype, rank, dims, &numel, &nbytes, &st))
        die("shape", &st);
    void *host = malloc(nbytes ? nbytes : 1);
    for (int64_t i = 0; i < numel; i++)
        fx_store_f64(host, dtype, i, uniform(lo, hi));
    if (fx_op_from_host(dev, dtype, rank, dims, host, nbytes, out, &st))
        die("upload", &st);
    free(host);
}

static void empty_tensor(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, fx_tensor *out)
{
    fx_status st;
    fx_status_clear(&st);
    if (fx_tensor_alloc(dev, dtype, rank, dims, out, &st))
        die("alloc", &st);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Every tensor a case can use; the ones it does not stay empty. */
typedef struct state {
    const bench_case *c;
    fx_tensor t[16];
    int count;
    fx_conv_inputs conv;
    fx_norm_inputs norm;
    fx_linear_inputs lin;
    fx_tensor *x, *y, *dy, *dx, *dw, *db, *s, *mean, *rstd, *dres, *pre, *state;
} state;

static fx_tensor *rnd(state *s, fx_device *dev, fx_dtype t, int rank, const int64_t *dims, double lo, double hi)
{
    fx_tensor *out = &s->t[s->count++];
    random_tensor(dev, t, rank, dims, lo, hi, out);
    return out;
}

static fx_tensor *out(state *s, fx_device *dev, fx_dtype t, int rank, const int64_t *dims)
{
    fx_tensor *o = &s->t[s->count++];
    empty_tensor(dev, t, rank, dims, o);
    return o;
}

static void setup(fx_device *dev, const bench_case *c, state *s)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    const fx_dtype t = c->dtype;
    if (c->fam == FAM_CONV || c->fam == FAM_CONV_STEP) {
        const int64_t xd[3] = {c->a, c->b, c->c}, wd[2] = {c->c, c->d}, bd[1] = {c->c}, sd[3] = {c->a, c->c, c->d - 1},
                      step[2] = {c->a, c->c};
        const bool stepping = c->fam == FAM_CONV_STEP;
        s->x = rnd(s, dev, t, stepping ? 2 : 3, stepping ? step : xd, -1, 1);
        s->conv = (fx_conv_inputs){.x = s->x, .w = rnd(s, dev, t, 2, wd, -0.5, 0.5),
                                   .bias = (c->opts & 1) ? rnd(s, dev, t, 1, bd, -0.5, 0.5) : NULL,
                                   .activation = c->kind};
        s->y = out(s, dev, t, stepping ? 2 : 3, stepping ? step : xd);
        if (stepping) {
            s->state = rnd(s, dev, t, 3, sd, -1, 1);
            return;
        }
        s->dy = rnd(s, dev, t, 3, xd, -1, 1);
        s->dx = out(s, dev, t, 3, xd);
        s->dw = out(s, dev, t, 2, wd);
        s->db = out(s, dev, t, 1, bd);
        return;
    }
    if (c->fam == FAM_NORM) {
        const int64_t xd[2] = {c->a, c->b}, hd[1] = {c->b}, rd[1] = {c->a};
        s->x = rnd(s, dev, t, 2, xd, -1, 1);
        s->norm = (fx_norm_inputs){
            .kind = c->kind, .eps = 1e-5, .x = s->x, .weight = rnd(s, dev, t, 1, hd, 0.5, 1.5),
            .bias = (c->opts & 4) ? rnd(s, dev, t, 1, hd, -0.5, 0.5) : NULL,
            .residual = (c->opts & 1) ? rnd(s, dev, t, 2, xd, -1, 1) : NULL,
            .gate = (c->opts & 2) ? rnd(s, dev, t, 2, xd, -1, 1) : NULL,
        };
        s->y = out(s, dev, t, 2, xd);
        s->s = (c->opts & 1) ? out(s, dev, t, 2, xd) : NULL;
        s->mean = c->kind == FX_NORM_LAYER ? out(s, dev, FX_F32, 1, rd) : NULL;
        s->rstd = out(s, dev, FX_F32, 1, rd);
        s->dy = rnd(s, dev, t, 2, xd, -1, 1);
        s->dx = out(s, dev, t, 2, xd);
        s->dw = out(s, dev, t, 1, hd);
        s->db = (c->opts & 4) ? out(s, dev, t, 1, hd) : NULL;
        s->dres = (c->opts & 1) ? out(s, dev, t, 2, xd) : NULL;
        s->pre = (c->opts & 2) ? out(s, dev, t, 2, xd) : NULL; /* dgate */
        return;
    }
    const int64_t xd[2] = {c->a, c->b}, wd[2] = {c->c, c->b}, bd[1] = {c->c}, yd[2] = {c->a, c->c};
    s->x = rnd(s, dev, t, 2, xd, -1, 1);
    s->lin = (fx_linear_inputs){.x = s->x, .w = rnd(s, dev, t, 2, wd, -0.05, 0.05),
                                .bias = (c->opts & 1) ? rnd(s, dev, t, 1, bd, -0.5, 0.5) : NULL,
                                .activation = c->kind};
    s->y = out(s, dev, t, 2, yd);
    s->pre = fx_linear_reads_pre(c->kind) ? out(s, dev, t, 2, yd) : NULL;
    s->dy = rnd(s, dev, t, 2, yd, -1, 1);
    s->dx = out(s, dev, t, 2, xd);
    s->dw = out(s, dev, t, 2, wd);
    s->db = (c->opts & 1) ? out(s, dev, t, 1, bd) : NULL;
}

/* What a backward row reads of its forward (residual_out, the statistics,
 * the pre-activation) is written once first. */
static void forward_once(state *s)
{
    fx_status st;
    fx_status_clear(&st);
    if (s->c->fam == FAM_NORM && fx_op_norm_forward_into(NULL, &s->norm, s->y, s->s, s->mean, s->rstd, &st))
        die("norm forward", &st);
    if (s->c->fam == FAM_LINEAR && fx_op_linear_forward_into(NULL, &s->lin, s->y, s->pre, &st))
        die("linear forward", &st);
}

static void teardown(state *s)
{
    for (int i = 0; i < s->count; i++)
        fx_tensor_release(&s->t[i]);
}

static void run_once(state *s)
{
    const bench_case *c = s->c;
    fx_status st;
    fx_status_clear(&st);
    switch (c->fam) {
    case FAM_CONV_STEP:
        if (fx_op_conv_step_into(NULL, s->state, &s->conv, s->y, &st))
            die("conv step", &st);
        return;
    case FAM_CONV: {
        if (c->mode != BWD && fx_op_conv_forward_into(NULL, &s->conv, s->y, NULL, &st))
            die("conv forward", &st);
        const fx_conv_grad_outs g = {.dx = s->dx, .dw = s->dw, .dbias = s->conv.bias ? s->db : NULL};
        if (c->mode != FWD && fx_op_conv_backward_into(NULL, &s->conv, s->dy, NULL, &g, &st))
            die("conv backward", &st);
        return;
    }
    case FAM_NORM: {
        if (c->mode != BWD && fx_op_norm_forward_into(NULL, &s->norm, s->y, s->s, s->mean, s->rstd, &st))
            die("norm forward", &st);
        const fx_norm_grad_outs g = {.dx = s->dx, .dweight = s->dw, .dbias = s->db, .dresidual = s->dres, .dgate = s->pre};
        if (c->mode != FWD && fx_op_norm_backward_into(NULL, &s->norm, s->s, s->mean, s->rstd, s->dy, NULL, &g, &st))
            die("norm backward", &st);
        return;
    }
    case FAM_LINEAR: {
        if (c->mode != BWD && fx_op_linear_forward_into(NULL, &s->lin, s->y, s->pre, &st))
            die("linear forward", &st);
        const fx_linear_grad_outs g = {.dx = s->dx, .dw = s->dw, .dbias = s->db};
        if (c->mode != FWD &&
            fx_op_linear_backward_into(NULL, &s->lin, fx_linear_reads_output(c->kind) ? s->y : NULL, s->pre, s->dy, &g, &st))
            die("linear backward", &st);
        return;
    }
    }
}

/* Times `reps` runs by device events after a busy-wait, and by the host
 * (call + synchronize), after `warm` untimed runs. */
static void time_runs(fx_device *dev, int reps, int warm, state *s, void *e0, void *e1, double *k_us, double *h_us)
{
    const fx_backend *be = dev->backend;
    fx_status st;
    fx_status_clear(&st);
    for (int i = 0; i < warm; i++)
        run_once(s);
    be->synchronize(dev->ordinal, &st);
    for (int i = 0; i < reps; i++) {
        be->busy_wait(dev->ordinal, 200, &st);
        be->event_record(dev->ordinal, e0, &st);
        run_once(s);
        be->event_record(dev->ordinal, e1, &st);
        be->synchronize(dev->ordinal, &st);
        be->event_elapsed_us(dev->ordinal, e0, e1, &k_us[i], &st);
        double t0 = now_us();
        run_once(s);
        be->synchronize(dev->ordinal, &st);
        h_us[i] = now_us() - t0;
    }
    if (st.code)
        die("timing", &st);
}

/* The floor, in bytes, and what it counts (inputs read once, outputs
 * written once; parameters and statistics included). */
static double floor_bytes(const bench_case *c, char *what, size_t len)
{
    const double es = (double)fx_dtype_size(c->dtype);
    if (c->fam == FAM_CONV || c->fam == FAM_CONV_STEP) {
        const double n = (double)c->a * c->b * c->c * es, params = (double)c->c * (c->d + 1) * es;
        if (c->fam == FAM_CONV_STEP) {
            snprintf(what, len, "x, y, state r+w");
            return 2 * n + 2 * (double)c->a * c->c * (c->d - 1) * es + params;
        }
        const double fwd = 2 * n + params, bwd = 3 * n + 2 * params;
        snprintf(what, len, c->mode == FWD ? "x, y" : c->mode == BWD ? "x, dy, dx" : "x, y + x, dy, dx");
        return c->mode == FWD ? fwd : c->mode == BWD ? bwd : fwd + bwd;
    }
    if (c->fam == FAM_NORM) {
        const bool res = c->opts & 1, gate = c->opts & 2;
        const double n = (double)c->a * c->b * es, stats = (double)c->a * 4 * (c->kind == FX_NORM_LAYER ? 2 : 1);
        const double fwd = n * (2 + (res ? 2 : 0) + (gate ? 1 : 0)) + stats;
        const double bwd = n * (3 + (res ? 1 : 0) + (gate ? 2 : 0)) + stats;
        snprintf(what, len, "%s%s%s", c->mode == BWD ? "" : res ? "x, r, y, s" : "x, y", c->mode == FWD_BWD ? " + " : "",
                 c->mode == FWD ? "" : res ? "s, dy, dx, dr" : "x, dy, dx");
        return c->mode == FWD ? fwd : c->mode == BWD ? bwd : fwd + bwd;
    }
    const double x = (double)c->a * c->b * es, w = (double)c->c * c->b * es, y = (double)c->a * c->c * es;
    snprintf(what, len, c->mode == FWD ? "x, w, y" : "x, w, dy, dx, dw");
    return c->mode == FWD ? x + w + y : 2 * (x + w) + y;
}

static double flops(const bench_case *c)
{
    if (c->fam != FAM_LINEAR)
        return 0;
    const double f = 2.0 * c->a * c->b * c->c;
    return c->mode == FWD ? f : c->mode == BWD ? 2 * f : 3 * f;
}

static double copy_bandwidth(fx_device *dev)
{
    const fx_backend *be = dev->backend;
    int64_t dims[1] = {256 << 20};
    fx_tensor a, b;
    fx_status st;
    fx_status_clear(&st);
    empty_tensor(dev, FX_U8, 1, dims, &a);
    empty_tensor(dev, FX_U8, 1, dims, &b);
    fx_exec own;
    const fx_exec *ex = fx_exec_resolve(dev, NULL, &own, &st);
    if (!ex)
        die("launch context", &st);
    void *e0, *e1;
    be->event_create(dev->ordinal, &e0, &st);
    be->event_create(dev->ordinal, &e1, &st);
    double t[20];
    for (int i = 0; i < 20; i++) {
        be->event_record(dev->ordinal, e0, &st);
        be->copy(ex, b.data, a.data, a.nbytes, &st);
        be->event_record(dev->ordinal, e1, &st);
        be->synchronize(dev->ordinal, &st);
        be->event_elapsed_us(dev->ordinal, e0, e1, &t[i], &st);
    }
    be->event_destroy(dev->ordinal, e0);
    be->event_destroy(dev->ordinal, e1);
    fx_tensor_release(&a);
    fx_tensor_release(&b);
    return 2.0 * a.nbytes / (median(t, 20) * 1e3);
}

static const char *op_name(const bench_case *c)
{
    switch (c->fam) {
    case FAM_CONV: return "causal_conv1d";
    case FAM_CONV_STEP: return "causal_conv1d_step";
    case FAM_NORM: return c->kind == FX_NORM_LAYER ? "layer_norm" : "rms_norm";
    default: return "linear";
    }
}

static void shape_of(const bench_case *c, char *buf, size_t len)
{
    if (c->fam == FAM_CONV || c->fam == FAM_CONV_STEP)
        snprintf(buf, len, "B%lld L%lld D%lld W%lld %s%s", (long long)c->a, (long long)c->b, (long long)c->c,
                 (long long)c->d, fx_activation_name(c->kind), c->opts & 1 ? " +bias" : "");
    else if (c->fam == FAM_NORM)
        snprintf(buf, len, "%lldx%lld%s%s%s", (long long)c->a, (long long)c->b, c->opts & 1 ? " +residual" : "",
                 c->opts & 2 ? " +gate" : "", c->opts & 4 ? " +bias" : "");
    else
        snprintf(buf, len, "%lldx%lld -> %lld %s%s", (long long)c->a, (long long)c->b, (long long)c->c,
                 fx_activation_name(c->kind), c->opts & 1 ? " +bias" : "");
}

int main(int argc, char **argv)
{
    int reps = 50;
    char wanted[NCASES] = {0};
    int any = 0, single = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--case") || !strcmp(argv[i], "--cases")) {
            single = !strcmp(argv[i], "--case");
            for (char *tok = strtok(argv[i + 1], ","); tok; tok = strtok(NULL, ","))
                if (atoi(tok) >= 0 && atoi(tok) < NCASES)
                    wanted[atoi(tok)] = any = 1;
        } else if (!strcmp(argv[i], "--reps")) {
            reps = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : 1;
        } else {
            fprintf(stderr, "mamba_bench: unknown flag %s (see the head of dev/mamba_bench/mamba_bench.c)\n", argv[i]);
            return 2;
        }
    }
    fx_status st;
    fx_status_clear(&st);
    const char *priv = getenv("FUSEX_PRIV");
    if (fx_runtime_init(priv ? priv : "priv", &fx_cpu_backend, &st))
        die("runtime init", &st);
    fx_device *dev = fx_device_find(FX_DEVICE_CUDA, 0);
    if (!dev) {
        fprintf(stderr, "no CUDA device: %s\n", fx_cuda_unavailable_reason());
        return 1;
    }
    const fx_backend *be = dev->backend;
    const double bw = single ? 0 : copy_bandwidth(dev);
    if (bw > 0)
        printf("copy bandwidth %.0f GB/s (read + write)\n\n", bw);
    printf("| # | op | mode | shape | dtype | kernel us | floor (bytes of) | GB/s | %% copy | TFLOP/s | host us | target |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    void *e0, *e1;
    be->event_create(dev->ordinal, &e0, &st);
    be->event_create(dev->ordinal, &e1, &st);
    double *k_us = malloc(sizeof(double) * (size_t)reps), *h_us = malloc(sizeof(double) * (size_t)reps);
    for (int ci = 0; ci < NCASES; ci++) {
        if (any && !wanted[ci])
            continue;
        const bench_case *c = &cases[ci];
        state s;
        setup(dev, c, &s);
        forward_once(&s);
        time_runs(dev, reps, single ? 1 : 3, &s, e0, e1, k_us, h_us);
        const double k = median(k_us, reps), h = median(h_us, reps);
        char what[64], shape[80];
        const double bytes = floor_bytes(c, what, sizeof what), gbs = bytes / (k * 1e3), f = flops(c);
        shape_of(c, shape, sizeof shape);
        char tflops[16] = "-";
        if (f > 0)
            snprintf(tflops, sizeof tflops, "%.1f", f / (k * 1e6));
        printf("| %d | %s | %s | %s | %s | %.2f | %.1f MB (%s) | %.0f | %.1f | %s | %.2f | %s |\n", ci, op_name(c),
               c->mode == FWD ? "fwd" : c->mode == BWD ? "bwd" : "fwd+bwd", shape, fx_dtype_name(c->dtype), k,
               bytes / 1e6, what, gbs, bw > 0 ? 100 * gbs / bw : 0.0, tflops, h, c->target);
        fflush(stdout);
        teardown(&s);
    }
    free(k_us);
    free(h_us);
    be->event_destroy(dev->ordinal, e0);
    be->event_destroy(dev->ordinal, e1);
    fx_runtime_shutdown();
    return 0;
}
