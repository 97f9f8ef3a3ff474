/* The one argument-parsing path every NIF uses, and the mapping of a
 * failed status onto an Erlang error. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "fusex_dtype.h"
#include "fusex_cpu.h"
#include "nif/nif.h"

typedef struct fx_ctx {
    const char *kind;
    void *data;
    void (*destroy)(void *data);
} fx_ctx;

ErlNifResourceType *fx_ctx_type;

/* Atoms by name, cached: the glue looks up the same few dozen names (option
 * keys, map keys, true/false) on every call, and each erts lookup hashes the
 * name and takes the atom table's lock. Atoms are never collected, so a
 * term found once is valid in every env. Reads are lock-free: a slot's name
 * is published (release) after its atom is written. */
#define ATOM_CACHE_SLOTS 512

typedef struct atom_slot {
    _Atomic(const char *) name; /* a private copy; NULL while the slot is free */
    ERL_NIF_TERM atom;
} atom_slot;

static atom_slot atom_cache[ATOM_CACHE_SLOTS];
static pthread_mutex_t atom_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static uint32_t name_hash(const char *name)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

static ERL_NIF_TERM make_atom(ErlNifEnv *env, const char *name)
{
    ERL_NIF_TERM atom;
    if (enif_make_existing_atom(env, name, &atom, ERL_NIF_LATIN1))
        return atom;
    return enif_make_atom(env, name);
}

/* The slot holding `name`, or the free slot where it belongs, or NULL when
 * the table is full. */
static atom_slot *atom_probe(const char *name, uint32_t hash, const char **found)
{
    for (unsigned i = 0; i < ATOM_CACHE_SLOTS; i++) {
        atom_slot *slot = &atom_cache[(hash + i) % ATOM_CACHE_SLOTS];
        const char *key = atomic_load_explicit(&slot->name, memory_order_acquire);
        *found = key;
        if (!key || strcmp(key, name) == 0)
            return slot;
    }
    return NULL;
}

ERL_NIF_TERM fx_atom(ErlNifEnv *env, const char *name)
{
    uint32_t hash = name_hash(name);
    const char *key;
    atom_slot *slot = atom_probe(name, hash, &key);
    if (slot && key)
        return slot->atom;
    ERL_NIF_TERM atom = make_atom(env, name);
    size_t len = strlen(name);
    if (!slot || len > 255)
        return atom;
    pthread_mutex_lock(&atom_cache_lock);
    slot = atom_probe(name, hash, &key); /* another thread may have added it */
    char *copy = slot && !key ? malloc(len + 1) : NULL;
    if (copy) {
        memcpy(copy, name, len + 1);
        slot->atom = atom;
        atomic_store_explicit(&slot->name, copy, memory_order_release);
    }
    pthread_mutex_unlock(&atom_cache_lock);
    return atom;
}

ERL_NIF_TERM fx_make_string(ErlNifEnv *env, const char *s)
{
    size_t len = strlen(s);
    ERL_NIF_TERM bin;
    unsigned char *data = enif_make_new_binary(env, len, &bin);
    memcpy(data, s, len);
    return bin;
}

void fx_format_term(char *out, size_t outlen, ERL_NIF_TERM term)
{
    int n = enif_snprintf(out, outlen, "%T", term);
    if (n >= (int)outlen && outlen > 4)
        memcpy(out + outlen - 4, "...", 4);
}

/* ---- call scope ---- */

void fx_call_init(fx_call *c, ErlNifEnv *env)
{
    c->env = env;
    fx_status_clear(&c->st);
    c->held = c->inline_held;
    c->nheld = 0;
    c->cap = (int)(sizeof c->inline_held / sizeof c->inline_held[0]);
    c->nallocs = 0;
    c->watching = false;
}

static bool caller_alive(void *env) { return enif_is_current_process_alive((ErlNifEnv *)env); }

void fx_call_watch_caller(fx_call *c)
{
    int type = enif_thread_type();
    if (type != ERL_NIF_THR_DIRTY_CPU_SCHEDULER && type != ERL_NIF_THR_DIRTY_IO_SCHEDULER)
        return;
    fx_cpu_watch_caller(caller_alive, c->env);
    c->watching = true;
}

/* Room for `more` held tensors (a list's worth at once, not by doubling). */
static int reserve_held(fx_call *c, unsigned more)
{
    if ((size_t)c->nheld + more <= (size_t)c->cap)
        return FX_OK;
    size_t cap = (size_t)c->cap * 2;
    if (cap < (size_t)c->nheld + more)
        cap = (size_t)c->nheld + more;
    if (cap > INT_MAX)
        return fx_fail(&c->st, FX_EBADARG, "too many tensors in one call (%zu)", cap);
    fx_tensor **grown = enif_alloc(sizeof *grown * cap);
    if (!grown)
        return fx_fail(&c->st, FX_ENOMEM, "out of host memory tracking tensors");
    memcpy(grown, c->held, sizeof *grown * (size_t)c->nheld);
    if (c->held != c->inline_held)
        enif_free(c->held);
    c->held = grown;
    c->cap = (int)cap;
    return FX_OK;
}

int fx_call_hold(fx_call *c, fx_tensor *t)
{
    if (reserve_held(c, 1) != FX_OK)
        return c->st.code;
    c->held[c->nheld++] = t;
    return FX_OK;
}

ERL_NIF_TERM fx_status_reason(ErlNifEnv *env, const fx_status *st)
{
    ERL_NIF_TERM msg = fx_make_string(env, st->msg);
    switch (st->code) {
    case FX_EBADARG: return enif_make_tuple2(env, fx_atom(env, "badarg"), msg);
    case FX_ENOMEM: return enif_make_tuple2(env, fx_atom(env, "out_of_memory"), msg);
    case FX_ECUDA:
        return enif_make_tuple3(env, fx_atom(env, "cuda_error"), enif_make_int(env, st->detail), msg);
    default: return enif_make_tuple2(env, fx_atom(env, "internal"), msg);
    }
}

/* Scratch memory freed at the end of the call, not zeroed. */
static void *call_alloc_raw(fx_call *c, size_t nbytes)
{
    if (c->nallocs == FX_CALL_MAX_ALLOCS) {
        fx_fail(&c->st, FX_EINTERNAL, "too many scratch allocations in one call");
        return NULL;
    }
    void *p = enif_alloc(nbytes ? nbytes : 1);
    if (!p) {
        fx_fail(&c->st, FX_ENOMEM, "out of host memory (%zu bytes of scratch)", nbytes);
        return NULL;
    }
    c->allocs[c->nallocs++] = p;
    return p;
}

void *fx_call_alloc(fx_call *c, size_t nbytes)
{
    void *p = call_alloc_raw(c, nbytes);
    if (p)
        memset(p, 0, nbytes);
    return p;
}

ERL_NIF_TERM fx_call_finish(fx_call *c, ERL_NIF_TERM result)
{
    if (c->watching) {
        fx_cpu_unwatch_caller();
        c->watching = false;
    }
    for (int i = 0; i < c->nheld; i++)
        fx_tensor_release(c->held[i]);
    for (int i = 0; i < c->nallocs; i++)
        enif_free(c->allocs[i]);
    c->nallocs = 0;
    if (c->held != c->inline_held)
        enif_free(c->held);
    c->held = c->inline_held;
    c->nheld = 0;
    if (c->st.code != FX_OK)
        return enif_raise_exception(c->env, fx_status_reason(c->env, &c->st));
    return result;
}

/* An integer that does not fit 64 bits (the messages then say the limit:
 * "expected a number" would be wrong for one). */
static bool is_big_integer(ErlNifEnv *env, ERL_NIF_TERM term)
{
    ErlNifSInt64 v;
    return enif_term_type(env, term) == ERL_NIF_TERM_TYPE_INTEGER && !enif_get_int64(env, term, &v);
}

static int bad(fx_call *c, const char *name, const char *expected, ERL_NIF_TERM got)
{
    char text[96];
    fx_format_term(text, sizeof text, got);
    return fx_fail(&c->st, FX_EBADARG, "%s: expected %s, got %s", name, expected, text);
}

/* ---- tensors ---- */

int fx_arg_tensor(fx_call *c, ERL_NIF_TERM term, const char *name, fx_tensor *out)
{
    fx_handle *h;
    if (!enif_get_resource(c->env, term, fx_tensor_type, (void **)&h)) {
        memset(out, 0, sizeof *out);
        return bad(c, name, "a fusex tensor", term);
    }
    if (fx_handle_acquire(h, name, out, &c->st) != FX_OK)
        return c->st.code;
    return fx_call_hold(c, out);
}

/* Turns "name: ..." into "name[i]: ...". Formatting the element's name
 * only when it failed keeps a list of hundreds of tensors cheap to parse. */
static int name_item(fx_call *c, const char *name, unsigned i)
{
    char *msg = c->st.msg;
    size_t len = strlen(name), msglen = strlen(msg);
    if (strncmp(msg, name, len) != 0 || msg[len] != ':')
        return c->st.code;
    char index[16];
    size_t k = (size_t)snprintf(index, sizeof index, "[%u]", i);
    if (msglen + k >= sizeof c->st.msg) /* cut the end to fit */
        msglen = sizeof c->st.msg - 1 - k;
    memmove(msg + len + k, msg + len, msglen - len);
    memcpy(msg + len, index, k);
    msg[msglen + k] = '\0';
    return c->st.code;
}

int fx_arg_tensor_list(fx_call *c, ERL_NIF_TERM term, const char *name, fx_tensor **out,
                       unsigned *count)
{
    *out = NULL;
    *count = 0;
    if (!enif_get_list_length(c->env, term, count))
        return bad(c, name, "a list of fusex tensors", term);
    if (*count == 0)
        return FX_OK;
    /* not zeroed: fx_arg_tensor fills each item, and the items after one
     * that fails are never read */
    fx_tensor *items = call_alloc_raw(c, sizeof *items * *count);
    if (!items || reserve_held(c, *count) != FX_OK)
        return c->st.code;
    *out = items;
    ERL_NIF_TERM head, tail = term;
    for (unsigned i = 0; enif_get_list_cell(c->env, tail, &head, &tail); i++)
        if (fx_arg_tensor(c, head, name, &items[i]) != FX_OK)
            return name_item(c, name, i);
    return FX_OK;
}

ERL_NIF_TERM fx_make_tensor(fx_call *c, fx_tensor *t)
{
    fx_handle *h = enif_alloc_resource(fx_tensor_type, sizeof *h);
    if (!h) {
        fx_tensor_release(t);
        fx_fail(&c->st, FX_ENOMEM, "out of host memory for a tensor handle");
        return enif_make_badarg(c->env);
    }
    fx_handle_init(h, t);
    ERL_NIF_TERM term = enif_make_resource(c->env, h);
    enif_release_resource(h);
    return term;
}

ERL_NIF_TERM fx_call_return_tensor(fx_call *c, fx_tensor *out)
{
    if (c->st.code != FX_OK) {
        fx_tensor_release(out);
        return fx_call_finish(c, 0);
    }
    return fx_call_finish(c, fx_make_tensor(c, out));
}

/* ---- scalars and descriptors ---- */

int fx_arg_dtype(fx_call *c, ERL_NIF_TERM term, const char *name, fx_dtype *out)
{
    const ERL_NIF_TERM *elems;
    int arity, bits;
    char kind[8];
    if (enif_get_tuple(c->env, term, &arity, &elems) && arity == 2 &&
        enif_get_atom(c->env, elems[0], kind, sizeof kind, ERL_NIF_LATIN1) &&
        enif_get_int(c->env, elems[1], &bits)) {
        int t = fx_dtype_from_nx(kind, bits);
        if (t >= 0) {
            *out = (fx_dtype)t;
            return FX_OK;
        }
    }
    return bad(c, name, "one of {f,32}, {f,64}, {bf,16}, {f,16}, {s,32}, {s,64}, {u,8}", term);
}

int fx_arg_shape(fx_call *c, ERL_NIF_TERM term, const char *name, int *rank, int64_t *dims)
{
    const ERL_NIF_TERM *elems;
    if (!enif_get_tuple(c->env, term, rank, &elems))
        return bad(c, name, "a tuple of non-negative integers", term);
    if (*rank > FX_MAX_RANK)
        return fx_fail(&c->st, FX_EBADARG, "%s: expected a rank of at most %d, got %d", name,
                       FX_MAX_RANK, *rank);
    for (int i = 0; i < *rank; i++) {
        ErlNifSInt64 dim;
        if (!enif_get_int64(c->env, elems[i], &dim)) {
            if (is_big_integer(c->env, elems[i]) && enif_compare(elems[i], enif_make_int(c->env, 0)) > 0)
                return bad(c, name, "a tuple of non-negative integers, each at most 2^48", term);
            return bad(c, name, "a tuple of non-negative integers", term);
        }
        if (dim < 0)
            return bad(c, name, "a tuple of non-negative integers", term);
        dims[i] = dim;
    }
    int64_t numel;
    return fx_shape_numel(name, *rank, dims, &numel, &c->st);
}

int fx_arg_device(fx_call *c, ERL_NIF_TERM term, const char *name, fx_device **out)
{
    const ERL_NIF_TERM *elems;
    int arity, ordinal = 0;
    fx_device_kind kind;
    if (enif_is_identical(term, fx_atom(c->env, "cpu")))
        kind = FX_DEVICE_CPU;
    else if (enif_is_identical(term, fx_atom(c->env, "cuda")))
        kind = FX_DEVICE_CUDA;
    else if (enif_get_tuple(c->env, term, &arity, &elems) && arity == 2 &&
             enif_is_identical(elems[0], fx_atom(c->env, "cuda")) &&
             enif_get_int(c->env, elems[1], &ordinal) && ordinal >= 0)
        kind = FX_DEVICE_CUDA;
    else if (enif_get_tuple(c->env, term, &arity, &elems) && arity == 2 &&
             enif_is_identical(elems[0], fx_atom(c->env, "cpu")) &&
             enif_is_identical(elems[1], fx_atom(c->env, "reference")))
        kind = FX_DEVICE_CPU, ordinal = 1; /* the CPU backend's f64 oracle */
    else
        return bad(c, name, "cpu, cuda or {cuda, N}", term);
    *out = fx_device_find(kind, ordinal);
    if (*out)
        return FX_OK;
    char text[64];
    fx_format_term(text, sizeof text, term);
    if (!fx_device_find(FX_DEVICE_CUDA, 0))
        return fx_fail(&c->st, FX_EBADARG, "%s: expected an available device, got %s (CUDA unavailable: %s)",
                       name, text, fx_cuda_unavailable_reason());
    return fx_fail(&c->st, FX_EBADARG, "%s: expected an available device, got %s (see fusex:devices())",
                   name, text);
}

ERL_NIF_TERM fx_make_device(ErlNifEnv *env, const fx_device *dev)
{
    if (dev->kind == FX_DEVICE_CPU)
        return dev->ordinal == 0 ? fx_atom(env, "cpu") : enif_make_tuple2(env, fx_atom(env, "cpu"), fx_atom(env, "reference"));
    return enif_make_tuple2(env, fx_atom(env, "cuda"), enif_make_int(env, dev->ordinal));
}

int fx_arg_binary(fx_call *c, ERL_NIF_TERM term, const char *name, ErlNifBinary *out)
{
    if (enif_inspect_binary(c->env, term, out))
        return FX_OK;
    return bad(c, name, "a binary", term);
}

int fx_arg_double(fx_call *c, ERL_NIF_TERM term, const char *name, double *out)
{
    ErlNifSInt64 i;
    if (enif_get_double(c->env, term, out))
        return FX_OK;
    if (enif_get_int64(c->env, term, &i)) {
        *out = (double)i;
        return FX_OK;
    }
    if (is_big_integer(c->env, term))
        return bad(c, name, "a float or an integer from -2^63 to 2^63-1", term);
    return bad(c, name, "a number", term);
}

int fx_arg_bool(fx_call *c, ERL_NIF_TERM term, const char *name, bool *out)
{
    if (enif_is_identical(term, fx_atom(c->env, "true")))
        *out = true;
    else if (enif_is_identical(term, fx_atom(c->env, "false")))
        *out = false;
    else
        return bad(c, name, "true or false", term);
    return FX_OK;
}

int fx_arg_int64(fx_call *c, ERL_NIF_TERM term, const char *name, int64_t *out)
{
    ErlNifSInt64 v;
    if (!enif_get_int64(c->env, term, &v))
        return bad(c, name, is_big_integer(c->env, term) ? "an integer from -2^63 to 2^63-1" : "an integer",
                   term);
    *out = v;
    return FX_OK;
}

/* ---- option maps ---- */

static bool allowed_key(ErlNifEnv *env, ERL_NIF_TERM key, const char *const *allowed)
{
    for (const char *const *a = allowed; *a; a++)
        if (enif_is_identical(key, fx_atom(env, *a)))
            return true;
    return false;
}

static int unknown_option(fx_call *c, ERL_NIF_TERM key, const char *const *allowed)
{
    char list[512] = "";
    size_t used = 0;
    for (const char *const *a = allowed; *a && used < sizeof list; a++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", a == allowed ? "" : ", ", *a);
    char text[96];
    fx_format_term(text, sizeof text, key);
    return fx_fail(&c->st, FX_EBADARG, "opts: expected only the options %s, got %s", list, text);
}

int fx_arg_opts(fx_call *c, ERL_NIF_TERM term, const char *const *allowed)
{
    if (!enif_is_map(c->env, term))
        return bad(c, "opts", "a map", term);
    ErlNifMapIterator it;
    ERL_NIF_TERM key, value;
    int rc = FX_OK;
    enif_map_iterator_create(c->env, term, &it, ERL_NIF_MAP_ITERATOR_FIRST);
    while (rc == FX_OK && enif_map_iterator_get_pair(c->env, &it, &key, &value)) {
        if (!allowed_key(c->env, key, allowed))
            rc = unknown_option(c, key, allowed);
        enif_map_iterator_next(c->env, &it);
    }
    enif_map_iterator_destroy(c->env, &it);
    return rc;
}

bool fx_opt_term(fx_call *c, ERL_NIF_TERM opts, const char *key, ERL_NIF_TERM *value)
{
    return enif_get_map_value(c->env, opts, fx_atom(c->env, key), value);
}

int fx_opt_tensor(fx_call *c, ERL_NIF_TERM opts, const char *key, fx_tensor *out, bool *present)
{
    ERL_NIF_TERM v;
    memset(out, 0, sizeof *out);
    *present = fx_opt_term(c, opts, key, &v);
    return *present ? fx_arg_tensor(c, v, key, out) : FX_OK;
}

int fx_opt_bool(fx_call *c, ERL_NIF_TERM opts, const char *key, bool dflt, bool *out)
{
    ERL_NIF_TERM v;
    *out = dflt;
    return fx_opt_term(c, opts, key, &v) ? fx_arg_bool(c, v, key, out) : FX_OK;
}

int fx_opt_double(fx_call *c, ERL_NIF_TERM opts, const char *key, double dflt, double *out)
{
    ERL_NIF_TERM v;
    *out = dflt;
    return fx_opt_term(c, opts, key, &v) ? fx_arg_double(c, v, key, out) : FX_OK;
}

/* ---- resource types: tensors and saved contexts ---- */

ErlNifResourceType *fx_tensor_type;

static void tensor_destructor(ErlNifEnv *env, void *obj)
{
    (void)env;
    fx_handle_free((fx_handle *)obj);
}

static void ctx_destructor(ErlNifEnv *env, void *obj)
{
    (void)env;
    fx_ctx *ctx = obj;
    if (ctx->destroy && ctx->data)
        ctx->destroy(ctx->data);
}

int fx_nif_open_types(ErlNifEnv *env)
{
    const ErlNifResourceFlags flags = ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER;
    fx_tensor_type = enif_open_resource_type(env, NULL, "fusex_tensor", tensor_destructor, flags, NULL);
    fx_ctx_type = enif_open_resource_type(env, NULL, "fusex_ctx", ctx_destructor, flags, NULL);
    return fx_tensor_type && fx_ctx_type;
}

ERL_NIF_TERM fx_make_ctx(fx_call *c, const char *kind, void *data, void (*destroy)(void *))
{
    fx_ctx *ctx = enif_alloc_resource(fx_ctx_type, sizeof *ctx);
    if (!ctx) {
        destroy(data);
        fx_fail(&c->st, FX_ENOMEM, "out of host memory for a context");
        return enif_make_badarg(c->env);
    }
    ctx->kind = kind;
    ctx->data = data;
    ctx->destroy = destroy;
    ERL_NIF_TERM term = enif_make_resource(c->env, ctx);
    enif_release_resource(ctx);
    return term;
}

int fx_arg_ctx(fx_call *c, ERL_NIF_TERM term, const char *name, const char *kind, void **data)
{
    fx_ctx *ctx;
    if (!enif_get_resource(c->env, term, fx_ctx_type, (void **)&ctx) || strcmp(ctx->kind, kind) != 0) {
        char expected[96];
        snprintf(expected, sizeof expected, "a context saved by %s", kind);
        return bad(c, name, expected, term);
    }
    *data = ctx->data;
    return FX_OK;
}
