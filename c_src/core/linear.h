/* The op layer of the linear layers (include/fusex_linear.h): validation
 * (every message names the argument and its layout), the `_into` ops on a
 * launch context, their scratch queries, the allocating forms and the
 * context a forward keeps for its backward.
 *
 * Inputs:     x [..., in], w [out, in], bias [out] (optional)
 * Attributes: activation (fx_activation), allow_tf32
 * Forward:    y [..., out]; pre [..., out] (optional: the pre-activation,
 *             what the backward of gelu and silu reads)
 * Backward:   reads x, w, bias, y (relu, tanh, sigmoid), pre (gelu, silu),
 *             dy [..., out]; writes dx, dw, dbias (where a bias was given)
 *
 * Every check reads shapes and types only (tensors with a NULL data are
 * fine), so a surface can ask for the results' shapes ahead of a run. */
#ifndef FX_CORE_LINEAR_H
#define FX_CORE_LINEAR_H

#include "core/runtime.h"
#include "fusex_linear.h"

typedef struct fx_linear_inputs {
    const fx_tensor *x, *w;
    const fx_tensor *bias; /* NULL when not given */
    int activation;
    bool allow_tf32;
} fx_linear_inputs;

/* The gradient outputs: dbias NULL exactly when no bias was given. */
typedef struct fx_linear_grad_outs {
    const fx_tensor *dx, *dw, *dbias;
} fx_linear_grad_outs;

/* Checks the inputs and the attributes and fills the dimensions. */
int fx_linear_check(const fx_linear_inputs *in, fx_linear_dims *n, fx_status *st);
/* A backward's inputs: the forward's, y and pre (each exactly where the
 * activation's derivative reads it), dy; not the gradients. */
int fx_linear_check_backward(const fx_linear_inputs *in, const fx_tensor *y, const fx_tensor *pre,
                             const fx_tensor *dy, fx_linear_dims *n, fx_status *st);
/* The shape of y, pre and dy: x's with the last dimension `out`. */
int fx_linear_output_shape(const fx_tensor *x, int64_t out, int64_t dims[FX_MAX_RANK]);

/* The ops into outputs the caller allocated, on `ex` (NULL: the device's
 * own context). forward: y, and pre or NULL. backward: y exactly where
 * fx_linear_reads_output(activation), pre exactly where
 * fx_linear_reads_pre(activation) (NULL otherwise), dy, the gradients. */
int fx_op_linear_forward_into(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                              const fx_tensor *pre, fx_status *st);
int fx_op_linear_backward_into(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                               const fx_tensor *pre, const fx_tensor *dy, const fx_linear_grad_outs *g,
                               fx_status *st);
/* The most scratch bytes the `_into` op with these arguments asks of `ex`
 * (shapes alone; 0 where the arguments do not pass the checks: the op then
 * fails before it asks). */
size_t fx_op_linear_forward_scratch(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                                    const fx_tensor *pre);
size_t fx_op_linear_backward_scratch(const fx_exec *ex, const fx_linear_inputs *in, const fx_tensor *y,
                                     const fx_tensor *pre, const fx_tensor *dy, const fx_linear_grad_outs *g);

/* What a forward keeps for its backward: references to x, w, bias and to
 * what the activation's derivative reads (y or pre; pre allocated by the
 * forward). A tensor with no buffer was not given / is not kept. */
typedef struct fx_linear_ctx {
    fx_linear_dims n;
    fx_tensor x, w, bias, y, pre;
    int activation;
    bool allow_tf32;
} fx_linear_ctx;

typedef struct fx_linear_grads {
    fx_tensor dx, dw, dbias; /* dbias without a buffer when there was no bias */
} fx_linear_grads;

/* Allocates y and runs the forward on the device's own context; with `ctx`
 * non-NULL also keeps a context (the pre-activation computed too where the
 * backward reads it). On failure nothing is left allocated. */
int fx_op_linear_forward(const fx_linear_inputs *in, fx_tensor *y, fx_linear_ctx **ctx, fx_status *st);
void fx_linear_ctx_free(fx_linear_ctx *ctx);
/* Device bytes the context holds beyond its references to the inputs and y. */
size_t fx_linear_ctx_saved_bytes(const fx_linear_ctx *ctx);
int fx_op_linear_backward(const fx_linear_ctx *ctx, const fx_tensor *dy, fx_linear_grads *g, fx_status *st);
void fx_linear_grads_release(fx_linear_grads *g);

#endif
