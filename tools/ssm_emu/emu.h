// A small CUDA emulation that runs the selective scan's kernels
// (c_src/cuda/ssm_kernels.cuh) on a CPU, to check their logic where there is
// no GPU. Every CUDA thread of a block is a fiber (ucontext, switched with
// _setjmp/_longjmp); a fiber runs until it reaches a barrier, then yields:
// __syncthreads waits for the block, __syncwarp and a shuffle for the warp. Blocks run one
// after the other, so shared memory is one buffer, poisoned with NaN before
// each block (a read of a slot no thread wrote shows up in the results).
// EMU_REVERSE=1 runs the fibers of a block in the reverse order (a missing
// barrier then shows up on the other side). The CUDA headers (not a GPU)
// provide float4, __half, __nv_bfloat16 and their conversions on the host.
#ifndef FX_SSM_EMU_H
#define FX_SSM_EMU_H

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

using std::max;
using std::min;
#define __launch_bounds__(...)

namespace emu {
extern int current;
extern dim3 block_idx, block_dim, grid_dim, thread_idx[1024];
void syncthreads();
void syncwarp();
float shfl_xor(float v, int lane_mask);
// Runs block `block` of a kernel with `threads` fibers.
void run_block(unsigned block, int threads, const std::function<void()> &kernel);
} // namespace emu

#define threadIdx (emu::thread_idx[emu::current])
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncwarp(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) { return emu::shfl_xor(v, lane_mask); }
// One OS thread runs every fiber, and only at barriers do they switch.
inline float atomicAdd(float *p, float v)
{
    float old = *p;
    *p += v;
    return old;
}
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float x, float y) { return x / y; }

#endif
