"""The selective scan (Mamba's S6; docs/SSM.md) as JAX functions."""

import operator

import jax.numpy as jnp

from . import _lib, _ops
from ._lib import ArgumentError

__all__ = ["selective_scan", "selective_scan_step", "selective_scan_saved_shape"]


def selective_scan(x, dt, a, b, c, *, d=None, z=None, dt_bias=None, dt_softplus=False, h0=None,
                   return_state=False):
    """Mamba's selective scan (S6), docs/SSM.md.

    x, dt, z: ``[batch, seqlen, dim]``; a: ``[dim, dstate]``; b, c:
    ``[batch, seqlen, dstate]`` or ``[batch, seqlen, groups, dstate]``; d,
    dt_bias: ``[dim]``; h0: ``[batch, dim, dstate]``. Returns y (x's shape
    and type) or ``(y, state)`` with ``return_state`` (state
    ``[batch, dim, dstate]``, f32; f64 for f64 inputs). Differentiable in
    every array argument; a training forward keeps the states entering
    each chunk (``selective_scan_saved_shape``) for its backward.
    """
    return _ops.forward("selective_scan", dict(x=x, dt=dt, a=a, b=b, c=c), d=d, z=z, dt_bias=dt_bias,
                        dt_softplus=dt_softplus, h0=h0, return_state=return_state)


def selective_scan_step(state, x, dt, a, b, c, *, d=None, z=None, dt_bias=None, dt_softplus=False):
    """One step of the selective scan: state ``[batch, dim, dstate]`` (f32;
    f64 on the CPU for f64 inputs), x, dt, z ``[batch, dim]``, b, c
    ``[batch, dstate]`` or ``[batch, groups, dstate]``. Returns
    ``(y, new_state)``, y ``[batch, dim]``. XLA updates the state in place
    when the caller donates it (the call aliases new_state to state)."""
    return _ops.step("selective_scan", dict(state=state, x=x, dt=dt, a=a, b=b, c=c), d=d, z=z, dt_bias=dt_bias,
                     dt_softplus=dt_softplus)


def _dims(name, shape):
    """A shape's sizes as int64s, refused as the Erlang API refuses them:
    integers only, none beyond 2^63."""
    try:
        dims = [operator.index(n) for n in shape if not isinstance(n, bool)]
    except TypeError:
        dims = None
    text = "{" + ",".join(str(n) for n in shape) + "}"
    if dims is None or len(dims) != len(shape):
        raise ArgumentError(f"{name}: expected a tuple of non-negative integers, got {text}")
    for n in dims:
        if n >= 2**63:
            raise ArgumentError(f"{name}: expected a tuple of non-negative integers, each at most 2^48, got {text}")
        if n < -2**63:
            raise ArgumentError(f"{name}: expected a tuple of non-negative integers, got {text}")
    return dims


def selective_scan_saved_shape(x_shape, a_shape, b_shape, dtype):
    """The shape of the states a training forward saves for its backward,
    ``(batch, nsaved, dim, dstate)`` of the state type, from the shapes of
    x ``[batch, seqlen, dim]``, a ``[dim, dstate]`` and b (rank 3, or rank 4
    with groups) and x's dtype. Sizes no scan has raise ArgumentError with
    the op layer's message."""
    x, a, b = _dims("x", tuple(x_shape)), _dims("a", tuple(a_shape)), _dims("b", tuple(b_shape))
    batch, seqlen, dim = (x + [0, 0, 0])[:3]
    dstate = a[-1] if a else 0
    groups = b[2] if len(b) == 4 else 1
    try:
        dtype_name = jnp.dtype(dtype).name
    except TypeError:
        dtype_name = str(dtype)
    return _lib.saved_shape(batch, seqlen, dim, dstate, groups, dtype_name)
