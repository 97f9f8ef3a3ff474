// The linear recurrences' launchers and kernels for bf16 inputs
// (linrec/launchers.cuh).
#include "cuda/linrec/launchers.cuh"

namespace fx::cuda::linrec {
FX_LINREC_INSTANTIATION(, __nv_bfloat16)
} // namespace fx::cuda::linrec
