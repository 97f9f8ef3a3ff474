/*
 * The XLA custom-call layer (docs/XLA.md): what the FFI binding
 * (handlers.cc, C++: XLA's ffi.h is a C++ header) hands to the C side
 * (targets.c: the one binder over the op layer's descriptions, core/op.h;
 * platform.c: devices and launch contexts). The binding only copies XLA's
 * call frame into these plain structs; every check and every message is
 * made on the C side, most of them by the op layer itself.
 *
 * Valid C11 and C++.
 */
#ifndef FX_XLA_H
#define FX_XLA_H

#include <stddef.h>
#include <stdint.h>

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The handlers are made by index into the op layer's registry
 * (core/op.h: fx_op_at), up to this many; registration refuses a registry
 * that outgrew it. */
#define FX_XLA_MAX_OPS 64

/* XLA's platform names: "Host" (the CPU backend) and "CUDA". */
typedef enum fx_xla_platform { FX_XLA_HOST = 0, FX_XLA_CUDA = 1, FX_XLA_PLATFORM_COUNT } fx_xla_platform;

/* The most operands, results and attributes a call may pass: those of
 * the op layer's descriptions (FX_OP_MAX_IO, FX_OP_MAX_ATTRS). */
#define FX_XLA_MAX_BUFFERS 64
#define FX_XLA_MAX_ATTRS 16

/* An operand or result as XLA passes it: `type` is XLA_FFI_DataType. */
typedef struct fx_xla_buffer {
    void *data;
    int type;
    int64_t rank;
    const int64_t *dims;
} fx_xla_buffer;

typedef enum fx_xla_attr_kind {
    FX_XLA_ATTR_INT = 0, /* any integer or boolean scalar: `i` */
    FX_XLA_ATTR_FLOAT,   /* f32 or f64 scalar: `f` */
    FX_XLA_ATTR_OTHER    /* anything else: `what` says what */
} fx_xla_attr_kind;

typedef struct fx_xla_attr {
    const char *name; /* not NUL-terminated */
    size_t name_len;
    int kind; /* fx_xla_attr_kind */
    int64_t i;
    double f;
    const char *what; /* "an i64", "an f32", "a string", ... */
} fx_xla_attr;

typedef struct fx_xla_call {
    int op;       /* the description's index (fx_op_at) */
    int platform; /* fx_xla_platform */
    int device;   /* CUDA: XLA's device ordinal; Host: 0 */
    void *stream; /* CUDA: XLA's stream (a cudaStream_t); Host: NULL */
    /* CUDA: XLA's scratch allocator (what it hands out is reclaimed when
     * the handler returns, ordered on the stream); Host: unused. */
    fx_scratch scratch;
    int nargs, nrets, nattrs; /* at most FX_XLA_MAX_BUFFERS / _ATTRS */
    const fx_xla_buffer *args, *rets;
    const fx_xla_attr *attrs;
} fx_xla_call;

/* Runs one call of an op. On failure st holds the code (FX_EBADARG for
 * bad operands, results or attributes) and a message that starts with the
 * target's name, then names the argument, what was expected and what came. */
int fx_xla_run(const fx_xla_call *call, fx_status *st);

/* "fusex_" + the description's name; NULL past the last op. */
const char *fx_xla_target_name(int op);

/* The check entry (fusex_xla_op_check, include/fusex_xla.h): op `op`'s
 * check on shapes and types alone, for XLA's platform `platform`. */
int fx_xla_check(int op, int platform, const int32_t *present, const int32_t *dtypes, const int32_t *ranks,
                 const int64_t *dims, const double *attrs, int32_t *out_present, int32_t *out_dtypes,
                 int32_t *out_ranks, int64_t *out_dims, fx_status *st);

/* ---- handlers.cc ---- */

/* Op `op`'s handler for `platform` (fx_xla_platform); NULL past
 * FX_XLA_MAX_OPS or the platforms. */
void *fx_xla_handler(int op, int platform);

/* ---- platform.c ---- */

/* The device record of a call's platform and device, and its launch
 * context: the CPU backend's own (host scratch) on Host; XLA's stream and
 * scratch on CUDA, whose backend (priv/fusex_cuda.so) is loaded at the
 * first CUDA call. Fails with the reason when CUDA cannot be used. */
struct fx_device;
int fx_xla_device(const fx_xla_call *call, struct fx_device **dev, fx_exec *ex, fx_status *st);

/* NULL when the CUDA backend loaded and found a device; else why not
 * (loading it first if no CUDA call did yet). */
const char *fx_xla_cuda_unavailable_reason(void);

#ifdef __cplusplus
}
#endif

#endif /* FX_XLA_H */
