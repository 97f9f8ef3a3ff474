/* The op layer of rms_norm and layer_norm (include/fusex_norm.h):
 * validation (messages name the argument and its layout), the `_into` ops
 * on a launch context with their scratch queries, the allocating forms and
 * the context a forward keeps for its backward.
 *
 * Inputs:     x [..., hidden], weight [hidden], bias [hidden] (optional),
 *             residual [..., hidden] (optional), gate [..., hidden] (optional)
 * Attributes: kind (rms or layer), eps, residual_in_f32
 * Forward:    y [..., hidden]; residual_out [..., hidden] (s = x + residual,
 *             exactly where a residual is given; "s" in messages); mean [rows] (layer only) and rstd [rows]
 *             (optional: what the backward reads)
 * Backward:   reads residual_out (where a residual was given), weight,
 *             bias, gate, mean, rstd, dy, dresidual_out (optional; "ds" in
 *             messages, the gradient reaching s); writes
 *             dx, dweight, and dbias, dresidual, dgate where their inputs
 *             were given
 *
 * Every check reads shapes and types only (data may be NULL). */
#ifndef FX_CORE_NORM_H
#define FX_CORE_NORM_H

#include "core/runtime.h"
#include "fusex_norm.h"

typedef struct fx_norm_inputs {
    int kind; /* fx_norm_kind */
    double eps;
    const fx_tensor *x, *weight;
    const fx_tensor *bias, *residual, *gate; /* NULL when not given */
    bool residual_in_f32;                    /* residual_out in f32 (else the residual's type) */
} fx_norm_inputs;

typedef struct fx_norm_grad_outs {
    const fx_tensor *dx, *dweight;
    const fx_tensor *dbias, *dresidual, *dgate; /* exactly where bias, residual, gate were given */
} fx_norm_grad_outs;

/* "rms_norm" or "layer_norm". */
const char *fx_norm_name(int kind);
/* Checks the inputs and attributes and fills the dimensions. */
int fx_norm_check(const fx_norm_inputs *in, fx_norm_dims *n, fx_status *st);
/* A backward's inputs (the forward's, what it saved, dy, dresidual_out
 * or NULL); not the gradients. */
int fx_norm_check_backward(const fx_norm_inputs *in, const fx_tensor *residual_out, const fx_tensor *mean,
                           const fx_tensor *rstd, const fx_tensor *dy, const fx_tensor *dresidual_out,
                           fx_norm_dims *n, fx_status *st);
/* mean's and rstd's type: f32, or f64 for f64 x. */
fx_dtype fx_norm_stat_type(fx_dtype x_type);
/* residual_out's type (a residual given): f32 when residual_in_f32, else
 * the residual's. */
fx_dtype fx_norm_residual_out_type(const fx_norm_inputs *in);

int fx_op_norm_forward_into(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *y,
                            const fx_tensor *residual_out, const fx_tensor *mean, const fx_tensor *rstd,
                            fx_status *st);
int fx_op_norm_backward_into(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *residual_out,
                             const fx_tensor *mean, const fx_tensor *rstd, const fx_tensor *dy,
                             const fx_tensor *dresidual_out, const fx_norm_grad_outs *g, fx_status *st);
/* The most scratch the `_into` ops ask of `ex` (shapes alone; 0 where the
 * arguments do not pass the checks). */
size_t fx_op_norm_forward_scratch(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *y,
                                  const fx_tensor *residual_out, const fx_tensor *mean, const fx_tensor *rstd);
size_t fx_op_norm_backward_scratch(const fx_exec *ex, const fx_norm_inputs *in, const fx_tensor *residual_out,
                                   const fx_tensor *mean, const fx_tensor *rstd, const fx_tensor *dy,
                                   const fx_tensor *dresidual_out, const fx_norm_grad_outs *g);

/* What a forward keeps: references to its inputs and to residual_out, and
 * the statistics it saved (a tensor without a buffer: not given / none). */
typedef struct fx_norm_ctx {
    fx_norm_dims n;
    int kind;
    double eps;
    bool residual_in_f32;
    fx_tensor x, weight, bias, residual, gate, residual_out, mean, rstd;
} fx_norm_ctx;

typedef struct fx_norm_grads {
    fx_tensor dx, dweight, dbias, dresidual, dgate; /* no buffer where the input was not given */
} fx_norm_grads;

/* Allocates y and, with a residual, residual_out; runs the forward on the
 * device's own context; with ctx non-NULL keeps a context (and the
 * statistics). On failure nothing is left allocated. */
int fx_op_norm_forward(const fx_norm_inputs *in, fx_tensor *y, fx_tensor *residual_out, fx_norm_ctx **ctx,
                       fx_status *st);
void fx_norm_ctx_free(fx_norm_ctx *ctx);
/* Device bytes the context holds beyond its references (the statistics). */
size_t fx_norm_ctx_saved_bytes(const fx_norm_ctx *ctx);
int fx_op_norm_backward(const fx_norm_ctx *ctx, const fx_tensor *dy, const fx_tensor *dresidual_out,
                        fx_norm_grads *g, fx_status *st);
void fx_norm_grads_release(fx_norm_grads *g);

#endif
