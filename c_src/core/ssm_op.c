/* The selective scan's descriptions (core/op.h): the forward, its
 * backward and the step, with operands, attributes and results in the
 * order of docs/XLA.md, over the family's op layer (core/ssm.c). */
#include <string.h>

#include "core/op.h"
#include "core/ssm.h"

#define L_X "[batch, seqlen, dim]"
#define L_A "[dim, dstate]"
#define L_B "[batch, seqlen, [groups,] dstate]"
#define L_CH "[dim]"
#define L_STATE "[batch, dim, dstate]"
#define L_SAVED "[batch, nsaved, dim, dstate]"
#define L_FRAME "[batch, dim]"
#define L_FRAME_B "[batch, [groups,] dstate]"

/* The forward's inputs are the backward's first, in the same places. */
enum { X, DT, A, B, C, D, Z, DT_BIAS, H0, SAVED, DY, DSTATE };
enum { STEP_STATE, STEP_X }; /* a step's inputs: its state, then x ... dt_bias */
enum { A_SOFTPLUS, A_HAS_D, A_HAS_Z, A_HAS_BIAS, A_HAS_H0, A_RETURN_STATE, A_SAVE };
enum { R_Y, R_STATE, R_SAVED };
enum { R_NEW_STATE = 1 };

static const fx_tensor *in_at(const fx_op_call *c, int i) { return c->in[i]; }

/* The scan's inputs from the call's, `first` the place of x. */
static fx_ssm_inputs inputs_of(const fx_op_call *c, int first, bool with_h0)
{
    fx_ssm_inputs in = {
        .x = in_at(c, first + X), .dt = in_at(c, first + DT), .a = in_at(c, first + A),
        .b = in_at(c, first + B), .c = in_at(c, first + C), .d = in_at(c, first + D),
        .z = in_at(c, first + Z), .dt_bias = in_at(c, first + DT_BIAS),
        .h0 = with_h0 ? in_at(c, first + H0) : NULL, .dt_softplus = c->attrs[A_SOFTPLUS] != 0,
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

/* The saved states exist past the first chunk: a result of the forward
 * when it saves, an operand of the backward. */
static int saved_present(const fx_op_call *c, bool result, int index, bool *present, fx_status *st)
{
    (void)index;
    *present = false;
    if (result && c->attrs[A_SAVE] == 0)
        return FX_OK;
    fx_ssm_inputs in = inputs_of(c, 0, true);
    fx_ssm_dims n;
    if (fx_ssm_check_forward(&in, &n, st))
        return st->code;
    *present = fx_ssm_nsaved(&n, in.x->dtype) > 0;
    return FX_OK;
}

static bool saves_on(const fx_device *dev) { return dev->backend->ssm && dev->backend->ssm->reads_saved; }

/* ---- forward ---- */

static int fwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_ssm_inputs in = inputs_of(c, 0, true);
    fx_ssm_dims n;
    if (fx_ssm_check_forward(&in, &n, st))
        return st->code;
    fx_dtype state = fx_ssm_state_dtype(in.x->dtype);
    int64_t sdims[3] = {n.batch, n.dim, n.dstate}, saved[4];
    spec_like(&r[R_Y], in.x);
    spec_of(&r[R_STATE], state, 3, sdims);
    spec_of(&r[R_SAVED], state, fx_ssm_saved_shape(&n, in.x->dtype, saved), saved);
    return FX_OK;
}

static int fwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_ssm_inputs in = inputs_of(c, 0, true);
    return fx_op_ssm_forward_into(ex, &in, c->out[R_Y], c->out[R_STATE], c->out[R_SAVED], st);
}

static size_t fwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_ssm_inputs in = inputs_of(c, 0, true);
    return fx_op_ssm_forward_scratch(ex, &in, c->out[R_Y], c->out[R_STATE], c->out[R_SAVED]);
}

/* ---- backward ---- */

static fx_ssm_grad_outs grads_of(const fx_op_call *c)
{
    fx_ssm_grad_outs g = {
        .x = c->out[X], .dt = c->out[DT], .a = c->out[A], .b = c->out[B], .c = c->out[C],
        .d = c->out[D], .z = c->out[Z], .dt_bias = c->out[DT_BIAS], .h0 = c->out[H0],
    };
    return g;
}

static int bwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_ssm_inputs in = inputs_of(c, 0, true);
    fx_ssm_dims n;
    if (fx_ssm_check_backward(&in, c->in[SAVED], c->in[DY], c->in[DSTATE], &n, st))
        return st->code;
    for (int i = X; i <= H0; i++)
        if (c->in[i])
            spec_like(&r[i], c->in[i]);
    return FX_OK;
}

static int bwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_ssm_inputs in = inputs_of(c, 0, true);
    fx_ssm_grad_outs g = grads_of(c);
    return fx_op_ssm_backward_into(ex, &in, c->in[SAVED], c->in[DY], c->in[DSTATE], &g, st);
}

static size_t bwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_ssm_inputs in = inputs_of(c, 0, true);
    fx_ssm_grad_outs g = grads_of(c);
    return fx_op_ssm_backward_scratch(ex, &in, c->in[SAVED], c->in[DY], c->in[DSTATE], &g);
}

/* ---- step ---- */

static int step_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_ssm_inputs in = inputs_of(c, STEP_X, false);
    fx_ssm_dims n;
    if (fx_ssm_check_step(c->in[STEP_STATE], &in, &n, st))
        return st->code;
    spec_like(&r[R_Y], in.x);
    spec_like(&r[R_NEW_STATE], c->in[STEP_STATE]);
    return FX_OK;
}

static int step_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_ssm_inputs in = inputs_of(c, STEP_X, false);
    return fx_op_ssm_step_into(ex, c->out[R_NEW_STATE], &in, c->out[R_Y], st);
}

/* ---- the descriptions ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define FLAG(name, role) {name, FX_ATTR_FLAG, role, 0, NULL, {NULL, NULL}, false}
#define IN(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, false}
#define IN_IF(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, false, false}

static const fx_op_attr fwd_attrs[] = {
    FLAG("dt_softplus", FX_ATTR_OPTION), FLAG("has_d", FX_ATTR_PRESENCE),       FLAG("has_z", FX_ATTR_PRESENCE),
    FLAG("has_dt_bias", FX_ATTR_PRESENCE), FLAG("has_h0", FX_ATTR_PRESENCE),    FLAG("return_state", FX_ATTR_OPTION),
    FLAG("save", FX_ATTR_SAVE),
};

static const fx_op_attr bwd_attrs[] = {
    FLAG("dt_softplus", FX_ATTR_OPTION), FLAG("has_d", FX_ATTR_PRESENCE),    FLAG("has_z", FX_ATTR_PRESENCE),
    FLAG("has_dt_bias", FX_ATTR_PRESENCE), FLAG("has_h0", FX_ATTR_PRESENCE), FLAG("has_dstate", FX_ATTR_PRESENCE),
};

static const fx_op_attr step_attrs[] = {
    FLAG("dt_softplus", FX_ATTR_OPTION),
    FLAG("has_d", FX_ATTR_PRESENCE),
    FLAG("has_z", FX_ATTR_PRESENCE),
    FLAG("has_dt_bias", FX_ATTR_PRESENCE),
};

#define SCAN_INPUTS(role, opt)                                                                              \
    IN("x", L_X, role), IN("dt", L_X, role), IN("a", L_A, role), IN("b", L_B, role), IN("c", L_B, role),   \
        IN_IF("d", L_CH, opt, "has_d"), IN_IF("z", L_X, opt, "has_z"),                                     \
        IN_IF("dt_bias", L_CH, opt, "has_dt_bias"), IN_IF("h0", L_STATE, opt, "has_h0")

static const fx_op_io fwd_inputs[] = {SCAN_INPUTS(FX_IO_ARG, FX_IO_OPTION)};

static const fx_op_io fwd_results[] = {
    IN("y", L_X, FX_IO_OUTPUT),
    IN_IF("state", L_STATE, FX_IO_OUTPUT, "return_state"),
    {"saved", L_SAVED, FX_IO_SAVED, FX_WHEN_RULE, NULL, true, false},
};

static const fx_op_io bwd_inputs[] = {
    SCAN_INPUTS(FX_IO_FORWARD, FX_IO_FORWARD),
    {"saved", L_SAVED, FX_IO_SAVED, FX_WHEN_RULE, NULL, false, false},
    IN("dy", L_X, FX_IO_COTANGENT),
    IN_IF("dstate", L_STATE, FX_IO_COTANGENT, "has_dstate"),
};

static const fx_op_io bwd_results[] = {
    IN("dx", L_X, FX_IO_GRAD),
    IN("ddt", L_X, FX_IO_GRAD),
    IN("da", L_A, FX_IO_GRAD),
    IN("db", L_B, FX_IO_GRAD),
    IN("dc", L_B, FX_IO_GRAD),
    IN_IF("dd", L_CH, FX_IO_GRAD, "has_d"),
    IN_IF("dz", L_X, FX_IO_GRAD, "has_z"),
    IN_IF("ddt_bias", L_CH, FX_IO_GRAD, "has_dt_bias"),
    IN_IF("dh0", L_STATE, FX_IO_GRAD, "has_h0"),
};

static const fx_op_io step_inputs[] = {
    IN("state", L_STATE, FX_IO_STATE),
    IN("x", L_FRAME, FX_IO_ARG),
    IN("dt", L_FRAME, FX_IO_ARG),
    IN("a", L_A, FX_IO_ARG),
    IN("b", L_FRAME_B, FX_IO_ARG),
    IN("c", L_FRAME_B, FX_IO_ARG),
    IN_IF("d", L_CH, FX_IO_OPTION, "has_d"),
    IN_IF("z", L_FRAME, FX_IO_OPTION, "has_z"),
    IN_IF("dt_bias", L_CH, FX_IO_OPTION, "has_dt_bias"),
};

static const fx_op_io step_results[] = {
    IN("y", L_FRAME, FX_IO_OUTPUT),
    IN("new_state", L_STATE, FX_IO_STATE),
};

static const char *const fwd_options[] = {"d", "z", "dt_bias", "dt_softplus", "h0", "return_state",
                                          "save_for_backward", NULL};
static const char *const bwd_options[] = {"dstate", NULL};
static const char *const step_options[] = {"d", "z", "dt_bias", "dt_softplus", NULL};

const fx_op_desc fx_ssm_op_descs[] = {
    {
        .name = "selective_scan_fwd", .op = "selective_scan", .family = "ssm", .dir = FX_OP_FWD,
        .nattrs = COUNT(fwd_attrs), .ninputs = COUNT(fwd_inputs), .nresults = COUNT(fwd_results),
        .attrs = fwd_attrs, .inputs = fwd_inputs, .results = fwd_results,
        .present = saved_present, .check = fwd_check, .scratch = fwd_scratch, .run = fwd_run,
        .backward = "selective_scan_bwd", .options = fwd_options, .saves_on = saves_on,
    },
    {
        .name = "selective_scan_bwd", .op = "selective_scan", .family = "ssm", .dir = FX_OP_BWD,
        .nattrs = COUNT(bwd_attrs), .ninputs = COUNT(bwd_inputs), .nresults = COUNT(bwd_results),
        .attrs = bwd_attrs, .inputs = bwd_inputs, .results = bwd_results,
        .present = saved_present, .check = bwd_check, .scratch = bwd_scratch, .run = bwd_run,
        .options = bwd_options,
    },
    {
        .name = "selective_scan_step", .op = "selective_scan", .family = "ssm", .dir = FX_OP_STEP,
        .nattrs = COUNT(step_attrs), .ninputs = COUNT(step_inputs), .nresults = COUNT(step_results),
        .attrs = step_attrs, .inputs = step_inputs, .results = step_results,
        .check = step_check, .run = step_run, .options = step_options,
    },
};

const int fx_ssm_op_ndescs = COUNT(fx_ssm_op_descs);
