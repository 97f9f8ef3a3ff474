/* The XLA custom-call targets (docs/XLA.md): one binder over the op
 * layer's descriptions (core/op.h). A call of target "fusex_" + name reads
 * the attributes its description lists, takes the operands and results
 * its description announces (in the description's order, each present as
 * its flag attribute or its rule says), wraps XLA's buffers as fx_tensors
 * on the call's device and runs the op through fx_op_run_into on the
 * call's launch context. No maths and few checks here: the op layer checks
 * every operand and result with the Erlang API's messages; this file
 * checks only what XLA adds (attributes, counts, element types fusex has
 * no name for, a step's result state). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/op.h"
#include "fusex_dtype.h"
#include "xla/ffi/api/c_api.h"
#include "xla/fx_xla.h"

/* ---- target names ---- */

static char target_names[FX_XLA_MAX_OPS][96];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void make_names(void)
{
    for (int i = 0; i < fx_op_xla_count() && i < FX_XLA_MAX_OPS; i++)
        snprintf(target_names[i], sizeof target_names[i], "fusex_%s", fx_op_at(i)->name);
}

const char *fx_xla_target_name(int op)
{
    pthread_once(&names_once, make_names);
    return op >= 0 && op < fx_op_xla_count() && op < FX_XLA_MAX_OPS ? target_names[op] : NULL;
}

/* ---- buffers ---- */

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

/* "operands: expected 7 (x, dt, a, b, c, [saved], dy), got 3" */
static int count_error(fx_status *st, const char *what, const char *const *names, int want, int got)
{
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < want && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    return fx_fail(st, FX_EBADARG, "%s: expected %d (%s), got %d", what, want, list, got);
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

/* Every attribute of the call is one the op takes: a misspelt flag is
 * refused, not ignored. */
static int expect_known_attrs(const fx_xla_call *c, const fx_op_desc *d, fx_status *st)
{
    for (int i = 0; i < c->nattrs; i++) {
        const fx_xla_attr *a = &c->attrs[i];
        int known = 0;
        for (int k = 0; k < d->nattrs && !known; k++)
            known = strlen(d->attrs[k].name) == a->name_len && memcmp(d->attrs[k].name, a->name, a->name_len) == 0;
        if (known)
            continue;
        char list[256] = "";
        size_t used = 0;
        for (int k = 0; k < d->nattrs && used < sizeof list; k++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", k ? ", " : "", d->attrs[k].name);
        return fx_fail(st, FX_EBADARG, "attributes: expected only %s, got %.*s", list, (int)a->name_len, a->name);
    }
    return FX_OK;
}

/* A flag: an integer attribute 0 or 1 (EXLA writes `name = 1 : i64`). */
static int flag_attr(const fx_xla_call *c, const char *name, double *out, fx_status *st)
{
    const fx_xla_attr *a = find_attr(c, name);
    if (!a)
        return fx_fail(st, FX_EBADARG, "%s: expected an attribute 0 or 1 (i64), got none", name);
    if (a->kind != FX_XLA_ATTR_INT)
        return fx_fail(st, FX_EBADARG, "%s: expected an integer attribute 0 or 1 (i64), got %s", name, a->what);
    if (a->i != 0 && a->i != 1)
        return fx_fail(st, FX_EBADARG, "%s: expected 0 or 1, got %lld", name, (long long)a->i);
    *out = (double)a->i;
    return FX_OK;
}

/* An enum: an integer attribute, the index of one of its choices. */
static int enum_attr(const fx_xla_call *c, const fx_op_attr *at, double *out, fx_status *st)
{
    const fx_xla_attr *a = find_attr(c, at->name);
    char names[160];
    fx_op_choice_list(at, ", ", names, sizeof names);
    const int last = fx_op_choice_count(at) - 1;
    if (!a)
        return fx_fail(st, FX_EBADARG, "%s: expected an attribute 0 to %d (i64: %s), got none", at->name, last, names);
    if (a->kind != FX_XLA_ATTR_INT)
        return fx_fail(st, FX_EBADARG, "%s: expected an integer attribute 0 to %d (i64: %s), got %s", at->name, last,
                       names, a->what);
    if (a->i < 0 || a->i > last) {
        char got[32];
        snprintf(got, sizeof got, "%lld", (long long)a->i);
        return fx_op_enum_error(at, got, st);
    }
    *out = (double)a->i;
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

/* Every attribute the description lists, in its order, all required. */
static int read_attrs(const fx_xla_call *c, fx_op_call *call, fx_status *st)
{
    const fx_op_desc *d = call->op;
    if (expect_known_attrs(c, d, st))
        return st->code;
    for (int a = 0; a < d->nattrs; a++) {
        const fx_op_attr *at = &d->attrs[a];
        int rc = at->kind == FX_ATTR_FLAG   ? flag_attr(c, at->name, &call->attrs[a], st)
                 : at->kind == FX_ATTR_ENUM ? enum_attr(c, at, &call->attrs[a], st)
                                            : number_attr(c, at->name, &call->attrs[a], st);
        if (rc)
            return rc;
    }
    return FX_OK;
}

/* ---- operands and results ---- */

/* A call's operands and results as the description announces them, and its
 * device and launch context. */
typedef struct frame {
    fx_device *dev;
    fx_exec ex;
    fx_op_call call;
    int nargs, nrets;                            /* listed so far */
    int arg_of[FX_OP_MAX_IO], ret_of[FX_OP_MAX_IO]; /* the call's slot of each */
    const char *arg_names[FX_OP_MAX_IO], *ret_names[FX_OP_MAX_IO];
    int wrapped;                                 /* operands wrapped so far */
    char undecided_names[FX_OP_MAX_IO][48];      /* "[saved]" */
    char arg_slot_names[FX_OP_MAX_IO][48], ret_slot_names[FX_OP_MAX_IO][48]; /* "layers[1].w_hh" */
    fx_tensor args[FX_OP_MAX_IO], rets[FX_OP_MAX_IO];
} frame;

/* Wraps the listed operands not yet wrapped (the call has them all). */
static int wrap_args(const fx_xla_call *c, frame *f, fx_status *st)
{
    for (; f->wrapped < f->nargs; f->wrapped++) {
        int k = f->wrapped, i = f->arg_of[k];
        if (wrap(f->arg_names[k], &c->args[k], f->dev, &f->args[k], st))
            return st->code;
        f->call.in[i] = &f->args[k];
    }
    return FX_OK;
}

/* The operands, in the description's order (a repeated group once per
 * repetition, as the call's attribute says): present by flag, or by rule
 * where the operands before it are there to decide it ("[name]" in the
 * count's message where they are not). */
static int bind_args(const fx_xla_call *c, frame *f, fx_status *st)
{
    const fx_op_desc *d = f->call.op;
    bool undecided = false;
    const int nslots = fx_op_slot_count(d, false, fx_op_repeats(&f->call));
    for (int i = 0; i < nslots; i++) {
        bool present = true;
        const fx_op_io *io = &d->inputs[fx_op_slot_entry(d, false, i, NULL)];
        fx_op_slot_name(d, false, i, f->arg_slot_names[i], sizeof f->arg_slot_names[i]);
        const char *name = f->arg_slot_names[i];
        if (io->when == FX_WHEN_RULE && !undecided) {
            if (c->nargs > f->nargs) {
                if (wrap_args(c, f, st) || fx_op_input_present(&f->call, i, &present, st))
                    return st->code;
            } else {
                undecided = true;
            }
        }
        if (io->when == FX_WHEN_RULE && undecided) {
            snprintf(f->undecided_names[f->nargs], sizeof f->undecided_names[0], "[%s]", name);
            name = f->undecided_names[f->nargs];
        } else if (io->when != FX_WHEN_RULE && fx_op_input_present(&f->call, i, &present, st)) {
            return st->code;
        }
        if (!present)
            continue;
        f->arg_of[f->nargs] = i;
        f->arg_names[f->nargs++] = name;
    }
    if (undecided || c->nargs != f->nargs)
        return count_error(st, "operands", f->arg_names, f->nargs, c->nargs);
    return FX_OK;
}

/* The results present by `specs` (or by their flags, where `specs` is
 * NULL: no result has a rule). */
static int list_rets(const fx_xla_call *c, frame *f, const fx_op_spec *specs, fx_status *st)
{
    const fx_op_desc *d = f->call.op;
    f->nrets = 0;
    for (int r = 0; r < fx_op_call_results(&f->call); r++) {
        bool present;
        if (specs)
            present = specs[r].present;
        else if (fx_op_result_present(&f->call, r, &present, st))
            return st->code;
        if (!present)
            continue;
        fx_op_slot_name(d, true, r, f->ret_slot_names[r], sizeof f->ret_slot_names[r]);
        f->ret_of[f->nrets] = r;
        f->ret_names[f->nrets++] = f->ret_slot_names[r];
    }
    if (c->nrets != f->nrets)
        return count_error(st, "results", f->ret_names, f->nrets, c->nrets);
    return FX_OK;
}

static int wrap_rets(const fx_xla_call *c, frame *f, fx_status *st)
{
    for (int k = 0; k < f->nrets; k++) {
        if (wrap(f->ret_names[k], &c->rets[k], f->dev, &f->rets[k], st))
            return st->code;
        f->call.out[f->ret_of[k]] = &f->rets[k];
    }
    return FX_OK;
}

static bool any_rule(const fx_op_io *io, int n)
{
    for (int i = 0; i < n; i++)
        if (io[i].when == FX_WHEN_RULE)
            return true;
    return false;
}

/* XLA programs are functional: a step reads each state S (`state`) and
 * returns the state after it as "new_" + S (`new_state`), which it updates
 * in place after a copy, unless the caller aliased the two (the copy is
 * then skipped). */
static int copy_states(frame *f, fx_status *st)
{
    const fx_op_desc *d = f->call.op;
    for (int out = 0; out < d->nresults; out++) {
        int in = fx_op_state_input(d, out);
        if (in < 0)
            continue;
        const char *name = d->results[out].name;
        const fx_tensor *state = f->call.in[in], *new_state = f->call.out[out];
        char layout[64];
        snprintf(layout, sizeof layout, "(the shape of %s)", d->inputs[in].name);
        if (fx_expect_dtype(st, name, new_state, state->dtype) ||
            fx_expect_shape(st, name, new_state, state->rank, state->dims, layout))
            return st->code;
        if (new_state->data == state->data || state->nbytes == 0)
            continue;
        if (f->dev->backend->copy(&f->ex, new_state->data, state->data, state->nbytes, st))
            return st->code;
    }
    return FX_OK;
}

static int bind_and_run(const fx_xla_call *c, frame *f, fx_status *st)
{
    const fx_op_desc *d = f->call.op;
    const bool rets_by_rule = any_rule(d->results, d->nresults);
    fx_op_spec specs[FX_OP_MAX_IO];
    if (read_attrs(c, &f->call, st) || fx_op_check_repeats(&f->call, st) || bind_args(c, f, st) ||
        (!rets_by_rule && list_rets(c, f, NULL, st)) || wrap_args(c, f, st) ||
        (!rets_by_rule && wrap_rets(c, f, st)) || fx_op_check(&f->call, specs, st) ||
        (rets_by_rule && (list_rets(c, f, specs, st) || wrap_rets(c, f, st))) ||
        (d->dir == FX_OP_STEP && copy_states(f, st)))
        return st->code;
    return fx_op_run_into(&f->ex, &f->call, st);
}

int fx_xla_run(const fx_xla_call *c, fx_status *st)
{
    const fx_op_desc *d = c->op < fx_op_xla_count() ? fx_op_at(c->op) : NULL;
    if (!d)
        return fx_fail(st, FX_EINTERNAL, "fusex XLA handler: unknown op %d", c->op);
    frame f;
    memset(&f, 0, sizeof f);
    if (fx_xla_device(c, &f.dev, &f.ex, st) == FX_OK) {
        fx_op_call_init(&f.call, d, f.dev);
        bind_and_run(c, &f, st);
    }
    if (st->code != FX_OK) {
        /* "fusex_<op>_fwd: <input>: expected ..." */
        char msg[FX_MSG_LEN + 64];
        snprintf(msg, sizeof msg, "%s: %s", fx_xla_target_name(c->op), st->msg);
        memcpy(st->msg, msg, FX_MSG_LEN - 1);
        st->msg[FX_MSG_LEN - 1] = '\0';
    }
    return st->code;
}

/* ---- the check entry ---- */

int fx_xla_check(int op, int platform, const int32_t *present, const int32_t *dtypes, const int32_t *ranks,
                 const int64_t *dims, const double *attrs, int32_t *out_present, int32_t *out_dtypes,
                 int32_t *out_ranks, int64_t *out_dims, fx_status *st)
{
    const fx_op_desc *d = op < fx_op_xla_count() ? fx_op_at(op) : NULL;
    if (!d)
        return fx_fail(st, FX_EBADARG, "op: expected an index below %d, got %d", fx_op_xla_count(), op);
    if (platform != FX_XLA_HOST && platform != FX_XLA_CUDA)
        return fx_fail(st, FX_EBADARG, "platform: expected 0 (Host) or 1 (CUDA), got %d", platform);
    fx_xla_call xc;
    memset(&xc, 0, sizeof xc);
    xc.op = op;
    xc.platform = platform;
    fx_device *dev;
    fx_exec ex;
    if (fx_xla_device(&xc, &dev, &ex, st))
        return st->code;
    fx_op_call call;
    fx_op_call_init(&call, d, dev);
    for (int a = 0; a < d->nattrs; a++)
        call.attrs[a] = attrs[a];
    fx_tensor t[FX_OP_MAX_IO];
    /* the arrays hold one entry per slot: a repeated group once per
     * repetition, as the attributes say */
    const int nslots = fx_op_slot_count(d, false, fx_op_repeats(&call));
    for (int i = 0; i < nslots; i++) {
        char name[64];
        fx_op_slot_name(d, false, i, name, sizeof name);
        int flag = fx_op_input_flag(d, fx_op_slot_entry(d, false, i, NULL));
        if (flag >= 0 && d->attrs[flag].role == FX_ATTR_PRESENCE)
            call.attrs[flag] = present[i] != 0;
        if (!present[i])
            continue;
        memset(&t[i], 0, sizeof t[i]);
        if (dtypes[i] < 0 || dtypes[i] >= FX_DTYPE_COUNT)
            return fx_fail(st, FX_EBADARG, "%s: expected an element type code from 0 to %d, got %d", name,
                           FX_DTYPE_COUNT - 1, (int)dtypes[i]);
        if (ranks[i] < 0 || ranks[i] > FX_MAX_RANK)
            return fx_fail(st, FX_EBADARG, "%s: expected rank at most %d, got rank %d", name, FX_MAX_RANK,
                           (int)ranks[i]);
        t[i].dtype = (fx_dtype)dtypes[i];
        t[i].rank = ranks[i];
        memcpy(t[i].dims, dims + (size_t)i * FX_MAX_RANK, sizeof(int64_t) * (size_t)ranks[i]);
        t[i].device = dev;
        if (fx_shape_nbytes(name, t[i].dtype, t[i].rank, t[i].dims, &t[i].numel, &t[i].nbytes, st))
            return st->code;
        call.in[i] = &t[i];
    }
    fx_op_spec specs[FX_OP_MAX_IO];
    if (fx_op_check(&call, specs, st))
        return st->code;
    for (int r = 0; r < fx_op_call_results(&call); r++) {
        out_present[r] = specs[r].present;
        out_dtypes[r] = specs[r].present ? (int32_t)specs[r].dtype : -1;
        out_ranks[r] = specs[r].present ? specs[r].rank : 0;
        for (int k = 0; k < FX_MAX_RANK; k++)
            out_dims[(size_t)r * FX_MAX_RANK + k] = specs[r].present && k < specs[r].rank ? specs[r].dims[k] : 0;
    }
    return FX_OK;
}
