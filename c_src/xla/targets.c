/* The fifteen XLA custom-call targets (docs/XLA.md): each reads its
 * attributes, lists the operands and results they announce, wraps XLA's
 * buffers as fx_tensors on the call's device and runs the op layer's
 * `_into` op on the call's launch context. No maths and few checks here:
 * the op layer checks every operand and result with the Erlang API's
 * messages; this file checks only what XLA adds (attributes, counts,
 * element types fusex has no name for, a step's result state). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/linrec.h"
#include "core/ssm.h"
#include "fusex_dtype.h"
#include "xla/ffi/api/c_api.h"
#include "xla/fx_xla.h"

/* ---- operands and results ---- */

/* A call's operands and results by name, in the order the target's
 * attributes announce them, and its device and launch context. */
typedef struct frame {
    fx_device *dev;
    fx_exec ex;
    int nargs, nrets;
    const char *arg_names[FX_XLA_MAX_BUFFERS], *ret_names[FX_XLA_MAX_BUFFERS];
    fx_tensor args[FX_XLA_MAX_BUFFERS], rets[FX_XLA_MAX_BUFFERS];
} frame;

static void want_arg(frame *f, const char *name)
{
    if (f->nargs < FX_XLA_MAX_BUFFERS)
        f->arg_names[f->nargs++] = name;
}

static void want_ret(frame *f, const char *name)
{
    if (f->nrets < FX_XLA_MAX_BUFFERS)
        f->ret_names[f->nrets++] = name;
}

static const fx_tensor *find(const char *const *names, const fx_tensor *tensors, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return &tensors[i];
    return NULL;
}

/* The operand or result `name`, or NULL where the call has none. */
static const fx_tensor *arg(const frame *f, const char *name)
{
    return find(f->arg_names, f->args, f->nargs, name);
}

static const fx_tensor *ret(const frame *f, const char *name)
{
    return find(f->ret_names, f->rets, f->nrets, name);
}

static int fx_type_of(int xla_type, fx_dtype *out)
{
    switch (xla_type) {
    case XLA_FFI_DataType_F32: *out = FX_F32; return 1;
    case XLA_FFI_DataType_F64: *out = FX_F64; return 1;
    case XLA_FFI_DataType_BF16: *out = FX_BF16; return 1;
    case XLA_FFI_DataType_F16: *out = FX_F16; return 1;
    case XLA_FFI_DataType_S32: *out = FX_S32; return 1;
    case XLA_FFI_DataType_S64: *out = FX_S64; return 1;
    case XLA_FFI_DataType_U8: *out = FX_U8; return 1;
    default: return 0;
    }
}

/* Nx's spelling of the XLA types fusex has no fx_dtype for. */
static const char *other_type_name(int xla_type, char *buf, size_t len)
{
    switch (xla_type) {
    case XLA_FFI_DataType_PRED: return "{pred,8}";
    case XLA_FFI_DataType_S8: return "{s,8}";
    case XLA_FFI_DataType_S16: return "{s,16}";
    case XLA_FFI_DataType_U16: return "{u,16}";
    case XLA_FFI_DataType_U32: return "{u,32}";
    case XLA_FFI_DataType_U64: return "{u,64}";
    case XLA_FFI_DataType_C64: return "{c,64}";
    case XLA_FFI_DataType_C128: return "{c,128}";
    default: snprintf(buf, len, "XLA element type %d", xla_type); return buf;
    }
}

/* An XLA buffer as an fx_tensor on `dev`: no fusex buffer behind it. */
static int wrap(const char *name, const fx_xla_buffer *b, fx_device *dev, fx_tensor *t, fx_status *st)
{
    memset(t, 0, sizeof *t);
    fx_dtype type;
    if (!fx_type_of(b->type, &type)) {
        char buf[48];
        return fx_fail(st, FX_EBADARG, "%s: expected a float type ({f,32}, {bf,16}, {f,16}%s), got %s", name,
                       dev->kind == FX_DEVICE_CPU ? " or {f,64}" : "", other_type_name(b->type, buf, sizeof buf));
    }
    if (b->rank < 0 || b->rank > FX_MAX_RANK)
        return fx_fail(st, FX_EBADARG, "%s: expected rank at most %d, got rank %lld", name, FX_MAX_RANK,
                       (long long)b->rank);
    t->data = b->data;
    t->dtype = type;
    t->rank = (int)b->rank;
    if (t->rank > 0)
        memcpy(t->dims, b->dims, sizeof(int64_t) * (size_t)t->rank);
    t->device = dev;
    return fx_shape_nbytes(name, type, t->rank, t->dims, &t->numel, &t->nbytes, st);
}

static int count_error(fx_status *st, const char *what, const char *const *names, int want, int got)
{
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < want && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    return fx_fail(st, FX_EBADARG, "%s: expected %d (%s), got %d", what, want, list, got);
}

/* Wraps the operands listed from `first` on (the call has them all). */
static int wrap_args(const fx_xla_call *c, frame *f, int first, fx_status *st)
{
    for (int i = first; i < f->nargs; i++)
        if (wrap(f->arg_names[i], &c->args[i], f->dev, &f->args[i], st))
            return st->code;
    return FX_OK;
}

/* Checks the call's operand count against the names listed and wraps them. */
static int bind_args(const fx_xla_call *c, frame *f, fx_status *st)
{
    if (c->nargs != f->nargs)
        return count_error(st, "operands", f->arg_names, f->nargs, c->nargs);
    return wrap_args(c, f, 0, st);
}

static int bind_rets(const fx_xla_call *c, frame *f, fx_status *st)
{
    if (c->nrets != f->nrets)
        return count_error(st, "results", f->ret_names, f->nrets, c->nrets);
    for (int i = 0; i < f->nrets; i++)
        if (wrap(f->ret_names[i], &c->rets[i], f->dev, &f->rets[i], st))
            return st->code;
    return FX_OK;
}

static int bind(const fx_xla_call *c, frame *f, fx_status *st)
{
    if (c->nargs != f->nargs)
        return count_error(st, "operands", f->arg_names, f->nargs, c->nargs);
    if (c->nrets != f->nrets)
        return count_error(st, "results", f->ret_names, f->nrets, c->nrets);
    return wrap_args(c, f, 0, st) || bind_rets(c, f, st) ? st->code : FX_OK;
}

/* ---- attributes ---- */

static const fx_xla_attr *find_attr(const fx_xla_call *c, const char *name)
{
    size_t len = strlen(name);
    for (int i = 0; i < c->nattrs; i++)
        if (c->attrs[i].name_len == len && memcmp(c->attrs[i].name, name, len) == 0)
            return &c->attrs[i];
    return NULL;
}

/* Every attribute of the call is one the target takes: a misspelt flag
 * is refused, not ignored. */
static int expect_known_attrs(const fx_xla_call *c, const char *const *names, int count, fx_status *st)
{
    for (int i = 0; i < c->nattrs; i++) {
        const fx_xla_attr *a = &c->attrs[i];
        int known = 0;
        for (int k = 0; k < count && !known; k++)
            known = strlen(names[k]) == a->name_len && memcmp(names[k], a->name, a->name_len) == 0;
        if (known)
            continue;
        char list[256] = "";
        size_t used = 0;
        for (int k = 0; k < count && used < sizeof list; k++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", k ? ", " : "", names[k]);
        return fx_fail(st, FX_EBADARG, "attributes: expected only %s, got %.*s", list, (int)a->name_len,
                       a->name);
    }
    return FX_OK;
}

/* A flag: an integer attribute 0 or 1 (EXLA writes `name = 1 : i64`). */
static int flag_attr(const fx_xla_call *c, const char *name, bool *out, fx_status *st)
{
    const fx_xla_attr *a = find_attr(c, name);
    if (!a)
        return fx_fail(st, FX_EBADARG, "%s: expected an attribute 0 or 1 (i64), got none", name);
    if (a->kind != FX_XLA_ATTR_INT)
        return fx_fail(st, FX_EBADARG, "%s: expected an integer attribute 0 or 1 (i64), got %s", name, a->what);
    if (a->i != 0 && a->i != 1)
        return fx_fail(st, FX_EBADARG, "%s: expected 0 or 1, got %lld", name, (long long)a->i);
    *out = a->i == 1;
    return FX_OK;
}

static int number_attr(const fx_xla_call *c, const char *name, double *out, fx_status *st)
{
    const fx_xla_attr *a = find_attr(c, name);
    if (!a)
        return fx_fail(st, FX_EBADARG, "%s: expected a number attribute (f64), got none", name);
    if (a->kind == FX_XLA_ATTR_FLOAT)
        *out = a->f;
    else if (a->kind == FX_XLA_ATTR_INT)
        *out = (double)a->i;
    else
        return fx_fail(st, FX_EBADARG, "%s: expected a number attribute (f64), got %s", name, a->what);
    return FX_OK;
}

/* The flags `names` (all required, no other attribute but `extra`). */
static int flags(const fx_xla_call *c, const char *const *names, int count, const char *extra, bool *values,
                 fx_status *st)
{
    const char *all[FX_XLA_MAX_ATTRS];
    int n = 0;
    for (int i = 0; i < count && n < FX_XLA_MAX_ATTRS - 1; i++)
        all[n++] = names[i];
    if (extra)
        all[n++] = extra;
    if (expect_known_attrs(c, all, n, st))
        return st->code;
    for (int i = 0; i < count; i++)
        if (flag_attr(c, names[i], &values[i], st))
            return st->code;
    return FX_OK;
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- selective scan ---- */

static void ssm_operands(frame *f, bool has_d, bool has_z, bool has_dt_bias, bool has_h0)
{
    static const char *const required[] = {"x", "dt", "a", "b", "c"};
    for (int i = 0; i < COUNT(required); i++)
        want_arg(f, required[i]);
    if (has_d)
        want_arg(f, "d");
    if (has_z)
        want_arg(f, "z");
    if (has_dt_bias)
        want_arg(f, "dt_bias");
    if (has_h0)
        want_arg(f, "h0");
}

static fx_ssm_inputs ssm_inputs(const frame *f, bool dt_softplus)
{
    fx_ssm_inputs in = {
        .x = arg(f, "x"), .dt = arg(f, "dt"), .a = arg(f, "a"), .b = arg(f, "b"), .c = arg(f, "c"),
        .d = arg(f, "d"), .z = arg(f, "z"), .dt_bias = arg(f, "dt_bias"), .h0 = arg(f, "h0"),
        .dt_softplus = dt_softplus,
    };
    return in;
}

/* The saved states are a result of the forward, and an operand of the
 * backward, where there are any (nsaved > 0: more than one chunk); the
 * count follows from the inputs' shapes, so they are checked first. */
static int ssm_nsaved(const fx_ssm_inputs *in, int64_t *nsaved, fx_status *st)
{
    fx_ssm_dims n;
    if (fx_ssm_check_forward(in, &n, st))
        return st->code;
    *nsaved = fx_ssm_nsaved(&n, in->x->dtype);
    return FX_OK;
}

static int selective_scan_fwd(const fx_xla_call *c, frame *f, fx_status *st)
{
    static const char *const names[] = {"dt_softplus", "has_d", "has_z", "has_dt_bias",
                                         "has_h0", "return_state", "save"};
    enum { SOFTPLUS, HAS_D, HAS_Z, HAS_BIAS, HAS_H0, RETURN_STATE, SAVE };
    bool v[COUNT(names)];
    if (flags(c, names, COUNT(names), NULL, v, st))
        return st->code;
    ssm_operands(f, v[HAS_D], v[HAS_Z], v[HAS_BIAS], v[HAS_H0]);
    if (bind_args(c, f, st))
        return st->code;
    fx_ssm_inputs in = ssm_inputs(f, v[SOFTPLUS]);
    int64_t nsaved = 0;
    if (ssm_nsaved(&in, &nsaved, st))
        return st->code;
    want_ret(f, "y");
    if (v[RETURN_STATE])
        want_ret(f, "state");
    if (v[SAVE] && nsaved > 0)
        want_ret(f, "saved");
    if (bind_rets(c, f, st))
        return st->code;
    return fx_op_ssm_forward_into(&f->ex, &in, ret(f, "y"), ret(f, "state"), ret(f, "saved"), st);
}

static int selective_scan_bwd(const fx_xla_call *c, frame *f, fx_status *st)
{
    static const char *const names[] = {"dt_softplus", "has_d", "has_z", "has_dt_bias", "has_h0", "has_dstate"};
    enum { SOFTPLUS, HAS_D, HAS_Z, HAS_BIAS, HAS_H0, HAS_DSTATE };
    bool v[COUNT(names)];
    if (flags(c, names, COUNT(names), NULL, v, st))
        return st->code;
    ssm_operands(f, v[HAS_D], v[HAS_Z], v[HAS_BIAS], v[HAS_H0]);
    const int forward_operands = f->nargs;
    if (c->nargs < forward_operands + 1) {
        want_arg(f, "[saved]");
        want_arg(f, "dy");
        if (v[HAS_DSTATE])
            want_arg(f, "dstate");
        return count_error(st, "operands", f->arg_names, f->nargs, c->nargs);
    }
    if (wrap_args(c, f, 0, st))
        return st->code;
    fx_ssm_inputs in = ssm_inputs(f, v[SOFTPLUS]);
    int64_t nsaved = 0;
    if (ssm_nsaved(&in, &nsaved, st))
        return st->code;
    if (nsaved > 0)
        want_arg(f, "saved");
    want_arg(f, "dy");
    if (v[HAS_DSTATE])
        want_arg(f, "dstate");
    static const char *const grads[] = {"dx", "ddt", "da", "db", "dc"};
    for (int i = 0; i < COUNT(grads); i++)
        want_ret(f, grads[i]);
    if (v[HAS_D])
        want_ret(f, "dd");
    if (v[HAS_Z])
        want_ret(f, "dz");
    if (v[HAS_BIAS])
        want_ret(f, "ddt_bias");
    if (v[HAS_H0])
        want_ret(f, "dh0");
    if (c->nargs != f->nargs)
        return count_error(st, "operands", f->arg_names, f->nargs, c->nargs);
    if (wrap_args(c, f, forward_operands, st) || bind_rets(c, f, st))
        return st->code;
    fx_ssm_grad_outs g = {
        .x = ret(f, "dx"), .dt = ret(f, "ddt"), .a = ret(f, "da"), .b = ret(f, "db"), .c = ret(f, "dc"),
        .d = ret(f, "dd"), .z = ret(f, "dz"), .dt_bias = ret(f, "ddt_bias"), .h0 = ret(f, "dh0"),
    };
    return fx_op_ssm_backward_into(&f->ex, &in, arg(f, "saved"), arg(f, "dy"), arg(f, "dstate"), &g, st);
}

/* XLA programs are functional: a step reads `state` and returns the state
 * after it as `new_state`, which it updates in place after a copy, unless
 * the caller aliased the two (the copy is then skipped). */
static int step_state(const frame *f, const fx_tensor *state, const fx_tensor *new_state, fx_status *st)
{
    if (fx_expect_dtype(st, "new_state", new_state, state->dtype) ||
        fx_expect_shape(st, "new_state", new_state, state->rank, state->dims, "(the shape of state)"))
        return st->code;
    if (new_state->data == state->data || state->nbytes == 0)
        return FX_OK;
    return f->dev->backend->copy(&f->ex, new_state->data, state->data, state->nbytes, st);
}

static int selective_scan_step(const fx_xla_call *c, frame *f, fx_status *st)
{
    static const char *const names[] = {"dt_softplus", "has_d", "has_z", "has_dt_bias"};
    enum { SOFTPLUS, HAS_D, HAS_Z, HAS_BIAS };
    bool v[COUNT(names)];
    if (flags(c, names, COUNT(names), NULL, v, st))
        return st->code;
    want_arg(f, "state");
    ssm_operands(f, v[HAS_D], v[HAS_Z], v[HAS_BIAS], false);
    want_ret(f, "y");
    want_ret(f, "new_state");
    if (bind(c, f, st))
        return st->code;
    fx_ssm_inputs in = ssm_inputs(f, v[SOFTPLUS]);
    const fx_tensor *state = arg(f, "state"), *new_state = ret(f, "new_state");
    fx_ssm_dims n;
    if (fx_ssm_check_step(state, &in, &n, st) || step_state(f, state, new_state, st))
        return st->code;
    return fx_op_ssm_step_into(&f->ex, new_state, &in, ret(f, "y"), st);
}

/* ---- linear recurrences ---- */

/* The gradient results' names, one per sequence input and liquid's tau, a. */
static const char *const linrec_grad_names[FX_LINREC_KIND_COUNT][FX_LINREC_MAX_SEQ] = {
    [FX_LINREC_SCAN] = {"da", "db"},
    [FX_LINREC_MINGRU] = {"dz_logits", "dcand"},
    [FX_LINREC_MINLSTM] = {"df_logits", "di_logits", "dcand"},
    [FX_LINREC_LIQUID] = {"df_logits"},
};

typedef enum direction { FWD, BWD, STEP } direction;

/* The attributes of a linrec target: flags, then liquid's `dt` (a number). */
typedef struct linrec_attrs {
    bool reverse, candidate_g, has_dt, has_h0, last; /* last: return_state (fwd) or has_dstate (bwd) */
    double dt;
} linrec_attrs;

/* A flag a linrec target takes, and where its value goes. */
typedef struct flag_slot {
    const char *name;
    bool *value;
} flag_slot;

static int linrec_read_attrs(const fx_xla_call *c, int kind, direction dir, linrec_attrs *a, fx_status *st)
{
    flag_slot want[6];
    int n = 0;
    memset(a, 0, sizeof *a);
    want[n++] = (flag_slot){"reverse", &a->reverse};
    if (kind == FX_LINREC_MINGRU || kind == FX_LINREC_MINLSTM)
        want[n++] = (flag_slot){"candidate_g", &a->candidate_g};
    if (kind == FX_LINREC_LIQUID)
        want[n++] = (flag_slot){"has_dt", &a->has_dt};
    if (dir != STEP)
        want[n++] = (flag_slot){"has_h0", &a->has_h0};
    if (dir == FWD)
        want[n++] = (flag_slot){"return_state", &a->last};
    if (dir == BWD)
        want[n++] = (flag_slot){"has_dstate", &a->last};
    const char *names[6];
    bool values[6];
    for (int i = 0; i < n; i++)
        names[i] = want[i].name;
    if (flags(c, names, n, kind == FX_LINREC_LIQUID ? "dt" : NULL, values, st))
        return st->code;
    for (int i = 0; i < n; i++)
        *want[i].value = values[i];
    a->dt = 1.0;
    if (kind == FX_LINREC_LIQUID && number_attr(c, "dt", &a->dt, st))
        return st->code;
    return FX_OK;
}

/* P (the sequence inputs, then liquid's tau and a), then the dt tensor. */
static void linrec_operands(frame *f, int kind, const linrec_attrs *a)
{
    for (int i = 0; i < fx_linrec_nseq(kind); i++)
        want_arg(f, fx_linrec_seq_name(kind, i));
    if (kind == FX_LINREC_LIQUID) {
        want_arg(f, "tau");
        want_arg(f, "a");
        if (a->has_dt)
            want_arg(f, "dt");
    }
}

static fx_linrec_problem linrec_problem(const frame *f, int kind, const linrec_attrs *a)
{
    fx_linrec_problem p;
    memset(&p, 0, sizeof p);
    p.kind = kind;
    for (int i = 0; i < fx_linrec_nseq(kind); i++)
        p.seq[i] = arg(f, fx_linrec_seq_name(kind, i));
    if (kind == FX_LINREC_LIQUID) {
        p.tau = arg(f, "tau");
        p.lam = arg(f, "a");
        p.dt = arg(f, "dt");
        p.dt_value = a->dt;
    }
    p.candidate_g = a->candidate_g;
    p.reverse = a->reverse;
    return p;
}

static int linrec_fwd(const fx_xla_call *c, frame *f, int kind, fx_status *st)
{
    linrec_attrs a;
    if (linrec_read_attrs(c, kind, FWD, &a, st))
        return st->code;
    linrec_operands(f, kind, &a);
    if (a.has_h0)
        want_arg(f, "h0");
    want_ret(f, "h");
    if (a.last)
        want_ret(f, "state");
    if (bind(c, f, st))
        return st->code;
    fx_linrec_problem p = linrec_problem(f, kind, &a);
    return fx_op_linrec_forward_into(&f->ex, &p, arg(f, "h0"), 0, ret(f, "h"), ret(f, "state"), st);
}

static int linrec_bwd(const fx_xla_call *c, frame *f, int kind, fx_status *st)
{
    linrec_attrs a;
    if (linrec_read_attrs(c, kind, BWD, &a, st))
        return st->code;
    linrec_operands(f, kind, &a);
    if (a.has_h0)
        want_arg(f, "h0");
    want_arg(f, "h");
    want_arg(f, "dh");
    if (a.last)
        want_arg(f, "dstate");
    for (int i = 0; i < fx_linrec_nseq(kind); i++)
        want_ret(f, linrec_grad_names[kind][i]);
    if (kind == FX_LINREC_LIQUID) {
        want_ret(f, "dtau");
        want_ret(f, "da");
        if (a.has_dt)
            want_ret(f, "ddt");
    }
    if (a.has_h0)
        want_ret(f, "dh0");
    if (bind(c, f, st))
        return st->code;
    fx_linrec_problem p = linrec_problem(f, kind, &a);
    fx_linrec_grad_outs g;
    memset(&g, 0, sizeof g);
    for (int i = 0; i < fx_linrec_nseq(kind); i++)
        g.seq[i] = ret(f, linrec_grad_names[kind][i]);
    if (kind == FX_LINREC_LIQUID) {
        g.tau = ret(f, "dtau");
        g.lam = ret(f, "da");
        g.dt = ret(f, "ddt");
    }
    g.h0 = ret(f, "dh0");
    return fx_op_linrec_backward_into(&f->ex, &p, arg(f, "h0"), arg(f, "h"), arg(f, "dh"), arg(f, "dstate"), 0,
                                      &g, st);
}

static int linrec_step(const fx_xla_call *c, frame *f, int kind, fx_status *st)
{
    linrec_attrs a;
    if (linrec_read_attrs(c, kind, STEP, &a, st))
        return st->code;
    want_arg(f, "state");
    linrec_operands(f, kind, &a);
    want_ret(f, "h");
    want_ret(f, "new_state");
    if (bind(c, f, st))
        return st->code;
    /* reverse is one of the step's attributes (docs/XLA.md) but has no
     * effect on one frame. */
    fx_linrec_problem p = linrec_problem(f, kind, &a);
    const fx_tensor *state = arg(f, "state"), *new_state = ret(f, "new_state");
    if (fx_linrec_check_step(&p, state, st) || step_state(f, state, new_state, st))
        return st->code;
    return fx_op_linrec_step_into(&f->ex, &p, new_state, ret(f, "h"), st);
}

/* ---- dispatch ---- */

static const struct {
    const char *name;
    int kind; /* fx_linrec_kind, or -1 for the selective scan */
    direction dir;
} targets[FX_XLA_TARGET_COUNT] = {
    [FX_XLA_SELECTIVE_SCAN_FWD] = {"fusex_selective_scan_fwd", -1, FWD},
    [FX_XLA_SELECTIVE_SCAN_BWD] = {"fusex_selective_scan_bwd", -1, BWD},
    [FX_XLA_SELECTIVE_SCAN_STEP] = {"fusex_selective_scan_step", -1, STEP},
    [FX_XLA_LINEAR_SCAN_FWD] = {"fusex_linear_scan_fwd", FX_LINREC_SCAN, FWD},
    [FX_XLA_LINEAR_SCAN_BWD] = {"fusex_linear_scan_bwd", FX_LINREC_SCAN, BWD},
    [FX_XLA_LINEAR_SCAN_STEP] = {"fusex_linear_scan_step", FX_LINREC_SCAN, STEP},
    [FX_XLA_MINGRU_FWD] = {"fusex_mingru_fwd", FX_LINREC_MINGRU, FWD},
    [FX_XLA_MINGRU_BWD] = {"fusex_mingru_bwd", FX_LINREC_MINGRU, BWD},
    [FX_XLA_MINGRU_STEP] = {"fusex_mingru_step", FX_LINREC_MINGRU, STEP},
    [FX_XLA_MINLSTM_FWD] = {"fusex_minlstm_fwd", FX_LINREC_MINLSTM, FWD},
    [FX_XLA_MINLSTM_BWD] = {"fusex_minlstm_bwd", FX_LINREC_MINLSTM, BWD},
    [FX_XLA_MINLSTM_STEP] = {"fusex_minlstm_step", FX_LINREC_MINLSTM, STEP},
    [FX_XLA_LIQUID_FWD] = {"fusex_liquid_fwd", FX_LINREC_LIQUID, FWD},
    [FX_XLA_LIQUID_BWD] = {"fusex_liquid_bwd", FX_LINREC_LIQUID, BWD},
    [FX_XLA_LIQUID_STEP] = {"fusex_liquid_step", FX_LINREC_LIQUID, STEP},
};

const char *fx_xla_target_name(int target)
{
    return target >= 0 && target < FX_XLA_TARGET_COUNT ? targets[target].name : NULL;
}

static int dispatch(const fx_xla_call *c, frame *f, fx_status *st)
{
    int kind = targets[c->target].kind;
    switch (targets[c->target].dir) {
    case FWD: return kind < 0 ? selective_scan_fwd(c, f, st) : linrec_fwd(c, f, kind, st);
    case BWD: return kind < 0 ? selective_scan_bwd(c, f, st) : linrec_bwd(c, f, kind, st);
    default: return kind < 0 ? selective_scan_step(c, f, st) : linrec_step(c, f, kind, st);
    }
}

int fx_xla_run(const fx_xla_call *c, fx_status *st)
{
    if (c->target < 0 || c->target >= FX_XLA_TARGET_COUNT)
        return fx_fail(st, FX_EINTERNAL, "fusex XLA handler: unknown target %d", c->target);
    frame f;
    memset(&f, 0, sizeof f);
    if (fx_xla_device(c, &f.dev, &f.ex, st) == FX_OK)
        dispatch(c, &f, st);
    if (st->code != FX_OK) {
        /* "fusex_mingru_fwd: cand: expected ..." */
        char msg[FX_MSG_LEN + 64];
        snprintf(msg, sizeof msg, "%s: %s", targets[c->target].name, st->msg);
        memcpy(st->msg, msg, FX_MSG_LEN - 1);
        st->msg[FX_MSG_LEN - 1] = '\0';
    }
    return st->code;
}
