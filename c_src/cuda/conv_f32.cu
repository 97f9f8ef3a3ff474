// causal_conv1d's launchers and kernels for f32 inputs (conv/launchers.cuh).
#include "cuda/conv/launchers.cuh"

namespace fx::cuda::conv {
FX_CONV_INSTANTIATION(, float)
} // namespace fx::cuda::conv
