#include "core/rnn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/ops.h"
#include "fusex_dtype.h"

#define LAYOUT_X "[batch, seqlen, input]"
#define LAYOUT_Y "[batch, seqlen, hidden]"
#define LAYOUT_STATE "[layers, batch, hidden]"
#define LAYOUT_SAVED "([layers, batch, seqlen, saved width], what a training forward keeps)"

const char *fx_rnn_cell_name(int cell)
{
    switch (cell) {
    case FX_RNN_GRU: return "gru";
    case FX_RNN_LSTM: return "lstm";
    default: return NULL;
    }
}

fx_dtype fx_rnn_state_type(fx_dtype x_type) { return x_type == FX_F64 ? FX_F64 : FX_F32; }

static bool on_cpu(const fx_tensor *t) { return t->device->kind == FX_DEVICE_CPU; }

static const struct fx_rnn_ops *rnn_ops(const fx_device *dev) { return dev->backend->rnn; }

typedef enum { OP_FORWARD, OP_BACKWARD, OP_STEP } op_kind;

static int expect_rnn(fx_status *st, const fx_device *dev, int cell, op_kind op)
{
    const struct fx_rnn_ops *ops = rnn_ops(dev);
    const void *fn = !ops                ? NULL
                     : op == OP_STEP     ? (const void *)ops->step
                     : op == OP_BACKWARD ? (const void *)ops->backward
                                         : (const void *)ops->forward;
    char what[32];
    snprintf(what, sizeof what, "%s%s", fx_rnn_cell_name(cell),
             op == OP_STEP ? "_step" : op == OP_BACKWARD ? "_backward" : "");
    return fx_expect_op(st, dev, fn, what);
}

/* A shape's layout in a message: "{15,5} ([3*hidden, hidden])". */
static int expect_shape(fx_status *st, const char *arg, const fx_tensor *t, int rank, const int64_t *dims,
                        const char *layout)
{
    char text[96];
    snprintf(text, sizeof text, layout[0] == '(' ? "%s" : "(%s)", layout);
    return fx_expect_shape(st, arg, t, rank, dims, text);
}

/* A tensor of x's device with `dtype` and the given shape. */
static int expect_typed(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, fx_dtype dtype,
                        int rank, const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_dtype(st, arg, t, dtype) ||
        expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

/* A tensor read once per gate or state (biases, h0, c0, the final states'
 * gradients): any float type of x's device, the given shape. */
static int expect_any_float(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, int rank,
                            const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_float(st, arg, t, on_cpu(t)) ||
        expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

static int expect_absent(fx_status *st, const char *arg, const fx_tensor *t, int cell)
{
    if (!t)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected no tensor for a %s (it has no cell state), got one", arg,
                   fx_rnn_cell_name(cell));
}

/* The layers' parameters: fixes hidden from layers[0].w_hh, then checks
 * every layer against it (w_ih's columns: `input` for layer 0, hidden
 * above). */
static int check_layers(const fx_rnn_inputs *in, fx_rnn_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x;
    const int gates = fx_rnn_gates(in->cell);
    char arg[48], layout[48];
    const fx_tensor *w_hh0 = in->layer[0].w_hh;
    snprintf(layout, sizeof layout, "[%d*hidden, hidden]", gates);
    if (!w_hh0)
        return fx_fail(st, FX_EBADARG, "layers[0].w_hh: expected a tensor %s, got none", layout);
    if (fx_expect_same_device(st, "layers[0].w_hh", w_hh0, x->device, "x") ||
        fx_expect_dtype(st, "layers[0].w_hh", w_hh0, x->dtype) || fx_expect_rank(st, "layers[0].w_hh", w_hh0, 2, layout))
        return st->code;
    n->hidden = w_hh0->dims[1];
    if (n->hidden < 1) {
        char got[160];
        fx_format_shape(got, sizeof got, w_hh0->rank, w_hh0->dims);
        return fx_fail(st, FX_EBADARG, "layers[0].w_hh: expected hidden >= 1 %s, got shape %s", layout, got);
    }
    const int64_t rows = gates * n->hidden;
    for (int64_t l = 0; l < in->layers; l++) {
        const fx_rnn_layer *p = &in->layer[l];
        const int64_t ih[2] = {rows, l == 0 ? n->input : n->hidden};
        const int64_t hh[2] = {rows, n->hidden};
        const int64_t bias[1] = {rows};
        snprintf(arg, sizeof arg, "layers[%lld].w_ih", (long long)l);
        snprintf(layout, sizeof layout, "[%d*hidden, %s]", gates, l == 0 ? "input" : "hidden");
        if (!p->w_ih)
            return fx_fail(st, FX_EBADARG, "%s: expected a tensor %s, got none", arg, layout);
        if (expect_typed(st, arg, p->w_ih, x, x->dtype, 2, ih, layout))
            return st->code;
        snprintf(arg, sizeof arg, "layers[%lld].w_hh", (long long)l);
        snprintf(layout, sizeof layout, "[%d*hidden, hidden]", gates);
        if (!p->w_hh)
            return fx_fail(st, FX_EBADARG, "%s: expected a tensor %s, got none", arg, layout);
        if (expect_typed(st, arg, p->w_hh, x, x->dtype, 2, hh, layout))
            return st->code;
        snprintf(layout, sizeof layout, "[%d*hidden]", gates);
        snprintf(arg, sizeof arg, "layers[%lld].b_ih", (long long)l);
        if (p->b_ih && expect_any_float(st, arg, p->b_ih, x, 1, bias, layout))
            return st->code;
        snprintf(arg, sizeof arg, "layers[%lld].b_hh", (long long)l);
        if (p->b_hh && expect_any_float(st, arg, p->b_hh, x, 1, bias, layout))
            return st->code;
    }
    return FX_OK;
}

/* The cell, the layer count, x's type and rank (`x_rank`: 3 for a
 * sequence, 2 for a step) and the backend's op. */
static int check_head(const fx_rnn_inputs *in, int x_rank, op_kind op, fx_status *st)
{
    if (!fx_rnn_cell_name(in->cell))
        return fx_fail(st, FX_EBADARG, "cell: expected gru or lstm, got %d", in->cell);
    if (in->layers < 1 || !in->layer)
        return fx_fail(st, FX_EBADARG, "layers: expected at least one layer, got %lld", (long long)in->layers);
    const fx_tensor *x = in->x;
    if (!x)
        return fx_fail(st, FX_EBADARG, "x: expected a tensor %s, got none", x_rank == 3 ? LAYOUT_X : "[batch, input]");
    if (fx_expect_float(st, "x", x, on_cpu(x)) ||
        fx_expect_rank(st, "x", x, x_rank, x_rank == 3 ? LAYOUT_X : "[batch, input]") ||
        expect_rnn(st, x->device, in->cell, op))
        return st->code;
    return FX_OK;
}

/* The sizes every tensor of the problem is made from fit: the states and
 * the saved tensor's element counts (x and the parameters exist). */
static int check_sizes(const fx_rnn_dims *n, fx_status *st)
{
    const int64_t state[3] = {n->layers, n->batch, n->hidden};
    int64_t saved[4], numel;
    fx_rnn_saved_shape(n, saved);
    if (fx_shape_numel("h0", 3, state, &numel, st) || fx_shape_numel("saved", 4, saved, &numel, st))
        return st->code;
    return FX_OK;
}

int fx_rnn_check_forward(const fx_rnn_inputs *in, fx_rnn_dims *n, fx_status *st)
{
    memset(n, 0, sizeof *n);
    if (check_head(in, 3, OP_FORWARD, st))
        return st->code;
    const fx_tensor *x = in->x;
    n->cell = in->cell;
    n->layers = in->layers;
    n->batch = x->dims[0];
    n->seqlen = x->dims[1];
    n->input = x->dims[2];
    if (check_layers(in, n, st) || check_sizes(n, st))
        return st->code;
    const int64_t state[3] = {n->layers, n->batch, n->hidden};
    if ((in->h0 && expect_any_float(st, "h0", in->h0, x, 3, state, LAYOUT_STATE)) ||
        (in->cell == FX_RNN_LSTM && in->c0 && expect_any_float(st, "c0", in->c0, x, 3, state, LAYOUT_STATE)) ||
        (in->cell == FX_RNN_GRU && expect_absent(st, "c0", in->c0, in->cell)))
        return st->code;
    return FX_OK;
}

int fx_rnn_saved_shape(const fx_rnn_dims *n, int64_t dims[4])
{
    dims[0] = n->layers;
    dims[1] = n->batch;
    dims[2] = n->seqlen;
    dims[3] = fx_rnn_saved_width(n->cell, n->hidden);
    return 4;
}

/* A state the step writes in place: the state type, [layers, batch,
 * hidden], apart from everything the step reads. */
static int check_state(const fx_rnn_inputs *in, const char *arg, const fx_tensor *s, const fx_rnn_dims *n,
                       fx_status *st)
{
    const fx_tensor *x = in->x;
    const int64_t dims[3] = {n->layers, n->batch, n->hidden};
    if (!s)
        return fx_fail(st, FX_EBADARG, "%s: expected a state tensor %s, got none", arg, LAYOUT_STATE);
    if (expect_typed(st, arg, s, x, fx_rnn_state_type(x->dtype), 3, dims, LAYOUT_STATE) ||
        fx_expect_apart(st, arg, s, "x", x))
        return st->code;
    char other[48];
    for (int64_t l = 0; l < in->layers; l++) {
        const fx_rnn_layer *p = &in->layer[l];
        const fx_tensor *read[4] = {p->w_ih, p->w_hh, p->b_ih, p->b_hh};
        const char *names[4] = {"w_ih", "w_hh", "b_ih", "b_hh"};
        for (int i = 0; i < 4; i++) {
            snprintf(other, sizeof other, "layers[%lld].%s", (long long)l, names[i]);
            if (fx_expect_apart(st, arg, s, other, read[i]))
                return st->code;
        }
    }
    return FX_OK;
}

int fx_rnn_check_step(const fx_rnn_inputs *in, const fx_tensor *h, const fx_tensor *c, fx_rnn_dims *n,
                      fx_status *st)
{
    memset(n, 0, sizeof *n);
    if (check_head(in, 2, OP_STEP, st))
        return st->code;
    const fx_tensor *x = in->x;
    n->cell = in->cell;
    n->layers = in->layers;
    n->batch = x->dims[0];
    n->seqlen = 1;
    n->input = x->dims[1];
    if (check_layers(in, n, st) || check_sizes(n, st) || check_state(in, "h", h, n, st))
        return st->code;
    if (in->cell == FX_RNN_GRU)
        return expect_absent(st, "c", c, in->cell);
    if (check_state(in, "c", c, n, st) || fx_expect_apart(st, "c", c, "h", h))
        return st->code;
    return FX_OK;
}

/* No step to take: an empty batch or sequence. No backend is handed one. */
static bool nothing_to_run(const fx_rnn_dims *n) { return n->batch == 0 || n->seqlen == 0; }

/* ---- forward ---- */

static int expect_outputs(const fx_rnn_inputs *in, const fx_rnn_dims *n, const fx_tensor *y, const fx_tensor *h_n,
                          const fx_tensor *c_n, const fx_tensor *saved, fx_status *st)
{
    const fx_tensor *x = in->x;
    const fx_dtype state_type = fx_rnn_state_type(x->dtype);
    const int64_t ydims[3] = {n->batch, n->seqlen, n->hidden};
    const int64_t state[3] = {n->layers, n->batch, n->hidden};
    int64_t sdims[4];
    fx_rnn_saved_shape(n, sdims);
    if (!y)
        return fx_fail(st, FX_EBADARG, "y: expected an output tensor %s, got none", LAYOUT_Y);
    if (expect_typed(st, "y", y, x, x->dtype, 3, ydims, LAYOUT_Y) ||
        (h_n && expect_typed(st, "h_n", h_n, x, state_type, 3, state, LAYOUT_STATE)) ||
        (n->cell == FX_RNN_GRU && expect_absent(st, "c_n", c_n, n->cell)) ||
        (c_n && expect_typed(st, "c_n", c_n, x, state_type, 3, state, LAYOUT_STATE)) ||
        (saved && expect_typed(st, "saved", saved, x, state_type, 4, sdims, LAYOUT_SAVED)))
        return st->code;
    return FX_OK;
}

static fx_rnn_fwd_args fwd_args(const fx_rnn_inputs *in, const fx_rnn_dims *n)
{
    fx_rnn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.n = *n;
    a.layer = in->layer;
    a.x = in->x;
    a.h0 = in->h0;
    a.c0 = n->cell == FX_RNN_LSTM ? in->c0 : NULL;
    a.path = in->path;
    return a;
}

int fx_op_rnn_forward_into(const fx_exec *ex, const fx_rnn_inputs *in, const fx_tensor *y, const fx_tensor *h_n,
                           const fx_tensor *c_n, const fx_tensor *saved, fx_status *st)
{
    fx_rnn_dims n;
    if (fx_rnn_check_forward(in, &n, st) || expect_outputs(in, &n, y, h_n, c_n, saved, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (nothing_to_run(&n)) /* y and saved are empty; the final states are the initial ones */
        return (h_n && fx_op_cast_or_zero(ex, in->h0, h_n, st)) || (c_n && fx_op_cast_or_zero(ex, in->c0, c_n, st))
                   ? st->code
                   : FX_OK;
    fx_rnn_fwd_args a = fwd_args(in, &n);
    a.y = y;
    a.h_n = h_n;
    a.c_n = c_n;
    a.saved = saved;
    return rnn_ops(dev)->forward(ex, &a, st);
}

/* ---- backward ---- */

/* A gradient output: there exactly when its input is, and like it. */
static int expect_grad(fx_status *st, const char *arg, const fx_tensor *grad, const fx_tensor *input,
                       const fx_tensor *x)
{
    if (!input != !grad)
        return fx_fail(st, FX_EBADARG, "%s: expected a gradient tensor %s", arg,
                       input ? "(its input was given)" : "only where its input was given");
    if (!input)
        return FX_OK;
    return expect_typed(st, arg, grad, x, input->dtype, input->rank, input->dims, "(the shape of its input)");
}

static int expect_grads(const fx_rnn_inputs *in, const fx_rnn_grad_outs *g, fx_status *st)
{
    const fx_tensor *x = in->x;
    if (!g || !g->layer)
        return fx_fail(st, FX_EBADARG, "layers: expected a gradient entry per layer, got none");
    if (expect_grad(st, "dx", g->dx, x, x) || expect_grad(st, "dh0", g->dh0, in->h0, x) ||
        expect_grad(st, "dc0", g->dc0, in->cell == FX_RNN_LSTM ? in->c0 : NULL, x))
        return st->code;
    char arg[48];
    for (int64_t l = 0; l < in->layers; l++) {
        const fx_rnn_layer *p = &in->layer[l];
        const fx_rnn_layer_grads *d = &g->layer[l];
        const fx_tensor *inputs[4] = {p->w_ih, p->w_hh, p->b_ih, p->b_hh};
        const fx_tensor *grads[4] = {d->dw_ih, d->dw_hh, d->db_ih, d->db_hh};
        const char *names[4] = {"dw_ih", "dw_hh", "db_ih", "db_hh"};
        for (int i = 0; i < 4; i++) {
            snprintf(arg, sizeof arg, "layers[%lld].%s", (long long)l, names[i]);
            if (expect_grad(st, arg, grads[i], inputs[i], x))
                return st->code;
        }
    }
    return FX_OK;
}

static int expect_cotangents(const fx_rnn_inputs *in, const fx_rnn_dims *n, const fx_tensor *dy,
                             const fx_tensor *dh_n, const fx_tensor *dc_n, fx_status *st)
{
    const fx_tensor *x = in->x;
    const int64_t ydims[3] = {n->batch, n->seqlen, n->hidden};
    const int64_t state[3] = {n->layers, n->batch, n->hidden};
    if ((dy && expect_typed(st, "dy", dy, x, x->dtype, 3, ydims, LAYOUT_Y)) ||
        (dh_n && expect_any_float(st, "dh_n", dh_n, x, 3, state, LAYOUT_STATE)) ||
        (n->cell == FX_RNN_GRU && expect_absent(st, "dc_n", dc_n, n->cell)) ||
        (dc_n && expect_any_float(st, "dc_n", dc_n, x, 3, state, LAYOUT_STATE)))
        return st->code;
    return FX_OK;
}

static int zero_grads(const fx_exec *ex, const fx_rnn_inputs *in, const fx_rnn_grad_outs *g, const fx_tensor *dh_n,
                      const fx_tensor *dc_n, fx_status *st)
{
    if (fx_op_fill_zero(ex, g->dx, st))
        return st->code;
    for (int64_t l = 0; l < in->layers; l++) {
        const fx_rnn_layer_grads *d = &g->layer[l];
        if (fx_op_fill_zero(ex, d->dw_ih, st) || fx_op_fill_zero(ex, d->dw_hh, st) ||
            fx_op_fill_zero(ex, d->db_ih, st) || fx_op_fill_zero(ex, d->db_hh, st))
            return st->code;
    }
    /* no step ran: the initial states went straight to the final ones */
    if ((g->dh0 && fx_op_cast_or_zero(ex, dh_n, g->dh0, st)) || (g->dc0 && fx_op_cast_or_zero(ex, dc_n, g->dc0, st)))
        return st->code;
    return FX_OK;
}

int fx_rnn_check_backward(const fx_rnn_inputs *in, const fx_tensor *saved, const fx_tensor *dy,
                          const fx_tensor *dh_n, const fx_tensor *dc_n, fx_rnn_dims *n, fx_status *st)
{
    if (fx_rnn_check_forward(in, n, st) || expect_rnn(st, in->x->device, in->cell, OP_BACKWARD) ||
        expect_cotangents(in, n, dy, dh_n, dc_n, st))
        return st->code;
    const fx_tensor *x = in->x;
    int64_t sdims[4];
    fx_rnn_saved_shape(n, sdims);
    if (!saved && !nothing_to_run(n))
        return fx_fail(st, FX_EBADARG, "saved: expected the tensor a training forward keeps %s, got none",
                       LAYOUT_SAVED);
    if (saved && expect_typed(st, "saved", saved, x, fx_rnn_state_type(x->dtype), 4, sdims, LAYOUT_SAVED))
        return st->code;
    return FX_OK;
}

int fx_op_rnn_backward_into(const fx_exec *ex, const fx_rnn_inputs *in, const fx_tensor *saved,
                            const fx_tensor *dy, const fx_tensor *dh_n, const fx_tensor *dc_n,
                            const fx_rnn_grad_outs *g, fx_status *st)
{
    fx_rnn_dims n;
    if (fx_rnn_check_backward(in, saved, dy, dh_n, dc_n, &n, st) || expect_grads(in, g, st))
        return st->code;
    const fx_tensor *x = in->x;
    fx_device *dev = x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (nothing_to_run(&n))
        return zero_grads(ex, in, g, dh_n, dc_n, st);
    fx_rnn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.fwd = fwd_args(in, &n);
    a.fwd.saved = saved;
    a.dy = dy;
    a.dh_n = dh_n;
    a.dc_n = n.cell == FX_RNN_LSTM ? dc_n : NULL;
    a.dx = g->dx;
    a.dh0 = g->dh0;
    a.dc0 = g->dc0;
    a.grad = g->layer;
    return rnn_ops(dev)->backward(ex, &a, st);
}

/* ---- step ---- */

int fx_op_rnn_step_into(const fx_exec *ex, const fx_rnn_inputs *in, const fx_tensor *h, const fx_tensor *c,
                        const fx_tensor *y, fx_status *st)
{
    fx_rnn_dims n;
    if (fx_rnn_check_step(in, h, c, &n, st))
        return st->code;
    const int64_t ydims[2] = {n.batch, n.hidden};
    if (!y)
        return fx_fail(st, FX_EBADARG, "y: expected an output tensor [batch, hidden], got none");
    if (expect_typed(st, "y", y, in->x, in->x->dtype, 2, ydims, "[batch, hidden]") ||
        fx_expect_apart(st, "y", y, "h", h) || fx_expect_apart(st, "y", y, "c", c))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.batch == 0)
        return FX_OK;
    fx_rnn_step_args a = {.n = n, .layer = in->layer, .x = in->x, .h = h, .c = c, .y = y, .path = in->path};
    return rnn_ops(dev)->step(ex, &a, st);
}

/* ---- scratch queries: arguments of shape-only tensors ---- */

static void shape_only(fx_tensor *t, fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims)
{
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->rank = rank;
    t->numel = 1;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = dims[i];
        t->numel *= dims[i];
    }
    t->nbytes = (size_t)t->numel * fx_dtype_size(dtype);
    t->device = dev;
}

size_t fx_op_rnn_forward_scratch(const fx_exec *ex, const fx_rnn_inputs *in, bool training)
{
    fx_status st;
    fx_status_clear(&st);
    fx_rnn_dims n;
    if (fx_rnn_check_forward(in, &n, &st))
        return SIZE_MAX;
    if (nothing_to_run(&n))
        return 0;
    fx_device *dev = in->x->device;
    fx_exec own;
    const fx_exec *own_ex = fx_exec_resolve(dev, ex, &own, &st);
    if (!own_ex)
        return SIZE_MAX;
    const fx_dtype state_type = fx_rnn_state_type(in->x->dtype);
    const int64_t ydims[3] = {n.batch, n.seqlen, n.hidden}, state[3] = {n.layers, n.batch, n.hidden};
    int64_t sdims[4];
    fx_rnn_saved_shape(&n, sdims);
    fx_tensor y, h_n, c_n, saved;
    shape_only(&y, dev, in->x->dtype, 3, ydims);
    shape_only(&h_n, dev, state_type, 3, state);
    shape_only(&c_n, dev, state_type, 3, state);
    shape_only(&saved, dev, state_type, 4, sdims);
    fx_rnn_fwd_args a = fwd_args(in, &n);
    a.y = &y;
    a.h_n = &h_n;
    a.c_n = n.cell == FX_RNN_LSTM ? &c_n : NULL;
    a.saved = training ? &saved : NULL;
    return rnn_ops(dev)->forward_scratch(own_ex, &a);
}

size_t fx_op_rnn_backward_scratch(const fx_exec *ex, const fx_rnn_inputs *in, bool has_dy, bool has_dh_n,
                                  bool has_dc_n)
{
    fx_status st;
    fx_status_clear(&st);
    fx_rnn_dims n;
    if (fx_rnn_check_forward(in, &n, &st))
        return SIZE_MAX;
    if (nothing_to_run(&n))
        return 0;
    fx_device *dev = in->x->device;
    fx_exec own;
    const fx_exec *own_ex = fx_exec_resolve(dev, ex, &own, &st);
    if (!own_ex)
        return SIZE_MAX;
    const fx_dtype state_type = fx_rnn_state_type(in->x->dtype);
    const int64_t ydims[3] = {n.batch, n.seqlen, n.hidden}, state[3] = {n.layers, n.batch, n.hidden};
    int64_t sdims[4];
    fx_rnn_saved_shape(&n, sdims);
    fx_tensor saved, dy, dh_n, dc_n, dx, dh0, dc0;
    shape_only(&saved, dev, state_type, 4, sdims);
    shape_only(&dy, dev, in->x->dtype, 3, ydims);
    shape_only(&dh_n, dev, state_type, 3, state);
    shape_only(&dc_n, dev, state_type, 3, state);
    shape_only(&dx, dev, in->x->dtype, 3, in->x->dims);
    shape_only(&dh0, dev, state_type, 3, state);
    shape_only(&dc0, dev, state_type, 3, state);
    fx_rnn_layer_grads *grads = calloc((size_t)n.layers, sizeof *grads);
    fx_tensor *params = calloc((size_t)n.layers * 4, sizeof *params);
    size_t bytes = SIZE_MAX;
    if (grads && params) {
        for (int64_t l = 0; l < n.layers; l++) {
            const fx_rnn_layer *p = &in->layer[l];
            const fx_tensor *src[4] = {p->w_ih, p->w_hh, p->b_ih, p->b_hh};
            const fx_tensor **dst[4] = {&grads[l].dw_ih, &grads[l].dw_hh, &grads[l].db_ih, &grads[l].db_hh};
            for (int i = 0; i < 4; i++)
                if (src[i]) {
                    shape_only(&params[4 * l + i], dev, src[i]->dtype, src[i]->rank, src[i]->dims);
                    *dst[i] = &params[4 * l + i];
                }
        }
        fx_rnn_bwd_args a;
        memset(&a, 0, sizeof a);
        a.fwd = fwd_args(in, &n);
        a.fwd.saved = &saved;
        a.dy = has_dy ? &dy : NULL;
        a.dh_n = has_dh_n ? &dh_n : NULL;
        a.dc_n = has_dc_n && n.cell == FX_RNN_LSTM ? &dc_n : NULL;
        a.dx = &dx;
        a.dh0 = in->h0 ? &dh0 : NULL;
        a.dc0 = in->c0 && n.cell == FX_RNN_LSTM ? &dc0 : NULL;
        a.grad = grads;
        bytes = rnn_ops(dev)->backward_scratch(own_ex, &a);
    }
    free(grads);
    free(params);
    return bytes;
}

size_t fx_op_rnn_step_scratch(const fx_exec *ex, const fx_rnn_inputs *in)
{
    fx_status st;
    fx_status_clear(&st);
    if (check_head(in, 2, OP_STEP, &st))
        return SIZE_MAX;
    fx_rnn_dims n = {.cell = in->cell, .layers = in->layers, .batch = in->x->dims[0], .seqlen = 1,
                     .input = in->x->dims[1]};
    if (check_layers(in, &n, &st) || check_sizes(&n, &st))
        return SIZE_MAX;
    if (n.batch == 0)
        return 0;
    fx_device *dev = in->x->device;
    fx_exec own;
    const fx_exec *own_ex = fx_exec_resolve(dev, ex, &own, &st);
    if (!own_ex)
        return SIZE_MAX;
    const fx_dtype state_type = fx_rnn_state_type(in->x->dtype);
    const int64_t ydims[2] = {n.batch, n.hidden}, state[3] = {n.layers, n.batch, n.hidden};
    fx_tensor y, h, c;
    shape_only(&y, dev, in->x->dtype, 2, ydims);
    shape_only(&h, dev, state_type, 3, state);
    shape_only(&c, dev, state_type, 3, state);
    fx_rnn_step_args a = {.n = n, .layer = in->layer, .x = in->x, .h = &h,
                          .c = n.cell == FX_RNN_LSTM ? &c : NULL, .y = &y, .path = in->path};
    return rnn_ops(dev)->step_scratch(own_ex, &a);
}

/* ---- contexts ---- */

static void keep(fx_tensor *dst, const fx_tensor *src)
{
    memset(dst, 0, sizeof *dst);
    if (!src)
        return;
    *dst = *src;
    if (src->buffer)
        fx_buffer_ref(src->buffer);
}

/* A tensor the context or the gradients hold, or NULL where its input was
 * not given (an empty tensor has a buffer and no data). */
static const fx_tensor *opt(const fx_tensor *t) { return t && t->buffer ? t : NULL; }

void fx_rnn_ctx_free(fx_rnn_ctx *ctx)
{
    if (!ctx)
        return;
    fx_tensor_release(&ctx->x);
    fx_tensor_release(&ctx->h0);
    fx_tensor_release(&ctx->c0);
    fx_tensor_release(&ctx->saved);
    if (ctx->params)
        for (int64_t i = 0; i < 4 * ctx->n.layers; i++)
            fx_tensor_release(&ctx->params[i]);
    free(ctx->params);
    free(ctx->layer);
    free(ctx);
}

size_t fx_rnn_ctx_saved_bytes(const fx_rnn_ctx *ctx) { return ctx->saved.nbytes; }

void fx_rnn_ctx_inputs(const fx_rnn_ctx *ctx, fx_rnn_inputs *in)
{
    memset(in, 0, sizeof *in);
    in->cell = ctx->n.cell;
    in->layers = ctx->n.layers;
    in->layer = ctx->layer;
    in->x = &ctx->x;
    in->h0 = opt(&ctx->h0);
    in->c0 = opt(&ctx->c0);
    in->path = ctx->path;
}

/* References to the inputs and the saved tensor of a forward of n. */
static int ctx_new(const fx_rnn_inputs *in, const fx_rnn_dims *n, fx_rnn_ctx **out, fx_status *st)
{
    fx_rnn_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx) {
        ctx->params = calloc((size_t)n->layers * 4, sizeof *ctx->params);
        ctx->layer = calloc((size_t)n->layers, sizeof *ctx->layer);
    }
    if (!ctx || !ctx->params || !ctx->layer) {
        if (ctx) {
            free(ctx->params);
            free(ctx->layer);
        }
        free(ctx);
        return fx_fail(st, FX_ENOMEM, "out of host memory for a %s context", fx_rnn_cell_name(n->cell));
    }
    ctx->n = *n;
    ctx->path = in->path;
    keep(&ctx->x, in->x);
    keep(&ctx->h0, in->h0);
    keep(&ctx->c0, n->cell == FX_RNN_LSTM ? in->c0 : NULL);
    for (int64_t l = 0; l < n->layers; l++) {
        const fx_rnn_layer *p = &in->layer[l];
        fx_tensor *q = &ctx->params[4 * l];
        keep(&q[0], p->w_ih);
        keep(&q[1], p->w_hh);
        keep(&q[2], p->b_ih);
        keep(&q[3], p->b_hh);
        ctx->layer[l] = (fx_rnn_layer){&q[0], &q[1], opt(&q[2]), opt(&q[3])};
    }
    int64_t sdims[4];
    fx_rnn_saved_shape(n, sdims);
    if (fx_tensor_alloc(in->x->device, fx_rnn_state_type(in->x->dtype), 4, sdims, &ctx->saved, st)) {
        fx_rnn_ctx_free(ctx);
        return st->code;
    }
    *out = ctx;
    return FX_OK;
}

int fx_op_rnn_forward(const fx_rnn_inputs *in, bool return_state, fx_tensor *y, fx_tensor *h_n, fx_tensor *c_n,
                      fx_rnn_ctx **ctx_out, fx_status *st)
{
    memset(y, 0, sizeof *y);
    memset(h_n, 0, sizeof *h_n);
    memset(c_n, 0, sizeof *c_n);
    if (ctx_out)
        *ctx_out = NULL;
    fx_rnn_dims n;
    if (fx_rnn_check_forward(in, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    const fx_dtype state_type = fx_rnn_state_type(in->x->dtype);
    const int64_t ydims[3] = {n.batch, n.seqlen, n.hidden}, state[3] = {n.layers, n.batch, n.hidden};
    const bool lstm = n.cell == FX_RNN_LSTM;
    fx_rnn_ctx *ctx = NULL;
    if (fx_tensor_alloc(dev, in->x->dtype, 3, ydims, y, st) ||
        (return_state && fx_tensor_alloc(dev, state_type, 3, state, h_n, st)) ||
        (return_state && lstm && fx_tensor_alloc(dev, state_type, 3, state, c_n, st)) ||
        (ctx_out && ctx_new(in, &n, &ctx, st)) ||
        fx_op_rnn_forward_into(NULL, in, y, return_state ? h_n : NULL, return_state && lstm ? c_n : NULL,
                               ctx ? &ctx->saved : NULL, st))
        goto fail;
    if (ctx_out)
        *ctx_out = ctx;
    return FX_OK;
fail:
    fx_tensor_release(y);
    fx_tensor_release(h_n);
    fx_tensor_release(c_n);
    fx_rnn_ctx_free(ctx);
    return st->code;
}

void fx_rnn_grads_release(fx_rnn_grads *g)
{
    fx_tensor_release(&g->dx);
    fx_tensor_release(&g->dh0);
    fx_tensor_release(&g->dc0);
    if (g->params)
        for (int64_t i = 0; i < 4 * g->layers; i++)
            fx_tensor_release(&g->params[i]);
    free(g->params);
    g->params = NULL;
    g->layers = 0;
}

static int alloc_like(const fx_tensor *input, fx_tensor *grad, fx_status *st)
{
    memset(grad, 0, sizeof *grad);
    if (!input)
        return FX_OK;
    return fx_tensor_alloc(input->device, input->dtype, input->rank, input->dims, grad, st);
}

int fx_op_rnn_backward(const fx_rnn_ctx *ctx, const fx_tensor *dy, const fx_tensor *dh_n, const fx_tensor *dc_n,
                       fx_rnn_grads *grads, fx_status *st)
{
    memset(grads, 0, sizeof *grads);
    fx_rnn_inputs in;
    fx_rnn_ctx_inputs(ctx, &in);
    /* the caller's tensors first, before anything is allocated */
    if (expect_rnn(st, in.x->device, in.cell, OP_BACKWARD) || expect_cotangents(&in, &ctx->n, dy, dh_n, dc_n, st))
        return st->code;
    const int64_t layers = ctx->n.layers;
    grads->params = calloc((size_t)layers * 4, sizeof *grads->params);
    fx_rnn_layer_grads *outs = calloc((size_t)layers, sizeof *outs);
    if (!grads->params || !outs) {
        free(outs);
        free(grads->params);
        grads->params = NULL;
        return fx_fail(st, FX_ENOMEM, "out of host memory for %lld layers' gradients", (long long)layers);
    }
    grads->layers = layers;
    if (alloc_like(in.x, &grads->dx, st) || alloc_like(in.h0, &grads->dh0, st) || alloc_like(in.c0, &grads->dc0, st))
        goto fail;
    for (int64_t l = 0; l < layers; l++) {
        const fx_rnn_layer *p = &in.layer[l];
        fx_tensor *q = &grads->params[4 * l];
        if (alloc_like(p->w_ih, &q[0], st) || alloc_like(p->w_hh, &q[1], st) || alloc_like(p->b_ih, &q[2], st) ||
            alloc_like(p->b_hh, &q[3], st))
            goto fail;
        outs[l] = (fx_rnn_layer_grads){&q[0], &q[1], opt(&q[2]), opt(&q[3])};
    }
    fx_rnn_grad_outs g = {.dx = &grads->dx, .dh0 = opt(&grads->dh0), .dc0 = opt(&grads->dc0), .layer = outs};
    if (fx_op_rnn_backward_into(NULL, &in, &ctx->saved, dy, dh_n, dc_n, &g, st))
        goto fail;
    free(outs);
    return FX_OK;
fail:
    free(outs);
    fx_rnn_grads_release(grads);
    return st->code;
}

int fx_op_rnn_step(const fx_rnn_inputs *in, const fx_tensor *h, const fx_tensor *c, fx_tensor *y, fx_status *st)
{
    memset(y, 0, sizeof *y);
    fx_rnn_dims n;
    if (fx_rnn_check_step(in, h, c, &n, st))
        return st->code;
    const int64_t ydims[2] = {n.batch, n.hidden};
    if (fx_tensor_alloc(in->x->device, in->x->dtype, 2, ydims, y, st) || fx_op_rnn_step_into(NULL, in, h, c, y, st))
        fx_tensor_release(y);
    return st->code;
}
