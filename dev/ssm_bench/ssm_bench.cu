// Timing of the selective scan's CUDA kernels outside the NIF: the kernels
// are launched directly (no allocation, no host path) and timed with CUDA
// events, median of `reps` runs, so that variants of one kernel (template
// knobs, launch shapes) can be compared in one call on the GPU machine.
// Built and run on the GPU machine by dev/ssm_bench/run.sh (steps build,
// bench, ncu; also the ssm suite, compute-sanitizer and `make bench`). Not
// part of `make`.
//
//   mode all   every case, one table (default)
//   mode ncu   each main kernel once, for `ncu -k regex:ssm`
//   mode variants  the forward variants compiled in (BENCH_DEFS: -DSSM_VARIANTS,
//                -DSSM_WIDE, -DSSM_SHORT, -DSSM_BASELINE), one table
//   mode ncu-variants  each f32 variant once, for ncu
//   mode sliced [N]  the sliced forward against the tile forward, dstate 32-256 (or N)
//   mode bwd-sliced [N]  the sliced backward against the configuration's, dstate 32-256 (or N)
//   mode fwd-tf  the tile forward's chunk length above dstate 32
//   mode bwd-dstate [16|other|plain]  every dstate against the baseline
//                (built with -DSSM_BASELINE)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

// The "no fence" variants (FwdTune's FENCE 0) instantiate the kernel's
// `FENCE && s % FENCE == ...`, whose modulo the guard never reaches but
// nvcc still flags (179: right operand of "%" is zero) under -Werror.
#pragma nv_diag_suppress 179
#include "cuda/ssm/plan.cuh"
#pragma nv_diag_default 179
#ifdef SSM_BASELINE // a copy of an earlier ssm_kernels.cuh in namespace fx_ssm_base
#include "baseline_kernels.cuh"
#endif

using namespace fx::cuda::ssm;

#include "../cuda_check.h"
#include "../cuda_timing.cuh"

static int g_sms;

// ---- inputs ----

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(float lo, float hi)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) * (1.0 / 16777216.0));
}

struct DevBuf {
    void *p = nullptr;
    size_t bytes = 0;
};

static fx_tensor tensor(fx_dtype type, std::vector<int64_t> dims, float lo, float hi, bool fill = true)
{
    fx_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = type;
    t.rank = (int)dims.size();
    t.numel = 1;
    for (int i = 0; i < t.rank; i++)
        t.dims[i] = dims[i], t.numel *= dims[i];
    size_t esz = type == FX_F32 ? 4 : 2;
    t.nbytes = (size_t)t.numel * esz;
    CUDA_CHECK(cudaMalloc(&t.data, t.nbytes ? t.nbytes : 16));
    if (fill && t.numel) {
        std::vector<float> h((size_t)t.numel);
        for (auto &v : h)
            v = uniform(lo, hi);
        if (type == FX_F32) {
            CUDA_CHECK(cudaMemcpy(t.data, h.data(), t.nbytes, cudaMemcpyHostToDevice));
        } else {
            std::vector<uint16_t> r((size_t)t.numel);
            for (size_t i = 0; i < h.size(); i++) {
                if (type == FX_BF16) {
                    __nv_bfloat16 v = __float2bfloat16_rn(h[i]);
                    r[i] = static_cast<__nv_bfloat16_raw>(v).x;
                } else {
                    __half v = __float2half_rn(h[i]);
                    r[i] = static_cast<__half_raw>(v).x;
                }
            }
            CUDA_CHECK(cudaMemcpy(t.data, r.data(), t.nbytes, cudaMemcpyHostToDevice));
        }
    }
    return t;
}

struct Problem {
    int B, L, D, N;
    fx_dtype type;
    fx_tensor x, dt, z, a, b, c, d, bias, y, y2, state, saved, dy;
    fx_tensor ysum; // the sliced forward's f32 sums of y (launch_fwd_sliced)
    fx_ssm_fwd_args args;
    Problem(int B_, int L_, int D_, int N_, fx_dtype type_)
        : B(B_), L(L_), D(D_), N(N_), type(type_)
    {
        x = tensor(type, {B, L, D}, -1, 1);
        dt = tensor(type, {B, L, D}, -4, 1);
        z = tensor(type, {B, L, D}, -2, 2);
        b = tensor(type, {B, L, N}, -1, 1);
        c = tensor(type, {B, L, N}, -1, 1);
        a = tensor(FX_F32, {D, N}, -3, -0.05f);
        d = tensor(FX_F32, {D}, -1, 1);
        bias = tensor(FX_F32, {D}, -1, 0.5f);
        y = tensor(type, {B, L, D}, 0, 0, false);
        y2 = tensor(type, {B, L, D}, 0, 0, false);
        dy = tensor(type, {B, L, D}, -1, 1);
        state = tensor(FX_F32, {B, D, N}, 0, 0, false);
        ysum = tensor(FX_F32, {B, L, D}, 0, 0, false);
        // the saved states' interval: the backward's chunk for dstate's configuration
        const int64_t every = with_cfg(N, [](auto cfg) { return (int64_t)decltype(cfg)::SAVE; });
        const int64_t chunks = (L + every - 1) / every;
        saved = tensor(FX_F32, {B, chunks > 1 ? chunks - 1 : 0, D, N}, 0, 0, false);
        memset(&args, 0, sizeof args);
        args.n = fx_ssm_dims{B, L, D, N, 1};
        args.x = &x, args.dt = &dt, args.a = &a, args.b = &b, args.c = &c;
        args.d = &d, args.z = &z, args.dt_bias = &bias, args.h0 = nullptr;
        args.dt_softplus = true;
        args.y = &y;
        args.state = nullptr;
        args.saved = nullptr;
        args.save_every = every;
    }
};

// ---- timing ----

static cudaStream_t g_stream;

// Three warm-up launches, then device events around each. With busy_ns 0
// (the main table's forward rows: they were always taken that way) nothing
// runs before a timed launch; the backward rows and the variants table's
// small cases pass a busy-wait, so that the host's enqueue (a memset and
// three launches; a short kernel's own launch) is not timed as GPU time.
static double time_us(const std::function<void()> &launch, int reps, unsigned long long busy_ns = 0)
{
    launch();
    launch();
    return fx_time_us(g_stream, reps, busy_ns, [&](int) { launch(); });
}

static void row(const char *what, const Problem &p, double us, double bytes)
{
    printf("| %-30s | B%d L%d D%d N%d | %s | %9.2f | %7.0f |\n", what, p.B, p.L, p.D, p.N,
           p.type == FX_F32 ? "f32 " : "bf16", us, bytes / us * 1e-3);
    fflush(stdout);
}

// ---- launchers (as in cuda/ssm/launchers.cuh, with the knobs exposed) ----

// A kernel's launch on the bench's stream with `smem` bytes of dynamic
// shared memory, opted in before every launch (the library opts in once
// per device and kernel).
template <typename KERNEL, typename... A>
static void launch_smem(KERNEL kernel, int64_t grid, int threads, size_t smem, const A &...args)
{
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<(unsigned)grid, threads, smem, g_stream>>>(args...);
}

template <typename T, class U = FwdDefault, class C = Cfg<4, 4>>
static void launch_fwd(const fx_ssm_fwd_args *a)
{
    const ScanParams p = scan_params(a, C::WCH);
    const int warps = fwd_block_warps<T, C, U>(p, g_sms);
    const int64_t grid = (p.units + warps - 1) / warps;
    const size_t smem = warps * FwdSmem<T, C, U>::BYTES;
    if (fwd_fast<T, C>(p))
        launch_smem(ssm_fwd_kernel<T, C, true, U>, grid, 32 * warps, smem, p);
    else
        launch_smem(ssm_fwd_kernel<T, C, false, U>, grid, 32 * warps, smem, p);
}

// The states a backward of configuration C starts from (pb.args keeps
// them: the backward's arguments are a copy).
template <typename T, class C> static void forward_saving(Problem &pb)
{
    pb.args.saved = &pb.saved;
    launch_fwd<T, FwdDefault, C>(&pb.args);
}

#ifdef SSM_BASELINE
// The forward of the baseline copy, launched as its ssm.cu did (the
// warp-specialized kernel where it fits, one instantiation per option set:
// a baseline from 6badf12 on).
template <typename T> static void launch_fwd_base(const fx_ssm_fwd_args *a)
{
    namespace B = fx_ssm_base;
    B::FwdLaunch l{};
    fx_status st{};
    if (B::fwd_launch<T, B::Cfg<4, 4>>(a, g_sms, &l, &st) || l.kernel != B::FwdKernel::WS) {
        fprintf(stderr, "baseline: not the warp-specialized path\n");
        exit(1);
    }
    B::with_ws_opts(l.p, [&](auto o) {
        launch_smem(B::ssm_fwd_ws_kernel<T, decltype(o)>, l.grid, 32 * l.warps, l.smem, l.p);
    });
}
#endif

// As ssm::forward: the warp-specialized kernel where it fits, else the
// one-warp-a-tile kernel.
template <typename T, int LOOK = kWsLook> static void launch_fwd_lib(const fx_ssm_fwd_args *a)
{
    typedef Cfg<4, 4> C;
    FwdLaunch l{};
    fx_status st{};
    if (fwd_launch<T, C>(a, g_sms, &l, &st)) {
        fprintf(stderr, "fwd_launch: %s\n", st.msg);
        exit(1);
    }
    if (l.kernel != FwdKernel::WS)
        launch_fwd<T>(a);
    else
        with_ws_opts(l.p, [&](auto o) {
            launch_smem(ssm_fwd_ws_kernel<T, decltype(o), LOOK>, l.grid, 32 * l.warps, l.smem, l.p);
        });
}

// The sliced forward as ssm::forward enqueues it (for any shape
// ws_sliced_shape takes): the sums of y zeroed, the slices, y from the
// sums; `ysum` holds batch * seqlen * dim floats (Problem::ysum).
template <typename T> static void launch_fwd_sliced(const fx_ssm_fwd_args *a, const fx_tensor &ysum_t)
{
    float *ysum = static_cast<float *>(ysum_t.data);
    FwdLaunch l{};
    const ScanParams p = scan_params(a, kWsChannels);
    if (!ws_sliced_shape<T>(p)) {
        fprintf(stderr, "sliced: not a shape the sliced forward takes\n");
        exit(1);
    }
    ws_sliced_launch<T>(p, &l);
    l.p.ysum = ysum;
    CUDA_CHECK(cudaMemsetAsync(ysum, 0, sizeof(float) * (size_t)ysum_floats(l.p), g_stream));
    with_ws_opts<true>(l.p, [&](auto o) {
        launch_smem(ssm_fwd_ws_kernel<T, decltype(o)>, l.grid, 32 * l.warps, l.smem, l.p);
    });
    with_finish_kernel<T>(l.p, [&](auto k) {
        decltype(k)::value<<<(unsigned)finish_grid(l.p, g_sms), kFinishThreads, 0, g_stream>>>(l.p);
    });
}

// The states the sliced forward saves (every 16 steps) for pb: a tensor
// [B, nsaved, D, N].
static fx_tensor saved_every_16(const Problem &pb)
{
    const int64_t chunks = (pb.L + kWsSteps - 1) / kWsSteps;
    return tensor(FX_F32, {pb.B, chunks > 1 ? chunks - 1 : 0, pb.D, pb.N}, 0, 0, false);
}

// rel-L2 distance of two outputs of the input type (on the host).
static double rel_l2(const fx_tensor &a, const fx_tensor &b)
{
    const size_t n = (size_t)a.numel;
    std::vector<float> x(n), y(n);
    if (a.dtype == FX_F32) {
        CUDA_CHECK(cudaMemcpy(x.data(), a.data, a.nbytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(y.data(), b.data, b.nbytes, cudaMemcpyDeviceToHost));
    } else {
        std::vector<uint16_t> rx(n), ry(n);
        CUDA_CHECK(cudaMemcpy(rx.data(), a.data, a.nbytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(ry.data(), b.data, b.nbytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)rx[i] << 16, v = (uint32_t)ry[i] << 16; // bf16
            memcpy(&x[i], &u, 4), memcpy(&y[i], &v, 4);
        }
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)x[i] - y[i];
        num += d * d, den += (double)y[i] * y[i];
        if (std::isnan(x[i]))
            return NAN;
    }
    return std::sqrt(num / den);
}

// The forward variants: each timed on the large case (f32, bf16) and on
// the two small ones (f32), its output compared with the reference
// launcher's (the baseline's where built with it).
struct Variant {
    const char *name;
    std::function<void(const fx_ssm_fwd_args *)> f32, bf16;
};

template <class U> static Variant variant(const char *name)
{
    return Variant{name, [](const fx_ssm_fwd_args *a) { launch_fwd<float, U>(a); },
                   [](const fx_ssm_fwd_args *a) { launch_fwd<__nv_bfloat16, U>(a); }};
}

template <class U, class C> static Variant variant_cfg(const char *name)
{
    return Variant{name, [](const fx_ssm_fwd_args *a) { launch_fwd<float, U, C>(a); },
                   [](const fx_ssm_fwd_args *a) { launch_fwd<__nv_bfloat16, U, C>(a); }};
}

static std::vector<Variant> variants()
{
    std::vector<Variant> v;
#ifdef SSM_BASELINE
    v.push_back(Variant{"baseline (main)", [](const fx_ssm_fwd_args *a) { launch_fwd_base<float>(a); },
                        [](const fx_ssm_fwd_args *a) { launch_fwd_base<__nv_bfloat16>(a); }});
#endif
    v.push_back(Variant{"library (warp-specialized where it fits)", launch_fwd_lib<float>,
                        launch_fwd_lib<__nv_bfloat16>});
    v.push_back(Variant{"warp-specialized, LOOK 3", launch_fwd_lib<float, 3>, launch_fwd_lib<__nv_bfloat16, 3>});
    v.push_back(variant<FwdDefault>("one warp a tile, LOOK 2, fence"));
#ifdef SSM_VARIANTS
    v.push_back(variant<FwdTune<2, 0>>("LOOK 2, no fence"));
    v.push_back(variant<FwdTune<0, 0>>("LOOK 0, no fence"));
    v.push_back(variant<FwdTune<3, 2>>("LOOK 3, fence every 2 steps"));
    v.push_back(variant<FwdTune<3, 1>>("LOOK 3, fence every step"));
    v.push_back(variant<FwdTune<2, 1, 32>>("LOOK 2, fence every step, 32-step chunks"));
#endif
#ifdef SSM_WIDE // a lane holds all 16 states of its channel (b, c reads are warp broadcasts)
    v.push_back(variant_cfg<FwdTune<2, 1, 16, 1>, Cfg<1, 16>>("1 x 16, LOOK 2, fence, T16"));
    v.push_back(variant_cfg<FwdTune<1, 1, 16, 1>, Cfg<1, 16>>("1 x 16, LOOK 1, fence, T16"));
    v.push_back(variant_cfg<FwdTune<1, 0, 16, 1>, Cfg<1, 16>>("1 x 16, LOOK 1, no fence, T16"));
    v.push_back(variant_cfg<FwdTune<2, 1, 8, 1>, Cfg<1, 16>>("1 x 16, LOOK 2, fence, T8"));
    v.push_back(variant_cfg<FwdTune<2, 1, 16, 2>, Cfg<2, 8>>("2 x 8, LOOK 2, fence, T16"));
#endif
#ifdef SSM_SHORT // shorter chunks: a shorter first load and commit for short sequences
    v.push_back(variant<FwdTune<2, 1, 8>>("T8, LOOK 2, fence"));
    v.push_back(variant<FwdTune<1, 1, 8>>("T8, LOOK 1, fence"));
    v.push_back(variant<FwdTune<2, 0, 8>>("T8, LOOK 2, no fence"));
    v.push_back(variant<FwdTune<2, 1, 4>>("T4, LOOK 2, fence"));
    v.push_back(variant<FwdDefault>("default again"));
#endif
    return v;
}

template <typename T> static void launch_step(const StepParams &p)
{
    typedef Cfg<4, 4> C;
    ssm_step_kernel<T, C><<<(unsigned)step_grid<C>(p), kThreads, 0, g_stream>>>(p);
}

// Gradients and f32 sums of one backward.
struct Grads {
    fx_tensor dx, ddt, dz, da, db, dc, dd, dbias;
    float *scratch;
    int64_t scratch_floats;
    fx_ssm_bwd_args args;
    Grads(Problem &pb, fx_tensor *saved, bool sliced = false)
    {
        dx = tensor(pb.type, {pb.B, pb.L, pb.D}, 0, 0, false);
        ddt = tensor(pb.type, {pb.B, pb.L, pb.D}, 0, 0, false);
        dz = tensor(pb.type, {pb.B, pb.L, pb.D}, 0, 0, false);
        da = tensor(FX_F32, {pb.D, pb.N}, 0, 0, false);
        db = tensor(pb.type, {pb.B, pb.L, pb.N}, 0, 0, false);
        dc = tensor(pb.type, {pb.B, pb.L, pb.N}, 0, 0, false);
        dd = tensor(FX_F32, {pb.D}, 0, 0, false);
        dbias = tensor(FX_F32, {pb.D}, 0, 0, false);
        scratch_floats = BwdScratch(pb.args.n, sliced).total;
        CUDA_CHECK(cudaMalloc(&scratch, sizeof(float) * scratch_floats));
        CUDA_CHECK(cudaMemset(scratch, 0, sizeof(float) * scratch_floats));
        memset(&args, 0, sizeof args);
        args.fwd = pb.args;
        args.fwd.saved = saved;
        args.fwd.y = nullptr;
        args.dy = &pb.dy;
        args.dx = &dx, args.ddt = &ddt, args.dz = &dz, args.da = &da, args.db = &db, args.dc = &dc;
        args.dd = &dd, args.ddt_bias = &dbias;
    }
};

// The backward kernel alone, for dstate's configuration C.
template <typename T, class C = Cfg<4, 4>> static BwdParams launch_bwd_kernel(Grads &g, const BwdScratch &sz)
{
    const BwdParams bp = bwd_params<C>(&g.args, g.scratch, sz);
    with_bwd_kernel<T, C>(bp, [&](auto kernel, size_t smem) {
        launch_smem(decltype(kernel)::value, grid_of(bp.f), C::BW * 32, smem, bp);
    });
    return bp;
}

// As the library's launch_backward: zero the sums, the kernel, the sums written out.
template <typename T, class C = Cfg<4, 4>> static void launch_bwd(Grads &g, bool kernel_only = false)
{
    const BwdScratch sz(g.args.fwd.n);
    if (!kernel_only)
        CUDA_CHECK(cudaMemsetAsync(g.scratch, 0, sizeof(float) * sz.total, g_stream));
    const BwdParams bp = launch_bwd_kernel<T, C>(g, sz);
    if (!kernel_only) {
        const fx::cuda::SumRegions sums = bwd_sums(&g.args, bp, sz);
        fx::cuda::write_sums<><<<264, 256, 0, g_stream>>>(sums);
    }
}

// The sliced backward as ssm::backward enqueues it: the zeroed sums,
// the slices, the per-channel kernel, the sums written out (g built with
// `sliced`).
template <typename T> static void launch_bwd_sliced(Grads &g)
{
    typedef Cfg<4, 4> C;
    const BwdScratch sz(g.args.fwd.n, true);
    CUDA_CHECK(cudaMemsetAsync(g.scratch, 0, sizeof(float) * sz.total, g_stream));
    const BwdParams bp = bwd_params<C>(&g.args, g.scratch, sz);
    with_bwd_kernel<T, C, true>(bp, [&](auto kernel, size_t smem) {
        launch_smem(decltype(kernel)::value, bwd_grid<true>(bp), C::BW * 32, smem, bp);
    });
    ssm_bwd_finish_kernel<T><<<(unsigned)bwd_finish_grid(bp.f, g_sms), kFinishThreads, 0, g_stream>>>(bp);
    fx::cuda::write_sums<><<<264, 256, 0, g_stream>>>(bwd_sums(&g.args, bp, sz));
}

#ifdef SSM_BASELINE
// The baseline copy's one-warp-a-tile forward for dstate's configuration C.
template <typename T, class C> static void launch_fwd_base_tile(const fx_ssm_fwd_args *a)
{
    namespace B = fx_ssm_base;
    typedef B::Cfg<C::LANES, C::NPL> BC;
    const B::ScanParams p = B::scan_params(a, BC::WCH);
    const int warps = B::fwd_block_warps<T, BC>(p, g_sms);
    const int64_t grid = (p.units + warps - 1) / warps;
    const size_t smem = warps * B::FwdSmem<T, BC>::BYTES;
    if (B::fwd_fast<T, BC>(p))
        launch_smem(B::ssm_fwd_kernel<T, BC, true>, grid, 32 * warps, smem, p);
    else
        launch_smem(B::ssm_fwd_kernel<T, BC, false>, grid, 32 * warps, smem, p);
}

// The baseline copy's backward kernel alone, launched as its ssm.cu did (a
// baseline from d7def70 on, with_bwd_kernel).
template <typename T, int LANES = 4, int NPL = 4> static void launch_bwd_base_kernel(Grads &g)
{
    namespace B = fx_ssm_base;
    typedef B::Cfg<LANES, NPL> C;
    const B::BwdScratch sz(g.args.fwd.n);
    const B::BwdParams bp = B::bwd_params<C>(&g.args, g.scratch, sz);
    B::with_bwd_kernel<T, C>(bp, [&](auto kernel, size_t smem) {
        launch_smem(decltype(kernel)::value, B::grid_of(bp.f), C::BW * 32, smem, bp);
    });
}
#endif

static StepParams step_of(Problem &pb)
{
    // the step on row t = 0 of the scan's inputs: [batch, dim] = first rows
    // only when L == 1, which is how the step cases are made
    StepParams s = {};
    s.x = pb.x.data, s.dt = pb.dt.data, s.z = pb.z.data, s.b = pb.b.data, s.c = pb.c.data;
    s.a = pb.a.data, s.d = pb.d.data, s.dt_bias = pb.bias.data;
    s.a_type = s.d_type = s.bias_type = FX_F32;
    s.batch = pb.B, s.dim = pb.D, s.dstate = pb.N, s.groups = 1, s.cpg = pb.D;
    s.softplus = true;
    s.state = static_cast<float *>(pb.state.data);
    s.y = pb.y.data;
    return s;
}

__global__ void empty_kernel(float *out)
{
    if (out && threadIdx.x == 0)
        out[blockIdx.x] = 1.0f;
}

// one(cfg, type tag, problem) for B4 L1024 D1024 in f32 and bf16 at each
// dstate N above 16 of `all`, or at the command line's third argument; cfg
// is with_cfg's for N.
template <class One> static void at_dstates(int argc, char **argv, const std::vector<int> &all, One &&one)
{
    const std::vector<int> dstates = argc > 2 ? std::vector<int>{atoi(argv[2])} : all;
    for (int N : dstates)
        with_cfg(N, [&](auto cfg) {
            if constexpr (decltype(cfg)::NPAD > kWsStates) { // above dstate 16
                Problem pf(4, 1024, 1024, N, FX_F32);
                one(cfg, (float *)nullptr, pf);
                Problem ph(4, 1024, 1024, N, FX_BF16);
                one(cfg, (__nv_bfloat16 *)nullptr, ph);
            }
        });
}

static double fwd_bytes(const Problem &p)
{
    double e = p.type == FX_F32 ? 4 : 2;
    return 4.0 * p.B * p.L * p.D * e + 2.0 * p.B * p.L * p.N * e;
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "all";
    CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreate(&g_stream));
    printf("device %s, %d SMs\n", prop.name, g_sms);

    Problem big(8, 2048, 1536, 16, FX_F32);
    Problem bigh(8, 2048, 1536, 16, FX_BF16);

    if (mode == "variants" || mode == "ncu-variants") {
        std::vector<Variant> vs = variants();
        if (mode == "ncu-variants") { // each f32 variant once, for ncu
            for (auto &v : vs)
                v.f32(&big.args);
            CUDA_CHECK(cudaDeviceSynchronize());
            return 0;
        }
        std::vector<Problem *> mid;
        for (int i = 0; i < 4; i++)
            mid.push_back(new Problem(32, 60, 512, 16, FX_F32));
        Problem s1(1, 32, 512, 16, FX_F32);
        // reference outputs: the first variant's, in y2
        auto ref = [&](Problem &pb, const std::function<void(const fx_ssm_fwd_args *)> &f) {
            fx_ssm_fwd_args a = pb.args;
            a.y = &pb.y2;
            f(&a);
            CUDA_CHECK(cudaDeviceSynchronize());
        };
        ref(big, vs[0].f32), ref(bigh, vs[0].bf16), ref(s1, vs[0].f32);
        printf("| variant | f32 B8 L2048 us | bf16 us | f32 B32 L60 us | f32 B1 L32 us | rel-L2 vs first (f32, bf16, B1) |\n");
        printf("|---|---:|---:|---:|---:|---|\n");
        for (auto &v : vs) {
            CUDA_CHECK(cudaMemset(big.y.data, 0xff, big.y.nbytes));
            CUDA_CHECK(cudaMemset(bigh.y.data, 0xff, bigh.y.nbytes));
            CUDA_CHECK(cudaMemset(s1.y.data, 0xff, s1.y.nbytes));
            const double t32 = time_us([&] { v.f32(&big.args); }, 20);
            const double t16 = time_us([&] { v.bf16(&bigh.args); }, 20);
            int k = 0;
            const double tm = time_us([&] { v.f32(&mid[k++ % 4]->args); }, 200, 30000);
            const double ts = time_us([&] { v.f32(&s1.args); }, 300, 30000);
            printf("| %s | %.1f | %.1f | %.2f | %.2f | %.2e, %.2e, %.2e |\n", v.name, t32, t16, tm, ts,
                   rel_l2(big.y, big.y2), rel_l2(bigh.y, bigh.y2), rel_l2(s1.y, s1.y2));
            fflush(stdout);
        }
        return 0;
    }

#ifdef SSM_BASELINE
    // The backward and the tile forward of every dstate configuration (B4
    // L1024 D1024; dstate 16 also at the benchmark's size, bf16, backward
    // only), alternating with the baseline's, each in the configuration the
    // library picks for its dstate (with_cfg); `bwd-dstate 16`, `other` or
    // `plain` (shapes of the plain paths: D1020, dstate 100 and 200) for a part.
    if (mode == "bwd-dstate") {
        printf("| kernel | shape | type | median us | GB/s |\n|---|---|---|---:|---:|\n");
        auto one = [&](auto cfg, auto *tag, fx_dtype type, int N, int B, int L, int D, bool fwd) {
            typedef decltype(cfg) C;
            typedef typename std::remove_pointer<decltype(tag)>::type T;
            static_assert(C::SAVE == fx_ssm_base::Cfg<C::LANES, C::NPL>::SAVE, "the same saved states");
            Problem pb(B, L, D, N, type);
            forward_saving<T, C>(pb);
            Grads g(pb, &pb.saved), gb(pb, &pb.saved);
            launch_bwd_kernel<T, C>(g, BwdScratch(g.args.fwd.n));
            launch_bwd_base_kernel<T, C::LANES, C::NPL>(gb);
            CUDA_CHECK(cudaDeviceSynchronize());
            printf("dstate %d D%d: dx rel-L2 new vs baseline %.2e\n", pb.N, pb.D, rel_l2(g.dx, gb.dx));
            if (fwd) { // the one-warp-a-tile forward (no saved states), y compared
                pb.args.saved = nullptr;
                fx_ssm_fwd_args ab = pb.args;
                ab.y = &pb.y2;
                launch_fwd<T, FwdDefault, C>(&pb.args);
                launch_fwd_base_tile<T, C>(&ab);
                CUDA_CHECK(cudaDeviceSynchronize());
                printf("dstate %d D%d: y rel-L2 new vs baseline %.2e\n", pb.N, pb.D, rel_l2(pb.y, pb.y2));
                for (int round = 0; round < 2; round++) {
                    row("fwd tile kernel (baseline)", pb, time_us([&] { launch_fwd_base_tile<T, C>(&ab); }, 10, 200000), 0);
                    row("fwd tile kernel", pb, time_us([&] { launch_fwd<T, FwdDefault, C>(&pb.args); }, 10, 200000), 0);
                }
            }
            for (int round = 0; round < 2; round++) {
                row("bwd kernel alone (baseline)", pb, time_us([&] { launch_bwd_base_kernel<T, C::LANES, C::NPL>(gb); }, 10, 200000), 0);
                row("bwd kernel alone", pb, time_us([&] { launch_bwd_kernel<T, C>(g, BwdScratch(g.args.fwd.n)); }, 10, 200000), 0);
            }
        };
        // dstate N in f32 and bf16 (bf16 only where !both), the tile forward too where fwd
        auto at = [&](int N, int B, int L, int D, bool fwd, bool both = true) {
            with_cfg(N, [&](auto cfg) {
                if (both)
                    one(cfg, (float *)nullptr, FX_F32, N, B, L, D, fwd);
                one(cfg, (__nv_bfloat16 *)nullptr, FX_BF16, N, B, L, D, fwd);
            });
        };
        const std::string only = argc > 2 ? argv[2] : "";
        if (only == "" || only == "16") {
            at(16, 4, 1024, 1024, true);
            at(16, 8, 2048, 1536, false, false);
        }
        if (only == "" || only == "other")
            for (int N : {4, 8, 32, 64, 128, 256})
                at(N, 4, 1024, 1024, true);
        // the plain paths: 1020 channels are not whole tiles, and dstate 100
        // (200) is not whole rows of 128 (256)
        if (only == "" || only == "plain") {
            at(16, 4, 1024, 1020, true);
            at(100, 4, 1024, 1024, true);
            with_cfg(200, [&](auto cfg) { one(cfg, (float *)nullptr, FX_F32, 200, 4, 1024, 1024, true); });
        }
        return 0;
    }
#endif

    // The tile forward above dstate 32 with shorter chunks than the
    // configuration's T (FwdTune's TF): fewer shared-memory bytes a warp,
    // more warps an SM. Each variant's y must equal the default's bit for
    // bit (the chunk length changes no arithmetic); warps an SM printed.
    if (mode == "fwd-tf") {
        printf("| kernel | shape | type | median us | GB/s |\n|---|---|---|---:|---:|\n");
        auto one = [&](auto cfg, auto *tag, fx_dtype type, int N, int B, int L, int D) {
            typedef decltype(cfg) C;
            typedef typename std::remove_pointer<decltype(tag)>::type T;
            Problem pb(B, L, D, N, type);
            fx_ssm_fwd_args ref = pb.args;
            ref.y = &pb.y2;
            launch_fwd<T, FwdDefault, C>(&ref);
            auto tf = [&](auto u) {
                typedef decltype(u) U;
                constexpr int TS = FwdSmem<T, C, U>::TS;
                if constexpr (TS <= C::T && TS % 2 == 0 && (TS % C::SAVE == 0 || C::SAVE % TS == 0)) {
                    const ScanParams p = scan_params(&pb.args, C::WCH);
                    const int warps = fwd_block_warps<T, C, U>(p, g_sms);
                    const size_t smem = warps * FwdSmem<T, C, U>::BYTES;
                    int blocks = 0;
                    CUDA_CHECK(cudaFuncSetAttribute(ssm_fwd_kernel<T, C, true, U>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, ssm_fwd_kernel<T, C, true, U>,
                                                                             32 * warps, smem));
                    CUDA_CHECK(cudaMemset(pb.y.data, 0xff, pb.y.nbytes));
                    launch_fwd<T, U, C>(&pb.args);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    printf("dstate %d T%d: %zu B a warp, %d warps an SM, %lld warps; y rel-L2 vs default %.2e\n", N,
                           TS, FwdSmem<T, C, U>::BYTES, blocks * warps, (long long)p.units, rel_l2(pb.y, pb.y2));
                    char name[40];
                    snprintf(name, sizeof name, "fwd tile T%d", TS);
                    for (int round = 0; round < 2; round++)
                        row(name, pb, time_us([&] { launch_fwd<T, U, C>(&pb.args); }, 10, 200000), fwd_bytes(pb));
                }
            };
            tf(FwdDefault());
            tf(FwdTune<2, 1, 8>());
            tf(FwdTune<2, 1, 4>());
            tf(FwdTune<2, 1, 2>());
        };
        for (int N : {64, 128, 256})
            for (int big_case = 0; big_case < 2; big_case++)
                with_cfg(N, [&](auto cfg) {
                    const int B = big_case ? 8 : 4, L = big_case ? 2048 : 1024, D = big_case ? 1536 : 1024;
                    one(cfg, (float *)nullptr, FX_F32, N, B, L, D);
                    one(cfg, (__nv_bfloat16 *)nullptr, FX_BF16, N, B, L, D);
                });
        return 0;
    }

    // The sliced forward (slices of 16 states in the warp-specialized
    // kernel, their parts of y summed) beside the one-warp-a-tile forward it
    // replaces, at every dstate above 32 it can take (where the library
    // takes it: ws_sliced_fits): y and the saved states compared, then kernel
    // times without and with saved states (sliced: the sums' memset, the
    // slices and y's kernel, as the launcher enqueues them).
    if (mode == "sliced") {
        printf("| kernel | shape | type | median us | GB/s |\n|---|---|---|---:|---:|\n");
        auto one = [&](auto cfg, auto *tag, Problem &pb) {
            typedef decltype(cfg) C;
            typedef typename std::remove_pointer<decltype(tag)>::type T;
            const int B = pb.B, D = pb.D, N = pb.N;
            fx_tensor saved16 = saved_every_16(pb); // the sliced forward's (pb.saved: the tile's, every C::SAVE)
            fx_ssm_fwd_args tile = pb.args, sliced = pb.args;
            tile.y = &pb.y2;
            auto tile_fwd = [&] { launch_fwd<T, FwdDefault, C>(&tile); };
            auto sliced_fwd = [&] { launch_fwd_sliced<T>(&sliced, pb.ysum); };
            CUDA_CHECK(cudaMemset(pb.y.data, 0xff, pb.y.nbytes));
            CUDA_CHECK(cudaMemset(pb.saved.data, 0xff, pb.saved.nbytes));
            CUDA_CHECK(cudaMemset(saved16.data, 0xff, saved16.nbytes));
            tile.saved = &pb.saved, sliced.saved = &saved16;
            tile_fwd(), sliced_fwd();
            CUDA_CHECK(cudaDeviceSynchronize());
            // the sliced forward's state k is the tile forward's
            // (k + 1) * per - 1 (it saves every 16 steps, the tile forward every C::SAVE)
            const int64_t per = kWsSteps / C::SAVE;
            double worst = 0;
            {
                const size_t row = (size_t)D * N;
                std::vector<float> s8((size_t)pb.saved.numel), s16((size_t)saved16.numel);
                CUDA_CHECK(cudaMemcpy(s8.data(), pb.saved.data, pb.saved.nbytes, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(s16.data(), saved16.data, saved16.nbytes, cudaMemcpyDeviceToHost));
                for (int64_t b = 0; b < B; b++)
                    for (int64_t k = 0; k < saved16.dims[1]; k++)
                        for (size_t e = 0; e < row; e++) {
                            const float u = s16[(b * saved16.dims[1] + k) * row + e];
                            const float v = s8[(b * pb.saved.dims[1] + (k + 1) * per - 1) * row + e];
                            worst = std::isnan(u) ? INFINITY : std::max(worst, (double)std::fabs(u - v));
                        }
            }
            printf("dstate %d: y rel-L2 sliced vs tile %.2e, saved states' largest difference %.2e\n", N,
                   rel_l2(pb.y, pb.y2), worst);
            for (int save = 0; save < 2; save++) {
                tile.saved = save ? &pb.saved : nullptr, sliced.saved = save ? &saved16 : nullptr;
                for (int round = 0; round < 2; round++) {
                    row(save ? "fwd tile + saved (every C::SAVE)" : "fwd tile", pb, time_us(tile_fwd, 10, 200000), fwd_bytes(pb));
                    row(save ? "fwd sliced + saved (every 16)" : "fwd sliced", pb, time_us(sliced_fwd, 10, 200000),
                        fwd_bytes(pb));
                }
            }
        };
        at_dstates(argc, argv, {32, 48, 64, 80, 96, 128, 192, 256}, one);
        return 0;
    }

    // The sliced backward beside the backward of dstate's configuration, at
    // every dstate above 32 it can take, each from the states its forward
    // saves (every 16 steps for the sliced one, every 8 for the other): dx,
    // ddt, dz, db, da, dd, ddt_bias compared, then the whole backward's time
    // (memset, kernels, sums written out).
    if (mode == "bwd-sliced") {
        printf("| kernel | shape | type | median us | GB/s |\n|---|---|---|---:|---:|\n");
        auto one = [&](auto cfg, auto *tag, Problem &pb) {
            typedef decltype(cfg) C;
            typedef typename std::remove_pointer<decltype(tag)>::type T;
            const int N = pb.N;
            forward_saving<T, C>(pb); // every C::SAVE steps, for the configuration's backward
            fx_tensor saved16 = saved_every_16(pb); // for the sliced backward
            fx_ssm_fwd_args a = pb.args;
            a.y = &pb.y2, a.saved = &saved16, a.save_every = kWsSteps;
            launch_fwd_sliced<T>(&a, pb.ysum);
            CUDA_CHECK(cudaDeviceSynchronize());
            Grads g(pb, &pb.saved), gs(pb, &saved16, true);
            launch_bwd<T, C>(g);
            launch_bwd_sliced<T>(gs);
            CUDA_CHECK(cudaDeviceSynchronize());
            printf("dstate %d: rel-L2 sliced vs not: dx %.2e ddt %.2e dz %.2e db %.2e da %.2e dd %.2e dbias %.2e\n", N,
                   rel_l2(gs.dx, g.dx), rel_l2(gs.ddt, g.ddt), rel_l2(gs.dz, g.dz), rel_l2(gs.db, g.db),
                   rel_l2(gs.da, g.da), rel_l2(gs.dd, g.dd), rel_l2(gs.dbias, g.dbias));
            for (int round = 0; round < 2; round++) {
                row("bwd", pb, time_us([&] { launch_bwd<T, C>(g); }, 10, 200000), 0);
                row("bwd sliced", pb, time_us([&] { launch_bwd_sliced<T>(gs); }, 10, 200000), 0);
            }
        };
        at_dstates(argc, argv, {32, 48, 64, 80, 128, 256}, one);
        return 0;
    }

    if (mode == "ncu") {
        launch_fwd_lib<float>(&big.args);
        launch_fwd_lib<__nv_bfloat16>(&bigh.args);
        big.args.saved = &big.saved;
        launch_fwd_lib<float>(&big.args);
        big.args.saved = nullptr;
        Grads g(big, &big.saved);
        launch_bwd<float>(g);
        CUDA_CHECK(cudaDeviceSynchronize());
        return 0;
    }

    printf("| kernel | shape | type | median us | GB/s |\n|---|---|---|---:|---:|\n");
    const int R = 20;
    row("fwd", big, time_us([&] { launch_fwd_lib<float>(&big.args); }, R), fwd_bytes(big));
    row("fwd", bigh, time_us([&] { launch_fwd_lib<__nv_bfloat16>(&bigh.args); }, R), fwd_bytes(bigh));
    {
        big.args.saved = &big.saved;
        row("fwd + saved states", big, time_us([&] { launch_fwd_lib<float>(&big.args); }, R), fwd_bytes(big));
        big.args.saved = nullptr;
        Grads g(big, &big.saved);
        big.args.saved = &big.saved;
        launch_fwd_lib<float>(&big.args); // the states the backward starts from
        big.args.saved = nullptr;
        // a busy-wait first: the host's enqueue of the memset, the kernel and the
        // sums (cudaFuncSetAttribute every time here) would otherwise be timed as
        // a gap after the memset
        const unsigned long long busy = 200000;
        row("bwd (memset, kernel, sums out)", big, time_us([&] { launch_bwd<float>(g); }, 10, busy), 0);
        row("bwd kernel alone", big, time_us([&] { launch_bwd<float>(g, true); }, 10, busy), 0);
#ifdef SSM_BASELINE // the baseline's backward kernel, alternating with this one's; dx compared
        {
            fx_tensor dx_new = tensor(big.type, {big.B, big.L, big.D}, 0, 0, false);
            CUDA_CHECK(cudaMemsetAsync(g.scratch, 0, sizeof(float) * g.scratch_floats, g_stream));
            launch_bwd<float>(g, true);
            CUDA_CHECK(cudaMemcpy(dx_new.data, g.dx.data, g.dx.nbytes, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemset(g.dx.data, 0xff, g.dx.nbytes));
            launch_bwd_base_kernel<float>(g);
            CUDA_CHECK(cudaDeviceSynchronize());
            printf("bwd: dx rel-L2 new vs baseline %.2e\n", rel_l2(dx_new, g.dx));
            for (int round = 0; round < 3; round++) {
                row("bwd kernel alone (baseline)", big, time_us([&] { launch_bwd_base_kernel<float>(g); }, 10, busy), 0);
                row("bwd kernel alone", big, time_us([&] { launch_bwd<float>(g, true); }, 10, busy), 0);
            }
        }
#endif
        row("fwd+bwd", big, time_us([&] {
            big.args.saved = &big.saved;
            launch_fwd_lib<float>(&big.args);
            big.args.saved = nullptr;
            launch_bwd<float>(g);
        }, 10, busy), 0);
    }
    // small cases: several input sets so that L2 does not hold them all
    {
        std::vector<Problem *> sets;
        for (int i = 0; i < 4; i++)
            sets.push_back(new Problem(32, 60, 512, 16, FX_F32));
        int k = 0;
        row("fwd", *sets[0], time_us([&] { launch_fwd_lib<float>(&sets[k++ % 4]->args); }, 200), fwd_bytes(*sets[0]));
    }
    {
        Problem s1(1, 32, 512, 16, FX_F32);
        row("empty kernel (launch floor)", s1,
            time_us([&] { empty_kernel<<<16, 128, 0, g_stream>>>(static_cast<float *>(s1.y2.data)); }, 300), 0);
        row("fwd", s1, time_us([&] { launch_fwd_lib<float>(&s1.args); }, 300), fwd_bytes(s1));
        Problem st(1, 1, 512, 16, FX_F32);
        StepParams sp = step_of(st);
        row("step", st, time_us([&] { launch_step<float>(sp); }, 500), 0);
#ifdef SSM_BASELINE // the baseline's step, alternating with this one's
        {
            namespace B = fx_ssm_base;
            typedef B::Cfg<4, 4> BC;
            static_assert(sizeof(B::StepParams) == sizeof(StepParams), "the same parameters");
            B::StepParams bp;
            memcpy(&bp, &sp, sizeof bp);
            for (int round = 0; round < 2; round++) {
                row("step (baseline)", st, time_us([&] {
                        B::ssm_step_kernel<float, BC><<<(unsigned)B::step_grid<BC>(bp), B::kThreads, 0, g_stream>>>(bp);
                    }, 500), 0);
                row("step", st, time_us([&] { launch_step<float>(sp); }, 500), 0);
            }
        }
#endif
    }
    return 0;
}
