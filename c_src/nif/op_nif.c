/* Glue for every described op (c_src/core/op.h): one set of rows reads an
 * op's description and turns terms into its call and its results into
 * terms. Nothing here knows an op; the public functions of src/fusex.erl
 * name them.
 *
 *   op(Name, Positional, Opts)             a forward or a step
 *   op_backward(Name, Cotangent, Ctx, Opts) a backward from a forward's context
 *   op_run(Name, Names, Tensors, Attrs)    any description (a backward too) on
 *                                          its inputs by name and its attributes
 *   op_check(Name, Inputs, Attrs, Device)  the op layer's check on shapes and types
 *   op_list()                              the descriptions as terms
 *
 * The options of a call are the description's (its `options`: optional
 * tensors by input name, option attributes by name or alias, choices and
 * enums as atoms, save_for_backward), checked against the allowed keys.
 * A repeated group (an RNN's layers, core/op.h) is one positional list of
 * maps, [#{w_ih => T, ...}], its repeat attribute its length; a backward
 * gives its gradients of it likewise, under the attribute's name
 * (layers => [#{w_ih => DW, ...}]). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/op.h"
#include "fusex_dtype.h"
#include "nif/nifs.h"

#define MAX_OPS 256

/* Each op's name as an atom, and each backward's forward, by registry
 * index: looked up on every call. Atoms are never collected, so terms
 * made once serve every env. */
static ERL_NIF_TERM op_atoms[MAX_OPS];
static const fx_op_desc *forward_of[MAX_OPS];
static int nops;
static atomic_bool atoms_ready;
static pthread_mutex_t atoms_lock = PTHREAD_MUTEX_INITIALIZER;

static void make_atoms(ErlNifEnv *env)
{
    if (atomic_load_explicit(&atoms_ready, memory_order_acquire))
        return;
    pthread_mutex_lock(&atoms_lock);
    if (!atomic_load_explicit(&atoms_ready, memory_order_relaxed)) {
        int n = fx_op_count() < MAX_OPS ? fx_op_count() : MAX_OPS;
        for (int i = 0; i < n; i++) {
            const fx_op_desc *d = fx_op_at(i);
            op_atoms[i] = fx_atom(env, d->name);
            const fx_op_desc *b = d->backward ? fx_op_find(d->backward) : NULL;
            if (b && fx_op_index(b) >= 0 && fx_op_index(b) < MAX_OPS)
                forward_of[fx_op_index(b)] = d;
        }
        nops = n;
        atomic_store_explicit(&atoms_ready, true, memory_order_release);
    }
    pthread_mutex_unlock(&atoms_lock);
}

static int bad_value(fx_call *c, const char *name, const char *expected, ERL_NIF_TERM got)
{
    char text[96];
    fx_format_term(text, sizeof text, got);
    return fx_fail(&c->st, FX_EBADARG, "%s: expected %s, got %s", name, expected, text);
}

/* The op an atom names, of direction `dir` (-1: any). */
static int arg_op(fx_call *c, ERL_NIF_TERM term, int dir, const fx_op_desc **out)
{
    make_atoms(c->env);
    for (int i = 0; i < nops; i++)
        if (enif_is_identical(term, op_atoms[i]) && (dir < 0 || (int)fx_op_at(i)->dir == dir)) {
            *out = fx_op_at(i);
            return FX_OK;
        }
    return bad_value(c, "op", dir == FX_OP_BWD ? "the name of a described backward (fusex_nif:op_list/0)"
                                               : "the name of a described op (fusex_nif:op_list/0)", term);
}

/* ---- options ---- */

/* What an option names: an input, an attribute (or both: a step size, a
 * tensor or a number), or save_for_backward. */
typedef struct option {
    const char *name;
    int input, attr;
    bool save;
} option;

static option resolve(const fx_op_desc *d, const char *name)
{
    option o = {name, fx_op_input_index(d, name), -1, strcmp(name, "save_for_backward") == 0};
    for (int a = 0; a < d->nattrs && o.attr < 0; a++) {
        const fx_op_attr *at = &d->attrs[a];
        if (at->role == FX_ATTR_OPTION && strcmp(at->option ? at->option : at->name, name) == 0)
            o.attr = a;
    }
    return o;
}

/* The option map's keys are all the op's options ("no options" where it
 * has none). */
static int check_opts(fx_call *c, ERL_NIF_TERM opts, const char *const *allowed)
{
    static const char *const none[] = {NULL};
    size_t size;
    if (!allowed)
        allowed = none;
    if (!allowed[0] && enif_get_map_size(c->env, opts, &size) && size > 0) {
        ERL_NIF_TERM key, value;
        ErlNifMapIterator it;
        enif_map_iterator_create(c->env, opts, &it, ERL_NIF_MAP_ITERATOR_FIRST);
        enif_map_iterator_get_pair(c->env, &it, &key, &value);
        enif_map_iterator_destroy(c->env, &it);
        return bad_value(c, "opts", "no options", key);
    }
    return fx_arg_opts(c, opts, allowed);
}

/* A number option: "a positive number" where the attribute says so, and
 * "or a fusex tensor (layout)" where an input shares its name. */
static int number_option(fx_call *c, const fx_op_desc *d, const option *o, ERL_NIF_TERM v, double *out)
{
    const fx_op_attr *at = &d->attrs[o->attr];
    if (!at->positive && o->input < 0)
        return fx_arg_double(c, v, o->name, out);
    char expected[128];
    if (o->input >= 0)
        snprintf(expected, sizeof expected, "a %snumber or a fusex tensor (%s)", at->positive ? "positive " : "",
                 d->inputs[o->input].layout);
    else
        snprintf(expected, sizeof expected, "a positive number");
    if (!enif_is_number(c->env, v) || fx_arg_double(c, v, o->name, out) ||
        (at->positive && (!(*out > 0) || !isfinite(*out))))
        return c->st.code ? c->st.code : bad_value(c, o->name, expected, v);
    return FX_OK;
}

/* A flag option: true or false, or one of its two choices. */
static int flag_option(fx_call *c, const fx_op_attr *at, const char *name, ERL_NIF_TERM v, double *out)
{
    if (!at->choices[0]) {
        bool b;
        if (fx_arg_bool(c, v, name, &b))
            return c->st.code;
        *out = b;
        return FX_OK;
    }
    for (int k = 0; k < 2; k++)
        if (enif_is_identical(v, fx_atom(c->env, at->choices[k]))) {
            *out = k;
            return FX_OK;
        }
    char expected[96];
    snprintf(expected, sizeof expected, "%s or %s", at->choices[0], at->choices[1]);
    return bad_value(c, name, expected, v);
}

/* An enum option: one of its choices, as an atom. */
static int enum_option(fx_call *c, const fx_op_attr *at, const char *name, ERL_NIF_TERM v, double *out)
{
    for (int k = 0; k < fx_op_choice_count(at); k++)
        if (enif_is_identical(v, fx_atom(c->env, at->choices[k]))) {
            *out = k;
            return FX_OK;
        }
    char expected[160];
    fx_op_choice_list(at, ", ", expected, sizeof expected);
    return bad_value(c, name, expected, v);
}

/* Reads every option given into the call (tensors into `held`); `save`
 * says whether save_for_backward was asked. */
static int read_opts(fx_call *c, ERL_NIF_TERM opts, fx_op_call *call, fx_tensor *held, bool *save)
{
    const fx_op_desc *d = call->op;
    *save = false;
    if (check_opts(c, opts, d->options))
        return c->st.code;
    for (const char *const *name = d->options; name && *name; name++) {
        ERL_NIF_TERM v;
        if (!fx_opt_term(c, opts, *name, &v))
            continue;
        option o = resolve(d, *name);
        fx_handle *h;
        if (o.input >= 0 && (o.attr < 0 || enif_get_resource(c->env, v, fx_tensor_type, (void **)&h))) {
            if (fx_arg_tensor(c, v, *name, &held[o.input]))
                return c->st.code;
            call->in[o.input] = &held[o.input];
        } else if (o.attr >= 0) {
            const fx_op_attr *at = &d->attrs[o.attr];
            double *value = &call->attrs[o.attr];
            if (at->kind == FX_ATTR_NUMBER ? number_option(c, d, &o, v, value)
                : at->kind == FX_ATTR_ENUM ? enum_option(c, at, *name, v, value)
                                           : flag_option(c, at, *name, v, value))
                return c->st.code;
        } else if (o.save && fx_arg_bool(c, v, *name, save)) {
            return c->st.code;
        }
    }
    return FX_OK;
}

/* Presence attributes from the tensors given. */
static void set_presence(fx_op_call *call)
{
    const fx_op_desc *d = call->op;
    for (int i = 0; i < d->ninputs; i++) {
        int flag = fx_op_input_flag(d, i);
        if (flag >= 0 && d->attrs[flag].role == FX_ATTR_PRESENCE)
            call->attrs[flag] = call->in[i] != NULL;
    }
}

/* A training forward keeps what its backward reads where that backward
 * reads it. */
static void set_save(fx_op_call *call)
{
    const fx_op_desc *d = call->op;
    for (int a = 0; a < d->nattrs; a++)
        if (d->attrs[a].role == FX_ATTR_SAVE)
            call->attrs[a] = !d->saves_on || d->saves_on(call->dev);
}

/* Reads one value of a repeated group into slot `slot`. */
typedef int (*group_reader)(fx_call *c, ERL_NIF_TERM value, const char *name, int slot, void *arg);

/* "#{w_ih, w_hh, b_ih, b_hh}": the keys of a repeated group's maps. */
static void group_keys(const fx_op_desc *d, char *out, size_t len)
{
    int first, n = fx_op_group(d, false, &first);
    size_t used = (size_t)snprintf(out, len, "#{");
    for (int k = 0; k < n && used < len; k++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", k ? ", " : "", d->inputs[first + k].name);
    if (used < len)
        snprintf(out + used, len - used, "}");
}

/* The repeated group: one map per repetition, every entry of the group a
 * key and no other; the repeat attribute set from the list's length. */
static int arg_group(fx_call *c, ERL_NIF_TERM list, fx_op_call *call, group_reader read, void *arg)
{
    const fx_op_desc *d = call->op;
    const int attr = fx_op_repeat_attr(d);
    int first, n = fx_op_group(d, false, &first);
    char keys[128], expected[192], name[64];
    unsigned len;
    group_keys(d, keys, sizeof keys);
    if (!enif_get_list_length(c->env, list, &len) || len < 1 || (int)len > fx_op_max_repeats(d)) {
        snprintf(expected, sizeof expected, "a list of 1 to %d maps %s", fx_op_max_repeats(d), keys);
        return bad_value(c, d->attrs[attr].name, expected, list);
    }
    snprintf(expected, sizeof expected, "a map %s", keys);
    call->attrs[attr] = len;
    ERL_NIF_TERM head, tail = list;
    for (int r = 0; enif_get_list_cell(c->env, tail, &head, &tail); r++) {
        size_t size;
        snprintf(name, sizeof name, "%s[%d]", d->attrs[attr].name, r);
        if (!enif_get_map_size(c->env, head, &size))
            return bad_value(c, name, expected, head);
        for (int k = 0; k < n; k++) {
            const char *entry = d->inputs[first + k].name;
            ERL_NIF_TERM v;
            int slot = fx_op_slot_of(d, false, first + k, r);
            fx_op_slot_name(d, false, slot, name, sizeof name);
            if (!enif_get_map_value(c->env, head, fx_atom(c->env, entry), &v))
                return fx_fail(&c->st, FX_EBADARG, "%s: expected a tensor %s, got none", name,
                               d->inputs[first + k].layout);
            if (read(c, v, name, slot, arg))
                return c->st.code;
        }
        if ((int)size != n) {
            ErlNifMapIterator it;
            ERL_NIF_TERM key = head, value;
            enif_map_iterator_create(c->env, head, &it, ERL_NIF_MAP_ITERATOR_FIRST);
            while (enif_map_iterator_get_pair(c->env, &it, &key, &value)) {
                bool known = false;
                for (int k = 0; k < n && !known; k++)
                    known = enif_is_identical(key, fx_atom(c->env, d->inputs[first + k].name));
                if (!known)
                    break;
                enif_map_iterator_next(c->env, &it);
            }
            enif_map_iterator_destroy(c->env, &it);
            snprintf(name, sizeof name, "%s[%d]", d->attrs[attr].name, r);
            snprintf(expected, sizeof expected, "only the keys %s", keys);
            return bad_value(c, name, expected, key);
        }
    }
    return FX_OK;
}

static int read_tensor(fx_call *c, ERL_NIF_TERM value, const char *name, int slot, void *arg)
{
    fx_op_call *call = ((void **)arg)[0];
    fx_tensor *held = ((void **)arg)[1];
    if (fx_arg_tensor(c, value, name, &held[slot]))
        return c->st.code;
    call->in[slot] = &held[slot];
    return FX_OK;
}

/* The positional tensors: the inputs the public function takes in order
 * (a step's state first; a repeated group as one list of maps, its
 * last). */
static int arg_positional(fx_call *c, ERL_NIF_TERM list, fx_op_call *call, fx_tensor *held)
{
    const fx_op_desc *d = call->op;
    int want = 0;
    const char *names[FX_OP_MAX_IO];
    int index[FX_OP_MAX_IO];
    const int attr = fx_op_repeat_attr(d);
    for (int i = 0; i < d->ninputs; i++)
        if (d->inputs[i].repeated) {
            names[want] = d->attrs[attr].name;
            index[want++] = -1;
            break;
        } else if (d->inputs[i].role == FX_IO_ARG || d->inputs[i].role == FX_IO_STATE) {
            names[want] = d->inputs[i].name;
            index[want++] = i;
        }
    unsigned len;
    if (!enif_get_list_length(c->env, list, &len) || (int)len != want) {
        char expected[256];
        size_t used = (size_t)snprintf(expected, sizeof expected, "a list of %d tensors (", want);
        for (int k = 0; k < want && used < sizeof expected; k++)
            used += (size_t)snprintf(expected + used, sizeof expected - used, "%s%s", k ? ", " : "", names[k]);
        if (used < sizeof expected)
            snprintf(expected + used, sizeof expected - used, ")");
        return bad_value(c, "args", expected, list);
    }
    ERL_NIF_TERM head, tail = list;
    void *group_arg[2] = {call, held};
    for (int k = 0; enif_get_list_cell(c->env, tail, &head, &tail); k++) {
        if (index[k] < 0 ? arg_group(c, head, call, read_tensor, group_arg)
                         : fx_arg_tensor(c, head, names[k], &held[index[k]]))
            return c->st.code;
        if (index[k] >= 0)
            call->in[index[k]] = &held[index[k]];
    }
    call->dev = held[index[0]].device;
    return FX_OK;
}

/* Holds the results for the call (released at its end unless handed to
 * Erlang). */
static int hold_outs(fx_call *c, const fx_op_desc *d, fx_tensor *outs)
{
    (void)d;
    for (int r = 0; r < FX_OP_MAX_IO; r++)
        if (outs[r].buffer && fx_call_hold(c, &outs[r]))
            return c->st.code;
    return FX_OK;
}

static void ctx_destroy(void *data) { fx_op_ctx_free(data); }

static const char *saved_by(const fx_op_desc *fwd) { return fwd->saved_by ? fwd->saved_by : fwd->op; }

/* op(Name, Positional, Opts) -> Y | {Y, State} | {Y, Ctx} | {Y, State, Ctx};
 * a step returns its output and updates its state in place. */
FX_ENQUEUE_NIF(nif_op)
static ERL_NIF_TERM nif_op(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    const fx_op_desc *d = NULL;
    fx_op_call call;
    fx_tensor held[FX_OP_MAX_IO], outs[FX_OP_MAX_IO];
    bool save = false;
    fx_op_ctx *ctx = NULL;
    memset(outs, 0, sizeof outs);
    fx_call_init(&c, env);
    if (arg_op(&c, argv[0], -1, &d))
        return fx_call_finish(&c, 0);
    if (d->dir == FX_OP_BWD) {
        bad_value(&c, "op", "a forward or a step (a backward runs through op_backward/4)", argv[0]);
        return fx_call_finish(&c, 0);
    }
    if (d->dir != FX_OP_STEP)
        fx_call_watch_caller(&c);
    fx_op_call_init(&call, d, NULL);
    if (arg_positional(&c, argv[1], &call, held) || read_opts(&c, argv[2], &call, held, &save))
        return fx_call_finish(&c, 0);
    set_presence(&call);
    if (save && d->backward)
        set_save(&call);
    if (fx_op_run(&call, outs, &c.st) || hold_outs(&c, d, outs) ||
        (save && d->backward && fx_op_ctx_new(&call, &ctx, &c.st)))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM items[FX_OP_MAX_IO + 1];
    unsigned count = 0;
    for (int r = 0; r < d->nresults; r++)
        if (d->results[r].role == FX_IO_OUTPUT && outs[r].buffer)
            items[count++] = fx_make_tensor(&c, &outs[r]);
    if (ctx)
        items[count++] = fx_make_ctx(&c, saved_by(d), ctx, ctx_destroy);
    return fx_call_finish(&c, count == 1 ? items[0] : enif_make_tuple_from_array(env, items, count));
}

/* op_backward(Name, Cotangent, Ctx, Opts) -> #{Input => Gradient} for every
 * input the forward was given. */
FX_ENQUEUE_NIF(nif_op_backward)
static ERL_NIF_TERM nif_op_backward(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    const fx_op_desc *d = NULL;
    fx_op_call call;
    fx_tensor held[FX_OP_MAX_IO], outs[FX_OP_MAX_IO];
    const fx_tensor *cotangents[FX_OP_MAX_IO] = {0};
    void *ctx;
    memset(outs, 0, sizeof outs);
    fx_call_init(&c, env);
    fx_call_watch_caller(&c);
    if (arg_op(&c, argv[0], FX_OP_BWD, &d))
        return fx_call_finish(&c, 0);
    const fx_op_desc *fwd = forward_of[fx_op_index(d)];
    /* The cotangent always given (dy, dh) is the positional one. */
    int first = -1;
    for (int i = 0; i < d->ninputs && first < 0; i++)
        if (d->inputs[i].role == FX_IO_COTANGENT && d->inputs[i].when == FX_WHEN_ALWAYS)
            first = i;
    if (!fwd || first < 0) {
        fx_fail(&c.st, FX_EINTERNAL, "%s: no forward, or no cotangent always given", d->name);
        return fx_call_finish(&c, 0);
    }
    fx_op_call_init(&call, d, NULL);
    bool save;
    if (fx_arg_tensor(&c, argv[1], d->inputs[first].name, &held[first]) ||
        fx_arg_ctx(&c, argv[2], "ctx", saved_by(fwd), &ctx) || read_opts(&c, argv[3], &call, held, &save))
        return fx_call_finish(&c, 0);
    cotangents[first] = &held[first];
    for (int i = 0; i < d->ninputs; i++)
        if (call.in[i])
            cotangents[i] = call.in[i];
    if (fx_op_ctx_backward(ctx, cotangents, &call, &c.st) || fx_op_run(&call, outs, &c.st) ||
        hold_outs(&c, d, outs))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM map = enif_make_new_map(env);
    ERL_NIF_TERM groups[FX_OP_MAX_IO];
    const int nslots = fx_op_call_results(&call);
    int nreps = 0;
    for (int r = 0; r < nslots; r++) {
        int rep, e = fx_op_slot_entry(d, true, r, &rep);
        if (!outs[r].buffer)
            continue;
        /* "dz_logits" -> z_logits; a repeated group's by repetition */
        ERL_NIF_TERM key = fx_atom(env, d->results[e].name + 1), value = fx_make_tensor(&c, &outs[r]);
        if (!d->results[e].repeated) {
            enif_make_map_put(env, map, key, value, &map);
            continue;
        }
        for (; nreps <= rep; nreps++)
            groups[nreps] = enif_make_new_map(env);
        enif_make_map_put(env, groups[rep], key, value, &groups[rep]);
    }
    if (nreps)
        enif_make_map_put(env, map, fx_atom(env, d->attrs[fx_op_repeat_attr(d)].name),
                          enif_make_list_from_array(env, groups, (unsigned)nreps), &map);
    return fx_call_finish(&c, map);
}

/* ---- op_check ---- */

static int unknown_key(fx_call *c, const char *what, const char *noun, ERL_NIF_TERM key, const char *const *names,
                       int n)
{
    char list[512] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    char expected[600];
    snprintf(expected, sizeof expected, "only the %s %s", noun, list);
    return bad_value(c, what, expected, key);
}

/* {Type, Shape} as a tensor without memory. */
static int read_spec(fx_call *c, ERL_NIF_TERM value, const char *name, int slot, void *arg)
{
    fx_op_call *call = ((void **)arg)[0];
    fx_tensor *t = ((void **)arg)[1];
    const ERL_NIF_TERM *pair;
    int arity;
    if (!enif_get_tuple(c->env, value, &arity, &pair) || arity != 2)
        return bad_value(c, name, "{Type, Shape}", value);
    memset(&t[slot], 0, sizeof t[slot]);
    t[slot].device = call->dev;
    if (fx_arg_dtype(c, pair[0], name, &t[slot].dtype) || fx_arg_shape(c, pair[1], name, &t[slot].rank, t[slot].dims) ||
        fx_shape_nbytes(name, t[slot].dtype, t[slot].rank, t[slot].dims, &t[slot].numel, &t[slot].nbytes, &c->st))
        return c->st.code;
    call->in[slot] = &t[slot];
    return FX_OK;
}

/* #{Input => {Type, Shape}}: tensors of those shapes and types, without
 * memory; a repeated group as its attribute's name => [#{Entry =>
 * {Type, Shape}}]. */
static int arg_specs(fx_call *c, ERL_NIF_TERM map, fx_op_call *call, fx_tensor *t)
{
    const fx_op_desc *d = call->op;
    if (!enif_is_map(c->env, map))
        return bad_value(c, "inputs", "a map of input names to {Type, Shape}", map);
    const char *names[FX_OP_MAX_IO];
    int first, nnames = 0, group = fx_op_group(d, false, &first);
    for (int i = 0; i < (group ? first : d->ninputs); i++)
        names[nnames++] = d->inputs[i].name;
    if (group)
        names[nnames++] = d->attrs[fx_op_repeat_attr(d)].name;
    void *group_arg[2] = {call, t};
    ErlNifMapIterator it;
    ERL_NIF_TERM key, value;
    int rc = FX_OK;
    enif_map_iterator_create(c->env, map, &it, ERL_NIF_MAP_ITERATOR_FIRST);
    while (rc == FX_OK && enif_map_iterator_get_pair(c->env, &it, &key, &value)) {
        int i = -1;
        for (int k = 0; k < nnames && i < 0; k++)
            if (enif_is_identical(key, fx_atom(c->env, names[k])))
                i = k;
        if (i < 0)
            rc = unknown_key(c, "inputs", "inputs", key, names, nnames);
        else if (group && i == first)
            rc = arg_group(c, value, call, read_spec, group_arg);
        else
            rc = read_spec(c, value, names[i], i, group_arg);
        enif_map_iterator_next(c->env, &it);
    }
    enif_map_iterator_destroy(c->env, &it);
    return rc ? c->st.code : FX_OK;
}

/* An attribute's value in op_check: a number, true or false (not for an
 * enum), or one of a flag's or an enum's choices. */
static int attr_value(fx_call *c, const fx_op_attr *at, ERL_NIF_TERM v, double *out)
{
    const bool is_enum = at->kind == FX_ATTR_ENUM;
    if (!is_enum &&
        (enif_is_identical(v, fx_atom(c->env, "true")) || enif_is_identical(v, fx_atom(c->env, "false")))) {
        *out = enif_is_identical(v, fx_atom(c->env, "true"));
        return FX_OK;
    }
    if (enif_is_number(c->env, v))
        return fx_arg_double(c, v, at->name, out);
    for (int k = 0; k < fx_op_choice_count(at); k++)
        if (enif_is_identical(v, fx_atom(c->env, at->choices[k]))) {
            *out = k;
            return FX_OK;
        }
    char names[160], expected[200];
    fx_op_choice_list(at, ", ", names, sizeof names);
    if (is_enum)
        snprintf(expected, sizeof expected, "a number, %s", names);
    else if (at->choices[0])
        snprintf(expected, sizeof expected, "a number, true, false, %s", names);
    else
        snprintf(expected, sizeof expected, "a number, true or false");
    return bad_value(c, at->name, expected, v);
}

/* #{Attr => Value}: by attribute name or option alias; a number, a
 * boolean, or one of a flag's choices. Presence attributes follow from the
 * inputs given (a value given for one must agree). */
static int arg_attrs(fx_call *c, ERL_NIF_TERM map, fx_op_call *call)
{
    const fx_op_desc *d = call->op;
    if (!enif_is_map(c->env, map))
        return bad_value(c, "attrs", "a map of attribute names to values", map);
    const char *names[FX_OP_MAX_ATTRS];
    for (int a = 0; a < d->nattrs; a++)
        names[a] = d->attrs[a].name;
    double given[FX_OP_MAX_ATTRS];
    bool has[FX_OP_MAX_ATTRS] = {0};
    ErlNifMapIterator it;
    ERL_NIF_TERM key, value;
    int rc = FX_OK;
    enif_map_iterator_create(c->env, map, &it, ERL_NIF_MAP_ITERATOR_FIRST);
    while (rc == FX_OK && enif_map_iterator_get_pair(c->env, &it, &key, &value)) {
        int a = -1;
        for (int k = 0; k < d->nattrs && a < 0; k++)
            if (enif_is_identical(key, fx_atom(c->env, names[k])) ||
                (d->attrs[k].option && enif_is_identical(key, fx_atom(c->env, d->attrs[k].option))))
                a = k;
        if (a < 0) {
            rc = unknown_key(c, "attrs", "attributes", key, names, d->nattrs);
        } else {
            rc = attr_value(c, &d->attrs[a], value, &given[a]);
            has[a] = true;
        }
        enif_map_iterator_next(c->env, &it);
    }
    enif_map_iterator_destroy(c->env, &it);
    if (rc)
        return c->st.code;
    set_presence(call);
    for (int a = 0; a < d->nattrs; a++) {
        if (!has[a])
            continue;
        if ((d->attrs[a].role == FX_ATTR_PRESENCE || d->attrs[a].role == FX_ATTR_REPEAT) &&
            given[a] != call->attrs[a])
            return fx_fail(&c->st, FX_EBADARG, "%s: expected %g (as the inputs given say), got %g", names[a],
                           call->attrs[a], given[a]);
        call->attrs[a] = given[a];
    }
    return FX_OK;
}

static ERL_NIF_TERM make_shape(ErlNifEnv *env, int rank, const int64_t *dims)
{
    ERL_NIF_TERM items[FX_MAX_RANK];
    for (int i = 0; i < rank; i++)
        items[i] = enif_make_int64(env, dims[i]);
    return enif_make_tuple_from_array(env, items, (unsigned)rank);
}

static ERL_NIF_TERM make_type(ErlNifEnv *env, fx_dtype t)
{
    return enif_make_tuple2(env, fx_atom(env, fx_dtype_kind(t)), enif_make_int(env, fx_dtype_bits(t)));
}

/* #{Result => {Type, Shape}} for the present results; a repeated group's
 * as the attribute's name => [#{Result => {Type, Shape}}]. */
static ERL_NIF_TERM specs_term(ErlNifEnv *env, const fx_op_call *call, const fx_op_spec *specs)
{
    const fx_op_desc *d = call->op;
    ERL_NIF_TERM result = enif_make_new_map(env), groups[FX_OP_MAX_IO];
    int nreps = 0;
    for (int r = 0; r < fx_op_call_results(call); r++) {
        int rep, e = fx_op_slot_entry(d, true, r, &rep);
        if (!specs[r].present)
            continue;
        ERL_NIF_TERM key = fx_atom(env, d->results[e].name),
                     value = enif_make_tuple2(env, make_type(env, specs[r].dtype),
                                              make_shape(env, specs[r].rank, specs[r].dims));
        if (!d->results[e].repeated) {
            enif_make_map_put(env, result, key, value, &result);
            continue;
        }
        for (; nreps <= rep; nreps++)
            groups[nreps] = enif_make_new_map(env);
        enif_make_map_put(env, groups[rep], key, value, &groups[rep]);
    }
    if (nreps)
        enif_make_map_put(env, result, fx_atom(env, d->attrs[fx_op_repeat_attr(d)].name),
                          enif_make_list_from_array(env, groups, (unsigned)nreps), &result);
    return result;
}

/* op_check(Name, Inputs, Attrs, Device) -> #{Result => {Type, Shape}} for
 * every result the call would have, or {badarg, Msg} (the op layer's
 * message, as a run of the op would raise it). Normal scheduler: shapes
 * only. */
ERL_NIF_TERM nif_op_check(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    const fx_op_desc *d = NULL;
    fx_device *dev;
    fx_op_call call;
    fx_tensor t[FX_OP_MAX_IO];
    fx_op_spec specs[FX_OP_MAX_IO];
    fx_call_init(&c, env);
    ERL_NIF_TERM result = 0;
    if (arg_op(&c, argv[0], -1, &d) == FX_OK && fx_arg_device(&c, argv[3], "device", &dev) == FX_OK) {
        fx_op_call_init(&call, d, dev);
        if (arg_specs(&c, argv[1], &call, t) == FX_OK && arg_attrs(&c, argv[2], &call) == FX_OK &&
            fx_op_check(&call, specs, &c.st) == FX_OK)
            result = specs_term(env, &call, specs);
    }
    if (c.st.code != FX_OK) {
        result = fx_status_reason(env, &c.st);
        fx_status_clear(&c.st);
    }
    return fx_call_finish(&c, result);
}

/* ---- op_run: a description on its own inputs and attributes ---- */

/* The inputs by name: Names (atoms) and Tensors (handles) pairwise, into
 * `held` and the call, `terms` keeping each tensor's term. The device is
 * the first tensor's. */
static int arg_named_tensors(fx_call *c, ERL_NIF_TERM names, ERL_NIF_TERM tensors, fx_op_call *call,
                             fx_tensor *held, ERL_NIF_TERM *terms)
{
    const fx_op_desc *d = call->op;
    const char *all[FX_OP_MAX_IO];
    for (int i = 0; i < d->ninputs; i++)
        all[i] = d->inputs[i].name;
    unsigned nnames, ntensors;
    if (!enif_get_list_length(c->env, names, &nnames) || !enif_get_list_length(c->env, tensors, &ntensors) ||
        nnames != ntensors || nnames == 0)
        return bad_value(c, "tensors", "as many tensors as names (one at least)", tensors);
    ERL_NIF_TERM name, tensor;
    while (enif_get_list_cell(c->env, names, &name, &names) && enif_get_list_cell(c->env, tensors, &tensor, &tensors)) {
        int i = -1;
        for (int k = 0; k < d->ninputs && i < 0; k++)
            if (enif_is_identical(name, fx_atom(c->env, all[k])))
                i = k;
        if (i < 0)
            return unknown_key(c, "names", "inputs", name, all, d->ninputs);
        if (call->in[i])
            return bad_value(c, "names", "each input once", name);
        if (fx_arg_tensor(c, tensor, all[i], &held[i]))
            return c->st.code;
        call->in[i] = &held[i];
        terms[i] = tensor;
        if (!call->dev)
            call->dev = held[i].device;
    }
    return FX_OK;
}

/* op_run(Name, Names, Tensors, Attrs) -> #{Result => Tensor}: op `Name`
 * (a forward, a backward or a step) on its inputs by name and its
 * attributes by name (as op_check/4 takes them), every present result. A
 * step's "new_state" is its "state" input, updated in place. */
FX_ENQUEUE_NIF(nif_op_run)
static ERL_NIF_TERM nif_op_run(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    const fx_op_desc *d = NULL;
    fx_op_call call;
    fx_tensor held[FX_OP_MAX_IO], outs[FX_OP_MAX_IO];
    ERL_NIF_TERM terms[FX_OP_MAX_IO];
    memset(outs, 0, sizeof outs);
    fx_call_init(&c, env);
    if (arg_op(&c, argv[0], -1, &d))
        return fx_call_finish(&c, 0);
    if (d->dir != FX_OP_STEP)
        fx_call_watch_caller(&c);
    fx_op_call_init(&call, d, NULL);
    if (arg_named_tensors(&c, argv[1], argv[2], &call, held, terms) || arg_attrs(&c, argv[3], &call) ||
        fx_op_run(&call, outs, &c.st) || hold_outs(&c, d, outs))
        return fx_call_finish(&c, 0);
    int state = fx_op_input_index(d, "state");
    ERL_NIF_TERM map = enif_make_new_map(env);
    for (int r = 0; r < d->nresults; r++) {
        ERL_NIF_TERM value;
        if (outs[r].buffer)
            value = fx_make_tensor(&c, &outs[r]);
        else if (d->results[r].role == FX_IO_STATE && state >= 0 && call.in[state])
            value = terms[state];
        else
            continue;
        enif_make_map_put(env, map, fx_atom(env, d->results[r].name), value, &map);
    }
    return fx_call_finish(&c, map);
}

/* ---- op_list ---- */

static const char *const dir_names[] = {"fwd", "bwd", "step"};
static const char *const kind_names[] = {"flag", "number", "enum"};
static const char *const attr_role_names[] = {"option", "presence", "save", "repeat"};
static const char *const io_role_names[] = {"arg", "option", "state", "forward", "saved", "cotangent", "output",
                                            "grad"};
static const char *const when_names[] = {"always", "flag", "rule"};

static ERL_NIF_TERM put(ErlNifEnv *env, ERL_NIF_TERM map, const char *key, ERL_NIF_TERM value)
{
    enif_make_map_put(env, map, fx_atom(env, key), value, &map);
    return map;
}

static ERL_NIF_TERM bool_term(ErlNifEnv *env, bool b) { return fx_atom(env, b ? "true" : "false"); }

static ERL_NIF_TERM attr_term(ErlNifEnv *env, const fx_op_attr *a)
{
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "name", fx_atom(env, a->name));
    m = put(env, m, "kind", fx_atom(env, kind_names[a->kind]));
    m = put(env, m, "role", fx_atom(env, attr_role_names[a->role]));
    m = put(env, m, "default",
            a->kind == FX_ATTR_FLAG   ? enif_make_int(env, a->dflt != 0)
            : a->kind == FX_ATTR_ENUM ? enif_make_int(env, (int)a->dflt)
                                      : enif_make_double(env, a->dflt));
    m = put(env, m, "positive", bool_term(env, a->positive));
    if (a->option)
        m = put(env, m, "option", fx_atom(env, a->option));
    if (a->choices[0]) {
        ERL_NIF_TERM choices = enif_make_list(env, 0);
        for (int k = fx_op_choice_count(a) - 1; k >= 0; k--)
            choices = enif_make_list_cell(env, fx_atom(env, a->choices[k]), choices);
        m = put(env, m, "choices", choices);
    }
    return m;
}

static ERL_NIF_TERM io_list(ErlNifEnv *env, const fx_op_io *io, int n)
{
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (int i = n - 1; i >= 0; i--) {
        ERL_NIF_TERM m = enif_make_new_map(env);
        m = put(env, m, "name", fx_atom(env, io[i].name));
        m = put(env, m, "layout", fx_make_string(env, io[i].layout));
        m = put(env, m, "role", fx_atom(env, io_role_names[io[i].role]));
        m = put(env, m, "presence", fx_atom(env, when_names[io[i].when]));
        m = put(env, m, "kept", bool_term(env, io[i].kept));
        m = put(env, m, "repeated", bool_term(env, io[i].repeated));
        if (io[i].flag)
            m = put(env, m, "flag", fx_atom(env, io[i].flag));
        list = enif_make_list_cell(env, m, list);
    }
    return list;
}

static ERL_NIF_TERM desc_term(ErlNifEnv *env, int index, const fx_op_desc *d)
{
    char target[128];
    snprintf(target, sizeof target, "fusex_%s", d->name);
    ERL_NIF_TERM attrs = enif_make_list(env, 0), options = enif_make_list(env, 0);
    for (int a = d->nattrs - 1; a >= 0; a--)
        attrs = enif_make_list_cell(env, attr_term(env, &d->attrs[a]), attrs);
    int nopts = 0;
    while (d->options && d->options[nopts])
        nopts++;
    for (int o = nopts - 1; o >= 0; o--)
        options = enif_make_list_cell(env, fx_atom(env, d->options[o]), options);
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "index", enif_make_int(env, index));
    m = put(env, m, "name", fx_atom(env, d->name));
    m = put(env, m, "op", fx_atom(env, d->op));
    m = put(env, m, "family", fx_atom(env, d->family));
    m = put(env, m, "dir", fx_atom(env, dir_names[d->dir]));
    if (!d->no_xla)
        m = put(env, m, "target", fx_make_string(env, target));
    m = put(env, m, "attrs", attrs);
    m = put(env, m, "inputs", io_list(env, d->inputs, d->ninputs));
    m = put(env, m, "results", io_list(env, d->results, d->nresults));
    m = put(env, m, "options", options);
    if (d->backward) {
        m = put(env, m, "backward", fx_atom(env, d->backward));
        m = put(env, m, "saved_by", fx_make_string(env, saved_by(d)));
    }
    return m;
}

/* op_list() -> [#{name, op, family, dir[, target], attrs, inputs, results,
 * options[, backward, saved_by]}] in the registry's order (no target: not
 * an XLA target). */
ERL_NIF_TERM nif_op_list(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (int i = fx_op_count() - 1; i >= 0; i--)
        list = enif_make_list_cell(env, desc_term(env, i, fx_op_at(i)), list);
    return list;
}
