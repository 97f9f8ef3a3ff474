/* Glue for the optimizers: option maps to fx_optim_hyper, the state as a
 * context resource plus handles to the tensors it keeps. */
#include <math.h>
#include <string.h>

#include "core/optim.h"
#include "nif/nifs.h"

#define OPTIM_CTX "adamw_init/2 or sgd_init/2"

static const char *const adamw_step_keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                              "maximize", "amsgrad", "max_grad_norm",
                                              "skip_nonfinite", NULL};
static const char *const adamw_init_keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                              "maximize", "amsgrad", "max_grad_norm",
                                              "skip_nonfinite", "master_weights", NULL};
static const char *const sgd_step_keys[] = {"lr", "momentum", "dampening", "nesterov",
                                            "weight_decay", "maximize", "max_grad_norm",
                                            "skip_nonfinite", NULL};
static const char *const sgd_init_keys[] = {"lr", "momentum", "dampening", "nesterov",
                                            "weight_decay", "maximize", "max_grad_norm",
                                            "skip_nonfinite", "master_weights", NULL};

static int arg_kind(fx_call *c, ERL_NIF_TERM term, fx_optim_kind *kind)
{
    if (enif_is_identical(term, fx_atom(c->env, "adamw")))
        *kind = FX_OPTIM_ADAMW;
    else if (enif_is_identical(term, fx_atom(c->env, "sgd")))
        *kind = FX_OPTIM_SGD;
    else {
        char text[64];
        fx_format_term(text, sizeof text, term);
        return fx_fail(&c->st, FX_EBADARG, "optimizer: expected adamw or sgd, got %s", text);
    }
    return FX_OK;
}

/* `max_grad_norm => none` (or absent, with no default) turns clipping off. */
static int opt_max_grad_norm(fx_call *c, ERL_NIF_TERM opts, fx_optim_hyper *h)
{
    ERL_NIF_TERM v;
    if (!fx_opt_term(c, opts, "max_grad_norm", &v))
        return FX_OK;
    if (enif_is_identical(v, fx_atom(c->env, "none"))) {
        h->clip = false;
        h->max_grad_norm = 0;
        return FX_OK;
    }
    if (!enif_is_number(c->env, v)) {
        char text[96];
        fx_format_term(text, sizeof text, v);
        return fx_fail(&c->st, FX_EBADARG, "max_grad_norm: expected a finite number > 0 or none, got %s",
                       text);
    }
    h->clip = true;
    return fx_arg_double(c, v, "max_grad_norm", &h->max_grad_norm);
}

/* The options over `dflt`; the op layer checks the ranges. */
static int parse_hyper(fx_call *c, fx_optim_kind kind, ERL_NIF_TERM opts,
                       const fx_optim_hyper *dflt, fx_optim_hyper *h)
{
    *h = *dflt;
    if (fx_opt_double(c, opts, "lr", dflt->lr, &h->lr) ||
        fx_opt_double(c, opts, "weight_decay", dflt->weight_decay, &h->weight_decay) ||
        fx_opt_bool(c, opts, "maximize", dflt->maximize, &h->maximize) ||
        fx_opt_bool(c, opts, "skip_nonfinite", dflt->skip_nonfinite, &h->skip_nonfinite) ||
        opt_max_grad_norm(c, opts, h))
        return c->st.code;
    if (kind == FX_OPTIM_ADAMW)
        return fx_opt_double(c, opts, "beta1", dflt->beta1, &h->beta1) ||
                       fx_opt_double(c, opts, "beta2", dflt->beta2, &h->beta2) ||
                       fx_opt_double(c, opts, "eps", dflt->eps, &h->eps) ||
                       fx_opt_bool(c, opts, "amsgrad", dflt->amsgrad, &h->amsgrad)
                   ? c->st.code
                   : FX_OK;
    return fx_opt_double(c, opts, "momentum", dflt->momentum, &h->momentum) ||
                   fx_opt_double(c, opts, "dampening", dflt->dampening, &h->dampening) ||
                   fx_opt_bool(c, opts, "nesterov", dflt->nesterov, &h->nesterov)
               ? c->st.code
               : FX_OK;
}

/* ---- init: the state as {Ctx, #{name => tensor | [tensor]}} ---- */

typedef struct handle_maker {
    fx_call *c;
    fx_tensor *copies; /* held by the call until made into handles */
    unsigned used;
} handle_maker;

/* A new handle sharing `t`'s buffer (the state keeps its own reference). */
static ERL_NIF_TERM share(handle_maker *hm, const fx_tensor *t)
{
    fx_tensor *copy = &hm->copies[hm->used++];
    if (fx_call_hold(hm->c, copy)) /* held empty: the call releases it if no handle takes it */
        return enif_make_badarg(hm->c->env);
    *copy = *t;
    fx_buffer_ref(copy->buffer);
    return fx_make_tensor(hm->c, copy);
}

static ERL_NIF_TERM share_list(handle_maker *hm, const fx_tensor *ts, unsigned n)
{
    ERL_NIF_TERM list = enif_make_list(hm->c->env, 0);
    if (!ts[0].buffer) /* the state keeps none of these */
        return list;
    for (unsigned i = n; i-- > 0;)
        list = enif_make_list_cell(hm->c->env, share(hm, &ts[i]), list);
    return list;
}

static ERL_NIF_TERM put(ErlNifEnv *env, ERL_NIF_TERM map, const char *key, ERL_NIF_TERM value)
{
    ERL_NIF_TERM out;
    enif_make_map_put(env, map, fx_atom(env, key), value, &out);
    return out;
}

static ERL_NIF_TERM state_tensors(fx_call *c, const fx_optim_state *s)
{
    handle_maker hm = {c, fx_call_alloc(c, sizeof(fx_tensor) * (4 * (size_t)s->n + 3)), 0};
    if (!hm.copies)
        return 0;
    ErlNifEnv *env = c->env;
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "step", share(&hm, &s->step));
    m = put(env, m, "grad_norm", share(&hm, &s->grad_norm));
    m = put(env, m, "skipped", share(&hm, &s->skipped));
    m = put(env, m, "master", share_list(&hm, s->master_t, s->n));
    if (s->kind == FX_OPTIM_ADAMW) {
        m = put(env, m, "exp_avg", share_list(&hm, s->buf0, s->n));
        m = put(env, m, "exp_avg_sq", share_list(&hm, s->buf1, s->n));
        m = put(env, m, "max_exp_avg_sq", share_list(&hm, s->buf2, s->n));
    } else {
        m = put(env, m, "momentum_buffer", share_list(&hm, s->buf0, s->n));
    }
    return m;
}

static void destroy_state(void *data) { fx_optim_state_free(data); }

FX_DIRTY_NIF(nif_optim_init)
static ERL_NIF_TERM nif_optim_init(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_optim_kind kind = FX_OPTIM_ADAMW;
    fx_tensor *params;
    unsigned n;
    fx_optim_config cfg;
    fx_optim_state *s = NULL;
    fx_call_init(&c, env);
    if (arg_kind(&c, argv[0], &kind) || fx_arg_tensor_list(&c, argv[1], "params", &params, &n) ||
        fx_arg_opts(&c, argv[2], kind == FX_OPTIM_ADAMW ? adamw_init_keys : sgd_init_keys))
        return fx_call_finish(&c, 0);
    fx_optim_hyper dflt = fx_optim_default_hyper(kind);
    if (parse_hyper(&c, kind, argv[2], &dflt, &cfg.defaults) ||
        fx_opt_bool(&c, argv[2], "master_weights", false, &cfg.master_weights) ||
        fx_op_optim_init(kind, params, n, &cfg, &s, &c.st))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM tensors = state_tensors(&c, s);
    ERL_NIF_TERM ctx = fx_make_ctx(&c, OPTIM_CTX, s, destroy_state); /* owns s from here */
    if (c.st.code != FX_OK)
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, enif_make_tuple2(env, ctx, tensors));
}

/* The step's body. With `done` NULL it may wait (a dirty scheduler);
 * else it never waits and leaves *done false when it enqueued nothing. */
static ERL_NIF_TERM optim_step(ErlNifEnv *env, const ERL_NIF_TERM argv[], bool *done)
{
    fx_call c;
    fx_optim_kind kind = FX_OPTIM_ADAMW;
    void *data;
    fx_tensor *params, *grads;
    unsigned np, ng;
    fx_optim_hyper h;
    bool enqueued = true;
    fx_call_init(&c, env);
    if (!arg_kind(&c, argv[0], &kind) && !fx_arg_ctx(&c, argv[1], "state", OPTIM_CTX, &data) &&
        !fx_arg_tensor_list(&c, argv[2], "params", &params, &np) &&
        !fx_arg_tensor_list(&c, argv[3], "grads", &grads, &ng) &&
        !fx_arg_opts(&c, argv[4], kind == FX_OPTIM_ADAMW ? adamw_step_keys : sgd_step_keys) &&
        !parse_hyper(&c, kind, argv[4], &((fx_optim_state *)data)->defaults, &h)) {
        if (done)
            fx_op_optim_try_step(data, kind, params, np, grads, ng, &h, &enqueued, &c.st);
        else
            fx_op_optim_step(data, kind, params, np, grads, ng, &h, &c.st);
    }
    if (done)
        *done = enqueued || c.st.code != FX_OK;
    return fx_call_finish(&c, fx_atom(env, "ok"));
}

/* A step whose table did not change is two launches at most: it runs on
 * the calling scheduler, saving the hop to a dirty one and the wake-up of
 * one that slept. */
FX_TRY_NIF(nif_optim_step, optim_step)

/* optim_info(Ref) -> #{step, skipped, grad_norm}: read through the state
 * resource, never from the tensors of the state map, which a caller can
 * replace (a forged `step' of another type read as garbage). */
static ERL_NIF_TERM nif_optim_info(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    void *data;
    fx_optim_info info;
    fx_call_init(&c, env);
    if (fx_arg_ctx(&c, argv[0], "state", OPTIM_CTX, &data) ||
        fx_op_optim_info(data, &info, &c.st))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM norm;
    if (isnan(info.grad_norm))
        norm = fx_atom(env, "nan");
    else if (isinf(info.grad_norm))
        norm = fx_atom(env, "infinity");
    else if (info.grad_norm < 0)
        norm = fx_atom(env, "undefined");
    else
        norm = enif_make_double(env, info.grad_norm);
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(env, m, "step", enif_make_int64(env, info.step));
    m = put(env, m, "skipped", fx_atom(env, info.skipped ? "true" : "false"));
    m = put(env, m, "grad_norm", norm);
    return fx_call_finish(&c, m);
}

/* The read waits for the state's device: dirty IO on a GPU, dirty CPU on
 * the CPU (the state resource, not a tensor argument, says which). */
ERL_NIF_TERM nif_optim_info_entry(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    fx_call c;
    void *data;
    fx_call_init(&c, env);
    if (fx_arg_ctx(&c, argv[0], "state", OPTIM_CTX, &data))
        return fx_call_finish(&c, 0);
    bool gpu = ((fx_optim_state *)data)->device->kind == FX_DEVICE_CUDA;
    fx_call_finish(&c, 0);
    return enif_schedule_nif(env, "optim_info", gpu ? ERL_NIF_DIRTY_JOB_IO_BOUND : ERL_NIF_DIRTY_JOB_CPU_BOUND,
                             nif_optim_info, argc, argv);
}
