// causal_conv1d's launchers and kernels for f16 inputs (conv/launchers.cuh).
#include "cuda/conv/launchers.cuh"

namespace fx::cuda::conv {
FX_CONV_INSTANTIATION(, __half)
} // namespace fx::cuda::conv
