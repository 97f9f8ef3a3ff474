/* The op layer for the optimizers: an optimizer state (moments, master
 * copies, the device step count, the device table of tensor pointers) and
 * the step that checks its inputs and hands one table to the backend.
 *
 * The state owns a reference to every buffer it uses, so the table it keeps
 * on the device stays valid however the caller's handles to the same
 * memory come and go. A step only rebuilds the table on the host, compares
 * it with what the device holds and uploads it when a pointer changed (new
 * gradient tensors, other parameter tensors of the same shapes). */
#ifndef FX_CORE_OPTIM_H
#define FX_CORE_OPTIM_H

#include <pthread.h>

#include "core/runtime.h"
#include "fusex_optim.h"

typedef struct fx_optim_state {
    fx_optim_kind kind;
    fx_device *device;
    fx_dtype param_dtype;   /* f32, or bf16/f16 with master copies */
    bool master;            /* 16-bit params: master[i] is the f32 truth */
    bool amsgrad;           /* AdamW: buf2 (max_exp_avg_sq) exists */
    bool momentum;          /* SGD: buf0 (momentum_buffer) exists */
    fx_optim_hyper defaults; /* the init options: each step starts from these */
    uint32_t n;             /* parameter tensors */
    int64_t nchunks;
    int64_t max_blocks;     /* FX_OPTIM_MAX_BLOCKS; tests lower it to exercise striding */

    fx_tensor *shapes;      /* params' rank and dims at init (no buffers) */
    /* Per tensor, each array n long; unused ones hold zeroed tensors. */
    fx_tensor *master_t;    /* f32 master copies */
    fx_tensor *buf0;        /* AdamW exp_avg | SGD momentum_buffer */
    fx_tensor *buf1;        /* AdamW exp_avg_sq */
    fx_tensor *buf2;        /* AdamW max_exp_avg_sq (amsgrad) */
    fx_tensor step;         /* {s,64} {}: steps taken */
    fx_tensor grad_norm;    /* {f,32} {}: the last norm, -1 when not computed */
    fx_tensor skipped;      /* {u,8} {}: 1 when the last step was skipped */

    /* One device buffer: slots | chunk_tensor | sync | partial_sq | partial_bad. */
    fx_tensor table;
    size_t off_chunks, off_sync, off_partial_sq, off_partial_bad;

    pthread_mutex_t lock;   /* one step at a time: the slot cache and the table */
    fx_optim_slot *host_slots; /* what the device table holds, when slots_valid */
    fx_optim_slot *next_slots; /* the step being built */
    bool slots_valid;
    /* The byte ranges a step writes (the params of host_slots and the
     * state's own tensors) sorted by address, for the aliasing checks of a
     * table that changed: a training loop's new gradients every step do
     * not re-sort unchanged params. Valid with slots_valid. */
    struct fx_ptr_index *sorted_written;
    size_t nwritten;
    uint32_t *chunk_tensor; /* host copy of the work list */
} fx_optim_state;

/* The options fixed at init, with each step's defaults. */
typedef struct fx_optim_config {
    fx_optim_hyper defaults;
    bool master_weights;
} fx_optim_config;

/* Torch's defaults: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 1e-2; SGD lr 1e-3, no momentum, no weight decay. */
fx_optim_hyper fx_optim_default_hyper(fx_optim_kind kind);

/* Names the hyperparameter that is out of range. */
int fx_optim_check_hyper(fx_optim_kind kind, const fx_optim_hyper *h, fx_status *st);

/* A new state for `params` (n >= 1, one device, one dtype). Allocates the
 * moments (zeroed f32), master copies (f32 casts of the params) when
 * cfg->master_weights and the params are 16-bit, and the device table. */
int fx_op_optim_init(fx_optim_kind kind, const fx_tensor *params, unsigned n,
                     const fx_optim_config *cfg, fx_optim_state **out, fx_status *st);

/* One step over params/grads (the lists given at init: same count, shapes
 * and dtype; grads of one float type). Enqueues the work and returns. */
int fx_op_optim_step(fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                     unsigned nparams, const fx_tensor *grads, unsigned ngrads,
                     const fx_optim_hyper *h, fx_status *st);
/* The same step's kernels on the launch context `ex` (a caller's stream).
 * A state's steps must still follow one another: its sums and counters
 * live in the state, so two streams must not step one state at once (after
 * steps on another stream, the caller waits for it first). A changed
 * parameter table (new parameter or gradient tensors) goes up on fusex's
 * own stream once `ex`'s stream has finished the steps reading the old
 * one, and the step waits for the upload. */
int fx_op_optim_step_on(const fx_exec *ex, fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                        unsigned nparams, const fx_tensor *grads, unsigned ngrads, const fx_optim_hyper *h,
                        fx_status *st);
/* The same step for a caller that must not wait (a normal scheduler): with
 * the same checks and errors, but where the step would wait (the state in
 * use by another call, a changed table whose upload must wait for a
 * staging slot, a device whose backend cannot upload without waiting) it
 * enqueues nothing and leaves *done false: the caller then makes the
 * blocking call. */
int fx_op_optim_try_step(fx_optim_state *s, fx_optim_kind kind, const fx_tensor *params,
                         unsigned nparams, const fx_tensor *grads, unsigned ngrads,
                         const fx_optim_hyper *h, bool *done, fx_status *st);

/* What the last step left on the device, read from the state's own
 * tensors (waits for the queued work). grad_norm is negative when the
 * step computed none. */
typedef struct fx_optim_info {
    int64_t step;
    float grad_norm;
    bool skipped;
} fx_optim_info;
int fx_op_optim_info(fx_optim_state *s, fx_optim_info *out, fx_status *st);

/* Drops the state's references (its memory goes when no handle shares it). */
void fx_optim_state_free(fx_optim_state *s);

const char *fx_optim_kind_name(fx_optim_kind kind); /* "AdamW", "SGD" */
const char *fx_optim_init_name(fx_optim_kind kind); /* "adamw_init", "sgd_init" */

#endif
