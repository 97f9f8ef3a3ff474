// The CPU emulator of fusex's CUDA kernels (test infrastructure).
//
// What it is. build/emu/fusex_cuda.so stands in for priv/fusex_cuda.so:
// `make test-emu` runs the Check suites (build/fusex_check) with
// FUSEX_PRIV=build/emu FUSEX_DEVICE=cuda, so "cuda:0" is this emulated
// device and every CUDA branch of the suites runs, each result compared
// with the CPU backend on the same inputs. Its families and elementwise
// ops are the real launchers (every c_src/cuda/*.cu but backend.cu and
// interop.cu, compiled with g++ as C++) on the real kernels; its memory is
// host memory (the CPU backend's memory ops; new allocations and scratch
// read as NaN). Each launcher goes through its launch context as on a GPU
// (fusex's own stream with its look-back status cache, or a caller's with
// scratch from an arena: test_exec.c); only the way work is enqueued
// differs:
//
//   test/emu/emu.h          (this file) force-included before every
//                           emulator translation unit: FX_CUDA_EMULATION,
//                           threadIdx & co., barriers, shuffles, votes,
//                           atomics, cache-hinted loads and stores, cp.async
//   test/emu/cuda/launch.cuh  shadows c_src/cuda/launch.cuh (include-path
//                           order): a launch runs the grid at once, on the
//                           calling thread; fills and copies are memset/memcpy
//   test/emu/backend.cc     the backend table, the device record (4 SMs by
//                           default, FUSEX_EMU_SMS), fx::cuda::enter and
//                           fail, the few CUDA runtime entry points the
//                           launchers reach (cudaGetLastError & co.)
//   test/emu/emu.cc         the scheduler
//   test/emu/shared.ld      gathers the kernels' `__shared__` variables
//
// How a launch runs. Every CUDA thread of a block is a fiber (its own
// stack; switched with _setjmp/_longjmp), all on one OS thread: a fiber
// runs until it reaches a point where a GPU thread could wait (a barrier,
// a shuffle or vote, __nanosleep) and then yields. Several blocks are in
// flight at once (FUSEX_EMU_BLOCKS, default 4), started in index order as
// a GPU dispatches them; the scheduler gives each a pass in turn (every
// runnable fiber of the block once), so a block that spins on the status
// of an earlier one (the linrec look-back: relaxed loads and __nanosleep)
// really waits while that one progresses. A fiber waiting at a barrier is
// skipped until the barrier opens; a block none of whose fibers can run is
// a deadlock and aborts the run with what each waits on; a launch whose
// blocks spin for long without one finishing aborts as a livelock.
//
// Interleavings. With FUSEX_EMU_SEED set (`make test-emu` sets a fresh
// one and prints it), the order is random but replayable: each launch
// takes 1 to 2 * FUSEX_EMU_BLOCKS blocks in flight, each pass picks a
// block at random, runs its fibers forward, backward or shuffled, and may
// stop part-way; an asynchronous copy lands either when it is issued or
// when its group is waited for. FUSEX_EMU_SEED=0 gives the fixed order
// (round robin, lanes in order; FUSEX_EMU_REVERSE=1 runs every block's
// fibers last to first), cp.async landing at the wait. FUSEX_EMU_TRACE=1
// logs every launch (kernel, grid, block, shared memory) on stderr.
//
// Shared memory is poisoned (every byte 0xFF: NaN) before each block:
// the dynamic part, the linrec scan's FX_SCAN_SHARED block, and every
// `__shared__` variable a kernel declares (these are statics gathered
// into one linker section by shared.ld; the scheduler gives each block in
// flight its own copy, swapped in when the block runs). Writing past the
// dynamic shared memory a launch asked for aborts the run.
//
// Emulated: __syncthreads (and _or/_and/_count), named barriers
// (bar.sync id, n: fx_emu_bar_sync), __syncwarp, __shfl{,_up,_down,_xor}
// _sync with widths, __all/__any/__ballot_sync, atomics (float, double,
// int, unsigned, u64) and fences, __ldg/__ldcs/__ldcg/__ldca/__ldlu/
// __ldcv and __stcs/__stcg/__stwb/__stwt, cp.async with commit groups and
// wait_group (async_copy.cuh), the SFU ops (sfu.cuh: libm), 16-bit types
// (the CUDA headers' host conversions), launch errors (an empty grid, more
// than 1024 threads, dynamic shared memory past the device's opt-in or past
// 48 KB without it: the op fails as on a GPU); cooperative launches
// (launch_cooperative: every block of the grid in flight from the start,
// so blocks that wait for each other at a grid barrier do, and a grid
// larger than the device keeps resident by threads and shared memory is
// refused with cudaErrorCooperativeLaunchTooLarge); the tensor-core
// product mma.sync m16n8k16 (cuda/rnn/mma.cuh: without __CUDA_ARCH__ the
// lanes exchange their fragments by shuffles in the PTX ISA's layouts).
//
// Not emulated: timing and occupancy (only the device record's SM count,
// which the launchers' tiling reads, and the residency count a
// cooperative launch is checked against); thread-block clusters and
// distributed shared memory; the memory model beyond sequential
// consistency between yield points (a fiber's loads and stores between two
// yields are atomic to the others: races inside that window, missing
// fences and relaxed-ordering effects are invisible); independent thread
// scheduling inside a warp (lanes only meet at the warp's sync points);
// bank conflicts, alignment faults and out-of-bounds global accesses
// (a wild write corrupts host memory or crashes the test); a barrier
// reached at different __syncthreads by different threads (checked by
// compute-sanitizer's synccheck on a GPU, `make sanitize`); the asm paths
// under __CUDA_ARCH__ (the kernels' host fallbacks run instead: plain
// vector loads for ld.volatile.shared, libm for MUFU ops).
#ifndef FX_EMU_H
#define FX_EMU_H

// Kernel headers take their emulation paths under this (scan.cuh's relaxed
// status accesses, the streaming kernels' named barrier, async_copy.cuh,
// the selective scan's dynamic shared memory).
#define FX_CUDA_EMULATION 1

#ifdef __cplusplus

// A `__shared__` variable declared in a kernel is a static: the CUDA
// headers define __shared__ only where it is not defined yet.
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// Kernel helpers are forced inline for nvcc; g++ compiles the launchers
// several times faster where it may choose.
#undef __forceinline__
#define __forceinline__ inline

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

using std::isinf;
using std::isnan;

// fmaxf and fminf inline (g++ calls libm for them, a quarter of some
// kernels' time), with CUDA's rule: a NaN argument gives the other one.
inline float fx_emu_fmaxf(float a, float b) { return a != a ? b : b != b ? a : a > b ? a : b; }
inline float fx_emu_fminf(float a, float b) { return a != a ? b : b != b ? a : a < b ? a : b; }
#define fmaxf fx_emu_fmaxf
#define fminf fx_emu_fminf

// CUDA's min and max: overloads for every arithmetic pair.
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b)
{
    return b < a ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b)
{
    return a < b ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}

namespace fx_emu {

// The CUDA thread running now (emu.cc's fiber).
struct thread_pos {
    uint3 thread_idx, block_idx;
    unsigned lane, warp;
};
extern thread_pos *cur;
extern dim3 grid_dim, block_dim;

void syncthreads();
// __syncthreads_or (0), _and (1), _count (2).
int syncthreads_reduce(int predicate, int op);
void syncwarp();
// The bits of `v` as lane `src` of the caller's warp segment holds them;
// `how`: 0 idx, 1 up, 2 down, 3 xor (`arg` the lane, delta or mask).
uint64_t shuffle(uint64_t v, int how, int arg, int width);
// __all_sync (0), __any_sync (1), __ballot_sync (2).
unsigned vote(int predicate, int op);
// A point where a GPU thread spins: other blocks run before it goes on.
void spin();
void bar_sync(int id, int threads);
void *dynamic_smem();
void *scan_shared(size_t bytes);
void copy_async(void *dst, const void *src, int bytes, bool valid);
void copy_commit();
void copy_wait(int pending);
void copy_wait_all();

template <typename T> inline T shfl(T v, int how, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle moves up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = shuffle(bits, how, arg, width);
    memcpy(&v, &bits, sizeof v);
    return v;
}

} // namespace fx_emu

#define threadIdx (fx_emu::cur->thread_idx)
#define blockIdx (fx_emu::cur->block_idx)
#define blockDim (fx_emu::block_dim)
#define gridDim (fx_emu::grid_dim)
#define warpSize 32

// ---- barriers, shuffles, votes ----

inline void __syncthreads() { fx_emu::syncthreads(); }
inline int __syncthreads_or(int p) { return fx_emu::syncthreads_reduce(p, 0); }
inline int __syncthreads_and(int p) { return fx_emu::syncthreads_reduce(p, 1); }
inline int __syncthreads_count(int p) { return fx_emu::syncthreads_reduce(p, 2); }
// Every mask in the kernels is the whole warp.
inline void __syncwarp(unsigned = 0xffffffffu) { fx_emu::syncwarp(); }
template <typename T> inline T __shfl_sync(unsigned, T v, int lane, int width = 32)
{
    return fx_emu::shfl(v, 0, lane, width);
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32)
{
    return fx_emu::shfl(v, 1, (int)delta, width);
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32)
{
    return fx_emu::shfl(v, 2, (int)delta, width);
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32)
{
    return fx_emu::shfl(v, 3, mask, width);
}
inline int __all_sync(unsigned, int p) { return (int)fx_emu::vote(p, 0); }
inline int __any_sync(unsigned, int p) { return (int)fx_emu::vote(p, 1); }
inline unsigned __ballot_sync(unsigned, int p) { return fx_emu::vote(p, 2); }
inline void __nanosleep(unsigned) { fx_emu::spin(); }

// The streaming kernels' `bar.sync id, threads` (linrec).
inline void fx_emu_bar_sync(int id, int threads) { fx_emu::bar_sync(id, threads); }
// A block's dynamic shared memory (`extern __shared__`).
inline void *fx_emu_dynamic_smem() { return fx_emu::dynamic_smem(); }

// scan.cuh's shared block and staging (its FX_SCAN_* hooks): the block's.
#define FX_SCAN_SHARED(type, name) type &name = *static_cast<type *>(fx_emu::scan_shared(sizeof(type)))
#define FX_SCAN_STAGE(name) unsigned char *name = static_cast<unsigned char *>(fx_emu::dynamic_smem())

// cp.async (async_copy.cuh): copies land at the wait for their group (or,
// in a random interleaving, maybe when issued).
inline void fx_emu_copy_async(void *dst, const void *src, int bytes, bool valid)
{
    fx_emu::copy_async(dst, src, bytes, valid);
}
inline void fx_emu_copy_commit() { fx_emu::copy_commit(); }
inline void fx_emu_copy_wait(int pending) { fx_emu::copy_wait(pending); }
inline void fx_emu_copy_wait_all() { fx_emu::copy_wait_all(); }

// ---- atomics and fences: one OS thread runs every fiber, and a fiber
// is never switched out inside one ----

template <typename T> inline T fx_emu_fetch_add(T *p, T v)
{
    const T old = *p;
    *p = old + v;
    return old;
}
inline float atomicAdd(float *p, float v) { return fx_emu_fetch_add(p, v); }
inline double atomicAdd(double *p, double v) { return fx_emu_fetch_add(p, v); }
inline int atomicAdd(int *p, int v) { return fx_emu_fetch_add(p, v); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return fx_emu_fetch_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { return fx_emu_fetch_add(p, v); }
template <typename T> inline T atomicExch(T *p, T v)
{
    const T old = *p;
    *p = v;
    return old;
}
template <typename T> inline T atomicMax(T *p, T v)
{
    const T old = *p;
    *p = old < v ? v : old;
    return old;
}
template <typename T> inline T atomicCAS(T *p, T compare, T v)
{
    const T old = *p;
    if (old == compare)
        *p = v;
    return old;
}
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- cache-hinted loads and stores: plain ones ----

template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
template <typename T> inline T __ldca(const T *p) { return *p; }
template <typename T> inline T __ldlu(const T *p) { return *p; }
template <typename T> inline T __ldcv(const T *p) { return *p; }
template <typename T> inline void __stcs(T *p, T v) { *p = v; }
template <typename T> inline void __stcg(T *p, T v) { *p = v; }
template <typename T> inline void __stwb(T *p, T v) { *p = v; }
template <typename T> inline void __stwt(T *p, T v) { *p = v; }

// ---- arithmetic intrinsics ----

inline float __fdividef(float x, float y) { return x / y; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
// CUDA's rsqrtf is within 2 ulp; here the correctly rounded quotient.
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
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
inline int __float_as_int(float x) { return (int)__float_as_uint(x); }
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }

#endif // __cplusplus

#endif
