/* The saved states' shape and spacing from shapes alone (fusex.erl's
 * saved-shape and save-every queries): what a caller sizing them ahead of
 * a run needs, the op layer's one rule (fx_ssm_dims_of_shapes,
 * fx_ssm_saved_shape, fx_ssm_save_every). */
#include "core/ssm.h"
#include "nif/nifs.h"

/* XShape, BShape, Type -> the scan's sizes. */
static int arg_dims(fx_call *c, const ERL_NIF_TERM argv[], fx_ssm_dims *n, fx_dtype *type)
{
    int xr, br;
    int64_t x[FX_MAX_RANK], b[FX_MAX_RANK];
    if (fx_arg_shape(c, argv[0], "x", &xr, x) || fx_arg_shape(c, argv[1], "b", &br, b) ||
        fx_arg_dtype(c, argv[2], "type", type))
        return c->st.code;
    return fx_ssm_dims_of_shapes(xr, x, br, b, *type, n, &c->st);
}

/* {Batch, NSaved, Dim, Dstate} (their type is the state type). */
ERL_NIF_TERM nif_ssm_saved_shape(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_ssm_dims n = {0};
    fx_dtype type = FX_F32;
    fx_call_init(&c, env);
    if (arg_dims(&c, argv, &n, &type))
        return fx_call_finish(&c, 0);
    int64_t dims[4];
    fx_ssm_saved_shape(&n, type, dims);
    ERL_NIF_TERM items[4];
    for (int i = 0; i < 4; i++)
        items[i] = enif_make_int64(env, dims[i]);
    return fx_call_finish(&c, enif_make_tuple_from_array(env, items, 4));
}

/* K, the steps between the saved states: a caller that computes them
 * itself (a plain-Nx forward) takes every K-th state. */
ERL_NIF_TERM nif_ssm_save_every(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    fx_call c;
    fx_ssm_dims n = {0};
    fx_dtype type = FX_F32;
    fx_call_init(&c, env);
    if (arg_dims(&c, argv, &n, &type))
        return fx_call_finish(&c, 0);
    return fx_call_finish(&c, enif_make_int64(env, fx_ssm_save_every(&n, type)));
}
