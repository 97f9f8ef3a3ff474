// Pointer interop on CUDA: exportable (cudaMalloc) memory, legacy IPC
// handles (cudaIpcMemHandle_t, what EXLA and PyTorch exchange), a device-wide
// synchronize to order foreign work, and checks of foreign addresses.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/families.h"

namespace fx::cuda {

// ---- exportable memory: the stream-ordered pool's blocks have no legacy
// IPC handle, so a tensor meant for another process gets its own cudaMalloc
// allocation (its handle then maps exactly this tensor, at offset 0) ----

int alloc_exportable(int dev, size_t nbytes, void **ptr, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaMalloc(ptr, nbytes), "cudaMalloc (ipc => true)", st);
    return FX_OK;
}

void release_exportable(int dev, void *ptr)
{
    fx_status st;
    fx_status_clear(&st);
    // Work on any stream (fusex's, or a reader's in this process) may still
    // use it: cudaFree is not stream-ordered, so wait for the device first.
    if (enter(dev, &st)) {
        if (cudaDeviceSynchronize() != cudaSuccess || cudaFree(ptr) != cudaSuccess)
            (void)cudaGetLastError(); // a destructor has no caller to tell
    }
}

// ---- IPC handles ----

int ipc_export(int dev, void *ptr, unsigned char handle[FX_IPC_HANDLE_SIZE],
                       fx_status *st)
{
    static_assert(sizeof(cudaIpcMemHandle_t) == FX_IPC_HANDLE_SIZE, "IPC handle size");
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    cudaIpcMemHandle_t h;
    FX_CUDA_TRY(d, cudaIpcGetMemHandle(&h, ptr), "cudaIpcGetMemHandle", st);
    memcpy(handle, &h, FX_IPC_HANDLE_SIZE);
    return FX_OK;
}

// cuMemGetAddressRange through the runtime's driver entry point: the
// runtime API has no way to ask how large an allocation is, and the
// backend links no libcuda (it finds the driver at run time).
static PFN_cuMemGetAddressRange_v3020 address_range_fn;
static pthread_once_t address_range_once = PTHREAD_ONCE_INIT;

static void load_address_range(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
        address_range_fn = (PFN_cuMemGetAddressRange_v3020)fn;
    else
        (void)cudaGetLastError();
}

// The allocation holding `ptr` (base and size); false when the driver
// cannot say.
static bool allocation_of(const void *ptr, uintptr_t *base, size_t *size)
{
    pthread_once(&address_range_once, load_address_range);
    if (!address_range_fn)
        return false;
    CUdeviceptr b = 0;
    size_t s = 0;
    if (address_range_fn(&b, &s, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
        return false;
    *base = (uintptr_t)b;
    *size = s;
    return true;
}

int ipc_open(int dev, const unsigned char handle[FX_IPC_HANDLE_SIZE], void **ptr,
                     size_t *nbytes, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, FX_IPC_HANDLE_SIZE);
    cudaError_t err = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
        fail(d, err, "cudaIpcOpenMemHandle", st);
        // The usual causes, which the driver's message does not name.
        size_t used = strlen(st->msg);
        snprintf(st->msg + used, sizeof st->msg - used,
                 " (a handle opens only in another process than the one that exported it, on the "
                 "device it lives on, while the exporter keeps the memory)");
        return st->code;
    }
    uintptr_t base;
    size_t size;
    *nbytes = allocation_of(*ptr, &base, &size) && base == (uintptr_t)*ptr ? size : 0;
    return FX_OK;
}

void ipc_close(int dev, void *ptr)
{
    fx_status st;
    fx_status_clear(&st);
    if (enter(dev, &st)) {
        // Work fusex queued on the mapping must finish before it goes.
        if (cudaDeviceSynchronize() != cudaSuccess || cudaIpcCloseMemHandle(ptr) != cudaSuccess)
            (void)cudaGetLastError();
    }
}

// ---- ordering and checks ----

int device_synchronize(int dev, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    FX_CUDA_TRY(d, cudaDeviceSynchronize(), "cudaDeviceSynchronize", st);
    return FX_OK;
}

static const char *memory_kind(cudaMemoryType t)
{
    switch (t) {
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeUnregistered: return "host memory that CUDA does not know";
    default: return "device memory";
    }
}

int pointer_check(int dev, const void *ptr, size_t nbytes, fx_status *st)
{
    Device *d = enter(dev, st);
    if (!d)
        return st->code;
    cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return fx_fail(st, FX_EBADARG, "pointer: expected memory of cuda:%d, got 0x%llx (%s)",
                       d->ordinal, (unsigned long long)(uintptr_t)ptr, cudaGetErrorString(err));
    }
    bool device_memory = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    if (!device_memory)
        return fx_fail(st, FX_EBADARG, "pointer: expected memory of cuda:%d, got %s at 0x%llx",
                       d->ordinal, memory_kind(attr.type), (unsigned long long)(uintptr_t)ptr);
    if (attr.device != d->ordinal)
        return fx_fail(st, FX_EBADARG, "pointer: expected memory of cuda:%d, got memory of cuda:%d",
                       d->ordinal, attr.device);
    uintptr_t base, addr = (uintptr_t)ptr;
    size_t size;
    if (allocation_of(ptr, &base, &size)) {
        size_t left = size - (size_t)(addr - base);
        if (nbytes > left)
            return fx_fail(st, FX_EBADARG,
                           "pointer: expected %zu bytes from 0x%llx, got %zu bytes to the end of its "
                           "CUDA allocation",
                           nbytes, (unsigned long long)addr, left);
    }
    return FX_OK;
}

} // namespace fx::cuda
