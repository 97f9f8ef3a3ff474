/* The op layer for the linear recurrences (generic scan, MinGRU, MinLSTM,
 * Liquid): validates every tensor against the op's layout, allocates the
 * outputs and calls the device's backend. Messages name the op's own
 * arguments ("z_logits", "cand", "tau", ...). */
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

/* Forward. The caller sets p->kind, p->seq[0..nseq), and for liquid tau,
 * lam and dt (tensor) or dt_value; candidate_g and reverse. This checks
 * them and h0 (NULL: zeros), fills in the dims and dtype, allocates `h`
 * and, when `want_state`, `state`, and runs the op. On failure nothing is
 * left allocated. */
int fx_op_linrec_forward(fx_linrec_problem *p, const fx_tensor *h0, bool want_state,
                         int max_tile_steps, fx_tensor *h, fx_tensor *state, fx_status *st);
/* The same into outputs the caller allocated (and the tests poison):
 * h [batch, seqlen, hidden] of the inputs' dtype, state (or NULL)
 * [batch, hidden] of the state dtype, both on the inputs' device. `ex`:
 * the launch context to run on (NULL: the device's own); every `_into`
 * op takes one, and the allocating forms run theirs with NULL. */
int fx_op_linrec_forward_into(const fx_exec *ex, fx_linrec_problem *p, const fx_tensor *h0,
                              int max_tile_steps, const fx_tensor *h, const fx_tensor *state, fx_status *st);

/* One tensor per input of a recurrence; entries for inputs that were not
 * given (h0, a dt tensor, tau/lam outside liquid) stay empty (zeroed
 * structs). What a forward's context keeps, and the gradients. */
typedef struct fx_linrec_tensors {
    fx_tensor seq[FX_LINREC_MAX_SEQ];
    fx_tensor tau, lam, dt, h0;
} fx_linrec_tensors;
void fx_linrec_tensors_release(fx_linrec_tensors *t);

/* Gradients, each shaped and typed as its input. */
typedef fx_linrec_tensors fx_linrec_grads;

/* Backward of a forward run with problem `p` (as the forward filled it),
 * `h0` and output `h`: checks dh ([batch, seqlen, hidden], p's dtype) and
 * dstate (NULL: zeros), allocates the gradients and runs the op. */
int fx_op_linrec_backward(const fx_linrec_problem *p, const fx_tensor *h0, const fx_tensor *h,
                          const fx_tensor *dh, const fx_tensor *dstate, int max_tile_steps,
                          fx_linrec_grads *grads, fx_status *st);
/* Gradient outputs the caller allocated (fusex tensors or foreign memory,
 * such as XLA's buffers): one per input given, NULL for the inputs that
 * were not (h0, a dt tensor, tau and a outside liquid, sequences past the
 * op's count). */
typedef struct fx_linrec_grad_outs {
    const fx_tensor *seq[FX_LINREC_MAX_SEQ];
    const fx_tensor *tau, *lam, *dt, *h0;
} fx_linrec_grad_outs;
/* Points at the gradients `g` holds (an entry without a buffer: NULL). */
fx_linrec_grad_outs fx_linrec_grad_outs_of(const fx_linrec_grads *g);

/* The pieces of the above: allocate the gradient tensors for p and h0,
 * then run the backward into them. The backward checks p's inputs (as the
 * forward does), h0, h (the forward's output), dh, dstate and the
 * gradient outputs before it runs. */
int fx_linrec_grads_alloc(const fx_linrec_problem *p, const fx_tensor *h0, fx_linrec_grads *grads,
                          fx_status *st);
int fx_op_linrec_backward_into(const fx_exec *ex, const fx_linrec_problem *p, const fx_tensor *h0,
                               const fx_tensor *h, const fx_tensor *dh, const fx_tensor *dstate,
                               int max_tile_steps, const fx_linrec_grad_outs *grads, fx_status *st);

/* One frame: p as for the forward, but the sequence inputs are
 * [batch, hidden] and a dt tensor [batch, 1]. Updates `state` in place and
 * returns the new h in `h` (p's dtype). */
int fx_op_linrec_step(fx_linrec_problem *p, const fx_tensor *state, fx_tensor *h, fx_status *st);
/* Checks a step's inputs (as fx_op_linrec_step does) and its state, and
 * fills in p's dims and dtype, without running anything: for a caller
 * that must prepare the state before the step (an XLA custom call copies
 * it into its result first). */
int fx_linrec_check_step(fx_linrec_problem *p, const fx_tensor *state, fx_status *st);
/* The same into h [batch, hidden] (the inputs' dtype) the caller allocated. */
int fx_op_linrec_step_into(const fx_exec *ex, fx_linrec_problem *p, const fx_tensor *state, const fx_tensor *h,
                           fx_status *st);

#endif
