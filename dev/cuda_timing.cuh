// Kernel timing for the GPU tools (dev/floor_bench, dev/linrec_variants),
// as dev/linrec_bench times the library: a busy-wait kernel first, so
// that the host has queued the timed launch before it starts, then device
// events around the launch; one warm-up launch, the median of `reps`.
#ifndef FX_TOOLS_CUDA_TIMING_CUH
#define FX_TOOLS_CUDA_TIMING_CUH

#include <algorithm>
#include <vector>

#include "cuda_check.h"

static __global__ void fx_busy_wait(unsigned long long ns)
{
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 >= ns)
            break;
    }
}

static inline double fx_median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// `launch(i)` enqueues run i on `stream` (i: which input set to rotate to).
// busy_ns must cover the host's enqueue of everything launch(i) does.
template <typename F>
static double fx_time_us(cudaStream_t stream, int reps, unsigned long long busy_ns, F &&launch)
{
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    launch(0);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> t;
    for (int i = 0; i < reps; i++) {
        fx_busy_wait<<<1, 1, 0, stream>>>(busy_ns);
        CUDA_CHECK(cudaEventRecord(e0, stream));
        launch(i);
        CUDA_CHECK(cudaEventRecord(e1, stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1e3);
    }
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return fx_median(t);
}

#endif
