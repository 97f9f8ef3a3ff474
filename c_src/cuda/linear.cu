// The linear family's entry points and ops table on CUDA: the layer's
// forward (one blas::gemm with its bias and activation as the epilogue)
// and backward (the activation's derivative, two products, the bias's
// column sums), and the backend's general product (fusex_linear.h's gemm).
#include "cuda/activation.cuh"
#include "cuda/blas.cuh"
#include "cuda/dispatch.cuh"
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

// ---- the layer ----

int64_t at_least_one(int64_t v) { return v > 0 ? v : 1; }

// y = act(x Wᵀ + bias): x [rows, in] times w stored [out, in], transposed.
blas::Gemm layer_product(const fx_linear_fwd_args *a)
{
    blas::Gemm g;
    g.tb = blas::Trans::kT;
    g.m = a->n.rows;
    g.n = a->n.out;
    g.k = a->n.in;
    g.a = a->x->data;
    g.lda = at_least_one(a->n.in);
    g.b = a->w->data;
    g.ldb = at_least_one(a->n.in);
    g.c = a->y->data;
    g.ldc = at_least_one(a->n.out);
    g.ab_type = g.c_type = a->x->dtype;
    g.epilogue = blas::epilogue_of(a->bias != nullptr, a->activation);
    if (a->bias) {
        g.bias = a->bias->data;
        g.bias_type = a->bias->dtype;
    }
    g.aux = a->pre ? a->pre->data : nullptr;
    g.allow_tf32 = a->allow_tf32;
    return g;
}

int op_forward(const fx_exec *ex, const fx_linear_fwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return blas::gemm(r, layer_product(a), "linear", st);
}

size_t op_forward_scratch(const fx_exec *, const fx_linear_fwd_args *)
{
    return fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(blas::workspace_bytes()));
}

// dpre = dy * act'(.): from the output y or the pre-activation.
template <typename T>
__global__ void pre_gradient_kernel(const T *__restrict__ dy, const T *__restrict__ saved, T *__restrict__ dpre,
                                    int64_t n, int act, bool from_output)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = Elem<T>::load(saved[i]);
        const float grad = from_output ? act::grad_at_output(act, s) : act::grad_at_input(act, s);
        dpre[i] = Elem<T>::store(Elem<T>::load(dy[i]) * grad);
    }
}

size_t dpre_bytes(const fx_linear_bwd_args *a)
{
    if (a->fwd.activation == FX_ACT_NONE)
        return 0; // dy is dpre
    return fx_size_mul(fx_size_mul(a->fwd.n.rows, a->fwd.n.out), (int64_t)fx_dtype_size(a->fwd.x->dtype));
}

template <typename T> int backward(const Run &r, const fx_linear_bwd_args *a, fx_status *st)
{
    const fx_linear_dims &n = a->fwd.n;
    const int act = a->fwd.activation;
    const void *dpre = a->dy->data;
    void *scratch = nullptr;
    if (act != FX_ACT_NONE) {
        if (take_scratch(r, dpre_bytes(a), "linear_backward", &scratch, st))
            return st->code;
        const bool from_output = fx_linear_reads_output(act);
        const fx_tensor *saved = from_output ? a->fwd.y : a->fwd.pre;
        const int64_t count = n.rows * n.out;
        if (count > 0 &&
            launch<pre_gradient_kernel<T>>(r, grid_for(r.d, count, 256), 256, "linear pre-activation gradient", st,
                                           (const T *)a->dy->data, (const T *)saved->data, (T *)scratch, count, act,
                                           from_output)) {
            give_back(r, scratch);
            return st->code;
        }
        dpre = scratch;
    }
    // dx [rows, in] = dpre [rows, out] · w [out, in]
    blas::Gemm dx;
    dx.m = n.rows;
    dx.n = n.in;
    dx.k = n.out;
    dx.a = dpre;
    dx.lda = at_least_one(n.out);
    dx.b = a->fwd.w->data;
    dx.ldb = at_least_one(n.in);
    dx.c = a->dx->data;
    dx.ldc = at_least_one(n.in);
    dx.ab_type = dx.c_type = a->fwd.x->dtype;
    dx.allow_tf32 = a->fwd.allow_tf32;
    // dw [out, in] = dpreᵀ [out, rows] · x [rows, in]: the sum over rows
    // is cuBLASLt's k, reduced in f32 in a fixed order.
    blas::Gemm dw = dx;
    dw.ta = blas::Trans::kT;
    dw.m = n.out;
    dw.n = n.in;
    dw.k = n.rows;
    dw.a = dpre;
    dw.lda = at_least_one(n.out);
    dw.b = a->fwd.x->data;
    dw.ldb = at_least_one(n.in);
    dw.c = a->dw->data;
    dw.ldc = at_least_one(n.in);
    if (blas::gemm(r, dx, "linear_backward (dx)", st) == FX_OK && blas::gemm(r, dw, "linear_backward (dw)", st) == FX_OK &&
        a->dbias) {
        blas::ColumnSums sums;
        sums.src = dpre;
        sums.src_type = a->fwd.x->dtype;
        sums.rows = n.rows;
        sums.cols = n.out;
        sums.ld = at_least_one(n.out);
        sums.dst = a->dbias->data;
        sums.dst_type = a->dbias->dtype;
        blas::column_sums(r, sums, "linear_backward (dbias)", st);
    }
    give_back(r, scratch);
    return st->code;
}

int op_backward(const fx_exec *ex, const fx_linear_bwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, a->fwd.x->dtype, "linear_backward", st, [&] {
        return backward<T>(r, a, st);
    });
}

// dpre, then each product's workspace and the column sums' partials, none
// given back before the op ends (an arena keeps every piece).
size_t op_backward_scratch(const fx_exec *, const fx_linear_bwd_args *a)
{
    size_t total = FX_SCRATCH_ALIGN;
    total = fx_size_add(total, fx_scratch_piece(dpre_bytes(a)));
    total = fx_size_add(total, fx_scratch_piece(blas::workspace_bytes()));
    total = fx_size_add(total, fx_scratch_piece(blas::workspace_bytes()));
    if (a->dbias)
        total = fx_size_add(total, fx_scratch_piece(blas::column_sums_scratch(a->fwd.n.rows, a->fwd.n.out)));
    return total;
}

} // namespace
} // namespace fx::cuda::linear

namespace fx::cuda {

const struct fx_linear_ops linear_ops = {
    .forward = linear::op_forward,
    .backward = linear::op_backward,
    .forward_scratch = linear::op_forward_scratch,
    .backward_scratch = linear::op_backward_scratch,
    .gemm = linear::op_gemm,
    .gemm_scratch = linear::op_gemm_scratch,
};

} // namespace fx::cuda
