// The norms' launchers and kernels for bf16 inputs (norm/launchers.cuh).
#include "cuda/norm/launchers.cuh"

namespace fx::cuda::norm {
FX_NORM_INSTANTIATION(, __nv_bfloat16)
} // namespace fx::cuda::norm
