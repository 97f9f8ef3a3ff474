// The selective scan's launchers, one set per input type T (instantiated
// by ssm_f32.cu, ssm_bf16.cu, ssm_f16.cu, which nvcc compiles in
// parallel): each picks the kernel through the launch plan (ssm/plan.cuh)
// and enqueues it, its scratch and its copies on the caller's launch
// context. ssm.cu dispatches to them.
#ifndef FX_CUDA_SSM_LAUNCHERS_CUH
#define FX_CUDA_SSM_LAUNCHERS_CUH

#include "cuda/launch.cuh"
#include "cuda/ssm/plan.cuh"

namespace fx::cuda::ssm {

template <typename T> int forward(const Run &r, const fx_ssm_fwd_args *a, fx_status *st);
template <typename T> int backward(const Run &r, const fx_ssm_bwd_args *a, fx_status *st);
template <typename T> int step(const Run &r, const fx_ssm_step_args *a, fx_status *st);

namespace detail {

// ---- tensors a sliced kernel needs on 16 bytes ----

// The sliced kernels read and write rows 16 bytes at a time. Where one is
// required (its chunk is the saved states' interval) and a tensor does not
// start on 16 bytes (a view made with from_pointer), the tensor is copied
// into aligned scratch first, and an output is written to aligned scratch
// and copied back after the kernels.
struct Realigned {
    static constexpr int kMax = 10;
    struct Piece {
        void *scratch;
        void *out; // where an output goes back to, or nullptr for an input
        size_t bytes;
    };
    Piece pieces[kMax];
    int count = 0;
};

inline bool on16(const void *p) { return (uintptr_t)p % 16 == 0; }

inline int realign_input(const Run &r, Realigned &ra, const void *&ptr, size_t bytes, fx_status *st)
{
    if (!ptr || on16(ptr))
        return FX_OK;
    void *copy = nullptr;
    if (take_scratch(r, bytes, "an aligned copy of an input view", &copy, st))
        return st->code;
    if (copy_device(r, copy, ptr, bytes, "cudaMemcpyAsync (an aligned copy of an input view)", st)) {
        give_back(r, copy);
        return st->code;
    }
    ra.pieces[ra.count++] = {copy, nullptr, bytes};
    ptr = copy;
    return FX_OK;
}

inline int realign_output(const Run &r, Realigned &ra, void *&ptr, size_t bytes, fx_status *st)
{
    if (!ptr || on16(ptr))
        return FX_OK;
    void *stand_in = nullptr;
    if (take_scratch(r, bytes, "an aligned stand-in for an output view", &stand_in, st))
        return st->code;
    ra.pieces[ra.count++] = {stand_in, ptr, bytes};
    ptr = stand_in;
    return FX_OK;
}

// Outputs copied back (when the kernels ran: rc FX_OK), then every piece
// released, ordered after the work that used it.
inline int realign_finish(const Run &r, Realigned &ra, int rc, fx_status *st)
{
    for (int i = 0; i < ra.count; i++) {
        const Realigned::Piece &piece = ra.pieces[i];
        if (rc == FX_OK && piece.out)
            rc = copy_device(r, piece.out, piece.scratch, piece.bytes,
                              "cudaMemcpyAsync (an output view from its aligned stand-in)", st);
        give_back(r, piece.scratch);
    }
    ra.count = 0;
    return rc;
}

inline size_t bytes_of(const fx_tensor *t) { return t ? t->nbytes : 0; }

// The f32 outputs the kernels write 16 bytes at a time: the final state
// and the saved states. fusex and XLA allocate them so; a C caller must.
inline int expect_states_aligned(const fx_tensor *state, const fx_tensor *saved, const char *op, fx_status *st)
{
    if (state && !on16(state->data))
        return fx_fail(st, FX_EBADARG, "%s: state: expected an address on 16 bytes, got %p", op, state->data);
    if (saved && !on16(saved->data))
        return fx_fail(st, FX_EBADARG, "%s: saved: expected an address on 16 bytes, got %p", op, saved->data);
    return FX_OK;
}

// ---- forward ----

template <typename T, class C> int launch_forward(const Run &r, const FwdLaunch &l, fx_status *st)
{
    return with_fwd_kernel<T, C>(l, [&](auto kernel) {
        return launch_opted<decltype(kernel)::value>(r, l.grid, 32 * l.warps, l.smem,
                                                             "selective_scan forward kernel", st, l.p);
    });
}

// The sliced forward: its slices store their parts of y in rows of f32
// sums, then a second kernel adds them up and writes y.
template <typename T, class C>
int launch_sliced_forward(const Run &r, const fx_ssm_fwd_args *a, FwdLaunch l, fx_status *st)
{
    Realigned ra;
    if (l.realign &&
        (realign_input(r, ra, l.p.x, bytes_of(a->x), st) || realign_input(r, ra, l.p.dt, bytes_of(a->dt), st) ||
         realign_input(r, ra, l.p.z, bytes_of(a->z), st) || realign_input(r, ra, l.p.b, bytes_of(a->b), st) ||
         realign_input(r, ra, l.p.c, bytes_of(a->c), st) || realign_output(r, ra, l.p.y, bytes_of(a->y), st)))
        return realign_finish(r, ra, st->code, st);
    void *ysum = nullptr;
    int rc = take_scratch(r, fx_size_mul(ysum_floats(l.p), sizeof(float)), "selective_scan sums of y", &ysum, st);
    l.p.ysum = static_cast<float *>(ysum);
    if (rc == FX_OK)
        rc = launch_forward<T, C>(r, l, st);
    if (rc == FX_OK)
        rc = with_finish_kernel<T>(l.p, [&](auto kernel) {
            return launch_opted<decltype(kernel)::value>(r, finish_grid(l.p, r.d->sm_count), kFinishThreads,
                                                                 0, "selective_scan forward's y kernel", st, l.p);
        });
    give_back(r, ysum);
    return realign_finish(r, ra, rc, st);
}

} // namespace detail

template <typename T> int forward(const Run &r, const fx_ssm_fwd_args *a, fx_status *st)
{
    if (detail::expect_states_aligned(a->state, a->saved, "selective_scan", st))
        return st->code;
    return with_cfg(a->n.dstate, [&](auto cfg) {
        typedef decltype(cfg) C;
        FwdLaunch l{};
        if (fwd_launch<T, C>(a, r.d->sm_count, &l, st))
            return st->code;
        if (l.p.units == 0)
            return (int)FX_OK;
        if (l.kernel == FwdKernel::WS_SLICED)
            return detail::launch_sliced_forward<T, C>(r, a, l, st);
        return detail::launch_forward<T, C>(r, l, st);
    });
}

template <typename T> int step(const Run &r, const fx_ssm_step_args *a, fx_status *st)
{
    return with_cfg(a->n.dstate, [&](auto cfg) {
        typedef decltype(cfg) C;
        const StepParams p = step_params(a);
        const int64_t grid = step_grid<C>(p);
        if (grid == 0)
            return (int)FX_OK;
        return launch<ssm_step_kernel<T, C>>(r, grid, kThreads, "selective_scan_step kernel", st, p);
    });
}

namespace detail {

// ---- backward ----

// The sliced backward's tensors on 16 bytes (Realigned).
inline int realign_backward(const Run &r, const fx_ssm_bwd_args *a, BwdParams &bp, Realigned &ra, fx_status *st)
{
    if (realign_input(r, ra, bp.f.x, bytes_of(a->fwd.x), st) || realign_input(r, ra, bp.f.dt, bytes_of(a->fwd.dt), st) ||
        realign_input(r, ra, bp.f.z, bytes_of(a->fwd.z), st) || realign_input(r, ra, bp.f.b, bytes_of(a->fwd.b), st) ||
        realign_input(r, ra, bp.f.c, bytes_of(a->fwd.c), st) || realign_input(r, ra, bp.dy, bytes_of(a->dy), st) ||
        realign_output(r, ra, bp.dx, bytes_of(a->dx), st) || realign_output(r, ra, bp.ddt, bytes_of(a->ddt), st) ||
        realign_output(r, ra, bp.dz, bytes_of(a->dz), st))
        return st->code;
    return FX_OK;
}

// The backward with configuration C (SL: the sliced kernel, C = Cfg<4, 4>):
// its f32 partial sums (every element written by the kernels), the kernel,
// for SL the per-channel gradients from the slices' sums, the sums added
// up and written out.
template <typename T, class C, bool SL>
int launch_backward(const Run &r, const fx_ssm_bwd_args *a, fx_status *st)
{
    const BwdScratch sz = bwd_scratch<C, SL>(a->fwd.n);
    void *scratch = nullptr;
    if (take_scratch(r, fx_size_mul(sz.total, sizeof(float)), "selective_scan_backward sums", &scratch, st))
        return st->code;
    BwdParams bp = bwd_params<C>(a, static_cast<float *>(scratch), sz);
    Realigned ra;
    int rc = SL ? realign_backward(r, a, bp, ra, st) : FX_OK;
    if (rc == FX_OK && grid_of(bp.f) > 0) {
        rc = with_bwd_kernel<T, C, SL>(bp, [&](auto kernel, size_t smem) {
            return launch_opted<decltype(kernel)::value>(r, bwd_grid<SL>(bp), C::BW * 32, smem,
                                                                 "selective_scan_backward kernel", st, bp);
        });
        if (rc == FX_OK && SL)
            rc = launch<ssm_bwd_finish_kernel<T>>(r, bwd_finish_grid(bp.f, r.d->sm_count), kFinishThreads,
                                                          "selective_scan_backward's per-channel kernel", st, bp);
    }
    rc = realign_finish(r, ra, rc, st);
    if (rc == FX_OK)
        rc = launch_sums(r, bwd_sums(a, bp, sz), "selective_scan_backward sums kernel", st);
    give_back(r, scratch);
    return rc;
}

} // namespace detail

template <typename T> int backward(const Run &r, const fx_ssm_bwd_args *a, fx_status *st)
{
    if (detail::expect_states_aligned(nullptr, a->fwd.saved, "selective_scan_backward", st))
        return st->code;
    return with_bwd_config<T>(a, st, [&](auto cfg, auto sl) {
        return detail::launch_backward<T, decltype(cfg), decltype(sl)::value>(r, a, st);
    });
}

// The launchers of one input type: declared `extern` for every type here,
// so that a file that calls them (ssm.cu) instantiates none, and defined by
// that type's unit (ssm_<type>.cu).
#define FX_SSM_INSTANTIATION(KEYWORD, T)                                                               \
    KEYWORD template int forward<T>(const Run &, const fx_ssm_fwd_args *, fx_status *);        \
    KEYWORD template int backward<T>(const Run &, const fx_ssm_bwd_args *, fx_status *);       \
    KEYWORD template int step<T>(const Run &, const fx_ssm_step_args *, fx_status *);

FX_SSM_INSTANTIATION(extern, float)
FX_SSM_INSTANTIATION(extern, __nv_bfloat16)
FX_SSM_INSTANTIATION(extern, __half)

} // namespace fx::cuda::ssm

#endif
