"""The linear recurrences (docs/LINREC.md) as JAX functions: the generic
linear scan, MinGRU, MinLSTM and Liquid, each a forward and a step."""

from . import _ops

__all__ = ["linear_scan", "linear_scan_step", "mingru", "mingru_step", "minlstm", "minlstm_step", "liquid",
           "liquid_step"]


def linear_scan(a, b, *, h0=None, reverse=False, return_state=False):
    """``h_t = a_t * h_{t-1} + b_t`` over ``[batch, seqlen, hidden]``
    (docs/LINREC.md). Returns h, or ``(h, state)`` with ``return_state``
    (``[batch, hidden]``, f32; f64 for f64 inputs)."""
    return _ops.forward("linear_scan", dict(a=a, b=b), h0=h0, reverse=reverse, return_state=return_state)


def mingru(z_logits, cand, *, h0=None, reverse=False, candidate_activation="identity", return_state=False):
    """MinGRU: ``h_t = (1 - z_t) h_{t-1} + z_t c~_t``, ``z = sigmoid(z_logits)``
    (docs/LINREC.md)."""
    return _ops.forward("mingru", dict(z_logits=z_logits, cand=cand), h0=h0, reverse=reverse,
                        candidate_activation=candidate_activation, return_state=return_state)


def minlstm(f_logits, i_logits, cand, *, h0=None, reverse=False, candidate_activation="identity",
            return_state=False):
    """MinLSTM with normalised gates (docs/LINREC.md)."""
    return _ops.forward("minlstm", dict(f_logits=f_logits, i_logits=i_logits, cand=cand), h0=h0, reverse=reverse,
                        candidate_activation=candidate_activation, return_state=return_state)


def liquid(f_logits, tau, a, *, dt=1.0, h0=None, reverse=False, return_state=False):
    """Liquid (LTC), the fused semi-implicit Euler step (docs/LINREC.md):
    tau, a ``[hidden]``; dt a positive number (a concrete scalar of any
    kind: Python's, numpy's, an array of shape ``()`` not traced), or an
    array ``[batch, seqlen, 1]`` (or a traced one of shape ``()``,
    broadcast) that gets a gradient."""
    return _ops.forward("liquid", dict(f_logits=f_logits, tau=tau, a=a), dt=dt, h0=h0, reverse=reverse,
                        return_state=return_state)


def linear_scan_step(state, a, b):
    """One frame: ``(h, new_state)``; state ``[batch, hidden]`` of the inputs'
    type or the state type, frames ``[batch, hidden]``."""
    return _ops.step("linear_scan", dict(state=state, a=a, b=b))


def mingru_step(state, z_logits, cand, *, candidate_activation="identity"):
    return _ops.step("mingru", dict(state=state, z_logits=z_logits, cand=cand),
                     candidate_activation=candidate_activation)


def minlstm_step(state, f_logits, i_logits, cand, *, candidate_activation="identity"):
    return _ops.step("minlstm", dict(state=state, f_logits=f_logits, i_logits=i_logits, cand=cand),
                     candidate_activation=candidate_activation)


def liquid_step(state, f_logits, tau, a, *, dt=1.0):
    """dt: a positive number or an array ``[batch, 1]`` (or ``()``)."""
    return _ops.step("liquid", dict(state=state, f_logits=f_logits, tau=tau, a=a), dt=dt)
