// The linear recurrences' launchers and kernels for f32 inputs
// (linrec/launchers.cuh).
#include "cuda/linrec/launchers.cuh"

namespace fxlinrec {
FX_LINREC_INSTANTIATION(, float)
} // namespace fxlinrec
