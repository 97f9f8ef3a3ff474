/* Pointer interop: handing a tensor's memory to another library (EXLA,
 * PyTorch) as a local address or a CUDA IPC handle, and wrapping memory
 * another library owns as a borrowed fusex tensor. The design, and what can
 * and cannot be checked, is in docs/INTEROP.md. */
#ifndef FX_POINTER_H
#define FX_POINTER_H

#include "core/runtime.h"

typedef enum fx_pointer_kind { FX_PTR_LOCAL = 0, FX_PTR_IPC } fx_pointer_kind;

typedef struct fx_pointer {
    fx_pointer_kind kind;
    uintptr_t address;                         /* local: the first byte */
    unsigned char handle[FX_IPC_HANDLE_SIZE];  /* ipc: cudaIpcMemHandle_t */
    int64_t offset;                            /* ipc: bytes from the allocation's base */
    size_t size;                               /* bytes the region holds, when size_known */
    bool size_known;
} fx_pointer;

/* The tensor's memory as a pointer of `kind`. With `sync`, waits for fusex's
 * pending work on the device first, so a foreign reader sees final values.
 * The buffer is marked exported (see fx_buffer_mark_exported). */
int fx_op_to_pointer(const fx_tensor *t, fx_pointer_kind kind, bool sync, fx_pointer *out,
                     fx_status *st);

/* A borrowed tensor over the memory `p` names on `dev`; fusex never frees
 * that memory (an IPC mapping is closed when the tensor goes). With `sync`,
 * the whole device is synchronized before the call returns, so work other
 * libraries of this process queued on other streams is complete before
 * fusex first touches the memory. */
int fx_op_from_pointer(fx_device *dev, const fx_pointer *p, fx_dtype dtype, int rank,
                       const int64_t *dims, bool sync, fx_tensor *out, fx_status *st);

#endif
