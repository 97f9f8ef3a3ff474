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

constexpr int CH = 32, N = 16, TS = 16, SW = 4, PW = 2, THREADS = 32 * (SW + PW);
constexpr int R = 4;       // raw buffers: chunks j .. j + 3
constexpr int DDS = 2 * TS + 2; // (delta, delta x) row of a channel, floats
constexpr int LOOK = 2;

template <typename T> struct Smem {
    // in floats; raw regions hold T
    static constexpr int RAWX = TS * CH * (int)sizeof(T) / 4; // one raw x (dt, z) chunk
    static constexpr int RAWB = TS * N * (int)sizeof(T) / 4;  // one raw b (c) chunk
    static constexpr int RAW = 3 * RAWX + 2 * RAWB;           // one chunk's raw inputs
    static constexpr int BC = 0;                              // f32 b, c [2][2][TS][N]
    static constexpr int DD = BC + 2 * 2 * TS * N;            // [2][CH][DDS]
    static constexpr int P = DD + 2 * CH * DDS;               // parts of y [2][SW][TS][CH]
    static constexpr int RAWS = P + 2 * SW * TS * CH;         // raw inputs [R][RAW]
    static constexpr int PAD = RAWS + R * RAW; // the scan warps' clock words
    static constexpr int WORDS = PAD + SW;
    static constexpr size_t BYTES = sizeof(float) * WORDS;
};

template <typename T> inline bool fits(const ScanParams &p)
{
    auto aligned = [](const void *ptr) { return ptr == nullptr || (uintptr_t)ptr % 16 == 0; };
    return p.dstate == N && p.cpg % CH == 0 && (int64_t)p.dim * sizeof(T) % 16 == 0 &&
           (int64_t)p.groups * N * sizeof(T) % 16 == 0 && aligned(p.x) && aligned(p.dt) && aligned(p.z) &&
           aligned(p.b) && aligned(p.c) && aligned(p.y) && !p.saved;
}

template <typename T> struct Staging {
    using S = Smem<T>;
    static constexpr int EPU = 16 / (int)sizeof(T);       // elements a 16-byte copy
    static constexpr int XU = CH / EPU, BU = N / EPU;      // copies a row of x, of b
    int lane, par; // rows of parity par
    Tile t;

    __device__ Staging(const Tile &t_, int lane_, int par_) : lane(lane_), par(par_), t(t_) {}

    // The copies of chunk j's rows of parity par into raw buffer j % R.
    __device__ __forceinline__ void load(const ScanParams &p, int j, float *sm)
    {
        float *raw = sm + S::RAWS + (j % R) * S::RAW;
        const int t0 = j * TS;
        // x, dt, z: TS / 2 rows x XU copies each
        for (int u = lane; u < TS / 2 * XU; u += 32) {
            const int r = 2 * (u / XU) + par, k = u % XU, row = t0 + r;
            const bool ok = row < p.seqlen;
            const int64_t at = ok ? at_btd(p, t.b, row, t.d0) + k * EPU : 0;
            const void *src[3] = {p.x, p.dt, p.z};
#pragma unroll
            for (int m = 0; m < 3; m++)
                if (src[m])
                    fx_copy_async<16>(reinterpret_cast<T *>(raw + m * S::RAWX) + r * CH + k * EPU,
                                      static_cast<const T *>(src[m]) + at, ok);
        }
        for (int u = lane; u < TS / 2 * BU; u += 32) {
            const int r = 2 * (u / BU) + par, k = u % BU, row = t0 + r;
            const bool ok = row < p.seqlen;
            const int64_t at = ok ? at_btg(p, t.b, row, t.g) + k * EPU : 0;
            fx_copy_async<16>(reinterpret_cast<T *>(raw + 3 * S::RAWX) + r * N + k * EPU,
                              static_cast<const T *>(p.b) + at, ok);
            fx_copy_async<16>(reinterpret_cast<T *>(raw + 3 * S::RAWX + S::RAWB) + r * N + k * EPU,
                              static_cast<const T *>(p.c) + at, ok);
        }
        fx_copy_commit();
    }

    // Chunk j's (delta, delta x) and f32 b, c of this warp's rows.
    __device__ __forceinline__ void commit(const ScanParams &p, int j, float *sm, float bias)
    {
        const float *raw = sm + S::RAWS + (j % R) * S::RAW;
        const T *rx = reinterpret_cast<const T *>(raw), *rdt = reinterpret_cast<const T *>(raw + S::RAWX);
        float *dd = sm + S::DD + (j % 2) * CH * DDS + lane * DDS;
        const int rows = p.seqlen - j * TS;
#pragma unroll
        for (int k = 0; k < TS / 2; k++) {
            const int r = 2 * k + par;
            float u = fx_elem<T>::load(rdt[r * CH + lane]) + bias;
            const float delta = r < rows ? (p.softplus ? softplus(u) : u) : 0.0f;
            *reinterpret_cast<float2 *>(dd + 2 * r) =
                make_float2(delta, delta * fx_elem<T>::load(rx[r * CH + lane]));
        }
        const T *rb = reinterpret_cast<const T *>(raw + 3 * S::RAWX);
        float *bc = sm + S::BC + (j % 2) * 2 * TS * N;
#pragma unroll
        for (int k = 0; k < 2 * TS / 2 * N / 32; k++) { // b then c, this warp's rows
            const int e = k * 32 + lane, which = e / (TS / 2 * N), f = e % (TS / 2 * N);
            const int r = 2 * (f / N) + par, n = f % N;
            bc[which * TS * N + r * N + n] = fx_elem<T>::load(rb[which * TS * N + r * N + n]);
        }
    }

    // y of chunk j's rows of this warp.
    __device__ __forceinline__ void epilogue(const ScanParams &p, int j, const float *sm, float dskip)
    {
        const float *raw = sm + S::RAWS + (j % R) * S::RAW;
        const T *rx = reinterpret_cast<const T *>(raw), *rz = reinterpret_cast<const T *>(raw + 2 * S::RAWX);
        const float *parts = sm + S::P + (j % 2) * SW * TS * CH;
        const int rows = p.seqlen - j * TS;
        T *y = static_cast<T *>(p.y) + at_btd(p, t.b, j * TS, t.d0) + lane;
#pragma unroll
        for (int k = 0; k < TS / 2; k++) {
            const int r = 2 * k + par;
            if (r < rows) {
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < SW; w++)
                    sum += parts[(w * TS + r) * CH + lane];
                float v = sum + dskip * fx_elem<T>::load(rx[r * CH + lane]);
                if (p.z)
                    v *= silu(fx_elem<T>::load(rz[r * CH + lane]));
                y[(int64_t)r * p.dim] = fx_elem<T>::store(v);
            }
        }
    }
};

// Scan warp w over chunk j: lane = channel, states 4w .. 4w + 3.
template <typename T>
__device__ __forceinline__ void scan_chunk(int j, int w, int lane, float (&h)[4], const float (&a2)[4],
                                           float *sm, unsigned &clocks)
{
    using S = Smem<T>;
    const float *dd_row = sm + S::DD + (j % 2) * CH * DDS + lane * DDS;
    const float *b_rows = sm + S::BC + (j % 2) * 2 * TS * N + 4 * w, *c_rows = b_rows + TS * N;
    float *parts = sm + S::P + (j % 2) * SW * TS * CH + w * TS * CH + lane;
    float2 dd[TS];
    float4 bv[TS], cv[TS];
    float dec[TS][4], inc[TS][4];
#pragma unroll
    for (int s = -LOOK - 1; s < TS; s++) {
        const int so = s + LOOK + 1;
        if (so >= 0 && so < TS) {
            dd[so] = *reinterpret_cast<const float2 *>(dd_row + 2 * so);
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
        sched_fence(clocks);
    }
}

template <typename T> __global__ void __launch_bounds__(THREADS, 3) fwd_kernel(const ScanParams p)
{
    using S = Smem<T>;
    float *sm = block_smem();
    const Tile t = tile_at(p, blockIdx.x, CH);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = t.d0 + lane;
    const int chunks = (p.seqlen + TS - 1) / TS;
    if (warp < SW) {
        float a2[4], h[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = 4 * warp + i;
            a2[i] = fx_load_any(p.a, p.a_type, (int64_t)d * N + n) * fx_log2e;
            h[i] = p.h0 ? fx_load_any(p.h0, p.h0_type, at_state(p, t.b, d) + n) : 0.0f;
        }
        unsigned clocks = 0;
        __syncthreads(); // chunk 0 committed
        for (int j = 0; j < chunks; j++) {
            scan_chunk<T>(j, warp, lane, h, a2, sm, clocks);
            __syncthreads();
        }
        if (p.state)
#pragma unroll
            for (int i = 0; i < 4; i++)
                p.state[at_state(p, t.b, d) + 4 * warp + i] = h[i];
        if (lane == 0) // keeps the fences' clock reads
            reinterpret_cast<unsigned *>(sm)[S::PAD + warp] = clocks;
    } else {
        Staging<T> st(t, lane, warp - SW);
        const float bias = p.dt_bias ? fx_load_any(p.dt_bias, p.bias_type, d) : 0.0f;
        const float dskip = p.d ? fx_load_any(p.d, p.d_type, d) : 0.0f;
#pragma unroll
        for (int j = 0; j < R - 1; j++)
            if (j < chunks)
                st.load(p, j, sm);
            else
                fx_copy_commit();
        fx_copy_wait<R - 2>(); // chunk 0's
        __syncwarp();
        if (chunks > 0)
            st.commit(p, 0, sm, bias);
        __syncthreads();
        for (int j = 0; j < chunks; j++) {
            if (j > 0)
                st.epilogue(p, j - 1, sm, dskip);
            if (j + 1 < chunks) {
                fx_copy_wait<R - 3>(); // chunk j + 1's
                __syncwarp();
                st.commit(p, j + 1, sm, bias);
            }
            __syncwarp(); // chunk j - 1's raw rows read: reused by chunk j + 3
            if (j + R - 1 < chunks)
                st.load(p, j + R - 1, sm);
            else
                fx_copy_commit();
            __syncthreads();
        }
        if (chunks > 0)
            st.epilogue(p, chunks - 1, sm, dskip);
    }
}

} // namespace ws

#endif
