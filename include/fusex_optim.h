/*
 * fusex optimizers: multi-tensor AdamW and SGD-momentum steps with global
 * gradient-norm clipping, a skip on non-finite gradients and f32 master
 * weights for 16-bit parameters.
 *
 * One step updates every parameter tensor of a model in place. The op layer
 * (c_src/core/optim.c) describes the tensors as a table of `fx_optim_slot`s
 * that lives in device memory for the life of the optimizer state (it is
 * re-uploaded only when a pointer in it changes), and a flat list of work
 * items: chunk k of the whole step covers FX_OPTIM_CHUNK elements of tensor
 * `chunk_tensor[k]`. A CUDA step is then one launch (the update), or two
 * when clipping or the non-finite check needs the whole gradient first (a
 * norm pass, then the update). Everything a step needs to know about itself
 * (the step count, the clip factor, the skip verdict) stays on the device:
 * a step only enqueues work and never waits for the GPU.
 *
 * The formulas, exactly as torch.optim.AdamW / SGD and
 * torch.nn.utils.clip_grad_norm_ compute them, are in docs/OPTIMIZERS.md.
 *
 * Valid C11 and CUDA C++ (the CUDA backend includes it).
 */
#ifndef FUSEX_OPTIM_H
#define FUSEX_OPTIM_H

#include <stdbool.h>

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per work item (one CUDA block each); a multiple of every vector
 * width, so chunk starts keep a tensor's alignment. */
#define FX_OPTIM_CHUNK 16384
/* The most blocks a pass launches: more chunks than this are shared out by
 * a grid-stride loop. Bounds the per-block partial sums of the norm pass. */
#define FX_OPTIM_MAX_BLOCKS 16384

typedef enum fx_optim_kind { FX_OPTIM_ADAMW = 0, FX_OPTIM_SGD = 1 } fx_optim_kind;

/* A step's hyperparameters, checked by the op layer. */
typedef struct fx_optim_hyper {
    double lr;
    double weight_decay;  /* AdamW: decoupled (p *= 1 - lr*wd); SGD: g += wd*p */
    double beta1, beta2;  /* AdamW */
    double eps;           /* AdamW */
    double momentum;      /* SGD */
    double dampening;     /* SGD */
    double max_grad_norm; /* used when clip */
    bool clip;            /* scale gradients by min(1, max_grad_norm / (norm + 1e-6)) */
    bool skip_nonfinite;  /* an Inf/NaN gradient element makes the step change nothing */
    bool maximize;        /* ascend: the gradient's sign flips */
    bool amsgrad;         /* AdamW: divide by sqrt(max over steps of v) */
    bool nesterov;        /* SGD */
} fx_optim_hyper;

/* One parameter tensor and what the optimizer keeps for it, in the device's
 * memory. Kernels use `param`/`master` to decide the element path; every
 * pointer is the start of a fusex buffer. */
typedef struct fx_optim_slot {
    void *param;          /* updated in place: f32, or bf16/f16 rounded from master */
    const void *grad;     /* f32, bf16 or f16; read only */
    float *master;        /* the f32 master copy of a 16-bit param, else NULL */
    float *buf0;          /* AdamW exp_avg; SGD momentum_buffer (NULL without momentum) */
    float *buf1;          /* AdamW exp_avg_sq, else NULL */
    float *buf2;          /* AdamW max_exp_avg_sq with amsgrad, else NULL */
    int64_t numel;
    int64_t chunk_begin;  /* index of the tensor's first chunk in the work list */
} fx_optim_slot;

/* Device words the passes of one step share. Zero between steps: the last
 * block of each pass resets its counter. */
typedef struct fx_optim_sync {
    uint32_t norm_blocks_done;   /* norm pass: blocks finished (the last one reduces) */
    uint32_t update_blocks_done; /* update pass: blocks finished (the last one counts the step) */
    float clip_factor;           /* the norm pass's verdict for the update pass ... */
    int32_t skip;                /* ... and whether to change nothing */
} fx_optim_sync;

typedef struct fx_optim_args {
    fx_optim_kind kind;
    fx_optim_hyper hyper;
    fx_dtype param_dtype; /* f32, or bf16/f16 (then every slot has a master) */
    fx_dtype grad_dtype;  /* f32, bf16 or f16 */
    uint32_t ntensors;
    int64_t nchunks;      /* 0 when every tensor is empty: the step still counts */
    int64_t blocks;       /* blocks per pass, 1..fx_optim_blocks(nchunks); fewer than
                           * nchunks means each block strides over several chunks */
    /* Whether the norm pass runs: clip or skip_nonfinite. Without it the
     * step reports no norm (grad_norm = -1) and never skips. */
    bool prepass;

    /* The table, as the host built it (the CPU backend reads these) ... */
    const fx_optim_slot *slots;
    const uint32_t *chunk_tensor;
    /* ... and the same bytes in device memory (kernels read these). */
    const fx_optim_slot *dev_slots;
    const uint32_t *dev_chunk_tensor;
    fx_optim_sync *sync;
    double *partial_sq;      /* fx_optim_blocks(nchunks) of them */
    uint32_t *partial_bad;   /* as many: 1 where a block saw Inf/NaN */

    /* The state's scalars, in device memory. */
    int64_t *step;     /* steps taken (not counting skipped ones) */
    float *grad_norm;  /* the last step's global L2 norm of the gradients, -1 if not computed */
    uint8_t *skipped;  /* 1 when the last step was skipped */
} fx_optim_args;

/* The blocks a pass launches for `nchunks` work items (at least one: the
 * last block to finish does the step's bookkeeping). */
static inline int64_t fx_optim_blocks(int64_t nchunks)
{
    return nchunks < 1 ? 1 : nchunks < FX_OPTIM_MAX_BLOCKS ? nchunks : FX_OPTIM_MAX_BLOCKS;
}

struct fx_optim_ops {
    /* One whole step: the norm pass when args->prepass, then the update.
     * Stream-ordered: returns once the work is enqueued. */
    int (*step)(const fx_exec *ex, const fx_optim_args *args, fx_status *st);
};

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_OPTIM_H */
