/* Where a NIF's work runs: on the calling scheduler, a dirty CPU scheduler
 * or a dirty IO one, from the device its arguments name (docs/ARCHITECTURE.md,
 * "Scheduling"). */
#include "nif/nif.h"

/* Which device does this call work on? The first tensor among the
 * arguments (or in a list argument) decides; else an explicit device term
 * (`cuda`, `{cuda, N}`) or a `device` key of an options map. */
static fx_device *term_cuda_device(ErlNifEnv *env, ERL_NIF_TERM t)
{
    const ERL_NIF_TERM *elems;
    int arity, ordinal;
    ERL_NIF_TERM cuda = fx_atom(env, "cuda");
    if (enif_is_identical(t, cuda))
        return fx_device_find(FX_DEVICE_CUDA, 0);
    if (enif_get_tuple(env, t, &arity, &elems) && arity == 2 && enif_is_identical(elems[0], cuda) &&
        enif_get_int(env, elems[1], &ordinal))
        return fx_device_find(FX_DEVICE_CUDA, ordinal);
    return NULL;
}

/* Which device does this call work on? The first tensor among the
 * arguments (or heading a list argument) decides; else an explicit device
 * term (`cuda`, `{cuda, N}`) or a `device` key of an options map. NULL means
 * the CPU (or an argument error the op itself will report). */
static fx_device *call_device(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    for (int i = 0; i < argc; i++) {
        ERL_NIF_TERM t = argv[i], head, tail, value;
        fx_handle *h;
        fx_device *dev;
        if (enif_get_list_cell(env, t, &head, &tail))
            t = head;
        if (enif_get_resource(env, t, fx_tensor_type, (void **)&h))
            return h->device;
        if ((dev = term_cuda_device(env, t)))
            return dev;
        if (enif_is_map(env, t) && enif_get_map_value(env, t, fx_atom(env, "device"), &value) &&
            (dev = term_cuda_device(env, value)))
            return dev;
    }
    return NULL;
}

static bool on_gpu(const fx_device *dev) { return dev && dev->kind == FX_DEVICE_CUDA; }

ERL_NIF_TERM fx_schedule_dirty(ErlNifEnv *env, const char *name, fx_nif_fn *fn, int argc,
                               const ERL_NIF_TERM argv[])
{
    int flags = on_gpu(call_device(env, argc, argv)) ? ERL_NIF_DIRTY_JOB_IO_BOUND
                                                      : ERL_NIF_DIRTY_JOB_CPU_BOUND;
    return enif_schedule_nif(env, name, flags, fn, argc, argv);
}

ERL_NIF_TERM fx_schedule_enqueue(ErlNifEnv *env, const char *name, fx_nif_fn *fn, int argc,
                                 const ERL_NIF_TERM argv[])
{
    fx_device *dev = call_device(env, argc, argv);
    if (!on_gpu(dev))
        return enif_schedule_nif(env, name, ERL_NIF_DIRTY_JOB_CPU_BOUND, fn, argc, argv);
    if (fx_device_enqueue_inline(dev))
        return fn(env, argc, argv);
    return enif_schedule_nif(env, name, ERL_NIF_DIRTY_JOB_IO_BOUND, fn, argc, argv);
}

ERL_NIF_TERM fx_schedule_try(ErlNifEnv *env, const char *name, fx_try_nif_fn *try_fn, fx_nif_fn *fn,
                             int argc, const ERL_NIF_TERM argv[])
{
    fx_device *dev = call_device(env, argc, argv);
    if (!on_gpu(dev))
        return enif_schedule_nif(env, name, ERL_NIF_DIRTY_JOB_CPU_BOUND, fn, argc, argv);
    if (fx_device_enqueue_inline(dev)) {
        bool done = false;
        ERL_NIF_TERM result = try_fn(env, argc, argv, &done);
        if (done)
            return result;
    }
    return enif_schedule_nif(env, name, ERL_NIF_DIRTY_JOB_IO_BOUND, fn, argc, argv);
}
