/* Glue for the linear recurrences: fusex:linear_scan/3, mingru/3,
 * minlstm/4, liquid/4, their backward (one NIF, the op named by an atom)
 * and their one-frame steps. Terms in, op layer, terms out. */
#include <math.h>
#include <string.h>

#include "core/linrec.h"
#include "nif/nifs.h"

/* What save_for_backward keeps: references to the inputs, h0 and the
 * output H (no copies), and the options. `p` points into this struct. */
typedef struct linrec_ctx {
    fx_linrec_problem p;
    fx_linrec_tensors in; /* references to the inputs */
    fx_tensor h;
    bool has_h0;
} linrec_ctx;

static const char *const ctx_kind[FX_LINREC_KIND_COUNT] = {
    "fusex:linear_scan", "fusex:mingru", "fusex:minlstm", "fusex:liquid"};

static const char *const scan_opts[] = {"h0", "return_state", "reverse", "save_for_backward", NULL};
static const char *const gated_opts[] = {"h0", "return_state", "reverse", "save_for_backward",
                                         "candidate_activation", NULL};
static const char *const liquid_opts[] = {"h0", "return_state", "reverse", "save_for_backward",
                                          "dt", NULL};
static const char *const no_opts[] = {NULL};
static const char *const gated_step_opts[] = {"candidate_activation", NULL};
static const char *const liquid_step_opts[] = {"dt", NULL};
static const char *const backward_opts[] = {"dstate", NULL};

static const char *const *forward_opts(int kind)
{
    return kind == FX_LINREC_SCAN ? scan_opts : kind == FX_LINREC_LIQUID ? liquid_opts : gated_opts;
}

static const char *const *step_opts(int kind)
{
    return kind == FX_LINREC_SCAN ? no_opts : kind == FX_LINREC_LIQUID ? liquid_step_opts
                                                                       : gated_step_opts;
}

static int bad_value(fx_call *c, const char *name, const char *expected, ERL_NIF_TERM got)
{
    char text[96];
    fx_format_term(text, sizeof text, got);
    return fx_fail(&c->st, FX_EBADARG, "%s: expected %s, got %s", name, expected, text);
}

static int check_opts(fx_call *c, ERL_NIF_TERM opts, const char *const *allowed)
{
    size_t size;
    if (!allowed[0] && enif_get_map_size(c->env, opts, &size) && size > 0) {
        ERL_NIF_TERM key, value;
        ErlNifMapIterator it;
        enif_map_iterator_create(c->env, opts, &it, ERL_NIF_MAP_ITERATOR_FIRST);
        enif_map_iterator_get_pair(c->env, &it, &key, &value);
        enif_map_iterator_destroy(c->env, &it);
        return bad_value(c, "opts", "no options", key);
    }
    return fx_arg_opts(c, opts, allowed);
}

static int opt_candidate(fx_call *c, ERL_NIF_TERM opts, fx_linrec_problem *p)
{
    ERL_NIF_TERM v;
    p->candidate_g = 0;
    if (p->kind != FX_LINREC_MINGRU && p->kind != FX_LINREC_MINLSTM)
        return FX_OK;
    if (!fx_opt_term(c, opts, "candidate_activation", &v))
        return FX_OK;
    if (enif_is_identical(v, fx_atom(c->env, "g")))
        p->candidate_g = 1;
    else if (!enif_is_identical(v, fx_atom(c->env, "identity")))
        return bad_value(c, "candidate_activation", "identity or g", v);
    return FX_OK;
}

/* dt: a positive number (default 1.0) or a tensor. */
static int opt_dt(fx_call *c, ERL_NIF_TERM opts, fx_linrec_problem *p, fx_tensor *dt, int frame)
{
    ERL_NIF_TERM v;
    fx_handle *h;
    p->dt = NULL;
    p->dt_value = 1.0;
    if (p->kind != FX_LINREC_LIQUID || !fx_opt_term(c, opts, "dt", &v))
        return FX_OK;
    const char *expected = frame ? "a positive number or a fusex tensor ([batch, 1])"
                                 : "a positive number or a fusex tensor ([batch, seqlen, 1])";
    if (enif_get_resource(c->env, v, fx_tensor_type, (void **)&h)) {
        if (fx_arg_tensor(c, v, "dt", dt))
            return c->st.code;
        p->dt = dt;
        return FX_OK;
    }
    if (!enif_is_number(c->env, v) || fx_arg_double(c, v, "dt", &p->dt_value) ||
        !(p->dt_value > 0) || !isfinite(p->dt_value))
        return c->st.code ? c->st.code : bad_value(c, "dt", expected, v);
    return FX_OK;
}

/* The op's tensor arguments: the sequence inputs, then liquid's tau and a. */
static int arg_inputs(fx_call *c, int kind, const ERL_NIF_TERM *terms, fx_tensor *seq,
                      fx_tensor *tau, fx_tensor *lam, fx_linrec_problem *p)
{
    p->kind = kind;
    int n = fx_linrec_nseq(kind);
    for (int i = 0; i < n; i++) {
        if (fx_arg_tensor(c, terms[i], fx_linrec_seq_name(kind, i), &seq[i]))
            return c->st.code;
        p->seq[i] = &seq[i];
    }
    if (kind == FX_LINREC_LIQUID) {
        if (fx_arg_tensor(c, terms[1], "tau", tau) || fx_arg_tensor(c, terms[2], "a", lam))
            return c->st.code;
        p->tau = tau;
        p->lam = lam;
    }
    return FX_OK;
}

/* ---- saved contexts ---- */

static void copy_ref(fx_tensor *dst, const fx_tensor *src)
{
    *dst = *src;
    if (src->buffer)
        fx_buffer_ref(src->buffer);
}

static void ctx_destroy(void *data)
{
    linrec_ctx *ctx = data;
    fx_linrec_tensors_release(&ctx->in);
    fx_tensor_release(&ctx->h);
    enif_free(ctx);
}

static ERL_NIF_TERM make_ctx(fx_call *c, const fx_linrec_problem *p, const fx_tensor *h0,
                             const fx_tensor *h)
{
    linrec_ctx *ctx = enif_alloc(sizeof *ctx);
    if (!ctx) {
        fx_fail(&c->st, FX_ENOMEM, "out of host memory for a context");
        return 0;
    }
    memset(ctx, 0, sizeof *ctx);
    ctx->p = *p;
    for (int i = 0; i < p->nseq; i++) {
        copy_ref(&ctx->in.seq[i], p->seq[i]);
        ctx->p.seq[i] = &ctx->in.seq[i];
    }
    if (p->tau) {
        copy_ref(&ctx->in.tau, p->tau);
        copy_ref(&ctx->in.lam, p->lam);
        ctx->p.tau = &ctx->in.tau;
        ctx->p.lam = &ctx->in.lam;
    }
    if (p->dt) {
        copy_ref(&ctx->in.dt, p->dt);
        ctx->p.dt = &ctx->in.dt;
    }
    if (h0) {
        copy_ref(&ctx->in.h0, h0);
        ctx->has_h0 = true;
    }
    copy_ref(&ctx->h, h);
    return fx_make_ctx(c, ctx_kind[p->kind], ctx, ctx_destroy);
}

/* ---- forward ---- */

static ERL_NIF_TERM forward(ErlNifEnv *env, int kind, const ERL_NIF_TERM *inputs,
                            ERL_NIF_TERM opts)
{
    fx_call c;
    fx_tensor seq[FX_LINREC_MAX_SEQ], tau, lam, dt, h0, h = {0}, state = {0};
    bool has_h0, want_state, save, reverse;
    fx_linrec_problem p = {0};
    fx_call_init(&c, env);
    fx_call_watch_caller(&c);
    if (arg_inputs(&c, kind, inputs, seq, &tau, &lam, &p) || check_opts(&c, opts, forward_opts(kind)) ||
        fx_opt_tensor(&c, opts, "h0", &h0, &has_h0) ||
        fx_opt_bool(&c, opts, "return_state", false, &want_state) ||
        fx_opt_bool(&c, opts, "reverse", false, &reverse) ||
        fx_opt_bool(&c, opts, "save_for_backward", false, &save) || opt_candidate(&c, opts, &p) ||
        opt_dt(&c, opts, &p, &dt, 0))
        return fx_call_finish(&c, 0);
    p.reverse = reverse;
    if (fx_op_linrec_forward(&p, has_h0 ? &h0 : NULL, want_state, 0, &h, &state, &c.st) ||
        fx_call_hold(&c, &h) || fx_call_hold(&c, &state))
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM ctx = save ? make_ctx(&c, &p, has_h0 ? &h0 : NULL, &h) : 0;
    if (c.st.code)
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM out[3];
    int n = 0;
    out[n++] = fx_make_tensor(&c, &h);
    if (want_state)
        out[n++] = fx_make_tensor(&c, &state);
    if (save)
        out[n++] = ctx;
    return fx_call_finish(&c, n == 1 ? out[0] : enif_make_tuple_from_array(env, out, (unsigned)n));
}

FX_ENQUEUE_NIF(nif_linear_scan)
static ERL_NIF_TERM nif_linear_scan(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return forward(env, FX_LINREC_SCAN, argv, argv[2]);
}

FX_ENQUEUE_NIF(nif_mingru)
static ERL_NIF_TERM nif_mingru(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return forward(env, FX_LINREC_MINGRU, argv, argv[2]);
}

FX_ENQUEUE_NIF(nif_minlstm)
static ERL_NIF_TERM nif_minlstm(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return forward(env, FX_LINREC_MINLSTM, argv, argv[3]);
}

FX_ENQUEUE_NIF(nif_liquid)
static ERL_NIF_TERM nif_liquid(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return forward(env, FX_LINREC_LIQUID, argv, argv[3]);
}

/* ---- backward ---- */

static int arg_kind(fx_call *c, ERL_NIF_TERM term, int *kind)
{
    for (int k = 0; k < FX_LINREC_KIND_COUNT; k++)
        if (enif_is_identical(term, fx_atom(c->env, fx_linrec_op_name(k)))) {
            *kind = k;
            return FX_OK;
        }
    return bad_value(c, "op", "linear_scan, mingru, minlstm or liquid", term);
}

static ERL_NIF_TERM put(ErlNifEnv *env, ERL_NIF_TERM map, const char *key, fx_call *c,
                        fx_tensor *t)
{
    ERL_NIF_TERM out;
    enif_make_map_put(env, map, fx_atom(env, key), fx_make_tensor(c, t), &out);
    return out;
}

FX_ENQUEUE_NIF(nif_linrec_backward)
static ERL_NIF_TERM nif_linrec_backward(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    int kind = 0;
    linrec_ctx *ctx;
    fx_tensor dh, dstate;
    bool has_dstate;
    fx_linrec_grads g;
    fx_call_init(&c, env);
    fx_call_watch_caller(&c);
    memset(&g, 0, sizeof g);
    if (arg_kind(&c, argv[0], &kind) || fx_arg_tensor(&c, argv[1], "dh", &dh))
        return fx_call_finish(&c, 0);
    if (fx_arg_ctx(&c, argv[2], "ctx", ctx_kind[kind], (void **)&ctx) ||
        check_opts(&c, argv[3], backward_opts) ||
        fx_opt_tensor(&c, argv[3], "dstate", &dstate, &has_dstate) ||
        fx_op_linrec_backward(&ctx->p, ctx->has_h0 ? &ctx->in.h0 : NULL, &ctx->h, &dh,
                              has_dstate ? &dstate : NULL, 0, &g, &c.st))
        return fx_call_finish(&c, 0);
    for (int i = 0; i < FX_LINREC_MAX_SEQ; i++)
        fx_call_hold(&c, &g.seq[i]);
    fx_call_hold(&c, &g.tau);
    fx_call_hold(&c, &g.lam);
    fx_call_hold(&c, &g.dt);
    fx_call_hold(&c, &g.h0);
    if (c.st.code)
        return fx_call_finish(&c, 0);
    ERL_NIF_TERM map = enif_make_new_map(env);
    for (int i = 0; i < ctx->p.nseq; i++)
        map = put(env, map, fx_linrec_seq_name(kind, i), &c, &g.seq[i]);
    if (kind == FX_LINREC_LIQUID) {
        map = put(env, map, "tau", &c, &g.tau);
        map = put(env, map, "a", &c, &g.lam);
        if (ctx->p.dt)
            map = put(env, map, "dt", &c, &g.dt);
    }
    if (ctx->has_h0)
        map = put(env, map, "h0", &c, &g.h0);
    return fx_call_finish(&c, map);
}

/* ---- steps ---- */

static ERL_NIF_TERM step(ErlNifEnv *env, int kind, const ERL_NIF_TERM argv[], ERL_NIF_TERM opts)
{
    fx_call c;
    fx_tensor state, seq[FX_LINREC_MAX_SEQ], tau, lam, dt, h = {0};
    fx_linrec_problem p = {0};
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, argv[0], "state", &state) ||
        arg_inputs(&c, kind, argv + 1, seq, &tau, &lam, &p) || check_opts(&c, opts, step_opts(kind)) ||
        opt_candidate(&c, opts, &p) || opt_dt(&c, opts, &p, &dt, 1) ||
        fx_op_linrec_step(&p, &state, &h, &c.st) || fx_call_hold(&c, &h))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, fx_make_tensor(&c, &h));
}

FX_ENQUEUE_NIF(nif_linear_scan_step)
static ERL_NIF_TERM nif_linear_scan_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return step(env, FX_LINREC_SCAN, argv, argv[3]);
}

FX_ENQUEUE_NIF(nif_mingru_step)
static ERL_NIF_TERM nif_mingru_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return step(env, FX_LINREC_MINGRU, argv, argv[3]);
}

FX_ENQUEUE_NIF(nif_minlstm_step)
static ERL_NIF_TERM nif_minlstm_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return step(env, FX_LINREC_MINLSTM, argv, argv[4]);
}

FX_ENQUEUE_NIF(nif_liquid_step)
static ERL_NIF_TERM nif_liquid_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return step(env, FX_LINREC_LIQUID, argv, argv[4]);
}
