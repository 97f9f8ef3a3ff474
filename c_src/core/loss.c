#include "core/loss.h"

#include "core/check.h"
#include "fusex_dtype.h"

static int check_y(const fx_loss_args *a, fx_status *st)
{
    if (a->y->dtype != FX_F32 && a->y->dtype != FX_F64)
        return fx_fail(st, FX_EBADARG, "y: expected type {f,32} or {f,64}, got %s", fx_dtype_name(a->y->dtype));
    const int64_t dims[2] = {a->rows, a->classes};
    return fx_expect_shape(st, "y", a->y, 2, dims, "[rows, classes]");
}

static int check_targets(const fx_loss_args *a, fx_status *st)
{
    if (a->kind == FX_LOSS_MSE) {
        const int64_t dims[2] = {a->rows, a->classes};
        return fx_expect_dtype(st, "targets", a->targets, a->y->dtype) ||
               fx_expect_shape(st, "targets", a->targets, 2, dims, "[rows, classes] (y's)");
    }
    const int64_t dims[1] = {a->rows};
    return fx_expect_dtype(st, "targets", a->targets, FX_S32) ||
           fx_expect_shape(st, "targets", a->targets, 1, dims, "[rows] (class indices)");
}

static int check_results(const fx_device *dev, const fx_loss_args *a, fx_status *st)
{
    const int64_t rows[1] = {a->rows};
    if (fx_expect_same_device(st, "row_loss", a->row_loss, dev, "y") ||
        fx_expect_dtype(st, "row_loss", a->row_loss, a->y->dtype) ||
        fx_expect_shape(st, "row_loss", a->row_loss, 1, rows, "[rows]"))
        return st->code;
    if (!a->dy)
        return FX_OK;
    const int64_t dims[2] = {a->rows, a->classes};
    return fx_expect_same_device(st, "dy", a->dy, dev, "y") || fx_expect_dtype(st, "dy", a->dy, a->y->dtype) ||
           fx_expect_shape(st, "dy", a->dy, 2, dims, "[rows, classes] (y's)");
}

int fx_loss_check(const fx_device *dev, const fx_loss_args *a, fx_status *st)
{
    if (a->kind != FX_LOSS_MSE && a->kind != FX_LOSS_CROSS_ENTROPY)
        return fx_fail(st, FX_EBADARG, "loss: expected mse or cross_entropy, got %d", a->kind);
    if (a->rows < 0 || a->classes < 1)
        return fx_fail(st, FX_EBADARG, "y: expected [rows, classes] with classes >= 1, got %lld x %lld",
                       (long long)a->rows, (long long)a->classes);
    if (check_y(a, st) || fx_expect_same_device(st, "targets", a->targets, dev, "y") || check_targets(a, st))
        return st->code;
    return check_results(dev, a, st);
}

int fx_op_loss_rows_into(const fx_exec *ex, const fx_loss_args *a, fx_status *st)
{
    fx_device *dev = a->y->device;
    if (fx_loss_check(dev, a, st) || fx_expect_op(st, dev, dev->backend->loss, "row losses"))
        return st->code;
    if (a->rows == 0)
        return FX_OK;
    fx_exec own;
    const fx_exec *run = fx_exec_resolve(dev, ex, &own, st);
    return run ? dev->backend->loss->rows(run, a, st) : st->code;
}
