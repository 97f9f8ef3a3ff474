/* The op layer for the linear recurrences (generic scan, MinGRU, MinLSTM,
 * Liquid): validates every tensor against the op's layout, allocates the
 * outputs and calls the device's backend. Messages name the op's own
 * arguments ("z_logits", "cand", "tau", ...). Its ops' descriptions
 * (c_src/core/op.h) are in linrec_op.c. */
#ifndef FX_CORE_LINREC_H
#define FX_CORE_LINREC_H

#include <stdbool.h>

#include "core/runtime.h"
#include "fusex_linrec.h"

/* "linear_scan", "mingru", "minlstm", "liquid". */
const char *fx_linrec_op_name(int kind);
/* The number of sequence inputs of `kind` and the name of the i-th
 * ("a", "b"; "z_logits", "cand"; ...). */
int fx_linrec_nseq(int kind);
const char *fx_linrec_seq_name(int kind, int i);

/* The inputs of one call of a recurrence (the caller's; never written). */
typedef struct fx_linrec_inputs {
    int kind; /* fx_linrec_kind */
    const fx_tensor *seq[FX_LINREC_MAX_SEQ]; /* the first fx_linrec_nseq(kind) */
    const fx_tensor *tau, *lam;               /* liquid: [hidden] */
    const fx_tensor *dt;                      /* liquid: a tensor, or NULL: dt_value */
    double dt_value;
    bool candidate_g; /* mingru, minlstm: c~ = g(cand) */
    bool reverse;
    const fx_tensor *h0; /* forward and backward: [batch, hidden], or NULL (zeros); not a step's */
} fx_linrec_inputs;

/* Checks a forward's inputs (the sequences [batch, seqlen, hidden], liquid's
 * tau, a and dt, and h0) and fills `p`, the backend's problem: the
 * inputs with their dims and dtype. */
int fx_linrec_check_forward(const fx_linrec_inputs *in, fx_linrec_problem *p, fx_status *st);
/* The same for a backward: the forward's inputs, then h (the forward's
 * output), dh and dstate (NULL: zeros). */
int fx_linrec_check_backward(const fx_linrec_inputs *in, const fx_tensor *h, const fx_tensor *dh,
                             const fx_tensor *dstate, fx_linrec_problem *p, fx_status *st);
/* The same for a step: the frames [batch, hidden] (a dt tensor
 * [batch, 1]) and the state. (That the state the step writes shares no
 * byte with them is checked where it is written, fx_op_linrec_step_into:
 * an XLA step writes a copy.) */
int fx_linrec_check_step(const fx_linrec_inputs *in, const fx_tensor *state, fx_linrec_problem *p,
                         fx_status *st);

/* The ops into outputs the caller allocated (fusex tensors or foreign
 * memory, such as XLA's buffers), on the launch context `ex` (NULL: the
 * device's own). Every input and output is checked first.
 * forward: h [batch, seqlen, hidden] of the inputs' dtype, state (or NULL)
 * [batch, hidden] of the state dtype, both on the inputs' device.
 * max_tile_steps: see fx_linrec_fwd_args (0 for the backend's choice). */
int fx_op_linrec_forward_into(const fx_exec *ex, const fx_linrec_inputs *in, int max_tile_steps,
                              const fx_tensor *h, const fx_tensor *state, fx_status *st);
/* Gradient outputs: one per input given, NULL for the inputs that were
 * not (h0, a dt tensor, tau and a outside liquid, sequences past the op's
 * count). */
typedef struct fx_linrec_grad_outs {
    const fx_tensor *seq[FX_LINREC_MAX_SEQ];
    const fx_tensor *tau, *lam, *dt, *h0;
} fx_linrec_grad_outs;
/* backward: h (the forward's output), dh, dstate (or NULL), the gradients,
 * each shaped and typed as its input. */
int fx_op_linrec_backward_into(const fx_exec *ex, const fx_linrec_inputs *in, const fx_tensor *h,
                               const fx_tensor *dh, const fx_tensor *dstate, int max_tile_steps,
                               const fx_linrec_grad_outs *grads, fx_status *st);
/* step: updates `state` in place and writes the new h into `h`
 * ([batch, hidden], the inputs' dtype). */
int fx_op_linrec_step_into(const fx_exec *ex, const fx_linrec_inputs *in, const fx_tensor *state,
                           const fx_tensor *h, fx_status *st);

/* The most scratch bytes the `_into` ops ask of `ex` (NULL: the device's
 * own context), from shapes alone; 0 where the tensors do not pass the
 * checks or nothing is scanned (the step asks for none). */
size_t fx_op_linrec_forward_scratch(const fx_exec *ex, const fx_linrec_inputs *in, int max_tile_steps,
                                    const fx_tensor *h, const fx_tensor *state);
size_t fx_op_linrec_backward_scratch(const fx_exec *ex, const fx_linrec_inputs *in, const fx_tensor *h,
                                     const fx_tensor *dh, const fx_tensor *dstate, int max_tile_steps,
                                     const fx_linrec_grad_outs *grads);

/* One tensor per input of a recurrence; entries for inputs that were not
 * given (h0, a dt tensor, tau/lam outside liquid) stay empty (zeroed
 * structs): the gradients of the allocating backward. */
typedef struct fx_linrec_tensors {
    fx_tensor seq[FX_LINREC_MAX_SEQ];
    fx_tensor tau, lam, dt, h0;
} fx_linrec_tensors;
void fx_linrec_tensors_release(fx_linrec_tensors *t);
typedef fx_linrec_tensors fx_linrec_grads;
/* Points at the gradients `g` holds (an entry without a buffer: NULL). */
fx_linrec_grad_outs fx_linrec_grad_outs_of(const fx_linrec_grads *g);
/* Allocates a gradient for every input `in` gives, like it. */
int fx_linrec_grads_alloc(const fx_linrec_inputs *in, fx_linrec_grads *grads, fx_status *st);

/* The allocating forms (C programs and tests; the NIF and the XLA handlers
 * run through the descriptions, c_src/core/op.h). On failure nothing is
 * left allocated. forward: h and, when `want_state`, state. backward: the
 * gradients. step: h, the state updated in place. */
int fx_op_linrec_forward(const fx_linrec_inputs *in, bool want_state, int max_tile_steps, fx_tensor *h,
                         fx_tensor *state, fx_status *st);
int fx_op_linrec_backward(const fx_linrec_inputs *in, const fx_tensor *h, const fx_tensor *dh,
                          const fx_tensor *dstate, int max_tile_steps, fx_linrec_grads *grads, fx_status *st);
int fx_op_linrec_step(const fx_linrec_inputs *in, const fx_tensor *state, fx_tensor *h, fx_status *st);

#endif
