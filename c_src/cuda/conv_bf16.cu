// causal_conv1d's launchers and kernels for bf16 inputs (conv/launchers.cuh).
#include "cuda/conv/launchers.cuh"

namespace fx::cuda::conv {
FX_CONV_INSTANTIATION(, __nv_bfloat16)
} // namespace fx::cuda::conv
