/* The CPU backend's fast path against its f64 oracle (the reference
 * device), through the op layer into outputs allocated once: each case
 * warmed up, then the median (and min) of REPS calls, with the memory floor
 * (each input read once, each output written once) at the copy bandwidth
 * this run measures first (memcpy of 256 MiB, median of 5). A benchmark,
 * never a test: on a machine other processes share, take medians of
 * several runs.
 *
 *   make -f dev/Makefile build/cpu_bench && build/cpu_bench [filter] [reps]
 *
 * bench/jax_cpu_bench.py times JAX's CPU code on the same cases; docs/CPU.md
 * and bench/RESULTS.md have the numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/linrec.h"
#include "core/optim.h"
#include "core/runtime.h"
#include "core/ssm.h"
#include "cpu/fast/fast.h"
#include "fusex_cpu.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const fx_status *st, const char *what)
{
    fprintf(stderr, "cpu_bench: %s: %s\n", what, st->msg);
    exit(1);
}

/* Copy bandwidth, bytes read + written per second. */
static double copy_bandwidth(void)
{
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b)
        exit(1);
    memset(a, 1, n);
    memset(b, 2, n);
    double t[5];
    for (int i = 0; i < 5; i++) {
        double t0 = now_us();
        memcpy(b, a, n);
        t[i] = now_us() - t0;
    }
    free(a);
    free(b);
    return 2.0 * (double)n / (median(t, 5) * 1e-6);
}

static fx_tensor tensor(fx_device *dev, fx_dtype t, int rank, const int64_t *dims, double lo, double hi)
{
    fx_tensor out;
    fx_status st;
    fx_status_clear(&st);
    if (fx_tensor_alloc(dev, t, rank, dims, &out, &st))
        die(&st, "alloc");
    for (int64_t i = 0; i < out.numel; i++)
        fx_store_f64(out.data, t, i, lo + (hi - lo) * ((double)rand() / RAND_MAX));
    return out;
}

static int reps = 21;
static const char *filter = NULL;
static double bandwidth;

typedef int (*run_fn)(void *ctx, fx_device *dev, fx_status *st);

/* Times fn on dev: median and min of reps after warm-ups. */
static void time_on(run_fn fn, void *ctx, fx_device *dev, int n, double *med, double *min)
{
    fx_status st;
    fx_status_clear(&st);
    for (int i = 0; i < 3; i++)
        if (fn(ctx, dev, &st))
            die(&st, "warm-up");
    double *t = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        if (fn(ctx, dev, &st))
            die(&st, "run");
        t[i] = now_us() - t0;
    }
    *med = median(t, n);
    *min = t[0];
    free(t);
}

static void report(const char *name, run_fn fn, void *ctx, double floor_bytes, bool oracle_too)
{
    if (filter && !strstr(name, filter))
        return;
    double fmed, fmin, omed = 0, omin = 0;
    time_on(fn, ctx, fx_cpu_device(), reps, &fmed, &fmin);
    if (oracle_too)
        time_on(fn, ctx, fx_cpu_reference_device(), reps < 7 ? reps : 7, &omed, &omin);
    double floor_us = floor_bytes / bandwidth * 1e6;
    char o[32] = "-", sp[32] = "";
    if (oracle_too) {
        snprintf(o, sizeof o, "%.1f", omed);
        snprintf(sp, sizeof sp, "%.1fx", omed / fmed);
    }
    (void)omin;
    printf("| %-44s | %10.1f | %10.1f | %10s | %7s | %9.1f | %6.2fx |\n", name, fmed, fmin, o, sp, floor_us,
           fmed / floor_us);
    fflush(stdout);
}

/* ---- linrec ---- */

typedef struct lr_ctx {
    int kind;
    int64_t B, L, H;
    bool backward, step;
    fx_tensor seq[2][FX_LINREC_MAX_SEQ], tau[2], lam[2], h[2], state[2], dh[2], g[2][FX_LINREC_MAX_SEQ];
    fx_tensor gtau[2], glam[2];
} lr_ctx;

static int dev_index(fx_device *dev) { return dev == fx_cpu_device() ? 0 : 1; }

static fx_linrec_inputs lr_inputs(lr_ctx *c, int d)
{
    fx_linrec_inputs in = {.kind = c->kind};
    for (int q = 0; q < fx_linrec_nseq(c->kind); q++)
        in.seq[q] = &c->seq[d][q];
    if (c->kind == FX_LINREC_LIQUID) {
        in.tau = &c->tau[d];
        in.lam = &c->lam[d];
        in.dt_value = 0.1;
    }
    return in;
}

static int lr_run(void *ctx, fx_device *dev, fx_status *st)
{
    lr_ctx *c = ctx;
    int d = dev_index(dev);
    fx_linrec_inputs in = lr_inputs(c, d);
    if (c->step)
        return fx_op_linrec_step_into(NULL, &in, &c->state[d], &c->h[d], st);
    if (fx_op_linrec_forward_into(NULL, &in, 0, &c->h[d], &c->state[d], st))
        return st->code;
    if (!c->backward)
        return FX_OK;
    fx_linrec_grad_outs g = {0};
    for (int q = 0; q < fx_linrec_nseq(c->kind); q++)
        g.seq[q] = &c->g[d][q];
    if (c->kind == FX_LINREC_LIQUID)
        g.tau = &c->gtau[d], g.lam = &c->glam[d];
    return fx_op_linrec_backward_into(NULL, &in, &c->h[d], &c->dh[d], NULL, 0, &g, st);
}

static void lr_case(const char *label, int kind, int64_t B, int64_t L, int64_t H, bool backward, bool step)
{
    char name[96];
    snprintf(name, sizeof name, "%s B%lld L%lld H%lld%s", label, (long long)B, (long long)L, (long long)H,
             step ? " step" : backward ? " fwd+bwd" : " fwd");
    if (filter && !strstr(name, filter))
        return;
    lr_ctx *c = calloc(1, sizeof *c);
    c->kind = kind, c->B = B, c->L = step ? 1 : L, c->H = H, c->backward = backward, c->step = step;
    int64_t d3[3] = {B, c->L, H}, d2[2] = {B, H}, d1[1] = {H};
    int nseq = fx_linrec_nseq(kind);
    for (int d = 0; d < 2; d++) {
        fx_device *dev = d ? fx_cpu_reference_device() : fx_cpu_device();
        for (int q = 0; q < nseq; q++) {
            c->seq[d][q] = step ? tensor(dev, FX_F32, 2, d2, -2, 2) : tensor(dev, FX_F32, 3, d3, -2, 2);
            if (backward)
                c->g[d][q] = tensor(dev, FX_F32, 3, d3, 0, 0);
        }
        if (kind == FX_LINREC_SCAN)
            c->seq[d][0] = step ? tensor(dev, FX_F32, 2, d2, 0.5, 1) : tensor(dev, FX_F32, 3, d3, 0.5, 1);
        c->tau[d] = tensor(dev, FX_F32, 1, d1, 0.5, 2);
        c->lam[d] = tensor(dev, FX_F32, 1, d1, -1, 1);
        c->gtau[d] = tensor(dev, FX_F32, 1, d1, 0, 0);
        c->glam[d] = tensor(dev, FX_F32, 1, d1, 0, 0);
        c->h[d] = step ? tensor(dev, FX_F32, 2, d2, 0, 0) : tensor(dev, FX_F32, 3, d3, 0, 0);
        c->state[d] = tensor(dev, FX_F32, 2, d2, 0, 0);
        if (backward)
            c->dh[d] = tensor(dev, FX_F32, 3, d3, -1, 1);
    }
    /* forward: the sequences read, h written; backward: sequences, h, dh
     * read, the sequence gradients written */
    double elems = (double)(B * c->L * H), floor = elems * 4.0 * (nseq + 1);
    if (backward)
        floor += elems * 4.0 * (nseq + 2 + nseq);
    report(name, lr_run, c, floor, true);
}

/* ---- selective scan ---- */

typedef struct ssm_ctx {
    int64_t B, L, D, N;
    bool backward, step;
    fx_tensor x[2], dt[2], a[2], b[2], c[2], d[2], z[2], bias[2], y[2], state[2], dy[2];
    fx_tensor gx[2], gdt[2], ga[2], gb[2], gc[2], gd[2], gz[2], gbias[2];
} ssm_ctx;

static fx_ssm_inputs ssm_inputs(ssm_ctx *c, int d)
{
    return (fx_ssm_inputs){&c->x[d], &c->dt[d], &c->a[d], &c->b[d], &c->c[d], &c->d[d], &c->z[d], &c->bias[d],
                           NULL, true};
}

static int ssm_run(void *ctx, fx_device *dev, fx_status *st)
{
    ssm_ctx *c = ctx;
    int d = dev_index(dev);
    fx_ssm_inputs in = ssm_inputs(c, d);
    if (c->step)
        return fx_op_ssm_step_into(NULL, &c->state[d], &in, &c->y[d], st);
    if (fx_op_ssm_forward_into(NULL, &in, &c->y[d], NULL, NULL, st))
        return st->code;
    if (!c->backward)
        return FX_OK;
    fx_ssm_grad_outs g = {&c->gx[d], &c->gdt[d], &c->ga[d], &c->gb[d], &c->gc[d], &c->gd[d], &c->gz[d],
                          &c->gbias[d], NULL};
    return fx_op_ssm_backward_into(NULL, &in, NULL, &c->dy[d], NULL, &g, st);
}

static void ssm_case(int64_t B, int64_t L, int64_t D, int64_t N, bool backward, bool step)
{
    char name[96];
    snprintf(name, sizeof name, "selective_scan B%lld L%lld D%lld N%lld%s", (long long)B, (long long)L,
             (long long)D, (long long)N, step ? " step" : backward ? " fwd+bwd" : " fwd");
    if (filter && !strstr(name, filter))
        return;
    ssm_ctx *c = calloc(1, sizeof *c);
    c->B = B, c->L = step ? 1 : L, c->D = D, c->N = N, c->backward = backward, c->step = step;
    int64_t btd[3] = {B, c->L, D}, bd[2] = {B, D}, dn[2] = {D, N}, d1[1] = {D}, bln[3] = {B, c->L, N},
            bn[2] = {B, N}, st3[3] = {B, D, N};
    for (int d = 0; d < 2; d++) {
        fx_device *dev = d ? fx_cpu_reference_device() : fx_cpu_device();
        int r = step ? 2 : 3;
        const int64_t *xs = step ? bd : btd, *bs = step ? bn : bln;
        c->x[d] = tensor(dev, FX_F32, r, xs, -1, 1);
        c->dt[d] = tensor(dev, FX_F32, r, xs, -3, 0);
        c->z[d] = tensor(dev, FX_F32, r, xs, -2, 2);
        c->a[d] = tensor(dev, FX_F32, 2, dn, -4, -0.5);
        c->b[d] = tensor(dev, FX_F32, r, bs, -1, 1);
        c->c[d] = tensor(dev, FX_F32, r, bs, -1, 1);
        c->d[d] = tensor(dev, FX_F32, 1, d1, -1, 1);
        c->bias[d] = tensor(dev, FX_F32, 1, d1, -0.5, 0.5);
        c->y[d] = tensor(dev, FX_F32, r, xs, 0, 0);
        c->state[d] = tensor(dev, FX_F32, 3, st3, 0, 0);
        if (backward) {
            c->dy[d] = tensor(dev, FX_F32, 3, btd, -1, 1);
            c->gx[d] = tensor(dev, FX_F32, 3, btd, 0, 0);
            c->gdt[d] = tensor(dev, FX_F32, 3, btd, 0, 0);
            c->gz[d] = tensor(dev, FX_F32, 3, btd, 0, 0);
            c->ga[d] = tensor(dev, FX_F32, 2, dn, 0, 0);
            c->gb[d] = tensor(dev, FX_F32, 3, bln, 0, 0);
            c->gc[d] = tensor(dev, FX_F32, 3, bln, 0, 0);
            c->gd[d] = tensor(dev, FX_F32, 1, d1, 0, 0);
            c->gbias[d] = tensor(dev, FX_F32, 1, d1, 0, 0);
        }
    }
    double btdb = (double)(B * c->L * D) * 4, bcb = (double)(B * c->L * N) * 4;
    double floor = step ? btdb * 4 + bcb * 2 + (double)(B * D * N) * 8 : btdb * 4 + bcb * 2;
    if (backward)
        floor += btdb * 4 + bcb * 2 + btdb * 3 + bcb * 2;
    report(name, ssm_run, c, floor, true);
}

/* ---- AdamW ---- */

typedef struct optim_ctx {
    fx_tensor p[2], g[2];
    fx_optim_state *s[2];
    fx_optim_hyper h;
} optim_ctx;

static int optim_run(void *ctx, fx_device *dev, fx_status *st)
{
    optim_ctx *c = ctx;
    int d = dev_index(dev);
    return fx_op_optim_step(c->s[d], FX_OPTIM_ADAMW, &c->p[d], 1, &c->g[d], 1, &c->h, st);
}

static void adamw_case(int64_t n)
{
    char name[96];
    snprintf(name, sizeof name, "AdamW %lld f32 params", (long long)n);
    if (filter && !strstr(name, filter))
        return;
    optim_ctx *c = calloc(1, sizeof *c);
    fx_status st;
    fx_status_clear(&st);
    c->h = fx_optim_default_hyper(FX_OPTIM_ADAMW);
    fx_optim_config cfg = {c->h, false};
    for (int d = 0; d < 2; d++) {
        fx_device *dev = d ? fx_cpu_reference_device() : fx_cpu_device();
        c->p[d] = tensor(dev, FX_F32, 1, &n, -1, 1);
        c->g[d] = tensor(dev, FX_F32, 1, &n, -1, 1);
        if (fx_op_optim_init(FX_OPTIM_ADAMW, &c->p[d], 1, &cfg, &c->s[d], &st))
            die(&st, "optim init");
    }
    /* p, m, v read and written; g read */
    report(name, optim_run, c, (double)n * 4 * 7, true);
}

int main(int argc, char **argv)
{
    filter = argc > 1 && strcmp(argv[1], "all") != 0 ? argv[1] : NULL;
    if (argc > 2)
        reps = atoi(argv[2]) > 0 ? atoi(argv[2]) : reps;
    fx_status st;
    fx_status_clear(&st);
    if (fx_runtime_init("priv", &fx_cpu_backend, &st))
        die(&st, "runtime");
    bandwidth = copy_bandwidth();
    time_t t = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("cpu_bench %s: %d pool threads, copy bandwidth %.2f GB/s (read + write), median of %d (oracle: of %d)\n\n",
           when, fx_pool_threads(), bandwidth / 1e9, reps, reps < 7 ? reps : 7);
    printf("| %-44s | %10s | %10s | %10s | %7s | %9s | %7s |\n", "case (f32)", "fast µs", "fast min", "oracle µs",
           "speedup", "floor µs", "x floor");
    printf("|%.46s|%.12s|%.12s|%.12s|%.9s|%.11s|%.9s|\n", "----------------------------------------------",
           "-----------:", "-----------:", "-----------:", "--------:", "----------:", "--------:");
    lr_case("mingru", FX_LINREC_MINGRU, 4, 1024, 512, false, false);
    lr_case("mingru", FX_LINREC_MINGRU, 1, 32, 512, false, false);
    lr_case("mingru", FX_LINREC_MINGRU, 16, 256, 256, false, false);
    lr_case("mingru", FX_LINREC_MINGRU, 4, 1024, 512, true, false);
    lr_case("linear_scan", FX_LINREC_SCAN, 4, 1024, 512, false, false);
    lr_case("minlstm", FX_LINREC_MINLSTM, 4, 1024, 512, false, false);
    lr_case("liquid", FX_LINREC_LIQUID, 4, 1024, 512, false, false);
    lr_case("mingru", FX_LINREC_MINGRU, 16, 1, 512, false, true);
    lr_case("mingru", FX_LINREC_MINGRU, 1, 1, 64, false, true);
    ssm_case(2, 256, 256, 16, false, false);
    ssm_case(2, 256, 256, 16, true, false);
    ssm_case(1, 32, 512, 16, false, false);
    ssm_case(16, 1, 512, 16, false, true);
    adamw_case(4 << 20);
    fx_runtime_shutdown();
    return 0;
}
