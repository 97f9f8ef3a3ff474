/* A bench driver for the linear recurrences on a GPU, below Erlang: calls
 * the op layer (fx_op_linrec_*_into) on device tensors and times each op
 * with device events after a busy-wait (as fusex_bench does), plus the
 * host-side call + synchronize. For kernel work: profile one case with
 *
 *   FUSEX_PRIV=priv ncu --set full -k regex:forward -c 1 build/linrec_bench --case 0 --reps 1
 *
 *   build/linrec_bench [--case N | --cases N,M,...] [--reps N] [--tiles N] [--add 1]
 *                      [--cand-g 1] [--dt-tensor 1] [--pad-kb N] [--fresh-h 1] [--addrs 1]
 *
 * --cand-g 1 runs MinGRU and MinLSTM with candidate_activation g, and
 * --dt-tensor 1 gives Liquid a [batch, seqlen, 1] dt tensor instead of the
 * scalar 0.5 (each a kernel variant of its own).
 * --pad-kb N allocates N KB between the inputs and h (where h lands relative
 * to the inputs), and --fresh-h 1 has every forward allocate its h from the
 * pool and free it, as a call through the NIF does; --addrs 1 prints where
 * the inputs and h lie.
 * --tiles passes N as max_tile_steps (include/fusex_linrec.h): -1 forces
 * the streaming kernels (forward and backward), -2 keeps the tiled ones.
 *
 * Prints one row per case: median kernel µs, GB/s over the floor bytes,
 * % of the device-to-device copy bandwidth measured first, host µs (the
 * call plus a synchronize). The first row is the floor of the method: a
 * one-element scale, timed the same way. With --add 1, every forward case
 * of two input sequences (scan, MinGRU) is followed by a row for the
 * library's elementwise add of the same two tensors into the same output:
 * the same bytes moved by the simplest kernel there is. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusex_cpu.h"
#include "fusex_dtype.h"
#include "core/linrec.h"
#include "core/ops.h"
#include "core/runtime.h"

typedef enum { FWD, BWD, FWD_BWD } mode_t_;

typedef struct bench_case {
    int kind;
    int64_t B, L, H;
    fx_dtype dtype;
    mode_t_ mode;
} bench_case;

static const bench_case cases[] = {
    {FX_LINREC_MINGRU, 16, 1024, 1024, FX_F32, FWD},
    {FX_LINREC_MINGRU, 16, 1024, 1024, FX_F32, BWD},
    {FX_LINREC_MINGRU, 16, 1024, 1024, FX_F32, FWD_BWD},
    {FX_LINREC_SCAN, 16, 1024, 1024, FX_F32, FWD},
    {FX_LINREC_SCAN, 8, 2048, 1536, FX_F32, FWD},
    {FX_LINREC_MINGRU, 1, 65536, 256, FX_F32, FWD},
    {FX_LINREC_MINGRU, 1, 32, 512, FX_F32, FWD},
    {FX_LINREC_MINLSTM, 1, 32, 512, FX_F32, FWD},
    {FX_LINREC_MINLSTM, 16, 1024, 1024, FX_F32, FWD},
    {FX_LINREC_LIQUID, 16, 1024, 1024, FX_F32, FWD},
    {FX_LINREC_MINGRU, 16, 1024, 1024, FX_BF16, FWD},
    {FX_LINREC_LIQUID, 16, 1024, 1024, FX_F32, FWD_BWD},
    {FX_LINREC_MINLSTM, 16, 1024, 1024, FX_F32, BWD},
    {FX_LINREC_LIQUID, 16, 1024, 1024, FX_F32, BWD},
    {FX_LINREC_MINGRU, 1, 65536, 256, FX_F32, BWD},
    {FX_LINREC_MINGRU, 4, 4096, 512, FX_F32, FWD},
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

static void random_tensor(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, double lo,
                          double hi, fx_tensor *out)
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

typedef struct run_state {
    fx_linrec_inputs p;
    fx_linrec_tensors in;
    fx_tensor h, dh, pad;
    fx_linrec_grads g;
} run_state;

static int cand_g;    /* --cand-g */
static int dt_tensor; /* --dt-tensor */
static int pad_kb;    /* --pad-kb: device memory allocated between the inputs and h */
static int fresh_h;   /* --fresh-h: h allocated and freed by every forward, as through the NIF */

static void setup(fx_device *dev, const bench_case *c, run_state *r)
{
    memset(r, 0, sizeof *r);
    int64_t dims[3] = {c->B, c->L, c->H}, hdim[1] = {c->H}, dt_dims[3] = {c->B, c->L, 1};
    r->p.kind = c->kind;
    r->p.dt_value = 0.5;
    r->p.candidate_g = cand_g && (c->kind == FX_LINREC_MINGRU || c->kind == FX_LINREC_MINLSTM);
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++) {
        int scan_a = c->kind == FX_LINREC_SCAN && k == 0;
        random_tensor(dev, c->dtype, 3, dims, scan_a ? 0.5 : -2.0, scan_a ? 1.0 : 2.0, &r->in.seq[k]);
        r->p.seq[k] = &r->in.seq[k];
    }
    if (c->kind == FX_LINREC_LIQUID) {
        random_tensor(dev, c->dtype, 1, hdim, 0.5, 2.0, &r->in.tau);
        random_tensor(dev, c->dtype, 1, hdim, -1.0, 1.0, &r->in.lam);
        r->p.tau = &r->in.tau;
        r->p.lam = &r->in.lam;
        if (dt_tensor) {
            random_tensor(dev, c->dtype, 3, dt_dims, 0.25, 1.0, &r->in.dt);
            r->p.dt = &r->in.dt;
        }
    }
    random_tensor(dev, c->dtype, 3, dims, -1.0, 1.0, &r->dh);
    fx_status st;
    fx_status_clear(&st);
    int64_t pad_dims[1] = {(int64_t)pad_kb << 10};
    if (pad_kb > 0 && fx_tensor_alloc(dev, FX_U8, 1, pad_dims, &r->pad, &st))
        die("alloc pad", &st);
    if (fx_tensor_alloc(dev, c->dtype, 3, dims, &r->h, &st))
        die("alloc h", &st);
    /* the backward needs H */
    if (fx_op_linrec_forward_into(NULL, &r->p, 0, &r->h, NULL, &st) || fx_linrec_grads_alloc(&r->p, &r->g, &st))
        die("first forward", &st);
}

static void teardown(run_state *r)
{
    fx_linrec_tensors_release(&r->in);
    fx_tensor_release(&r->h);
    fx_tensor_release(&r->dh);
    fx_tensor_release(&r->pad);
    fx_linrec_tensors_release(&r->g);
}

static int tiles;    /* --tiles: max_tile_steps of every call */
static int with_add; /* --add: an add row after each two-input forward */

static void run_once(const bench_case *c, run_state *r)
{
    fx_status st;
    fx_status_clear(&st);
    if (c->mode == FWD && fresh_h) {
        fx_tensor h, state;
        if (fx_op_linrec_forward(&r->p, false, tiles, &h, &state, &st))
            die("forward", &st);
        fx_tensor_release(&h);
        return;
    }
    if (c->mode != BWD && fx_op_linrec_forward_into(NULL, &r->p, tiles, &r->h, NULL, &st))
        die("forward", &st);
    fx_linrec_grad_outs outs = fx_linrec_grad_outs_of(&r->g);
    if (c->mode != FWD && fx_op_linrec_backward_into(NULL, &r->p, &r->h, &r->dh, NULL, tiles, &outs, &st))
        die("backward", &st);
}

typedef struct case_ctx {
    const bench_case *c;
    run_state *r;
} case_ctx;

static void case_call(void *ctx)
{
    case_ctx *x = ctx;
    run_once(x->c, x->r);
}

/* The library's add of a forward case's two input sequences into its output
 * (h: their shape and type). The backend's op, as trivial_call's scale:
 * fx_op_binary allocates a fresh output every call. */
static void add_call(void *ctx)
{
    case_ctx *x = ctx;
    fx_device *dev = x->r->h.device;
    fx_status st;
    fx_status_clear(&st);
    fx_exec own;
    const fx_exec *ex = fx_exec_resolve(dev, NULL, &own, &st);
    if (!ex || dev->backend->binary(ex, FX_ADD, &x->r->in.seq[0], &x->r->in.seq[1], &x->r->h, &st))
        die("add", &st);
}

/* Times `reps` calls of `call` by device events (after a busy-wait, so that
 * the launch is not what is timed) and by the host (call + synchronize),
 * after `warm` untimed calls. */
static void time_calls(fx_device *dev, int reps, int warm, void (*call)(void *), void *ctx, void *e0, void *e1,
                       double *k_us, double *h_us)
{
    const fx_backend *be = dev->backend;
    fx_status st;
    fx_status_clear(&st);
    for (int i = 0; i < warm; i++)
        call(ctx);
    be->synchronize(dev->ordinal, &st);
    for (int i = 0; i < reps; i++) {
        be->busy_wait(dev->ordinal, 100, &st);
        be->event_record(dev->ordinal, e0, &st);
        call(ctx);
        be->event_record(dev->ordinal, e1, &st);
        be->synchronize(dev->ordinal, &st);
        be->event_elapsed_us(dev->ordinal, e0, e1, &k_us[i], &st);
        double t0 = now_us();
        call(ctx);
        be->synchronize(dev->ordinal, &st);
        h_us[i] = now_us() - t0;
    }
    if (st.code)
        die("timing", &st);
}

/* Floor bytes: inputs read once, outputs written once. */
static double floor_bytes(const bench_case *c)
{
    double n = (double)c->B * c->L * c->H * fx_dtype_size(c->dtype);
    int nseq = fx_linrec_nseq(c->kind);
    double fwd = (nseq + 1) * n, bwd = (nseq + 2) * n + nseq * n;
    return c->mode == FWD ? fwd : c->mode == BWD ? bwd : fwd + bwd;
}

static double copy_bandwidth(fx_device *dev)
{
    const fx_backend *be = dev->backend;
    int64_t dims[1] = {256 << 20};
    fx_tensor a, b;
    fx_status st;
    fx_status_clear(&st);
    if (fx_tensor_alloc(dev, FX_U8, 1, dims, &a, &st) || fx_tensor_alloc(dev, FX_U8, 1, dims, &b, &st))
        die("alloc", &st);
    /* the device's own stream, the one its events record on */
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

/* One launch that does nothing worth timing: what every row includes. */
typedef struct trivial_ctx {
    fx_device *dev;
    fx_tensor a, b;
} trivial_ctx;

static void trivial_call(void *ctx)
{
    trivial_ctx *x = ctx;
    fx_status st;
    fx_status_clear(&st);
    fx_exec ex;
    if (!fx_exec_resolve(x->dev, NULL, &ex, &st) || x->dev->backend->scale(&ex, &x->a, 2.0, &x->b, &st))
        die("scale", &st);
}

static void trivial_row(fx_device *dev, int reps, void *e0, void *e1, double *k_us, double *h_us)
{
    int64_t one[1] = {1};
    trivial_ctx x = {.dev = dev};
    fx_status st;
    fx_status_clear(&st);
    random_tensor(dev, FX_F32, 1, one, 0, 1, &x.a);
    if (fx_tensor_alloc(dev, FX_F32, 1, one, &x.b, &st))
        die("alloc", &st);
    time_calls(dev, reps, 0, trivial_call, &x, e0, e1, k_us, h_us);
    printf("%-3s %-8s %-8s %-18s %-5s %10.2f %8s %7s %10.2f\n", "-", "scale", "trivial", "1 element", "{f,32}",
           median(k_us, reps), "-", "-", median(h_us, reps));
    fx_tensor_release(&x.a);
    fx_tensor_release(&x.b);
}

int main(int argc, char **argv)
{
    int reps = 50;
    char wanted[NCASES] = {0};
    int any = 0, single = 0;
    int print_addrs = 0;
    /* the flags that take one integer */
    const struct {
        const char *name;
        int *value;
    } int_flags[] = {{"--reps", &reps},     {"--tiles", &tiles},   {"--add", &with_add},
                     {"--cand-g", &cand_g}, {"--dt-tensor", &dt_tensor}, {"--pad-kb", &pad_kb},
                     {"--fresh-h", &fresh_h}, {"--addrs", &print_addrs}};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--case") || !strcmp(argv[i], "--cases")) {
            single = !strcmp(argv[i], "--case");
            for (char *tok = strtok(argv[i + 1], ","); tok; tok = strtok(NULL, ","))
                if (atoi(tok) >= 0 && atoi(tok) < NCASES)
                    wanted[atoi(tok)] = any = 1;
            continue;
        }
        size_t f = 0;
        while (f < sizeof int_flags / sizeof int_flags[0] && strcmp(argv[i], int_flags[f].name))
            f++;
        if (f == sizeof int_flags / sizeof int_flags[0]) {
            fprintf(stderr, "linrec_bench: unknown flag %s (see the head of dev/linrec_bench/linrec_bench.c)\n", argv[i]);
            return 2;
        }
        *int_flags[f].value = atoi(argv[i + 1]);
    }
    const int only = single ? 1 : -1; /* one case, for a profiler: no copy test, one warm-up */
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
    double bw = only < 0 ? copy_bandwidth(dev) : 0;
    if (bw > 0)
        printf("copy bandwidth %.0f GB/s (read + write)\n", bw);
    printf("%-3s %-8s %-8s %-18s %-5s %10s %8s %7s %10s\n", "#", "op", "mode", "shape", "dtype",
           "kernel us", "GB/s", "% copy", "host us");
    void *e0, *e1;
    be->event_create(dev->ordinal, &e0, &st);
    be->event_create(dev->ordinal, &e1, &st);
    double *k_us = malloc(sizeof(double) * (size_t)reps), *h_us = malloc(sizeof(double) * (size_t)reps);
    if (!single)
        trivial_row(dev, reps, e0, e1, k_us, h_us);
    for (int ci = 0; ci < NCASES; ci++) {
        if (any && !wanted[ci])
            continue;
        const bench_case *c = &cases[ci];
        run_state r;
        setup(dev, c, &r);
        if (print_addrs)
            printf("#   inputs at %p %p, h at %p\n", r.in.seq[0].data, r.in.seq[1].data, r.h.data);
        time_calls(dev, reps, only >= 0 ? 1 : 3, case_call, &(case_ctx){c, &r}, e0, e1, k_us, h_us);
        double k = median(k_us, reps), h = median(h_us, reps), gbs = floor_bytes(c) / (k * 1e3);
        char shape[32];
        snprintf(shape, sizeof shape, "B%lld L%lld H%lld", (long long)c->B, (long long)c->L, (long long)c->H);
        printf("%-3d %-8s %-8s %-18s %-5s %10.2f %8.0f %7.1f %10.2f\n", ci, fx_linrec_op_name(c->kind),
               c->mode == FWD ? "fwd" : c->mode == BWD ? "bwd" : "fwd+bwd", shape,
               fx_dtype_name(c->dtype), k, gbs, bw > 0 ? 100 * gbs / bw : 0.0, h);
        if (with_add && c->mode == FWD && fx_linrec_nseq(c->kind) == 2) {
            time_calls(dev, reps, 3, add_call, &(case_ctx){c, &r}, e0, e1, k_us, h_us);
            k = median(k_us, reps), h = median(h_us, reps), gbs = floor_bytes(c) / (k * 1e3);
            printf("%-3s %-8s %-8s %-18s %-5s %10.2f %8.0f %7.1f %10.2f\n", "+", "add", "same", shape,
                   fx_dtype_name(c->dtype), k, gbs, bw > 0 ? 100 * gbs / bw : 0.0, h);
        }
        fflush(stdout);
        teardown(&r);
    }
    be->event_destroy(dev->ordinal, e0);
    be->event_destroy(dev->ordinal, e1);
    free(k_us);
    free(h_us);
    fx_runtime_shutdown();
    return 0;
}
