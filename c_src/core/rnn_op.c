/* The GRU's and the LSTM's descriptions (core/op.h): for each cell its
 * forward, backward and step over the family's op layer (core/rnn.c).
 * The layers' parameters are the descriptions' repeated group (w_ih,
 * w_hh, b_ih, b_hh, once per layer, as many as the attribute `layers`
 * says), their trailing inputs; a backward's gradients of them its
 * trailing results. Laid out alike for both cells (the LSTM's c0, c_n,
 * dc_n, dc0 and its step's second state c where the GRU has none):
 *
 *   forward   x, h0, [c0], layers...       -> y, h_n, [c_n], saved
 *   backward  x, h0, [c0], saved, dy, dh_n, [dc_n], layers...
 *                                          -> dx, dh0, [dc0], layers' d...
 *   step      h, [c], x, layers...         -> y, new_h, [new_c]
 */
#include <string.h>

#include "core/op.h"
#include "core/rnn.h"

#define L_X "[batch, seqlen, input]"
#define L_Y "[batch, seqlen, hidden]"
#define L_STATE "[layers, batch, hidden]"
#define L_SAVED "[layers, batch, seqlen, saved width]"
/* Layer 0's w_ih; the layers above take [G*hidden, hidden]. */
#define L_W_IH(g) "[" g "*hidden, input]"
#define L_W_HH(g) "[" g "*hidden, hidden]"
#define L_BIAS(g) "[" g "*hidden]"
#define L_FRAME_X "[batch, input]"
#define L_FRAME_Y "[batch, hidden]"

/* The most layers a call holds: the LSTM backward's slots (7 inputs
 * before the group) within FX_OP_MAX_IO. */
#define MAX_LAYERS ((FX_OP_MAX_IO - 3) / 4)

static bool is_lstm(const fx_op_call *c) { return c->op->variant == FX_RNN_LSTM; }

/* The attribute `layers` is every description's first. */
static int64_t layers_of(const fx_op_call *c) { return fx_op_repeats(c); }

/* The call's inputs: x at slot `x`, h0 and c0 at `h0` and `h0 + 1` (-1:
 * none), the layers from the repeated group's first slot. */
typedef struct rnn_call {
    fx_rnn_inputs in;
    fx_rnn_layer layer[MAX_LAYERS];
} rnn_call;

static void inputs_of(const fx_op_call *c, int x, int h0, rnn_call *r)
{
    memset(r, 0, sizeof *r);
    int first;
    fx_op_group(c->op, false, &first);
    r->in.cell = c->op->variant;
    r->in.layers = layers_of(c);
    r->in.layer = r->layer;
    r->in.x = c->in[x];
    r->in.h0 = h0 >= 0 ? c->in[h0] : NULL;
    r->in.c0 = h0 >= 0 && is_lstm(c) ? c->in[h0 + 1] : NULL;
    for (int64_t l = 0; l < r->in.layers && l < MAX_LAYERS; l++) {
        const fx_tensor *const *p = &c->in[first + 4 * l];
        r->layer[l] = (fx_rnn_layer){.w_ih = p[0], .w_hh = p[1], .b_ih = p[2], .b_hh = p[3]};
    }
}

static void spec_of(fx_op_spec *s, fx_dtype dtype, int rank, const int64_t *dims)
{
    s->dtype = dtype;
    s->rank = rank;
    memcpy(s->dims, dims, sizeof(int64_t) * (size_t)rank);
}

static void spec_like(fx_op_spec *s, const fx_tensor *t) { spec_of(s, t->dtype, t->rank, t->dims); }

/* ---- forward: y, h_n, [c_n], saved ---- */

enum { F_X, F_H0 };
static int f_saved(const fx_op_call *c) { return is_lstm(c) ? 3 : 2; }

static int fwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    rnn_call rc;
    inputs_of(c, F_X, F_H0, &rc);
    fx_rnn_dims n;
    if (fx_rnn_check_forward(&rc.in, &n, st))
        return st->code;
    const fx_dtype state = fx_rnn_state_type(rc.in.x->dtype);
    const int64_t y[3] = {n.batch, n.seqlen, n.hidden}, h[3] = {n.layers, n.batch, n.hidden};
    int64_t saved[4];
    spec_of(&r[0], rc.in.x->dtype, 3, y);
    spec_of(&r[1], state, 3, h);
    if (is_lstm(c))
        spec_of(&r[2], state, 3, h);
    spec_of(&r[f_saved(c)], state, fx_rnn_saved_shape(&n, saved), saved);
    return FX_OK;
}

static int fwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    rnn_call rc;
    inputs_of(c, F_X, F_H0, &rc);
    return fx_op_rnn_forward_into(ex, &rc.in, c->out[0], c->out[1], is_lstm(c) ? c->out[2] : NULL,
                                  c->out[f_saved(c)], st);
}

static size_t fwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    rnn_call rc;
    inputs_of(c, F_X, F_H0, &rc);
    return fx_op_rnn_forward_scratch(ex, &rc.in, c->out[f_saved(c)] != NULL);
}

/* ---- backward: x, h0, [c0], saved, dy, dh_n, [dc_n], layers ---- */

typedef struct bwd_slots {
    int saved, dy, dh_n, dc_n; /* dc_n -1 for the GRU */
} bwd_slots;

static bwd_slots bwd_slots_of(const fx_op_call *c)
{
    int k = is_lstm(c) ? 3 : 2;
    return (bwd_slots){k, k + 1, k + 2, is_lstm(c) ? k + 3 : -1};
}

/* The gradients' slots mirror the forward's inputs: dx, dh0, [dc0], then
 * the layers'. */
static fx_rnn_grad_outs grads_of(const fx_op_call *c, fx_rnn_layer_grads *layer)
{
    int first;
    fx_op_group(c->op, true, &first);
    for (int64_t l = 0; l < layers_of(c) && l < MAX_LAYERS; l++) {
        const fx_tensor *const *p = &c->out[first + 4 * l];
        layer[l] = (fx_rnn_layer_grads){.dw_ih = p[0], .dw_hh = p[1], .db_ih = p[2], .db_hh = p[3]};
    }
    return (fx_rnn_grad_outs){.dx = c->out[0], .dh0 = c->out[1], .dc0 = is_lstm(c) ? c->out[2] : NULL, .layer = layer};
}

static int bwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    rnn_call rc;
    inputs_of(c, F_X, F_H0, &rc);
    bwd_slots s = bwd_slots_of(c);
    fx_rnn_dims n;
    if (fx_rnn_check_backward(&rc.in, c->in[s.saved], c->in[s.dy], c->in[s.dh_n],
                              s.dc_n >= 0 ? c->in[s.dc_n] : NULL, &n, st))
        return st->code;
    /* every gradient is like its input; the forward's inputs sit in the
     * gradients' slots (x, h0, [c0]) or in the group's */
    int in_first, out_first;
    fx_op_group(c->op, false, &in_first);
    fx_op_group(c->op, true, &out_first);
    for (int i = 0; i < out_first; i++)
        if (c->in[i])
            spec_like(&r[i], c->in[i]);
    for (int k = 0; k < 4 * layers_of(c); k++)
        spec_like(&r[out_first + k], c->in[in_first + k]);
    return FX_OK;
}

static int bwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    rnn_call rc;
    fx_rnn_layer_grads layer[MAX_LAYERS];
    inputs_of(c, F_X, F_H0, &rc);
    bwd_slots s = bwd_slots_of(c);
    fx_rnn_grad_outs g = grads_of(c, layer);
    return fx_op_rnn_backward_into(ex, &rc.in, c->in[s.saved], c->in[s.dy], c->in[s.dh_n],
                                   s.dc_n >= 0 ? c->in[s.dc_n] : NULL, &g, st);
}

static size_t bwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    rnn_call rc;
    inputs_of(c, F_X, F_H0, &rc);
    bwd_slots s = bwd_slots_of(c);
    return fx_op_rnn_backward_scratch(ex, &rc.in, c->in[s.dy] != NULL, c->in[s.dh_n] != NULL,
                                      s.dc_n >= 0 && c->in[s.dc_n]);
}

/* ---- step: h, [c], x, layers -> y, new_h, [new_c] ---- */

static int s_x(const fx_op_call *c) { return is_lstm(c) ? 2 : 1; }

static int step_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    rnn_call rc;
    inputs_of(c, s_x(c), -1, &rc);
    fx_rnn_dims n;
    if (fx_rnn_check_step(&rc.in, c->in[0], is_lstm(c) ? c->in[1] : NULL, &n, st))
        return st->code;
    const int64_t y[2] = {n.batch, n.hidden};
    spec_of(&r[0], rc.in.x->dtype, 2, y);
    spec_like(&r[1], c->in[0]);
    if (is_lstm(c))
        spec_like(&r[2], c->in[1]);
    return FX_OK;
}

static int step_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    rnn_call rc;
    inputs_of(c, s_x(c), -1, &rc);
    return fx_op_rnn_step_into(ex, &rc.in, c->out[1], is_lstm(c) ? c->out[2] : NULL, c->out[0], st);
}

static size_t step_scratch(const fx_exec *ex, const fx_op_call *c)
{
    rnn_call rc;
    inputs_of(c, s_x(c), -1, &rc);
    return fx_op_rnn_step_scratch(ex, &rc.in);
}

/* ---- the descriptions ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define LAYERS {"layers", FX_ATTR_NUMBER, FX_ATTR_REPEAT, 1, NULL, {NULL}, false}
#define FLAG(name, role) {name, FX_ATTR_FLAG, role, 0, NULL, {NULL, NULL}, false}
#define IO(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, false}
#define IO_IF(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, false, false}
#define PER_LAYER(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, true}
#define PARAMS(g, role, d)                                                                                   \
    PER_LAYER(d "w_ih", L_W_IH(g), role), PER_LAYER(d "w_hh", L_W_HH(g), role),                                 \
        PER_LAYER(d "b_ih", L_BIAS(g), role), PER_LAYER(d "b_hh", L_BIAS(g), role)

static const fx_op_attr gru_fwd_attrs[] = {LAYERS, FLAG("has_h0", FX_ATTR_PRESENCE),
                                           FLAG("return_state", FX_ATTR_OPTION), FLAG("save", FX_ATTR_SAVE)};
static const fx_op_attr lstm_fwd_attrs[] = {LAYERS, FLAG("has_h0", FX_ATTR_PRESENCE),
                                            FLAG("has_c0", FX_ATTR_PRESENCE), FLAG("return_state", FX_ATTR_OPTION),
                                            FLAG("save", FX_ATTR_SAVE)};
static const fx_op_attr gru_bwd_attrs[] = {LAYERS, FLAG("has_h0", FX_ATTR_PRESENCE),
                                           FLAG("has_dh_n", FX_ATTR_PRESENCE)};
static const fx_op_attr lstm_bwd_attrs[] = {LAYERS, FLAG("has_h0", FX_ATTR_PRESENCE),
                                            FLAG("has_c0", FX_ATTR_PRESENCE), FLAG("has_dh_n", FX_ATTR_PRESENCE),
                                            FLAG("has_dc_n", FX_ATTR_PRESENCE)};
static const fx_op_attr step_attrs[] = {LAYERS};

static const fx_op_io gru_fwd_inputs[] = {
    IO("x", L_X, FX_IO_ARG),
    IO_IF("h0", L_STATE, FX_IO_OPTION, "has_h0"),
    PARAMS("3", FX_IO_ARG, ""),
};
static const fx_op_io lstm_fwd_inputs[] = {
    IO("x", L_X, FX_IO_ARG),
    IO_IF("h0", L_STATE, FX_IO_OPTION, "has_h0"),
    IO_IF("c0", L_STATE, FX_IO_OPTION, "has_c0"),
    PARAMS("4", FX_IO_ARG, ""),
};
static const fx_op_io gru_fwd_results[] = {
    IO("y", L_Y, FX_IO_OUTPUT),
    IO_IF("h_n", L_STATE, FX_IO_OUTPUT, "return_state"),
    {"saved", L_SAVED, FX_IO_SAVED, FX_WHEN_FLAG, "save", true, false},
};
static const fx_op_io lstm_fwd_results[] = {
    IO("y", L_Y, FX_IO_OUTPUT),
    IO_IF("h_n", L_STATE, FX_IO_OUTPUT, "return_state"),
    IO_IF("c_n", L_STATE, FX_IO_OUTPUT, "return_state"),
    {"saved", L_SAVED, FX_IO_SAVED, FX_WHEN_FLAG, "save", true, false},
};

static const fx_op_io gru_bwd_inputs[] = {
    IO("x", L_X, FX_IO_FORWARD),
    IO_IF("h0", L_STATE, FX_IO_FORWARD, "has_h0"),
    IO("saved", L_SAVED, FX_IO_SAVED),
    IO("dy", L_Y, FX_IO_COTANGENT),
    IO_IF("dh_n", L_STATE, FX_IO_COTANGENT, "has_dh_n"),
    PARAMS("3", FX_IO_FORWARD, ""),
};
static const fx_op_io lstm_bwd_inputs[] = {
    IO("x", L_X, FX_IO_FORWARD),
    IO_IF("h0", L_STATE, FX_IO_FORWARD, "has_h0"),
    IO_IF("c0", L_STATE, FX_IO_FORWARD, "has_c0"),
    IO("saved", L_SAVED, FX_IO_SAVED),
    IO("dy", L_Y, FX_IO_COTANGENT),
    IO_IF("dh_n", L_STATE, FX_IO_COTANGENT, "has_dh_n"),
    IO_IF("dc_n", L_STATE, FX_IO_COTANGENT, "has_dc_n"),
    PARAMS("4", FX_IO_FORWARD, ""),
};
static const fx_op_io gru_bwd_results[] = {
    IO("dx", L_X, FX_IO_GRAD),
    IO_IF("dh0", L_STATE, FX_IO_GRAD, "has_h0"),
    PARAMS("3", FX_IO_GRAD, "d"),
};
static const fx_op_io lstm_bwd_results[] = {
    IO("dx", L_X, FX_IO_GRAD),
    IO_IF("dh0", L_STATE, FX_IO_GRAD, "has_h0"),
    IO_IF("dc0", L_STATE, FX_IO_GRAD, "has_c0"),
    PARAMS("4", FX_IO_GRAD, "d"),
};

static const fx_op_io gru_step_inputs[] = {
    IO("h", L_STATE, FX_IO_STATE),
    IO("x", L_FRAME_X, FX_IO_ARG),
    PARAMS("3", FX_IO_ARG, ""),
};
static const fx_op_io lstm_step_inputs[] = {
    IO("h", L_STATE, FX_IO_STATE),
    IO("c", L_STATE, FX_IO_STATE),
    IO("x", L_FRAME_X, FX_IO_ARG),
    PARAMS("4", FX_IO_ARG, ""),
};
static const fx_op_io gru_step_results[] = {
    IO("y", L_FRAME_Y, FX_IO_OUTPUT),
    IO("new_h", L_STATE, FX_IO_STATE),
};
static const fx_op_io lstm_step_results[] = {
    IO("y", L_FRAME_Y, FX_IO_OUTPUT),
    IO("new_h", L_STATE, FX_IO_STATE),
    IO("new_c", L_STATE, FX_IO_STATE),
};

static const char *const gru_fwd_options[] = {"h0", "return_state", "save_for_backward", NULL};
static const char *const lstm_fwd_options[] = {"h0", "c0", "return_state", "save_for_backward", NULL};
static const char *const gru_bwd_options[] = {"dh_n", NULL};
static const char *const lstm_bwd_options[] = {"dh_n", "dc_n", NULL};

#define DESC(nm, cell, d, as, ins, outs)                                                                    \
    .name = nm, .op = cell == FX_RNN_GRU ? "gru" : "lstm", .family = "rnn", .dir = d, .variant = cell,       \
    .nattrs = COUNT(as), .ninputs = COUNT(ins), .nresults = COUNT(outs), .attrs = as, .inputs = ins,          \
    .results = outs

const fx_op_desc fx_rnn_op_descs[] = {
    {
        DESC("gru_fwd", FX_RNN_GRU, FX_OP_FWD, gru_fwd_attrs, gru_fwd_inputs, gru_fwd_results),
        .check = fwd_check, .scratch = fwd_scratch, .run = fwd_run, .backward = "gru_bwd",
        .options = gru_fwd_options, .saved_by = "fusex:gru",
    },
    {
        DESC("gru_bwd", FX_RNN_GRU, FX_OP_BWD, gru_bwd_attrs, gru_bwd_inputs, gru_bwd_results),
        .check = bwd_check, .scratch = bwd_scratch, .run = bwd_run, .options = gru_bwd_options,
    },
    {
        DESC("gru_step", FX_RNN_GRU, FX_OP_STEP, step_attrs, gru_step_inputs, gru_step_results),
        .check = step_check, .scratch = step_scratch, .run = step_run,
    },
    {
        DESC("lstm_fwd", FX_RNN_LSTM, FX_OP_FWD, lstm_fwd_attrs, lstm_fwd_inputs, lstm_fwd_results),
        .check = fwd_check, .scratch = fwd_scratch, .run = fwd_run, .backward = "lstm_bwd",
        .options = lstm_fwd_options, .saved_by = "fusex:lstm",
    },
    {
        DESC("lstm_bwd", FX_RNN_LSTM, FX_OP_BWD, lstm_bwd_attrs, lstm_bwd_inputs, lstm_bwd_results),
        .check = bwd_check, .scratch = bwd_scratch, .run = bwd_run, .options = lstm_bwd_options,
    },
    {
        DESC("lstm_step", FX_RNN_LSTM, FX_OP_STEP, step_attrs, lstm_step_inputs, lstm_step_results),
        .check = step_check, .scratch = step_scratch, .run = step_run,
    },
};

const int fx_rnn_op_ndescs = COUNT(fx_rnn_op_descs);
