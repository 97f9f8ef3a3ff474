// Launchers for the kernel files of dev/linrec_variants: each builds the
// plan and tiling as the library's forward_with (c_src/cuda/linrec/
// launchers.cuh) does and launches one kernel (chained launches only:
// every case of the driver has several time tiles).
#ifndef LV_LAUNCH_CUH
#define LV_LAUNCH_CUH

#include "cuda/linrec/plan.cuh"
#include "variants.h"

namespace lvimpl {

using namespace fx::cuda::linrec;

template <typename T> constexpr fx_dtype dtype_of() { return sizeof(T) == 4 ? FX_F32 : FX_BF16; }

template <int KIND, typename T> inline fx_linrec_problem problem(const lv_args &a)
{
    fx_linrec_problem p = {};
    p.kind = KIND;
    p.batch = a.B;
    p.seqlen = a.L;
    p.hidden = a.H;
    p.dtype = dtype_of<T>();
    p.nseq = nseq<KIND>();
    return p;
}

inline FwdParams params(const lv_args &a)
{
    FwdParams prm = {};
    for (int k = 0; k < 3; k++)
        prm.in.seq[k] = a.seq[k];
    prm.in.tau = a.tau;
    prm.in.lam = a.lam;
    prm.in.dt = nullptr;
    prm.in.dt_value = a.dt_value;
    prm.h = a.h;
    prm.state = a.state;
    return prm;
}

template <typename K>
inline cudaError_t launch_with(K kernel, const lv_args &a, const Plan &pl, fx::cuda::scan::Tiling &t, unsigned grid,
                               size_t dyn, lv_info *info)
{
    if (pl.ttiles < 2)
        return cudaErrorInvalidConfiguration; // the driver's cases all chain tiles
    carve_lookback(a.scratch, a.epoch, t);
    const unsigned threads = 32 * pl.warps;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
    if (err != cudaSuccess)
        return err;
    if (info) {
        cudaFuncAttributes fa;
        cudaFuncGetAttributes(&fa, kernel);
        info->regs = fa.numRegs;
        info->local_bytes = (int)fa.localSizeBytes;
        info->static_smem = (int)fa.sharedSizeBytes;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info->per_sm, kernel, (int)threads, dyn);
        info->dyn_smem = dyn;
        info->grid = grid;
        info->threads = threads;
        info->tiles = pl.ctiles * pl.ttiles;
        info->ttiles = pl.ttiles;
    }
    kernel<<<grid, threads, dyn, a.stream>>>(params(a), t);
    return cudaGetLastError();
}

inline Plan plan_for(const lv_args &a, const fx_linrec_problem &p, int V, int G, int S)
{
    fx::cuda::Device d = {};
    d.sm_count = a.sm_count;
    return make_plan(&d, &p, V, G, S, 0);
}

// The one-tile-per-block kernel holding its inputs in registers.
template <int KIND, typename T, int V, int G, int S> cudaError_t reg(const lv_args &a, lv_info *info)
{
    const fx_linrec_problem p = problem<KIND, T>(a);
    const Plan pl = plan_for(a, p, V, G, S);
    fx::cuda::scan::Tiling t = make_tiling(&p, pl, 0);
    return launch_with(forward_kernel<KIND, T, V, G, S, false, true>, a, pl, t,
                       (unsigned)(pl.ctiles * pl.ttiles), 0, info);
}

// The one-tile-per-block kernel staging its inputs (cp.async).
template <int KIND, typename T, int V, int G, int S> cudaError_t staged(const lv_args &a, lv_info *info)
{
    const fx_linrec_problem p = problem<KIND, T>(a);
    const Plan pl = plan_for(a, p, V, G, S);
    fx::cuda::scan::Tiling t = make_tiling(&p, pl, 0);
    return launch_with(forward_staged_kernel<KIND, T, V, G, S, false, true>, a, pl, t,
                       (unsigned)(pl.ctiles * pl.ttiles), fwd_stage_bytes<KIND, T, V>(pl.steps, pl.warps), info);
}

} // namespace lvimpl

#endif
