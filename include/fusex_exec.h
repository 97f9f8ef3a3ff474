/*
 * The launch context: where a backend runs an op. Every op of every family
 * (and every elementwise op) takes one, so that the same launcher serves
 * fusex's own NIF path (its per-device stream and memory pool) and a caller
 * that owns the stream and the memory (an XLA custom call: XLA's stream and
 * scratch allocator; a C program: its own stream and a buffer).
 *
 * A launcher uses the stream it is given, writes only the outputs in its
 * argument struct, and takes any temporary memory from `scratch`; it keeps
 * no state between calls that two streams could share. Sizes come from
 * shapes alone: each family's ops table says how many scratch bytes an op
 * asks for at most, so a caller can hand over one buffer up front
 * (fx_scratch_arena below).
 *
 * Valid C11 and CUDA C++.
 */
#ifndef FUSEX_EXEC_H
#define FUSEX_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "fusex.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every scratch allocation starts on this many bytes (the widest vector
 * access and the cache line of every device fusex supports). */
#define FX_SCRATCH_ALIGN 256

/* Temporary memory for the work of one op. `alloc` gives `nbytes` starting
 * on FX_SCRATCH_ALIGN bytes, readable and writable by work the op enqueues
 * on the context's stream from then on; `release` gives it back, ordered
 * after that work (stream-ordered, or simply kept until the caller's op is
 * over). `release` may be NULL: the caller reclaims everything itself once
 * the op's work is done (an arena, XLA's scratch allocator). */
typedef struct fx_scratch {
    int (*alloc)(void *ctx, size_t nbytes, void **ptr, fx_status *st);
    void (*release)(void *ctx, void *ptr);
    void *ctx;
} fx_scratch;

/* Memory a backend keeps with one stream between the ops on it, for work
 * that would otherwise have to clear fresh scratch at every launch (the
 * scans' look-back statuses carry a launch's tag, so reused memory needs
 * no clearing). Defined by the backend; owned by whoever owns the stream:
 * fusex's own context carries its stream's, a caller's context none. */
struct fx_stream_cache;

typedef struct fx_exec {
    int device;         /* the backend's own device ordinal */
    void *stream;       /* the cudaStream_t work is enqueued on; NULL on the CPU */
    fx_scratch scratch;
    struct fx_stream_cache *cache; /* the stream's cache, or NULL */
} fx_exec;

static inline int fx_scratch_alloc(const fx_exec *ex, size_t nbytes, void **ptr, fx_status *st)
{
    *ptr = NULL;
    if (nbytes == 0)
        return FX_OK;
    if (!ex->scratch.alloc)
        return fx_fail(st, FX_EINTERNAL, "the launch context has no scratch allocator (%zu bytes asked)",
                       nbytes);
    return ex->scratch.alloc(ex->scratch.ctx, nbytes, ptr, st);
}

static inline void fx_scratch_release(const fx_exec *ex, void *ptr)
{
    if (ptr && ex->scratch.release)
        ex->scratch.release(ex->scratch.ctx, ptr);
}

/* What one allocation of `nbytes` takes of an arena: its bytes rounded up to
 * the alignment. A size query is the sum of these over an op's
 * allocations, plus FX_SCRATCH_ALIGN for the arena's own start. SIZE_MAX
 * when it would overflow. */
static inline size_t fx_scratch_piece(size_t nbytes)
{
    if (nbytes > SIZE_MAX - (FX_SCRATCH_ALIGN - 1))
        return SIZE_MAX;
    return (nbytes + FX_SCRATCH_ALIGN - 1) / FX_SCRATCH_ALIGN * FX_SCRATCH_ALIGN;
}

/* a + b, or SIZE_MAX when it overflows (sizes of scratch queries). */
static inline size_t fx_size_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* a * b, or SIZE_MAX when it overflows or either is negative. */
static inline size_t fx_size_mul(int64_t a, int64_t b)
{
    if (a < 0 || b < 0)
        return SIZE_MAX;
    if (a != 0 && (uint64_t)b > (uint64_t)SIZE_MAX / (uint64_t)a)
        return SIZE_MAX;
    return (size_t)a * (size_t)b;
}

/* A bump allocator over one buffer the caller owns (any alignment): hands
 * out aligned pieces until it is full, and fails with a clear error past
 * that. Nothing is released piece by piece; the caller reuses the buffer
 * once the op's work is done. */
typedef struct fx_scratch_arena {
    char *base;
    size_t size;
    size_t used;
} fx_scratch_arena;

static inline int fx_scratch_arena_alloc(void *ctx, size_t nbytes, void **ptr, fx_status *st)
{
    fx_scratch_arena *arena = (fx_scratch_arena *)ctx;
    const uintptr_t start = (uintptr_t)arena->base + arena->used;
    const size_t pad = (size_t)((FX_SCRATCH_ALIGN - start % FX_SCRATCH_ALIGN) % FX_SCRATCH_ALIGN);
    const size_t piece = fx_scratch_piece(nbytes);
    if (piece == SIZE_MAX || arena->used > arena->size || pad > arena->size - arena->used ||
        piece > arena->size - arena->used - pad)
        return fx_fail(st, FX_EINTERNAL, "scratch: %zu bytes asked of an arena of %zu with %zu used", nbytes,
                       arena->size, arena->used);
    *ptr = arena->base + arena->used + pad;
    arena->used += pad + piece;
    return FX_OK;
}

static inline fx_scratch fx_scratch_arena_use(fx_scratch_arena *arena)
{
    fx_scratch s;
    s.alloc = fx_scratch_arena_alloc;
    s.release = NULL;
    s.ctx = arena;
    return s;
}

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_EXEC_H */
