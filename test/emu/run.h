// The emulator's scheduler as the launches (cuda/launch.cuh here) and the
// backend (backend.cc) use it.
#ifndef FX_EMU_RUN_H
#define FX_EMU_RUN_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "fusex.h"

namespace fx_emu {

// Runs fn(ctx) as every thread of a grid of `grid` blocks of `threads`,
// with `smem` bytes of dynamic shared memory a block, and returns when all
// have finished. A configuration a GPU refuses (an empty or too large grid,
// more than 1024 threads, `smem` past `smem_limit`) runs nothing; its
// cudaError_t is returned and kept for take_last_error. `cooperative`
// (> 0): a cooperative launch whose device keeps that many blocks
// resident: every block is in flight from the start (a larger grid is
// refused, cudaErrorCooperativeLaunchTooLarge).
int run_grid(const char *name, int64_t grid, int threads, size_t smem, size_t smem_limit, void (*fn)(void *),
             void *ctx, int64_t cooperative = 0);

// The error of this thread's last refused launch, cleared
// (cudaGetLastError).
int take_last_error();

// Gives back every fiber stack and shared memory buffer (the backend's
// shutdown).
void release_all();

// How launches are interleaved (the FUSEX_EMU_* settings), for the log.
std::string describe();

// CUDA graphs (backend.cc). While this thread captures `stream` (a token of
// stream_create), work enqueued on it is recorded, with its arguments by
// value as a kernel launch copies them, instead of run; a graph's launch
// runs the record in order. Work on other streams runs at once, as a GPU
// runs it during a capture.
using work = std::function<int(fx_status *)>;
bool capturing(const void *stream);
void record(work w);

} // namespace fx_emu

#endif
