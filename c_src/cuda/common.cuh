// Shared by every CUDA kernel family: per-device state (stream, properties),
// error reporting into fx_status, element load/store traits and launch
// helpers. One place, so a family file holds kernels and nothing else.
#ifndef FX_CUDA_COMMON_CUH
#define FX_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

#include "fusex.h"
#include "fusex_dtype.h"
#include "fusex_exec.h"

#define FX_CUDA_MAX_DEVICES 16

// What fusex keeps with its own stream of a device between launches
// (fx_exec.cache): look-back statuses, grown on demand, tagged by an epoch
// that every launch advances, so they are cleared only when they grow or
// the epoch wraps. Launches on the stream take the lock from preparing the
// statuses to enqueueing the kernel that uses them.
struct fx_stream_cache {
    pthread_mutex_t lock;
    void *statuses;
    size_t bytes;
    uint32_t epoch;
};

namespace fx::cuda {

struct Device {
    int ordinal;
    cudaStream_t stream;
    fx_stream_cache cache; // fusex's own stream's (fx_exec.cache)
    cudaStream_t copy_stream; // small downloads once `stream` is idle (try_download)
    int sm_count;
    int max_threads_per_sm;
    size_t shared_per_block_optin;
    int lost; // a sticky error poisoned the context: refuse further work
    char lost_reason[160];
};

// Device state for `dev`, made current on the calling thread; NULL (and st
// filled) if the device is unknown or its context was lost.
Device *enter(int dev, fx_status *st);

// A launch context as a CUDA launcher uses it: the device's record (its
// properties, whether it is lost), the caller's stream, and the context
// itself for scratch (launch.cuh).
struct Run {
    Device *d;
    cudaStream_t stream;
    const fx_exec *ex;
};

// Makes ex's device current on the calling thread and fills *run; the
// error in st when the device is unknown or lost.
int enter(const fx_exec *ex, Run *run, fx_status *st);

// Turns a CUDA error into FX_ECUDA with the code and a message naming what
// failed; marks the device lost if the error is sticky. Returns the status.
int fail(Device *d, cudaError_t err, const char *what, fx_status *st);

#define FX_CUDA_TRY(d, call, what, st)                                   \
    do {                                                                 \
        cudaError_t fx_err_ = (call);                                    \
        if (fx_err_ != cudaSuccess) return fx::cuda::fail(d, fx_err_, what, st); \
    } while (0)

// After a launch: a launch error (bad configuration, or an earlier
// asynchronous fault surfacing) becomes the op's status.
static inline int check_launch(Device *d, const char *what, fx_status *st)
{
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? FX_OK : fail(d, err, what, st);
}

// A grid for `n` independent items at `threads` per block, capped so that a
// grid-stride loop covers the rest without oversubscribing the chip.
static inline unsigned grid_for(const Device *d, int64_t n, int threads)
{
    int64_t blocks = (n + threads - 1) / threads;
    int64_t cap = (int64_t)d->sm_count * (d->max_threads_per_sm / threads) * 4;
    if (blocks > cap) blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

// ---- element traits: every storage type loads to and stores from its
// arithmetic type (float for the 16-bit floats) ----
template <typename T> struct Elem {
    typedef T math;
    __device__ __forceinline__ static T load(T v) { return v; }
    __device__ __forceinline__ static T store(T v) { return v; }
};
template <> struct Elem<__nv_bfloat16> {
    typedef float math;
    __device__ __forceinline__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ __forceinline__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Elem<__half> {
    typedef float math;
    __device__ __forceinline__ static float load(__half v) { return __half2float(v); }
    __device__ __forceinline__ static __half store(float v) { return __float2half_rn(v); }
};

// Parameters, states and reduced gradients come in any float type; each
// is read or written a few times per thread, so a switch on the type is
// cheaper than more kernels.
__device__ __forceinline__ float load_any(const void *p, int type, int64_t i)
{
    switch (type) {
    case FX_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case FX_F16: return __half2float(static_cast<const __half *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void store_any(void *p, int type, int64_t i, float v)
{
    switch (type) {
    case FX_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v); break;
    case FX_F16: static_cast<__half *>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float *>(p)[i] = v; break;
    }
}

} // namespace fx::cuda

#endif
