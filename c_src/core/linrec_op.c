/* The linear recurrences' descriptions (core/op.h): for each op (the
 * generic scan, MinGRU, MinLSTM, Liquid) its forward, backward and step,
 * with operands, attributes and results in the order of docs/XLA.md, over
 * the family's op layer (core/linrec.c). Every description of an op is
 * laid out alike: the sequence inputs P (liquid: then tau, a and the dt
 * tensor), then h0; attributes reverse, candidate_g or has_dt, has_h0,
 * return_state or has_dstate, then liquid's number dt. */
#include <string.h>

#include "core/linrec.h"
#include "core/op.h"

#define L_SEQ "[batch, seqlen, hidden]"
#define L_FRAME "[batch, hidden]"
#define L_HIDDEN "[hidden]"
#define L_DT "[batch, seqlen, 1]"
#define L_DT_FRAME "[batch, 1]"

static bool liquid(int kind) { return kind == FX_LINREC_LIQUID; }
static bool gated(int kind) { return kind == FX_LINREC_MINGRU || kind == FX_LINREC_MINLSTM; }

/* Inputs of a forward or backward before h0: P, liquid's tau, a, dt. */
static int nparams(int kind) { return fx_linrec_nseq(kind) + (liquid(kind) ? 3 : 0); }

/* The recurrence's inputs from the call's, `first` the place of P's
 * first (a step's state comes before it). */
static fx_linrec_inputs inputs_of(const fx_op_call *c, int first, bool with_h0)
{
    const fx_op_desc *d = c->op;
    int kind = d->variant, n = fx_linrec_nseq(kind);
    fx_linrec_inputs in;
    memset(&in, 0, sizeof in);
    in.kind = kind;
    for (int i = 0; i < n; i++)
        in.seq[i] = c->in[first + i];
    if (liquid(kind)) {
        in.tau = c->in[first + n];
        in.lam = c->in[first + n + 1];
        in.dt = c->in[first + n + 2];
        in.dt_value = c->attrs[d->nattrs - 1];
    }
    in.reverse = c->attrs[0] != 0;
    in.candidate_g = gated(kind) && c->attrs[1] != 0;
    in.h0 = with_h0 ? c->in[first + nparams(kind)] : NULL;
    return in;
}

static void spec_of(fx_op_spec *s, fx_dtype dtype, int rank, const int64_t *dims)
{
    s->dtype = dtype;
    s->rank = rank;
    memcpy(s->dims, dims, sizeof(int64_t) * (size_t)rank);
}

static void spec_like(fx_op_spec *s, const fx_tensor *t) { spec_of(s, t->dtype, t->rank, t->dims); }

/* ---- forward: results h, state ---- */

static int fwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_linrec_inputs in = inputs_of(c, 0, true);
    fx_linrec_problem p;
    if (fx_linrec_check_forward(&in, &p, st))
        return st->code;
    int64_t hdims[3] = {p.batch, p.seqlen, p.hidden}, sdims[2] = {p.batch, p.hidden};
    spec_of(&r[0], p.dtype, 3, hdims);
    spec_of(&r[1], fx_linrec_state_dtype(p.dtype), 2, sdims);
    return FX_OK;
}

static int fwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_linrec_inputs in = inputs_of(c, 0, true);
    return fx_op_linrec_forward_into(ex, &in, 0, c->out[0], c->out[1], st);
}

static size_t fwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    fx_linrec_inputs in = inputs_of(c, 0, true);
    return fx_op_linrec_forward_scratch(ex, &in, 0, c->out[0], c->out[1]);
}

/* ---- backward: inputs P, h0, h, dh, dstate; one gradient per input ---- */

typedef struct bwd_call {
    fx_linrec_inputs in;
    const fx_tensor *h, *dh, *dstate;
    fx_linrec_grad_outs g;
} bwd_call;

static bwd_call bwd_of(const fx_op_call *c)
{
    bwd_call b;
    memset(&b, 0, sizeof b);
    b.in = inputs_of(c, 0, true);
    int kind = c->op->variant, h0 = nparams(kind), n = fx_linrec_nseq(kind);
    b.h = c->in[h0 + 1];
    b.dh = c->in[h0 + 2];
    b.dstate = c->in[h0 + 3];
    for (int i = 0; i < n; i++)
        b.g.seq[i] = c->out[i];
    if (liquid(kind)) {
        b.g.tau = c->out[n];
        b.g.lam = c->out[n + 1];
        b.g.dt = c->out[n + 2];
    }
    b.g.h0 = c->out[h0];
    return b;
}

static int bwd_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    bwd_call b = bwd_of(c);
    fx_linrec_problem p;
    if (fx_linrec_check_backward(&b.in, b.h, b.dh, b.dstate, &p, st))
        return st->code;
    for (int i = 0; i <= nparams(c->op->variant); i++)
        if (c->in[i])
            spec_like(&r[i], c->in[i]);
    return FX_OK;
}

static int bwd_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    bwd_call b = bwd_of(c);
    return fx_op_linrec_backward_into(ex, &b.in, b.h, b.dh, b.dstate, 0, &b.g, st);
}

static size_t bwd_scratch(const fx_exec *ex, const fx_op_call *c)
{
    bwd_call b = bwd_of(c);
    return fx_op_linrec_backward_scratch(ex, &b.in, b.h, b.dh, b.dstate, 0, &b.g);
}

/* ---- step: inputs state, P; results h, new_state ---- */

static int step_check(const fx_op_call *c, fx_op_spec *r, fx_status *st)
{
    fx_linrec_inputs in = inputs_of(c, 1, false);
    fx_linrec_problem p;
    if (fx_linrec_check_step(&in, c->in[0], &p, st))
        return st->code;
    int64_t dims[2] = {p.batch, p.hidden};
    spec_of(&r[0], p.dtype, 2, dims);
    spec_like(&r[1], c->in[0]);
    return FX_OK;
}

static int step_run(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_linrec_inputs in = inputs_of(c, 1, false);
    return fx_op_linrec_step_into(ex, &in, c->out[1], c->out[0], st);
}

/* ---- the descriptions ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define FLAG(name, role) {name, FX_ATTR_FLAG, role, 0, NULL, {NULL, NULL}, false}
#define CANDIDATE {"candidate_g", FX_ATTR_FLAG, FX_ATTR_OPTION, 0, "candidate_activation", {"identity", "g"}, false}
#define DT_NUMBER {"dt", FX_ATTR_NUMBER, FX_ATTR_OPTION, 1.0, NULL, {NULL, NULL}, true}
#define IN(name, layout, role) {name, layout, role, FX_WHEN_ALWAYS, NULL, false, false}
#define IN_IF(name, layout, role, flag) {name, layout, role, FX_WHEN_FLAG, flag, false, false}

#define REVERSE FLAG("reverse", FX_ATTR_OPTION)
#define HAS_DT FLAG("has_dt", FX_ATTR_PRESENCE)
#define HAS_H0 FLAG("has_h0", FX_ATTR_PRESENCE)
#define RETURN_STATE FLAG("return_state", FX_ATTR_OPTION)
#define HAS_DSTATE FLAG("has_dstate", FX_ATTR_PRESENCE)

static const fx_op_attr scan_fwd_attrs[] = {REVERSE, HAS_H0, RETURN_STATE};
static const fx_op_attr gated_fwd_attrs[] = {REVERSE, CANDIDATE, HAS_H0, RETURN_STATE};
static const fx_op_attr liquid_fwd_attrs[] = {REVERSE, HAS_DT, HAS_H0, RETURN_STATE, DT_NUMBER};
static const fx_op_attr scan_bwd_attrs[] = {REVERSE, HAS_H0, HAS_DSTATE};
static const fx_op_attr gated_bwd_attrs[] = {REVERSE, CANDIDATE, HAS_H0, HAS_DSTATE};
static const fx_op_attr liquid_bwd_attrs[] = {REVERSE, HAS_DT, HAS_H0, HAS_DSTATE, DT_NUMBER};
static const fx_op_attr scan_step_attrs[] = {REVERSE};
static const fx_op_attr gated_step_attrs[] = {REVERSE, CANDIDATE};
static const fx_op_attr liquid_step_attrs[] = {REVERSE, HAS_DT, DT_NUMBER};

/* P as forward inputs (role ARG) or as a backward's (role FORWARD). */
#define SCAN_P(role) IN("a", L_SEQ, role), IN("b", L_SEQ, role)
#define MINGRU_P(role) IN("z_logits", L_SEQ, role), IN("cand", L_SEQ, role)
#define MINLSTM_P(role) IN("f_logits", L_SEQ, role), IN("i_logits", L_SEQ, role), IN("cand", L_SEQ, role)
#define LIQUID_P(role, opt)                                                                                 \
    IN("f_logits", L_SEQ, role), IN("tau", L_HIDDEN, role), IN("a", L_HIDDEN, role),                       \
        IN_IF("dt", L_DT, opt, "has_dt")
#define H0(role) IN_IF("h0", L_FRAME, role, "has_h0")
/* A backward's inputs after the forward's. */
#define BWD_TAIL                                                                                            \
    IN("h", L_SEQ, FX_IO_SAVED), IN("dh", L_SEQ, FX_IO_COTANGENT),                                         \
        IN_IF("dstate", L_FRAME, FX_IO_COTANGENT, "has_dstate")

static const fx_op_io scan_fwd_inputs[] = {SCAN_P(FX_IO_ARG), H0(FX_IO_OPTION)};
static const fx_op_io mingru_fwd_inputs[] = {MINGRU_P(FX_IO_ARG), H0(FX_IO_OPTION)};
static const fx_op_io minlstm_fwd_inputs[] = {MINLSTM_P(FX_IO_ARG), H0(FX_IO_OPTION)};
static const fx_op_io liquid_fwd_inputs[] = {LIQUID_P(FX_IO_ARG, FX_IO_OPTION), H0(FX_IO_OPTION)};
static const fx_op_io scan_bwd_inputs[] = {SCAN_P(FX_IO_FORWARD), H0(FX_IO_FORWARD), BWD_TAIL};
static const fx_op_io mingru_bwd_inputs[] = {MINGRU_P(FX_IO_FORWARD), H0(FX_IO_FORWARD), BWD_TAIL};
static const fx_op_io minlstm_bwd_inputs[] = {MINLSTM_P(FX_IO_FORWARD), H0(FX_IO_FORWARD), BWD_TAIL};
static const fx_op_io liquid_bwd_inputs[] = {LIQUID_P(FX_IO_FORWARD, FX_IO_FORWARD), H0(FX_IO_FORWARD), BWD_TAIL};

#define STATE IN("state", L_FRAME, FX_IO_STATE)
static const fx_op_io scan_step_inputs[] = {STATE, IN("a", L_FRAME, FX_IO_ARG), IN("b", L_FRAME, FX_IO_ARG)};
static const fx_op_io mingru_step_inputs[] = {STATE, IN("z_logits", L_FRAME, FX_IO_ARG),
                                              IN("cand", L_FRAME, FX_IO_ARG)};
static const fx_op_io minlstm_step_inputs[] = {STATE, IN("f_logits", L_FRAME, FX_IO_ARG),
                                               IN("i_logits", L_FRAME, FX_IO_ARG), IN("cand", L_FRAME, FX_IO_ARG)};
static const fx_op_io liquid_step_inputs[] = {STATE, IN("f_logits", L_FRAME, FX_IO_ARG),
                                              IN("tau", L_HIDDEN, FX_IO_ARG), IN("a", L_HIDDEN, FX_IO_ARG),
                                              IN_IF("dt", L_DT_FRAME, FX_IO_OPTION, "has_dt")};

static const fx_op_io fwd_results[] = {
    {"h", L_SEQ, FX_IO_OUTPUT, FX_WHEN_ALWAYS, NULL, true, false},
    IN_IF("state", L_FRAME, FX_IO_OUTPUT, "return_state"),
};
#define DH0 IN_IF("dh0", L_FRAME, FX_IO_GRAD, "has_h0")
static const fx_op_io scan_bwd_results[] = {IN("da", L_SEQ, FX_IO_GRAD), IN("db", L_SEQ, FX_IO_GRAD), DH0};
static const fx_op_io mingru_bwd_results[] = {IN("dz_logits", L_SEQ, FX_IO_GRAD), IN("dcand", L_SEQ, FX_IO_GRAD),
                                              DH0};
static const fx_op_io minlstm_bwd_results[] = {IN("df_logits", L_SEQ, FX_IO_GRAD),
                                               IN("di_logits", L_SEQ, FX_IO_GRAD), IN("dcand", L_SEQ, FX_IO_GRAD),
                                               DH0};
static const fx_op_io liquid_bwd_results[] = {IN("df_logits", L_SEQ, FX_IO_GRAD), IN("dtau", L_HIDDEN, FX_IO_GRAD),
                                              IN("da", L_HIDDEN, FX_IO_GRAD),
                                              IN_IF("ddt", L_DT, FX_IO_GRAD, "has_dt"), DH0};
static const fx_op_io step_results[] = {IN("h", L_FRAME, FX_IO_OUTPUT), IN("new_state", L_FRAME, FX_IO_STATE)};

static const char *const scan_fwd_options[] = {"h0", "return_state", "reverse", "save_for_backward", NULL};
static const char *const gated_fwd_options[] = {"h0", "return_state", "reverse", "save_for_backward",
                                                "candidate_activation", NULL};
static const char *const liquid_fwd_options[] = {"h0", "return_state", "reverse", "save_for_backward", "dt",
                                                 NULL};
static const char *const bwd_options[] = {"dstate", NULL};
static const char *const gated_step_options[] = {"candidate_activation", NULL};
static const char *const liquid_step_options[] = {"dt", NULL};

/* One op's three descriptions: NAME its name, `kind` its fx_linrec_kind,
 * `fam` the attribute set (scan, gated, liquid), `io` the inputs' and
 * results' arrays, `step_opts` the step's options (NULL: none). */
#define LINREC_OP(NAME, kind, fam, io, step_opts)                                                             \
    {.name = NAME "_fwd", .op = NAME, .family = "linrec", .dir = FX_OP_FWD, .variant = kind,                   \
     .nattrs = COUNT(fam##_fwd_attrs), .ninputs = COUNT(io##_fwd_inputs), .nresults = COUNT(fwd_results),   \
     .attrs = fam##_fwd_attrs, .inputs = io##_fwd_inputs, .results = fwd_results, .check = fwd_check,       \
     .scratch = fwd_scratch, .run = fwd_run, .backward = NAME "_bwd", .options = fam##_fwd_options,          \
     .saved_by = "fusex:" NAME},                                                                              \
    {.name = NAME "_bwd", .op = NAME, .family = "linrec", .dir = FX_OP_BWD, .variant = kind,                   \
     .nattrs = COUNT(fam##_bwd_attrs), .ninputs = COUNT(io##_bwd_inputs), .nresults = COUNT(io##_bwd_results), \
     .attrs = fam##_bwd_attrs, .inputs = io##_bwd_inputs, .results = io##_bwd_results, .check = bwd_check,  \
     .scratch = bwd_scratch, .run = bwd_run, .options = bwd_options},                                       \
    {.name = NAME "_step", .op = NAME, .family = "linrec", .dir = FX_OP_STEP, .variant = kind,                 \
     .nattrs = COUNT(fam##_step_attrs), .ninputs = COUNT(io##_step_inputs), .nresults = COUNT(step_results), \
     .attrs = fam##_step_attrs, .inputs = io##_step_inputs, .results = step_results, .check = step_check,   \
     .run = step_run, .options = step_opts}

const fx_op_desc fx_linrec_op_descs[] = {
    LINREC_OP("linear_scan", FX_LINREC_SCAN, scan, scan, NULL),
    LINREC_OP("mingru", FX_LINREC_MINGRU, gated, mingru, gated_step_options),
    LINREC_OP("minlstm", FX_LINREC_MINLSTM, gated, minlstm, gated_step_options),
    LINREC_OP("liquid", FX_LINREC_LIQUID, liquid, liquid, liquid_step_options),
};

const int fx_linrec_op_ndescs = COUNT(fx_linrec_op_descs);
