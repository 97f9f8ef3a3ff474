// The selective scan's warp-specialized forward (dstate 16), its sliced
// form for larger dstates (slices of 16 states) and the sliced form's
// second kernel.
#ifndef FX_CUDA_SSM_FORWARD_WS_CUH
#define FX_CUDA_SSM_FORWARD_WS_CUH

#include "cuda/ssm/forward.cuh"

namespace fx::cuda::ssm {

// ---- forward, warp-specialized (dstate 16) ----
//
// The forward above gives each warp its own staging, so a warp does
// everything for its 8 channels and the large case has ~3 warps a
// scheduler: each warp then waits on its own latencies (bench/RESULTS.md:
// fewer warps measured slower, every other lever moved it little). Here a
// block of 32 channels of one (batch, group) is 8 warps with two jobs:
//   scan warps 0-3: lane = channel, warp w holds states 4w .. 4w + 3, so
//     every lane of a warp reads the same b and c values (a broadcast, not
//     4 wavefronts); per step one (delta, delta x) load, 4 exps, 12 FMAs
//     and one store of the warp's part of y's sum over states;
//   staging warps 4-7: warp k owns rows k, k + 4, ... of every chunk, a lane
//     4 consecutive channels of one of them: the cp.async copies (three
//     chunks ahead; b and c by rows of their own, WsStaging::bc_row), the
//     commit (softplus, delta x; 16-bit b and c to f32) and the epilogue
//     (the 4 parts added, d x, the gate recomputed from the raw z, one
//     vector store of y). A staging warp touches no other's rows, so the
//     staging needs no barrier of its own.
// One block barrier a chunk (ws_block_sync): the scan of chunk j runs
// beside the epilogue of j - 1 and the commit of j + 1 (mbarrier hand-overs
// that let the scan warps run on measured slower). 24 warps an SM (3
// blocks of 56 KB of shared memory for f32), all resident for the large
// case: 214-221 -> 180-182 us (bench/RESULTS.md), the small cases faster too.
constexpr int kWsChannels = 32, kWsScanWarps = 4, kWsStageWarps = 4, kWsSteps = 16, kWsStates = 16;
constexpr int kWsThreads = 32 * (kWsScanWarps + kWsStageWarps);
constexpr int kWsRing = 4; // raw chunks: j (b, c being scanned) .. j + 3 (landing)
constexpr int kWsLook = 2; // a decay's exp this many steps before its FMA (3: slower)

template <typename T> struct WsSmem {
    static constexpr int CH = kWsChannels, N = kWsStates, TS = kWsSteps;
    static constexpr bool F32 = sizeof(T) == 4; // b, c read where they land
    // in floats; the raw regions hold T
    static constexpr int RAWX = TS * CH * (int)sizeof(T) / 4; // one raw x (dt, z) chunk [TS][CH]
    static constexpr int RAWB = TS * N * (int)sizeof(T) / 4;  // one raw b (c) chunk [TS][N]
    static constexpr int RAW = 3 * RAWX + 2 * RAWB;
    static constexpr int BC = 0;                               // 16-bit: f32 b, c [2][2][TS][N]
    static constexpr int DD = BC + (F32 ? 0 : 2 * 2 * TS * N); // (delta, delta x) [2][TS][CH] float2
    static constexpr int P = DD + 2 * TS * CH * 2;             // y's parts [2][scan warp][TS][CH]
    static constexpr int RAWS = P + 2 * kWsScanWarps * TS * CH; // [kWsRing][RAW]
    static constexpr int WORDS = RAWS + kWsRing * RAW;
    static constexpr size_t BYTES = sizeof(float) * WORDS;
    // The sliced kernel's states at chunk ends, [2][CH][N] by the chunk's
    // parity, for their coalesced stores (save_at), after the rest
    static constexpr int SAVES = WORDS;
    static constexpr size_t SLICED_BYTES = BYTES + sizeof(float) * 2 * CH * N;
    // chunk j's channel c's quad q, quads swizzled by (c / 2) % 4 so that
    // both the scan warps' stores (lane = channel) and the reads for the
    // global stores (4 lanes a channel) are free of bank conflicts
    __device__ static constexpr int save_at(unsigned j, int c, int q)
    {
        return SAVES + ((int)(j % 2) * CH + c) * N + 4 * (q ^ (c >> 1 & 3));
    }
    // A chunk's places (in floats from the block's base, or from a lane's
    // pinned place in the region) by its ring slot, j % kWsRing (the double
    // buffers take slot % 2 = j % 2); where the slot is a constant, as in
    // the staging's unrolled loop, so is each offset. The one statement of
    // this layout, for the scan and the staging.
    __device__ static constexpr unsigned raw_at(unsigned slot) { return RAWS + slot * RAW; } // raw inputs
    __device__ static constexpr unsigned bc_at(unsigned slot) { return BC + slot % 2 * 2 * TS * N; } // 16-bit: f32 b, c
    __device__ static constexpr unsigned dd_rows_at(unsigned slot) { return DD + slot % 2 * TS * CH * 2; }
    __device__ static constexpr unsigned parts_at(unsigned slot) { return P + slot % 2 * kWsScanWarps * TS * CH; }
    // chunk j's f32 b rows (its c rows follow, TS * N floats on)
    __device__ static const float *b_rows(float *sm, unsigned j)
    {
        return sm + (F32 ? raw_at(j % kWsRing) + 3 * RAWX : bc_at(j));
    }
    // (delta, delta x) rows: a row of 32 channels is 16 16-byte pairs of
    // channels, the last 8 of them swapped two by two, so that a staging
    // lane's two stores of 4 channels (pairs 2l, 2l + 1) and a scan warp's
    // 8-byte reads are free of bank conflicts; `dd_at(c)` is channel c's
    // place (in floats) in its row
    __device__ static constexpr int dd_at(int c) { return 2 * c ^ (c >> 4) << 2; }
};

// The shapes it takes: dstate 16, whole 32-channel tiles, 16-byte aligned
// rows (the copies and the staging's vector accesses).
template <typename T> inline bool ws_fits(const ScanParams &p)
{
    return p.dstate == kWsStates && p.cpg % kWsChannels == 0 && rows_aligned<T>(p, 16, 16);
}

// The shapes the sliced kernels (WsOpts::SL, ssm_bwd_kernel's SL) take:
// dstate a multiple of 16 from 32, whole 32-channel tiles (the rows of x,
// dt, z, y, b and c are then whole multiples of 16 bytes for every input
// type). The tensors must also start on 16 bytes (rows_aligned); where a
// sliced kernel is required and one does not, the launcher copies it.
template <typename T> inline bool ws_sliced_shape(const ScanParams &p)
{
    return p.dstate > kWsStates && p.dstate % kWsStates == 0 && p.cpg % kWsChannels == 0;
}

// Where the backward is sliced: every such shape but dstate 32 and 64,
// where the configuration's own kernel (8 x 4, 8 x 8) is faster (32: 17-22 %,
// 64: 14-17 %); elsewhere the sliced one measured 28-61 % faster (dstate
// 128 f32 1566 -> 1055 us, B4 L1024 D1024, bench/RESULTS.md). Its chunks
// are 16 steps, so there the forward saves a state every 16 steps: the
// shapes alone decide, never the addresses (fx_ssm_save_every, which
// check_saved holds this rule to).
template <typename T> inline bool bwd_sliced_shape(const ScanParams &p)
{
    return ws_sliced_shape<T>(p) && p.dstate != 32 && p.dstate != 64;
}

// Where the forward is sliced without saved states (and at dstate 32 with
// them): every such shape, its rows 16-byte aligned, but f32 inputs at
// dstate 32 and 64, where the one-warp-a-tile forward's own configuration
// is as fast (32: -2 % sliced, +0.5 % with saved states) or faster (64:
// 3 %). Elsewhere the sliced one measured 12-79 % faster, e.g. dstate 128
// f32 412 -> 230 us, 16-bit at 32 105 -> 74 (B4 L1024 D1024,
// bench/RESULTS.md). Above dstate 32 with saved states their interval
// decides (fwd_launch).
template <typename T> inline bool ws_sliced_fits(const ScanParams &p)
{
    return ws_sliced_shape<T>(p) && rows_aligned<T>(p, 16, 16) &&
           !(sizeof(T) == 4 && (p.dstate == 32 || p.dstate == 64));
}

// The options a chunk of the warp-specialized kernel would otherwise test at
// run time (the gate z, softplus, the saved states): compiled in, since each
// test is a reload of the parameter and a few uniform instructions a chunk
// (bench/RESULTS.md).
// SL: a block is one slice of 16 states of a larger dstate (fwd_launch):
// its part of y's sum goes to its own row of the f32 sums p.ysum, which a
// second kernel adds up in slice order and turns into y
// (ssm_fwd_finish_kernel), and it saves its states at each
// chunk's end, every 16 steps, the sliced backward's chunk. The gate is the
// second kernel's, so a slice never has Z (nor copies z).
template <bool Z_, bool SP_, bool SAVE_, bool SL_ = false> struct WsOpts {
    static constexpr bool Z = Z_, SP = SP_, SAVE = SAVE_, SL = SL_;
    static_assert(!(Z && SL), "the sliced forward gates y in its second kernel");
};

// body(WsOpts<..., SL>()) for p's options.
template <bool SL = false, class F>
inline auto with_ws_opts(const ScanParams &p, F &&body) -> decltype(body(WsOpts<!SL, true, true, SL>()))
{
    auto save = [&](auto z, auto sp) {
        constexpr bool Z = decltype(z)::value, SP = decltype(sp)::value;
        return p.saved ? body(WsOpts<Z, SP, true, SL>()) : body(WsOpts<Z, SP, false, SL>());
    };
    auto softplus = [&](auto z) {
        return p.softplus ? save(z, std::true_type{}) : save(z, std::false_type{});
    };
    if constexpr (SL)
        return softplus(std::false_type{});
    else
        return p.z ? softplus(std::true_type{}) : softplus(std::false_type{});
}

// The block barrier of the warp-specialized kernel. The scan and staging
// warps reach it at different instructions, which __syncthreads (bar.sync,
// i.e. barrier.sync.aligned) does not allow (compute-sanitizer's synccheck
// reports it); barrier.sync without .aligned does.
__device__ __forceinline__ void ws_block_sync()
{
#ifdef __CUDA_ARCH__
    asm volatile("barrier.sync 1, %0;" ::"n"(kWsThreads) : "memory");
#else
    __syncthreads();
#endif
}

template <typename T, class O> struct WsStaging {
    using S = WsSmem<T>;
    static constexpr int CH = S::CH, N = S::N, TS = S::TS;
    static constexpr int EPU = 16 / (int)sizeof(T);  // elements a 16-byte copy
    static constexpr int XU = CH / EPU, BU = N / EPU; // copies a row of x, of b
    static constexpr int ROWS = TS / kWsStageWarps;   // a staging warp's rows a chunk
    static_assert(ROWS == 4, "a lane takes one row of 8 lanes x 4 channels");
    static_assert(ROWS * XU <= 32 && 2 * ROWS * BU <= 32, "one copy a lane of x (dt, z), of b or c");
    // The rows of b and c a staging warp copies (and for 16-bit inputs
    // converts): 2k, 2k + 1, 2k + 8, 2k + 9, so that a copy's 8 lanes
    // cover two neighbouring rows, all 32 banks. (Its own rows of x, dt, z
    // are k, k + 4, ...: nothing else reads the rows of b and c before the
    // block barrier.) `bc_row_of(k, g)`: the warp's g-th row; piece i of its
    // copies: BU pieces a row, rows by pairs, b's pair then c's.
    __device__ static int bc_row_of(int k, int g) { return 2 * k + g % 2 + 8 * (g / 2); }
    __device__ static int bc_row(int k, int i) { return bc_row_of(k, i / BU % 2 + 2 * (i / (4 * BU))); }
    __device__ static bool bc_is_c(int i) { return i / (2 * BU) % 2; }
    // Everything a chunk touches is a fixed offset from where the previous
    // chunk's was: the sources and y step by pointers, and a shared place is
    // one of the lane's pinned addresses plus a constant for the chunk's slot.
    int r;                       // the lane's row of each chunk
    bool copies_x, copies_bc;    // whether the lane has a piece of x (dt, z), of b or c
    bool of_c;                   // its piece of b or c is c's
    int row_x, row_bc;           // the rows of its pieces
    // the lane's places in shared memory, pinned (each access a constant
    // from one of them): its parts of y in a row, its pieces of a raw x
    // (dt, z) row, its (delta, delta x) stores, its copies' destinations,
    // and for 16-bit inputs its quad of b or c to convert (raw, then f32)
    float *my_parts, *my_raw, *my_dd0, *my_dd1, *my_copy_x, *my_copy_bc, *my_conv_raw, *my_conv;
    const T *src[4];             // x, dt, z, b or c: the lane's pieces of the next chunk to load
    // the lane's y in the next chunk written; sliced: its f32 sums
    typename std::conditional<O::SL, float, T>::type *y;
    int64_t chunk_x, chunk_b;
    float bias[4], dskip[4];

    // `n0`: the block's first state (its slice's, else 0)
    __device__ WsStaging(const ScanParams &p, const Tile &t, int lane, int k, int n0, float *sm)
    {
        r = k + kWsStageWarps * (lane / 8);
        const int c0 = 4 * (lane % 8); // its first channel
#pragma unroll
        for (int v = 0; v < 4; v++) {
            bias[v] = p.dt_bias ? load_any(p.dt_bias, p.bias_type, t.d0 + c0 + v) : 0.0f;
            dskip[v] = p.d && !O::SL ? load_any(p.d, p.d_type, t.d0 + c0 + v) : 0.0f;
        }
        const int64_t x0 = at_btd(p, t.b, 0, t.d0), b0 = at_btg(p, t.b, 0, t.g);
        copies_x = lane < ROWS * XU, copies_bc = lane < 2 * ROWS * BU;
        of_c = bc_is_c(lane);
        row_x = k + kWsStageWarps * (lane / XU), row_bc = bc_row(k, lane);
        // (offsets in T scaled to floats: c0 and the pieces are multiples of 4)
        constexpr int TW = (int)sizeof(T);
        my_parts = pinned_shared(sm + r * CH + c0);
        my_raw = S::F32 ? my_parts : pinned_shared(sm + (r * CH + c0) * TW / 4);
        my_copy_x = S::F32 ? my_parts : pinned_shared(sm + (row_x * CH + (lane % XU) * EPU) * TW / 4);
        my_copy_bc = pinned_shared(sm + ((of_c ? TS * N : 0) + row_bc * N + (lane % BU) * EPU) * TW / 4);
        my_dd0 = pinned_shared(sm + r * CH * 2 + S::dd_at(c0));
        my_dd1 = pinned_shared(sm + r * CH * 2 + S::dd_at(c0 + 2));
        if constexpr (!S::F32) {
            // 2 x ROWS rows of N: one quad a lane (ROWS * N / 2 = 32 quads)
            const int which = lane / (ROWS * N / 4), f = lane % (ROWS * N / 4);
            const int conv = which * TS * N + bc_row_of(k, f / (N / 4)) * N + 4 * (f % (N / 4));
            my_conv_raw = pinned_shared(sm + conv * TW / 4);
            my_conv = pinned_shared(sm + conv);
        }
        const int64_t gx = x0 + (int64_t)row_x * p.dim + (lane % XU) * EPU;
        const int row_b = O::SL ? p.groups * p.dstate : p.groups * N; // (16 where not sliced)
        const int64_t gb = b0 + (int64_t)row_bc * row_b + n0 + (lane % BU) * EPU;
        const T *const in[4] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                                static_cast<const T *>(p.z), static_cast<const T *>(of_c ? p.c : p.b)};
#pragma unroll
        for (int m = 0; m < 4; m++) // (no z: x's pieces stand in, never copied)
            src[m] = (in[m] ? in[m] : in[0]) + (m < 3 ? gx : gb);
        chunk_x = (int64_t)TS * p.dim, chunk_b = (int64_t)TS * row_b;
        if constexpr (O::SL) // the slice's row of sums
            y = p.ysum + (int64_t)(n0 / kWsStates) * p.batch * p.seqlen * p.dim + x0 + (int64_t)r * p.dim + c0;
        else
            y = static_cast<T *>(p.y) + x0 + (int64_t)r * p.dim + c0;
    }

    // Starts the copies of chunk j's rows of this warp into its ring slot;
    // called for j = 0, 1, 2, ... in order (the sources step a chunk).
    // Rows past the end are zeros (the scan then keeps its state).
    template <bool FULL> __device__ __forceinline__ void copy(const ScanParams &p, unsigned j, unsigned slot)
    {
        const unsigned raw = S::raw_at(slot);
        const int rows = p.seqlen - (int)j * TS;
        // a row past the end reads nothing; its address is the tensor's start
        // (the constructor's list again: one helper for both changed the
        // loop's code, +4 to +8 instructions)
        const T *const in[4] = {static_cast<const T *>(p.x), static_cast<const T *>(p.dt),
                                static_cast<const T *>(p.z), static_cast<const T *>(of_c ? p.c : p.b)};
        if (copies_x) {
            const bool ok = FULL || row_x < rows;
#pragma unroll
            for (int m = 0; m < 3; m++)
                if (m < 2 || O::Z)
                    copy_async<16>(my_copy_x + raw + m * S::RAWX, ok ? src[m] : in[m], ok);
        }
        if (copies_bc) {
            const bool ok = FULL || row_bc < rows;
            copy_async<16>(my_copy_bc + raw + 3 * S::RAWX, ok ? src[3] : in[3], ok);
        }
#pragma unroll
        for (int m = 0; m < 4; m++)
            src[m] += m < 3 ? chunk_x : chunk_b;
    }
    __device__ __forceinline__ void load(const ScanParams &p, unsigned j, unsigned slot)
    {
        if ((int)(j + 1) * TS <= p.seqlen)
            copy<true>(p, j, slot);
        else
            copy<false>(p, j, slot);
        copy_commit();
    }

    // Chunk j's (delta, delta x) of the lane's row (delta 0 past the end),
    // and for 16-bit inputs the warp's rows of b and c in f32.
    __device__ __forceinline__ void commit(const ScanParams &p, unsigned j, unsigned slot)
    {
        const float *mine = my_raw + S::raw_at(slot);
        float u[4], x[4];
        ld_vec<T, 4>(u, reinterpret_cast<const T *>(mine + S::RAWX));
        ld_vec<T, 4>(x, reinterpret_cast<const T *>(mine));
#pragma unroll
        for (int v = 0; v < 4; v++)
            u[v] += bias[v];
        if constexpr (O::SP)
#pragma unroll
            for (int v = 0; v < 4; v++)
                u[v] = softplus(u[v]);
        const bool ok = r < p.seqlen - (int)j * TS;
        float o[8];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            o[2 * v] = ok ? u[v] : 0.0f;
            o[2 * v + 1] = o[2 * v] * x[v];
        }
        const unsigned dd = S::dd_rows_at(slot);
        *reinterpret_cast<float4 *>(my_dd0 + dd) = make_float4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<float4 *>(my_dd1 + dd) = make_float4(o[4], o[5], o[6], o[7]);
        if constexpr (!S::F32) {
            float v4[4];
            ld_vec<T, 4>(v4, reinterpret_cast<const T *>(my_conv_raw + S::raw_at(slot) + 3 * S::RAWX));
            *reinterpret_cast<float4 *>(my_conv + S::bc_at(slot)) = make_float4(v4[0], v4[1], v4[2], v4[3]);
        }
    }

    // Makes the warp's copies of a chunk visible to its other lanes. For f32
    // inputs there is nothing to make visible: a lane commits and writes out
    // only the pieces of x, dt and z it copied itself, and the scan warps read
    // b and c after a block barrier.
    __device__ __forceinline__ static void lanes_sync()
    {
        if constexpr (!S::F32)
            __syncwarp();
    }

    // Chunk j of the staging's loop, in ring slot `slot` (j % kWsRing): y of
    // chunk j - 1, the commit of j + 1, the copies of j + 3, the block
    // barrier. Called for j = 0 .. chunks; true at chunks, where only the
    // last y is left to write.
    __device__ __forceinline__ bool step(const ScanParams &p, unsigned j, unsigned slot, int chunks)
    {
        constexpr unsigned M = kWsRing - 1; // slot + M: the slot of chunk j + M, and of j - 1
        if (slot != 0 || j > 0) // (only slot 0 tests j)
            epilogue(p, j - 1, (slot + M) % kWsRing);
        if ((int)j == chunks)
            return true;
        if ((int)j + 1 < chunks) {
            copy_wait<kWsRing - 3>(); // chunk j + 1's
            lanes_sync();
            commit(p, j + 1, (slot + 1) % kWsRing);
        }
        lanes_sync(); // chunk j - 1's raw rows read: chunk j + 3 lands there
        if ((int)j + kWsRing - 1 < chunks)
            load(p, j + M, (slot + M) % kWsRing);
        else
            copy_commit();
        ws_block_sync();
        return false;
    }

    // y of chunk j's row of the lane; called for j = 0, 1, ... in order.
    __device__ __forceinline__ void epilogue(const ScanParams &p, unsigned j, unsigned slot)
    {
        const float *parts = my_parts + S::parts_at(slot);
        auto *out_y = y;
        y += chunk_x;
        if (r >= p.seqlen - (int)j * TS)
            return;
        float4 sum = *reinterpret_cast<const float4 *>(parts);
#pragma unroll
        for (int w = 1; w < kWsScanWarps; w++) {
            const float4 q = *reinterpret_cast<const float4 *>(parts + w * TS * CH);
            sum.x += q.x, sum.y += q.y, sum.z += q.z, sum.w += q.w;
        }
        if constexpr (O::SL) // the slice's part; d x and the gate come after every slice's
            *reinterpret_cast<float4 *>(out_y) = sum;
        else
            write_y(out_y, sum, my_raw + S::raw_at(slot));
    }

    // y of the lane's 4 channels from its raw x and z (`mine`)
    __device__ __forceinline__ void write_y(T *out_y, float4 sum, const float *mine) const
    {
        store_y4<T, O::Z>(out_y, sum, dskip, reinterpret_cast<const T *>(mine),
                          reinterpret_cast<const T *>(mine + 2 * S::RAWX));
    }
};

// Scan warp w over chunk j: lane = channel, states 4w .. 4w + 3. The decays
// and increments are computed kWsLook steps before their FMAs, from
// operands read a step before that; every load is issued before the step's
// store (a shared-memory load cannot move above a store).
template <typename T, int LOOK>
__device__ __forceinline__ void ws_scan_chunk(unsigned j, int w, int lane, float (&h)[4], const float (&a2)[4], float *sm)
{
    using S = WsSmem<T>;
    constexpr int TS = S::TS, CH = S::CH, N = S::N;
    const float *dd_col = sm + S::dd_rows_at(j) + S::dd_at(lane);
    const float *b_rows = S::b_rows(sm, j) + 4 * w, *c_rows = b_rows + TS * N;
    float *parts = sm + S::parts_at(j) + w * TS * CH + lane;
    float2 dd[TS];
    float4 bv[TS], cv[TS];
    float dec[TS][4], inc[TS][4];
#pragma unroll
    for (int s = -LOOK - 1; s < TS; s++) {
        const int so = s + LOOK + 1; // the operands of step so's exps
        if (so >= 0 && so < TS) {
            dd[so] = *reinterpret_cast<const float2 *>(dd_col + so * CH * 2);
            bv[so] = *reinterpret_cast<const float4 *>(b_rows + so * N);
        }
        if (s + 1 >= 0 && s + 1 < TS)
            cv[s + 1] = *reinterpret_cast<const float4 *>(c_rows + (s + 1) * N);
        const int se = s + LOOK; // step se's exps and increments
        if (se >= 0 && se < TS) {
            const float b4[4] = {bv[se].x, bv[se].y, bv[se].z, bv[se].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                dec[se][i] = fast_exp2(dd[se].x * a2[i]);
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
    }
}

// The sliced kernel's saved states go through shared memory, so that 4
// lanes store a channel's 16 states of the slice as 64 contiguous bytes:
// stored by each lane (16 bytes in each of 32 rows an instruction) they
// cost the kernel 2-3x as much (bench/RESULTS.md). A scan lane puts its 4
// states aside at the end of chunk j (`h`) ...
template <typename T> __device__ __forceinline__ void ws_put_saved(const ScanParams &p, float *sm, unsigned j, const float (&h)[4])
{
    using S = WsSmem<T>;
    if ((int)(j + 1) * S::TS < p.seqlen) // (the state entering chunk j + 1)
        *reinterpret_cast<float4 *>(sm + S::save_at(j, threadIdx.x % 32, threadIdx.x / 32)) =
            make_float4(h[0], h[1], h[2], h[3]);
}

// ... and during chunk j + 1, past the block barrier between them, the
// scan warps store them (called for chunk j + 1 with j + 1 > 0). The buffer
// of j's parity is written again at the end of chunk j + 2, after the next
// block barrier: no other barrier is needed.
template <typename T>
__device__ __forceinline__ void ws_store_saved(const ScanParams &p, const Tile &t, const float *sm, int slice, unsigned j)
{
    using S = WsSmem<T>;
    const int c = threadIdx.x / 4, q = threadIdx.x % 4;
    *reinterpret_cast<float4 *>(p.saved + (((int64_t)t.b * p.nsaved + j) * p.dim + t.d0 + c) * p.dstate +
                                S::N * slice + 4 * q) = *reinterpret_cast<const float4 *>(sm + S::save_at(j, c, q));
}

template <typename T, class O, int LOOK = kWsLook>
__global__ void __launch_bounds__(kWsThreads, 3) ssm_fwd_ws_kernel(const ScanParams p)
{
    using S = WsSmem<T>;
    constexpr int TS = S::TS;
    float *sm = block_smem();
    // sliced: the slices of a tile are neighbouring blocks (their x, dt, z
    // reads meet in L2)
    const int slices = O::SL ? p.dstate / kWsStates : 1;
    const int slice = O::SL ? (int)blockIdx.x % slices : 0;
    const Tile t = tile_at(p, O::SL ? (int)blockIdx.x / slices : (int)blockIdx.x, kWsChannels);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int chunks = (p.seqlen + TS - 1) / TS;
    if (warp < kWsScanWarps) {
        const int d = t.d0 + lane;
        const int n0 = kWsStates * slice + 4 * warp; // the lane's first state
        const int64_t at = at_state(p, t.b, d) + n0;
        const int row = O::SL ? p.dstate : kWsStates; // (16 where not sliced)
        float a2[4], h[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a2[i] = load_any(p.a, p.a_type, (int64_t)d * row + n0 + i) * kLog2e;
            h[i] = p.h0 ? load_any(p.h0, p.h0_type, at + i) : 0.0f;
        }
        ws_block_sync(); // chunk 0 committed
        for (unsigned j = 0; (int)j < chunks; j++) {
            if (O::SAVE && O::SL && j > 0) // the state entering chunk j, put aside at j - 1's end
                ws_store_saved<T>(p, t, sm, slice, j - 1);
            ws_scan_chunk<T, LOOK>(j, warp, lane, h, a2, sm);
            // the state entering chunk j + 1, for the backward (SAVE = TS)
            if constexpr (O::SAVE && O::SL)
                ws_put_saved<T>(p, sm, j, h);
            else if (O::SAVE && (int)(j + 1) * TS < p.seqlen)
                *reinterpret_cast<float4 *>(p.saved + (((int64_t)t.b * p.nsaved + j) * p.dim + d) * kWsStates +
                                            4 * warp) = make_float4(h[0], h[1], h[2], h[3]);
            ws_block_sync(); // chunk j's parts written; chunk j + 1 committed
        }
        if (p.state)
            *reinterpret_cast<float4 *>(p.state + at) = make_float4(h[0], h[1], h[2], h[3]);
    } else {
        const int k = warp - kWsScanWarps;
        WsStaging<T, O> st(p, t, lane, k, kWsStates * slice, sm);
#pragma unroll
        for (unsigned j = 0; j < kWsRing - 1; j++)
            if ((int)j < chunks)
                st.load(p, j, j);
            else
                copy_commit(); // empty groups keep the count
        copy_wait<kWsRing - 2>(); // chunk 0's
        st.lanes_sync();
        if (chunks > 0)
            st.commit(p, 0, 0);
        ws_block_sync();
        // unrolled by the ring's length: each chunk's slot is a constant, and
        // with the pinned addresses every shared access is a register plus a
        // constant (f32 staging 252 -> 179 instructions a chunk, bf16 322 ->
        // 228: bench/RESULTS.md)
        static_assert(kWsRing == 4, "four steps a round");
        for (unsigned j = 0; !st.step(p, j, 0, chunks) && !st.step(p, j + 1, 1, chunks) &&
                             !st.step(p, j + 2, 2, chunks) && !st.step(p, j + 3, 3, chunks);
             j += kWsRing)
            ;
    }
}

// y of the sliced forward: (the slices' f32 sums, added slice by slice,
// + d x) silu(z), 4 channels a thread (dim is a multiple of 32 there), in a
// grid-stride loop.
constexpr int kFinishThreads = 256;
template <typename T, bool Z> __global__ void __launch_bounds__(kFinishThreads) ssm_fwd_finish_kernel(const ScanParams p)
{
    const int64_t n = (int64_t)p.batch * p.seqlen * p.dim, quads = n / 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int slices = p.dstate / kWsStates;
    const T *x = static_cast<const T *>(p.x), *z = static_cast<const T *>(p.z);
    T *y = static_cast<T *>(p.y);
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += stride) {
        const int64_t i = 4 * q;
        const int d = (int)(i % p.dim);
        float dskip[4];
#pragma unroll
        for (int v = 0; v < 4; v++)
            dskip[v] = p.d ? load_any(p.d, p.d_type, d + v) : 0.0f;
        float4 sum = *reinterpret_cast<const float4 *>(p.ysum + i);
        for (int s = 1; s < slices; s++) {
            const float4 part = *reinterpret_cast<const float4 *>(p.ysum + s * n + i);
            sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
        }
        store_y4<T, Z>(y + i, sum, dskip, x + i, z + i);
    }
}

// The grid of a grid-stride loop over `items` (a thread each), at most 8
// blocks an SM.
inline int64_t finish_grid_of(int64_t items, int sm_count)
{
    const int64_t blocks = (items + kFinishThreads - 1) / kFinishThreads, most = (int64_t)sm_count * 8;
    return blocks < 1 ? 1 : blocks < most ? blocks : most;
}

// The sliced forward's second kernel, y from the sums: its grid.
inline int64_t finish_grid(const ScanParams &p, int sm_count)
{
    return finish_grid_of((int64_t)p.batch * p.seqlen * p.dim / 4, sm_count);
}

} // namespace fx::cuda::ssm

#endif
