// The norms' launchers and kernels for f16 inputs (norm/launchers.cuh).
#include "cuda/norm/launchers.cuh"

namespace fx::cuda::norm {
FX_NORM_INSTANTIATION(, __half)
} // namespace fx::cuda::norm
