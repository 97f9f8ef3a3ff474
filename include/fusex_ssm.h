/*
 * The selective scan (Mamba S6) family: argument structs and the ops table
 * a backend fills. Row-major, Nx layout:
 *
 *   x, dt, z, y     [batch, seqlen, dim]
 *   a               [dim, dstate]
 *   b, c            [batch, seqlen, groups, dstate]   (groups = 1 for rank-3 inputs)
 *   d, dt_bias      [dim]
 *   h0, state       [batch, dim, dstate]
 *
 *   delta_t  = softplus(dt_t + dt_bias)      (bias and softplus only when asked)
 *   h_t[d,n] = exp(delta_t[d] * a[d,n]) * h_{t-1}[d,n] + delta_t[d] * b_t[g,n] * x_t[d]
 *   y_t[d]   = (sum_n c_t[g,n] * h_t[d,n] + d[d] * x_t[d]) * silu(z_t[d])
 *
 * with g = d div (dim / groups). The op layer has checked every shape, type
 * and device before a backend sees these structs; absent options are NULL.
 *
 * Types: x, dt, z, b, c, y and dy share one type (f32, bf16 or f16; f64 on
 * the CPU). a, d, dt_bias, h0 and the final-state gradient may each be any
 * float type the device supports: they are read once per channel. Every
 * gradient has the type of its input. States (final state, step state,
 * saved states) are f32, or f64 when x is f64.
 */
#ifndef FUSEX_SSM_H
#define FUSEX_SSM_H

#include <stdbool.h>

#include "fusex.h"
#include "fusex_exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fx_ssm_dims {
    int64_t batch, seqlen, dim, dstate, groups;
} fx_ssm_dims;

typedef struct fx_ssm_fwd_args {
    fx_ssm_dims n;
    const fx_tensor *x, *dt, *a, *b, *c;
    const fx_tensor *d, *z, *dt_bias, *h0; /* NULL when not given */
    bool dt_softplus;
    const fx_tensor *y;     /* out [batch, seqlen, dim] */
    const fx_tensor *state; /* out [batch, dim, dstate], or NULL */
    /* out [batch, nsaved, dim, dstate] of the state type, or NULL: saved[b][k]
     * is the state after step (k + 1) * save_every - 1, i.e. the state
     * entering the time chunk k + 1 of save_every steps (nsaved =
     * max(ceil(seqlen / save_every) - 1, 0)); save_every is
     * fx_ssm_save_every(&n, x's type). */
    const fx_tensor *saved;
    int64_t save_every;
} fx_ssm_fwd_args;

typedef struct fx_ssm_bwd_args {
    /* The forward's inputs and what it saved (y and state are NULL). */
    fx_ssm_fwd_args fwd;
    const fx_tensor *dy;     /* [batch, seqlen, dim], x's type */
    const fx_tensor *dstate; /* gradient of the final state [batch, dim, dstate], or NULL */
    /* out: one gradient per input, NULL for options that were not given.
     * da, dd, ddt_bias are summed over batch and time; db, dc over the
     * channels of their group. */
    const fx_tensor *dx, *ddt, *da, *db, *dc, *dd, *dz, *ddt_bias, *dh0;
} fx_ssm_bwd_args;

typedef struct fx_ssm_step_args {
    fx_ssm_dims n; /* seqlen is 1 */
    const fx_tensor *state; /* [batch, dim, dstate], read and written in place */
    const fx_tensor *x, *dt; /* [batch, dim] */
    const fx_tensor *a;      /* [dim, dstate] */
    const fx_tensor *b, *c;  /* [batch, groups, dstate] */
    const fx_tensor *d, *z, *dt_bias; /* d, dt_bias [dim]; z [batch, dim]; NULL when not given */
    bool dt_softplus;
    const fx_tensor *y; /* out [batch, dim] */
} fx_ssm_step_args;

struct fx_ssm_ops {
    int (*forward)(const fx_exec *ex, const fx_ssm_fwd_args *args, fx_status *st);
    int (*backward)(const fx_exec *ex, const fx_ssm_bwd_args *args, fx_status *st);
    /* Needs no scratch. */
    int (*step)(const fx_exec *ex, const fx_ssm_step_args *args, fx_status *st);
    /* The most scratch bytes forward and backward ask of `ex` for these
     * arguments, from shapes, types and options alone (addresses may make
     * them ask less, never more); SIZE_MAX when that does not fit a size_t. */
    size_t (*forward_scratch)(const fx_exec *ex, const fx_ssm_fwd_args *args);
    size_t (*backward_scratch)(const fx_exec *ex, const fx_ssm_bwd_args *args);
    /* Whether the backward reads the states a forward saved (args->saved);
     * where it does not (the CPU: it recomputes from h0) the op layer asks
     * for none, but a forward given a `saved` tensor still fills it. */
    bool reads_saved;
    /* The largest dstate the backend handles; 0 for no limit. */
    int64_t max_dstate;
};

/* The steps between the states a forward saves for its backward: the time
 * chunk of the CUDA backward, which starts each chunk from a saved state and
 * holds the chunk's states in registers. It depends on the shapes and the
 * input type alone, never on addresses or the device, so that a program
 * (an XLA custom call) can size the saved states before it runs:
 *  - 16 up to dstate 32 (4 states a lane, a chunk of 64 / 4 steps);
 *  - above that 8 (8 states a lane), except where the backward runs as
 *    slices of 16 states (dstate a multiple of 16 above 32 but 64, where
 *    its own configuration is faster; channels per group a multiple of
 *    32): its chunk is 16 steps.
 * The rows of x, dt, z (dim elements) and b, c (groups * dstate) of such a
 * shape are whole multiples of 16 bytes for every input type. */
static inline int64_t fx_ssm_save_every(const fx_ssm_dims *n, fx_dtype x_type)
{
    (void)x_type; /* the rule happens not to depend on it; callers pass it */
    if (n->dstate <= 32)
        return 16;
    const int64_t per_group = n->groups > 0 ? n->dim / n->groups : 0;
    if (n->dstate != 64 && n->dstate % 16 == 0 && per_group % 32 == 0)
        return 16;
    return 8;
}

/* The saved states' count per batch row: the chunks after the first. */
static inline int64_t fx_ssm_nsaved(const fx_ssm_dims *n, fx_dtype x_type)
{
    const int64_t every = fx_ssm_save_every(n, x_type);
    const int64_t chunks = n->seqlen / every + (n->seqlen % every != 0);
    return chunks > 1 ? chunks - 1 : 0;
}

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_SSM_H */
