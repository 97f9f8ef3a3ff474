#include "core/model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/conv.h"
#include "core/linear.h"
#include "core/linrec.h"
#include "core/loss.h"
#include "core/norm.h"
#include "core/ops.h"
#include "core/rnn.h"
#include "core/ssm.h"

/* ---- kinds and their weight slots ---- */

typedef struct layer_kind_info {
    const char *name;
    int nslots;
    const char *slot[FX_LAYER_MAX_SLOTS];
} layer_kind_info;

static const layer_kind_info kinds[FX_LAYER_KIND_COUNT] = {
    [FX_LAYER_LINEAR] = {"linear", 2, {"w", "b"}},
    [FX_LAYER_RMS_NORM] = {"rms_norm", 1, {"weight"}},
    [FX_LAYER_LAYER_NORM] = {"layer_norm", 2, {"weight", "bias"}},
    [FX_LAYER_MINGRU] = {"mingru", 4, {"w_z", "b_z", "w_h", "b_h"}},
    [FX_LAYER_MINLSTM] = {"minlstm", 6, {"w_f", "b_f", "w_i", "b_i", "w_h", "b_h"}},
    [FX_LAYER_GRU] = {"gru", 4, {"w_ih", "w_hh", "b_ih", "b_hh"}},
    [FX_LAYER_LSTM] = {"lstm", 4, {"w_ih", "w_hh", "b_ih", "b_hh"}},
    [FX_LAYER_MAMBA] = {"mamba", 12, {"w_in_x", "w_in_z", "w_conv", "b_conv", "w_x_dt", "w_x_b", "w_x_c", "w_dt",
                                      "b_dt", "a", "d", "w_out"}},
};

/* Mamba's weight slots and frame buffers. */
enum { W_IN_X, W_IN_Z, W_CONV, B_CONV, W_X_DT, W_X_B, W_X_C, W_DT, B_DT, M_A, M_D, W_OUT };
enum { M_XIN, M_Z, M_U, M_DTL, M_B, M_C, M_DT, M_Y, M_NTMP };

const char *fx_layer_kind_name(int kind) { return kind >= 0 && kind < FX_LAYER_KIND_COUNT ? kinds[kind].name : NULL; }

int fx_layer_kind_of(const char *name)
{
    for (int k = 0; k < FX_LAYER_KIND_COUNT; k++)
        if (strcmp(kinds[k].name, name) == 0)
            return k;
    return -1;
}

int fx_layer_slot_count(int kind) { return fx_layer_kind_name(kind) ? kinds[kind].nslots : 0; }

const char *fx_layer_slot_name(int kind, int slot)
{
    return slot >= 0 && slot < fx_layer_slot_count(kind) ? kinds[kind].slot[slot] : NULL;
}

static bool is_min(int kind) { return kind == FX_LAYER_MINGRU || kind == FX_LAYER_MINLSTM; }
static bool is_rnn(int kind) { return kind == FX_LAYER_GRU || kind == FX_LAYER_LSTM; }
static bool is_norm(int kind) { return kind == FX_LAYER_RMS_NORM || kind == FX_LAYER_LAYER_NORM; }
static bool is_mamba(int kind) { return kind == FX_LAYER_MAMBA; }
/* The min layers' projections: 2 (z, h) or 3 (f, i, h). */
static int nproj(int kind) { return kind == FX_LAYER_MINLSTM ? 3 : 2; }

bool fx_layer_slot_is_bias(int kind, int slot)
{
    switch (kind) {
    case FX_LAYER_LINEAR:
    case FX_LAYER_LAYER_NORM: return slot == 1;
    case FX_LAYER_MINGRU:
    case FX_LAYER_MINLSTM: return slot % 2 == 1;
    case FX_LAYER_GRU:
    case FX_LAYER_LSTM: return slot >= 2;
    default: return false;
    }
}

static int64_t layer_out(const fx_layer_spec *spec, int64_t in)
{
    return is_norm(spec->kind) || is_mamba(spec->kind) ? in : spec->size;
}

/* Mamba's slot shapes: [E, D], [E, D], [E, K], [E], [R, E], [N, E], [N, E],
 * [E, R], [E], [E, N], [E], [D, E]. */
static int mamba_slot_shape(const fx_layer_spec *spec, int64_t in, int slot, int64_t dims[2], const char **layout)
{
    static const char *const layouts[12] = {"[d_inner, in]", "[d_inner, in]", "[d_inner, d_conv]", "[d_inner]",
                                            "[dt_rank, d_inner]", "[d_state, d_inner]", "[d_state, d_inner]",
                                            "[d_inner, dt_rank]", "[d_inner]", "[d_inner, d_state]", "[d_inner]",
                                            "[in, d_inner]"};
    const int64_t e = spec->inner, n = spec->dstate, r = spec->dt_rank;
    const int64_t shapes[12][2] = {{e, in}, {e, in}, {e, spec->dconv}, {e, 0}, {r, e}, {n, e},
                                   {n, e},  {e, r},  {e, 0},           {e, n}, {e, 0}, {in, e}};
    *layout = layouts[slot];
    dims[0] = shapes[slot][0];
    dims[1] = shapes[slot][1];
    return dims[1] ? 2 : 1;
}

int fx_layer_slot_shape(const fx_layer_spec *spec, int64_t in, int slot, int64_t dims[2], const char **layout)
{
    const int64_t out = layer_out(spec, in);
    const int64_t gates = spec->kind == FX_LAYER_LSTM ? 4 : 3;
    switch (spec->kind) {
    case FX_LAYER_MAMBA: return mamba_slot_shape(spec, in, slot, dims, layout);
    case FX_LAYER_LINEAR:
        dims[0] = out, dims[1] = in;
        *layout = slot == 0 ? "[out, in]" : "[out]";
        return slot == 0 ? 2 : 1;
    case FX_LAYER_RMS_NORM:
    case FX_LAYER_LAYER_NORM:
        dims[0] = in;
        *layout = "[in]";
        return 1;
    case FX_LAYER_MINGRU:
    case FX_LAYER_MINLSTM:
        dims[0] = out, dims[1] = in;
        *layout = slot % 2 == 0 ? "[hidden, in]" : "[hidden]";
        return slot % 2 == 0 ? 2 : 1;
    default: /* gru, lstm */
        dims[0] = gates * out;
        dims[1] = slot == 0 ? in : out;
        *layout = slot == 0   ? (gates == 4 ? "[4*hidden, in]" : "[3*hidden, in]")
                  : slot == 1 ? (gates == 4 ? "[4*hidden, hidden]" : "[3*hidden, hidden]")
                              : (gates == 4 ? "[4*hidden]" : "[3*hidden]");
        return slot <= 1 ? 2 : 1;
    }
}

/* ---- small helpers ---- */

static _Atomic uint64_t next_model_id = 1;

static int tensor_like(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, fx_tensor *t, fx_status *st)
{
    return fx_op_zeros(dev, dtype, rank, dims, t, st);
}

static fx_dtype state_type(fx_dtype dtype) { return dtype == FX_F64 ? FX_F64 : FX_F32; }

/* A tensor without memory: what scratch queries take. */
static fx_tensor shape_only(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims)
{
    fx_tensor t;
    memset(&t, 0, sizeof t);
    t.device = dev;
    t.dtype = dtype;
    t.rank = rank;
    t.numel = 1;
    for (int i = 0; i < rank; i++)
        t.dims[i] = dims[i], t.numel *= dims[i];
    t.nbytes = (size_t)t.numel * (dtype == FX_F64 ? 8 : 4);
    return t;
}

static const fx_tensor *opt(const fx_tensor *t) { return t->data || t->buffer ? t : NULL; }

/* splitmix64: the initial weights, reproducible from the spec's seed. */
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s, double bound)
{
    return ((double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * bound;
}

/* Host doubles into a tensor of dtype f32 or f64 on dev. */
static int upload_doubles(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims, const double *v,
                          int64_t n, fx_tensor *out, fx_status *st)
{
    if (dtype == FX_F64)
        return fx_op_from_host(dev, dtype, rank, dims, v, (size_t)n * 8, out, st);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    if (!f)
        return fx_fail(st, FX_ENOMEM, "out of host memory for %lld values", (long long)n);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    int rc = fx_op_from_host(dev, dtype, rank, dims, f, (size_t)n * 4, out, st);
    free(f);
    return rc;
}

/* The tensor's elements as host doubles (malloc'd). */
static double *download_doubles(const fx_tensor *t, fx_status *st)
{
    const int64_t n = t->numel;
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    void *raw = t->dtype == FX_F64 ? (void *)v : malloc(t->nbytes ? t->nbytes : 1);
    if (!v || !raw) {
        free(v);
        if (raw != v)
            free(raw);
        fx_fail(st, FX_ENOMEM, "out of host memory for %lld values", (long long)n);
        return NULL;
    }
    if (fx_op_to_host(t, raw, st)) {
        if (raw != v)
            free(raw);
        free(v);
        return NULL;
    }
    if (t->dtype == FX_F32)
        for (int64_t i = 0; i < n; i++)
            v[i] = ((const float *)raw)[i];
    if (raw != v)
        free(raw);
    return v;
}

/* ---- building ---- */

static int check_layer_spec(const fx_layer_spec *ls, int i, int64_t in, fx_status *st)
{
    const char *name = fx_layer_kind_name(ls->kind);
    if (!name)
        return fx_fail(st, FX_EBADARG, "layers[%d]: expected a layer kind (linear, rms_norm, layer_norm, mingru, "
                                       "minlstm, gru, lstm, mamba), got %d", i, ls->kind);
    if (is_mamba(ls->kind)) {
        const struct { const char *name; int64_t v, lo, hi; } sizes[] = {
            {"d_inner", ls->inner, 1, INT32_MAX}, {"d_state", ls->dstate, 1, 256},
            {"d_conv", ls->dconv, 2, 16}, {"dt_rank", ls->dt_rank, 1, INT32_MAX}};
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            if (sizes[k].v < sizes[k].lo || sizes[k].v > sizes[k].hi)
                return fx_fail(st, FX_EBADARG, "layers[%d] (mamba): %s: expected an integer in [%lld, %lld], got %lld",
                               i, sizes[k].name, (long long)sizes[k].lo, (long long)sizes[k].hi,
                               (long long)sizes[k].v);
    } else if (!is_norm(ls->kind) && ls->size < 1)
        return fx_fail(st, FX_EBADARG, "layers[%d] (%s): %s: expected an integer >= 1, got %lld", i, name,
                       ls->kind == FX_LAYER_LINEAR ? "out" : "hidden", (long long)ls->size);
    if (ls->kind == FX_LAYER_LINEAR && (ls->activation < 0 || ls->activation >= FX_ACT_COUNT))
        return fx_fail(st, FX_EBADARG, "layers[%d] (linear): activation: expected one of none, relu, gelu, silu, "
                                       "tanh, sigmoid, got %d", i, ls->activation);
    if (is_norm(ls->kind) && !(ls->eps > 0 && isfinite(ls->eps)))
        return fx_fail(st, FX_EBADARG, "layers[%d] (%s): eps: expected a finite number > 0, got %g", i, name,
                       ls->eps);
    if (ls->residual && layer_out(ls, in) != in)
        return fx_fail(st, FX_EBADARG, "layers[%d] (%s): residual: expected the layer's output width to equal "
                                       "its input's (%lld), got %lld", i, name, (long long)in,
                       (long long)layer_out(ls, in));
    return FX_OK;
}

static int check_spec(fx_device *dev, const fx_model_spec *spec, fx_status *st)
{
    if (spec->dtype != FX_F32 && !(spec->dtype == FX_F64 && dev->kind == FX_DEVICE_CPU))
        return fx_fail(st, FX_EBADARG, "type: expected {f,32}%s, got another type",
                       dev->kind == FX_DEVICE_CPU ? " or {f,64}" : " (the only model type on CUDA)");
    if (spec->input < 1)
        return fx_fail(st, FX_EBADARG, "input: expected an integer >= 1, got %lld", (long long)spec->input);
    if (spec->nlayers < 1 || spec->nlayers > FX_MODEL_MAX_LAYERS)
        return fx_fail(st, FX_EBADARG, "layers: expected 1 to %d layers, got %d", FX_MODEL_MAX_LAYERS,
                       spec->nlayers);
    int64_t in = spec->input;
    for (int i = 0; i < spec->nlayers; i++) {
        if (check_layer_spec(&spec->layers[i], i, in, st))
            return st->code;
        in = layer_out(&spec->layers[i], in);
    }
    return FX_OK;
}

/* Mamba's own initial values where they are not a uniform fan-in draw
 * (mamba_simple.py): A = -(1..d_state) per channel, D = 1, dt_proj's bias
 * the inverse softplus of a dt log-uniform in [1e-3, 1e-1]. */
static void mamba_init(int slot, const int64_t dims[2], double *v, uint64_t *rng)
{
    if (slot == M_A)
        for (int64_t e = 0; e < dims[0]; e++)
            for (int64_t k = 0; k < dims[1]; k++)
                v[e * dims[1] + k] = -(double)(k + 1);
    if (slot == M_D)
        for (int64_t e = 0; e < dims[0]; e++)
            v[e] = 1.0;
    if (slot == B_DT)
        for (int64_t e = 0; e < dims[0]; e++) {
            const double dt = exp(log(1e-3) + (uniform(rng, 1.0) + 1.0) / 2.0 * (log(1e-1) - log(1e-3)));
            v[e] = dt + log(-expm1(-dt));
        }
}

static int init_slot(fx_model *m, fx_layer *L, int slot, uint64_t *rng, fx_status *st)
{
    int64_t dims[2];
    const char *layout;
    const int rank = fx_layer_slot_shape(&L->spec, L->in, slot, dims, &layout);
    const int64_t n = rank == 2 ? dims[0] * dims[1] : dims[0];
    double *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a weight of %lld values", (long long)n);
    const int64_t fan_in = is_rnn(L->spec.kind) ? L->out : rank == 2 ? dims[1] : L->in;
    const double bound = 1.0 / sqrt((double)fan_in);
    for (int64_t i = 0; i < n; i++)
        v[i] = is_norm(L->spec.kind) ? (slot == 0 ? 1.0 : 0.0) : uniform(rng, bound);
    if (is_mamba(L->spec.kind))
        mamba_init(slot, dims, v, rng);
    int rc = upload_doubles(m->device, m->dtype, rank, dims, v, n, &L->param[slot], st);
    free(v);
    return rc;
}

/* A given weight, checked and copied onto the model's device. */
static int copy_slot(fx_model *m, fx_layer *L, int li, int slot, const fx_tensor *w, fx_status *st)
{
    int64_t dims[2];
    const char *layout;
    const int rank = fx_layer_slot_shape(&L->spec, L->in, slot, dims, &layout);
    char arg[64], text[48];
    snprintf(arg, sizeof arg, "layers[%d].%s", li, fx_layer_slot_name(L->spec.kind, slot));
    if (!w)
        return fx_fail(st, FX_EBADARG, "%s: expected a tensor %s, got none", arg, layout);
    snprintf(text, sizeof text, "(%s)", layout);
    if (fx_expect_dtype(st, arg, w, m->dtype) || fx_expect_shape(st, arg, w, rank, dims, text))
        return st->code;
    return fx_op_copy_to(w, m->device, &L->param[slot], st);
}

static int build_layer(fx_model *m, int li, const fx_layer_spec *ls, int64_t in, const fx_tensor *const *weights,
                       uint64_t *rng, fx_status *st)
{
    fx_layer *L = &m->layer[li];
    L->spec = *ls;
    L->in = in;
    L->out = layer_out(ls, in);
    L->nslots = fx_layer_slot_count(ls->kind);
    for (int s = 0; s < L->nslots; s++) {
        const bool absent = fx_layer_slot_is_bias(ls->kind, s) && !ls->bias;
        const fx_tensor *w = weights ? weights[li * FX_LAYER_MAX_SLOTS + s] : NULL;
        if (absent) {
            if (w)
                return fx_fail(st, FX_EBADARG, "layers[%d].%s: expected none (the layer has bias => false), "
                                               "got a tensor", li, fx_layer_slot_name(ls->kind, s));
            continue;
        }
        if (weights ? copy_slot(m, L, li, s, w, st) : init_slot(m, L, s, rng, st))
            return st->code;
    }
    return FX_OK;
}

/* Whether frames can be graphs: a device with a stream whose backend
 * captures (CUDA), and the spec not turning them off. */
static void decide_graphs(fx_model *m, const fx_model_spec *spec)
{
    const fx_backend *b = m->device->backend;
    m->graphs = false;
    if (spec->no_graph)
        snprintf(m->frame_why, sizeof m->frame_why, "graph => false in the spec");
    else if (m->device->kind != FX_DEVICE_CUDA)
        snprintf(m->frame_why, sizeof m->frame_why, "%s has no CUDA graphs", m->device->label);
    else if (!b->graph_begin || !b->graph_end || !b->graph_launch || !b->graph_destroy || !b->stream_create)
        snprintf(m->frame_why, sizeof m->frame_why, "the backend of %s has no graph capture", m->device->label);
    else
        m->graphs = true, m->frame_why[0] = '\0';
}

bool fx_model_frame_graphs(fx_model *m, char *why, size_t len)
{
    pthread_mutex_lock(&m->lock);
    const bool graphs = m->graphs;
    if (len)
        snprintf(why, len, "%s", graphs ? "" : m->frame_why);
    pthread_mutex_unlock(&m->lock);
    return graphs;
}

int fx_model_new(fx_device *dev, const fx_model_spec *spec, const fx_tensor *const *weights, fx_model **out,
                 fx_status *st)
{
    *out = NULL;
    if (check_spec(dev, spec, st))
        return st->code;
    fx_model *m = calloc(1, sizeof *m);
    fx_layer *layers = calloc((size_t)spec->nlayers, sizeof *layers);
    if (!m || !layers) {
        free(m);
        free(layers);
        return fx_fail(st, FX_ENOMEM, "out of host memory for a model of %d layers", spec->nlayers);
    }
    m->id = atomic_fetch_add(&next_model_id, 1);
    m->device = dev;
    m->dtype = spec->dtype;
    m->input = spec->input;
    m->nlayers = spec->nlayers;
    m->layer = layers;
    pthread_mutex_init(&m->lock, NULL);
    uint64_t rng = spec->seed;
    int64_t in = spec->input;
    for (int i = 0; i < spec->nlayers; i++) {
        if (build_layer(m, i, &spec->layers[i], in, weights, &rng, st)) {
            fx_model_free(m);
            return st->code;
        }
        in = m->layer[i].out;
    }
    m->output = in;
    decide_graphs(m, spec);
    *out = m;
    return FX_OK;
}

void fx_model_free(fx_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nlayers; i++)
        for (int s = 0; s < FX_LAYER_MAX_SLOTS; s++) {
            fx_tensor_release(&m->layer[i].param[s]);
            fx_tensor_release(&m->layer[i].grad[s]);
        }
    pthread_mutex_destroy(&m->lock);
    free(m->layer);
    free(m);
}

/* The (layer, slot) of the i-th parameter, or false. */
static bool param_at(const fx_model *m, int i, int *li, int *slot)
{
    for (int l = 0; l < m->nlayers; l++)
        for (int s = 0; s < m->layer[l].nslots; s++)
            if (m->layer[l].param[s].buffer && i-- == 0) {
                *li = l, *slot = s;
                return true;
            }
    return false;
}

int fx_model_param_count(const fx_model *m)
{
    int n = 0;
    for (int l = 0; l < m->nlayers; l++)
        for (int s = 0; s < m->layer[l].nslots; s++)
            n += m->layer[l].param[s].buffer != NULL;
    return n;
}

const fx_tensor *fx_model_param(const fx_model *m, int i)
{
    int l, s;
    return param_at(m, i, &l, &s) ? &m->layer[l].param[s] : NULL;
}

const fx_tensor *fx_model_grad(const fx_model *m, int i)
{
    int l, s;
    return m->grads_ready && param_at(m, i, &l, &s) ? &m->layer[l].grad[s] : NULL;
}

/* ---- the state ---- */

static int alloc_rec(const fx_model *m, const fx_layer *L, int64_t batch, fx_tensor rec[2], fx_status *st)
{
    const fx_dtype t = state_type(m->dtype);
    if (is_min(L->spec.kind)) {
        const int64_t dims[2] = {batch, L->out};
        return tensor_like(m->device, t, 2, dims, &rec[0], st);
    }
    if (is_mamba(L->spec.kind)) {
        const int64_t ssm[3] = {batch, L->spec.inner, L->spec.dstate};
        const int64_t conv[3] = {batch, L->spec.inner, L->spec.dconv - 1};
        return tensor_like(m->device, fx_ssm_state_dtype(m->dtype), 3, ssm, &rec[0], st) ||
                       tensor_like(m->device, m->dtype, 3, conv, &rec[1], st)
                   ? st->code
                   : FX_OK;
    }
    if (is_rnn(L->spec.kind)) {
        const int64_t dims[3] = {1, batch, L->out};
        return tensor_like(m->device, t, 3, dims, &rec[0], st) ||
                       (L->spec.kind == FX_LAYER_LSTM && tensor_like(m->device, t, 3, dims, &rec[1], st))
                   ? st->code
                   : FX_OK;
    }
    return FX_OK;
}

static void rnn_layer_of(const fx_layer *L, fx_rnn_layer *rl)
{
    rl->w_ih = &L->param[0];
    rl->w_hh = &L->param[1];
    rl->b_ih = opt(&L->param[2]);
    rl->b_hh = opt(&L->param[3]);
}

static fx_rnn_inputs rnn_inputs(const fx_layer *L, const fx_rnn_layer *rl, const fx_tensor *x, const fx_tensor *h0,
                                const fx_tensor *c0)
{
    fx_rnn_inputs in = {.cell = L->spec.kind == FX_LAYER_LSTM ? FX_RNN_LSTM : FX_RNN_GRU,
                        .layers = 1, .layer = rl, .x = x, .h0 = h0, .c0 = c0, .path = 0};
    return in;
}

static fx_linear_inputs proj_inputs(const fx_layer *L, int k, const fx_tensor *x)
{
    fx_linear_inputs in = {.x = x, .w = &L->param[2 * k], .bias = opt(&L->param[2 * k + 1]),
                           .activation = FX_ACT_NONE, .allow_tf32 = false};
    return in;
}

static fx_linear_inputs linear_inputs(const fx_layer *L, const fx_tensor *x)
{
    fx_linear_inputs in = {.x = x, .w = &L->param[0], .bias = opt(&L->param[1]),
                           .activation = L->spec.activation, .allow_tf32 = false};
    return in;
}

static fx_norm_inputs norm_inputs(const fx_layer *L, const fx_tensor *x)
{
    fx_norm_inputs in = {.kind = L->spec.kind == FX_LAYER_RMS_NORM ? FX_NORM_RMS : FX_NORM_LAYER,
                         .eps = L->spec.eps, .x = x, .weight = &L->param[0], .bias = opt(&L->param[1]),
                         .residual = NULL, .gate = NULL, .residual_in_f32 = false};
    return in;
}

static fx_linrec_inputs linrec_inputs(const fx_layer *L, const fx_tensor *proj, const fx_tensor *h0)
{
    fx_linrec_inputs in;
    memset(&in, 0, sizeof in);
    in.kind = L->spec.kind == FX_LAYER_MINLSTM ? FX_LINREC_MINLSTM : FX_LINREC_MINGRU;
    for (int k = 0; k < nproj(L->spec.kind); k++)
        in.seq[k] = &proj[k];
    in.h0 = h0;
    return in;
}

/* The width of mamba's k-th intermediate. */
static int64_t mamba_tmp_width(const fx_layer_spec *spec, int k)
{
    return k == M_DTL ? spec->dt_rank : (k == M_B || k == M_C) ? spec->dstate : spec->inner;
}

static fx_linear_inputs plain(const fx_tensor *x, const fx_tensor *w)
{
    fx_linear_inputs in = {.x = x, .w = w, .bias = NULL, .activation = FX_ACT_NONE, .allow_tf32 = false};
    return in;
}

/* Mamba's products: (input, weight slot, output) in order. */
typedef struct mamba_product {
    int in; /* a frame buffer, or -1: the layer's input */
    int w, out;
} mamba_product;
static const mamba_product mamba_in[] = {{-1, W_IN_X, M_XIN}, {-1, W_IN_Z, M_Z}};
static const mamba_product mamba_mid[] = {{M_U, W_X_DT, M_DTL}, {M_U, W_X_B, M_B}, {M_U, W_X_C, M_C},
                                          {M_DTL, W_DT, M_DT}};

static fx_conv_inputs mamba_conv(const fx_layer *L, const fx_tensor *tmp, const fx_tensor *initial)
{
    fx_conv_inputs in = {.x = &tmp[M_XIN], .w = &L->param[W_CONV], .bias = &L->param[B_CONV],
                         .initial_state = initial, .activation = FX_ACT_SILU};
    return in;
}

static fx_ssm_inputs mamba_scan(const fx_layer *L, const fx_tensor *tmp, const fx_tensor *h0)
{
    const fx_tensor *P = L->param;
    fx_ssm_inputs in = {.x = &tmp[M_U], .dt = &tmp[M_DT], .a = &P[M_A], .b = &tmp[M_B], .c = &tmp[M_C],
                        .d = &P[M_D], .z = &tmp[M_Z], .dt_bias = &P[B_DT], .h0 = h0, .dt_softplus = true};
    return in;
}

/* Scratch a frame's op asks for; SIZE_MAX where a query fails. */
static size_t layer_step_scratch(const fx_exec *ex, const fx_model *m, const fx_model_state *s, int l,
                                 const fx_tensor *x, const fx_tensor *y)
{
    const fx_layer *L = &m->layer[l];
    switch (L->spec.kind) {
    case FX_LAYER_LINEAR: {
        fx_linear_inputs in = linear_inputs(L, x);
        return fx_op_linear_forward_scratch(ex, &in, y, NULL);
    }
    case FX_LAYER_RMS_NORM:
    case FX_LAYER_LAYER_NORM: {
        fx_norm_inputs in = norm_inputs(L, x);
        return fx_op_norm_forward_scratch(ex, &in, y, NULL, NULL, NULL);
    }
    case FX_LAYER_MINGRU:
    case FX_LAYER_MINLSTM: {
        size_t most = 0;
        for (int k = 0; k < nproj(L->spec.kind); k++) {
            fx_linear_inputs in = proj_inputs(L, k, x);
            size_t n = fx_op_linear_forward_scratch(ex, &in, &s->proj[FX_LAYER_MAX_TMP * l + k], NULL);
            most = n > most ? n : most;
        }
        return most;
    }
    case FX_LAYER_MAMBA: {
        const fx_tensor *tmp = &s->proj[FX_LAYER_MAX_TMP * l];
        size_t most = 0;
        for (int k = 0; k < 2; k++) {
            fx_linear_inputs in = plain(x, &L->param[mamba_in[k].w]);
            size_t n = fx_op_linear_forward_scratch(ex, &in, &tmp[mamba_in[k].out], NULL);
            most = n > most ? n : most;
        }
        for (int k = 0; k < 4; k++) {
            fx_linear_inputs in = plain(&tmp[mamba_mid[k].in], &L->param[mamba_mid[k].w]);
            size_t n = fx_op_linear_forward_scratch(ex, &in, &tmp[mamba_mid[k].out], NULL);
            most = n > most ? n : most;
        }
        fx_linear_inputs in = plain(&tmp[M_Y], &L->param[W_OUT]);
        size_t n = fx_op_linear_forward_scratch(ex, &in, y, NULL);
        return n > most ? n : most;
    }
    default: {
        fx_rnn_layer rl;
        rnn_layer_of(L, &rl);
        fx_rnn_inputs in = rnn_inputs(L, &rl, x, NULL, NULL);
        return fx_op_rnn_step_scratch(ex, &in);
    }
    }
}

static int alloc_frame_buffers(const fx_model *m, fx_model_state *s, int l, fx_status *st)
{
    const fx_layer *L = &m->layer[l];
    const int64_t out[2] = {s->batch, L->out};
    if (l + 1 < m->nlayers && tensor_like(m->device, m->dtype, 2, out, &s->act[l], st))
        return st->code;
    if (L->spec.residual && tensor_like(m->device, m->dtype, 2, out, &s->inner[l], st))
        return st->code;
    if (is_min(L->spec.kind))
        for (int k = 0; k < nproj(L->spec.kind); k++)
            if (tensor_like(m->device, m->dtype, 2, out, &s->proj[FX_LAYER_MAX_TMP * l + k], st))
                return st->code;
    if (is_mamba(L->spec.kind))
        for (int k = 0; k < M_NTMP; k++) {
            const int64_t dims[2] = {s->batch, mamba_tmp_width(&L->spec, k)};
            if (tensor_like(m->device, m->dtype, 2, dims, &s->proj[FX_LAYER_MAX_TMP * l + k], st))
                return st->code;
        }
    return alloc_rec(m, L, s->batch, &s->rec[2 * l], st);
}

/* The arena: the most any frame op asks, queried on shapes. */
static int alloc_arena(const fx_model *m, fx_model_state *s, fx_status *st)
{
    fx_exec own;
    const fx_exec *ex = fx_exec_resolve(m->device, NULL, &own, st);
    if (!ex)
        return st->code;
    size_t most = 0;
    int64_t in_dims[2] = {s->batch, m->input};
    fx_tensor x = shape_only(m->device, m->dtype, 2, in_dims);
    for (int l = 0; l < m->nlayers; l++) {
        const fx_layer *L = &m->layer[l];
        int64_t out_dims[2] = {s->batch, L->out};
        fx_tensor y = shape_only(m->device, m->dtype, 2, out_dims);
        size_t n = layer_step_scratch(ex, m, s, l, &x, &y);
        if (n == SIZE_MAX)
            return fx_fail(st, FX_EINTERNAL, "layers[%d] (%s): its frame's scratch could not be sized", l,
                           fx_layer_kind_name(L->spec.kind));
        most = n > most ? n : most;
        x = y;
    }
    if (most == 0)
        return FX_OK;
    most = fx_size_add(most, FX_SCRATCH_ALIGN);
    const int64_t dims[1] = {(int64_t)most};
    return fx_tensor_alloc(m->device, FX_U8, 1, dims, &s->arena, st);
}

/* What a graph frame needs beyond the plain frame's buffers: the fixed
 * input and output frames and a stream of the state's own to capture on
 * (never the device's, on which other threads enqueue meanwhile). Made
 * with the state, so that no frame allocates. */
static int alloc_graph_buffers(const fx_model *m, fx_model_state *s, fx_status *st)
{
    if (!m->graphs)
        return FX_OK;
    const int64_t in[2] = {s->batch, m->input}, out[2] = {s->batch, m->output};
    if (tensor_like(m->device, m->dtype, 2, in, &s->frame_in, st) ||
        tensor_like(m->device, m->dtype, 2, out, &s->frame_out, st))
        return st->code;
    return m->device->backend->stream_create(m->device->ordinal, &s->capture_stream, st);
}

int fx_model_state_new(const fx_model *m, int64_t batch, fx_model_state **out, fx_status *st)
{
    *out = NULL;
    if (batch < 1)
        return fx_fail(st, FX_EBADARG, "batch: expected an integer >= 1, got %lld", (long long)batch);
    fx_model_state *s = calloc(1, sizeof *s);
    const size_t n = (size_t)m->nlayers;
    if (s) {
        s->rec = calloc(2 * n, sizeof *s->rec);
        s->act = calloc(n, sizeof *s->act);
        s->inner = calloc(n, sizeof *s->inner);
        s->proj = calloc(FX_LAYER_MAX_TMP * n, sizeof *s->proj);
    }
    if (!s || !s->rec || !s->act || !s->inner || !s->proj) {
        fx_model_state_free(s);
        return fx_fail(st, FX_ENOMEM, "out of host memory for a model state");
    }
    s->model_id = m->id;
    s->device = m->device;
    s->batch = batch;
    s->nlayers = m->nlayers;
    pthread_mutex_init(&s->lock, NULL);
    for (int l = 0; l < m->nlayers; l++)
        if (alloc_frame_buffers(m, s, l, st)) {
            fx_model_state_free(s);
            return st->code;
        }
    if (alloc_arena(m, s, st) || alloc_graph_buffers(m, s, st)) {
        fx_model_state_free(s);
        return st->code;
    }
    *out = s;
    return FX_OK;
}

static void release_graph(fx_model_state *s)
{
    if (s->graph)
        s->device->backend->graph_destroy(s->device->ordinal, s->graph);
    s->graph = NULL;
}

void fx_model_state_free(fx_model_state *s)
{
    if (!s)
        return;
    for (int l = 0; l < s->nlayers; l++) {
        if (s->rec)
            fx_tensor_release(&s->rec[2 * l]), fx_tensor_release(&s->rec[2 * l + 1]);
        if (s->act)
            fx_tensor_release(&s->act[l]);
        if (s->inner)
            fx_tensor_release(&s->inner[l]);
        if (s->proj)
            for (int k = 0; k < FX_LAYER_MAX_TMP; k++)
                fx_tensor_release(&s->proj[FX_LAYER_MAX_TMP * l + k]);
    }
    fx_tensor_release(&s->arena);
    release_graph(s);
    if (s->capture_stream)
        s->device->backend->stream_destroy(s->device->ordinal, s->capture_stream);
    fx_tensor_release(&s->frame_in);
    fx_tensor_release(&s->frame_out);
    if (s->rec) /* the lock was initialized with the arrays */
        pthread_mutex_destroy(&s->lock);
    free(s->rec);
    free(s->act);
    free(s->inner);
    free(s->proj);
    free(s);
}

static int check_state(const fx_model *m, const fx_model_state *s, fx_status *st)
{
    if (s->model_id != m->id)
        return fx_fail(st, FX_EBADARG, "state: expected a state made by model_init_state/2 for this model, got "
                                       "one of another model");
    return FX_OK;
}

int fx_model_state_reset(const fx_model *m, fx_model_state *s, fx_status *st)
{
    if (check_state(m, s, st))
        return st->code;
    fx_exec own;
    const fx_exec *ex = fx_exec_resolve(m->device, NULL, &own, st);
    if (!ex)
        return st->code;
    for (int i = 0; i < 2 * s->nlayers; i++)
        if (fx_op_fill_zero(ex, &s->rec[i], st))
            return st->code;
    return FX_OK;
}

/* ---- one frame ---- */

typedef struct frame_exec {
    fx_exec ex;
    void *own_stream; /* the device's: plain frames and replays go there */
    fx_scratch_arena arena;
} frame_exec;

/* The ops share one arena: each starts it afresh (their work is ordered
 * on one stream, so one op's scratch is free when the next runs). */
static const fx_exec *fresh(frame_exec *fe)
{
    fe->arena.used = 0;
    return &fe->ex;
}

/* One frame of a Mamba block: nine products, the conv step and the scan
 * step, every intermediate in the state's buffers. */
static int mamba_step(frame_exec *fe, const fx_layer *L, fx_tensor *tmp, const fx_tensor *rec, const fx_tensor *x,
                      const fx_tensor *fy, fx_status *st)
{
    for (int k = 0; k < 2; k++) {
        fx_linear_inputs in = plain(x, &L->param[mamba_in[k].w]);
        if (fx_op_linear_forward_into(fresh(fe), &in, &tmp[mamba_in[k].out], NULL, st))
            return st->code;
    }
    fx_conv_inputs ci = mamba_conv(L, tmp, NULL);
    if (fx_op_conv_step_into(fresh(fe), &rec[1], &ci, &tmp[M_U], st))
        return st->code;
    for (int k = 0; k < 4; k++) {
        fx_linear_inputs in = plain(&tmp[mamba_mid[k].in], &L->param[mamba_mid[k].w]);
        if (fx_op_linear_forward_into(fresh(fe), &in, &tmp[mamba_mid[k].out], NULL, st))
            return st->code;
    }
    fx_ssm_inputs si = mamba_scan(L, tmp, NULL);
    if (fx_op_ssm_step_into(fresh(fe), &rec[0], &si, &tmp[M_Y], st))
        return st->code;
    fx_linear_inputs out = plain(&tmp[M_Y], &L->param[W_OUT]);
    return fx_op_linear_forward_into(fresh(fe), &out, fy, NULL, st);
}

static int layer_step(frame_exec *fe, const fx_model *m, fx_model_state *s, int l, const fx_tensor *x,
                      const fx_tensor *y, fx_status *st)
{
    const fx_layer *L = &m->layer[l];
    const fx_tensor *fy = L->spec.residual ? &s->inner[l] : y;
    switch (L->spec.kind) {
    case FX_LAYER_LINEAR: {
        fx_linear_inputs in = linear_inputs(L, x);
        if (fx_op_linear_forward_into(fresh(fe), &in, fy, NULL, st))
            return st->code;
        break;
    }
    case FX_LAYER_RMS_NORM:
    case FX_LAYER_LAYER_NORM: {
        fx_norm_inputs in = norm_inputs(L, x);
        if (fx_op_norm_forward_into(fresh(fe), &in, fy, NULL, NULL, NULL, st))
            return st->code;
        break;
    }
    case FX_LAYER_MINGRU:
    case FX_LAYER_MINLSTM: {
        fx_tensor *proj = &s->proj[FX_LAYER_MAX_TMP * l];
        for (int k = 0; k < nproj(L->spec.kind); k++) {
            fx_linear_inputs in = proj_inputs(L, k, x);
            if (fx_op_linear_forward_into(fresh(fe), &in, &proj[k], NULL, st))
                return st->code;
        }
        fx_linrec_inputs in = linrec_inputs(L, proj, NULL);
        if (fx_op_linrec_step_into(fresh(fe), &in, &s->rec[2 * l], fy, st))
            return st->code;
        break;
    }
    case FX_LAYER_MAMBA:
        if (mamba_step(fe, L, &s->proj[FX_LAYER_MAX_TMP * l], &s->rec[2 * l], x, fy, st))
            return st->code;
        break;
    default: {
        fx_rnn_layer rl;
        rnn_layer_of(L, &rl);
        fx_rnn_inputs in = rnn_inputs(L, &rl, x, NULL, NULL);
        if (fx_op_rnn_step_into(fresh(fe), &in, &s->rec[2 * l], opt(&s->rec[2 * l + 1]), fy, st))
            return st->code;
    }
    }
    if (L->spec.residual)
        return m->device->backend->binary(fresh(fe), FX_ADD, x, fy, y, st);
    return FX_OK;
}

static int check_frame(const fx_model *m, const fx_model_state *s, const fx_tensor *frame, const fx_tensor *out,
                       fx_status *st)
{
    const int64_t in_dims[2] = {s->batch, m->input};
    const int64_t out_dims[2] = {s->batch, m->output};
    if (fx_expect_same_device(st, "frame", frame, m->device, "the model") ||
        fx_expect_dtype(st, "frame", frame, m->dtype) ||
        fx_expect_shape(st, "frame", frame, 2, in_dims, "([batch, input]: the state's batch, the model's input)") ||
        fx_expect_same_device(st, "out", out, m->device, "the model") || fx_expect_dtype(st, "out", out, m->dtype) ||
        fx_expect_shape(st, "out", out, 2, out_dims, "([batch, output])"))
        return st->code;
    return FX_OK;
}

/* Every layer's ops from `frame` to `out` on fe's stream. */
static int run_frame(frame_exec *fe, const fx_model *m, fx_model_state *s, const fx_tensor *frame,
                     const fx_tensor *out, fx_status *st)
{
    const fx_tensor *x = frame;
    for (int l = 0; l < m->nlayers && st->code == FX_OK; l++) {
        const fx_tensor *y = l + 1 < m->nlayers ? &s->act[l] : out;
        layer_step(fe, m, s, l, x, y, st);
        x = y;
    }
    return st->code;
}

/* The addresses a captured frame holds of the weights (FNV-1a). */
static uint64_t weights_key(const fx_model *m)
{
    uint64_t h = 1469598103934665603ull;
    for (int l = 0; l < m->nlayers; l++)
        for (int k = 0; k < m->layer[l].nslots; k++)
            h = (h ^ (uint64_t)(uintptr_t)m->layer[l].param[k].data) * 1099511628211ull;
    return h;
}

/* Captures the frame from frame_in to frame_out on the state's stream.
 * Nothing runs while capturing, so a failure leaves the state as it was;
 * the model's graphs are then off for good (its frames launched plainly). */
static bool capture_frame(frame_exec *fe, fx_model *m, fx_model_state *s)
{
    const fx_backend *b = m->device->backend;
    fx_status cst;
    fx_status_clear(&cst);
    fe->ex.stream = s->capture_stream;
    if (b->graph_begin(m->device->ordinal, s->capture_stream, &cst) == FX_OK) {
        run_frame(fe, m, s, &s->frame_in, &s->frame_out, &cst);
        fx_status end;
        fx_status_clear(&end);
        if (b->graph_end(m->device->ordinal, s->capture_stream, &s->graph, &end) != FX_OK && cst.code == FX_OK)
            cst = end;
    }
    fe->ex.stream = fe->own_stream;
    if (cst.code != FX_OK) {
        release_graph(s);
        m->graphs = false;
        snprintf(m->frame_why, sizeof m->frame_why, "the frame's capture failed: %.160s", cst.msg);
        return false;
    }
    s->weights_key = weights_key(m);
    return true;
}

/* The frame as the state's graph on the device's stream: the frame into
 * frame_in, the graph, frame_out into `out`. */
static int replay_frame(const fx_exec *ex, const fx_model *m, fx_model_state *s, const fx_tensor *frame,
                        const fx_tensor *out, fx_status *st)
{
    const fx_backend *b = m->device->backend;
    if (b->copy(ex, s->frame_in.data, frame->data, frame->nbytes, st) ||
        b->graph_launch(m->device->ordinal, s->graph, ex->stream, st) ||
        b->copy(ex, out->data, s->frame_out.data, out->nbytes, st))
        return st->code;
    s->replays++;
    return FX_OK;
}

/* Plain launches for the state's first frame (the warm-up: cuBLASLt's
 * handle and algorithm choices, shared-memory opt-ins and lazily loaded
 * kernels are made outside any capture) and wherever graphs are off;
 * from the second on the state's graph, captured once (again only if
 * the weights moved). */
static int step_locked(frame_exec *fe, fx_model *m, fx_model_state *s, const fx_tensor *frame,
                       const fx_tensor *out, fx_status *st)
{
    if (m->graphs && s->graph && s->weights_key != weights_key(m))
        release_graph(s);
    if (m->graphs && s->frames > 0 && (s->graph || capture_frame(fe, m, s)))
        return replay_frame(&fe->ex, m, s, frame, out, st);
    fe->ex.stream = fe->own_stream;
    return run_frame(fe, m, s, frame, out, st);
}

int fx_model_step_into(fx_model *m, fx_model_state *s, const fx_tensor *frame, const fx_tensor *out, fx_status *st)
{
    if (check_state(m, s, st) || check_frame(m, s, frame, out, st))
        return st->code;
    frame_exec fe;
    if (!fx_exec_resolve(m->device, NULL, &fe.ex, st))
        return st->code;
    fe.own_stream = fe.ex.stream;
    fe.arena.base = s->arena.data;
    fe.arena.size = s->arena.nbytes;
    fe.arena.used = 0;
    fe.ex.scratch = fx_scratch_arena_use(&fe.arena);
    /* The stream's look-back cache tags each launch with a host-side epoch
     * baked into its arguments: a replayed graph would reuse its tags. The
     * ops take their statuses from the arena instead (the scratch queries
     * size for that). */
    fe.ex.cache = NULL;
    pthread_mutex_lock(&m->lock);
    pthread_mutex_lock(&s->lock);
    if (step_locked(&fe, m, s, frame, out, st) == FX_OK)
        s->frames++;
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_unlock(&m->lock);
    return st->code;
}

/* ---- windows: the forward, for inference and for training ---- */

/* What a layer's forward over a window keeps. */
typedef struct layer_run {
    fx_tensor y;     /* the layer's output (after the residual) */
    fx_tensor inner; /* a residual layer's own output */
    fx_tensor pre;   /* linear: the pre-activation its backward reads */
    fx_tensor mean, rstd;
    fx_tensor proj[FX_LAYER_MAX_TMP]; /* the min layers' projections, mamba's intermediates */
    fx_tensor saved; /* gru, lstm, mamba: the training forward's saved tensor */
    fx_tensor h_n, c_n;
} layer_run;

static void layer_run_release(layer_run *r)
{
    fx_tensor *all[] = {&r->y, &r->inner, &r->pre, &r->mean, &r->rstd, &r->saved, &r->h_n, &r->c_n};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fx_tensor_release(all[i]);
    for (int k = 0; k < FX_LAYER_MAX_TMP; k++)
        fx_tensor_release(&r->proj[k]);
}

static int seq_alloc(const fx_model *m, int64_t b, int64_t t, int64_t w, fx_tensor *out, fx_status *st)
{
    const int64_t dims[3] = {b, t, w};
    return fx_tensor_alloc(m->device, m->dtype, 3, dims, out, st);
}

/* A Mamba block over a window: every intermediate in r->proj (what the
 * backward reads), the scan's saved states for training, and from the
 * state `rec` (NULL: zeros) the final states in r->h_n (scan) and r->c_n
 * (conv). */
static int mamba_forward(const fx_model *m, const fx_layer *L, const fx_tensor *rec, const fx_tensor *x,
                         bool training, layer_run *r, const fx_tensor *fy, fx_status *st)
{
    const int64_t b = x->dims[0], t = x->dims[1], e = L->spec.inner;
    fx_tensor *tmp = r->proj;
    for (int k = 0; k < M_NTMP; k++)
        if (seq_alloc(m, b, t, mamba_tmp_width(&L->spec, k), &tmp[k], st))
            return st->code;
    for (int k = 0; k < 2; k++) {
        fx_linear_inputs in = plain(x, &L->param[mamba_in[k].w]);
        if (fx_op_linear_forward_into(NULL, &in, &tmp[mamba_in[k].out], NULL, st))
            return st->code;
    }
    const int64_t conv_dims[3] = {b, e, L->spec.dconv - 1};
    fx_conv_inputs ci = mamba_conv(L, tmp, rec ? &rec[1] : NULL);
    if ((rec && fx_tensor_alloc(m->device, m->dtype, 3, conv_dims, &r->c_n, st)) ||
        fx_op_conv_forward_into(NULL, &ci, &tmp[M_U], opt(&r->c_n), st))
        return st->code;
    for (int k = 0; k < 4; k++) {
        fx_linear_inputs in = plain(&tmp[mamba_mid[k].in], &L->param[mamba_mid[k].w]);
        if (fx_op_linear_forward_into(NULL, &in, &tmp[mamba_mid[k].out], NULL, st))
            return st->code;
    }
    fx_ssm_inputs si = mamba_scan(L, tmp, rec ? &rec[0] : NULL);
    fx_ssm_dims n;
    int64_t saved_dims[4];
    const int64_t ssm_dims[3] = {b, e, L->spec.dstate};
    const fx_dtype stt = fx_ssm_state_dtype(m->dtype);
    if (fx_ssm_check_forward(&si, &n, st))
        return st->code;
    fx_ssm_saved_shape(&n, m->dtype, saved_dims);
    const bool save = training && m->device->backend->ssm && m->device->backend->ssm->reads_saved &&
                      fx_ssm_nsaved(&n, m->dtype) > 0;
    if ((save && fx_tensor_alloc(m->device, stt, 4, saved_dims, &r->saved, st)) ||
        (rec && fx_tensor_alloc(m->device, stt, 3, ssm_dims, &r->h_n, st)) ||
        fx_op_ssm_forward_into(NULL, &si, &tmp[M_Y], opt(&r->h_n), opt(&r->saved), st))
        return st->code;
    fx_linear_inputs out = plain(&tmp[M_Y], &L->param[W_OUT]);
    return fx_op_linear_forward_into(NULL, &out, fy, NULL, st);
}

/* Layer l over x [batch, seqlen, in]: r->y and what `training` keeps; from
 * the state `s` (NULL: zeros), whose final states go to r->h_n, r->c_n. */
static int layer_forward(const fx_model *m, const fx_model_state *s, int l, const fx_tensor *x, bool training,
                         layer_run *r, fx_status *st)
{
    const fx_layer *L = &m->layer[l];
    const int64_t b = x->dims[0], t = x->dims[1];
    if (seq_alloc(m, b, t, L->out, &r->y, st) || (L->spec.residual && seq_alloc(m, b, t, L->out, &r->inner, st)))
        return st->code;
    const fx_tensor *fy = L->spec.residual ? &r->inner : &r->y;
    switch (L->spec.kind) {
    case FX_LAYER_LINEAR: {
        fx_linear_inputs in = linear_inputs(L, x);
        if (training && fx_linear_reads_pre(L->spec.activation) && seq_alloc(m, b, t, L->out, &r->pre, st))
            return st->code;
        if (fx_op_linear_forward_into(NULL, &in, fy, opt(&r->pre), st))
            return st->code;
        break;
    }
    case FX_LAYER_RMS_NORM:
    case FX_LAYER_LAYER_NORM: {
        fx_norm_inputs in = norm_inputs(L, x);
        const int64_t rows[1] = {b * t};
        const fx_dtype stat = fx_norm_stat_type(m->dtype);
        if (training && ((in.kind == FX_NORM_LAYER && fx_tensor_alloc(m->device, stat, 1, rows, &r->mean, st)) ||
                         fx_tensor_alloc(m->device, stat, 1, rows, &r->rstd, st)))
            return st->code;
        if (fx_op_norm_forward_into(NULL, &in, fy, NULL, opt(&r->mean), opt(&r->rstd), st))
            return st->code;
        break;
    }
    case FX_LAYER_MINGRU:
    case FX_LAYER_MINLSTM: {
        for (int k = 0; k < nproj(L->spec.kind); k++) {
            fx_linear_inputs in = proj_inputs(L, k, x);
            if (seq_alloc(m, b, t, L->out, &r->proj[k], st) ||
                fx_op_linear_forward_into(NULL, &in, &r->proj[k], NULL, st))
                return st->code;
        }
        fx_linrec_inputs in = linrec_inputs(L, r->proj, s ? &s->rec[2 * l] : NULL);
        const int64_t sd[2] = {b, L->out};
        if ((s && fx_tensor_alloc(m->device, state_type(m->dtype), 2, sd, &r->h_n, st)) ||
            fx_op_linrec_forward_into(NULL, &in, 0, fy, opt(&r->h_n), st))
            return st->code;
        break;
    }
    case FX_LAYER_MAMBA:
        if (mamba_forward(m, L, s ? &s->rec[2 * l] : NULL, x, training, r, fy, st))
            return st->code;
        break;
    default: {
        fx_rnn_layer rl;
        rnn_layer_of(L, &rl);
        fx_rnn_inputs in = rnn_inputs(L, &rl, x, s ? &s->rec[2 * l] : NULL, s ? opt(&s->rec[2 * l + 1]) : NULL);
        fx_rnn_dims n;
        int64_t saved_dims[4];
        const int64_t sd[3] = {1, b, L->out};
        const fx_dtype stt = state_type(m->dtype);
        if (fx_rnn_check_forward(&in, &n, st))
            return st->code;
        fx_rnn_saved_shape(&n, saved_dims);
        if ((training && fx_tensor_alloc(m->device, stt, 4, saved_dims, &r->saved, st)) ||
            (s && fx_tensor_alloc(m->device, stt, 3, sd, &r->h_n, st)) ||
            (s && L->spec.kind == FX_LAYER_LSTM && fx_tensor_alloc(m->device, stt, 3, sd, &r->c_n, st)) ||
            fx_op_rnn_forward_into(NULL, &in, fy, opt(&r->h_n), opt(&r->c_n), opt(&r->saved), st))
            return st->code;
    }
    }
    if (L->spec.residual) {
        fx_exec own;
        const fx_exec *ex = fx_exec_resolve(m->device, NULL, &own, st);
        return ex ? m->device->backend->binary(ex, FX_ADD, x, fy, &r->y, st) : st->code;
    }
    return FX_OK;
}

static int check_window(const fx_model *m, const char *arg, const fx_tensor *w, fx_status *st)
{
    char layout[64];
    if (fx_expect_same_device(st, arg, w, m->device, "the model") || fx_expect_dtype(st, arg, w, m->dtype) ||
        fx_expect_rank(st, arg, w, 3, "[batch, seqlen, input]"))
        return st->code;
    const int64_t dims[3] = {w->dims[0], w->dims[1], m->input};
    snprintf(layout, sizeof layout, "([batch, seqlen, input], input %lld)", (long long)m->input);
    if (fx_expect_shape(st, arg, w, 3, dims, layout))
        return st->code;
    if (w->dims[0] < 1 || w->dims[1] < 1)
        return fx_fail(st, FX_EBADARG, "%s: expected batch and seqlen >= 1, got {%lld,%lld,%lld}", arg,
                       (long long)w->dims[0], (long long)w->dims[1], (long long)w->dims[2]);
    return FX_OK;
}

/* Every layer over the window; runs[l] keeps layer l's tensors. */
static int run_layers(const fx_model *m, const fx_model_state *s, const fx_tensor *window, bool training,
                      layer_run *runs, fx_status *st)
{
    const fx_tensor *x = window;
    for (int l = 0; l < m->nlayers; l++) {
        if (layer_forward(m, s, l, x, training, &runs[l], st))
            return st->code;
        x = &runs[l].y;
    }
    return FX_OK;
}

static layer_run *runs_new(const fx_model *m, fx_status *st)
{
    layer_run *runs = calloc((size_t)m->nlayers, sizeof *runs);
    if (!runs)
        fx_fail(st, FX_ENOMEM, "out of host memory for a forward of %d layers", m->nlayers);
    return runs;
}

static void runs_free(const fx_model *m, layer_run *runs)
{
    for (int l = 0; runs && l < m->nlayers; l++)
        layer_run_release(&runs[l]);
    free(runs);
}

int fx_model_forward(fx_model *m, fx_model_state *s, const fx_tensor *window, fx_tensor *y, fx_status *st)
{
    memset(y, 0, sizeof *y);
    if (check_state(m, s, st) || check_window(m, "window", window, st))
        return st->code;
    if (window->dims[0] != s->batch)
        return fx_fail(st, FX_EBADARG, "window: expected batch %lld (the state's), got %lld", (long long)s->batch,
                       (long long)window->dims[0]);
    layer_run *runs = runs_new(m, st);
    if (!runs)
        return st->code;
    pthread_mutex_lock(&m->lock);
    pthread_mutex_lock(&s->lock);
    if (run_layers(m, s, window, false, runs, st) == FX_OK)
        for (int l = 0; l < m->nlayers && st->code == FX_OK; l++) {
            if (runs[l].h_n.buffer)
                fx_op_copy_into(&runs[l].h_n, &s->rec[2 * l], st);
            if (runs[l].c_n.buffer)
                fx_op_copy_into(&runs[l].c_n, &s->rec[2 * l + 1], st);
        }
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_unlock(&m->lock);
    if (st->code == FX_OK) {
        *y = runs[m->nlayers - 1].y;
        memset(&runs[m->nlayers - 1].y, 0, sizeof *y);
    }
    runs_free(m, runs);
    return st->code;
}

/* ---- training ---- */

static int alloc_grads(fx_model *m, fx_status *st)
{
    if (m->grads_ready)
        return FX_OK;
    for (int l = 0; l < m->nlayers; l++)
        for (int s = 0; s < m->layer[l].nslots; s++) {
            const fx_tensor *p = &m->layer[l].param[s];
            if (p->buffer && tensor_like(m->device, m->dtype, p->rank, p->dims, &m->layer[l].grad[s], st))
                return st->code;
        }
    m->grads_ready = true;
    return FX_OK;
}

/* dx (+)= the gradient through x w^T from dy, and dw. */
static int plain_backward(const fx_model *m, const fx_exec *ex, const fx_tensor *x, const fx_tensor *w,
                          const fx_tensor *dy, const fx_tensor *dw, const fx_tensor *dx, const fx_tensor *acc,
                          fx_status *st)
{
    fx_linear_inputs in = plain(x, w);
    fx_linear_grad_outs g = {acc ? acc : dx, dw, NULL};
    if (fx_op_linear_backward_into(NULL, &in, NULL, NULL, dy, &g, st))
        return st->code;
    return acc ? m->device->backend->binary(ex, FX_ADD, dx, acc, dx, st) : FX_OK;
}

/* Mamba's backward: out_proj, the scan, dt_proj, x_proj's three blocks
 * (their du summed with the scan's), the conv, in_proj's two halves. */
static int mamba_backward(const fx_model *m, const fx_exec *ex, const fx_layer *L, fx_tensor *grad,
                          const fx_tensor *x, const layer_run *r, const fx_tensor *dy, const fx_tensor *dx,
                          fx_status *st)
{
    enum { D_Y, D_U, D_DT, D_B, D_C, D_Z, D_DTL, D_ACC, D_XIN, D_XACC, D_N };
    const int64_t b = x->dims[0], t = x->dims[1], e = L->spec.inner;
    const int64_t widths[D_N] = {e, e, e, L->spec.dstate, L->spec.dstate, e, L->spec.dt_rank, e, e, L->in};
    const fx_tensor *P = L->param, *tmp = r->proj;
    fx_tensor d[D_N];
    memset(d, 0, sizeof d);
    for (int k = 0; k < D_N && st->code == FX_OK; k++)
        seq_alloc(m, b, t, widths[k], &d[k], st);
    if (st->code == FX_OK && plain_backward(m, ex, &tmp[M_Y], &P[W_OUT], dy, &grad[W_OUT], &d[D_Y], NULL, st) == FX_OK) {
        fx_ssm_inputs si = mamba_scan(L, tmp, NULL);
        fx_ssm_grad_outs g = {.x = &d[D_U], .dt = &d[D_DT], .a = &grad[M_A], .b = &d[D_B], .c = &d[D_C],
                              .d = &grad[M_D], .z = &d[D_Z], .dt_bias = &grad[B_DT], .h0 = NULL};
        fx_conv_inputs ci = mamba_conv(L, tmp, NULL);
        fx_conv_grad_outs cg = {.dx = &d[D_XIN], .dw = &grad[W_CONV], .dbias = &grad[B_CONV], .dinitial_state = NULL};
        if (fx_op_ssm_backward_into(NULL, &si, opt(&r->saved), &d[D_Y], NULL, &g, st) == FX_OK &&
            plain_backward(m, ex, &tmp[M_DTL], &P[W_DT], &d[D_DT], &grad[W_DT], &d[D_DTL], NULL, st) == FX_OK &&
            plain_backward(m, ex, &tmp[M_U], &P[W_X_DT], &d[D_DTL], &grad[W_X_DT], &d[D_U], &d[D_ACC], st) == FX_OK &&
            plain_backward(m, ex, &tmp[M_U], &P[W_X_B], &d[D_B], &grad[W_X_B], &d[D_U], &d[D_ACC], st) == FX_OK &&
            plain_backward(m, ex, &tmp[M_U], &P[W_X_C], &d[D_C], &grad[W_X_C], &d[D_U], &d[D_ACC], st) == FX_OK &&
            fx_op_conv_backward_into(NULL, &ci, &d[D_U], NULL, &cg, st) == FX_OK &&
            plain_backward(m, ex, x, &P[W_IN_X], &d[D_XIN], &grad[W_IN_X], dx, NULL, st) == FX_OK)
            plain_backward(m, ex, x, &P[W_IN_Z], &d[D_Z], &grad[W_IN_Z], dx, &d[D_XACC], st);
    }
    for (int k = 0; k < D_N; k++)
        fx_tensor_release(&d[k]);
    return st->code;
}

/* The gradient reaching x from layer l, given dy reaching its output. */
static int layer_backward(const fx_model *m, int l, const fx_tensor *x, const layer_run *r, const fx_tensor *dy,
                          fx_tensor *dx, fx_status *st)
{
    const fx_layer *L = &m->layer[l];
    fx_layer *G = (fx_layer *)L; /* the gradients are the model's own resident tensors */
    const int64_t b = x->dims[0], t = x->dims[1];
    const fx_tensor *fy = L->spec.residual ? &r->inner : &r->y;
    fx_exec own;
    const fx_exec *ex = fx_exec_resolve(m->device, NULL, &own, st);
    if (!ex || seq_alloc(m, b, t, L->in, dx, st))
        return st->code;
    switch (L->spec.kind) {
    case FX_LAYER_LINEAR: {
        fx_linear_inputs in = linear_inputs(L, x);
        fx_linear_grad_outs g = {dx, &G->grad[0], opt(&G->grad[1])};
        if (fx_op_linear_backward_into(NULL, &in, fx_linear_reads_output(L->spec.activation) ? fy : NULL,
                                       opt(&r->pre), dy, &g, st))
            return st->code;
        break;
    }
    case FX_LAYER_RMS_NORM:
    case FX_LAYER_LAYER_NORM: {
        fx_norm_inputs in = norm_inputs(L, x);
        fx_norm_grad_outs g = {.dx = dx, .dweight = &G->grad[0], .dbias = opt(&G->grad[1])};
        if (fx_op_norm_backward_into(NULL, &in, NULL, opt(&r->mean), &r->rstd, dy, NULL, &g, st))
            return st->code;
        break;
    }
    case FX_LAYER_MINGRU:
    case FX_LAYER_MINLSTM: {
        const int np = nproj(L->spec.kind);
        fx_tensor dproj[3], dxk;
        memset(dproj, 0, sizeof dproj);
        memset(&dxk, 0, sizeof dxk);
        fx_linrec_inputs in = linrec_inputs(L, r->proj, NULL);
        fx_linrec_grad_outs g;
        memset(&g, 0, sizeof g);
        for (int k = 0; k < np && st->code == FX_OK; k++)
            if (seq_alloc(m, b, t, L->out, &dproj[k], st) == FX_OK)
                g.seq[k] = &dproj[k];
        if (st->code == FX_OK && fx_op_linrec_backward_into(NULL, &in, fy, dy, NULL, 0, &g, st) == FX_OK &&
            seq_alloc(m, b, t, L->in, &dxk, st) == FX_OK)
            for (int k = 0; k < np && st->code == FX_OK; k++) {
                fx_linear_inputs lin = proj_inputs(L, k, x);
                fx_linear_grad_outs lg = {k == 0 ? dx : &dxk, &G->grad[2 * k], opt(&G->grad[2 * k + 1])};
                if (fx_op_linear_backward_into(NULL, &lin, NULL, NULL, &dproj[k], &lg, st) == FX_OK && k > 0)
                    m->device->backend->binary(ex, FX_ADD, dx, &dxk, dx, st);
            }
        for (int k = 0; k < np; k++)
            fx_tensor_release(&dproj[k]);
        fx_tensor_release(&dxk);
        if (st->code)
            return st->code;
        break;
    }
    case FX_LAYER_MAMBA:
        if (mamba_backward(m, ex, L, G->grad, x, r, dy, dx, st))
            return st->code;
        break;
    default: {
        fx_rnn_layer rl;
        rnn_layer_of(L, &rl);
        fx_rnn_inputs in = rnn_inputs(L, &rl, x, NULL, NULL);
        fx_rnn_layer_grads lg = {&G->grad[0], &G->grad[1], opt(&G->grad[2]), opt(&G->grad[3])};
        fx_rnn_grad_outs g = {.dx = dx, .dh0 = NULL, .dc0 = NULL, .layer = &lg};
        if (fx_op_rnn_backward_into(NULL, &in, &r->saved, dy, NULL, NULL, &g, st))
            return st->code;
    }
    }
    if (L->spec.residual)
        return m->device->backend->binary(ex, FX_ADD, dx, dy, dx, st);
    return FX_OK;
}

static int check_targets(const fx_model *m, const fx_tensor *inputs, const fx_tensor *t, int loss, fx_status *st)
{
    if (fx_expect_same_device(st, "targets", t, m->device, "the model"))
        return st->code;
    if (loss == FX_LOSS_MSE) {
        const int64_t dims[3] = {inputs->dims[0], inputs->dims[1], m->output};
        return fx_expect_dtype(st, "targets", t, m->dtype) ||
                       fx_expect_shape(st, "targets", t, 3, dims, "([batch, seqlen, output]: the model's outputs)")
                   ? st->code
                   : FX_OK;
    }
    const int64_t dims[2] = {inputs->dims[0], inputs->dims[1]};
    return fx_expect_dtype(st, "targets", t, FX_S32) ||
                   fx_expect_shape(st, "targets", t, 2, dims, "([batch, seqlen]: class indices)")
               ? st->code
               : FX_OK;
}

/* Cross-entropy's labels lie in [0, classes): checked on the host, where
 * the message can name the row. */
static int check_labels(const fx_tensor *targets, int64_t classes, fx_status *st)
{
    int32_t *labels = malloc(targets->nbytes ? targets->nbytes : 1);
    if (!labels)
        return fx_fail(st, FX_ENOMEM, "out of host memory for the targets");
    if (fx_op_to_host(targets, labels, st) == FX_OK)
        for (int64_t r = 0; r < targets->numel; r++)
            if (labels[r] < 0 || labels[r] >= classes) {
                fx_fail(st, FX_EBADARG, "targets: expected class indices in [0, %lld), got %d at row %lld",
                        (long long)classes, labels[r], (long long)r);
                break;
            }
    free(labels);
    return st->code;
}

/* The rows' losses, downloaded and summed in order (f64), scaled. */
static int sum_rows(const fx_tensor *row_loss, double scale, double *value, fx_status *st)
{
    double *v = download_doubles(row_loss, st);
    if (!v)
        return st->code;
    double sum = 0;
    for (int64_t r = 0; r < row_loss->numel; r++)
        sum += v[r];
    free(v);
    *value = sum * scale;
    return FX_OK;
}

/* The loss of y against the targets and, into dy_out (allocated), its
 * gradient, on the model's device (fx_op_loss_rows_into). */
static int loss_of(const fx_model *m, const fx_tensor *y, const fx_tensor *targets, int loss, double *value,
                   fx_tensor *dy_out, fx_status *st)
{
    const int64_t rows = y->numel / m->output;
    const double scale = loss == FX_LOSS_MSE ? 1.0 / (double)(y->numel ? y->numel : 1) : 1.0 / (double)(rows ? rows : 1);
    if (loss == FX_LOSS_CROSS_ENTROPY && check_labels(targets, m->output, st))
        return st->code;
    const int64_t ydims[2] = {rows, m->output}; /* MSE's targets have y's shape, labels [rows] */
    fx_tensor y2, t2, row_loss;
    if (fx_op_reshape(y, 2, ydims, &y2, st))
        return st->code;
    if (fx_op_reshape(targets, loss == FX_LOSS_MSE ? 2 : 1, ydims, &t2, st)) {
        fx_tensor_release(&y2);
        return st->code;
    }
    memset(&row_loss, 0, sizeof row_loss);
    if (fx_tensor_alloc(m->device, y->dtype, 1, &rows, &row_loss, st) == FX_OK &&
        fx_tensor_alloc(m->device, y->dtype, y->rank, y->dims, dy_out, st) == FX_OK) {
        fx_tensor dy2;
        if (fx_op_reshape(dy_out, 2, ydims, &dy2, st) == FX_OK) {
            const fx_loss_args a = {.rows = rows, .classes = m->output, .kind = loss, .y = &y2, .targets = &t2,
                                    .grad_scale = scale, .row_loss = &row_loss, .dy = &dy2};
            if (fx_op_loss_rows_into(NULL, &a, st) == FX_OK)
                sum_rows(&row_loss, scale, value, st);
            fx_tensor_release(&dy2);
        }
    }
    fx_tensor_release(&row_loss);
    fx_tensor_release(&y2);
    fx_tensor_release(&t2);
    return st->code;
}

static int backward_layers(const fx_model *m, const fx_tensor *inputs, const layer_run *runs, fx_tensor *dy,
                           fx_status *st)
{
    for (int l = m->nlayers - 1; l >= 0; l--) {
        fx_tensor dx;
        memset(&dx, 0, sizeof dx);
        const fx_tensor *x = l > 0 ? &runs[l - 1].y : inputs;
        int rc = layer_backward(m, l, x, &runs[l], dy, &dx, st);
        fx_tensor_release(dy);
        *dy = dx;
        if (rc)
            return rc;
    }
    return FX_OK;
}

int fx_model_gradients(fx_model *m, const fx_tensor *inputs, const fx_tensor *targets, int loss, bool want_grads,
                       double *loss_out, fx_status *st)
{
    *loss_out = NAN;
    if (loss != FX_LOSS_MSE && loss != FX_LOSS_CROSS_ENTROPY)
        return fx_fail(st, FX_EBADARG, "loss: expected mse or cross_entropy, got %d", loss);
    if (check_window(m, "inputs", inputs, st) || check_targets(m, inputs, targets, loss, st))
        return st->code;
    layer_run *runs = runs_new(m, st);
    if (!runs)
        return st->code;
    fx_tensor dy;
    memset(&dy, 0, sizeof dy);
    pthread_mutex_lock(&m->lock);
    if (alloc_grads(m, st) == FX_OK && run_layers(m, NULL, inputs, want_grads, runs, st) == FX_OK &&
        loss_of(m, &runs[m->nlayers - 1].y, targets, loss, loss_out, &dy, st) == FX_OK && want_grads)
        backward_layers(m, inputs, runs, &dy, st);
    pthread_mutex_unlock(&m->lock);
    fx_tensor_release(&dy);
    runs_free(m, runs);
    return st->code;
}
