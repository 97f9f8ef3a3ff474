/* The activations of include/fusex_activation.h in f64, and their
 * derivatives: the CPU references' arithmetic. */
#ifndef FX_CPU_ACTIVATION_H
#define FX_CPU_ACTIVATION_H

#include <math.h>

#include "fusex_activation.h"

static inline double fx_sigmoid64(double u) { return 1.0 / (1.0 + exp(-u)); }

static inline double fx_activate64(int act, double u)
{
    switch (act) {
    case FX_ACT_RELU: return u > 0.0 ? u : 0.0;
    case FX_ACT_GELU: return 0.5 * u * (1.0 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
    case FX_ACT_SILU: return u * fx_sigmoid64(u);
    case FX_ACT_TANH: return tanh(u);
    case FX_ACT_SIGMOID: return fx_sigmoid64(u);
    default: return u;
    }
}

/* act'(u), from the pre-activation. */
static inline double fx_activate64_grad(int act, double u)
{
    switch (act) {
    case FX_ACT_RELU: return u > 0.0 ? 1.0 : 0.0;
    case FX_ACT_GELU: {
        const double k0 = 0.7978845608028654, k1 = 0.044715;
        const double t = tanh(k0 * (u + k1 * u * u * u));
        return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * u * u);
    }
    case FX_ACT_SILU: {
        const double s = fx_sigmoid64(u);
        return s * (1.0 + u * (1.0 - s));
    }
    case FX_ACT_TANH: {
        const double t = tanh(u);
        return 1.0 - t * t;
    }
    case FX_ACT_SIGMOID: {
        const double s = fx_sigmoid64(u);
        return s * (1.0 - s);
    }
    default: return 1.0;
    }
}

/* act'(u) from the output y = act(u), where that determines it (none, relu,
 * tanh, sigmoid). */
static inline double fx_activate64_grad_at_output(int act, double y)
{
    switch (act) {
    case FX_ACT_RELU: return y > 0.0 ? 1.0 : 0.0;
    case FX_ACT_TANH: return 1.0 - y * y;
    case FX_ACT_SIGMOID: return y * (1.0 - y);
    default: return 1.0;
    }
}

#endif
