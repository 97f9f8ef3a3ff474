// A tiny CUDA emulator for checking kernel logic on a machine without a
// GPU: every CUDA thread of a block is a pthread, __syncthreads and
// __syncwarp are barriers, warp shuffles go through a per-warp exchange
// array, atomics and acquire/release are the compiler's atomics, and a few
// blocks run at once so that the look-back between tiles really waits.
// Only what cuda/scan.cuh and cuda/linrec_kernels.cuh use, and only f32.
#ifndef FX_CUDA_EMU_H
#define FX_CUDA_EMU_H

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

using std::max;
using std::min;

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
void *emu_stage(); // the block's dynamic shared memory (emu_launch's stage_bytes)
#define FXSCAN_SHARED(type, name) type &name = *static_cast<type *>(emu_shared(sizeof(type)))
#define FXSCAN_STAGE(name) unsigned char *name = static_cast<unsigned char *>(emu_stage())

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
// bar.sync id, threads: a barrier over `threads` threads of the block
// (whole warps), which the others need not reach.
void emu_bar_sync(int id, int threads);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
int __shfl_xor_sync(unsigned mask, int v, int lane_mask);
float __shfl_up_sync(unsigned mask, float v, unsigned delta);
int __all_sync(unsigned mask, int predicate);
void __nanosleep(unsigned ns);
float atomicAdd(float *p, float v);
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// Loads and stores with cache hints, of sequence data: each element is
// written by one thread and read after the launch, so plain copies. (Tile
// statuses go through scan.cuh's relaxed accesses, atomics here.)
template <typename T> inline T __ldcs(const T *p)
{
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}
template <typename T> inline void __stcs(T *p, T v) { memcpy(p, &v, sizeof v); }

// Runs `kernel` on a grid of `grid` blocks of `block` threads, at most
// `concurrent` blocks at a time, started in block order, each with
// `stage_bytes` of dynamic shared memory.
void emu_launch(unsigned grid, unsigned block, int concurrent, const std::function<void()> &kernel,
                size_t stage_bytes = 0);
// Random pauses inside barriers, so that blocks overtake each other.
void emu_set_jitter(int percent);

#endif
