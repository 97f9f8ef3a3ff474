// The entry points each CUDA source file exports into the backend table
// (backend.cu): the slots of fx_backend, under their slot names.
#ifndef FX_CUDA_FAMILIES_H
#define FX_CUDA_FAMILIES_H

#include "fusex.h"
#include "fusex_exec.h"

namespace fx::cuda {

// elementwise.cu
int cast(const fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st);
int binary(const fx_exec *ex, fx_binop op, const fx_tensor *a, const fx_tensor *b,
           const fx_tensor *out, fx_status *st);
int scale(const fx_exec *ex, const fx_tensor *src, double factor, const fx_tensor *dst,
          fx_status *st);

// interop.cu (pointer interop, see docs/INTEROP.md)
int alloc_exportable(int dev, size_t nbytes, void **ptr, fx_status *st);
void release_exportable(int dev, void *ptr);
int ipc_export(int dev, void *ptr, unsigned char handle[FX_IPC_HANDLE_SIZE],
               fx_status *st);
int ipc_open(int dev, const unsigned char handle[FX_IPC_HANDLE_SIZE], void **ptr,
             size_t *nbytes, fx_status *st);
void ipc_close(int dev, void *ptr);
int device_synchronize(int dev, fx_status *st);
int pointer_check(int dev, const void *ptr, size_t nbytes, fx_status *st);

// ssm.cu
extern const struct fx_ssm_ops ssm_ops;
// linrec.cu
extern const struct fx_linrec_ops linrec_ops;
// optim.cu
extern const struct fx_optim_ops optim_ops;
// linear.cu
extern const struct fx_linear_ops linear_ops;
// norm.cu
extern const struct fx_norm_ops norm_ops;
// conv.cu
extern const struct fx_conv_ops conv_ops;
// rnn.cu
extern const struct fx_rnn_ops rnn_ops;
// loss.cu
extern const struct fx_loss_ops loss_ops;

} // namespace fx::cuda

#endif
