// The linear recurrences' launchers and kernels for bf16 inputs
// (linrec/launchers.cuh).
#include "cuda/linrec/launchers.cuh"

namespace fxlinrec {
FX_LINREC_INSTANTIATION(, __nv_bfloat16)
} // namespace fxlinrec
