/* Devices, buffers and tensor handles: the resident-tensor machinery the
 * NIF glue and the C tests share. Nothing here knows about Erlang. */
#ifndef FX_RUNTIME_H
#define FX_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "fusex.h"
#include "fusex_exec.h"

typedef enum fx_device_kind { FX_DEVICE_CPU = 0, FX_DEVICE_CUDA = 1 } fx_device_kind;

struct fx_buffer;

/* Freed allocations remembered per device, so that importing an address
 * inside one is refused as a use-after-free (see fx_registry_find). */
#define FX_FREED_RING 2048

typedef struct fx_freed_range {
    uintptr_t base;
    size_t nbytes;
} fx_freed_range;

typedef struct fx_device {
    fx_device_kind kind;
    int ordinal;  /* the backend's own device number */
    char label[24]; /* "cpu", "cpu:reference", "cuda:0" */
    const fx_backend *backend;
    atomic_llong allocated;    /* bytes of fusex-owned buffers */
    atomic_llong peak;
    atomic_llong live_tensors; /* handles not yet freed or collected */
    atomic_int queued_ops;     /* ops enqueued since the stream was last seen idle */
    /* The registry of live fusex allocations on this device: an intrusive
     * list of buffers (O(1) insert and remove under one uncontended mutex;
     * lookups, done only by from_pointer, scan it), and a ring of the most
     * recently freed ranges. */
    pthread_mutex_t registry_lock;
    struct fx_buffer *registry_head;
    fx_freed_range freed[FX_FREED_RING];
    unsigned freed_next;
} fx_device;

/* Makes `host` (the CPU backend, which the program links: the NIF, the
 * tests) device 0 and, when priv_dir holds fusex_cuda.so and a driver and
 * GPU are present, adds the CUDA backend's devices. Safe to call more than
 * once (later calls change nothing). A missing CUDA backend is not an
 * error: fx_cuda_unavailable_reason() says why. FUSEX_DISABLE_CUDA=1 in
 * the environment skips CUDA. */
int fx_runtime_init(const char *priv_dir, const fx_backend *host, fx_status *st);
/* Loads and starts the CUDA backend at `path` (fusex_cuda.so), for the
 * runtime and for the XLA handlers' library, which keeps its own device
 * records: FUSEX_DISABLE_CUDA, dlopen, the entry point, the ABI version
 * and struct size, init, a device count. Returns the count (> 0) with the
 * backend in *out and `why` emptied, or 0 with *out NULL and the reason in
 * `why`. An incompatible library is closed again; one whose init failed
 * stays mapped. */
int fx_cuda_backend_open(const char *path, const fx_backend **out, char *why, size_t len);
/* Waits for pending work and frees backend caches; for orderly exits of
 * programs that link the core (the C tests). */
void fx_runtime_shutdown(void);
int fx_device_count(void);

/* How many ops may be queued on a stream, since it was last seen idle, for
 * the next one still to be enqueued from a normal scheduler. CUDA's launch
 * queue holds about a thousand launches; an op makes a few. Far below that,
 * enqueueing cannot block, so it needs no dirty scheduler. */
#define FX_INLINE_QUEUE_MAX 64

/* Counts an op about to be enqueued; true when it may run inline. */
bool fx_device_enqueue_inline(fx_device *dev);
/* Everything enqueued so far has finished (seen by a synchronize, a
 * download or an idle query). */
void fx_device_note_idle(fx_device *dev);
/* A device record over `backend`'s device `ordinal`, labelled "cpu" or
 * "cuda:N", its accounting and registry empty: what the runtime keeps for
 * each device, and what a second entry (the XLA handlers' library) keeps
 * for its own. */
void fx_device_init(fx_device *dev, fx_device_kind kind, int ordinal, const fx_backend *backend);
fx_device *fx_device_at(int index);
fx_device *fx_device_find(fx_device_kind kind, int ordinal);
fx_device *fx_cpu_device(void);
/* The host backend's reference path ("cpu:reference", CPU ordinal 1: the
 * f64-accumulating oracle), or NULL where the host backend has none. */
fx_device *fx_cpu_reference_device(void);
const char *fx_cuda_unavailable_reason(void);
int fx_device_query(fx_device *dev, fx_device_info *info, fx_status *st);

/* What an op runs on: `ex` when the caller gave one, else `dev`'s own launch
 * context (its stream and memory pool), filled into *own. NULL, with the
 * error in st, when the device cannot give one (a lost GPU). */
const fx_exec *fx_exec_resolve(const fx_device *dev, const fx_exec *ex, fx_exec *own, fx_status *st);

/* A device allocation with a reference count. Several handles may share one
 * (reshape views); the memory goes back when the last reference drops.
 * A borrowed buffer wraps memory fusex does not own (a foreign pointer):
 * it is never freed, only its release hook runs. */
typedef struct fx_buffer {
    atomic_int refs;
    fx_device *device;
    void *ptr;
    size_t nbytes;
    bool borrowed;
    bool exportable;      /* plain cudaMalloc memory (ipc => true): has an IPC handle */
    atomic_bool exported; /* its address was handed out by to_pointer */
    void (*on_release)(void *arg);
    void *release_arg;
    struct fx_buffer *reg_prev, *reg_next; /* the device's registry list */
} fx_buffer;

/* Allocation flags: FX_ALLOC_IPC asks for memory another process can map
 * (the backend's alloc_exportable); refused where the device has none. */
enum { FX_ALLOC_DEFAULT = 0, FX_ALLOC_IPC = 1 };

int fx_buffer_new(fx_device *dev, size_t nbytes, fx_buffer **out, fx_status *st);
int fx_buffer_new_flags(fx_device *dev, size_t nbytes, unsigned flags, fx_buffer **out,
                        fx_status *st);
fx_buffer *fx_buffer_borrow(fx_device *dev, void *ptr, size_t nbytes,
                            void (*on_release)(void *), void *arg);
void fx_buffer_ref(fx_buffer *buf);
void fx_buffer_unref(fx_buffer *buf);
/* Marks memory whose address left fusex (to_pointer): before it goes back
 * to the allocator the whole device is synchronized, so a foreign stream
 * still reading it is done first. */
void fx_buffer_mark_exported(fx_buffer *buf);

/* Where does `addr` lie on `dev`? FX_ADDR_LIVE: inside a live fusex
 * allocation, returned in *owner with a reference the caller drops;
 * FX_ADDR_FREED: inside one of the last FX_FREED_RING allocations fusex
 * freed (and not reused since), returned in *freed; FX_ADDR_FOREIGN:
 * neither (memory fusex never allocated, or freed too long ago). */
typedef enum fx_addr_kind { FX_ADDR_FOREIGN = 0, FX_ADDR_LIVE, FX_ADDR_FREED } fx_addr_kind;
fx_addr_kind fx_registry_find(fx_device *dev, uintptr_t addr, fx_buffer **owner,
                              fx_freed_range *freed);

/* Shape maths with overflow checks; `arg` names the argument in errors. */
int fx_shape_numel(const char *arg, int rank, const int64_t *dims, int64_t *numel,
                   fx_status *st);
int fx_shape_nbytes(const char *arg, fx_dtype dtype, int rank, const int64_t *dims,
                    int64_t *numel, size_t *nbytes, fx_status *st);
/* Writes "{2,3,4}" (Erlang tuple spelling). */
void fx_format_shape(char *out, size_t outlen, int rank, const int64_t *dims);

/* Fills `t`'s shape fields and gives it a new buffer (one reference, owned
 * by `t`) on `dev`. */
int fx_tensor_alloc(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                    fx_tensor *t, fx_status *st);
int fx_tensor_alloc_flags(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                          unsigned flags, fx_tensor *t, fx_status *st);
/* Drops the buffer reference a tensor holds; safe on a zeroed struct. */
void fx_tensor_release(fx_tensor *t);

/* A handle is what an Erlang tensor term points at. `free` can race with an
 * op that is reading the handle in another thread, so the buffer pointer is
 * guarded by a small spin lock; ops hold their own buffer reference for as
 * long as they use it, so a concurrent free never pulls memory from under a
 * running op. */
typedef struct fx_handle {
    atomic_flag lock;
    fx_buffer *buffer; /* NULL once freed */
    fx_device *device;
    fx_dtype dtype;
    int rank;
    int64_t dims[FX_MAX_RANK];
    int64_t numel;
    size_t nbytes;
} fx_handle;

/* Moves the tensor's buffer reference into the handle (t is emptied). */
void fx_handle_init(fx_handle *h, fx_tensor *t);
/* A new reference to the handle's tensor, or a badarg naming `arg` when the
 * handle was freed. Release it with fx_tensor_release. */
int fx_handle_acquire(fx_handle *h, const char *arg, fx_tensor *out, fx_status *st);
/* Returns true when this call freed it, false when it was already freed. */
bool fx_handle_free(fx_handle *h);
bool fx_handle_is_live(fx_handle *h);

#endif
