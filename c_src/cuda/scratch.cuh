// The scratch a launcher takes from its launch context (include/fusex_exec.h)
// and the look-back statuses it keeps with a stream (fx_stream_cache), the
// same for the CUDA build and the CPU emulator, so the policy is written
// once. Included by launch.cuh (c_src's and test/emu's), which defines the
// hooks declared here: fill_zero, alloc_statuses and free_statuses.
#ifndef FX_CUDA_SCRATCH_CUH
#define FX_CUDA_SCRATCH_CUH

#include <stdio.h>
#include <string.h>

#include "cuda/common.cuh"

namespace fx::cuda {

// ---- hooks, defined by each build's launch.cuh ----

// `bytes` of zeros at dst on the launch's stream.
static inline int fill_zero(const Run &r, void *dst, size_t bytes, const char *what, fx_status *st);

// `bytes` of device memory at *out for a stream's look-back statuses,
// stream-ordered; contents undefined.
static inline int alloc_statuses(const Run &r, size_t bytes, void **out, fx_status *st);

// Frees alloc_statuses' memory, stream-ordered: a launch still reading it
// finishes first.
static inline int free_statuses(const Run &r, void *ptr, fx_status *st);

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

// With the stream's cache locked (fx_stream_cache): at least `bytes` of
// look-back statuses at *base that hold no status tagged *epoch, which this
// launch then uses. Statuses of earlier launches stay there, tagged with
// older epochs, so the memory is cleared only when it grows (to 1.5 times
// what is asked, so a slowly growing shape does not clear every launch) or
// the epoch wraps (old tags could match again).
static inline int cached_statuses(const Run &r, fx_stream_cache *cache, size_t bytes, void **base, uint32_t *epoch,
                                  fx_status *st)
{
    bool clear = false;
    if (bytes > cache->bytes) {
        const size_t grown = fx_size_add(bytes, bytes / 2); // saturates: never less than bytes
        if (cache->statuses && free_statuses(r, cache->statuses, st))
            return st->code;
        cache->statuses = nullptr;
        cache->bytes = 0;
        if (alloc_statuses(r, grown, &cache->statuses, st)) {
            cache->statuses = nullptr;
            return st->code;
        }
        cache->bytes = grown;
        clear = true;
    }
    if (++cache->epoch >= (1u << 30)) {
        cache->epoch = 1;
        clear = true;
    }
    if (clear && fill_zero(r, cache->statuses, cache->bytes, "look-back statuses", st))
        return st->code;
    *base = cache->statuses;
    *epoch = cache->epoch;
    return FX_OK;
}

} // namespace fx::cuda

#endif
