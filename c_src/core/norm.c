#include "core/norm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/ops.h"
#include "fusex_dtype.h"

#define LAYOUT_X "[..., hidden]"
#define LAYOUT_H "[hidden]"
#define LAYOUT_ROWS "[rows]"

static bool on_cpu(const fx_tensor *t) { return t->device->kind == FX_DEVICE_CPU; }

static const struct fx_norm_ops *norm_ops(const fx_device *dev) { return dev->backend->norm; }

const char *fx_norm_name(int kind) { return kind == FX_NORM_LAYER ? "layer_norm" : "rms_norm"; }

static int expect_norm(fx_status *st, const fx_device *dev, int kind, bool backward)
{
    const struct fx_norm_ops *ops = norm_ops(dev);
    const void *fn = ops ? (backward ? (const void *)ops->backward : (const void *)ops->forward) : NULL;
    char what[40];
    snprintf(what, sizeof what, "%s%s", fx_norm_name(kind), backward ? "_backward" : "");
    return fx_expect_op(st, dev, fn, what);
}

static int expect_like(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, fx_dtype dtype, int rank,
                       const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_dtype(st, arg, t, dtype) ||
        fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

/* weight and bias: any float type the device takes, [hidden]. */
static int expect_param(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, int64_t hidden)
{
    const int64_t dims[1] = {hidden};
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_float(st, arg, t, on_cpu(t)) ||
        fx_expect_shape(st, arg, t, 1, dims, LAYOUT_H))
        return st->code;
    return FX_OK;
}

fx_dtype fx_norm_stat_type(fx_dtype x_type) { return x_type == FX_F64 ? FX_F64 : FX_F32; }

fx_dtype fx_norm_residual_out_type(const fx_norm_inputs *in)
{
    return in->residual_in_f32 ? FX_F32 : in->residual->dtype;
}

int fx_norm_check(const fx_norm_inputs *in, fx_norm_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x;
    memset(n, 0, sizeof *n);
    if (in->kind != FX_NORM_RMS && in->kind != FX_NORM_LAYER)
        return fx_fail(st, FX_EBADARG, "kind: expected rms (0) or layer (1), got %d", in->kind);
    if (fx_expect_float(st, "x", x, on_cpu(x)))
        return st->code;
    char got[160];
    fx_format_shape(got, sizeof got, x->rank, x->dims);
    if (x->rank < 1)
        return fx_fail(st, FX_EBADARG, "x: expected rank >= 1 " LAYOUT_X ", got rank 0 shape %s", got);
    if (expect_norm(st, x->device, in->kind, false))
        return st->code;
    n->hidden = x->dims[x->rank - 1];
    if (n->hidden < 1)
        return fx_fail(st, FX_EBADARG, "x: expected hidden >= 1 " LAYOUT_X ", got shape %s", got);
    if (fx_shape_numel("x", x->rank - 1, x->dims, &n->rows, st))
        return st->code;
    if (expect_param(st, "weight", in->weight, x, n->hidden) ||
        (in->bias && expect_param(st, "bias", in->bias, x, n->hidden)))
        return st->code;
    if (in->residual) {
        const fx_tensor *r = in->residual;
        if (fx_expect_same_device(st, "residual", r, x->device, "x"))
            return st->code;
        if (r->dtype != x->dtype && r->dtype != FX_F32) {
            if (x->dtype == FX_F32)
                return fx_expect_dtype(st, "residual", r, FX_F32);
            return fx_fail(st, FX_EBADARG, "residual: expected type %s (x's) or {f,32}, got %s", fx_dtype_name(x->dtype),
                           fx_dtype_name(r->dtype));
        }
        if (fx_expect_shape(st, "residual", r, x->rank, x->dims, LAYOUT_X))
            return st->code;
    }
    if (in->gate && expect_like(st, "gate", in->gate, x, x->dtype, x->rank, x->dims, LAYOUT_X))
        return st->code;
    if (!isfinite(in->eps) || in->eps < 0)
        return fx_fail(st, FX_EBADARG, "eps: expected a finite number >= 0, got %g", in->eps);
    return FX_OK;
}

/* A tensor given exactly where `wanted`, else a message saying why. */
static int expect_presence(fx_status *st, const char *arg, const fx_tensor *t, bool wanted, const char *why_wanted,
                           const char *why_not)
{
    if (wanted && !t)
        return fx_fail(st, FX_EBADARG, "%s: expected a tensor (%s), got none", arg, why_wanted);
    if (!wanted && t)
        return fx_fail(st, FX_EBADARG, "%s: expected none (%s), got a tensor", arg, why_not);
    return FX_OK;
}

static int expect_stat(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, const fx_norm_dims *n)
{
    const int64_t dims[1] = {n->rows};
    return expect_like(st, arg, t, x, fx_norm_stat_type(x->dtype), 1, dims, LAYOUT_ROWS);
}

static int expect_residual_out(fx_status *st, const char *arg, const fx_norm_inputs *in, const fx_tensor *t)
{
    if (expect_presence(st, arg, t, in->residual != NULL, "a residual is given", "no residual is given"))
        return st->code;
    return t ? expect_like(st, arg, t, in->x, fx_norm_residual_out_type(in), in->x->rank, in->x->dims, LAYOUT_X)
             : FX_OK;
}

static int check_forward(const fx_norm_inputs *in, const fx_tensor *y, const fx_tensor *residual_out,
                         const fx_tensor *mean, const fx_tensor *rstd, fx_norm_dims *n, fx_status *st)
{
    if (fx_norm_check(in, n, st))
        return st->code;
    const fx_tensor *x = in->x;
    if (expect_like(st, "y", y, x, x->dtype, x->rank, x->dims, LAYOUT_X) ||
        expect_residual_out(st, "s", in, residual_out))
        return st->code;
    if (in->kind == FX_NORM_RMS && mean)
        return fx_fail(st, FX_EBADARG, "mean: expected none (rms_norm keeps no mean), got a tensor");
    if ((mean && expect_stat(st, "mean", mean, x, n)) || (rstd && expect_stat(st, "rstd", rstd, x, n)))
        return st->code;
    return FX_OK;
}

static fx_norm_fwd_args fwd_args(const fx_norm_inputs *in, const fx_norm_dims *n, const fx_tensor *y,
                                 const fx_tensor *residual_out, const fx_tensor *mean, const fx_tensor *rstd)
{
    fx_norm_fwd_args a = {
        .n = *n, .kind = in->kind, .eps = in->eps, .x = in->x, .weight = in->weight, .bias = in->bias,
        .residual = in->residual, .gate = in->gate, .y = y, .residual_out = residual_out, .mean = mean, .rstd = rstd,
    };
    return a;
}

int fx_op_norm_forward_into(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *y,
                            const fx_tensor *residual_out, const fx_tensor *mean, const fx_tensor *rstd,
                            fx_status *st)
{
    fx_norm_dims n;
    if (check_forward(in, y, residual_out, mean, rstd, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.rows == 0) /* every output is empty */
        return FX_OK;
    const fx_norm_fwd_args a = fwd_args(in, &n, y, residual_out, mean, rstd);
    return norm_ops(dev)->forward(ex, &a, st);
}

size_t fx_op_norm_forward_scratch(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *y,
                                  const fx_tensor *residual_out, const fx_tensor *mean, const fx_tensor *rstd)
{
    fx_status st;
    fx_status_clear(&st);
    fx_norm_dims n;
    if (check_forward(in, y, residual_out, mean, rstd, &n, &st) || n.rows == 0)
        return 0;
    const fx_norm_fwd_args a = fwd_args(in, &n, y, residual_out, mean, rstd);
    return norm_ops(in->x->device)->forward_scratch(ex, &a);
}

static int expect_grad(fx_status *st, const char *arg, const fx_tensor *grad, const fx_tensor *input,
                       const fx_tensor *x, const char *layout)
{
    if (!input != !grad)
        return fx_fail(st, FX_EBADARG, "%s: expected %s, got %s", arg,
                       input ? "a gradient tensor (its input was given)" : "none (its input was not given)",
                       grad ? "a tensor" : "none");
    return input ? expect_like(st, arg, grad, x, input->dtype, input->rank, input->dims, layout) : FX_OK;
}

int fx_norm_check_backward(const fx_norm_inputs *in, const fx_tensor *residual_out, const fx_tensor *mean,
                           const fx_tensor *rstd, const fx_tensor *dy, const fx_tensor *dresidual_out,
                           fx_norm_dims *n, fx_status *st)
{
    if (fx_norm_check(in, n, st) || expect_norm(st, in->x->device, in->kind, true))
        return st->code;
    const fx_tensor *x = in->x;
    const bool layer = in->kind == FX_NORM_LAYER;
    if (expect_residual_out(st, "s", in, residual_out) ||
        expect_presence(st, "mean", mean, layer, "the forward's statistics [rows]", "rms_norm keeps no mean") ||
        expect_presence(st, "rstd", rstd, true, "the forward's statistics [rows]", "") ||
        (mean && expect_stat(st, "mean", mean, x, n)) || expect_stat(st, "rstd", rstd, x, n) ||
        expect_like(st, "dy", dy, x, x->dtype, x->rank, x->dims, LAYOUT_X))
        return st->code;
    if (dresidual_out) {
        if (!in->residual)
            return fx_fail(st, FX_EBADARG, "ds: expected none (no residual was given), got a tensor");
        if (expect_like(st, "ds", dresidual_out, x, fx_norm_residual_out_type(in), x->rank, x->dims,
                        LAYOUT_X))
            return st->code;
    }
    return FX_OK;
}

static int check_backward(const fx_norm_inputs *in, const fx_tensor *residual_out, const fx_tensor *mean,
                          const fx_tensor *rstd, const fx_tensor *dy, const fx_tensor *dresidual_out,
                          const fx_norm_grad_outs *g, fx_norm_dims *n, fx_status *st)
{
    if (fx_norm_check_backward(in, residual_out, mean, rstd, dy, dresidual_out, n, st))
        return st->code;
    const fx_tensor *x = in->x;
    if (expect_grad(st, "dx", g->dx, x, x, LAYOUT_X) || expect_grad(st, "dweight", g->dweight, in->weight, x, LAYOUT_H) ||
        expect_grad(st, "dbias", g->dbias, in->bias, x, LAYOUT_H) ||
        expect_grad(st, "dresidual", g->dresidual, in->residual, x, LAYOUT_X) ||
        expect_grad(st, "dgate", g->dgate, in->gate, x, LAYOUT_X))
        return st->code;
    return FX_OK;
}

static fx_norm_bwd_args bwd_args(const fx_norm_inputs *in, const fx_norm_dims *n, const fx_tensor *residual_out,
                                 const fx_tensor *mean, const fx_tensor *rstd, const fx_tensor *dy,
                                 const fx_tensor *dresidual_out, const fx_norm_grad_outs *g)
{
    fx_norm_bwd_args a = {
        .n = *n, .kind = in->kind, .eps = in->eps, .xs = in->residual ? residual_out : in->x,
        .weight = in->weight, .bias = in->bias, .gate = in->gate, .mean = mean, .rstd = rstd, .dy = dy,
        .dresidual_out = dresidual_out, .dx = g->dx, .dweight = g->dweight, .dbias = g->dbias,
        .dresidual = g->dresidual, .dgate = g->dgate,
    };
    return a;
}

int fx_op_norm_backward_into(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *residual_out,
                             const fx_tensor *mean, const fx_tensor *rstd, const fx_tensor *dy,
                             const fx_tensor *dresidual_out, const fx_norm_grad_outs *g, fx_status *st)
{
    fx_norm_dims n;
    if (check_backward(in, residual_out, mean, rstd, dy, dresidual_out, g, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.rows == 0) /* nothing flowed back: the weights' gradients are zero, the rest empty */
        return fx_op_fill_zero(ex, g->dweight, st) || fx_op_fill_zero(ex, g->dbias, st) ? st->code : FX_OK;
    const fx_norm_bwd_args a = bwd_args(in, &n, residual_out, mean, rstd, dy, dresidual_out, g);
    return norm_ops(dev)->backward(ex, &a, st);
}

size_t fx_op_norm_backward_scratch(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *residual_out,
                                   const fx_tensor *mean, const fx_tensor *rstd, const fx_tensor *dy,
                                   const fx_tensor *dresidual_out, const fx_norm_grad_outs *g)
{
    fx_status st;
    fx_status_clear(&st);
    fx_norm_dims n;
    if (check_backward(in, residual_out, mean, rstd, dy, dresidual_out, g, &n, &st) || n.rows == 0)
        return 0;
    const fx_norm_bwd_args a = bwd_args(in, &n, residual_out, mean, rstd, dy, dresidual_out, g);
    return norm_ops(in->x->device)->backward_scratch(ex, &a);
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

void fx_norm_ctx_free(fx_norm_ctx *ctx)
{
    if (!ctx)
        return;
    fx_tensor *all[] = {&ctx->x,    &ctx->weight,       &ctx->bias, &ctx->residual,
                        &ctx->gate, &ctx->residual_out, &ctx->mean, &ctx->rstd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    free(ctx);
}

size_t fx_norm_ctx_saved_bytes(const fx_norm_ctx *ctx) { return ctx->mean.nbytes + ctx->rstd.nbytes; }

int fx_op_norm_forward(const fx_norm_inputs *in, fx_tensor *y, fx_tensor *residual_out, fx_norm_ctx **ctx_out,
                       fx_status *st)
{
    memset(y, 0, sizeof *y);
    memset(residual_out, 0, sizeof *residual_out);
    if (ctx_out)
        *ctx_out = NULL;
    fx_norm_dims n;
    if (fx_norm_check(in, &n, st))
        return st->code;
    const fx_tensor *x = in->x;
    fx_device *dev = x->device;
    fx_norm_ctx *ctx = NULL;
    if (fx_tensor_alloc(dev, x->dtype, x->rank, x->dims, y, st) ||
        (in->residual && fx_tensor_alloc(dev, fx_norm_residual_out_type(in), x->rank, x->dims, residual_out, st)))
        goto fail;
    if (ctx_out) {
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) {
            fx_fail(st, FX_ENOMEM, "out of host memory for a %s context", fx_norm_name(in->kind));
            goto fail;
        }
        ctx->n = n;
        ctx->kind = in->kind;
        ctx->eps = in->eps;
        ctx->residual_in_f32 = in->residual_in_f32;
        keep(&ctx->x, x);
        keep(&ctx->weight, in->weight);
        keep(&ctx->bias, in->bias);
        keep(&ctx->residual, in->residual);
        keep(&ctx->gate, in->gate);
        const int64_t rows[1] = {n.rows};
        const fx_dtype stat = fx_norm_stat_type(x->dtype);
        if ((in->kind == FX_NORM_LAYER && fx_tensor_alloc(dev, stat, 1, rows, &ctx->mean, st)) ||
            fx_tensor_alloc(dev, stat, 1, rows, &ctx->rstd, st))
            goto fail;
    }
    if (fx_op_norm_forward_into(NULL, in, y, opt(residual_out), ctx ? opt(&ctx->mean) : NULL,
                                ctx ? opt(&ctx->rstd) : NULL, st))
        goto fail;
    if (ctx) {
        keep(&ctx->residual_out, opt(residual_out));
        *ctx_out = ctx;
    }
    return FX_OK;
fail:
    fx_tensor_release(y);
    fx_tensor_release(residual_out);
    fx_norm_ctx_free(ctx);
    return st->code;
}

void fx_norm_grads_release(fx_norm_grads *g)
{
    fx_tensor *all[] = {&g->dx, &g->dweight, &g->dbias, &g->dresidual, &g->dgate};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
}

static int alloc_like(const fx_tensor *t, fx_tensor *out, fx_status *st)
{
    memset(out, 0, sizeof *out);
    if (!t->buffer)
        return FX_OK;
    return fx_tensor_alloc(t->device, t->dtype, t->rank, t->dims, out, st);
}

int fx_op_norm_backward(const fx_norm_ctx *ctx, const fx_tensor *dy, const fx_tensor *dresidual_out,
                        fx_norm_grads *g, fx_status *st)
{
    memset(g, 0, sizeof *g);
    const fx_norm_inputs in = {
        .kind = ctx->kind, .eps = ctx->eps, .x = &ctx->x, .weight = &ctx->weight, .bias = opt(&ctx->bias),
        .residual = opt(&ctx->residual), .gate = opt(&ctx->gate), .residual_in_f32 = ctx->residual_in_f32,
    };
    const fx_tensor *x = &ctx->x;
    /* the caller's tensors first, before anything is allocated */
    if (expect_norm(st, x->device, ctx->kind, true) || expect_like(st, "dy", dy, x, x->dtype, x->rank, x->dims, LAYOUT_X))
        return st->code;
    if (alloc_like(&ctx->x, &g->dx, st) || alloc_like(&ctx->weight, &g->dweight, st) ||
        alloc_like(&ctx->bias, &g->dbias, st) || alloc_like(&ctx->residual, &g->dresidual, st) ||
        alloc_like(&ctx->gate, &g->dgate, st))
        goto fail;
    const fx_norm_grad_outs outs = {
        .dx = &g->dx, .dweight = &g->dweight, .dbias = opt(&g->dbias), .dresidual = opt(&g->dresidual),
        .dgate = opt(&g->dgate),
    };
    if (fx_op_norm_backward_into(NULL, &in, opt(&ctx->residual_out), opt(&ctx->mean), opt(&ctx->rstd), dy,
                                 dresidual_out, &outs, st))
        goto fail;
    return FX_OK;
fail:
    fx_norm_grads_release(g);
    return st->code;
}
