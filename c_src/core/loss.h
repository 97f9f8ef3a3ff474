/* The op layer of the row losses (include/fusex_loss.h): checks, then the
 * backend's entry on a launch context.
 *
 * Inputs:     y [rows, classes] (f32, f64); targets: MSE y's shape and
 *             type, cross-entropy s32 [rows] with labels in [0, classes)
 *             (the caller checks the labels' values: a kernel cannot name
 *             the row); grad_scale
 * Results:    row_loss [rows] (y's type); dy (y's shape, optional)
 *
 * Every check reads shapes and types only (data may be NULL). */
#ifndef FX_CORE_LOSS_H
#define FX_CORE_LOSS_H

#include "core/runtime.h"
#include "fusex_loss.h"

/* Checks `args` (its row_loss and dy as results) against each other. */
int fx_loss_check(const fx_device *dev, const fx_loss_args *args, fx_status *st);

/* Each row's loss and, where args->dy is given, the gradient, enqueued on
 * `ex` (NULL: the device's own). */
int fx_op_loss_rows_into(const fx_exec *ex, const fx_loss_args *args, fx_status *st);

#endif /* FX_CORE_LOSS_H */
