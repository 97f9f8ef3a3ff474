"""fusex's recurrences as JAX functions: each is one XLA custom call
(docs/XLA.md), differentiable through ``jax.custom_vjp`` whose backward is
the op's backward target. Semantics, shapes and types are the Erlang API's
(docs/SSM.md, docs/LINREC.md); the handlers check every operand with the
Erlang API's messages, which reach the caller as ``jax.errors.JaxRuntimeError``
("INVALID_ARGUMENT: fusex_mingru_fwd: cand: expected type {f,32}, got {f,16}").
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib

# ---- helpers ----


def _flag(value):
    return np.int64(1 if value else 0)


def _array(x):
    return None if x is None else jnp.asarray(x)


def _dims(x, rank):
    """x's shape padded or cut to `rank` entries: output shapes of a call
    whose inputs are malformed (the handler refuses the inputs before it
    looks at the outputs)."""
    shape = tuple(x.shape)[:rank]
    return shape + (0,) * (rank - len(shape))


def _state_dtype(dtype):
    """States are f32 for f32/bf16/f16 inputs, f64 for f64 ones."""
    return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def _like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _call(target, results, operands, attrs, aliases=None):
    fn = jax.ffi.ffi_call(target, tuple(results), vmap_method="sequential",
                          input_output_aliases=aliases)
    return fn(*operands, **attrs)


def _present(*xs):
    return [x for x in xs if x is not None]


def _candidate_g(candidate_activation):
    if candidate_activation not in ("identity", "g"):
        raise ValueError(f"candidate_activation: expected identity or g, got {candidate_activation!r}")
    return candidate_activation == "g"


# ---- selective scan ----


def selective_scan_saved_shape(x_shape, a_shape, b_shape, dtype):
    """The shape of the states a training forward saves for its backward,
    ``(batch, nsaved, dim, dstate)`` of the state type, from the shapes of
    x ``[batch, seqlen, dim]``, a ``[dim, dstate]`` and b (rank 3, or rank 4
    with groups) and x's dtype."""
    batch, seqlen, dim = (tuple(x_shape) + (0, 0, 0))[:3]
    dstate = a_shape[-1] if len(a_shape) else 0
    groups = b_shape[2] if len(b_shape) == 4 else 1
    return _lib.saved_shape(batch, seqlen, dim, dstate, groups, jnp.dtype(dtype).name)


def _ssm_attrs(dt_softplus, d, z, dt_bias):
    return dict(dt_softplus=_flag(dt_softplus), has_d=_flag(d is not None), has_z=_flag(z is not None),
                has_dt_bias=_flag(dt_bias is not None))


def _ssm_fwd_call(dt_softplus, return_state, save, x, dt, a, b, c, d, z, dt_bias, h0):
    batch, _, dim = _dims(x, 3)
    dstate = _dims(a, 2)[1]
    results = [_like(x)]
    if return_state:
        results.append(jax.ShapeDtypeStruct((batch, dim, dstate), _state_dtype(x.dtype)))
    # A sequence of one chunk saves nothing: then there is no such result
    # (docs/XLA.md), and the backward gets None.
    saved_shape = selective_scan_saved_shape(x.shape, a.shape, b.shape, x.dtype) if save else None
    has_saved = saved_shape is not None and saved_shape[1] > 0
    if has_saved:
        results.append(jax.ShapeDtypeStruct(saved_shape, _state_dtype(x.dtype)))
    attrs = _ssm_attrs(dt_softplus, d, z, dt_bias)
    attrs.update(has_h0=_flag(h0 is not None), return_state=_flag(return_state), save=_flag(save))
    outs = _call("fusex_selective_scan_fwd", results, [x, dt, a, b, c] + _present(d, z, dt_bias, h0), attrs)
    return tuple(outs) + ((None,) if save and not has_saved else ())


def _ssm_bwd_call(dt_softplus, inputs, saved, dy, dstate):
    x, dt, a, b, c, d, z, dt_bias, h0 = inputs
    attrs = _ssm_attrs(dt_softplus, d, z, dt_bias)
    attrs.update(has_h0=_flag(h0 is not None), has_dstate=_flag(dstate is not None))
    given = [t for t in inputs if t is not None]
    operands = given + _present(saved) + [dy] + _present(dstate)
    grads = iter(_call("fusex_selective_scan_bwd", [_like(t) for t in given], operands, attrs))
    return tuple(None if t is None else next(grads) for t in inputs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _selective_scan(dt_softplus, return_state, x, dt, a, b, c, d, z, dt_bias, h0):
    outs = _ssm_fwd_call(dt_softplus, return_state, False, x, dt, a, b, c, d, z, dt_bias, h0)
    return (outs[0], outs[1]) if return_state else outs[0]


def _selective_scan_fwd(dt_softplus, return_state, x, dt, a, b, c, d, z, dt_bias, h0):
    outs = _ssm_fwd_call(dt_softplus, return_state, True, x, dt, a, b, c, d, z, dt_bias, h0)
    primal = (outs[0], outs[1]) if return_state else outs[0]
    return primal, ((x, dt, a, b, c, d, z, dt_bias, h0), outs[-1])


def _selective_scan_bwd(dt_softplus, return_state, residuals, cotangent):
    inputs, saved = residuals
    dy, dstate = cotangent if return_state else (cotangent, None)
    return _ssm_bwd_call(dt_softplus, inputs, saved, dy, dstate)


_selective_scan.defvjp(_selective_scan_fwd, _selective_scan_bwd)


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
    return _selective_scan(bool(dt_softplus), bool(return_state), *map(_array, (x, dt, a, b, c, d, z, dt_bias, h0)))


def _ssm_step_call(dt_softplus, state, x, dt, a, b, c, d, z, dt_bias):
    attrs = _ssm_attrs(dt_softplus, d, z, dt_bias)
    operands = [state, x, dt, a, b, c] + _present(d, z, dt_bias)
    y, new_state = _call("fusex_selective_scan_step", [_like(x), _like(state)], operands, attrs, {0: 1})
    return y, new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _selective_scan_step(dt_softplus, state, x, dt, a, b, c, d, z, dt_bias):
    return _ssm_step_call(dt_softplus, state, x, dt, a, b, c, d, z, dt_bias)


def _selective_scan_step_fwd(dt_softplus, state, x, dt, a, b, c, d, z, dt_bias):
    out = _ssm_step_call(dt_softplus, state, x, dt, a, b, c, d, z, dt_bias)
    return out, (state, x, dt, a, b, c, d, z, dt_bias)


def _frame(t):
    """A step's frame as a sequence of one step: [batch, ...] -> [batch, 1, ...]."""
    return None if t is None else jnp.expand_dims(t, 1)


def _unframe(t):
    return None if t is None else jnp.squeeze(t, 1)


def _selective_scan_step_bwd(dt_softplus, residuals, cotangent):
    # The step is the scan of one step from h0 = state: its backward is the
    # scan's backward on that sequence of one (no saved states: one chunk).
    state, x, dt, a, b, c, d, z, dt_bias = residuals
    dy, dnew_state = cotangent
    seq = (_frame(x), _frame(dt), a, _frame(b), _frame(c), d, _frame(z), dt_bias, state)
    dx, ddt, da, db, dc, dd, dz, ddt_bias, dstate = _ssm_bwd_call(dt_softplus, seq, None, _frame(dy), dnew_state)
    return (dstate, _unframe(dx), _unframe(ddt), da, _unframe(db), _unframe(dc), dd, _unframe(dz), ddt_bias)


_selective_scan_step.defvjp(_selective_scan_step_fwd, _selective_scan_step_bwd)


def selective_scan_step(state, x, dt, a, b, c, *, d=None, z=None, dt_bias=None, dt_softplus=False):
    """One step of the selective scan: state ``[batch, dim, dstate]`` (f32;
    f64 on the CPU for f64 inputs), x, dt, z ``[batch, dim]``, b, c
    ``[batch, dstate]`` or ``[batch, groups, dstate]``. Returns
    ``(y, new_state)``, y ``[batch, dim]``. XLA updates the state in place
    when the caller donates it (the call aliases new_state to state)."""
    return _selective_scan_step(bool(dt_softplus), *map(_array, (state, x, dt, a, b, c, d, z, dt_bias)))


# ---- linear recurrences ----


class _Linrec(NamedTuple):
    """What is fixed at trace time: the op and its options."""
    op: str
    reverse: bool
    candidate_g: bool
    dt: float  # liquid's scalar dt (used when no dt tensor is given)


def _linrec_attrs(cfg, dt_tensor):
    attrs = dict(reverse=_flag(cfg.reverse))
    if cfg.op in ("mingru", "minlstm"):
        attrs["candidate_g"] = _flag(cfg.candidate_g)
    if cfg.op == "liquid":
        attrs["has_dt"] = _flag(dt_tensor is not None)
        attrs["dt"] = np.float64(cfg.dt)
    return attrs


def _linrec_fwd_call(cfg, return_state, seq, params, dt, h0):
    first = seq[0]
    results = [_like(first)]
    if return_state:
        batch, hidden = _dims(first, 3)[0], _dims(first, 3)[2]
        results.append(jax.ShapeDtypeStruct((batch, hidden), _state_dtype(first.dtype)))
    attrs = _linrec_attrs(cfg, dt)
    attrs.update(has_h0=_flag(h0 is not None), return_state=_flag(return_state))
    operands = list(seq) + list(params) + _present(dt, h0)
    return _call(f"fusex_{cfg.op}_fwd", results, operands, attrs)


def _linrec_bwd_call(cfg, seq, params, dt, h0, h, dh, dstate):
    attrs = _linrec_attrs(cfg, dt)
    attrs.update(has_h0=_flag(h0 is not None), has_dstate=_flag(dstate is not None))
    given = list(seq) + list(params) + _present(dt, h0)
    operands = given + [h, dh] + _present(dstate)
    grads = list(_call(f"fusex_{cfg.op}_bwd", [_like(t) for t in given], operands, attrs))
    nseq, nparams = len(seq), len(params)
    dseq, dparams = tuple(grads[:nseq]), tuple(grads[nseq:nseq + nparams])
    rest = iter(grads[nseq + nparams:])
    ddt = None if dt is None else next(rest)
    dh0 = None if h0 is None else next(rest)
    return dseq, dparams, ddt, dh0


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _linrec(cfg, return_state, seq, params, dt, h0):
    outs = _linrec_fwd_call(cfg, return_state, seq, params, dt, h0)
    return (outs[0], outs[1]) if return_state else outs[0]


def _linrec_fwd(cfg, return_state, seq, params, dt, h0):
    outs = _linrec_fwd_call(cfg, return_state, seq, params, dt, h0)
    primal = (outs[0], outs[1]) if return_state else outs[0]
    # The backward reads h_{t-1} from the forward's output.
    return primal, (seq, params, dt, h0, outs[0])


def _linrec_bwd(cfg, return_state, residuals, cotangent):
    seq, params, dt, h0, h = residuals
    dh, dstate = cotangent if return_state else (cotangent, None)
    return _linrec_bwd_call(cfg, seq, params, dt, h0, h, dh, dstate)


_linrec.defvjp(_linrec_fwd, _linrec_bwd)


def _step_call(cfg, state, seq, params, dt):
    operands = [state] + list(seq) + list(params) + _present(dt)
    h, new_state = _call(f"fusex_{cfg.op}_step", [_like(seq[0]), _like(state)], operands,
                         _linrec_attrs(cfg, dt), {0: 1})
    return h, new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _linrec_step(cfg, state, seq, params, dt):
    return _step_call(cfg, state, seq, params, dt)


def _linrec_step_fwd(cfg, state, seq, params, dt):
    h, new_state = _step_call(cfg, state, seq, params, dt)
    return (h, new_state), (state, seq, params, dt, h)


def _linrec_step_bwd(cfg, residuals, cotangent):
    # A step is the forward of one step from h0 = state: its backward is
    # that forward's backward on sequences of one step.
    state, seq, params, dt, h = residuals
    dh, dnew_state = cotangent
    frames = tuple(_frame(t) for t in seq)
    dseq, dparams, ddt, dstate = _linrec_bwd_call(cfg, frames, params, _frame(dt), state, _frame(h), _frame(dh),
                                                  dnew_state)
    return dstate, tuple(_unframe(t) for t in dseq), dparams, _unframe(ddt)


_linrec_step.defvjp(_linrec_step_fwd, _linrec_step_bwd)


def _liquid_dt(dt, first, frame):
    """A Python number stays a static attribute (the handler checks that it
    is positive); an array of shape () is broadcast to dt's tensor layout
    ([batch, seqlen, 1], [batch, 1] for a step) so that it has a gradient."""
    if isinstance(dt, (int, float)) and not isinstance(dt, bool):
        return float(dt), None
    dt = jnp.asarray(dt)
    if dt.ndim == 0:
        shape = (_dims(first, 2)[0], 1) if frame else (_dims(first, 3)[0], _dims(first, 3)[1], 1)
        dt = jnp.broadcast_to(dt.astype(first.dtype), shape)
    return 1.0, dt


def _run(op, seq, *, params=(), dt=1.0, h0=None, reverse=False, candidate_activation="identity",
         return_state=False):
    seq = tuple(jnp.asarray(t) for t in seq)
    params = tuple(jnp.asarray(t) for t in params)
    dt_value, dt_tensor = _liquid_dt(dt, seq[0], False) if op == "liquid" else (1.0, None)
    cfg = _Linrec(op, bool(reverse), _candidate_g(candidate_activation), dt_value)
    return _linrec(cfg, bool(return_state), seq, params, dt_tensor, _array(h0))


def _step(op, state, seq, *, params=(), dt=1.0, candidate_activation="identity"):
    seq = tuple(jnp.asarray(t) for t in seq)
    params = tuple(jnp.asarray(t) for t in params)
    dt_value, dt_tensor = _liquid_dt(dt, seq[0], True) if op == "liquid" else (1.0, None)
    cfg = _Linrec(op, False, _candidate_g(candidate_activation), dt_value)
    return _linrec_step(cfg, jnp.asarray(state), seq, params, dt_tensor)


def linear_scan(a, b, *, h0=None, reverse=False, return_state=False):
    """``h_t = a_t * h_{t-1} + b_t`` over ``[batch, seqlen, hidden]``
    (docs/LINREC.md). Returns h, or ``(h, state)`` with ``return_state``
    (``[batch, hidden]``, f32; f64 for f64 inputs)."""
    return _run("linear_scan", (a, b), h0=h0, reverse=reverse, return_state=return_state)


def mingru(z_logits, cand, *, h0=None, reverse=False, candidate_activation="identity", return_state=False):
    """MinGRU: ``h_t = (1 - z_t) h_{t-1} + z_t c~_t``, ``z = sigmoid(z_logits)``
    (docs/LINREC.md)."""
    return _run("mingru", (z_logits, cand), h0=h0, reverse=reverse, candidate_activation=candidate_activation,
                return_state=return_state)


def minlstm(f_logits, i_logits, cand, *, h0=None, reverse=False, candidate_activation="identity",
            return_state=False):
    """MinLSTM with normalised gates (docs/LINREC.md)."""
    return _run("minlstm", (f_logits, i_logits, cand), h0=h0, reverse=reverse,
                candidate_activation=candidate_activation, return_state=return_state)


def liquid(f_logits, tau, a, *, dt=1.0, h0=None, reverse=False, return_state=False):
    """Liquid (LTC), the fused semi-implicit Euler step (docs/LINREC.md):
    tau, a ``[hidden]``; dt a positive number, or an array
    ``[batch, seqlen, 1]`` (or of shape ``()``) that gets a gradient."""
    return _run("liquid", (f_logits,), params=(tau, a), dt=dt, h0=h0, reverse=reverse, return_state=return_state)


def linear_scan_step(state, a, b):
    """One frame: ``(h, new_state)``; state ``[batch, hidden]`` of the inputs'
    type or the state type, frames ``[batch, hidden]``."""
    return _step("linear_scan", state, (a, b))


def mingru_step(state, z_logits, cand, *, candidate_activation="identity"):
    return _step("mingru", state, (z_logits, cand), candidate_activation=candidate_activation)


def minlstm_step(state, f_logits, i_logits, cand, *, candidate_activation="identity"):
    return _step("minlstm", state, (f_logits, i_logits, cand), candidate_activation=candidate_activation)


def liquid_step(state, f_logits, tau, a, *, dt=1.0):
    """dt: a positive number or an array ``[batch, 1]`` (or ``()``)."""
    return _step("liquid", state, (f_logits,), params=(tau, a), dt=dt)


def cuda_unavailable_reason() -> Optional[str]:
    """None when fusex's CUDA handlers can run in this process (its CUDA
    backend, priv/fusex_cuda.so, loaded and found a GPU), else why not."""
    return _lib.cuda_unavailable_reason()
