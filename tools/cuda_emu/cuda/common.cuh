// Stands in for c_src/cuda/common.cuh when tools/cuda_emu compiles the
// kernels for the CPU: f32 element traits, the f32 store of reduced sums and
// the device record.
#ifndef FX_CUDA_COMMON_CUH
#define FX_CUDA_COMMON_CUH

#include <cstdlib>

#include "emu.h"
#include "fusex.h"

#define FX_CUDA_MAX_DEVICES 16

struct fx_cuda_device {
    int sm_count;
};

template <typename T> struct fx_elem {
    typedef T math;
    static T load(T v) { return v; }
    static T store(T v) { return v; }
};

// The emulated linrec kernels are f32 only.
inline void fx_store_any(void *p, int type, int64_t i, float v)
{
    if (type != FX_F32)
        abort();
    static_cast<float *>(p)[i] = v;
}

#endif
