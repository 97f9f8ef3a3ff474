// The generic chunked linear scan, h_p = a_p * h_{p-1} + b_p along a
// sequence, for [batch, seqlen, hidden] tensors scanned along seqlen,
// independently per (batch, hidden) channel. Written once, used by every op
// whose step is "compute (a, b) elementwise from the inputs, then scan"
// (c_src/cuda/linrec_kernels.cuh: the four forwards, and their backwards, whose
// adjoint is again such a scan run from the other end).
//
// Tiling. A block owns one tile: 32*V consecutive channels of one batch row
// (lane l holds channels l*V .. l*V+V-1, so a warp's loads of one time row
// are one contiguous, coalesced run) times `warps * steps` consecutive
// steps (warp w holds `steps` consecutive steps in registers). A thread
// composes its steps into one affine map; the block combines its warps'
// maps through shared memory; the tile's carry-in comes from h0 (first time
// tile) or from the tiles before it:
//
// Look-back (more than one time tile). Tiles are numbered time tile by
// time tile (all channel tiles of time tile 0 first) and block i scans tile
// i: blocks are dispatched in increasing index order (as CUB's single-pass
// scan also assumes), so every tile a block waits for belongs to a block
// that is already running or done. Warp 0 first peeks at the previous
// tile's status while the tile's own loads are in flight; if its inclusive
// state (the h after its last step) is there, that is the carry. Otherwise
// the tile publishes its aggregate map and looks back over the previous
// tiles kReads * warps at a time (each warp reads kReads tiles' statuses):
// aggregates compose into a running map until a tile with its inclusive
// state is found. It then publishes its own inclusive state. Statuses live
// in a per-device scratch buffer tagged with a per-launch epoch, so nothing
// has to be cleared between launches.
//
// Everything is f32: 16-bit inputs are widened on load.
#ifndef FX_CUDA_SCAN_CUH
#define FX_CUDA_SCAN_CUH

#include "cuda/common.cuh"

// A block's shared memory. tools/cuda_emu, which runs these kernels on the
// CPU, defines it (and FXSCAN_EMULATION) first.
#ifndef FXSCAN_SHARED
#define FXSCAN_SHARED(type, name) __shared__ type name
#endif

namespace fxscan {

// Warps per block along time (blocks of up to 256 threads, two per SM at
// up to 128 registers a thread), and previous tiles each warp reads per
// look-back round (a round covers kReads * warps tiles).
constexpr int kMaxWarps = 8;
constexpr int kReads = 2;

// h -> a * h + b
struct affine {
    float a, b;
};

__device__ __forceinline__ affine identity() { return {1.f, 0.f}; }

// `first`, then `then`.
__device__ __forceinline__ affine compose(affine first, affine then)
{
    return {then.a * first.a, fmaf(then.a, first.b, then.b)};
}

__device__ __forceinline__ float apply(affine m, float h) { return fmaf(m.a, h, m.b); }

// ---- tile statuses for the look-back ----

enum : uint32_t { kEmpty = 0, kAggregate = 1, kInclusive = 2 };

struct lookback {
    uint32_t *flags;             // [tiles]: epoch << 2 | kind
    float *agg_a, *agg_b, *incl; // [tiles][32 * V]
    uint32_t epoch;              // 1 .. 2^30 - 1, new for every launch
};

struct tiling {
    int64_t batch, seqlen, hidden;
    int64_t htiles; // channel tiles per batch row
    int64_t ctiles; // batch * htiles
    int64_t ttiles; // time tiles
    int warps;      // warps per block, along time
    int steps;      // steps per thread (<= the kernel's register capacity)
    int flip;       // step p of the scan reads time row seqlen - 1 - p
    lookback lb;    // when ttiles > 1
};

template <int V> struct smem {
    float xa[kMaxWarps][32 * V], xb[kMaxWarps][32 * V]; // each warp's map
    float wa[kReads * kMaxWarps][32 * V], wb[kReads * kMaxWarps][32 * V]; // look-back window
    float carry[32 * V]; // the tile's carry-in
    uint32_t wkind[kReads * kMaxWarps];
    int used, found;
};

__device__ __forceinline__ uint32_t load_acquire(const uint32_t *p)
{
#ifdef FXSCAN_EMULATION
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

__device__ __forceinline__ void store_release(uint32_t *p, uint32_t v)
{
#ifdef FXSCAN_EMULATION
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

// Warp 0 publishes a status: values first, then (after a fence) the flag.
template <int V>
__device__ __forceinline__ void publish(const lookback &lb, int64_t slot, uint32_t kind,
                                        const float (&va)[V], const float (&vb)[V])
{
    const int lane = threadIdx.x & 31;
    const int64_t base = slot * (32 * V) + lane * V;
#pragma unroll
    for (int v = 0; v < V; v++) {
        if (kind == kAggregate) {
            __stcg(lb.agg_a + base + v, va[v]);
            __stcg(lb.agg_b + base + v, vb[v]);
        } else {
            __stcg(lb.incl + base + v, va[v]);
        }
    }
    __threadfence();
    __syncwarp();
    if (lane == 0)
        store_release(lb.flags + slot, (lb.epoch << 2) | kind);
}

// Called by warp 0 as soon as the tile's loads are issued: reads the
// previous tile's status while the data is on its way. When that tile's
// inclusive state is already there (the usual case when many channel tiles
// run side by side), the look-back costs nothing more. Other warps, the
// first time tile and single-tile launches get false.
template <int V>
__device__ __forceinline__ bool peek(const tiling &t, int64_t ct, int64_t tt, float (&h)[V])
{
    if (tt == 0 || (threadIdx.x >> 5) != 0)
        return false;
    const int lane = threadIdx.x & 31;
    const int64_t js = ct * t.ttiles + tt - 1;
    uint32_t f = load_acquire(t.lb.flags + js);
    if (__reduce_min_sync(0xffffffffu, (f >> 2) == t.lb.epoch ? (f & 3u) : kEmpty) != kInclusive)
        return false;
#pragma unroll
    for (int v = 0; v < V; v++)
        h[v] = __ldcg(t.lb.incl + js * (32 * V) + lane * V + v);
    return true;
}

// Called by every thread of the block with the map of its own steps
// (`mine`), for the first time tile the state before the sequence (`init`,
// read by warp 0 only), and what peek() returned. Leaves in `hin` the state
// before the thread's first step.
template <int V>
__device__ __forceinline__ void scan_tile(const tiling &t, int64_t ct, int64_t tt,
                                          const affine (&mine)[V], const float (&init)[V],
                                          bool peeked, const float (&peek_h)[V], smem<V> &sm,
                                          float (&hin)[V])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = t.warps;
#pragma unroll
    for (int v = 0; v < V; v++) {
        sm.xa[warp][lane * V + v] = mine[v].a;
        sm.xb[warp][lane * V + v] = mine[v].b;
    }
    if (tt > 0 && warp == 0) { // the carry, if the previous tile's state is known
        if (lane == 0)
            sm.found = peeked;
        if (peeked)
#pragma unroll
            for (int v = 0; v < V; v++)
                sm.carry[lane * V + v] = peek_h[v];
    }
    __syncthreads();

    affine pre[V]; // the warps before this one
#pragma unroll
    for (int v = 0; v < V; v++)
        pre[v] = identity();
    for (int w = 0; w < warp; w++)
#pragma unroll
        for (int v = 0; v < V; v++)
            pre[v] = compose(pre[v], affine{sm.xa[w][lane * V + v], sm.xb[w][lane * V + v]});

    // Warp 0 speaks for the tile: its whole map, and the look-back.
    affine total[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        total[v] = identity();
    if (warp == 0) {
        for (int w = 0; w < warps; w++)
#pragma unroll
            for (int v = 0; v < V; v++)
                total[v] = compose(total[v], affine{sm.xa[w][lane * V + v], sm.xb[w][lane * V + v]});
    }
    const bool chained = t.ttiles > 1;
    const int64_t slot = ct * t.ttiles + tt;

    if (tt == 0) {
        if (warp == 0) {
            float incl[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                sm.carry[lane * V + v] = init[v];
                incl[v] = apply(total[v], init[v]);
            }
            if (chained)
                publish<V>(t.lb, slot, kInclusive, incl, incl);
        }
    } else if (!sm.found) {
        affine running[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            running[v] = identity();
        if (warp == 0) {
            float va[V], vb[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                va[v] = total[v].a;
                vb[v] = total[v].b;
            }
            publish<V>(t.lb, slot, kAggregate, va, vb);
        }
        int64_t next = tt; // the tiles below `next` are still to be read
        for (;;) {
            // Window entry e is tile next-1-e; warp w reads e = w, w + warps, ...
#pragma unroll
            for (int r = 0; r < kReads; r++) {
                const int e = r * warps + warp;
                const int64_t j = next - 1 - e;
                uint32_t kind = kEmpty;
                if (j >= 0) { // the same for the whole warp
                    const int64_t js = ct * t.ttiles + j;
                    // Each lane's own acquire orders its own value loads;
                    // the flag may move on between lanes' loads, so the
                    // warp takes the least advanced state any lane saw.
                    uint32_t f = load_acquire(t.lb.flags + js);
                    kind = __reduce_min_sync(0xffffffffu, (f >> 2) == t.lb.epoch ? (f & 3u) : kEmpty);
                    const int64_t base = js * (32 * V) + lane * V;
#pragma unroll
                    for (int v = 0; v < V; v++) {
                        if (kind == kInclusive) {
                            sm.wa[e][lane * V + v] = __ldcg(t.lb.incl + base + v);
                        } else if (kind == kAggregate) {
                            sm.wa[e][lane * V + v] = __ldcg(t.lb.agg_a + base + v);
                            sm.wb[e][lane * V + v] = __ldcg(t.lb.agg_b + base + v);
                        }
                    }
                }
                if (lane == 0)
                    sm.wkind[e] = kind;
            }
            __syncthreads();
            if (warp == 0) {
                int used = 0, found = 0;
                for (int e = 0; e < kReads * warps && !found; e++) {
                    uint32_t k = sm.wkind[e];
                    if (k == kInclusive) {
#pragma unroll
                        for (int v = 0; v < V; v++)
                            sm.carry[lane * V + v] = apply(running[v], sm.wa[e][lane * V + v]);
                        found = 1;
                    } else if (k == kAggregate) {
#pragma unroll
                        for (int v = 0; v < V; v++)
                            running[v] = compose(affine{sm.wa[e][lane * V + v], sm.wb[e][lane * V + v]},
                                                 running[v]);
                    } else {
                        break; // not published yet: read it again next round
                    }
                    used = e + 1;
                }
                if (lane == 0) {
                    sm.used = used;
                    sm.found = found;
                }
            }
            __syncthreads();
            if (sm.found)
                break;
            next -= sm.used;
            if (sm.used == 0)
                __nanosleep(64);
        }
    }
    if (tt > 0 && warp == 0 && tt + 1 < t.ttiles) {
        float incl[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            incl[v] = apply(total[v], sm.carry[lane * V + v]);
        publish<V>(t.lb, slot, kInclusive, incl, incl);
    }
    __syncthreads();
#pragma unroll
    for (int v = 0; v < V; v++)
        hin[v] = apply(pre[v], sm.carry[lane * V + v]);
}

// ---- loads and stores of V consecutive elements, widened to f32 ----

template <int BYTES> struct raw;
template <> struct raw<2> { typedef unsigned short type; };
template <> struct raw<4> { typedef unsigned int type; };
template <> struct raw<8> { typedef uint2 type; };
template <> struct raw<16> { typedef uint4 type; };

// Streaming (evict-first) loads: sequence inputs are read exactly once.
template <typename T, int V>
__device__ __forceinline__ void load_stream(const T *p, float (&out)[V])
{
    typedef typename raw<sizeof(T) * V>::type R;
    R r = __ldcs(reinterpret_cast<const R *>(p));
    const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
    for (int v = 0; v < V; v++)
        out[v] = fx_elem<T>::load(e[v]);
}

template <typename T, int V>
__device__ __forceinline__ void store_stream(T *p, const float (&in)[V])
{
    typedef typename raw<sizeof(T) * V>::type R;
    R r;
    T *e = reinterpret_cast<T *>(&r);
#pragma unroll
    for (int v = 0; v < V; v++)
        e[v] = fx_elem<T>::store(in[v]);
    __stcs(reinterpret_cast<R *>(p), r);
}

// States (h0, dstate, a step's state, the final state, dh0) are either of
// the sequence type T or f32.
template <typename T>
__device__ __forceinline__ float load_state(const void *p, int is_f32, int64_t i)
{
    return is_f32 ? static_cast<const float *>(p)[i] : fx_elem<T>::load(static_cast<const T *>(p)[i]);
}

template <typename T>
__device__ __forceinline__ void store_state(void *p, int is_f32, int64_t i, float v)
{
    if (is_f32)
        static_cast<float *>(p)[i] = v;
    else
        static_cast<T *>(p)[i] = fx_elem<T>::store(v);
}

} // namespace fxscan

#endif
