/* The frame of a resident model as a C caller sees it (no Erlang): median
 * and p99 microseconds of fx_model_step_into plus a wait for the device,
 * and of the enqueue alone, each frame case as the state's CUDA graph and
 * as plain launches (graph => false), for the cases (docs/MODELS.md): a
 * 2-layer Mamba d_model 256 d_state 16 (RMSNorm, block, residual) at batch 1 and 32, a 2-layer GRU
 * hidden 512 at batch 1, and a Mamba window of 32 frames. Build:
 * make build/libfusex_core.a && cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Ic_src
 * bench/model_frame.c build/libfusex_core.a -fopenmp -ldl -lpthread -lm -lmvec
 * -o build/model_frame; run with FUSEX_PRIV=priv FUSEX_DEVICE=cuda, or without
 * FUSEX_DEVICE on the CPU (bench/jax_cpu_model.py times JAX's CPU code on
 * the same cases). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/model.h"
#include "core/ops.h"
#include "fusex_cpu.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *us, int n)
{
    qsort(us, (size_t)n, sizeof *us, cmp);
    printf("%-44s p50 %8.1f us  p99 %8.1f us\n", what, us[n / 2], us[n * 99 / 100]);
}

static int fail(const fx_status *st)
{
    fprintf(stderr, "failed: %s\n", st->msg);
    return 1;
}

#define MAX_REPS 2000
static int REPS = MAX_REPS; /* FUSEX_REPS lowers it */

static int bench_frames(fx_device *dev, const char *name, const fx_layer_spec *layers, int n, int64_t input,
                        int64_t batch, bool graph)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_spec spec = {.dtype = FX_F32, .input = input, .nlayers = n, .layers = layers, .seed = 1,
                          .no_graph = !graph};
    fx_model *m;
    fx_model_state *s;
    fx_tensor frame, out;
    const int64_t fdims[2] = {batch, input};
    if (fx_model_new(dev, &spec, NULL, &m, &st) || fx_model_state_new(m, batch, &s, &st) ||
        fx_op_zeros(dev, FX_F32, 2, fdims, &frame, &st))
        return fail(&st);
    const int64_t odims[2] = {batch, m->output};
    if (fx_op_zeros(dev, FX_F32, 2, odims, &out, &st))
        return fail(&st);
    static double synced[MAX_REPS], enqueued[MAX_REPS];
    for (int i = 0; i < 50; i++)
        fx_model_step_into(m, s, &frame, &out, &st);
    fx_op_synchronize(dev, &st);
    for (int i = 0; i < REPS; i++) {
        double t0 = now_us();
        fx_model_step_into(m, s, &frame, &out, &st);
        double t1 = now_us();
        fx_op_synchronize(dev, &st);
        synced[i] = now_us() - t0;
        enqueued[i] = t1 - t0;
    }
    if (st.code)
        return fail(&st);
    char what[96], why[192];
    const char *mode = fx_model_frame_graphs(m, why, sizeof why) ? "graph" : "launches";
    if (graph && strcmp(mode, "graph") != 0)
        printf("(%s: frames as launches: %s)\n", name, why);
    snprintf(what, sizeof what, "%s B%lld frame (%s) + sync", name, (long long)batch, mode);
    report(what, synced, REPS);
    snprintf(what, sizeof what, "%s B%lld frame (%s) enqueue", name, (long long)batch, mode);
    report(what, enqueued, REPS);
    fx_tensor_release(&frame);
    fx_tensor_release(&out);
    fx_model_state_free(s);
    fx_model_free(m);
    return 0;
}

static int bench_window(fx_device *dev, const char *name, const fx_layer_spec *layers, int n, int64_t input,
                        int64_t seqlen)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_spec spec = {.dtype = FX_F32, .input = input, .nlayers = n, .layers = layers, .seed = 1};
    fx_model *m;
    fx_model_state *s;
    fx_tensor window, y;
    const int64_t wdims[3] = {1, seqlen, input};
    if (fx_model_new(dev, &spec, NULL, &m, &st) || fx_model_state_new(m, 1, &s, &st) ||
        fx_op_zeros(dev, FX_F32, 3, wdims, &window, &st))
        return fail(&st);
    static double us[MAX_REPS / 4];
    for (int i = 0; i < REPS / 4 + 20; i++) {
        double t0 = now_us();
        if (fx_model_forward(m, s, &window, &y, &st))
            return fail(&st);
        fx_op_synchronize(dev, &st);
        if (i >= 20)
            us[i - 20] = now_us() - t0;
        fx_tensor_release(&y);
    }
    char what[96];
    snprintf(what, sizeof what, "%s B1 L%lld window + sync", name, (long long)seqlen);
    report(what, us, REPS / 4);
    fx_tensor_release(&window);
    fx_model_state_free(s);
    fx_model_free(m);
    return 0;
}

/* A training step's parts for the training case (a 2-layer Mamba
 * d768 B8 L2048): the inference window, the training forward with the loss
 * (fx_model_gradients without gradients), and the whole forward, loss and
 * backward; medians of a few, each waited for. */
static double seconds_of(fx_device *dev, fx_model *m, fx_model_state *s, const fx_tensor *x,
                         const fx_tensor *t, int what, fx_status *st)
{
    double t0 = now_us(), loss;
    fx_tensor y;
    if (what == 0) {
        if (fx_model_forward(m, s, x, &y, st) == FX_OK)
            fx_tensor_release(&y);
    } else {
        fx_model_gradients(m, x, t, FX_LOSS_MSE, what == 2, &loss, st);
    }
    fx_op_synchronize(dev, st);
    return now_us() - t0;
}

static int bench_training(fx_device *dev, const char *name, const fx_layer_spec *layers, int n, int64_t width,
                          int64_t batch, int64_t seqlen)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_spec spec = {.dtype = FX_F32, .input = width, .nlayers = n, .layers = layers, .seed = 1};
    fx_model *m;
    fx_model_state *s;
    fx_tensor x, t;
    const int64_t dims[3] = {batch, seqlen, width};
    if (fx_model_new(dev, &spec, NULL, &m, &st) || fx_model_state_new(m, batch, &s, &st) ||
        fx_op_zeros(dev, FX_F32, 3, dims, &x, &st) || fx_op_zeros(dev, FX_F32, 3, dims, &t, &st))
        return fail(&st);
    static const char *parts[3] = {"window (inference)", "training forward + loss", "forward + loss + backward"};
    for (int what = 0; what < 3; what++) {
        double us[7];
        for (int i = 0; i < 9; i++) {
            double one = seconds_of(dev, m, s, &x, &t, what, &st);
            if (st.code)
                return fail(&st);
            if (i >= 2)
                us[i - 2] = one;
        }
        char label[128];
        snprintf(label, sizeof label, "%s B%lld L%lld %s", name, (long long)batch, (long long)seqlen, parts[what]);
        report(label, us, 7);
    }
    fx_tensor_release(&x);
    fx_tensor_release(&t);
    fx_model_state_free(s);
    fx_model_free(m);
    return 0;
}

int main(void)
{
    fx_status st;
    fx_status_clear(&st);
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *reps = getenv("FUSEX_REPS");
    if (reps && atoi(reps) >= 4 && atoi(reps) <= MAX_REPS)
        REPS = atoi(reps);
    const char *priv = getenv("FUSEX_PRIV");
    if (fx_runtime_init(priv ? priv : "priv", &fx_cpu_backend, &st))
        return fail(&st);
    const char *want = getenv("FUSEX_DEVICE");
    fx_device *dev = want && strcmp(want, "cuda") == 0 ? fx_device_find(FX_DEVICE_CUDA, 0) : fx_cpu_device();
    if (!dev) {
        fprintf(stderr, "no CUDA device: %s\n", fx_cuda_unavailable_reason());
        return 1;
    }
    printf("fusex model frames on %s\n", dev->label);
    /* Each Mamba layer an RMSNorm then the block with its residual, as
     * bench/peers_model.py's peers and fusex_bench_model's rows. */
    const fx_layer_spec mamba2[4] = {
        {.kind = FX_LAYER_RMS_NORM, .eps = 1e-5},
        {.kind = FX_LAYER_MAMBA, .inner = 512, .dstate = 16, .dconv = 4, .dt_rank = 16, .residual = true},
        {.kind = FX_LAYER_RMS_NORM, .eps = 1e-5},
        {.kind = FX_LAYER_MAMBA, .inner = 512, .dstate = 16, .dconv = 4, .dt_rank = 16, .residual = true}};
    const fx_layer_spec gru2[2] = {{.kind = FX_LAYER_GRU, .size = 512, .bias = true},
                                   {.kind = FX_LAYER_GRU, .size = 512, .bias = true}};
    int rc = 0;
    /* The CPU has no graphs: its frames run once, as launches. */
    for (int graph = dev == fx_cpu_device() ? 0 : 1; graph >= 0 && rc == 0; graph--)
        rc = bench_frames(dev, "2-layer Mamba d256 N16", mamba2, 4, 256, 1, graph) ||
             bench_frames(dev, "2-layer Mamba d256 N16", mamba2, 4, 256, 32, graph) ||
             bench_frames(dev, "2-layer GRU H512", gru2, 2, 512, 1, graph);
    rc = rc || bench_window(dev, "2-layer Mamba d256 N16", mamba2, 4, 256, 32);
    const fx_layer_spec mamba768[4] = {
        {.kind = FX_LAYER_RMS_NORM, .eps = 1e-5},
        {.kind = FX_LAYER_MAMBA, .inner = 1536, .dstate = 16, .dconv = 4, .dt_rank = 48, .residual = true},
        {.kind = FX_LAYER_RMS_NORM, .eps = 1e-5},
        {.kind = FX_LAYER_MAMBA, .inner = 1536, .dstate = 16, .dconv = 4, .dt_rank = 48, .residual = true}};
    if (dev->kind == FX_DEVICE_CUDA || getenv("FUSEX_TRAIN"))
        rc = rc || bench_training(dev, "2-layer Mamba d768 N16", mamba768, 4, 768, 8, 2048);
    fx_runtime_shutdown();
    return rc;
}
