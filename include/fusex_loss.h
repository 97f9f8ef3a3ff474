/* Losses over rows of a model's outputs, computed where the outputs are:
 * each row's loss and, on request, the gradient of a scaled sum of them.
 * The backends' entries; the op layer (c_src/core/loss.h) checks. */
#ifndef FUSEX_LOSS_H
#define FUSEX_LOSS_H

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MSE: a row's loss is sum_c (y - t)^2 over its classes; cross-entropy:
 * logsumexp(y) - y[label] of its logits. */
typedef enum fx_loss_kind { FX_LOSS_MSE = 0, FX_LOSS_CROSS_ENTROPY = 1 } fx_loss_kind;

typedef struct fx_loss_args {
    int64_t rows, classes; /* y is [rows, classes] */
    int kind;              /* fx_loss_kind */
    const fx_tensor *y;    /* f32 or f64 */
    /* MSE: y's shape and type; cross-entropy: s32 [rows], each label in
     * [0, classes) (the op layer checks them). */
    const fx_tensor *targets;
    double grad_scale;         /* dy = grad_scale * d(row loss)/dy */
    const fx_tensor *row_loss; /* out [rows], y's type */
    const fx_tensor *dy;       /* out, y's shape and type, or NULL */
} fx_loss_args;

struct fx_loss_ops {
    int (*rows)(const fx_exec *ex, const fx_loss_args *args, fx_status *st);
};

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_LOSS_H */
