/* Glue for the selective scan: forward (with its saved context), backward
 * and single step. Terms in, terms out; the op layer checks everything. */
#include <string.h>

#include "core/ssm.h"
#include "fusex_dtype.h"
#include "nif/nifs.h"

#define CTX_KIND "selective_scan"

static const char *const scan_opts[] = {"d", "z", "dt_bias", "dt_softplus", "h0",
                                        "return_state", "save_for_backward", NULL};
static const char *const step_opts[] = {"d", "z", "dt_bias", "dt_softplus", NULL};
static const char *const backward_opts[] = {"dstate", NULL};

typedef struct scan_terms {
    fx_tensor x, dt, a, b, c, d, z, dt_bias, h0;
    fx_ssm_inputs in;
} scan_terms;

static const fx_tensor *given(const fx_tensor *t, bool present) { return present ? t : NULL; }

/* x, dt, a, b, c from argv[0..4] and the options every variant shares;
 * h0 only where `with_h0`. */
static int arg_inputs(fx_call *c, const ERL_NIF_TERM argv[], ERL_NIF_TERM opts, bool with_h0,
                      scan_terms *t)
{
    bool has_d, has_z, has_bias, has_h0 = false;
    memset(t, 0, sizeof *t);
    if (fx_arg_tensor(c, argv[0], "x", &t->x) || fx_arg_tensor(c, argv[1], "dt", &t->dt) ||
        fx_arg_tensor(c, argv[2], "a", &t->a) || fx_arg_tensor(c, argv[3], "b", &t->b) ||
        fx_arg_tensor(c, argv[4], "c", &t->c) || fx_opt_tensor(c, opts, "d", &t->d, &has_d) ||
        fx_opt_tensor(c, opts, "z", &t->z, &has_z) ||
        fx_opt_tensor(c, opts, "dt_bias", &t->dt_bias, &has_bias) ||
        (with_h0 && fx_opt_tensor(c, opts, "h0", &t->h0, &has_h0)) ||
        fx_opt_bool(c, opts, "dt_softplus", false, &t->in.dt_softplus))
        return c->st.code;
    t->in.x = &t->x;
    t->in.dt = &t->dt;
    t->in.a = &t->a;
    t->in.b = &t->b;
    t->in.c = &t->c;
    t->in.d = given(&t->d, has_d);
    t->in.z = given(&t->z, has_z);
    t->in.dt_bias = given(&t->dt_bias, has_bias);
    t->in.h0 = given(&t->h0, has_h0);
    return FX_OK;
}

static void ctx_destroy(void *data) { fx_ssm_ctx_free(data); }

/* selective_scan(X, Dt, A, B, C, Opts) -> Y | {Y, State} | {Y, Ctx} | {Y, State, Ctx} */
FX_ENQUEUE_NIF(nif_selective_scan)
static ERL_NIF_TERM nif_selective_scan(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    scan_terms t;
    bool return_state, save;
    fx_tensor y = {0}, state = {0};
    fx_ssm_ctx *ctx = NULL;
    fx_call_init(&c, env);
    fx_call_watch_caller(&c);
    if (fx_arg_opts(&c, argv[5], scan_opts) || arg_inputs(&c, argv, argv[5], true, &t) ||
        fx_opt_bool(&c, argv[5], "return_state", false, &return_state) ||
        fx_opt_bool(&c, argv[5], "save_for_backward", false, &save) ||
        fx_op_ssm_forward(&t.in, return_state, &y, &state, save ? &ctx : NULL, &c.st) ||
        fx_call_hold(&c, &y) || fx_call_hold(&c, &state)) {
        fx_tensor_release(&y);
        fx_tensor_release(&state);
        fx_ssm_ctx_free(ctx);
        return fx_call_finish(&c, 0);
    }
    ERL_NIF_TERM items[3];
    unsigned count = 0;
    items[count++] = fx_make_tensor(&c, &y);
    if (return_state)
        items[count++] = fx_make_tensor(&c, &state);
    if (save)
        items[count++] = fx_make_ctx(&c, CTX_KIND, ctx, ctx_destroy);
    return fx_call_finish(&c, count == 1 ? items[0] : enif_make_tuple_from_array(env, items, count));
}

static ERL_NIF_TERM put(fx_call *c, ERL_NIF_TERM map, const char *key, fx_tensor *t)
{
    if (!t->buffer)
        return map;
    ERL_NIF_TERM out;
    enif_make_map_put(c->env, map, fx_atom(c->env, key), fx_make_tensor(c, t), &out);
    return out;
}

/* selective_scan_backward(Dy, Ctx, Opts) -> #{x, dt, a, b, c[, d, z, dt_bias, h0]} */
FX_ENQUEUE_NIF(nif_selective_scan_backward)
static ERL_NIF_TERM nif_selective_scan_backward(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor dy, dstate;
    bool has_dstate;
    void *ctx;
    fx_ssm_grads g;
    memset(&g, 0, sizeof g);
    fx_call_init(&c, env);
    fx_call_watch_caller(&c);
    if (fx_arg_tensor(&c, argv[0], "dy", &dy) || fx_arg_ctx(&c, argv[1], "ctx", CTX_KIND, &ctx) ||
        fx_arg_opts(&c, argv[2], backward_opts) ||
        fx_opt_tensor(&c, argv[2], "dstate", &dstate, &has_dstate) ||
        fx_op_ssm_backward(ctx, &dy, has_dstate ? &dstate : NULL, &g, &c.st))
        return fx_call_finish(&c, 0);
    fx_tensor *all[] = {&g.x, &g.dt, &g.a, &g.b, &g.c, &g.d, &g.z, &g.dt_bias, &g.h0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->buffer && fx_call_hold(&c, all[i])) {
            fx_ssm_grads_release(&g);
            return fx_call_finish(&c, 0);
        }
    ERL_NIF_TERM m = enif_make_new_map(env);
    m = put(&c, m, "x", &g.x);
    m = put(&c, m, "dt", &g.dt);
    m = put(&c, m, "a", &g.a);
    m = put(&c, m, "b", &g.b);
    m = put(&c, m, "c", &g.c);
    m = put(&c, m, "d", &g.d);
    m = put(&c, m, "z", &g.z);
    m = put(&c, m, "dt_bias", &g.dt_bias);
    m = put(&c, m, "h0", &g.h0);
    return fx_call_finish(&c, m);
}

/* selective_scan_step(State, X, Dt, A, B, C, Opts) -> Y, State updated in place */
FX_ENQUEUE_NIF(nif_selective_scan_step)
static ERL_NIF_TERM nif_selective_scan_step(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_tensor state, y = {0};
    scan_terms t;
    fx_call_init(&c, env);
    if (fx_arg_tensor(&c, argv[0], "state", &state) || fx_arg_opts(&c, argv[6], step_opts) ||
        arg_inputs(&c, argv + 1, argv[6], false, &t) ||
        fx_op_ssm_step(&state, &t.in, &y, &c.st) || fx_call_hold(&c, &y))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, fx_make_tensor(&c, &y));
}

/* The shape of a forward's saved states as a tuple {Batch, NSaved, Dim, Dstate}
 * (their type is the state type): what a caller sizing them ahead of a run
 * (an XLA program) needs, from the shapes of x and b and x's type alone. */
static int saved_shape_dims(fx_call *c, const ERL_NIF_TERM argv[], fx_ssm_dims *n, fx_dtype *type)
{
    int xr, br;
    int64_t x[FX_MAX_RANK], b[FX_MAX_RANK];
    char got[160];
    if (fx_arg_shape(c, argv[0], "x", &xr, x) || fx_arg_shape(c, argv[1], "b", &br, b) ||
        fx_arg_dtype(c, argv[2], "type", type))
        return c->st.code;
    if (!fx_dtype_is_float(*type))
        return fx_fail(&c->st, FX_EBADARG, "type: expected a float type, got %s", fx_dtype_name(*type));
    if (xr != 3) {
        fx_format_shape(got, sizeof got, xr, x);
        return fx_fail(&c->st, FX_EBADARG, "x: expected a shape of rank 3 [batch, seqlen, dim], got %s", got);
    }
    if ((br != 3 && br != 4) || b[0] != x[0] || b[1] != x[1]) {
        fx_format_shape(got, sizeof got, br, b);
        return fx_fail(&c->st, FX_EBADARG,
                       "b: expected a shape {%lld,%lld,dstate} or {%lld,%lld,groups,dstate} ([batch, seqlen, "
                       "[groups,] dstate]), got %s",
                       (long long)x[0], (long long)x[1], (long long)x[0], (long long)x[1], got);
    }
    *n = (fx_ssm_dims){.batch = x[0], .seqlen = x[1], .dim = x[2], .dstate = b[br - 1],
                       .groups = br == 4 ? b[2] : 1};
    return fx_ssm_check_dims(n, *type, &c->st);
}

ERL_NIF_TERM nif_selective_scan_saved_shape(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_ssm_dims n = {0};
    fx_dtype type = FX_F32;
    fx_call_init(&c, env);
    if (saved_shape_dims(&c, argv, &n, &type))
        return fx_call_finish(&c, 0);
    int64_t dims[4];
    fx_ssm_saved_shape(&n, type, dims);
    ERL_NIF_TERM items[4];
    for (int i = 0; i < 4; i++)
        items[i] = enif_make_int64(env, dims[i]);
    return fx_call_finish(&c, enif_make_tuple_from_array(env, items, 4));
}

/* The steps between the saved states, K (fx_ssm_save_every), from the same
 * arguments: a caller that computes the saved states itself (a plain-Nx
 * forward) takes every K-th state. */
ERL_NIF_TERM nif_selective_scan_save_every(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_ssm_dims n = {0};
    fx_dtype type = FX_F32;
    fx_call_init(&c, env);
    if (saved_shape_dims(&c, argv, &n, &type))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, enif_make_int64(env, fx_ssm_save_every(&n, type)));
}
