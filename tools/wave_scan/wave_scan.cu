// Prototype: the long-and-thin linear recurrence (few chains, long
// sequences) as waves of tiles joined by a grid barrier instead of a
// decoupled look-back. Standalone (the library's gate maths only), timed as
// tools/linrec_bench times the library; every result checked against an f64
// host recurrence.
//
//   make build/wave_scan && build/wave_scan [reps]
//   WAVE_TRACE=file appends every block's phase stamps (globaltimer) per wave.
//
// Outcome (H200, 2026-11-25, bench/RESULTS.md "Session of 2026-11-25
// (sixth)"): 86-117 us against the look-back kernel's 82; an L2 round trip
// takes ~1 us under a saturated DRAM queue, and the barrier and the carry
// each need at least one a wave. Kept as the record, not used by the library.
//
// Why: the library's chained kernel holds a tile's slot while its look-back
// waits for the loads of the chain's resident predecessors (the convoy:
// 82 µs against 57 without the waits on MinGRU B1 L65536 H256,
// bench/RESULTS.md). Here every resident block owns one tile a wave and a
// second buffer: the next wave's loads are issued before the current tile
// is scanned, so they are in flight across everything that waits (the
// barrier, the carries, the fix-up and the stores).
//
// A wave, per block (tile i = w * G + block; tiles time-major: chain i %
// chains, time tile i / chains):
//   1. loads of tile i + G into the other buffer (cp.async);
//   2. wait for tile i's loads; each thread composes the maps of its segment
//      of steps (one channel); the block's segments give the tile's map and
//      each segment's exclusive prefix; the tile's map to global memory;
//   3. grid barrier;
//   4. the carry into the tile: the chain's carry out of the last wave,
//      then the maps of the chain's earlier tiles in this wave (split among
//      the warps, then joined); the chain's last tile of the wave writes
//      the chain's carry for the next;
//   5. fix-up: each segment steps again from its carry and stores h.
// Maps and carries are double-buffered by wave parity, so that a block a
// wave ahead never overwrites what a slower one still reads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/async_copy.cuh"
#include "cuda/linrec_kernels.cuh"
#include "cuda_check.h"
#include "cuda_timing.cuh"

using fxscan::affine;
using fxlinrec::chan;
using fxlinrec::coeff;
using fxlinrec::advance;

struct WaveParams {
    const float *in0, *in1;
    float *out;
    int batch, seqlen, hidden;
    int chains, ntiles, waves;
    float *maps;    // [2][G][2][32]: a wave's tile maps (a row, b row)
    float *carries; // [2][chains][32]
    unsigned *bar;
    unsigned bar_base, gen_base;
    unsigned long long *trace; // diagnostics: [block][wave][6] globaltimer stamps (NULL: none)
};

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every block of the (cooperative) grid arrives; returns once all have.
// bar[0] counts arrivals (`target`: the count once all have arrived), bar[32]
// (another line) is the generation the last arriver publishes, which the
// others poll: the pollers do not queue in front of the arrivals' atomics.
__device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned target, unsigned gen)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned old = atomicAdd(bar, 1u);
        if (old + 1 == target) {
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 32), "r"(gen) : "memory");
        } else {
            const unsigned long long t0 = gtime();
            while ((int)(ld_acquire(bar + 32) - gen) < 0) {
                __nanosleep(32);
                if (gtime() - t0 > 100000000ull) // 100 ms: a bug, not a wait
                    __trap();
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// Tile i's rows of both inputs into `dst` ([input][S][32] floats) by
// cp.async, as one commit group (empty past the last tile, so that every
// block counts its groups alike).
// Offset of tile i's step `step` (within the tile), first channel.
template <int S> __device__ __forceinline__ int64_t tile_row(const WaveParams &p, int i, int step)
{
    const int chain = i % p.chains, tt = i / p.chains, per_row = p.hidden / 32;
    const int b = chain / per_row, c0 = (chain % per_row) * 32;
    return ((int64_t)b * p.seqlen + (int64_t)tt * S + step) * p.hidden + c0;
}

template <int S, int NT> __device__ __forceinline__ void issue_tile(const WaveParams &p, int i, float *dst)
{
    if (i < p.ntiles) {
        const int64_t base = tile_row<S>(p, i, 0);
        for (int u = threadIdx.x; u < 2 * S * 8; u += NT) {
            const int j = u / (S * 8), r = (u % (S * 8)) / 8, piece = u % 8;
            const float *src = (j ? p.in1 : p.in0) + base + (int64_t)r * p.hidden + piece * 4;
            fx_copy_async<16>(dst + j * S * 32 + r * 32 + piece * 4, src);
        }
    }
    fx_copy_commit();
}

template <int KIND, int S, int NT> struct Wave {
    static constexpr int SEGS = NT / 32, SPT = S / SEGS; // segments, steps a thread
    static constexpr int BUF = 2 * S * 32;               // floats of one buffer (two inputs)
    // shared: 2 buffers, then per segment: exclusive prefix (a, b), carry parts (a, b)
    static constexpr int PRE = 2 * BUF, PART = PRE + 2 * SEGS * 32;
    static constexpr size_t BYTES = sizeof(float) * (PART + 2 * SEGS * 32);
    static constexpr int MAP_SLOTS = 2, CIN_SLOTS = 2; // by wave parity
    static_assert(S % SEGS == 0, "whole segments");
};

// DIAG (timing only, results wrong): 1 no barrier and zero carries,
// 2 the barrier but zero carries; run_case's DIAG 3 runs pipe_kernel below.
// MAPS: the first pass leaves each step's map (a, b) where its inputs were,
// so that the fix-up is one FMA a step instead of the gates again.
template <int KIND, int S, int NT, int DIAG = 0, bool MAPS = false>
__global__ void __launch_bounds__(NT) wave_kernel(const WaveParams p)
{
    typedef Wave<KIND, S, NT> W;
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    const int G = gridDim.x, tid = threadIdx.x, seg = tid / 32, lane = tid % 32;

    auto issue = [&](int i, int buf) { issue_tile<S, NT>(p, i, sm + buf * W::BUF); };

    const chan none = {0.f, 0.f};
    issue(blockIdx.x, 0);
    unsigned long long *tr = p.trace && tid == 0 ? p.trace + (size_t)blockIdx.x * p.waves * 7 : nullptr;
    for (int w = 0; w < p.waves; w++) {
        const int i = w * G + blockIdx.x, buf = w & 1;
        if (tr)
            tr[w * 7 + 0] = gtime();
        issue(i + G, buf ^ 1);
        fx_copy_wait<1>();
        __syncthreads();
        if (tr)
            tr[w * 7 + 1] = gtime();
        const bool mine = i < p.ntiles;
        const int chain = i % p.chains;
        float *x0 = sm + buf * W::BUF + seg * W::SPT * 32 + lane, *x1 = x0 + S * 32;
        float *pre = sm + W::PRE, *part = sm + W::PART;
        if (mine) {
            affine m = fxscan::identity();
#pragma unroll 4
            for (int s = 0; s < W::SPT; s++) {
                const float x[3] = {x0[s * 32], x1[s * 32], 0.f};
                const affine step = coeff<KIND, false>(x, none, 0.f);
                if (MAPS)
                    x0[s * 32] = step.a, x1[s * 32] = step.b;
                m = fxscan::compose(m, step);
            }
            part[seg * 32 + lane] = m.a, part[(W::SEGS + seg) * 32 + lane] = m.b;
        }
        __syncthreads();
        if (mine && seg == 0) {
            affine run = fxscan::identity();
            for (int k = 0; k < W::SEGS; k++) {
                pre[k * 32 + lane] = run.a, pre[(W::SEGS + k) * 32 + lane] = run.b;
                run = fxscan::compose(run, {part[k * 32 + lane], part[(W::SEGS + k) * 32 + lane]});
            }
            float *map = p.maps + ((size_t)buf * G + blockIdx.x) * 64;
            map[lane] = run.a, map[32 + lane] = run.b;
        }
        if (tr)
            tr[w * 7 + 2] = gtime();
        if (DIAG != 1)
            grid_barrier(p.bar, p.bar_base + (unsigned)(w + 1) * G, p.gen_base + (unsigned)w + 1);
        if (tr)
            tr[w * 7 + 3] = gtime();
        if (mine) {
            // the chain's first tile in this wave, and how many come before i
            const int first = w * G + ((chain - (w * G) % p.chains) % p.chains + p.chains) % p.chains;
            const int before = (i - first) / p.chains;
            const int lo = seg * before / W::SEGS, hi = (seg + 1) * before / W::SEGS;
            const float carried = DIAG || first / p.chains == 0 ? 0.f : __ldcg(p.carries + ((size_t)(buf ^ 1) * p.chains + chain) * 32 + lane);
            // every load of a round issued before the first compose: one L2
            // round trip a round, not one a map
            constexpr int R = 8;
            affine m = fxscan::identity();
            for (int k0 = lo; k0 < (DIAG ? lo : hi); k0 += R) {
                affine got[R];
#pragma unroll
                for (int u = 0; u < R; u++) {
                    got[u] = fxscan::identity();
                    if (k0 + u < hi) {
                        const float *map = p.maps + ((size_t)buf * G + (first + (k0 + u) * p.chains - w * G)) * 64;
                        got[u] = {__ldcg(map + lane), __ldcg(map + 32 + lane)};
                    }
                }
#pragma unroll
                for (int u = 0; u < R; u++)
                    m = fxscan::compose(m, got[u]);
            }
            __syncthreads(); // part is read (segment maps): reuse it
            part[seg * 32 + lane] = m.a, part[(W::SEGS + seg) * 32 + lane] = m.b;
            __syncthreads();
            float h = carried;
            for (int k = 0; k < W::SEGS; k++)
                h = fxscan::apply({part[k * 32 + lane], part[(W::SEGS + k) * 32 + lane]}, h);
            // h: the state entering tile i
            const bool last = i + p.chains >= min((w + 1) * G, p.ntiles);
            if (last && seg == 0) {
                const float *map = p.maps + ((size_t)buf * G + blockIdx.x) * 64;
                p.carries[((size_t)buf * p.chains + chain) * 32 + lane] =
                    fxscan::apply({__ldcg(map + lane), __ldcg(map + 32 + lane)}, h);
            }
            if (tr)
                tr[w * 7 + 4] = gtime();
            h = fxscan::apply({pre[seg * 32 + lane], pre[(W::SEGS + seg) * 32 + lane]}, h);
            float *out = p.out + tile_row<S>(p, i, seg * W::SPT) + lane;
#pragma unroll 4
            for (int s = 0; s < W::SPT; s++) {
                if (MAPS) {
                    h = fmaf(x0[s * 32], h, x1[s * 32]);
                } else {
                    const float x[3] = {x0[s * 32], x1[s * 32], 0.f};
                    h = advance<KIND, false>(x, none, 0.f, h);
                }
                __stcs(out + (int64_t)s * p.hidden, h);
            }
        }
        __syncthreads(); // the buffer and the shared maps are free
        if (tr) {
            unsigned smid;
            asm("mov.u32 %0, %%smid;" : "=r"(smid));
            tr[w * 7 + 5] = gtime(), tr[w * 7 + 6] = smid;
        }
    }
}


// The same waves, software-pipelined so that no block waits for the slowest
// one: iteration k scans tile k (A) and arrives at barrier k without waiting,
// then waits for barrier k - 1 (normally long passed), computes tile k - 1's
// carry (C) and fixes it up (F). Three buffers (tile k - 1 awaiting its
// fix-up, tile k, tile k + 1 loading); the loads of tile k + 2 go out once
// tile k - 1 is stored. The carry into wave j cannot come from wave j - 1's
// carries (written after barrier j), so C(j) starts from the chain's state
// entering wave j - 2 and composes the chain's maps of waves j - 2, j - 1 and
// its predecessors in j. Maps live 6 waves (slot k % 6), carries 4 (k % 4):
// a block can be at most one barrier ahead of the slowest.
template <int KIND, int S, int NT> struct Pipe {
    static constexpr int SEGS = NT / 32, SPT = S / SEGS;
    static constexpr int BUF = 2 * S * 32;
    static constexpr int PRE = 3 * BUF, PART = PRE + 2 * 2 * SEGS * 32; // pre[2][a|b][SEGS][32]
    static constexpr size_t BYTES = sizeof(float) * (PART + 2 * SEGS * 32);
    static constexpr int MAP_SLOTS = 6, CIN_SLOTS = 4;
};

template <int KIND, int S, int NT>
__global__ void __launch_bounds__(NT) pipe_kernel(const WaveParams p)
{
    typedef Pipe<KIND, S, NT> W;
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    const int G = gridDim.x, tid = threadIdx.x, seg = tid / 32, lane = tid % 32;
    float *part = sm + W::PART;

    auto issue = [&](int i, int buf) { issue_tile<S, NT>(p, i, sm + buf * W::BUF); };
    auto map_at = [&](int wave, int i) { return p.maps + ((size_t)(wave % W::MAP_SLOTS) * G + (i - wave * G)) * 64; };
    // first tile of `chain` at or after index `from`
    auto first_at = [&](int from, int chain) { return from + ((chain - from % p.chains) % p.chains + p.chains) % p.chains; };

    const chan none = {0.f, 0.f};
    unsigned long long *tr = p.trace && tid == 0 ? p.trace + (size_t)blockIdx.x * p.waves * 7 : nullptr;
    issue(blockIdx.x, 0);
    issue(G + blockIdx.x, 1);
    for (int k = 0; k <= p.waves; k++) {
        if (k < p.waves) {
            const int i = k * G + blockIdx.x, buf = k % 3;
            if (tr)
                tr[k * 7 + 0] = gtime();
            fx_copy_wait<1>();
            __syncthreads();
            if (tr)
                tr[k * 7 + 1] = gtime();
            float *x0 = sm + buf * W::BUF + seg * W::SPT * 32 + lane, *x1 = x0 + S * 32;
            if (i < p.ntiles) {
                affine m = fxscan::identity();
#pragma unroll 4
                for (int s = 0; s < W::SPT; s++) {
                    const float x[3] = {x0[s * 32], x1[s * 32], 0.f};
                    const affine step = coeff<KIND, false>(x, none, 0.f);
                    x0[s * 32] = step.a, x1[s * 32] = step.b;
                    m = fxscan::compose(m, step);
                }
                part[seg * 32 + lane] = m.a, part[(W::SEGS + seg) * 32 + lane] = m.b;
            }
            __syncthreads();
            if (i < p.ntiles && seg == 0) {
                float *pre = sm + W::PRE + (k & 1) * 2 * W::SEGS * 32;
                affine run = fxscan::identity();
                for (int q = 0; q < W::SEGS; q++) {
                    pre[q * 32 + lane] = run.a, pre[(W::SEGS + q) * 32 + lane] = run.b;
                    run = fxscan::compose(run, {part[q * 32 + lane], part[(W::SEGS + q) * 32 + lane]});
                }
                float *map = map_at(k, i);
                map[lane] = run.a, map[32 + lane] = run.b;
            }
            __syncthreads();
            if (tid == 0) { // arrive at barrier k, without waiting
                __threadfence();
                const unsigned old = atomicAdd(p.bar, 1u);
                if (old + 1 == p.bar_base + (unsigned)(k + 1) * G)
                    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p.bar + 32), "r"(p.gen_base + k + 1)
                                 : "memory");
            }
            if (tr)
                tr[k * 7 + 2] = gtime();
        }
        if (k >= 1) {
            const int j = k - 1, i = j * G + blockIdx.x, buf = j % 3;
            if (tid == 0) { // wait for barrier j
                const unsigned long long t0 = gtime();
                while ((int)(ld_acquire(p.bar + 32) - (p.gen_base + j + 1)) < 0) {
                    __nanosleep(32);
                    if (gtime() - t0 > 100000000ull)
                        __trap();
                }
                __threadfence();
            }
            __syncthreads();
            if (tr)
                tr[j * 7 + 3] = gtime();
            if (i < p.ntiles) {
                const int chain = i % p.chains;
                const int s0 = j >= 2 ? j - 2 : 0, from = first_at(s0 * G, chain);
                const int first_j = first_at(j * G, chain);
                const float start = j >= 2 ? __ldcg(p.carries + ((size_t)(s0 % W::CIN_SLOTS) * p.chains + chain) * 32 + lane) : 0.f;
                const int n = (i - from) / p.chains; // maps before tile i since wave s0
                const int lo = seg * n / W::SEGS, hi = (seg + 1) * n / W::SEGS;
                constexpr int R = 8;
                affine m = fxscan::identity();
                for (int k0 = lo; k0 < hi; k0 += R) {
                    affine got[R];
#pragma unroll
                    for (int u = 0; u < R; u++) {
                        got[u] = fxscan::identity();
                        if (k0 + u < hi) {
                            const int at = from + (k0 + u) * p.chains;
                            const float *map = map_at(at / G, at);
                            got[u] = {__ldcg(map + lane), __ldcg(map + 32 + lane)};
                        }
                    }
#pragma unroll
                    for (int u = 0; u < R; u++)
                        m = fxscan::compose(m, got[u]);
                }
                part[seg * 32 + lane] = m.a, part[(W::SEGS + seg) * 32 + lane] = m.b;
                __syncthreads();
                float h = start;
                for (int q = 0; q < W::SEGS; q++)
                    h = fxscan::apply({part[q * 32 + lane], part[(W::SEGS + q) * 32 + lane]}, h);
                // h: the state entering tile i; the chain's first tile of
                // wave j leaves it as the state entering wave j
                if (i == first_j && seg == 0)
                    p.carries[((size_t)(j % W::CIN_SLOTS) * p.chains + chain) * 32 + lane] = h;
                if (tr)
                    tr[j * 7 + 4] = gtime();
                const float *pre = sm + W::PRE + (j & 1) * 2 * W::SEGS * 32;
                h = fxscan::apply({pre[seg * 32 + lane], pre[(W::SEGS + seg) * 32 + lane]}, h);
                float *out = p.out + tile_row<S>(p, i, seg * W::SPT) + lane;
                const float *x0 = sm + buf * W::BUF + seg * W::SPT * 32 + lane, *x1 = x0 + S * 32;
#pragma unroll 4
                for (int s = 0; s < W::SPT; s++) {
                    h = fmaf(x0[s * 32], h, x1[s * 32]);
                    __stcs(out + (int64_t)s * p.hidden, h);
                }
            }
            __syncthreads(); // buffer j % 3 and part are free
            if (tr) {
                unsigned smid;
                asm("mov.u32 %0, %%smid;" : "=r"(smid));
                tr[j * 7 + 5] = gtime(), tr[j * 7 + 6] = smid;
            }
        }
        issue((k + 2) * G + blockIdx.x, (k + 2) % 3);
    }
}

// ---- host ----

static unsigned g_bar_total = 0, g_gen_total = 0; // the barrier's counter and generation after every launch so far

template <int KIND, int S, int NT, int DIAG = 0, bool MAPS = false> struct Runner {
    typedef Wave<KIND, S, NT> W;
    int grid = 0;
    float *maps = nullptr, *carries = nullptr;

    int setup(int batch, int hidden, int sms)
    {
        auto k = DIAG == 3 ? pipe_kernel<KIND, S, NT> : wave_kernel<KIND, S, NT, DIAG, MAPS>;
        const int bytes = (int)(DIAG == 3 ? Pipe<KIND, S, NT>::BYTES : W::BYTES);
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, NT, bytes));
        grid = per_sm * sms;
        typedef Pipe<KIND, S, NT> P;
        const int map_slots = DIAG == 3 ? P::MAP_SLOTS : W::MAP_SLOTS, cin_slots = DIAG == 3 ? P::CIN_SLOTS : W::CIN_SLOTS;
        CUDA_CHECK(cudaMalloc(&maps, sizeof(float) * map_slots * grid * 64));
        CUDA_CHECK(cudaMalloc(&carries, sizeof(float) * cin_slots * batch * hidden));
        return per_sm;
    }
    unsigned long long *trace = nullptr;
    int waves = 0;
    void launch(const float *a, const float *b, float *out, int batch, int seqlen, int hidden, unsigned *bar)
    {
        WaveParams p;
        p.in0 = a, p.in1 = b, p.out = out;
        p.batch = batch, p.seqlen = seqlen, p.hidden = hidden;
        p.chains = batch * hidden / 32;
        p.ntiles = p.chains * (seqlen / S);
        p.waves = (p.ntiles + grid - 1) / grid;
        p.maps = maps, p.carries = carries, p.bar = bar, p.bar_base = g_bar_total, p.trace = trace;
        waves = p.waves;
        p.gen_base = g_gen_total;
        if (DIAG != 1)
            g_bar_total += (unsigned)p.waves * grid, g_gen_total += (unsigned)p.waves;
        void *args[] = {&p};
        if (DIAG == 3)
            CUDA_CHECK(cudaLaunchCooperativeKernel((const void *)pipe_kernel<KIND, S, NT>, grid, NT, args,
                                                   Pipe<KIND, S, NT>::BYTES, 0));
        else
            CUDA_CHECK(cudaLaunchCooperativeKernel((const void *)wave_kernel<KIND, S, NT, DIAG, MAPS>, grid, NT, args,
                                                   W::BYTES, 0));
    }
    void release()
    {
        cudaFree(maps);
        cudaFree(carries);
    }
};

static double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// f64 recurrence over [batch, seqlen, hidden]; rel-L2 of got against it.
static double check(int kind, const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &got,
                    int batch, int seqlen, int hidden)
{
    double num = 0, den = 0;
    bool nan = false;
    for (int bb = 0; bb < batch; bb++)
        for (int c = 0; c < hidden; c++) {
            double h = 0;
            for (int t = 0; t < seqlen; t++) {
                const size_t i = ((size_t)bb * seqlen + t) * hidden + c;
                if (kind == FX_LINREC_SCAN) {
                    h = a[i] * h + b[i];
                } else {
                    const double z = sigmoid_d(a[i]);
                    h = (1 - z) * h + z * b[i];
                }
                if (std::isnan(got[i]))
                    nan = true;
                num += (got[i] - h) * (got[i] - h), den += h * h;
            }
        }
    return nan ? NAN : std::sqrt(num / den);
}

template <int KIND, int S, int NT, int DIAG = 0, bool MAPS = false>
static void run_case(const char *name, int batch, int seqlen, int hidden, int reps, int sms, unsigned *bar,
                     double floor_us)
{
    const size_t n = (size_t)batch * seqlen * hidden;
    const int sets = 3;
    std::vector<float> ha(n), hb(n), got(n);
    srand(12345u + KIND);
    for (size_t i = 0; i < n; i++) {
        const float u = (float)rand() / RAND_MAX, v = (float)rand() / RAND_MAX;
        ha[i] = KIND == FX_LINREC_SCAN ? 0.5f + 0.5f * u : 4.f * u - 2.f; // a in [0.5, 1] / logits
        hb[i] = 2.f * v - 1.f;
    }
    float *a[sets], *b[sets], *out[sets];
    for (int k = 0; k < sets; k++) {
        CUDA_CHECK(cudaMalloc(&a[k], n * 4));
        CUDA_CHECK(cudaMalloc(&b[k], n * 4));
        CUDA_CHECK(cudaMalloc(&out[k], n * 4));
        CUDA_CHECK(cudaMemcpy(a[k], ha.data(), n * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(b[k], hb.data(), n * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(out[k], 0xff, n * 4)); // NaN: an unwritten element fails
    }
    Runner<KIND, S, NT, DIAG, MAPS> r;
    const int per_sm = r.setup(batch, hidden, sms);
    r.launch(a[0], b[0], out[0], batch, seqlen, hidden, bar);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got.data(), out[0], n * 4, cudaMemcpyDeviceToHost));
    const double err = check(KIND, ha, hb, got, batch, seqlen, hidden);
    const double us = fx_time_us(0, reps, 50000, [&](int i) {
        const int k = i % sets;
        r.launch(a[k], b[k], out[k], batch, seqlen, hidden, bar);
    });
    printf("%-8s B%d L%d H%d  S=%-3d NT=%-3d maps %d diag %d blocks/SM %d  %8.2f us  (2R1W floor %s)  rel-L2 %.2e %s\n",
           name, batch, seqlen, hidden, S, NT, (int)MAPS, DIAG, per_sm, us, floor_us > 0 ? "51.5" : "-", err, (DIAG && DIAG != 3) || err <= 1e-5 ? "ok" : "FAIL");
    if (getenv("WAVE_TRACE") && (DIAG == 0 || DIAG == 3)) { // phases of a few blocks, µs from the launch's first stamp
        const size_t nt = (size_t)r.grid * r.waves * 7;
        CUDA_CHECK(cudaMalloc(&r.trace, nt * 8));
        CUDA_CHECK(cudaMemset(r.trace, 0, nt * 8));
        r.launch(a[0], b[0], out[0], batch, seqlen, hidden, bar);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<unsigned long long> t(nt);
        CUDA_CHECK(cudaMemcpy(t.data(), r.trace, nt * 8, cudaMemcpyDeviceToHost));
        unsigned long long t0 = ~0ull, tend = 0;
        for (size_t k = 0; k < nt; k++)
            if (t[k] && k % 7 != 6) t0 = std::min(t0, t[k]), tend = std::max(tend, t[k]);
        printf("  trace: %.2f us first to last stamp (all blocks to %s)\n", (tend - t0) / 1e3, getenv("WAVE_TRACE"));
        if (FILE *f = fopen(getenv("WAVE_TRACE"), "a")) {
            fprintf(f, "# %s S=%d NT=%d grid %d waves %d\n", name, S, NT, r.grid, r.waves);
            for (int blk = 0; blk < r.grid; blk++)
                for (int w = 0; w < r.waves; w++) {
                    const unsigned long long *q = &t[((size_t)blk * r.waves + w) * 7];
                    fprintf(f, "%d %d %llu", blk, w, q[6]);
                    for (int k = 0; k < 6; k++)
                        fprintf(f, " %.3f", q[k] ? (q[k] - t0) / 1e3 : -1.0);
                    fprintf(f, "\n");
                }
            fclose(f);
        }
        cudaFree(r.trace);
        r.trace = nullptr;
    }
    r.release();
    for (int k = 0; k < sets; k++)
        cudaFree(a[k]), cudaFree(b[k]), cudaFree(out[k]);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 30;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int coop = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    printf("%s, %d SMs, cooperative launch %d\n", prop.name, prop.multiProcessorCount, coop);
    unsigned *bar;
    CUDA_CHECK(cudaMalloc(&bar, 256));
    CUDA_CHECK(cudaMemset(bar, 0, 256));
    const int sms = prop.multiProcessorCount;
    const double thin = 51.5, b4 = 0; // floors measured by tools/floor_bench (2R1W)
    const char *m = "mingru";
    // every row of the table in bench/RESULTS.md ("Session of 2026-11-25 (sixth)")
    run_case<FX_LINREC_MINGRU, 128, 256>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 256, 0, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 256, 1, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 256, 2, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 64, 256, 0, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 64, 128, 0, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 128, 0, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 256, 256, 0, true>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_SCAN, 128, 256>("scan", 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_SCAN, 128, 256, 0, true>("scan", 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 256>(m, 4, 4096, 512, reps, sms, bar, b4);
    run_case<FX_LINREC_MINGRU, 128, 256, 0, true>(m, 4, 4096, 512, reps, sms, bar, b4);
    // pipelined
    run_case<FX_LINREC_MINGRU, 128, 256, 3>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 64, 256, 3>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 64, 128, 3>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 128, 3>(m, 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_SCAN, 128, 256, 3>("scan", 1, 65536, 256, reps, sms, bar, thin);
    run_case<FX_LINREC_MINGRU, 128, 256, 3>(m, 4, 4096, 512, reps, sms, bar, b4);
    run_case<FX_LINREC_MINGRU, 64, 128, 3>(m, 4, 4096, 512, reps, sms, bar, b4);
    return 0;
}
