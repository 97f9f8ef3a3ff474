// The emulated CUDA backend (test/emu/emu.h): what c_src/cuda/backend.cu
// is to the launchers, on host memory. Its table is the CPU backend's (the
// memory ops, the synchronous stream) with the CUDA launchers' families
// and elementwise ops; new allocations and scratch read as NaN, as memory
// a GPU hands out holds whatever was there.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <new>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/families.h"
#include "fusex_cpu.h"
#include "run.h"

namespace {

// One device, small: the launchers size grids and tiles by its SMs, so a
// few keep the grids of test shapes short and still several blocks wide.
fx::cuda::Device device;
fx_backend table;

int emu_init(fx_status *st)
{
    if (fx_cpu_backend.init(st) != FX_OK)
        return st->code;
    const char *sms = getenv("FUSEX_EMU_SMS");
    device.ordinal = 0;
    device.sm_count = sms && atoi(sms) > 0 ? atoi(sms) : 4;
    device.max_threads_per_sm = 2048;
    device.shared_per_block_optin = 227 * 1024;
    pthread_mutex_init(&device.cache.lock, nullptr);
    fprintf(stderr, "fusex CUDA emulator: cuda:0 is the real launchers on the CPU (%d SMs; %s)\n", device.sm_count,
            fx_emu::describe().c_str());
    return FX_OK;
}

void emu_shutdown(void)
{
    fx_emu::release_all();
    free(device.cache.statuses);
    device.cache.statuses = nullptr;
    device.cache.bytes = 0;
    fx_cpu_backend.shutdown();
}

int emu_device_count(void) { return 1; }

int emu_device_info(int dev, fx_device_info *info, fx_status *st)
{
    if (fx_cpu_backend.device_info(dev, info, st) != FX_OK)
        return st->code;
    snprintf(info->name, sizeof info->name, "CUDA emulated on the CPU (%d SMs)", device.sm_count);
    info->compute_major = 9;
    info->compute_minor = 0;
    info->multiprocessors = device.sm_count;
    info->threads = 0;
    return FX_OK;
}

int emu_alloc(int dev, size_t nbytes, void **ptr, fx_status *st)
{
    if (fx_cpu_backend.alloc(dev, nbytes, ptr, st) != FX_OK)
        return st->code;
    memset(*ptr, 0xff, nbytes);
    return FX_OK;
}

int poisoned_scratch(void *, size_t nbytes, void **ptr, fx_status *st)
{
    const size_t rounded = fx_scratch_piece(nbytes);
    *ptr = rounded == SIZE_MAX ? nullptr : aligned_alloc(FX_SCRATCH_ALIGN, rounded);
    if (!*ptr)
        return fx_fail(st, FX_ENOMEM, "out of host memory for %zu bytes of scratch", nbytes);
    memset(*ptr, 0xff, rounded);
    return FX_OK;
}

void release_scratch(void *, void *ptr) { free(ptr); }

// fusex's own stream: scratch from the heap, the stream's look-back cache.
int emu_exec_default(int dev, fx_exec *ex, fx_status *st)
{
    if (!fx::cuda::enter(dev, st))
        return st->code;
    ex->device = dev;
    ex->stream = nullptr;
    ex->scratch.alloc = poisoned_scratch;
    ex->scratch.release = release_scratch;
    ex->scratch.ctx = nullptr;
    ex->cache = &device.cache;
    return FX_OK;
}

// A caller's stream (test_exec.c's lanes): a token, since all work is done
// by the time a launch returns.
int emu_stream_create(int, void **stream, fx_status *st)
{
    *stream = malloc(1);
    return *stream ? FX_OK : fx_fail(st, FX_ENOMEM, "out of host memory for a stream");
}

void emu_stream_destroy(int, void *stream) { free(stream); }

int emu_stream_synchronize(int, void *, fx_status *) { return FX_OK; }

// ---- CUDA graphs: a capture records the work enqueued on its stream from
// this thread (cuda/launch.cuh, blas.cc, the table's copies and fills), a
// graph is that record, its launch runs it. As cudaStreamCaptureModeThread
// Local, a synchronising call on the capturing thread (a synchronize, a
// download) fails and spoils the capture, whose end then fails.
// FUSEX_EMU_GRAPH=fail makes every capture's end fail as a spoiled one
// does (the callers' fallbacks); =off leaves the table without graphs. ----

struct Capture {
    const void *stream = nullptr;
    std::vector<fx_emu::work> work;
    const char *spoiled_by = nullptr;
};

thread_local Capture *capture;

struct Graph {
    std::vector<fx_emu::work> work;
};

// A call a capture forbids: fails (and spoils the capture) where this thread
// is capturing.
int unsafe_in_capture(const char *what, fx_status *st)
{
    if (!capture)
        return FX_OK;
    if (!capture->spoiled_by)
        capture->spoiled_by = what;
    return fx_fail(st, FX_ECUDA, "%s failed: operation not permitted when stream is capturing "
                                 "(cudaErrorStreamCaptureUnsupported)", what);
}

int emu_graph_begin(int, void *stream, fx_status *st)
{
    if (capture)
        return fx_fail(st, FX_ECUDA, "cudaStreamBeginCapture failed: this thread is capturing already "
                                     "(cudaErrorIllegalState)");
    capture = new (std::nothrow) Capture;
    if (!capture)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a capture");
    capture->stream = stream;
    return FX_OK;
}

int emu_graph_end(int, void *stream, void **out, fx_status *st)
{
    *out = nullptr;
    if (!capture || capture->stream != stream)
        return fx_fail(st, FX_ECUDA, "cudaStreamEndCapture failed: the stream is not capturing "
                                     "(cudaErrorIllegalState)");
    Capture *done = capture;
    capture = nullptr;
    const char *forced = getenv("FUSEX_EMU_GRAPH");
    const char *spoiled = done->spoiled_by    ? done->spoiled_by
                          : forced && strcmp(forced, "fail") == 0 ? "FUSEX_EMU_GRAPH=fail"
                                                                  : nullptr;
    Graph *g = spoiled ? nullptr : new (std::nothrow) Graph;
    if (g)
        g->work = std::move(done->work);
    delete done;
    if (spoiled)
        return fx_fail(st, FX_ECUDA, "cudaStreamEndCapture failed: operation failed due to a previous error "
                                     "during capture (cudaErrorStreamCaptureInvalidated; %s)", spoiled);
    if (!g)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a graph");
    *out = g;
    return FX_OK;
}

int emu_graph_launch(int, void *graph, void *, fx_status *st)
{
    if (capture)
        return unsafe_in_capture("cudaGraphLaunch (on another stream)", st);
    for (const fx_emu::work &w : static_cast<Graph *>(graph)->work)
        if (w(st) != FX_OK)
            return st->code;
    return FX_OK;
}

void emu_graph_destroy(int, void *graph) { delete static_cast<Graph *>(graph); }

int emu_copy(const fx_exec *ex, void *dst, const void *src, size_t n, fx_status *st)
{
    if (!fx_emu::capturing(ex->stream))
        return fx_cpu_backend.copy(ex, dst, src, n, st);
    fx_emu::record([dst, src, n](fx_status *) { return n ? (memcpy(dst, src, n), FX_OK) : FX_OK; });
    return FX_OK;
}

int emu_fill_zero(const fx_exec *ex, void *dst, size_t n, fx_status *st)
{
    if (!fx_emu::capturing(ex->stream))
        return fx_cpu_backend.fill_zero(ex, dst, n, st);
    fx_emu::record([dst, n](fx_status *) { return n ? (memset(dst, 0, n), FX_OK) : FX_OK; });
    return FX_OK;
}

int emu_download(int dev, void *dst, const void *src, size_t n, fx_status *st)
{
    return unsafe_in_capture("cudaMemcpy (download)", st) ? st->code : fx_cpu_backend.download(dev, dst, src, n, st);
}

int emu_synchronize(int dev, fx_status *st)
{
    return unsafe_in_capture("cudaStreamSynchronize", st) ? st->code : fx_cpu_backend.synchronize(dev, st);
}

int emu_stream_synchronize_checked(int dev, void *stream, fx_status *st)
{
    return unsafe_in_capture("cudaStreamSynchronize", st) ? st->code : emu_stream_synchronize(dev, stream, st);
}

} // namespace

namespace fx_emu {

bool capturing(const void *stream) { return capture && stream && capture->stream == stream; }

void record(work w) { capture->work.push_back(std::move(w)); }

} // namespace fx_emu

// ---- what backend.cu gives the launchers (cuda/common.cuh) ----

namespace fx::cuda {

Device *enter(int dev, fx_status *st)
{
    if (dev != 0) {
        fx_fail(st, FX_EINTERNAL, "no CUDA device %d", dev);
        return nullptr;
    }
    return &device;
}

int enter(const fx_exec *ex, Run *run, fx_status *st)
{
    run->d = enter(ex->device, st);
    run->stream = (cudaStream_t)ex->stream;
    run->ex = ex;
    return run->d ? FX_OK : st->code;
}

int fail(Device *, cudaError_t err, const char *what, fx_status *st)
{
    if (st->code == FX_OK)
        st->detail = (int)err;
    return fx_fail(st, FX_ECUDA, "%s failed: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

} // namespace fx::cuda

// ---- the CUDA runtime entry points the launchers reach ----

extern "C" {

cudaError_t cudaGetLastError(void) { return (cudaError_t)fx_emu::take_last_error(); }

const char *cudaGetErrorName(cudaError_t err)
{
    switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorCooperativeLaunchTooLarge: return "cudaErrorCooperativeLaunchTooLarge";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch";
    default: return "unknown error";
    }
}

// What the runtime loads (FX_CUDA_BACKEND_SYMBOL), as priv/fusex_cuda.so.
__attribute__((visibility("default"))) const fx_backend *fusex_cuda_backend(void)
{
    table = fx_cpu_backend;
    table.name = "cuda (emulated)"; // the tests size their sweeps by it (fx_test_emulated)
    table.init = emu_init;
    table.shutdown = emu_shutdown;
    table.device_count = emu_device_count;
    table.device_info = emu_device_info;
    table.alloc = emu_alloc;
    table.exec_default = emu_exec_default;
    table.stream_create = emu_stream_create;
    table.stream_destroy = emu_stream_destroy;
    table.stream_synchronize = emu_stream_synchronize_checked;
    table.copy = emu_copy;
    table.fill_zero = emu_fill_zero;
    table.download = emu_download;
    table.synchronize = emu_synchronize;
    const char *graphs = getenv("FUSEX_EMU_GRAPH");
    if (!graphs || strcmp(graphs, "off") != 0) {
        table.graph_begin = emu_graph_begin;
        table.graph_end = emu_graph_end;
        table.graph_launch = emu_graph_launch;
        table.graph_destroy = emu_graph_destroy;
    }
    table.cast = fx::cuda::cast;
    table.binary = fx::cuda::binary;
    table.scale = fx::cuda::scale;
    table.ssm = &fx::cuda::ssm_ops;
    table.linrec = &fx::cuda::linrec_ops;
    table.optim = &fx::cuda::optim_ops;
    table.linear = &fx::cuda::linear_ops;
    table.norm = &fx::cuda::norm_ops;
    table.conv = &fx::cuda::conv_ops;
    table.rnn = &fx::cuda::rnn_ops;
    table.loss = &fx::cuda::loss_ops;
    return &table;
}

} // extern "C"
