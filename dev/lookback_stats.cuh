// Look-back statistics of the linrec tiled kernels, for a diagnostic build
// of the CUDA backend (never the shipped one):
//
//   make nif NVCC="nvcc -include dev/lookback_stats.cuh"
//
// Every chained launch then prints, from the device, how many of its tiles
// were chained, how many found their carry by the peek, how many look-back
// rounds ran and how many of them found nothing new, and clears the
// counts. It defines the hooks cuda/scan.cuh (FX_SCAN_EVENT) and
// cuda/linrec/launchers.cuh (FX_SCAN_LAUNCHED) leave empty. The counts are
// one set per compilation unit (each linrec_<type>.cu has its own), and
// thread 0 of each block counts for its block.
#ifndef FX_DEV_LOOKBACK_STATS_CUH
#define FX_DEV_LOOKBACK_STATS_CUH

#include <stdio.h>

namespace fx::dev {

static __device__ unsigned long long lookback_counts[4]; // scan.cuh's kEvent* order

template <int = 0> __global__ void print_lookback_counts(unsigned blocks)
{
    unsigned long long *s = lookback_counts;
    printf("lookback stats: %u tiles, %llu chained, %llu peek hits, %llu rounds, %llu empty rounds\n", blocks, s[0],
           s[1], s[2], s[3]);
    s[0] = s[1] = s[2] = s[3] = 0;
}

} // namespace fx::dev

#define FX_SCAN_EVENT(event) \
    (threadIdx.x == 0 ? (void)atomicAdd(&fx::dev::lookback_counts[(event)], 1ull) : (void)0)
#define FX_SCAN_LAUNCHED(run, blocks) fx::dev::print_lookback_counts<><<<1, 1, 0, (run).stream>>>((unsigned)(blocks))

#endif
