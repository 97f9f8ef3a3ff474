// The selective scan's launchers and kernels for bf16 inputs (ssm/launchers.cuh).
#include "cuda/ssm/launchers.cuh"

namespace fx::cuda::ssm {
FX_SSM_INSTANTIATION(, __nv_bfloat16)
} // namespace fx::cuda::ssm
