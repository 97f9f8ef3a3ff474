// The generic chunked linear scan, h_p = a_p * h_{p-1} + b_p along a
// sequence, for [batch, seqlen, hidden] tensors scanned along seqlen,
// independently per (batch, hidden) channel. Written once, used by every op
// whose step is "compute (a, b) elementwise from the inputs, then scan"
// (c_src/cuda/linrec/: each recurrence's forward, and its backward, whose
// adjoint is again such a scan run from the other end).
//
// Tiling. A block owns one tile: W = G * V consecutive channels of one batch
// row times `segs * steps` consecutive steps. A group of G lanes covers one
// time row of the tile (lane q holds channels q*V .. q*V+V-1, so a group's
// access to a row is one contiguous run of G * V elements, 16 bytes a lane
// on the vector path); each group is a time segment of `steps` consecutive
// steps (their inputs in registers, or staged in shared memory), and a
// warp holds 32 / G segments. A thread
// composes its steps into one affine map; segments combine by shuffles
// inside a warp and through shared memory across warps; the tile's carry-in
// comes from h0 (first time tile) or from the tiles before it.
//
// Look-back (more than one time tile). Tiles are numbered time tile by time
// tile (all channel tiles of time tile 0 first) and block i scans tile i:
// blocks are dispatched in increasing index order (as CUB's single-pass
// scan also assumes), so every tile a block waits for belongs to a block
// that is already running or done. Warp 0 peeks at the previous tile's
// status while the tile's own loads are in flight; if its inclusive state
// (the h after its last step) is there, that is the carry. Otherwise the
// tile publishes its aggregate map and every group of the block reads one
// earlier tile's status per round (a window of warps * 32/G tiles) until
// the window holds a tile with its inclusive state behind only aggregates;
// those are applied to it one by one, oldest first, which gives the same
// bits as the tiles' states computed one after another (scan_tile), so
// that the result does not depend on the blocks' timing. The tile then
// publishes its own inclusive state.
//
// Statuses: per tile and channel two 64-bit words, each a float in its low
// half and a tag in its high half (tag = epoch << 1 | inclusive). An
// aggregate is the pair {a, b} tagged epoch << 1; an inclusive state is the
// second word tagged epoch << 1 | 1. Every word carries its own tag, so no
// fence has to order values before a flag: a reader takes a word when its
// tag is this launch's, so memory reused from launch to launch with a new
// epoch each time (fusex's own stream) needs no clearing, and zeroed memory
// (a caller's scratch) holds no tag of epoch 1.
//
// Everything is f32: 16-bit inputs are widened on load.
#ifndef FX_CUDA_SCAN_CUH
#define FX_CUDA_SCAN_CUH

#include "cuda/common.cuh"

// A block's shared memory, and its dynamic part (staged inputs):
// declarations, so macros. The CPU emulator (test/emu, FX_CUDA_EMULATION)
// defines them first.
#ifndef FX_SCAN_SHARED
#define FX_SCAN_SHARED(type, name) __shared__ type name
#define FX_SCAN_STAGE(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace fx::cuda::scan {

// Warps per block (blocks of up to 256 threads).
constexpr int kMaxWarps = 8;
constexpr int kBlockThreads = 32 * kMaxWarps;

// h -> a * h + b
struct Affine {
    float a, b;
};

__device__ __forceinline__ Affine identity() { return {1.f, 0.f}; }

// `first`, then `then`.
__device__ __forceinline__ Affine compose(Affine first, Affine then)
{
    return {then.a * first.a, fmaf(then.a, first.b, then.b)};
}

__device__ __forceinline__ float apply(Affine m, float h) { return fmaf(m.a, h, m.b); }

// ---- look-back events ----
// Hooks for a diagnostic build (dev/lookback_stats.cuh, which defines
// FX_SCAN_EVENT before this header): a chained tile, one whose peek found
// its carry, a look-back round, and a round that found nothing new (it
// waits on a predecessor). A no-op otherwise.
enum : int { kEventChained = 0, kEventPeekHit = 1, kEventRound = 2, kEventEmptyRound = 3 };
#ifndef FX_SCAN_EVENT
#define FX_SCAN_EVENT(event) ((void)0)
#endif

// ---- tile statuses ----

enum : int { kEmpty = 0, kAggregate = 1, kInclusive = 2 };

typedef unsigned long long Word;

struct Lookback {
    Word *status;   // [tiles][W channels][2]
    uint32_t epoch; // 1 .. 2^30 - 1, new for every launch
};

struct Tiling {
    int64_t batch, seqlen, hidden;
    int htiles;     // channel tiles per batch row
    int ctiles;     // batch * htiles (tiles in all: < 2^31)
    int ttiles;     // time tiles
    int segs;       // time segments per tile (one per group of G lanes)
    int steps;      // steps per segment (<= the kernel's register capacity)
    int flip;       // step p of the scan reads time row seqlen - 1 - p
    Lookback lb;    // when ttiles > 1
};

__device__ __forceinline__ Word pack_word(float v, uint32_t tag)
{
    return (Word)tag << 32 | __float_as_uint(v);
}

__device__ __forceinline__ uint32_t word_tag(Word w) { return (uint32_t)(w >> 32); }
__device__ __forceinline__ float word_value(Word w) { return __uint_as_float((uint32_t)w); }

// Relaxed (strong, L1-bypassing) accesses at GPU scope: statuses are written
// and read by different blocks while the kernel runs. A two-word access is
// two single-copy-atomic words; each is validated by its own tag.
__device__ __forceinline__ void store_relaxed(Word *p, Word x)
{
#ifdef FX_CUDA_EMULATION
    __atomic_store_n(p, x, __ATOMIC_RELAXED);
#else
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(x) : "memory");
#endif
}

__device__ __forceinline__ void store_relaxed2(Word *p, Word x, Word y)
{
#ifdef FX_CUDA_EMULATION
    __atomic_store_n(p, x, __ATOMIC_RELAXED);
    __atomic_store_n(p + 1, y, __ATOMIC_RELAXED);
#else
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(x), "l"(y) : "memory");
#endif
}

__device__ __forceinline__ Word load_relaxed(const Word *p)
{
#ifdef FX_CUDA_EMULATION
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
    Word x;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(x) : "l"(p) : "memory");
    return x;
#endif
}

__device__ __forceinline__ void load_relaxed2(const Word *p, Word &x, Word &y)
{
#ifdef FX_CUDA_EMULATION
    x = __atomic_load_n(p, __ATOMIC_RELAXED);
    y = __atomic_load_n(p + 1, __ATOMIC_RELAXED);
#else
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
#endif
}

__device__ __forceinline__ uint32_t aggregate_tag(const Lookback &lb) { return lb.epoch << 1; }
__device__ __forceinline__ uint32_t inclusive_tag(const Lookback &lb) { return lb.epoch << 1 | 1u; }

// ---- where a thread is ----

struct Place {
    int64_t tt, ct, b, h; // time tile, channel tile, batch row, first channel
    int64_t p0;           // first step of the thread's segment
    int lane, warp, seg, q; // q: lane within the segment's group
    bool live;              // its channels exist and its segment is in the tile
};

// Block i scans tile i. (32-bit divisions: 64-bit ones are a long
// software sequence, and every thread of every block runs this.)
template <int G, int V, bool CHAINED>
__device__ __forceinline__ Place locate(const Tiling &t)
{
    Place at;
    at.lane = threadIdx.x & 31;
    at.warp = threadIdx.x >> 5;
    at.seg = threadIdx.x / G;
    at.q = threadIdx.x % G;
    const unsigned tile = blockIdx.x, ctiles = (unsigned)t.ctiles, htiles = (unsigned)t.htiles;
    const unsigned tt = CHAINED ? tile / ctiles : 0u, ct = tile - tt * ctiles, b = ct / htiles;
    at.tt = tt;
    at.ct = ct;
    at.b = b;
    at.h = (int64_t)(ct - b * htiles) * (G * V) + at.q * V;
    at.live = at.h < t.hidden && at.seg < t.segs; // hidden % V == 0 when V > 1
    at.p0 = (at.tt * t.segs + at.seg) * (int64_t)t.steps;
    return at;
}

// ---- reductions within a group of G lanes (full-warp shuffles) ----

template <int G> __device__ __forceinline__ int group_min(int v)
{
#pragma unroll
    for (int o = 1; o < G; o <<= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int G> __device__ __forceinline__ int group_max(int v)
{
#pragma unroll
    for (int o = 1; o < G; o <<= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int G> __device__ __forceinline__ float group_sum(float v)
{
#pragma unroll
    for (int o = 1; o < G; o <<= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the segments of a warp (lanes with the same q).
template <int G> __device__ __forceinline__ float segment_sum(float v)
{
#pragma unroll
    for (int o = G; o < 32; o <<= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- the block's shared memory ----

template <int W, int SEGW> struct Smem {
    float ta[kMaxWarps][W], tb[kMaxWarps][W];                 // each warp's total map
    float wa[kMaxWarps * SEGW][W], wb[kMaxWarps * SEGW][W]; // look-back window
    float carry[W];                                          // the tile's carry-in
    float xa[W], xb[W]; // the tile's map, while it looks back
    int wkind[kMaxWarps * SEGW];
    int found;
};

template <int G, int V> using TileSmem = Smem<G * V, 32 / G>;

// The status words ([V channels][aggregate, inclusive]) of this segment's
// channels in time tile `tt` of its channel tile.
template <int G, int V>
__device__ __forceinline__ Word *status_of(const Tiling &t, const Place &at, int64_t tt)
{
    return t.lb.status + (((int64_t)at.ct * t.ttiles + tt) * (G * V) + at.q * V) * 2;
}

// Called by warp 0 as soon as the tile's loads are issued: reads the
// previous tile's status while the data is on its way. When that tile's
// inclusive state is already there (the usual case when many channel tiles
// run side by side), the look-back costs nothing more. Other warps, the
// first time tile and single-tile launches get false.
template <int G, int V, bool CHAINED>
__device__ __forceinline__ bool peek(const Tiling &t, const Place &at, float (&h)[V])
{
    if (!CHAINED || at.tt == 0 || at.warp != 0)
        return false;
    const Word *rec = status_of<G, V>(t, at, at.tt - 1);
    const uint32_t want = inclusive_tag(t.lb);
    bool ok = true;
#pragma unroll
    for (int v = 0; v < V; v++) {
        Word w = load_relaxed(rec + 2 * v + 1);
        ok = ok && word_tag(w) == want;
        h[v] = word_value(w);
    }
    return __all_sync(0xffffffffu, ok);
}

// Warp 0, group 0 (the G lanes of segment 0) publishes the tile's status.
template <int G, int V>
__device__ __forceinline__ void publish_aggregate(const Tiling &t, const Place &at, const Affine (&m)[V])
{
    Word *rec = status_of<G, V>(t, at, at.tt);
    const uint32_t tag = aggregate_tag(t.lb);
#pragma unroll
    for (int v = 0; v < V; v++)
        store_relaxed2(rec + 2 * v, pack_word(m[v].a, tag), pack_word(m[v].b, tag));
}

template <int G, int V>
__device__ __forceinline__ void publish_inclusive(const Tiling &t, const Place &at, const float (&h)[V])
{
    Word *rec = status_of<G, V>(t, at, at.tt);
    const uint32_t tag = inclusive_tag(t.lb);
#pragma unroll
    for (int v = 0; v < V; v++)
        store_relaxed(rec + 2 * v + 1, pack_word(h[v], tag));
}

// One look-back round: group k of warp w reads the status of tile
// next - 1 - (w * 32/G + k) into window entry e; the group agrees on its
// kind (a status half written reads as empty and is read again).
template <int G, int V>
__device__ __forceinline__ void read_window(const Tiling &t, const Place &at, int64_t next,
                                            TileSmem<G, V> &sm)
{
    const int e = at.warp * (32 / G) + at.lane / G;
    const int64_t j = next - 1 - e;
    int lo = kEmpty, hi = kEmpty;
    if (j >= 0) {
        const Word *rec = status_of<G, V>(t, at, j);
        const uint32_t agg = aggregate_tag(t.lb), incl = inclusive_tag(t.lb);
        lo = kInclusive;
#pragma unroll
        for (int v = 0; v < V; v++) {
            Word x, y;
            load_relaxed2(rec + 2 * v, x, y);
            int kind = word_tag(y) == incl                              ? kInclusive
                       : word_tag(x) == agg && word_tag(y) == agg ? kAggregate
                                                                   : kEmpty;
            lo = min(lo, kind);
            hi = max(hi, kind);
            sm.wa[e][at.q * V + v] = word_value(x);
            sm.wb[e][at.q * V + v] = word_value(y);
        }
    }
    lo = group_min<G>(lo);
    hi = group_max<G>(hi);
    if (at.q == 0)
        sm.wkind[e] = lo == hi ? lo : kEmpty;
}

// Called by every thread of the block with the map of its own steps
// (`mine`), the state before the sequence for the first time tile
// (`init`, its own channels) and what peek() returned. Leaves in `hin` the
// state before the thread's first step. CHAINED: the launch has more than
// one time tile (a single-tile launch has none of the look-back code).
template <int G, int V, bool CHAINED>
__device__ __forceinline__ void scan_tile(const Tiling &t, const Place &at, const Affine (&mine)[V],
                                          const float (&init)[V], bool peeked, const float (&peek_h)[V],
                                          TileSmem<G, V> &sm, float (&hin)[V])
{
    constexpr int SEGW = 32 / G;
    const int k = at.lane / G, warps = (int)(blockDim.x >> 5);
    const int c0 = at.q * V; // the thread's first channel within the tile

    // The segments of this warp: an inclusive scan by shuffles, then the
    // map of the segments before this one.
    Affine inc[V], pre[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        inc[v] = mine[v];
#pragma unroll
    for (int d = 1; d < SEGW; d <<= 1) {
#pragma unroll
        for (int v = 0; v < V; v++) {
            Affine o = {__shfl_up_sync(0xffffffffu, inc[v].a, d * G),
                        __shfl_up_sync(0xffffffffu, inc[v].b, d * G)};
            if (k >= d)
                inc[v] = compose(o, inc[v]);
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        pre[v] = identity();
        if (SEGW > 1) {
            Affine o = {__shfl_up_sync(0xffffffffu, inc[v].a, G), __shfl_up_sync(0xffffffffu, inc[v].b, G)};
            if (k > 0)
                pre[v] = o;
        }
    }
    if (k == SEGW - 1)
#pragma unroll
        for (int v = 0; v < V; v++) {
            sm.ta[at.warp][c0 + v] = inc[v].a;
            sm.tb[at.warp][c0 + v] = inc[v].b;
        }
    if (CHAINED && at.tt > 0 && at.warp == 0) { // the carry, if the previous tile's state is known
        if (at.lane == 0)
            sm.found = peeked;
        if (peeked && k == 0)
#pragma unroll
            for (int v = 0; v < V; v++)
                sm.carry[c0 + v] = peek_h[v];
    }
    __syncthreads();

    // The warps before this one.
    for (int w = at.warp - 1; w >= 0; w--)
#pragma unroll
        for (int v = 0; v < V; v++)
            pre[v] = compose(Affine{sm.ta[w][c0 + v], sm.tb[w][c0 + v]}, pre[v]);

    if (!CHAINED) {
#pragma unroll
        for (int v = 0; v < V; v++)
            hin[v] = apply(pre[v], init[v]);
        return;
    }

    // Warp 0 speaks for the tile: its whole map, its status, the look-back.
    const bool speaker = at.warp == 0 && k == 0;
    const bool found = at.tt == 0 || sm.found;
    if (at.tt > 0) {
        FX_SCAN_EVENT(kEventChained);
        if (found)
            FX_SCAN_EVENT(kEventPeekHit);
    }
    if (at.warp == 0) {
        Affine total[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            total[v] = identity();
        for (int w = 0; w < warps; w++)
#pragma unroll
            for (int v = 0; v < V; v++)
                total[v] = compose(total[v], Affine{sm.ta[w][c0 + v], sm.tb[w][c0 + v]});
        if (found) { // the carry is init or the peeked state: publish the inclusive state now
            float incl[V];
#pragma unroll
            for (int v = 0; v < V; v++)
                incl[v] = apply(total[v], at.tt == 0 ? init[v] : peek_h[v]);
            if (speaker && at.tt + 1 < t.ttiles)
                publish_inclusive<G, V>(t, at, incl);
        } else if (speaker) { // publish the aggregate, keep the map for after the look-back
            publish_aggregate<G, V>(t, at, total);
#pragma unroll
            for (int v = 0; v < V; v++) {
                sm.xa[c0 + v] = total[v].a;
                sm.xb[c0 + v] = total[v].b;
            }
        }
    }
    if (at.tt == 0) {
#pragma unroll
        for (int v = 0; v < V; v++)
            hin[v] = apply(pre[v], init[v]);
        return;
    }

    if (!found) {
        // The carry is the state after the previous tile as the tiles
        // before compute it one after the other: the nearest published
        // inclusive state, then each newer tile's aggregate applied to it in
        // turn, oldest first. A tile's inclusive state is that same value
        // (its carry, then its map), so the carry's bits do not depend on
        // which tiles had published what when the window was read, and a
        // run replays bit for bit. (Composing the aggregates into one map
        // and applying that rounds differently with how many it composed,
        // which depends on the blocks' timing.) A window without an
        // inclusive state behind an unbroken run of aggregates is read again
        // until it has one: the tiles before publish theirs in turn, the
        // first time tile's at once.
        for (;;) {
            read_window<G, V>(t, at, at.tt, sm);
            FX_SCAN_EVENT(kEventRound);
            __syncthreads();
            if (at.warp == 0) {
                int nearest = -1; // the window entry of the nearest inclusive state, only aggregates newer
                for (int e = 0; e < warps * SEGW; e++) {
                    const int kind = sm.wkind[e];
                    if (kind == kInclusive) {
                        nearest = e;
                        break;
                    }
                    if (kind != kAggregate)
                        break; // not published yet: read it again next round
                }
                if (nearest >= 0 && k == 0)
#pragma unroll
                    for (int v = 0; v < V; v++) {
                        float h = sm.wb[nearest][c0 + v];
                        for (int e = nearest - 1; e >= 0; e--)
                            h = apply(Affine{sm.wa[e][c0 + v], sm.wb[e][c0 + v]}, h);
                        sm.carry[c0 + v] = h;
                    }
                if (at.lane == 0)
                    sm.found = nearest >= 0;
            }
            __syncthreads();
            if (sm.found)
                break;
            // (warp 0 writes sm.found again only after the next round's
            // first barrier, which every thread reaches after reading it)
            FX_SCAN_EVENT(kEventEmptyRound);
            __nanosleep(64);
        }
        if (speaker && at.tt + 1 < t.ttiles) {
            float incl[V];
#pragma unroll
            for (int v = 0; v < V; v++)
                incl[v] = apply(Affine{sm.xa[c0 + v], sm.xb[c0 + v]}, sm.carry[c0 + v]);
            publish_inclusive<G, V>(t, at, incl);
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++)
        hin[v] = apply(pre[v], sm.carry[c0 + v]);
}

// Where a thread's steps of a tile are: the offset of its first step's
// channels, the stride to the next step's, and how many of its steps exist.
struct Rows {
    int64_t row0, off0, stride;
    int count;
};

__device__ __forceinline__ Rows rows_of(const Tiling &t, const Place &at)
{
    Rows r;
    const int64_t L = t.seqlen, H = t.hidden;
    r.row0 = t.flip ? L - 1 - at.p0 : at.p0;
    r.off0 = (at.b * L + r.row0) * H + at.h;
    r.stride = t.flip ? -H : H;
    const int64_t n = L - at.p0 < t.steps ? L - at.p0 : t.steps;
    r.count = at.live && n > 0 ? (int)n : 0;
    return r;
}

// ---- loads and stores of V consecutive elements, widened to f32 ----

template <int BYTES> struct Raw;
template <> struct Raw<2> { typedef unsigned short type; };
template <> struct Raw<4> { typedef unsigned int type; };
template <> struct Raw<8> { typedef uint2 type; };
template <> struct Raw<16> { typedef uint4 type; };

// V elements of T as loaded: one access of V * sizeof(T) bytes.
template <typename T, int V> struct Pack {
    typedef typename Raw<sizeof(T) * V>::type R;
    R r;
    __device__ __forceinline__ float get(int v) const
    {
        return Elem<T>::load(reinterpret_cast<const T *>(&r)[v]);
    }
};

// Streaming (evict-first) loads: sequence inputs are read exactly once.
template <typename T, int V> __device__ __forceinline__ Pack<T, V> load_stream(const T *p)
{
    Pack<T, V> x;
    x.r = __ldcs(reinterpret_cast<const typename Pack<T, V>::R *>(p));
    return x;
}

template <typename T, int V> __device__ __forceinline__ Pack<T, V> zero_pack()
{
    Pack<T, V> x = {};
    return x;
}

template <typename T, int V>
__device__ __forceinline__ void store_stream(T *p, const float (&in)[V])
{
    typedef typename Raw<sizeof(T) * V>::type R;
    R r;
    T *e = reinterpret_cast<T *>(&r);
#pragma unroll
    for (int v = 0; v < V; v++)
        e[v] = Elem<T>::store(in[v]);
#ifdef FX_SCAN_PLAIN_STORES // dev/linrec_variants: the same kernels with default-policy stores
    *reinterpret_cast<R *>(p) = r;
#else
    __stcs(reinterpret_cast<R *>(p), r);
#endif
}

// States (h0, dstate, a step's state, the final state, dh0) are either of
// the sequence type T or f32.
template <typename T>
__device__ __forceinline__ float load_state(const void *p, int is_f32, int64_t i)
{
    return is_f32 ? static_cast<const float *>(p)[i] : Elem<T>::load(static_cast<const T *>(p)[i]);
}

template <typename T>
__device__ __forceinline__ void store_state(void *p, int is_f32, int64_t i, float v)
{
    if (is_f32)
        static_cast<float *>(p)[i] = v;
    else
        static_cast<T *>(p)[i] = Elem<T>::store(v);
}

} // namespace fx::cuda::scan

#endif
