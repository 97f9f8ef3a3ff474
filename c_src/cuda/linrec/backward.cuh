// The linear recurrences' tiled backward: the forward's machinery run from
// the last step to the first over the adjoint.
#ifndef FX_CUDA_LINREC_BACKWARD_CUH
#define FX_CUDA_LINREC_BACKWARD_CUH

#include "cuda/linrec/ops.cuh"

namespace fx::cuda::linrec {

// ---- backward ----

struct BwdParams {
    OpParams in;
    const void *h0; // the forward's; NULL: zeros
    int h0_f32;
    const void *h;  // the forward's output
    const void *dh;
    const void *dstate; // NULL: zeros
    int dstate_f32;
    void *dseq[FX_LINREC_MAX_SEQ];
    void *dh0; // NULL: not wanted (dtype: h0's)
    // liquid: f32 partial sums (LiquidRows: a row for each block or warp
    // that adds into an element), [rows.tau][hidden] each and
    // [rows.dt][batch * seqlen]
    float *sum_tau, *sum_lam, *sum_dt;
    int reverse; // of the forward
};

template <int KIND, typename T, int V, int G, int S, bool CG, bool CHAINED>
__global__ void __launch_bounds__(fx::cuda::scan::kBlockThreads, kRegBlocks)
    backward_kernel(const BwdParams p, const fx::cuda::scan::Tiling t)
{
    constexpr int N = nseq<KIND>();
    typedef fx::cuda::scan::Pack<T, V> pk;
    typedef fx::cuda::scan::TileSmem<G, V> shared_t;
    FX_SCAN_SHARED(shared_t, sm);
    const fx::cuda::scan::Place at = fx::cuda::scan::locate<G, V, CHAINED>(t);
    const fx::cuda::scan::Rows r = fx::cuda::scan::rows_of(t, at);
    const int64_t L = t.seqlen, H = t.hidden;
    // Backward step p is forward step L-1-p (t.flip = !reverse maps it to
    // its row); h_{t-1} (forward order) sits one row towards the forward's
    // start, and the forward's first step (backward step L-1, the
    // segment's step `first`) starts from h0 instead.
    const int64_t prev = p.reverse ? H : -H;
    const int64_t first = L - 1 - at.p0; // in this segment when 0 <= first < count

    pk x[S][N], dh[S], hp[S];
#pragma unroll
    for (int c = 0; c < S; c++) {
        const int64_t off = r.off0 + c * r.stride;
#pragma unroll
        for (int k = 0; k < N; k++)
            x[c][k] = c < r.count ? fx::cuda::scan::load_stream<T, V>(static_cast<const T *>(p.in.seq[k]) + off)
                                  : pad_pack<KIND, T, V>(k);
        dh[c] = c < r.count ? fx::cuda::scan::load_stream<T, V>(static_cast<const T *>(p.dh) + off) : fx::cuda::scan::zero_pack<T, V>();
        hp[c] = c < r.count && c != first ? fx::cuda::scan::load_stream<T, V>(static_cast<const T *>(p.h) + off + prev)
                                          : fx::cuda::scan::zero_pack<T, V>();
    }
    float dt[S], h0v[V], init[V], peek_u[V];
    Chan ch[V];
    const bool peeked = tile_start<KIND, T, V, G, S, CHAINED>(
        p.in, t, at, r, p.dstate, p.dstate_f32,
        [&](int v) {
            h0v[v] = first >= 0 && first < r.count && p.h0 ? fx::cuda::scan::load_state<T>(p.h0, p.h0_f32, at.b * H + at.h + v)
                                                          : 0.f;
        },
        dt, ch, init, peek_u);

    // The adjoint's map per step: u -> a * (dh + u).
    Affine mine[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        mine[v] = fx::cuda::scan::identity();
#pragma unroll
    for (int c = 0; c < S; c++)
#pragma unroll
        for (int v = 0; v < V; v++) {
            float xs[3];
            step_inputs<N>(x[c], v, xs);
            const float a = coeff<KIND, CG>(xs, ch[v], dt[c]).a;
            mine[v] = fx::cuda::scan::compose(mine[v], Affine{a, a * dh[c].get(v)});
        }

    float u[V];
    fx::cuda::scan::scan_tile<G, V, CHAINED>(t, at, mine, init, peeked, peek_u, sm, u);

    float sum_tau[V] = {}, sum_lam[V] = {};
#pragma unroll
    for (int c = 0; c < S; c++) {
        float dx[3][V], row_dt = 0.f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            // (a step that does not exist passes u on unchanged and adds
            // nothing to tau's and A's sums: dt = 0)
            const float g = dh[c].get(v) + u[v];
            float xs[3], d3[3] = {0.f, 0.f, 0.f}, dtau = 0.f, dlam = 0.f, ddt = 0.f;
            step_inputs<N>(x[c], v, xs);
            const float a = step_grad<KIND, CG>(xs, ch[v], dt[c], c == first ? h0v[v] : hp[c].get(v), g, d3,
                                                dtau, dlam, ddt);
#pragma unroll
            for (int k = 0; k < 3; k++)
                dx[k][v] = d3[k];
            sum_tau[v] += dtau;
            sum_lam[v] += dlam;
            row_dt += ddt;
            u[v] = a * g;
        }
        if (c < r.count)
#pragma unroll
            for (int k = 0; k < N; k++)
                fx::cuda::scan::store_stream<T, V>(static_cast<T *>(p.dseq[k]) + r.off0 + c * r.stride, dx[k]);
        if constexpr (KIND == FX_LINREC_LIQUID) {
            if (p.sum_dt) { // the group's sum, in its channel tile's row
                row_dt = fx::cuda::scan::group_sum<G>(row_dt);
                if (at.q == 0 && c < r.count)
                    p.sum_dt[(at.ct - at.b * t.htiles) * (t.batch * L) + at.b * L + r.row0 + (t.flip ? -c : c)] =
                        row_dt;
            }
        }
    }
    if (p.dh0 && at.live && at.tt == t.ttiles - 1 && at.seg == t.segs - 1)
#pragma unroll
        for (int v = 0; v < V; v++)
            fx::cuda::scan::store_state<T>(p.dh0, p.h0_f32, at.b * H + at.h + v, u[v]);

    if constexpr (KIND == FX_LINREC_LIQUID) {
        // The block's tau and A sums, stored in its (time tile, batch row)'s
        // row: over the segments of a warp by shuffles, over warps in warp
        // order through the warp-total arrays (free once every thread is
        // past the barrier).
#pragma unroll
        for (int v = 0; v < V; v++) {
            sum_tau[v] = fx::cuda::scan::segment_sum<G>(sum_tau[v]);
            sum_lam[v] = fx::cuda::scan::segment_sum<G>(sum_lam[v]);
        }
        __syncthreads();
        const int c0 = at.q * V;
        if (at.lane < G)
#pragma unroll
            for (int v = 0; v < V; v++) {
                sm.ta[at.warp][c0 + v] = sum_tau[v];
                sm.tb[at.warp][c0 + v] = sum_lam[v];
            }
        __syncthreads();
        if (at.warp == 0 && at.lane < G && at.h < H) {
            const int warps = (int)(blockDim.x >> 5);
#pragma unroll
            for (int v = 0; v < V; v++) {
                float st = 0.f, sl = 0.f;
                for (int w = 0; w < warps; w++) {
                    st += sm.ta[w][c0 + v];
                    sl += sm.tb[w][c0 + v];
                }
                const int64_t at_row = (at.tt * t.batch + at.b) * H + at.h + v;
                p.sum_tau[at_row] = st;
                p.sum_lam[at_row] = sl;
            }
        }
    }
}

} // namespace fx::cuda::linrec

#endif
