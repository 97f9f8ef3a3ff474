/* Library entry: loads the runtime with the CPU backend, opens the
 * resource types and lists every NIF. */
#include <string.h>

#include "fusex_cpu.h"
#include "nif/nifs.h"

static char priv_dir[4096] = "priv";

const char *fx_nif_priv_dir(void) { return priv_dir; }

static int on_load(ErlNifEnv *env, void **priv, ERL_NIF_TERM load_info)
{
    (void)priv;
    if (enif_get_string(env, load_info, priv_dir, sizeof priv_dir, ERL_NIF_LATIN1) <= 0)
        strcpy(priv_dir, "priv");
    fx_status st;
    fx_status_clear(&st);
    if (fx_runtime_init(priv_dir, &fx_cpu_backend, &st) != FX_OK)
        return 1;
    return fx_nif_open_types(env) && fx_event_type_open(env) ? 0 : 1;
}

static int on_upgrade(ErlNifEnv *env, void **priv, void **old_priv, ERL_NIF_TERM load_info)
{
    (void)old_priv;
    return on_load(env, priv, load_info);
}

static ErlNifFunc nif_funcs[] = {
    FX_TENSOR_NIFS,
    FX_POINTER_NIFS,
    FX_OPTIM_NIFS,
    FX_OP_NIFS,
    FX_SSM_SHAPE_NIFS,
    FX_XLA_NIFS,
    FX_MODEL_NIFS,
};

ERL_NIF_INIT(fusex_nif, nif_funcs, on_load, NULL, on_upgrade, NULL)
