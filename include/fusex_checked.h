/*
 * Overflow-checked counts and byte counts, for every place one is formed:
 * the op layer, the CPU backend's scratch and the CUDA backend's host code.
 *
 * A tensor's own shape is bounded when it is made (fx_shape_numel: its
 * nonzero dimensions multiply to at most 2^48), but a count that combines
 * dimensions of several tensors (batch of x, dstate of a) or multiplies a
 * count by something else (chunks, groups, element bytes) is not: each
 * such product goes through these. They follow C23's ckd_mul: the result
 * is written and the return value is true when it overflowed.
 *
 * Valid C11 and CUDA C++ (host code); GCC and Clang builtins.
 */
#ifndef FUSEX_CHECKED_H
#define FUSEX_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline bool fx_ckd_mul(int64_t *r, int64_t a, int64_t b)
{
    return __builtin_mul_overflow(a, b, r);
}

static inline bool fx_ckd_add(int64_t *r, int64_t a, int64_t b)
{
    return __builtin_add_overflow(a, b, r);
}

/* count * elem as a byte count; a negative count counts as an overflow. */
static inline bool fx_ckd_bytes(size_t *r, int64_t count, size_t elem)
{
    if (count < 0) {
        *r = 0;
        return true;
    }
    return __builtin_mul_overflow((size_t)count, elem, r);
}

/* a * b * c (counts of several tensors' dimensions together). */
static inline bool fx_ckd_mul3(int64_t *r, int64_t a, int64_t b, int64_t c)
{
    int64_t ab;
    return fx_ckd_mul(&ab, a, b) || fx_ckd_mul(r, ab, c);
}

/* a * b, or INT64_MAX when that overflows: for sizes that only pick a
 * strategy (whether a loop is worth threads), never for memory. */
static inline int64_t fx_sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return fx_ckd_mul(&r, a, b) ? INT64_MAX : r;
}

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_CHECKED_H */
