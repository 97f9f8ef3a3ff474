/* The norms' descriptions (core/op.h): rms_norm's and layer_norm's
 * forward and backward, with operands, attributes and results in the
 * order of docs/XLA.md, over the family's op layer (core/norm.c). Both are
 * laid out alike: x, weight, bias (an option of rms_norm, an argument of
 * layer_norm), residual, gate; the forward's results y, s (x + residual,
 * with a residual), then what a training forward saves (layer_norm's
 * mean, rstd); the backward reads the forward's inputs, s, the statistics,
 * dy and ds. Attributes: eps, residual_in_f32, the presence flags, then
 * the forward's save. */
#include <string.h>

#include "core/norm.h"
#include "core/op.h"

#define L_X "[..., hidden]"
#define L_H "[hidden]"
#define L_ROWS "[rows]"

enum { X, WEIGHT, BIAS, RESIDUAL, GATE }; /* the inputs both directions begin with */
enum { A_EPS, A_RESIDUAL_IN_F32 };       /* the attributes every description begins with */
enum { R_Y, R_S };                       /* the forward's first results */

/* An input or a result by name (NULL: absent, or none of that name). */
static const fx_tensor *input(const fx_op_call *c, const char *name)
{
    int i = fx_op_input_index(c->op, name);
    return i >= 0 ? c->in[i] : NULL;
}

static const fx_tensor *result(const fx_op_call *c, const char *name)
{
    int r = fx_op_result_index(c->op, name);
    return r >= 0 ? c->out[r] : NULL;
}

static fx_norm_inputs inputs_of(const fx_op_call *c)
{
    fx_norm_inputs in = {
        .kind = c->op->variant, .eps = c->attrs[A_EPS], .x = c->in[X], .weight = c->in[WEIGHT],
        .bias = c->in[BIAS], .residual = c->in[RESIDUAL], .gate = c->in[GATE],
        .residual_in_f32 = c->attrs[A_RESIDUAL_IN_F32] != 0,
    };
    return in;
}

static void spec_of(fx_op_spec *s, fx_dtype dtype, int rank, const int64_t *dims)
{
    s->dtype = dtype;
    s->rank = rank;
    memcpy(s->dims, dims, sizeof(int64_t) * (size_t)rank);
}

static void spec_like(fx_op_spec *s, const fx_tensor *t) { spec_of(s, t->dtype, t->rank, t->dims); }

/* ---- forward: results y, s, (mean,) rstd ---- */

static int fwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_norm_inputs in = inputs_of(c);
    fx_norm_dims n;
    if (fx_norm_check(&in, &n, st))
        return st->code;
    spec_like(&r[R_Y], in.x);
    if (in.residual)
        spec_of(&r[R_S], fx_norm_residual_out_type(&in), in.x->rank, in.x->dims);
    const int64_t rows[1] = {n.rows};
    for (int k = R_S + 1; k < c->op->nresults; k++) /* the statistics */
        spec_of(&r[k], fx_norm_stat_type(in.x->dtype), 1, rows);
    return FX_OK;
}

static int fwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_norm_inputs in = inputs_of(c);
    return fx_op_norm_forward_into(ex, &in, c->out[R_Y], c->out[R_S], result(c, "mean"), result(c, "rstd"), st);
}

static size_t fwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_norm_inputs in = inputs_of(c);
    return fx_op_norm_forward_scratch(ex, &in, c->out[R_Y], c->out[R_S], result(c, "mean"), result(c, "rstd"));
}

/* ---- backward: a gradient per input given ---- */

static fx_norm_grad_outs grads_of(const fx_op_call *c)
{
    fx_norm_grad_outs g = {.dx = c->out[X], .dweight = c->out[WEIGHT], .dbias = c->out[BIAS],
                           .dresidual = c->out[RESIDUAL], .dgate = c->out[GATE]};
    return g;
}

static int bwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_norm_inputs in = inputs_of(c);
    fx_norm_dims n;
    if (fx_norm_check_backward(&in, input(c, "s"), input(c, "mean"), input(c, "rstd"), input(c, "dy"),
                               input(c, "ds"), &n, st))
        return st->code;
    for (int i = X; i <= GATE; i++)
        if (c->in[i])
            spec_like(&r[i], c->in[i]);
    return FX_OK;
}

static int bwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_norm_inputs in = inputs_of(c);
    fx_norm_grad_outs g = grads_of(c);
    return fx_op_norm_backward_into(ex, &in, input(c, "s"), input(c, "mean"), input(c, "rstd"), input(c, "dy"),
                                    input(c, "ds"), &g, st);
}

static size_t bwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_norm_inputs in = inputs_of(c);
    fx_norm_grad_outs g = grads_of(c);
    return fx_op_norm_backward_scratch(ex, &in, input(c, "s"), input(c, "mean"), input(c, "rstd"), input(c, "dy"),
                                       input(c, "ds"), &g);
}

/* ---- the descriptions ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define FLAG(name, role) {name, FX_ATTR_FLAG, role, 0, NULL, {NULL}, false}
#define EPS {"eps", FX_ATTR_NUMBER, FX_ATTR_OPTION, 1e-5, NULL, {NULL}, false}
#define IN(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, false}
#define IN_IF(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, false, false}
#define KEPT(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, true, false}

#define HEAD EPS, FLAG("residual_in_f32", FX_ATTR_OPTION)
#define TAIL FLAG("has_residual", FX_ATTR_PRESENCE), FLAG("has_gate", FX_ATTR_PRESENCE)
static const fx_op_attr rms_fwd_attrs[] = {HEAD, FLAG("has_bias", FX_ATTR_PRESENCE), TAIL, FLAG("save", FX_ATTR_SAVE)};
static const fx_op_attr layer_fwd_attrs[] = {HEAD, TAIL, FLAG("save", FX_ATTR_SAVE)};
static const fx_op_attr rms_bwd_attrs[] = {HEAD, FLAG("has_bias", FX_ATTR_PRESENCE), TAIL,
                                           FLAG("has_ds", FX_ATTR_PRESENCE)};
static const fx_op_attr layer_bwd_attrs[] = {HEAD, TAIL, FLAG("has_ds", FX_ATTR_PRESENCE)};

/* x, weight, bias, residual, gate: forward inputs (role ARG, options
 * OPTION) or a backward's (FORWARD); rms_norm's bias is an option. */
#define NORM_INPUTS(role, opt, bias)                                                                        \
    IN("x", L_X, role), IN("weight", L_H, role), bias, IN_IF("residual", L_X, opt, "has_residual"),        \
        IN_IF("gate", L_X, opt, "has_gate")

static const fx_op_io rms_fwd_inputs[] = {
    NORM_INPUTS(FX_IO_ARG, FX_IO_OPTION, IN_IF("bias", L_H, FX_IO_OPTION, "has_bias"))};
static const fx_op_io layer_fwd_inputs[] = {NORM_INPUTS(FX_IO_ARG, FX_IO_OPTION, IN("bias", L_H, FX_IO_ARG))};

#define S_RESULT KEPT("s", L_X, FX_IO_OUTPUT, "has_residual")
static const fx_op_io rms_fwd_results[] = {
    IN("y", L_X, FX_IO_OUTPUT), S_RESULT, KEPT("rstd", L_ROWS, FX_IO_SAVED, "save")};
static const fx_op_io layer_fwd_results[] = {
    IN("y", L_X, FX_IO_OUTPUT), S_RESULT, KEPT("mean", L_ROWS, FX_IO_SAVED, "save"),
    KEPT("rstd", L_ROWS, FX_IO_SAVED, "save")};

#define BWD_TAIL                                                                                            \
    IN("rstd", L_ROWS, FX_IO_SAVED), IN("dy", L_X, FX_IO_COTANGENT), IN_IF("ds", L_X, FX_IO_COTANGENT, "has_ds")
#define S_INPUT IN_IF("s", L_X, FX_IO_SAVED, "has_residual")
static const fx_op_io rms_bwd_inputs[] = {
    NORM_INPUTS(FX_IO_FORWARD, FX_IO_FORWARD, IN_IF("bias", L_H, FX_IO_FORWARD, "has_bias")), S_INPUT, BWD_TAIL};
static const fx_op_io layer_bwd_inputs[] = {NORM_INPUTS(FX_IO_FORWARD, FX_IO_FORWARD, IN("bias", L_H, FX_IO_FORWARD)),
                                            S_INPUT, IN("mean", L_ROWS, FX_IO_SAVED), BWD_TAIL};

#define GRADS(bias)                                                                                         \
    IN("dx", L_X, FX_IO_GRAD), IN("dweight", L_H, FX_IO_GRAD), bias,                                       \
        IN_IF("dresidual", L_X, FX_IO_GRAD, "has_residual"), IN_IF("dgate", L_X, FX_IO_GRAD, "has_gate")
static const fx_op_io rms_bwd_results[] = {GRADS(IN_IF("dbias", L_H, FX_IO_GRAD, "has_bias"))};
static const fx_op_io layer_bwd_results[] = {GRADS(IN("dbias", L_H, FX_IO_GRAD))};

static const char *const rms_fwd_options[] = {"bias", "residual", "gate", "eps", "residual_in_f32",
                                              "save_for_backward", NULL};
static const char *const layer_fwd_options[] = {"residual", "gate", "eps", "residual_in_f32", "save_for_backward",
                                                NULL};
static const char *const bwd_options[] = {"ds", NULL};

/* One norm's two descriptions: NAME its name, `kind` its fx_norm_kind,
 * `fam` its arrays' prefix. */
#define NORM_OP(NAME, kind, fam)                                                                              \
    {.name = NAME "_fwd", .op = NAME, .family = "norm", .dir = FX_OP_FWD, .variant = kind,                     \
     .nattrs = COUNT(fam##_fwd_attrs), .ninputs = COUNT(fam##_fwd_inputs), .nresults = COUNT(fam##_fwd_results), \
     .attrs = fam##_fwd_attrs, .inputs = fam##_fwd_inputs, .results = fam##_fwd_results, .check = fwd_check,  \
     .scratch = fwd_scratch, .run = fwd_run, .backward = NAME "_bwd", .options = fam##_fwd_options,           \
     .saved_by = "fusex:" NAME},                                                                                \
    {.name = NAME "_bwd", .op = NAME, .family = "norm", .dir = FX_OP_BWD, .variant = kind,                     \
     .nattrs = COUNT(fam##_bwd_attrs), .ninputs = COUNT(fam##_bwd_inputs), .nresults = COUNT(fam##_bwd_results), \
     .attrs = fam##_bwd_attrs, .inputs = fam##_bwd_inputs, .results = fam##_bwd_results, .check = bwd_check,  \
     .scratch = bwd_scratch, .run = bwd_run, .options = bwd_options}

const fx_op_desc fx_norm_op_descs[] = {
    NORM_OP("rms_norm", FX_NORM_RMS, rms),
    NORM_OP("layer_norm", FX_NORM_LAYER, layer),
};

const int fx_norm_op_ndescs = COUNT(fx_norm_op_descs);
