// Prototype (tools/ssm_bench -DSSM_WS, not in the library): the selective
// scan's forward with warp specialization, to measure whether more warps a
// scheduler (and warp-uniform b, c reads) make the forward faster.
//
// A block is 32 channels of one (batch, group), dstate 16, in 6 warps:
//   scan warps 0-3: lane = channel, warp w holds states 4w .. 4w + 3, so
//     every lane of a warp reads the same b and c values (one broadcast);
//     per step: the (delta, delta x) of its channel, 4 exps and 12 FMAs,
//     one store of its part of y;
//   staging warps 4-5: the copies (cp.async, three chunks ahead), the commit
//     (softplus, delta x, b and c as f32) and the epilogue (the four parts
//     of y added, d x, the gate, the store of y). Staging warp k owns the
//     rows of parity k of every chunk, in every buffer, so the two never
//     touch each other's data and need no barrier between them.
// One block barrier a chunk: scan warps scan chunk j while the staging warps
// write out chunk j - 1 and commit chunk j + 1.
//
// Limits (the prototype's, checked by ws::fits): dstate 16, channels per
// group a multiple of 32, 16-byte aligned rows, z and softplus on or off.
// No saved states.
#ifndef FX_SSM_WS_KERNEL_CUH
#define FX_SSM_WS_KERNEL_CUH

namespace ws {

using namespace fx_ssm;

constexpr int CH = 32, N = 16, TS = 16, SW = 4;
constexpr int R = 4;            // raw buffers: chunks j .. j + 3
// knobs: staging warps, the scan's exps LOOK steps ahead, a scheduling
// fence after each step
// SPLIT: the staging warps and the scan warps signal each other with named
// barriers (bar.arrive / bar.sync: chunk j committed, chunk j scanned)
// instead of one block barrier a chunk.
template <int PW_ = 4, int LOOK_ = 2, bool FENCE_ = false, bool SPLIT_ = false> struct Tune {
    static constexpr int PW = PW_, LOOK = LOOK_;
    static constexpr bool FENCE = FENCE_, SPLIT = SPLIT_;
};

// Named barrier `id` over `threads` threads: wait, or only arrive. (The
// emulator has block barriers only: both sides then wait, a stricter order.)
__device__ __forceinline__ void named_sync(int id, int threads)
{
#ifdef __CUDA_ARCH__
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
    (void)id, (void)threads;
    __syncthreads();
#endif
}
__device__ __forceinline__ void named_arrive(int id, int threads)
{
#ifdef __CUDA_ARCH__
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
    (void)id, (void)threads;
    __syncthreads();
#endif
}
constexpr int kFull = 1, kDone = 3; // + chunk parity

template <typename T> struct Smem {
    // in floats; raw regions hold T
    static constexpr bool F32 = sizeof(T) == 4;
    static constexpr int RAWX = TS * CH * (int)sizeof(T) / 4; // one raw x (dt, z) chunk
    static constexpr int RAWB = TS * N * (int)sizeof(T) / 4;  // one raw b (c) chunk
    static constexpr int RAW = 3 * RAWX + 2 * RAWB;           // one chunk's raw inputs
    static constexpr int BC = 0;                              // 16-bit inputs: f32 b, c [2][2][TS][N]
    static constexpr int DD = BC + (F32 ? 0 : 2 * 2 * TS * N); // (delta, delta x) [2][TS][CH] float2
    static constexpr int P = DD + 2 * TS * CH * 2;            // parts of y [2][SW][TS][CH]
    static constexpr int RAWS = P + 2 * SW * TS * CH;         // raw inputs [R][RAW]
    static constexpr int PAD = RAWS + R * RAW;                // the scan warps' clock words
    static constexpr int WORDS = PAD + SW;
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    // where the scan reads chunk j's b (c: + TS * N floats)
    __device__ static const float *b_rows(const float *sm, int j)
    {
        return F32 ? sm + RAWS + (j % R) * RAW + 3 * RAWX : sm + BC + (j % 2) * 2 * TS * N;
    }
};

template <typename T> inline bool fits(const ScanParams &p)
{
    auto aligned = [](const void *ptr) { return ptr == nullptr || (uintptr_t)ptr % 16 == 0; };
    return p.dstate == N && p.cpg % CH == 0 && (int64_t)p.dim * sizeof(T) % 16 == 0 &&
           (int64_t)p.groups * N * sizeof(T) % 16 == 0 && aligned(p.x) && aligned(p.dt) && aligned(p.z) &&
           aligned(p.b) && aligned(p.c) && aligned(p.y) && !p.saved;
}

// Staging warp k of PW owns the rows r = k (mod PW) of every chunk; a lane
// takes 4 consecutive channels (c0 ..) of rows k + PW (ri + 4 pass). Its
// global offsets are set once and advance by a chunk at each use (loads,
// epilogues: each in chunk order); rows are tested against the sequence's
// end only in its last chunk.
template <typename T, int PW> struct Staging {
    using S = Smem<T>;
    static constexpr int EPU = 16 / (int)sizeof(T);  // elements a 16-byte copy
    static constexpr int XU = CH / EPU, BU = N / EPU; // copies a row of x, of b
    static constexpr int ROWS = TS / PW, PASSES = ROWS / 4;
    static constexpr int NUX = (ROWS * XU + 31) / 32, NUB = (ROWS * BU + 31) / 32;
    static_assert(TS % (4 * PW) == 0, "whole passes of 4 rows");
    int k, ri, c0;
    int rx_row[NUX], rb_row[NUB]; // the rows of the lane's copies (-1: none)
    int sx[NUX], sb[NUB];         // their places in a raw buffer (elements)
    int64_t gx[NUX], gb[NUB];     // their sources in the next chunk to load (elements)
    int64_t oy;                   // the lane's first y element in the next chunk to write
    int64_t chunk_x, chunk_b;     // elements a chunk
    float bias[4], dskip[4];

    __device__ Staging(const ScanParams &p, const Tile &t, int lane, int k_) : k(k_)
    {
        ri = lane / 8, c0 = 4 * (lane % 8);
#pragma unroll
        for (int v = 0; v < 4; v++) {
            bias[v] = p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, t.d0 + c0 + v) : 0.0f;
            dskip[v] = p.d ? fx_load_any(p.d, p.d_type, t.d0 + c0 + v) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NUX; i++) {
            const int u = 32 * i + lane, r = k + PW * (u / XU), q = u % XU;
            rx_row[i] = u < ROWS * XU ? r : -1;
            sx[i] = r * CH + q * EPU;
            gx[i] = at_btd(p, t.b, 0, t.d0) + (int64_t)r * p.dim + q * EPU;
        }
#pragma unroll
        for (int i = 0; i < NUB; i++) {
            const int u = 32 * i + lane, r = k + PW * (u / BU), q = u % BU;
            rb_row[i] = u < ROWS * BU ? r : -1;
            sb[i] = r * N + q * EPU;
            gb[i] = at_btg(p, t.b, 0, t.g) + (int64_t)r * p.groups * N + q * EPU;
        }
        oy = at_btd(p, t.b, 0, t.d0) + c0;
        chunk_x = (int64_t)TS * p.dim, chunk_b = (int64_t)TS * p.groups * N;
    }
    __device__ __forceinline__ int row(int pass) const { return k + PW * (ri + 4 * pass); }
    __device__ __forceinline__ static float *raw_of(float *sm, int j) { return sm + S::RAWS + (j % R) * S::RAW; }

    // The copies of chunk j's rows of this warp into raw buffer j % R.
    template <bool FULL> __device__ __forceinline__ void load(const ScanParams &p, int j, float *sm)
    {
        float *raw = raw_of(sm, j);
        const int rows = p.seqlen - j * TS;
#pragma unroll
        for (int i = 0; i < NUX; i++) {
            if ((ROWS * XU) % 32 == 0 || rx_row[i] >= 0) {
                const bool ok = FULL || rx_row[i] < rows;
                const int64_t at = ok ? gx[i] : 0;
                fx_copy_async<16>(reinterpret_cast<T *>(raw) + sx[i], static_cast<const T *>(p.x) + at, ok);
                fx_copy_async<16>(reinterpret_cast<T *>(raw + S::RAWX) + sx[i], static_cast<const T *>(p.dt) + at, ok);
                if (p.z)
                    fx_copy_async<16>(reinterpret_cast<T *>(raw + 2 * S::RAWX) + sx[i], static_cast<const T *>(p.z) + at, ok);
            }
            gx[i] += chunk_x;
        }
#pragma unroll
        for (int i = 0; i < NUB; i++) {
            if ((ROWS * BU) % 32 == 0 || rb_row[i] >= 0) {
                const bool ok = FULL || rb_row[i] < rows;
                const int64_t at = ok ? gb[i] : 0;
                fx_copy_async<16>(reinterpret_cast<T *>(raw + 3 * S::RAWX) + sb[i], static_cast<const T *>(p.b) + at, ok);
                fx_copy_async<16>(reinterpret_cast<T *>(raw + 3 * S::RAWX + S::RAWB) + sb[i],
                                  static_cast<const T *>(p.c) + at, ok);
            }
            gb[i] += chunk_b;
        }
        fx_copy_commit();
    }
    __device__ __forceinline__ void load(const ScanParams &p, int j, float *sm)
    {
        if ((j + 1) * TS <= p.seqlen)
            load<true>(p, j, sm);
        else
            load<false>(p, j, sm);
    }

    // Chunk j's (delta, delta x) of this warp's rows (and f32 b, c for 16-bit inputs).
    __device__ __forceinline__ void commit(const ScanParams &p, int j, float *sm, int lane)
    {
        const float *raw = raw_of(sm, j);
        const T *rx = reinterpret_cast<const T *>(raw), *rdt = reinterpret_cast<const T *>(raw + S::RAWX);
        float *dd = sm + S::DD + (j % 2) * TS * CH * 2 + 2 * c0;
        const int rows = p.seqlen - j * TS;
#pragma unroll
        for (int ps = 0; ps < PASSES; ps++) {
            const int r = row(ps);
            float u[4], x[4];
            ld_vec<T, 4>(u, rdt + r * CH + c0);
            ld_vec<T, 4>(x, rx + r * CH + c0);
#pragma unroll
            for (int v = 0; v < 4; v++)
                u[v] += bias[v];
            if (p.softplus)
#pragma unroll
                for (int v = 0; v < 4; v++)
                    u[v] = softplus(u[v]);
            const bool ok = r < rows;
            float o[8];
#pragma unroll
            for (int v = 0; v < 4; v++) {
                o[2 * v] = ok ? u[v] : 0.0f;
                o[2 * v + 1] = o[2 * v] * x[v];
            }
            float4 *row_dd = reinterpret_cast<float4 *>(dd + r * CH * 2);
            row_dd[0] = make_float4(o[0], o[1], o[2], o[3]);
            row_dd[1] = make_float4(o[4], o[5], o[6], o[7]);
        }
        if constexpr (!S::F32) {
            const T *rb = reinterpret_cast<const T *>(raw + 3 * S::RAWX);
            float *bc = sm + S::BC + (j % 2) * 2 * TS * N;
            // this warp's rows of b and c: 2 x ROWS x N values, 4 a lane and pass
#pragma unroll
            for (int e0 = 0; e0 < 2 * ROWS * N / 4; e0 += 32) {
                const int e = e0 + lane;
                if ((2 * ROWS * N / 4) % 32 == 0 || e < 2 * ROWS * N / 4) {
                    const int which = e / (ROWS * N / 4), f = e % (ROWS * N / 4);
                    const int r = k + PW * (f / (N / 4)), n = 4 * (f % (N / 4));
                    float v4[4];
                    ld_vec<T, 4>(v4, rb + which * TS * N + r * N + n);
                    *reinterpret_cast<float4 *>(bc + which * TS * N + r * N + n) = make_float4(v4[0], v4[1], v4[2], v4[3]);
                }
            }
        }
    }

    // y of chunk j's rows of this warp.
    __device__ __forceinline__ void epilogue(const ScanParams &p, int j, const float *sm)
    {
        const float *raw = raw_of(const_cast<float *>(sm), j);
        const T *rx = reinterpret_cast<const T *>(raw), *rz = reinterpret_cast<const T *>(raw + 2 * S::RAWX);
        const float *parts = sm + S::P + (j % 2) * SW * TS * CH + c0;
        const int rows = p.seqlen - j * TS;
        T *y = static_cast<T *>(p.y) + oy;
        oy += chunk_x;
#pragma unroll
        for (int ps = 0; ps < PASSES; ps++) {
            const int r = row(ps);
            if (r < rows) {
                float4 sum = *reinterpret_cast<const float4 *>(parts + r * CH);
#pragma unroll
                for (int w = 1; w < SW; w++) {
                    const float4 q = *reinterpret_cast<const float4 *>(parts + (w * TS + r) * CH);
                    sum.x += q.x, sum.y += q.y, sum.z += q.z, sum.w += q.w;
                }
                float x[4], zv[4], out[4];
                const float s4[4] = {sum.x, sum.y, sum.z, sum.w};
                ld_vec<T, 4>(x, rx + r * CH + c0);
                if (p.z) {
                    ld_vec<T, 4>(zv, rz + r * CH + c0);
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        out[v] = (s4[v] + dskip[v] * x[v]) * silu(zv[v]);
                } else {
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        out[v] = s4[v] + dskip[v] * x[v];
                }
                st_vec<T, 4>(y + (int64_t)r * p.dim, out);
            }
        }
    }
};

// Scan warp w over chunk j: lane = channel, states 4w .. 4w + 3.
template <typename T, class U>
__device__ __forceinline__ void scan_chunk(int j, int w, int lane, float (&h)[4], const float (&a2)[4],
                                           float *sm, unsigned &clocks)
{
    using S = Smem<T>;
    const float *dd_row = sm + S::DD + (j % 2) * TS * CH * 2 + 2 * lane;
    const float *b_rows = S::b_rows(sm, j) + 4 * w, *c_rows = b_rows + TS * N;
    float *parts = sm + S::P + (j % 2) * SW * TS * CH + w * TS * CH + lane;
    float2 dd[TS];
    float4 bv[TS], cv[TS];
    float dec[TS][4], inc[TS][4];
    constexpr int LOOK = U::LOOK;
#pragma unroll
    for (int s = -LOOK - 1; s < TS; s++) {
        const int so = s + LOOK + 1;
        if (so >= 0 && so < TS) {
            dd[so] = *reinterpret_cast<const float2 *>(dd_row + so * CH * 2);
            bv[so] = *reinterpret_cast<const float4 *>(b_rows + so * N);
        }
        if (s + 1 >= 0 && s + 1 < TS)
            cv[s + 1] = *reinterpret_cast<const float4 *>(c_rows + (s + 1) * N);
        const int se = s + LOOK;
        if (se >= 0 && se < TS) {
            const float b4[4] = {bv[se].x, bv[se].y, bv[se].z, bv[se].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                dec[se][i] = fx_fast_exp2(dd[se].x * a2[i]);
                inc[se][i] = dd[se].y * b4[i];
            }
        }
        if (s < 0)
            continue;
        const float c4[4] = {cv[s].x, cv[s].y, cv[s].z, cv[s].w};
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            h[i] = fmaf(dec[s][i], h[i], inc[s][i]);
            acc = fmaf(c4[i], h[i], acc);
        }
        parts[s * CH] = acc;
        if (U::FENCE)
            sched_fence(clocks);
    }
}

template <typename T, class U> __global__ void __launch_bounds__(32 * (SW + U::PW), 3) fwd_kernel(const ScanParams p)
{
    constexpr int PW = U::PW, THREADS = 32 * (SW + PW);
    using S = Smem<T>;
    float *sm = block_smem();
    const Tile t = tile_at(p, blockIdx.x, CH);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int chunks = (p.seqlen + TS - 1) / TS;
    if (warp < SW) {
        const int d = t.d0 + lane;
        float a2[4], h[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = 4 * warp + i;
            a2[i] = fx_load_any(p.a, p.a_type, (int64_t)d * N + n) * fx_log2e;
            h[i] = p.h0 ? fx_load_any(p.h0, p.h0_type, at_state(p, t.b, d) + n) : 0.0f;
        }
        unsigned clocks = 0;
        if (!U::SPLIT)
            __syncthreads(); // chunk 0 committed
        for (int j = 0; j < chunks; j++) {
            if (U::SPLIT)
                named_sync(kFull + j % 2, THREADS);
            scan_chunk<T, U>(j, warp, lane, h, a2, sm, clocks);
            if (U::SPLIT)
                named_arrive(kDone + j % 2, THREADS);
            else
                __syncthreads();
        }
        if (p.state)
#pragma unroll
            for (int i = 0; i < 4; i++)
                p.state[at_state(p, t.b, d) + 4 * warp + i] = h[i];
        if (lane == 0) // keeps the fences' clock reads
            reinterpret_cast<unsigned *>(sm)[S::PAD + warp] = clocks;
    } else {
        Staging<T, PW> st(p, t, lane, warp - SW);
#pragma unroll
        for (int j = 0; j < R - 1; j++)
            if (j < chunks)
                st.load(p, j, sm);
            else
                fx_copy_commit();
        fx_copy_wait<R - 2>(); // chunk 0's
        __syncwarp();
        if (chunks > 0)
            st.commit(p, 0, sm, lane);
        if (U::SPLIT) {
            if (chunks > 0)
                named_arrive(kFull, THREADS);
        } else {
            __syncthreads();
        }
        for (int j = 0; j < chunks; j++) {
            if (j > 0) {
                if (U::SPLIT) // chunk j - 1 scanned: its parts are in, its DD and P slots free
                    named_sync(kDone + (j - 1) % 2, THREADS);
                st.epilogue(p, j - 1, sm);
            }
            if (j + 1 < chunks) {
                fx_copy_wait<R - 3>(); // chunk j + 1's
                __syncwarp();
                st.commit(p, j + 1, sm, lane);
                if (U::SPLIT)
                    named_arrive(kFull + (j + 1) % 2, THREADS);
            }
            __syncwarp(); // chunk j - 1's raw rows read: reused by chunk j + 3
            if (j + R - 1 < chunks)
                st.load(p, j + R - 1, sm);
            else
                fx_copy_commit();
            if (!U::SPLIT)
                __syncthreads();
        }
        if (chunks > 0) {
            if (U::SPLIT)
                named_sync(kDone + (chunks - 1) % 2, THREADS);
            st.epilogue(p, chunks - 1, sm);
        }
    }
}

} // namespace ws

#endif
