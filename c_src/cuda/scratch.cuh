// The scratch a launcher takes from its launch context (include/fusex_exec.h),
// the same for the CUDA build and the CPU emulator: both launch.cuh (c_src's
// and test/emu's) include it and define fill_zero, stream-ordered zeros.
#ifndef FX_CUDA_SCRATCH_CUH
#define FX_CUDA_SCRATCH_CUH

#include <stdio.h>
#include <string.h>

#include "cuda/common.cuh"

namespace fx::cuda {

// `bytes` of zeros at dst on the launch's stream (launch.cuh).
static inline int fill_zero(const Run &r, void *dst, size_t bytes, const char *what, fx_status *st);

// `bytes` of scratch from the context at *out (nullptr for none); `what`
// names it in errors. Give it back with give_back once the work that
// uses it is enqueued.
static inline int take_scratch(const Run &r, size_t bytes, const char *what, void **out, fx_status *st)
{
    if (fx_scratch_alloc(r.ex, bytes, out, st) == FX_OK)
        return FX_OK;
    const size_t len = strlen(st->msg);
    snprintf(st->msg + len, sizeof st->msg - len, " (scratch for %s)", what);
    return st->code;
}

static inline void give_back(const Run &r, void *ptr) { fx_scratch_release(r.ex, ptr); }

// Scratch of `bytes` zeroed, at *out; released on failure.
static inline int take_zeroed_scratch(const Run &r, size_t bytes, const char *what, void **out, fx_status *st)
{
    if (take_scratch(r, bytes, what, out, st) != FX_OK)
        return st->code;
    if (fill_zero(r, *out, bytes, what, st) != FX_OK) {
        give_back(r, *out);
        *out = nullptr;
        return st->code;
    }
    return FX_OK;
}

} // namespace fx::cuda

#endif
