// Gradients reduced over batch, time, channels or blocks (the selective
// scan's da, db, dc, dd, ddt_bias; the linear recurrences' dtau, dA and dt) are
// written by the kernels as rows of partial sums in f32 scratch, one row
// per block (or per batch row, per channel tile: whatever adds into one
// element from different blocks), each element of a row written by one
// thread with a plain store. write_sums then adds the rows in row order
// and writes the callers' tensors, of any float type. No float atomics
// into a sum: their order, and so the rounding, would follow the blocks'
// scheduling, and a run would not replay bit for bit (test/c/test_replay.c).
// One launch writes them all: a launch per gradient cost 1.2-2 us of GPU
// time each on an H200, more than the writing itself (bench/RESULTS.md).
#ifndef FX_CUDA_SUMS_CUH
#define FX_CUDA_SUMS_CUH

#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace fx::cuda {

// dst[i] = the sum of the `parts` rows of n floats of src at i, i < n,
// row 0 first (f64: a row count may be in the thousands).
struct SumRegion {
    const float *src;
    void *dst;
    int64_t n, parts;
    int type; // dst's fx_dtype
};

struct SumRegions {
    static constexpr int kMax = 5;
    SumRegion r[kMax];
    int count;
    int64_t total; // elements over all regions

    // A gradient not asked for (dst NULL) or empty adds nothing.
    void add(const float *src, const fx_tensor *dst, int64_t n, int64_t parts)
    {
        if (!dst || n == 0)
            return;
        r[count++] = SumRegion{src, dst->data, n, parts, (int)dst->dtype};
        total += n;
    }
};

// One grid-stride loop over the regions laid end to end; the region of an
// index is found by a walk over at most kMax (unrolled, so the parameters
// are read at constant offsets). A template only so that every file that
// launches it may hold a copy (a __global__ function cannot be inline).
template <int = 0> __global__ void write_sums(const SumRegions s)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < s.total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = i;
#pragma unroll
        for (int k = 0; k < SumRegions::kMax; k++) {
            if (k < s.count && j < s.r[k].n) {
                const SumRegion &r = s.r[k];
                double sum = 0.0;
                for (int64_t q = 0; q < r.parts; q++)
                    sum += r.src[q * r.n + j];
                store_any(r.dst, r.type, j, (float)sum);
                break;
            }
            j -= s.r[k].n;
        }
    }
}

static inline int launch_sums(const Run &r, const SumRegions &s, const char *what, fx_status *st)
{
    if (s.total == 0)
        return FX_OK;
    return launch<write_sums<>>(r, grid_for(r.d, s.total, 256), 256, what, st, s);
}

} // namespace fx::cuda

#endif
