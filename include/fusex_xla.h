/*
 * priv/fusex_xla.so, fusex's XLA custom-call targets (docs/XLA.md): the C
 * functions it exports, nothing else. Its ops are the op layer's
 * descriptions (c_src/core/op.h), by index from 0 to fusex_xla_op_count()
 * - 1: the target of op i is "fusex_" + its name, its handlers come from
 * fusex_xla_op_handler. Needs no XLA header: the XLA_FFI_Api is passed as
 * `const void *`, a handler returned as `void *` (an XLA_FFI_Handler *).
 * Plain C types throughout, for ctypes.
 *
 * Registration and the helpers return 0 on success and -1 on failure,
 * with the reason in `msg` (NUL-terminated, cut to `msglen` bytes).
 */
#ifndef FUSEX_XLA_H
#define FUSEX_XLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Registers every op's target for the platforms "Host" and "CUDA" with the XLA
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

/* ---- the ops' descriptions, for the front ends (fusex_jax) ---- */

/* How many ops there are. */
int fusex_xla_op_count(void);
/* Op `op`'s description as one JSON object (fx_op_describe_json in
 * c_src/core/op.h gives the format: name, target, attrs, inputs, results
 * in the binder's order, their roles and presence, the public options),
 * kept in static storage for the process; NULL past the last op. */
const char *fusex_xla_op_describe(int op);
/* The element type codes that dtypes, out_dtypes and the descriptions
 * use, as a JSON list indexed by code: ["f32", "f64", "bf16", "f16",
 * "s32", "s64", "u8"]. Static storage. */
const char *fusex_xla_dtypes_json(void);
/* The index of the op named `name` ("<op>_fwd", or its target
 * "fusex_<op>_fwd"), or -1. */
int fusex_xla_op_index(const char *name);
/* Op `op`'s XLA_FFI_Handler for `platform` (0: Host, 1: CUDA), for
 * jax.ffi.register_ffi_target; NULL past the last op or platform. */
void *fusex_xla_op_handler(int op, int platform);

/* The op layer's check of a call of op `op` on shapes and types alone, on
 * `platform` (0: Host; 1: CUDA, whose limits it applies: it loads the CUDA
 * backend, and fails saying why where there is none), for a front end
 * that sizes results or refuses bad input before it runs anything:
 *   present[i], dtypes[i], ranks[i], dims[i * 8 .. i * 8 + ranks[i]):
 *       input i of the description (ninputs entries; dims 8 per input);
 *       dtypes by fusex_xla_dtypes_json's codes;
 *   attrs[a]: attribute a in the description's order (flags 0 or 1).
 *       Presence attributes (role "presence": has_h0, ...) are computed
 *       from `present`, whatever attrs holds for them;
 *   out_present[r], out_dtypes[r], out_ranks[r], out_dims[r * 8 ..]:
 *       result r (nresults entries; out_dtypes -1 and out_ranks 0 where
 *       absent).
 * Returns 0, or the fx_code (1: bad argument; see include/fusex.h) with
 * the op layer's own message in `msg`, without the target's name (the
 * handler's message is the target's name, ": " and this). */
int fusex_xla_op_check(int op, int platform, const int32_t *present, const int32_t *dtypes, const int32_t *ranks,
                       const int64_t *dims, const double *attrs, int32_t *out_present, int32_t *out_dtypes,
                       int32_t *out_ranks, int64_t *out_dims, char *msg, size_t msglen);

typedef int (*fusex_xla_register_loaded_fn)(const char *library, char *msg, size_t msglen);
#define FUSEX_XLA_REGISTER_LOADED_SYMBOL "fusex_xla_register_loaded"

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_XLA_H */
