/*
 * RMSNorm and LayerNorm over the last dimension, fused with the residual
 * add before them and the gate after them (a Mamba block's prenorm and
 * Mamba-2's gated RMSNorm): argument structs and the ops table a backend
 * fills. Row-major; `rows` is the product of x's leading dimensions.
 *
 *   x, residual, gate, y      [..., hidden]
 *   weight, bias              [hidden]
 *   mean, rstd                [rows]         (saved for the backward)
 *
 *   s     = x + residual                      (x without a residual)
 *   rms:    rstd = 1 / sqrt(mean(s^2) + eps),             n = s * rstd
 *   layer:  mu = mean(s), rstd = 1 / sqrt(mean((s - mu)^2) + eps),
 *                                                          n = (s - mu) * rstd
 *   o     = n * weight + bias                 (no bias: + 0)
 *   y     = o * silu(gate)                    (no gate: o)
 *
 * With a residual the forward also returns s (`residual_out`): what the
 * next block adds to. Its type is the residual's, or f32 when asked
 * (residual_in_f32). The statistics are computed from s before it is
 * rounded to that type, in f32 (f64 for f64 inputs).
 *
 * The backward reads what was normalised (s, or x without a residual), the
 * weight, bias and gate, the saved statistics, dy and the gradient that
 * reached s from the next block (dresidual_out, optional):
 *   do    = dy * silu(gate);  dgate = dy * o * silu'(gate)
 *   dn    = do * weight;      dweight = sum over rows of do * n;  dbias = sum of do
 *   rms:    ds = rstd * (dn - n * mean(dn * n))
 *   layer:  ds = rstd * (dn - mean(dn) - n * mean(dn * n))
 *   ds   += dresidual_out;    dx = ds, dresidual = ds
 * dweight and dbias are summed in a fixed order (deterministic).
 *
 * Types: x, gate, y, dy, dx, dgate share one type (f32, bf16, f16; f64 on
 * the CPU); weight and bias any float type; the residual x's type or f32;
 * mean and rstd f32 (f64 for f64 x). Every gradient has its input's type;
 * dresidual_out has residual_out's.
 */
#ifndef FUSEX_NORM_H
#define FUSEX_NORM_H

#include <stdbool.h>

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_norm_kind { FX_NORM_RMS = 0, FX_NORM_LAYER = 1 } fx_norm_kind;

typedef struct fx_norm_dims {
    int64_t rows, hidden;
} fx_norm_dims;

typedef struct fx_norm_fwd_args {
    fx_norm_dims n;
    int kind; /* fx_norm_kind */
    double eps;
    const fx_tensor *x, *weight;
    const fx_tensor *bias, *residual, *gate; /* NULL when not given */
    const fx_tensor *y;            /* out */
    const fx_tensor *residual_out; /* out, exactly where a residual is given */
    const fx_tensor *mean;         /* out [rows], or NULL (always NULL for rms) */
    const fx_tensor *rstd;         /* out [rows], or NULL */
} fx_norm_fwd_args;

typedef struct fx_norm_bwd_args {
    fx_norm_dims n;
    int kind;
    double eps;
    const fx_tensor *xs; /* what was normalised: residual_out, or x without a residual */
    const fx_tensor *weight;
    const fx_tensor *bias, *gate;  /* NULL when not given */
    const fx_tensor *mean, *rstd;  /* as the forward saved them (mean NULL for rms) */
    const fx_tensor *dy;
    const fx_tensor *dresidual_out; /* NULL when not given */
    const fx_tensor *dx, *dweight;  /* out */
    const fx_tensor *dbias, *dresidual, *dgate; /* out, where bias, residual, gate were given */
} fx_norm_bwd_args;

struct fx_norm_ops {
    int (*forward)(const fx_exec *ex, const fx_norm_fwd_args *args, fx_status *st);
    int (*backward)(const fx_exec *ex, const fx_norm_bwd_args *args, fx_status *st);
    /* The most scratch bytes forward (none on either backend today) and
     * backward ask of `ex`, from the shapes, types and options alone;
     * SIZE_MAX where that overflows. */
    size_t (*forward_scratch)(const fx_exec *ex, const fx_norm_fwd_args *args);
    size_t (*backward_scratch)(const fx_exec *ex, const fx_norm_bwd_args *args);
};

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_NORM_H */
