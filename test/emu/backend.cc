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

} // namespace

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
    table.stream_synchronize = emu_stream_synchronize;
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
    return &table;
}

} // extern "C"
