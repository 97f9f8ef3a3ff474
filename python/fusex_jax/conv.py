"""The causal depthwise convolution of a Mamba block (docs/LAYERS.md) as
JAX functions: the forward with its backward, and the step."""

from . import _ops

__all__ = ["causal_conv1d", "causal_conv1d_step"]


def causal_conv1d(x, w, bias=None, *, activation=None, initial_state=None, return_state=False):
    """``y_t[d] = act(bias[d] + sum_k w[d, k] x_{t-(W-1)+k}[d])`` over x
    ``[batch, seqlen, dim]`` (channels last), w ``[dim, width]`` (width 1
    to 16): ``w[:, W-1]`` multiplies the current input. bias ``[dim]``;
    activation None or ``"silu"``; initial_state ``[batch, dim, width - 1]``
    (the inputs before the first, oldest first; zeros when not given).
    Returns y (x's shape and type), or ``(y, final_state)`` with
    ``return_state`` (the last ``width - 1`` inputs, oldest first, x's
    type). Differentiable in every array argument; the backward sums dw
    and dbias in a fixed order (no float atomics)."""
    return _ops.forward("causal_conv1d", dict(x=x, w=w), bias=bias, activation=activation,
                        initial_state=initial_state, return_state=return_state)


def causal_conv1d_step(state, x_t, w, bias=None, *, activation=None):
    """One frame of ``causal_conv1d``: state ``[batch, dim, width - 1]``
    (the last ``width - 1`` inputs, oldest first: a forward's final state,
    or zeros), x_t ``[batch, dim]``. Returns ``(y_t, new_state)``; XLA
    updates the state in place when the caller donates it (the call
    aliases new_state to state)."""
    return _ops.step("causal_conv1d", dict(state=state, x=x_t, w=w), bias=bias, activation=activation)
