/*
 * fusex linear recurrences: the generic scan h_t = a_t * h_{t-1} + b_t and
 * the gated layers whose step is that scan with coefficients computed
 * elementwise from the inputs (MinGRU, MinLSTM, Liquid/LTC).
 *
 * The op layer (c_src/core/linrec.c) fills these structs after checking
 * every tensor; the CPU (c_src/cpu/linrec.c) and CUDA (c_src/cuda/linrec.cu)
 * backends take them as they are.
 *
 * Layout: sequences are [batch, seqlen, hidden] row-major; states, h0 and
 * step frames [batch, hidden]; liquid's tau and a [hidden]; liquid's dt a
 * scalar or a tensor [batch, seqlen, 1] ([batch, 1] for a step).
 *
 * Per step, with x the step's inputs:
 *   scan     a = x_a                  b = x_b
 *   mingru   z = sigmoid(zl)          a = 1 - z            b = z * c~
 *   minlstm  f' = f/(f+i), i' = i/(f+i) with f = sigmoid(fl), i = sigmoid(il)
 *            a = f'                   b = i' * c~
 *   liquid   f = sigmoid(fl), den = 1 + dt*(1/tau + f)
 *            a = 1/den                b = dt*f*A/den
 * where c~ = cand, or g(cand) when candidate_g (g(x) = x + 1/2 for x >= 0,
 * sigmoid(x) otherwise). `reverse` scans from the end: the step at time t
 * follows the one at t+1 and the final state is the one after t = 0.
 *
 * State dtype: f32 for f32/bf16/f16 sequences, f64 for f64 ones. h0, a
 * step's state and the backward's dstate may be of the sequence dtype or
 * of the state dtype; dh0 comes back in h0's dtype.
 */
#ifndef FUSEX_LINREC_H
#define FUSEX_LINREC_H

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_linrec_kind {
    FX_LINREC_SCAN = 0, /* seq: a, b */
    FX_LINREC_MINGRU,   /* seq: z_logits, cand */
    FX_LINREC_MINLSTM,  /* seq: f_logits, i_logits, cand */
    FX_LINREC_LIQUID,   /* seq: f_logits; tau, a [hidden]; dt */
    FX_LINREC_KIND_COUNT
} fx_linrec_kind;

#define FX_LINREC_MAX_SEQ 3

/* What a forward, backward or step computes, and on what. */
typedef struct fx_linrec_problem {
    int kind; /* fx_linrec_kind */
    int64_t batch, seqlen, hidden;
    fx_dtype dtype; /* every input below and every sequence output */
    int nseq;       /* sequence inputs used by `kind` (2, 2, 3, 1) */
    const fx_tensor *seq[FX_LINREC_MAX_SEQ];
    const fx_tensor *tau;   /* liquid: [hidden] */
    const fx_tensor *lam;   /* liquid: A, [hidden] */
    const fx_tensor *dt;    /* liquid: [batch, seqlen, 1], or NULL: dt_value */
    double dt_value;        /* liquid, when dt is NULL */
    int candidate_g;        /* mingru, minlstm: c~ = g(cand) */
    int reverse;
} fx_linrec_problem;

typedef struct fx_linrec_fwd_args {
    fx_linrec_problem p;
    const fx_tensor *h0;    /* [batch, hidden] or NULL (zeros) */
    const fx_tensor *h;     /* out: [batch, seqlen, hidden], p.dtype */
    const fx_tensor *state; /* out: [batch, hidden], state dtype, or NULL */
    /* 0: the backend picks its tiling. > 0: tests force time tiles of at
     * most this many steps, to drive CUDA's multi-tile path on small
     * inputs. FX_LINREC_TILES_STREAM: tests force CUDA's streaming kernel
     * (a warp per column of channels) where its layout allows;
     * FX_LINREC_TILES_NO_STREAM: the tiled kernels as the backend picks
     * them, never the streaming one (benchmarks compare the two). The CPU
     * ignores it. The backward's max_tile_steps means the same. */
    int max_tile_steps;
} fx_linrec_fwd_args;

#define FX_LINREC_TILES_STREAM (-1)
#define FX_LINREC_TILES_NO_STREAM (-2)

typedef struct fx_linrec_bwd_args {
    fx_linrec_problem p;
    const fx_tensor *h0;     /* as given to the forward, or NULL */
    const fx_tensor *h;      /* the forward's output */
    const fx_tensor *dh;     /* [batch, seqlen, hidden], p.dtype */
    const fx_tensor *dstate; /* [batch, hidden] or NULL (zeros) */
    /* Outputs, each shaped and typed as its input; NULL where that input
     * was not given (dh0 without h0, ddt without a dt tensor). */
    const fx_tensor *dseq[FX_LINREC_MAX_SEQ];
    const fx_tensor *dtau, *dlam, *ddt, *dh0;
    int max_tile_steps;
} fx_linrec_bwd_args;

/* One frame: p.seqlen is 1, p.seq are [batch, hidden] and p.dt [batch, 1].
 * state is read as h_{t-1} and overwritten with h_t. */
typedef struct fx_linrec_step_args {
    fx_linrec_problem p;
    const fx_tensor *state; /* in/out: [batch, hidden] */
    const fx_tensor *h;     /* out: [batch, hidden], p.dtype */
} fx_linrec_step_args;

struct fx_linrec_ops {
    int (*forward)(const fx_exec *ex, const fx_linrec_fwd_args *args, fx_status *st);
    int (*backward)(const fx_exec *ex, const fx_linrec_bwd_args *args, fx_status *st);
    /* Needs no scratch. */
    int (*step)(const fx_exec *ex, const fx_linrec_step_args *args, fx_status *st);
    /* The most scratch bytes forward and backward ask of `ex` for these
     * arguments, from shapes, types, options and the device alone
     * (addresses may make them ask less, never more); SIZE_MAX when that
     * does not fit a size_t. */
    size_t (*forward_scratch)(const fx_exec *ex, const fx_linrec_fwd_args *args);
    size_t (*backward_scratch)(const fx_exec *ex, const fx_linrec_bwd_args *args);
};

/* The dtype of states for sequences of `dtype`. */
static inline fx_dtype fx_linrec_state_dtype(fx_dtype dtype)
{
    return dtype == FX_F64 ? FX_F64 : FX_F32;
}

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_LINREC_H */
