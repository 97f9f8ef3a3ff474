// The linear recurrences' launchers and kernels for f16 inputs
// (linrec/launchers.cuh).
#include "cuda/linrec/launchers.cuh"

namespace fx::cuda::linrec {
FX_LINREC_INSTANTIATION(, __half)
} // namespace fx::cuda::linrec
