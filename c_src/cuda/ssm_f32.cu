// The selective scan's launchers and kernels for f32 inputs (ssm/launchers.cuh).
#include "cuda/ssm/launchers.cuh"

namespace fx::cuda::ssm {
FX_SSM_INSTANTIATION(, float)
} // namespace fx::cuda::ssm
