// The selective scan's entry points and ops table (cuda/entry.cuh): the
// launch context entered, the dimensions checked, the call handed to the
// launchers of the input type (ssm/launchers.cuh, compiled per type by
// ssm_f32.cu, ssm_bf16.cu, ssm_f16.cu), and the scratch each asks for at
// most.
#include "cuda/entry.cuh"
#include "cuda/families.h"
#include "cuda/ssm/launchers.cuh"

namespace fx::cuda::ssm {
namespace {

struct Forward : OpEntry<fx_ssm_fwd_args> {
    static constexpr const char *kWhat = "selective_scan";
    static fx_dtype type(const Args *a) { return a->x->dtype; }
    static int check(const Args *a, fx_status *st) { return check_dims(a->n, kWhat, st); }
    template <typename T> static int launch(const Run &r, const Args *a, fx_status *st) { return forward<T>(r, a, st); }
    // Where the shape may run sliced, the slices' sums of y and aligned
    // copies of every row tensor.
    template <typename T> static size_t scratch(const fx_exec *, const Args *a)
    {
        if (!ws_sliced_shape<T>(scan_params(a, kWsChannels)))
            return 0;
        size_t total = FX_SCRATCH_ALIGN;
        total = fx_size_add(total, fx_scratch_piece(fx_size_mul(ysum_floats(scan_params(a, kWsChannels)), 4)));
        const fx_tensor *rows[] = {a->x, a->dt, a->z, a->b, a->c, a->y};
        for (const fx_tensor *t : rows)
            total = fx_size_add(total, fx_scratch_piece(detail::bytes_of(t)));
        return total;
    }
};

struct Backward : OpEntry<fx_ssm_bwd_args> {
    static constexpr const char *kWhat = "selective_scan_backward";
    static fx_dtype type(const Args *a) { return a->fwd.x->dtype; }
    static int check(const Args *a, fx_status *st) { return check_dims(a->fwd.n, kWhat, st); }
    template <typename T> static int launch(const Run &r, const Args *a, fx_status *st) { return backward<T>(r, a, st); }
    // Its partial sums and, sliced, aligned copies of every row tensor it
    // reads or writes.
    template <typename T> static size_t scratch(const fx_exec *, const Args *a)
    {
        const bool sliced = bwd_sliced_shape<T>(scan_params(&a->fwd, kWsChannels));
        size_t total = fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(fx_size_mul(bwd_scratch_of<T>(a).total, 4)));
        if (sliced) {
            const fx_tensor *rows[] = {a->fwd.x, a->fwd.dt, a->fwd.z, a->fwd.b, a->fwd.c, a->dy, a->dx, a->ddt, a->dz};
            for (const fx_tensor *t : rows)
                total = fx_size_add(total, fx_scratch_piece(detail::bytes_of(t)));
        }
        return total;
    }
};

struct Step : OpEntry<fx_ssm_step_args> {
    static constexpr const char *kWhat = "selective_scan_step";
    static fx_dtype type(const Args *a) { return a->x->dtype; }
    static int check(const Args *a, fx_status *st) { return check_dims(a->n, kWhat, st); }
    template <typename T> static int launch(const Run &r, const Args *a, fx_status *st) { return step<T>(r, a, st); }
};

} // namespace
} // namespace fx::cuda::ssm

namespace fx::cuda {

const struct fx_ssm_ops ssm_ops = {
    .forward = entry<ssm::Forward>,
    .backward = entry<ssm::Backward>,
    .step = entry<ssm::Step>,
    .forward_scratch = scratch_entry<ssm::Forward>,
    .backward_scratch = scratch_entry<ssm::Backward>,
    .reads_saved = true,
    .max_dstate = ssm::kMaxDstate,
};

} // namespace fx::cuda
