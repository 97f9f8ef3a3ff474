/*
 * The pointwise activations the families apply after a product or a
 * convolution (linear layers: all of them; causal_conv1d: none or silu),
 * with the names the options and the messages use. Valid C11 and CUDA C++.
 *
 *   relu(u)    = max(u, 0)
 *   gelu(u)    = u/2 * (1 + tanh(sqrt(2/pi) * (u + 0.044715 u^3)))   (the tanh form:
 *                cuBLASLt's epilogue, PyTorch's gelu(approximate="tanh"))
 *   silu(u)    = u * sigmoid(u)
 *   tanh(u), sigmoid(u) = 1 / (1 + exp(-u))
 */
#ifndef FUSEX_ACTIVATION_H
#define FUSEX_ACTIVATION_H

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_activation {
    FX_ACT_NONE = 0,
    FX_ACT_RELU,
    FX_ACT_GELU,
    FX_ACT_SILU,
    FX_ACT_TANH,
    FX_ACT_SIGMOID,
    FX_ACT_COUNT
} fx_activation;

static inline const char *fx_activation_name(int act)
{
    static const char *const names[FX_ACT_COUNT] = {"none", "relu", "gelu", "silu", "tanh", "sigmoid"};
    return act >= 0 && act < FX_ACT_COUNT ? names[act] : "?";
}

/* The activation of that name, or -1. */
static inline int fx_activation_from_name(const char *name)
{
    for (int act = 0; act < FX_ACT_COUNT; act++)
        if (strcmp(name, fx_activation_name(act)) == 0)
            return act;
    return -1;
}

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_ACTIVATION_H */
