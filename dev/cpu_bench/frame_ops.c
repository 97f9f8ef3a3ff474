/* The ops of one resident-model frame on the CPU, each timed alone at the
 * shapes bench/model_frame.c's cases give them: a Mamba block (d_model 256,
 * expand 2, d_state 16, d_conv 4, dt_rank 16) at batch 1, and a GRU layer
 * (hidden 512, input 512) at batch 1. Median and p99 of REPS calls after
 * warm-up, on the fast device (`cpu`) and with `ref` as the argument on the
 * oracle: which ops a frame's time goes to. A benchmark, never a test.
 *
 *   make -f dev/Makefile build/frame_ops && build/frame_ops [ref] [reps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/conv.h"
#include "core/linear.h"
#include "core/ops.h"
#include "core/rnn.h"
#include "core/runtime.h"
#include "core/ssm.h"
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

static void die(const fx_status *st, const char *what)
{
    fprintf(stderr, "frame_ops: %s: %s\n", what, st->msg);
    exit(1);
}

static fx_device *dev;
static int reps = 2000;

static fx_tensor tensor2(int64_t a, int64_t b, double lo, double hi)
{
    fx_tensor t;
    fx_status st;
    fx_status_clear(&st);
    const int64_t dims[2] = {a, b};
    if (fx_tensor_alloc(dev, FX_F32, 2, dims, &t, &st))
        die(&st, "alloc");
    for (int64_t i = 0; i < t.numel; i++)
        ((float *)t.data)[i] = (float)(lo + (hi - lo) * ((double)rand() / RAND_MAX));
    return t;
}

static fx_tensor tensor1(int64_t a, double lo, double hi)
{
    fx_tensor t = tensor2(1, a, lo, hi);
    t.rank = 1;
    t.dims[0] = a;
    return t;
}

typedef int (*op_fn)(void *ctx, fx_status *st);

static double total_p50;

static void time_op(const char *name, int count, op_fn fn, void *ctx)
{
    fx_status st;
    fx_status_clear(&st);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t)
        exit(1);
    for (int i = 0; i < 20; i++)
        if (fn(ctx, &st))
            die(&st, name);
    for (int i = 0; i < reps; i++) {
        double t0 = now_us();
        fn(ctx, &st);
        t[i] = now_us() - t0;
    }
    if (st.code)
        die(&st, name);
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    printf("| %-40s | %3d | %9.2f | %9.2f | %9.2f |\n", name, count, t[reps / 2], t[reps * 99 / 100],
           count * t[reps / 2]);
    total_p50 += count * t[reps / 2];
    free(t);
}

typedef struct lin_ctx {
    fx_tensor x, w, y;
} lin_ctx;

static int lin_run(void *p, fx_status *st)
{
    lin_ctx *c = p;
    fx_linear_inputs in = {.x = &c->x, .w = &c->w, .activation = FX_ACT_NONE};
    return fx_op_linear_forward_into(NULL, &in, &c->y, NULL, st);
}

static void linear_case(int64_t in, int64_t out, int count)
{
    lin_ctx c = {tensor2(1, in, -1, 1), tensor2(out, in, -0.1, 0.1), tensor2(1, out, 0, 0)};
    char name[64];
    snprintf(name, sizeof name, "linear B1 %lld -> %lld", (long long)in, (long long)out);
    time_op(name, count, lin_run, &c);
}

typedef struct conv_ctx {
    fx_tensor state, x, w, b, y;
} conv_ctx;

static int conv_run(void *p, fx_status *st)
{
    conv_ctx *c = p;
    fx_conv_inputs in = {.x = &c->x, .w = &c->w, .bias = &c->b, .activation = FX_ACT_SILU};
    return fx_op_conv_step_into(NULL, &c->state, &in, &c->y, st);
}

typedef struct ssm_ctx {
    fx_tensor state, x, dt, a, b, c, d, z, bias, y;
} ssm_ctx;

static int ssm_run(void *p, fx_status *st)
{
    ssm_ctx *c = p;
    fx_ssm_inputs in = {.x = &c->x, .dt = &c->dt, .a = &c->a, .b = &c->b, .c = &c->c, .d = &c->d, .z = &c->z,
                        .dt_bias = &c->bias, .dt_softplus = true};
    return fx_op_ssm_step_into(NULL, &c->state, &in, &c->y, st);
}

typedef struct add_ctx {
    fx_tensor a, b, y;
} add_ctx;

static int add_run(void *p, fx_status *st)
{
    add_ctx *c = p;
    return dev->backend->binary(NULL, FX_ADD, &c->a, &c->b, &c->y, st);
}

typedef struct gru_ctx {
    fx_rnn_layer layer;
    fx_tensor w_ih, w_hh, b_ih, b_hh, x, h, y;
} gru_ctx;

static int gru_run(void *p, fx_status *st)
{
    gru_ctx *c = p;
    fx_rnn_inputs in = {.cell = FX_RNN_GRU, .layers = 1, .layer = &c->layer, .x = &c->x};
    return fx_op_rnn_step_into(NULL, &in, &c->h, NULL, &c->y, st);
}

static void mamba_block(void)
{
    const int64_t D = 256, E = 512, N = 16, K = 4, R = 16;
    linear_case(D, E, 2);
    conv_ctx cv = {tensor2(E, K - 1, -1, 1), tensor2(1, E, -1, 1), tensor2(E, K, -0.5, 0.5), tensor1(E, -0.1, 0.1),
                   tensor2(1, E, 0, 0)};
    cv.state.rank = 3, cv.state.dims[0] = 1, cv.state.dims[1] = E, cv.state.dims[2] = K - 1;
    time_op("causal_conv1d step B1 D512 W4 silu", 1, conv_run, &cv);
    linear_case(E, R, 1);
    linear_case(E, N, 2);
    linear_case(R, E, 1);
    ssm_ctx s = {tensor2(E, N, -1, 1), tensor2(1, E, -1, 1), tensor2(1, E, -3, 0), tensor2(E, N, -4, -0.5),
                 tensor2(1, N, -1, 1), tensor2(1, N, -1, 1), tensor1(E, -1, 1), tensor2(1, E, -2, 2),
                 tensor1(E, -0.5, 0.5), tensor2(1, E, 0, 0)};
    s.state.rank = 3, s.state.dims[0] = 1, s.state.dims[1] = E, s.state.dims[2] = N;
    time_op("selective_scan step B1 D512 N16", 1, ssm_run, &s);
    linear_case(E, D, 1);
    add_ctx a = {tensor2(1, D, -1, 1), tensor2(1, D, -1, 1), tensor2(1, D, 0, 0)};
    time_op("residual add B1 256", 1, add_run, &a);
}

static void gru_layer(void)
{
    const int64_t H = 512;
    gru_ctx g = {{0}, tensor2(3 * H, H, -0.04, 0.04), tensor2(3 * H, H, -0.04, 0.04), tensor1(3 * H, -0.04, 0.04),
                 tensor1(3 * H, -0.04, 0.04), tensor2(1, H, -1, 1), tensor2(1, H, -1, 1), tensor2(1, H, 0, 0)};
    g.h.rank = 3, g.h.dims[0] = 1, g.h.dims[1] = 1, g.h.dims[2] = H;
    g.layer = (fx_rnn_layer){&g.w_ih, &g.w_hh, &g.b_ih, &g.b_hh};
    time_op("gru step B1 H512 (one layer)", 1, gru_run, &g);
}

int main(int argc, char **argv)
{
    fx_status st;
    fx_status_clear(&st);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (fx_runtime_init("priv", &fx_cpu_backend, &st))
        die(&st, "init");
    bool ref = argc > 1 && strcmp(argv[1], "ref") == 0;
    if (argc > 2)
        reps = atoi(argv[2]) > 10 ? atoi(argv[2]) : reps;
    dev = ref ? fx_cpu_reference_device() : fx_cpu_device();
    printf("frame ops on %s, median and p99 of %d calls (µs)\n\n", dev->label, reps);
    printf("| %-40s | %3s | %9s | %9s | %9s |\n", "op", "n", "p50", "p99", "n x p50");
    printf("|%s|%s:|%s:|%s:|%s:|\n", "------------------------------------------", "----", "----------",
           "----------", "----------");
    mamba_block();
    printf("| %-40s |     |           |           | %9.2f |\n", "one Mamba block", total_p50);
    total_p50 = 0;
    gru_layer();
    fx_runtime_shutdown();
    return 0;
}
