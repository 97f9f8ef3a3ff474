/*
 * fusex — the C interface shared by the op layer and the backends.
 *
 * This header is the whole contract between c_src/core (which owns tensors,
 * devices and validation) and a backend (c_src/cpu, linked in; c_src/cuda,
 * built into priv/fusex_cuda.so and loaded with dlopen). A backend sees only
 * what is declared here: plain pointers, dims and dtypes that the op layer has
 * already checked. It never sees Erlang terms.
 *
 * Everything here must stay valid C11 and valid CUDA C++ (the CUDA backend
 * includes it from .cu files).
 */
#ifndef FUSEX_H
#define FUSEX_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever fx_backend or an argument struct changes layout. The core
 * refuses a backend whose version or struct size differs from its own. */
#define FX_ABI_VERSION 8

#define FX_MAX_RANK 8

/* The largest download a backend's try_download takes (its copy is waited
 * for on the calling thread, a normal Erlang scheduler). */
#define FX_TRY_DOWNLOAD_MAX ((size_t)64 << 10)

/* The size of a CUDA IPC handle (cudaIpcMemHandle_t), as EXLA and PyTorch
 * exchange it. */
#define FX_IPC_HANDLE_SIZE 64

typedef enum fx_dtype {
    FX_F32 = 0,
    FX_F64,
    FX_BF16,
    FX_F16,
    FX_S32,
    FX_S64,
    FX_U8,
    FX_DTYPE_COUNT
} fx_dtype;

/* Status codes map one to one onto the Erlang exception reasons
 * (see c_src/nif/args.c): {badarg,Msg} (any bad input: wrong type, shape,
 * dtype or device, a freed tensor, an unavailable device),
 * {out_of_memory,Msg} (host memory), {cuda_error,Code,Msg} (any CUDA
 * failure, device out-of-memory included) and {internal,Msg}. */
typedef enum fx_code {
    FX_OK = 0,
    FX_EBADARG,
    FX_ENOMEM,
    FX_ECUDA,
    FX_EINTERNAL
} fx_code;

#define FX_MSG_LEN 384

typedef struct fx_status {
    int code;   /* fx_code */
    int detail; /* the cudaError_t for FX_ECUDA, else 0 */
    char msg[FX_MSG_LEN];
} fx_status;

static inline void fx_status_clear(fx_status *st)
{
    st->code = FX_OK;
    st->detail = 0;
    st->msg[0] = '\0';
}

/* Records the first failure only: a later, vaguer error never overwrites the
 * precise one. Returns the code so callers can `return fx_fail(...)`. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int fx_fail(fx_status *st, int code, const char *fmt, ...)
{
    if (st->code == FX_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
        st->code = code;
    }
    return code;
}

struct fx_device;
struct fx_buffer;
struct fx_exec; /* the launch context: fusex_exec.h */

/* A resolved, contiguous row-major tensor as the op layer hands it to a
 * backend. `device` and `buffer` belong to the core; backends use only
 * data, dtype, rank, dims and numel. */
typedef struct fx_tensor {
    void *data;
    fx_dtype dtype;
    int rank;
    int64_t dims[FX_MAX_RANK];
    int64_t numel;
    size_t nbytes;
    struct fx_device *device;
    struct fx_buffer *buffer;
} fx_tensor;

typedef struct fx_device_info {
    char name[256];
    uint64_t memory_total;
    uint64_t memory_free;
    int compute_major;
    int compute_minor;
    int multiprocessors;
    int threads; /* CPU worker threads, or 0 */
} fx_device_info;

typedef enum fx_binop { FX_ADD = 0, FX_SUB, FX_MUL } fx_binop;

/* ---- kernel families: each adds its own ops table (see its header) ---- */
struct fx_ssm_ops;
struct fx_linrec_ops;
struct fx_optim_ops;
struct fx_rnn_ops;    /* classic GRU and LSTM: fusex_rnn.h */
struct fx_conv_ops;   /* causal depthwise conv1d: fusex_conv.h */
struct fx_norm_ops;   /* RMSNorm, LayerNorm: fusex_norm.h */
struct fx_linear_ops; /* linear layers: fusex_linear.h */

/*
 * A backend's function table. Memory management and transfers take the
 * backend-local device ordinal `dev` and work on fusex's own stream of that
 * device; every function that computes (the elementwise ops, device copies
 * and fills, every family's ops) takes a launch context (fusex_exec.h)
 * instead: a device, a stream and a scratch allocator chosen by the caller.
 * `exec_default` gives fusex's own. Failures are reported through `st`, and
 * every function returns its code.
 *
 * Ordering: on a device with a stream (CUDA) every function is stream-ordered
 * and returns once its work is enqueued, except `download` (returns once the
 * bytes are in host memory), `upload` (returns once `src` may be reused) and
 * `synchronize`/`event_elapsed`. `release` is ordered after all work enqueued
 * on fusex's stream before it, so freeing a buffer a pending kernel still
 * reads is safe.
 */
typedef struct fx_backend {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;

    int (*init)(fx_status *st);
    /* Releases what init and later calls cached (staging buffers), after
     * waiting for pending work. Only for orderly exits (tests, tools): the
     * VM never unloads the library. */
    void (*shutdown)(void);
    int (*device_count)(void);
    int (*device_info)(int dev, fx_device_info *info, fx_status *st);

    int (*alloc)(int dev, size_t nbytes, void **ptr, fx_status *st);
    void (*release)(int dev, void *ptr);
    int (*upload)(int dev, void *dst, const void *src, size_t nbytes, fx_status *st);
    int (*download)(int dev, void *dst, const void *src, size_t nbytes, fx_status *st);
    /* fusex's own launch context of `dev`: its stream, and scratch from its
     * stream-ordered memory pool (host memory on the CPU). */
    int (*exec_default)(int dev, struct fx_exec *ex, fx_status *st);
    /* Streams of a caller's own, for its launch contexts (a C program's,
     * the tests'); NULL where the device has none (the CPU, whose work is
     * synchronous). `stream_synchronize` waits for the work on one. */
    int (*stream_create)(int dev, void **stream, fx_status *st);
    void (*stream_destroy)(int dev, void *stream);
    int (*stream_synchronize)(int dev, void *stream, fx_status *st);
    int (*copy)(const struct fx_exec *ex, void *dst, const void *src, size_t nbytes, fx_status *st);
    int (*fill_zero)(const struct fx_exec *ex, void *dst, size_t nbytes, fx_status *st);
    int (*synchronize)(int dev, fx_status *st);
    /* Sets *idle to 1 when all enqueued work has finished; never blocks. */
    int (*is_idle)(int dev, int *idle, fx_status *st);

    /* Timing, for the benchmarks: events on the device's stream, and a
     * kernel that keeps the device busy for `us` microseconds so that the
     * work enqueued behind it is timed without host launch gaps. */
    int (*event_create)(int dev, void **event, fx_status *st);
    void (*event_destroy)(int dev, void *event);
    int (*event_record)(int dev, void *event, fx_status *st);
    int (*event_elapsed_us)(int dev, void *start, void *stop, double *us, fx_status *st);
    int (*busy_wait)(int dev, double us, fx_status *st);

    /* Elementwise ops on same-shaped tensors (the op layer checks shapes). */
    int (*cast)(const struct fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st);
    int (*binary)(const struct fx_exec *ex, fx_binop op, const fx_tensor *a, const fx_tensor *b,
                  const fx_tensor *out, fx_status *st);
    int (*scale)(const struct fx_exec *ex, const fx_tensor *src, double factor, const fx_tensor *dst,
                 fx_status *st);

    const struct fx_ssm_ops *ssm;
    const struct fx_linrec_ops *linrec;
    const struct fx_optim_ops *optim;
    /* NULL where the backend has no such family (the op layer refuses it
     * with a message naming the device). */
    const struct fx_rnn_ops *rnn;
    const struct fx_conv_ops *conv;
    const struct fx_norm_ops *norm;
    const struct fx_linear_ops *linear;
    const struct fx_loss_ops *loss; /* row losses: a model's training loss */

    /* ---- pointer interop (fusex:to_pointer/from_pointer); see
     * docs/INTEROP.md. Any of these may be NULL where the device has no
     * such thing; the core then refuses the request with a clear error. ---- */

    /* Memory another process can map: plain cudaMalloc memory, not the
     * stream-ordered pool (whose blocks have no legacy IPC handle).
     * `release_exportable` waits for all work on the device first. */
    int (*alloc_exportable)(int dev, size_t nbytes, void **ptr, fx_status *st);
    void (*release_exportable)(int dev, void *ptr);
    /* The IPC handle of an exportable allocation (its base address). */
    int (*ipc_export)(int dev, void *ptr, unsigned char handle[FX_IPC_HANDLE_SIZE],
                      fx_status *st);
    /* Maps another process's allocation; `*ptr` is its base and `*nbytes`
     * its size when the driver says (else 0). Undone by `ipc_close`. */
    int (*ipc_open)(int dev, const unsigned char handle[FX_IPC_HANDLE_SIZE], void **ptr,
                    size_t *nbytes, fx_status *st);
    void (*ipc_close)(int dev, void *ptr);
    /* Waits for all work on the whole device, every stream of every library
     * in this process: how an imported pointer is ordered after foreign
     * work that fusex cannot see, and how memory handed out is kept until
     * foreign readers are done. */
    int (*device_synchronize)(int dev, fx_status *st);
    /* Checks a foreign address before fusex uses it: that it is memory of
     * this device and, where the driver says, that `nbytes` from it lie in
     * one allocation. NULL: nothing can be checked (host memory). */
    int (*pointer_check)(int dev, const void *ptr, size_t nbytes, fx_status *st);

    /* `upload` for callers that must not wait (a normal Erlang scheduler):
     * enqueues the copy and sets *done, or, where that would wait for a
     * staging slot or a lock, enqueues nothing and leaves *done false.
     * NULL: every upload may wait. */
    int (*try_upload)(int dev, void *dst, const void *src, size_t nbytes, bool *done,
                      fx_status *st);
    /* `download` for callers that must not wait: only a small one (at most
     * FX_TRY_DOWNLOAD_MAX bytes), and only once all enqueued work has
     * finished: then it copies at once and sets *done; otherwise it leaves
     * *done false. NULL: every download may wait. */
    int (*try_download)(int dev, void *dst, const void *src, size_t nbytes, bool *done,
                        fx_status *st);

    /* ---- CUDA graphs: work captured once and replayed as one launch (a
     * model's frame, docs/MODELS.md). NULL where the device has none (the
     * CPU); all four or none. ---- */

    /* Starts capturing the work enqueued on `stream` (a stream of
     * stream_create, never fusex's own, which other threads enqueue on)
     * from this thread (thread-local mode: a synchronising or allocating
     * call on this thread fails and spoils the capture). From here until
     * graph_end nothing enqueued on `stream` runs. */
    int (*graph_begin)(int dev, void *stream, fx_status *st);
    /* Ends the capture on `stream` and instantiates it: *graph is an
     * executable graph, or NULL with the error (a spoiled capture, an
     * uncapturable call) in st, the stream no longer capturing either way. */
    int (*graph_end)(int dev, void *stream, void **graph, fx_status *st);
    /* Enqueues the whole graph on `stream` (NULL: fusex's own), ordered
     * with the stream's other work like any launch. */
    int (*graph_launch)(int dev, void *graph, void *stream, fx_status *st);
    /* Frees a graph; work it enqueued finishes first. */
    void (*graph_destroy)(int dev, void *graph);
} fx_backend;

/* The one symbol priv/fusex_cuda.so exports. */
typedef const fx_backend *(*fx_backend_entry_fn)(void);
#define FX_CUDA_BACKEND_SYMBOL "fusex_cuda_backend"

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_H */
