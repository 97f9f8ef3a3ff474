/* The op layer of the selective scan: validation (every message names the
 * argument and its layout), output allocation, the context a forward saves
 * for its backward, and dispatch to the device's backend. */
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

/* What a forward keeps for its backward: its own references to the input
 * buffers (a tensor with a NULL buffer was not given) and, on backends whose
 * backward reads them, the states entering every chunk of
 * fx_ssm_save_every steps. */
typedef struct fx_ssm_ctx {
    fx_ssm_dims n;
    fx_tensor x, dt, a, b, c, d, z, dt_bias, h0;
    bool dt_softplus;
    fx_tensor saved; /* [batch, nsaved, dim, dstate] of the state type, or no buffer */
} fx_ssm_ctx;

/* One gradient per input; no buffer for options that were not given. */
typedef struct fx_ssm_grads {
    fx_tensor x, dt, a, b, c, d, z, dt_bias, h0;
} fx_ssm_grads;

/* Gradient outputs the caller allocated: one per input given, NULL for
 * the inputs that were not. */
typedef struct fx_ssm_grad_outs {
    const fx_tensor *x, *dt, *a, *b, *c, *d, *z, *dt_bias, *h0;
} fx_ssm_grad_outs;

/* Checks a forward's inputs and fills the dimensions. */
int fx_ssm_check_forward(const fx_ssm_inputs *in, fx_ssm_dims *n, fx_status *st);
/* Checks a step's inputs (x, dt [batch, dim]; b, c [batch, dstate] or
 * [batch, groups, dstate]) and its state. */
int fx_ssm_check_step(const fx_tensor *state, const fx_ssm_inputs *in, fx_ssm_dims *n,
                      fx_status *st);
/* The type of the states of a scan whose x has type `x_type`. */
fx_dtype fx_ssm_state_type(fx_dtype x_type);
/* The shape of the saved states of a forward of n (fx_ssm_save_every);
 * returns their rank, 4. Their type is fx_ssm_state_type. */
int fx_ssm_saved_shape(const fx_ssm_dims *n, fx_dtype x_type, int64_t dims[4]);
/* Checks sizes given on their own (not as tensors: a caller sizing the
 * saved states ahead of a run): batch, seqlen, dim >= 0, dstate >= 1,
 * groups >= 1 dividing dim, and x, b and the saved states' element counts
 * within 2^48. Check before fx_ssm_saved_shape or fx_ssm_save_every. */
int fx_ssm_check_dims(const fx_ssm_dims *n, fx_dtype x_type, fx_status *st);

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

/* Runs the forward: allocates y and, when asked, the final state; with
 * `ctx` non-NULL also saves a context (free it with fx_ssm_ctx_free). On
 * failure nothing is left allocated. */
int fx_op_ssm_forward(const fx_ssm_inputs *in, bool return_state, fx_tensor *y,
                      fx_tensor *state, fx_ssm_ctx **ctx, fx_status *st);
void fx_ssm_ctx_free(fx_ssm_ctx *ctx);
/* Device bytes the context holds beyond its references to the inputs. */
size_t fx_ssm_ctx_saved_bytes(const fx_ssm_ctx *ctx);

/* The gradients of every input given to the forward, from dy and the
 * optional gradient of the final state. */
int fx_op_ssm_backward(const fx_ssm_ctx *ctx, const fx_tensor *dy, const fx_tensor *dstate,
                       fx_ssm_grads *grads, fx_status *st);
void fx_ssm_grads_release(fx_ssm_grads *g);

/* One time step: updates `state` in place and returns y [batch, dim]. */
int fx_op_ssm_step(const fx_tensor *state, const fx_ssm_inputs *in, fx_tensor *y,
                   fx_status *st);

#endif
