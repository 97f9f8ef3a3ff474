// The linear recurrences' launchers and kernels for f16 inputs
// (linrec/launchers.cuh).
#include "cuda/linrec/launchers.cuh"

namespace fxlinrec {
FX_LINREC_INSTANTIATION(, __half)
} // namespace fxlinrec
