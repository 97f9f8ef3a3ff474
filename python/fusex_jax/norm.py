"""RMSNorm and LayerNorm over the last axis, fused with the residual add
before them and the gate after them (docs/LAYERS.md), as JAX functions."""

from . import _ops

__all__ = ["rms_norm", "layer_norm"]


def rms_norm(x, weight, *, eps=1e-5, residual=None, gate=None, bias=None, residual_in_f32=False):
    """``s = x + residual`` (x without one), ``y = s / sqrt(mean(s^2) + eps)
    * weight + bias``, times ``silu(gate)`` with a gate (Mamba-2's gated
    RMSNorm). x, residual, gate ``[..., hidden]``; weight, bias
    ``[hidden]``; eps a concrete number, finite and >= 0. Returns y (x's
    shape and type), or ``(y, s)`` with a residual: what the next block
    adds to, in the residual's type, f32 with ``residual_in_f32``. The
    statistics are f32 (f64 for f64 inputs). Differentiable in every
    array argument (dweight, dbias summed over the rows in a fixed order)."""
    return _ops.forward("rms_norm", dict(x=x, weight=weight), bias=bias, residual=residual, gate=gate, eps=eps,
                        residual_in_f32=residual_in_f32)


def layer_norm(x, weight, bias, *, eps=1e-5, residual=None, gate=None, residual_in_f32=False):
    """``y = (s - mean(s)) / sqrt(var(s) + eps) * weight + bias``, fused as
    ``rms_norm`` (the residual before, the gate after); returns y, or
    ``(y, s)`` with a residual."""
    return _ops.forward("layer_norm", dict(x=x, weight=weight, bias=bias), residual=residual, gate=gate, eps=eps,
                        residual_in_f32=residual_in_f32)
