/* The op layer of causal_conv1d (include/fusex_conv.h): validation
 * (messages name the argument and its layout), the `_into` ops on a launch
 * context with their scratch queries, the allocating forms and the context
 * a forward keeps for its backward.
 *
 * Inputs:     x [batch, seqlen, dim], w [dim, width], bias [dim] (optional),
 *             initial_state [batch, dim, width - 1] (optional)
 * Attributes: activation (none or silu)
 * Forward:    y [batch, seqlen, dim]; final_state [batch, dim, width - 1]
 *             (optional: return_state)
 * Backward:   reads the forward's inputs, dy, dfinal_state (optional);
 *             writes dx, dw, and dbias, dinitial_state where given
 * Step:       state [batch, dim, width - 1] in place, x [batch, dim], w,
 *             bias; writes y [batch, dim]
 *
 * Every check reads shapes and types only (data may be NULL; the step's
 * overlap check skips such tensors). */
#ifndef FX_CORE_CONV_H
#define FX_CORE_CONV_H

#include "core/runtime.h"
#include "fusex_conv.h"

typedef struct fx_conv_inputs {
    const fx_tensor *x, *w;
    const fx_tensor *bias, *initial_state; /* NULL when not given (initial_state: never for the step) */
    int activation;                        /* FX_ACT_NONE or FX_ACT_SILU */
} fx_conv_inputs;

typedef struct fx_conv_grad_outs {
    const fx_tensor *dx, *dw;
    const fx_tensor *dbias, *dinitial_state; /* exactly where bias, initial_state were given */
} fx_conv_grad_outs;

/* A forward's inputs; fills the dimensions. */
int fx_conv_check(const fx_conv_inputs *in, fx_conv_dims *n, fx_status *st);
/* A backward's inputs: the forward's, dy and dfinal_state (NULL: not
 * given); not the gradients. */
int fx_conv_check_backward(const fx_conv_inputs *in, const fx_tensor *dy, const fx_tensor *dfinal_state,
                           fx_conv_dims *n, fx_status *st);
/* A step's: x [batch, dim] and the state. */
int fx_conv_check_step(const fx_tensor *state, const fx_conv_inputs *in, fx_conv_dims *n, fx_status *st);

int fx_op_conv_forward_into(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *y,
                            const fx_tensor *final_state, fx_status *st);
int fx_op_conv_backward_into(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *dy,
                             const fx_tensor *dfinal_state, const fx_conv_grad_outs *g, fx_status *st);
int fx_op_conv_step_into(const fx_exec *ex, const fx_tensor *state, const fx_conv_inputs *in, const fx_tensor *y,
                         fx_status *st);
/* The most scratch the `_into` ops ask of `ex` (shapes alone; 0 where the
 * arguments do not pass the checks). The step asks for none. */
size_t fx_op_conv_forward_scratch(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *y,
                                  const fx_tensor *final_state);
size_t fx_op_conv_backward_scratch(const fx_exec *ex, const fx_conv_inputs *in, const fx_tensor *dy,
                                   const fx_tensor *dfinal_state, const fx_conv_grad_outs *g);

/* What a forward keeps: references to its inputs (no buffer: not given). */
typedef struct fx_conv_ctx {
    fx_conv_dims n;
    fx_tensor x, w, bias, initial_state;
    int activation;
} fx_conv_ctx;

typedef struct fx_conv_grads {
    fx_tensor dx, dw, dbias, dinitial_state; /* no buffer where the input was not given */
} fx_conv_grads;

/* Allocates y and, with return_state, the final state; runs on the
 * device's own context; with ctx non-NULL keeps a context. On failure
 * nothing is left allocated. */
int fx_op_conv_forward(const fx_conv_inputs *in, bool return_state, fx_tensor *y, fx_tensor *final_state,
                       fx_conv_ctx **ctx, fx_status *st);
void fx_conv_ctx_free(fx_conv_ctx *ctx);
int fx_op_conv_backward(const fx_conv_ctx *ctx, const fx_tensor *dy, const fx_tensor *dfinal_state,
                        fx_conv_grads *g, fx_status *st);
void fx_conv_grads_release(fx_conv_grads *g);
/* One step: updates `state` in place and returns y [batch, dim]. */
int fx_op_conv_step(const fx_tensor *state, const fx_conv_inputs *in, fx_tensor *y, fx_status *st);

#endif
