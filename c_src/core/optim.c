#include "core/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "fusex_dtype.h"
#include "core/ops.h"

const char *fx_optim_kind_name(fx_optim_kind kind)
{
    return kind == FX_OPTIM_ADAMW ? "AdamW" : "SGD";
}

const char *fx_optim_init_name(fx_optim_kind kind)
{
    return kind == FX_OPTIM_ADAMW ? "adamw_init" : "sgd_init";
}

fx_optim_hyper fx_optim_default_hyper(fx_optim_kind kind)
{
    fx_optim_hyper h;
    memset(&h, 0, sizeof h);
    h.lr = 1e-3;
    if (kind == FX_OPTIM_ADAMW) {
        h.beta1 = 0.9;
        h.beta2 = 0.999;
        h.eps = 1e-8;
        h.weight_decay = 1e-2;
    }
    return h;
}

/* ---- hyperparameters ---- */

static int expect_at_least(fx_status *st, const char *name, double v, double lo)
{
    if (isfinite(v) && v >= lo)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected a finite number >= %g, got %g", name, lo, v);
}

/* [0, 1) for betas: beta = 1 would freeze a moment and divide by zero in
 * the bias correction. */
static int expect_unit_open(fx_status *st, const char *name, double v)
{
    if (v >= 0 && v < 1)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected a number in [0, 1), got %g", name, v);
}

static int expect_unit_closed(fx_status *st, const char *name, double v)
{
    if (v >= 0 && v <= 1)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected a number in [0, 1], got %g", name, v);
}

int fx_optim_check_hyper(fx_optim_kind kind, const fx_optim_hyper *h, fx_status *st)
{
    if (expect_at_least(st, "lr", h->lr, 0) || expect_at_least(st, "weight_decay", h->weight_decay, 0))
        return st->code;
    if (h->clip && !(isfinite(h->max_grad_norm) && h->max_grad_norm > 0))
        return fx_fail(st, FX_EBADARG, "max_grad_norm: expected a finite number > 0 or none, got %g",
                       h->max_grad_norm);
    if (kind == FX_OPTIM_ADAMW)
        return expect_unit_open(st, "beta1", h->beta1) || expect_unit_open(st, "beta2", h->beta2) ||
                       expect_at_least(st, "eps", h->eps, 0)
                   ? st->code
                   : FX_OK;
    if (expect_at_least(st, "momentum", h->momentum, 0) ||
        expect_unit_closed(st, "dampening", h->dampening))
        return st->code;
    if (h->nesterov && (h->momentum <= 0 || h->dampening != 0))
        return fx_fail(st, FX_EBADARG,
                       "nesterov: expected momentum > 0 and dampening 0 with nesterov => true, got momentum %g and dampening %g",
                       h->momentum, h->dampening);
    return FX_OK;
}

/* ---- parameter lists ---- */

static void item_name(char *out, size_t len, const char *list, unsigned i)
{
    snprintf(out, len, "%s[%u]", list, i);
}

static int check_param_type(fx_status *st, const fx_tensor *p, bool master_weights)
{
    fx_dtype t = p->dtype;
    if (t == FX_F32 || ((t == FX_BF16 || t == FX_F16) && master_weights))
        return FX_OK;
    if (t == FX_BF16 || t == FX_F16)
        return fx_fail(st, FX_EBADARG,
                       "params[0]: expected type {f,32} ({bf,16} and {f,16} parameters need master_weights => true), got %s",
                       fx_dtype_name(t));
    return fx_fail(st, FX_EBADARG,
                   "params[0]: expected type {f,32}, or {bf,16}/{f,16} with master_weights => true, got %s",
                   fx_dtype_name(t));
}

/* The aliasing checks compare byte ranges, whatever made the tensors
 * (reshape views, from_pointer views at any offset, the state's own
 * tensors handed back as params or grads). A range's owner: a param, or
 * one of the optimizer state's tensors. */
enum { OWN_PARAM = 0, OWN_MASTER, OWN_BUF0, OWN_BUF1, OWN_BUF2, OWN_STEP, OWN_NORM, OWN_SKIPPED,
       OWN_TABLE };

typedef struct fx_ptr_index {
    uintptr_t begin, end; /* [begin, end): a non-empty tensor's bytes */
    unsigned index;       /* which param, or which tensor of the state's lists */
    unsigned owner;       /* OWN_* */
} ptr_index;

static int cmp_ptr_index(const void *a, const void *b)
{
    const ptr_index *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->owner != y->owner)
        return x->owner < y->owner ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Appends t's range; empty tensors own no memory and cannot alias. */
static void add_range(ptr_index *ranges, size_t *count, const fx_tensor *t, unsigned owner,
                      unsigned index)
{
    if (!t->data || t->nbytes == 0)
        return;
    uintptr_t begin = (uintptr_t)t->data;
    ranges[(*count)++] = (ptr_index){begin, begin + t->nbytes, index, owner};
}

static void range_name(const fx_optim_state *s, const ptr_index *r, char *out, size_t len)
{
    static const char *const lists[] = {[OWN_MASTER] = "master", [OWN_BUF1] = "exp_avg_sq",
                                        [OWN_BUF2] = "max_exp_avg_sq"};
    switch (r->owner) {
    case OWN_PARAM: snprintf(out, len, "params[%u]", r->index); break;
    case OWN_BUF0:
        snprintf(out, len, "the state's %s[%u]",
                 s && s->kind == FX_OPTIM_SGD ? "momentum_buffer" : "exp_avg", r->index);
        break;
    case OWN_MASTER:
    case OWN_BUF1:
    case OWN_BUF2: snprintf(out, len, "the state's %s[%u]", lists[r->owner], r->index); break;
    case OWN_STEP: snprintf(out, len, "the state's step"); break;
    case OWN_NORM: snprintf(out, len, "the state's grad_norm"); break;
    case OWN_SKIPPED: snprintf(out, len, "the state's skipped"); break;
    default: snprintf(out, len, "the state's device table"); break;
    }
}

/* Updating one memory twice in one step would race, and a param that is
 * one of the state's moments would be updated from itself: the params
 * and the state's tensors (everything a step writes), sorted by address,
 * must be pairwise apart. The state's own tensors are separate
 * allocations, so any overlap involves a param. */
static int check_written_apart(const fx_optim_state *s, const ptr_index *sorted, size_t n,
                               fx_status *st)
{
    size_t reach = 0; /* the range reaching furthest so far */
    for (size_t i = 1; i < n; i++) {
        if (sorted[i].begin < sorted[reach].end) {
            const ptr_index *a = &sorted[i], *b = &sorted[reach];
            if (a->owner != OWN_PARAM && b->owner != OWN_PARAM)
                return fx_fail(st, FX_EINTERNAL, "optimizer state: two of its own tensors overlap");
            if (a->owner != OWN_PARAM) { /* name the param first */
                const ptr_index *t = a;
                a = b;
                b = t;
            }
            char other[64];
            range_name(s, b, other, sizeof other);
            if (b->owner == OWN_PARAM)
                return fx_fail(st, FX_EBADARG, "params[%u]: expected a tensor distinct from %s, got %s memory",
                               a->index, other, a->begin == b->begin && a->end == b->end ? "the same" : "overlapping");
            return fx_fail(st, FX_EBADARG,
                           "params[%u]: expected a tensor distinct from the optimizer state's tensors, got the memory of %s",
                           a->index, other);
        }
        if (sorted[i].end > sorted[reach].end)
            reach = i;
    }
    return FX_OK;
}

/* A gradient that is also a parameter, or one of the state's tensors,
 * would be read while it is written. `sorted` (n ranges) is apart, so
 * its ends rise with its begins: the one range a gradient can meet first
 * is the last that begins before the gradient ends. */
static int check_grads_apart(const fx_optim_state *s, const ptr_index *sorted, size_t n,
                             const fx_tensor *grads, unsigned ngrads, fx_status *st)
{
    for (unsigned i = 0; i < ngrads; i++) {
        if (!grads[i].data || grads[i].nbytes == 0)
            continue;
        uintptr_t begin = (uintptr_t)grads[i].data, end = begin + grads[i].nbytes;
        size_t lo = 0, hi = n; /* the first range beginning at or after `end` */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (sorted[mid].begin < end)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > 0 && sorted[lo - 1].end > begin) {
            char other[64];
            range_name(s, &sorted[lo - 1], other, sizeof other);
            if (sorted[lo - 1].owner == OWN_PARAM)
                return fx_fail(st, FX_EBADARG,
                               "grads[%u]: expected a tensor distinct from every param, got the memory of %s",
                               i, other);
            return fx_fail(st, FX_EBADARG,
                           "grads[%u]: expected a tensor distinct from every param and the optimizer state's tensors, got the memory of %s",
                           i, other);
        }
    }
    return FX_OK;
}

/* The ranges a step writes: the params, then the state's tensors (none at
 * init, before they exist), sorted. Returns how many. */
static size_t written_ranges(const fx_optim_state *s, const fx_tensor *params, unsigned n,
                             ptr_index *out)
{
    size_t count = 0;
    for (unsigned i = 0; i < n; i++)
        add_range(out, &count, &params[i], OWN_PARAM, i);
    if (s) {
        for (unsigned i = 0; i < s->n; i++) {
            add_range(out, &count, &s->master_t[i], OWN_MASTER, i);
            add_range(out, &count, &s->buf0[i], OWN_BUF0, i);
            add_range(out, &count, &s->buf1[i], OWN_BUF1, i);
            add_range(out, &count, &s->buf2[i], OWN_BUF2, i);
        }
        add_range(out, &count, &s->step, OWN_STEP, 0);
        add_range(out, &count, &s->grad_norm, OWN_NORM, 0);
        add_range(out, &count, &s->skipped, OWN_SKIPPED, 0);
        add_range(out, &count, &s->table, OWN_TABLE, 0);
    }
    qsort(out, count, sizeof *out, cmp_ptr_index);
    return count;
}

/* Room for written_ranges of a state of n params. */
static size_t written_capacity(size_t n) { return 5 * n + 4; }

static int check_init_params(const fx_tensor *params, unsigned n, bool master_weights,
                             fx_status *st)
{
    if (n == 0)
        return fx_fail(st, FX_EBADARG, "params: expected a non-empty list of tensors, got []");
    if (check_param_type(st, &params[0], master_weights))
        return st->code;
    char name[32];
    for (unsigned i = 1; i < n; i++) {
        item_name(name, sizeof name, "params", i);
        if (fx_expect_same_device(st, name, &params[i], params[0].device, "params[0]"))
            return st->code;
        if (params[i].dtype != params[0].dtype)
            return fx_fail(st, FX_EBADARG, "%s: expected type %s (the type of params[0]), got %s",
                           name, fx_dtype_name(params[0].dtype), fx_dtype_name(params[i].dtype));
    }
    ptr_index *sorted = malloc(sizeof *sorted * n);
    if (!sorted)
        return fx_fail(st, FX_ENOMEM, "out of host memory checking %u params", n);
    check_written_apart(NULL, sorted, written_ranges(NULL, params, n, sorted), st);
    free(sorted);
    return st->code;
}

/* ---- the work list ---- */

static int64_t chunks_of(int64_t numel) { return (numel + FX_OPTIM_CHUNK - 1) / FX_OPTIM_CHUNK; }

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static int plan_table(fx_optim_state *s, const fx_tensor *params, fx_status *st)
{
    int64_t total = 0;
    for (unsigned i = 0; i < s->n; i++)
        total += chunks_of(params[i].numel);
    /* Work item indices are 32-bit on the device. */
    if (total > INT32_MAX)
        return fx_fail(st, FX_EBADARG,
                       "params: expected at most %lld elements in all, got %lld chunks of %d",
                       (long long)INT32_MAX * FX_OPTIM_CHUNK, (long long)total, FX_OPTIM_CHUNK);
    s->nchunks = total;
    s->max_blocks = FX_OPTIM_MAX_BLOCKS;
    s->chunk_tensor = malloc(sizeof *s->chunk_tensor * (size_t)(total ? total : 1));
    if (!s->chunk_tensor)
        return fx_fail(st, FX_ENOMEM, "out of host memory for %lld work items", (long long)total);
    int64_t k = 0;
    for (unsigned i = 0; i < s->n; i++)
        for (int64_t c = chunks_of(params[i].numel); c > 0; c--)
            s->chunk_tensor[k++] = i;
    size_t blocks = (size_t)fx_optim_blocks(total);
    s->off_chunks = align16(sizeof(fx_optim_slot) * s->n);
    s->off_sync = align16(s->off_chunks + sizeof(uint32_t) * (size_t)total);
    s->off_partial_sq = align16(s->off_sync + sizeof(fx_optim_sync));
    s->off_partial_bad = align16(s->off_partial_sq + sizeof(double) * blocks);
    return FX_OK;
}

static int make_table(fx_optim_state *s, fx_status *st)
{
    int64_t bytes = (int64_t)align16(s->off_partial_bad + sizeof(uint32_t) *
                                                            (size_t)fx_optim_blocks(s->nchunks));
    if (fx_op_zeros(s->device, FX_U8, 1, &bytes, &s->table, st))
        return st->code;
    if (s->nchunks == 0)
        return FX_OK;
    return s->device->backend->upload(s->device->ordinal, (char *)s->table.data + s->off_chunks,
                                      s->chunk_tensor, sizeof(uint32_t) * (size_t)s->nchunks, st);
}

/* ---- state ---- */

static void release_all(fx_tensor *ts, unsigned n)
{
    if (!ts)
        return;
    for (unsigned i = 0; i < n; i++)
        fx_tensor_release(&ts[i]);
    free(ts);
}

void fx_optim_state_free(fx_optim_state *s)
{
    if (!s)
        return;
    release_all(s->master_t, s->n);
    release_all(s->buf0, s->n);
    release_all(s->buf1, s->n);
    release_all(s->buf2, s->n);
    fx_tensor_release(&s->step);
    fx_tensor_release(&s->grad_norm);
    fx_tensor_release(&s->skipped);
    fx_tensor_release(&s->table);
    free(s->shapes);
    free(s->host_slots);
    free(s->next_slots);
    free(s->sorted_written);
    free(s->chunk_tensor);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int alloc_arrays(fx_optim_state *s, fx_status *st)
{
    unsigned n = s->n;
    s->shapes = calloc(n, sizeof *s->shapes);
    s->master_t = calloc(n, sizeof *s->master_t);
    s->buf0 = calloc(n, sizeof *s->buf0);
    s->buf1 = calloc(n, sizeof *s->buf1);
    s->buf2 = calloc(n, sizeof *s->buf2);
    s->host_slots = calloc(n, sizeof *s->host_slots);
    s->next_slots = calloc(n, sizeof *s->next_slots);
    s->sorted_written = calloc(written_capacity(n), sizeof *s->sorted_written);
    if (!s->shapes || !s->master_t || !s->buf0 || !s->buf1 || !s->buf2 || !s->host_slots ||
        !s->next_slots || !s->sorted_written)
        return fx_fail(st, FX_ENOMEM, "out of host memory for an optimizer state of %u tensors", n);
    return FX_OK;
}

/* The per-tensor buffers: zeroed f32 moments of the param's shape, and an
 * f32 copy of the param as its master. */
static int alloc_tensor_state(fx_optim_state *s, const fx_tensor *p, unsigned i, fx_status *st)
{
    fx_tensor *shape = &s->shapes[i];
    shape->dtype = p->dtype;
    shape->rank = p->rank;
    memcpy(shape->dims, p->dims, sizeof shape->dims);
    shape->numel = p->numel;
    if (s->master && fx_op_cast(p, FX_F32, &s->master_t[i], st))
        return st->code;
    bool want0 = s->kind == FX_OPTIM_ADAMW || s->momentum;
    bool want1 = s->kind == FX_OPTIM_ADAMW;
    bool want2 = s->kind == FX_OPTIM_ADAMW && s->amsgrad;
    if (want0 && fx_op_zeros(s->device, FX_F32, p->rank, p->dims, &s->buf0[i], st))
        return st->code;
    if (want1 && fx_op_zeros(s->device, FX_F32, p->rank, p->dims, &s->buf1[i], st))
        return st->code;
    if (want2 && fx_op_zeros(s->device, FX_F32, p->rank, p->dims, &s->buf2[i], st))
        return st->code;
    return FX_OK;
}

static int alloc_scalars(fx_optim_state *s, fx_status *st)
{
    float no_norm = -1.0f;
    const int64_t scalar[1] = {0}; /* rank 0: no dims are read */
    if (fx_op_zeros(s->device, FX_S64, 0, scalar, &s->step, st) ||
        fx_op_from_host(s->device, FX_F32, 0, scalar, &no_norm, sizeof no_norm, &s->grad_norm, st) ||
        fx_op_zeros(s->device, FX_U8, 0, scalar, &s->skipped, st))
        return st->code;
    return FX_OK;
}

int fx_op_optim_init(fx_optim_kind kind, const fx_tensor *params, unsigned n,
                     const fx_optim_config *cfg, fx_optim_state **out, fx_status *st)
{
    *out = NULL;
    if (fx_optim_check_hyper(kind, &cfg->defaults, st) ||
        check_init_params(params, n, cfg->master_weights, st))
        return st->code;
    const struct fx_optim_ops *ops = params[0].device->backend->optim;
    if (fx_expect_op(st, params[0].device, ops ? (const void *)ops->step : NULL, "the optimizers"))
        return st->code;
    fx_optim_state *s = calloc(1, sizeof *s);
    if (!s)
        return fx_fail(st, FX_ENOMEM, "out of host memory for an optimizer state");
    pthread_mutex_init(&s->lock, NULL);
    s->kind = kind;
    s->device = params[0].device;
    s->param_dtype = params[0].dtype;
    s->master = params[0].dtype != FX_F32; /* check_init_params allowed 16-bit only with it */
    s->amsgrad = kind == FX_OPTIM_ADAMW && cfg->defaults.amsgrad;
    s->momentum = kind == FX_OPTIM_SGD && cfg->defaults.momentum > 0;
    s->defaults = cfg->defaults;
    s->n = n;
    int rc = alloc_arrays(s, st);
    for (unsigned i = 0; rc == FX_OK && i < n; i++)
        rc = alloc_tensor_state(s, &params[i], i, st);
    if (rc == FX_OK)
        rc = alloc_scalars(s, st);
    if (rc == FX_OK)
        rc = plan_table(s, params, st);
    if (rc == FX_OK)
        rc = make_table(s, st);
    if (rc != FX_OK) {
        fx_optim_state_free(s);
        return rc;
    }
    *out = s;
    return FX_OK;
}

/* ---- step ---- */

static int check_kind_options(const fx_optim_state *s, const fx_optim_hyper *h, fx_status *st)
{
    if (s->kind == FX_OPTIM_ADAMW && h->amsgrad != s->amsgrad)
        return fx_fail(st, FX_EBADARG,
                       "amsgrad: expected %s (fixed by adamw_init, which %s max_exp_avg_sq), got %s",
                       s->amsgrad ? "true" : "false", s->amsgrad ? "allocated" : "did not allocate",
                       h->amsgrad ? "true" : "false");
    if (s->kind == FX_OPTIM_SGD && h->momentum > 0 && !s->momentum)
        return fx_fail(st, FX_EBADARG,
                       "momentum: expected 0 (sgd_init was given momentum 0, so the state holds no momentum buffers), got %g",
                       h->momentum);
    return FX_OK;
}

static bool same_shape(const fx_tensor *t, const fx_tensor *like)
{
    if (t->rank != like->rank)
        return false;
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] != like->dims[d])
            return false;
    return true;
}

/* The checks run for every tensor of every step, so the cheap comparison
 * comes first and the message (names, layouts) is formatted only for the
 * tensor that fails. */
static bool param_ok(const fx_optim_state *s, const fx_tensor *p, unsigned i)
{
    return p->device == s->device && p->dtype == s->param_dtype && same_shape(p, &s->shapes[i]);
}

static int fail_param(const fx_optim_state *s, const fx_tensor *p, unsigned i, fx_status *st)
{
    char name[32];
    item_name(name, sizeof name, "params", i);
    if (fx_expect_same_device(st, name, p, s->device, "the optimizer state"))
        return st->code;
    if (p->dtype != s->param_dtype)
        return fx_fail(st, FX_EBADARG, "%s: expected type %s (as given to %s), got %s", name,
                       fx_dtype_name(s->param_dtype), fx_optim_init_name(s->kind),
                       fx_dtype_name(p->dtype));
    char layout[48];
    snprintf(layout, sizeof layout, "(as given to %s)", fx_optim_init_name(s->kind));
    return fx_expect_shape(st, name, p, s->shapes[i].rank, s->shapes[i].dims, layout);
}

static bool grad_ok(const fx_optim_state *s, const fx_tensor *g, const fx_tensor *g0,
                    const fx_tensor *p)
{
    fx_dtype t = g->dtype;
    return g->device == s->device && (t == FX_F32 || t == FX_BF16 || t == FX_F16) &&
           t == g0->dtype && same_shape(g, p);
}

static int fail_grad(const fx_optim_state *s, const fx_tensor *g, const fx_tensor *g0,
                     const fx_tensor *p, unsigned i, fx_status *st)
{
    char name[32], layout[48];
    item_name(name, sizeof name, "grads", i);
    if (fx_expect_same_device(st, name, g, s->device, "the optimizer state"))
        return st->code;
    fx_dtype t = g->dtype;
    if (t != FX_F32 && t != FX_BF16 && t != FX_F16)
        return fx_fail(st, FX_EBADARG, "%s: expected type {f,32}, {bf,16} or {f,16}, got %s", name,
                       fx_dtype_name(t));
    if (t != g0->dtype)
        return fx_fail(st, FX_EBADARG, "%s: expected type %s (the type of grads[0]), got %s", name,
                       fx_dtype_name(g0->dtype), fx_dtype_name(t));
    snprintf(layout, sizeof layout, "(the shape of params[%u])", i);
    return fx_expect_shape(st, name, g, p->rank, p->dims, layout);
}

static int check_step_lists(const fx_optim_state *s, const fx_tensor *params, unsigned np,
                            const fx_tensor *grads, unsigned ng, fx_status *st)
{
    if (np != s->n)
        return fx_fail(st, FX_EBADARG, "params: expected a list of %u %s (as given to %s), got %u",
                       s->n, s->n == 1 ? "tensor" : "tensors", fx_optim_init_name(s->kind), np);
    if (ng != np)
        return fx_fail(st, FX_EBADARG, "grads: expected a list of %u %s (one per param), got %u", np,
                       np == 1 ? "tensor" : "tensors", ng);
    for (unsigned i = 0; i < np; i++) {
        if (!param_ok(s, &params[i], i))
            return fail_param(s, &params[i], i, st);
        if (!grad_ok(s, &grads[i], &grads[0], &params[i]))
            return fail_grad(s, &grads[i], &grads[0], &params[i], i, st);
    }
    return FX_OK;
}

static const float *ptr_or_null(const fx_tensor *t) { return t->buffer ? t->data : NULL; }

static void build_slots(fx_optim_state *s, const fx_tensor *params, const fx_tensor *grads)
{
    int64_t chunk = 0;
    for (unsigned i = 0; i < s->n; i++) {
        fx_optim_slot *slot = &s->next_slots[i];
        memset(slot, 0, sizeof *slot);
        slot->param = params[i].data;
        slot->grad = grads[i].data;
        slot->master = (float *)ptr_or_null(&s->master_t[i]);
        slot->buf0 = (float *)ptr_or_null(&s->buf0[i]);
        slot->buf1 = (float *)ptr_or_null(&s->buf1[i]);
        slot->buf2 = (float *)ptr_or_null(&s->buf2[i]);
        slot->numel = params[i].numel;
        slot->chunk_begin = chunk;
        chunk += chunks_of(params[i].numel);
    }
}

/* Do the params of the step being built sit where the device table's do? */
static bool same_params(const fx_optim_state *s)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->next_slots[i].param != s->host_slots[i].param)
            return false;
    return true;
}

/* The upload of a changed table; with `nowait`, only when the backend can
 * do it without waiting (*done false, nothing enqueued, otherwise). */
/* The table goes up on fusex's own stream, so after the steps enqueued on
 * it; steps enqueued on a caller's stream (`ex`) may still be reading the
 * old table there, so that stream is waited for first. */
static int upload_table(const fx_exec *ex, fx_optim_state *s, size_t bytes, bool nowait, bool *done,
                        fx_status *st)
{
    const fx_backend *b = s->device->backend;
    *done = false;
    if (!nowait) {
        if (ex && ex->stream && b->stream_synchronize &&
            b->stream_synchronize(ex->device, ex->stream, st) != FX_OK)
            return st->code;
        *done = b->upload(s->device->ordinal, s->table.data, s->next_slots, bytes, st) == FX_OK;
        return st->code;
    }
    if (!b->try_upload)
        return FX_OK;
    return b->try_upload(s->device->ordinal, s->table.data, s->next_slots, bytes, done, st);
}

/* Uploads the slots when they differ from what the device holds. A table
 * that changed is checked for aliasing first (an unchanged one passed).
 * *ready: the device holds the table (false only with `nowait`). */
static int sync_table(const fx_exec *ex, fx_optim_state *s, const fx_tensor *params, const fx_tensor *grads,
                      bool nowait, bool *ready, bool *uploaded_now, fx_status *st)
{
    *uploaded_now = false;
    *ready = false;
    build_slots(s, params, grads);
    size_t bytes = sizeof(fx_optim_slot) * s->n;
    if (s->slots_valid && memcmp(s->next_slots, s->host_slots, bytes) == 0) {
        *ready = true;
        return FX_OK;
    }
    if (!(s->slots_valid && same_params(s))) {
        s->slots_valid = false; /* sorted_written no longer matches host_slots */
        s->nwritten = written_ranges(s, params, s->n, s->sorted_written);
        if (check_written_apart(s, s->sorted_written, s->nwritten, st) != FX_OK)
            return st->code;
    }
    if (check_grads_apart(s, s->sorted_written, s->nwritten, grads, s->n, st) != FX_OK)
        return st->code;
    bool uploaded;
    /* a failed upload may have written part of the device's table */
    if (upload_table(ex, s, bytes, nowait, &uploaded, st) != FX_OK) {
        s->slots_valid = false;
        return st->code;
    }
    if (!uploaded)
        return FX_OK;
    *uploaded_now = true;
    fx_optim_slot *held = s->host_slots;
    s->host_slots = s->next_slots;
    s->next_slots = held;
    s->slots_valid = true;
    *ready = true;
    return FX_OK;
}

static void fill_args(const fx_optim_state *s, const fx_optim_hyper *h, fx_dtype grad_dtype,
                      fx_optim_args *a)
{
    char *table = s->table.data;
    memset(a, 0, sizeof *a);
    a->kind = s->kind;
    a->hyper = *h;
    a->param_dtype = s->param_dtype;
    a->grad_dtype = grad_dtype;
    a->ntensors = s->n;
    a->nchunks = s->nchunks;
    a->blocks = fx_optim_blocks(s->nchunks);
    if (a->blocks > s->max_blocks)
        a->blocks = s->max_blocks > 0 ? s->max_blocks : 1;
    a->prepass = h->clip || h->skip_nonfinite;
    a->slots = s->host_slots;
    a->chunk_tensor = s->chunk_tensor;
    a->dev_slots = (const fx_optim_slot *)table;
    a->dev_chunk_tensor = (const uint32_t *)(table + s->off_chunks);
    a->sync = (fx_optim_sync *)(table + s->off_sync);
    a->partial_sq = (double *)(table + s->off_partial_sq);
    a->partial_bad = (uint32_t *)(table + s->off_partial_bad);
    a->step = s->step.data;
    a->grad_norm = s->grad_norm.data;
    a->skipped = s->skipped.data;
}

static int optim_step(const fx_exec *ex, fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                      unsigned nparams, const fx_tensor *grads, unsigned ngrads,
                      const fx_optim_hyper *h, bool nowait, bool *done, fx_status *st)
{
    *done = false;
    if (kind != s->kind)
        return fx_fail(st, FX_EBADARG, "state: expected an %s state (from %s), got an %s state",
                       fx_optim_kind_name(kind), fx_optim_init_name(kind),
                       fx_optim_kind_name(s->kind));
    const struct fx_optim_ops *ops = s->device->backend->optim;
    if (fx_expect_op(st, s->device, ops ? (const void *)ops->step : NULL, "the optimizers") ||
        fx_optim_check_hyper(kind, h, st) || check_kind_options(s, h, st) ||
        check_step_lists(s, params, nparams, grads, ngrads, st))
        return st->code;
    if (!nowait)
        pthread_mutex_lock(&s->lock);
    else if (pthread_mutex_trylock(&s->lock) != 0)
        return FX_OK;
    bool ready, uploaded;
    int rc = sync_table(ex, s, params, grads, nowait, &ready, &uploaded, st);
    /* The table goes up on fusex's own stream: a step on another waits for
     * it (only when the parameters or gradients moved). */
    if (rc == FX_OK && ready && uploaded && ex)
        rc = s->device->backend->synchronize(s->device->ordinal, st);
    if (rc == FX_OK && ready) {
        fx_optim_args args;
        fx_exec own;
        fill_args(s, h, grads[0].dtype, &args);
        const fx_exec *on = fx_exec_resolve(s->device, ex, &own, st);
        rc = on ? ops->step(on, &args, st) : st->code;
        *done = rc == FX_OK;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int fx_op_optim_step(fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                     unsigned nparams, const fx_tensor *grads, unsigned ngrads,
                     const fx_optim_hyper *h, fx_status *st)
{
    bool done;
    return optim_step(NULL, s, kind, params, nparams, grads, ngrads, h, false, &done, st);
}

int fx_op_optim_step_on(const fx_exec *ex, fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                        unsigned nparams, const fx_tensor *grads, unsigned ngrads, const fx_optim_hyper *h,
                        fx_status *st)
{
    bool done;
    return optim_step(ex, s, kind, params, nparams, grads, ngrads, h, false, &done, st);
}

int fx_op_optim_try_step(fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                         unsigned nparams, const fx_tensor *grads, unsigned ngrads,
                         const fx_optim_hyper *h, bool *done, fx_status *st)
{
    return optim_step(NULL, s, kind, params, nparams, grads, ngrads, h, true, done, st);
}

/* Under the state's lock, so that a step running on the CPU in another
 * thread is not read half-way. */
int fx_op_optim_info(fx_optim_state *s, fx_optim_info *out, fx_status *st)
{
    uint8_t skipped = 0;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->lock);
    if (fx_op_to_host(&s->step, &out->step, st) == FX_OK &&
        fx_op_to_host(&s->grad_norm, &out->grad_norm, st) == FX_OK)
        fx_op_to_host(&s->skipped, &skipped, st);
    pthread_mutex_unlock(&s->lock);
    out->skipped = skipped != 0;
    return st->code;
}
