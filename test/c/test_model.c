/* Resident models (core/model.h) on the device under test against the same
 * model on the CPU: a chain of frames equals the window's forward on both,
 * the device's forward, frames and gradients equal the CPU's, a frame
 * allocates nothing, and bad specs and weights are refused with their
 * messages. Under `make test-emu` this runs the CUDA launchers of every
 * layer's frame, window and backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/loss.h"
#include "core/model.h"
#include "core/ops.h"
#include "fusex_activation.h"
#include "testutil.h"

/* Every layer kind, widths that fit no tile, residuals where they fit. */
static const fx_layer_spec every_kind[] = {
    {.kind = FX_LAYER_LINEAR, .size = 7, .activation = FX_ACT_TANH, .bias = true},
    {.kind = FX_LAYER_MINGRU, .size = 6, .bias = true},
    {.kind = FX_LAYER_GRU, .size = 6, .bias = true, .residual = true},
    {.kind = FX_LAYER_RMS_NORM, .eps = 1e-5},
    {.kind = FX_LAYER_MINLSTM, .size = 5, .bias = false},
    {.kind = FX_LAYER_LSTM, .size = 5, .bias = true, .residual = true},
    {.kind = FX_LAYER_LAYER_NORM, .eps = 1e-5, .bias = true, .residual = true},
    {.kind = FX_LAYER_MAMBA, .inner = 10, .dstate = 5, .dconv = 4, .dt_rank = 2, .residual = true},
    {.kind = FX_LAYER_LINEAR, .size = 3, .activation = FX_ACT_GELU, .bias = true},
};

static fx_model_spec spec_of(const fx_layer_spec *layers, int n, int64_t input)
{
    fx_model_spec spec = {.dtype = FX_F32, .input = input, .nlayers = n, .layers = layers, .seed = 7};
    return spec;
}

/* The CPU model and the same weights on the device under test. */
static void model_pair(const fx_model_spec *spec, fx_model **cpu, fx_model **dev)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_new(fx_cpu_device(), spec, NULL, cpu, &st);
    FX_CK_OK(st);
    const fx_tensor *w[FX_MODEL_MAX_LAYERS * FX_LAYER_MAX_SLOTS] = {NULL};
    for (int l = 0; l < (*cpu)->nlayers; l++)
        for (int s = 0; s < FX_LAYER_MAX_SLOTS; s++)
            if ((*cpu)->layer[l].param[s].buffer)
                w[l * FX_LAYER_MAX_SLOTS + s] = &(*cpu)->layer[l].param[s];
    fx_model_new(fx_test_device(), spec, w, dev, &st);
    FX_CK_OK(st);
}

static void window(fx_device *dev, int64_t b, int64_t t, int64_t w, const double *v, fx_tensor *out)
{
    const int64_t dims[3] = {b, t, w};
    fx_test_tensor(dev, FX_F32, 3, dims, v, out);
}

/* y [B, L, O] of model m over the window from zeros. */
static double *forward_values(fx_model *m, const double *xs, int64_t b, int64_t l)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_state *s;
    fx_tensor x, y;
    fx_model_state_new(m, b, &s, &st);
    FX_CK_OK(st);
    window(m->device, b, l, m->input, xs, &x);
    fx_model_forward(m, s, &x, &y, &st);
    FX_CK_OK(st);
    double *v = fx_test_read(&y);
    fx_tensor_release(&x);
    fx_tensor_release(&y);
    fx_model_state_free(s);
    return v;
}

/* The same from frames, laid out [B, L, O]. */
static double *step_values(fx_model *m, const double *xs, int64_t b, int64_t l)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_state *s;
    fx_model_state_new(m, b, &s, &st);
    FX_CK_OK(st);
    const int64_t in = m->input, o = m->output;
    const int64_t fdims[2] = {b, in}, odims[2] = {b, o};
    double *frame = malloc(sizeof *frame * (size_t)(b * in));
    double *ys = malloc(sizeof *ys * (size_t)(b * l * o));
    fx_tensor out;
    fx_test_poisoned(m->device, FX_F32, 2, odims, &out);
    for (int64_t t = 0; t < l; t++) {
        for (int64_t i = 0; i < b; i++)
            memcpy(frame + i * in, xs + (i * l + t) * in, sizeof *frame * (size_t)in);
        fx_tensor f;
        fx_test_tensor(m->device, FX_F32, 2, fdims, frame, &f);
        fx_model_step_into(m, s, &f, &out, &st);
        FX_CK_OK(st);
        double *got = fx_test_read(&out);
        for (int64_t i = 0; i < b; i++)
            memcpy(ys + (i * l + t) * o, got + i * o, sizeof *ys * (size_t)o);
        free(got);
        fx_tensor_release(&f);
    }
    fx_tensor_release(&out);
    fx_model_state_free(s);
    free(frame);
    return ys;
}

START_TEST(frames_and_windows_match_the_cpu)
{
    const fx_model_spec spec = spec_of(every_kind, 9, 5);
    fx_model *cpu, *dev;
    model_pair(&spec, &cpu, &dev);
    const int64_t b = 3, l = 9;
    double *xs = malloc(sizeof *xs * (size_t)(b * l * spec.input));
    fx_fill_uniform(xs, b * l * spec.input, -1, 1);
    double *want = forward_values(cpu, xs, b, l);
    double *cpu_steps = step_values(cpu, xs, b, l);
    double *dev_fwd = forward_values(dev, xs, b, l);
    double *dev_steps = step_values(dev, xs, b, l);
    const int64_t n = b * l * cpu->output;
    fx_assert_close(cpu_steps, want, n, 1e-5);
    fx_assert_close(dev_fwd, want, n, 1e-5);
    fx_assert_close(dev_steps, want, n, 1e-5);
    free(xs), free(want), free(cpu_steps), free(dev_fwd), free(dev_steps);
    fx_model_free(cpu);
    fx_model_free(dev);
}
END_TEST

START_TEST(gradients_match_the_cpu)
{
    const fx_model_spec spec = spec_of(every_kind, 9, 5);
    fx_model *cpu, *dev;
    model_pair(&spec, &cpu, &dev);
    const int64_t b = 2, l = 6;
    double *xs = malloc(sizeof *xs * (size_t)(b * l * spec.input));
    double *ts = malloc(sizeof *ts * (size_t)(b * l * cpu->output));
    fx_fill_uniform(xs, b * l * spec.input, -1, 1);
    fx_fill_uniform(ts, b * l * cpu->output, -1, 1);
    fx_model *both[2] = {cpu, dev};
    double loss[2];
    for (int i = 0; i < 2; i++) {
        fx_status st;
        fx_status_clear(&st);
        fx_tensor x, t;
        window(both[i]->device, b, l, spec.input, xs, &x);
        window(both[i]->device, b, l, cpu->output, ts, &t);
        fx_model_gradients(both[i], &x, &t, FX_LOSS_MSE, true, &loss[i], &st);
        FX_CK_OK(st);
        fx_tensor_release(&x);
        fx_tensor_release(&t);
    }
    ck_assert_msg(fabs(loss[0] - loss[1]) <= 1e-5 * fabs(loss[0]), "loss %g vs %g", loss[1], loss[0]);
    ck_assert_int_eq(fx_model_param_count(cpu), fx_model_param_count(dev));
    for (int i = 0; i < fx_model_param_count(cpu); i++) {
        double *g = fx_test_read(fx_model_grad(dev, i)), *w = fx_test_read(fx_model_grad(cpu, i));
        fx_assert_close(g, w, fx_model_grad(cpu, i)->numel, 1e-4);
        free(g), free(w);
    }
    free(xs), free(ts);
    fx_model_free(cpu);
    fx_model_free(dev);
}
END_TEST

/* The row losses on the device under test against their formulas in f64
 * (awkward widths: one class, fewer than a warp, more than a warp), their
 * outputs poisoned first, and the op layer's refusals. */
static void loss_case(int kind, int64_t rows, int64_t classes)
{
    fx_device *dev = fx_test_device();
    const int64_t n = rows * classes, ydims[2] = {rows, classes};
    double *y = malloc(sizeof *y * (size_t)n), *t = malloc(sizeof *t * (size_t)n);
    double *want_rows = malloc(sizeof *want_rows * (size_t)rows), *want_dy = malloc(sizeof *want_dy * (size_t)n);
    int32_t *labels = malloc(sizeof *labels * (size_t)rows);
    fx_fill_uniform(y, n, -3, 3);
    fx_fill_uniform(t, n, -3, 3);
    /* The formulas read the f32 values the device holds: a difference of two
     * rounded inputs can lose more than 1e-5 of itself to the rounding. */
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)y[i], t[i] = (float)t[i];
    const double scale = 1.0 / (double)n;
    for (int64_t r = 0; r < rows; r++) {
        labels[r] = (int32_t)((r * 7 + 3) % classes);
        const double *yr = y + r * classes;
        double sum = 0, top = yr[0], total = 0;
        for (int64_t c = 0; c < classes; c++)
            top = fmax(top, yr[c]);
        for (int64_t c = 0; c < classes; c++)
            total += exp(yr[c] - top);
        for (int64_t c = 0; c < classes; c++) {
            const double d = yr[c] - t[r * classes + c];
            sum += d * d;
            want_dy[r * classes + c] = kind == FX_LOSS_MSE ? scale * 2 * d
                                                           : scale * (exp(yr[c] - top) / total - (c == labels[r]));
        }
        want_rows[r] = kind == FX_LOSS_MSE ? sum : log(total) + top - yr[labels[r]];
    }
    fx_status st;
    fx_status_clear(&st);
    fx_tensor yt, tt, row_loss, dy;
    fx_test_tensor(dev, FX_F32, 2, ydims, y, &yt);
    if (kind == FX_LOSS_MSE)
        fx_test_tensor(dev, FX_F32, 2, ydims, t, &tt);
    else
        ck_assert_int_eq(fx_op_from_host(dev, FX_S32, 1, &rows, labels, sizeof *labels * (size_t)rows, &tt, &st), FX_OK);
    fx_test_poisoned(dev, FX_F32, 1, &rows, &row_loss);
    fx_test_poisoned(dev, FX_F32, 2, ydims, &dy);
    const fx_loss_args a = {.rows = rows, .classes = classes, .kind = kind, .y = &yt, .targets = &tt,
                            .grad_scale = scale, .row_loss = &row_loss, .dy = &dy};
    fx_op_loss_rows_into(NULL, &a, &st);
    FX_CK_OK(st);
    double *got_rows = fx_test_read(&row_loss), *got_dy = fx_test_read(&dy);
    fx_assert_close(got_rows, want_rows, rows, 1e-5);
    fx_assert_close(got_dy, want_dy, n, 1e-5);
    fx_loss_args wrong = a;
    wrong.row_loss = &dy;
    ck_assert_int_eq(fx_op_loss_rows_into(NULL, &wrong, &st), FX_EBADARG);
    char want_msg[160];
    snprintf(want_msg, sizeof want_msg, "row_loss: expected shape {%lld} [rows], got {%lld,%lld}", (long long)rows,
             (long long)rows, (long long)classes);
    ck_assert_str_eq(st.msg, want_msg);
    free(got_rows), free(got_dy);
    fx_tensor *all[] = {&yt, &tt, &row_loss, &dy};
    for (int i = 0; i < 4; i++)
        fx_tensor_release(all[i]);
    free(y), free(t), free(want_rows), free(want_dy), free(labels);
}

START_TEST(loss_rows_match_their_formulas)
{
    const int64_t sizes[][2] = {{1, 1}, {3, 5}, {37, 33}, {70, 100}, {9, 257}};
    for (int kind = FX_LOSS_MSE; kind <= FX_LOSS_CROSS_ENTROPY; kind++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            loss_case(kind, sizes[i][0], sizes[i][1]);
}
END_TEST

/* A frame into a caller's output allocates no device memory. */
START_TEST(a_frame_allocates_nothing)
{
    const fx_model_spec spec = spec_of(every_kind, 9, 5);
    fx_model *cpu, *dev;
    model_pair(&spec, &cpu, &dev);
    fx_status st;
    fx_status_clear(&st);
    fx_model_state *s;
    fx_model_state_new(dev, 2, &s, &st);
    FX_CK_OK(st);
    const int64_t fdims[2] = {2, 5}, odims[2] = {2, 3};
    double frame[10];
    fx_fill_uniform(frame, 10, -1, 1);
    fx_tensor f, out;
    fx_test_tensor(dev->device, FX_F32, 2, fdims, frame, &f);
    fx_test_poisoned(dev->device, FX_F32, 2, odims, &out);
    fx_model_step_into(dev, s, &f, &out, &st);
    FX_CK_OK(st);
    const long long before = atomic_load(&dev->device->allocated);
    for (int i = 0; i < 20; i++)
        fx_model_step_into(dev, s, &f, &out, &st);
    FX_CK_OK(st);
    ck_assert_int_eq(atomic_load(&dev->device->allocated), before);
    fx_tensor_release(&f);
    fx_tensor_release(&out);
    fx_model_state_free(s);
    fx_model_free(cpu);
    fx_model_free(dev);
}
END_TEST

/* The outputs of `l` frames from a fresh state of m (then, from the same
 * state reset, `l` more), laid out frame after frame; the state's replay
 * count into *replays. */
static double *chain(fx_model *m, const double *frames, int64_t b, int64_t l, uint64_t *replays)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model_state *s;
    fx_model_state_new(m, b, &s, &st);
    FX_CK_OK(st);
    const int64_t in = m->input, o = m->output;
    const int64_t fdims[2] = {b, in}, odims[2] = {b, o};
    double *ys = malloc(sizeof *ys * (size_t)(2 * l * b * o));
    fx_tensor out;
    fx_test_poisoned(m->device, FX_F32, 2, odims, &out);
    for (int64_t t = 0; t < 2 * l; t++) {
        if (t == l) {
            fx_model_state_reset(m, s, &st);
            FX_CK_OK(st);
        }
        fx_tensor f;
        fx_test_tensor(m->device, FX_F32, 2, fdims, frames + (t % l) * b * in, &f);
        fx_model_step_into(m, s, &f, &out, &st);
        FX_CK_OK(st);
        double *got = fx_test_read(&out);
        memcpy(ys + t * b * o, got, sizeof *ys * (size_t)(b * o));
        free(got);
        fx_tensor_release(&f);
    }
    *replays = s->replays;
    fx_tensor_release(&out);
    fx_model_state_free(s);
    return ys;
}

static void assert_same_bits(const double *got, const double *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(!isnan(got[i]) && got[i] == want[i], "element %lld: %.9g, want %.9g (bit for bit)",
                      (long long)i, got[i], want[i]);
}

/* Replayed frames equal launched ones bit for bit over a chain, and across
 * a reset (the graph holds the state's addresses, which a reset keeps).
 * Where the device has no graphs (the CPU) the model says so and the
 * graph's assertions are skipped. */
START_TEST(graph_frames_equal_launched_frames)
{
    fx_model_spec spec = spec_of(every_kind, 9, 5);
    fx_model *graph, *plain;
    fx_status st;
    fx_status_clear(&st);
    fx_model_new(fx_test_device(), &spec, NULL, &graph, &st);
    FX_CK_OK(st);
    spec.no_graph = true;
    fx_model_new(fx_test_device(), &spec, NULL, &plain, &st);
    FX_CK_OK(st);
    char why[192];
    ck_assert(!fx_model_frame_graphs(plain, why, sizeof why));
    ck_assert_str_eq(why, "graph => false in the spec");
    const bool graphs = fx_model_frame_graphs(graph, why, sizeof why);
    if (graph->device->kind == FX_DEVICE_CPU) {
        ck_assert(!graphs);
        ck_assert_str_eq(why, "cpu has no CUDA graphs");
        printf("model graph: the graph's assertions skipped: no CUDA device under test (%s)\n", why);
    } else {
        ck_assert_msg(graphs, "cuda model without graphs: %s", why);
    }
    const int64_t b = 3, l = 7;
    double *frames = malloc(sizeof *frames * (size_t)(l * b * spec.input));
    fx_fill_uniform(frames, l * b * spec.input, -1, 1);
    uint64_t graph_replays, plain_replays;
    double *want = chain(plain, frames, b, l, &plain_replays);
    double *got = chain(graph, frames, b, l, &graph_replays);
    assert_same_bits(got, want, 2 * l * b * graph->output);
    ck_assert_int_eq(plain_replays, 0);
    /* Every frame but the state's first (plain: the warm-up) is a replay. */
    ck_assert_int_eq(graph_replays, graphs ? 2 * l - 1 : 0);
    ck_assert(fx_model_frame_graphs(graph, why, sizeof why) == graphs);
    free(frames), free(want), free(got);
    fx_model_free(graph);
    fx_model_free(plain);
}
END_TEST

/* A capture that fails (the emulator's FUSEX_EMU_GRAPH=fail spoils every
 * one) turns the model's graphs off for good, says why, and its frames
 * still come out right, launched plainly: never an error. */
START_TEST(a_failed_capture_falls_back)
{
    if (!fx_test_emulated()) {
        printf("model graph: the failed capture's test skipped: it needs the CUDA emulator, whose captures can be "
               "made to fail (device under test: %s)\n", fx_test_device()->label);
        return;
    }
    fx_model_spec spec = spec_of(every_kind, 9, 5);
    fx_model *graph, *plain;
    fx_status st;
    fx_status_clear(&st);
    fx_model_new(fx_test_device(), &spec, NULL, &graph, &st);
    FX_CK_OK(st);
    spec.no_graph = true;
    fx_model_new(fx_test_device(), &spec, NULL, &plain, &st);
    FX_CK_OK(st);
    const int64_t b = 2, l = 4;
    double *frames = malloc(sizeof *frames * (size_t)(l * b * spec.input));
    fx_fill_uniform(frames, l * b * spec.input, -1, 1);
    uint64_t replays;
    double *want = chain(plain, frames, b, l, &replays);
    setenv("FUSEX_EMU_GRAPH", "fail", 1);
    double *got = chain(graph, frames, b, l, &replays);
    unsetenv("FUSEX_EMU_GRAPH");
    assert_same_bits(got, want, 2 * l * b * graph->output);
    ck_assert_int_eq(replays, 0);
    char why[192];
    ck_assert(!fx_model_frame_graphs(graph, why, sizeof why));
    ck_assert_msg(strstr(why, "the frame's capture failed: cudaStreamEndCapture failed") == why, "why: %s", why);
    free(frames), free(want), free(got);
    fx_model_free(graph);
    fx_model_free(plain);
}
END_TEST

static void expect_refused(const fx_model_spec *spec, const fx_tensor *const *w, const char *msg)
{
    fx_status st;
    fx_status_clear(&st);
    fx_model *m = NULL;
    ck_assert_int_eq(fx_model_new(fx_test_device(), spec, w, &m, &st), FX_EBADARG);
    ck_assert_ptr_null(m);
    ck_assert_str_eq(st.msg, msg);
}

START_TEST(bad_specs_and_weights)
{
    fx_layer_spec layers[2] = {{.kind = FX_LAYER_RMS_NORM, .eps = 1e-5}, {.kind = FX_LAYER_GRU, .size = 0}};
    fx_model_spec spec = spec_of(layers, 2, 4);
    expect_refused(&spec, NULL, "layers[1] (gru): hidden: expected an integer >= 1, got 0");
    layers[1] = (fx_layer_spec){.kind = FX_LAYER_LINEAR, .size = 3, .residual = true};
    expect_refused(&spec, NULL,
                   "layers[1] (linear): residual: expected the layer's output width to equal its input's (4), got 3");
    layers[1] = (fx_layer_spec){.kind = FX_LAYER_LINEAR, .size = 3, .bias = true};
    const fx_tensor *w[2 * FX_LAYER_MAX_SLOTS] = {NULL};
    fx_tensor weight, wrong;
    const double ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t wdims[1] = {4}, bad_dims[2] = {4, 3};
    fx_test_tensor(fx_test_device(), FX_F32, 1, wdims, ones, &weight);
    fx_test_tensor(fx_test_device(), FX_F32, 2, bad_dims, ones, &wrong);
    w[0] = &weight;
    w[FX_LAYER_MAX_SLOTS] = &wrong;
    expect_refused(&spec, w, "layers[1].w: expected shape {3,4} ([out, in]), got {4,3}");
    w[FX_LAYER_MAX_SLOTS] = NULL;
    expect_refused(&spec, w, "layers[1].w: expected a tensor [out, in], got none");
    fx_tensor_release(&weight);
    fx_tensor_release(&wrong);
}
END_TEST

Suite *fx_suite_model(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, frames_and_windows_match_the_cpu);
    tcase_add_test(tc, gradients_match_the_cpu);
    tcase_add_test(tc, loss_rows_match_their_formulas);
    tcase_add_test(tc, a_frame_allocates_nothing);
    tcase_add_test(tc, bad_specs_and_weights);
    tcase_add_test(tc, graph_frames_equal_launched_frames);
    tcase_add_test(tc, a_failed_capture_falls_back);
    suite_add_tcase(s, tc);
    return s;
}
