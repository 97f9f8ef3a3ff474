// The norms' launchers and kernels for f32 inputs (norm/launchers.cuh).
#include "cuda/norm/launchers.cuh"

namespace fx::cuda::norm {
FX_NORM_INSTANTIATION(, float)
} // namespace fx::cuda::norm
