// The GRU's and LSTM's launchers and kernels for {f,32} inputs
// (rnn/launchers.cuh).
#include "cuda/rnn/launchers.cuh"

namespace fx::cuda::rnn {
FX_RNN_INSTANTIATION(, float)
} // namespace fx::cuda::rnn
