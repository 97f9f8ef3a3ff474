/* The registry of op descriptions (core/op.h), the generic check, run and
 * context over them, and their JSON. Nothing here knows a family: each
 * lists its descriptions in one array, named in FX_OP_FAMILIES. */
#include "core/op.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"

/* Every family's descriptions, in the order the registry lists them
 * (docs/XLA.md's order). Families whose ops are no XLA targets (`no_xla`)
 * come last: the XLA library's ops are the registry's first. */
#define FX_OP_FAMILIES(X) X(ssm) X(linrec) X(conv) X(norm) X(rnn) X(linear)

#define DECLARE(family)                                                                                      \
    extern const fx_op_desc fx_##family##_op_descs[];                                                        \
    extern const int fx_##family##_op_ndescs;
FX_OP_FAMILIES(DECLARE)
#undef DECLARE

typedef struct family {
    const fx_op_desc *descs;
    const int *count;
} family;

#define ENTRY(family) {fx_##family##_op_descs, &fx_##family##_op_ndescs},
static const family families[] = {FX_OP_FAMILIES(ENTRY)};
#undef ENTRY

#define NFAMILIES ((int)(sizeof families / sizeof families[0]))
#define MAX_OPS 256

/* What the generic code looks up on every call, worked out once: each
 * input's and result's flag attribute (-1: none), the step's states (the
 * input each state result updates, -1: none), the repeated groups. */
typedef struct op_info {
    const fx_op_desc *d;
    signed char in_flag[FX_OP_MAX_IO], out_flag[FX_OP_MAX_IO];
    signed char state_of[FX_OP_MAX_IO];  /* by result */
    signed char repeat_attr;             /* -1: no repeated group */
    signed char in_first, in_group, out_first, out_group;
} op_info;

static op_info infos[MAX_OPS];
static int nops, nxla;
static pthread_once_t infos_once = PTHREAD_ONCE_INIT;

static int index_of(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n && name; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

int fx_op_attr_index(const fx_op_desc *d, const char *name)
{
    for (int i = 0; i < d->nattrs && name; i++)
        if (strcmp(d->attrs[i].name, name) == 0)
            return i;
    return -1;
}

static int io_index(const fx_op_io *io, int n, const char *name)
{
    for (int i = 0; i < n && name; i++)
        if (strcmp(io[i].name, name) == 0)
            return i;
    return -1;
}

int fx_op_input_index(const fx_op_desc *d, const char *name) { return io_index(d->inputs, d->ninputs, name); }
int fx_op_result_index(const fx_op_desc *d, const char *name) { return io_index(d->results, d->nresults, name); }

static void build_infos(void)
{
    for (int f = 0; f < NFAMILIES; f++)
        for (int k = 0; k < *families[f].count && nops < MAX_OPS; k++) {
            const fx_op_desc *d = &families[f].descs[k];
            op_info *info = &infos[nops++];
            info->d = d;
            info->repeat_attr = -1;
            for (int a = 0; a < d->nattrs; a++)
                if (d->attrs[a].role == FX_ATTR_REPEAT && info->repeat_attr < 0)
                    info->repeat_attr = (signed char)a;
            info->in_first = (signed char)d->ninputs;
            info->out_first = (signed char)d->nresults;
            for (int i = 0; i < d->ninputs && i < FX_OP_MAX_IO; i++) {
                info->in_flag[i] = (signed char)fx_op_attr_index(d, d->inputs[i].flag);
                if (d->inputs[i].repeated && info->in_group == 0)
                    info->in_first = (signed char)i;
                info->in_group = (signed char)(d->inputs[i].repeated ? d->ninputs - info->in_first : 0);
            }
            for (int i = 0; i < d->nresults && i < FX_OP_MAX_IO; i++) {
                info->out_flag[i] = (signed char)fx_op_attr_index(d, d->results[i].flag);
                info->state_of[i] = -1;
                if (d->results[i].role == FX_IO_STATE && strncmp(d->results[i].name, "new_", 4) == 0) {
                    int in = fx_op_input_index(d, d->results[i].name + 4);
                    if (in >= 0 && d->inputs[in].role == FX_IO_STATE)
                        info->state_of[i] = (signed char)in;
                }
                if (d->results[i].repeated && info->out_group == 0)
                    info->out_first = (signed char)i;
                info->out_group = (signed char)(d->results[i].repeated ? d->nresults - info->out_first : 0);
            }
            if (!d->no_xla && nxla == nops - 1)
                nxla = nops;
        }
}

static const op_info *info_of(const fx_op_desc *d)
{
    pthread_once(&infos_once, build_infos);
    for (int i = 0; i < nops; i++)
        if (infos[i].d == d)
            return &infos[i];
    return NULL;
}

int fx_op_count(void)
{
    pthread_once(&infos_once, build_infos);
    return nops;
}

int fx_op_xla_count(void)
{
    pthread_once(&infos_once, build_infos);
    return nxla;
}

const fx_op_desc *fx_op_at(int index)
{
    pthread_once(&infos_once, build_infos);
    return index >= 0 && index < nops ? infos[index].d : NULL;
}

const fx_op_desc *fx_op_find(const char *name)
{
    pthread_once(&infos_once, build_infos);
    for (int i = 0; i < nops && name; i++)
        if (strcmp(infos[i].d->name, name) == 0)
            return infos[i].d;
    return NULL;
}

int fx_op_index(const fx_op_desc *d)
{
    const op_info *info = info_of(d);
    return info ? (int)(info - infos) : -1;
}

int fx_op_state_input(const fx_op_desc *d, int result)
{
    const op_info *info = info_of(d);
    return info && result >= 0 && result < d->nresults ? info->state_of[result] : -1;
}

/* ---- repeated groups and slots ---- */

int fx_op_group(const fx_op_desc *d, bool result, int *first)
{
    const op_info *info = info_of(d);
    if (first)
        *first = result ? info->out_first : info->in_first;
    return result ? info->out_group : info->in_group;
}

int fx_op_repeat_attr(const fx_op_desc *d) { return info_of(d)->repeat_attr; }

/* The repetitions one description's slots hold. */
static int own_max_repeats(const op_info *info)
{
    int in = info->in_group ? (FX_OP_MAX_IO - info->in_first) / info->in_group : FX_OP_MAX_IO;
    int out = info->out_group ? (FX_OP_MAX_IO - info->out_first) / info->out_group : FX_OP_MAX_IO;
    return in < out ? in : out;
}

/* One limit for all of an op's descriptions (a forward whose backward
 * could not take its layers would be no use for training). */
int fx_op_max_repeats(const fx_op_desc *d)
{
    const op_info *info = info_of(d);
    if (info->repeat_attr < 0)
        return 1;
    int most = own_max_repeats(info);
    for (int i = 0; i < nops; i++)
        if (infos[i].repeat_attr >= 0 && strcmp(infos[i].d->op, d->op) == 0 &&
            strcmp(infos[i].d->family, d->family) == 0 && own_max_repeats(&infos[i]) < most)
            most = own_max_repeats(&infos[i]);
    return most;
}

static bool repeats_valid(const fx_op_desc *d, double v)
{
    return v == floor(v) && v >= 1 && v <= fx_op_max_repeats(d);
}

int fx_op_repeats(const fx_op_call *c)
{
    int a = fx_op_repeat_attr(c->op);
    return a >= 0 && repeats_valid(c->op, c->attrs[a]) ? (int)c->attrs[a] : 1;
}

int fx_op_slot_count(const fx_op_desc *d, bool result, int repeats)
{
    int first, group = fx_op_group(d, result, &first);
    return group ? first + repeats * group : (result ? d->nresults : d->ninputs);
}

int fx_op_slot_entry(const fx_op_desc *d, bool result, int slot, int *rep)
{
    int first, group = fx_op_group(d, result, &first);
    if (rep)
        *rep = 0;
    if (slot < 0 || slot >= FX_OP_MAX_IO)
        return -1;
    if (!group || slot < first)
        return slot < (result ? d->nresults : d->ninputs) ? slot : -1;
    if (rep)
        *rep = (slot - first) / group;
    return first + (slot - first) % group;
}

int fx_op_slot_of(const fx_op_desc *d, bool result, int index, int rep)
{
    int first, group = fx_op_group(d, result, &first);
    return group && index >= first ? first + rep * group + (index - first) : index;
}

void fx_op_slot_name(const fx_op_desc *d, bool result, int slot, char *out, size_t len)
{
    int rep, e = fx_op_slot_entry(d, result, slot, &rep);
    const fx_op_io *io = e < 0 ? NULL : result ? &d->results[e] : &d->inputs[e];
    int a = fx_op_repeat_attr(d);
    if (!io)
        snprintf(out, len, "?");
    else if (io->repeated && a >= 0)
        snprintf(out, len, "%s[%d].%s", d->attrs[a].name, rep, io->name);
    else
        snprintf(out, len, "%s", io->name);
}

int fx_op_choice_count(const fx_op_attr *a)
{
    int n = 0;
    while (n < FX_OP_MAX_CHOICES && a->choices[n])
        n++;
    return n;
}

int fx_op_choice_index(const fx_op_attr *a, const char *name)
{
    for (int k = 0; k < fx_op_choice_count(a) && name; k++)
        if (strcmp(a->choices[k], name) == 0)
            return k;
    return -1;
}

bool fx_op_enum_valid(const fx_op_attr *a, double v)
{
    return v == floor(v) && v >= 0 && v < fx_op_choice_count(a);
}

int fx_op_enum_error(const fx_op_attr *a, const char *got, fx_status *st)
{
    char names[160];
    fx_op_choice_list(a, ", ", names, sizeof names);
    return fx_fail(st, FX_EBADARG, "%s: expected 0 to %d (%s), got %s", a->name, fx_op_choice_count(a) - 1, names,
                   got);
}

void fx_op_choice_list(const fx_op_attr *a, const char *sep, char *out, size_t len)
{
    int n = fx_op_choice_count(a);
    size_t used = 0;
    if (len)
        out[0] = '\0';
    for (int k = 0; k < n && used < len; k++) {
        const char *before = k == 0 ? "" : k == n - 1 ? " or " : sep;
        int w = snprintf(out + used, len - used, "%s%s", before, a->choices[k]);
        used += w > 0 ? (size_t)w : 0;
    }
}

/* ---- the registry's own check ---- */

__attribute__((format(printf, 3, 4))) static int fault(fx_status *st, const fx_op_desc *d, const char *fmt, ...)
{
    char what[FX_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fx_fail(st, FX_EINTERNAL, "op %s: %s", d ? d->name : "?", what);
}

static int check_io(const fx_op_desc *d, const fx_op_io *io, int n, const char *which, fx_status *st)
{
    for (int i = 0; i < n; i++) {
        const fx_op_io *e = &io[i];
        if (!e->name || !e->layout)
            return fault(st, d, "%s %d: a name and a layout", which, i);
        if (io_index(io, i, e->name) >= 0)
            return fault(st, d, "%s %s: listed twice", which, e->name);
        int flag = fx_op_attr_index(d, e->flag);
        if ((e->when == FX_WHEN_FLAG) != (flag >= 0))
            return fault(st, d, "%s %s: a flag attribute exactly when its `when` is a flag", which, e->name);
        if (flag >= 0 && d->attrs[flag].kind != FX_ATTR_FLAG)
            return fault(st, d, "%s %s: its flag %s is no flag attribute", which, e->name, e->flag);
        if (e->when == FX_WHEN_RULE && !d->present)
            return fault(st, d, "%s %s: a rule, but no `present` hook", which, e->name);
    }
    return FX_OK;
}

/* The public options: each resolves to what may be an option, and every
 * optional tensor input can be given. */
static int check_options(const fx_op_desc *d, fx_status *st)
{
    int n = 0;
    for (const char *const *o = d->options; o && *o; o++, n++) {
        int in = fx_op_input_index(d, *o), attr = -1;
        for (int a = 0; a < d->nattrs && attr < 0; a++)
            if (d->attrs[a].role == FX_ATTR_OPTION &&
                strcmp(d->attrs[a].option ? d->attrs[a].option : d->attrs[a].name, *o) == 0)
                attr = a;
        bool save = strcmp(*o, "save_for_backward") == 0 && d->backward;
        bool tensor = in >= 0 && (d->inputs[in].role == FX_IO_OPTION ||
                                  (d->inputs[in].role == FX_IO_COTANGENT && d->inputs[in].when == FX_WHEN_FLAG));
        if (!tensor && attr < 0 && !save)
            return fault(st, d, "option %s: names no optional input, option attribute or save_for_backward", *o);
        if (tensor && attr >= 0 && d->attrs[attr].kind != FX_ATTR_NUMBER)
            return fault(st, d, "option %s: an input and a flag of one name", *o);
        for (const char *const *p = d->options; p != o; p++)
            if (strcmp(*p, *o) == 0)
                return fault(st, d, "option %s: listed twice", *o);
    }
    for (int i = 0; i < d->ninputs; i++)
        if (d->inputs[i].role == FX_IO_OPTION && index_of(d->inputs[i].name, d->options, n) < 0)
            return fault(st, d, "input %s: an option the public functions do not list", d->inputs[i].name);
    return FX_OK;
}

/* A backward: its gradients are "d" + the forward's inputs, in their
 * order; its forward inputs and saved inputs exist in the forward. */
static int check_backward(const fx_op_desc *fwd, fx_status *st)
{
    const fx_op_desc *bwd = fx_op_find(fwd->backward);
    if (!bwd || bwd->dir != FX_OP_BWD)
        return fault(st, fwd, "its backward %s: not a described backward", fwd->backward);
    int g = 0;
    for (int i = 0; i < fwd->ninputs; i++) {
        const fx_op_io *in = &fwd->inputs[i];
        if (g >= bwd->nresults || bwd->results[g].name[0] != 'd' || strcmp(bwd->results[g].name + 1, in->name))
            return fault(st, bwd, "result %d: expected the gradient d%s", g, in->name);
        if (bwd->results[g].role != FX_IO_GRAD)
            return fault(st, bwd, "result %s: a gradient", bwd->results[g].name);
        if (bwd->results[g].repeated != in->repeated)
            return fault(st, bwd, "result %s: repeated exactly when %s is", bwd->results[g].name, in->name);
        g++;
    }
    if (g != bwd->nresults)
        return fault(st, bwd, "results: one gradient per input of %s, got %d more", fwd->name, bwd->nresults - g);
    for (int i = 0; i < bwd->ninputs; i++) {
        const fx_op_io *in = &bwd->inputs[i];
        if (in->role == FX_IO_FORWARD && fx_op_input_index(fwd, in->name) < 0)
            return fault(st, bwd, "input %s: not an input of %s", in->name, fwd->name);
        if (in->role == FX_IO_FORWARD && fwd->inputs[fx_op_input_index(fwd, in->name)].repeated != in->repeated)
            return fault(st, bwd, "input %s: repeated exactly when in %s", in->name, fwd->name);
        int r = fx_op_result_index(fwd, in->name);
        if (in->role == FX_IO_SAVED && (r < 0 || !fwd->results[r].kept))
            return fault(st, bwd, "input %s: not a kept result of %s", in->name, fwd->name);
        if (in->role == FX_IO_COTANGENT && (in->name[0] != 'd' || fx_op_result_index(fwd, in->name + 1) < 0))
            return fault(st, bwd, "input %s: not d + a result of %s", in->name, fwd->name);
    }
    return FX_OK;
}

/* Choices: none for a number, none or two for a flag, two or more
 * distinct names for an enum, whose default is one of them. */
static int check_choices(const fx_op_desc *d, const fx_op_attr *at, fx_status *st)
{
    int n = fx_op_choice_count(at);
    for (int k = n; k < FX_OP_MAX_CHOICES; k++)
        if (at->choices[k])
            return fault(st, d, "attribute %s: a choice after the list's end", at->name);
    for (int k = 0; k < n; k++)
        if (fx_op_choice_index(at, at->choices[k]) != k)
            return fault(st, d, "attribute %s: choice %s listed twice", at->name, at->choices[k]);
    switch (at->kind) {
    case FX_ATTR_NUMBER:
        return n ? fault(st, d, "attribute %s: choices for a number", at->name) : FX_OK;
    case FX_ATTR_FLAG:
        return n != 0 && n != 2 ? fault(st, d, "attribute %s: a flag has two choices or none, got %d", at->name, n)
                                : FX_OK;
    case FX_ATTR_ENUM:
        if (n < 2)
            return fault(st, d, "attribute %s: an enum has two choices or more, got %d", at->name, n);
        if (at->dflt != floor(at->dflt) || at->dflt < 0 || at->dflt >= n)
            return fault(st, d, "attribute %s: its default %g is no index of its choices", at->name, at->dflt);
        return FX_OK;
    default: return fault(st, d, "attribute %s: an unknown kind %d", at->name, (int)at->kind);
    }
}

/* A repeated group: trailing, always present, no state, announced by one
 * FX_ATTR_REPEAT number; a description with that attribute has a group. */
static int check_group(const fx_op_desc *d, const fx_op_io *io, int n, const char *which, fx_status *st)
{
    bool seen = false;
    for (int i = 0; i < n; i++) {
        if (seen && !io[i].repeated)
            return fault(st, d, "%s %s: after the repeated group (it is the trailing entries)", which, io[i].name);
        seen = seen || io[i].repeated;
        if (io[i].repeated && (io[i].when != FX_WHEN_ALWAYS || io[i].role == FX_IO_STATE || io[i].kept))
            return fault(st, d, "%s %s: a repeated entry is always present, no state and not kept", which,
                         io[i].name);
    }
    return FX_OK;
}

static int check_repeat(const fx_op_desc *d, fx_status *st)
{
    int n = 0;
    for (int a = 0; a < d->nattrs; a++)
        if (d->attrs[a].role == FX_ATTR_REPEAT) {
            if (d->attrs[a].kind != FX_ATTR_NUMBER || d->attrs[a].dflt != 1)
                return fault(st, d, "attribute %s: a repeat count is a number of default 1", d->attrs[a].name);
            n++;
        }
    if (check_group(d, d->inputs, d->ninputs, "input", st) || check_group(d, d->results, d->nresults, "result", st))
        return st->code;
    bool group = fx_op_group(d, false, NULL) || fx_op_group(d, true, NULL);
    if (n != (group ? 1 : 0))
        return fault(st, d, "one repeat attribute exactly when it has a repeated group, got %d", n);
    if (group && fx_op_max_repeats(d) < 1)
        return fault(st, d, "its repeated group does not fit %d slots once", FX_OP_MAX_IO);
    return FX_OK;
}

/* Each state input S of a step is updated into the result "new_" + S. */
static int check_states(const fx_op_desc *d, fx_status *st)
{
    for (int i = 0; i < d->ninputs; i++) {
        if (d->inputs[i].role != FX_IO_STATE)
            continue;
        int r = -1;
        for (int k = 0; k < d->nresults && r < 0; k++)
            if (fx_op_state_input(d, k) == i)
                r = k;
        if (r < 0)
            return fault(st, d, "state %s: no result new_%s updates it", d->inputs[i].name, d->inputs[i].name);
    }
    for (int r = 0; r < d->nresults; r++)
        if (d->results[r].role == FX_IO_STATE && fx_op_state_input(d, r) < 0)
            return fault(st, d, "result %s: a state result is \"new_\" + a state input", d->results[r].name);
    return FX_OK;
}

static int check_desc(const fx_op_desc *d, fx_status *st)
{
    if (!d->name || !d->op || !d->family || !d->check || !d->run)
        return fault(st, d, "a name, op, family, check and run");
    if (d->nattrs > FX_OP_MAX_ATTRS || d->ninputs > FX_OP_MAX_IO || d->nresults > FX_OP_MAX_IO)
        return fault(st, d, "at most %d attributes and %d inputs and results", FX_OP_MAX_ATTRS, FX_OP_MAX_IO);
    for (int a = 0; a < d->nattrs; a++) {
        if (fx_op_attr_index(d, d->attrs[a].name) != a)
            return fault(st, d, "attribute %s: listed twice", d->attrs[a].name);
        if (check_choices(d, &d->attrs[a], st))
            return st->code;
    }
    if (check_io(d, d->inputs, d->ninputs, "input", st) || check_io(d, d->results, d->nresults, "result", st) ||
        check_options(d, st) || check_repeat(d, st) || check_states(d, st))
        return st->code;
    bool states = false;
    for (int i = 0; i < d->ninputs; i++)
        states = states || d->inputs[i].role == FX_IO_STATE;
    if ((d->dir == FX_OP_STEP) != states)
        return fault(st, d, "a step has a state input (\"state\", updated into \"new_state\"), other ops none");
    if (d->backward && d->dir != FX_OP_FWD)
        return fault(st, d, "only a forward has a backward");
    if (d->backward && fx_op_find(d->backward) && fx_op_find(d->backward)->no_xla != d->no_xla)
        return fault(st, d, "its backward %s: an XLA target exactly when the forward is", d->backward);
    return d->backward ? check_backward(d, st) : FX_OK;
}

int fx_op_registry_check(fx_status *st)
{
    for (int i = 0; i < fx_op_count(); i++) {
        const fx_op_desc *d = fx_op_at(i);
        for (int k = 0; k < i; k++)
            if (strcmp(fx_op_at(k)->name, d->name) == 0)
                return fault(st, d, "described twice");
        if (check_desc(d, st))
            return st->code;
        if (!d->no_xla && i > 0 && fx_op_at(i - 1)->no_xla)
            return fault(st, d, "an XLA target listed after %s, which is none (XLA targets come first)",
                         fx_op_at(i - 1)->name);
    }
    return FX_OK;
}

/* ---- calls ---- */

void fx_op_call_init(fx_op_call *c, const fx_op_desc *d, fx_device *dev)
{
    memset(c, 0, sizeof *c);
    c->op = d;
    c->dev = dev;
    for (int a = 0; a < d->nattrs; a++)
        c->attrs[a] = d->attrs[a].dflt;
}

/* `index`: a slot (the entries of a repeated group are always present). */
static int present(const op_info *info, const fx_op_call *c, bool result, int index, bool *out, fx_status *st)
{
    const fx_op_desc *d = c->op;
    index = fx_op_slot_entry(d, result, index, NULL);
    if (index < 0) {
        *out = false;
        return FX_OK;
    }
    const fx_op_io *io = result ? &d->results[index] : &d->inputs[index];
    switch (io->when) {
    case FX_WHEN_FLAG: *out = c->attrs[result ? info->out_flag[index] : info->in_flag[index]] != 0; return FX_OK;
    case FX_WHEN_RULE: return d->present(c, result, index, out, st);
    default: *out = true; return FX_OK;
    }
}

int fx_op_input_present(const fx_op_call *c, int index, bool *out, fx_status *st)
{
    return present(info_of(c->op), c, false, index, out, st);
}

int fx_op_result_present(const fx_op_call *c, int index, bool *out, fx_status *st)
{
    return present(info_of(c->op), c, true, index, out, st);
}

int fx_op_input_flag(const fx_op_desc *d, int index)
{
    const op_info *info = info_of(d);
    return info && index >= 0 && index < d->ninputs ? info->in_flag[index] : -1;
}

int fx_op_result_flag(const fx_op_desc *d, int index)
{
    const op_info *info = info_of(d);
    return info && index >= 0 && index < d->nresults ? info->out_flag[index] : -1;
}

/* Why an input (slot `i`) should or should not be there, for the message. */
static int presence_error(const fx_op_call *c, int i, bool want, fx_status *st)
{
    const fx_op_io *io = &c->op->inputs[fx_op_slot_entry(c->op, false, i, NULL)];
    char name[64];
    fx_op_slot_name(c->op, false, i, name, sizeof name);
    if (io->when == FX_WHEN_FLAG)
        return fx_fail(st, FX_EBADARG, "%s: expected %s (%s is %d), got %s", name, want ? "a tensor" : "none",
                       io->flag, want ? 1 : 0, want ? "none" : "a tensor");
    if (io->when == FX_WHEN_RULE)
        return fx_fail(st, FX_EBADARG, "%s: expected %s for these inputs, got %s", name,
                       want ? "a tensor" : "none", want ? "none" : "a tensor");
    return fx_fail(st, FX_EBADARG, "%s: expected a tensor, got none", name);
}

/* The repeat count is an integer the slots hold. */
int fx_op_check_repeats(const fx_op_call *c, fx_status *st)
{
    const fx_op_desc *d = c->op;
    int a = fx_op_repeat_attr(d);
    if (a < 0 || repeats_valid(d, c->attrs[a]))
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected an integer from 1 to %d, got %g", d->attrs[a].name,
                   fx_op_max_repeats(d), c->attrs[a]);
}

int fx_op_check(const fx_op_call *c, fx_op_spec results[FX_OP_MAX_IO], fx_status *st)
{
    const fx_op_desc *d = c->op;
    const op_info *info = info_of(d);
    for (int a = 0; a < d->nattrs; a++)
        if (d->attrs[a].kind == FX_ATTR_FLAG && c->attrs[a] != 0 && c->attrs[a] != 1)
            return fx_fail(st, FX_EBADARG, "%s: expected 0 or 1, got %g", d->attrs[a].name, c->attrs[a]);
        else if (d->attrs[a].kind == FX_ATTR_ENUM && !fx_op_enum_valid(&d->attrs[a], c->attrs[a])) {
            char got[32];
            snprintf(got, sizeof got, "%g", c->attrs[a]);
            return fx_op_enum_error(&d->attrs[a], got, st);
        }
    if (fx_op_check_repeats(c, st))
        return st->code;
    const int nin = fx_op_slot_count(d, false, fx_op_repeats(c)), nout = fx_op_slot_count(d, true, fx_op_repeats(c));
    for (int i = nin; i < FX_OP_MAX_IO; i++)
        if (c->in[i]) {
            char name[64];
            fx_op_slot_name(d, false, i, name, sizeof name);
            return fx_fail(st, FX_EBADARG, "inputs: expected %d tensors (for %d repetitions), got one more (%s)",
                           nin, fx_op_repeats(c), name);
        }
    for (int i = 0; i < nin; i++) {
        bool want;
        if (present(info, c, false, i, &want, st))
            return st->code;
        bool given = c->in[i] != NULL;
        if (want == given)
            continue;
        /* Saved states the device's backward does not read: the check
         * decides (it refuses their absence where it needs them). */
        const fx_op_io *io = &d->inputs[fx_op_slot_entry(d, false, i, NULL)];
        if (!given && io->role == FX_IO_SAVED && io->when == FX_WHEN_RULE)
            continue;
        return presence_error(c, i, want, st);
    }
    for (int r = 0; r < nout; r++) {
        results[r].dtype = FX_F32;
        results[r].rank = 0;
        if (present(info, c, true, r, &results[r].present, st))
            return st->code;
    }
    return d->check(c, results, st);
}

/* Every present result is given and no other. */
static int expect_results(const fx_op_call *c, const fx_op_spec *specs, fx_status *st)
{
    const int n = fx_op_slot_count(c->op, true, fx_op_repeats(c));
    for (int r = 0; r < FX_OP_MAX_IO; r++) {
        bool want = r < n && specs[r].present;
        if (want == (c->out[r] != NULL))
            continue;
        char name[64];
        fx_op_slot_name(c->op, true, r, name, sizeof name);
        return fx_fail(st, FX_EBADARG, "%s: expected %s, got %s", name, want ? "a result tensor" : "no result tensor",
                       want ? "none" : "one");
    }
    return FX_OK;
}

int fx_op_call_results(const fx_op_call *c) { return fx_op_slot_count(c->op, true, fx_op_repeats(c)); }

int fx_op_run_into(const fx_exec *ex, const fx_op_call *c, fx_status *st)
{
    fx_op_spec specs[FX_OP_MAX_IO];
    if (fx_op_check(c, specs, st) || expect_results(c, specs, st))
        return st->code;
    return c->op->run(ex, c, st);
}

/* A tensor of the spec's shape and type without memory: what a scratch
 * query or a shape-only check reads. */
static int shape_only(const fx_op_spec *s, fx_device *dev, fx_tensor *t, fx_status *st)
{
    memset(t, 0, sizeof *t);
    t->dtype = s->dtype;
    t->rank = s->rank;
    memcpy(t->dims, s->dims, sizeof(int64_t) * (size_t)s->rank);
    t->device = dev;
    return fx_shape_nbytes("shape", s->dtype, s->rank, s->dims, &t->numel, &t->nbytes, st);
}

size_t fx_op_scratch(const fx_exec *ex, const fx_op_call *c)
{
    if (!c->op->scratch)
        return 0;
    fx_status st;
    fx_status_clear(&st);
    fx_op_spec specs[FX_OP_MAX_IO];
    fx_tensor stand_in[FX_OP_MAX_IO];
    fx_op_call q = *c;
    if (fx_op_check(c, specs, &st))
        return 0;
    for (int r = 0; r < fx_op_call_results(c); r++)
        if (specs[r].present && !q.out[r]) {
            if (shape_only(&specs[r], c->dev, &stand_in[r], &st))
                return 0;
            q.out[r] = &stand_in[r];
        }
    return c->op->scratch(ex, &q);
}

static void release_outs(fx_op_call *c, fx_tensor outs[FX_OP_MAX_IO])
{
    for (int r = 0; r < FX_OP_MAX_IO; r++) {
        fx_tensor_release(&outs[r]);
        c->out[r] = NULL;
    }
}

int fx_op_run(fx_op_call *c, fx_tensor outs[FX_OP_MAX_IO], fx_status *st)
{
    const fx_op_desc *d = c->op;
    fx_op_spec specs[FX_OP_MAX_IO];
    memset(outs, 0, sizeof(fx_tensor) * FX_OP_MAX_IO);
    memset(c->out, 0, sizeof c->out);
    if (fx_op_check(c, specs, st))
        return st->code;
    for (int r = 0; r < fx_op_call_results(c); r++) {
        if (!specs[r].present)
            continue;
        int state = fx_op_state_input(d, fx_op_slot_entry(d, true, r, NULL));
        if (state >= 0) {
            c->out[r] = c->in[state];
            continue;
        }
        if (fx_tensor_alloc(c->dev, specs[r].dtype, specs[r].rank, specs[r].dims, &outs[r], st)) {
            release_outs(c, outs);
            return st->code;
        }
        c->out[r] = &outs[r];
    }
    if (d->run(NULL, c, st))
        release_outs(c, outs);
    return st->code;
}

/* ---- contexts ---- */

struct fx_op_ctx {
    const fx_op_desc *op;
    fx_device *dev;
    double attrs[FX_OP_MAX_ATTRS];
    fx_tensor in[FX_OP_MAX_IO], kept[FX_OP_MAX_IO]; /* no buffer: not given, not kept */
    bool has_in[FX_OP_MAX_IO], has_kept[FX_OP_MAX_IO];
};

static void keep(fx_tensor *dst, const fx_tensor *src)
{
    *dst = *src;
    if (src->buffer)
        fx_buffer_ref(src->buffer);
}

/* The backward's call from what a context holds (the forward's attributes,
 * inputs and kept results): attributes by name, forward inputs by name,
 * saved inputs from the kept results where the backward's call wants them
 * (by flag or rule, given the inputs before them), cotangents as given,
 * presence flags from what is there. */
static int backward_call(const fx_op_desc *fwd, const double *attrs, const fx_tensor *const *in,
                         const fx_tensor *const *kept, const fx_tensor *const *cotangents, fx_device *dev,
                         fx_op_call *bwd, fx_status *st)
{
    const fx_op_desc *d = fx_op_find(fwd->backward);
    if (!d)
        return fx_fail(st, FX_EINTERNAL, "%s: its backward %s is not described", fwd->name, fwd->backward);
    fx_op_call_init(bwd, d, dev);
    for (int a = 0; a < d->nattrs; a++) {
        int f = fx_op_attr_index(fwd, d->attrs[a].name);
        if (f >= 0)
            bwd->attrs[a] = attrs[f];
    }
    const op_info *info = info_of(d);
    const int nin = fx_op_slot_count(d, false, fx_op_repeats(bwd));
    for (int i = 0; i < nin; i++) {
        int rep, e = fx_op_slot_entry(d, false, i, &rep);
        const fx_op_io *io = &d->inputs[e];
        int f;
        bool wanted;
        switch (io->role) {
        case FX_IO_FORWARD:
            f = fx_op_input_index(fwd, io->name);
            bwd->in[i] = f >= 0 ? in[fx_op_slot_of(fwd, false, f, rep)] : NULL;
            break;
        case FX_IO_SAVED:
            f = fx_op_result_index(fwd, io->name);
            bwd->in[i] = f >= 0 ? kept[f] : NULL;
            if (bwd->in[i] && fx_op_input_present(bwd, i, &wanted, st))
                return st->code;
            if (bwd->in[i] && !wanted)
                bwd->in[i] = NULL;
            break;
        default: bwd->in[i] = cotangents ? cotangents[i] : NULL; break;
        }
        if (info->in_flag[e] >= 0 && d->attrs[info->in_flag[e]].role == FX_ATTR_PRESENCE)
            bwd->attrs[info->in_flag[e]] = bwd->in[i] != NULL;
    }
    return FX_OK;
}

/* The context's inputs and kept results as the backward call takes them. */
static void ctx_tensors(const fx_op_ctx *ctx, const fx_tensor *in[FX_OP_MAX_IO], const fx_tensor *kept[FX_OP_MAX_IO])
{
    for (int i = 0; i < FX_OP_MAX_IO; i++) {
        in[i] = ctx->has_in[i] ? &ctx->in[i] : NULL;
        kept[i] = ctx->has_kept[i] ? &ctx->kept[i] : NULL;
    }
}

int fx_op_ctx_new(const fx_op_call *fwd, fx_op_ctx **out, fx_status *st)
{
    const fx_op_desc *d = fwd->op;
    *out = NULL;
    if (!d->backward)
        return fx_fail(st, FX_EINTERNAL, "%s: no backward to keep a context for", d->name);
    fx_op_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a %s context", d->op);
    ctx->op = d;
    ctx->dev = fwd->dev;
    memcpy(ctx->attrs, fwd->attrs, sizeof ctx->attrs);
    for (int i = 0; i < FX_OP_MAX_IO; i++)
        if (fwd->in[i]) {
            keep(&ctx->in[i], fwd->in[i]);
            ctx->has_in[i] = true;
        }
    for (int r = 0; r < d->nresults; r++)
        if (d->results[r].kept && fwd->out[r]) {
            keep(&ctx->kept[r], fwd->out[r]);
            ctx->has_kept[r] = true;
        }
    /* Only what the backward reads stays (a linear layer's y only where
     * the activation's derivative reads it). */
    const fx_tensor *in[FX_OP_MAX_IO], *kept[FX_OP_MAX_IO];
    ctx_tensors(ctx, in, kept);
    fx_op_call bwd;
    if (backward_call(d, ctx->attrs, in, kept, NULL, ctx->dev, &bwd, st)) {
        fx_op_ctx_free(ctx);
        return st->code;
    }
    for (int r = 0; r < d->nresults; r++) {
        int b = fx_op_input_index(bwd.op, d->results[r].name);
        if (ctx->has_kept[r] && (b < 0 || bwd.op->inputs[b].role != FX_IO_SAVED || !bwd.in[b])) {
            fx_tensor_release(&ctx->kept[r]);
            memset(&ctx->kept[r], 0, sizeof ctx->kept[r]);
            ctx->has_kept[r] = false;
        }
    }
    *out = ctx;
    return FX_OK;
}

void fx_op_ctx_free(fx_op_ctx *ctx)
{
    if (!ctx)
        return;
    for (int i = 0; i < FX_OP_MAX_IO; i++) {
        fx_tensor_release(&ctx->in[i]);
        fx_tensor_release(&ctx->kept[i]);
    }
    free(ctx);
}

const fx_op_desc *fx_op_ctx_op(const fx_op_ctx *ctx) { return ctx->op; }

size_t fx_op_ctx_saved_bytes(const fx_op_ctx *ctx)
{
    size_t bytes = 0;
    for (int r = 0; r < ctx->op->nresults; r++)
        if (ctx->has_kept[r] && ctx->op->results[r].role == FX_IO_SAVED)
            bytes += ctx->kept[r].nbytes;
    return bytes;
}

int fx_op_ctx_backward(const fx_op_ctx *ctx, const fx_tensor *const cotangents[FX_OP_MAX_IO], fx_op_call *bwd,
                       fx_status *st)
{
    const fx_tensor *in[FX_OP_MAX_IO], *kept[FX_OP_MAX_IO];
    ctx_tensors(ctx, in, kept);
    return backward_call(ctx->op, ctx->attrs, in, kept, cotangents, ctx->dev, bwd, st);
}

/* ---- JSON ---- */

typedef struct writer {
    char *out;
    size_t len, used; /* used may pass len: the length needed */
} writer;

__attribute__((format(printf, 2, 3))) static void put(writer *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = w->used < w->len ? w->len - w->used : 0;
    int n = vsnprintf(room ? w->out + w->used : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->used += (size_t)n;
}

/* A JSON string (names and layouts are plain ASCII; quotes and
 * backslashes are escaped all the same), or null. */
static void put_string(writer *w, const char *s)
{
    if (!s) {
        put(w, "null");
        return;
    }
    put(w, "\"");
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            put(w, "\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            put(w, "\\u%04x", (unsigned)*p);
        else
            put(w, "%c", *p);
    }
    put(w, "\"");
}

static void put_key(writer *w, const char *key, const char *value, bool first)
{
    put(w, "%s\"%s\": ", first ? "" : ", ", key);
    put_string(w, value);
}

static const char *const dir_names[] = {"fwd", "bwd", "step"};
static const char *const kind_names[] = {"flag", "number", "enum"};
static const char *const attr_role_names[] = {"option", "presence", "save", "repeat"};
static const char *const io_role_names[] = {"arg", "option", "state", "forward", "saved", "cotangent", "output",
                                            "grad"};
static const char *const when_names[] = {"always", "flag", "rule"};

static void put_number(writer *w, double v)
{
    if (v == floor(v) && fabs(v) < 1e15)
        put(w, "%lld", (long long)v);
    else
        put(w, "%.17g", v);
}

static void put_io(writer *w, const char *key, const fx_op_io *io, int n)
{
    put(w, ", \"%s\": [", key);
    for (int i = 0; i < n; i++) {
        put(w, "%s{", i ? ", " : "");
        put_key(w, "name", io[i].name, true);
        put_key(w, "layout", io[i].layout, false);
        put_key(w, "role", io_role_names[io[i].role], false);
        put_key(w, "presence", when_names[io[i].when], false);
        put_key(w, "flag", io[i].flag, false);
        put(w, ", \"kept\": %s", io[i].kept ? "true" : "false");
        put(w, ", \"repeated\": %s}", io[i].repeated ? "true" : "false");
    }
    put(w, "]");
}

size_t fx_op_describe_json(const fx_op_desc *d, char *out, size_t len)
{
    writer w = {out, len, 0};
    if (out && len)
        out[0] = '\0';
    char target[128];
    snprintf(target, sizeof target, "fusex_%s", d->name);
    put(&w, "{\"index\": %d, ", fx_op_index(d));
    put_key(&w, "name", d->name, true);
    put_key(&w, "op", d->op, false);
    put_key(&w, "family", d->family, false);
    put_key(&w, "dir", dir_names[d->dir], false);
    put_key(&w, "target", d->no_xla ? NULL : target, false);
    put(&w, ", \"attrs\": [");
    for (int a = 0; a < d->nattrs; a++) {
        const fx_op_attr *at = &d->attrs[a];
        put(&w, "%s{", a ? ", " : "");
        put_key(&w, "name", at->name, true);
        put_key(&w, "kind", kind_names[at->kind], false);
        put_key(&w, "role", attr_role_names[at->role], false);
        put(&w, ", \"default\": ");
        put_number(&w, at->dflt);
        put_key(&w, "option", at->option, false);
        put(&w, ", \"choices\": ");
        if (at->choices[0]) {
            put(&w, "[");
            for (int k = 0; k < fx_op_choice_count(at); k++) {
                put(&w, "%s", k ? ", " : "");
                put_string(&w, at->choices[k]);
            }
            put(&w, "]");
        } else {
            put(&w, "null");
        }
        put(&w, ", \"positive\": %s}", at->positive ? "true" : "false");
    }
    put(&w, "]");
    put_io(&w, "inputs", d->inputs, d->ninputs);
    put_io(&w, "results", d->results, d->nresults);
    put(&w, ", \"options\": [");
    for (const char *const *o = d->options; o && *o; o++) {
        put(&w, "%s", o == d->options ? "" : ", ");
        put_string(&w, *o);
    }
    put(&w, "]");
    put_key(&w, "backward", d->backward, false);
    put_key(&w, "saved_by", d->backward ? (d->saved_by ? d->saved_by : d->op) : NULL, false);
    put(&w, "}");
    if (out && len && w.used >= len)
        out[len - 1] = '\0';
    return w.used;
}

size_t fx_op_dtypes_json(char *out, size_t len)
{
    writer w = {out, len, 0};
    if (out && len)
        out[0] = '\0';
    put(&w, "[");
    for (int t = 0; t < FX_DTYPE_COUNT; t++) {
        char name[16];
        snprintf(name, sizeof name, "%s%d", fx_dtype_kind((fx_dtype)t), fx_dtype_bits((fx_dtype)t));
        put(&w, "%s", t ? ", " : "");
        put_string(&w, name);
    }
    put(&w, "]");
    if (out && len && w.used >= len)
        out[len - 1] = '\0';
    return w.used;
}
