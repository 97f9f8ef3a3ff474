#include "core/check.h"

#include "fusex_dtype.h"

static void shape_of(const fx_tensor *t, char *buf, size_t len)
{
    fx_format_shape(buf, len, t->rank, t->dims);
}

int fx_expect_dtype(fx_status *st, const char *arg, const fx_tensor *t, fx_dtype want)
{
    if (t->dtype == want)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected type %s, got %s", arg, fx_dtype_name(want),
                   fx_dtype_name(t->dtype));
}

int fx_expect_float(fx_status *st, const char *arg, const fx_tensor *t, int allow_f64)
{
    fx_dtype d = t->dtype;
    if (d == FX_F32 || d == FX_BF16 || d == FX_F16 || (allow_f64 && d == FX_F64))
        return FX_OK;
    if (d == FX_F64)
        return fx_fail(st, FX_EBADARG,
                       "%s: expected type {f,32}, {bf,16} or {f,16} on %s ({f,64} runs on cpu only), got {f,64}",
                       arg, t->device->label);
    return fx_fail(st, FX_EBADARG, "%s: expected a float type ({f,32}, {bf,16}, {f,16}%s), got %s",
                   arg, allow_f64 ? " or {f,64}" : "", fx_dtype_name(d));
}

int fx_expect_rank(fx_status *st, const char *arg, const fx_tensor *t, int rank,
                   const char *layout)
{
    if (t->rank == rank)
        return FX_OK;
    char got[160];
    shape_of(t, got, sizeof got);
    return fx_fail(st, FX_EBADARG, "%s: expected rank %d %s, got rank %d shape %s", arg, rank,
                   layout, t->rank, got);
}

int fx_expect_shape(fx_status *st, const char *arg, const fx_tensor *t, int rank,
                    const int64_t *dims, const char *layout)
{
    int same = t->rank == rank;
    for (int i = 0; same && i < rank; i++)
        same = t->dims[i] == dims[i];
    if (same)
        return FX_OK;
    char want[160], got[160];
    fx_format_shape(want, sizeof want, rank, dims);
    shape_of(t, got, sizeof got);
    return fx_fail(st, FX_EBADARG, "%s: expected shape %s %s, got %s", arg, want, layout, got);
}

int fx_expect_same_device(fx_status *st, const char *arg, const fx_tensor *t,
                          const fx_device *dev, const char *ref_arg)
{
    if (t->device == dev)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected a tensor on %s (where %s is), got one on %s", arg,
                   dev->label, ref_arg, t->device->label);
}

int fx_expect_op(fx_status *st, const fx_device *dev, const void *fn, const char *what)
{
    if (fn)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "device: expected a device that implements %s, got %s", what,
                   dev->label);
}

bool fx_tensors_overlap(const fx_tensor *a, const fx_tensor *b)
{
    /* A tensor without memory (a check of shapes and types alone) shares
     * no byte with anything. */
    if (a->device != b->device || a->nbytes == 0 || b->nbytes == 0 || !a->data || !b->data)
        return false;
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + b->nbytes && b0 < a0 + a->nbytes;
}

int fx_expect_apart(fx_status *st, const char *arg, const fx_tensor *t, const char *other_arg,
                    const fx_tensor *other)
{
    if (!other || !fx_tensors_overlap(t, other))
        return FX_OK;
    return fx_fail(st, FX_EBADARG,
                   "%s: expected memory apart from %s's (it is written in place while %s is read), got "
                   "an overlap of their bytes",
                   arg, other_arg, other_arg);
}
