// The CUDA backend's selective scan launchers (c_src/cuda/ssm.cu), mirrored
// for the emulation: the same kernels and parameter builders on host
// memory, one block at a time.
#include "emu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda/ssm/plan.cuh"

namespace fx_ssm {
alignas(16) float smem[1 << 16]; // what block_smem() returns
}

using namespace fx_ssm;

namespace {

void launch(int64_t grid, int threads, size_t smem_bytes, const std::function<void()> &kernel)
{
    if (smem_bytes > sizeof smem) {
        fprintf(stderr, "emu: %zu bytes of shared memory asked\n", smem_bytes);
        abort();
    }
    emu::grid_dim = dim3((unsigned)grid, 1, 1);
    for (int64_t b = 0; b < grid; b++) {
        for (float &v : smem)
            v = NAN;
        emu::run_block((unsigned)b, threads, kernel);
    }
}

template <typename F> int with_type(fx_dtype t, F &&body)
{
    switch (t) {
    case FX_F32: return body((float *)nullptr);
    case FX_BF16: return body((__nv_bfloat16 *)nullptr);
    case FX_F16: return body((__half *)nullptr);
    default: return FX_EINTERNAL;
    }
}

int emu_forward(const fx_exec *, const fx_ssm_fwd_args *a, fx_status *st)
{
    if (check_dims(a->n, "selective_scan", st))
        return st->code;
    return with_type(a->x->dtype, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return with_cfg(a->n.dstate, [&](auto cfg) {
            typedef decltype(cfg) C;
            // as on a GPU of 4 SMs: blocks of one warp for small problems,
            // of several for larger ones
            FwdLaunch l{};
            if (fwd_launch<T, C>(a, 4, &l, st))
                return st->code;
            // the sliced kernel's sums of y, zeroed; then y from them
            std::vector<float> ysum(l.kernel == FwdKernel::WS_SLICED ? (size_t)ysum_floats(l.p) : 0);
            l.p.ysum = ysum.empty() ? nullptr : ysum.data();
            with_fwd_kernel<T, C>(l, [&](auto kernel) {
                launch(l.grid, 32 * l.warps, l.smem, [&] { decltype(kernel)::value(l.p); });
            });
            if (l.kernel == FwdKernel::WS_SLICED)
                with_finish_kernel<T>(l.p, [&](auto kernel) {
                    launch(4, kFinishThreads, 0, [&] { decltype(kernel)::value(l.p); });
                });
            return (int)FX_OK;
        });
    });
}

int emu_step(const fx_exec *, const fx_ssm_step_args *a, fx_status *st)
{
    if (check_dims(a->n, "selective_scan_step", st))
        return st->code;
    return with_type(a->x->dtype, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return with_cfg(a->n.dstate, [&](auto cfg) {
            typedef decltype(cfg) C;
            const StepParams p = step_params(a);
            launch(step_grid<C>(p), kThreads, 0, [&] { ssm_step_kernel<T, C>(p); });
            return (int)FX_OK;
        });
    });
}

// Runs fx_write_sums as the launcher does: one grid over every region.
void write_sums(const fx_sum_regions &s)
{
    if (s.total > 0)
        launch(4, 64, 0, [&] { fx_write_sums<>(s); });
}

// As ssm.cu's launch_backward: zeroed sums, the kernel, for SL the
// per-channel kernel, the sums written out.
template <typename T, class C, bool SL> int emu_launch_backward(const fx_ssm_bwd_args *a)
{
    const BwdScratch sz(a->fwd.n, SL);
    std::vector<float> scratch((size_t)sz.total + 1);
    BwdParams bp = bwd_params<C>(a, scratch.data(), sz);
    std::vector<float4> dy_copy; // a dy not on 16 bytes, copied first (as launch_backward does)
    if (SL && (uintptr_t)bp.dy % 16 != 0) {
        dy_copy.resize((a->dy->nbytes + 15) / 16);
        memcpy(dy_copy.data(), a->dy->data, a->dy->nbytes);
        bp.dy = dy_copy.data();
    }
    with_bwd_kernel<T, C, SL>(bp, [&](auto kernel, size_t smem) {
        launch(bwd_grid<SL>(bp), C::BW * 32, smem, [&] { decltype(kernel)::value(bp); });
    });
    if (SL)
        launch(4, kFinishThreads, 0, [&] { ssm_bwd_finish_kernel<T>(bp); });
    write_sums(bwd_sums(a, bp, sz));
    return FX_OK;
}

int emu_backward(const fx_exec *, const fx_ssm_bwd_args *a, fx_status *st)
{
    if (check_dims(a->fwd.n, "selective_scan_backward", st))
        return st->code;
    return with_type(a->fwd.x->dtype, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return with_bwd_config<T>(a, st, [&](auto cfg, auto sl) {
            return emu_launch_backward<T, decltype(cfg), decltype(sl)::value>(a);
        });
    });
}

} // namespace

extern "C" const struct fx_ssm_ops fx_emu_ssm_ops = {
    .forward = emu_forward,
    .backward = emu_backward,
    .step = emu_step,
    .forward_scratch = nullptr,
    .backward_scratch = nullptr,
    .reads_saved = true,
    .max_dstate = kMaxDstate,
};
