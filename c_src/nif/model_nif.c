/* Glue for resident models (c_src/core/model.h, docs/MODELS.md): the spec
 * and weights from terms, the model and its states as context resources,
 * frames, windows, losses, gradients and the training step. */
#include <stdio.h>
#include <string.h>

#include "core/model.h"
#include "core/ops.h"
#include "core/optim.h"
#include "fusex_activation.h"
#include "nif/nifs.h"

#define MODEL_CTX "model/2,3"
#define STATE_CTX "model_init_state/2"
/* The optimizer's context kind (optim_nif.c): a train step steps its state. */
#define FX_OPTIM_CTX "adamw_init/2 or sgd_init/2"

/* "msg" -> "prefix msg" (cut to fit). */
static int prefix_error(fx_call *c, const char *prefix)
{
    char msg[FX_MSG_LEN];
    const size_t plen = strlen(prefix) < FX_MSG_LEN - 1 ? strlen(prefix) : FX_MSG_LEN - 1;
    memcpy(msg, prefix, plen);
    const size_t rest = strnlen(c->st.msg, FX_MSG_LEN - 1 - plen);
    memcpy(msg + plen, c->st.msg, rest);
    msg[plen + rest] = '\0';
    memcpy(c->st.msg, msg, sizeof msg);
    return c->st.code;
}

/* An option map's check names the map "opts" and its keys "options": the
 * spec's and the weights' errors name them as what they are. */
static int rename_opts_error(fx_call *c, const char *name, const char *keys)
{
    char msg[FX_MSG_LEN];
    const char *rest = c->st.msg + strlen("opts");
    if (strncmp(c->st.msg, "opts:", 5) != 0)
        return c->st.code;
    const char *only = strstr(rest, "only the options ");
    if (only)
        snprintf(msg, sizeof msg, "%s: expected only the %s %.*s", name, keys, (int)(sizeof msg - 64),
                 only + strlen("only the options "));
    else
        snprintf(msg, sizeof msg, "%s%.*s", name, (int)(sizeof msg - 64), rest);
    memcpy(c->st.msg, msg, sizeof msg);
    return c->st.code;
}

static int arg_model(fx_call *c, ERL_NIF_TERM term, fx_model **m)
{
    return fx_arg_ctx(c, term, "model", MODEL_CTX, (void **)m);
}

static int arg_state(fx_call *c, ERL_NIF_TERM term, fx_model_state **s)
{
    return fx_arg_ctx(c, term, "state", STATE_CTX, (void **)s);
}

static ERL_NIF_TERM put(ErlNifEnv *env, ERL_NIF_TERM map, const char *key, ERL_NIF_TERM value)
{
    ERL_NIF_TERM out;
    enif_make_map_put(env, map, fx_atom(env, key), value, &out);
    return out;
}

/* ---- the spec ---- */

static const char *const spec_keys[] = {"input", "layers", "type", "seed", "graph", NULL};
static const char *const linear_keys[] = {"out", "activation", "bias", "residual", NULL};
static const char *const rms_keys[] = {"eps", "residual", NULL};
static const char *const layer_norm_keys[] = {"eps", "bias", "residual", NULL};
static const char *const rec_keys[] = {"hidden", "bias", "residual", NULL};
static const char *const mamba_keys[] = {"expand", "d_state", "d_conv", "dt_rank", "residual", NULL};

static const char *const *layer_keys(int kind)
{
    switch (kind) {
    case FX_LAYER_LINEAR: return linear_keys;
    case FX_LAYER_RMS_NORM: return rms_keys;
    case FX_LAYER_LAYER_NORM: return layer_norm_keys;
    case FX_LAYER_MAMBA: return mamba_keys;
    default: return rec_keys;
    }
}

static int opt_int64(fx_call *c, ERL_NIF_TERM opts, const char *key, int64_t dflt, int64_t *out)
{
    ERL_NIF_TERM v;
    *out = dflt;
    return fx_opt_term(c, opts, key, &v) ? fx_arg_int64(c, v, key, out) : FX_OK;
}

static int opt_activation(fx_call *c, ERL_NIF_TERM opts, int *act)
{
    ERL_NIF_TERM v;
    char name[16];
    *act = FX_ACT_NONE;
    if (!fx_opt_term(c, opts, "activation", &v))
        return FX_OK;
    if (!enif_get_atom(c->env, v, name, sizeof name, ERL_NIF_LATIN1) || (*act = fx_activation_from_name(name)) < 0) {
        char text[64];
        fx_format_term(text, sizeof text, v);
        return fx_fail(&c->st, FX_EBADARG, "activation: expected none, relu, gelu, silu, tanh or sigmoid, got %s",
                       text);
    }
    return FX_OK;
}

/* Mamba's sizes: d_inner = expand * in, dt_rank ceil(in / 16) by default
 * (mamba_simple.py's). */
static int parse_mamba(fx_call *c, ERL_NIF_TERM opts, int64_t in, fx_layer_spec *ls)
{
    int64_t expand;
    if (opt_int64(c, opts, "expand", 2, &expand) || opt_int64(c, opts, "d_state", 16, &ls->dstate) ||
        opt_int64(c, opts, "d_conv", 4, &ls->dconv) || opt_int64(c, opts, "dt_rank", (in + 15) / 16, &ls->dt_rank))
        return c->st.code;
    if (expand < 1 || expand > 64)
        return fx_fail(&c->st, FX_EBADARG, "expand: expected an integer in [1, 64], got %lld", (long long)expand);
    ls->inner = expand * in;
    return FX_OK;
}

/* {Kind, Opts} or a bare Kind atom; `in` is the layer's input width. */
static int parse_layer(fx_call *c, ERL_NIF_TERM term, int i, int64_t in, fx_layer_spec *ls)
{
    const ERL_NIF_TERM *elems;
    int arity = 0;
    ERL_NIF_TERM kind_term = term, opts = enif_make_new_map(c->env);
    char name[16] = "", prefix[48];
    if (enif_get_tuple(c->env, term, &arity, &elems) && arity == 2)
        kind_term = elems[0], opts = elems[1];
    memset(ls, 0, sizeof *ls);
    if (!enif_get_atom(c->env, kind_term, name, sizeof name, ERL_NIF_LATIN1) ||
        (ls->kind = fx_layer_kind_of(name)) < 0) {
        char text[64];
        fx_format_term(text, sizeof text, term);
        return fx_fail(&c->st, FX_EBADARG, "layers[%d]: expected {Kind, Opts} or Kind with Kind one of linear, "
                                           "rms_norm, layer_norm, mingru, minlstm, gru, lstm, mamba, got %s", i, text);
    }
    snprintf(prefix, sizeof prefix, "layers[%d] (%s): ", i, name);
    ERL_NIF_TERM v;
    const bool sized = ls->kind != FX_LAYER_RMS_NORM && ls->kind != FX_LAYER_LAYER_NORM && ls->kind != FX_LAYER_MAMBA;
    const char *size_key = ls->kind == FX_LAYER_LINEAR ? "out" : "hidden";
    if (fx_arg_opts(c, opts, layer_keys(ls->kind)))
        return prefix_error(c, prefix);
    if (sized && !fx_opt_term(c, opts, size_key, &v)) {
        fx_fail(&c->st, FX_EBADARG, "%s: expected an integer >= 1, got none", size_key);
        return prefix_error(c, prefix);
    }
    if ((sized && fx_arg_int64(c, v, size_key, &ls->size)) || opt_activation(c, opts, &ls->activation) ||
        fx_opt_bool(c, opts, "bias", true, &ls->bias) || fx_opt_bool(c, opts, "residual", false, &ls->residual) ||
        fx_opt_double(c, opts, "eps", 1e-5, &ls->eps) ||
        (ls->kind == FX_LAYER_MAMBA && parse_mamba(c, opts, in, ls)))
        return prefix_error(c, prefix);
    return FX_OK;
}

/* Counts the layers' widths as the model will (norms and mamba keep theirs). */
static int64_t next_width(const fx_layer_spec *ls, int64_t in)
{
    return ls->kind == FX_LAYER_RMS_NORM || ls->kind == FX_LAYER_LAYER_NORM || ls->kind == FX_LAYER_MAMBA ? in
                                                                                                       : ls->size;
}

typedef struct parsed_spec {
    fx_model_spec spec;
    fx_layer_spec layers[FX_MODEL_MAX_LAYERS];
} parsed_spec;

static int parse_spec(fx_call *c, ERL_NIF_TERM term, parsed_spec *p)
{
    ERL_NIF_TERM v, list, head;
    unsigned n;
    int64_t seed = 0;
    bool graph = true;
    memset(p, 0, sizeof *p);
    p->spec.dtype = FX_F32;
    if (fx_arg_opts(c, term, spec_keys))
        return rename_opts_error(c, "spec", "keys");
    if (!fx_opt_term(c, term, "input", &v))
        return fx_fail(&c->st, FX_EBADARG, "input: expected an integer >= 1 (the frame's width), got none");
    if (fx_arg_int64(c, v, "input", &p->spec.input) ||
        (fx_opt_term(c, term, "type", &v) && fx_arg_dtype(c, v, "type", &p->spec.dtype)) ||
        opt_int64(c, term, "seed", 0, &seed) || fx_opt_bool(c, term, "graph", true, &graph))
        return c->st.code;
    p->spec.seed = (uint64_t)seed;
    p->spec.no_graph = !graph;
    if (!fx_opt_term(c, term, "layers", &list) || !enif_get_list_length(c->env, list, &n) || n < 1 ||
        n > FX_MODEL_MAX_LAYERS) {
        char text[64] = "none";
        if (fx_opt_term(c, term, "layers", &list))
            fx_format_term(text, sizeof text, list);
        return fx_fail(&c->st, FX_EBADARG, "layers: expected a list of 1 to %d layers, got %s",
                       FX_MODEL_MAX_LAYERS, text);
    }
    int64_t in = p->spec.input;
    for (unsigned i = 0; enif_get_list_cell(c->env, list, &head, &list); i++) {
        if (parse_layer(c, head, (int)i, in, &p->layers[i]))
            return c->st.code;
        in = next_width(&p->layers[i], in);
    }
    p->spec.nlayers = (int)n;
    p->spec.layers = p->layers;
    return FX_OK;
}

/* ---- the weights: a list of maps, one per layer ---- */

/* A binary as the slot's tensor: the model's type, the slot's shape. */
static int binary_weight(fx_call *c, fx_device *dev, const fx_model_spec *spec, int li, int64_t in, int slot,
                         ErlNifBinary *bin, const char *arg, fx_tensor *out)
{
    int64_t dims[2];
    const char *layout;
    const int rank = fx_layer_slot_shape(&spec->layers[li], in, slot, dims, &layout);
    const size_t want = (size_t)(rank == 2 ? dims[0] * dims[1] : dims[0]) * (spec->dtype == FX_F64 ? 8 : 4);
    if (bin->size != want)
        return fx_fail(&c->st, FX_EBADARG, "%s: expected a binary of %zu bytes (%s of the model's type), got %zu",
                       arg, want, layout, bin->size);
    if (fx_op_from_host(dev, spec->dtype, rank, dims, bin->data, bin->size, out, &c->st))
        return c->st.code;
    return fx_call_hold(c, out);
}

static int parse_layer_weights(fx_call *c, fx_device *dev, const fx_model_spec *spec, int li, int64_t in,
                               ERL_NIF_TERM map, const fx_tensor **slots, fx_tensor *store)
{
    const int kind = spec->layers[li].kind;
    const char *allowed[FX_LAYER_MAX_SLOTS + 1] = {NULL};
    char name[32];
    snprintf(name, sizeof name, "weights[%d]", li);
    for (int s = 0; s < fx_layer_slot_count(kind); s++)
        allowed[s] = fx_layer_slot_name(kind, s);
    if (fx_arg_opts(c, map, allowed))
        return rename_opts_error(c, name, "weights");
    for (int s = 0; s < fx_layer_slot_count(kind); s++) {
        ERL_NIF_TERM v;
        ErlNifBinary bin;
        char arg[48];
        snprintf(arg, sizeof arg, "layers[%d].%s", li, allowed[s]);
        if (!fx_opt_term(c, map, allowed[s], &v))
            continue; /* the op layer names what is missing */
        fx_tensor *t = &store[li * FX_LAYER_MAX_SLOTS + s];
        if (enif_inspect_binary(c->env, v, &bin)) {
            if (binary_weight(c, dev, spec, li, in, s, &bin, arg, t))
                return c->st.code;
        } else if (fx_arg_tensor(c, v, arg, t)) {
            if (strncmp(c->st.msg, arg, strlen(arg)) == 0 && strstr(c->st.msg, "a fusex tensor")) {
                fx_status_clear(&c->st);
                char text[64];
                fx_format_term(text, sizeof text, v);
                return fx_fail(&c->st, FX_EBADARG, "%s: expected a fusex tensor or a binary, got %s", arg, text);
            }
            return c->st.code;
        }
        slots[li * FX_LAYER_MAX_SLOTS + s] = t;
    }
    return FX_OK;
}

static int parse_weights(fx_call *c, fx_device *dev, const fx_model_spec *spec, ERL_NIF_TERM term,
                         const fx_tensor **slots, fx_tensor *store)
{
    unsigned n;
    ERL_NIF_TERM head, list = term;
    if (!enif_get_list_length(c->env, term, &n) || n != (unsigned)spec->nlayers) {
        char text[64];
        fx_format_term(text, sizeof text, term);
        return fx_fail(&c->st, FX_EBADARG, "weights: expected a list of %d maps (one per layer), got %s",
                       spec->nlayers, text);
    }
    int64_t in = spec->input;
    for (int li = 0; enif_get_list_cell(c->env, list, &head, &list); li++) {
        if (parse_layer_weights(c, dev, spec, li, in, head, slots, store))
            return c->st.code;
        in = next_width(&spec->layers[li], in);
    }
    return FX_OK;
}

static void destroy_model(void *data) { fx_model_free(data); }
static void destroy_state(void *data) { fx_model_state_free(data); }

/* model_new(Device, Spec, Weights | none) -> Model */
FX_DIRTY_NIF(nif_model_new)
static ERL_NIF_TERM nif_model_new(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_device *dev;
    fx_model *m = NULL;
    fx_call_init(&c, env);
    parsed_spec *p = fx_call_alloc(&c, sizeof *p);
    const fx_tensor **slots = fx_call_alloc(&c, sizeof *slots * FX_MODEL_MAX_LAYERS * FX_LAYER_MAX_SLOTS);
    /* every weight's tensor in one block: the call's scratch allocations are few */
    fx_tensor *store = fx_call_alloc(&c, sizeof *store * FX_MODEL_MAX_LAYERS * FX_LAYER_MAX_SLOTS);
    if (!p || !slots || !store || fx_arg_device(&c, argv[0], "device", &dev) || parse_spec(&c, argv[1], p))
        return fx_call_finish(&c, 0);
    const bool given = !enif_is_identical(argv[2], fx_atom(env, "none"));
    if ((given && parse_weights(&c, dev, &p->spec, argv[2], slots, store)) ||
        fx_model_new(dev, &p->spec, given ? slots : NULL, &m, &c.st))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, fx_make_ctx(&c, MODEL_CTX, m, destroy_model));
}

/* ---- what the model holds ---- */

static ERL_NIF_TERM share(fx_call *c, const fx_tensor *t)
{
    fx_tensor copy = *t;
    fx_buffer_ref(copy.buffer);
    return fx_make_tensor(c, &copy);
}

static ERL_NIF_TERM make_dtype(ErlNifEnv *env, fx_dtype dtype)
{
    return dtype == FX_F64 ? enif_make_tuple2(env, fx_atom(env, "f"), enif_make_int(env, 64))
                           : enif_make_tuple2(env, fx_atom(env, "f"), enif_make_int(env, 32));
}

static ERL_NIF_TERM layer_info(ErlNifEnv *env, const fx_layer *L)
{
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "kind", fx_atom(env, fx_layer_kind_name(L->spec.kind)));
    m = put(env, m, "in", enif_make_int64(env, L->in));
    m = put(env, m, "out", enif_make_int64(env, L->out));
    m = put(env, m, "residual", fx_atom(env, L->spec.residual ? "true" : "false"));
    if (L->spec.kind == FX_LAYER_LINEAR)
        m = put(env, m, "activation", fx_atom(env, fx_activation_name(L->spec.activation)));
    return m;
}

/* model_info(Model) -> #{device, type, input, output, params, layers,
 * frame => graph | launches, and frame_why (a binary) for launches} */
ERL_NIF_TERM nif_model_info(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM layers = enif_make_list(env, 0);
    int64_t count = 0;
    for (int l = m->nlayers; l-- > 0;)
        layers = enif_make_list_cell(env, layer_info(env, &m->layer[l]), layers);
    for (int i = 0; i < fx_model_param_count(m); i++)
        count += fx_model_param(m, i)->numel;
    ERL_NIF_TERM r = enif_make_new_map(env);
    r = put(env, r, "device", fx_make_device(env, m->device));
    r = put(env, r, "type", make_dtype(env, m->dtype));
    r = put(env, r, "input", enif_make_int64(env, m->input));
    r = put(env, r, "output", enif_make_int64(env, m->output));
    r = put(env, r, "params", enif_make_int64(env, count));
    r = put(env, r, "layers", layers);
    char why[sizeof m->frame_why];
    const bool graphs = fx_model_frame_graphs(m, why, sizeof why);
    r = put(env, r, "frame", fx_atom(env, graphs ? "graph" : "launches"));
    if (!graphs)
        r = put(env, r, "frame_why", fx_make_string(env, why));
    return fx_call_finish(&c, r);
}

/* model_weights(Model) -> [#{Name => Tensor}]: handles sharing the
 * model's own memory (training updates them in place). */
ERL_NIF_TERM nif_model_weights(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (int l = m->nlayers; l-- > 0;) {
        const fx_layer *L = &m->layer[l];
        ERL_NIF_TERM map = enif_make_new_map(env);
        for (int s = 0; s < L->nslots; s++)
            if (L->param[s].buffer)
                map = put(env, map, fx_layer_slot_name(L->spec.kind, s), share(&c, &L->param[s]));
        list = enif_make_list_cell(env, map, list);
    }
    return fx_call_finish(&c, list);
}

static ERL_NIF_TERM tensor_list(fx_call *c, const fx_model *m, bool grads)
{
    ERL_NIF_TERM list = enif_make_list(c->env, 0);
    for (int i = fx_model_param_count(m); i-- > 0;) {
        const fx_tensor *t = grads ? fx_model_grad(m, i) : fx_model_param(m, i);
        if (t)
            list = enif_make_list_cell(c->env, share(c, t), list);
    }
    return list;
}

/* model_params(Model) -> [Tensor], in the optimizer's order. */
ERL_NIF_TERM nif_model_params(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, tensor_list(&c, m, false));
}

/* ---- states and frames ---- */

/* model_init_state(Model, Batch) -> State */
FX_DIRTY_NIF(nif_model_init_state)
static ERL_NIF_TERM nif_model_init_state(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_model_state *s;
    int64_t batch;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m) || fx_arg_int64(&c, argv[1], "batch", &batch) ||
        fx_model_state_new(m, batch, &s, &c.st))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, fx_make_ctx(&c, STATE_CTX, s, destroy_state));
}

/* model_reset_state(Model, State) -> ok */
FX_DIRTY_NIF(nif_model_reset_state)
static ERL_NIF_TERM nif_model_reset_state(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_model_state *s;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m) || arg_state(&c, argv[1], &s))
        return fx_call_finish(&c, 0);
    fx_model_state_reset(m, s, &c.st);
    return fx_call_finish(&c, fx_atom(env, "ok"));
}

/* model_step(Model, State, Frame) -> Out: enqueue-only on CUDA (its
 * buffers are the state's; the output is the one allocation). */
FX_ENQUEUE_NIF(nif_model_step)
static ERL_NIF_TERM nif_model_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_model_state *s;
    fx_tensor frame, out;
    memset(&out, 0, sizeof out);
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m) || arg_state(&c, argv[1], &s) || fx_arg_tensor(&c, argv[2], "frame", &frame))
        return fx_call_finish(&c, 0);
    const int64_t dims[2] = {s->batch, m->output};
    if (fx_tensor_alloc(m->device, m->dtype, 2, dims, &out, &c.st) == FX_OK)
        fx_model_step_into(m, s, &frame, &out, &c.st);
    return fx_call_return_tensor(&c, &out);
}

/* model_forward(Model, State, Window) -> Out */
FX_DIRTY_NIF(nif_model_forward)
static ERL_NIF_TERM nif_model_forward(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_model_state *s;
    fx_tensor window, y;
    memset(&y, 0, sizeof y);
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m) || arg_state(&c, argv[1], &s) || fx_arg_tensor(&c, argv[2], "window", &window))
        return fx_call_finish(&c, 0);
    fx_model_forward(m, s, &window, &y, &c.st);
    return fx_call_return_tensor(&c, &y);
}

/* ---- losses and training ---- */

static int arg_loss(fx_call *c, ERL_NIF_TERM term, int *loss)
{
    if (enif_is_identical(term, fx_atom(c->env, "mse")))
        *loss = FX_LOSS_MSE;
    else if (enif_is_identical(term, fx_atom(c->env, "cross_entropy")))
        *loss = FX_LOSS_CROSS_ENTROPY;
    else {
        char text[64];
        fx_format_term(text, sizeof text, term);
        return fx_fail(&c->st, FX_EBADARG, "loss: expected mse or cross_entropy, got %s", text);
    }
    return FX_OK;
}

/* model_gradients(Model, Inputs, Targets, Loss, WantGrads) -> {Loss, [Grad]} | Loss */
FX_DIRTY_NIF(nif_model_gradients)
static ERL_NIF_TERM nif_model_gradients(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_tensor inputs, targets;
    int loss = FX_LOSS_MSE;
    bool want;
    double value;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m) || fx_arg_tensor(&c, argv[1], "inputs", &inputs) ||
        fx_arg_tensor(&c, argv[2], "targets", &targets) || arg_loss(&c, argv[3], &loss) ||
        fx_arg_bool(&c, argv[4], "grads", &want) ||
        fx_model_gradients(m, &inputs, &targets, loss, want, &value, &c.st))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM v = enif_make_double(env, value);
    return fx_call_finish(&c, want ? enif_make_tuple2(env, v, tensor_list(&c, m, true)) : v);
}

static const char *const train_keys[] = {"loss", "lr", NULL};

/* model_train_step(Model, OptimizerRef, Inputs, Targets, Opts) -> Loss:
 * the gradients, then the optimizer's fused step on the resident weights. */
FX_DIRTY_NIF(nif_model_train_step)
static ERL_NIF_TERM nif_model_train_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_model *m;
    fx_optim_state *os;
    fx_tensor inputs, targets;
    int loss = FX_LOSS_MSE;
    double value;
    ERL_NIF_TERM v;
    fx_call_init(&c, env);
    if (arg_model(&c, argv[0], &m) || fx_arg_ctx(&c, argv[1], "optimizer", FX_OPTIM_CTX, (void **)&os) ||
        fx_arg_tensor(&c, argv[2], "inputs", &inputs) || fx_arg_tensor(&c, argv[3], "targets", &targets) ||
        fx_arg_opts(&c, argv[4], train_keys) || (fx_opt_term(&c, argv[4], "loss", &v) && arg_loss(&c, v, &loss)))
        return fx_call_finish(&c, 0);
    fx_optim_hyper h = os->defaults;
    const int n = fx_model_param_count(m);
    fx_tensor *params = fx_call_alloc(&c, sizeof *params * (size_t)n);
    fx_tensor *grads = fx_call_alloc(&c, sizeof *grads * (size_t)n);
    if (!params || !grads || fx_opt_double(&c, argv[4], "lr", os->defaults.lr, &h.lr) ||
        fx_model_gradients(m, &inputs, &targets, loss, true, &value, &c.st))
        return fx_call_finish(&c, 0);
    for (int i = 0; i < n; i++)
        params[i] = *fx_model_param(m, i), grads[i] = *fx_model_grad(m, i);
    if (fx_optim_check_hyper(os->kind, &h, &c.st) ||
        fx_op_optim_step(os, os->kind, params, (unsigned)n, grads, (unsigned)n, &h, &c.st))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, enif_make_double(env, value));
}
