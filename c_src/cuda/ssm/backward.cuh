// The selective scan's backward: per chunk of saved states, the states
// recomputed and the adjoint run backwards; and the sliced backward's
// per-channel kernel.
#ifndef FX_CUDA_SSM_BACKWARD_CUH
#define FX_CUDA_SSM_BACKWARD_CUH

#include "cuda/ssm/forward_ws.cuh"

namespace fx::cuda::ssm {

// ---- backward ----
//
// A block is BW warps over BW * WCH consecutive channels of one batch
// element and group; every warp runs on its own (as in the forward) except
// for one block barrier per chunk, where the warps add up their b and c
// gradients. Chunks of K = SAVE steps, last to first. Per chunk, per warp:
//   load       x, dt, z, dy, b, c of the chunk into the raw buffer and the
//              saved state entering the chunk into the warp's state slot
//              (cp.async a chunk ahead, as in the forward);
//   commit     per (step, channel) pair: delta, delta * x, dyp = dy silu(z)
//              for the scan lanes; x, dy silu'(z), softplus'(u) for the
//              epilogue; b, c rows to f32;
//   recompute  K steps forward from the saved state, the K states kept in
//              registers (one exp per state and step), reading b only;
//   adjoint    K steps backward: the decay again (a second exp: cheaper than
//              K more registers), g = c dyp + decay' g', the lane's parts of
//              c . h (the pre-gate output, for dz) and of the sums over
//              states of g decay h_prev a and g b (for ddt, dx) to shared
//              memory, da summed in registers, and the
//              gradients of b and c summed over the warp's channels by a
//              transposing butterfly (each lane ends with one sum);
//   epilogue   per pair: the parts summed, dx, ddt, dz written;
//   block      the warps' b and c gradients added, one vector store per
//              (step, 4 states) into the block's channel tile's row of
//              partial sums (a one-warp block's warp stores its own from
//              the adjoint, bwd_direct); write_sums adds the rows up.
// Nothing of size [batch, seqlen, dim, dstate] exists: the states of a
// chunk live in registers.

// Whether the warps of a backward block add their b and c gradients to
// memory themselves, from the step loop, instead of through a block buffer
// and pass: where a block is one warp (its buffer took a quarter to a third
// of the block's shared memory). The plain path measured slower without
// the buffer only while it loaded b and c element by element
// (bench/RESULTS.md).
template <class C> constexpr bool bwd_direct() { return C::BW == 1; }

template <typename T, class C> struct BwdSmem {
    static constexpr int K = C::SAVE, WCH = C::WCH, NPAD = C::NPAD;
    static constexpr int words(int elems) { return (elems * (int)sizeof(T) + 15) / 16 * 4; }
    // per warp, in 4-byte words; raw inputs in the input type
    static constexpr int XR = 0, DTR = XR + words(K * WCH), ZR = DTR + words(K * WCH);
    static constexpr int DYR = ZR + words(K * WCH), BR = DYR + words(K * WCH);
    static constexpr int CR = BR + words(K * NPAD);
    static constexpr int INS = 4 * K + 4; // per channel: (delta, delta x, dyp, 0) per step
    static constexpr int IN = CR + words(K * NPAD);
    static constexpr int OWN = IN + WCH * INS; // [K][WCH] (x, dy silu'(z), softplus'(u), 0)
    static constexpr int B = OWN + 4 * K * WCH, CC = B + K * NPAD; // f32 [K][NPAD]
    static constexpr int PY = CC + K * NPAD;  // parts of c . h [K][32 lanes]
    static constexpr int PR = PY + 32 * K;    // parts of sum g decay h a, of sum g b [K][2][32]
    static constexpr int HS = PR + 64 * K;    // the state entering a chunk, copied a chunk ahead [32 lanes][NPL]
    static constexpr int WARP = HS + 32 * C::NPL;
    // per block after the warps: b and c gradients per warp [BW][K][2 * NPAD]
    // (none where bwd_direct)
    static constexpr int DBC = C::BW * WARP;
    static constexpr int WORDS = DBC + (bwd_direct<C>() ? 0 : C::BW * K * 2 * NPAD);
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    static_assert(INS % 4 == 0, "float4 rows");
};

// Backward blocks an SM: the 12 warps its registers were tuned for (168 a
// thread), or fewer where the block's shared memory fits at most 8 warps on
// sm_90 (228 KB an SM, 1 KB of it the driver's per block: dstate <= 8 and
// > 128). An SM's registers are split between its 4 schedulers, so only
// there, at 2 warps a scheduler, do the missing warps' registers go to the
// others: at dstate 256 the kernel spilled at 168 (bench/RESULTS.md).
template <typename T, class C> constexpr int bwd_min_blocks()
{
    constexpr int fit = 228 * 1024 / (int)(BwdSmem<T, C>::BYTES + 1024);
    return fit * C::BW <= 8 ? cmax(1, fit) : 12 / C::BW;
}

template <typename T, class C> inline bool bwd_fast(const BwdParams &bp)
{
    typedef FwdCopy<T, C> K;
    const ScanParams &p = bp.f;
    return fwd_fast<T, C>(p) && p.cpg % (C::BW * C::WCH) == 0 &&
           (bp.dy == nullptr || (uintptr_t)bp.dy % K::UX == 0);
}

// A (step, channel) pair's gradient terms of the backward, for the kernel's
// epilogue and, sliced, ssm_bwd_finish_kernel. The gate's: dyp = dy
// silu(z), the gradient of y before the gate, and dyz = dy silu'(z).
__device__ __forceinline__ void gate_grads(float dy, float z, float &dyp, float &dyz)
{
    const float sz = sigmoid(z);
    dyp = dy * z * sz;
    dyz = dy * sz * fmaf(z, 1.0f - sz, 1.0f);
}

// dx, ddt, dz from the pair's sums over states (r_a = sum g decay h a
// log2(e), r_b = sum g b) and ypre = y before the gate; dsp = softplus'(u)
// (1 without softplus).
__device__ __forceinline__ void pair_grads(float r_a, float r_b, float ypre, float x, float delta, float dyp,
                                           float dyz, float dsp, float dskip, float &dx, float &ddt, float &dz)
{
    ddt = fmaf(r_a, kLn2, x * r_b) * dsp; // a was scaled by log2(e)
    dx = fmaf(delta, r_b, dskip * dyp);
    dz = ypre * dyz;
}

template <int N> __device__ __forceinline__ constexpr int log2i() { return N <= 1 ? 0 : 1 + log2i<N / 2>(); }

// SL: one slice of 16 states of a larger dstate (Cfg<4, 4>, FAST; see
// ssm_bwd_kernel); n_off its first state.
template <typename T, class C, bool FAST, bool SL = false> struct BwdStage {
    using S = BwdSmem<T, C>;
    typedef FwdCopy<T, C> K;
    static constexpr int KS = C::SAVE;
    static constexpr int E = (KS + C::LANES - 1) / C::LANES; // pairs per lane
    static constexpr int Q4 = C::NPAD / 4;
    int lane, cs, r0, ds, n_off;
    bool cs_ok;
    float bias, dskip;

    __device__ BwdStage(const ScanParams &p, const Tile &t, int lane_, int n_off_ = 0) : lane(lane_), n_off(n_off_)
    {
        cs = lane % C::WCH;
        r0 = lane / C::WCH;
        cs_ok = cs < t.nvalid;
        ds = t.d0 + cs;
        bias = cs_ok && p.dt_bias ? load_any(p.dt_bias, p.bias_type, ds) : 0.0f;
        dskip = cs_ok && p.d ? load_any(p.d, p.d_type, ds) : 0.0f;
    }

    __device__ __forceinline__ bool row_ok(const ScanParams &p, int t0, int k) const
    {
        const int tl = r0 + k * C::LANES;
        return cs_ok && tl < KS && t0 + tl < p.seqlen;
    }

    // The FAST copies of a chunk's rows of J inputs (those of bits of
    // OPTIONAL skipped when NULL), each row RB bytes in units of UB: unit u
    // (lanes take u = lane + 32k) is row u / (RB / UB); row_at(step) is a
    // step's first element in the inputs, `width` a row's elements in the
    // raw buffers. Rows past the end are zeros.
    template <int RB, int UB, unsigned OPTIONAL, int J, typename RowAt>
    __device__ __forceinline__ void copy_rows(T *const (&dst)[J], const T *const (&src)[J], int width, int t0,
                                              int seqlen, RowAt row_at) const
    {
        constexpr int PER_ROW = RB / UB, UNITS = KS * PER_ROW, EPU = UB / (int)sizeof(T);
#pragma unroll
        for (int k = 0; k < (UNITS + 31) / 32; k++) {
            const int u = lane + 32 * k, tl = u / PER_ROW, e = (u % PER_ROW) * EPU;
            const bool ok = t0 + tl < seqlen;
            const int64_t i = row_at(ok ? t0 + tl : 0) + e;
#pragma unroll
            for (int j = 0; j < J; j++)
                if ((UNITS % 32 == 0 || u < UNITS) && (!(OPTIONAL >> j & 1u) || src[j]))
                    copy_async<UB>(dst[j] + tl * width + e, src[j] + i, ok);
        }
    }

    // As FwdStage::load, with dy as a fourth per-channel input.
    __device__ __forceinline__ void load(const BwdParams &bp, const Tile &t, int t0, float *sm)
    {
        const ScanParams &p = bp.f;
        T *raw[4] = {reinterpret_cast<T *>(sm + S::XR), reinterpret_cast<T *>(sm + S::DTR),
                     reinterpret_cast<T *>(sm + S::ZR), reinterpret_cast<T *>(sm + S::DYR)};
        const T *src[4] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                           static_cast<const T *>(p.z), static_cast<const T *>(bp.dy)};
        T *rawbc[2] = {reinterpret_cast<T *>(sm + S::BR), reinterpret_cast<T *>(sm + S::CR)};
        const T *srcbc[2] = {static_cast<const T *>(p.b), static_cast<const T *>(p.c)};
        if constexpr (FAST && K::POSSIBLE) { // (bwd_fast is false when not POSSIBLE)
            copy_rows<K::RX, K::UX, 1u << 2>(raw, src, C::WCH, t0, p.seqlen, // z may be NULL
                                             [&](int step) { return at_btd(p, t.b, step, t.d0); });
            copy_rows<K::RB, K::UB, 0u>(rawbc, srcbc, C::NPAD, t0, p.seqlen, [&](int step) {
                return at_btg(p, t.b, step, t.g) + (SL ? n_off : 0);
            });
        } else {
#pragma unroll
            for (int k = 0; k < E; k++) {
                const int tl = r0 + k * C::LANES;
                if (tl >= KS)
                    continue;
                const bool ok = row_ok(p, t0, k);
                const int64_t i = ok ? at_btd(p, t.b, t0 + tl, ds) : 0;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    raw[j][tl * C::WCH + cs] = ok && src[j] ? src[j][i] : T(0.0f);
            }
            load_bc_rows<T, C::NPAD, KS>(p, t, t0, lane, rawbc[0], rawbc[1]);
        }
    }

    // Steps past the end and channels past the group: delta = 0 and dy = 0,
    // so the state and g pass through them unchanged and add nothing. The
    // options are tested once per chunk (the pairs' exps interleave).
    __device__ __forceinline__ void commit(const ScanParams &p, int t0, float *sm)
    {
        const T *rx = reinterpret_cast<const T *>(sm + S::XR), *rdt = reinterpret_cast<const T *>(sm + S::DTR);
        const T *rz = reinterpret_cast<const T *>(sm + S::ZR), *rdy = reinterpret_cast<const T *>(sm + S::DYR);
        float x[E], u[E], dy[E], delta[E], dsp[E], dyp[E], dyz[E];
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int at = cmin(r0 + k * C::LANES, KS - 1) * C::WCH + cs; // rows past KS: not used
            x[k] = Elem<T>::load(rx[at]);
            u[k] = Elem<T>::load(rdt[at]) + bias;
            dy[k] = row_ok(p, t0, k) ? Elem<T>::load(rdy[at]) : 0.0f;
            delta[k] = u[k], dsp[k] = 1.0f, dyp[k] = dy[k], dyz[k] = 0.0f;
        }
        if (p.softplus) {
#pragma unroll
            for (int k = 0; k < E; k++)
                softplus_and_grad(u[k], delta[k], dsp[k]);
        }
        if (p.z) {
#pragma unroll
            for (int k = 0; k < E; k++)
                gate_grads(dy[k], Elem<T>::load(rz[cmin(r0 + k * C::LANES, KS - 1) * C::WCH + cs]), dyp[k], dyz[k]);
        }
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int tl = r0 + k * C::LANES;
            if (tl >= KS)
                continue;
            const float dk = row_ok(p, t0, k) ? delta[k] : 0.0f;
            *reinterpret_cast<float4 *>(sm + S::IN + cs * S::INS + 4 * tl) = make_float4(dk, dk * x[k], dyp[k], 0.0f);
            if constexpr (!SL) // (sliced, the epilogue's terms are taken after every slice)
                *reinterpret_cast<float4 *>(sm + S::OWN + 4 * (tl * C::WCH + cs)) = make_float4(x[k], dyz[k], dsp[k], 0.0f);
        }
        typedef typename Quad<T>::Raw Raw;
        const Raw *rb = reinterpret_cast<const Raw *>(sm + S::BR), *rc = reinterpret_cast<const Raw *>(sm + S::CR);
#pragma unroll
        for (int k = 0; k < (KS * Q4 + 31) / 32; k++) {
            const int s = lane + 32 * k;
            if ((KS * Q4) % 32 == 0 || s < KS * Q4) {
                *reinterpret_cast<float4 *>(sm + S::B + 4 * s) = Quad<T>::to_float(rb[s]);
                *reinterpret_cast<float4 *>(sm + S::CC + 4 * s) = Quad<T>::to_float(rc[s]);
            }
        }
    }

    // dx, ddt, dz of the chunk's pairs from the lanes' parts; the sums of
    // dyp x (dd) and ddt (ddt_bias) of this lane's pairs into acc.
    __device__ __forceinline__ void epilogue(const BwdParams &bp, const Tile &t, int t0, const float *sm,
                                             float &acc_d, float &acc_bias)
    {
        const ScanParams &p = bp.f;
        // row r0 of the chunk; the lane's later rows are LANES rows apart
        const int64_t base = at_btd(p, t.b, min(t0 + r0, p.seqlen - 1), ds);
        T *dx = static_cast<T *>(bp.dx) + base, *ddt_out = static_cast<T *>(bp.ddt) + base;
        T *dz = bp.dz ? static_cast<T *>(bp.dz) + base : nullptr;
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int tl = r0 + k * C::LANES;
            if (!row_ok(p, t0, k))
                continue;
            const int at = tl * C::WCH + cs;
            const int64_t off = (int64_t)(k * C::LANES) * p.dim;
            const float4 in = lds_whole(sm + S::IN + cs * S::INS + 4 * tl);
            const float4 own = *reinterpret_cast<const float4 *>(sm + S::OWN + 4 * at);
            const float ypre = sum_parts<C::LANES>(sm + S::PY + at * C::LANES) + dskip * own.x;
            const float *pr = sm + S::PR + tl * 64 + cs * C::LANES;
            const float r_a = sum_parts<C::LANES>(pr), r_b = sum_parts<C::LANES>(pr + 32);
            float gx, ddt, gz;
            pair_grads(r_a, r_b, ypre, own.x, in.x, in.z, own.y, own.z, dskip, gx, ddt, gz);
            dx[off] = Elem<T>::store(gx);
            ddt_out[off] = Elem<T>::store(ddt);
            if (dz)
                dz[off] = Elem<T>::store(gz);
            acc_d = fmaf(in.z, own.x, acc_d);
            acc_bias += ddt;
        }
    }

    // Sliced: the slice's parts of the chunk's per-channel sums (y before d
    // x and the gate, sum g decay h a, sum g b) stored in its rows of
    // bp.parts, a lane a step and 4 channels (one vector store each); dx,
    // ddt, dz come from the totals, added slice by slice
    // (ssm_bwd_finish_kernel).
    __device__ __forceinline__ void epilogue_sliced(const BwdParams &bp, const Tile &t, int t0, const float *sm) const
    {
        static_assert(KS * C::WCH == 4 * 32 && C::LANES == 4, "a lane a step and 4 channels");
        const ScanParams &p = bp.f;
        const int s = lane / (C::WCH / 4), c0 = 4 * (lane % (C::WCH / 4));
        if (t0 + s >= p.seqlen)
            return;
        const float *from[3] = {sm + S::PY + s * 32, sm + S::PR + s * 64, sm + S::PR + s * 64 + 32};
        const int64_t n = (int64_t)p.batch * p.seqlen * p.dim, at = at_btd(p, t.b, t0 + s, t.d0 + c0);
        const int slices = p.dstate / kWsStates, slice = n_off / kWsStates;
#pragma unroll
        for (int m = 0; m < 3; m++) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) { // channel c0 + j's 4 lanes' parts
                const float4 q = *reinterpret_cast<const float4 *>(from[m] + 4 * (c0 + j));
                v[j] = (q.x + q.y) + (q.z + q.w);
            }
            *reinterpret_cast<float4 *>(bp.parts + (int64_t)(m * slices + slice) * n + at) =
                make_float4(v[0], v[1], v[2], v[3]);
        }
    }
};

// Stores 4 gradient sums at `dst` (n0..n0+3 of a row of dstate): one
// vector store where rows start on 16 bytes, else those inside the row.
__device__ __forceinline__ void put4(float *dst, int n0, int dstate, float4 v)
{
    if (dstate % 4 == 0) {
        *reinterpret_cast<float4 *>(dst) = v;
        return;
    }
    float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (n0 + i < dstate)
            dst[i] = e[i];
}

// The block's row of the b and c gradients' partial sums: its channel
// tile's (the tiles of a group are the blocks that add into one element).
__device__ __forceinline__ int64_t bc_row_of(const BwdParams &bp, int unit) { return (int64_t)(unit % bp.f.tiles) * bp.bc_row; }

// SL: a block is one slice of 16 states of a larger dstate (C = Cfg<4, 4>,
// FAST; grid: tiles x slices, neighbouring blocks a tile's slices), as in
// the sliced forward, which saved the states every KS steps for it
// (save_interval_of). Its per-channel sums go to bp.parts, and
// ssm_bwd_finish_kernel makes dx, ddt, dz, dd and ddt_bias from them.
template <typename T, class C, bool FAST, bool SL = false>
__global__ void __launch_bounds__(C::BW * 32, bwd_min_blocks<T, C>()) ssm_bwd_kernel(const BwdParams bp)
{
    using S = BwdSmem<T, C>;
    constexpr int NPL = C::NPL, KS = C::SAVE, LO = log2i<C::LANES>();
    constexpr bool DIRECT = bwd_direct<C>();
    static_assert(!SL || (FAST && C::NPAD == kWsStates && !DIRECT), "slices of 16 states on the FAST path");
    const ScanParams &p = bp.f;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sm = block_smem() + warp * S::WARP;
    float *dbc = block_smem() + S::DBC;
    const int slices = SL ? p.dstate / kWsStates : 1;
    const int n_off = SL ? kWsStates * ((int)blockIdx.x % slices) : 0; // the slice's first state
    const int unit = SL ? (int)blockIdx.x / slices : (int)blockIdx.x;
    Tile tile = tile_at(p, unit, C::BW * C::WCH);
    tile.d0 += warp * C::WCH;
    tile.nvalid = max(0, min(C::WCH, tile.nvalid - warp * C::WCH));
    const int c = lane / C::LANES, q = lane % C::LANES, d = tile.d0 + c;
    const bool ok = c < tile.nvalid;

    float a2[NPL], gs[NPL];
    double sum_a[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int n = n_off + state_of<C>(q, i);
        const bool nok = ok && n < p.dstate;
        a2[i] = nok ? load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * kLog2e : 0.0f;
        // dL/dh entering the last step from after it: the final state's gradient
        gs[i] = nok && bp.dstate ? load_any(bp.dstate, bp.dstate_type, at_state(p, tile.b, d) + n) : 0.0f;
        sum_a[i] = 0.0;
    }
    double sum_d = 0.0, sum_bias = 0.0;
    BwdStage<T, C, FAST, SL> stage(p, tile, lane, n_off);

    // The state entering chunk k (h0 or zeros for the first, else saved)
    // into the lane's slot of shared memory, where the chunk reads it: a
    // saved one copied with the chunk's inputs (16 bytes a copy where every
    // state is valid, FAST), so that no register holds it while it travels
    // (the kernel is at its register cap); h0 loaded at once.
    float *hslot = sm + S::HS + lane * NPL;
    auto stage_state = [&](int k) {
        if (k > 0) {
            const float *src = p.saved + (((int64_t)tile.b * p.nsaved + k - 1) * p.dim + d) * p.dstate + n_off + 4 * q;
            if constexpr (FAST) {
#pragma unroll
                for (int i = 0; i < NPL; i += 4)
                    copy_async<16>(hslot + i, ok ? src + quad_offset<C>(i) : p.saved, ok);
            } else {
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    const bool nok = ok && state_of<C>(q, i) < p.dstate;
                    copy_async<4>(hslot + i, nok ? src + quad_offset<C>(i) : p.saved, nok);
                }
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int n = n_off + state_of<C>(q, i);
            hslot[i] = ok && n < p.dstate && p.h0 ? load_any(p.h0, p.h0_type, at_state(p, tile.b, d) + n) : 0.0f;
        }
    };

    const int chunks = (p.seqlen + KS - 1) / KS;
    if (chunks > 0) {
        stage_state(chunks - 1);
        stage.load(bp, tile, (chunks - 1) * KS, sm);
    }
    for (int k = chunks - 1; k >= 0; k--) {
        const int t0 = k * KS;
        float h[NPL], hs[KS][NPL];
        copy_wait_all();
        __syncwarp(); // the chunk's raw inputs and state are in; the last chunk's parts are read
        lds(h, hslot);
        stage.commit(p, t0, sm);
        __syncwarp(); // staged; the raw buffer and the state's slot are free
        if (k > 0) {
            stage_state(k - 1);
            stage.load(bp, tile, t0 - KS, sm); // lands during this chunk
        }

        // recompute: the chunk's states (a step's operands are read before
        // the previous step's store, as in fwd_scan). Only `b` is read here:
        // each lane's part of c . h is taken in the adjoint, which reads `c`
        // anyway (shared memory's data path is the backward's busiest unit).
        const float *in_row = sm + S::IN + c * S::INS, *b_row = sm + S::B + 4 * q, *c_row = sm + S::CC + 4 * q;
        {
            float2 in = *reinterpret_cast<const float2 *>(in_row);
            float bv[NPL];
            lds_states<C>(bv, b_row);
#pragma unroll
            for (int s = 0; s < KS; s++) {
                float2 inn = in;
                float bn[NPL] = {}; // (set where it is used: g++ cannot tell)
                if (s + 1 < KS) {
                    inn = *reinterpret_cast<const float2 *>(in_row + 4 * (s + 1));
                    lds_states<C>(bn, b_row + (s + 1) * C::NPAD);
                }
#pragma unroll
                for (int i = 0; i < NPL; i++)
                    hs[s][i] = fmaf(fast_exp2(in.x * a2[i]), s > 0 ? hs[s - 1][i] : h[i], in.y * bv[i]);
                if (s + 1 < KS) {
                    in = inn;
#pragma unroll
                    for (int i = 0; i < NPL; i++)
                        bv[i] = bn[i];
                }
            }
        }

        // adjoint, last step first
        float acc_a[NPL];
#pragma unroll
        for (int i = 0; i < NPL; i++)
            acc_a[i] = 0.0f;
        {
            float4 in = lds_three(in_row + 4 * (KS - 1));
            float bv[NPL], cv[NPL];
            lds_states<C>(bv, b_row + (KS - 1) * C::NPAD);
            lds_states<C>(cv, c_row + (KS - 1) * C::NPAD);
#pragma unroll
            for (int s = KS - 1; s >= 0; s--) {
                float4 inn = in;
                float bn[NPL], cn[NPL];
                if (s > 0) {
                    inn = lds_three(in_row + 4 * (s - 1));
                    lds_states<C>(bn, b_row + (s - 1) * C::NPAD);
                    lds_states<C>(cn, c_row + (s - 1) * C::NPAD);
                }
                float r_a = 0.0f, r_b = 0.0f, yp = 0.0f, pbc[2 * NPL];
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    yp = fmaf(cv[i], hs[s][i], yp);
                    const float decay = fast_exp2(in.x * a2[i]);
                    const float prev = s > 0 ? hs[s - 1][i] : h[i];
                    const float g = fmaf(cv[i], in.z, gs[i]); // dL/dh_t
                    const float pr = g * (decay * prev);
                    acc_a[i] = fmaf(pr, in.x, acc_a[i]);
                    r_a = fmaf(pr, a2[i], r_a);
                    r_b = fmaf(g, bv[i], r_b);
                    pbc[i] = g * in.y;             // db: g delta x
                    pbc[NPL + i] = in.z * hs[s][i]; // dc: dyp h
                    gs[i] = decay * g;             // dL/dh_{t-1} through h_t
                }
                sm[S::PY + s * 32 + lane] = yp;
                sm[S::PR + s * 64 + lane] = r_a;
                sm[S::PR + s * 64 + 32 + lane] = r_b;
                // over the warp's channels (lane bits LO..4)
                const int first = fx::cuda::warp::transpose_sum<2 * NPL, LO>(pbc, lane);
                constexpr int CNT = (2 * NPL) >> (5 - LO) > 0 ? (2 * NPL) >> (5 - LO) : 1;
                if constexpr (!DIRECT) { // the warp's part of the block's buffer
                    float *dbc_out = dbc + (warp * KS + s) * 2 * C::NPAD;
#pragma unroll
                    for (int j = 0; j < CNT; j++) {
                        const int o = first + j; // which * NPL + i
                        dbc_out[(o / NPL) * C::NPAD + state_of<C>(q, o % NPL)] = pbc[j];
                    }
                } else if (t0 + s < p.seqlen) { // already the block's sums: to memory
                    static_assert(CNT % 4 == 0 && NPL % 4 == 0, "whole quads of one gradient");
#pragma unroll
                    for (int j = 0; j < CNT; j += 4) {
                        const int o = first + j, n0 = state_of<C>(q, o % NPL);
                        float *acc = (o / NPL == 0 ? bp.acc_db : bp.acc_dc) + bc_row_of(bp, unit);
                        if (n0 < p.dstate)
                            put4(acc + at_btg(p, tile.b, t0 + s, tile.g) + n0, n0, p.dstate,
                                 make_float4(pbc[j], pbc[j + 1], pbc[j + 2], pbc[j + 3]));
                    }
                }
                if (s > 0) {
                    in = inn;
#pragma unroll
                    for (int i = 0; i < NPL; i++)
                        bv[i] = bn[i], cv[i] = cn[i];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NPL; i++)
            sum_a[i] += acc_a[i];
        __syncwarp(); // the parts are written
        if constexpr (SL) {
            stage.epilogue_sliced(bp, tile, t0, sm);
        } else {
            float acc_d = 0.0f, acc_bias = 0.0f;
            stage.epilogue(bp, tile, t0, sm, acc_d, acc_bias);
            sum_d += acc_d;
            sum_bias += acc_bias;
        }

        // the block's b and c gradients: the warps' sums added in warp
        // order, one vector store per (step, 4 states) into its row
        if constexpr (!DIRECT) {
            __syncthreads();
            const float *src = dbc;
            constexpr int QUADS = KS * 2 * C::NPAD / 4;
            for (int e = threadIdx.x; e < QUADS; e += C::BW * 32) {
                const int tl = e / (2 * C::NPAD / 4), rest = e % (2 * C::NPAD / 4);
                const int which = rest / (C::NPAD / 4), n0 = (rest % (C::NPAD / 4)) * 4;
                if (t0 + tl >= p.seqlen || n0 >= p.dstate)
                    continue;
                float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < C::BW; w++) {
                    const float4 v = *reinterpret_cast<const float4 *>(src + (w * KS + tl) * 2 * C::NPAD + 4 * rest);
                    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
                }
                float *acc = (which == 0 ? bp.acc_db : bp.acc_dc) + bc_row_of(bp, unit);
                put4(acc + at_btg(p, tile.b, t0 + tl, tile.g) + n_off + n0, n0, p.dstate, sum);
            }
            __syncthreads(); // the buffer is read
        }
    }

    if (ok) {
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int n = n_off + state_of<C>(q, i);
            if (n >= p.dstate)
                continue;
            bp.acc_da[at_state(p, tile.b, d) + n] = (float)sum_a[i]; // batch row b's part
            if (bp.dh0) // after step 0, gs is dL/dh0
                store_any(bp.dh0, bp.dh0_type, at_state(p, tile.b, d) + n, gs[i]);
        }
    }
    // dd and ddt_bias (sliced: ssm_bwd_finish_kernel's): the lanes of one
    // staging channel hold its rows' sums, batch row b's part (stored also
    // where d or dt_bias was not given: no gradient then reads it)
    if constexpr (!SL) {
        float fd = (float)sum_d, fb = (float)sum_bias;
#pragma unroll
        for (int m = C::WCH; m < 32; m *= 2) {
            fd += __shfl_xor_sync(kFullMask, fd, m);
            fb += __shfl_xor_sync(kFullMask, fb, m);
        }
        if (stage.cs_ok && stage.r0 == 0) {
            bp.acc_dd[(int64_t)tile.b * p.dim + stage.ds] = fd;
            bp.acc_dbias[(int64_t)tile.b * p.dim + stage.ds] = fb;
        }
    }
}

// The sliced backward's per-channel gradients from its slices' sums
// (bp.parts, added slice by slice): dx, ddt, dz, and the partial sums of dd
// and ddt_bias, a row for each kBwdFinishRows (batch, step) rows; a thread
// takes 4 channels of those rows, in a grid-stride loop.
// The per-pair terms are ssm_bwd_kernel's (gate_grads, pair_grads).
constexpr int kBwdFinishRows = 16;
template <typename T> __global__ void __launch_bounds__(kFinishThreads) ssm_bwd_finish_kernel(const BwdParams bp)
{
    const ScanParams &p = bp.f;
    const int quads = p.dim / 4;
    const int64_t rows = (int64_t)p.batch * p.seqlen, n = rows * p.dim;
    const int64_t items = quads * ((rows + kBwdFinishRows - 1) / kBwdFinishRows);
    const int slices = p.dstate / kWsStates;
    const T *xs = static_cast<const T *>(p.x), *dts = static_cast<const T *>(p.dt);
    const T *zs = static_cast<const T *>(p.z), *dys = static_cast<const T *>(bp.dy);
    for (int64_t item = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; item < items;
         item += (int64_t)gridDim.x * blockDim.x) {
        const int d = 4 * (int)(item % quads);
        const int64_t r0 = item / quads * kBwdFinishRows, r1 = min(r0 + kBwdFinishRows, rows);
        float bias[4], dskip[4], acc_d[4] = {}, acc_bias[4] = {};
#pragma unroll
        for (int v = 0; v < 4; v++) {
            bias[v] = p.dt_bias ? load_any(p.dt_bias, p.bias_type, d + v) : 0.0f;
            dskip[v] = p.d ? load_any(p.d, p.d_type, d + v) : 0.0f;
        }
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i = r * p.dim + d;
            float x[4], u[4], dy[4], z[4] = {}, dx[4], ddt[4], dz[4];
            ld_vec<T, 4>(x, xs + i);
            ld_vec<T, 4>(u, dts + i);
            ld_vec<T, 4>(dy, dys + i);
            if (zs)
                ld_vec<T, 4>(z, zs + i);
            float4 y4 = *reinterpret_cast<const float4 *>(bp.parts + i);
            float4 ra4 = *reinterpret_cast<const float4 *>(bp.parts + slices * n + i);
            float4 rb4 = *reinterpret_cast<const float4 *>(bp.parts + 2 * slices * n + i);
            for (int sl = 1; sl < slices; sl++) {
                const float4 y = *reinterpret_cast<const float4 *>(bp.parts + sl * n + i);
                const float4 a = *reinterpret_cast<const float4 *>(bp.parts + (slices + sl) * n + i);
                const float4 b = *reinterpret_cast<const float4 *>(bp.parts + (2 * slices + sl) * n + i);
                y4.x += y.x, y4.y += y.y, y4.z += y.z, y4.w += y.w;
                ra4.x += a.x, ra4.y += a.y, ra4.z += a.z, ra4.w += a.w;
                rb4.x += b.x, rb4.y += b.y, rb4.z += b.z, rb4.w += b.w;
            }
            const float ys[4] = {y4.x, y4.y, y4.z, y4.w}, ra[4] = {ra4.x, ra4.y, ra4.z, ra4.w};
            const float rb[4] = {rb4.x, rb4.y, rb4.z, rb4.w};
#pragma unroll
            for (int v = 0; v < 4; v++) {
                float delta = u[v] + bias[v], dsp = 1.0f, dyp = dy[v], dyz = 0.0f;
                if (p.softplus)
                    softplus_and_grad(u[v] + bias[v], delta, dsp);
                if (zs)
                    gate_grads(dy[v], z[v], dyp, dyz);
                pair_grads(ra[v], rb[v], ys[v] + dskip[v] * x[v], x[v], delta, dyp, dyz, dsp, dskip[v], dx[v], ddt[v],
                           dz[v]);
                acc_d[v] = fmaf(dyp, x[v], acc_d[v]);
                acc_bias[v] += ddt[v];
            }
            st_vec<T, 4>(static_cast<T *>(bp.dx) + i, dx);
            st_vec<T, 4>(static_cast<T *>(bp.ddt) + i, ddt);
            if (bp.dz)
                st_vec<T, 4>(static_cast<T *>(bp.dz) + i, dz);
        }
        const int64_t row = item / quads; // its rows' row of dd's and ddt_bias's partial sums
#pragma unroll
        for (int v = 0; v < 4; v++) {
            bp.acc_dd[row * p.dim + d + v] = acc_d[v];
            bp.acc_dbias[row * p.dim + d + v] = acc_bias[v];
        }
    }
}

inline int64_t bwd_finish_grid(const ScanParams &p, int sm_count)
{
    const int64_t rows = (int64_t)p.batch * p.seqlen;
    return finish_grid_of((int64_t)(p.dim / 4) * ((rows + kBwdFinishRows - 1) / kBwdFinishRows), sm_count);
}

} // namespace fx::cuda::ssm

#endif
