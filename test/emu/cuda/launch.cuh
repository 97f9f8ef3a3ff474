// Stands in for c_src/cuda/launch.cuh in the CPU emulator (test/emu/emu.h
// says how): the same functions, with the same contracts, for the same
// launchers. A launch runs its grid to the end before it returns (the
// emulated stream is always idle); a fill or a copy is a memset or memcpy.
#ifndef FX_CUDA_LAUNCH_CUH
#define FX_CUDA_LAUNCH_CUH

#include <stdio.h>
#include <string.h>

#include "cuda/common.cuh"
#include "run.h"

// A block gets 48 KB of dynamic shared memory, or what its kernel opted in
// for (up to the device's limit). The most each kernel opted in for.
template <auto KERNEL> inline size_t fx_emu_opted_bytes = 48 * 1024;

template <auto KERNEL> int fx_cuda_opt_in_smem(fx_cuda_device *d, size_t bytes, const char *name, fx_status *st)
{
    if (bytes <= fx_emu_opted_bytes<KERNEL>)
        return FX_OK;
    if (bytes > d->shared_per_block_optin) { // what cudaFuncSetAttribute answers
        char what[96];
        snprintf(what, sizeof what, "cudaFuncSetAttribute (%s)", name);
        return fx_cuda_fail(d, cudaErrorInvalidValue, what, st);
    }
    fx_emu_opted_bytes<KERNEL> = bytes;
    return FX_OK;
}

// KERNEL(params...) in every thread of the grid, with `smem` bytes of
// dynamic shared memory a block.
template <auto KERNEL, class... P>
int fx_emu_launch(const fx_cuda_run &r, int64_t grid, int threads, size_t smem, const char *name, fx_status *st,
                  const P &...params)
{
    auto thread = [&] { KERNEL(params...); };
    fx_emu::run_grid(
        name, grid, threads, smem, fx_emu_opted_bytes<KERNEL>,
        [](void *body) { (*static_cast<decltype(thread) *>(body))(); }, &thread);
    return fx_cuda_launched(r.d, name, st);
}

template <auto KERNEL, class... P>
int fx_cuda_launch_opted(const fx_cuda_run &r, int64_t grid, int threads, size_t smem, const char *name,
                         fx_status *st, const P &...params)
{
    if (fx_cuda_opt_in_smem<KERNEL>(r.d, smem, name, st))
        return st->code;
    return fx_emu_launch<KERNEL>(r, grid, threads, smem, name, st, params...);
}

template <auto KERNEL, class... P>
int fx_cuda_launch(const fx_cuda_run &r, int64_t grid, int threads, const char *name, fx_status *st,
                   const P &...params)
{
    return fx_emu_launch<KERNEL>(r, grid, threads, 0, name, st, params...);
}

static inline int fx_cuda_scratch(const fx_cuda_run &r, size_t bytes, const char *what, void **out, fx_status *st)
{
    if (fx_scratch_alloc(r.ex, bytes, out, st) == FX_OK)
        return FX_OK;
    const size_t len = strlen(st->msg);
    snprintf(st->msg + len, sizeof st->msg - len, " (scratch for %s)", what);
    return st->code;
}

static inline void fx_cuda_release(const fx_cuda_run &r, void *ptr) { fx_scratch_release(r.ex, ptr); }

static inline int fx_cuda_zero(const fx_cuda_run &, void *dst, size_t bytes, const char *, fx_status *)
{
    if (bytes)
        memset(dst, 0, bytes);
    return FX_OK;
}

static inline int fx_cuda_copy(const fx_cuda_run &, void *dst, const void *src, size_t bytes, const char *,
                               fx_status *)
{
    if (bytes)
        memcpy(dst, src, bytes);
    return FX_OK;
}

static inline int fx_cuda_zeroed_scratch(const fx_cuda_run &r, size_t bytes, const char *what, void **out,
                                         fx_status *st)
{
    if (fx_cuda_scratch(r, bytes, what, out, st) != FX_OK)
        return st->code;
    return fx_cuda_zero(r, *out, bytes, what, st);
}

#endif
