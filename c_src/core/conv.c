#include "core/conv.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/ops.h"
#include "fusex_dtype.h"

#define LAYOUT_X "[batch, seqlen, dim]"
#define LAYOUT_W "[dim, width]"
#define LAYOUT_CH "[dim]"
#define LAYOUT_STATE "[batch, dim, width - 1]"
#define LAYOUT_STEP "[batch, dim]"

static bool on_cpu(const fx_tensor *t) { return t->device->kind == FX_DEVICE_CPU; }

static const struct fx_conv_ops *conv_ops(const fx_device *dev) { return dev->backend->conv; }

static int expect_conv(fx_status *st, const fx_device *dev, const char *what)
{
    const struct fx_conv_ops *ops = conv_ops(dev);
    const void *fn = NULL;
    if (ops)
        fn = strcmp(what, "causal_conv1d_step") == 0       ? (const void *)ops->step
             : strcmp(what, "causal_conv1d_backward") == 0 ? (const void *)ops->backward
                                                           : (const void *)ops->forward;
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

/* w [dim, width] (width 1 to FX_CONV_MAX_WIDTH), bias [dim], activation:
 * what forward and step share. Fills n->width. */
static int check_params(const fx_conv_inputs *in, int64_t dim, fx_conv_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x, *w = in->w;
    if (fx_expect_same_device(st, "w", w, x->device, "x") || fx_expect_float(st, "w", w, on_cpu(w)) ||
        fx_expect_rank(st, "w", w, 2, LAYOUT_W))
        return st->code;
    const int64_t wdims[2] = {dim, w->dims[1]};
    if (fx_expect_shape(st, "w", w, 2, wdims, LAYOUT_W))
        return st->code;
    if (w->dims[1] < 1 || w->dims[1] > FX_CONV_MAX_WIDTH)
        return fx_fail(st, FX_EBADARG, "w: expected a width of 1 to %d " LAYOUT_W ", got shape {%lld,%lld}",
                       FX_CONV_MAX_WIDTH, (long long)w->dims[0], (long long)w->dims[1]);
    n->width = w->dims[1];
    const int64_t ch[1] = {dim};
    if (in->bias && (fx_expect_same_device(st, "bias", in->bias, x->device, "x") ||
                     fx_expect_float(st, "bias", in->bias, on_cpu(in->bias)) ||
                     fx_expect_shape(st, "bias", in->bias, 1, ch, LAYOUT_CH)))
        return st->code;
    if (in->activation != FX_ACT_NONE && in->activation != FX_ACT_SILU)
        return fx_fail(st, FX_EBADARG, "activation: expected none or silu, got %s", fx_activation_name(in->activation));
    return FX_OK;
}

static void state_dims(const fx_conv_dims *n, int64_t dims[3])
{
    dims[0] = n->batch;
    dims[1] = n->dim;
    dims[2] = n->width - 1;
}

int fx_conv_check(const fx_conv_inputs *in, fx_conv_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x;
    memset(n, 0, sizeof *n);
    if (fx_expect_float(st, "x", x, on_cpu(x)) || fx_expect_rank(st, "x", x, 3, LAYOUT_X) ||
        expect_conv(st, x->device, "causal_conv1d"))
        return st->code;
    n->batch = x->dims[0];
    n->seqlen = x->dims[1];
    n->dim = x->dims[2];
    if (check_params(in, n->dim, n, st))
        return st->code;
    int64_t sd[3];
    state_dims(n, sd);
    if (in->initial_state && expect_like(st, "initial_state", in->initial_state, x, x->dtype, 3, sd, LAYOUT_STATE))
        return st->code;
    return FX_OK;
}

int fx_conv_check_step(const fx_tensor *state, const fx_conv_inputs *in, fx_conv_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x;
    memset(n, 0, sizeof *n);
    if (fx_expect_float(st, "x", x, on_cpu(x)) || fx_expect_rank(st, "x", x, 2, LAYOUT_STEP) ||
        expect_conv(st, x->device, "causal_conv1d_step"))
        return st->code;
    n->batch = x->dims[0];
    n->seqlen = 1;
    n->dim = x->dims[1];
    if (in->initial_state)
        return fx_fail(st, FX_EBADARG, "initial_state: expected none (a step's state is `state`), got a tensor");
    if (check_params(in, n->dim, n, st))
        return st->code;
    int64_t sd[3];
    state_dims(n, sd);
    if (expect_like(st, "state", state, x, x->dtype, 3, sd, LAYOUT_STATE))
        return st->code;
    /* the state is written in place while these are read (tensors without
     * an address, shapes only, have nothing to overlap) */
    const char *names[] = {"x", "w", "bias"};
    const fx_tensor *read[] = {in->x, in->w, in->bias};
    for (size_t i = 0; i < sizeof read / sizeof read[0]; i++)
        if (state->data && read[i] && read[i]->data && fx_expect_apart(st, "state", state, names[i], read[i]))
            return st->code;
    return FX_OK;
}

static int check_forward(const fx_conv_inputs *in, const fx_tensor *y, const fx_tensor *final_state, fx_conv_dims *n,
                         fx_status *st)
{
    if (fx_conv_check(in, n, st))
        return st->code;
    const fx_tensor *x = in->x;
    int64_t sd[3];
    state_dims(n, sd);
    if (expect_like(st, "y", y, x, x->dtype, 3, x->dims, LAYOUT_X) ||
        (final_state && expect_like(st, "final_state", final_state, x, x->dtype, 3, sd, LAYOUT_STATE)))
        return st->code;
    return FX_OK;
}

static fx_conv_fwd_args fwd_args(const fx_conv_inputs *in, const fx_conv_dims *n, const fx_tensor *y,
                                 const fx_tensor *final_state)
{
    fx_conv_fwd_args a = {
        .n = *n, .x = in->x, .w = in->w, .bias = in->bias, .initial_state = in->initial_state,
        .activation = in->activation, .y = y, .final_state = final_state,
    };
    return a;
}

int fx_op_conv_forward_into(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *y,
                            const fx_tensor *final_state, fx_status *st)
{
    fx_conv_dims n;
    if (check_forward(in, y, final_state, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.batch == 0 || n.dim == 0) /* every output is empty */
        return FX_OK;
    if (n.seqlen == 0) /* y is empty; the final state is the initial one */
        return final_state ? fx_op_cast_or_zero(ex, in->initial_state, final_state, st) : FX_OK;
    const fx_conv_fwd_args a = fwd_args(in, &n, y, final_state);
    return conv_ops(dev)->forward(ex, &a, st);
}

size_t fx_op_conv_forward_scratch(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *y,
                                  const fx_tensor *final_state)
{
    fx_status st;
    fx_status_clear(&st);
    fx_conv_dims n;
    if (check_forward(in, y, final_state, &n, &st) || n.batch == 0 || n.dim == 0 || n.seqlen == 0)
        return 0;
    const fx_conv_fwd_args a = fwd_args(in, &n, y, final_state);
    return conv_ops(in->x->device)->forward_scratch(ex, &a);
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

int fx_conv_check_backward(const fx_conv_inputs *in, const fx_tensor *dy, const fx_tensor *dfinal_state,
                           fx_conv_dims *n, fx_status *st)
{
    if (fx_conv_check(in, n, st) || expect_conv(st, in->x->device, "causal_conv1d_backward"))
        return st->code;
    const fx_tensor *x = in->x;
    int64_t sd[3];
    state_dims(n, sd);
    if (expect_like(st, "dy", dy, x, x->dtype, 3, x->dims, LAYOUT_X) ||
        (dfinal_state && expect_like(st, "dfinal_state", dfinal_state, x, x->dtype, 3, sd, LAYOUT_STATE)))
        return st->code;
    return FX_OK;
}

static int check_backward(const fx_conv_inputs *in, const fx_tensor *dy, const fx_tensor *dfinal_state,
                          const fx_conv_grad_outs *g, fx_conv_dims *n, fx_status *st)
{
    if (fx_conv_check_backward(in, dy, dfinal_state, n, st))
        return st->code;
    const fx_tensor *x = in->x;
    if (expect_grad(st, "dx", g->dx, x, x, LAYOUT_X) || expect_grad(st, "dw", g->dw, in->w, x, LAYOUT_W) ||
        expect_grad(st, "dbias", g->dbias, in->bias, x, LAYOUT_CH) ||
        expect_grad(st, "dinitial_state", g->dinitial_state, in->initial_state, x, LAYOUT_STATE))
        return st->code;
    return FX_OK;
}

static fx_conv_bwd_args bwd_args(const fx_conv_inputs *in, const fx_conv_dims *n, const fx_tensor *dy,
                                 const fx_tensor *dfinal_state, const fx_conv_grad_outs *g)
{
    fx_conv_bwd_args a = {
        .fwd = fwd_args(in, n, NULL, NULL), .dy = dy, .dfinal_state = dfinal_state, .dx = g->dx, .dw = g->dw,
        .dbias = g->dbias, .dinitial_state = g->dinitial_state,
    };
    return a;
}

int fx_op_conv_backward_into(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *dy,
                             const fx_tensor *dfinal_state, const fx_conv_grad_outs *g, fx_status *st)
{
    fx_conv_dims n;
    if (check_backward(in, dy, dfinal_state, g, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.batch == 0 || n.dim == 0 || n.seqlen == 0) {
        /* no step ran: dw and dbias are zero; the initial state went
         * straight to the final state (seqlen 0) */
        if (fx_op_fill_zero(ex, g->dw, st) || fx_op_fill_zero(ex, g->dbias, st))
            return st->code;
        return g->dinitial_state ? fx_op_cast_or_zero(ex, dfinal_state, g->dinitial_state, st) : FX_OK;
    }
    const fx_conv_bwd_args a = bwd_args(in, &n, dy, dfinal_state, g);
    return conv_ops(dev)->backward(ex, &a, st);
}

size_t fx_op_conv_backward_scratch(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *dy,
                                   const fx_tensor *dfinal_state, const fx_conv_grad_outs *g)
{
    fx_status st;
    fx_status_clear(&st);
    fx_conv_dims n;
    if (check_backward(in, dy, dfinal_state, g, &n, &st) || n.batch == 0 || n.dim == 0 || n.seqlen == 0)
        return 0;
    const fx_conv_bwd_args a = bwd_args(in, &n, dy, dfinal_state, g);
    return conv_ops(in->x->device)->backward_scratch(ex, &a);
}

int fx_op_conv_step_into(const fx_exec *ex, const fx_tensor *state, const fx_conv_inputs *in, const fx_tensor *y,
                         fx_status *st)
{
    fx_conv_dims n;
    if (fx_conv_check_step(state, in, &n, st) ||
        expect_like(st, "y", y, in->x, in->x->dtype, 2, in->x->dims, LAYOUT_STEP))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.batch == 0 || n.dim == 0)
        return FX_OK;
    const fx_conv_step_args a = {
        .n = n, .state = state, .x = in->x, .w = in->w, .bias = in->bias, .activation = in->activation, .y = y,
    };
    return conv_ops(dev)->step(ex, &a, st);
}

/* ---- contexts and the allocating forms ---- */

static void keep(fx_tensor *dst, const fx_tensor *src)
{
    memset(dst, 0, sizeof *dst);
    if (!src)
        return;
    *dst = *src;
    fx_buffer_ref(src->buffer);
}

static const fx_tensor *opt(const fx_tensor *t) { return t && t->buffer ? t : NULL; }

void fx_conv_ctx_free(fx_conv_ctx *ctx)
{
    if (!ctx)
        return;
    fx_tensor *all[] = {&ctx->x, &ctx->w, &ctx->bias, &ctx->initial_state};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    free(ctx);
}

int fx_op_conv_forward(const fx_conv_inputs *in, bool return_state, fx_tensor *y, fx_tensor *final_state,
                       fx_conv_ctx **ctx_out, fx_status *st)
{
    memset(y, 0, sizeof *y);
    memset(final_state, 0, sizeof *final_state);
    if (ctx_out)
        *ctx_out = NULL;
    fx_conv_dims n;
    if (fx_conv_check(in, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    int64_t sd[3];
    state_dims(&n, sd);
    fx_conv_ctx *ctx = NULL;
    if (fx_tensor_alloc(dev, in->x->dtype, 3, in->x->dims, y, st) ||
        (return_state && fx_tensor_alloc(dev, in->x->dtype, 3, sd, final_state, st)))
        goto fail;
    if (ctx_out) {
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) {
            fx_fail(st, FX_ENOMEM, "out of host memory for a causal_conv1d context");
            goto fail;
        }
        ctx->n = n;
        ctx->activation = in->activation;
        keep(&ctx->x, in->x);
        keep(&ctx->w, in->w);
        keep(&ctx->bias, in->bias);
        keep(&ctx->initial_state, in->initial_state);
    }
    if (fx_op_conv_forward_into(NULL, in, y, return_state ? final_state : NULL, st))
        goto fail;
    if (ctx_out)
        *ctx_out = ctx;
    return FX_OK;
fail:
    fx_tensor_release(y);
    fx_tensor_release(final_state);
    fx_conv_ctx_free(ctx);
    return st->code;
}

void fx_conv_grads_release(fx_conv_grads *g)
{
    fx_tensor *all[] = {&g->dx, &g->dw, &g->dbias, &g->dinitial_state};
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

int fx_op_conv_backward(const fx_conv_ctx *ctx, const fx_tensor *dy, const fx_tensor *dfinal_state,
                        fx_conv_grads *g, fx_status *st)
{
    memset(g, 0, sizeof *g);
    const fx_conv_inputs in = {.x = &ctx->x, .w = &ctx->w, .bias = opt(&ctx->bias),
                               .initial_state = opt(&ctx->initial_state), .activation = ctx->activation};
    const fx_tensor *x = &ctx->x;
    int64_t sd[3];
    state_dims(&ctx->n, sd);
    /* the caller's tensors first, before anything is allocated */
    if (expect_conv(st, x->device, "causal_conv1d_backward") ||
        expect_like(st, "dy", dy, x, x->dtype, 3, x->dims, LAYOUT_X) ||
        (dfinal_state && expect_like(st, "dfinal_state", dfinal_state, x, x->dtype, 3, sd, LAYOUT_STATE)))
        return st->code;
    if (alloc_like(&ctx->x, &g->dx, st) || alloc_like(&ctx->w, &g->dw, st) || alloc_like(&ctx->bias, &g->dbias, st) ||
        alloc_like(&ctx->initial_state, &g->dinitial_state, st))
        goto fail;
    const fx_conv_grad_outs outs = {.dx = &g->dx, .dw = &g->dw, .dbias = opt(&g->dbias),
                                    .dinitial_state = opt(&g->dinitial_state)};
    if (fx_op_conv_backward_into(NULL, &in, dy, dfinal_state, &outs, st))
        goto fail;
    return FX_OK;
fail:
    fx_conv_grads_release(g);
    return st->code;
}

int fx_op_conv_step(const fx_tensor *state, const fx_conv_inputs *in, fx_tensor *y, fx_status *st)
{
    memset(y, 0, sizeof *y);
    fx_conv_dims n;
    if (fx_conv_check_step(state, in, &n, st))
        return st->code;
    if (fx_tensor_alloc(in->x->device, in->x->dtype, 2, in->x->dims, y, st) || fx_op_conv_step_into(NULL, state, in, y, st))
        fx_tensor_release(y);
    return st->code;
}
