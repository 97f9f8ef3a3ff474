/* The op layer of the GRU and LSTM layers (include/fusex_rnn.h): checks
 * whose messages name the argument and its layout ("layers[1].w_hh:
 * expected shape {1536,512} ([3*hidden, hidden]), got {1536,256}"), the
 * `_into` ops on a launch context, their scratch queries, the allocating
 * forms and the context a training forward keeps for its backward.
 *
 * Every check reads shapes, types and devices only, never `data` (a
 * shape-only tensor, data NULL, is checked the same way), except the
 * in-place step's test that its states share no byte with what it reads,
 * which skips tensors without data. */
#ifndef FX_CORE_RNN_H
#define FX_CORE_RNN_H

#include <stdbool.h>

#include "core/runtime.h"
#include "fusex_rnn.h"

/* "gru", "lstm" (NULL for another value). */
const char *fx_rnn_cell_name(int cell);

/* The inputs of one call. `layer` holds `layers` entries; h0 and c0 are
 * NULL when absent (c0 is the LSTM's only; a step ignores both). `path`:
 * FX_RNN_PATH_* (0 outside tests). */
typedef struct fx_rnn_inputs {
    int cell; /* fx_rnn_cell */
    int64_t layers;
    const fx_rnn_layer *layer;
    const fx_tensor *x; /* [batch, seqlen, input]; a step's [batch, input] */
    const fx_tensor *h0, *c0;
    int path;
} fx_rnn_inputs;

/* Gradient outputs the caller allocated: dx; dh0, dc0 exactly where h0, c0
 * were given (else NULL); `layer` holds one entry per layer, db_ih, db_hh
 * exactly where the biases were given. */
typedef struct fx_rnn_grad_outs {
    const fx_tensor *dx, *dh0, *dc0;
    const fx_rnn_layer_grads *layer;
} fx_rnn_grad_outs;

/* The state type of a recurrence over x of type `x_type`: f32, or f64 for
 * f64. */
fx_dtype fx_rnn_state_type(fx_dtype x_type);

/* Checks a forward's (and a backward's) inputs and fills the dimensions. */
int fx_rnn_check_forward(const fx_rnn_inputs *in, fx_rnn_dims *n, fx_status *st);
/* Checks a step's inputs (x [batch, input]) and its states: h, and c for
 * the LSTM (NULL for the GRU), [layers, batch, hidden] of the state type,
 * sharing no byte with each other or with what the step reads. */
int fx_rnn_check_step(const fx_rnn_inputs *in, const fx_tensor *h, const fx_tensor *c, fx_rnn_dims *n,
                      fx_status *st);
/* Checks a backward's inputs: the forward's, its saved tensor (required
 * unless the problem is empty) and the cotangents dy, dh_n, dc_n (each
 * NULL: zeros). */
int fx_rnn_check_backward(const fx_rnn_inputs *in, const fx_tensor *saved, const fx_tensor *dy,
                          const fx_tensor *dh_n, const fx_tensor *dc_n, fx_rnn_dims *n, fx_status *st);
/* The saved tensor's shape for a forward of n: [layers, batch, seqlen,
 * fx_rnn_saved_width]; its type is fx_rnn_state_type. Returns the rank, 4. */
int fx_rnn_saved_shape(const fx_rnn_dims *n, int64_t dims[4]);

/* The ops into outputs the caller allocated, on `ex` (NULL: the device's
 * own context). Every input and output is checked first.
 * forward: y [batch, seqlen, hidden] of x's type; h_n, c_n (NULL, or
 * [layers, batch, hidden] of the state type; c_n LSTM only); saved (NULL
 * for inference, or fx_rnn_saved_shape: what the backward reads).
 * backward: the forward's inputs, its saved tensor, dy, dh_n, dc_n (each
 * NULL: zeros) and the gradients.
 * step: h (and c) updated in place, y [batch, hidden] of x's type. */
int fx_op_rnn_forward_into(const fx_exec *ex, const fx_rnn_inputs *in, const fx_tensor *y, const fx_tensor *h_n,
                           const fx_tensor *c_n, const fx_tensor *saved, fx_status *st);
int fx_op_rnn_backward_into(const fx_exec *ex, const fx_rnn_inputs *in, const fx_tensor *saved,
                            const fx_tensor *dy, const fx_tensor *dh_n, const fx_tensor *dc_n,
                            const fx_rnn_grad_outs *grads, fx_status *st);
int fx_op_rnn_step_into(const fx_exec *ex, const fx_rnn_inputs *in, const fx_tensor *h, const fx_tensor *c,
                        const fx_tensor *y, fx_status *st);

/* The most scratch bytes the `_into` ops ask of `ex` for these inputs
 * (`training`: with a saved tensor; the backward's with dy, dh_n, dc_n
 * given or not as `has_*` say), from shapes, types and the device alone:
 * an arena of that size is enough. 0 for an empty problem; SIZE_MAX when
 * the inputs fail their checks or the size does not fit. */
size_t fx_op_rnn_forward_scratch(const fx_exec *ex, const fx_rnn_inputs *in, bool training);
size_t fx_op_rnn_backward_scratch(const fx_exec *ex, const fx_rnn_inputs *in, bool has_dy, bool has_dh_n,
                                  bool has_dc_n);
size_t fx_op_rnn_step_scratch(const fx_exec *ex, const fx_rnn_inputs *in);

/* ---- allocating forms ---- */

/* What a training forward keeps: references to every input buffer (the
 * layers' parameters included) and the saved tensor. */
typedef struct fx_rnn_ctx {
    fx_rnn_dims n;
    int path;
    fx_tensor x, h0, c0;     /* no buffer where not given */
    fx_tensor *params;       /* [layers][4]: w_ih, w_hh, b_ih, b_hh */
    fx_rnn_layer *layer;     /* [layers], pointing into params */
    fx_tensor saved;
} fx_rnn_ctx;

/* The gradients of a backward: dx, dh0 and dc0 (no buffer where h0, c0
 * were not given), and per layer dw_ih, dw_hh, db_ih, db_hh. */
typedef struct fx_rnn_grads {
    int64_t layers;
    fx_tensor dx, dh0, dc0;
    fx_tensor *params; /* [layers][4] */
} fx_rnn_grads;

/* Runs the forward: allocates y and, with `return_state`, h_n (and c_n
 * for the LSTM); with `ctx` non-NULL also keeps a context for the
 * backward (a training forward: the saved tensor). Nothing is left
 * allocated on failure. */
int fx_op_rnn_forward(const fx_rnn_inputs *in, bool return_state, fx_tensor *y, fx_tensor *h_n, fx_tensor *c_n,
                      fx_rnn_ctx **ctx, fx_status *st);
void fx_rnn_ctx_free(fx_rnn_ctx *ctx);
/* Device bytes the context holds beyond its references to the inputs. */
size_t fx_rnn_ctx_saved_bytes(const fx_rnn_ctx *ctx);
/* The inputs the context holds, as a forward took them. */
void fx_rnn_ctx_inputs(const fx_rnn_ctx *ctx, fx_rnn_inputs *in);

/* Every gradient of the forward's inputs from dy, dh_n and dc_n (each
 * NULL: zeros). */
int fx_op_rnn_backward(const fx_rnn_ctx *ctx, const fx_tensor *dy, const fx_tensor *dh_n, const fx_tensor *dc_n,
                       fx_rnn_grads *grads, fx_status *st);
void fx_rnn_grads_release(fx_rnn_grads *g);

/* One step of every layer: h (and c) in place, y allocated [batch, hidden]. */
int fx_op_rnn_step(const fx_rnn_inputs *in, const fx_tensor *h, const fx_tensor *c, fx_tensor *y, fx_status *st);

#endif
