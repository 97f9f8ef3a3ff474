// The linear recurrences' tiled forwards: inputs in registers, or staged
// in shared memory (large launches), each tile's carry from the shared scan.
#ifndef FX_CUDA_LINREC_FORWARD_CUH
#define FX_CUDA_LINREC_FORWARD_CUH

#include "cuda/linrec/ops.cuh"

namespace fx::cuda::linrec {

// ---- forward ----

struct FwdParams {
    OpParams in;
    const void *h0; // NULL: zeros
    int h0_f32;
    void *h;
    float *state; // NULL: not wanted
};

// S: the steps a thread can hold (t.steps <= S). CG: candidate g.
// CHAINED: more than one time tile (the look-back).
template <int KIND, typename T, int V, int G, int S, bool CG, bool CHAINED>
__global__ void __launch_bounds__(fx::cuda::scan::kBlockThreads, kRegBlocks)
    forward_kernel(const FwdParams p, const fx::cuda::scan::Tiling t)
{
    constexpr int N = nseq<KIND>();
    typedef fx::cuda::scan::Pack<T, V> pk;
    typedef fx::cuda::scan::TileSmem<G, V> shared_t;
    FX_SCAN_SHARED(shared_t, sm);
    const fx::cuda::scan::Place at = fx::cuda::scan::locate<G, V, CHAINED>(t);
    const fx::cuda::scan::Rows r = fx::cuda::scan::rows_of(t, at);
    const int64_t H = t.hidden;

    // Every load first, so that they are all in flight together.
    pk x[S][N];
#pragma unroll
    for (int c = 0; c < S; c++)
#pragma unroll
        for (int k = 0; k < N; k++)
            x[c][k] = c < r.count
                          ? fx::cuda::scan::load_stream<T, V>(static_cast<const T *>(p.in.seq[k]) + r.off0 + c * r.stride)
                          : pad_pack<KIND, T, V>(k);
    float dt[S], init[V], peek_h[V];
    Chan ch[V];
    const bool peeked = tile_start<KIND, T, V, G, S, CHAINED>(p.in, t, at, r, p.h0, p.h0_f32, [](int) {}, dt, ch,
                                                              init, peek_h);

    // First pass: each step's map, composed.
    Affine mine[V], kept[S][V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fx::cuda::scan::identity();
#pragma unroll
    for (int c = 0; c < S; c++)
#pragma unroll
        for (int v = 0; v < V; v++) {
            float xs[3];
            step_inputs<N>(x[c], v, xs);
            kept[c][v] = coeff<KIND, CG>(xs, ch[v], dt[c]);
            mine[v] = fx::cuda::scan::compose(mine[v], kept[c][v]);
        }

    float hv[V];
    fx::cuda::scan::scan_tile<G, V, CHAINED>(t, at, mine, init, peeked, peek_h, sm, hv);

    // Second pass: from the carry, every step's h.
#pragma unroll
    for (int c = 0; c < S; c++) {
#pragma unroll
        for (int v = 0; v < V; v++)
            hv[v] = fx::cuda::scan::apply(kept[c][v], hv[v]);
        if (c < r.count)
            fx::cuda::scan::store_stream<T, V>(static_cast<T *>(p.h) + r.off0 + c * r.stride, hv);
    }
    // The last segment of the last tile ends on the final state (steps
    // past the end are identities).
    if (p.state && at.live && at.tt == t.ttiles - 1 && at.seg == t.segs - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[at.b * H + at.h + v] = hv[v];
}

// The forward with the inputs staged in shared memory (cp.async) rather
// than held in registers: a thread holds no step's data, so more blocks
// fit an SM; both passes read the slots and compute (a, b) from them. A
// thread copies its own runs into its own slots and reads them back
// itself, so no barrier is needed: slot s of thread i is stage[s *
// threads + i].
template <int KIND, typename T, int V, int G, int S, bool CG, bool CHAINED>
__global__ void __launch_bounds__(fx::cuda::scan::kBlockThreads, kStagedBlocks)
    forward_staged_kernel(const FwdParams p, const fx::cuda::scan::Tiling t)
{
    constexpr int N = nseq<KIND>();
    typedef fx::cuda::scan::Pack<T, V> pk;
    typedef typename pk::R R;
    typedef fx::cuda::scan::TileSmem<G, V> shared_t;
    FX_SCAN_SHARED(shared_t, sm);
    FX_SCAN_STAGE(stage_bytes);
    const R *slots = reinterpret_cast<const R *>(stage_bytes) + threadIdx.x;
    const fx::cuda::scan::Place at = fx::cuda::scan::locate<G, V, CHAINED>(t);
    const fx::cuda::scan::Rows r = fx::cuda::scan::rows_of(t, at);
    const int64_t H = t.hidden;
    const unsigned threads = blockDim.x;

#pragma unroll
    for (int c = 0; c < S; c++)
        if (c < r.count)
#pragma unroll
            for (int k = 0; k < N; k++)
                copy_async<sizeof(R)>(reinterpret_cast<R *>(stage_bytes) + (c * N + k) * threads + threadIdx.x,
                                         static_cast<const T *>(p.in.seq[k]) + r.off0 + c * r.stride);
    float dt[S], init[V], peek_h[V];
    Chan ch[V];
    const bool peeked = tile_start<KIND, T, V, G, S, CHAINED>(p.in, t, at, r, p.h0, p.h0_f32, [](int) {}, dt, ch,
                                                              init, peek_h);
    copy_wait_all();

    auto step_map = [&](int c, int v, const pk (&xc)[N]) {
        float xs[3];
        step_inputs<N>(xc, v, xs);
        return coeff<KIND, CG>(xs, ch[v], dt[c]);
    };
    auto read_step = [&](int c, pk (&xc)[N]) {
#pragma unroll
        for (int k = 0; k < N; k++)
            xc[k] = c < r.count ? pk{slots[(c * N + k) * threads]} : pad_pack<KIND, T, V>(k);
    };

    Affine mine[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fx::cuda::scan::identity();
#pragma unroll
    for (int c = 0; c < S; c++) {
        pk xc[N];
        read_step(c, xc);
#pragma unroll
        for (int v = 0; v < V; v++)
            mine[v] = fx::cuda::scan::compose(mine[v], step_map(c, v, xc));
    }

    float hv[V];
    fx::cuda::scan::scan_tile<G, V, CHAINED>(t, at, mine, init, peeked, peek_h, sm, hv);

#pragma unroll
    for (int c = 0; c < S; c++) {
        pk xc[N];
        read_step(c, xc);
#pragma unroll
        for (int v = 0; v < V; v++)
            hv[v] = fx::cuda::scan::apply(step_map(c, v, xc), hv[v]);
        if (c < r.count)
            fx::cuda::scan::store_stream<T, V>(static_cast<T *>(p.h) + r.off0 + c * r.stride, hv);
    }
    if (p.state && at.live && at.tt == t.ttiles - 1 && at.seg == t.segs - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            p.state[at.b * H + at.h + v] = hv[v];
}

// Shared memory the staged forward's slots take: the inputs of every step.
template <int KIND, typename T, int V> inline size_t fwd_stage_bytes(int steps, int warps)
{
    return (size_t)steps * nseq<KIND>() * 32 * warps * sizeof(typename fx::cuda::scan::Pack<T, V>::R);
}

} // namespace fx::cuda::linrec

#endif
