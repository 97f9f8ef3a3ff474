// The linear family's entry points and ops table on CUDA: the backend's
// general product (fusex_linear.h's gemm) over blas::gemm.
#include "cuda/blas.cuh"
#include "cuda/families.h"
#include "cuda/launch.cuh"
#include "fusex_linear.h"

namespace fx::cuda::linear {
namespace {

blas::Gemm gemm_of(const fx_gemm_args *a)
{
    blas::Gemm g;
    g.ta = a->trans_a ? blas::Trans::kT : blas::Trans::kN;
    g.tb = a->trans_b ? blas::Trans::kT : blas::Trans::kN;
    g.m = a->m;
    g.n = a->n;
    g.k = a->k;
    g.a = a->a;
    g.lda = a->lda;
    g.b = a->b;
    g.ldb = a->ldb;
    g.c = a->c;
    g.ldc = a->ldc;
    g.ab_type = a->ab_type;
    g.c_type = a->c_type;
    g.alpha = a->alpha;
    g.beta = a->beta;
    g.epilogue = blas::epilogue_of(a->bias != nullptr, a->activation);
    g.bias = a->bias;
    g.bias_type = a->bias_type;
    g.aux = a->aux;
    g.allow_tf32 = a->allow_tf32;
    g.batch = a->batch;
    g.stride_a = a->stride_a;
    g.stride_b = a->stride_b;
    g.stride_c = a->stride_c;
    return g;
}

int op_gemm(const fx_exec *ex, const fx_gemm_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    if (a->activation < 0 || a->activation >= FX_ACT_COUNT)
        return fx_fail(st, FX_EBADARG, "gemm: expected an activation 0..%d, got %d", FX_ACT_COUNT - 1, a->activation);
    return blas::gemm(r, gemm_of(a), "gemm", st);
}

size_t op_gemm_scratch(const fx_exec *, const fx_gemm_args *)
{
    return fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(blas::workspace_bytes()));
}

} // namespace
} // namespace fx::cuda::linear

namespace fx::cuda {

const struct fx_linear_ops linear_ops = {
    .gemm = linear::op_gemm,
    .gemm_scratch = linear::op_gemm_scratch,
};

} // namespace fx::cuda
