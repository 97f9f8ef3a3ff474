// The selective scan's entry points and ops table: the launch context
// entered, the dimensions checked, the call handed to the launchers of the
// input type (ssm/launchers.cuh, compiled per type by ssm_f32.cu,
// ssm_bf16.cu, ssm_f16.cu), and the scratch each asks for at most.
#include "cuda/families.h"
#include "cuda/ssm/launchers.cuh"

namespace fx::cuda::ssm {
namespace {

int op_forward(const fx_exec *ex, const fx_ssm_fwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st) || check_dims(a->n, "selective_scan", st))
        return st->code;
    return with_float(a->x->dtype, "selective_scan", st, [&](auto *tag) {
        return forward<typename std::remove_pointer<decltype(tag)>::type>(r, a, st);
    });
}

int op_backward(const fx_exec *ex, const fx_ssm_bwd_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st) || check_dims(a->fwd.n, "selective_scan_backward", st))
        return st->code;
    return with_float(a->fwd.x->dtype, "selective_scan_backward", st, [&](auto *tag) {
        return backward<typename std::remove_pointer<decltype(tag)>::type>(r, a, st);
    });
}

int op_step(const fx_exec *ex, const fx_ssm_step_args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st) || check_dims(a->n, "selective_scan_step", st))
        return st->code;
    return with_float(a->x->dtype, "selective_scan_step", st, [&](auto *tag) {
        return step<typename std::remove_pointer<decltype(tag)>::type>(r, a, st);
    });
}

// The forward's scratch at most: where the shape may run sliced, the sums
// of y and aligned copies of every row tensor. The size goes out through
// `total`, not with_float's answer: that is a status, an int, which would
// cut sizes above 2 GiB.
size_t op_forward_scratch(const fx_exec *, const fx_ssm_fwd_args *a)
{
    size_t total = 0;
    fx_status st; // a type with no kernel asks for none: the op itself fails
    fx_status_clear(&st);
    with_float(a->x->dtype, "selective_scan", &st, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        if (!ws_sliced_shape<T>(scan_params(a, kWsChannels)))
            return (int)FX_OK;
        total = FX_SCRATCH_ALIGN;
        total = fx_size_add(total, fx_scratch_piece(fx_size_mul(ysum_floats(scan_params(a, kWsChannels)), 4)));
        const fx_tensor *rows[] = {a->x, a->dt, a->z, a->b, a->c, a->y};
        for (const fx_tensor *t : rows)
            total = fx_size_add(total, fx_scratch_piece(detail::bytes_of(t)));
        return (int)FX_OK;
    });
    return total;
}

// The backward's scratch at most: its sums and, sliced, aligned copies of
// every row tensor it reads or writes. Out through `total`, as above.
size_t op_backward_scratch(const fx_exec *, const fx_ssm_bwd_args *a)
{
    size_t total = 0;
    fx_status st; // as above
    fx_status_clear(&st);
    with_float(a->fwd.x->dtype, "selective_scan_backward", &st, [&](auto *tag) {
        typedef typename std::remove_pointer<decltype(tag)>::type T;
        const bool sliced = bwd_sliced_shape<T>(scan_params(&a->fwd, kWsChannels));
        total = fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(fx_size_mul(BwdScratch(a->fwd.n, sliced).total, 4)));
        if (sliced) {
            const fx_tensor *rows[] = {a->fwd.x, a->fwd.dt, a->fwd.z, a->fwd.b, a->fwd.c, a->dy, a->dx, a->ddt, a->dz};
            for (const fx_tensor *t : rows)
                total = fx_size_add(total, fx_scratch_piece(detail::bytes_of(t)));
        }
        return (int)FX_OK;
    });
    return total;
}

} // namespace
} // namespace fx::cuda::ssm

namespace fx::cuda {

const struct fx_ssm_ops ssm_ops = {
    .forward = ssm::op_forward,
    .backward = ssm::op_backward,
    .step = ssm::op_step,
    .forward_scratch = ssm::op_forward_scratch,
    .backward_scratch = ssm::op_backward_scratch,
    .reads_saved = true,
    .max_dstate = ssm::kMaxDstate,
};

} // namespace fx::cuda
