/* A bench driver for the GRU and LSTM layers on a GPU, below Erlang: calls
 * the op layer (fx_op_rnn_*_into) on device tensors and times each op with
 * device events after a busy-wait (as fusex_bench does), plus the host-side
 * call + synchronize. The cases are the issue's targets; bench/peers_rnn.py
 * times cuDNN through PyTorch at the same shapes.
 *
 *   build/rnn_bench [--case N | --cases N,M,...] [--reps N] [--path P] [--markdown 1]
 *
 * --path sets fx_rnn_inputs.path for every call (include/fusex_rnn.h: 1
 * stepwise, 2 persistent on the CUDA cores, 3 tensor cores, +16 one layer
 * a launch; 0, the default, the backend's own choice), so that the paths
 * can be timed side by side. A case the forced path cannot take prints
 * the refusal and goes on. For kernel work, profile one case:
 *
 *   FUSEX_PRIV=priv ncu --set full -k regex:wave -c 1 build/rnn_bench --case 0 --reps 1
 *
 * Prints one row per case: median kernel µs, the target, host µs (the
 * call plus a synchronize); --markdown 1 prints the rows as a markdown
 * table. The first row is the floor of the method: a one-element scale,
 * timed the same way. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/ops.h"
#include "core/rnn.h"
#include "core/runtime.h"
#include "fusex_cpu.h"
#include "fusex_dtype.h"

typedef enum { FWD, FWD_BWD, STEP } mode_t_;

typedef struct bench_case {
    int cell;
    int64_t layers, B, L, I, H;
    fx_dtype dtype;
    mode_t_ mode;
    double target_us; /* 0: none (measure) */
} bench_case;

static const bench_case cases[] = {
    {FX_RNN_GRU, 2, 1, 60, 512, 512, FX_F32, FWD, 150},
    {FX_RNN_GRU, 2, 64, 60, 512, 512, FX_F32, FWD_BWD, 1500},
    {FX_RNN_GRU, 2, 256, 60, 512, 512, FX_F32, FWD, 1000},
    {FX_RNN_LSTM, 2, 1, 60, 512, 512, FX_F32, FWD, 150},
    {FX_RNN_LSTM, 2, 64, 60, 512, 512, FX_F32, FWD_BWD, 1800},
    {FX_RNN_LSTM, 2, 256, 60, 512, 512, FX_F32, FWD, 1000},
    {FX_RNN_GRU, 2, 1, 1, 512, 512, FX_F32, STEP, 8},
    {FX_RNN_LSTM, 2, 1, 1, 512, 512, FX_F32, STEP, 8},
    {FX_RNN_GRU, 1, 16, 1024, 1024, 1024, FX_F32, FWD, 0},
    {FX_RNN_GRU, 2, 1, 60, 512, 512, FX_BF16, FWD, 150},
    {FX_RNN_GRU, 2, 64, 60, 512, 512, FX_BF16, FWD_BWD, 1500},
    {FX_RNN_GRU, 2, 256, 60, 512, 512, FX_BF16, FWD, 1000},
    {FX_RNN_LSTM, 2, 1, 60, 512, 512, FX_BF16, FWD, 150},
    {FX_RNN_LSTM, 2, 64, 60, 512, 512, FX_BF16, FWD_BWD, 1800},
    {FX_RNN_LSTM, 2, 256, 60, 512, 512, FX_BF16, FWD, 1000},
    {FX_RNN_GRU, 2, 1, 1, 512, 512, FX_BF16, STEP, 8},
    {FX_RNN_LSTM, 2, 1, 1, 512, 512, FX_BF16, STEP, 8},
    {FX_RNN_GRU, 1, 16, 1024, 1024, 1024, FX_BF16, FWD, 0},
    {FX_RNN_GRU, 1, 4, 32, 2048, 2048, FX_F32, FWD, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))
#define MAXL 2

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

static void random_tensor(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, double scale,
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
        fx_store_f64(host, dtype, i, uniform(-scale, scale));
    if (fx_op_from_host(dev, dtype, rank, dims, host, nbytes, out, &st))
        die("upload", &st);
    free(host);
}

static void alloc(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, fx_tensor *out)
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

typedef struct run_state {
    fx_tensor x, h0, dh0, y, h_n, c_n, saved, dy, dx, w[MAXL][4], dw[MAXL][4], xt, yt, hs, cs;
    fx_rnn_layer layer[MAXL];
    fx_rnn_layer_grads grad[MAXL];
    fx_rnn_inputs in, step_in;
} run_state;

static int path; /* --path */

static void setup(fx_device *dev, const bench_case *c, run_state *r)
{
    memset(r, 0, sizeof *r);
    const int64_t G = fx_rnn_gates(c->cell), H = c->H;
    const int64_t xd[3] = {c->B, c->L, c->I}, yd[3] = {c->B, c->L, H}, sd[3] = {c->layers, c->B, H};
    const double ws = 1.0 / sqrt((double)H);
    random_tensor(dev, c->dtype, 3, xd, 1.0, &r->x);
    for (int64_t l = 0; l < c->layers; l++) {
        const int64_t ih[2] = {G * H, l == 0 ? c->I : H}, hh[2] = {G * H, H}, b[1] = {G * H};
        random_tensor(dev, c->dtype, 2, ih, ws, &r->w[l][0]);
        random_tensor(dev, c->dtype, 2, hh, ws, &r->w[l][1]);
        random_tensor(dev, c->dtype, 1, b, ws, &r->w[l][2]);
        random_tensor(dev, c->dtype, 1, b, ws, &r->w[l][3]);
        r->layer[l] = (fx_rnn_layer){&r->w[l][0], &r->w[l][1], &r->w[l][2], &r->w[l][3]};
        for (int p = 0; p < 4; p++)
            alloc(dev, c->dtype, r->w[l][p].rank, r->w[l][p].dims, &r->dw[l][p]);
        r->grad[l] = (fx_rnn_layer_grads){&r->dw[l][0], &r->dw[l][1], &r->dw[l][2], &r->dw[l][3]};
    }
    random_tensor(dev, FX_F32, 3, sd, 0.5, &r->h0);
    alloc(dev, c->dtype, 3, yd, &r->y);
    alloc(dev, FX_F32, 3, sd, &r->h_n);
    alloc(dev, FX_F32, 3, sd, &r->c_n);
    const fx_rnn_dims n = {c->cell, c->layers, c->B, c->L, c->I, H};
    int64_t saved[4];
    fx_rnn_saved_shape(&n, saved);
    if (c->mode == FWD_BWD) {
        alloc(dev, FX_F32, 4, saved, &r->saved);
        random_tensor(dev, c->dtype, 3, yd, 1.0, &r->dy);
        alloc(dev, c->dtype, 3, xd, &r->dx);
        alloc(dev, FX_F32, 3, sd, &r->dh0);
    }
    r->in = (fx_rnn_inputs){.cell = c->cell, .layers = c->layers, .layer = r->layer, .x = &r->x, .h0 = &r->h0,
                            .path = path};
    if (c->mode == STEP) {
        const int64_t xt[2] = {c->B, c->I}, yt[2] = {c->B, H};
        random_tensor(dev, c->dtype, 2, xt, 1.0, &r->xt);
        alloc(dev, c->dtype, 2, yt, &r->yt);
        random_tensor(dev, FX_F32, 3, sd, 0.5, &r->hs);
        random_tensor(dev, FX_F32, 3, sd, 0.5, &r->cs);
        r->step_in = r->in;
        r->step_in.x = &r->xt;
        r->step_in.h0 = NULL;
    }
}

static void teardown(run_state *r)
{
    fx_tensor *all[] = {&r->x, &r->h0, &r->dh0, &r->y, &r->h_n, &r->c_n, &r->saved, &r->dy, &r->dx,
                        &r->xt, &r->yt, &r->hs, &r->cs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    for (int l = 0; l < MAXL; l++)
        for (int p = 0; p < 4; p++) {
            fx_tensor_release(&r->w[l][p]);
            fx_tensor_release(&r->dw[l][p]);
        }
}

static int run_once(const bench_case *c, run_state *r, fx_status *st)
{
    const bool lstm = c->cell == FX_RNN_LSTM;
    if (c->mode == STEP)
        return fx_op_rnn_step_into(NULL, &r->step_in, &r->hs, lstm ? &r->cs : NULL, &r->yt, st);
    if (fx_op_rnn_forward_into(NULL, &r->in, &r->y, &r->h_n, lstm ? &r->c_n : NULL,
                               c->mode == FWD_BWD ? &r->saved : NULL, st))
        return st->code;
    if (c->mode == FWD)
        return FX_OK;
    fx_rnn_grad_outs g = {.dx = &r->dx, .dh0 = &r->dh0, .dc0 = NULL, .layer = r->grad};
    return fx_op_rnn_backward_into(NULL, &r->in, &r->saved, &r->dy, NULL, NULL, &g, st);
}

/* Times `reps` calls by device events (after a busy-wait, so that the
 * launches are not what is timed) and by the host (call + synchronize),
 * after `warm` untimed calls. Fails (returns the status) where the call
 * does. */
static int time_calls(fx_device *dev, const bench_case *c, run_state *r, int reps, int warm, void *e0, void *e1,
                      double *k_us, double *h_us, fx_status *st)
{
    const fx_backend *be = dev->backend;
    for (int i = 0; i < warm; i++)
        if (run_once(c, r, st))
            return st->code;
    be->synchronize(dev->ordinal, st);
    for (int i = 0; i < reps && st->code == FX_OK; i++) {
        be->busy_wait(dev->ordinal, 200, st);
        be->event_record(dev->ordinal, e0, st);
        run_once(c, r, st);
        be->event_record(dev->ordinal, e1, st);
        be->synchronize(dev->ordinal, st);
        be->event_elapsed_us(dev->ordinal, e0, e1, &k_us[i], st);
        double t0 = now_us();
        run_once(c, r, st);
        be->synchronize(dev->ordinal, st);
        h_us[i] = now_us() - t0;
    }
    return st->code;
}

static void describe(const bench_case *c, char *op, size_t oplen, char *shape, size_t shlen)
{
    snprintf(op, oplen, "%s %s", fx_rnn_cell_name(c->cell),
             c->mode == FWD ? "fwd" : c->mode == FWD_BWD ? "fwd+bwd" : "step");
    snprintf(shape, shlen, "B%lld L%lld I%lld H%lld x%lld", (long long)c->B, (long long)c->L, (long long)c->I,
             (long long)c->H, (long long)c->layers);
}

int main(int argc, char **argv)
{
    int reps = 30, markdown = 0;
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
        } else if (!strcmp(argv[i], "--path")) {
            path = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--markdown")) {
            markdown = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "rnn_bench: unknown flag %s (see the head of dev/rnn_bench/rnn_bench.c)\n", argv[i]);
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
    if (markdown)
        printf("| # | op | shape | dtype | path | fusex kernel us | target us | host us |\n|---|---|---|---|---|---:|---:|---:|\n");
    else
        printf("%-3s %-13s %-26s %-7s %-5s %12s %10s %10s\n", "#", "op", "shape", "dtype", "path", "kernel us",
               "target", "host us");
    void *e0, *e1;
    be->event_create(dev->ordinal, &e0, &st);
    be->event_create(dev->ordinal, &e1, &st);
    double *k_us = malloc(sizeof(double) * (size_t)reps), *h_us = malloc(sizeof(double) * (size_t)reps);
    for (int ci = 0; ci < NCASES; ci++) {
        if (any && !wanted[ci])
            continue;
        const bench_case *c = &cases[ci];
        run_state r;
        setup(dev, c, &r);
        char op[32], shape[64];
        describe(c, op, sizeof op, shape, sizeof shape);
        fx_status_clear(&st);
        if (time_calls(dev, c, &r, reps, single ? 1 : 3, e0, e1, k_us, h_us, &st)) {
            printf(markdown ? "| %d | %s | %s | %s | %d | refused: %s | | |\n" : "%-3d %-13s %-26s %-7s %-5d refused: %s\n",
                   ci, op, shape, fx_dtype_name(c->dtype), path, st.msg);
        } else {
            const double k = median(k_us, reps), h = median(h_us, reps);
            char target[16] = "-";
            if (c->target_us > 0)
                snprintf(target, sizeof target, "%.0f", c->target_us);
            printf(markdown ? "| %d | %s | %s | %s | %d | %.1f | %s | %.1f |\n"
                            : "%-3d %-13s %-26s %-7s %-5d %12.1f %10s %10.1f\n",
                   ci, op, shape, fx_dtype_name(c->dtype), path, k, target, h);
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
