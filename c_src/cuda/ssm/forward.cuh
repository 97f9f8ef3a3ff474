// The selective scan's one-warp-a-tile forward (every dstate).
#ifndef FX_CUDA_SSM_FORWARD_CUH
#define FX_CUDA_SSM_FORWARD_CUH

#include "cuda/ssm/params.cuh"

namespace fx::cuda::ssm {

// ---- forward ----
//
// One warp is one batch element x a tile of WCH = 32 / LANES channels of one
// group, and never waits for another warp: a block is W warps side by side,
// each with its own FwdSmem words of shared memory, so the only
// synchronisation is __syncwarp. Per chunk of TS steps:
//   load     the chunk's x, dt, z, b, c as they are (input type) into the
//            warp's raw buffers: cp.async, issued a chunk ahead so that the
//            copies land while the previous chunk is scanned (FAST: tiles
//            full and rows aligned, which the launcher checks; each lane
//            copies whole 16-byte pieces of one row, at offsets that advance
//            by a chunk), or plain loads and stores for odd shapes;
//   commit   lane l takes CV consecutive channels of a row (rows l / LPR,
//            + RPP, ...): delta, delta * x for the scan; x and silu(z) kept
//            in registers for the epilogue; 16-bit b and c rows converted to
//            f32 (f32 rows are read where they land: two raw buffers);
//   scan     lanes (channel l / LANES, states state_of(l % LANES, i)) walk
//            the TS steps: per state one exp and three FMAs, the exps LOOK
//            steps ahead of the FMAs that use them (the only dependency from
//            a step to the next is one FMA per state); per step one store of
//            the lane's part of y's sum over states, so no shuffle sits
//            between a step and the next;
//   epilogue the staging lane adds the LANES parts of each of its channels,
//            adds d * x, applies the gate and writes its CV values of y with
//            one store. It shares a phase (no barrier between) with the next
//            chunk's commit.

// Knobs of the forward kernel (dev/ssm_bench times other values): LOOK,
// the steps between a decay's exp and the FMA that uses it; FENCE, a
// scheduling fence after every FENCE steps of the scan (0: none), without
// which ptxas sinks each exp to just above its first use; TF, the steps
// per chunk (0: the configuration's T).
template <int LOOK_ = 2, int FENCE_ = 1, int TF_ = 0, int MINB_ = 4> struct FwdTune {
    static constexpr int LOOK = LOOK_, FENCE = FENCE_, TF = TF_, MINB = MINB_;
};
typedef FwdTune<> FwdDefault;

template <typename T, class C, class U = FwdDefault> struct FwdSmem {
    static constexpr int TS = U::TF ? U::TF : C::T; // steps per chunk
    static constexpr int LOOK = cmin(U::LOOK, TS - 1);
    static constexpr bool F32 = sizeof(T) == 4; // b, c read where they land
    // staging: CV consecutive channels of one row per lane and pass; LPR
    // lanes per row, RPP rows per pass, NP passes per chunk
    static constexpr int CV = cmax(1, cmin(cmin(4, C::WCH), C::WCH * TS / 32));
    static constexpr int LPR = C::WCH / CV, RPP = 32 / LPR, NP = (TS + RPP - 1) / RPP;
    static constexpr bool ALL_ROWS = RPP * NP == TS; // every lane has a row in every pass
    // in 4-byte words; every region starts 16-byte aligned
    static constexpr int words(int elems) { return (elems * (int)sizeof(T) + 15) / 16 * 4; }
    static constexpr int XR = 0;                     // raw x [TS][WCH], input type
    static constexpr int DTR = XR + words(TS * C::WCH); // raw dt
    static constexpr int ZR = DTR + words(TS * C::WCH); // raw z
    static constexpr int NBUF = F32 ? 2 : 1;            // raw b, c: chunk k in buffer k % NBUF
    static constexpr int BCW = words(TS * C::NPAD);     // one raw b or c chunk [TS][NPAD]
    static constexpr int BR = ZR + words(TS * C::WCH);  // raw b
    static constexpr int CR = BR + NBUF * BCW;          // raw c
    // per channel: (delta, delta * x) per step; +4 floats puts the channels
    // of a warp's float4 loads in different banks
    static constexpr int DDS = 2 * TS + 4;
    static constexpr int DD = CR + NBUF * BCW;
    static constexpr int B = DD + C::WCH * DDS;            // f32 b [TS][NPAD] (16-bit inputs)
    static constexpr int CC = B + (F32 ? 0 : TS * C::NPAD); // f32 c
    // parts of y [TS][PS]: a row per step, padded so that the staging lanes'
    // float4 reads of different rows fall in different banks
    static constexpr int PS = 36;
    static constexpr int P = CC + (F32 ? 0 : TS * C::NPAD);
    static constexpr int WORDS = P + TS * PS; // per warp
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    static_assert(DDS % 4 == 0 && TS % 2 == 0, "float4 rows of two steps");
    static_assert(TS % C::SAVE == 0 || C::SAVE % TS == 0, "saves fall on chunk steps");
};

// What the FAST load needs: full tiles, and rows of x, dt, z, b, c that
// split into aligned copies of UX (x, dt, z) and UB (b, c) bytes.
template <typename T, class C> struct FwdCopy {
    static constexpr int RX = C::WCH * (int)sizeof(T);  // bytes of a tile's row of x
    static constexpr int UX = RX < 16 ? RX : 16;
    static constexpr int RB = BcCopy<T, C::NPAD>::RB;   // bytes of a row of b
    static constexpr int UB = BcCopy<T, C::NPAD>::UB;
    static constexpr bool POSSIBLE = RX >= 4; // cp.async copies 4, 8 or 16 bytes
};

// Whether every row of x, dt, z, y starts on a multiple of ux bytes, and
// every row of b, c on one of ub (what the cp.async paths copy in units of).
template <typename T> inline bool rows_aligned(const ScanParams &p, int ux, int ub)
{
    auto aligned = [](const void *ptr, int unit) { return ptr == nullptr || (uintptr_t)ptr % unit == 0; };
    return (int64_t)p.dim * sizeof(T) % ux == 0 && aligned(p.x, ux) && aligned(p.dt, ux) && aligned(p.z, ux) &&
           aligned(p.y, ux) && (int64_t)p.groups * p.dstate * sizeof(T) % ub == 0 && aligned(p.b, ub) &&
           aligned(p.c, ub);
}

template <typename T, class C> inline bool fwd_fast(const ScanParams &p)
{
    typedef FwdCopy<T, C> K;
    return K::POSSIBLE && p.cpg % C::WCH == 0 && p.dstate == C::NPAD && rows_aligned<T>(p, K::UX, K::UB);
}

// A scheduling fence: ptxas keeps every instruction on its side of a read
// of the clock. Its list scheduler would otherwise sink each exp to just
// above its first use (its static latency model allows it), where the warp
// waits whenever the SFU is shared with the other warps. The reads are
// folded into `clocks`, which the caller stores, so that they are kept.
__device__ __forceinline__ void sched_fence(unsigned &clocks)
{
#ifdef __CUDA_ARCH__
    unsigned c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    clocks ^= c;
#else
    (void)clocks;
#endif
}

// CV consecutive elements of the input type (aligned to their size) as floats.
template <typename T, int CV> __device__ __forceinline__ void ld_vec(float (&v)[CV], const T *p)
{
    if constexpr (CV == 4) {
        const float4 f = Quad<T>::to_float(*reinterpret_cast<const typename Quad<T>::Raw *>(p));
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if constexpr (CV == 2 && sizeof(T) == 4) {
        const float2 f = *reinterpret_cast<const float2 *>(p);
        v[0] = f.x, v[1] = f.y;
    } else if constexpr (CV == 2) {
        const uint32_t w = *reinterpret_cast<const uint32_t *>(p);
        v[0] = Quad<T>::elem(w, 0), v[1] = Quad<T>::elem(w, 1);
    } else {
        v[0] = Elem<T>::load(p[0]);
    }
}

template <typename T> __device__ __forceinline__ uint32_t bits16(float v)
{
    const typename Raw16<T>::type r = Elem<T>::store(v);
    return r.x;
}

// CV floats to CV consecutive elements of the input type (aligned to their size).
template <typename T, int CV> __device__ __forceinline__ void st_vec(T *p, const float (&v)[CV])
{
    if constexpr (sizeof(T) == 4 && CV == 4) {
        *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (sizeof(T) == 4 && CV == 2) {
        *reinterpret_cast<float2 *>(p) = make_float2(v[0], v[1]);
    } else if constexpr (CV == 4) {
        *reinterpret_cast<uint2 *>(p) =
            make_uint2(bits16<T>(v[0]) | bits16<T>(v[1]) << 16, bits16<T>(v[2]) | bits16<T>(v[3]) << 16);
    } else if constexpr (CV == 2) {
        *reinterpret_cast<uint32_t *>(p) = bits16<T>(v[0]) | bits16<T>(v[1]) << 16;
    } else {
        p[0] = Elem<T>::store(v[0]);
    }
}

// y of 4 channels, (their sums over states + d x) silu(z), stored as the
// input type; x and z (read only with Z) as 4 elements of it.
template <typename T, bool Z>
__device__ __forceinline__ void store_y4(T *y, float4 sum, const float (&dskip)[4], const T *x, const T *z)
{
    const float s4[4] = {sum.x, sum.y, sum.z, sum.w};
    float xv[4], out[4];
    ld_vec<T, 4>(xv, x);
#pragma unroll
    for (int v = 0; v < 4; v++)
        out[v] = s4[v] + dskip[v] * xv[v];
    if constexpr (Z) {
        float zv[4];
        ld_vec<T, 4>(zv, z);
#pragma unroll
        for (int v = 0; v < 4; v++)
            out[v] *= silu(zv[v]);
    }
    st_vec<T, 4>(y, out);
}

template <typename T, class C, class U, bool FAST> struct FwdStage {
    using S = FwdSmem<T, C, U>;
    typedef FwdCopy<T, C> K;
    static constexpr int TS = S::TS, CV = S::CV, NP = S::NP;
    // FAST loads: of x (dt, z), each lane copies NUX consecutive units of UX
    // bytes, all in one row; of b (c), units lane, lane + 32, ... of UB
    // bytes, so that a copy's lanes write consecutive units of shared memory
    // (a lane's consecutive units had NUB-way bank conflicts on every copy:
    // 8-way at dstate 64-256, bench/RESULTS.md)
    static constexpr int PER_ROW = K::RX / K::UX, UNITS = TS * PER_ROW, NUX = (UNITS + 31) / 32;
    static constexpr int EPU = K::UX / (int)sizeof(T);
    static constexpr int BPR = K::RB / K::UB, BUNITS = TS * BPR, NUB = (BUNITS + 31) / 32;
    static constexpr int EPB = BcCopy<T, C::NPAD>::EPU;
    // Copies of b and c kept in L1 as well where a warp is one channel
    // (dstate > 128): then every warp of an SM copies the same rows of its
    // batch element's steps, and from L2 (cp.async.cg) those copies were
    // the forward's limit (dstate 256 f32 -47 %; dstate 128, while it was
    // one channel a warp, -34 %). Where a warp is 2-4 channels they made
    // the forward 6-7 % slower, and the backward slower at every dstate
    // (bench/RESULTS.md).
    static constexpr CopyHint BC_HINT = C::WCH == 1 ? kCopyL1 : kCopyL2;
    static_assert(PER_ROW % NUX == 0, "a lane's copies of x lie in one row");
    static_assert(BPR % 32 == 0 || 32 % BPR == 0, "unit lane + 32 k is the lane's unit moved by 32 k");
    int lane, r0, c0; // staging: rows r0, r0 + RPP, ...; channels c0 .. c0 + CV - 1 of the tile
    const T *src[5];  // FAST: the lane's first element of x, dt, z, b, c in the next chunk to load
    int64_t oy;       // its first element of y in the next chunk to write
    float bias[CV], dskip[CV];
    float xk[NP][CV], gate[NP][CV]; // x and silu(z) of the committed chunk, for the epilogue

    __device__ FwdStage(const ScanParams &p, const Tile &t, int lane_) : lane(lane_)
    {
        r0 = lane / S::LPR;
        c0 = lane % S::LPR * CV;
#pragma unroll
        for (int v = 0; v < CV; v++) {
            const bool cok = c0 + v < t.nvalid;
            bias[v] = cok && p.dt_bias ? load_any(p.dt_bias, p.bias_type, t.d0 + c0 + v) : 0.0f;
            dskip[v] = cok && p.d ? load_any(p.d, p.d_type, t.d0 + c0 + v) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < NP; k++)
#pragma unroll
            for (int v = 0; v < CV; v++)
                xk[k][v] = 0.0f, gate[k][v] = 1.0f;
        if constexpr (FAST) {
            const int ux = lane * NUX;
            const int64_t ox = at_btd(p, t.b, ux / PER_ROW, t.d0) + ux % PER_ROW * EPU;
            const int64_t ob = at_btg(p, t.b, lane / BPR, t.g) + lane % BPR * EPB;
            src[0] = static_cast<const T *>(p.x) + ox, src[1] = static_cast<const T *>(p.dt) + ox;
            src[2] = p.z ? static_cast<const T *>(p.z) + ox : nullptr;
            src[3] = static_cast<const T *>(p.b) + ob, src[4] = static_cast<const T *>(p.c) + ob;
        }
        oy = at_btd(p, t.b, r0, t.d0 + c0);
    }

    // The FAST copies of the next chunk, rows from t0 (FULL: all inside the
    // sequence; else rows past the end are zeros, read from the tensors'
    // first element).
    template <bool FULL> __device__ __forceinline__ void copy(const ScanParams &p, int t0, float *sm, int buf)
    {
        const int ux = lane * NUX; // a unit's place in the raw buffer is its place in the rows
        if (UNITS % 32 == 0 || ux < UNITS) {
            const bool ok = FULL || t0 + ux / PER_ROW < p.seqlen;
            const void *base[3] = {p.x, p.dt, p.z};
            const int at[3] = {S::XR, S::DTR, S::ZR};
#pragma unroll
            for (int j = 0; j < 3; j++)
#pragma unroll
                for (int k = 0; k < NUX; k++)
                    if (j < 2 || src[2])
                        copy_async<K::UX>(reinterpret_cast<T *>(sm + at[j]) + (ux + k) * EPU,
                                        ok ? src[j] + k * EPU : static_cast<const T *>(base[j]), ok);
        }
        const int64_t row = (int64_t)p.groups * p.dstate; // elements from a step's b row to the next
        const void *base[2] = {p.b, p.c};
        const int at[2] = {S::BR, S::CR};
#pragma unroll
        for (int k = 0; k < NUB; k++) {
            const int ub = lane + 32 * k;
            if (BUNITS % 32 == 0 || ub < BUNITS) {
                const bool ok = FULL || t0 + ub / BPR < p.seqlen;
                const int64_t from = 32 * k / BPR * row + 32 * k % BPR * EPB; // unit ub from unit lane
#pragma unroll
                for (int j = 0; j < 2; j++)
                    copy_async<K::UB, BC_HINT>(reinterpret_cast<T *>(sm + at[j] + buf * S::BCW) + ub * EPB,
                                         ok ? src[3 + j] + from : static_cast<const T *>(base[j]), ok);
            }
        }
    }

    // Starts (FAST) or does the loads of chunk [t0, t0 + TS) into the raw
    // buffers (b and c into buffer `buf`); rows past the end and channels
    // past the group are zeros.
    __device__ __forceinline__ void load(const ScanParams &p, const Tile &t, int t0, float *sm, int buf)
    {
        if constexpr (FAST && K::POSSIBLE) { // (fwd_fast is false when not POSSIBLE)
            if (t0 + TS <= p.seqlen)
                copy<true>(p, t0, sm, buf);
            else
                copy<false>(p, t0, sm, buf);
            const int64_t rows = (int64_t)TS * p.dim, rows_bc = (int64_t)TS * p.groups * p.dstate;
            src[0] += rows, src[1] += rows, src[3] += rows_bc, src[4] += rows_bc;
            if (src[2])
                src[2] += rows;
        } else {
            T *raw[3] = {reinterpret_cast<T *>(sm + S::XR), reinterpret_cast<T *>(sm + S::DTR),
                         reinterpret_cast<T *>(sm + S::ZR)};
            const T *in[3] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                              static_cast<const T *>(p.z)};
            for (int e = lane; e < TS * C::WCH; e += 32) {
                const int tl = e / C::WCH, cc = e % C::WCH;
                const bool ok = t0 + tl < p.seqlen && cc < t.nvalid;
                const int64_t i = ok ? at_btd(p, t.b, t0 + tl, t.d0 + cc) : 0;
#pragma unroll
                for (int j = 0; j < 3; j++)
                    raw[j][e] = ok && in[j] ? in[j][i] : T(0.0f);
            }
            load_bc_rows<T, C::NPAD, TS, BC_HINT>(p, t, t0, lane, reinterpret_cast<T *>(sm + S::BR + buf * S::BCW),
                                         reinterpret_cast<T *>(sm + S::CR + buf * S::BCW));
        }
    }

    __device__ __forceinline__ static void softplus_all(float (&delta)[NP][CV])
    {
#pragma unroll
        for (int k = 0; k < NP; k++)
#pragma unroll
            for (int v = 0; v < CV; v++)
                delta[k][v] = softplus(delta[k][v]);
    }

    __device__ __forceinline__ void gates(const T *rz)
    {
#pragma unroll
        for (int k = 0; k < NP; k++) {
            float zv[CV];
            ld_vec<T, CV>(zv, rz + cmin(r0 + k * S::RPP, TS - 1) * C::WCH + c0);
#pragma unroll
            for (int v = 0; v < CV; v++)
                gate[k][v] = silu(zv[v]);
        }
    }

    // Turns the loaded chunk into what the scan reads. Steps past the end
    // and channels past the group get delta = 0: their state stays. The
    // options are tested once per chunk, so that the exps and polynomials
    // of a lane's values interleave.
    __device__ __forceinline__ void commit(const ScanParams &p, const Tile &t, int t0, float *sm, int buf)
    {
        const T *rx = reinterpret_cast<const T *>(sm + S::XR), *rdt = reinterpret_cast<const T *>(sm + S::DTR);
        const T *rz = reinterpret_cast<const T *>(sm + S::ZR);
        float delta[NP][CV];
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int at = cmin(r0 + k * S::RPP, TS - 1) * C::WCH + c0; // rows past TS: not used
            ld_vec<T, CV>(xk[k], rx + at);
            ld_vec<T, CV>(delta[k], rdt + at);
#pragma unroll
            for (int v = 0; v < CV; v++)
                delta[k][v] += bias[v];
        }
        // both options (Mamba's case) in one block, so that the gate's exps
        // and reciprocals interleave with softplus's polynomials
        if (p.softplus && p.z) {
            softplus_all(delta);
            gates(rz);
        } else {
            if (p.softplus)
                softplus_all(delta);
            if (p.z)
                gates(rz);
        }
        const int rows = p.seqlen - t0;
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int r = r0 + k * S::RPP;
            if (S::ALL_ROWS || r < TS) {
#pragma unroll
                for (int v = 0; v < CV; v++) {
                    const bool ok = r < rows && (FAST || c0 + v < t.nvalid);
                    const float dk = ok ? delta[k][v] : 0.0f;
                    *reinterpret_cast<float2 *>(sm + S::DD + (c0 + v) * S::DDS + 2 * r) = make_float2(dk, dk * xk[k][v]);
                }
            }
        }
        if constexpr (!S::F32) {
            typedef typename Quad<T>::Raw Raw;
            constexpr int Q4 = C::NPAD / 4; // quads per b row
            const Raw *rb = reinterpret_cast<const Raw *>(sm + S::BR + buf * S::BCW);
            const Raw *rc = reinterpret_cast<const Raw *>(sm + S::CR + buf * S::BCW);
#pragma unroll
            for (int k = 0; k < (TS * Q4 + 31) / 32; k++) {
                const int s = lane + 32 * k;
                if ((TS * Q4) % 32 == 0 || s < TS * Q4) {
                    *reinterpret_cast<float4 *>(sm + S::B + 4 * s) = Quad<T>::to_float(rb[s]);
                    *reinterpret_cast<float4 *>(sm + S::CC + 4 * s) = Quad<T>::to_float(rc[s]);
                }
            }
        }
    }

    // y = (sum of the lanes' parts + d x) * silu(z) for the committed chunk.
    __device__ __forceinline__ void epilogue(const ScanParams &p, const Tile &t, int t0, const float *sm)
    {
        const int rows = p.seqlen - t0;
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int r = r0 + k * S::RPP;
            if ((S::ALL_ROWS || r < TS) && r < rows) {
                float yv[CV];
#pragma unroll
                for (int v = 0; v < CV; v++) {
                    const float sum = sum_parts<C::LANES>(sm + S::P + r * S::PS + (c0 + v) * C::LANES);
                    yv[v] = (sum + dskip[v] * xk[k][v]) * gate[k][v];
                }
                T *y = static_cast<T *>(p.y) + oy + (int64_t)(k * S::RPP) * p.dim;
                if constexpr (FAST) {
                    st_vec<T, CV>(y, yv);
                } else {
#pragma unroll
                    for (int v = 0; v < CV; v++)
                        if (c0 + v < t.nvalid)
                            y[v] = Elem<T>::store(yv[v]);
                }
            }
        }
        oy += (int64_t)TS * p.dim;
    }
};

// The scan over one staged chunk (all TS steps: padded steps have delta 0).
// Step s's chain (h = decay h + delta x b, y's part c . h) uses the decays
// and increments computed LOOK steps earlier, from operands read from
// shared memory a step before that; c is read a step ahead. Every load is
// issued before the store of the current step's part of y: a load after a
// store to shared memory cannot be moved above it, and would stall the step
// it feeds.
template <typename T, class C, class U>
__device__ __forceinline__ void fwd_scan(const ScanParams &p, const Tile &t, int c, int q, bool ok, int t0,
                                         float (&h)[C::NPL], const float (&a2)[C::NPL], const float *bsrc,
                                         const float *csrc, float *sm)
{
    using S = FwdSmem<T, C, U>;
    constexpr int NPL = C::NPL, TS = S::TS, LOOK = S::LOOK;
    const int lane = c * C::LANES + q;
    const float *dd_row = sm + S::DD + c * S::DDS, *b_row = bsrc + 4 * q, *c_row = csrc + 4 * q;
    float4 dd[TS / 2];                // (delta, delta x) of steps 2i, 2i + 1
    float bv[TS][NPL], cv[TS][NPL];   // b and c of a step
    float dec[TS][NPL], inc[TS][NPL]; // exp(delta a) and delta x b of a step
    unsigned clocks = 0; // the fences' clock reads (kept by a store to a pad word of P)
#pragma unroll
    for (int s = -LOOK - 1; s < TS; s++) {
        const int so = s + LOOK + 1; // the operands of step so's exps
        if (so >= 0 && so < TS) {
            if (so % 2 == 0)
                dd[so / 2] = *reinterpret_cast<const float4 *>(dd_row + 2 * so);
            lds_states<C>(bv[so], b_row + so * C::NPAD);
        }
        if (s + 1 >= 0 && s + 1 < TS)
            lds_states<C>(cv[s + 1], c_row + (s + 1) * C::NPAD);
        const int se = s + LOOK; // step se's exps and increments
        if (se >= 0 && se < TS) {
            const float delta = se % 2 ? dd[se / 2].z : dd[se / 2].x, dx = se % 2 ? dd[se / 2].w : dd[se / 2].y;
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                dec[se][i] = fast_exp2(delta * a2[i]);
                inc[se][i] = dx * bv[se][i];
            }
        }
        if (s < 0)
            continue;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            h[i] = fmaf(dec[s][i], h[i], inc[s][i]);
            acc = fmaf(cv[s][i], h[i], acc);
        }
        sm[S::P + s * S::PS + lane] = acc;
        if (U::FENCE && s % U::FENCE == U::FENCE - 1)
            sched_fence(clocks);
        // the state entering every SAVE-step chunk, for the backward
        if ((s + 1) % cmin(TS, C::SAVE) == 0 && p.saved && ok) {
            const int te = t0 + s + 1;
            if (te % C::SAVE == 0 && te < p.seqlen) {
                float *out = p.saved + (((int64_t)t.b * p.nsaved + te / C::SAVE - 1) * p.dim + t.d0 + c) * p.dstate;
#pragma unroll
                for (int i = 0; i < NPL; i++)
                    if (state_of<C>(q, i) < p.dstate)
                        out[state_of<C>(q, i)] = h[i];
            }
        }
    }
    if (U::FENCE && lane == 0)
        reinterpret_cast<unsigned *>(sm)[S::P + S::PS - 1] = clocks;
}

template <typename T, class C, bool FAST, class U = FwdDefault>
__global__ void __launch_bounds__(kFwdMaxThreads, U::MINB) ssm_fwd_kernel(const ScanParams p)
{
    using S = FwdSmem<T, C, U>;
    constexpr int NPL = C::NPL;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int index = blockIdx.x * (blockDim.x / 32) + warp;
    if (index >= p.units)
        return; // a whole warp: no barrier waits for it
    float *sm = block_smem() + warp * S::WORDS;
    const Tile tile = tile_at(p, index, C::WCH);
    const int c = lane / C::LANES, q = lane % C::LANES, d = tile.d0 + c;
    const bool ok = c < tile.nvalid;
    float a2[NPL], h[NPL]; // a2 = a log2(e): a decay is one ex2 of delta * a2
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int n = state_of<C>(q, i);
        const bool nok = ok && n < p.dstate;
        a2[i] = nok ? load_any(p.a, p.a_type, (int64_t)d * p.dstate + n) * kLog2e : 0.0f;
        h[i] = nok && p.h0 ? load_any(p.h0, p.h0_type, at_state(p, tile.b, d) + n) : 0.0f;
    }

    FwdStage<T, C, U, FAST> stage(p, tile, lane);
    const int chunks = (p.seqlen + S::TS - 1) / S::TS;
    if (chunks > 0) {
        stage.load(p, tile, 0, sm, 0);
        copy_wait_all();
        __syncwarp();
        stage.commit(p, tile, 0, sm, 0);
        __syncwarp();
    }
    for (int k = 0; k < chunks; k++) {
        const int t0 = k * S::TS, buf = k % S::NBUF, next = (k + 1) % S::NBUF;
        if (k + 1 < chunks)
            stage.load(p, tile, t0 + S::TS, sm, next); // lands during the scan
        const float *bsrc = S::F32 ? sm + S::BR + buf * S::BCW : sm + S::B;
        const float *csrc = S::F32 ? sm + S::CR + buf * S::BCW : sm + S::CC;
        fwd_scan<T, C, U>(p, tile, c, q, ok, t0, h, a2, bsrc, csrc, sm);
        copy_wait_all();
        __syncwarp(); // the parts of y are written; the next chunk's inputs are in
        stage.epilogue(p, tile, t0, sm);
        if (k + 1 < chunks)
            stage.commit(p, tile, t0 + S::TS, sm, next);
        __syncwarp(); // staged; the raw x, dt, z buffer is free
    }
    if (p.state && ok) {
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if (state_of<C>(q, i) < p.dstate)
                p.state[at_state(p, tile.b, d) + state_of<C>(q, i)] = h[i];
    }
}

} // namespace fx::cuda::ssm

#endif
