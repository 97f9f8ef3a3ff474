#include "core/ops.h"

#include <string.h>

#include "core/check.h"
#include "fusex_dtype.h"

int fx_op_from_host(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                    const void *data, size_t datalen, fx_tensor *out, fx_status *st)
{
    return fx_op_from_host_flags(dev, dtype, rank, dims, data, datalen, FX_ALLOC_DEFAULT, out, st);
}

static int check_host_data(fx_dtype dtype, int rank, const int64_t *dims, size_t datalen,
                           fx_status *st)
{
    int64_t numel;
    size_t nbytes;
    if (fx_shape_nbytes("shape", dtype, rank, dims, &numel, &nbytes, st) != FX_OK)
        return st->code;
    if (datalen != nbytes) {
        char shape[160];
        fx_format_shape(shape, sizeof shape, rank, dims);
        return fx_fail(st, FX_EBADARG, "data: expected %zu bytes (shape %s of %s), got %zu bytes",
                       nbytes, shape, fx_dtype_name(dtype), datalen);
    }
    return FX_OK;
}

int fx_op_from_host_flags(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                          const void *data, size_t datalen, unsigned flags, fx_tensor *out,
                          fx_status *st)
{
    if (check_host_data(dtype, rank, dims, datalen, st) != FX_OK ||
        fx_tensor_alloc_flags(dev, dtype, rank, dims, flags, out, st) != FX_OK)
        return st->code;
    if (datalen > 0 && dev->backend->upload(dev->ordinal, out->data, data, datalen, st) != FX_OK) {
        fx_tensor_release(out);
        return st->code;
    }
    return FX_OK;
}

int fx_op_try_from_host(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                        const void *data, size_t datalen, fx_tensor *out, bool *done,
                        fx_status *st)
{
    *done = false;
    memset(out, 0, sizeof *out);
    if (check_host_data(dtype, rank, dims, datalen, st) != FX_OK)
        return st->code;
    if (!dev->backend->try_upload)
        return FX_OK;
    if (fx_tensor_alloc(dev, dtype, rank, dims, out, st) != FX_OK)
        return st->code;
    bool uploaded = datalen == 0;
    if (!uploaded &&
        dev->backend->try_upload(dev->ordinal, out->data, data, datalen, &uploaded, st) != FX_OK)
        uploaded = false;
    if (!uploaded) /* a stream-ordered free: nothing waits */
        fx_tensor_release(out);
    *done = uploaded;
    return st->code;
}

int fx_op_zeros(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, fx_tensor *out,
                fx_status *st)
{
    return fx_op_zeros_flags(dev, dtype, rank, dims, FX_ALLOC_DEFAULT, out, st);
}

int fx_op_zeros_flags(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                      unsigned flags, fx_tensor *out, fx_status *st)
{
    if (fx_tensor_alloc_flags(dev, dtype, rank, dims, flags, out, st) != FX_OK)
        return st->code;
    fx_exec own;
    const fx_exec *ex = out->nbytes > 0 ? fx_exec_resolve(dev, NULL, &own, st) : NULL;
    if (out->nbytes > 0 && (!ex || dev->backend->fill_zero(ex, out->data, out->nbytes, st) != FX_OK)) {
        fx_tensor_release(out);
        return st->code;
    }
    return FX_OK;
}

int fx_op_fill_zero(const fx_exec *ex, const fx_tensor *t, fx_status *st)
{
    if (!t || !t->data || t->nbytes == 0)
        return FX_OK;
    return t->device->backend->fill_zero(ex, t->data, t->nbytes, st);
}

int fx_op_cast_or_zero(const fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st)
{
    if (!src || dst->numel == 0)
        return fx_op_fill_zero(ex, dst, st);
    return dst->device->backend->cast(ex, src, dst, st);
}

/* Larger downloads go through the pinned staging ring on a dirty
 * scheduler. */
bool fx_op_try_to_host_eligible(const fx_tensor *t)
{
    return t->device->backend->try_download && t->nbytes <= FX_TRY_DOWNLOAD_MAX;
}

int fx_op_try_to_host(const fx_tensor *t, void *dst, bool *done, fx_status *st)
{
    const fx_backend *b = t->device->backend;
    *done = false;
    if (!fx_op_try_to_host_eligible(t))
        return fx_fail(st, FX_EINTERNAL, "fx_op_try_to_host: a tensor it cannot copy without waiting");
    if (t->nbytes == 0) {
        *done = true;
        return FX_OK;
    }
    if (b->try_download(t->device->ordinal, dst, t->data, t->nbytes, done, st) == FX_OK && *done)
        fx_device_note_idle(t->device); /* it found the stream idle */
    return st->code;
}

int fx_op_to_host(const fx_tensor *t, void *dst, fx_status *st)
{
    if (t->nbytes == 0)
        return FX_OK;
    int rc = t->device->backend->download(t->device->ordinal, dst, t->data, t->nbytes, st);
    if (rc == FX_OK) /* the download waited for everything queued before it */
        fx_device_note_idle(t->device);
    return rc;
}

int fx_op_copy_to(const fx_tensor *t, fx_device *dev, fx_tensor *out, fx_status *st)
{
    return fx_op_copy_to_flags(t, dev, FX_ALLOC_DEFAULT, out, st);
}

int fx_op_copy_to_flags(const fx_tensor *t, fx_device *dev, unsigned flags, fx_tensor *out,
                        fx_status *st)
{
    if (fx_tensor_alloc_flags(dev, t->dtype, t->rank, t->dims, flags, out, st) != FX_OK)
        return st->code;
    if (t->nbytes == 0)
        return FX_OK;
    fx_device *src = t->device;
    int rc;
    fx_exec own;
    if (src == dev)
        rc = fx_exec_resolve(dev, NULL, &own, st) ? dev->backend->copy(&own, out->data, t->data, t->nbytes, st)
                                                  : st->code;
    else if (src->kind == FX_DEVICE_CPU)
        rc = dev->backend->upload(dev->ordinal, out->data, t->data, t->nbytes, st);
    else if (dev->kind == FX_DEVICE_CPU)
        rc = src->backend->download(src->ordinal, out->data, t->data, t->nbytes, st);
    else /* GPU to another GPU: stage through the host, correct if not fastest */
        rc = fx_fail(st, FX_EBADARG, "device: copies between two GPUs (%s to %s) are not supported; copy through cpu",
                     src->label, dev->label);
    if (rc != FX_OK)
        fx_tensor_release(out);
    return rc;
}

int fx_op_cast(const fx_tensor *t, fx_dtype dtype, fx_tensor *out, fx_status *st)
{
    fx_device *dev = t->device;
    if (fx_tensor_alloc(dev, dtype, t->rank, t->dims, out, st) != FX_OK)
        return st->code;
    fx_exec own;
    if (t->numel > 0 && (!fx_exec_resolve(dev, NULL, &own, st) || dev->backend->cast(&own, t, out, st) != FX_OK))
        fx_tensor_release(out);
    return st->code;
}

int fx_op_binary(fx_binop op, const fx_tensor *a, const fx_tensor *b, fx_tensor *out,
                 fx_status *st)
{
    fx_device *dev = a->device;
    if (fx_expect_same_device(st, "b", b, dev, "a") ||
        fx_expect_dtype(st, "b", b, a->dtype) ||
        fx_expect_shape(st, "b", b, a->rank, a->dims, "(the shape of a)"))
        return st->code;
    if (fx_tensor_alloc(dev, a->dtype, a->rank, a->dims, out, st) != FX_OK)
        return st->code;
    fx_exec own;
    if (a->numel > 0 &&
        (!fx_exec_resolve(dev, NULL, &own, st) || dev->backend->binary(&own, op, a, b, out, st) != FX_OK))
        fx_tensor_release(out);
    return st->code;
}

int fx_op_scale(const fx_tensor *t, double factor, fx_tensor *out, fx_status *st)
{
    fx_device *dev = t->device;
    if (fx_expect_float(st, "tensor", t, 1))
        return st->code;
    if (fx_tensor_alloc(dev, t->dtype, t->rank, t->dims, out, st) != FX_OK)
        return st->code;
    fx_exec own;
    if (t->numel > 0 &&
        (!fx_exec_resolve(dev, NULL, &own, st) || dev->backend->scale(&own, t, factor, out, st) != FX_OK))
        fx_tensor_release(out);
    return st->code;
}

int fx_op_reshape(const fx_tensor *t, int rank, const int64_t *dims, fx_tensor *out,
                  fx_status *st)
{
    int64_t numel;
    if (fx_shape_numel("shape", rank, dims, &numel, st) != FX_OK)
        return st->code;
    if (numel != t->numel) {
        char from[160], to[160];
        fx_format_shape(from, sizeof from, t->rank, t->dims);
        fx_format_shape(to, sizeof to, rank, dims);
        return fx_fail(st, FX_EBADARG, "shape: expected %lld elements (as in %s), got %s with %lld",
                       (long long)t->numel, from, to, (long long)numel);
    }
    *out = *t;
    out->rank = rank;
    memset(out->dims, 0, sizeof out->dims);
    memcpy(out->dims, dims, sizeof(int64_t) * (size_t)rank);
    fx_buffer_ref(t->buffer);
    return FX_OK;
}

int fx_op_copy_into(const fx_tensor *src, const fx_tensor *dst, fx_status *st)
{
    fx_device *dev = src->device;
    if (fx_expect_same_device(st, "dst", dst, dev, "src") ||
        fx_expect_dtype(st, "dst", dst, src->dtype) ||
        fx_expect_shape(st, "dst", dst, src->rank, src->dims, "(the shape of src)"))
        return st->code;
    if (src->nbytes == 0 || src->data == dst->data)
        return FX_OK;
    fx_exec own;
    if (!fx_exec_resolve(dev, NULL, &own, st))
        return st->code;
    if (!fx_tensors_overlap(src, dst))
        return dev->backend->copy(&own, dst->data, src->data, src->nbytes, st);
    /* Views of one memory at different offsets (from_pointer, reshape):
     * a backend's copy, like memcpy, wants disjoint ranges, so the bytes
     * go through a copy of src first (as memmove would). */
    fx_tensor staged;
    if (fx_op_copy_to(src, dev, &staged, st) != FX_OK)
        return st->code;
    dev->backend->copy(&own, dst->data, staged.data, src->nbytes, st);
    fx_tensor_release(&staged);
    return st->code;
}

int fx_op_synchronize(fx_device *dev, fx_status *st)
{
    int rc = dev->backend->synchronize(dev->ordinal, st);
    if (rc == FX_OK)
        fx_device_note_idle(dev);
    return rc;
}
