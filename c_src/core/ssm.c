#include "core/ssm.h"

#include <string.h>

#include "core/check.h"
#include "core/ops.h"
#include "fusex_dtype.h"

#define LAYOUT_X "[batch, seqlen, dim]"
#define LAYOUT_A "[dim, dstate]"
#define LAYOUT_STATE "[batch, dim, dstate]"
#define LAYOUT_CH "[dim]"

static bool on_cpu(const fx_tensor *t) { return t->device->kind == FX_DEVICE_CPU; }

/* x's companions (dt, z, b, c, dy): x's device and type, the given shape. */
static int expect_like_x(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x,
                         int rank, const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_dtype(st, arg, t, x->dtype) ||
        fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

/* Parameters and states read once per channel: any float type the device
 * handles, x's device, the given shape. */
static int expect_param(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x,
                        int rank, const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_float(st, arg, t, on_cpu(t)) ||
        fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

static const struct fx_ssm_ops *ssm_ops(const fx_device *dev)
{
    return dev->backend->ssm;
}

static int expect_ssm(fx_status *st, const fx_device *dev, const char *what)
{
    const struct fx_ssm_ops *ops = ssm_ops(dev);
    const void *fn = NULL;
    if (ops)
        fn = strcmp(what, "selective_scan_step") == 0 ? (const void *)ops->step
             : strcmp(what, "selective_scan_backward") == 0 ? (const void *)ops->backward
                                                             : (const void *)ops->forward;
    return fx_expect_op(st, dev, fn, what);
}

/* a [dim, dstate]: fixes dstate, which the backend may bound. */
static int check_a(fx_status *st, const fx_tensor *a, const fx_tensor *x, int64_t dim,
                   int64_t *dstate)
{
    if (fx_expect_same_device(st, "a", a, x->device, "x") || fx_expect_float(st, "a", a, on_cpu(a)) ||
        fx_expect_rank(st, "a", a, 2, LAYOUT_A))
        return st->code;
    int64_t want[2] = {dim, a->dims[1]};
    if (fx_expect_shape(st, "a", a, 2, want, LAYOUT_A))
        return st->code;
    if (a->dims[1] < 1)
        return fx_fail(st, FX_EBADARG, "a: expected dstate >= 1 " LAYOUT_A ", got shape {%lld,%lld}",
                       (long long)a->dims[0], (long long)a->dims[1]);
    int64_t max = ssm_ops(x->device)->max_dstate;
    if (max > 0 && a->dims[1] > max)
        return fx_fail(st, FX_EBADARG, "a: expected dstate <= %lld on %s " LAYOUT_A ", got %lld",
                       (long long)max, x->device->label, (long long)a->dims[1]);
    *dstate = a->dims[1];
    return FX_OK;
}

/* b: the leading dims `lead` (batch, seqlen for the scan; batch for the
 * step) then [groups,] dstate. Fixes groups. */
static int check_b(fx_status *st, const fx_tensor *b, const fx_tensor *x, int nlead,
                   const int64_t *lead, int64_t dim, int64_t dstate, int64_t *groups)
{
    const char *l3 = nlead == 2 ? "[batch, seqlen, dstate]" : "[batch, dstate]";
    const char *l4 = nlead == 2 ? "[batch, seqlen, groups, dstate]" : "[batch, groups, dstate]";
    if (fx_expect_same_device(st, "b", b, x->device, "x") || fx_expect_dtype(st, "b", b, x->dtype))
        return st->code;
    int64_t want[FX_MAX_RANK];
    memcpy(want, lead, sizeof(int64_t) * (size_t)nlead);
    if (b->rank == nlead + 1) {
        want[nlead] = dstate;
        *groups = 1;
        return fx_expect_shape(st, "b", b, nlead + 1, want, l3);
    }
    if (b->rank != nlead + 2) {
        char got[160];
        fx_format_shape(got, sizeof got, b->rank, b->dims);
        return fx_fail(st, FX_EBADARG, "b: expected rank %d %s or rank %d %s, got rank %d shape %s",
                       nlead + 1, l3, nlead + 2, l4, b->rank, got);
    }
    want[nlead] = b->dims[nlead];
    want[nlead + 1] = dstate;
    if (fx_expect_shape(st, "b", b, nlead + 2, want, l4))
        return st->code;
    int64_t g = b->dims[nlead];
    if (g < 1 || dim % g != 0)
        return fx_fail(st, FX_EBADARG, "b: expected a number of groups that divides dim %lld %s, got %lld",
                       (long long)dim, l4, (long long)g);
    *groups = g;
    return FX_OK;
}

static int check_c(fx_status *st, const fx_tensor *c, const fx_tensor *b, const fx_tensor *x)
{
    if (fx_expect_same_device(st, "c", c, x->device, "x") || fx_expect_dtype(st, "c", c, x->dtype) ||
        fx_expect_shape(st, "c", c, b->rank, b->dims, "(the shape of b)"))
        return st->code;
    return FX_OK;
}

/* d, dt_bias [dim] and z (x's shape) — the options forward and step share. */
static int check_options(fx_status *st, const fx_ssm_inputs *in, int64_t dim, const char *z_layout)
{
    const fx_tensor *x = in->x;
    int64_t ch[1] = {dim};
    if ((in->d && expect_param(st, "d", in->d, x, 1, ch, LAYOUT_CH)) ||
        (in->dt_bias && expect_param(st, "dt_bias", in->dt_bias, x, 1, ch, LAYOUT_CH)) ||
        (in->z && expect_like_x(st, "z", in->z, x, x->rank, x->dims, z_layout)))
        return st->code;
    return FX_OK;
}

int fx_ssm_check_forward(const fx_ssm_inputs *in, fx_ssm_dims *n, fx_status *st)
{
    const fx_tensor *x = in->x;
    memset(n, 0, sizeof *n);
    if (fx_expect_float(st, "x", x, on_cpu(x)) || fx_expect_rank(st, "x", x, 3, LAYOUT_X) ||
        expect_ssm(st, x->device, "selective_scan"))
        return st->code;
    n->batch = x->dims[0];
    n->seqlen = x->dims[1];
    n->dim = x->dims[2];
    if (expect_like_x(st, "dt", in->dt, x, 3, x->dims, LAYOUT_X) ||
        check_a(st, in->a, x, n->dim, &n->dstate) ||
        check_b(st, in->b, x, 2, x->dims, n->dim, n->dstate, &n->groups) ||
        check_c(st, in->c, in->b, x) || check_options(st, in, n->dim, LAYOUT_X))
        return st->code;
    int64_t state_dims[3] = {n->batch, n->dim, n->dstate};
    if (in->h0 && expect_param(st, "h0", in->h0, x, 3, state_dims, LAYOUT_STATE))
        return st->code;
    return FX_OK;
}

fx_dtype fx_ssm_state_dtype(fx_dtype x_type) { return x_type == FX_F64 ? FX_F64 : FX_F32; }

int fx_ssm_check_step(const fx_tensor *state, const fx_ssm_inputs *in, fx_ssm_dims *n,
                      fx_status *st)
{
    const fx_tensor *x = in->x;
    memset(n, 0, sizeof *n);
    if (fx_expect_float(st, "x", x, on_cpu(x)) || fx_expect_rank(st, "x", x, 2, "[batch, dim]") ||
        expect_ssm(st, x->device, "selective_scan_step"))
        return st->code;
    n->batch = x->dims[0];
    n->seqlen = 1;
    n->dim = x->dims[1];
    if (expect_like_x(st, "dt", in->dt, x, 2, x->dims, "[batch, dim]") ||
        check_a(st, in->a, x, n->dim, &n->dstate) ||
        check_b(st, in->b, x, 1, x->dims, n->dim, n->dstate, &n->groups) ||
        check_c(st, in->c, in->b, x) || check_options(st, in, n->dim, "[batch, dim]"))
        return st->code;
    int64_t state_dims[3] = {n->batch, n->dim, n->dstate};
    if (fx_expect_same_device(st, "state", state, x->device, "x"))
        return st->code;
    if (state->dtype != FX_F32 && !(on_cpu(state) && state->dtype == FX_F64))
        return fx_fail(st, FX_EBADARG, "state: expected type {f,32}%s, got %s",
                       on_cpu(state) ? " or {f,64}" : "", fx_dtype_name(state->dtype));
    if (fx_expect_shape(st, "state", state, 3, state_dims, LAYOUT_STATE))
        return st->code;
    const char *names[] = {"x", "dt", "a", "b", "c", "d", "z", "dt_bias"};
    const fx_tensor *read[] = {in->x, in->dt, in->a, in->b, in->c, in->d, in->z, in->dt_bias};
    for (size_t i = 0; i < sizeof read / sizeof read[0]; i++)
        if (fx_expect_apart(st, "state", state, names[i], read[i]))
            return st->code;
    return FX_OK;
}

/* Outputs the caller allocated: on x's device, with the layout the op
 * writes. */
static int expect_output(fx_status *st, const char *arg, const fx_tensor *t, const fx_tensor *x, fx_dtype dtype,
                         int rank, const int64_t *dims, const char *layout)
{
    if (fx_expect_same_device(st, arg, t, x->device, "x") || fx_expect_dtype(st, arg, t, dtype) ||
        fx_expect_shape(st, arg, t, rank, dims, layout))
        return st->code;
    return FX_OK;
}

/* The saved states of a forward of n with inputs of x's type: the state
 * type, [batch, nsaved, dim, dstate]. */
static void saved_dims(const fx_ssm_dims *n, fx_dtype x_type, int64_t dims[4])
{
    dims[0] = n->batch;
    dims[1] = fx_ssm_nsaved(n, x_type);
    dims[2] = n->dim;
    dims[3] = n->dstate;
}

static int expect_saved(fx_status *st, const fx_tensor *saved, const fx_tensor *x, const fx_ssm_dims *n)
{
    int64_t dims[4];
    saved_dims(n, x->dtype, dims);
    return expect_output(st, "saved", saved, x, fx_ssm_state_dtype(x->dtype), 4, dims,
                         "([batch, nsaved, dim, dstate], the states entering each chunk after the first)");
}

int fx_ssm_saved_shape(const fx_ssm_dims *n, fx_dtype x_type, int64_t dims[4])
{
    saved_dims(n, x_type, dims);
    return 4;
}

int fx_ssm_check_dims(const fx_ssm_dims *n, fx_dtype x_type, fx_status *st)
{
    const int64_t x[3] = {n->batch, n->seqlen, n->dim};
    int64_t numel;
    if (fx_shape_numel("x", 3, x, &numel, st))
        return st->code;
    /* b as a caller holding only these sizes knows it: with a groups axis
     * unless there is one group. */
    const int b_rank = n->groups == 1 ? 3 : 4;
    const int64_t b[4] = {n->batch, n->seqlen, b_rank == 3 ? n->dstate : n->groups, n->dstate};
    char got[160];
    fx_format_shape(got, sizeof got, b_rank, b);
    if (n->dstate < 1 || n->groups < 1 || n->dim % n->groups != 0)
        return fx_fail(st, FX_EBADARG, "b: expected dstate >= 1 and a number of groups that divides dim %lld, got %s",
                       (long long)n->dim, got);
    /* Every size the saved states' shape is formed from is within bounds. */
    int64_t saved[4];
    saved_dims(n, x_type, saved);
    if (fx_shape_numel("b", b_rank, b, &numel, st) || fx_shape_numel("saved", 4, saved, &numel, st))
        return st->code;
    return FX_OK;
}

int fx_ssm_dims_of_shapes(int x_rank, const int64_t *x, int b_rank, const int64_t *b, fx_dtype x_type,
                          fx_ssm_dims *n, fx_status *st)
{
    char got[160];
    if (!fx_dtype_is_float(x_type))
        return fx_fail(st, FX_EBADARG, "type: expected a float type, got %s", fx_dtype_name(x_type));
    if (x_rank != 3) {
        fx_format_shape(got, sizeof got, x_rank, x);
        return fx_fail(st, FX_EBADARG, "x: expected a shape of rank 3 [batch, seqlen, dim], got %s", got);
    }
    if ((b_rank != 3 && b_rank != 4) || b[0] != x[0] || b[1] != x[1]) {
        fx_format_shape(got, sizeof got, b_rank, b);
        return fx_fail(st, FX_EBADARG,
                       "b: expected a shape {%lld,%lld,dstate} or {%lld,%lld,groups,dstate} ([batch, seqlen, "
                       "[groups,] dstate]), got %s",
                       (long long)x[0], (long long)x[1], (long long)x[0], (long long)x[1], got);
    }
    *n = (fx_ssm_dims){.batch = x[0], .seqlen = x[1], .dim = x[2], .dstate = b[b_rank - 1],
                       .groups = b_rank == 4 ? b[2] : 1};
    return fx_ssm_check_dims(n, x_type, st);
}

/* Nothing to scan: a zero batch, sequence or dim. No backend is handed such
 * a problem, so none loops over rows of nothing (a batch of 2^40 empty
 * sequences is a valid zero-element tensor, and was hours of loop). */
static bool nothing_to_scan(const fx_ssm_dims *n)
{
    return n->batch == 0 || n->seqlen == 0 || n->dim == 0;
}

/* ---- forward ---- */

static fx_ssm_fwd_args fwd_args(const fx_ssm_inputs *in, const fx_ssm_dims *n, const fx_tensor *y,
                                const fx_tensor *state, const fx_tensor *saved)
{
    fx_ssm_fwd_args args = {
        .n = *n, .x = in->x, .dt = in->dt, .a = in->a, .b = in->b, .c = in->c,
        .d = in->d, .z = in->z, .dt_bias = in->dt_bias, .h0 = in->h0,
        .dt_softplus = in->dt_softplus, .y = y, .state = state, .saved = saved,
        .save_every = saved ? fx_ssm_save_every(n, in->x->dtype) : 0,
    };
    return args;
}

static int check_forward_outputs(const fx_ssm_inputs *in, const fx_ssm_dims *n, const fx_tensor *y,
                                 const fx_tensor *state, const fx_tensor *saved, fx_status *st)
{
    const fx_tensor *x = in->x;
    int64_t state_dims[3] = {n->batch, n->dim, n->dstate};
    if (expect_output(st, "y", y, x, x->dtype, 3, x->dims, LAYOUT_X) ||
        (state && expect_output(st, "state", state, x, fx_ssm_state_dtype(x->dtype), 3, state_dims,
                                LAYOUT_STATE)) ||
        (saved && expect_saved(st, saved, x, n)))
        return st->code;
    return FX_OK;
}

int fx_op_ssm_forward_into(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *y, const fx_tensor *state,
                           const fx_tensor *saved, fx_status *st)
{
    fx_ssm_dims n;
    if (fx_ssm_check_forward(in, &n, st) || check_forward_outputs(in, &n, y, state, saved, st))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (nothing_to_scan(&n)) /* y and the saved states are empty; the final state is h0 */
        return state ? fx_op_cast_or_zero(ex, in->h0, state, st) : FX_OK;
    fx_ssm_fwd_args args = fwd_args(in, &n, y, state, saved);
    return ssm_ops(dev)->forward(ex, &args, st);
}

size_t fx_op_ssm_forward_scratch(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *y,
                                 const fx_tensor *state, const fx_tensor *saved)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_dims n;
    fx_exec own;
    if (fx_ssm_check_forward(in, &n, &st) || nothing_to_scan(&n) ||
        !(ex = fx_exec_resolve(in->x->device, ex, &own, &st)))
        return 0;
    fx_ssm_fwd_args args = fwd_args(in, &n, y, state, saved);
    return ssm_ops(in->x->device)->forward_scratch(ex, &args);
}

int fx_op_ssm_forward(const fx_ssm_inputs *in, bool return_state, fx_tensor *y, fx_tensor *state,
                      fx_status *st)
{
    fx_ssm_dims n;
    memset(y, 0, sizeof *y);
    memset(state, 0, sizeof *state);
    if (fx_ssm_check_forward(in, &n, st))
        return st->code;
    fx_device *dev = in->x->device;
    int64_t state_dims[3] = {n.batch, n.dim, n.dstate};
    if (fx_tensor_alloc(dev, in->x->dtype, 3, in->x->dims, y, st) ||
        (return_state &&
         fx_tensor_alloc(dev, fx_ssm_state_dtype(in->x->dtype), 3, state_dims, state, st)) ||
        fx_op_ssm_forward_into(NULL, in, y, return_state ? state : NULL, NULL, st)) {
        fx_tensor_release(y);
        fx_tensor_release(state);
    }
    return st->code;
}

/* ---- backward ---- */

/* A gradient output: there exactly when its input is, and like it. */
static int expect_grad(fx_status *st, const char *arg, const fx_tensor *grad, const fx_tensor *input,
                       const fx_tensor *x)
{
    if (!input != !grad)
        return fx_fail(st, FX_EBADARG, "%s: expected a gradient tensor %s", arg,
                       input ? "(its input was given)" : "only where its input was given");
    if (!input)
        return FX_OK;
    return expect_output(st, arg, grad, x, input->dtype, input->rank, input->dims, "(the shape of its input)");
}

static int expect_grads(fx_status *st, const fx_ssm_inputs *in, const fx_ssm_grad_outs *g)
{
    const fx_tensor *x = in->x;
    if (expect_grad(st, "dx", g->x, in->x, x) || expect_grad(st, "ddt", g->dt, in->dt, x) ||
        expect_grad(st, "da", g->a, in->a, x) || expect_grad(st, "db", g->b, in->b, x) ||
        expect_grad(st, "dc", g->c, in->c, x) || expect_grad(st, "dd", g->d, in->d, x) ||
        expect_grad(st, "dz", g->z, in->z, x) || expect_grad(st, "ddt_bias", g->dt_bias, in->dt_bias, x) ||
        expect_grad(st, "dh0", g->h0, in->h0, x))
        return st->code;
    return FX_OK;
}

int fx_ssm_check_backward(const fx_ssm_inputs *in, const fx_tensor *saved, const fx_tensor *dy,
                          const fx_tensor *dstate, fx_ssm_dims *n, fx_status *st)
{
    if (fx_ssm_check_forward(in, n, st))
        return st->code;
    const fx_tensor *x = in->x;
    fx_device *dev = x->device;
    int64_t state_dims[3] = {n->batch, n->dim, n->dstate};
    if (expect_ssm(st, dev, "selective_scan_backward") || expect_like_x(st, "dy", dy, x, 3, x->dims, LAYOUT_X) ||
        (dstate && expect_param(st, "dstate", dstate, x, 3, state_dims, LAYOUT_STATE)))
        return st->code;
    if (!saved && ssm_ops(dev)->reads_saved && fx_ssm_nsaved(n, x->dtype) > 0)
        return fx_fail(st, FX_EBADARG, "saved: expected the states the forward saved (save_for_backward) on %s, "
                       "got none", dev->label);
    if (saved && expect_saved(st, saved, x, n))
        return st->code;
    return FX_OK;
}

static fx_ssm_bwd_args bwd_args(const fx_ssm_inputs *in, const fx_ssm_dims *n, const fx_tensor *saved,
                                const fx_tensor *dy, const fx_tensor *dstate, const fx_ssm_grad_outs *g)
{
    fx_ssm_bwd_args args = {
        .fwd = fwd_args(in, n, NULL, NULL, saved),
        .dy = dy, .dstate = dstate,
        .dx = g->x, .ddt = g->dt, .da = g->a, .db = g->b, .dc = g->c,
        .dd = g->d, .dz = g->z, .ddt_bias = g->dt_bias, .dh0 = g->h0,
    };
    return args;
}

int fx_op_ssm_backward_into(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *saved,
                            const fx_tensor *dy, const fx_tensor *dstate, const fx_ssm_grad_outs *g,
                            fx_status *st)
{
    fx_ssm_dims n;
    if (fx_ssm_check_backward(in, saved, dy, dstate, &n, st) || expect_grads(st, in, g))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (nothing_to_scan(&n)) {
        /* No step ran: every gradient is zero (db and dc too, whose groups
         * may have no channels when dim is 0), except that h0 went straight
         * to the final state. */
        const fx_tensor *zeros[] = {g->x, g->dt, g->a, g->b, g->c, g->d, g->z, g->dt_bias};
        for (size_t i = 0; i < sizeof zeros / sizeof zeros[0]; i++)
            if (fx_op_fill_zero(ex, zeros[i], st))
                return st->code;
        return g->h0 ? fx_op_cast_or_zero(ex, dstate, g->h0, st) : FX_OK;
    }
    fx_ssm_bwd_args args = bwd_args(in, &n, saved, dy, dstate, g);
    return ssm_ops(dev)->backward(ex, &args, st);
}

size_t fx_op_ssm_backward_scratch(const fx_exec *ex, const fx_ssm_inputs *in, const fx_tensor *saved,
                                  const fx_tensor *dy, const fx_tensor *dstate, const fx_ssm_grad_outs *g)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_dims n;
    fx_exec own;
    if (fx_ssm_check_backward(in, saved, dy, dstate, &n, &st) || nothing_to_scan(&n) ||
        !(ex = fx_exec_resolve(in->x->device, ex, &own, &st)))
        return 0;
    fx_ssm_bwd_args args = bwd_args(in, &n, saved, dy, dstate, g);
    return ssm_ops(in->x->device)->backward_scratch(ex, &args);
}

/* ---- step ---- */

int fx_op_ssm_step_into(const fx_exec *ex, const fx_tensor *state, const fx_ssm_inputs *in, const fx_tensor *y,
                        fx_status *st)
{
    fx_ssm_dims n;
    if (fx_ssm_check_step(state, in, &n, st) ||
        expect_output(st, "y", y, in->x, in->x->dtype, 2, in->x->dims, "([batch, dim])"))
        return st->code;
    fx_device *dev = in->x->device;
    fx_exec own;
    if (!(ex = fx_exec_resolve(dev, ex, &own, st)))
        return st->code;
    if (n.batch == 0 || n.dim == 0) /* y and the state are empty */
        return FX_OK;
    fx_ssm_step_args args = {
        .n = n, .state = state, .x = in->x, .dt = in->dt, .a = in->a, .b = in->b, .c = in->c,
        .d = in->d, .z = in->z, .dt_bias = in->dt_bias, .dt_softplus = in->dt_softplus, .y = y,
    };
    return ssm_ops(dev)->step(ex, &args, st);
}

int fx_op_ssm_step(const fx_tensor *state, const fx_ssm_inputs *in, fx_tensor *y,
                   fx_status *st)
{
    fx_ssm_dims n;
    memset(y, 0, sizeof *y);
    if (fx_ssm_check_step(state, in, &n, st))
        return st->code;
    if (fx_tensor_alloc(in->x->device, in->x->dtype, 2, in->x->dims, y, st) ||
        fx_op_ssm_step_into(NULL, state, in, y, st))
        fx_tensor_release(y);
    return st->code;
}
