// The persistent GRU and LSTM kernels: one cooperative grid walks the whole
// sequence, each block keeping its slice of the recurrent weights on chip
// (shared memory) for every step (Diamos et al., "Persistent RNNs", 2016;
// NX-AI flashrnn's fused kernel). All blocks are resident at once (a
// cooperative launch), so a block may wait for the others.
//
// Forward (wave_forward): a block owns `units` hidden units of one layer
// (all G gate rows of each, so the pointwise step is local) and the batch
// rows of its group. Launch layer 0 takes its input projection
// precomputed (a GEMM over all time steps) or, for a step, forms it from
// x; the layers above form theirs on chip from the layer below's h_t
// (their w_ih sits beside w_hh). The layers run as a wavefront: layer
// l + 1 works on time t while layer l works on t + 1.
//
// The blocks meet through the states themselves, not a barrier: h_t
// crosses blocks through a ring of two slots a layer in global memory (L2)
// whose words carry the value and the step that wrote it (tag t + 1; the
// ring is zeroed before the launch), so a block's loads of h_{t-1} are its
// wait for it: one trip to L2 a step where a grid barrier takes two (its
// arrival, then the data). A slot is written again two steps later, which
// the dependencies order within a layer (every block read h_{t-2} before
// it wrote the h_{t-1} this block has read); across layers a block waits,
// before it overwrites a slot, until the layer above has read it (a
// counter of reads a layer, almost always passed already).
//
// Backward (wave_backward, one layer a launch): a block owns units J and
// keeps the columns W_hh[:, J] (as rows of K = G*hidden), so that
// dh_{t-1}[J] = dah_t W_hh[:, J] needs only the gradient of every gate at
// step t, which crosses blocks through the same kind of tagged ring.
//
// The products (an engine, the kernels' template parameter) accumulate in
// f32: on the CUDA cores (Ffma: each warp takes 4 rows and, where there are
// fewer row groups than warps, a share of K; lanes stride K, and one
// warp-transposing sum reduces 4 x BT values at once, warp_sum.cuh; h in
// f32), or on the tensor cores for 16-bit weights (Mma: mma.cuh, h
// rounded to the weights' type for the product, as cuDNN does). The
// pointwise steps read h_{t-1} in f32 either way.
#ifndef FX_CUDA_RNN_PERSISTENT_CUH
#define FX_CUDA_RNN_PERSISTENT_CUH

#include <string.h>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/rnn/cells.cuh"
#include "cuda/rnn/mma.cuh"
#include "cuda/warp_sum.cuh"

namespace fx::cuda::rnn {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 4;
// Layers one launch takes as a wavefront (the parameter block's size).
constexpr int kMaxWave = 8;

// ---- states that cross blocks: tagged words, counters ----

// A state's value and the step that wrote it (its tag), in one word that
// is stored and loaded whole. Two kinds: Wide, f32 and a 32-bit tag (8
// bytes: what the CUDA cores' products read, h in f32); Narrow, the 16-bit
// type T and a 16-bit tag (4 bytes: the tensor cores round to T anyway).
// Tags are the step + 1 (wrapping at 2^16 for Narrow: a slot's tag is then
// compared with the step's, which differs from the one two steps back);
// the ring starts zeroed, and no step waits for a tag 0 before its slot
// was written.
struct Wide {
    typedef unsigned long long W;
    __device__ static unsigned tag_of(int64_t step) { return (unsigned)(step + 1); }
    __device__ static unsigned tag(W w) { return (unsigned)(w >> 32); }
    __device__ static float value(W w) { return __uint_as_float((unsigned)w); }
    __device__ static W pack(unsigned tag, float v) { return (W)tag << 32 | __float_as_uint(v); }
};

template <typename T> struct Narrow {
    typedef unsigned W;
    __device__ static unsigned tag_of(int64_t step) { return (unsigned)((step + 1) & 0xffff); }
    __device__ static unsigned tag(W w) { return w >> 16; }
    __device__ static float value(W w)
    {
        const unsigned short bits = (unsigned short)(w & 0xffffu);
        T v;
        memcpy(&v, &bits, sizeof bits);
        return Elem<T>::load(v);
    }
    __device__ static W pack(unsigned tag, float v)
    {
        const T x = Elem<T>::store(v);
        unsigned short bits;
        memcpy(&bits, &x, sizeof bits);
        return (tag & 0xffffu) << 16 | bits;
    }
};

__device__ __forceinline__ unsigned long long load_relaxed_word(const unsigned long long *p)
{
#ifdef FX_CUDA_EMULATION
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
#endif
}

__device__ __forceinline__ unsigned load_relaxed_word(const unsigned *p)
{
#ifdef FX_CUDA_EMULATION
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
    unsigned w;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(w) : "l"(p) : "memory");
    return w;
#endif
}

__device__ __forceinline__ void store_relaxed_word(unsigned long long *p, unsigned long long w)
{
#ifdef FX_CUDA_EMULATION
    __atomic_store_n(p, w, __ATOMIC_RELAXED);
#else
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
#endif
}

__device__ __forceinline__ void store_relaxed_word(unsigned *p, unsigned w)
{
#ifdef FX_CUDA_EMULATION
    __atomic_store_n(p, w, __ATOMIC_RELAXED);
#else
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(w) : "memory");
#endif
}

template <class S> __device__ __forceinline__ void put_tagged(typename S::W *p, unsigned tag, float v)
{
    store_relaxed_word(p, S::pack(tag, v));
}

// The value at p once its tag is `tag`.
template <class S> __device__ __forceinline__ float get_tagged(const typename S::W *p, unsigned tag)
{
    typename S::W w = load_relaxed_word(p);
    while (S::tag(w) != tag) {
        __nanosleep(20);
        w = load_relaxed_word(p);
    }
    return S::value(w);
}

__device__ __forceinline__ unsigned load_acquire(const unsigned *p)
{
#ifdef FX_CUDA_EMULATION
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

__device__ __forceinline__ unsigned load_relaxed(const unsigned *p)
{
#ifdef FX_CUDA_EMULATION
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

__device__ __forceinline__ void add_release(unsigned *p)
{
#ifdef FX_CUDA_EMULATION
    __atomic_fetch_add(p, 1u, __ATOMIC_RELEASE);
#else
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
#endif
}

// Thread 0 waits until *counter reaches `target` (`seen`: a value it read
// earlier, which may already show it), then every thread goes on with
// what the counter's producers did before they counted visible to it.
__device__ __forceinline__ void wait_count(const unsigned *counter, unsigned target, unsigned seen)
{
    if (threadIdx.x == 0) {
        if (seen >= target)
            __threadfence(); // the relaxed read made an acquire
        else
            while (load_acquire(counter) < target)
                __nanosleep(32);
    }
    __syncthreads();
}

template <typename T> __device__ __forceinline__ float load_elem(const T *p, int64_t i)
{
    return Elem<T>::load(p[i]);
}
__device__ __forceinline__ float load_elem(const float *p, int64_t i) { return p[i]; }

// ---- staging: many loads in flight a thread ----

// store(i, load(i)) for i < n over the block, N loads of a thread issued
// before their stores: the latency of global memory paid once a round,
// not once an element.
template <int N, typename LOAD, typename STORE> __device__ __forceinline__ void batched(int64_t n, LOAD load, STORE store)
{
    typedef decltype(load((int64_t)0)) V;
    for (int64_t base = threadIdx.x; base < n; base += (int64_t)kThreads * N) {
        V v[N];
#pragma unroll
        for (int u = 0; u < N; u++) {
            const int64_t i = base + (int64_t)u * kThreads;
            if (i < n)
                v[u] = load(i);
        }
#pragma unroll
        for (int u = 0; u < N; u++) {
            const int64_t i = base + (int64_t)u * kThreads;
            if (i < n)
                store(i, v[u]);
        }
    }
}

// dst(i, v) for i < n, v the value of a tagged word once it carries its
// step's tag (src(i, imm, tag) gives the word's address and sets the tag,
// or gives nullptr with the value in `imm`); N loads a thread in flight,
// all issued before the first is waited for.
template <int N, class S, typename SRC, typename DST> __device__ __forceinline__ void batched_tagged(int64_t n, SRC src, DST dst)
{
    typedef typename S::W W;
    for (int64_t base = threadIdx.x; base < n; base += (int64_t)kThreads * N) {
        const W *at[N];
        float imm[N];
        unsigned tag[N];
        W w[N];
#pragma unroll
        for (int u = 0; u < N; u++) {
            const int64_t i = base + (int64_t)u * kThreads;
            imm[u] = 0.f;
            tag[u] = 0;
            at[u] = i < n ? src(i, imm[u], tag[u]) : nullptr;
            w[u] = at[u] ? load_relaxed_word(at[u]) : 0;
        }
#pragma unroll
        for (int u = 0; u < N; u++) {
            const int64_t i = base + (int64_t)u * kThreads;
            if (i >= n)
                continue;
            if (!at[u])
                dst(i, imm[u]);
            else if (S::tag(w[u]) == tag[u])
                dst(i, S::value(w[u]));
            else
                dst(i, get_tagged<S>(at[u], tag[u]));
        }
    }
}

// rows [rows][ld] of T in shared memory from global rows of K elements
// (row q at src(q), nullptr for a row of zeros), zero from K to ld; `vec`
// (16 or 4: every source row and ld aligned so) copies in cp.async pieces
// of that many bytes, 0 element by element. Every thread of the block
// calls it; the copies have landed when it returns (after a barrier).
template <typename T, typename ROW>
__device__ __forceinline__ void stage_rows(T *dst, int64_t ld, int rows, int64_t K, ROW src, int vec)
{
    const int64_t pad = ld - K;
    for (int64_t i = threadIdx.x; i < rows * pad; i += kThreads)
        dst[i / pad * ld + K + i % pad] = Elem<T>::store(0.f);
    if (vec == 16 || vec == 4) {
        const int64_t per = vec / (int64_t)sizeof(T), chunks = K / per;
        for (int64_t i = threadIdx.x; i < rows * chunks; i += kThreads) {
            const int q = (int)(i / chunks);
            const int64_t k = i % chunks * per;
            const T *row = src(q);
            if (vec == 16)
                copy_async<16>(dst + q * ld + k, row ? row + k : nullptr, row != nullptr);
            else
                copy_async<4>(dst + q * ld + k, row ? row + k : nullptr, row != nullptr);
        }
        copy_commit();
        copy_wait_all();
    } else {
        batched<8>((int64_t)rows * K,
                   [&](int64_t i) {
                       const T *row = src((int)(i / K));
                       return row ? row[i % K] : Elem<T>::store(0.f);
                   },
                   [&](int64_t i, T v) { dst[i / K * ld + i % K] = v; });
    }
    __syncthreads();
}

// The widest cp.async piece (16, 4, or 0: none) that rows of K elements of
// T at `base`, staged `ld` apart, allow.
__host__ __device__ inline int stage_vec(const void *base, int64_t K, int64_t ld, int64_t esize)
{
    const uintptr_t at = (uintptr_t)base;
    if (at % 16 == 0 && (K * esize) % 16 == 0 && (ld * esize) % 16 == 0)
        return 16;
    if (at % 4 == 0 && (K * esize) % 4 == 0 && (ld * esize) % 4 == 0)
        return 4;
    return 0;
}

// ---- the block's products ----

// out[q][b] = sum_k W[row q][k] v[b][k] for q < rows, b < BT, where row q is
// at base + ((q / units) * gate_stride + q % units) * ld and only units
// below `valid` exist (the others give 0). v is [BT][ldv] f32 in shared
// memory (rows past the batch tile zero); out [rows][BT] and part
// (kWarps * rows * BT floats) in shared memory. Every thread of the block
// calls it; it ends with a __syncthreads.
template <int BT, typename TW>
__device__ __forceinline__ void matvec(const TW *base, int64_t gate_stride, int64_t ld, int units, int valid,
                                       int rows, int K, const float *v, int ldv, float *out, float *part)
{
    constexpr int V = kRowsPerWarp * BT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int groups = (rows + kRowsPerWarp - 1) / kRowsPerWarp;
    const int splits = groups >= kWarps ? 1 : kWarps / groups;
    const int chunk = ((K + splits - 1) / splits + 31) / 32 * 32;
    float *dst = splits == 1 ? out : part;
    for (int w = warp; w < groups * splits; w += kWarps) {
        const int rg = w % groups, ks = w / groups;
        const int k0 = ks * chunk, k1 = k0 + chunk < K ? k0 + chunk : K;
        const TW *row[kRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; i++) {
            const int q = rg * kRowsPerWarp + i;
            row[i] = q < rows && q % units < valid ? base + ((q / units) * gate_stride + q % units) * ld : nullptr;
        }
        float acc[V];
#pragma unroll
        for (int i = 0; i < V; i++)
            acc[i] = 0.f;
        for (int k = k0 + lane; k < k1; k += 32) {
            float w_k[kRowsPerWarp];
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; i++)
                w_k[i] = row[i] ? load_elem(row[i], k) : 0.f;
#pragma unroll
            for (int b = 0; b < BT; b++) {
                const float x = v[b * ldv + k];
#pragma unroll
                for (int i = 0; i < kRowsPerWarp; i++)
                    acc[i * BT + b] = fmaf(w_k[i], x, acc[i * BT + b]);
            }
        }
        const int index = warp::transpose_sum<V, 0>(acc, lane);
        if ((lane & (32 / V - 1)) == 0) {
            const int q = rg * kRowsPerWarp + index / BT;
            if (q < rows)
                dst[(ks * rows + q) * BT + index % BT] = acc[0];
        }
    }
    __syncthreads();
    if (splits > 1) {
        for (int i = threadIdx.x; i < rows * BT; i += kThreads) {
            float sum = 0.f;
            for (int ks = 0; ks < splits; ks++)
                sum += part[ks * rows * BT + i];
            out[i] = sum;
        }
        __syncthreads();
    }
}

// ---- the engines ----

template <typename T, int BT> struct Ffma {
    static constexpr int kBT = BT;
    typedef float V;    // how a batch tile of h is staged
    typedef Wide Slot;  // how the states cross blocks
    __host__ __device__ static int64_t ld(int64_t k) { return k; }
    __device__ static V to_v(float x) { return x; }
    __device__ static void product(const T *base, int64_t gate_stride, int64_t ld, int units, int valid, int rows,
                                   int K, const V *v, int ldv, float *out, float *part)
    {
        matvec<BT>(base, gate_stride, ld, units, valid, rows, K, v, ldv, out, part);
    }
};

// Rows padded to whole k-steps of 16, plus 8 elements (16 bytes) so that
// the 8 rows a fragment load touches fall in distinct banks.
__host__ __device__ inline int64_t mma_ld(int64_t k) { return k > 0 ? (k + 15) / 16 * 16 + 8 : 0; }

template <typename T, int NT> struct Mma {
    static constexpr int kBT = 8 * NT;
    typedef T V;
    typedef Narrow<T> Slot;
    __host__ __device__ static int64_t ld(int64_t k) { return mma_ld(k); }
    __device__ static V to_v(float x) { return Elem<T>::store(x); }
    __device__ static void product(const T *base, int64_t gate_stride, int64_t ld, int units, int valid, int rows,
                                   int K, const V *v, int ldv, float *out, float *part)
    {
        matvec_mma<NT, T>(base, gate_stride, ld, units, valid, rows, (K + 15) / 16 * 16, v, ldv, out, part);
    }
};

// ---- shared memory layouts (the host's plan computes the same) ----

__host__ __device__ constexpr int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

struct WaveSmem {
    int64_t w_hh, w_ih, v, vin, pre_h, pre_x, part, bias, own_h, own_c, total; // byte offsets; total the size
};

// The warps' shares of K a product of `rows` rows splits into (matvec,
// matvec_mma: at most this many), whose partial sums need room beside the
// result where there are more than one.
__host__ __device__ inline int product_splits(int64_t rows, bool mma)
{
    const int64_t groups = mma ? (rows + 15) / 16 : (rows + kRowsPerWarp - 1) / kRowsPerWarp;
    return groups >= kWarps ? 1 : (int)(kWarps / groups);
}

// `rows`: G * units; `ld_h`, `ld_w`: the staged rows' strides for K =
// hidden and for the widest on-chip projection (0: none), elements of
// `esize_w` bytes (weights) and `esize_v` (the staged batch tiles);
// `stage`: the weights in shared memory; `owned`: the states the block
// keeps in f32 from step to step (its group's rows x its units; the
// LSTM's c as many again).
__host__ __device__ inline WaveSmem wave_smem(int64_t rows, int64_t ld_h, int64_t ld_w, int bt, int64_t esize_w,
                                              int64_t esize_v, bool stage, bool mma, int64_t owned, bool lstm)
{
    WaveSmem s;
    const int splits = product_splits(rows, mma);
    int64_t at = 0;
    s.w_hh = at;
    at += stage ? align16(rows * ld_h * esize_w) : 0;
    s.w_ih = at;
    at += stage ? align16(rows * ld_w * esize_w) : 0;
    s.v = at;
    at += align16(bt * ld_h * esize_v);
    s.vin = at;
    at += align16(bt * ld_w * esize_v);
    s.pre_h = at;
    at += align16(rows * bt * 4);
    s.pre_x = at;
    at += align16(rows * bt * 4);
    s.part = at;
    at += splits > 1 ? align16(splits * rows * bt * 4) : 0;
    s.bias = at;
    at += align16(2 * rows * 4);
    s.own_h = at;
    at += align16(owned * 4);
    s.own_c = at;
    at += lstm ? align16(owned * 4) : 0;
    s.total = at;
    return s;
}

// The backward's: W_hh's columns of the block's units as rows of
// G * hidden (stride `ld`), the gate gradients of a batch tile, the
// products.
struct BackSmem {
    int64_t wt, v, m, part, total;
};

__host__ __device__ inline BackSmem back_smem(int64_t units, int64_t ld, int bt, int64_t esize_w, int64_t esize_v,
                                              bool mma)
{
    BackSmem s;
    const int splits = product_splits(units, mma);
    int64_t at = 0;
    s.wt = at;
    at += align16(units * ld * esize_w);
    s.v = at;
    at += align16(bt * ld * esize_v);
    s.m = at;
    at += align16(units * bt * 4);
    s.part = at;
    at += splits > 1 ? align16(splits * units * bt * 4) : 0;
    s.total = at;
    return s;
}

__device__ __forceinline__ unsigned char *dynamic_smem()
{
#ifdef FX_CUDA_EMULATION
    return static_cast<unsigned char *>(fx_emu_dynamic_smem()); // test/emu: the block's
#else
    extern __shared__ __align__(16) unsigned char smem[];
    return smem;
#endif
}

// ---- forward ----

struct WaveLayer {
    const void *w_ih;         // [G*hidden, in_width] of T (an on-chip projection), or nullptr
    const void *w_hh;         // [G*hidden, hidden] of T
    const void *b_ih, *b_hh;  // [G*hidden], or nullptr
    int b_ih_type, b_hh_type;
    const void *h0, *c0;      // the layer's [batch, hidden], or nullptr
    int h0_type, c0_type;
    float *h_n, *c_n;         // the layer's [batch, hidden], or nullptr
    float *saved;             // the layer's [batch, seqlen, saved width], or nullptr
    void *out;                // [batch, seqlen, hidden] of T, or nullptr
    int64_t in_width;         // w_ih's columns
    int vec_hh, vec_ih;       // stage_vec of w_hh and w_ih as staged
};

struct WaveParams {
    int cell, layers; // the layers of this launch
    int64_t batch, seqlen, hidden;
    const float *gx;  // launch layer 0's projection [batch, seqlen, G*hidden] (no bias), or nullptr:
    const void *x;    // then formed on chip from this [batch, seqlen, in_width] of T
    WaveLayer layer[kMaxWave];
    void *ring;       // [layers][2][batch][hidden] slot words (the engine's Slot), zero at the launch
    unsigned *reads;  // [groups][layers]: steps a layer's blocks are done with (their inputs read), zero at the launch
    int units, tiles, groups;
    int64_t group_rows;
    int stage;        // weights in shared memory (else read from global memory: a step)
    int defer_final;  // the final states alias the initial ones: written once every block read those
    int64_t wmax;     // the widest on-chip projection of the launch (the layout)
};

template <typename T, class E> __global__ void __launch_bounds__(kThreads, 2) wave_forward(const WaveParams p)
{
    typedef typename E::V V;
    typedef typename E::Slot Sl;
    typedef typename Sl::W W;
    constexpr int BT = E::kBT;
    const int per_group = p.layers * p.tiles;
    const int g = blockIdx.x / per_group, l = blockIdx.x % per_group / p.tiles, u = blockIdx.x % p.tiles;
    const WaveLayer &ly = p.layer[l];
    const int64_t H = p.hidden, L = p.seqlen, B = p.batch;
    const int G = gates_of(p.cell), U = p.units, rows = G * U;
    const int64_t GH = G * H, S = saved_width(p.cell, H);
    const int64_t j0 = (int64_t)u * U;
    const int nu = (int)(H - j0 < U ? H - j0 : U);
    const bool proj = l > 0 || !p.gx;
    const int64_t K = proj ? ly.in_width : 0;
    // staged rows' strides; rows read in place (a step) are as stored
    const int64_t ld_h = E::ld(H), ld_w = E::ld(p.wmax);
    const bool lstm = p.cell == FX_RNN_LSTM;
    const WaveSmem lay =
        wave_smem(rows, ld_h, ld_w, BT, sizeof(T), sizeof(V), p.stage, !std::is_same<V, float>::value,
                  p.group_rows * U, lstm);
    unsigned char *smem = dynamic_smem();
    T *w_hh_s = reinterpret_cast<T *>(smem + lay.w_hh), *w_ih_s = reinterpret_cast<T *>(smem + lay.w_ih);
    V *v = reinterpret_cast<V *>(smem + lay.v), *vin = reinterpret_cast<V *>(smem + lay.vin);
    float *pre_h = reinterpret_cast<float *>(smem + lay.pre_h), *pre_x = reinterpret_cast<float *>(smem + lay.pre_x);
    float *part = reinterpret_cast<float *>(smem + lay.part), *bias = reinterpret_cast<float *>(smem + lay.bias);
    // h (and c) of the block's own units over its group's rows, kept in f32
    float *own_h = reinterpret_cast<float *>(smem + lay.own_h), *own_c = reinterpret_cast<float *>(smem + lay.own_c);
    const T *w_hh = static_cast<const T *>(ly.w_hh), *w_ih = static_cast<const T *>(ly.w_ih);

    // the block's rows (gate q / U of unit j0 + q % U), staged once, zero
    // past their columns
    if (p.stage) {
        stage_rows(w_hh_s, ld_h, rows, H,
                   [&](int q) { return q % U < nu ? w_hh + ((q / U) * H + j0 + q % U) * H : (const T *)nullptr; },
                   ly.vec_hh);
        if (proj)
            stage_rows(w_ih_s, ld_w, rows, K,
                       [&](int q) { return q % U < nu ? w_ih + ((q / U) * H + j0 + q % U) * K : (const T *)nullptr; },
                       ly.vec_ih);
    }
    for (int q = threadIdx.x; q < rows; q += kThreads) {
        const int64_t r = (q / U) * H + j0 + q % U;
        const bool ok = q % U < nu;
        bias[q] = ok && ly.b_ih ? load_any(ly.b_ih, ly.b_ih_type, r) : 0.f;
        bias[rows + q] = ok && ly.b_hh ? load_any(ly.b_hh, ly.b_hh_type, r) : 0.f;
    }
    __syncthreads();
    // the products read the staged rows, or the rows in place
    const T *hh_base = p.stage ? w_hh_s : w_hh + j0 * H;
    const T *ih_base = p.stage ? w_ih_s : w_ih + j0 * K;
    const int64_t hh_gate = p.stage ? U : H, ih_gate = p.stage ? U : H;
    const int64_t hh_ld = p.stage ? ld_h : H, ih_ld = p.stage ? ld_w : K;

    const int64_t b_lo = (int64_t)g * p.group_rows, b_hi = b_lo + p.group_rows < B ? b_lo + p.group_rows : B;
    for (int64_t i = threadIdx.x; i < (b_hi - b_lo) * nu; i += kThreads) {
        const int64_t bb = b_lo + i / nu, jj = i % nu, e = bb * H + j0 + jj;
        own_h[(bb - b_lo) * U + jj] = ly.h0 ? load_any(ly.h0, ly.h0_type, e) : 0.f;
        if (lstm)
            own_c[(bb - b_lo) * U + jj] = ly.c0 ? load_any(ly.c0, ly.c0_type, e) : 0.f;
    }
    W *ring = static_cast<W *>(p.ring);
    W *ring_l = ring + (int64_t)l * 2 * B * H;
    unsigned *reads = p.reads + (int64_t)g * p.layers;
    const bool above = l + 1 < p.layers; // a layer of this launch reads this one's h_t
    for (int64_t t = 0; t < L; t++) {
        // h_t goes into the slot of h_{t-2}: the layer above must have read
        // that (its step t - 2); thread 0 asks now and looks after the products
        const unsigned need = above && t >= 2 ? (unsigned)((t - 1) * p.tiles) : 0;
        const unsigned seen = need && threadIdx.x == 0 ? load_relaxed(reads + l + 1) : 0;
        const W *h_prev = ring_l + ((t - 1) & 1) * B * H;
        const W *below = l > 0 ? ring + ((int64_t)(l - 1) * 2 + (t & 1)) * B * H : nullptr;
        W *h_now = ring_l + (t & 1) * B * H;
        for (int64_t b0 = b_lo; b0 < b_hi; b0 += BT) {
            const int nb = (int)(b_hi - b0 < BT ? b_hi - b0 : BT);
            // the batch tile's h_{t-1} (tag t) and input (the layer below's
            // h_t, tag t + 1), zero past the tile and past K
            // one pass over both, so that their loads are in flight together
            const int64_t nv = BT * ld_h, nin = proj ? BT * ld_w : 0;
            batched_tagged<4, Sl>(
                nv + nin,
                [&](int64_t i, float &imm, unsigned &tag) -> const W * {
                    if (i < nv) {
                        const int64_t b = i / ld_h, k = i % ld_h, bb = b0 + b;
                        if (b >= nb || k >= H)
                            return nullptr;
                        tag = Sl::tag_of(t - 1);
                        if (t > 0)
                            return h_prev + bb * H + k;
                        imm = ly.h0 ? load_any(ly.h0, ly.h0_type, bb * H + k) : 0.f;
                        return nullptr;
                    }
                    const int64_t b = (i - nv) / ld_w, k = (i - nv) % ld_w, bb = b0 + b;
                    if (b >= nb || k >= K)
                        return nullptr;
                    tag = Sl::tag_of(t);
                    if (below)
                        return below + bb * H + k;
                    imm = load_elem(static_cast<const T *>(p.x), (bb * L + t) * K + k);
                    return nullptr;
                },
                [&](int64_t i, float val) {
                    if (i < nv)
                        v[i] = E::to_v(val);
                    else
                        vin[i - nv] = E::to_v(val);
                });
            __syncthreads();
            E::product(hh_base, hh_gate, hh_ld, U, nu, rows, (int)H, v, (int)ld_h, pre_h, part);
            if (proj)
                E::product(ih_base, ih_gate, ih_ld, U, nu, rows, (int)K, vin, (int)ld_w, pre_x, part);
            if (b0 == b_lo && need)
                wait_count(reads + l + 1, need, seen);
            for (int i = threadIdx.x; i < nb * nu; i += kThreads) {
                const int b = i / nu, jj = i % nu;
                const int64_t bb = b0 + b, j = j0 + jj, row = bb * L + t;
                float ax[kMaxGates], ah[kMaxGates];
                for (int q = 0; q < G; q++) {
                    const int r = q * U + jj;
                    ax[q] = (proj ? pre_x[r * BT + b] : p.gx[row * GH + q * H + j]) + bias[r];
                    ah[q] = pre_h[r * BT + b] + bias[rows + r];
                }
                float *oh = own_h + (bb - b_lo) * U + jj, *oc = own_c + (bb - b_lo) * U + jj;
                float c = lstm ? *oc : 0.f;
                float *save = ly.saved ? ly.saved + row * S + j : nullptr;
                const float h = cell_forward(p.cell, ax, ah, *oh, c, save, H);
                put_tagged<Sl>(h_now + bb * H + j, Sl::tag_of(t), h);
                *oh = h;
                if (lstm)
                    *oc = c;
                if (save)
                    save[S - H] = h;
                if (ly.out)
                    static_cast<T *>(ly.out)[row * H + j] = Elem<T>::store(h);
                if (t == L - 1 && !p.defer_final) {
                    if (ly.h_n)
                        ly.h_n[bb * H + j] = h;
                    if (ly.c_n)
                        ly.c_n[bb * H + j] = c;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            add_release(reads + l); // this block is done with every input of step t
    }
    if (p.defer_final) {
        // every block of the layer has read h0 (its step 0) before h_n,
        // the same memory, changes
        wait_count(reads + l, (unsigned)p.tiles, 0);
        for (int64_t i = threadIdx.x; i < (b_hi - b_lo) * nu; i += kThreads) {
            const int64_t bb = b_lo + i / nu, jj = i % nu, e = bb * H + j0 + jj;
            if (ly.h_n)
                ly.h_n[e] = own_h[(bb - b_lo) * U + jj];
            if (ly.c_n)
                ly.c_n[e] = own_c[(bb - b_lo) * U + jj];
        }
    }
}

// ---- backward ----

struct BackParams {
    int cell;
    int64_t batch, seqlen, hidden;
    const void *w_hh;          // [G*hidden, hidden] of T
    const float *saved;        // the layer's [batch, seqlen, saved width]
    const void *h0, *c0;       // the layer's [batch, hidden], or nullptr
    int h0_type, c0_type;
    const void *dout;          // the layer output's gradient [batch, seqlen, hidden], or nullptr
    int dout_type;
    const void *dh_n, *dc_n;   // the layer's [batch, hidden], or nullptr
    int dh_n_type, dc_n_type;
    void *dax, *dah, *hprev;   // of T: [batch, seqlen, G*hidden] (dah nullptr: the LSTM's is dax), [.., hidden]
    void *dh0, *dc0;           // the layer's [batch, hidden], or nullptr
    int dh0_type, dc0_type;
    void *ring;                // [2][batch][G*hidden] slot words (the engine's Slot), zero at the launch
    float *dhc, *dcc;          // [batch][hidden]: carried by the unit's owner
    int units, tiles, groups;
    int64_t group_rows;
};

template <typename T, class E> __global__ void __launch_bounds__(kThreads, 2) wave_backward(const BackParams p)
{
    typedef typename E::V V;
    typedef typename E::Slot Sl;
    typedef typename Sl::W W;
    constexpr int BT = E::kBT;
    const int g = blockIdx.x / p.tiles, u = blockIdx.x % p.tiles;
    const int64_t H = p.hidden, L = p.seqlen, B = p.batch;
    const int G = gates_of(p.cell), U = p.units;
    const int64_t GH = G * H, S = saved_width(p.cell, H), ld = E::ld(GH);
    const int64_t j0 = (int64_t)u * U;
    const int nu = (int)(H - j0 < U ? H - j0 : U);
    const BackSmem lay = back_smem(U, ld, BT, sizeof(T), sizeof(V), !std::is_same<V, float>::value);
    unsigned char *smem = dynamic_smem();
    T *wt = reinterpret_cast<T *>(smem + lay.wt);
    V *v = reinterpret_cast<V *>(smem + lay.v);
    float *m = reinterpret_cast<float *>(smem + lay.m), *part = reinterpret_cast<float *>(smem + lay.part);
    const T *w_hh = static_cast<const T *>(p.w_hh);
    // wt[jj][r] = W_hh[r][j0 + jj]: neighbouring threads read neighbouring
    // units; zero past the units and past G * hidden
    batched<8>(
        U * ld,
        [&](int64_t i) {
            const int64_t r = i / U, jj = i % U;
            return jj < nu && r < GH ? w_hh[r * H + j0 + jj] : Elem<T>::store(0.f);
        },
        [&](int64_t i, T w) { wt[i % U * ld + i / U] = w; });
    __syncthreads();
    const int64_t b_lo = (int64_t)g * p.group_rows, b_hi = b_lo + p.group_rows < B ? b_lo + p.group_rows : B;
    T *dax_t = static_cast<T *>(p.dax), *dah_t = static_cast<T *>(p.dah), *hprev_t = static_cast<T *>(p.hprev);
    for (int64_t s = 0; s <= L; s++) {
        const int64_t t = L - 1 - s;
        const W *later = static_cast<const W *>(p.ring) + ((s - 1) & 1) * B * GH;
        W *now = static_cast<W *>(p.ring) + (s & 1) * B * GH;
        for (int64_t b0 = b_lo; b0 < b_hi; b0 += BT) {
            const int nb = (int)(b_hi - b0 < BT ? b_hi - b0 : BT);
            if (s > 0) {
                // every gate's gradient at step s - 1 (tag s)
                batched_tagged<4, Sl>(
                    BT * ld,
                    [&](int64_t i, float &, unsigned &tag) -> const W * {
                        const int64_t b = i / ld, k = i % ld;
                        tag = Sl::tag_of(s - 1);
                        return b < nb && k < GH ? later + (b0 + b) * GH + k : nullptr;
                    },
                    [&](int64_t i, float val) { v[i] = E::to_v(val); });
                __syncthreads();
                E::product(wt, 0, ld, U, nu, U, (int)GH, v, (int)ld, m, part);
            }
            for (int i = threadIdx.x; i < nb * nu; i += kThreads) {
                const int b = i / nu, jj = i % nu;
                const int64_t bb = b0 + b, j = j0 + jj, e = bb * H + j;
                float dh = s > 0 ? p.dhc[e] + m[jj * BT + b] : p.dh_n ? load_any(p.dh_n, p.dh_n_type, e) : 0.f;
                float dc = 0.f;
                if (p.cell == FX_RNN_LSTM)
                    dc = s > 0 ? p.dcc[e] : p.dc_n ? load_any(p.dc_n, p.dc_n_type, e) : 0.f;
                if (t < 0) { // the gradients of the initial states
                    if (p.dh0)
                        store_any(p.dh0, p.dh0_type, e, dh);
                    if (p.dc0)
                        store_any(p.dc0, p.dc0_type, e, dc);
                    continue;
                }
                const int64_t row = bb * L + t;
                const float gt = dh + (p.dout ? load_any(p.dout, p.dout_type, row * H + j) : 0.f);
                const float *saved = p.saved + row * S + j;
                const float hp = t > 0 ? saved[-H] : p.h0 ? load_any(p.h0, p.h0_type, e) : 0.f;
                const float cp = p.cell != FX_RNN_LSTM ? 0.f
                                 : t > 0         ? saved[-S + 4 * H]
                                 : p.c0          ? load_any(p.c0, p.c0_type, e)
                                                 : 0.f;
                float dax[kMaxGates], dah[kMaxGates];
                const float direct = cell_backward(p.cell, gt, saved, H, hp, cp, dc, dax, dah);
                for (int q = 0; q < G; q++) {
                    put_tagged<Sl>(now + bb * GH + q * H + j, Sl::tag_of(s), dah[q]);
                    dax_t[row * GH + q * H + j] = Elem<T>::store(dax[q]);
                    if (dah_t)
                        dah_t[row * GH + q * H + j] = Elem<T>::store(dah[q]);
                }
                hprev_t[row * H + j] = Elem<T>::store(hp);
                p.dhc[e] = direct;
                if (p.cell == FX_RNN_LSTM)
                    p.dcc[e] = dc;
            }
            __syncthreads();
        }
    }
}

} // namespace fx::cuda::rnn

#endif
