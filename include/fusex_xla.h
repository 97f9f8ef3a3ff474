/*
 * priv/fusex_xla.so, fusex's XLA custom-call targets (docs/XLA.md): the C
 * functions it exports besides its thirty handler symbols
 * (`fusex_<op>_<dir>_host` and `fusex_<op>_<dir>_cuda`, each an
 * XLA_FFI_Handler). Needs no XLA header: the XLA_FFI_Api is passed as
 * `const void *`.
 *
 * Every function that can fail returns 0 on success and -1 on failure,
 * with the reason in `msg` (NUL-terminated, cut to `msglen` bytes).
 */
#ifndef FUSEX_XLA_H
#define FUSEX_XLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Registers every target for the platforms "Host" and "CUDA" with the XLA
 * whose FFI API table (`const XLA_FFI_Api *`) is `api`. Registering again
 * with the same table does nothing. Thread-safe. */
int fusex_xla_register(const void *api, char *msg, size_t msglen);

/* Finds an XLA already loaded in this process and registers with it: the
 * library `library` (a path or a soname), or, when NULL, the libraries
 * EXLA loads (libxla_extension.so). Its FFI API comes from its exported
 * `XLA_FFI_GetApi` or `xla::ffi::GetXlaFfiApi()`. The library is looked
 * up with RTLD_NOLOAD, never loaded: an XLA that nothing in the process
 * uses would be of no use. */
int fusex_xla_register_loaded(const char *library, char *msg, size_t msglen);

/* The selective scan's saved states, [batch, nsaved, dim, dstate]
 * (fx_ssm_saved_shape: the one rule), for inputs of type `dtype` ("float32",
 * "bfloat16", "float16", "float64", or Nx's "{f,32}", ...). Returns 0, or
 * -1 with the reason in `msg` for an unknown type or sizes no scan has
 * (fx_ssm_check_dims: a negative size, dstate 0, groups 0 or not dividing
 * dim, counts past 2^48), where `out` is left as it was. */
int fusex_xla_ssm_saved_shape(int64_t batch, int64_t seqlen, int64_t dim, int64_t dstate, int64_t groups,
                              const char *dtype, int64_t out[4], char *msg, size_t msglen);

/* NULL when the CUDA handlers can run (priv/fusex_cuda.so loaded and found
 * a GPU); otherwise why not. Loads the CUDA backend if nothing did yet. */
const char *fusex_xla_cuda_unavailable_reason(void);

typedef int (*fusex_xla_register_loaded_fn)(const char *library, char *msg, size_t msglen);
#define FUSEX_XLA_REGISTER_LOADED_SYMBOL "fusex_xla_register_loaded"

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_XLA_H */
