/* The causal depthwise convolution's descriptions (core/op.h): the
 * forward, its backward and the step, with operands, attributes and
 * results in the order of docs/XLA.md, over the family's op layer
 * (core/conv.c). Laid out alike: x (a step: its state, then x), w, then
 * bias and the forward's initial state by their flags; attributes the
 * activation, the presence flags, then return_state or has_dfinal_state. */
#include <string.h>

#include "core/conv.h"
#include "core/op.h"

#define L_X "[batch, seqlen, dim]"
#define L_W "[dim, width]"
#define L_CH "[dim]"
#define L_STATE "[batch, dim, width - 1]"
#define L_FRAME "[batch, dim]"

/* The inputs' places: a forward's and a backward's, then a step's. */
enum { X, W, BIAS, INITIAL_STATE, DY, DFINAL_STATE };
enum { STEP_STATE, STEP_X, STEP_W, STEP_BIAS };
enum { A_ACTIVATION }; /* the first attribute of every description */
enum { R_Y, R_FINAL_STATE };
enum { R_STEP_Y, R_NEW_STATE };

/* The enum's choices in its order, as fx_activation values. */
static const int activations[] = {FX_ACT_NONE, FX_ACT_SILU};

static int activation_of(const fx_op_call *c)
{
    int k = (int)c->attrs[A_ACTIVATION];
    return k >= 0 && k < (int)(sizeof activations / sizeof activations[0]) ? activations[k] : -1;
}

static fx_conv_inputs inputs_of(const fx_op_call *c)
{
    fx_conv_inputs in = {.x = c->in[X], .w = c->in[W], .bias = c->in[BIAS], .initial_state = c->in[INITIAL_STATE],
                         .activation = activation_of(c)};
    return in;
}

static fx_conv_inputs step_inputs_of(const fx_op_call *c)
{
    fx_conv_inputs in = {.x = c->in[STEP_X], .w = c->in[STEP_W], .bias = c->in[STEP_BIAS],
                         .activation = activation_of(c)};
    return in;
}

static void spec_of(fx_op_spec *s, fx_dtype dtype, int rank, const int64_t *dims)
{
    s->dtype = dtype;
    s->rank = rank;
    memcpy(s->dims, dims, sizeof(int64_t) * (size_t)rank);
}

static void spec_like(fx_op_spec *s, const fx_tensor *t) { spec_of(s, t->dtype, t->rank, t->dims); }

/* ---- forward: results y, final_state ---- */

static int fwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_conv_inputs in = inputs_of(c);
    fx_conv_dims n;
    if (fx_conv_check(&in, &n, st))
        return st->code;
    const int64_t sd[3] = {n.batch, n.dim, n.width - 1};
    spec_like(&r[R_Y], in.x);
    spec_of(&r[R_FINAL_STATE], in.x->dtype, 3, sd);
    return FX_OK;
}

static int fwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_conv_inputs in = inputs_of(c);
    return fx_op_conv_forward_into(ex, &in, c->out[R_Y], c->out[R_FINAL_STATE], st);
}

static size_t fwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_conv_inputs in = inputs_of(c);
    return fx_op_conv_forward_scratch(ex, &in, c->out[R_Y], c->out[R_FINAL_STATE]);
}

/* ---- backward: the forward's inputs, dy, dfinal_state; a gradient each ---- */

static fx_conv_grad_outs grads_of(const fx_op_call *c)
{
    fx_conv_grad_outs g = {.dx = c->out[X], .dw = c->out[W], .dbias = c->out[BIAS],
                           .dinitial_state = c->out[INITIAL_STATE]};
    return g;
}

static int bwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_conv_inputs in = inputs_of(c);
    fx_conv_dims n;
    if (fx_conv_check_backward(&in, c->in[DY], c->in[DFINAL_STATE], &n, st))
        return st->code;
    for (int i = X; i <= INITIAL_STATE; i++)
        if (c->in[i])
            spec_like(&r[i], c->in[i]);
    return FX_OK;
}

static int bwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_conv_inputs in = inputs_of(c);
    fx_conv_grad_outs g = grads_of(c);
    return fx_op_conv_backward_into(ex, &in, c->in[DY], c->in[DFINAL_STATE], &g, st);
}

static size_t bwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_conv_inputs in = inputs_of(c);
    fx_conv_grad_outs g = grads_of(c);
    return fx_op_conv_backward_scratch(ex, &in, c->in[DY], c->in[DFINAL_STATE], &g);
}

/* ---- step: state, x, w, bias; results y, new_state ---- */

static int step_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_conv_inputs in = step_inputs_of(c);
    fx_conv_dims n;
    if (fx_conv_check_step(c->in[STEP_STATE], &in, &n, st))
        return st->code;
    spec_like(&r[R_STEP_Y], in.x);
    spec_like(&r[R_NEW_STATE], c->in[STEP_STATE]);
    return FX_OK;
}

static int step_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_conv_inputs in = step_inputs_of(c);
    return fx_op_conv_step_into(ex, c->out[R_NEW_STATE], &in, c->out[R_STEP_Y], st);
}

/* ---- the descriptions ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define FLAG(name, role) {name, FX_ATTR_FLAG, role, 0, NULL, {NULL}, false}
#define ACTIVATION {"activation", FX_ATTR_ENUM, FX_ATTR_OPTION, 0, NULL, {"none", "silu"}, false}
#define IN(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, false}
#define IN_IF(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, false, false}

static const fx_op_attr fwd_attrs[] = {
    ACTIVATION,
    FLAG("has_bias", FX_ATTR_PRESENCE),
    FLAG("has_initial_state", FX_ATTR_PRESENCE),
    FLAG("return_state", FX_ATTR_OPTION),
};

static const fx_op_attr bwd_attrs[] = {
    ACTIVATION,
    FLAG("has_bias", FX_ATTR_PRESENCE),
    FLAG("has_initial_state", FX_ATTR_PRESENCE),
    FLAG("has_dfinal_state", FX_ATTR_PRESENCE),
};

static const fx_op_attr step_attrs[] = {ACTIVATION, FLAG("has_bias", FX_ATTR_PRESENCE)};

#define CONV_INPUTS(role, opt)                                                                              \
    IN("x", L_X, role), IN("w", L_W, role), IN_IF("bias", L_CH, opt, "has_bias"),                         \
        IN_IF("initial_state", L_STATE, opt, "has_initial_state")

static const fx_op_io fwd_inputs[] = {CONV_INPUTS(FX_IO_ARG, FX_IO_OPTION)};

static const fx_op_io fwd_results[] = {
    IN("y", L_X, FX_IO_OUTPUT),
    IN_IF("final_state", L_STATE, FX_IO_OUTPUT, "return_state"),
};

static const fx_op_io bwd_inputs[] = {
    CONV_INPUTS(FX_IO_FORWARD, FX_IO_FORWARD),
    IN("dy", L_X, FX_IO_COTANGENT),
    IN_IF("dfinal_state", L_STATE, FX_IO_COTANGENT, "has_dfinal_state"),
};

static const fx_op_io bwd_results[] = {
    IN("dx", L_X, FX_IO_GRAD),
    IN("dw", L_W, FX_IO_GRAD),
    IN_IF("dbias", L_CH, FX_IO_GRAD, "has_bias"),
    IN_IF("dinitial_state", L_STATE, FX_IO_GRAD, "has_initial_state"),
};

static const fx_op_io step_inputs[] = {
    IN("state", L_STATE, FX_IO_STATE),
    IN("x", L_FRAME, FX_IO_ARG),
    IN("w", L_W, FX_IO_ARG),
    IN_IF("bias", L_CH, FX_IO_OPTION, "has_bias"),
};

static const fx_op_io step_results[] = {
    IN("y", L_FRAME, FX_IO_OUTPUT),
    IN("new_state", L_STATE, FX_IO_STATE),
};

static const char *const fwd_options[] = {"bias", "activation", "initial_state", "return_state",
                                          "save_for_backward", NULL};
static const char *const bwd_options[] = {"dfinal_state", NULL};
static const char *const step_options[] = {"bias", "activation", NULL};

const fx_op_desc fx_conv_op_descs[] = {
    {
        .name = "causal_conv1d_fwd", .op = "causal_conv1d", .family = "conv", .dir = FX_OP_FWD,
        .nattrs = COUNT(fwd_attrs), .ninputs = COUNT(fwd_inputs), .nresults = COUNT(fwd_results),
        .attrs = fwd_attrs, .inputs = fwd_inputs, .results = fwd_results,
        .check = fwd_check, .scratch = fwd_scratch, .run = fwd_run,
        .backward = "causal_conv1d_bwd", .options = fwd_options, .saved_by = "fusex:causal_conv1d",
    },
    {
        .name = "causal_conv1d_bwd", .op = "causal_conv1d", .family = "conv", .dir = FX_OP_BWD,
        .nattrs = COUNT(bwd_attrs), .ninputs = COUNT(bwd_inputs), .nresults = COUNT(bwd_results),
        .attrs = bwd_attrs, .inputs = bwd_inputs, .results = bwd_results,
        .check = bwd_check, .scratch = bwd_scratch, .run = bwd_run, .options = bwd_options,
    },
    {
        .name = "causal_conv1d_step", .op = "causal_conv1d", .family = "conv", .dir = FX_OP_STEP,
        .nattrs = COUNT(step_attrs), .ninputs = COUNT(step_inputs), .nresults = COUNT(step_results),
        .attrs = step_attrs, .inputs = step_inputs, .results = step_results,
        .check = step_check, .run = step_run, .options = step_options,
    },
};

const int fx_conv_op_ndescs = COUNT(fx_conv_op_descs);
