// The selective scan's launchers and the family's ops table (the kernels
// and their design notes are in ssm_kernels.cuh).
#include "cuda/families.h"
#include "cuda/launch.cuh"
#include "cuda/ssm_kernels.cuh"

namespace fx_ssm {
namespace {

// `floats` of stream-ordered f32 scratch, zeroed, at *out (NULL for none);
// the caller frees it with cudaFreeAsync after the kernels that use it.
// `what` names it in errors.
int zeroed_scratch(fx_cuda_device *d, int64_t floats, const char *what, float **out, fx_status *st)
{
    *out = nullptr;
    if (floats <= 0)
        return FX_OK;
    const size_t bytes = sizeof(float) * (size_t)floats;
    char call[112];
    snprintf(call, sizeof call, "cudaMallocAsync (%s)", what);
    FX_CUDA_TRY(d, cudaMallocAsync((void **)out, bytes, d->stream), call, st);
    const cudaError_t err = cudaMemsetAsync(*out, 0, bytes, d->stream);
    if (err != cudaSuccess) {
        (void)cudaFreeAsync(*out, d->stream);
        *out = nullptr;
        snprintf(call, sizeof call, "cudaMemsetAsync (%s)", what);
        return fx_cuda_fail(d, err, call, st);
    }
    return FX_OK;
}

template <typename T, class C> int launch_forward(fx_cuda_device *d, const FwdLaunch &l, fx_status *st)
{
    return with_fwd_kernel<T, C>(l, [&](auto kernel) {
        return fx_cuda_launch_opted<decltype(kernel)::value>(d, l.grid, 32 * l.warps, l.smem,
                                                             "selective_scan forward kernel", st, l.p);
    });
}

// The sliced forward: its slices add their parts of y into zeroed f32 sums,
// then a second kernel writes y from them.
template <typename T, class C> int launch_sliced_forward(fx_cuda_device *d, FwdLaunch l, fx_status *st)
{
    if (zeroed_scratch(d, ysum_floats(l.p), "selective_scan sums of y", &l.p.ysum, st))
        return st->code;
    int rc = launch_forward<T, C>(d, l, st);
    if (rc == FX_OK)
        rc = with_finish_kernel<T>(l.p, [&](auto kernel) {
            return fx_cuda_launch_opted<decltype(kernel)::value>(d, finish_grid(l.p, d->sm_count), kFinishThreads, 0,
                                                                 "selective_scan forward's y kernel", st, l.p);
        });
    if (l.p.ysum) // stream-ordered: released after the kernels that use it
        (void)cudaFreeAsync(l.p.ysum, d->stream);
    return rc;
}

int cuda_ssm_forward(int dev, const fx_ssm_fwd_args *a, fx_status *st)
{
    fx_cuda_device *d = fx_cuda_enter(dev, st);
    if (!d || check_dims(a->n, "selective_scan", st))
        return st->code;
    return fx_dispatch_float(a->x->dtype, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return with_cfg(a->n.dstate, [&](auto cfg) {
            typedef decltype(cfg) C;
            FwdLaunch l{};
            if (fwd_launch<T, C>(a, d->sm_count, &l, st))
                return st->code;
            if (l.p.units == 0)
                return (int)FX_OK;
            if (l.kernel == FwdKernel::WS_SLICED)
                return launch_sliced_forward<T, C>(d, l, st);
            return launch_forward<T, C>(d, l, st);
        });
    });
}

int cuda_ssm_step(int dev, const fx_ssm_step_args *a, fx_status *st)
{
    fx_cuda_device *d = fx_cuda_enter(dev, st);
    if (!d || check_dims(a->n, "selective_scan_step", st))
        return st->code;
    return fx_dispatch_float(a->x->dtype, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return with_cfg(a->n.dstate, [&](auto cfg) {
            typedef decltype(cfg) C;
            const StepParams p = step_params(a);
            const int64_t grid = step_grid<C>(p);
            if (grid == 0)
                return (int)FX_OK;
            ssm_step_kernel<T, C><<<(unsigned)grid, kThreads, 0, d->stream>>>(p);
            return fx_cuda_launched(d, "selective_scan_step kernel", st);
        });
    });
}

// The backward with configuration C (SL: the sliced kernel, C = Cfg<4, 4>):
// its zeroed f32 sums, the kernel, for SL the per-channel gradients from
// the slices' sums, the sums written out.
template <typename T, class C, bool SL> int launch_backward(fx_cuda_device *d, const fx_ssm_bwd_args *a, fx_status *st)
{
    const BwdScratch sz(a->fwd.n, SL);
    float *scratch;
    if (zeroed_scratch(d, sz.total, "selective_scan_backward sums", &scratch, st))
        return st->code;
    BwdParams bp = bwd_params<C>(a, scratch, sz);
    int rc = FX_OK;
    // The sliced kernel copies dy's rows 16 bytes at a time, and the forward
    // chose it (its saved states are 16 steps apart): a dy that does not
    // start on 16 bytes (a view) is copied to one that does first.
    void *dy_copy = nullptr;
    if (SL && (uintptr_t)bp.dy % 16 != 0) {
        cudaError_t err = cudaMallocAsync(&dy_copy, a->dy->nbytes, d->stream);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(dy_copy, a->dy->data, a->dy->nbytes, cudaMemcpyDeviceToDevice, d->stream);
        if (err != cudaSuccess)
            rc = fx_cuda_fail(d, err, "selective_scan_backward: an aligned copy of dy", st);
        bp.dy = dy_copy;
    }
    if (rc == FX_OK && grid_of(bp.f) > 0) {
        rc = with_bwd_kernel<T, C, SL>(bp, [&](auto kernel, size_t smem) {
            return fx_cuda_launch_opted<decltype(kernel)::value>(d, bwd_grid<SL>(bp), C::BW * 32, smem,
                                                                 "selective_scan_backward kernel", st, bp);
        });
        if (rc == FX_OK && SL)
            rc = fx_cuda_launch_opted<ssm_bwd_finish_kernel<T>>(d, bwd_finish_grid(bp.f, d->sm_count), kFinishThreads,
                                                                0, "selective_scan_backward's per-channel kernel", st,
                                                                bp);
    }
    if (rc == FX_OK)
        rc = fx_launch_sums(d, bwd_sums(a, bp, sz), "selective_scan_backward sums kernel", st);
    if (scratch) // stream-ordered: released after the kernels that use it
        (void)cudaFreeAsync(scratch, d->stream);
    if (dy_copy)
        (void)cudaFreeAsync(dy_copy, d->stream);
    return rc;
}

int cuda_ssm_backward(int dev, const fx_ssm_bwd_args *a, fx_status *st)
{
    fx_cuda_device *d = fx_cuda_enter(dev, st);
    if (!d || check_dims(a->fwd.n, "selective_scan_backward", st))
        return st->code;
    return fx_dispatch_float(a->fwd.x->dtype, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        return with_bwd_config<T>(a, st, [&](auto cfg, auto sl) {
            return launch_backward<T, decltype(cfg), decltype(sl)::value>(d, a, st);
        });
    });
}

int64_t cuda_save_interval(const fx_ssm_fwd_args *a)
{
    return fx_dispatch_float(a->x->dtype, [&](auto *tag) -> int64_t {
        return save_interval_of<typename std::remove_pointer<decltype(tag)>::type>(a);
    });
}

} // namespace
} // namespace fx_ssm

using namespace fx_ssm;

const struct fx_ssm_ops fx_cuda_ssm_ops = {
    cuda_ssm_forward, cuda_ssm_backward, cuda_ssm_step, cuda_save_interval, kMaxDstate,
};
