#include "core/linrec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/ops.h"
#include "fusex_dtype.h"

static const struct {
    const char *op;
    int nseq;
    const char *seq[FX_LINREC_MAX_SEQ];
} kinds[FX_LINREC_KIND_COUNT] = {
    [FX_LINREC_SCAN] = {"linear_scan", 2, {"a", "b"}},
    [FX_LINREC_MINGRU] = {"mingru", 2, {"z_logits", "cand"}},
    [FX_LINREC_MINLSTM] = {"minlstm", 3, {"f_logits", "i_logits", "cand"}},
    [FX_LINREC_LIQUID] = {"liquid", 1, {"f_logits"}},
};

const char *fx_linrec_op_name(int kind)
{
    return kind >= 0 && kind < FX_LINREC_KIND_COUNT ? kinds[kind].op : "?";
}

int fx_linrec_nseq(int kind)
{
    return kind >= 0 && kind < FX_LINREC_KIND_COUNT ? kinds[kind].nseq : 0;
}

const char *fx_linrec_seq_name(int kind, int i)
{
    return i >= 0 && i < fx_linrec_nseq(kind) ? kinds[kind].seq[i] : "?";
}

/* h0, a step's state and dstate: the sequence dtype or the state dtype. */
static int expect_state_type(fx_status *st, const char *arg, const fx_tensor *t, fx_dtype dtype)
{
    fx_dtype state = fx_linrec_state_dtype(dtype);
    if (t->dtype == dtype || t->dtype == state)
        return FX_OK;
    if (state == dtype)
        return fx_expect_dtype(st, arg, t, dtype);
    return fx_fail(st, FX_EBADARG, "%s: expected type %s or %s, got %s", arg, fx_dtype_name(dtype),
                   fx_dtype_name(state), fx_dtype_name(t->dtype));
}

static int expect_state_tensor(fx_status *st, const char *arg, const fx_tensor *t,
                               const fx_linrec_problem *p, const char *ref_arg)
{
    int64_t dims[2] = {p->batch, p->hidden};
    if (fx_expect_same_device(st, arg, t, p->seq[0]->device, ref_arg) ||
        expect_state_type(st, arg, t, p->dtype) ||
        fx_expect_shape(st, arg, t, 2, dims, "([batch, hidden])"))
        return st->code;
    return FX_OK;
}

static int expect_like(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *ref,
                       const char *ref_arg, int rank, const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, ref->device, ref_arg) ||
        fx_expect_dtype(st, arg, t, ref->dtype) || fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

/* A sequence input like the first one; the layout in the message is
 * formatted only when it is needed (this runs on every call). */
static int expect_seq_like(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *first,
                           const char *first_name, int rank, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, first->device, first_name) ||
        fx_expect_dtype(st, arg, t, first->dtype))
        return st->code;
    if (t->rank == rank && memcmp(t->dims, first->dims, sizeof(int64_t) * (size_t)rank) == 0)
        return FX_OK;
    char same[96];
    snprintf(same, sizeof same, "(%s, as %s)", layout, first_name);
    return fx_expect_shape(st, arg, t, rank, first->dims, same);
}

/* Checks the inputs of a forward (frame = 0) or a step (frame = 1) and
 * fills `p` with them, their dims and dtype. */
static int check_problem(const fx_linrec_inputs *in, int frame, fx_linrec_problem *p, fx_status *st)
{
    int kind = in->kind;
    memset(p, 0, sizeof *p);
    if (kind < 0 || kind >= FX_LINREC_KIND_COUNT)
        return fx_fail(st, FX_EINTERNAL, "linrec: unknown op kind %d", kind);
    p->kind = kind;
    p->nseq = kinds[kind].nseq;
    for (int i = 0; i < p->nseq; i++)
        p->seq[i] = in->seq[i];
    p->candidate_g = kind == FX_LINREC_MINGRU || kind == FX_LINREC_MINLSTM ? in->candidate_g : 0;
    p->reverse = in->reverse;
    const fx_tensor *first = p->seq[0];
    const char *first_name = kinds[kind].seq[0];
    const char *layout = frame ? "[batch, hidden]" : "[batch, seqlen, hidden]";
    int rank = frame ? 2 : 3;
    if (fx_expect_float(st, first_name, first, first->device->kind == FX_DEVICE_CPU) ||
        fx_expect_rank(st, first_name, first, rank, layout))
        return st->code;
    p->dtype = first->dtype;
    p->batch = first->dims[0];
    p->seqlen = frame ? 1 : first->dims[1];
    p->hidden = first->dims[rank - 1];

    for (int i = 1; i < p->nseq; i++)
        if (expect_seq_like(st, kinds[kind].seq[i], p->seq[i], first, first_name, rank, layout))
            return st->code;
    if (kind != FX_LINREC_LIQUID)
        return FX_OK;

    p->tau = in->tau;
    p->lam = in->lam;
    p->dt = in->dt;
    p->dt_value = in->dt ? 1.0 : in->dt_value;
    int64_t hidden[1] = {p->hidden};
    if (expect_like(st, "tau", p->tau, first, first_name, 1, hidden, "([hidden])") ||
        expect_like(st, "a", p->lam, first, first_name, 1, hidden, "([hidden])"))
        return st->code;
    if (p->dt) {
        int64_t dt_dims[3] = {p->batch, frame ? 1 : p->seqlen, 1};
        if (frame)
            return expect_like(st, "dt", p->dt, first, first_name, 2, dt_dims, "([batch, 1])");
        return expect_like(st, "dt", p->dt, first, first_name, 3, dt_dims, "([batch, seqlen, 1])");
    }
    if (!(p->dt_value > 0) || !isfinite(p->dt_value))
        return fx_fail(st, FX_EBADARG, "dt: expected a positive number or a tensor (%s), got %g",
                       frame ? "[batch, 1]" : "[batch, seqlen, 1]", p->dt_value);
    return FX_OK;
}

static const struct fx_linrec_ops *device_ops(const fx_device *dev)
{
    return dev->backend->linrec;
}

static int expect_impl(fx_status *st, const fx_device *dev, const void *fn, int kind,
                       const char *suffix)
{
    if (fn) /* (every call passes here: no formatting on the way) */
        return FX_OK;
    char what[64];
    snprintf(what, sizeof what, "fusex:%s%s", fx_linrec_op_name(kind), suffix);
    return fx_expect_op(st, dev, fn, what);
}

/* No channel to scan (a zero batch or hidden): the outputs are empty. The
 * test is on each dimension, not their product, which overflows for a
 * zero-element sequence like {2^48, 0, 2^22}. */
static bool no_channels(const fx_linrec_problem *p) { return p->batch == 0 || p->hidden == 0; }

/* Outputs the caller allocated: on the inputs' device, with the layout
 * the op writes. */
static int expect_output(fx_status *st, const char *arg, const fx_tensor *t, const fx_device *dev,
                         fx_dtype dtype, int rank, const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, dev, "the inputs") || fx_expect_dtype(st, arg, t, dtype) ||
        fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

int fx_linrec_check_forward(const fx_linrec_inputs *in, fx_linrec_problem *p, fx_status *st)
{
    if (check_problem(in, 0, p, st))
        return st->code;
    const struct fx_linrec_ops *ops = device_ops(p->seq[0]->device);
    if (expect_impl(st, p->seq[0]->device, (const void *)(ops ? ops->forward : NULL), p->kind, "") ||
        (in->h0 && expect_state_tensor(st, "h0", in->h0, p, kinds[p->kind].seq[0])))
        return st->code;
    return FX_OK;
}

static int check_forward_outputs(const fx_linrec_problem *p, const fx_tensor *h, const fx_tensor *state,
                                 fx_status *st)
{
    fx_device *dev = p->seq[0]->device;
    int64_t hdims[3] = {p->batch, p->seqlen, p->hidden}, sdims[2] = {p->batch, p->hidden};
    if (expect_output(st, "h", h, dev, p->dtype, 3, hdims, "([batch, seqlen, hidden])") ||
        (state && expect_output(st, "state", state, dev, fx_linrec_state_dtype(p->dtype), 2,
                                sdims, "([batch, hidden])")))
        return st->code;
    return FX_OK;
}

int fx_op_linrec_forward_into(const fx_exec *ex, const fx_linrec_inputs *in, int max_tile_steps,
                              const fx_tensor *h, const fx_tensor *state, fx_status *st)
{
    fx_linrec_problem p;
    if (fx_linrec_check_forward(in, &p, st) || check_forward_outputs(&p, h, state, st))
        return st->code;
    fx_device *dev = p.seq[0]->device;
    fx_exec own;
    if (no_channels(&p))
        return FX_OK;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (p.seqlen == 0) /* nothing to scan: the state is h0 */
        return state ? fx_op_cast_or_zero(ex, in->h0, state, st) : FX_OK;
    fx_linrec_fwd_args args = {.p = p, .h0 = in->h0, .h = h, .state = state, .max_tile_steps = max_tile_steps};
    return device_ops(dev)->forward(ex, &args, st);
}

size_t fx_op_linrec_forward_scratch(const fx_exec *ex, const fx_linrec_inputs *in, int max_tile_steps,
                                    const fx_tensor *h, const fx_tensor *state)
{
    fx_status st;
    fx_status_clear(&st);
    fx_linrec_problem p;
    fx_exec own;
    if (fx_linrec_check_forward(in, &p, &st) || no_channels(&p) || p.seqlen == 0 ||
        !(ex = fx_exec_resolve(p.seq[0]->device, ex, &own, &st)))
        return 0;
    fx_linrec_fwd_args args = {.p = p, .h0 = in->h0, .h = h, .state = state, .max_tile_steps = max_tile_steps};
    return device_ops(p.seq[0]->device)->forward_scratch(ex, &args);
}

int fx_op_linrec_forward(const fx_linrec_inputs *in, bool want_state, int max_tile_steps, fx_tensor *h,
                         fx_tensor *state, fx_status *st)
{
    memset(h, 0, sizeof *h);
    memset(state, 0, sizeof *state);
    fx_linrec_problem p;
    if (check_problem(in, 0, &p, st))
        return st->code;
    fx_device *dev = p.seq[0]->device;
    int64_t hdims[3] = {p.batch, p.seqlen, p.hidden}, sdims[2] = {p.batch, p.hidden};
    if (fx_tensor_alloc(dev, p.dtype, 3, hdims, h, st) ||
        (want_state && fx_tensor_alloc(dev, fx_linrec_state_dtype(p.dtype), 2, sdims, state, st)) ||
        fx_op_linrec_forward_into(NULL, in, max_tile_steps, h, want_state ? state : NULL, st)) {
        fx_tensor_release(h);
        fx_tensor_release(state);
    }
    return st->code;
}

void fx_linrec_tensors_release(fx_linrec_tensors *t)
{
    for (int i = 0; i < FX_LINREC_MAX_SEQ; i++)
        fx_tensor_release(&t->seq[i]);
    fx_tensor_release(&t->tau);
    fx_tensor_release(&t->lam);
    fx_tensor_release(&t->dt);
    fx_tensor_release(&t->h0);
}

static int alloc_like(const fx_tensor *t, fx_tensor *out, fx_status *st)
{
    return fx_tensor_alloc(t->device, t->dtype, t->rank, t->dims, out, st);
}

int fx_linrec_grads_alloc(const fx_linrec_inputs *in, fx_linrec_grads *g, fx_status *st)
{
    memset(g, 0, sizeof *g);
    int rc = FX_OK;
    for (int i = 0; i < fx_linrec_nseq(in->kind) && rc == FX_OK; i++)
        rc = alloc_like(in->seq[i], &g->seq[i], st);
    if (rc == FX_OK && in->kind == FX_LINREC_LIQUID)
        rc = alloc_like(in->tau, &g->tau, st) || alloc_like(in->lam, &g->lam, st) ||
             (in->dt && alloc_like(in->dt, &g->dt, st));
    if (rc == FX_OK && in->h0)
        rc = alloc_like(in->h0, &g->h0, st);
    if (rc != FX_OK)
        fx_linrec_tensors_release(g);
    return st->code;
}

static const fx_tensor *present(const fx_tensor *t) { return t->buffer ? t : NULL; }

fx_linrec_grad_outs fx_linrec_grad_outs_of(const fx_linrec_grads *g)
{
    fx_linrec_grad_outs out;
    for (int i = 0; i < FX_LINREC_MAX_SEQ; i++)
        out.seq[i] = present(&g->seq[i]);
    out.tau = present(&g->tau);
    out.lam = present(&g->lam);
    out.dt = present(&g->dt);
    out.h0 = present(&g->h0);
    return out;
}

/* Each gradient the caller passed must be there exactly when its input is,
 * and look like it. Messages name it "d<input>". */
static int expect_grad(fx_status *st, const char *input_name, const fx_tensor *grad,
                       const fx_tensor *input)
{
    char arg[40];
    snprintf(arg, sizeof arg, "d%s", input_name);
    if (!input != !grad)
        return fx_fail(st, FX_EBADARG, "%s: expected a gradient tensor %s", arg,
                       input ? "(its input was given)" : "only where its input was given");
    if (!input)
        return FX_OK;
    if (fx_expect_same_device(st, arg, grad, input->device, "its input") ||
        fx_expect_dtype(st, arg, grad, input->dtype) ||
        fx_expect_shape(st, arg, grad, input->rank, input->dims, "(the shape of its input)"))
        return st->code;
    return FX_OK;
}

static int expect_grads(fx_status *st, const fx_linrec_problem *p, const fx_tensor *h0,
                        const fx_linrec_grad_outs *g)
{
    int liquid = p->kind == FX_LINREC_LIQUID;
    for (int i = 0; i < FX_LINREC_MAX_SEQ; i++)
        if (expect_grad(st, i < p->nseq ? kinds[p->kind].seq[i] : "?", g->seq[i],
                        i < p->nseq ? p->seq[i] : NULL))
            return st->code;
    if (expect_grad(st, "tau", g->tau, liquid ? p->tau : NULL) ||
        expect_grad(st, "a", g->lam, liquid ? p->lam : NULL) ||
        expect_grad(st, "dt", g->dt, liquid ? p->dt : NULL) || expect_grad(st, "h0", g->h0, h0))
        return st->code;
    return FX_OK;
}

int fx_linrec_check_backward(const fx_linrec_inputs *in, const fx_tensor *h, const fx_tensor *dh,
                             const fx_tensor *dstate, fx_linrec_problem *p, fx_status *st)
{
    /* The forward's inputs are checked again: a caller without a saved
     * context (an XLA custom call) passes them anew. */
    if (check_problem(in, 0, p, st))
        return st->code;
    fx_device *dev = p->seq[0]->device;
    const struct fx_linrec_ops *ops = device_ops(dev);
    const char *first = kinds[p->kind].seq[0];
    int64_t hdims[3] = {p->batch, p->seqlen, p->hidden};
    if (expect_impl(st, dev, (const void *)(ops ? ops->backward : NULL), p->kind, "_backward") ||
        (in->h0 && expect_state_tensor(st, "h0", in->h0, p, first)) ||
        expect_output(st, "h", h, dev, p->dtype, 3, hdims, "([batch, seqlen, hidden], the forward's output)") ||
        fx_expect_same_device(st, "dh", dh, dev, "the saved context") ||
        fx_expect_dtype(st, "dh", dh, p->dtype) ||
        fx_expect_shape(st, "dh", dh, 3, hdims, "([batch, seqlen, hidden], as the forward's output)") ||
        (dstate && expect_state_tensor(st, "dstate", dstate, p, "the saved context")))
        return st->code;
    return FX_OK;
}

int fx_op_linrec_backward_into(const fx_exec *ex, const fx_linrec_inputs *in, const fx_tensor *h,
                               const fx_tensor *dh, const fx_tensor *dstate, int max_tile_steps,
                               const fx_linrec_grad_outs *g, fx_status *st)
{
    fx_linrec_problem p;
    fx_exec own;
    if (fx_linrec_check_backward(in, h, dh, dstate, &p, st) || expect_grads(st, &p, in->h0, g))
        return st->code;
    fx_device *dev = p.seq[0]->device;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (no_channels(&p) || p.seqlen == 0) {
        /* Nothing was scanned: tau, a and dt (a sum over the channels of
         * each row, of which there may be none) get zeros, h0 went
         * straight to the state so dh0 is dstate. */
        if (fx_op_fill_zero(ex, g->tau, st) || fx_op_fill_zero(ex, g->lam, st) ||
            fx_op_fill_zero(ex, g->dt, st))
            return st->code;
        return g->h0 && !no_channels(&p) ? fx_op_cast_or_zero(ex, dstate, g->h0, st) : FX_OK;
    }
    fx_linrec_bwd_args args = {.p = p, .h0 = in->h0, .h = h, .dh = dh, .dstate = dstate,
                               .dtau = g->tau, .dlam = g->lam, .ddt = g->dt, .dh0 = g->h0,
                               .max_tile_steps = max_tile_steps};
    for (int i = 0; i < p.nseq; i++)
        args.dseq[i] = g->seq[i];
    return device_ops(dev)->backward(ex, &args, st);
}

size_t fx_op_linrec_backward_scratch(const fx_exec *ex, const fx_linrec_inputs *in, const fx_tensor *h,
                                     const fx_tensor *dh, const fx_tensor *dstate, int max_tile_steps,
                                     const fx_linrec_grad_outs *g)
{
    fx_status st;
    fx_status_clear(&st);
    fx_linrec_problem p;
    fx_exec own;
    if (fx_linrec_check_backward(in, h, dh, dstate, &p, &st) || no_channels(&p) || p.seqlen == 0 ||
        !(ex = fx_exec_resolve(p.seq[0]->device, ex, &own, &st)))
        return 0;
    fx_linrec_bwd_args args = {.p = p, .h0 = in->h0, .h = h, .dh = dh, .dstate = dstate,
                               .dtau = g->tau, .dlam = g->lam, .ddt = g->dt, .dh0 = g->h0,
                               .max_tile_steps = max_tile_steps};
    for (int i = 0; i < p.nseq; i++)
        args.dseq[i] = g->seq[i];
    return device_ops(p.seq[0]->device)->backward_scratch(ex, &args);
}

int fx_op_linrec_backward(const fx_linrec_inputs *in, const fx_tensor *h, const fx_tensor *dh,
                          const fx_tensor *dstate, int max_tile_steps, fx_linrec_grads *g, fx_status *st)
{
    memset(g, 0, sizeof *g);
    /* Check the caller's tensors before allocating anything. */
    fx_device *dev = h->device;
    if (fx_expect_same_device(st, "dh", dh, dev, "the saved context") ||
        (dstate && fx_expect_same_device(st, "dstate", dstate, dev, "the saved context")))
        return st->code;
    if (fx_linrec_grads_alloc(in, g, st) == FX_OK) {
        fx_linrec_grad_outs outs = fx_linrec_grad_outs_of(g);
        fx_op_linrec_backward_into(NULL, in, h, dh, dstate, max_tile_steps, &outs, st);
    }
    if (st->code != FX_OK)
        fx_linrec_tensors_release(g);
    return st->code;
}

int fx_linrec_check_step(const fx_linrec_inputs *in, const fx_tensor *state, fx_linrec_problem *p,
                         fx_status *st)
{
    if (check_problem(in, 1, p, st))
        return st->code;
    fx_device *dev = p->seq[0]->device;
    const struct fx_linrec_ops *ops = device_ops(dev);
    if (expect_impl(st, dev, (const void *)(ops ? ops->step : NULL), p->kind, "_step") ||
        expect_state_tensor(st, "state", state, p, kinds[p->kind].seq[0]))
        return st->code;
    return FX_OK;
}

/* The state a step writes in place shares no byte with what it reads. */
static int expect_state_apart(const fx_linrec_problem *p, const fx_tensor *state, fx_status *st)
{
    for (int i = 0; i < p->nseq; i++)
        if (fx_expect_apart(st, "state", state, kinds[p->kind].seq[i], p->seq[i]))
            return st->code;
    if (fx_expect_apart(st, "state", state, "tau", p->tau) ||
        fx_expect_apart(st, "state", state, "a", p->lam) || fx_expect_apart(st, "state", state, "dt", p->dt))
        return st->code;
    return FX_OK;
}

int fx_op_linrec_step_into(const fx_exec *ex, const fx_linrec_inputs *in, const fx_tensor *state,
                           const fx_tensor *h, fx_status *st)
{
    fx_linrec_problem p;
    if (fx_linrec_check_step(in, state, &p, st))
        return st->code;
    fx_device *dev = p.seq[0]->device;
    int64_t dims[2] = {p.batch, p.hidden};
    fx_exec own;
    if (expect_output(st, "h", h, dev, p.dtype, 2, dims, "([batch, hidden])") || expect_state_apart(&p, state, st))
        return st->code;
    if (no_channels(&p))
        return FX_OK;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    fx_linrec_step_args args = {.p = p, .state = state, .h = h};
    return device_ops(dev)->step(ex, &args, st);
}

int fx_op_linrec_step(const fx_linrec_inputs *in, const fx_tensor *state, fx_tensor *h, fx_status *st)
{
    memset(h, 0, sizeof *h);
    fx_linrec_problem p;
    if (check_problem(in, 1, &p, st))
        return st->code;
    int64_t dims[2] = {p.batch, p.hidden};
    if (fx_tensor_alloc(p.seq[0]->device, p.dtype, 2, dims, h, st) ||
        fx_op_linrec_step_into(NULL, in, state, h, st))
        fx_tensor_release(h);
    return st->code;
}
