// A tiny CUDA emulator for checking kernel logic on a machine without a
// GPU: every CUDA thread of a block is a pthread, __syncthreads and
// __syncwarp are barriers, warp shuffles go through a per-warp exchange
// array, atomics and acquire/release are the compiler's atomics, and a few
// blocks run at once so that the look-back between tiles really waits.
// Only what cuda/scan.cuh and cuda/linrec_kernels.cuh use, and only f32.
#ifndef FX_CUDA_EMU_H
#define FX_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#define FXSCAN_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct emu_dim3 {
    unsigned x, y, z;
};
extern thread_local emu_dim3 threadIdx, blockIdx;
extern emu_dim3 blockDim, gridDim;

struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};

void *emu_shared(size_t bytes);
#define FXSCAN_SHARED(type, name) type &name = *static_cast<type *>(emu_shared(sizeof(type)))

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
unsigned __reduce_min_sync(unsigned mask, unsigned v);
void __nanosleep(unsigned ns);
float atomicAdd(float *p, float v);
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }

// Loads and stores with cache hints: relaxed atomics here, since other
// threads may write the same words (tile statuses).
template <typename T> inline T emu_load(const T *p)
{
    T v;
    __atomic_load(const_cast<T *>(p), &v, __ATOMIC_RELAXED);
    return v;
}
template <typename T> inline void emu_store(T *p, T v) { __atomic_store(p, &v, __ATOMIC_RELAXED); }
template <typename T> inline T __ldcs(const T *p) { return emu_load(p); }
template <typename T> inline T __ldcg(const T *p) { return emu_load(p); }
template <typename T> inline void __stcs(T *p, T v) { emu_store(p, v); }
template <typename T> inline void __stcg(T *p, T v) { emu_store(p, v); }

// Runs `kernel` on a grid of `grid` blocks of `block` threads, at most
// `concurrent` blocks at a time, started in block order.
void emu_launch(unsigned grid, unsigned block, int concurrent, const std::function<void()> &kernel);
// Random pauses inside barriers, so that blocks overtake each other.
void emu_set_jitter(int percent);

#endif
