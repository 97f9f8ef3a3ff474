/* The op layer of the selective scan: validation (every message names the
 * argument and its layout), output allocation and dispatch to the device's
 * backend. Its ops' descriptions (c_src/core/op.h) are in ssm_op.c; what a
 * forward keeps for its backward is the op layer's generic context. */
#ifndef FX_CORE_SSM_H
#define FX_CORE_SSM_H

#include "core/runtime.h"
#include "fusex_ssm.h"

/* The tensors of one call; the options d, z, dt_bias, h0 are NULL when
 * absent (h0 is not an input of the step). */
typedef struct fx_ssm_inputs {
    const fx_tensor *x, *dt, *a, *b, *c;
    const fx_tensor *d, *z, *dt_bias, *h0;
    bool dt_softplus;
} fx_ssm_inputs;

/* Gradient outputs the caller allocated: one per input given, NULL for
 * the inputs that were not. */
typedef struct fx_ssm_grad_outs {
    const fx_tensor *x, *dt, *a, *b, *c, *d, *z, *dt_bias, *h0;
} fx_ssm_grad_outs;

/* Checks a forward's inputs and fills the dimensions. */
int fx_ssm_check_forward(const fx_ssm_inputs *in, fx_ssm_dims *n, fx_status *st);
/* Checks a backward's inputs: the forward's, its saved states (NULL where
 * there are none: a single chunk, or a backend whose backward reads none),
 * dy and dstate (or NULL). */
int fx_ssm_check_backward(const fx_ssm_inputs *in, const fx_tensor *saved, const fx_tensor *dy,
                          const fx_tensor *dstate, fx_ssm_dims *n, fx_status *st);
/* Checks a step's inputs (x, dt [batch, dim]; b, c [batch, dstate] or
 * [batch, groups, dstate]) and its state. */
int fx_ssm_check_step(const fx_tensor *state, const fx_ssm_inputs *in, fx_ssm_dims *n,
                      fx_status *st);
/* The type of the states of a scan whose x has type `x_type`. */
fx_dtype fx_ssm_state_dtype(fx_dtype x_type);
/* The shape of the saved states of a forward of n (fx_ssm_save_every);
 * returns their rank, 4. Their type is fx_ssm_state_dtype. */
int fx_ssm_saved_shape(const fx_ssm_dims *n, fx_dtype x_type, int64_t dims[4]);
/* Checks sizes given on their own (not as tensors: a caller sizing the
 * saved states ahead of a run): batch, seqlen, dim >= 0, dstate >= 1,
 * groups >= 1 dividing dim, and x, b and the saved states' element counts
 * within 2^48. Check before fx_ssm_saved_shape or fx_ssm_save_every. */
int fx_ssm_check_dims(const fx_ssm_dims *n, fx_dtype x_type, fx_status *st);
/* The sizes of a scan from the shapes of x ([batch, seqlen, dim]) and b
 * ([batch, seqlen, [groups,] dstate]) and x's type alone, checked as
 * fx_ssm_check_dims does: for a caller sizing the saved states
 * (the Erlang API's saved-shape query). */
int fx_ssm_dims_of_shapes(int x_rank, const int64_t *x, int b_rank, const int64_t *b, fx_dtype x_type,
                          fx_ssm_dims *n, fx_status *st);

/* The ops into outputs the caller allocated, on the launch context `ex`
 * (NULL: the device's own). Every input and output is checked first.
 * forward: y (x's shape and type), state (NULL, or [batch, dim, dstate]
 * of the state type), saved (NULL, or fx_ssm_saved_shape: filled for a
 * backward). backward: the forward's inputs and saved states (NULL where
 * the backend's backward does not read them), dy, dstate (or NULL), and
 * the gradients (saved may be NULL where there are none: a single chunk).
 * step: y [batch, dim] of x's type; state in place. */
int fx_op_ssm_forward_into(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *y, const fx_tensor *state,
                           const fx_tensor *saved, fx_status *st);
int fx_op_ssm_backward_into(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *saved,
                            const fx_tensor *dy, const fx_tensor *dstate, const fx_ssm_grad_outs *grads,
                            fx_status *st);
int fx_op_ssm_step_into(const fx_exec *ex, const fx_tensor *state, const fx_ssm_inputs *in, const fx_tensor *y,
                        fx_status *st);

/* The most scratch bytes the `_into` ops ask of `ex` (NULL: the device's
 * own context) for these tensors, from shapes alone; 0 where they do not
 * pass the checks or there is nothing to scan (the step asks for none). */
size_t fx_op_ssm_forward_scratch(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *y,
                                 const fx_tensor *state, const fx_tensor *saved);
size_t fx_op_ssm_backward_scratch(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *saved,
                                  const fx_tensor *dy, const fx_tensor *dstate, const fx_ssm_grad_outs *grads);

/* Runs the forward: allocates y and, when asked, the final state. On
 * failure nothing is left allocated. (A forward that keeps a context for
 * its backward runs through the op layer's descriptions: fx_op_run,
 * fx_op_ctx_new.) */
int fx_op_ssm_forward(const fx_ssm_inputs *in, bool return_state, fx_tensor *y, fx_tensor *state,
                      fx_status *st);

/* One time step: updates `state` in place and returns y [batch, dim]. */
int fx_op_ssm_step(const fx_tensor *state, const fx_ssm_inputs *in, fx_tensor *y,
                   fx_status *st);

#endif
