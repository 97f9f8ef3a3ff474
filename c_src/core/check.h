/* Validation helpers for the op layer. Each names the argument, says what
 * was expected and what came, and returns the status code (FX_OK on
 * success), so checks chain with `||`-free early returns:
 *
 *     if (fx_expect_rank(st, "x", x, 3, "[batch, seqlen, dim]")) return st->code;
 */
#ifndef FX_CHECK_H
#define FX_CHECK_H

#include "core/runtime.h"

int fx_expect_dtype(fx_status *st, const char *arg, const fx_tensor *t, fx_dtype want);
/* One of f32, bf16, f16 — and f64 where `allow_f64` (the CPU backend). */
int fx_expect_float(fx_status *st, const char *arg, const fx_tensor *t, int allow_f64);
int fx_expect_rank(fx_status *st, const char *arg, const fx_tensor *t, int rank,
                   const char *layout);
int fx_expect_shape(fx_status *st, const char *arg, const fx_tensor *t, int rank,
                    const int64_t *dims, const char *layout);
int fx_expect_same_device(fx_status *st, const char *arg, const fx_tensor *t,
                          const fx_device *dev, const char *ref_arg);
/* Whether two tensors' bytes overlap (on one device; empty ones and ones
 * without memory, data NULL, never do). */
bool fx_tensors_overlap(const fx_tensor *a, const fx_tensor *b);
/* `t`, which an op writes in place, shares no byte with `other`, which it
 * reads: element i of one is not element i of the other, so the op would
 * read values it has already overwritten. */
int fx_expect_apart(fx_status *st, const char *arg, const fx_tensor *t, const char *other_arg,
                    const fx_tensor *other);
/* The backend implements `what`, or a badarg naming the device. */
int fx_expect_op(fx_status *st, const fx_device *dev, const void *fn, const char *what);

#endif
