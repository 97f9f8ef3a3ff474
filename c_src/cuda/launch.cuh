// Launch helpers shared by the family launchers (ssm.cu, linrec.cu). Kept
// out of common.cuh, which the kernels' headers include and which therefore
// also compiles as plain C++ for the CPU emulator (tools/ssm_emu).
#ifndef FX_CUDA_LAUNCH_CUH
#define FX_CUDA_LAUNCH_CUH

#include <atomic>
#include <mutex>
#include <stdio.h>

#include "cuda/common.cuh"

// A block whose static and dynamic shared memory exceed 48 KB needs its
// kernel's opt-in for the dynamic bytes, per device and kernel; any launch
// with dynamic bytes opts in (the static part counts against the 48 KB
// too). The most bytes opted in so far are remembered per device (the
// attribute only grows, under a lock), so a launch that asks no more makes
// no driver call: one per device and kernel for kernels of a fixed size,
// one per new maximum for those sized per launch (linrec's staging).
// `name` says which kernel in errors.
template <auto KERNEL> int fx_cuda_opt_in_smem(fx_cuda_device *d, size_t bytes, const char *name, fx_status *st)
{
    static std::atomic<size_t> opted[FX_CUDA_MAX_DEVICES];
    static std::mutex raising;
    if (bytes <= opted[d->ordinal].load(std::memory_order_acquire))
        return FX_OK;
    std::lock_guard<std::mutex> held(raising);
    if (bytes <= opted[d->ordinal].load(std::memory_order_relaxed))
        return FX_OK;
    const cudaError_t err = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaFuncSetAttribute (%s)", name);
        return fx_cuda_fail(d, err, what, st);
    }
    opted[d->ordinal].store(bytes, std::memory_order_release);
    return FX_OK;
}

// KERNEL<<<grid, threads, smem>>>(params...) on the device's stream, opted
// in for its `smem` bytes first; `name` says which in errors.
template <auto KERNEL, class... P>
int fx_cuda_launch_opted(fx_cuda_device *d, int64_t grid, int threads, size_t smem, const char *name, fx_status *st,
                         const P &...params)
{
    if (fx_cuda_opt_in_smem<KERNEL>(d, smem, name, st))
        return st->code;
    KERNEL<<<(unsigned)grid, threads, smem, d->stream>>>(params...);
    return fx_cuda_launched(d, name, st);
}

#endif
