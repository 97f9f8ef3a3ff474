"""Classic GRU and LSTM, stacked (PyTorch's ``nn.GRU`` / ``nn.LSTM`` with
``batch_first=True``; docs/RNN.md) as JAX functions.

Each layer is a tuple ``(w_ih, w_hh, b_ih, b_hh)`` in PyTorch's layout,
``G`` gate blocks of ``hidden`` rows (GRU: 3, r z n; LSTM: 4, i f g o):
``w_ih [G*hidden, input]`` (layer 0; ``[G*hidden, hidden]`` above),
``w_hh [G*hidden, hidden]``, ``b_ih, b_hh [G*hidden]``. ``x [batch, seqlen,
input]``; ``h0``, ``c0``, the final and the steps' states ``[layers, batch,
hidden]``, f32 (f64 for f64 inputs) whatever the input type.
"""

import jax

from . import _ops
from ._lib import ArgumentError

__all__ = ["gru", "lstm", "gru_step", "lstm_step"]


def gru(x, layers, *, h0=None, return_state=False):
    """A stacked GRU over a sequence: ``y [batch, seqlen, hidden]`` (the last
    layer's ``h_t``, x's type), or ``(y, h_n)`` with ``return_state``.
    Differentiable in x, every layer's parameters and h0 (the training
    forward keeps the gates and states, ``[layers, batch, seqlen,
    5*hidden]``, for its backward)."""
    return _ops.forward("gru", dict(x=x, layers=_layers(layers)), h0=h0, return_state=return_state)


def lstm(x, layers, *, h0=None, c0=None, return_state=False):
    """A stacked LSTM over a sequence: ``y``, or ``(y, (h_n, c_n))`` with
    ``return_state``. Differentiable in every array argument."""
    out = _ops.forward("lstm", dict(x=x, layers=_layers(layers)), h0=h0, c0=c0, return_state=return_state)
    if return_state:
        y, h_n, c_n = out
        return y, (h_n, c_n)
    return out


def _layers(layers):
    """The layers as a tuple of tuples (a pytree custom_vjp takes), refused
    in the op layer's words where they are no sequence of 4-tuples."""
    _ops._flatten_group("gru", _ops._desc(_ops._find("gru_fwd")), {"layers": layers})
    return tuple(tuple(layer) for layer in layers)


def _one_step(cell):
    """The step as a forward over one frame from h0 (and c0): its
    gradient."""
    def run(state, x_t, layers):
        if cell == "gru":
            y, h = gru(x_t[:, None], layers, h0=state, return_state=True)
            return y[:, 0], h
        y, hc = lstm(x_t[:, None], layers, h0=state[0], c0=state[1], return_state=True)
        return y[:, 0], hc
    return run


def _stepper(cell):
    """One frame through every layer by the step kernel, differentiable as
    the forward over one frame (custom_vjp: its training forward and
    backward)."""
    @jax.custom_vjp
    def step(state, x_t, layers):
        if cell == "gru":
            return _ops.step("gru", dict(h=state, x=x_t, layers=layers))
        y, h, c = _ops.step("lstm", dict(h=state[0], c=state[1], x=x_t, layers=layers))
        return y, (h, c)

    def fwd(state, x_t, layers):
        return jax.vjp(_one_step(cell), state, x_t, layers)

    def bwd(vjp, cotangent):
        return vjp(cotangent)

    step.defvjp(fwd, bwd)
    return step


_GRU_STEP, _LSTM_STEP = _stepper("gru"), _stepper("lstm")


def gru_step(h, x_t, layers):
    """One frame of :func:`gru` through every layer: ``h [layers, batch,
    hidden]`` (the state type), ``x_t [batch, input]``. Returns ``(y_t,
    h_new)``, ``y_t [batch, hidden]``. XLA updates h in place when the
    caller donates it. A chain of steps equals the forward."""
    return _GRU_STEP(h, x_t, _layers(layers))


def lstm_step(state, x_t, layers):
    """One frame of :func:`lstm`: ``state = (h, c)``, each ``[layers, batch,
    hidden]``. Returns ``(y_t, (h_new, c_new))``."""
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise ArgumentError(f"state: expected a tuple (h, c) of two arrays [layers, batch, hidden], got "
                            f"{_ops._show(state)}")
    return _LSTM_STEP(tuple(state), x_t, _layers(layers))
