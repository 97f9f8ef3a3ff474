// The GRU's and LSTM's launchers and kernels for {bf,16} inputs
// (rnn/launchers.cuh).
#include "cuda/rnn/launchers.cuh"

namespace fx::cuda::rnn {
FX_RNN_INSTANTIATION(, __nv_bfloat16)
} // namespace fx::cuda::rnn
