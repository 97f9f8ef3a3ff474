// The entry points each CUDA kernel family file exports into the backend
// table (backend.cu).
#ifndef FX_CUDA_FAMILIES_H
#define FX_CUDA_FAMILIES_H

#include "fusex.h"
#include "fusex_exec.h"

// elementwise.cu
int fx_cuda_cast(const fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st);
int fx_cuda_binary(const fx_exec *ex, fx_binop op, const fx_tensor *a, const fx_tensor *b,
                   const fx_tensor *out, fx_status *st);
int fx_cuda_scale(const fx_exec *ex, const fx_tensor *src, double factor, const fx_tensor *dst,
                  fx_status *st);

// interop.cu (pointer interop, see docs/INTEROP.md)
int fx_cuda_alloc_exportable(int dev, size_t nbytes, void **ptr, fx_status *st);
void fx_cuda_release_exportable(int dev, void *ptr);
int fx_cuda_ipc_export(int dev, void *ptr, unsigned char handle[FX_IPC_HANDLE_SIZE],
                       fx_status *st);
int fx_cuda_ipc_open(int dev, const unsigned char handle[FX_IPC_HANDLE_SIZE], void **ptr,
                     size_t *nbytes, fx_status *st);
void fx_cuda_ipc_close(int dev, void *ptr);
int fx_cuda_device_synchronize(int dev, fx_status *st);
int fx_cuda_pointer_check(int dev, const void *ptr, size_t nbytes, fx_status *st);

// ssm.cu
extern const struct fx_ssm_ops fx_cuda_ssm_ops;
// linrec.cu
extern const struct fx_linrec_ops fx_cuda_linrec_ops;
// optim.cu
extern const struct fx_optim_ops fx_cuda_optim_ops;

#endif
