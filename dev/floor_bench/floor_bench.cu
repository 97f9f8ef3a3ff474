// What the memory of this GPU allows for the linear recurrences' byte
// patterns, and a prototype of the streaming forward that moves its rows
// with the bulk-copy engine (TMA, sm_90) instead of per-lane cp.async and
// per-step stores. Standalone (no library), timed as dev/linrec_bench
// times the library: device events around one launch after a busy-wait,
// median of `reps`. On the GPU machine (dev/floor_bench/run.sh also runs
// the library's kernels on the same shapes and ncu):
//
//   make -f dev/Makefile build/floor_bench && build/floor_bench [reps]
//
// Rows:
//   ftz check      sigmoid and softplus from ftz exps against __expf /
//                  __logf on 2^30 inputs: how many differ in any bit
//   empty          a 1-thread kernel: the event method's own cost
//   memcpy         cudaMemcpyAsync device to device, 2 arrays' bytes
//   copy4 / add4   float4 elementwise 1R1W / 2R1W, U float4 per thread,
//                  every load before the first store: the floor of a
//                  pass that reads its inputs and writes its output once
//   column walk    out = a + b in the streaming scans' order (a warp per
//                  column of 128 B or 512 B of one batch element, rows in
//                  order), the rows split among 1, 4 or 16 warps: what the
//                  order of the accesses costs, apart from the recurrence
//   lockstep walk  the same walk with a block's W warps side by side on one
//                  row (W * 128 contiguous bytes) and a block barrier every
//                  8 rows: whether reading a row's pieces together is what
//                  the order lacks
//   two passes     a wave of rows read twice (a reduction, then out = a + b),
//                  wave after wave: what a two-pass scan moves when a wave's
//                  inputs fit L2 (the second read hits it), launch gaps in
//   bulk scan/mingru  the prototype: a warp per 128-byte column walking
//                  the sequence; rows arrive by cp.async.bulk (one copy a
//                  row, a lane a row, an mbarrier a stage) and h leaves
//                  through shared memory by bulk stores (a lane a row)
// Every prototype result is checked against a host recurrence.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "cuda/linrec/plan.cuh" // the gates the ftz check compares, the prototype's step
#include "cuda/sfu.cuh"
#include "cuda_check.h"
#include "cuda_timing.cuh"

// ---- timing ----

__global__ void empty_kernel() {}

// The busy-wait before each timed launch: long enough for the host to
// enqueue everything a timed call launches (the waves: up to ~70 kernels).
static unsigned long long g_busy_ns = 100000;

// On the default stream (every launch below uses it).
template <typename F> static double time_us(int reps, F &&launch) { return fx_time_us(0, reps, g_busy_ns, launch); }

// ---- elementwise floors ----

struct Shape {
    const char *name;
    int B, L, H;
};

// One table row: what ran, on which shape, how, its median and the bytes
// it moved over that time (and over the copy bandwidth measured first).
static void report(const char *kernel, const Shape &s, const char *variant, double us, double bytes, double copy_gbs)
{
    printf("%-22s %-18s %-20s %9.2f %8.0f %6.1f\n", kernel, s.name, variant, us, bytes / us / 1e3,
           100 * bytes / us / 1e3 / copy_gbs);
}

// The bytes of a pass that reads two [B, L, H] f32 tensors and writes one.
static double bytes_2r1w(const Shape &s) { return 3.0 * s.B * s.L * s.H * 4; }

template <int U, int NIN>
__global__ void __launch_bounds__(256) elementwise4(const float4 *__restrict__ a, const float4 *__restrict__ b,
                                                    float4 *__restrict__ out, int64_t n4)
{
    const int64_t base = (int64_t)blockIdx.x * 256 * U + threadIdx.x;
    float4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t i = base + u * 256;
        if (i < n4) {
            x[u] = __ldcs(a + i);
            if (NIN == 2)
                y[u] = __ldcs(b + i);
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t i = base + u * 256;
        if (i < n4) {
            float4 r = x[u];
            if (NIN == 2)
                r.x += y[u].x, r.y += y[u].y, r.z += y[u].z, r.w += y[u].w;
            __stcs(out + i, r);
        }
    }
}

// ---- the scans' access order without a recurrence ----

// out = a + b walked as the streaming scan walks it: a warp owns a column of
// 32 * VEC floats of one batch element and goes through its rows in order,
// UNROLL rows' loads in flight before their stores; SEGS splits each column's
// rows into that many independent warps (no carry: only the order of the
// accesses is measured, with more or fewer warps).
template <int VEC, int SEGS>
__global__ void __launch_bounds__(64) column_walk(const float *__restrict__ in0, const float *__restrict__ in1,
                                                  float *__restrict__ out, int batch, int seqlen, int hidden)
{
    constexpr int UNROLL = 8;
    typedef typename std::conditional<VEC == 4, float4, float>::type V;
    const int lane = threadIdx.x & 31;
    const int columns = hidden / (32 * VEC);
    const int64_t warp = (int64_t)blockIdx.x * 2 + (threadIdx.x >> 5);
    if (warp >= (int64_t)batch * columns * SEGS)
        return;
    const int64_t seg = warp % SEGS, column = warp / SEGS;
    const int64_t b = column / columns, ch = (column % columns) * 32 * VEC + lane * VEC;
    const int rows = seqlen / SEGS, t0 = (int)seg * rows;
    const int64_t stride = hidden / VEC; // in V
    const int64_t base = ((b * seqlen + t0) * hidden + ch) / VEC;
    const V *a = reinterpret_cast<const V *>(in0) + base, *c = reinterpret_cast<const V *>(in1) + base;
    V *o = reinterpret_cast<V *>(out) + base;
    for (int t = 0; t < rows; t += UNROLL) {
        V x[UNROLL], y[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            x[u] = __ldcs(a + (t + u) * stride), y[u] = __ldcs(c + (t + u) * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if constexpr (VEC == 4)
                x[u].x += y[u].x, x[u].y += y[u].y, x[u].z += y[u].z, x[u].w += y[u].w;
            else
                x[u] += y[u];
            __stcs(o + (t + u) * stride, x[u]);
        }
    }
}

// The same walk with the W warps of a block side by side on one batch
// element's row (W * 128 contiguous bytes of it) and a block barrier every
// UNROLL rows, so that they read and write their row's pieces together.
template <int W, int SEGS>
__global__ void __launch_bounds__(32 * W) column_walk_lockstep(const float *__restrict__ in0,
                                                              const float *__restrict__ in1,
                                                              float *__restrict__ out, int batch, int seqlen,
                                                              int hidden)
{
    constexpr int UNROLL = 8;
    const int groups = hidden / (32 * W); // blocks across a row
    const int64_t blk = blockIdx.x;
    const int64_t seg = blk % SEGS, rest = blk / SEGS, b = rest / groups;
    const int64_t ch = (rest % groups) * 32 * W + threadIdx.x;
    if (b >= batch)
        return; // a whole block
    const int rows = seqlen / SEGS, t0 = (int)seg * rows;
    const int64_t base = (b * seqlen + t0) * hidden + ch;
    const float *a = in0 + base, *c = in1 + base;
    float *o = out + base;
    for (int t = 0; t < rows; t += UNROLL) {
        float x[UNROLL], y[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            x[u] = __ldcs(a + (int64_t)(t + u) * hidden), y[u] = __ldcs(c + (int64_t)(t + u) * hidden);
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            __stcs(o + (int64_t)(t + u) * hidden, x[u] + y[u]);
        __syncthreads();
    }
}

template <int W, int SEGS>
static void run_lockstep(const Shape &s, float *const *in0, float *const *in1, float *const *out, int sets, int reps,
                         double copy_gbs)
{
    if (s.H % (32 * W))
        return;
    const unsigned grid = (unsigned)((int64_t)s.B * (s.H / (32 * W)) * SEGS);
    const double us = time_us(reps, [&](int i) {
        const int k = i % sets;
        column_walk_lockstep<W, SEGS><<<grid, 32 * W>>>(in0[k], in1[k], out[k], s.B, s.L, s.H);
    });
    char variant[64];
    snprintf(variant, sizeof variant, "%dB x %d seg %lld w", 128 * W, SEGS, (long long)grid * W);
    report("lockstep walk (2R1W)", s, variant, us, bytes_2r1w(s), copy_gbs);
}

template <int VEC, int SEGS>
static void run_walk(const Shape &s, float *const *in0, float *const *in1, float *const *out, int sets, int reps,
                     double copy_gbs)
{
    const int64_t warps = (int64_t)s.B * (s.H / (32 * VEC)) * SEGS;
    const unsigned grid = (unsigned)((warps + 1) / 2);
    const double us = time_us(reps, [&](int i) {
        const int k = i % sets;
        column_walk<VEC, SEGS><<<grid, 64>>>(in0[k], in1[k], out[k], s.B, s.L, s.H);
    });
    char variant[64];
    snprintf(variant, sizeof variant, "%dB x %d seg %lld w", 128 * VEC, SEGS, (long long)warps);
    report("column walk (2R1W)", s, variant, us, bytes_2r1w(s), copy_gbs);
}

// ---- two passes through L2, a wave of rows at a time ----

// What a two-pass scan of a long, thin sequence would move: pass 1 reads a
// wave of rows of both inputs (default caching: they stay in L2) and reduces
// them (one float a block); pass 2 reads the same rows again and writes the
// output. Waves run one after the other on one stream, so pass 2 of a wave
// finds its inputs in L2 when a wave's inputs fit there.
__global__ void __launch_bounds__(256) wave_reduce(const float4 *__restrict__ a, const float4 *__restrict__ b,
                                                   float *__restrict__ sums, int64_t n4)
{
    float acc = 0.f;
    for (int64_t i = blockIdx.x * 256 + threadIdx.x; i < n4; i += (int64_t)gridDim.x * 256) {
        const float4 x = a[i], y = b[i];
        acc += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 16);
    acc += __shfl_xor_sync(0xffffffffu, acc, 8);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if ((threadIdx.x & 31) == 0)
        atomicAdd(sums + blockIdx.x, acc);
}

__global__ void __launch_bounds__(256) wave_apply(const float4 *__restrict__ a, const float4 *__restrict__ b,
                                                  float4 *__restrict__ out, int64_t n4)
{
    for (int64_t i = blockIdx.x * 256 + threadIdx.x; i < n4; i += (int64_t)gridDim.x * 256) {
        const float4 x = __ldcs(a + i), y = __ldcs(b + i);
        __stcs(out + i, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
    }
}

static void run_waves(const Shape &s, int wave_mb, float *const *in0, float *const *in1, float *const *out,
                      int sets, int reps, double copy_gbs, int sms)
{
    const int64_t n4 = (int64_t)s.B * s.L * s.H / 4;
    const int64_t wave4 = std::min<int64_t>(n4, ((int64_t)wave_mb << 20) / 32); // both inputs' bytes
    const unsigned grid = 4u * sms;
    float *sums;
    CUDA_CHECK(cudaMalloc(&sums, grid * sizeof(float)));
    const double us = time_us(reps, [&](int i) {
        const int k = i % sets;
        const float4 *a = (const float4 *)in0[k], *b = (const float4 *)in1[k];
        float4 *o = (float4 *)out[k];
        for (int64_t w = 0; w < n4; w += wave4) {
            const int64_t n = std::min(wave4, n4 - w);
            wave_reduce<<<grid, 256>>>(a + w, b + w, sums, n);
            wave_apply<<<grid, 256>>>(a + w, b + w, o + w, n);
        }
    });
    CUDA_CHECK(cudaFree(sums));
    char variant[64];
    snprintf(variant, sizeof variant, "%d MB waves, %lld x 2", wave_mb, (long long)((n4 + wave4 - 1) / wave4));
    report("two passes by waves", s, variant, us, bytes_2r1w(s), copy_gbs);
}

// ---- the bulk-copy streaming prototype ----

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

__device__ __forceinline__ void bulk_store(void *dst, const void *src, unsigned bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

enum { SCAN = FX_LINREC_SCAN, MINGRU = FX_LINREC_MINGRU };

// The library's own step, as its streaming forward takes it.
template <int KIND> __device__ __forceinline__ float step(float h, float x0, float x1)
{
    const float xs[3] = {x0, x1, 0.f};
    return fx::cuda::linrec::advance<KIND, false>(xs, fx::cuda::linrec::Chan{}, 0.f, h);
}

constexpr int kWarps = 2;  // a block: independent warps side by side
constexpr int kSteps = 16; // rows of a stage: lanes 0..15 copy input 0's, 16..31 input 1's

template <int STAGES, int OUTB> struct BulkSmem {
    static constexpr int RING = STAGES * 2 * kSteps * 32; // floats: [stage][input][step][lane]
    static constexpr int OUT = OUTB * kSteps * 32;        // floats: [buffer][step][lane]
    static constexpr size_t WARP_BYTES = (RING + OUT) * 4 + STAGES * 8;
};

// hidden % 32 == 0 (whole 128-byte columns), 16-byte aligned rows.
template <int KIND, int STAGES, int OUTB>
__global__ void __launch_bounds__(32 * kWarps) stream_bulk(const float *__restrict__ in0, const float *__restrict__ in1,
                                                           float *__restrict__ out, int batch, int seqlen, int hidden)
{
    typedef BulkSmem<STAGES, OUTB> S;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int columns = hidden / 32;
    const int64_t column = (int64_t)blockIdx.x * kWarps + warp;
    if (column >= (int64_t)batch * columns)
        return;
    unsigned char *mine = smem_raw + warp * S::WARP_BYTES;
    float *ring = reinterpret_cast<float *>(mine), *obuf = ring + S::RING;
    uint64_t *bars = reinterpret_cast<uint64_t *>(obuf + S::OUT);
    if (lane == 0) {
        for (int s = 0; s < STAGES; s++)
            mbar_init(&bars[s], 1);
        fence_mbar_init();
    }
    __syncwarp();

    const int64_t b = column / columns, ch0 = (column % columns) * 32;
    const int row = lane % kSteps, seq = lane / kSteps;
    const int64_t stage_stride = (int64_t)kSteps * hidden;
    const float *src = (seq ? in1 : in0) + (b * seqlen + row) * hidden + ch0;
    float *dst = out + (b * seqlen + row) * hidden + ch0;
    const int stages = (seqlen + kSteps - 1) / kSteps;

    auto issue = [&](int st) {
        if (st < stages) {
            const int slot = st % STAGES, rows = min(kSteps, seqlen - st * kSteps);
            if (lane == 0)
                mbar_arrive_expect_tx(&bars[slot], 2u * rows * 128u);
            __syncwarp();
            if (row < rows)
                bulk_load(ring + ((slot * 2 + seq) * kSteps + row) * 32, src, 128, &bars[slot]);
            src += stage_stride;
        }
    };
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++)
        issue(st);

    float h = 0.f;
    for (int st = 0; st < stages; st++) {
        const int slot = st % STAGES;
        mbar_wait(&bars[slot], (st / STAGES) & 1);
        float x0[kSteps], x1[kSteps];
        const float *r = ring + slot * 2 * kSteps * 32 + lane;
#pragma unroll
        for (int j = 0; j < kSteps; j++)
            x0[j] = r[j * 32], x1[j] = r[(kSteps + j) * 32];
        __syncwarp(); // slot st - 1 is read by all: refill it
        issue(st + STAGES - 1);
        const int ob = st % OUTB;
        if (st >= OUTB) {
            bulk_wait_read<OUTB - 1>(); // this lane's store of stage st - OUTB has read its buffer
            __syncwarp();
        }
        float *o = obuf + ob * kSteps * 32 + lane;
        const int rows = min(kSteps, seqlen - st * kSteps);
        if (rows == kSteps) {
#pragma unroll
            for (int j = 0; j < kSteps; j++)
                h = step<KIND>(h, x0[j], x1[j]), o[j * 32] = h;
        } else {
            for (int j = 0; j < rows; j++)
                h = step<KIND>(h, x0[j], x1[j]), o[j * 32] = h;
        }
        fence_proxy_async(); // the generic stores above, before the bulk engine reads them
        __syncwarp();
        if (lane < rows)
            bulk_store(dst, obuf + (ob * kSteps + lane) * 32, 128);
        bulk_commit();
        dst += stage_stride;
    }
    bulk_wait_all();
}

// ---- the gates' exps with and without ftz (c_src/cuda/sfu.cuh) ----

// The linrec kernels' sigmoid and softplus (ftz SFU ops) against the same
// formulas from __expf / __logf (non-ftz); counts inputs whose bits differ.
__global__ void ftz_check(float lo, float step, int64_t n, unsigned long long *diffs)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = lo + step * (float)i;
        float sig, neg;
        fx::cuda::linrec::sigmoid2(x, sig, neg);
        const float sp = fx::cuda::linrec::softplus(x);
        const float sig_ref = fx::cuda::fast_rcp(1.f + __expf(-x));
        const float sp_ref = fmaxf(x, 0.f) + __logf(1.f + __expf(-fabsf(x)));
        if (__float_as_uint(sig) != __float_as_uint(sig_ref) || __float_as_uint(sp) != __float_as_uint(sp_ref))
            atomicAdd(diffs, 1ull);
    }
}

static void run_ftz_check()
{
    unsigned long long *d, h = 0;
    CUDA_CHECK(cudaMalloc(&d, sizeof h));
    CUDA_CHECK(cudaMemset(d, 0, sizeof h));
    const int64_t n = (int64_t)1 << 30; // [-200, 200) in steps of 400 / 2^30
    ftz_check<<<4096, 256>>>(-200.f, 400.f / (float)n, n, d);
    CUDA_CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    printf("ftz check: %llu of %lld inputs in [-200, 200) give other bits with ftz exps %s\n", h, (long long)n,
           h ? "FAILED" : "ok");
    CUDA_CHECK(cudaFree(d));
}

// ---- driver ----

static void check_prototype(int kind, const Shape &s, const float *d0, const float *d1, const float *dout)
{
    // column 0 and the last column of batch 0 and the last batch, every step
    const size_t n = (size_t)s.B * s.L * s.H;
    std::vector<float> a(n), b(n), o(n);
    CUDA_CHECK(cudaMemcpy(a.data(), d0, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(b.data(), d1, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(o.data(), dout, n * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    const int bs[2] = {0, s.B - 1};
    for (int bi = 0; bi < 2; bi++)
        for (int ch = 0; ch < s.H; ch += s.H - 1) {
            double h = 0;
            for (int t = 0; t < s.L; t++) {
                const size_t i = ((size_t)bs[bi] * s.L + t) * s.H + ch;
                if (kind == SCAN) {
                    h = a[i] * h + b[i];
                } else {
                    const double z = 1.0 / (1.0 + std::exp(-(double)a[i]));
                    h = (1 - z) * h + z * b[i];
                }
                num += (o[i] - h) * (o[i] - h);
                den += h * h;
            }
        }
    const double rel = std::sqrt(num / den);
    printf("   check %s %s: rel-L2 %.2e %s\n", kind == SCAN ? "scan" : "mingru", s.name, rel,
           rel <= 1e-5 ? "ok" : "FAILED");
    if (!(rel <= 1e-5))
        exit(1);
}

template <int KIND, int STAGES, int OUTB>
static void run_bulk(const Shape &s, float *const *in0, float *const *in1, float *const *out, int sets, int reps,
                     double copy_gbs)
{
    typedef BulkSmem<STAGES, OUTB> S;
    const size_t smem = kWarps * S::WARP_BYTES;
    auto kern = stream_bulk<KIND, STAGES, OUTB>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t warps = (int64_t)s.B * (s.H / 32);
    const unsigned grid = (unsigned)((warps + kWarps - 1) / kWarps);
    // poison the outputs first so that an unwritten row fails the check
    const size_t n = (size_t)s.B * s.L * s.H;
    CUDA_CHECK(cudaMemset(out[0], 0xff, n * 4));
    kern<<<grid, 32 * kWarps, smem>>>(in0[0], in1[0], out[0], s.B, s.L, s.H);
    CUDA_CHECK(cudaDeviceSynchronize());
    check_prototype(KIND, s, in0[0], in1[0], out[0]);
    const double us = time_us(reps, [&](int i) {
        const int k = i % sets;
        kern<<<grid, 32 * kWarps, smem>>>(in0[k], in1[k], out[k], s.B, s.L, s.H);
    });
    char variant[64];
    snprintf(variant, sizeof variant, "%d x %d stages", STAGES, OUTB);
    report(KIND == SCAN ? "bulk scan" : "bulk mingru", s, variant, us, bytes_2r1w(s), copy_gbs);
}

template <int U, int NIN>
static void run_elementwise(const Shape &s, float *const *in0, float *const *in1, float *const *out, int sets,
                            int reps, double copy_gbs)
{
    const int64_t n4 = (int64_t)s.B * s.L * s.H / 4;
    const unsigned grid = (unsigned)((n4 + 256 * U - 1) / (256 * U));
    const double us = time_us(reps, [&](int i) {
        const int k = i % sets;
        elementwise4<U, NIN><<<grid, 256>>>((const float4 *)in0[k], (const float4 *)in1[k], (float4 *)out[k], n4);
    });
    char variant[64];
    snprintf(variant, sizeof variant, "U=%d", U);
    report(NIN == 2 ? "add4 (2R1W)" : "copy4 (1R1W)", s, variant, us, (NIN + 1.0) * n4 * 16, copy_gbs);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    const Shape shapes[] = {{"B16 L1024 H1024", 16, 1024, 1024},
                            {"B8 L2048 H1536", 8, 2048, 1536},
                            {"B1 L65536 H256", 1, 65536, 256}};
    const int sets = 2; // inputs alternate between two sets
    size_t max_n = 0;
    for (const Shape &s : shapes)
        max_n = std::max(max_n, (size_t)s.B * s.L * s.H);
    float *in0[sets], *in1[sets], *out[sets];
    std::vector<float> host(max_n);
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int k = 0; k < sets; k++) {
        CUDA_CHECK(cudaMalloc(&in0[k], max_n * 4));
        CUDA_CHECK(cudaMalloc(&in1[k], max_n * 4));
        CUDA_CHECK(cudaMalloc(&out[k], max_n * 4));
        for (int which = 0; which < 2; which++) {
            for (auto &v : host) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                const float u = (float)((rng >> 40) * (1.0 / 16777216.0));
                // a in [0.5, 1) for the scan (also a fine logit), b in [-2, 2)
                v = which == 0 ? 0.5f + 0.5f * u : -2.0f + 4.0f * u;
            }
            CUDA_CHECK(cudaMemcpy(which ? in1[k] : in0[k], host.data(), max_n * 4, cudaMemcpyHostToDevice));
        }
    }

    run_ftz_check();
    const double empty = time_us(reps, [&](int) { empty_kernel<<<1, 1>>>(); });
    const size_t copy_bytes = max_n * 4; // the largest array
    const double memcpy_us = time_us(reps, [&](int i) {
        CUDA_CHECK(cudaMemcpyAsync(out[i % sets], in0[i % sets], copy_bytes, cudaMemcpyDeviceToDevice));
    });
    const double copy_gbs = 2.0 * copy_bytes / memcpy_us / 1e3;
    printf("empty kernel %.2f us; cudaMemcpy %.0f MB %.2f us = %.0f GB/s read + write\n\n", empty, copy_bytes / 1e6,
           memcpy_us, copy_gbs);
    printf("%-22s %-18s %-20s %9s %8s %6s\n", "kernel", "shape", "variant", "median us", "GB/s", "% copy");
    for (const Shape &s : shapes) {
        run_elementwise<1, 1>(s, in0, in1, out, sets, reps, copy_gbs);
        run_elementwise<4, 1>(s, in0, in1, out, sets, reps, copy_gbs);
        run_elementwise<1, 2>(s, in0, in1, out, sets, reps, copy_gbs);
        run_elementwise<2, 2>(s, in0, in1, out, sets, reps, copy_gbs);
        run_elementwise<4, 2>(s, in0, in1, out, sets, reps, copy_gbs);
        g_busy_ns = 1000000;
        for (int mb : {4, 8, 16, 32, 256})
            run_waves(s, mb, in0, in1, out, sets, reps, copy_gbs, prop.multiProcessorCount);
        g_busy_ns = 100000;
        run_lockstep<2, 16>(s, in0, in1, out, sets, reps, copy_gbs);
        run_lockstep<8, 4>(s, in0, in1, out, sets, reps, copy_gbs);
        run_lockstep<8, 16>(s, in0, in1, out, sets, reps, copy_gbs);
        run_lockstep<12, 16>(s, in0, in1, out, sets, reps, copy_gbs);
        run_lockstep<32, 16>(s, in0, in1, out, sets, reps, copy_gbs);
        run_walk<1, 1>(s, in0, in1, out, sets, reps, copy_gbs);
        run_walk<1, 4>(s, in0, in1, out, sets, reps, copy_gbs);
        run_walk<1, 16>(s, in0, in1, out, sets, reps, copy_gbs);
        run_walk<4, 1>(s, in0, in1, out, sets, reps, copy_gbs);
        run_walk<4, 4>(s, in0, in1, out, sets, reps, copy_gbs);
        run_walk<4, 16>(s, in0, in1, out, sets, reps, copy_gbs);
        if ((int64_t)s.B * (s.H / 32) >= 2 * prop.multiProcessorCount) { // a streaming shape
            run_bulk<SCAN, 6, 2>(s, in0, in1, out, sets, reps, copy_gbs);
            run_bulk<SCAN, 10, 2>(s, in0, in1, out, sets, reps, copy_gbs);
            run_bulk<MINGRU, 6, 2>(s, in0, in1, out, sets, reps, copy_gbs);
            run_bulk<MINGRU, 10, 2>(s, in0, in1, out, sets, reps, copy_gbs);
        }
        printf("\n");
    }
    return 0;
}
