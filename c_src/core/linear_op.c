/* The linear layer's descriptions (core/op.h): its forward and backward
 * over the family's op layer (core/linear.c). Not XLA targets (`no_xla`):
 * inside an XLA program XLA's own products (and their fused epilogues)
 * are the right ones, so the layer serves Erlang and eager Elixir, and
 * the registry lists it after every XLA target. The backward reads what
 * the activation's derivative needs of the forward: y (relu, tanh,
 * sigmoid), the pre-activation (gelu, silu) or neither; each by a rule on
 * the activation. */
#include <string.h>

#include "core/linear.h"
#include "core/op.h"

#define L_X "[..., in]"
#define L_W "[out, in]"
#define L_B "[out]"
#define L_Y "[..., out]"

enum { X, W, BIAS, Y, PRE, DY };           /* the inputs (a forward's are the first three) */
enum { A_ACTIVATION, A_ALLOW_TF32, A_HAS_BIAS, A_SAVE };
enum { R_Y, R_PRE };

/* The enum's choices are fx_activation's names in its order. */
static int activation_of(const fx_op_call *c) { return (int)c->attrs[A_ACTIVATION]; }

static fx_linear_inputs inputs_of(const fx_op_call *c)
{
    fx_linear_inputs in = {.x = c->in[X], .w = c->in[W], .bias = c->in[BIAS], .activation = activation_of(c),
                           .allow_tf32 = c->attrs[A_ALLOW_TF32] != 0};
    return in;
}

/* The forward's pre-activation is a result when it saves and the
 * activation's derivative reads it; the backward takes y and pre where
 * that derivative reads them. */
static int saved_present(const fx_op_call *c, bool is_result, int index, bool *present, fx_status *st)
{
    (void)st;
    const int act = activation_of(c);
    if (is_result)
        *present = index == R_PRE && c->attrs[A_SAVE] != 0 && fx_linear_reads_pre(act);
    else
        *present = index == Y ? fx_linear_reads_output(act) : index == PRE && fx_linear_reads_pre(act);
    return FX_OK;
}

static void spec_of(fx_op_spec *s, fx_dtype dtype, int rank, const int64_t *dims)
{
    s->dtype = dtype;
    s->rank = rank;
    memcpy(s->dims, dims, sizeof(int64_t) * (size_t)rank);
}

static void spec_like(fx_op_spec *s, const fx_tensor *t) { spec_of(s, t->dtype, t->rank, t->dims); }

/* ---- forward: results y, pre ---- */

static int fwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_linear_inputs in = inputs_of(c);
    fx_linear_dims n;
    if (fx_linear_check(&in, &n, st))
        return st->code;
    int64_t dims[FX_MAX_RANK];
    const int rank = fx_linear_output_shape(in.x, n.out, dims);
    spec_of(&r[R_Y], in.x->dtype, rank, dims);
    spec_of(&r[R_PRE], in.x->dtype, rank, dims);
    return FX_OK;
}

static int fwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_linear_inputs in = inputs_of(c);
    return fx_op_linear_forward_into(ex, &in, c->out[R_Y], c->out[R_PRE], st);
}

static size_t fwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_linear_inputs in = inputs_of(c);
    return fx_op_linear_forward_scratch(ex, &in, c->out[R_Y], c->out[R_PRE]);
}

/* ---- backward: x, w, bias, y, pre, dy; dx, dw, dbias ---- */

static int bwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_linear_inputs in = inputs_of(c);
    fx_linear_dims n;
    if (fx_linear_check_backward(&in, c->in[Y], c->in[PRE], c->in[DY], &n, st))
        return st->code;
    for (int i = X; i <= BIAS; i++)
        if (c->in[i])
            spec_like(&r[i], c->in[i]);
    return FX_OK;
}

static fx_linear_grad_outs grads_of(const fx_op_call *c)
{
    fx_linear_grad_outs g = {.dx = c->out[X], .dw = c->out[W], .dbias = c->out[BIAS]};
    return g;
}

static int bwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_linear_inputs in = inputs_of(c);
    fx_linear_grad_outs g = grads_of(c);
    return fx_op_linear_backward_into(ex, &in, c->in[Y], c->in[PRE], c->in[DY], &g, st);
}

static size_t bwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_linear_inputs in = inputs_of(c);
    fx_linear_grad_outs g = grads_of(c);
    return fx_op_linear_backward_scratch(ex, &in, c->in[Y], c->in[PRE], c->in[DY], &g);
}

/* ---- the descriptions ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define FLAG(name, role) {name, FX_ATTR_FLAG, role, 0, NULL, {NULL}, false}
#define ACTIVATION                                                                                          \
    {"activation", FX_ATTR_ENUM, FX_ATTR_OPTION, 0, NULL, {"none", "relu", "gelu", "silu", "tanh", "sigmoid"}, \
     false}
#define IN(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, false}
#define IN_IF(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, false, false}
#define BY_RULE(name, layout, role, kept) {name, layout, role, FX_WHEN_RULE, NULL, kept, false}

static const fx_op_attr fwd_attrs[] = {ACTIVATION, FLAG("allow_tf32", FX_ATTR_OPTION),
                                       FLAG("has_bias", FX_ATTR_PRESENCE), FLAG("save", FX_ATTR_SAVE)};
static const fx_op_attr bwd_attrs[] = {ACTIVATION, FLAG("allow_tf32", FX_ATTR_OPTION),
                                       FLAG("has_bias", FX_ATTR_PRESENCE)};

static const fx_op_io fwd_inputs[] = {IN("x", L_X, FX_IO_ARG), IN("w", L_W, FX_IO_ARG),
                                      IN_IF("bias", L_B, FX_IO_OPTION, "has_bias")};
static const fx_op_io fwd_results[] = {
    {"y", L_Y, FX_IO_OUTPUT, FX_WHEN_ALWAYS, NULL, true, false},
    BY_RULE("pre", L_Y, FX_IO_SAVED, true),
};
static const fx_op_io bwd_inputs[] = {
    IN("x", L_X, FX_IO_FORWARD),         IN("w", L_W, FX_IO_FORWARD),
    IN_IF("bias", L_B, FX_IO_FORWARD, "has_bias"), BY_RULE("y", L_Y, FX_IO_SAVED, false),
    BY_RULE("pre", L_Y, FX_IO_SAVED, false),      IN("dy", L_Y, FX_IO_COTANGENT),
};
static const fx_op_io bwd_results[] = {IN("dx", L_X, FX_IO_GRAD), IN("dw", L_W, FX_IO_GRAD),
                                       IN_IF("dbias", L_B, FX_IO_GRAD, "has_bias")};

static const char *const fwd_options[] = {"bias", "activation", "allow_tf32", "save_for_backward", NULL};

const fx_op_desc fx_linear_op_descs[] = {
    {
        .name = "linear_fwd", .op = "linear", .family = "linear", .dir = FX_OP_FWD,
        .nattrs = COUNT(fwd_attrs), .ninputs = COUNT(fwd_inputs), .nresults = COUNT(fwd_results),
        .attrs = fwd_attrs, .inputs = fwd_inputs, .results = fwd_results, .present = saved_present,
        .check = fwd_check, .scratch = fwd_scratch, .run = fwd_run, .backward = "linear_bwd",
        .options = fwd_options, .saved_by = "fusex:linear", .no_xla = true,
    },
    {
        .name = "linear_bwd", .op = "linear", .family = "linear", .dir = FX_OP_BWD,
        .nattrs = COUNT(bwd_attrs), .ninputs = COUNT(bwd_inputs), .nresults = COUNT(bwd_results),
        .attrs = bwd_attrs, .inputs = bwd_inputs, .results = bwd_results, .present = saved_present,
        .check = bwd_check, .scratch = bwd_scratch, .run = bwd_run, .no_xla = true,
    },
};

const int fx_linear_op_ndescs = COUNT(fx_linear_op_descs);
