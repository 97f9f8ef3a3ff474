// The linear recurrences' launchers and kernels for f32 inputs
// (linrec/launchers.cuh).
#include "cuda/linrec/launchers.cuh"

namespace fx::cuda::linrec {
FX_LINREC_INSTANTIATION(, float)
} // namespace fx::cuda::linrec
