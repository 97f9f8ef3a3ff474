/*
 * The XLA custom-call layer (docs/XLA.md): what the FFI binding
 * (handlers.cc, C++: XLA's ffi.h is a C++ header) hands to the C side
 * (targets.c: operand lists, attributes, the op layer's `_into` ops;
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

/* The fifteen targets, in docs/XLA.md's order. */
typedef enum fx_xla_target {
    FX_XLA_SELECTIVE_SCAN_FWD = 0,
    FX_XLA_SELECTIVE_SCAN_BWD,
    FX_XLA_SELECTIVE_SCAN_STEP,
    FX_XLA_LINEAR_SCAN_FWD,
    FX_XLA_LINEAR_SCAN_BWD,
    FX_XLA_LINEAR_SCAN_STEP,
    FX_XLA_MINGRU_FWD,
    FX_XLA_MINGRU_BWD,
    FX_XLA_MINGRU_STEP,
    FX_XLA_MINLSTM_FWD,
    FX_XLA_MINLSTM_BWD,
    FX_XLA_MINLSTM_STEP,
    FX_XLA_LIQUID_FWD,
    FX_XLA_LIQUID_BWD,
    FX_XLA_LIQUID_STEP,
    FX_XLA_TARGET_COUNT
} fx_xla_target;

/* XLA's platform names: "Host" (the CPU backend) and "CUDA". */
typedef enum fx_xla_platform { FX_XLA_HOST = 0, FX_XLA_CUDA = 1, FX_XLA_PLATFORM_COUNT } fx_xla_platform;

/* The most operands, results and attributes a target takes (the selective
 * scan's backward: 12 operands, 9 results; 7 attributes), with room. */
#define FX_XLA_MAX_BUFFERS 16
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
    int target;   /* fx_xla_target */
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

/* Runs one call of a target. On failure st holds the code (FX_EBADARG for
 * bad operands, results or attributes) and a message that starts with the
 * target's name, then names the argument, what was expected and what came. */
int fx_xla_run(const fx_xla_call *call, fx_status *st);

/* "fusex_selective_scan_fwd", ...; NULL past the last target. */
const char *fx_xla_target_name(int target);

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
