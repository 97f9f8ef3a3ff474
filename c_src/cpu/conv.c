/* The CPU causal depthwise conv1d (include/fusex_conv.h): the reference the
 * CUDA backend is tested against. f64 throughout; the equations as loops,
 * a (batch, channel) sequence a task (OpenMP where it pays). The weight
 * and bias gradients are summed per channel over batch and time in that
 * order, whatever the threads. */
#include <omp.h>

#include "cpu/activation.h"
#include "cpu/cpu.h"
#include "fusex_conv.h"
#include "fusex_dtype.h"

static double ld(const fx_tensor *t, int64_t i) { return fx_load_f64(t->data, t->dtype, i); }
static void st64(const fx_tensor *t, int64_t i, double v) { fx_store_f64(t->data, t->dtype, i, v); }

static bool parallel(const fx_conv_dims *n)
{
    return n->batch * n->dim > 1 && n->batch * n->seqlen * n->dim * n->width > FX_CPU_PARALLEL_MIN;
}

/* x_t[d] of sequence b, t in [-(width-1), seqlen): the initial state's (or
 * zero) before the first input. */
static double x_at(const fx_conv_fwd_args *a, int64_t b, int64_t t, int64_t d)
{
    const fx_conv_dims *n = &a->n;
    if (t >= 0)
        return ld(a->x, (b * n->seqlen + t) * n->dim + d);
    if (!a->initial_state)
        return 0.0;
    return ld(a->initial_state, (b * n->dim + d) * (n->width - 1) + (t + n->width - 1));
}

static double pre_at(const fx_conv_fwd_args *a, int64_t b, int64_t t, int64_t d)
{
    const int64_t W = a->n.width;
    double acc = a->bias ? ld(a->bias, d) : 0.0;
    for (int64_t k = 0; k < W; k++)
        acc += ld(a->w, d * W + k) * x_at(a, b, t - (W - 1) + k, d);
    return acc;
}

static void forward_sequence(const fx_conv_fwd_args *a, int64_t b, int64_t d)
{
    const fx_conv_dims *n = &a->n;
    for (int64_t t = 0; t < n->seqlen; t++)
        st64(a->y, (b * n->seqlen + t) * n->dim + d, fx_activate64(a->activation, pre_at(a, b, t, d)));
    if (a->final_state)
        for (int64_t k = 0; k < n->width - 1; k++)
            st64(a->final_state, (b * n->dim + d) * (n->width - 1) + k, x_at(a, b, n->seqlen - (n->width - 1) + k, d));
}

static int cpu_forward(const fx_exec *ex, const fx_conv_fwd_args *a, fx_status *st)
{
    (void)ex;
    const int64_t tasks = a->n.batch * a->n.dim;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < tasks && !fx_watch_gone(&w); lo = fx_piece_end(lo, tasks)) {
        const int64_t hi = fx_piece_end(lo, tasks);
#pragma omp parallel for if (parallel(&a->n)) schedule(static)
        for (int64_t i = lo; i < hi; i++)
            forward_sequence(a, i / a->n.dim, i % a->n.dim);
    }
    return fx_watch_end(&w, "a causal_conv1d", st);
}

static size_t cpu_scratch(const fx_exec *ex, const void *args)
{
    (void)ex;
    (void)args;
    return 0;
}

static size_t cpu_forward_scratch(const fx_exec *ex, const fx_conv_fwd_args *a) { return cpu_scratch(ex, a); }
static size_t cpu_backward_scratch(const fx_exec *ex, const fx_conv_bwd_args *a) { return cpu_scratch(ex, a); }

/* g_s = dy_s * act'(pre_s) for s in [0, seqlen), else 0. */
static double g_at(const fx_conv_bwd_args *a, int64_t b, int64_t s, int64_t d)
{
    const fx_conv_dims *n = &a->fwd.n;
    if (s < 0 || s >= n->seqlen)
        return 0.0;
    const double dy = ld(a->dy, (b * n->seqlen + s) * n->dim + d);
    if (a->fwd.activation == FX_ACT_NONE)
        return dy;
    return dy * fx_activate64_grad(a->fwd.activation, pre_at(&a->fwd, b, s, d));
}

/* dx_t (t in [-(width-1), seqlen)): the inputs' gradient through y and
 * through the final state. */
static double dx_at(const fx_conv_bwd_args *a, int64_t b, int64_t t, int64_t d)
{
    const fx_conv_dims *n = &a->fwd.n;
    const int64_t W = n->width;
    double sum = 0.0;
    for (int64_t k = 0; k < W; k++)
        sum += ld(a->fwd.w, d * W + k) * g_at(a, b, t + (W - 1) - k, d);
    const int64_t k = t - (n->seqlen - (W - 1)); /* the final state's slot holding x_t */
    if (a->dfinal_state && k >= 0 && k < W - 1)
        sum += ld(a->dfinal_state, (b * n->dim + d) * (W - 1) + k);
    return sum;
}

static void backward_channel(const fx_conv_bwd_args *a, int64_t d)
{
    const fx_conv_dims *n = &a->fwd.n;
    const int64_t W = n->width;
    double dw[FX_CONV_MAX_WIDTH] = {0}, db = 0.0;
    for (int64_t b = 0; b < n->batch; b++) {
        for (int64_t t = 0; t < n->seqlen; t++) {
            st64(a->dx, (b * n->seqlen + t) * n->dim + d, dx_at(a, b, t, d));
            const double g = g_at(a, b, t, d);
            db += g;
            for (int64_t k = 0; k < W; k++)
                dw[k] += g * x_at(&a->fwd, b, t - (W - 1) + k, d);
        }
        if (a->dinitial_state)
            for (int64_t i = 0; i < W - 1; i++)
                st64(a->dinitial_state, (b * n->dim + d) * (W - 1) + i, dx_at(a, b, i - (W - 1), d));
    }
    for (int64_t k = 0; k < W; k++)
        st64(a->dw, d * W + k, dw[k]);
    if (a->dbias)
        st64(a->dbias, d, db);
}

static int cpu_backward(const fx_exec *ex, const fx_conv_bwd_args *a, fx_status *st)
{
    (void)ex;
    const int64_t dim = a->fwd.n.dim;
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t lo = 0; lo < dim && !fx_watch_gone(&w); lo = fx_piece_end(lo, dim)) {
        const int64_t hi = fx_piece_end(lo, dim);
#pragma omp parallel for if (parallel(&a->fwd.n)) schedule(static)
        for (int64_t d = lo; d < hi; d++)
            backward_channel(a, d);
    }
    return fx_watch_end(&w, "a causal_conv1d backward", st);
}

static int cpu_step(const fx_exec *ex, const fx_conv_step_args *a, fx_status *st)
{
    (void)ex;
    (void)st;
    const int64_t B = a->n.batch, D = a->n.dim, W = a->n.width;
#pragma omp parallel for if (B * D * W > FX_CPU_PARALLEL_MIN) schedule(static)
    for (int64_t i = 0; i < B * D; i++) {
        const int64_t d = i % D;
        double window[FX_CONV_MAX_WIDTH];
        for (int64_t k = 0; k < W - 1; k++)
            window[k] = ld(a->state, i * (W - 1) + k);
        window[W - 1] = ld(a->x, i);
        double acc = a->bias ? ld(a->bias, d) : 0.0;
        for (int64_t k = 0; k < W; k++)
            acc += ld(a->w, d * W + k) * window[k];
        st64(a->y, i, fx_activate64(a->activation, acc));
        for (int64_t k = 0; k < W - 1; k++)
            st64(a->state, i * (W - 1) + k, window[k + 1]);
    }
    return FX_OK;
}

const struct fx_conv_ops fx_cpu_conv_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
};
