// How every launcher of c_src/cuda enqueues work on its launch context: the
// kernel launches, the scratch it takes from the context's allocator, the
// fills and copies. Launchers use nothing else of the CUDA runtime for
// work, so that the CPU emulator (which supplies its own version of this
// header, test/emu/cuda/launch.cuh) runs the same launchers. Kept out of common.cuh, which the
// kernels' headers include.
#ifndef FX_CUDA_LAUNCH_CUH
#define FX_CUDA_LAUNCH_CUH

#include <atomic>
#include <mutex>
#include <stdio.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/scratch.cuh"

namespace fx::cuda {

// A block whose static and dynamic shared memory exceed 48 KB needs its
// kernel's opt-in for the dynamic bytes, per device and kernel; any launch
// with dynamic bytes opts in (the static part counts against the 48 KB
// too). The most bytes opted in so far are remembered per device (the
// attribute only grows, under a lock), so a launch that asks no more makes
// no driver call: one per device and kernel for kernels of a fixed size,
// one per new maximum for those sized per launch (linrec's staging).
// `name` says which kernel in errors.
template <auto KERNEL> int opt_in_smem(Device *d, size_t bytes, const char *name, fx_status *st)
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
        return fail(d, err, what, st);
    }
    opted[d->ordinal].store(bytes, std::memory_order_release);
    return FX_OK;
}

// KERNEL<<<grid, threads, smem>>>(params...) on the context's stream, opted
// in for its `smem` bytes first; `name` says which in errors.
template <auto KERNEL, class... P>
int launch_opted(const Run &r, int64_t grid, int threads, size_t smem, const char *name,
                         fx_status *st, const P &...params)
{
    if (opt_in_smem<KERNEL>(r.d, smem, name, st))
        return st->code;
    KERNEL<<<(unsigned)grid, threads, smem, r.stream>>>(params...);
    return check_launch(r.d, name, st);
}

// KERNEL<<<grid, threads>>>(params...) on the context's stream.
template <auto KERNEL, class... P>
int launch(const Run &r, int64_t grid, int threads, const char *name, fx_status *st,
                   const P &...params)
{
    KERNEL<<<(unsigned)grid, threads, 0, r.stream>>>(params...);
    return check_launch(r.d, name, st);
}

// KERNEL as a cooperative grid (cudaLaunchCooperativeKernel), opted in for
// its `smem` bytes: every block resident at once, which a kernel whose
// blocks wait for each other (the persistent recurrences' grid barriers)
// needs. Where they cannot all be resident the launch fails
// (cudaErrorCooperativeLaunchTooLarge) and runs nothing.
template <auto KERNEL, class... P>
int launch_cooperative(const Run &r, int64_t grid, int threads, size_t smem, const char *name, fx_status *st,
                       const P &...params)
{
    if (opt_in_smem<KERNEL>(r.d, smem, name, st))
        return st->code;
    // All of the SM's unified memory as shared memory, so that the blocks
    // the plan counted on (two of them where their shared memory allows)
    // are what the residency check of the launch finds. Once per device
    // and kernel (racing threads set the same value).
    static std::atomic<bool> carved[FX_CUDA_MAX_DEVICES];
    if (!carved[r.d->ordinal].load(std::memory_order_acquire)) {
        const cudaError_t err = cudaFuncSetAttribute(KERNEL, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                     (int)cudaSharedmemCarveoutMaxShared);
        if (err != cudaSuccess) {
            char what[96];
            snprintf(what, sizeof what, "cudaFuncSetAttribute carveout (%s)", name);
            return fail(r.d, err, what, st);
        }
        carved[r.d->ordinal].store(true, std::memory_order_release);
    }
    void *args[] = {const_cast<void *>(static_cast<const void *>(&params))...};
    FX_CUDA_TRY(r.d,
                cudaLaunchCooperativeKernel(reinterpret_cast<const void *>(KERNEL), dim3((unsigned)grid),
                                            dim3((unsigned)threads), args, smem, r.stream),
                name, st);
    return FX_OK;
}

// `bytes` of zeros at dst, stream-ordered.
static inline int fill_zero(const Run &r, void *dst, size_t bytes, const char *what, fx_status *st)
{
    if (bytes == 0)
        return FX_OK;
    FX_CUDA_TRY(r.d, cudaMemsetAsync(dst, 0, bytes, r.stream), what, st);
    return FX_OK;
}

// `bytes` from src to dst, both device memory, stream-ordered.
static inline int copy_device(const Run &r, void *dst, const void *src, size_t bytes, const char *what,
                               fx_status *st)
{
    if (bytes == 0)
        return FX_OK;
    FX_CUDA_TRY(r.d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, r.stream), what, st);
    return FX_OK;
}

// The look-back statuses' memory (scratch.cuh's hooks) comes from the
// stream's memory pool, so freeing it waits for no launch on the host.
static inline int alloc_statuses(const Run &r, size_t bytes, void **out, fx_status *st)
{
    FX_CUDA_TRY(r.d, cudaMallocAsync(out, bytes, r.stream), "cudaMallocAsync (look-back statuses)", st);
    return FX_OK;
}

static inline int free_statuses(const Run &r, void *ptr, fx_status *st)
{
    FX_CUDA_TRY(r.d, cudaFreeAsync(ptr, r.stream), "cudaFreeAsync (look-back statuses)", st);
    return FX_OK;
}

} // namespace fx::cuda

#endif
