// Stands in for c_src/cuda/launch.cuh in the CPU emulator (test/emu/emu.h
// says how): the same functions, with the same contracts, for the same
// launchers. A launch runs its grid to the end before it returns (the
// emulated stream is always idle); a fill or a copy is a memset or memcpy;
// device memory is host memory.
#ifndef FX_CUDA_LAUNCH_CUH
#define FX_CUDA_LAUNCH_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tuple>

#include "cuda/common.cuh"
#include "cuda/scratch.cuh"
#include "run.h"

namespace fx::cuda {

// A block gets 48 KB of dynamic shared memory, or what its kernel opted in
// for (up to the device's limit). The most each kernel opted in for.
template <auto KERNEL> inline size_t emu_opted_bytes = 48 * 1024;

template <auto KERNEL> int opt_in_smem(Device *d, size_t bytes, const char *name, fx_status *st)
{
    if (bytes <= emu_opted_bytes<KERNEL>)
        return FX_OK;
    if (bytes > d->shared_per_block_optin) { // what cudaFuncSetAttribute answers
        char what[96];
        snprintf(what, sizeof what, "cudaFuncSetAttribute (%s)", name);
        return fail(d, cudaErrorInvalidValue, what, st);
    }
    emu_opted_bytes<KERNEL> = bytes;
    return FX_OK;
}

// KERNEL(params...) in every thread of the grid, with `smem` bytes of
// dynamic shared memory a block.
template <auto KERNEL, class... P>
int emu_run(Device *d, int64_t grid, int threads, size_t smem, const char *name, fx_status *st, const P &...params)
{
    auto thread = [&] { KERNEL(params...); };
    fx_emu::run_grid(
        name, grid, threads, smem, emu_opted_bytes<KERNEL>,
        [](void *body) { (*static_cast<decltype(thread) *>(body))(); }, &thread);
    return check_launch(d, name, st);
}

// Run now, or recorded with copies of its arguments on a capturing stream.
template <auto KERNEL, class... P>
int emu_launch(const Run &r, int64_t grid, int threads, size_t smem, const char *name, fx_status *st,
               const P &...params)
{
    if (!fx_emu::capturing(r.stream))
        return emu_run<KERNEL>(r.d, grid, threads, smem, name, st, params...);
    Device *d = r.d;
    fx_emu::record([d, grid, threads, smem, name, args = std::make_tuple(params...)](fx_status *replay) {
        return std::apply(
            [&](const P &...p) { return emu_run<KERNEL>(d, grid, threads, smem, name, replay, p...); }, args);
    });
    return FX_OK;
}

// A cooperative grid (c_src/cuda/launch.cuh): every block in flight at
// once, so blocks that wait for each other do; a grid larger than the
// device keeps resident (by threads and shared memory, as a GPU counts
// them) is refused as cudaLaunchCooperativeKernel refuses it.
template <auto KERNEL, class... P>
int launch_cooperative(const Run &r, int64_t grid, int threads, size_t smem, const char *name, fx_status *st,
                       const P &...params)
{
    if (opt_in_smem<KERNEL>(r.d, smem, name, st))
        return st->code;
    const int by_threads = r.d->max_threads_per_sm / (threads > 0 ? threads : 1);
    const int by_smem = (int)((r.d->shared_per_block_optin + 1024) / (smem + 1024));
    const int64_t resident = (int64_t)r.d->sm_count * (by_threads < by_smem ? by_threads : by_smem);
    Device *d = r.d;
    auto run = [d, grid, threads, smem, name, resident](fx_status *to, const P &...p) {
        auto thread = [&] { KERNEL(p...); };
        fx_emu::run_grid(
            name, grid, threads, smem, emu_opted_bytes<KERNEL>,
            [](void *body) { (*static_cast<decltype(thread) *>(body))(); }, &thread, resident);
        return check_launch(d, name, to);
    };
    if (!fx_emu::capturing(r.stream))
        return run(st, params...);
    fx_emu::record([run, args = std::make_tuple(params...)](fx_status *replay) {
        return std::apply([&](const P &...p) { return run(replay, p...); }, args);
    });
    return FX_OK;
}

template <auto KERNEL, class... P>
int launch_opted(const Run &r, int64_t grid, int threads, size_t smem, const char *name, fx_status *st,
                 const P &...params)
{
    if (opt_in_smem<KERNEL>(r.d, smem, name, st))
        return st->code;
    return emu_launch<KERNEL>(r, grid, threads, smem, name, st, params...);
}

template <auto KERNEL, class... P>
int launch(const Run &r, int64_t grid, int threads, const char *name, fx_status *st, const P &...params)
{
    return emu_launch<KERNEL>(r, grid, threads, 0, name, st, params...);
}

static inline int fill_zero(const Run &r, void *dst, size_t bytes, const char *, fx_status *)
{
    if (!bytes)
        return FX_OK;
    if (fx_emu::capturing(r.stream))
        fx_emu::record([dst, bytes](fx_status *) { return memset(dst, 0, bytes), FX_OK; });
    else
        memset(dst, 0, bytes);
    return FX_OK;
}

static inline int copy_device(const Run &r, void *dst, const void *src, size_t bytes, const char *, fx_status *)
{
    if (!bytes)
        return FX_OK;
    if (fx_emu::capturing(r.stream))
        fx_emu::record([dst, src, bytes](fx_status *) { return memcpy(dst, src, bytes), FX_OK; });
    else
        memcpy(dst, src, bytes);
    return FX_OK;
}

// Host memory, aligned as scratch is (aligned_alloc wants a multiple of
// the alignment).
static inline int alloc_statuses(const Run &, size_t bytes, void **out, fx_status *st)
{
    *out = bytes == SIZE_MAX ? nullptr : aligned_alloc(FX_SCRATCH_ALIGN, fx_scratch_piece(bytes));
    if (!*out)
        return fx_fail(st, FX_ENOMEM, "out of host memory for %zu bytes of look-back statuses", bytes);
    return FX_OK;
}

static inline int free_statuses(const Run &, void *ptr, fx_status *)
{
    free(ptr);
    return FX_OK;
}

} // namespace fx::cuda

#endif
