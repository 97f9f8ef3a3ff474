/* fusex:xla_register/0,1: registers fusex's XLA custom-call targets
 * (docs/XLA.md) with the XLA that EXLA loaded in this VM. The targets live
 * in priv/fusex_xla.so, which this NIF does not link: it is loaded here, on
 * the first call, and asked to find XLA (include/fusex_xla.h). EXLA's
 * libxla_extension.so is loaded RTLD_LOCAL with EXLA's NIF, so nothing but
 * a lookup by name finds it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "fusex_xla.h"
#include "nif/nifs.h"

static pthread_mutex_t xla_lock = PTHREAD_MUTEX_INITIALIZER;
static fusex_xla_register_loaded_fn register_loaded; /* set once priv/fusex_xla.so is loaded; kept */

static ERL_NIF_TERM error(ErlNifEnv *env, const char *msg)
{
    return enif_make_tuple2(env, fx_atom(env, "error"), fx_make_string(env, msg));
}

/* Loads priv/fusex_xla.so once (never unloaded once its registration
 * function is found: XLA keeps pointers to its handlers). Called under
 * xla_lock. */
static fusex_xla_register_loaded_fn load_library(char *msg, size_t msglen)
{
    if (register_loaded)
        return register_loaded;
    char path[4200];
    snprintf(path, sizeof path, "%s/fusex_xla.so", fx_nif_priv_dir());
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(msg, msglen, "cannot load fusex's XLA targets: %s (make builds it where the XLA FFI headers are "
                 "found; see docs/XLA.md)", dlerror());
        return NULL;
    }
    dlerror(); /* clears an earlier failure, so the one read below is dlsym's */
    register_loaded = (fusex_xla_register_loaded_fn)dlsym(lib, FUSEX_XLA_REGISTER_LOADED_SYMBOL);
    if (!register_loaded) {
        const char *why = dlerror(); /* names the library and the symbol */
        if (why)
            snprintf(msg, msglen, "cannot use fusex's XLA targets: %.900s", why);
        else
            snprintf(msg, msglen, "cannot use fusex's XLA targets: %.800s exports %s as NULL", path,
                     FUSEX_XLA_REGISTER_LOADED_SYMBOL);
        /* Nothing of it is used, so it goes; a later call loads it again. */
        dlclose(lib);
    }
    return register_loaded;
}

/* Raises {badarg, Message} as fusex:xla_register/1 does, for a caller of the
 * NIF that skipped its checks. */
static ERL_NIF_TERM bad_library(ErlNifEnv *env, ERL_NIF_TERM library)
{
    char got[256], msg[400];
    fx_format_term(got, sizeof got, library);
    snprintf(msg, sizeof msg, "library: expected the path or soname of a loaded XLA library, got %s", got);
    return enif_raise_exception(env, enif_make_tuple2(env, fx_atom(env, "badarg"), fx_make_string(env, msg)));
}

/* The name must fit `library` below with its NUL: the same limit and message
 * as fusex:xla_register/1's. */
static ERL_NIF_TERM library_too_long(ErlNifEnv *env, size_t nbytes, size_t max_bytes)
{
    char msg[200];
    snprintf(msg, sizeof msg, "library: expected a path or soname of at most %zu bytes, got one of %zu bytes",
             max_bytes, nbytes);
    return enif_raise_exception(env, enif_make_tuple2(env, fx_atom(env, "badarg"), fx_make_string(env, msg)));
}

/* xla_register(undefined | Library :: binary()) -> ok | {error, Reason}. */
ERL_NIF_TERM nif_xla_register(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    char library[4096] = "";
    ErlNifBinary bin;
    if (enif_inspect_binary(env, argv[0], &bin)) {
        if (bin.size == 0 || memchr(bin.data, 0, bin.size))
            return bad_library(env, argv[0]);
        if (bin.size >= sizeof library)
            return library_too_long(env, bin.size, sizeof library - 1);
        memcpy(library, bin.data, bin.size);
        library[bin.size] = '\0';
    } else if (!enif_is_identical(argv[0], fx_atom(env, "undefined"))) {
        return bad_library(env, argv[0]);
    }
    char msg[1024] = "";
    pthread_mutex_lock(&xla_lock);
    fusex_xla_register_loaded_fn fn = load_library(msg, sizeof msg);
    int rc = fn ? fn(library[0] ? library : NULL, msg, sizeof msg) : -1;
    pthread_mutex_unlock(&xla_lock);
    return rc == 0 ? fx_atom(env, "ok") : error(env, msg);
}
