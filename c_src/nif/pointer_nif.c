/* Glue for pointer interop: fusex:to_pointer/3 and fusex:from_pointer/4
 * (see c_src/core/pointer.h and docs/INTEROP.md). */
#include <string.h>

#include "core/ops.h"
#include "core/pointer.h"
#include "nif/nifs.h"

static int arg_kind(fx_call *c, ERL_NIF_TERM term, fx_pointer_kind *out)
{
    if (enif_is_identical(term, fx_atom(c->env, "local")))
        *out = FX_PTR_LOCAL;
    else if (enif_is_identical(term, fx_atom(c->env, "ipc")))
        *out = FX_PTR_IPC;
    else {
        char text[96];
        fx_format_term(text, sizeof text, term);
        return fx_fail(&c->st, FX_EBADARG, "kind: expected local or ipc, got %s", text);
    }
    return FX_OK;
}

static int bad_pointer(fx_call *c, ERL_NIF_TERM term)
{
    char text[96];
    fx_format_term(text, sizeof text, term);
    return fx_fail(&c->st, FX_EBADARG,
                   "pointer: expected {local, Address}, {ipc, Handle} or either with a byte size "
                   "as a third element, got %s",
                   text);
}

/* An address or byte size: an integer from 0 to 2^64 - 1 (the message
 * says so for an integer outside it). */
static int arg_u64(fx_call *c, ERL_NIF_TERM pointer, ERL_NIF_TERM term, const char *what,
                   ErlNifUInt64 *out)
{
    if (enif_get_uint64(c->env, term, out))
        return FX_OK;
    if (enif_term_type(c->env, term) != ERL_NIF_TERM_TYPE_INTEGER)
        return bad_pointer(c, pointer);
    char text[96];
    fx_format_term(text, sizeof text, term);
    return fx_fail(&c->st, FX_EBADARG, "pointer: expected %s from 0 to 2^64-1, got %s", what, text);
}

/* {local, Address[, Size]} | {ipc, Handle[, Size]} */
static int arg_pointer(fx_call *c, ERL_NIF_TERM term, fx_pointer *p)
{
    const ERL_NIF_TERM *elems;
    int arity;
    memset(p, 0, sizeof *p);
    if (!enif_get_tuple(c->env, term, &arity, &elems) || (arity != 2 && arity != 3))
        return bad_pointer(c, term);
    if (enif_is_identical(elems[0], fx_atom(c->env, "local"))) {
        ErlNifUInt64 addr;
        if (arg_u64(c, term, elems[1], "an address", &addr))
            return c->st.code;
        if (addr > UINTPTR_MAX)
            return bad_pointer(c, term);
        p->kind = FX_PTR_LOCAL;
        p->address = (uintptr_t)addr;
    } else if (enif_is_identical(elems[0], fx_atom(c->env, "ipc"))) {
        ErlNifBinary handle;
        if (!enif_inspect_binary(c->env, elems[1], &handle))
            return bad_pointer(c, term);
        if (handle.size != FX_IPC_HANDLE_SIZE)
            return fx_fail(&c->st, FX_EBADARG,
                           "pointer: expected a %d-byte CUDA IPC handle (cudaIpcMemHandle_t), got %zu bytes",
                           FX_IPC_HANDLE_SIZE, handle.size);
        p->kind = FX_PTR_IPC;
        memcpy(p->handle, handle.data, FX_IPC_HANDLE_SIZE);
    } else {
        return bad_pointer(c, term);
    }
    if (arity == 3) {
        ErlNifUInt64 size;
        if (arg_u64(c, term, elems[2], "a byte size", &size))
            return c->st.code;
        p->size = (size_t)size;
        p->size_known = true;
    }
    return FX_OK;
}

static ERL_NIF_TERM make_pointer(ErlNifEnv *env, const fx_pointer *p)
{
    ERL_NIF_TERM size = enif_make_uint64(env, p->size);
    if (p->kind == FX_PTR_LOCAL)
        return enif_make_tuple3(env, fx_atom(env, "local"), enif_make_uint64(env, p->address), size);
    ERL_NIF_TERM handle;
    unsigned char *bytes = enif_make_new_binary(env, FX_IPC_HANDLE_SIZE, &handle);
    memcpy(bytes, p->handle, FX_IPC_HANDLE_SIZE);
    return enif_make_tuple3(env, fx_atom(env, "ipc"), handle, size);
}

FX_DIRTY_NIF(nif_to_pointer)
static ERL_NIF_TERM nif_to_pointer(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor t;
    fx_pointer_kind kind = FX_PTR_LOCAL;
    bool sync = true;
    fx_pointer p;
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, argv[0], "tensor", &t) || arg_kind(&c, argv[1], &kind) ||
        fx_arg_bool(&c, argv[2], "sync", &sync) || fx_op_to_pointer(&t, kind, sync, &p, &c.st))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, make_pointer(env, &p));
}

FX_DIRTY_NIF(nif_from_pointer)
static ERL_NIF_TERM nif_from_pointer(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_pointer p;
    fx_dtype dtype;
    int rank;
    int64_t dims[FX_MAX_RANK];
    fx_device *dev;
    bool sync = true;
    fx_tensor out = {0};
    fx_call_init(&c, env);
    if (arg_pointer(&c, argv[0], &p) || fx_arg_dtype(&c, argv[1], "type", &dtype) ||
        fx_arg_shape(&c, argv[2], "shape", &rank, dims) ||
        fx_arg_device(&c, argv[3], "device", &dev) || fx_arg_bool(&c, argv[4], "sync", &sync) ||
        fx_arg_int64(&c, argv[5], "offset", &p.offset))
        return fx_call_finish(&c, 0);
    if (p.kind == FX_PTR_LOCAL && p.offset != 0) {
        fx_fail(&c.st, FX_EBADARG,
                "offset: expected no offset for a local pointer (add it to the address), got %lld",
                (long long)p.offset);
        return fx_call_finish(&c, 0);
    }
    if (fx_op_from_pointer(dev, &p, dtype, rank, dims, sync, &out, &c.st) || fx_call_hold(&c, &out))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, fx_make_tensor(&c, &out));
}

FX_ENQUEUE_NIF(nif_copy_into)
static ERL_NIF_TERM nif_copy_into(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor src, dst;
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, argv[0], "src", &src) == FX_OK &&
        fx_arg_tensor(&c, argv[1], "dst", &dst) == FX_OK)
        fx_op_copy_into(&src, &dst, &c.st);
    return fx_call_finish(&c, fx_atom(env, "ok"));
}
