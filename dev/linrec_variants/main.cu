// dev/linrec_variants: the linrec forward kernels launched directly, several
// variants per case, each timed with device events after a spin (as
// dev/linrec_bench does) and checked against the first variant of its case
// (the kernel the backend uses). Add a variant: a launcher in launch.cuh (or
// an existing one with other template arguments) and a line in a k_*.cu
// file. Also: where h is written (pool, cudaMalloc, compressible memory)
// against time, for the L2 compression question.
//
//   make -f dev/Makefile build/linrec_variants   (GPU machine; links the CUDA driver)
//   build/linrec_variants [--reps N] [--cases 0,3]   timings
//   build/linrec_variants --ncu            one launch of each kernel worth profiling
//   build/linrec_variants --ncu-compress   one launch each of h written into pool,
//                                          cudaMalloc and compressible memory
//   ncu --section SpeedOfLight ... build/linrec_variants --ncu
#include <cuda.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fusex_linrec.h"
#include "variants.h"

#include "../cuda_check.h"
#include "../cuda_timing.cuh"

namespace {

struct bench_case {
    int kind, bf16;
    int64_t B, L, H;
    const char *label;
};

const bench_case cases[] = {
    {FX_LINREC_MINGRU, 0, 16, 1024, 1024, "mingru f32 B16 L1024 H1024"},
    {FX_LINREC_SCAN, 0, 16, 1024, 1024, "linear_scan f32 B16 L1024 H1024"},
    {FX_LINREC_SCAN, 0, 8, 2048, 1536, "linear_scan f32 B8 L2048 H1536"},
    {FX_LINREC_MINGRU, 0, 1, 65536, 256, "mingru f32 B1 L65536 H256"},
    {FX_LINREC_MINLSTM, 0, 16, 1024, 1024, "minlstm f32 B16 L1024 H1024"},
    {FX_LINREC_LIQUID, 0, 16, 1024, 1024, "liquid f32 B16 L1024 H1024"},
    {FX_LINREC_MINGRU, 1, 16, 1024, 1024, "mingru bf16 B16 L1024 H1024"},
};
constexpr int kCases = sizeof cases / sizeof cases[0];

int nseq(int kind) { return kind == FX_LINREC_MINLSTM ? 3 : kind == FX_LINREC_LIQUID ? 1 : 2; }

__device__ float hash_uniform(uint64_t i, uint32_t seed)
{
    uint64_t x = i * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (float)(x >> 40) / 16777216.f;
}

__global__ void fill(void *p, int bf16, int64_t n, float lo, float hi, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = lo + (hi - lo) * hash_uniform((uint64_t)i, seed);
        if (bf16)
            static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
        else
            static_cast<float *>(p)[i] = v;
    }
}

// Pure writes of n floats: pseudo-random values (incompressible, like h)
// or zeros (compressible).
__global__ void write_only(float4 *p, int64_t n4, int zeros)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = {0.f, 0.f, 0.f, 0.f};
        if (!zeros)
            v = {hash_uniform(4 * i, 7), hash_uniform(4 * i + 1, 7), hash_uniform(4 * i + 2, 7),
                 hash_uniform(4 * i + 3, 7)};
        __stcs(p + i, v);
    }
}

__global__ void diff_sums(const void *got, const void *want, int bf16, int64_t n, double *sums)
{
    double d = 0, r = 0;
    int nan = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g, w;
        if (bf16) {
            g = __bfloat162float(static_cast<const __nv_bfloat16 *>(got)[i]);
            w = __bfloat162float(static_cast<const __nv_bfloat16 *>(want)[i]);
        } else {
            g = static_cast<const float *>(got)[i];
            w = static_cast<const float *>(want)[i];
        }
        nan |= isnan(g) || isnan(w);
        d += (double)(g - w) * (g - w);
        r += (double)w * w;
    }
    atomicAdd(sums, d);
    atomicAdd(sums + 1, r);
    if (nan)
        atomicAdd(sums + 2, 1.0);
}

struct env {
    cudaStream_t stream;
    int sm_count;
    char *scratch;
    uint32_t epoch = 0;
    double *sums;
};

// Times `launch` (median of reps), after a 40 us busy-wait so that the
// launch is queued (dev/cuda_timing.cuh).
template <typename F> double time_us(env &E, int reps, F &&launch)
{
    return fx_time_us(E.stream, reps, 40000, [&](int) { launch(); });
}

double rel_l2(env &E, const void *got, const void *want, int bf16, int64_t n)
{
    CUDA_CHECK(cudaMemsetAsync(E.sums, 0, 3 * sizeof(double), E.stream));
    diff_sums<<<4 * E.sm_count, 256, 0, E.stream>>>(got, want, bf16, n, E.sums);
    double s[3];
    CUDA_CHECK(cudaMemcpyAsync(s, E.sums, sizeof s, cudaMemcpyDeviceToHost, E.stream));
    CUDA_CHECK(cudaStreamSynchronize(E.stream));
    return s[2] > 0 ? INFINITY : s[1] > 0 ? sqrt(s[0] / s[1]) : sqrt(s[0]);
}

struct buffers {
    void *seq[3], *h, *href, *tau, *lam;
    float *state;
};

void setup_case(env &E, const bench_case &c, buffers &b, lv_args &a)
{
    const int64_t n = c.B * c.L * c.H;
    for (int k = 0; k < nseq(c.kind); k++) {
        const bool scan_a = c.kind == FX_LINREC_SCAN && k == 0;
        fill<<<4 * E.sm_count, 256, 0, E.stream>>>(b.seq[k], c.bf16, n, scan_a ? 0.5f : -2.f, scan_a ? 1.f : 2.f,
                                                  17 + k);
    }
    fill<<<4, 256, 0, E.stream>>>(b.tau, c.bf16, c.H, 0.5f, 2.f, 5);
    fill<<<4, 256, 0, E.stream>>>(b.lam, c.bf16, c.H, -1.f, 1.f, 6);
    CUDA_CHECK(cudaStreamSynchronize(E.stream));
    memset(&a, 0, sizeof a);
    a.B = c.B;
    a.L = c.L;
    a.H = c.H;
    for (int k = 0; k < 3; k++)
        a.seq[k] = b.seq[k];
    a.tau = b.tau;
    a.lam = b.lam;
    a.dt_value = 0.5f;
    a.h = b.h;
    a.state = nullptr;
    a.scratch = E.scratch;
    a.sm_count = E.sm_count;
    a.stream = E.stream;
}

cudaError_t run(env &E, const lv_variant &v, lv_args &a, lv_info *info)
{
    a.epoch = ++E.epoch;
    return v.launch(a, info);
}

// ---- where h lives: pool, cudaMalloc, compressible (cuMemCreate) ----

// The driver's functions, through the runtime (no link against libcuda).
template <typename F> F driver_fn(const char *name)
{
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, CUDART_VERSION, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return nullptr;
    return (F)fn;
}
#define DRIVER(name) static const auto d_##name = driver_fn<decltype(&name)>(#name)

const char *comp_name(int t) { return t == CU_MEM_ALLOCATION_COMP_GENERIC ? "generic (compressible)" : t == 0 ? "none" : "?"; }

// What the driver says about an address: its allocation's compression type,
// where the allocation has a handle (pool and cuMemCreate memory).
void describe_allocation(const char *what, void *p)
{
    DRIVER(cuMemRetainAllocationHandle);
    DRIVER(cuMemGetAllocationPropertiesFromHandle);
    DRIVER(cuMemRelease);
    DRIVER(cuGetErrorString);
    if (!d_cuMemRetainAllocationHandle || !d_cuMemGetAllocationPropertiesFromHandle || !d_cuMemRelease ||
        !d_cuGetErrorString) {
        printf("  %-28s (driver entry points missing)\n", what);
        return;
    }
    CUmemGenericAllocationHandle h;
    CUresult r = d_cuMemRetainAllocationHandle(&h, p);
    if (r != CUDA_SUCCESS) {
        const char *s = "?";
        d_cuGetErrorString(r, &s);
        printf("  %-28s cuMemRetainAllocationHandle: %s (no handle to ask)\n", what, s);
        return;
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    r = d_cuMemGetAllocationPropertiesFromHandle(&prop, h);
    if (r == CUDA_SUCCESS)
        printf("  %-28s compression: %s\n", what, comp_name(prop.allocFlags.compressionType));
    else
        printf("  %-28s cuMemGetAllocationPropertiesFromHandle failed (%d)\n", what, (int)r);
    d_cuMemRelease(h);
}

void *alloc_compressible(size_t bytes, int dev)
{
    DRIVER(cuDeviceGetAttribute);
    DRIVER(cuMemGetAllocationGranularity);
    DRIVER(cuMemCreate);
    DRIVER(cuMemAddressReserve);
    DRIVER(cuMemMap);
    DRIVER(cuMemSetAccess);
    DRIVER(cuMemRelease);
    if (!d_cuDeviceGetAttribute || !d_cuMemGetAllocationGranularity || !d_cuMemCreate || !d_cuMemAddressReserve ||
        !d_cuMemMap || !d_cuMemSetAccess || !d_cuMemRelease)
        return nullptr;
    int supported = 0;
    d_cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev);
    printf("  device: generic compression supported = %d\n", supported);
    if (!supported)
        return nullptr;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    size_t gran = 0;
    if (d_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
        return nullptr;
    bytes = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    if (d_cuMemCreate(&h, bytes, &prop, 0) != CUDA_SUCCESS)
        return nullptr;
    CUdeviceptr ptr;
    if (d_cuMemAddressReserve(&ptr, bytes, 0, 0, 0) != CUDA_SUCCESS || d_cuMemMap(ptr, bytes, 0, h, 0) != CUDA_SUCCESS)
        return nullptr;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (d_cuMemSetAccess(ptr, bytes, &acc, 1) != CUDA_SUCCESS)
        return nullptr;
    d_cuMemRelease(h); // the mapping keeps it
    return (void *)ptr;
}

} // namespace

int main(int argc, char **argv)
{
    int reps = 30, ncu = 0, compress_only = 0;
    bool wanted[kCases];
    std::fill(wanted, wanted + kCases, true);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ncu"))
            ncu = 1;
        else if (!strcmp(argv[i], "--ncu-compress"))
            ncu = compress_only = 1;
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
            std::fill(wanted, wanted + kCases, false);
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(nullptr, ","))
                if (atoi(tok) >= 0 && atoi(tok) < kCases)
                    wanted[atoi(tok)] = true;
        }
    }
    env E;
    CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    E.sm_count = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreateWithFlags(&E.stream, cudaStreamNonBlocking));
    // The backend's allocator: the device's default pool, kept.
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    const size_t big = (size_t)8 * 2048 * 1536 * 4; // the largest case's f32 sequence
    buffers b;
    for (int k = 0; k < 3; k++)
        CUDA_CHECK(cudaMallocAsync(&b.seq[k], big, E.stream));
    CUDA_CHECK(cudaMallocAsync(&b.h, big, E.stream));
    CUDA_CHECK(cudaMallocAsync(&b.href, big, E.stream));
    CUDA_CHECK(cudaMallocAsync(&b.tau, 1 << 20, E.stream));
    CUDA_CHECK(cudaMallocAsync(&b.lam, 1 << 20, E.stream));
    CUDA_CHECK(cudaMallocAsync(&E.scratch, 64 << 20, E.stream));
    CUDA_CHECK(cudaMemsetAsync(E.scratch, 0, 64 << 20, E.stream));
    CUDA_CHECK(cudaMallocAsync(&E.sums, 64, E.stream));
    CUDA_CHECK(cudaStreamSynchronize(E.stream));

    std::vector<lv_variant> all;
    lv_register_mingru(all);
    lv_register_scan(all);
    lv_register_other(all);
    lv_register_plain(all);

    printf("device %s, %d SMs\n", prop.name, E.sm_count);
    double copy_bw = 0;
    if (!ncu) {
        const double us = time_us(E, reps, [&] {
            CUDA_CHECK(cudaMemcpyAsync(b.href, b.h, big, cudaMemcpyDeviceToDevice, E.stream));
        });
        copy_bw = 2.0 * big / (us * 1e3);
        printf("copy %zu MB: %.2f us, %.0f GB/s (read + write)\n\n", big >> 20, us, copy_bw);
        printf("%-32s %-30s %9s %7s %7s %9s %5s %5s %6s %6s %7s %6s\n", "case", "variant", "kernel us", "GB/s",
               "% copy", "rel-L2", "regs", "local", "per SM", "grid", "tiles", "ttile");
    }

    // The kernels a profile wants: main's on the target cases, and the
    // 16-channel tiles on the thin one.
    auto profiled = [&](int ci, const std::string &name) {
        if (compress_only)
            return false;
        if (ci == 0 || ci == 1)
            return name.find("(main)") != std::string::npos;
        if (ci == 3)
            return name == "staged8 (main)" || name == "staged8 w16";
        return false;
    };

    for (int ci = 0; ci < kCases; ci++) {
        if (!wanted[ci])
            continue;
        const bench_case &c = cases[ci];
        const int64_t n = c.B * c.L * c.H;
        const double bytes = (double)(nseq(c.kind) + 1) * n * (c.bf16 ? 2 : 4);
        lv_args a;
        setup_case(E, c, b, a);
        bool first = true;
        for (const lv_variant &v : all) {
            if (v.kind != c.kind || v.bf16 != c.bf16)
                continue;
            if (ncu && !profiled(ci, v.name))
                continue;
            {
                lv_info info = {};
                CUDA_CHECK(cudaMemsetAsync(b.h, 0xff, n * (c.bf16 ? 2 : 4), E.stream)); // NaN: unwritten fails
                cudaError_t err = run(E, v, a, &info);
                if (err == cudaSuccess)
                    err = cudaStreamSynchronize(E.stream);
                if (err != cudaSuccess) {
                    printf("%-32s %-30s launch failed: %s\n", c.label, v.name.c_str(), cudaGetErrorString(err));
                    exit(1);
                }
                if (ncu)
                    continue;
                double err_l2 = 0;
                if (first) {
                    CUDA_CHECK(cudaMemcpyAsync(b.href, b.h, n * (c.bf16 ? 2 : 4), cudaMemcpyDeviceToDevice, E.stream));
                    err_l2 = rel_l2(E, b.h, b.href, c.bf16, n); // NaN check
                } else {
                    err_l2 = rel_l2(E, b.h, b.href, c.bf16, n);
                }
                first = false;
                const double us = time_us(E, reps, [&] { CUDA_CHECK(run(E, v, a, nullptr)); });
                const double gbs = bytes / (us * 1e3);
                const std::string &name = v.name;
                printf("%-32s %-30s %9.2f %7.0f %7.1f %9.2e %5d %5d %6d %6u %7lld %6lld\n", c.label, name.c_str(), us,
                       gbs, 100 * gbs / copy_bw, err_l2, info.regs, info.local_bytes, info.per_sm, info.grid,
                       info.tiles, info.tiles / info.ttiles);
                fflush(stdout);
            }
        }
        if (!ncu)
            printf("\n");
    }

    // ---- where h is written: pool, cudaMalloc, compressible ----
    if (wanted[0] && (!ncu || compress_only)) {
        const bench_case &c = cases[0];
        const int64_t n = c.B * c.L * c.H;
        const size_t hbytes = (size_t)n * 4;
        printf("h of %s (%zu MB) written into:\n", c.label, hbytes >> 20);
        void *h_malloc = nullptr, *h_comp = nullptr;
        CUDA_CHECK(cudaMalloc(&h_malloc, hbytes));
        h_comp = alloc_compressible(hbytes, 0);
        describe_allocation("pool (cudaMallocAsync)", b.h);
        describe_allocation("cudaMalloc", h_malloc);
        if (h_comp)
            describe_allocation("cuMemCreate COMP_GENERIC", h_comp);
        lv_args a;
        setup_case(E, c, b, a);
        const lv_variant *main_v = nullptr;
        for (const lv_variant &v : all)
            if (v.kind == c.kind && !v.bf16 && v.name == "staged8 (main)")
                main_v = &v;
        struct target {
            const char *name;
            void *p;
        } targets[] = {{"pool", b.h}, {"cudaMalloc", h_malloc}, {"compressible", h_comp}};
        for (const target &tg : targets) {
            if (!tg.p)
                continue;
            a.h = tg.p;
            const int64_t n4 = n / 4;
            if (ncu) {
                CUDA_CHECK(run(E, *main_v, a, nullptr));
                write_only<<<4 * E.sm_count, 256, 0, E.stream>>>((float4 *)tg.p, n4, 0);
                write_only<<<4 * E.sm_count, 256, 0, E.stream>>>((float4 *)tg.p, n4, 1);
                CUDA_CHECK(cudaStreamSynchronize(E.stream));
                continue;
            }
            const double t_main = time_us(E, reps, [&] { CUDA_CHECK(run(E, *main_v, a, nullptr)); });
            const double t_rand = time_us(E, reps, [&] {
                write_only<<<4 * E.sm_count, 256, 0, E.stream>>>((float4 *)tg.p, n4, 0);
            });
            const double t_zero = time_us(E, reps, [&] {
                write_only<<<4 * E.sm_count, 256, 0, E.stream>>>((float4 *)tg.p, n4, 1);
            });
            printf("  %-14s mingru %s %.2f us; write-only %zu MB: random %.2f us (%.0f GB/s), zeros %.2f us "
                   "(%.0f GB/s)\n",
                   tg.name, main_v->name.c_str(), t_main, hbytes >> 20, t_rand, hbytes / (t_rand * 1e3), t_zero,
                   hbytes / (t_zero * 1e3));
        }
        CUDA_CHECK(cudaFree(h_malloc));
    }
    CUDA_CHECK(cudaStreamSynchronize(E.stream));
    printf("done\n");
    return 0;
}
