// Runs the linrec CUDA kernels (c_src/cuda/linrec_kernels.cuh with the
// shared scan of c_src/cuda/scan.cuh) in the CPU emulator and compares
// every forward, backward and step with the CPU reference backend, over
// awkward shapes and tilings, single tile and look-back alike. f32 only
// (the emulator has no 16-bit types); what it checks is the indexing, the
// tiling and the look-back, which do not depend on the dtype.
//
//   make emu              # build/linrec_emu, then run it
//   build/linrec_emu [seed] [cases]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <ctime>
#include <string>
#include <vector>

#include "cuda/linrec_kernels.cuh"

extern "C" const struct fx_linrec_ops fx_cpu_linrec_ops;

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
};

double rel_l2(const tensor &got, const tensor &want)
{
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < want.t.numel; i++) {
        double g = got.values[(size_t)i], w = want.values[(size_t)i];
        if (std::isnan(g) || std::isnan(w))
            return INFINITY;
        diff += (g - w) * (g - w);
        ref += w * w;
    }
    return ref == 0 ? (diff == 0 ? 0 : INFINITY) : sqrt(diff / ref);
}

struct lr_case {
    int kind;
    int64_t B, L, H;
    int reverse, cand_g, h0, dstate, dt_tensor, max_tile, concurrent;
    int vec, group; // channels per lane and lanes per row: 1 and 32, 4 and 8 (f32), 4 and 16 (bf16/f16)
    int staged;     // the forward with its inputs in shared memory (f32 layout)
};

std::string describe(const lr_case &c)
{
    char text[256];
    snprintf(text, sizeof text, "%s B%lld L%lld H%lld%s%s%s%s%s tile=%d blocks=%d vec=%d group=%d staged=%d",
             (const char *[]){"linear_scan", "mingru", "minlstm", "liquid"}[c.kind], (long long)c.B,
             (long long)c.L, (long long)c.H, c.reverse ? " reverse" : "", c.cand_g ? " g" : "",
             c.h0 ? " h0" : "", c.dstate ? " dstate" : "", c.dt_tensor ? " dt=tensor" : "", c.max_tile,
             c.concurrent, c.vec, c.group, c.staged);
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

template <int KIND> void emu_forward(const fx_linrec_fwd_args *a, const lr_case &c)
{
    if (c.vec == 4 && c.group == 8 && c.staged)
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
    std::vector<float> sums((size_t)sum_count(a), 0.f);
    const bwd_params prm = make_bwd_params(a, KIND == FX_LINREC_LIQUID ? sums.data() : nullptr);
    if (c.vec == 4 && c.group == 16)
        emu_backward_with<KIND, 4, 16>(a, prm, c);
    else if (c.vec == 4)
        emu_backward_with<KIND, 4, 8>(a, prm, c);
    else
        emu_backward_with<KIND, 1, 32>(a, prm, c);
    if (KIND == FX_LINREC_LIQUID) {
        emu_launch(2, 64, 2, [&] { write_sums<float>(prm.sum_tau, (float *)a->dtau->data, a->p.hidden); });
        emu_launch(2, 64, 2, [&] { write_sums<float>(prm.sum_lam, (float *)a->dlam->data, a->p.hidden); });
        if (a->ddt)
            emu_launch(3, 32, 3, [&] {
                write_sums<float>(prm.sum_dt, (float *)a->ddt->data, a->p.batch * a->p.seqlen);
            });
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

void expect(const char *what, const lr_case &c, const tensor &got, const tensor &want, double tol)
{
    double err = rel_l2(got, want);
    if (!(err <= tol)) {
        printf("FAIL %s of %s: rel-L2 %.3g\n", what, describe(c).c_str(), err);
        failures++;
    }
}

// ---- one case: forward, backward and (for the first frame) step ----

void run_case(const lr_case &c)
{
    const int nseq = c.kind == FX_LINREC_MINLSTM ? 3 : c.kind == FX_LINREC_LIQUID ? 1 : 2;
    std::vector<int64_t> sdims = {c.B, c.L, c.H}, bdims = {c.B, c.H}, hdims = {c.H},
                         tdims = {c.B, c.L, 1};
    std::vector<tensor> seq;
    for (int k = 0; k < nseq; k++) {
        seq.emplace_back(sdims);
        bool cand = (c.kind == FX_LINREC_MINGRU && k == 1) || (c.kind == FX_LINREC_MINLSTM && k == 2);
        if (c.kind == FX_LINREC_SCAN)
            k == 0 ? seq[k].fill(0.9, 1.0) : seq[k].fill(-1, 1);
        else if (cand)
            seq[k].fill(-2, 2);
        else
            seq[k].fill_normal(2);
    }
    tensor tau(hdims), lam(hdims), dt(tdims), h0(bdims), dh(sdims), dstate(bdims);
    tau.fill(0.5, 3);
    lam.fill(-2, 2);
    dt.fill(0.05, 1);
    h0.fill(-1, 1);
    dh.fill(-1, 1);
    dstate.fill(-1, 1);

    fx_linrec_problem p = {};
    p.kind = c.kind;
    p.batch = c.B;
    p.seqlen = c.L;
    p.hidden = c.H;
    p.dtype = FX_F32;
    p.nseq = nseq;
    for (int k = 0; k < nseq; k++)
        p.seq[k] = &seq[k].t;
    if (c.kind == FX_LINREC_LIQUID) {
        p.tau = &tau.t;
        p.lam = &lam.t;
        p.dt = c.dt_tensor ? &dt.t : nullptr;
        p.dt_value = 0.3;
    }
    p.candidate_g = c.cand_g;
    p.reverse = c.reverse;

    // forward
    tensor h_emu(sdims), h_ref(sdims), s_emu(bdims), s_ref(bdims);
    fx_linrec_fwd_args fa = {p, c.h0 ? &h0.t : nullptr, &h_ref.t, &s_ref.t, 0};
    fx_status st;
    fx_status_clear(&st);
    fx_cpu_linrec_ops.forward(0, &fa, &st);
    fa.h = &h_emu.t;
    fa.state = &s_emu.t;
    fa.max_tile_steps = c.max_tile;
    by_kind(c.kind, [&](auto k) { emu_forward<decltype(k)::value>(&fa, c); });
    expect("h", c, h_emu, h_ref, 1e-5);
    expect("state", c, s_emu, s_ref, 1e-5);

    // backward, from the reference forward's h
    std::vector<tensor> dseq_emu, dseq_ref;
    for (int k = 0; k < nseq; k++) {
        dseq_emu.emplace_back(sdims);
        dseq_ref.emplace_back(sdims);
    }
    tensor dtau_e(hdims), dtau_r(hdims), dlam_e(hdims), dlam_r(hdims), ddt_e(tdims), ddt_r(tdims),
        dh0_e(bdims), dh0_r(bdims);
    fx_linrec_bwd_args ba = {};
    ba.p = p;
    ba.h0 = c.h0 ? &h0.t : nullptr;
    ba.h = &h_ref.t;
    ba.dh = &dh.t;
    ba.dstate = c.dstate ? &dstate.t : nullptr;
    bool liquid = c.kind == FX_LINREC_LIQUID;
    auto point = [&](bool emu) {
        for (int k = 0; k < nseq; k++)
            ba.dseq[k] = emu ? &dseq_emu[k].t : &dseq_ref[k].t;
        ba.dtau = liquid ? (emu ? &dtau_e.t : &dtau_r.t) : nullptr;
        ba.dlam = liquid ? (emu ? &dlam_e.t : &dlam_r.t) : nullptr;
        ba.ddt = liquid && c.dt_tensor ? (emu ? &ddt_e.t : &ddt_r.t) : nullptr;
        ba.dh0 = c.h0 ? (emu ? &dh0_e.t : &dh0_r.t) : nullptr;
    };
    point(false);
    ba.max_tile_steps = 0;
    fx_cpu_linrec_ops.backward(0, &ba, &st);
    point(true);
    ba.max_tile_steps = c.max_tile;
    by_kind(c.kind, [&](auto k) { emu_backward<decltype(k)::value>(&ba, c); });
    for (int k = 0; k < nseq; k++)
        expect("dseq", c, dseq_emu[k], dseq_ref[k], 1e-5);
    if (liquid) {
        expect("dtau", c, dtau_e, dtau_r, 2e-5);
        expect("da", c, dlam_e, dlam_r, 2e-5);
        if (c.dt_tensor)
            expect("ddt", c, ddt_e, ddt_r, 2e-5);
    }
    if (c.h0)
        expect("dh0", c, dh0_e, dh0_r, 1e-5);

    // step: the first frame of the sequence, from h0 (or zeros)
    std::vector<tensor> frames;
    for (int k = 0; k < nseq; k++) {
        frames.emplace_back(bdims);
        for (int64_t b = 0; b < c.B; b++)
            memcpy(&frames[k].values[(size_t)(b * c.H)], &seq[k].values[(size_t)(b * c.L * c.H)],
                   sizeof(float) * (size_t)c.H);
    }
    tensor fdt(std::vector<int64_t>{c.B, 1});
    for (int64_t b = 0; b < c.B; b++)
        fdt.values[(size_t)b] = dt.values[(size_t)(b * c.L)];
    tensor state_e(bdims), state_r(bdims), hs_e(bdims), hs_r(bdims);
    for (int64_t i = 0; i < c.B * c.H; i++)
        state_e.values[(size_t)i] = state_r.values[(size_t)i] = c.h0 ? h0.values[(size_t)i] : 0.f;
    fx_linrec_step_args sa = {};
    sa.p = p;
    sa.p.seqlen = 1;
    sa.p.reverse = 0;
    for (int k = 0; k < nseq; k++)
        sa.p.seq[k] = &frames[k].t;
    sa.p.dt = liquid && c.dt_tensor ? &fdt.t : nullptr;
    sa.state = &state_r.t;
    sa.h = &hs_r.t;
    fx_cpu_linrec_ops.step(0, &sa, &st);
    sa.state = &state_e.t;
    sa.h = &hs_e.t;
    by_kind(c.kind, [&](auto k) { emu_step<decltype(k)::value>(&sa); });
    expect("step h", c, hs_e, hs_r, 1e-5);
    expect("step state", c, state_e, state_r, 1e-5);
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
    if (getenv("EMU_CASE")) { // kind,B,L,H,reverse,g,h0,dstate,dt,tile,blocks[,vec,group]
        lr_case c = {};
        c.vec = 1;
        c.group = 32;
        sscanf(getenv("EMU_CASE"), "%d,%lld,%lld,%lld,%d,%d,%d,%d,%d,%d,%d,%d,%d", &c.kind,
               (long long *)&c.B, (long long *)&c.L, (long long *)&c.H, &c.reverse, &c.cand_g, &c.h0,
               &c.dstate, &c.dt_tensor, &c.max_tile, &c.concurrent, &c.vec, &c.group);
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
        const int layout = c.H % 4 == 0 ? (i / 2) % 3 : 0; // scalar, f32 vector, 16-bit vector
        c.vec = layout ? 4 : 1;
        c.group = layout == 0 ? 32 : layout == 1 ? 8 : 16;
        c.staged = layout == 1 && (i / 5) % 2;
        run_case(c);
        runs++;
    }
    printf("%d cases, %d failures\n", runs, failures);
    return failures ? 1 : 0;
}
