/*
 * The causal depthwise convolution over time (a Mamba block's conv1d):
 * argument structs and the ops table a backend fills. Channels last, as
 * fusex's scans:
 *
 *   x, y            [batch, seqlen, dim]
 *   w               [dim, width]          width 1 to FX_CONV_MAX_WIDTH
 *   bias            [dim]                 optional
 *   initial_state   [batch, dim, width-1] the width-1 inputs before the first, oldest first
 *   final_state     [batch, dim, width-1] the last width-1 inputs, oldest first
 *
 *   y_t[d] = act(bias[d] + sum_k w[d, k] * x_{t-(width-1)+k}[d])
 *
 * so w[:, width-1] multiplies the current input (causal-conv1d's and a
 * left-padded PyTorch conv1d's convention); x_t for t < 0 is the initial
 * state's (zeros without one), so the final state of a short sequence
 * (seqlen < width-1) still holds some of the initial state. act is none or
 * silu.
 *
 * The backward gives dx, dw, dbias and the initial state's gradient from
 * dy and, optionally, the final state's gradient; dw and dbias are summed
 * over batch and time in an order fixed by the shapes (deterministic: no
 * float atomics). The step takes one input per sequence and updates a
 * state [batch, dim, width-1] in place (the oldest input leaves, x enters).
 *
 * Types: x, y, dy, dx and every state and state gradient share one type
 * (f32, bf16, f16; f64 on the CPU); w and bias any float type, their
 * gradients their type. Sums are f32 on CUDA (f64 on the CPU).
 */
#ifndef FUSEX_CONV_H
#define FUSEX_CONV_H

#include <stdbool.h>

#include "fusex.h"
#include "fusex_activation.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FX_CONV_MAX_WIDTH 16

typedef struct fx_conv_dims {
    int64_t batch, seqlen, dim, width;
} fx_conv_dims;

typedef struct fx_conv_fwd_args {
    fx_conv_dims n;
    const fx_tensor *x, *w;
    const fx_tensor *bias, *initial_state; /* NULL when not given */
    int activation;                        /* FX_ACT_NONE or FX_ACT_SILU */
    const fx_tensor *y;                    /* out */
    const fx_tensor *final_state;          /* out, or NULL */
} fx_conv_fwd_args;

typedef struct fx_conv_bwd_args {
    fx_conv_fwd_args fwd; /* the forward's inputs (y and final_state NULL) */
    const fx_tensor *dy;
    const fx_tensor *dfinal_state; /* NULL when not given */
    const fx_tensor *dx, *dw;      /* out */
    const fx_tensor *dbias, *dinitial_state; /* out, where bias and initial_state were given */
} fx_conv_bwd_args;

typedef struct fx_conv_step_args {
    fx_conv_dims n;         /* seqlen 1 */
    const fx_tensor *state; /* [batch, dim, width-1], read and written in place */
    const fx_tensor *x;     /* [batch, dim] */
    const fx_tensor *w, *bias;
    int activation;
    const fx_tensor *y;     /* out [batch, dim] */
} fx_conv_step_args;

struct fx_conv_ops {
    int (*forward)(const fx_exec *ex, const fx_conv_fwd_args *args, fx_status *st);
    int (*backward)(const fx_exec *ex, const fx_conv_bwd_args *args, fx_status *st);
    /* Needs no scratch. */
    int (*step)(const fx_exec *ex, const fx_conv_step_args *args, fx_status *st);
    /* The most scratch bytes forward and backward ask of `ex`, from the
     * shapes, types and options alone; SIZE_MAX where that overflows. */
    size_t (*forward_scratch)(const fx_exec *ex, const fx_conv_fwd_args *args);
    size_t (*backward_scratch)(const fx_exec *ex, const fx_conv_bwd_args *args);
};

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_CONV_H */
