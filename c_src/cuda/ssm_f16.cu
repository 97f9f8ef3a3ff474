// The selective scan's launchers and kernels for f16 inputs (ssm/launchers.cuh).
#include "cuda/ssm/launchers.cuh"

namespace fx::cuda::ssm {
FX_SSM_INSTANTIATION(, __half)
} // namespace fx::cuda::ssm
