#include "core/runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"

#define FX_MAX_CPU_DEVICES 2 /* cpu and its reference path */
#define FX_MAX_DEVICES (FX_MAX_CPU_DEVICES + 16) /* + up to 16 GPUs */


static fx_device devices[FX_MAX_DEVICES];
static int device_total;
static char cuda_reason[1024] = "CUDA backend not loaded";
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static const char *init_priv_dir;
static const fx_backend *init_host;
static fx_status init_status;

void fx_device_init(fx_device *dev, fx_device_kind kind, int ordinal, const fx_backend *backend)
{
    memset(dev, 0, sizeof *dev);
    dev->kind = kind;
    dev->ordinal = ordinal;
    dev->backend = backend;
    if (kind == FX_DEVICE_CPU)
        snprintf(dev->label, sizeof dev->label, ordinal == 0 ? "cpu" : "cpu:reference");
    else
        snprintf(dev->label, sizeof dev->label, "cuda:%d", ordinal);
    atomic_init(&dev->allocated, 0);
    atomic_init(&dev->peak, 0);
    atomic_init(&dev->live_tensors, 0);
    atomic_init(&dev->queued_ops, 0);
    pthread_mutex_init(&dev->registry_lock, NULL);
    dev->registry_head = NULL;
    dev->freed_next = 0;
}

static void add_device(const fx_backend *backend, fx_device_kind kind, int ordinal)
{
    fx_device_init(&devices[device_total++], kind, ordinal, backend);
}

static int backend_compatible(const fx_backend *b)
{
    return b->abi_version == FX_ABI_VERSION && b->struct_size == sizeof(fx_backend);
}

int fx_cuda_backend_open(const char *path, const fx_backend **out, char *why, size_t len)
{
    *out = NULL;
    const char *disable = getenv("FUSEX_DISABLE_CUDA");
    if (disable && *disable && strcmp(disable, "0") != 0) {
        snprintf(why, len, "disabled by FUSEX_DISABLE_CUDA=%.100s", disable);
        return 0;
    }
    /* Where the library is loaded already (the NIF's and the XLA
     * handlers' in one BEAM), dlopen hands back that copy, whose init has
     * run: init is once per process, and a second call is a no-op. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, len, "no CUDA backend: %.900s (built only where nvcc is found)", dlerror());
        return 0;
    }
    fx_backend_entry_fn entry = (fx_backend_entry_fn)dlsym(lib, FX_CUDA_BACKEND_SYMBOL);
    const fx_backend *backend = entry ? entry() : NULL;
    if (!backend || !backend_compatible(backend)) {
        snprintf(why, len, "%.800s is not a compatible fusex CUDA backend (ABI %d)", path, FX_ABI_VERSION);
        dlclose(lib);
        return 0;
    }
    fx_status st;
    fx_status_clear(&st);
    if (backend->init(&st) != FX_OK) {
        snprintf(why, len, "the CUDA backend did not start: %s", st.msg);
        return 0; /* keep the library mapped: cudart may hold state */
    }
    int count = backend->device_count();
    if (count <= 0) {
        snprintf(why, len, "no CUDA device found");
        return 0;
    }
    if (len > 0)
        why[0] = '\0';
    *out = backend;
    return count;
}

static void load_cuda(const char *priv_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/fusex_cuda.so", priv_dir ? priv_dir : "priv");
    const fx_backend *backend;
    int count = fx_cuda_backend_open(path, &backend, cuda_reason, sizeof cuda_reason);
    for (int i = 0; i < count && device_total < FX_MAX_DEVICES; i++)
        add_device(backend, FX_DEVICE_CUDA, i);
}

static void init_all(void)
{
    fx_status_clear(&init_status);
    if (!init_host || !backend_compatible(init_host)) {
        fx_fail(&init_status, FX_EINTERNAL, "fx_runtime_init: the host backend is missing or not of ABI %d",
                FX_ABI_VERSION);
        return;
    }
    if (init_host->init(&init_status) != FX_OK)
        return;
    /* The host backend's devices first: "cpu", then where it has one the
     * reference path (the CPU backend's oracle) as CPU device 1. */
    int host_count = init_host->device_count();
    for (int i = 0; i < host_count && device_total < FX_MAX_CPU_DEVICES; i++)
        add_device(init_host, FX_DEVICE_CPU, i);
    load_cuda(init_priv_dir);
}

int fx_runtime_init(const char *priv_dir, const fx_backend *host, fx_status *st)
{
    init_priv_dir = priv_dir;
    init_host = host;
    pthread_once(&init_once, init_all);
    if (init_status.code != FX_OK)
        return fx_fail(st, init_status.code, "%s", init_status.msg);
    return FX_OK;
}

void fx_runtime_shutdown(void)
{
    const fx_backend *done[FX_MAX_DEVICES];
    int ndone = 0;
    for (int i = 0; i < device_total; i++) {
        const fx_backend *b = devices[i].backend;
        int seen = 0;
        for (int k = 0; k < ndone; k++)
            seen |= done[k] == b;
        if (!seen) {
            b->shutdown();
            done[ndone++] = b;
        }
    }
}

int fx_device_count(void) { return device_total; }

bool fx_device_enqueue_inline(fx_device *dev)
{
    return atomic_fetch_add(&dev->queued_ops, 1) < FX_INLINE_QUEUE_MAX;
}

void fx_device_note_idle(fx_device *dev) { atomic_store(&dev->queued_ops, 0); }

fx_device *fx_device_at(int index)
{
    return index >= 0 && index < device_total ? &devices[index] : NULL;
}

fx_device *fx_device_find(fx_device_kind kind, int ordinal)
{
    for (int i = 0; i < device_total; i++)
        if (devices[i].kind == kind && devices[i].ordinal == ordinal)
            return &devices[i];
    return NULL;
}

fx_device *fx_cpu_device(void) { return device_total > 0 ? &devices[0] : NULL; }

fx_device *fx_cpu_reference_device(void) { return fx_device_find(FX_DEVICE_CPU, 1); }

const fx_exec *fx_exec_resolve(const fx_device *dev, const fx_exec *ex, fx_exec *own, fx_status *st)
{
    if (ex)
        return ex;
    memset(own, 0, sizeof *own);
    return dev->backend->exec_default(dev->ordinal, own, st) == FX_OK ? own : NULL;
}

const char *fx_cuda_unavailable_reason(void) { return cuda_reason; }

int fx_device_query(fx_device *dev, fx_device_info *info, fx_status *st)
{
    memset(info, 0, sizeof *info);
    return dev->backend->device_info(dev->ordinal, info, st);
}

/* ---- shapes ---- */

/* The largest allocation we agree to describe: keeps every byte offset
 * representable in int64 and well clear of size_t overflow. */
#define FX_MAX_BYTES ((int64_t)1 << 48)

void fx_format_shape(char *out, size_t outlen, int rank, const int64_t *dims)
{
    size_t used = (size_t)snprintf(out, outlen, "{");
    for (int i = 0; i < rank && used < outlen; i++)
        used += (size_t)snprintf(out + used, outlen - used, i ? ",%lld" : "%lld",
                                 (long long)dims[i]);
    if (used < outlen)
        snprintf(out + used, outlen - used, "}");
}

/* The nonzero dimensions must multiply to at most 2^48 too, not only the
 * element count: a zero-element shape like {2^48, 0, 2^22} is a valid
 * tensor, and the ops form counts from some of its dimensions (batch *
 * dim, a state's batch * dim * dstate). Bounding every partial product of
 * a shape keeps each such count of one tensor within 2^48; products that
 * combine several tensors are checked where they are formed (fx_size_mul
 * and fx_size_add of fusex_exec.h saturate, so an allocation of what
 * overflowed fails). */
int fx_shape_numel(const char *arg, int rank, const int64_t *dims, int64_t *numel,
                   fx_status *st)
{
    if (rank < 0 || rank > FX_MAX_RANK)
        return fx_fail(st, FX_EBADARG, "%s: expected a rank of at most %d, got %d", arg,
                       FX_MAX_RANK, rank);
    int64_t nonzero = 1;
    bool empty = false;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return fx_fail(st, FX_EBADARG, "%s: expected non-negative dimensions, got %lld at axis %d",
                           arg, (long long)dims[i], i);
        if (dims[i] == 0) {
            empty = true;
            continue;
        }
        if (nonzero > FX_MAX_BYTES / dims[i]) {
            bool has_zero = empty;
            for (int k = i + 1; k < rank; k++)
                has_zero |= dims[k] == 0;
            char shape[160];
            fx_format_shape(shape, sizeof shape, rank, dims);
            if (has_zero)
                return fx_fail(st, FX_EBADARG,
                               "%s: expected nonzero dimensions whose product is at most 2^48, got %s",
                               arg, shape);
            return fx_fail(st, FX_EBADARG, "%s: expected a shape of at most 2^48 elements, got %s",
                           arg, shape);
        }
        nonzero *= dims[i];
    }
    *numel = empty ? 0 : nonzero;
    return FX_OK;
}

int fx_shape_nbytes(const char *arg, fx_dtype dtype, int rank, const int64_t *dims,
                    int64_t *numel, size_t *nbytes, fx_status *st)
{
    if (fx_shape_numel(arg, rank, dims, numel, st) != FX_OK)
        return st->code;
    int64_t size = (int64_t)fx_dtype_size(dtype);
    if (*numel > FX_MAX_BYTES / size) {
        char shape[160];
        fx_format_shape(shape, sizeof shape, rank, dims);
        return fx_fail(st, FX_EBADARG, "%s: expected at most 2^48 bytes, got shape %s of %s", arg,
                       shape, fx_dtype_name(dtype));
    }
    *nbytes = (size_t)(*numel * size);
    return FX_OK;
}

/* ---- buffers ---- */

static void count_alloc(fx_device *dev, long long nbytes)
{
    long long now = atomic_fetch_add(&dev->allocated, nbytes) + nbytes;
    long long peak = atomic_load(&dev->peak);
    while (now > peak && !atomic_compare_exchange_weak(&dev->peak, &peak, now)) {
    }
}

/* ---- the registry of live allocations ---- */

static void registry_add(fx_buffer *buf)
{
    fx_device *dev = buf->device;
    pthread_mutex_lock(&dev->registry_lock);
    buf->reg_prev = NULL;
    buf->reg_next = dev->registry_head;
    if (dev->registry_head)
        dev->registry_head->reg_prev = buf;
    dev->registry_head = buf;
    pthread_mutex_unlock(&dev->registry_lock);
}

static void registry_remove(fx_buffer *buf)
{
    fx_device *dev = buf->device;
    pthread_mutex_lock(&dev->registry_lock);
    if (buf->reg_prev)
        buf->reg_prev->reg_next = buf->reg_next;
    else
        dev->registry_head = buf->reg_next;
    if (buf->reg_next)
        buf->reg_next->reg_prev = buf->reg_prev;
    fx_freed_range *slot = &dev->freed[dev->freed_next++ % FX_FREED_RING];
    slot->base = (uintptr_t)buf->ptr;
    slot->nbytes = buf->nbytes;
    pthread_mutex_unlock(&dev->registry_lock);
}

static int contains(uintptr_t base, size_t nbytes, uintptr_t addr)
{
    return addr >= base && addr - base < nbytes;
}

/* A reference to a buffer whose count may be dropping to zero on another
 * thread (it is then waiting for the registry lock to unlink itself). */
static int ref_unless_dying(fx_buffer *buf)
{
    int refs = atomic_load(&buf->refs);
    while (refs > 0)
        if (atomic_compare_exchange_weak(&buf->refs, &refs, refs + 1))
            return 1;
    return 0;
}

fx_addr_kind fx_registry_find(fx_device *dev, uintptr_t addr, fx_buffer **owner,
                              fx_freed_range *freed)
{
    fx_addr_kind kind = FX_ADDR_FOREIGN;
    *owner = NULL;
    pthread_mutex_lock(&dev->registry_lock);
    for (fx_buffer *b = dev->registry_head; b; b = b->reg_next)
        if (contains((uintptr_t)b->ptr, b->nbytes, addr)) {
            if (ref_unless_dying(b)) {
                *owner = b;
                kind = FX_ADDR_LIVE;
            } else { /* being freed right now: as good as freed */
                freed->base = (uintptr_t)b->ptr;
                freed->nbytes = b->nbytes;
                kind = FX_ADDR_FREED;
            }
            break;
        }
    /* Newest first: the most recent free of a range is the one that counts. */
    for (unsigned i = 0; kind == FX_ADDR_FOREIGN && i < FX_FREED_RING; i++) {
        fx_freed_range *r = &dev->freed[(dev->freed_next - 1 - i) % FX_FREED_RING];
        if (r->nbytes && contains(r->base, r->nbytes, addr)) {
            *freed = *r;
            kind = FX_ADDR_FREED;
        }
    }
    pthread_mutex_unlock(&dev->registry_lock);
    return kind;
}

/* ---- buffers ---- */

int fx_buffer_new(fx_device *dev, size_t nbytes, fx_buffer **out, fx_status *st)
{
    return fx_buffer_new_flags(dev, nbytes, FX_ALLOC_DEFAULT, out, st);
}

static int alloc_exportable(fx_device *dev, size_t nbytes, void **ptr, fx_status *st)
{
    const fx_backend *b = dev->backend;
    if (!b->alloc_exportable)
        return fx_fail(st, FX_EBADARG,
                       "ipc: expected a CUDA device (IPC handles are CUDA memory), got %s; "
                       "use local pointers on %s",
                       dev->label, dev->label);
    return b->alloc_exportable(dev->ordinal, nbytes, ptr, st);
}

int fx_buffer_new_flags(fx_device *dev, size_t nbytes, unsigned flags, fx_buffer **out,
                        fx_status *st)
{
    bool exportable = (flags & FX_ALLOC_IPC) != 0;
    if (exportable && !dev->backend->alloc_exportable)
        return alloc_exportable(dev, nbytes, NULL, st); /* the refusal */
    fx_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a buffer record");
    /* An exportable buffer is allocated even when empty: it is its own
     * allocation, so it has a handle. */
    int rc = FX_OK;
    if (exportable)
        rc = alloc_exportable(dev, nbytes ? nbytes : 1, &buf->ptr, st);
    else if (nbytes > 0)
        rc = dev->backend->alloc(dev->ordinal, nbytes, &buf->ptr, st);
    if (rc != FX_OK) {
        free(buf);
        return st->code;
    }
    atomic_init(&buf->refs, 1);
    atomic_init(&buf->exported, false);
    buf->device = dev;
    buf->nbytes = nbytes;
    buf->exportable = exportable;
    count_alloc(dev, (long long)nbytes);
    if (buf->ptr)
        registry_add(buf);
    *out = buf;
    return FX_OK;
}

fx_buffer *fx_buffer_borrow(fx_device *dev, void *ptr, size_t nbytes,
                            void (*on_release)(void *), void *arg)
{
    fx_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return NULL;
    atomic_init(&buf->refs, 1);
    buf->device = dev;
    buf->ptr = ptr;
    buf->nbytes = nbytes;
    buf->borrowed = true;
    atomic_init(&buf->exported, false);
    buf->on_release = on_release;
    buf->release_arg = arg;
    return buf;
}

void fx_buffer_ref(fx_buffer *buf) { atomic_fetch_add(&buf->refs, 1); }

void fx_buffer_mark_exported(fx_buffer *buf) { atomic_store(&buf->exported, true); }

static void release_memory(fx_buffer *buf)
{
    fx_device *dev = buf->device;
    const fx_backend *b = dev->backend;
    if (!buf->ptr)
        return;
    registry_remove(buf);
    if (buf->exportable) {
        b->release_exportable(dev->ordinal, buf->ptr);
        return;
    }
    /* A foreign stream may still read memory whose address left fusex: the
     * stream-ordered free below is ordered only after fusex's own stream. */
    if (atomic_load(&buf->exported) && b->device_synchronize) {
        fx_status st;
        fx_status_clear(&st);
        (void)b->device_synchronize(dev->ordinal, &st); /* a lost device frees anyway */
    }
    b->release(dev->ordinal, buf->ptr);
}

void fx_buffer_unref(fx_buffer *buf)
{
    if (!buf || atomic_fetch_sub(&buf->refs, 1) != 1)
        return;
    if (buf->borrowed) {
        if (buf->on_release)
            buf->on_release(buf->release_arg);
    } else {
        release_memory(buf);
        atomic_fetch_sub(&buf->device->allocated, (long long)buf->nbytes);
    }
    free(buf);
}

/* ---- tensors ---- */

int fx_tensor_alloc(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                    fx_tensor *t, fx_status *st)
{
    return fx_tensor_alloc_flags(dev, dtype, rank, dims, FX_ALLOC_DEFAULT, t, st);
}

int fx_tensor_alloc_flags(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                          unsigned flags, fx_tensor *t, fx_status *st)
{
    memset(t, 0, sizeof *t);
    if (fx_shape_nbytes("shape", dtype, rank, dims, &t->numel, &t->nbytes, st) != FX_OK)
        return st->code;
    if (fx_buffer_new_flags(dev, t->nbytes, flags, &t->buffer, st) != FX_OK)
        return st->code;
    t->dtype = dtype;
    t->rank = rank;
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);
    t->device = dev;
    t->data = t->buffer->ptr;
    return FX_OK;
}

void fx_tensor_release(fx_tensor *t)
{
    if (t->buffer) {
        fx_buffer_unref(t->buffer);
        t->buffer = NULL;
        t->data = NULL;
    }
}

/* ---- handles ---- */

static void handle_lock(fx_handle *h)
{
    while (atomic_flag_test_and_set_explicit(&h->lock, memory_order_acquire)) {
    }
}

static void handle_unlock(fx_handle *h) { atomic_flag_clear_explicit(&h->lock, memory_order_release); }

void fx_handle_init(fx_handle *h, fx_tensor *t)
{
    atomic_flag_clear(&h->lock);
    h->buffer = t->buffer;
    h->device = t->device;
    h->dtype = t->dtype;
    h->rank = t->rank;
    memcpy(h->dims, t->dims, sizeof h->dims);
    h->numel = t->numel;
    h->nbytes = t->nbytes;
    atomic_fetch_add(&h->device->live_tensors, 1);
    t->buffer = NULL;
    t->data = NULL;
}

/* Every field of `out` is assigned: this runs for each tensor of a call,
 * hundreds of times for an optimizer step, where a memset first cost more
 * than the copy. */
int fx_handle_acquire(fx_handle *h, const char *arg, fx_tensor *out, fx_status *st)
{
    handle_lock(h);
    fx_buffer *buf = h->buffer;
    if (buf)
        fx_buffer_ref(buf);
    handle_unlock(h);
    out->buffer = buf;
    out->data = buf ? buf->ptr : NULL;
    out->device = h->device;
    out->dtype = h->dtype;
    out->rank = h->rank;
    memcpy(out->dims, h->dims, sizeof out->dims);
    out->numel = h->numel;
    out->nbytes = h->nbytes;
    if (!buf)
        return fx_fail(st, FX_EBADARG, "%s: expected a live tensor, got one released by fusex:free/1",
                       arg);
    return FX_OK;
}

bool fx_handle_free(fx_handle *h)
{
    handle_lock(h);
    fx_buffer *buf = h->buffer;
    h->buffer = NULL;
    handle_unlock(h);
    if (!buf)
        return false;
    atomic_fetch_sub(&h->device->live_tensors, 1);
    fx_buffer_unref(buf);
    return true;
}

bool fx_handle_is_live(fx_handle *h)
{
    handle_lock(h);
    bool live = h->buffer != NULL;
    handle_unlock(h);
    return live;
}
