// blas.cuh in the CPU emulator (test/emu/emu.h), standing in for
// c_src/cuda/blas.cu: the same checks and the same split of the epilogue
// (blas_plan.cuh, shared), the product a plain loop accumulating in f64
// with what cuBLASLt would fuse into it (bias, relu, gelu, gelu keeping
// its input), the rest by the real epilogue kernel (blas_kernels.cu) on
// the emulated device. The launchers around a product run as they do on a
// GPU; only cuBLASLt itself is replaced.
#include <vector>

#include "cuda/activation.cuh"
#include "cuda/blas_plan.cuh"
#include "cuda/launch.cuh"

namespace fx::cuda::blas {
namespace {

// opA(A)[i, kk] of batch bt, as stored.
double a_at(const Gemm &g, int64_t bt, int64_t i, int64_t kk)
{
    const int64_t at = bt * g.stride_a + (g.ta == Trans::kN ? i * g.lda + kk : kk * g.lda + i);
    return fx_load_f64(g.a, g.ab_type, at);
}

double b_at(const Gemm &g, int64_t bt, int64_t kk, int64_t j)
{
    const int64_t at = bt * g.stride_b + (g.tb == Trans::kN ? kk * g.ldb + j : j * g.ldb + kk);
    return fx_load_f64(g.b, g.ab_type, at);
}

// D = alpha·AB + beta·C (+ bias), then relu or gelu, in f32 after the f64
// sum as cuBLASLt's epilogue computes in f32; the activation's input to
// aux where the plan fuses that too.
void product(const Gemm &g, const detail::Plan &p)
{
    const int64_t batch = g.batch;
    std::vector<double> a((size_t)(g.m * g.k)), bt_((size_t)(g.n * g.k));
    for (int64_t bt = 0; bt < batch; bt++) {
        const int64_t sc = batch > 1 ? bt * g.stride_c : 0;
        for (int64_t i = 0; i < g.m; i++)
            for (int64_t kk = 0; kk < g.k; kk++)
                a[(size_t)(i * g.k + kk)] = a_at(g, batch > 1 ? bt : 0, i, kk);
        for (int64_t j = 0; j < g.n; j++)
            for (int64_t kk = 0; kk < g.k; kk++)
                bt_[(size_t)(j * g.k + kk)] = b_at(g, batch > 1 ? bt : 0, kk, j);
        for (int64_t i = 0; i < g.m; i++)
            for (int64_t j = 0; j < g.n; j++) {
                double acc = 0.0;
                const double *ai = &a[(size_t)(i * g.k)], *bj = &bt_[(size_t)(j * g.k)];
                for (int64_t kk = 0; kk < g.k; kk++)
                    acc += ai[kk] * bj[kk];
                const int64_t at = sc + i * g.ldc + j;
                double pre = (double)g.alpha * acc;
                if (g.beta != 0.0f)
                    pre += (double)g.beta * fx_load_f64(g.c, g.c_type, at);
                if (p.product_bias)
                    pre += fx_load_f64(g.bias, g.bias_type, j);
                const float pre32 = (float)pre;
                if (p.product_aux)
                    fx_store_f64(g.aux, g.c_type, at, pre32);
                fx_store_f64(p.product_out, g.c_type, at, act::apply(p.product_act, pre32));
            }
    }
}

} // namespace

// What blas.cu offers the heuristics, so that scratch queries agree.
size_t workspace_bytes() { return (size_t)32 << 20; }

int gemm(const Run &r, const Gemm &g, const char *what, fx_status *st)
{
    if (detail::check(g, what, st))
        return st->code;
    if (g.m == 0 || g.n == 0)
        return FX_OK;
    const detail::Plan p = detail::plan(g, true);
    if (p.product && fx_emu::capturing(r.stream))
        fx_emu::record([g, p](fx_status *) { return product(g, p), FX_OK; });
    else if (p.product)
        product(g, p);
    return detail::run_epilogue(r, g, p, what, st);
}

void shutdown() {}

} // namespace fx::cuda::blas
