// The linear recurrences' tuning: the sizes the kernels are built for,
// each with what chose it (measured on an H200 unless said otherwise;
// bench/RESULTS.md keeps the measurements). Constants, so that a kernel's
// shape is one reading of this file; to try another value, change it here
// and measure (dev/linrec_bench, dev/linrec_variants).
#ifndef FX_CUDA_LINREC_TUNING_CUH
#define FX_CUDA_LINREC_TUNING_CUH

namespace fx::cuda::linrec {

// ---- the tiled kernels: how much a thread holds ----

// Blocks of up to 256 threads (scan::kBlockThreads). Kernels that hold
// their steps' inputs in registers run two blocks per SM (up to 128
// registers a thread, 64 of them the steps' data); the staged forward,
// whose inputs wait in shared memory (cp.async), runs three.
constexpr int kRegBlocks = 2;
constexpr int kStagedBlocks = 3;
constexpr int kDataRegs = 64;
// A single-tile launch gives each thread at least this many steps (the
// scan across segments stays short: latency).
constexpr int kMinSteps = 4;

// The vector path: 4 channels per lane (16 bytes of f32, 8 of bf16/f16),
// groups of lanes covering kRowBytes of a tile's time row (other widths
// measured slower).
constexpr int kVec = 4;
constexpr int kRowBytes = 128;

// The staged forward: steps a thread stages (the slots of three blocks
// fill an SM's shared memory: 3 x 64 KB for MinGRU f32).
constexpr int kStagedFwdSteps = 8;

// ---- the streaming kernels (linrec/stream.cuh) ----
//
// 16 steps a stage, 6 stages and 2-warp blocks measured best of 8 x 6,
// 8 x 12, 8 x 20, 16 x 6, 16 x 8, 32 x 4 and 4-warp blocks for the kernels
// that stage two sequences (MinGRU's and the scan's forwards); lockstep in
// 2-warp blocks beat free warps (kStreamLockstep false: each warp runs
// free), in 4-warp blocks it did not.
constexpr int kStreamSteps = 16;
constexpr int kStreamStages = 6;
constexpr int kStreamWarps = 2;
constexpr bool kStreamLockstep = true;
// The forwards that stage other than two sequences have shapes of their
// own (StreamShape): 32 x 4 measured best for MinLSTM's with the identity
// candidate (three sequences: 73.6 against 75.9 us at 16 x 6 and 74.4 at
// 8 x 12, B16 L1024 H1024; with the candidate g, 76.7 against 73.3 at
// 16 x 6, which it keeps) and for Liquid's (one: 40.4 against 41.2 at
// 16 x 6, 48.0 against 61.3 with a dt tensor; 8 x 12, 32 x 8, 32 x 12 and
// 16 x 12 slower).
constexpr int kStreamMinlstmFwdSteps = 32;
constexpr int kStreamMinlstmFwdStages = 4;
constexpr int kStreamLiquidFwdSteps = 32;
constexpr int kStreamLiquidFwdStages = 4;
// The most steps a stage of any streaming kernel: a stage's row offsets
// are 32-bit below hidden * kStreamMaxSteps < 2^31 (stream_fits).
constexpr int kStreamMaxSteps = 32;

} // namespace fx::cuda::linrec

#endif
