#include "core/linear.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/ops.h"
#include "fusex_dtype.h"

#define LAYOUT_X "[..., in]"
#define LAYOUT_W "[out, in]"
#define LAYOUT_BIAS "[out]"
#define LAYOUT_Y "[..., out]"

static bool on_cpu(const fx_tensor *t) { return t->device->kind == FX_DEVICE_CPU; }

static const struct fx_linear_ops *linear_ops(const fx_device *dev) { return dev->backend->linear; }

static int expect_linear(fx_status *st, const fx_device *dev, bool backward)
{
    const struct fx_linear_ops *ops = linear_ops(dev);
    const void *fn = ops ? (backward ? (const void *)ops->backward : (const void *)ops->forward) : NULL;
    return fx_expect_op(st, dev, fn, backward ? "linear_backward" : "linear");
}

/* A tensor the op reads or writes beside x: x's device, the type and shape. */
static int expect_like(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, fx_dtype dtype, int rank,
                       const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_dtype(st, arg, t, dtype) ||
        fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

int fx_linear_output_shape(const fx_tensor *x, int64_t out, int64_t dims[FX_MAX_RANK])
{
    memcpy(dims, x->dims, sizeof(int64_t) * (size_t)x->rank);
    dims[x->rank - 1] = out;
    return x->rank;
}

int fx_linear_check(const fx_linear_inputs *in, fx_linear_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x, *w = in->w;
    memset(n, 0, sizeof *n);
    if (fx_expect_float(st, "x", x, on_cpu(x)))
        return st->code;
    if (x->rank < 1) {
        char got[160];
        fx_format_shape(got, sizeof got, x->rank, x->dims);
        return fx_fail(st, FX_EBADARG, "x: expected rank >= 1 " LAYOUT_X ", got rank %d shape %s", x->rank, got);
    }
    if (expect_linear(st, x->device, false))
        return st->code;
    n->in = x->dims[x->rank - 1];
    if (fx_shape_numel("x", x->rank - 1, x->dims, &n->rows, st))
        return st->code;
    if (fx_expect_same_device(st, "w", w, x->device, "x") || fx_expect_dtype(st, "w", w, x->dtype) ||
        fx_expect_rank(st, "w", w, 2, LAYOUT_W))
        return st->code;
    const int64_t wdims[2] = {w->dims[0], n->in};
    if (fx_expect_shape(st, "w", w, 2, wdims, LAYOUT_W))
        return st->code;
    n->out = w->dims[0];
    const int64_t bdims[1] = {n->out};
    if (in->bias && (fx_expect_same_device(st, "bias", in->bias, x->device, "x") ||
                     fx_expect_float(st, "bias", in->bias, on_cpu(in->bias)) ||
                     fx_expect_shape(st, "bias", in->bias, 1, bdims, LAYOUT_BIAS)))
        return st->code;
    if (in->activation < 0 || in->activation >= FX_ACT_COUNT)
        return fx_fail(st, FX_EBADARG, "activation: expected none, relu, gelu, silu, tanh or sigmoid (0..%d), got %d",
                       FX_ACT_COUNT - 1, in->activation);
    /* y [..., out] must have a countable size too */
    int64_t ydims[FX_MAX_RANK], numel;
    return fx_shape_numel("y", fx_linear_output_shape(x, n->out, ydims), ydims, &numel, st);
}

static fx_linear_fwd_args fwd_args(const fx_linear_inputs *in, const fx_linear_dims *n, const fx_tensor *y,
                                   const fx_tensor *pre)
{
    fx_linear_fwd_args a = {
        .n = *n, .x = in->x, .w = in->w, .bias = in->bias, .activation = in->activation,
        .allow_tf32 = in->allow_tf32, .y = y, .pre = pre,
    };
    return a;
}

/* y and pre: x's type, [..., out]. */
static int check_forward_outputs(const fx_linear_inputs *in, const fx_linear_dims *n, const fx_tensor *y,
                                 const fx_tensor *pre, fx_status *st)
{
    int64_t dims[FX_MAX_RANK];
    const int rank = fx_linear_output_shape(in->x, n->out, dims);
    if (expect_like(st, "y", y, in->x, in->x->dtype, rank, dims, LAYOUT_Y) ||
        (pre && expect_like(st, "pre", pre, in->x, in->x->dtype, rank, dims, LAYOUT_Y)))
        return st->code;
    return FX_OK;
}

int fx_op_linear_forward_into(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                              const fx_tensor *pre, fx_status *st)
{
    fx_linear_dims n;
    if (fx_linear_check(in, &n, st) || check_forward_outputs(in, &n, y, pre, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.rows == 0 || n.out == 0) /* y and pre are empty */
        return FX_OK;
    const fx_linear_fwd_args a = fwd_args(in, &n, y, pre);
    return linear_ops(dev)->forward(ex, &a, st);
}

size_t fx_op_linear_forward_scratch(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                                    const fx_tensor *pre)
{
    fx_status st;
    fx_status_clear(&st);
    fx_linear_dims n;
    if (fx_linear_check(in, &n, &st) || check_forward_outputs(in, &n, y, pre, &st) || n.rows == 0 || n.out == 0)
        return 0;
    const fx_linear_fwd_args a = fwd_args(in, &n, y, pre);
    return linear_ops(in->x->device)->forward_scratch(ex, &a);
}

/* A tensor the backward reads exactly when the activation's derivative
 * needs it. */
static int expect_saved(fx_status *st, const char *arg, const fx_tensor *t, bool needed, int activation,
                        const fx_tensor *x, int rank, const int64_t *dims)
{
    const char *act = fx_activation_name(activation);
    if (needed && !t)
        return fx_fail(st, FX_EBADARG, "%s: expected the forward's %s (activation %s's derivative reads it), got none",
                       arg, strcmp(arg, "y") == 0 ? "output" : "pre-activation", act);
    if (!needed && t)
        return fx_fail(st, FX_EBADARG, "%s: expected none (activation %s's derivative does not read it), got a tensor",
                       arg, act);
    return t ? expect_like(st, arg, t, x, x->dtype, rank, dims, LAYOUT_Y) : FX_OK;
}

int fx_linear_check_backward(const fx_linear_inputs *in, const fx_tensor *y, const fx_tensor *pre,
                             const fx_tensor *dy, fx_linear_dims *n, fx_status *st)
{
    if (fx_linear_check(in, n, st) || expect_linear(st, in->x->device, true))
        return st->code;
    const fx_tensor *x = in->x;
    int64_t dims[FX_MAX_RANK];
    const int rank = fx_linear_output_shape(x, n->out, dims);
    if (expect_saved(st, "y", y, fx_linear_reads_output(in->activation), in->activation, x, rank, dims) ||
        expect_saved(st, "pre", pre, fx_linear_reads_pre(in->activation), in->activation, x, rank, dims) ||
        expect_like(st, "dy", dy, x, x->dtype, rank, dims, LAYOUT_Y))
        return st->code;
    return FX_OK;
}

static int check_backward(const fx_linear_inputs *in, const fx_tensor *y, const fx_tensor *pre, const fx_tensor *dy,
                          const fx_linear_grad_outs *g, fx_linear_dims *n, fx_status *st)
{
    if (fx_linear_check_backward(in, y, pre, dy, n, st))
        return st->code;
    const fx_tensor *x = in->x;
    if (expect_like(st, "dx", g->dx, x, x->dtype, x->rank, x->dims, LAYOUT_X) ||
        expect_like(st, "dw", g->dw, x, in->w->dtype, 2, in->w->dims, LAYOUT_W))
        return st->code;
    if (!in->bias != !g->dbias)
        return fx_fail(st, FX_EBADARG, "dbias: expected %s, got %s", in->bias ? "a gradient tensor (a bias was given)" : "none (no bias was given)",
                       g->dbias ? "a tensor" : "none");
    if (in->bias && expect_like(st, "dbias", g->dbias, x, in->bias->dtype, 1, in->bias->dims, LAYOUT_BIAS))
        return st->code;
    return FX_OK;
}

static fx_linear_bwd_args bwd_args(const fx_linear_inputs *in, const fx_linear_dims *n, const fx_tensor *y,
                                   const fx_tensor *pre, const fx_tensor *dy, const fx_linear_grad_outs *g)
{
    fx_linear_bwd_args a = {
        .fwd = fwd_args(in, n, y, pre), .dy = dy, .dx = g->dx, .dw = g->dw, .dbias = g->dbias,
    };
    return a;
}

int fx_op_linear_backward_into(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                               const fx_tensor *pre, const fx_tensor *dy, const fx_linear_grad_outs *g,
                               fx_status *st)
{
    fx_linear_dims n;
    if (check_backward(in, y, pre, dy, g, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    /* No rows, or no outputs: nothing flows back; every gradient is zero. */
    if (n.rows == 0 || n.out == 0) {
        if (fx_op_fill_zero(ex, g->dx, st) || fx_op_fill_zero(ex, g->dw, st) || fx_op_fill_zero(ex, g->dbias, st))
            return st->code;
        return FX_OK;
    }
    const fx_linear_bwd_args a = bwd_args(in, &n, y, pre, dy, g);
    return linear_ops(dev)->backward(ex, &a, st);
}

size_t fx_op_linear_backward_scratch(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                                     const fx_tensor *pre, const fx_tensor *dy, const fx_linear_grad_outs *g)
{
    fx_status st;
    fx_status_clear(&st);
    fx_linear_dims n;
    if (check_backward(in, y, pre, dy, g, &n, &st) || n.rows == 0 || n.out == 0)
        return 0;
    const fx_linear_bwd_args a = bwd_args(in, &n, y, pre, dy, g);
    return linear_ops(in->x->device)->backward_scratch(ex, &a);
}

/* ---- contexts ---- */

static void keep(fx_tensor *dst, const fx_tensor *src)
{
    memset(dst, 0, sizeof *dst);
    if (!src)
        return;
    *dst = *src;
    fx_buffer_ref(src->buffer);
}

static const fx_tensor *opt(const fx_tensor *t) { return t && t->buffer ? t : NULL; }

void fx_linear_ctx_free(fx_linear_ctx *ctx)
{
    if (!ctx)
        return;
    fx_tensor *all[] = {&ctx->x, &ctx->w, &ctx->bias, &ctx->y, &ctx->pre};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    free(ctx);
}

size_t fx_linear_ctx_saved_bytes(const fx_linear_ctx *ctx) { return ctx->pre.nbytes; }

int fx_op_linear_forward(const fx_linear_inputs *in, fx_tensor *y, fx_linear_ctx **ctx_out, fx_status *st)
{
    memset(y, 0, sizeof *y);
    if (ctx_out)
        *ctx_out = NULL;
    fx_linear_dims n;
    if (fx_linear_check(in, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    int64_t dims[FX_MAX_RANK];
    const int rank = fx_linear_output_shape(in->x, n.out, dims);
    fx_linear_ctx *ctx = NULL;
    if (fx_tensor_alloc(dev, in->x->dtype, rank, dims, y, st))
        return st->code;
    if (ctx_out) {
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) {
            fx_fail(st, FX_ENOMEM, "out of host memory for a linear context");
            goto fail;
        }
        ctx->n = n;
        ctx->activation = in->activation;
        ctx->allow_tf32 = in->allow_tf32;
        keep(&ctx->x, in->x);
        keep(&ctx->w, in->w);
        keep(&ctx->bias, in->bias);
        if (fx_linear_reads_pre(in->activation) &&
            fx_tensor_alloc(dev, in->x->dtype, rank, dims, &ctx->pre, st))
            goto fail;
    }
    if (fx_op_linear_forward_into(NULL, in, y, ctx ? opt(&ctx->pre) : NULL, st))
        goto fail;
    if (ctx) {
        if (fx_linear_reads_output(in->activation))
            keep(&ctx->y, y);
        *ctx_out = ctx;
    }
    return FX_OK;
fail:
    fx_tensor_release(y);
    fx_linear_ctx_free(ctx);
    return st->code;
}

void fx_linear_grads_release(fx_linear_grads *g)
{
    fx_tensor_release(&g->dx);
    fx_tensor_release(&g->dw);
    fx_tensor_release(&g->dbias);
}

static int alloc_like(const fx_tensor *t, fx_tensor *out, fx_status *st)
{
    memset(out, 0, sizeof *out);
    if (!t->buffer)
        return FX_OK;
    return fx_tensor_alloc(t->device, t->dtype, t->rank, t->dims, out, st);
}

int fx_op_linear_backward(const fx_linear_ctx *ctx, const fx_tensor *dy, fx_linear_grads *g, fx_status *st)
{
    memset(g, 0, sizeof *g);
    const fx_linear_inputs in = {.x = &ctx->x, .w = &ctx->w, .bias = opt(&ctx->bias), .activation = ctx->activation,
                                 .allow_tf32 = ctx->allow_tf32};
    int64_t dims[FX_MAX_RANK];
    const int rank = fx_linear_output_shape(&ctx->x, ctx->n.out, dims);
    /* the caller's tensor first, before anything is allocated */
    if (expect_linear(st, ctx->x.device, true) || expect_like(st, "dy", dy, &ctx->x, ctx->x.dtype, rank, dims, LAYOUT_Y))
        return st->code;
    if (alloc_like(&ctx->x, &g->dx, st) || alloc_like(&ctx->w, &g->dw, st) || alloc_like(&ctx->bias, &g->dbias, st))
        goto fail;
    const fx_linear_grad_outs outs = {.dx = &g->dx, .dw = &g->dw, .dbias = opt(&g->dbias)};
    if (fx_op_linear_backward_into(NULL, &in, opt(&ctx->y), opt(&ctx->pre), dy, &outs, st))
        goto fail;
    return FX_OK;
fail:
    fx_linear_grads_release(g);
    return st->code;
}
