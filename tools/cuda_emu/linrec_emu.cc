// Runs the linrec CUDA kernels (c_src/cuda/linrec_kernels.cuh with the
// shared scan of c_src/cuda/scan.cuh) in the CPU emulator and compares
// every forward, backward and step with the CPU reference backend, over
// awkward shapes and tilings, single tile and look-back alike. f32 only
// (the emulator has no 16-bit types); what it checks is the indexing, the
// tiling and the look-back, which do not depend on the dtype.
//
//   make emu              # build/linrec_emu, then run it
//   build/linrec_emu [seed] [cases]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <ctime>
#include <string>
#include <vector>

#include "cuda/linrec/plan.cuh"

extern "C" const struct fx_linrec_ops fx_cpu_linrec_ops;
extern "C" const fx_backend fx_cpu_backend;

using namespace fxlinrec;

namespace {

std::mt19937_64 rng;
double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
double normal() { return std::normal_distribution<double>(0, 1)(rng); }

// A host tensor the emulated kernels and the CPU reference both use.
struct tensor {
    std::vector<float> values;
    fx_tensor t;
    explicit tensor(std::vector<int64_t> dims)
    {
        memset(&t, 0, sizeof t);
        int64_t n = 1;
        for (int64_t d : dims)
            n *= d;
        values.assign((size_t)(n > 0 ? n : 1), NAN); // poisoned
        t.data = values.data();
        t.dtype = FX_F32;
        t.rank = (int)dims.size();
        for (size_t i = 0; i < dims.size(); i++)
            t.dims[i] = dims[i];
        t.numel = n;
        t.nbytes = (size_t)n * sizeof(float);
    }
    void fill(double lo, double hi)
    {
        for (int64_t i = 0; i < t.numel; i++)
            values[(size_t)i] = (float)uniform(lo, hi);
    }
    void fill_normal(double scale)
    {
        for (int64_t i = 0; i < t.numel; i++)
            values[(size_t)i] = (float)(scale * normal());
    }
    void poison() { std::fill(values.begin(), values.end(), NAN); }
    // Copies and moves point t.data at their own values.
    tensor(const tensor &o) : values(o.values), t(o.t) { t.data = values.data(); }
    tensor(tensor &&o) noexcept : values(std::move(o.values)), t(o.t) { t.data = values.data(); }
    tensor &operator=(tensor o) noexcept
    {
        values.swap(o.values);
        t = o.t;
        t.data = values.data();
        return *this;
    }
};

struct lr_case {
    int kind;
    int64_t B, L, H;
    int reverse, cand_g, h0, dstate, dt_tensor, max_tile, concurrent;
    int vec, group; // channels per lane and lanes per row: 1 and 32, 4 and 8 (f32), 4 and 16 (bf16/f16)
    int staged;     // the forward with its inputs in shared memory (f32 layout)
    int stream;     // the streaming forward and backward (a warp per column of channels; hidden % 4 == 0)
};

std::string describe(const lr_case &c)
{
    char text[256];
    snprintf(text, sizeof text, "%s B%lld L%lld H%lld%s%s%s%s%s tile=%d blocks=%d vec=%d group=%d staged=%d stream=%d",
             (const char *[]){"linear_scan", "mingru", "minlstm", "liquid"}[c.kind], (long long)c.B,
             (long long)c.L, (long long)c.H, c.reverse ? " reverse" : "", c.cand_g ? " g" : "",
             c.h0 ? " h0" : "", c.dstate ? " dstate" : "", c.dt_tensor ? " dt=tensor" : "", c.max_tile,
             c.concurrent, c.vec, c.group, c.staged, c.stream);
    return text;
}

// ---- the launches, as c_src/cuda/linrec.cu makes them ----

std::vector<unsigned long long> scratch; // 8-byte aligned
uint32_t epoch;
int failures;

// As linrec.cu's launch_tiles: block i scans tile i; the look-back scratch
// when tiles chain. `kernel(chained)` runs one thread of the block.
template <typename F>
void launch(fxscan::tiling &t, const plan &pl, const lr_case &c, F &&kernel, size_t stage_bytes = 0)
{
    const bool chained = t.ttiles > 1;
    if (chained) {
        size_t need = (lookback_bytes(t, pl.vec * pl.group) + 7) / 8;
        if (need > scratch.size())
            scratch.assign(need, 0);
        carve_lookback(reinterpret_cast<char *>(scratch.data()), ++epoch, t);
    }
    emu_launch((unsigned)(t.ctiles * t.ttiles), 32 * pl.warps, c.concurrent, [&] { kernel(chained); },
               stage_bytes);
}

// The kernels with V channels per lane and G lanes per row: (1, 32) is
// the scalar path, (4, 8) the f32 vector path, (4, 16) the bf16/f16 one.
template <int KIND, int V, int G> void emu_forward_with(const fx_linrec_fwd_args *a, const lr_case &c)
{
    fx_cuda_device d = {132};
    constexpr int S = fwd_steps<KIND, float, V>();
    plan pl = make_plan(&d, &a->p, V, G, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, a->p.reverse);
    const fwd_params prm = make_fwd_params(a);
    constexpr bool cg = KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM;
    launch(t, pl, c, [&](bool chained) {
        if (a->p.candidate_g)
            chained ? forward_kernel<KIND, float, V, G, S, cg, true>(prm, t)
                    : forward_kernel<KIND, float, V, G, S, cg, false>(prm, t);
        else
            chained ? forward_kernel<KIND, float, V, G, S, false, true>(prm, t)
                    : forward_kernel<KIND, float, V, G, S, false, false>(prm, t);
    });
}

// The staged forward (inputs in shared memory), on the f32 vector layout.
template <int KIND> void emu_forward_staged(const fx_linrec_fwd_args *a, const lr_case &c)
{
    fx_cuda_device d = {132};
    constexpr int S = kStagedFwdSteps;
    plan pl = make_plan(&d, &a->p, 4, 8, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, a->p.reverse);
    const fwd_params prm = make_fwd_params(a);
    constexpr bool cg = KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM;
    launch(
        t, pl, c,
        [&](bool chained) {
            if (a->p.candidate_g)
                chained ? forward_staged_kernel<KIND, float, 4, 8, S, cg, true>(prm, t)
                        : forward_staged_kernel<KIND, float, 4, 8, S, cg, false>(prm, t);
            else
                chained ? forward_staged_kernel<KIND, float, 4, 8, S, false, true>(prm, t)
                        : forward_staged_kernel<KIND, float, 4, 8, S, false, false>(prm, t);
        },
        fwd_stage_bytes<KIND, float, 4>(pl.steps, pl.warps));
}

// A streaming kernel (`run` runs one thread of it), launched as linrec.cu's
// launch_stream does; a case whose layout does not allow it fails.
template <int KIND, bool BACKWARD, typename Args, typename Run>
void emu_stream(const Args *a, const lr_case &c, Run &&run)
{
    if (!stream_fits(a, 4)) {
        printf("FAIL %s: the streaming kernel does not fit\n", describe(c).c_str());
        failures++;
        return;
    }
    const stream_tiling s = make_stream_tiling(&a->p, 4, BACKWARD);
    const unsigned blocks = (unsigned)((s.batch * s.columns + kStreamWarps - 1) / kStreamWarps);
    // the launcher's choice of variant (linrec.cu: has_cand && candidate_g)
    const size_t bytes = a->p.candidate_g ? stream_block_bytes<KIND, BACKWARD, has_cand<KIND>()>()
                                          : stream_block_bytes<KIND, BACKWARD, false>();
    emu_launch(blocks, 32 * kStreamWarps, c.concurrent, [&] { run(s); }, bytes);
}

template <int KIND> void emu_forward_stream(const fx_linrec_fwd_args *a, const lr_case &c)
{
    const fwd_params prm = make_fwd_params(a);
    constexpr bool cg = KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM;
    emu_stream<KIND, false>(a, c, [&](const stream_tiling &s) {
        a->p.candidate_g ? forward_stream_kernel<KIND, float, cg>(prm, s)
                         : forward_stream_kernel<KIND, float, false>(prm, s);
    });
}

template <int KIND> void emu_backward_stream(const fx_linrec_bwd_args *a, const bwd_params &prm, const lr_case &c)
{
    constexpr bool cg = KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM;
    emu_stream<KIND, true>(a, c, [&](const stream_tiling &s) {
        a->p.candidate_g ? backward_stream_kernel<KIND, float, cg>(prm, s)
                         : backward_stream_kernel<KIND, float, false>(prm, s);
    });
}

template <int KIND> void emu_forward(const fx_linrec_fwd_args *a, const lr_case &c)
{
    if (c.stream)
        emu_forward_stream<KIND>(a, c);
    else if (c.vec == 4 && c.group == 8 && c.staged)
        emu_forward_staged<KIND>(a, c);
    else if (c.vec == 4 && c.group == 16)
        emu_forward_with<KIND, 4, 16>(a, c);
    else if (c.vec == 4)
        emu_forward_with<KIND, 4, 8>(a, c);
    else
        emu_forward_with<KIND, 1, 32>(a, c);
}

template <int KIND, int V, int G>
void emu_backward_with(const fx_linrec_bwd_args *a, const bwd_params &prm, const lr_case &c)
{
    fx_cuda_device d = {132};
    constexpr int S = bwd_steps<KIND, float, V>();
    plan pl = make_plan(&d, &a->p, V, G, S, a->max_tile_steps);
    fxscan::tiling t = make_tiling(&a->p, pl, !a->p.reverse);
    constexpr bool cg = KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM;
    launch(t, pl, c, [&](bool chained) {
        if (a->p.candidate_g)
            chained ? backward_kernel<KIND, float, V, G, S, cg, true>(prm, t)
                    : backward_kernel<KIND, float, V, G, S, cg, false>(prm, t);
        else
            chained ? backward_kernel<KIND, float, V, G, S, false, true>(prm, t)
                    : backward_kernel<KIND, float, V, G, S, false, false>(prm, t);
    });
}

template <int KIND> void emu_backward(const fx_linrec_bwd_args *a, const lr_case &c)
{
    // the sums the kernels store rather than add to are NaN until then:
    // each must be written
    std::vector<float> sums((size_t)sum_count(a, c.stream, 4), NAN);
    std::fill(sums.begin(), sums.begin() + zeroed_sum_count(a, c.stream, 4), 0.f);
    const bwd_params prm = make_bwd_params(a, KIND == FX_LINREC_LIQUID ? sums.data() : nullptr);
    if (c.stream)
        emu_backward_stream<KIND>(a, prm, c);
    else if (c.vec == 4 && c.group == 16)
        emu_backward_with<KIND, 4, 16>(a, prm, c);
    else if (c.vec == 4)
        emu_backward_with<KIND, 4, 8>(a, prm, c);
    else
        emu_backward_with<KIND, 1, 32>(a, prm, c);
    if (KIND == FX_LINREC_LIQUID) {
        const fx_sum_regions s = liquid_sums(a, prm, c.stream, 4);
        emu_launch(3, 32, 3, [&] { fx_write_sums<>(s); });
    }
}

template <int KIND> void emu_step(const fx_linrec_step_args *a)
{
    const step_params prm = make_step_params(a);
    emu_launch(2, 64, 2, [&] {
        if (a->p.candidate_g)
            step_kernel<KIND, float, KIND == FX_LINREC_MINGRU || KIND == FX_LINREC_MINLSTM>(prm);
        else
            step_kernel<KIND, float, false>(prm);
    });
}

template <typename F> void by_kind(int kind, F &&f)
{
    switch (kind) {
    case 0: f(std::integral_constant<int, 0>{}); break;
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 3>{}); break;
    }
}

// Every input of a case, as the kernels and the reference read them.
struct case_inputs {
    std::vector<tensor> seq;
    tensor tau = one(), lam = one(), dt = one(), h0 = one(), dh = one(), dstate = one();
    static tensor one() { return tensor(std::vector<int64_t>{1}); }
};

// Whether sequence input k of `kind` goes through a sigmoid.
bool is_logits(int kind, int k)
{
    return (kind == FX_LINREC_MINGRU && k == 0) || (kind == FX_LINREC_MINLSTM && k < 2) ||
           (kind == FX_LINREC_LIQUID && k == 0);
}

// The same inputs with every value moved by one f32 ulp, up or down at
// random: the rounding any f32 implementation makes of its inputs and of
// the intermediates it forms from them. A logit also moves (away from 0)
// by what moves its sigmoid by one f32 ulp of 1, 2^-24 / sigmoid'(x): the
// kernels form sigmoid(-x) as 1 - sigmoid(x), as torch's sigmoid backward
// does, exact only to that ulp (capped at 32: sigmoid is 1 in f32 by then).
case_inputs nudged(const case_inputs &in, int kind)
{
    case_inputs out = in;
    auto nudge = [](tensor &t) {
        for (float &v : t.values)
            v = nextafterf(v, rng() & 1 ? INFINITY : -INFINITY);
    };
    for (size_t k = 0; k < out.seq.size(); k++) {
        nudge(out.seq[k]);
        if (is_logits(kind, (int)k))
            for (float &v : out.seq[k].values) {
                double s = 1 / (1 + exp(-(double)v));
                v = (float)(v + copysign(fmin(ldexp(1.0, -24) / (s * (1 - s)), 32.0), v));
            }
    }
    for (tensor *t : {&out.tau, &out.lam, &out.dt, &out.h0, &out.dh, &out.dstate})
        nudge(*t);
    return out;
}

fx_linrec_problem problem(const lr_case &c, case_inputs &in)
{
    fx_linrec_problem p = {};
    p.kind = c.kind;
    p.batch = c.B;
    p.seqlen = c.L;
    p.hidden = c.H;
    p.dtype = FX_F32;
    p.nseq = (int)in.seq.size();
    for (int k = 0; k < p.nseq; k++)
        p.seq[k] = &in.seq[k].t;
    if (c.kind == FX_LINREC_LIQUID) {
        p.tau = &in.tau.t;
        p.lam = &in.lam.t;
        p.dt = c.dt_tensor ? &in.dt.t : nullptr;
        p.dt_value = 0.3;
    }
    p.candidate_g = c.cand_g;
    p.reverse = c.reverse;
    return p;
}

// What one phase (forward, backward, step) writes, by name.
struct outputs {
    std::vector<std::pair<std::string, tensor>> all;
    outputs() { all.reserve(8); } // add's references stay valid (no phase has more)
    tensor &add(const char *name, std::vector<int64_t> dims)
    {
        all.emplace_back(name, tensor(dims));
        return all.back().second;
    }
};

// One phase by the emulated kernels, or by the CPU reference (`ref`).
template <typename A, typename E>
void run_phase(bool emu, int (*ref)(const fx_exec *, const A *, fx_status *), const A *args, E &&emulated)
{
    if (emu) {
        emulated();
        return;
    }
    fx_status st;
    fx_status_clear(&st);
    fx_exec ex;
    fx_cpu_backend.exec_default(0, &ex, &st);
    ref(&ex, args, &st);
}

// A case's three phases, each run by the emulated kernels (emu) or by the
// CPU reference. The backward reads the reference forward's h (h_fwd).
outputs forward(const lr_case &c, case_inputs &in, bool emu)
{
    outputs o;
    tensor &h = o.add("h", {c.B, c.L, c.H}), &state = o.add("state", {c.B, c.H});
    fx_linrec_fwd_args fa = {problem(c, in), c.h0 ? &in.h0.t : nullptr, &h.t, &state.t, 0};
    run_phase(emu, fx_cpu_linrec_ops.forward, &fa, [&] {
        fa.max_tile_steps = c.max_tile;
        by_kind(c.kind, [&](auto k) { emu_forward<decltype(k)::value>(&fa, c); });
    });
    return o;
}

outputs backward(const lr_case &c, case_inputs &in, const tensor &h_fwd, bool emu)
{
    outputs o;
    std::vector<int64_t> sdims = {c.B, c.L, c.H}, bdims = {c.B, c.H}, hdims = {c.H};
    const bool liquid = c.kind == FX_LINREC_LIQUID;
    fx_linrec_bwd_args ba = {};
    ba.p = problem(c, in);
    ba.h0 = c.h0 ? &in.h0.t : nullptr;
    ba.h = &h_fwd.t;
    ba.dh = &in.dh.t;
    ba.dstate = c.dstate ? &in.dstate.t : nullptr;
    for (int k = 0; k < ba.p.nseq; k++)
        ba.dseq[k] = &o.add("dseq", sdims).t;
    if (liquid) {
        ba.dtau = &o.add("dtau", hdims).t;
        ba.dlam = &o.add("da", hdims).t;
        if (c.dt_tensor)
            ba.ddt = &o.add("ddt", {c.B, c.L, 1}).t;
    }
    if (c.h0)
        ba.dh0 = &o.add("dh0", bdims).t;
    run_phase(emu, fx_cpu_linrec_ops.backward, &ba, [&] {
        ba.max_tile_steps = c.max_tile;
        by_kind(c.kind, [&](auto k) { emu_backward<decltype(k)::value>(&ba, c); });
    });
    return o;
}

// The first frame of the sequence, from h0 (or zeros).
outputs step(const lr_case &c, case_inputs &in, bool emu)
{
    outputs o;
    std::vector<int64_t> bdims = {c.B, c.H};
    tensor &h = o.add("step h", bdims), &state = o.add("step state", bdims);
    std::vector<tensor> frames;
    for (size_t k = 0; k < in.seq.size(); k++) {
        frames.emplace_back(bdims);
        for (int64_t b = 0; b < c.B; b++)
            memcpy(&frames[k].values[(size_t)(b * c.H)], &in.seq[k].values[(size_t)(b * c.L * c.H)],
                   sizeof(float) * (size_t)c.H);
    }
    tensor fdt(std::vector<int64_t>{c.B, 1});
    for (int64_t b = 0; b < c.B; b++)
        fdt.values[(size_t)b] = in.dt.values[(size_t)(b * c.L)];
    for (int64_t i = 0; i < c.B * c.H; i++)
        state.values[(size_t)i] = c.h0 ? in.h0.values[(size_t)i] : 0.f;
    fx_linrec_step_args sa = {};
    sa.p = problem(c, in);
    sa.p.seqlen = 1;
    sa.p.reverse = 0;
    for (size_t k = 0; k < frames.size(); k++)
        sa.p.seq[k] = &frames[k].t;
    sa.p.dt = c.kind == FX_LINREC_LIQUID && c.dt_tensor ? &fdt.t : nullptr;
    sa.state = &state.t;
    sa.h = &h.t;
    run_phase(emu, fx_cpu_linrec_ops.step, &sa,
              [&] { by_kind(c.kind, [&](auto k) { emu_step<decltype(k)::value>(&sa); }); });
    return o;
}

double l2(const tensor &t) { double s = 0; for (float v : t.values) s += (double)v * v; return sqrt(s); }

double l2_diff(const tensor &a, const tensor &b)
{
    double s = 0;
    for (size_t i = 0; i < a.values.size(); i++) {
        double d = (double)a.values[i] - b.values[i];
        s += d * d;
    }
    return s; // NaN stays NaN
}

// Compares each output of the emulated phase with the reference's. The
// bound is the rel-L2 rule plus a rounding floor: 8x the largest move of
// that output under three draws of `nudged` inputs (`again` runs the
// reference on them). Where an output is a near-cancellation (h = a h0 + b
// with a h0 ~ -b, dh + dstate ~ 0) or a logit's gradient at a large logit,
// the floor is what an f32 implementation may be off by; elsewhere it is
// far below 1e-5 ||ref|| and the plain rule decides. An indexing or carry
// error is O(||ref||).
template <typename F> void expect_all(const lr_case &c, const outputs &got, const outputs &want, F &&again)
{
    std::vector<double> floor(want.all.size(), 0.0);
    for (int draw = 0; draw < 3; draw++) {
        outputs moved = again();
        for (size_t i = 0; i < want.all.size(); i++)
            floor[i] = std::max(floor[i], sqrt(l2_diff(moved.all[i].second, want.all[i].second)));
    }
    for (size_t i = 0; i < want.all.size(); i++) {
        const tensor &g = got.all[i].second, &w = want.all[i].second;
        const std::string &name = want.all[i].first;
        double err = sqrt(l2_diff(g, w)), ref = l2(w);
        double tol = (name == "dtau" || name == "da" || name == "ddt") ? 2e-5 : 1e-5;
        if (!(err <= tol * ref + 8 * floor[i])) {
            printf("FAIL %s of %s: rel-L2 %.3g (floor %.3g)\n", name.c_str(), describe(c).c_str(),
                   ref > 0 ? err / ref : err, ref > 0 ? floor[i] / ref : floor[i]);
            failures++;
        }
    }
}

// ---- one case: forward, backward and (for the first frame) step ----

void run_case(const lr_case &c)
{
    const int nseq = c.kind == FX_LINREC_MINLSTM ? 3 : c.kind == FX_LINREC_LIQUID ? 1 : 2;
    std::vector<int64_t> sdims = {c.B, c.L, c.H}, bdims = {c.B, c.H}, hdims = {c.H};
    case_inputs in;
    for (int k = 0; k < nseq; k++) {
        in.seq.emplace_back(sdims);
        bool cand = (c.kind == FX_LINREC_MINGRU && k == 1) || (c.kind == FX_LINREC_MINLSTM && k == 2);
        if (c.kind == FX_LINREC_SCAN)
            k == 0 ? in.seq[k].fill(0.9, 1.0) : in.seq[k].fill(-1, 1);
        else if (cand)
            in.seq[k].fill(-2, 2);
        else
            in.seq[k].fill_normal(2);
    }
    in.tau = tensor(hdims);
    in.lam = tensor(hdims);
    in.dt = tensor({c.B, c.L, 1});
    in.h0 = tensor(bdims);
    in.dh = tensor(sdims);
    in.dstate = tensor(bdims);
    in.tau.fill(0.5, 3);
    in.lam.fill(-2, 2);
    in.dt.fill(0.05, 1);
    in.h0.fill(-1, 1);
    in.dh.fill(-1, 1);
    in.dstate.fill(-1, 1);

    outputs fwd_ref = forward(c, in, false);
    expect_all(c, forward(c, in, true), fwd_ref, [&] {
        case_inputs moved = nudged(in, c.kind);
        return forward(c, moved, false);
    });

    // the backward from the reference forward's h (itself nudged in the floor's runs)
    const tensor &h_ref = fwd_ref.all[0].second;
    expect_all(c, backward(c, in, h_ref, true), backward(c, in, h_ref, false), [&] {
        case_inputs moved = nudged(in, c.kind);
        tensor h_moved = h_ref;
        for (float &v : h_moved.values)
            v = nextafterf(v, rng() & 1 ? INFINITY : -INFINITY);
        return backward(c, moved, h_moved, false);
    });

    expect_all(c, step(c, in, true), step(c, in, false), [&] {
        case_inputs moved = nudged(in, c.kind);
        return step(c, moved, false);
    });
}

} // namespace

int main(int argc, char **argv)
{
    unsigned long long seed = argc > 1 ? strtoull(argv[1], nullptr, 10) : (unsigned long long)time(nullptr);
    int count = argc > 2 ? atoi(argv[2]) : 64;
    rng.seed(seed);
    printf("linrec kernels in the CUDA emulator, seed %llu\n", seed);
    emu_set_jitter(3);
    const int64_t shapes[][3] = {{1, 1, 1},   {1, 2, 36},  {2, 5, 7},    {3, 17, 28},
                                 {1, 31, 64}, {2, 64, 66}, {1, 97, 4},   {1, 130, 40},
                                 {2, 300, 3}, {1, 520, 36}, {2, 45, 132}, {1, 7, 68}};
    const int tiles[] = {0, 1, 2, 3, 5, 17, 40};
    const int nshapes = sizeof shapes / sizeof shapes[0], ntiles = sizeof tiles / sizeof tiles[0];
    int runs = 0;
    if (getenv("EMU_CASE")) { // kind,B,L,H,reverse,g,h0,dstate,dt,tile,blocks[,vec,group,stream]
        lr_case c = {};
        c.vec = 1;
        c.group = 32;
        sscanf(getenv("EMU_CASE"), "%d,%lld,%lld,%lld,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", &c.kind,
               (long long *)&c.B, (long long *)&c.L, (long long *)&c.H, &c.reverse, &c.cand_g, &c.h0,
               &c.dstate, &c.dt_tensor, &c.max_tile, &c.concurrent, &c.vec, &c.group, &c.stream);
        run_case(c);
        printf("%s: %d failures\n", describe(c).c_str(), failures);
        return failures ? 1 : 0;
    }
    for (int i = 0; i < count; i++) {
        lr_case c = {};
        c.kind = i % 4;
        const int64_t *s = shapes[(i / 4 + i) % nshapes];
        c.B = s[0];
        c.L = s[1];
        c.H = s[2];
        c.reverse = (i / 2) % 2;
        c.cand_g = (i / 3) % 2;
        c.h0 = (i / 5) % 2;
        c.dstate = (i / 7) % 2 || !c.h0;
        c.dt_tensor = (i / 4) % 2;
        c.max_tile = tiles[(i * 5 + i / 7) % ntiles];
        c.concurrent = 1 + (i % 4);
        // scalar, f32 vector, 16-bit vector, streaming
        const int layout = c.H % 4 == 0 ? (i / 2) % 4 : 0;
        c.vec = layout == 1 || layout == 2 ? 4 : 1;
        c.group = c.vec == 1 ? 32 : layout == 1 ? 8 : 16;
        c.staged = layout == 1 && (i / 5) % 2;
        c.stream = layout == 3;
        run_case(c);
        runs++;
    }
    printf("%d cases, %d failures\n", runs, failures);
    return failures ? 1 : 0;
}
