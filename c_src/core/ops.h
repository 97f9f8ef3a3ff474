/* The op layer for tensors themselves: creation, transfer, cast,
 * elementwise maths and reshape. Inputs are acquired tensors; outputs are
 * new tensors the caller owns (fx_tensor_release, or hand to a handle). */
#ifndef FX_OPS_H
#define FX_OPS_H

#include "core/runtime.h"

/* `data` must hold exactly the bytes the shape needs (`datalen`). */
int fx_op_from_host(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                    const void *data, size_t datalen, fx_tensor *out, fx_status *st);
int fx_op_zeros(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, fx_tensor *out,
                fx_status *st);
/* Waits for pending work on the tensor, then copies t->nbytes into dst. */
int fx_op_to_host(const fx_tensor *t, void *dst, fx_status *st);
/* Whether fx_op_try_to_host can ever copy this tensor: its device can
 * download without waiting, and it is small. */
bool fx_op_try_to_host_eligible(const fx_tensor *t);
/* fx_op_to_host for a caller that must not wait, on an eligible tensor:
 * copies (and sets *done) once its device has finished all queued work;
 * else leaves *done false: the caller polls again or makes the blocking
 * call. */
int fx_op_try_to_host(const fx_tensor *t, void *dst, bool *done, fx_status *st);
int fx_op_copy_to(const fx_tensor *t, fx_device *dev, fx_tensor *out, fx_status *st);
int fx_op_cast(const fx_tensor *t, fx_dtype dtype, fx_tensor *out, fx_status *st);
int fx_op_binary(fx_binop op, const fx_tensor *a, const fx_tensor *b, fx_tensor *out,
                 fx_status *st);
int fx_op_scale(const fx_tensor *t, double factor, fx_tensor *out, fx_status *st);
/* A view sharing t's buffer; the element count must not change. */
int fx_op_reshape(const fx_tensor *t, int rank, const int64_t *dims, fx_tensor *out,
                  fx_status *st);
int fx_op_synchronize(fx_device *dev, fx_status *st);
/* Copies src's elements into dst in place (same device, type and shape):
 * how a result reaches memory fusex does not own (a from_pointer view). */
int fx_op_copy_into(const fx_tensor *src, const fx_tensor *dst, fx_status *st);

/* For the ops that write outputs the caller allocated, on the stream `ex`.
 * They test `data`, never `buffer`: a caller's memory (an XLA buffer, a
 * from_pointer view) has data and no fusex buffer, and must be written.
 * fx_op_fill_zero: t's bytes are zeros (nothing for a NULL or empty t).
 * fx_op_cast_or_zero: dst is src in dst's type (same shape), or zeros
 * without src. */
int fx_op_fill_zero(const fx_exec *ex, const fx_tensor *t, fx_status *st);
int fx_op_cast_or_zero(const fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st);

/* The same creation ops with allocation flags (FX_ALLOC_IPC: memory with a
 * CUDA IPC handle; see runtime.h). */
int fx_op_from_host_flags(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                          const void *data, size_t datalen, unsigned flags, fx_tensor *out,
                          fx_status *st);
int fx_op_zeros_flags(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                      unsigned flags, fx_tensor *out, fx_status *st);
/* fx_op_from_host (default allocation) for a caller that must not wait:
 * the same checks and errors, but where the upload would wait (a staging
 * slot still in use, or a backend without try_upload) it leaves *done
 * false and `out` empty: the caller then makes the blocking call. */
int fx_op_try_from_host(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                        const void *data, size_t datalen, fx_tensor *out, bool *done,
                        fx_status *st);
int fx_op_copy_to_flags(const fx_tensor *t, fx_device *dev, unsigned flags, fx_tensor *out,
                        fx_status *st);

#endif
