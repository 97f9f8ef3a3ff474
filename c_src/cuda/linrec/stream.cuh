// The linear recurrences' streaming kernels, forward and backward: a warp a
// column of channels walking the whole sequence, its inputs in a ring of
// shared-memory stages.
#ifndef FX_CUDA_LINREC_STREAM_CUH
#define FX_CUDA_LINREC_STREAM_CUH

#include "cuda/linrec/backward.cuh"
#include "cuda/linrec/forward.cuh"

namespace fx::cuda::linrec {

// ---- the streaming forward ----
//
// Where there are channels enough for a warp on every scheduler, tiles and
// their look-back are not needed: a warp owns a 128-byte column of channels
// (32 lanes of 4 bytes: one f32 channel or two 16-bit ones a lane) of one
// batch element and walks the whole sequence with h in registers. Its
// inputs flow through a ring of stages of steps in shared memory
// (StreamShape), each lane copying 16-byte pieces with cp.async: all
// stages but the one being computed are in flight, so a warp always has its
// next ~80-96 steps' loads outstanding and never waits for a predecessor
// tile.
// (The tiled kernels' block life of load, scan, store leaves memory idle
// between blocks: bench/RESULTS.md, decision L1.) The warps of a block share
// no data, but they walk the neighbouring columns of the same rows in
// lockstep, a stage at a time (StreamRing::lockstep). The stage shapes and
// block sizes: linrec/tuning.cuh.

template <typename T> constexpr int stream_vec() { return 4 / (int)sizeof(T); }

struct StreamTiling {
    int64_t batch, seqlen, hidden;
    int64_t columns; // 128-byte columns of channels per batch element
    int flip;        // reverse
};

// The threads of this block's live warps (the last block may have fewer).
__device__ __forceinline__ int stream_block_threads(const StreamTiling &s)
{
    const int64_t left = s.batch * s.columns - (int64_t)blockIdx.x * kStreamWarps;
    return 32 * (int)(left < kStreamWarps ? left : kStreamWarps);
}

// A barrier over the block's live warps (a warp of a column past the end
// has returned): named barrier 1 with their count.
__device__ __forceinline__ void stream_bar_sync(int threads)
{
#if defined(__CUDA_ARCH__)
    asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
#elif defined(FX_CUDA_EMULATION)
    fx_emu_bar_sync(1, threads);
#else
    (void)threads;
#endif
}

// The ring of one streaming kernel: SEQS sequences (the op's inputs; the
// backward also dh and h of the step before), STEPS steps a stage, STAGES
// stages. kStreamStages of kStreamSteps, fewer stages where a stage holds
// many sequences (MinLSTM's backward, 5), so that two 2-warp blocks fit an
// SM (<= 56 KB a warp); MinLSTM's forward (three sequences, the identity
// candidate: CG false) and Liquid's (one) have shapes of their own.
template <int KIND, bool BACKWARD, bool CG> struct StreamShape {
    static constexpr int SEQS = nseq<KIND>() + (BACKWARD ? 2 : 0);
    static constexpr bool MINLSTM = !BACKWARD && !CG && KIND == FX_LINREC_MINLSTM;
    static constexpr bool LIQUID = !BACKWARD && KIND == FX_LINREC_LIQUID;
    static constexpr int STEPS = MINLSTM  ? kStreamMinlstmFwdSteps
                                 : LIQUID ? kStreamLiquidFwdSteps
                                          : kStreamSteps;
    static constexpr int OWN_STAGES = MINLSTM  ? kStreamMinlstmFwdStages
                                      : LIQUID ? kStreamLiquidFwdStages
                                               : kStreamStages;
    static constexpr int WORDS = SEQS * STEPS * 32; // a stage's 4-byte words: sequence, step, lane
    static constexpr int FIT = 56 * 1024 / (WORDS * 4); // stages in 56 KB: two 2-warp blocks an SM
    static constexpr int STAGES = OWN_STAGES < FIT ? OWN_STAGES : FIT;
    static constexpr size_t BLOCK_BYTES = (size_t)kStreamWarps * STAGES * WORDS * 4;
    static_assert(STEPS % 4 == 0 && STEPS <= kStreamMaxSteps && STAGES >= 2, "a stage is whole groups of 4 rows");
};
template <int KIND, bool BACKWARD, bool CG> inline size_t stream_block_bytes()
{
    return StreamShape<KIND, BACKWARD, CG>::BLOCK_BYTES;
}

// One warp's ring: STAGES stages of K rows of SEQS sequences,
// each row a 128-byte piece (the warp's column) of a [batch, seqlen,
// hidden] tensor, walked from row0 by `stride` elements a step. A lane
// copies piece lane % 8 of the rows of steps 4q + lane / 8 of a stage, for
// every sequence and q: in the ring that is word 4 * lane of row (k, 4q).
// Sequence k's steps from `last[k]` on (and a column's pieces past hidden)
// are zero-filled. All stages but the one being read are in flight.
template <typename T, int SEQS, int K, int STAGES> struct StreamRing {
    static constexpr int Q = K / 4, WORDS = SEQS * K * 32; // words a stage
    static constexpr int PIECE = 16 / (int)sizeof(T);      // elements a copy
    const T *src[SEQS][Q];
    const T *zero[SEQS]; // any valid address of the sequence: the source of a zero fill
    int64_t last[SEQS], whole_to, stride, stages;
    uint32_t *ring, *ring_end, *fill;
    const uint32_t *read;
    int lane, sub;
    int block_threads; // of the block's live warps
    bool piece_live;

    // seq[k] + first[k] + row0: sequence k's row of step 0 (all in elements)
    __device__ __forceinline__ StreamRing(uint32_t *words, const void *const (&seq)[SEQS],
                                           const int64_t (&first)[SEQS], const int64_t (&last_)[SEQS],
                                           int64_t row0, int64_t stride_, int64_t seqlen, int64_t ch0,
                                           int64_t hidden, int lane_, int block_threads_)
        : stride(stride_), ring(words), ring_end(words + STAGES * WORDS), fill(words), lane(lane_),
          block_threads(block_threads_)
    {
        sub = lane >> 3;
        const int64_t piece_ch = ch0 + (lane & 7) * PIECE;
        piece_live = piece_ch < hidden;
        stages = (seqlen + K - 1) / K;
        whole_to = seqlen;
#pragma unroll
        for (int k = 0; k < SEQS; k++) {
            zero[k] = static_cast<const T *>(seq[k]);
            last[k] = last_[k];
            whole_to = last[k] < whole_to ? last[k] : whole_to;
#pragma unroll
            for (int q = 0; q < Q; q++)
                src[k][q] = zero[k] + first[k] + row0 + (4 * q + sub) * stride + piece_ch;
        }
        read = ring + lane;
    }

    template <bool WHOLE> __device__ __forceinline__ void copies(int64_t st)
    {
#pragma unroll
        for (int k = 0; k < SEQS; k++)
#pragma unroll
            for (int q = 0; q < Q; q++) {
                // (a whole stage tests only the lane's piece, once per launch)
                const bool ok = piece_live && (WHOLE || st * K + 4 * q + sub < last[k]);
                copy_async<16, kCopyL2Line>(fill + 4 * lane + (k * K + 4 * q) * 32, ok ? src[k][q] : zero[k],
                                                  ok);
                src[k][q] += K * stride;
            }
    }

    // Starts the copies of stage st into the slot after the last one filled.
    __device__ __forceinline__ void issue(int64_t st)
    {
        if (st < stages) {
            if ((st + 1) * K <= whole_to)
                copies<true>(st);
            else
                copies<false>(st);
            fill = fill + WORDS == ring_end ? ring : fill + WORDS;
        }
        copy_commit(); // an empty group past the end keeps the count
    }

    __device__ __forceinline__ void start()
    {
#pragma unroll
        for (int st = 0; st < STAGES - 1; st++)
            issue(st);
    }

    // Waits for stage st and starts stage st + STAGES - 1 into the slot of
    // stage st - 1.
    __device__ __forceinline__ void advance(int64_t st)
    {
        copy_wait<STAGES - 2>(); // this lane's copies of stage st
        lockstep();                 // everyone's, and stage st - 1 read by all
        issue(st + STAGES - 1);
    }

    // A barrier over the warp or, where the block has more than one live
    // warp, over the block's live warps: they own the neighbouring 128-byte
    // pieces of the same rows, and a row's pieces requested together are read
    // faster than by warps drifting apart (B16 -0.6 to -0.9 us:
    // bench/RESULTS.md). The warps share no data; this barrier is for timing.
    __device__ __forceinline__ void lockstep() const
    {
        if (kStreamLockstep && block_threads > 32)
            stream_bar_sync(block_threads);
        else
            __syncwarp();
    }

    // The rows of the stage advanced to, into x: every read before the
    // caller's first store (the compiler cannot move a shared-memory load
    // above a global store it might alias).
    template <typename P> __device__ __forceinline__ void read_stage(P (&x)[K][SEQS])
    {
#pragma unroll
        for (int j = 0; j < K; j++)
#pragma unroll
            for (int k = 0; k < SEQS; k++)
                x[j][k].r = read[(k * K + j) * 32];
        read = read + WORDS >= ring_end ? ring + lane : read + WORDS;
    }
};

// Where a streaming warp works: batch element b, channels ch0 .. ch0 + 32 V
// (its lane: mine .. mine + V - 1, live when inside hidden), rows walked
// from row0 by stride elements a step (s.flip: towards lower rows).
struct StreamColumn {
    int64_t b, ch0, mine, stride, row0;
    bool live;
    __device__ __forceinline__ StreamColumn(const StreamTiling &s, int64_t column, int lane, int vec)
    {
        b = column / s.columns;
        ch0 = (column - b * s.columns) * 32 * vec;
        mine = ch0 + lane * vec;
        live = mine < s.hidden; // hidden is a multiple of vec
        stride = s.flip ? -s.hidden : s.hidden;
        row0 = (b * s.seqlen + (s.flip ? s.seqlen - 1 : 0)) * s.hidden;
    }
};

// Liquid's dt of a walk's steps (0 for the other ops). A scalar dt is a
// constant: nothing is tested per step (testing every step of every stage
// against the sequence's end and selecting the scalar cost the backward 97
// against 80 us: bench/RESULTS.md). A dt
// tensor's values are loaded a stage ahead, each lane loading every step's
// (the 32 loads of a stage read one line), long before their use. Passing
// a stage's values through shared memory or by shuffles from one load a
// lane measured ~10 us slower in each direction: those values then come
// from shared-memory loads or shuffles at the stage's start, beside the
// ring's 32 loads of the stage, and ncu put the warp waiting on them (short
// scoreboard, 1.5 cycles an instruction) where it now waits on nothing.
template <int KIND, typename T, int K> struct StreamDt {
    float next[K];

    __device__ __forceinline__ void load(const OpParams &in, const StreamTiling &s, int64_t b, int64_t st)
    {
        if (KIND == FX_LINREC_LIQUID && in.dt)
#pragma unroll
            for (int j = 0; j < K; j++) {
                const int64_t step = st * K + j;
                next[j] = step < s.seqlen
                              ? load_dt<KIND, T>(in, b * s.seqlen + (s.flip ? s.seqlen - 1 - step : step))
                              : 0.f;
            }
    }

    // stage st's into dt, and stage st + 1's on their way
    __device__ __forceinline__ void take(const OpParams &in, const StreamTiling &s, int64_t b, int64_t st,
                                         float (&dt)[K])
    {
        if constexpr (KIND != FX_LINREC_LIQUID) {
#pragma unroll
            for (int j = 0; j < K; j++)
                dt[j] = 0.f;
        } else if (!in.dt) {
#pragma unroll
            for (int j = 0; j < K; j++)
                dt[j] = in.dt_value;
        } else {
#pragma unroll
            for (int j = 0; j < K; j++)
                dt[j] = next[j];
            load(in, s, b, st + 1);
        }
    }
};

// With one warp per scheduler nothing hides a warp's own latencies, so the
// loop is lean: pointers step by a row, no 64-bit index maths or branch
// per step (with them, 42 instructions a step, the loop ran at half the
// tiled kernels' speed: bench/RESULTS.md).
template <int KIND, typename T, bool CG>
__global__ void __launch_bounds__(32 * kStreamWarps) forward_stream_kernel(const FwdParams p, const StreamTiling s)
{
    typedef StreamShape<KIND, false, CG> shape;
    constexpr int N = nseq<KIND>(), V = stream_vec<T>(), K = shape::STEPS;
    typedef fx::cuda::scan::Pack<T, V> pk;
    static_assert(sizeof(typename pk::R) == 4, "a lane's part of a row is one 4-byte word");
    FX_SCAN_STAGE(stage_bytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t column = (int64_t)blockIdx.x * kStreamWarps + warp;
    if (column >= s.batch * s.columns)
        return; // a whole warp: the others never wait for it
    const int64_t L = s.seqlen, H = s.hidden;
    const StreamColumn col(s, column, lane, V);
    const int64_t b = col.b, mine = col.mine, stride = col.stride, row0 = col.row0;
    const bool live = col.live;
    const void *seqs[N];
    int64_t first[N], last[N];
#pragma unroll
    for (int k = 0; k < N; k++)
        seqs[k] = p.in.seq[k], first[k] = 0, last[k] = L;
    StreamRing<T, N, K, shape::STAGES> ring(reinterpret_cast<uint32_t *>(stage_bytes) +
                                                 warp * shape::STAGES * shape::WORDS,
                                             seqs, first, last, row0, stride, L, col.ch0, H, lane,
                                             stream_block_threads(s));

    Chan ch[V];
    load_chan<KIND, T, V>(p.in, mine, live, ch);
    float h[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        h[v] = live && p.h0 ? fx::cuda::scan::load_state<T>(p.h0, p.h0_f32, b * H + mine + v) : 0.f;
    T *out = static_cast<T *>(p.h) + row0 + mine;
    // A step's row within a stage: one 32-bit multiply-add, not a 64-bit
    // one (|stride| = hidden < 2^31 / K: stream_fits)
    const int row_step = (int)stride;
    StreamDt<KIND, T, K> dts;
    dts.load(p.in, s, b, 0);

    ring.start();
    for (int64_t st = 0; st < ring.stages; st++) {
        ring.advance(st);
        float dt[K];
        dts.take(p.in, s, b, st, dt);
        pk x[K][N];
        ring.read_stage(x);
        const int n = L - st * K < K ? (int)(L - st * K) : K;
        auto steps = [&](auto whole) {
#pragma unroll
            for (int j = 0; j < K; j++) {
                if (!decltype(whole)::value && j >= n)
                    break;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    float xs[3];
                    step_inputs<N>(x[j], v, xs);
                    h[v] = advance<KIND, CG>(xs, ch[v], dt[j], h[v]);
                }
                if (live)
                    fx::cuda::scan::store_stream<T, V>(out + j * row_step, h);
            }
        };
        if (n == K)
            steps(std::true_type{});
        else
            steps(std::false_type{});
        out += K * stride;
    }
    if (p.state && live)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[b * H + mine + v] = h[v];
}

// ---- the streaming backward ----
//
// The streaming forward's layout run backwards: a warp owns a 128-byte
// column of one batch element and walks from the forward's last step to its
// first with the adjoint u = dL/dh flowing in from the later steps in
// registers. Its ring carries per step the op's inputs, dh and h of the
// forward step before (the next row of the walk; the walk's last step, the
// forward's first, takes h0 instead), and each step writes the gradients of
// its inputs.

template <int KIND, typename T, bool CG>
__global__ void __launch_bounds__(32 * kStreamWarps) backward_stream_kernel(const BwdParams p, const StreamTiling s)
{
    typedef StreamShape<KIND, true, CG> shape;
    constexpr int N = nseq<KIND>(), SEQS = shape::SEQS, V = stream_vec<T>(), K = shape::STEPS;
    constexpr int STAGES = shape::STAGES;
    typedef fx::cuda::scan::Pack<T, V> pk;
    FX_SCAN_STAGE(stage_bytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t column = (int64_t)blockIdx.x * kStreamWarps + warp;
    if (column >= s.batch * s.columns)
        return;
    const int64_t L = s.seqlen, H = s.hidden;
    const StreamColumn col(s, column, lane, V); // s.flip: the forward ran upwards
    const int64_t b = col.b, mine = col.mine, stride = col.stride, row0 = col.row0;
    const bool live = col.live;
    const void *seqs[SEQS];
    int64_t first[SEQS], last[SEQS];
#pragma unroll
    for (int k = 0; k < N; k++)
        seqs[k] = p.in.seq[k], first[k] = 0, last[k] = L;
    seqs[N] = p.dh, first[N] = 0, last[N] = L;
    seqs[N + 1] = p.h, first[N + 1] = stride, last[N + 1] = L - 1; // h_{t-1}: one row on
    StreamRing<T, SEQS, K, STAGES> ring(reinterpret_cast<uint32_t *>(stage_bytes) + warp * STAGES * shape::WORDS,
                                         seqs, first, last, row0, stride, L, col.ch0, H, lane,
                                         stream_block_threads(s));

    Chan ch[V];
    load_chan<KIND, T, V>(p.in, mine, live, ch);
    float u[V], h0v[V], sum_tau[V] = {}, sum_lam[V] = {};
#pragma unroll
    for (int v = 0; v < V; v++) {
        u[v] = live && p.dstate ? fx::cuda::scan::load_state<T>(p.dstate, p.dstate_f32, b * H + mine + v) : 0.f;
        h0v[v] = live && p.h0 ? fx::cuda::scan::load_state<T>(p.h0, p.h0_f32, b * H + mine + v) : 0.f;
    }
    int64_t out = row0 + mine;                         // the gradients' element of the current step
    // liquid: this column's row of ddt sums, at the stage's first step
    float *dt_sums = p.sum_dt ? p.sum_dt + (column - b * s.columns) * (s.batch * L) + b * L : nullptr;
    StreamDt<KIND, T, K> dts;
    dts.load(p.in, s, b, 0);

    ring.start();
    for (int64_t st = 0; st < ring.stages; st++) {
        ring.advance(st);
        float dt[K];
        dts.take(p.in, s, b, st, dt);
        pk x[K][SEQS];
        ring.read_stage(x);
        const int n = L - st * K < K ? (int)(L - st * K) : K; // steps of this stage
        float lane_dt[K]; // liquid: the lane's part of each step's ddt
        // a whole stage: K steps, none of them the forward's first
        auto steps = [&](auto whole) {
#pragma unroll
            for (int j = 0; j < K; j++) {
                if (!decltype(whole)::value && j >= n)
                    break;
                const bool at_h0 = !decltype(whole)::value && j == n - 1 && st * K + j == L - 1;
                float dx[3][V], row_dt = 0.f;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    float xs[3], d3[3] = {0.f, 0.f, 0.f}, dtau = 0.f, dlam = 0.f, ddt = 0.f;
                    step_inputs<N>(x[j], v, xs);
                    const float g = x[j][N].get(v) + u[v];
                    const float hprev = at_h0 ? h0v[v] : x[j][N + 1].get(v);
                    const float a = step_grad<KIND, CG>(xs, ch[v], dt[j], hprev, g, d3, dtau, dlam, ddt);
#pragma unroll
                    for (int k = 0; k < 3; k++)
                        dx[k][v] = d3[k];
                    sum_tau[v] += dtau;
                    sum_lam[v] += dlam;
                    row_dt += ddt;
                    u[v] = a * g;
                }
                if (live)
#pragma unroll
                    for (int k = 0; k < N; k++)
                        fx::cuda::scan::store_stream<T, V>(static_cast<T *>(p.dseq[k]) + out, dx[k]);
                if constexpr (KIND == FX_LINREC_LIQUID)
                    lane_dt[j] = live ? row_dt : 0.f;
                out += stride;
            }
        };
        if (n == K && (st + 1) * K < L) {
            steps(std::true_type{});
        } else {
#pragma unroll
            for (int j = 0; j < K; j++)
                lane_dt[j] = 0.f;
            steps(std::false_type{});
        }
        // The stage's ddt parts summed over the warp: one transposing sum a
        // stage (K shuffles), not a 5-shuffle sum a step on a warp alone on
        // its scheduler. A row's warps (one a column) would hit one address
        // at once with atomics (the Liquid fwd+bwd with a dt tensor took 240
        // us against 137 with a scalar), so each column stores its own row
        // of sums (LiquidRows), which write_sums adds up.
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (dt_sums) {
                // one sum a lane: step j's (the 32 / K lanes of a step hold the same)
                const int j = fx::cuda::warp::transpose_sum<K, 0>(lane_dt, lane);
                if ((lane & (32 / K - 1)) == 0 && j < n)
                    dt_sums[s.flip ? L - 1 - (st * K + j) : st * K + j] = lane_dt[0];
            }
        }
    }
    if (p.dh0 && live) // after the forward's first step, u is dL/dh0
#pragma unroll
        for (int v = 0; v < V; v++)
            fx::cuda::scan::store_state<T>(p.dh0, p.h0_f32, b * H + mine + v, u[v]);
    if constexpr (KIND == FX_LINREC_LIQUID) {
        if (live)
#pragma unroll
            for (int v = 0; v < V; v++) {
                p.sum_tau[b * H + mine + v] = sum_tau[v]; // batch row b's part
                p.sum_lam[b * H + mine + v] = sum_lam[v];
            }
    }
}

} // namespace fx::cuda::linrec

#endif
