/* Library entry: loads the runtime, opens the resource types, moves ops to
 * the right dirty scheduler, and lists every NIF. */
#include <string.h>

#include "fusex_cpu.h"
#include "nif/nifs.h"

ErlNifResourceType *fx_tensor_type;
int fx_ctx_type_open(ErlNifEnv *env);
int fx_event_type_open(ErlNifEnv *env);

static void tensor_destructor(ErlNifEnv *env, void *obj)
{
    (void)env;
    fx_handle_free((fx_handle *)obj);
}

static int open_types(ErlNifEnv *env)
{
    int flags = ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER;
    fx_tensor_type = enif_open_resource_type(env, NULL, "fusex_tensor", tensor_destructor, flags, NULL);
    return fx_tensor_type && fx_ctx_type_open(env) && fx_event_type_open(env);
}

static char priv_dir[4096] = "priv";

const char *fx_nif_priv_dir(void) { return priv_dir; }

static int on_load(ErlNifEnv *env, void **priv, ERL_NIF_TERM load_info)
{
    (void)priv;
    if (enif_get_string(env, load_info, priv_dir, sizeof priv_dir, ERL_NIF_LATIN1) <= 0)
        strcpy(priv_dir, "priv");
    fx_status st;
    fx_status_clear(&st);
    if (fx_runtime_init(priv_dir, &fx_cpu_backend, &st) != FX_OK)
        return 1;
    return open_types(env) ? 0 : 1;
}

static int on_upgrade(ErlNifEnv *env, void **priv, void **old_priv, ERL_NIF_TERM load_info)
{
    (void)old_priv;
    return on_load(env, priv, load_info);
}

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

static ErlNifFunc nif_funcs[] = {
    FX_TENSOR_NIFS,
    FX_POINTER_NIFS,
    FX_OPTIM_NIFS,
    FX_LINREC_NIFS,
    FX_SSM_NIFS,
    FX_XLA_NIFS,
};

ERL_NIF_INIT(fusex_nif, nif_funcs, on_load, NULL, on_upgrade, NULL)
