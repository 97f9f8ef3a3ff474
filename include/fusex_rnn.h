/*
 * Classic GRU and LSTM layers, stacked: argument structs and the ops table
 * a backend fills. The semantics are PyTorch's nn.GRU / nn.LSTM with
 * batch_first=True, exactly. Row-major, per layer l (G = 3 for the GRU, 4
 * for the LSTM; I_0 the input size, I_l = hidden above layer 0):
 *
 *   x              [batch, seqlen, input]
 *   w_ih           [G*hidden, I_l]        w_hh  [G*hidden, hidden]
 *   b_ih, b_hh     [G*hidden]             (absent: zeros)
 *   h0, c0         [layers, batch, hidden] (absent: zeros; c0 LSTM only)
 *   y              [batch, seqlen, hidden] (the last layer's h_t)
 *   h_n, c_n       [layers, batch, hidden]
 *
 * with ax = W_ih x_t + b_ih and ah = W_hh h_{t-1} + b_hh split in gate
 * blocks of `hidden` rows:
 *
 *   GRU   r = sigmoid(ax_r + ah_r)   z = sigmoid(ax_z + ah_z)
 *         n = tanh(ax_n + r * ah_n)  h_t = (1 - z) * n + z * h_{t-1}
 *   LSTM  i = sigmoid(ax_i + ah_i)   f = sigmoid(ax_f + ah_f)
 *         g = tanh(ax_g + ah_g)      o = sigmoid(ax_o + ah_o)
 *         c_t = f * c_{t-1} + i * g  h_t = o * tanh(c_t)
 *
 * Layer l > 0 reads layer l - 1's h_t as its x_t.
 *
 * Types. x, y, dy, dx and every layer's w_ih and w_hh share one type: f32,
 * bf16 or f16 (f64 too on the CPU); the products accumulate in f32 (f64 on
 * the CPU). Weights kept in f32 for a 16-bit model are cast to its type
 * first (as autocast does): one GEMM type per product. b_ih, b_hh, h0, c0
 * and the final states' gradients may each be any float type the device
 * supports (read once per gate); every gradient has its input's type. The
 * states (h_n, c_n, a step's h and c, the saved values) are f32, or f64
 * when x is f64.
 *
 * The op layer (c_src/core/rnn.c) has checked every shape, type and device
 * before a backend sees these structs; absent tensors are NULL; batch,
 * seqlen and hidden are at least 1 there (an empty problem never reaches a
 * backend).
 */
#ifndef FUSEX_RNN_H
#define FUSEX_RNN_H

#include <stdbool.h>

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_rnn_cell { FX_RNN_GRU = 0, FX_RNN_LSTM, FX_RNN_CELL_COUNT } fx_rnn_cell;

/* Gate blocks of a cell: 3 (r, z, n) or 4 (i, f, g, o). */
static inline int fx_rnn_gates(int cell) { return cell == FX_RNN_LSTM ? 4 : 3; }

typedef struct fx_rnn_dims {
    int cell; /* fx_rnn_cell */
    int64_t layers, batch, seqlen, input, hidden;
} fx_rnn_dims;

/* One layer's parameters. */
typedef struct fx_rnn_layer {
    const fx_tensor *w_ih, *w_hh; /* [G*hidden, I_l], [G*hidden, hidden] */
    const fx_tensor *b_ih, *b_hh; /* [G*hidden], or NULL */
} fx_rnn_layer;

/* One layer's parameter gradients, each its parameter's shape and type;
 * NULL for an absent bias. */
typedef struct fx_rnn_layer_grads {
    const fx_tensor *dw_ih, *dw_hh, *db_ih, *db_hh;
} fx_rnn_layer_grads;

/*
 * What a training forward keeps for its backward: one tensor of the state
 * type, [layers, batch, seqlen, fx_rnn_saved_width(cell, hidden)], from the
 * shapes alone. Row (l, b, t) holds, in blocks of `hidden`:
 *
 *   GRU   r, z, n, W_hn h_{t-1} + b_hn, h_t           (5 * hidden)
 *   LSTM  i, f, g, o, c_t, h_t                        (6 * hidden)
 *
 * (the gates after their nonlinearity). The backward reads these and the
 * forward's inputs, and recomputes nothing step by step.
 */
static inline int64_t fx_rnn_saved_width(int cell, int64_t hidden)
{
    return (cell == FX_RNN_LSTM ? 6 : 5) * hidden;
}

/* Which kernels a CUDA launch takes (the tests force each; the CPU ignores
 * it). AUTO picks by shape and device. A forced path that the shape or the
 * device cannot take fails with a badarg naming "path". */
enum {
    FX_RNN_PATH_AUTO = 0,
    /* per time step: a GEMM h_{t-1} W_hh^T and a gate kernel (any hidden) */
    FX_RNN_PATH_STEPWISE = 1,
    /* the persistent kernel: w_hh on chip, one grid barrier a step,
     * products on the CUDA cores (f32 accumulation) */
    FX_RNN_PATH_PERSISTENT = 2,
    /* the persistent kernel with tensor-core products (bf16, f16) */
    FX_RNN_PATH_PERSISTENT_MMA = 3,
    /* with a persistent path: one layer a launch, never the wavefront */
    FX_RNN_PATH_NO_WAVEFRONT = 0x10,
};
#define FX_RNN_PATH_KIND(path) ((path) & 0x0f)

typedef struct fx_rnn_fwd_args {
    fx_rnn_dims n;
    const fx_rnn_layer *layer; /* [n.layers] */
    const fx_tensor *x;        /* [batch, seqlen, input] */
    const fx_tensor *h0, *c0;  /* [layers, batch, hidden], or NULL */
    const fx_tensor *y;        /* out [batch, seqlen, hidden], x's type */
    const fx_tensor *h_n, *c_n; /* out [layers, batch, hidden], state type, or NULL */
    /* out (training): fx_rnn_saved_width's layout, or NULL (inference:
     * nothing is kept) */
    const fx_tensor *saved;
    int path;
} fx_rnn_fwd_args;

typedef struct fx_rnn_bwd_args {
    /* The forward's inputs and what it saved (y, h_n and c_n are NULL). */
    fx_rnn_fwd_args fwd;
    const fx_tensor *dy;          /* [batch, seqlen, hidden], x's type, or NULL (zeros) */
    const fx_tensor *dh_n, *dc_n; /* [layers, batch, hidden], or NULL (zeros) */
    /* out: dx (x's shape and type); dh0, dc0 where h0, c0 were given
     * (else NULL); per layer the parameters' gradients, summed over batch
     * and time. */
    const fx_tensor *dx;
    const fx_tensor *dh0, *dc0;
    const fx_rnn_layer_grads *grad; /* [n.layers] */
} fx_rnn_bwd_args;

/* One time step of every layer: x [batch, input]; the states h and c
 * (c for the LSTM only) [layers, batch, hidden] of the state type are read
 * as h_{t-1}, c_{t-1} and overwritten with h_t, c_t. */
typedef struct fx_rnn_step_args {
    fx_rnn_dims n; /* seqlen 1 */
    const fx_rnn_layer *layer;
    const fx_tensor *x;    /* [batch, input] */
    const fx_tensor *h, *c; /* in/out */
    const fx_tensor *y;    /* out [batch, hidden], x's type: the last layer's h_t */
    int path;
} fx_rnn_step_args;

struct fx_rnn_ops {
    int (*forward)(const fx_exec *ex, const fx_rnn_fwd_args *args, fx_status *st);
    int (*backward)(const fx_exec *ex, const fx_rnn_bwd_args *args, fx_status *st);
    int (*step)(const fx_exec *ex, const fx_rnn_step_args *args, fx_status *st);
    /* The most scratch bytes each op asks of `ex` for these arguments, from
     * shapes, types, the path and the device alone (addresses never make
     * it ask more); SIZE_MAX when that does not fit a size_t. */
    size_t (*forward_scratch)(const fx_exec *ex, const fx_rnn_fwd_args *args);
    size_t (*backward_scratch)(const fx_exec *ex, const fx_rnn_bwd_args *args);
    size_t (*step_scratch)(const fx_exec *ex, const fx_rnn_step_args *args);
};

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_RNN_H */
