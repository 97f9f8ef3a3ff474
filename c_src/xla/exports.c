/* What priv/fusex_xla.so exports (include/fusex_xla.h): registration with
 * an XLA, the loader that finds EXLA's XLA in the process, the ops'
 * descriptions, handlers and check for the front ends (the JAX package
 * calls them through ctypes), and the helpers. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/op.h"
#include "core/ssm.h"
#include "fusex_xla.h"
#include "xla/ffi/api/c_api.h"
#include "xla/fx_xla.h"

#define EXPORT __attribute__((visibility("default")))

/* XLA's platform names (it canonicalises them: "Host" is its "host"). */
static const char *const platform_names[FX_XLA_PLATFORM_COUNT] = {"Host", "CUDA"};

__attribute__((format(printf, 3, 4))) static void say(char *msg, size_t msglen, const char *fmt, ...)
{
    if (!msg || !msglen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msglen, fmt, ap);
    va_end(ap);
}

/* XLA's message of `err`, which is then destroyed. */
static void take_error(const XLA_FFI_Api *api, XLA_FFI_Error *err, char *out, size_t len)
{
    snprintf(out, len, "no message");
    if (api->XLA_FFI_Error_GetMessage) {
        XLA_FFI_Error_GetMessage_Args get;
        memset(&get, 0, sizeof get);
        get.struct_size = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
        get.error = err;
        api->XLA_FFI_Error_GetMessage(&get);
        if (get.message)
            snprintf(out, len, "%s", get.message);
    }
    if (api->XLA_FFI_Error_Destroy) {
        XLA_FFI_Error_Destroy_Args destroy;
        memset(&destroy, 0, sizeof destroy);
        destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
        destroy.error = err;
        api->XLA_FFI_Error_Destroy(&destroy);
    }
}

static int register_one(const XLA_FFI_Api *api, int op, int platform, char *msg, size_t msglen)
{
    const char *name = fx_xla_target_name(op);
    const char *plat = platform_names[platform];
    XLA_FFI_Handler_Register_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
    args.name = (XLA_FFI_ByteSpan){name, strlen(name)};
    args.platform = (XLA_FFI_ByteSpan){plat, strlen(plat)};
    args.bundle.execute = (XLA_FFI_Handler *)fx_xla_handler(op, platform);
    /* No traits: XLA must not capture the calls into a command buffer
     * (the CUDA handlers take scratch from XLA's allocator per call). */
    args.traits = 0;
    XLA_FFI_Error *err = api->XLA_FFI_Handler_Register(&args);
    if (!err)
        return 0;
    char why[512];
    take_error(api, err, why, sizeof why);
    say(msg, msglen, "XLA refused %s for %s: %s", name, plat, why);
    return -1;
}

#define MAX_APIS 8

static pthread_mutex_t registered_lock = PTHREAD_MUTEX_INITIALIZER;
static const XLA_FFI_Api *registered[MAX_APIS];
static int nregistered;

EXPORT int fusex_xla_register(const void *api_ptr, char *msg, size_t msglen)
{
    const XLA_FFI_Api *api = api_ptr;
    if (!api || !api->XLA_FFI_Handler_Register) {
        say(msg, msglen, "the XLA FFI API table is missing or has no XLA_FFI_Handler_Register");
        return -1;
    }
    if (api->api_version.major_version != XLA_FFI_API_MAJOR) {
        say(msg, msglen, "expected an XLA FFI API of major version %d, got %d", XLA_FFI_API_MAJOR,
            api->api_version.major_version);
        return -1;
    }
    pthread_mutex_lock(&registered_lock);
    int rc = 0;
    for (int i = 0; i < nregistered; i++)
        if (registered[i] == api)
            goto done;
    if (nregistered == MAX_APIS) {
        say(msg, msglen, "fusex registered with %d XLAs already in this process", MAX_APIS);
        rc = -1;
        goto done;
    }
    if (fx_op_xla_count() > FX_XLA_MAX_OPS) {
        say(msg, msglen,
            "fusex describes %d XLA targets, more than the %d its handlers were built for (FX_XLA_MAX_OPS)",
            fx_op_xla_count(), FX_XLA_MAX_OPS);
        rc = -1;
    }
    for (int op = 0; op < fx_op_xla_count() && rc == 0; op++)
        for (int p = 0; p < FX_XLA_PLATFORM_COUNT && rc == 0; p++)
            rc = register_one(api, op, p, msg, msglen);
    if (rc == 0)
        registered[nregistered++] = api;
done:
    pthread_mutex_unlock(&registered_lock);
    if (rc == 0 && msg && msglen)
        msg[0] = '\0';
    return rc;
}

typedef const XLA_FFI_Api *(*get_api_fn)(void);

/* XLA's FFI API table of a loaded library, or NULL (msg says why). */
static const XLA_FFI_Api *loaded_api(const char *library, char *msg, size_t msglen)
{
    void *lib = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
        say(msg, msglen, "%s is not loaded in this process (load EXLA, whose NIF loads it, first)", library);
        return NULL;
    }
    get_api_fn get = (get_api_fn)dlsym(lib, "XLA_FFI_GetApi");
    if (!get)
        get = (get_api_fn)dlsym(lib, "_ZN3xla3ffi12GetXlaFfiApiEv");
    /* The library stays loaded by whoever loaded it; this was a second
     * reference, taken only to look it up. */
    const XLA_FFI_Api *api = get ? get() : NULL;
    dlclose(lib);
    if (!get)
        say(msg, msglen, "%s exports neither XLA_FFI_GetApi nor xla::ffi::GetXlaFfiApi()", library);
    else if (!api)
        say(msg, msglen, "%s returned no XLA FFI API", library);
    return api;
}

EXPORT int fusex_xla_register_loaded(const char *library, char *msg, size_t msglen)
{
    static const char *const exla_libraries[] = {"libxla_extension.so"};
    if (library && *library) {
        const XLA_FFI_Api *api = loaded_api(library, msg, msglen);
        return api ? fusex_xla_register(api, msg, msglen) : -1;
    }
    for (size_t i = 0; i < sizeof exla_libraries / sizeof exla_libraries[0]; i++) {
        const XLA_FFI_Api *api = loaded_api(exla_libraries[i], msg, msglen);
        if (api)
            return fusex_xla_register(api, msg, msglen);
    }
    return -1;
}

static int dtype_of(const char *name, fx_dtype *out)
{
    static const struct {
        const char *numpy, *nx;
        fx_dtype type;
    } names[] = {
        {"float32", "{f,32}", FX_F32},
        {"bfloat16", "{bf,16}", FX_BF16},
        {"float16", "{f,16}", FX_F16},
        {"float64", "{f,64}", FX_F64},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].numpy) == 0 || strcmp(name, names[i].nx) == 0) {
            *out = names[i].type;
            return 1;
        }
    return 0;
}

EXPORT int fusex_xla_ssm_saved_shape(int64_t batch, int64_t seqlen, int64_t dim, int64_t dstate, int64_t groups,
                                     const char *dtype, int64_t out[4], char *msg, size_t msglen)
{
    fx_dtype type;
    if (!dtype_of(dtype, &type)) {
        say(msg, msglen, "x: expected type float32, bfloat16, float16 or float64, got %s", dtype ? dtype : "none");
        return -1;
    }
    fx_ssm_dims n = {.batch = batch, .seqlen = seqlen, .dim = dim, .dstate = dstate, .groups = groups};
    fx_status st = {0};
    if (fx_ssm_check_dims(&n, type, &st)) {
        say(msg, msglen, "%s", st.msg);
        return -1;
    }
    fx_ssm_saved_shape(&n, type, out);
    return 0;
}

EXPORT const char *fusex_xla_cuda_unavailable_reason(void) { return fx_xla_cuda_unavailable_reason(); }

/* ---- the ops, for the front ends ---- */

/* The ops that are XLA targets: the registry's first (core/op.h). */
EXPORT int fusex_xla_op_count(void) { return fx_op_xla_count(); }

/* Each description's JSON, made once and kept for the process. */
static char *descriptions[FX_XLA_MAX_OPS];
static char dtypes_json[256];
static pthread_once_t descriptions_once = PTHREAD_ONCE_INIT;

static void describe_all(void)
{
    for (int i = 0; i < fx_op_xla_count() && i < FX_XLA_MAX_OPS; i++) {
        const fx_op_desc *d = fx_op_at(i);
        size_t len = fx_op_describe_json(d, NULL, 0) + 1;
        descriptions[i] = malloc(len);
        if (descriptions[i])
            fx_op_describe_json(d, descriptions[i], len);
    }
    fx_op_dtypes_json(dtypes_json, sizeof dtypes_json);
}

EXPORT const char *fusex_xla_op_describe(int op)
{
    pthread_once(&descriptions_once, describe_all);
    return op >= 0 && op < fx_op_xla_count() && op < FX_XLA_MAX_OPS ? descriptions[op] : NULL;
}

EXPORT const char *fusex_xla_dtypes_json(void)
{
    pthread_once(&descriptions_once, describe_all);
    return dtypes_json;
}

EXPORT int fusex_xla_op_index(const char *name)
{
    if (!name)
        return -1;
    if (strncmp(name, "fusex_", 6) == 0 && !fx_op_find(name))
        name += 6;
    const fx_op_desc *d = fx_op_find(name);
    return d && !d->no_xla ? fx_op_index(d) : -1;
}

EXPORT void *fusex_xla_op_handler(int op, int platform)
{
    return op >= 0 && op < fx_op_xla_count() ? fx_xla_handler(op, platform) : NULL;
}

EXPORT int fusex_xla_op_check(int op, int platform, const int32_t *present, const int32_t *dtypes,
                              const int32_t *ranks, const int64_t *dims, const double *attrs, int32_t *out_present,
                              int32_t *out_dtypes, int32_t *out_ranks, int64_t *out_dims, char *msg, size_t msglen)
{
    fx_status st;
    fx_status_clear(&st);
    fx_xla_check(op, platform, present, dtypes, ranks, dims, attrs, out_present, out_dtypes, out_ranks, out_dims,
                 &st);
    say(msg, msglen, "%s", st.code ? st.msg : "");
    return st.code;
}
