// The CUDA backend: one non-blocking stream per device, a stream-ordered
// memory pool, pinned staging for host transfers, events for timing.
// Built into priv/fusex_cuda.so and loaded by the core with dlopen, so the
// NIF itself never links against CUDA.
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/blas.cuh"
#include "cuda/common.cuh"
#include "cuda/families.h"

namespace fx::cuda {

static Device devices[FX_CUDA_MAX_DEVICES];
static int device_total;

// ---- errors ----

static int is_sticky(cudaError_t err)
{
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
        return 1;
    default:
        return 0;
    }
}

int fail(Device *d, cudaError_t err, const char *what, fx_status *st)
{
    if (st->code == FX_OK)
        st->detail = (int)err;
    if (d && is_sticky(err) && !d->lost) {
        d->lost = 1;
        snprintf(d->lost_reason, sizeof d->lost_reason, "%s: %s", what, cudaGetErrorString(err));
    }
    if (!is_sticky(err))
        (void)cudaGetLastError(); // clear a non-sticky error so later calls work
    return fx_fail(st, FX_ECUDA, "%s failed: %s (%s)%s", what, cudaGetErrorString(err),
                   cudaGetErrorName(err),
                   is_sticky(err) ? "; the CUDA context is lost, restart the VM to use this GPU again"
                                  : "");
}

// The device current on this thread, so the hot path skips cudaSetDevice.
static __thread int thread_device = -1;

Device *enter(int dev, fx_status *st)
{
    if (dev < 0 || dev >= device_total) {
        fx_fail(st, FX_EINTERNAL, "no CUDA device %d", dev);
        return NULL;
    }
    Device *d = &devices[dev];
    if (d->lost) {
        st->detail = (int)cudaErrorIllegalAddress;
        fx_fail(st, FX_ECUDA, "cuda:%d is unusable after an earlier fault (%s)", dev, d->lost_reason);
        return NULL;
    }
    if (thread_device != d->ordinal) {
        cudaError_t err = cudaSetDevice(d->ordinal);
        if (err != cudaSuccess) {
            fail(d, err, "cudaSetDevice", st);
            return NULL;
        }
        thread_device = d->ordinal;
    }
    return d;
}

// A stream of fusex's own is only ever used with its device made current by
// enter. A caller's stream comes from a thread whose current device
// someone else sets (XLA switches contexts on its threads), so the cached
// device of this thread cannot be trusted: ask the runtime.
int enter(const fx_exec *ex, Run *run, fx_status *st)
{
    const int dev = ex->device;
    if (dev >= 0 && dev < device_total && ex->stream != (void *)devices[dev].stream) {
        int current = -1;
        if (cudaGetDevice(&current) != cudaSuccess) {
            (void)cudaGetLastError();
            current = -1;
        }
        thread_device = current;
    }
    run->d = enter(dev, st);
    run->stream = (cudaStream_t)ex->stream;
    run->ex = ex;
    return run->d ? FX_OK : st->code;
}

// ---- pinned staging: host <-> device copies go through a few reusable
// page-locked slots, so the DMA runs at full speed and an upload returns as
// soon as the source bytes are in a slot ----

#define STAGE_SLOTS 8
#define STAGE_CHUNK ((size_t)2 << 20)
// One thread copies ~10-14 GB/s between pageable and pinned memory, less
// than the ~50 GB/s the DMA engine moves, so large chunks are copied by a
// few threads at once; small ones are not worth waking them for.
#define PARALLEL_COPY_MIN ((size_t)512 << 10)
#define PARALLEL_COPY_PIECE ((size_t)128 << 10)
#define PARALLEL_COPY_THREADS 8

struct Staging {
    pthread_mutex_t lock;
    int ready;
    unsigned next;
    void *host[STAGE_SLOTS];
    cudaEvent_t done[STAGE_SLOTS];
};

static Staging stages[FX_CUDA_MAX_DEVICES];

static void host_copy(char *dst, const char *src, size_t n)
{
    if (n < PARALLEL_COPY_MIN) {
        memcpy(dst, src, n);
        return;
    }
    long pieces = (long)((n + PARALLEL_COPY_PIECE - 1) / PARALLEL_COPY_PIECE);
    int threads = omp_get_num_procs() / 2;
    threads = threads < 1 ? 1 : threads > PARALLEL_COPY_THREADS ? PARALLEL_COPY_THREADS : threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < pieces; i++) {
        size_t off = (size_t)i * PARALLEL_COPY_PIECE;
        memcpy(dst + off, src + off, n - off < PARALLEL_COPY_PIECE ? n - off : PARALLEL_COPY_PIECE);
    }
}

static int staging_ready(Device *d, Staging *s, fx_status *st)
{
    if (s->ready)
        return FX_OK;
    for (int i = 0; i < STAGE_SLOTS; i++) {
        FX_CUDA_TRY(d, cudaHostAlloc(&s->host[i], STAGE_CHUNK, cudaHostAllocPortable),
                    "cudaHostAlloc (pinned staging)", st);
        FX_CUDA_TRY(d, cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming),
                    "cudaEventCreate (staging)", st);
    }
    s->ready = 1;
    return FX_OK;
}

static int upload_chunks(Device *d, Staging *s, char *dst, const char *src, size_t n,
                         fx_status *st)
{
    for (size_t off = 0; off < n; off += STAGE_CHUNK) {
        size_t len = n - off < STAGE_CHUNK ? n - off : STAGE_CHUNK;
        unsigned slot = s->next++ % STAGE_SLOTS;
        FX_CUDA_TRY(d, cudaEventSynchronize(s->done[slot]), "waiting for a staging slot", st);
        host_copy((char *)s->host[slot], src + off, len);
        FX_CUDA_TRY(d, cudaMemcpyAsync(dst + off, s->host[slot], len, cudaMemcpyHostToDevice, d->stream),
                    "cudaMemcpyAsync (upload)", st);
        FX_CUDA_TRY(d, cudaEventRecord(s->done[slot], d->stream), "cudaEventRecord (upload)", st);
    }
    return FX_OK;
}

static int issue_download(Device *d, Staging *s, unsigned slot, const char *src,
                          size_t len, fx_status *st)
{
    FX_CUDA_TRY(d, cudaMemcpyAsync(s->host[slot], src, len, cudaMemcpyDeviceToHost, d->stream),
                "cudaMemcpyAsync (download)", st);
    FX_CUDA_TRY(d, cudaEventRecord(s->done[slot], d->stream), "cudaEventRecord (download)", st);
    return FX_OK;
}

// Keeps up to STAGE_SLOTS chunks in flight: while the host copies chunk i
// out of its slot, the DMA engine fills the slots of the chunks after it.
static int download_chunks(Device *d, Staging *s, char *dst, const char *src, size_t n,
                           fx_status *st)
{
    size_t chunks = (n + STAGE_CHUNK - 1) / STAGE_CHUNK;
    unsigned base = s->next;
    s->next += (unsigned)chunks;
    for (size_t i = 0; i < chunks && i < STAGE_SLOTS; i++) {
        size_t len = n - i * STAGE_CHUNK < STAGE_CHUNK ? n - i * STAGE_CHUNK : STAGE_CHUNK;
        if (issue_download(d, s, (base + (unsigned)i) % STAGE_SLOTS, src + i * STAGE_CHUNK, len, st))
            return st->code;
    }
    for (size_t i = 0; i < chunks; i++) {
        unsigned slot = (base + (unsigned)i) % STAGE_SLOTS;
        size_t off = i * STAGE_CHUNK;
        size_t len = n - off < STAGE_CHUNK ? n - off : STAGE_CHUNK;
        FX_CUDA_TRY(d, cudaEventSynchronize(s->done[slot]), "waiting for a download", st);
        host_copy(dst + off, (const char *)s->host[slot], len);
        size_t next = i + STAGE_SLOTS;
        if (next < chunks) {
            size_t next_off = next * STAGE_CHUNK;
            size_t next_len = n - next_off < STAGE_CHUNK ? n - next_off : STAGE_CHUNK;
            if (issue_download(d, s, slot, src + next_off, next_len, st))
                return st->code;
        }
    }
    return FX_OK;
}

typedef int (*transfer_fn)(Device *, Staging *, char *, const char *, size_t, fx_status *);

static int staged_transfer(int dev, transfer_fn fn, void *dst, const void *src, size_t n,
                           fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    Staging *s = &stages[dev];
    pthread_mutex_lock(&s->lock);
    int rc = staging_ready(d, s, st);
    if (rc == FX_OK)
        rc = fn(d, s, (char *)dst, (const char *)src, n, st);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

// The upload of a small table (an optimizer's slots) from a normal Erlang
// scheduler: only when the staging lock is free and the slots it needs have
// finished their last copies, so that nothing below waits.
#define TRY_UPLOAD_MAX PARALLEL_COPY_MIN

static bool slots_free(Staging *s, size_t chunks)
{
    for (size_t i = 0; i < chunks; i++) {
        cudaError_t err = cudaEventQuery(s->done[(s->next + i) % STAGE_SLOTS]);
        if (err != cudaSuccess) {
            if (err == cudaErrorNotReady)
                (void)cudaGetLastError();
            return false; // any other error shows in the waiting upload
        }
    }
    return true;
}

static int cuda_try_upload(int dev, void *dst, const void *src, size_t n, bool *done, fx_status *st)
{
    *done = false;
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    Staging *s = &stages[dev];
    if (n >= TRY_UPLOAD_MAX || pthread_mutex_trylock(&s->lock) != 0)
        return FX_OK;
    int rc = FX_OK;
    if (s->ready && slots_free(s, (n + STAGE_CHUNK - 1) / STAGE_CHUNK)) {
        rc = upload_chunks(d, s, (char *)dst, (const char *)src, n, st);
        *done = rc == FX_OK;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

// A small download from a normal Erlang scheduler: once the work stream is
// idle, everything that wrote the source has finished, and the copy goes on
// a stream of its own, so that work enqueued meanwhile by other callers does
// not hold it up: it waits only for its own few kilobytes
// (FX_TRY_DOWNLOAD_MAX).
static int cuda_try_download(int dev, void *dst, const void *src, size_t n, bool *done,
                             fx_status *st)
{
    *done = false;
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    if (n > FX_TRY_DOWNLOAD_MAX)
        return FX_OK;
    cudaError_t err = cudaStreamQuery(d->stream);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return FX_OK;
    }
    if (err != cudaSuccess)
        return fail(d, err, "cudaStreamQuery", st);
    FX_CUDA_TRY(d, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, d->copy_stream),
                "cudaMemcpyAsync (small download)", st);
    FX_CUDA_TRY(d, cudaStreamSynchronize(d->copy_stream), "cudaStreamSynchronize (small download)", st);
    *done = true;
    return FX_OK;
}

// ---- the table ----

static int init_devices(fx_status *st)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return fx_fail(st, FX_ECUDA, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                       cudaGetErrorName(err));
    }
    if (count > FX_CUDA_MAX_DEVICES)
        count = FX_CUDA_MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        Device *d = &devices[i];
        d->ordinal = i;
        cudaDeviceProp prop;
        FX_CUDA_TRY(d, cudaSetDevice(i), "cudaSetDevice", st);
        FX_CUDA_TRY(d, cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties", st);
        d->sm_count = prop.multiProcessorCount;
        d->max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
        d->shared_per_block_optin = prop.sharedMemPerBlockOptin;
        FX_CUDA_TRY(d, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking),
                    "cudaStreamCreate", st);
        FX_CUDA_TRY(d, cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking),
                    "cudaStreamCreate (copies)", st);
        // Keep freed blocks in the pool: allocation then costs no driver call.
        cudaMemPool_t pool;
        FX_CUDA_TRY(d, cudaDeviceGetDefaultMemPool(&pool, i), "cudaDeviceGetDefaultMemPool", st);
        uint64_t keep = UINT64_MAX;
        FX_CUDA_TRY(d, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
                    "cudaMemPoolSetAttribute", st);
        pthread_mutex_init(&stages[i].lock, NULL);
        pthread_mutex_init(&d->cache.lock, NULL);
        device_total = i + 1;
    }
    return FX_OK;
}

// The backend may be initialised by more than one user in a process (the
// NIF, and the XLA handlers' library, which loads this same file): the
// devices, streams and staging are made once, and every later call gets
// the first call's outcome.
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static fx_status init_status;

static void init_devices_once(void)
{
    fx_status_clear(&init_status);
    (void)init_devices(&init_status);
}

static int cuda_init(fx_status *st)
{
    pthread_once(&init_once, init_devices_once);
    if (init_status.code != FX_OK)
        return fx_fail(st, init_status.code, "%s", init_status.msg);
    return FX_OK;
}

static void cuda_shutdown(void)
{
    for (int i = 0; i < device_total; i++) {
        fx_status st;
        fx_status_clear(&st);
        Device *d = enter(i, &st);
        if (!d)
            continue;
        (void)cudaStreamSynchronize(d->stream);
        (void)cudaStreamSynchronize(d->copy_stream);
        pthread_mutex_lock(&d->cache.lock);
        if (d->cache.statuses)
            (void)cudaFree(d->cache.statuses);
        d->cache.statuses = NULL;
        d->cache.bytes = 0;
        pthread_mutex_unlock(&d->cache.lock);
        Staging *s = &stages[i];
        pthread_mutex_lock(&s->lock);
        if (s->ready) {
            for (int k = 0; k < STAGE_SLOTS; k++) {
                (void)cudaEventDestroy(s->done[k]);
                (void)cudaFreeHost(s->host[k]);
            }
            s->ready = 0;
        }
        pthread_mutex_unlock(&s->lock);
    }
    blas::shutdown();
}

static int cuda_device_count(void) { return device_total; }

static int cuda_device_info(int dev, fx_device_info *info, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    cudaDeviceProp prop;
    FX_CUDA_TRY(d, cudaGetDeviceProperties(&prop, d->ordinal), "cudaGetDeviceProperties", st);
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    size_t free_bytes = 0, total_bytes = 0;
    FX_CUDA_TRY(d, cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", st);
    info->memory_total = total_bytes;
    info->memory_free = free_bytes;
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
    info->multiprocessors = prop.multiProcessorCount;
    return FX_OK;
}

static int cuda_alloc(int dev, size_t nbytes, void **ptr, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaMallocAsync(ptr, nbytes, d->stream), "cudaMallocAsync", st);
    return FX_OK;
}

static void cuda_release(int dev, void *ptr)
{
    fx_status st;
    fx_status_clear(&st);
    Device *d = enter(dev, &st);
    if (d && cudaFreeAsync(ptr, d->stream) != cudaSuccess)
        (void)cudaGetLastError(); // nothing to report to: a destructor has no caller
}

static int cuda_upload(int dev, void *dst, const void *src, size_t n, fx_status *st)
{
    return staged_transfer(dev, upload_chunks, dst, src, n, st);
}

static int cuda_download(int dev, void *dst, const void *src, size_t n, fx_status *st)
{
    return staged_transfer(dev, download_chunks, dst, src, n, st);
}

static int cuda_copy(const fx_exec *ex, void *dst, const void *src, size_t n, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    FX_CUDA_TRY(r.d, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, r.stream),
                "cudaMemcpyAsync (device to device)", st);
    return FX_OK;
}

static int cuda_fill_zero(const fx_exec *ex, void *dst, size_t n, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    FX_CUDA_TRY(r.d, cudaMemsetAsync(dst, 0, n, r.stream), "cudaMemsetAsync", st);
    return FX_OK;
}

// fusex's own scratch: the device's stream-ordered pool, on its stream.
static int pool_scratch_alloc(void *ctx, size_t nbytes, void **ptr, fx_status *st)
{
    Device *d = static_cast<Device *>(ctx);
    FX_CUDA_TRY(d, cudaMallocAsync(ptr, nbytes, d->stream), "cudaMallocAsync", st);
    return FX_OK;
}

static void pool_scratch_release(void *ctx, void *ptr)
{
    Device *d = static_cast<Device *>(ctx);
    if (cudaFreeAsync(ptr, d->stream) != cudaSuccess)
        (void)cudaGetLastError(); // a sticky error has already been reported by the work
}

static int cuda_stream_create(int dev, void **stream, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaStreamCreateWithFlags((cudaStream_t *)stream, cudaStreamNonBlocking), "cudaStreamCreate", st);
    return FX_OK;
}

static void cuda_stream_destroy(int dev, void *stream)
{
    fx_status st;
    fx_status_clear(&st);
    if (enter(dev, &st) && cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_stream_synchronize(int dev, void *stream, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize", st);
    return FX_OK;
}

static int cuda_exec_default(int dev, fx_exec *ex, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    ex->device = dev;
    ex->stream = d->stream;
    ex->scratch.alloc = pool_scratch_alloc;
    ex->scratch.release = pool_scratch_release;
    ex->scratch.ctx = d;
    ex->cache = &d->cache;
    return FX_OK;
}

static int cuda_synchronize(int dev, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaStreamSynchronize(d->stream), "cudaStreamSynchronize", st);
    return FX_OK;
}

static int cuda_is_idle(int dev, int *idle, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    cudaError_t err = cudaStreamQuery(d->stream);
    *idle = err == cudaSuccess;
    if (err == cudaSuccess || err == cudaErrorNotReady) {
        if (err == cudaErrorNotReady)
            (void)cudaGetLastError();
        return FX_OK;
    }
    return fail(d, err, "cudaStreamQuery", st);
}

static int cuda_event_create(int dev, void **event, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaEventCreate((cudaEvent_t *)event), "cudaEventCreate", st);
    return FX_OK;
}

static void cuda_event_destroy(int dev, void *event)
{
    fx_status st;
    fx_status_clear(&st);
    if (enter(dev, &st))
        (void)cudaEventDestroy((cudaEvent_t)event);
}

static int cuda_event_record(int dev, void *event, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaEventRecord((cudaEvent_t)event, d->stream), "cudaEventRecord", st);
    return FX_OK;
}

static int cuda_event_elapsed_us(int dev, void *start, void *stop, double *us, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    float ms = 0;
    FX_CUDA_TRY(d, cudaEventSynchronize((cudaEvent_t)stop), "cudaEventSynchronize", st);
    FX_CUDA_TRY(d, cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)stop),
                "cudaEventElapsedTime", st);
    *us = (double)ms * 1000.0;
    return FX_OK;
}

__global__ void busy_wait_kernel(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

static int cuda_busy_wait(int dev, double us, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    busy_wait_kernel<<<1, 1, 0, d->stream>>>((unsigned long long)(us * 1000.0));
    return check_launch(d, "busy_wait kernel", st);
}

// ---- CUDA graphs (a model's frame: captured once, replayed as one launch) ----

static int cuda_graph_begin(int dev, void *stream, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    // Thread-local: only this thread's unsafe calls (a synchronize, a
    // cudaMalloc) spoil the capture; other threads keep using the device.
    FX_CUDA_TRY(d, cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal),
                "cudaStreamBeginCapture", st);
    return FX_OK;
}

static int cuda_graph_end(int dev, void *stream, void **out, fx_status *st)
{
    *out = NULL;
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    cudaGraph_t graph = NULL;
    // Ends the capture even when it was spoiled (then graph is NULL), so the
    // stream takes plain work again.
    const cudaError_t ended = cudaStreamEndCapture((cudaStream_t)stream, &graph);
    if (ended != cudaSuccess) {
        if (graph)
            (void)cudaGraphDestroy(graph);
        return fail(d, ended, "cudaStreamEndCapture", st);
    }
    cudaGraphExec_t exec = NULL;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph); // the executable graph keeps what it needs
    if (made != cudaSuccess)
        return fail(d, made, "cudaGraphInstantiate", st);
    *out = exec;
    return FX_OK;
}

static int cuda_graph_launch(int dev, void *graph, void *stream, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaGraphLaunch((cudaGraphExec_t)graph, stream ? (cudaStream_t)stream : d->stream),
                "cudaGraphLaunch", st);
    return FX_OK;
}

static void cuda_graph_destroy(int dev, void *graph)
{
    fx_status st;
    fx_status_clear(&st);
    // A graph still in flight is freed once its work completes.
    if (graph && enter(dev, &st) && cudaGraphExecDestroy((cudaGraphExec_t)graph) != cudaSuccess)
        (void)cudaGetLastError();
}

static const fx_backend cuda_backend = {
    .abi_version = FX_ABI_VERSION,
    .struct_size = sizeof(fx_backend),
    .name = "cuda",
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .device_count = cuda_device_count,
    .device_info = cuda_device_info,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .exec_default = cuda_exec_default,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .copy = cuda_copy,
    .fill_zero = cuda_fill_zero,
    .synchronize = cuda_synchronize,
    .is_idle = cuda_is_idle,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_elapsed_us = cuda_event_elapsed_us,
    .busy_wait = cuda_busy_wait,
    .cast = cast,
    .binary = binary,
    .scale = scale,
    .ssm = &ssm_ops,
    .linrec = &linrec_ops,
    .optim = &optim_ops,
    .rnn = &rnn_ops,
    .conv = &conv_ops,
    .norm = &norm_ops,
    .linear = &linear_ops,
    .loss = &loss_ops,
    .alloc_exportable = alloc_exportable,
    .release_exportable = release_exportable,
    .ipc_export = ipc_export,
    .ipc_open = ipc_open,
    .ipc_close = ipc_close,
    .device_synchronize = device_synchronize,
    .pointer_check = pointer_check,
    .try_upload = cuda_try_upload,
    .try_download = cuda_try_download,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
};

} // namespace fx::cuda

extern "C" __attribute__((visibility("default"))) const fx_backend *fusex_cuda_backend(void)
{
    return &fx::cuda::cuda_backend;
}
