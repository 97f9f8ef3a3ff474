/* NIF glue shared by every family: resource types, the per-call scope that
 * releases whatever a call acquired, and the one set of argument parsers.
 * Glue parses terms and handles resources; all checking of shapes, dtypes
 * and devices happens in the op layer (c_src/core). */
#ifndef FX_NIF_H
#define FX_NIF_H

#include <erl_nif.h>
#include <stdbool.h>

#include "core/runtime.h"

typedef ERL_NIF_TERM fx_nif_fn(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]);

extern ErlNifResourceType *fx_tensor_type;
/* Opens the tensor and context resource types (at load and upgrade). */
int fx_nif_open_types(ErlNifEnv *env);

/* A call's scope: a status, and every tensor whose buffer reference the call
 * holds (arguments it acquired, outputs not yet handed to Erlang). All are
 * released by fx_call_finish on every path, so nothing leaks on errors. */
#define FX_CALL_MAX_ALLOCS 8

typedef struct fx_call {
    ErlNifEnv *env;
    fx_status st;
    fx_tensor **held;
    int nheld, cap;
    fx_tensor *inline_held[24];
    void *allocs[FX_CALL_MAX_ALLOCS];
    int nallocs;
    bool watching; /* fx_call_watch_caller named a test for this thread */
} fx_call;

void fx_call_init(fx_call *c, ErlNifEnv *env);
/* For an op that can run long on a dirty scheduler (the scans): until the
 * call finishes, the CPU backend's loops may ask whether the calling
 * process is alive and give up once it was killed (fusex_cpu.h). Does
 * nothing on a normal scheduler, where calls are short. */
void fx_call_watch_caller(fx_call *c);
/* Registers a tensor to release at the end of the call. */
int fx_call_hold(fx_call *c, fx_tensor *t);
/* Zeroed scratch memory freed at the end of the call; NULL (st set) when
 * out of memory. */
void *fx_call_alloc(fx_call *c, size_t nbytes);
/* Releases what the call holds; raises the status as an Erlang error if it
 * is not FX_OK, else returns `result`. */
ERL_NIF_TERM fx_call_finish(fx_call *c, ERL_NIF_TERM result);
/* The Erlang error reason of a failed status: {badarg, Msg}, ... */
ERL_NIF_TERM fx_status_reason(ErlNifEnv *env, const fx_status *st);

/* ---- argument parsers: each returns FX_OK or fills c->st with a badarg
 * naming the argument, so they chain with `||` ---- */
int fx_arg_tensor(fx_call *c, ERL_NIF_TERM term, const char *name, fx_tensor *out);
/* A proper list of tensors, in scratch storage the call frees. */
int fx_arg_tensor_list(fx_call *c, ERL_NIF_TERM term, const char *name, fx_tensor **out,
                       unsigned *count);
int fx_arg_dtype(fx_call *c, ERL_NIF_TERM term, const char *name, fx_dtype *out);
int fx_arg_shape(fx_call *c, ERL_NIF_TERM term, const char *name, int *rank, int64_t *dims);
int fx_arg_device(fx_call *c, ERL_NIF_TERM term, const char *name, fx_device **out);
int fx_arg_binary(fx_call *c, ERL_NIF_TERM term, const char *name, ErlNifBinary *out);
int fx_arg_double(fx_call *c, ERL_NIF_TERM term, const char *name, double *out);
int fx_arg_bool(fx_call *c, ERL_NIF_TERM term, const char *name, bool *out);
int fx_arg_int64(fx_call *c, ERL_NIF_TERM term, const char *name, int64_t *out);

/* Option maps: fx_arg_opts checks that `term` is a map whose keys are all
 * atoms in `allowed` (NULL-terminated); the fx_opt_* readers then take one
 * key each, with a default when absent. */
int fx_arg_opts(fx_call *c, ERL_NIF_TERM term, const char *const *allowed);
int fx_opt_tensor(fx_call *c, ERL_NIF_TERM opts, const char *key, fx_tensor *out, bool *present);
int fx_opt_bool(fx_call *c, ERL_NIF_TERM opts, const char *key, bool dflt, bool *out);
int fx_opt_double(fx_call *c, ERL_NIF_TERM opts, const char *key, double dflt, double *out);
/* The raw value, for options with their own syntax; false when absent. */
bool fx_opt_term(fx_call *c, ERL_NIF_TERM opts, const char *key, ERL_NIF_TERM *value);

/* The directory the NIF was loaded from (fusex's priv), where
 * fusex_cuda.so and fusex_xla.so lie. */
const char *fx_nif_priv_dir(void);

/* ---- results ---- */
ERL_NIF_TERM fx_atom(ErlNifEnv *env, const char *name);
/* Wraps `t` (its buffer reference moves into the new handle; released if
 * the handle cannot be made). */
ERL_NIF_TERM fx_make_tensor(fx_call *c, fx_tensor *t);
/* Ends a call whose result is the single new tensor `out`: the tensor, or
 * the call's error (then `out`, if it was made, is released). `out` must
 * start zeroed. */
ERL_NIF_TERM fx_call_return_tensor(fx_call *c, fx_tensor *out);
ERL_NIF_TERM fx_make_device(ErlNifEnv *env, const fx_device *dev);
ERL_NIF_TERM fx_make_string(ErlNifEnv *env, const char *s);
/* Writes the term, cut to fit, for "got ..." in error messages. */
void fx_format_term(char *out, size_t outlen, ERL_NIF_TERM term);

/* ---- contexts: what a forward pass saves for its backward ----
 * `kind` names the op; a backward refuses another op's context. The
 * destructor runs when the context term is garbage-collected. */
ERL_NIF_TERM fx_make_ctx(fx_call *c, const char *kind, void *data, void (*destroy)(void *));
int fx_arg_ctx(fx_call *c, ERL_NIF_TERM term, const char *name, const char *kind, void **data);

/* Moves a NIF onto the dirty scheduler that suits the device its tensors
 * live on: dirty CPU for CPU work, dirty IO for CUDA calls. */
ERL_NIF_TERM fx_schedule_dirty(ErlNifEnv *env, const char *name, fx_nif_fn *fn, int argc,
                               const ERL_NIF_TERM argv[]);

/* An op that only enqueues GPU work (launches and stream-ordered
 * allocations; no waiting, no host copies) returns in a few microseconds
 * and cannot block while the device's queue is short, so on CUDA it runs
 * right away on the calling scheduler, saving the ~2 µs hop to a dirty one;
 * past FX_INLINE_QUEUE_MAX queued ops it goes to dirty IO. CPU work always
 * goes to dirty CPU. */
ERL_NIF_TERM fx_schedule_enqueue(ErlNifEnv *env, const char *name, fx_nif_fn *fn, int argc,
                                 const ERL_NIF_TERM argv[]);

/* An op that may enqueue only or may have to wait, depending on what it
 * finds (the optimizer step: a changed table may wait for a staging slot).
 * On CUDA with a short queue `try_fn` runs on the calling scheduler and
 * must not wait: it sets *done when its result (or error) is final, and
 * leaves it false, with nothing enqueued, when it would wait; `fn`, the
 * same op allowed to wait, then runs on a dirty scheduler. */
typedef ERL_NIF_TERM fx_try_nif_fn(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[], bool *done);
ERL_NIF_TERM fx_schedule_try(ErlNifEnv *env, const char *name, fx_try_nif_fn *try_fn, fx_nif_fn *fn,
                             int argc, const ERL_NIF_TERM argv[]);

/* FX_TRY_NIF(nif_tensor, body), after `body`, defines nif_tensor_entry for
 * fx_schedule_try: `body(env, argv, done)` with done non-NULL must not wait
 * (the calling scheduler's try), with NULL it may (the dirty run). */
#define FX_TRY_NIF(fn, body)                                                             \
    static ERL_NIF_TERM fn(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])          \
    {                                                                                    \
        (void)argc;                                                                      \
        return body(env, argv, NULL);                                                    \
    }                                                                                    \
    static ERL_NIF_TERM fn##_try(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[],    \
                                 bool *done)                                             \
    {                                                                                    \
        (void)argc;                                                                      \
        return body(env, argv, done);                                                    \
    }                                                                                    \
    ERL_NIF_TERM fn##_entry(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])         \
    {                                                                                    \
        return fx_schedule_try(env, #fn, fn##_try, fn, argc, argv);                      \
    }

/* FX_DIRTY_NIF(nif_add) defines nif_add_entry, which reschedules nif_add;
 * register the entry as a normal NIF: {"add", 2, nif_add_entry, 0}.
 * FX_ENQUEUE_NIF(fn) is the same for enqueue-only ops (fx_schedule_enqueue). */
#define FX_DIRTY_NIF(fn)                                                             \
    static ERL_NIF_TERM fn(ErlNifEnv *, int, const ERL_NIF_TERM[]);                  \
    ERL_NIF_TERM fn##_entry(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])     \
    {                                                                                \
        return fx_schedule_dirty(env, #fn, fn, argc, argv);                          \
    }
#define FX_ENQUEUE_NIF(fn)                                                           \
    static ERL_NIF_TERM fn(ErlNifEnv *, int, const ERL_NIF_TERM[]);                  \
    ERL_NIF_TERM fn##_entry(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])     \
    {                                                                                \
        return fx_schedule_enqueue(env, #fn, fn, argc, argv);                        \
    }
#define FX_ENTRY(fn) ERL_NIF_TERM fn##_entry(ErlNifEnv *, int, const ERL_NIF_TERM[])

#endif
