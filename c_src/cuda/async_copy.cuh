// Global-to-shared copies that land later (cp.async), for every kernel family
// that stages its inputs: the linrec forwards (cuda/scan.cuh,
// cuda/linrec/) and the selective scan (cuda/ssm/). In the CPU emulator
// (test/emu, FX_CUDA_EMULATION) a copy lands when its group is waited for
// (or, in a random interleaving, maybe at once).
#ifndef FX_CUDA_ASYNC_COPY_CUH
#define FX_CUDA_ASYNC_COPY_CUH

#include <string.h>

#include "cuda/common.cuh"

namespace fx::cuda {

// Where a 16-byte copy is cached on its way (smaller copies are always
// kept in L1 as well: cp.async.ca):
//   kCopyL2       L2 only (cp.async.cg);
//   kCopyL2Line   L2 only, which fetches the whole 128-byte line (the
//                   linrec streaming forward measured a small gain with it);
//   kCopyL1       L1 as well, for rows that other warps of the SM copy too
//                   (the selective scan's b and c where a warp is one channel).
// bench/RESULTS.md has the measurements.
enum CopyHint { kCopyL2, kCopyL2Line, kCopyL1 };

// BYTES (4, 8 or 16) from src to dst in shared memory.
template <int BYTES, CopyHint HINT = kCopyL2>
__device__ __forceinline__ void copy_async(void *dst, const void *src)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
#ifdef __CUDA_ARCH__
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16 && HINT == kCopyL2Line)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
    else if constexpr (BYTES == 16 && HINT == kCopyL2)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
    else // kCopyL1, or fewer than 16 bytes
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(BYTES) : "memory");
#elif defined(FX_CUDA_EMULATION)
    fx_emu_copy_async(dst, src, BYTES, true);
#else
    memcpy(dst, src, BYTES);
#endif
}

// The same, writing zeros instead (and reading nothing from src) where
// `valid` is false.
template <int BYTES, CopyHint HINT = kCopyL2>
__device__ __forceinline__ void copy_async(void *dst, const void *src, bool valid)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
#ifdef __CUDA_ARCH__
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? BYTES : 0;
    if constexpr (BYTES == 16 && HINT == kCopyL2Line)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n)
                     : "memory");
    else if constexpr (BYTES == 16 && HINT == kCopyL2)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
    else // kCopyL1, or fewer than 16 bytes
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(BYTES), "r"(n)
                     : "memory");
#elif defined(FX_CUDA_EMULATION)
    fx_emu_copy_async(dst, src, BYTES, valid);
#else
    if (valid)
        memcpy(dst, src, BYTES);
    else
        memset(dst, 0, BYTES);
#endif
}

// Closes this thread's group of copies issued since the last commit.
__device__ __forceinline__ void copy_commit()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#elif defined(FX_CUDA_EMULATION)
    fx_emu_copy_commit();
#endif
}

// Waits until at most N of this thread's committed groups are in flight.
// The copies of other threads need a barrier besides.
template <int N> __device__ __forceinline__ void copy_wait()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#elif defined(FX_CUDA_EMULATION)
    fx_emu_copy_wait(N);
#endif
}

// Waits for every copy this thread issued.
__device__ __forceinline__ void copy_wait_all()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_all;" ::: "memory");
#elif defined(FX_CUDA_EMULATION)
    fx_emu_copy_wait_all();
#endif
}

} // namespace fx::cuda

#endif
