/* Glue for the tensor API: creation, transfer, inspection, memory,
 * elementwise ops and the benchmark timing hooks. */
#include <string.h>

#include "fusex_dtype.h"
#include "core/ops.h"
#include "nif/nifs.h"

static ERL_NIF_TERM ok(fx_call *c) { return fx_call_finish(c, fx_atom(c->env, "ok")); }

static ERL_NIF_TERM make_shape(ErlNifEnv *env, int rank, const int64_t *dims)
{
    ERL_NIF_TERM items[FX_MAX_RANK];
    for (int i = 0; i < rank; i++)
        items[i] = enif_make_int64(env, dims[i]);
    return enif_make_tuple_from_array(env, items, (unsigned)rank);
}

static ERL_NIF_TERM make_dtype(ErlNifEnv *env, fx_dtype t)
{
    return enif_make_tuple2(env, fx_atom(env, fx_dtype_kind(t)), enif_make_int(env, fx_dtype_bits(t)));
}

/* ---- inspection (normal scheduler: no device work) ---- */

static ERL_NIF_TERM put(ErlNifEnv *env, ERL_NIF_TERM map, const char *key, ERL_NIF_TERM value)
{
    ERL_NIF_TERM out;
    enif_make_map_put(env, map, fx_atom(env, key), value, &out);
    return out;
}

static ERL_NIF_TERM device_map(fx_call *c, fx_device *dev)
{
    ErlNifEnv *env = c->env;
    fx_device_info info;
    if (fx_device_query(dev, &info, &c->st) != FX_OK)
        return 0;
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "id", fx_make_device(env, dev));
    m = put(env, m, "kind", fx_atom(env, dev->kind == FX_DEVICE_CPU ? "cpu" : "cuda"));
    m = put(env, m, "name", fx_make_string(env, info.name));
    m = put(env, m, "memory_total", enif_make_uint64(env, info.memory_total));
    m = put(env, m, "memory_free", enif_make_uint64(env, info.memory_free));
    if (dev->kind == FX_DEVICE_CPU) {
        m = put(env, m, "threads", enif_make_int(env, info.threads));
        /* which CPU kernels run: the fast f32 ones, or the f64 oracle */
        m = put(env, m, "path", fx_atom(env, dev->ordinal == 0 ? "fast" : "reference"));
        if (dev->ordinal == 0 && !fx_device_find(FX_DEVICE_CUDA, 0))
            m = put(env, m, "cuda_unavailable", fx_make_string(env, fx_cuda_unavailable_reason()));
    } else {
        m = put(env, m, "compute_capability",
                enif_make_tuple2(env, enif_make_int(env, info.compute_major),
                                 enif_make_int(env, info.compute_minor)));
        m = put(env, m, "multiprocessors", enif_make_int(env, info.multiprocessors));
    }
    return m;
}

ERL_NIF_TERM nif_devices(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    fx_call c;
    fx_call_init(&c, env);
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (int i = fx_device_count() - 1; i >= 0 && c.st.code == FX_OK; i--) {
        ERL_NIF_TERM m = device_map(&c, fx_device_at(i));
        if (c.st.code == FX_OK)
            list = enif_make_list_cell(env, m, list);
    }
    return fx_call_finish(&c, list);
}

/* shape/1, type/1, device/1: one live tensor in, one description out. */
static ERL_NIF_TERM describe(ErlNifEnv *env, ERL_NIF_TERM arg,
                             ERL_NIF_TERM (*what)(ErlNifEnv *, const fx_tensor *))
{
    fx_call c;
    fx_tensor t;
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, arg, "tensor", &t))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, what(env, &t));
}

static ERL_NIF_TERM shape_of(ErlNifEnv *env, const fx_tensor *t) { return make_shape(env, t->rank, t->dims); }
static ERL_NIF_TERM type_of(ErlNifEnv *env, const fx_tensor *t) { return make_dtype(env, t->dtype); }
static ERL_NIF_TERM device_of(ErlNifEnv *env, const fx_tensor *t) { return fx_make_device(env, t->device); }

ERL_NIF_TERM nif_shape(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return describe(env, argv[0], shape_of);
}

ERL_NIF_TERM nif_type(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return describe(env, argv[0], type_of);
}

ERL_NIF_TERM nif_device(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return describe(env, argv[0], device_of);
}

ERL_NIF_TERM nif_free(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_handle *h;
    if (!enif_get_resource(env, argv[0], fx_tensor_type, (void **)&h)) {
        fx_call c;
        fx_call_init(&c, env);
        fx_tensor unused;
        fx_arg_tensor(&c, argv[0], "tensor", &unused); /* fills the badarg */
        return fx_call_finish(&c, 0);
    }
    fx_handle_free(h);
    return fx_atom(env, "ok");
}

ERL_NIF_TERM nif_is_live(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_handle *h;
    if (!enif_get_resource(env, argv[0], fx_tensor_type, (void **)&h))
        return fx_atom(env, "false");
    return fx_atom(env, fx_handle_is_live(h) ? "true" : "false");
}

ERL_NIF_TERM nif_memory(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_device *dev;
    fx_call_init(&c, env);
    if (fx_arg_device(&c, argv[0], "device", &dev))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "allocated", enif_make_int64(env, atomic_load(&dev->allocated)));
    m = put(env, m, "peak", enif_make_int64(env, atomic_load(&dev->peak)));
    m = put(env, m, "live_tensors", enif_make_int64(env, atomic_load(&dev->live_tensors)));
    return fx_call_finish(&c, m);
}

ERL_NIF_TERM nif_reshape(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor t, out = {0};
    int rank;
    int64_t dims[FX_MAX_RANK];
    fx_call_init(&c, env);
    if (!fx_arg_tensor(&c, argv[0], "tensor", &t) && !fx_arg_shape(&c, argv[1], "shape", &rank, dims))
        fx_op_reshape(&t, rank, dims, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

ERL_NIF_TERM nif_nop(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    return fx_atom(env, "ok");
}

/* ---- device work (dirty schedulers) ---- */

/* Waits polled on a normal scheduler (synchronize, small downloads): rounds
 * of at most SYNC_ROUND_NS between reschedulings, SYNC_POLL_NS in all before
 * a move to dirty IO; see nif_synchronize_entry for why. */
#define SYNC_ROUND_NS 10000
#define SYNC_POLL_NS 1000000

/* After a round that found the device busy: another round of `poll` on
 * this scheduler, or, once the wait has lasted SYNC_POLL_NS, `blocking` on
 * dirty IO. argv: the target and the time the wait began (`began`). */
static ERL_NIF_TERM poll_again(ErlNifEnv *env, const char *name, fx_nif_fn *poll, fx_nif_fn *blocking,
                               const ERL_NIF_TERM argv[2], ErlNifSInt64 began)
{
    if (enif_monotonic_time(ERL_NIF_NSEC) - began >= SYNC_POLL_NS)
        return enif_schedule_nif(env, name, ERL_NIF_DIRTY_JOB_IO_BOUND, blocking, 1, argv);
    (void)enif_consume_timeslice(env, 1); /* a round is ~1 % of a 1 ms time slice */
    return enif_schedule_nif(env, name, 0, poll, 2, argv);
}

/* The first round of `poll` for argv[0], the wait beginning now. */
static ERL_NIF_TERM poll_start(ErlNifEnv *env, fx_nif_fn *poll, const ERL_NIF_TERM argv[])
{
    ERL_NIF_TERM args[2] = {argv[0], enif_make_int64(env, enif_monotonic_time(ERL_NIF_NSEC))};
    return poll(env, 2, args);
}

/* The body of tensor/5. With `done` NULL it may wait (a dirty scheduler);
 * else it never waits and leaves *done false when it made nothing. */
static ERL_NIF_TERM tensor_from_host(ErlNifEnv *env, const ERL_NIF_TERM argv[], bool *done)
{
    fx_call c;
    ErlNifBinary data;
    fx_dtype dtype;
    int rank;
    int64_t dims[FX_MAX_RANK];
    fx_device *dev;
    fx_tensor out = {0};
    bool ipc, made = true;
    fx_call_init(&c, env);
    if (!fx_arg_binary(&c, argv[0], "data", &data) && !fx_arg_dtype(&c, argv[1], "type", &dtype) &&
        !fx_arg_shape(&c, argv[2], "shape", &rank, dims) && !fx_arg_device(&c, argv[3], "device", &dev) &&
        !fx_arg_bool(&c, argv[4], "ipc", &ipc)) {
        if (done && !ipc) /* IPC memory is cudaMalloc'd: that may wait */
            fx_op_try_from_host(dev, dtype, rank, dims, data.data, data.size, &out, &made, &c.st);
        else if (done)
            made = false;
        else
            fx_op_from_host_flags(dev, dtype, rank, dims, data.data, data.size,
                                  ipc ? FX_ALLOC_IPC : FX_ALLOC_DEFAULT, &out, &c.st);
    }
    if (done)
        *done = made || c.st.code != FX_OK;
    if (!made && c.st.code == FX_OK)
        return fx_call_finish(&c, 0);
    return fx_call_return_tensor(&c, &out);
}

/* A small upload through a free staging slot only enqueues: it runs on the
 * calling scheduler (the inference path uploads a frame's inputs). */
FX_TRY_NIF(nif_tensor, tensor_from_host)

FX_ENQUEUE_NIF(nif_zeros)
static ERL_NIF_TERM nif_zeros(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_dtype dtype;
    int rank;
    int64_t dims[FX_MAX_RANK];
    fx_device *dev;
    fx_tensor out = {0};
    bool ipc;
    fx_call_init(&c, env);
    if (!fx_arg_dtype(&c, argv[0], "type", &dtype) && !fx_arg_shape(&c, argv[1], "shape", &rank, dims) &&
        !fx_arg_device(&c, argv[2], "device", &dev) && !fx_arg_bool(&c, argv[3], "ipc", &ipc))
        fx_op_zeros_flags(dev, dtype, rank, dims, ipc ? FX_ALLOC_IPC : FX_ALLOC_DEFAULT, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

static ERL_NIF_TERM nif_to_binary(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor t;
    ErlNifBinary bin;
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, argv[0], "tensor", &t))
        return fx_call_finish(&c, 0);
    if (!enif_alloc_binary(t.nbytes, &bin)) {
        fx_fail(&c.st, FX_ENOMEM, "out of host memory for a %zu-byte binary", t.nbytes);
        return fx_call_finish(&c, 0);
    }
    if (fx_op_to_host(&t, bin.data, &c.st)) {
        enif_release_binary(&bin);
        return fx_call_finish(&c, 0);
    }
    return fx_call_finish(&c, enif_make_binary(env, &bin));
}

/* One round of tries of a download that must not wait, for up to
 * SYNC_ROUND_NS from `round` (one binary for the whole round). *outcome:
 * 0 the result (a binary or an error), 1 the device still has queued
 * work, 2 this tensor never takes this path (a large one, or a device
 * without try_download). */
static ERL_NIF_TERM to_binary_round(ErlNifEnv *env, ERL_NIF_TERM tensor, ErlNifTime round, int *outcome)
{
    fx_call c;
    fx_tensor t;
    ErlNifBinary bin;
    bool done = false;
    *outcome = 0;
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, tensor, "tensor", &t))
        return fx_call_finish(&c, 0);
    if (!fx_op_try_to_host_eligible(&t)) {
        *outcome = 2;
        return fx_call_finish(&c, 0);
    }
    if (!enif_alloc_binary(t.nbytes, &bin)) {
        fx_fail(&c.st, FX_ENOMEM, "out of host memory for a %zu-byte binary", t.nbytes);
        return fx_call_finish(&c, 0);
    }
    while (fx_op_try_to_host(&t, bin.data, &done, &c.st) == FX_OK && !done &&
           enif_monotonic_time(ERL_NIF_NSEC) - round < SYNC_ROUND_NS)
        ;
    if (done)
        return fx_call_finish(&c, enif_make_binary(env, &bin));
    enif_release_binary(&bin);
    if (c.st.code == FX_OK)
        *outcome = 1;
    return fx_call_finish(&c, 0);
}

/* A small result read back right after its kernels (the inference path)
 * waits here as synchronize does: polling the device in yielding rounds on
 * the calling scheduler, then copying at once; past SYNC_POLL_NS, or for a
 * large tensor, the download moves to dirty IO. argv: the tensor, and the
 * time the wait began (ns). */
static ERL_NIF_TERM to_binary_poll(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    ErlNifSInt64 began;
    if (argc != 2 || !enif_get_int64(env, argv[1], &began))
        return enif_make_badarg(env);
    int outcome;
    ERL_NIF_TERM result = to_binary_round(env, argv[0], enif_monotonic_time(ERL_NIF_NSEC), &outcome);
    if (outcome == 0)
        return result;
    if (outcome == 2)
        return enif_schedule_nif(env, "to_binary", ERL_NIF_DIRTY_JOB_IO_BOUND, nif_to_binary, 1, argv);
    return poll_again(env, "to_binary", to_binary_poll, nif_to_binary, argv, began);
}

ERL_NIF_TERM nif_to_binary_entry(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    fx_handle *h;
    if (!enif_get_resource(env, argv[0], fx_tensor_type, (void **)&h) ||
        h->device->kind != FX_DEVICE_CUDA) /* CPU copies, and bad arguments, on dirty CPU */
        return fx_schedule_dirty(env, "to_binary", nif_to_binary, argc, argv);
    return poll_start(env, to_binary_poll, argv);
}

FX_DIRTY_NIF(nif_copy)
static ERL_NIF_TERM nif_copy(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor t, out = {0};
    fx_device *dev;
    bool ipc;
    fx_call_init(&c, env);
    if (!fx_arg_tensor(&c, argv[0], "tensor", &t) && !fx_arg_device(&c, argv[1], "device", &dev) &&
        !fx_arg_bool(&c, argv[2], "ipc", &ipc))
        fx_op_copy_to_flags(&t, dev, ipc ? FX_ALLOC_IPC : FX_ALLOC_DEFAULT, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

/* A tensor or a device; a freed tensor still names its device. */
static int sync_target(fx_call *c, ERL_NIF_TERM term, fx_device **dev)
{
    fx_handle *h;
    if (enif_get_resource(c->env, term, fx_tensor_type, (void **)&h)) {
        *dev = h->device;
        return FX_OK;
    }
    return fx_arg_device(c, term, "tensor_or_device", dev);
}

static ERL_NIF_TERM nif_synchronize_blocking(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_device *dev;
    fx_call_init(&c, env);
    if (sync_target(&c, argv[0], &dev) == FX_OK)
        fx_op_synchronize(dev, &c.st);
    return ok(&c);
}

/* Waiting on work that finishes within microseconds is the common case
 * (a small op, then its result is read), and so is waiting on a few
 * hundred microseconds (an optimizer step, a training step's kernels). A
 * blocking wait on a dirty IO scheduler costs ~20 µs after the work ends on
 * the lent VMs: the hop there, and the wake-up of the normal scheduler that
 * takes the process back. So the wait polls the stream on the calling
 * scheduler in rounds of at most SYNC_ROUND_NS, rescheduling itself between
 * rounds (enif_schedule_nif on a normal scheduler: other processes run in
 * between, as with any yielding NIF), and moves to dirty IO only once it
 * has polled for SYNC_POLL_NS, where those 20 µs are 2 % of the wait. */

/* argv: the tensor or device, and the time the wait began (ns). */
static ERL_NIF_TERM synchronize_poll(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    fx_call c;
    fx_device *dev;
    ErlNifSInt64 began;
    fx_call_init(&c, env);
    if (sync_target(&c, argv[0], &dev))
        return fx_call_finish(&c, 0);
    if (argc != 2 || !enif_get_int64(env, argv[1], &began))
        return enif_make_badarg(env);
    ErlNifTime round = enif_monotonic_time(ERL_NIF_NSEC);
    do {
        int idle = 0;
        if (dev->backend->is_idle(dev->ordinal, &idle, &c.st) != FX_OK)
            return ok(&c);
        if (idle) {
            fx_device_note_idle(dev);
            return ok(&c);
        }
    } while (enif_monotonic_time(ERL_NIF_NSEC) - round < SYNC_ROUND_NS);
    return poll_again(env, "synchronize", synchronize_poll, nif_synchronize_blocking, argv, began);
}

ERL_NIF_TERM nif_synchronize_entry(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return poll_start(env, synchronize_poll, argv);
}

FX_ENQUEUE_NIF(nif_convert)
static ERL_NIF_TERM nif_convert(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor t, out = {0};
    fx_dtype dtype;
    fx_call_init(&c, env);
    if (!fx_arg_tensor(&c, argv[0], "tensor", &t) && !fx_arg_dtype(&c, argv[1], "type", &dtype))
        fx_op_cast(&t, dtype, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

FX_ENQUEUE_NIF(nif_binary)
static ERL_NIF_TERM nif_binary(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor a, b, out = {0};
    fx_binop op;
    fx_call_init(&c, env);
    if (enif_is_identical(argv[0], fx_atom(env, "add")))
        op = FX_ADD;
    else if (enif_is_identical(argv[0], fx_atom(env, "subtract")))
        op = FX_SUB;
    else if (enif_is_identical(argv[0], fx_atom(env, "multiply")))
        op = FX_MUL;
    else {
        fx_fail(&c.st, FX_EBADARG, "op: expected add, subtract or multiply");
        return fx_call_finish(&c, 0);
    }
    if (!fx_arg_tensor(&c, argv[1], "a", &a) && !fx_arg_tensor(&c, argv[2], "b", &b))
        fx_op_binary(op, &a, &b, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

FX_ENQUEUE_NIF(nif_scale)
static ERL_NIF_TERM nif_scale(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor t, out = {0};
    double factor;
    fx_call_init(&c, env);
    if (!fx_arg_tensor(&c, argv[0], "tensor", &t) && !fx_arg_double(&c, argv[1], "factor", &factor))
        fx_op_scale(&t, factor, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

/* ---- timing hooks for bench/: device events and a busy-wait ---- */

typedef struct fx_event {
    fx_device *device;
    void *event;
} fx_event;

static ErlNifResourceType *fx_event_type;

static void event_destructor(ErlNifEnv *env, void *obj)
{
    (void)env;
    fx_event *e = obj;
    if (e->event)
        e->device->backend->event_destroy(e->device->ordinal, e->event);
}

int fx_event_type_open(ErlNifEnv *env)
{
    fx_event_type = enif_open_resource_type(env, NULL, "fusex_event", event_destructor,
                                            ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    return fx_event_type != NULL;
}

static int arg_event(fx_call *c, ERL_NIF_TERM term, const char *name, fx_event **out)
{
    if (enif_get_resource(c->env, term, fx_event_type, (void **)out))
        return FX_OK;
    char text[96];
    fx_format_term(text, sizeof text, term);
    return fx_fail(&c->st, FX_EBADARG, "%s: expected a fusex event, got %s", name, text);
}

FX_DIRTY_NIF(nif_event_new)
static ERL_NIF_TERM nif_event_new(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_device *dev;
    fx_call_init(&c, env);
    if (fx_arg_device(&c, argv[0], "device", &dev))
        return fx_call_finish(&c, 0);
    fx_event *e = enif_alloc_resource(fx_event_type, sizeof *e);
    e->device = dev;
    e->event = NULL;
    dev->backend->event_create(dev->ordinal, &e->event, &c.st);
    ERL_NIF_TERM term = enif_make_resource(env, e);
    enif_release_resource(e);
    return fx_call_finish(&c, term);
}

FX_DIRTY_NIF(nif_event_record)
static ERL_NIF_TERM nif_event_record(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_event *e;
    fx_call_init(&c, env);
    if (arg_event(&c, argv[0], "event", &e) == FX_OK)
        e->device->backend->event_record(e->device->ordinal, e->event, &c.st);
    return ok(&c);
}

FX_DIRTY_NIF(nif_event_elapsed)
static ERL_NIF_TERM nif_event_elapsed(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_event *start, *stop;
    double us = 0;
    fx_call_init(&c, env);
    if (arg_event(&c, argv[0], "start", &start) || arg_event(&c, argv[1], "stop", &stop))
        return fx_call_finish(&c, 0);
    if (start->device != stop->device)
        fx_fail(&c.st, FX_EBADARG, "stop: expected an event on %s (where start is), got one on %s",
                start->device->label, stop->device->label);
    else
        start->device->backend->event_elapsed_us(start->device->ordinal, start->event, stop->event,
                                                 &us, &c.st);
    return fx_call_finish(&c, enif_make_double(env, us));
}

FX_DIRTY_NIF(nif_busy_wait)
static ERL_NIF_TERM nif_busy_wait(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_device *dev;
    double us;
    fx_call_init(&c, env);
    if (fx_arg_device(&c, argv[0], "device", &dev) || fx_arg_double(&c, argv[1], "us", &us))
        return fx_call_finish(&c, 0);
    if (us < 0 || us > 1e6)
        fx_fail(&c.st, FX_EBADARG, "us: expected 0..1000000 microseconds, got %g", us);
    else
        dev->backend->busy_wait(dev->ordinal, us, &c.st);
    return ok(&c);
}
