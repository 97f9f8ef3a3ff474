"""fusex for JAX: every op under jax.jit, forward and jax.grad, against plain
jax.numpy / lax.scan references written here (f64), over awkward shapes and
every option; the exact StableHLO form EXLA emits; bad input through the
handlers.

    PYTHONPATH=python python3 test/python/test_fusex_jax.py

FUSEX_JAX_PLATFORM=cuda runs fusex on the GPU (JAX's "CUDA" platform) and
also compares every result with fusex's CPU handlers on the same inputs;
there the tests fail when the GPU or fusex's CUDA backend is missing.
FUSEX_SEED fixes the seed (printed either way); FUSEX_JAX_ONLY=substring
runs the matching cases. Plain Python (no pytest): the GPU machine's
python3 has JAX but nothing to install from.

Tolerances (rel-L2, NaN never passes): f32 1e-5, bf16/f16 1e-2, f64 1e-10
(the CPU handlers compute in f64). On CUDA, gradients summed over n terms
in f32 (a, d, dt_bias over batch and time, b, c over a group's channels,
liquid's tau, a, dt) get 1e-5 * max(1, sqrt(n) / 4), as in test/c/test_ssm.c.
"""

import math
import os
import sys
import time
import traceback

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)  # the references run in f64

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import fusex_jax as fj  # noqa: E402

PLATFORM = os.environ.get("FUSEX_JAX_PLATFORM", "cpu").lower()
ON_CUDA = PLATFORM == "cuda"
SEED = int(os.environ.get("FUSEX_SEED") or time.time_ns() % 2**31)
ONLY = os.environ.get("FUSEX_JAX_ONLY")
CPU = jax.devices("cpu")[0]

F32, F64, BF16, F16 = jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16
TOL = {jnp.dtype(F32): 1e-5, jnp.dtype(BF16): 1e-2, jnp.dtype(F16): 1e-2, jnp.dtype(F64): 1e-10}


def device():
    if not ON_CUDA:
        return CPU
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        raise SystemExit("FUSEX_JAX_PLATFORM=cuda: JAX sees no GPU (jax.devices(): %s)" % jax.devices())
    return gpus[0]


DEVICE = device()

# ---- the runner ----

CASES = []
STATS = {"compared": 0, "max_err": {}}


def case(name):
    def register(fn):
        CASES.append((name, fn))
        return fn
    return register


def rel_l2(got, want):
    got = np.asarray(jnp.asarray(got, F64), np.float64)
    want = np.asarray(jnp.asarray(want, F64), np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != {want.shape}")
    if np.isnan(got).any() or np.isnan(want).any():
        return math.inf
    ref = np.linalg.norm(want)
    diff = np.linalg.norm(got - want)
    if ref == 0:
        return 0.0 if diff == 0 else math.inf
    return float(diff / ref)


def check(what, got, want, tol):
    err = rel_l2(got, want)
    STATS["compared"] += 1
    key = f"{tol:g}"
    STATS["max_err"][key] = max(STATS["max_err"].get(key, 0.0), err)
    if tol > 0:
        STATS["case_worst"] = max(STATS.get("case_worst", 0.0), err / tol)
    if not err <= tol:
        raise AssertionError(f"{what}: rel-L2 {err:.3g} > {tol:g}")


def rng(tag):
    """A fresh generator per case, from the run's seed and the case's name."""
    return np.random.default_rng([SEED, sum(ord(ch) * (i + 1) for i, ch in enumerate(tag))])


def on(dev, tree):
    return jax.tree_util.tree_map(lambda t: None if t is None else jax.device_put(t, dev), tree,
                                  is_leaf=lambda t: t is None)


def f64(tree):
    return jax.tree_util.tree_map(lambda t: None if t is None else jnp.asarray(t, F64), tree,
                                  is_leaf=lambda t: t is None)


def against(what, got, want, tol, sums=None):
    """Compares a tuple of results (None where absent); `sums[i]` is the
    number of f32 terms result i sums on CUDA."""
    for i, (g, w) in enumerate(zip(got, want)):
        if (g is None) != (w is None):
            raise AssertionError(f"{what}[{i}]: present {g is not None}, expected {w is not None}")
        if g is None:
            continue
        t = tol
        if ON_CUDA and sums and sums[i] > 1:
            t = tol * max(1.0, math.sqrt(sums[i]) / 4)
        check(f"{what}[{i}]", g, w, t)


# ---- references (f64, plain jax.numpy and lax.scan) ----


def softplus_ref(u):
    # PyTorch's threshold, as fusex: u above 20.
    return jnp.where(u > 20, u, jnp.log1p(jnp.exp(jnp.minimum(u, 20.0))))


def ssm_ref(x, dt, a, b, c, d, z, dt_bias, h0, dt_softplus):
    batch, _, dim = x.shape
    u = dt + (0.0 if dt_bias is None else dt_bias)
    delta = softplus_ref(u) if dt_softplus else u

    def per_channel(t):
        if t.ndim == 4:  # [batch, seqlen, groups, dstate]: channel d reads group d div (dim / groups)
            return t[:, :, jnp.arange(dim) // (dim // t.shape[2]), :]
        return t[:, :, None, :]

    bb, cc = per_channel(b), per_channel(c)
    h = jnp.zeros((batch, dim, a.shape[1]), F64) if h0 is None else h0

    def step(h, t):
        delta_t, x_t, b_t, c_t = t
        h = jnp.exp(delta_t[..., None] * a) * h + (delta_t * x_t)[..., None] * b_t
        return h, jnp.sum(c_t * h, axis=-1)

    h, ys = lax.scan(step, h, tuple(jnp.swapaxes(t, 0, 1) for t in (delta, x, bb, cc)))
    y = jnp.swapaxes(ys, 0, 1)
    if d is not None:
        y = y + d * x
    if z is not None:
        y = y * z * jax.nn.sigmoid(z)
    return y, h


def candidate(cv, g):
    return jnp.where(cv >= 0, cv + 0.5, jax.nn.sigmoid(cv)) if g else cv


def coefficients(op, seq, params, dt, cand_g):
    if op == "linear_scan":
        return seq
    if op == "mingru":
        zl, cv = seq
        zz = jax.nn.sigmoid(zl)
        return 1 - zz, zz * candidate(cv, cand_g)
    if op == "minlstm":
        fl, il, cv = seq
        s = jax.nn.softplus(-il) - jax.nn.softplus(-fl)
        return jax.nn.sigmoid(s), jax.nn.sigmoid(-s) * candidate(cv, cand_g)
    (fl,) = seq
    tau, lam = params
    f = jax.nn.sigmoid(fl)
    den = 1 + dt * (1 / tau + f)
    return 1 / den, dt * f * lam / den


def linrec_ref(op, seq, params, dt, h0, reverse, cand_g):
    a, b = coefficients(op, seq, params, dt, cand_g)
    h = jnp.zeros((a.shape[0], a.shape[2]), F64) if h0 is None else h0

    def step(h, t):
        h = t[0] * h + t[1]
        return h, h

    h, hs = lax.scan(step, h, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)), reverse=reverse)
    return jnp.swapaxes(hs, 0, 1), h


# ---- inputs ----


def normal(r, shape, dtype, scale=1.0):
    return jnp.asarray(r.standard_normal(shape) * scale, dtype)


def uniform(r, shape, dtype, lo, hi):
    return jnp.asarray(r.uniform(lo, hi, shape), dtype)


def weights_like(r, t):
    """Random weights of t's dtype (so a cotangent of that dtype is exact)."""
    return None if t is None else normal(r, t.shape, t.dtype)


# ---- the check both op families share ----


def grad_check(name, fusex_fn, ref_fn, args, tol, sums):
    """Forward and gradient of `fusex_fn(*args)` (jitted, on the device
    under test) against `ref_fn` in f64, and on CUDA against fusex's CPU
    handlers. Both return a tuple of outputs; the loss is sum(out * w)."""
    r = rng(name + "/w")
    weights = tuple(normal(r, s.shape, s.dtype) for s in jax.eval_shape(fusex_fn, *args))
    argnums = tuple(i for i, t in enumerate(args) if t is not None)

    def loss(fn):
        # The loss and, as its auxiliary value, the outputs: one compile.
        def value(*xs):
            outs = fn(*xs)
            return sum(jnp.sum(jnp.asarray(o, F64) * jnp.asarray(w, F64)) for o, w in zip(outs, weights)), outs
        return jax.jit(jax.grad(value, argnums=argnums, has_aux=True))

    # The plain forward (no saved states) and the training forward with
    # its backward are different calls: both are checked.
    outs = jax.jit(fusex_fn)(*on(DEVICE, args))
    grads, train_outs = loss(fusex_fn)(*on(DEVICE, args))
    ref_grads, ref_outs = loss(ref_fn)(*on(CPU, f64(args)))
    against(name + " outputs", outs, ref_outs, tol)
    # (CUDA may run another kernel where the forward saves states.)
    against(name + " training outputs", train_outs, outs, tol if ON_CUDA else 0.0)
    against(name + " grads", grads, ref_grads, tol, [sums[i] for i in argnums])
    for g, i in zip(grads, argnums):
        if g.dtype != args[i].dtype or g.shape != args[i].shape:
            raise AssertionError(f"{name}: gradient {i} is {g.dtype}{g.shape}, its input {args[i].dtype}{args[i].shape}")
    if ON_CUDA:
        host_grads, host_outs = loss(fusex_fn)(*on(CPU, args))
        against(name + " outputs vs cpu", outs, host_outs, tol)
        against(name + " grads vs cpu", grads, host_grads, tol, [sums[i] for i in argnums])


# ---- selective scan ----

SSM_ARGS = ("x", "dt", "a", "b", "c", "d", "z", "dt_bias", "h0")


def ssm_inputs(r, batch, seqlen, dim, dstate, groups, dtype, param_dtype, opts):
    bc = (batch, seqlen, groups, dstate) if groups > 1 else (batch, seqlen, dstate)
    x = normal(r, (batch, seqlen, dim), dtype)
    # A step's delta is positive (the decays exp(delta a) below 1): dt as it
    # is without softplus, its argument with it.
    dt = normal(r, (batch, seqlen, dim), dtype, 0.5)
    if "softplus" not in opts:
        dt = jnp.abs(dt)
    a = jnp.asarray(-np.exp(r.standard_normal((dim, dstate)) * 0.5), param_dtype)
    b, c = normal(r, bc, dtype), normal(r, bc, dtype)
    d = normal(r, (dim,), param_dtype) if "d" in opts else None
    z = normal(r, (batch, seqlen, dim), dtype) if "z" in opts else None
    dt_bias = normal(r, (dim,), param_dtype, 0.3) if "bias" in opts else None
    h0 = normal(r, (batch, dim, dstate), param_dtype) if "h0" in opts else None
    return (x, dt, a, b, c, d, z, dt_bias, h0)


def ssm_case(batch, seqlen, dim, dstate, groups, dtype, opts, param_dtype=F32, cuda=True):
    name = (f"selective_scan B{batch} L{seqlen} D{dim} N{dstate} G{groups} {jnp.dtype(dtype).name}"
            f" params {jnp.dtype(param_dtype).name} {'+'.join(sorted(opts)) or 'plain'}")
    softplus, ret = "softplus" in opts, "state" in opts

    @case(name)
    def run():
        if ON_CUDA and not cuda:
            return "cpu only"
        args = ssm_inputs(rng(name), batch, seqlen, dim, dstate, groups, dtype, param_dtype, opts)

        def fusex_fn(x, dt, a, b, c, d, z, dt_bias, h0):
            out = fj.selective_scan(x, dt, a, b, c, d=d, z=z, dt_bias=dt_bias, h0=h0, dt_softplus=softplus,
                                    return_state=ret)
            return out if ret else (out,)

        def ref_fn(*xs):
            y, h = ssm_ref(*xs, softplus)
            return (y, h) if ret else (y,)

        n_bt = batch * seqlen
        sums = [1, 1, n_bt, dim // groups, dim // groups, n_bt, 1, n_bt, 1]
        grad_check(name, fusex_fn, ref_fn, args, max(TOL[jnp.dtype(dtype)], TOL[jnp.dtype(param_dtype)]), sums)


ALL = {"d", "z", "bias", "softplus", "h0", "state"}
ssm_case(1, 1, 3, 1, 1, F32, set())
ssm_case(1, 1, 3, 4, 1, F32, ALL)
ssm_case(2, 7, 4, 4, 1, F32, ALL - {"h0"})
ssm_case(2, 13, 6, 16, 2, F32, {"z", "d", "state"})
ssm_case(1, 33, 8, 5, 1, F32, {"softplus", "bias", "h0"})
ssm_case(3, 31, 5, 3, 1, F32, {"z"})
ssm_case(2, 130, 64, 16, 4, F32, ALL)
ssm_case(1, 257, 16, 16, 1, F32, ALL)
ssm_case(1, 41, 64, 48, 2, F32, ALL)      # CUDA: the sliced forward and backward (states every 16)
ssm_case(1, 23, 64, 64, 1, F32, ALL - {"z"})  # CUDA: states every 8
ssm_case(2, 29, 32, 128, 1, F32, {"z", "softplus", "state"})
ssm_case(2, 31, 32, 16, 1, BF16, ALL)
ssm_case(1, 19, 32, 32, 2, BF16, {"d", "z", "state"}, param_dtype=BF16)
ssm_case(1, 17, 16, 8, 2, F16, {"d", "z", "h0"}, param_dtype=F16)
ssm_case(2, 11, 5, 3, 1, F64, ALL, param_dtype=F64, cuda=False)


def ssm_step_case(batch, dim, dstate, groups, dtype, opts):
    name = f"selective_scan_step B{batch} D{dim} N{dstate} G{groups} {jnp.dtype(dtype).name} {'+'.join(sorted(opts))}"
    softplus = "softplus" in opts

    @case(name)
    def run():
        r = rng(name)
        x, dt, a, b, c, d, z, dt_bias, h0 = ssm_inputs(r, batch, 1, dim, dstate, groups, dtype, F32, opts | {"h0"})
        state = jnp.asarray(h0, F64 if jnp.dtype(dtype) == F64 else F32)
        args = (state, x[:, 0], dt[:, 0], a, b[:, 0], c[:, 0], d, None if z is None else z[:, 0], dt_bias)

        def fusex_fn(state, x, dt, a, b, c, d, z, dt_bias):
            return fj.selective_scan_step(state, x, dt, a, b, c, d=d, z=z, dt_bias=dt_bias, dt_softplus=softplus)

        def ref_fn(state, x, dt, a, b, c, d, z, dt_bias):
            frame = (lambda t: None if t is None else t[:, None])
            y, h = ssm_ref(frame(x), frame(dt), a, frame(b), frame(c), d, frame(z), dt_bias, state, softplus)
            return y[:, 0], h

        sums = [1, 1, 1, batch, dim // groups, dim // groups, batch, 1, batch]
        grad_check(name, fusex_fn, ref_fn, args, TOL[jnp.dtype(dtype)], sums)


ssm_step_case(2, 8, 4, 1, F32, {"d", "z", "bias", "softplus"})
ssm_step_case(3, 64, 16, 4, F32, {"z"})
ssm_step_case(1, 32, 48, 1, BF16, {"d", "softplus"})


@case("selective_scan: steps from h0 equal one call, state carried")
def steps_equal_scan():
    r = rng("steps")
    x, dt, a, b, c, d, z, dt_bias, h0 = ssm_inputs(r, 2, 9, 16, 8, 2, F32, F32, ALL)
    args = on(DEVICE, (x, dt, a, b, c, d, z, dt_bias, h0))

    @jax.jit
    def by_steps(x, dt, a, b, c, d, z, dt_bias, h0):
        def step(state, t):
            y, state = fj.selective_scan_step(state, t[0], t[1], a, t[2], t[3], d=d, z=t[4], dt_bias=dt_bias,
                                              dt_softplus=True)
            return state, y
        state, ys = lax.scan(step, h0, tuple(jnp.swapaxes(t, 0, 1) for t in (x, dt, b, c, z)))
        return jnp.swapaxes(ys, 0, 1), state

    y, state = jax.jit(lambda *v: fj.selective_scan(*v[:5], d=v[5], z=v[6], dt_bias=v[7], h0=v[8],
                                                     dt_softplus=True, return_state=True))(*args)
    ys, states = by_steps(*args)
    check("steps vs one call: y", ys, y, 1e-5)
    check("steps vs one call: state", states, state, 1e-5)


@case("selective_scan_saved_shape: the library's rule")
def saved_shapes():
    # (x shape, a shape, b shape) -> the saved states' shape
    expect = [
        (((2, 40, 8), (8, 16), (2, 40, 16)), (2, 2, 8, 16)),        # every 16 up to dstate 32
        (((1, 16, 8), (8, 4), (1, 16, 4)), (1, 0, 8, 4)),          # one chunk: nothing saved
        (((1, 17, 8), (8, 4), (1, 17, 4)), (1, 1, 8, 4)),
        (((1, 40, 64), (64, 48), (1, 40, 2, 48)), (1, 2, 64, 48)),  # sliced: every 16
        (((1, 40, 64), (64, 64), (1, 40, 64)), (1, 4, 64, 64)),     # dstate 64: every 8
        (((1, 40, 48), (48, 48), (1, 40, 48)), (1, 4, 48, 48)),     # channels per group not 32k: every 8
    ]
    for (xs, as_, bs), want in expect:
        got = fj.selective_scan_saved_shape(xs, as_, bs, F32)
        if got != want:
            raise AssertionError(f"saved shape of x {xs} a {as_} b {bs}: {got}, expected {want}")


@case("selective_scan_saved_shape: sizes no scan has are refused")
def saved_shapes_refused():
    div = "b: expected dstate >= 1 and a number of groups that divides dim"
    expect = [
        (((2, 40, 8), (8, 16), (2, 40, 3, 16)), f"{div} 8, got {{2,40,3,16}}"),
        (((2, 40, 8), (8, 16), (2, 40, 0, 16)), f"{div} 8, got {{2,40,0,16}}"),
        (((2, 40, 8), (8, 0), (2, 40, 0)), f"{div} 8, got {{2,40,0}}"),
        (((2, -1, 8), (8, 4), (2, -1, 4)), "x: expected non-negative dimensions, got -1 at axis 1"),
    ]
    for (xs, as_, bs), want in expect:
        try:
            got = fj.selective_scan_saved_shape(xs, as_, bs, F32)
        except TypeError as e:
            if str(e) != want:
                raise AssertionError(f"saved shape of x {xs} a {as_} b {bs}: {e!r}, expected {want!r}") from None
            continue
        raise AssertionError(f"saved shape of x {xs} a {as_} b {bs}: {got}, expected the error {want!r}")


def expect_equal(what, got, want):
    """Exactly `want` (NaN never passes), shape and all."""
    check(what, got, want, 0.0)


def empty_ssm_case(batch, seqlen, h0):
    # Nothing to scan, but the final state (h0, or zeros) and da, dd,
    # dt_bias (sums over no step: zeros) are results with elements, which
    # the handlers must write: XLA's result buffers start with whatever was
    # there before.
    name = f"selective_scan with nothing to scan: B{batch} L{seqlen}{' h0' if h0 else ''}"

    @case(name)
    def run():
        dim, dstate = 4, 3
        x, dt, a, b, c, d, z, dt_bias, init = ssm_inputs(rng(name), batch, seqlen, dim, dstate, 1, F32, F32,
                                                          {"d", "z", "bias", "softplus", "h0"})
        init = init if h0 else None
        w_state = normal(rng(name + "/w"), (batch, dim, dstate), F32)

        def scan(*xs):
            return fj.selective_scan(*xs[:5], d=xs[5], z=xs[6], dt_bias=xs[7], h0=xs[8], dt_softplus=True,
                                     return_state=True)

        def loss(*xs):
            y, state = scan(*xs)
            return jnp.sum(y) + jnp.sum(state * w_state)

        args = on(DEVICE, (x, dt, a, b, c, d, z, dt_bias, init))
        _, state = jax.jit(scan)(*args)
        expect_equal(name + " state", state, init if h0 else jnp.zeros((batch, dim, dstate), F32))
        argnums = (0, 1, 2, 3, 4, 5, 6, 7) + ((8,) if h0 else ())
        grads = jax.jit(jax.grad(loss, argnums=argnums))(*args)
        for arg_name, g, t in zip(SSM_ARGS, grads, args):
            if arg_name == "h0":
                expect_equal(name + " dh0", g, w_state)
            else:
                expect_equal(f"{name} d{arg_name}", g, jnp.zeros(t.shape, t.dtype))


for h0 in (False, True):
    empty_ssm_case(2, 0, h0)
    empty_ssm_case(0, 3, h0)


# ---- linear recurrences ----

SEQ_NAMES = {"linear_scan": ("a", "b"), "mingru": ("z_logits", "cand"), "minlstm": ("f_logits", "i_logits", "cand"),
             "liquid": ("f_logits",)}


def linrec_inputs(r, op, batch, seqlen, hidden, dtype):
    shape = (batch, seqlen, hidden)
    if op == "linear_scan":
        seq = (uniform(r, shape, dtype, 0.5, 1.0), normal(r, shape, dtype))
    else:
        seq = tuple(normal(r, shape, dtype, 1.5) for _ in SEQ_NAMES[op])
    params = (uniform(r, (hidden,), dtype, 0.5, 2.0), normal(r, (hidden,), dtype)) if op == "liquid" else ()
    return seq, params


def linrec_call(op, seq, params, dt, h0, reverse, cand_g, ret):
    kw = dict(h0=h0, reverse=reverse, return_state=ret)
    if op in ("mingru", "minlstm"):
        kw["candidate_activation"] = "g" if cand_g else "identity"
    if op == "liquid":
        out = fj.liquid(seq[0], params[0], params[1], dt=dt, **kw)
    else:
        out = getattr(fj, op)(*seq, **kw)
    return out if ret else (out,)


def linrec_case(op, batch, seqlen, hidden, dtype, reverse=False, h0=False, ret=False, cand_g=False, dt="scalar",
                cuda=True):
    name = (f"{op} B{batch} L{seqlen} H{hidden} {jnp.dtype(dtype).name}{' reverse' if reverse else ''}"
            f"{' h0' if h0 else ''}{' state' if ret else ''}{' g' if cand_g else ''}"
            f"{' dt=' + dt if op == 'liquid' else ''}")

    @case(name)
    def run():
        if ON_CUDA and not cuda:
            return "cpu only"
        r = rng(name)
        seq, params = linrec_inputs(r, op, batch, seqlen, hidden, dtype)
        state_dtype = F64 if jnp.dtype(dtype) == F64 else F32
        init = normal(r, (batch, hidden), state_dtype if h0 == "state" else dtype) if h0 else None
        dt_value = 0.7
        dt_arr = None
        if op == "liquid" and dt == "tensor":
            dt_arr = uniform(r, (batch, seqlen, 1), dtype, 0.1, 1.0)
        elif op == "liquid" and dt == "array0":
            dt_arr = jnp.asarray(0.4, dtype)
        nseq, nparams = len(seq), len(params)
        args = seq + params + (dt_arr, init)

        def split(xs):
            return xs[:nseq], xs[nseq:nseq + nparams], xs[nseq + nparams], xs[nseq + nparams + 1]

        def fusex_fn(*xs):
            s, p, d, h = split(xs)
            return linrec_call(op, s, p, dt_value if d is None else d, h, reverse, cand_g, ret)

        def ref_fn(*xs):
            s, p, d, h = split(xs)
            hs, final = linrec_ref(op, s, p, dt_value if d is None else d, h, reverse, cand_g)
            return (hs, final) if ret else (hs,)

        n_bt = batch * seqlen
        dt_sum = hidden
        sums = [1] * nseq + [n_bt] * nparams + [dt_sum, 1]
        grad_check(name, fusex_fn, ref_fn, args, TOL[jnp.dtype(dtype)], sums)


for op in ("linear_scan", "mingru", "minlstm", "liquid"):
    linrec_case(op, 1, 1, 1, F32)
    linrec_case(op, 2, 7, 5, F32, reverse=True, h0=True, ret=True, cand_g=True)
    linrec_case(op, 3, 13, 4, F32, h0="state", ret=True, dt="tensor")
    linrec_case(op, 2, 67, 33, F32, reverse=True)
    linrec_case(op, 1, 301, 8, F32, h0=True, cand_g=True, ret=True)
    linrec_case(op, 2, 17, 16, BF16, h0="state", ret=True, dt="tensor")
    linrec_case(op, 1, 9, 12, F16, reverse=True, h0=True, cand_g=True)
    linrec_case(op, 2, 5, 3, F64, h0=True, ret=True, reverse=True, dt="tensor", cuda=False)
# A dt of shape () gets its gradient from JAX's sum of the dt tensor's, in
# the inputs' type: in f32 that sum of random-sign terms has no relative
# accuracy to speak of, so it is checked in f64.
linrec_case("liquid", 2, 29, 7, F64, reverse=True, dt="array0", cuda=False)


def empty_linrec_case(op, batch, seqlen, h0):
    # As empty_ssm_case: the final state (h0, or zeros), liquid's dtau, da
    # and dh0 (dstate) are results with elements.
    name = f"{op} with nothing to scan: B{batch} L{seqlen}{' h0' if h0 else ''}"

    @case(name)
    def run():
        hidden = 5
        r = rng(name)
        seq, params = linrec_inputs(r, op, batch, seqlen, hidden, F32)
        dt = uniform(r, (batch, seqlen, 1), F32, 0.1, 1.0) if op == "liquid" else None
        init = normal(r, (batch, hidden), F32) if h0 else None
        w_state = normal(rng(name + "/w"), (batch, hidden), F32)
        nseq, nparams = len(seq), len(params)
        args = on(DEVICE, seq + params + (dt, init))

        def scan(*xs):
            s, p = xs[:nseq], xs[nseq:nseq + nparams]
            return linrec_call(op, s, p, xs[-2], xs[-1], False, False, True)

        def loss(*xs):
            hs, state = scan(*xs)
            return jnp.sum(hs) + jnp.sum(state * w_state)

        _, state = jax.jit(scan)(*args)
        expect_equal(name + " state", state, init if h0 else jnp.zeros((batch, hidden), F32))
        argnums = tuple(i for i, t in enumerate(args) if t is not None)
        grads = jax.jit(jax.grad(loss, argnums=argnums))(*args)
        for i, g in zip(argnums, grads):
            want = w_state if i == len(args) - 1 else jnp.zeros(args[i].shape, args[i].dtype)
            expect_equal(f"{name} gradient {i}", g, want)


for op in ("linear_scan", "mingru", "minlstm", "liquid"):
    for h0 in (False, True):
        empty_linrec_case(op, 2, 0, h0)
        empty_linrec_case(op, 0, 3, h0)


def linrec_step_case(op, batch, hidden, dtype, state_dtype, cand_g=False, dt="scalar"):
    name = (f"{op}_step B{batch} H{hidden} {jnp.dtype(dtype).name} state {jnp.dtype(state_dtype).name}"
            f"{' g' if cand_g else ''}{' dt=' + dt if op == 'liquid' else ''}")

    @case(name)
    def run():
        r = rng(name)
        seq, params = linrec_inputs(r, op, batch, 1, hidden, dtype)
        seq = tuple(t[:, 0] for t in seq)
        state = normal(r, (batch, hidden), state_dtype)
        dt_arr = uniform(r, (batch, 1), dtype, 0.1, 1.0) if op == "liquid" and dt == "tensor" else None
        nseq, nparams = len(seq), len(params)
        args = (state,) + seq + params + (dt_arr,)

        def fusex_fn(state, *xs):
            s, p, d = xs[:nseq], xs[nseq:nseq + nparams], xs[-1]
            kw = {"candidate_activation": "g" if cand_g else "identity"} if op in ("mingru", "minlstm") else {}
            if op == "liquid":
                return fj.liquid_step(state, s[0], p[0], p[1], dt=0.6 if d is None else d)
            return getattr(fj, op + "_step")(state, *s, **kw)

        def ref_fn(state, *xs):
            s, p, d = xs[:nseq], xs[nseq:nseq + nparams], xs[-1]
            frames = tuple(t[:, None] for t in s)
            hs, h = linrec_ref(op, frames, p, 0.6 if d is None else d[:, None], state, False, cand_g)
            return hs[:, 0], h

        sums = [1] + [1] * nseq + [batch] * nparams + [hidden]
        grad_check(name, fusex_fn, ref_fn, args, TOL[jnp.dtype(dtype)], sums)


for op in ("linear_scan", "mingru", "minlstm", "liquid"):
    linrec_step_case(op, 3, 7, F32, F32, cand_g=True, dt="tensor")
    linrec_step_case(op, 2, 16, BF16, F32)
linrec_step_case("mingru", 2, 9, F16, F16)


def host_check(name, fusex_fn, args, tol, sums):
    """CUDA against fusex's CPU handlers (f64 inside) on the same inputs:
    shapes too large for the jnp references, which take fusex's other
    CUDA kernels (the warp-specialized and sliced selective scans, the
    streaming and chained linrec scans)."""
    r = rng(name + "/w")
    weights = tuple(normal(r, s.shape, s.dtype) for s in jax.eval_shape(fusex_fn, *args))
    argnums = tuple(i for i, t in enumerate(args) if t is not None)

    def value(*xs):
        outs = fusex_fn(*xs)
        return sum(jnp.sum(jnp.asarray(o, F64) * jnp.asarray(w, F64)) for o, w in zip(outs, weights)), outs

    run = jax.jit(jax.grad(value, argnums=argnums, has_aux=True))
    outs = jax.jit(fusex_fn)(*on(DEVICE, args))
    grads, _ = run(*on(DEVICE, args))
    host_grads, host_outs = run(*on(CPU, args))
    against(name + " outputs vs cpu", outs, host_outs, tol)
    against(name + " grads vs cpu", grads, host_grads, tol, [sums[i] for i in argnums])


def large_ssm_case(batch, seqlen, dim, dstate, groups, dtype):
    name = f"cuda vs cpu: selective_scan B{batch} L{seqlen} D{dim} N{dstate} G{groups} {jnp.dtype(dtype).name}"

    @case(name)
    def run():
        if not ON_CUDA:
            return "cuda only"
        args = ssm_inputs(rng(name), batch, seqlen, dim, dstate, groups, dtype, F32, ALL)

        def fusex_fn(x, dt, a, b, c, d, z, dt_bias, h0):
            return fj.selective_scan(x, dt, a, b, c, d=d, z=z, dt_bias=dt_bias, h0=h0, dt_softplus=True,
                                     return_state=True)

        n_bt = batch * seqlen
        host_check(name, fusex_fn, args, TOL[jnp.dtype(dtype)],
                   [1, 1, n_bt, dim // groups, dim // groups, n_bt, 1, n_bt, 1])


def large_linrec_case(op, batch, seqlen, hidden, reverse=False, dt_tensor=False):
    name = f"cuda vs cpu: {op} B{batch} L{seqlen} H{hidden} float32{' reverse' if reverse else ''}"

    @case(name)
    def run():
        if not ON_CUDA:
            return "cuda only"
        r = rng(name)
        seq, params = linrec_inputs(r, op, batch, seqlen, hidden, F32)
        h0 = normal(r, (batch, hidden), F32)
        dt = uniform(r, (batch, seqlen, 1), F32, 0.1, 1.0) if dt_tensor else None
        nseq, nparams = len(seq), len(params)

        def fusex_fn(*xs):
            s, p, d, h = xs[:nseq], xs[nseq:nseq + nparams], xs[-2], xs[-1]
            return linrec_call(op, s, p, 0.5 if d is None else d, h, reverse, False, True)

        n_bt = batch * seqlen
        host_check(name, fusex_fn, seq + params + (dt, h0), TOL[jnp.dtype(F32)],
                   [1] * nseq + [n_bt] * nparams + [hidden, 1])


large_ssm_case(4, 1024, 1024, 16, 1, F32)   # the warp-specialized forward
large_ssm_case(2, 300, 256, 16, 1, BF16)
large_ssm_case(2, 257, 512, 128, 2, F32)    # the sliced forward and backward
large_ssm_case(1, 200, 256, 256, 1, BF16)
large_linrec_case("mingru", 16, 256, 1024)  # the streaming kernels
large_linrec_case("liquid", 16, 128, 1024, dt_tensor=True)
large_linrec_case("minlstm", 8, 200, 1536, reverse=True)
large_linrec_case("linear_scan", 1, 4097, 256, reverse=True)  # chained tiles, look-back


@case("mingru under vmap (sequential) equals a loop")
def vmapped():
    r = rng("vmap")
    zl, cv = normal(r, (3, 2, 11, 6), F32), normal(r, (3, 2, 11, 6), F32)
    got = jax.jit(jax.vmap(lambda a, b: fj.mingru(a, b)))(*on(DEVICE, (zl, cv)))
    for i in range(3):
        check(f"vmap row {i}", got[i], fj.mingru(*on(DEVICE, (zl[i], cv[i]))), 0.0 if not ON_CUDA else 1e-6)


# ---- the form EXLA emits ----


def compile_stablehlo(text, dev):
    """Compiles StableHLO text with JAX's client for `dev`'s platform, as
    EXLA compiles what it emits: no JAX tracing, no ffi_call."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client as xc
    backend = xla_bridge.get_backend(dev.platform)
    devices = xc.DeviceList((dev,))
    compile_fn = getattr(backend, "compile_and_load", None) or backend.compile
    return compile_fn(text, devices, xc.CompileOptions())


def run_compiled(exe, args):
    outs = exe.execute_sharded([jax.device_put(a, DEVICE) for a in args])
    return [np.asarray(o[0]) for o in outs.disassemble_into_single_device_arrays()]


def ttype(shape, dtype="f32"):
    return "tensor<" + "".join(f"{n}x" for n in shape) + dtype + ">"


@case("EXLA form: stablehlo.custom_call, api_version 4, backend_config dictionary, tuple results")
def exla_form():
    r = rng("exla")
    batch, seqlen, dim, dstate = 2, 40, 8, 4
    x, dt, a, b, c, d, _, _, _ = ssm_inputs(r, batch, seqlen, dim, dstate, 1, F32, F32, {"d"})
    dy = normal(r, x.shape, F32)
    zl, cv = normal(r, (batch, seqlen, dim), F32), normal(r, (batch, seqlen, dim), F32)
    state0 = normal(r, (batch, dim), F32)
    saved = fj.selective_scan_saved_shape(x.shape, a.shape, b.shape, F32)
    tx, ta, tb, td = ttype(x.shape), ttype(a.shape), ttype(b.shape), ttype(d.shape)
    ts, tsv, th = ttype((batch, dim, dstate)), ttype(saved), ttype((batch, dim))
    flags = "dt_softplus = 1 : i64, has_d = 1 : i64, has_z = 0 : i64, has_dt_bias = 0 : i64, has_h0 = 0 : i64"
    text = f"""
module @exla_form {{
  func.func public @main(%x: {tx}, %dt: {tx}, %a: {ta}, %b: {tb}, %c: {tb}, %d: {td}, %dy: {tx},
                         %zl: {tx}, %cv: {tx}, %s0: {th}) -> ({tx}, {ts}, {tx}, {tx}, {ta}, {tb}, {tb}, {td}, {tx}, {th}, {th}, {th}) {{
    %r:3 = "stablehlo.custom_call"(%x, %dt, %a, %b, %c, %d) {{call_target_name = "fusex_selective_scan_fwd", api_version = 4 : i32, backend_config = {{{flags}, return_state = 1 : i64, save = 1 : i64}}}} : ({tx}, {tx}, {ta}, {tb}, {tb}, {td}) -> ({tx}, {ts}, {tsv})
    %g:6 = "stablehlo.custom_call"(%x, %dt, %a, %b, %c, %d, %r#2, %dy, %r#1) {{call_target_name = "fusex_selective_scan_bwd", api_version = 4 : i32, backend_config = {{{flags}, has_dstate = 1 : i64}}}} : ({tx}, {tx}, {ta}, {tb}, {tb}, {td}, {tsv}, {tx}, {ts}) -> ({tx}, {tx}, {ta}, {tb}, {tb}, {td})
    %m:2 = "stablehlo.custom_call"(%zl, %cv, %s0) {{call_target_name = "fusex_mingru_fwd", api_version = 4 : i32, backend_config = {{reverse = 1 : i64, candidate_g = 1 : i64, has_h0 = 1 : i64, return_state = 1 : i64}}}} : ({tx}, {tx}, {th}) -> ({tx}, {th})
    %fl = stablehlo.slice %zl [0:2, 0:1, 0:8] : ({tx}) -> {ttype((batch, 1, dim))}
    %f = stablehlo.reshape %fl : ({ttype((batch, 1, dim))}) -> {th}
    %tau = stablehlo.slice %a [0:8, 0:1] : ({ta}) -> {ttype((dim, 1))}
    %tau1 = stablehlo.reshape %tau : ({ttype((dim, 1))}) -> {td}
    %one = stablehlo.constant dense<2.0> : {td}
    %taup = stablehlo.add %one, %tau1 : {td}
    %q:2 = "stablehlo.custom_call"(%s0, %f, %taup, %d) {{call_target_name = "fusex_liquid_step", api_version = 4 : i32, backend_config = {{reverse = 0 : i64, has_dt = 0 : i64, dt = 5.000000e-01 : f64}}}} : ({th}, {th}, {td}, {td}) -> ({th}, {th})
    func.return %r#0, %r#1, %g#0, %g#1, %g#2, %g#3, %g#4, %g#5, %m#0, %m#1, %q#0, %q#1 : {tx}, {ts}, {tx}, {tx}, {ta}, {tb}, {tb}, {td}, {tx}, {th}, {th}, {th}
  }}
}}"""
    exe = compile_stablehlo(text, DEVICE)
    got = run_compiled(exe, [x, dt, a, b, c, d, dy, zl, cv, state0])

    # The same through fusex_jax (whose results the other cases check
    # against the references).
    def through_jax(x, dt, a, b, c, d, dy, zl, cv, s0):
        (y, st), vjp = jax.vjp(lambda x, dt, a, b, c, d: fj.selective_scan(x, dt, a, b, c, d=d, dt_softplus=True,
                                                                            return_state=True), x, dt, a, b, c, d)
        grads = vjp((dy, st))
        h, hs = fj.mingru(zl, cv, h0=s0, reverse=True, candidate_activation="g", return_state=True)
        lq = fj.liquid_step(s0, zl[:, 0], 2.0 + a[:, 0], d, dt=0.5)
        return (y, st) + tuple(grads) + (h, hs) + tuple(lq)

    want = jax.jit(through_jax)(*on(DEVICE, (x, dt, a, b, c, d, dy, zl, cv, state0)))
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} results, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        check(f"EXLA form result {i}", g, w, 1e-5 if ON_CUDA else 1e-6)


# ---- bad input through the handlers ----

ERRORS = []


def error_case(expected, fn, *args, exc=None):
    ERRORS.append((expected, fn, args, exc))


def f32(*shape):
    return jnp.ones(shape, F32)


def of(dtype, *shape):
    return jnp.ones(shape, dtype)


def ssm_fwd(**kw):
    def run(x=f32(2, 5, 4), dt=f32(2, 5, 4), a=-f32(4, 3), b=f32(2, 5, 3), c=f32(2, 5, 3), **opts):
        return fj.selective_scan(x, dt, a, b, c, **opts)
    return lambda: run(**kw)


FLOATS = "{f,32}, {bf,16}, {f,16}"
error_case(f"fusex_selective_scan_fwd: x: expected a float type ({FLOATS}", ssm_fwd(x=of(jnp.int32, 2, 5, 4)))
error_case("fusex_selective_scan_fwd: x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,5}",
           ssm_fwd(x=f32(2, 5)))
error_case("fusex_selective_scan_fwd: dt: expected shape {2,5,4} [batch, seqlen, dim], got {2,5,3}",
           ssm_fwd(dt=f32(2, 5, 3)))
error_case("fusex_selective_scan_fwd: dt: expected type {f,32}, got {bf,16}", ssm_fwd(dt=of(BF16, 2, 5, 4)))
error_case("fusex_selective_scan_fwd: a: expected shape {4,3} [dim, dstate], got {5,3}", ssm_fwd(a=f32(5, 3)))
error_case("fusex_selective_scan_fwd: a: expected rank 2 [dim, dstate], got rank 1 shape {4}", ssm_fwd(a=f32(4)))
error_case("fusex_selective_scan_fwd: b: expected a number of groups that divides dim 4 "
           "[batch, seqlen, groups, dstate], got 3", ssm_fwd(b=f32(2, 5, 3, 3), c=f32(2, 5, 3, 3)))
error_case("fusex_selective_scan_fwd: b: expected shape {2,5,3} [batch, seqlen, dstate], got {2,4,3}",
           ssm_fwd(b=f32(2, 4, 3)))
error_case("fusex_selective_scan_fwd: c: expected shape {2,5,3} (the shape of b), got {2,5,2}",
           ssm_fwd(c=f32(2, 5, 2)))
error_case("fusex_selective_scan_fwd: b: expected a float type", ssm_fwd(b=of(jnp.int8, 2, 5, 3)))
error_case("fusex_selective_scan_fwd: d: expected shape {4} [dim], got {5}", ssm_fwd(d=f32(5)))
error_case("fusex_selective_scan_fwd: z: expected type {f,32}, got {f,16}", ssm_fwd(z=of(F16, 2, 5, 4)))
error_case("fusex_selective_scan_fwd: dt_bias: expected shape {4} [dim], got {3}", ssm_fwd(dt_bias=f32(3)))
error_case("fusex_selective_scan_fwd: h0: expected shape {2,4,3} [batch, dim, dstate], got {2,4,2}",
           ssm_fwd(h0=f32(2, 4, 2)))
error_case("fusex_selective_scan_fwd: a: expected a float type", ssm_fwd(a=of(jnp.int32, 4, 3)))


def ssm_step(**kw):
    def run(state=f32(2, 4, 3), x=f32(2, 4), dt=f32(2, 4), a=-f32(4, 3), b=f32(2, 3), c=f32(2, 3), **opts):
        return fj.selective_scan_step(state, x, dt, a, b, c, **opts)
    return lambda: run(**kw)


error_case("fusex_selective_scan_step: state: expected type {f,32}", ssm_step(state=of(BF16, 2, 4, 3)))
error_case("fusex_selective_scan_step: state: expected shape {2,4,3} [batch, dim, dstate], got {2,4,4}",
           ssm_step(state=f32(2, 4, 4)))
error_case("fusex_selective_scan_step: x: expected rank 2 [batch, dim], got rank 3 shape {2,1,4}",
           ssm_step(x=f32(2, 1, 4)))
error_case("fusex_selective_scan_step: b: expected rank 2 [batch, dstate] or rank 3 [batch, groups, dstate], "
           "got rank 1 shape {3}", ssm_step(b=f32(3), c=f32(3)))
error_case("fusex_selective_scan_step: z: expected shape {2,4} [batch, dim], got {2,5}", ssm_step(z=f32(2, 5)))

error_case("fusex_linear_scan_fwd: b: expected shape {2,3,4} ([batch, seqlen, hidden], as a), got {2,3,5}",
           lambda: fj.linear_scan(f32(2, 3, 4), f32(2, 3, 5)))
error_case("fusex_mingru_fwd: cand: expected type {f,32}, got {f,16}",
           lambda: fj.mingru(f32(2, 3, 4), of(F16, 2, 3, 4)))
error_case("fusex_minlstm_fwd: f_logits: expected rank 3 [batch, seqlen, hidden], got rank 2 shape {2,4}",
           lambda: fj.minlstm(f32(2, 4), f32(2, 4), f32(2, 4)))
error_case("fusex_minlstm_fwd: cand: expected shape {2,3,4} ([batch, seqlen, hidden], as f_logits), got {2,4}",
           lambda: fj.minlstm(f32(2, 3, 4), f32(2, 3, 4), f32(2, 4)))
error_case("fusex_mingru_fwd: h0: expected type {f,32}, got {bf,16}",
           lambda: fj.mingru(f32(2, 3, 4), f32(2, 3, 4), h0=of(BF16, 2, 4)))
error_case("fusex_mingru_fwd: h0: expected type {f,16} or {f,32}, got {bf,16}",
           lambda: fj.mingru(of(F16, 2, 3, 4), of(F16, 2, 3, 4), h0=of(BF16, 2, 4)))
error_case("fusex_linear_scan_fwd: h0: expected shape {2,4} ([batch, hidden]), got {2,5}",
           lambda: fj.linear_scan(f32(2, 3, 4), f32(2, 3, 4), h0=f32(2, 5)))
error_case("fusex_linear_scan_fwd: a: expected a float type", lambda: fj.linear_scan(of(jnp.int32, 2, 3, 4),
                                                                                      of(jnp.int32, 2, 3, 4)))
error_case("fusex_liquid_fwd: tau: expected shape {4} ([hidden]), got {5}",
           lambda: fj.liquid(f32(2, 3, 4), f32(5), f32(4)))
error_case("fusex_liquid_fwd: a: expected shape {4} ([hidden]), got {2,4}",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(2, 4)))
error_case("fusex_liquid_fwd: dt: expected shape {2,3,1} ([batch, seqlen, 1]), got {2,3,2}",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=f32(2, 3, 2)))
error_case("fusex_liquid_fwd: dt: expected a positive number or a tensor ([batch, seqlen, 1]), got -1",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=-1.0))
error_case("fusex_liquid_fwd: dt: expected a positive number or a tensor ([batch, seqlen, 1]), got 0",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=0))
error_case("fusex_liquid_fwd: dt: expected a positive number or a tensor ([batch, seqlen, 1]), got inf",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=float("inf")))
error_case("fusex_liquid_step: dt: expected a positive number or a tensor ([batch, 1]), got nan",
           lambda: fj.liquid_step(f32(2, 4), f32(2, 4), f32(4), f32(4), dt=float("nan")))
error_case("fusex_liquid_step: dt: expected shape {2,1} ([batch, 1]), got {2,3,1}",
           lambda: fj.liquid_step(f32(2, 4), f32(2, 4), f32(4), f32(4), dt=f32(2, 3, 1)))
error_case("fusex_mingru_step: state: expected shape {2,4} ([batch, hidden]), got {2,5}",
           lambda: fj.mingru_step(f32(2, 5), f32(2, 4), f32(2, 4)))
error_case("fusex_linear_scan_step: a: expected rank 2 [batch, hidden], got rank 3 shape {2,3,4}",
           lambda: fj.linear_scan_step(f32(2, 4), f32(2, 3, 4), f32(2, 3, 4)))
error_case("candidate_activation: expected identity or g, got 'relu'",
           lambda: fj.mingru(f32(2, 3, 4), f32(2, 3, 4), candidate_activation="relu"), exc=ValueError)


def raw(target, results, operands, **attrs):
    """An ffi_call with whatever operands, results and attributes."""
    def run():
        shapes = [jax.ShapeDtypeStruct(s, t) for s, t in results]
        return jax.ffi.ffi_call(target, shapes)(*operands, **attrs)
    return run


I = np.int64  # noqa: E741
SCAN_FLAGS = dict(reverse=I(0), has_h0=I(0), return_state=I(0))
error_case("fusex_linear_scan_fwd: has_h0: expected an attribute 0 or 1 (i64), got none",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, reverse=I(0), return_state=I(0)))
error_case("fusex_linear_scan_fwd: attributes: expected only reverse, has_h0, return_state, got revers",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, revers=I(0), has_h0=I(0),
               return_state=I(0)))
error_case("fusex_linear_scan_fwd: reverse: expected 0 or 1, got 2",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, **dict(SCAN_FLAGS, reverse=I(2))))
error_case("fusex_linear_scan_fwd: reverse: expected an integer attribute 0 or 1 (i64), got an f32",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2,
               **dict(SCAN_FLAGS, reverse=np.float32(1))))
error_case("fusex_linear_scan_fwd: reverse: expected an integer attribute 0 or 1 (i64), got a string",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, **dict(SCAN_FLAGS, reverse="yes")))
error_case("fusex_liquid_fwd: dt: expected a number attribute (f64), got a string",
           raw("fusex_liquid_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4), f32(4), f32(4)], reverse=I(0), has_h0=I(0),
               return_state=I(0), has_dt=I(0), dt="1"))
error_case("fusex_linear_scan_fwd: operands: expected 3 (a, b, h0), got 2",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, **dict(SCAN_FLAGS, has_h0=I(1))))
error_case("fusex_linear_scan_fwd: results: expected 2 (h, state), got 1",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2,
               **dict(SCAN_FLAGS, return_state=I(1))))
error_case("fusex_linear_scan_fwd: h: expected shape {2,3,4} ([batch, seqlen, hidden]), got {2,3,5}",
           raw("fusex_linear_scan_fwd", [((2, 3, 5), F32)], [f32(2, 3, 4)] * 2, **SCAN_FLAGS))
error_case("fusex_linear_scan_fwd: h: expected type {f,32}, got {bf,16}",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), BF16)], [f32(2, 3, 4)] * 2, **SCAN_FLAGS))
error_case("fusex_linear_scan_fwd: state: expected type {f,32}, got {f,16}",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F16), ((2, 4), F16)], [of(F16, 2, 3, 4)] * 2,
               **dict(SCAN_FLAGS, return_state=I(1))))
error_case("fusex_linear_scan_fwd: a: expected rank at most 8, got rank 9",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(*[1] * 9), f32(2, 3, 4)], **SCAN_FLAGS))
error_case("fusex_linear_scan_bwd: h: expected shape {2,3,4} ([batch, seqlen, hidden], the forward's output), "
           "got {2,3,5}", raw("fusex_linear_scan_bwd", [((2, 3, 4), F32)] * 2,
                              [f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 5), f32(2, 3, 4)],
                              reverse=I(0), has_h0=I(0), has_dstate=I(0)))
error_case("fusex_linear_scan_bwd: dh: expected type {f,32}, got {bf,16}",
           raw("fusex_linear_scan_bwd", [((2, 3, 4), F32)] * 2,
               [f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 4), of(BF16, 2, 3, 4)],
               reverse=I(0), has_h0=I(0), has_dstate=I(0)))
error_case("fusex_linear_scan_bwd: db: expected shape {2,3,4} (the shape of its input), got {2,3,3}",
           raw("fusex_linear_scan_bwd", [((2, 3, 4), F32), ((2, 3, 3), F32)], [f32(2, 3, 4)] * 4,
               reverse=I(0), has_h0=I(0), has_dstate=I(0)))
error_case("fusex_liquid_bwd: results: expected 4 (df_logits, dtau, da, ddt), got 3",
           raw("fusex_liquid_bwd", [((2, 3, 4), F32), ((4,), F32), ((4,), F32)],
               [f32(2, 3, 4), f32(4), f32(4), f32(2, 3, 1), f32(2, 3, 4), f32(2, 3, 4)],
               reverse=I(0), has_h0=I(0), has_dstate=I(0), has_dt=I(1), dt=np.float64(1)))
error_case("fusex_linear_scan_step: new_state: expected shape {2,4} (the shape of state), got {2,5}",
           raw("fusex_linear_scan_step", [((2, 4), F32), ((2, 5), F32)], [f32(2, 4)] * 3, reverse=I(0)))

SSM_FLAGS = dict(dt_softplus=I(0), has_d=I(0), has_z=I(0), has_dt_bias=I(0), has_h0=I(0))
SSM_IN = [f32(1, 40, 4), f32(1, 40, 4), -f32(4, 3), f32(1, 40, 3), f32(1, 40, 3)]
error_case("fusex_selective_scan_fwd: saved: expected shape {1,2,4,3} ([batch, nsaved, dim, dstate], the states "
           "entering each chunk after the first), got {1,3,4,3}",
           raw("fusex_selective_scan_fwd", [((1, 40, 4), F32), ((1, 3, 4, 3), F32)], SSM_IN,
               **SSM_FLAGS, return_state=I(0), save=I(1)))
error_case("fusex_selective_scan_fwd: saved: expected type {f,32}, got {bf,16}",
           raw("fusex_selective_scan_fwd", [((1, 40, 4), F32), ((1, 2, 4, 3), BF16)], SSM_IN,
               **SSM_FLAGS, return_state=I(0), save=I(1)))
error_case("fusex_selective_scan_fwd: state: expected shape {1,4,3} [batch, dim, dstate], got {1,3,4}",
           raw("fusex_selective_scan_fwd", [((1, 40, 4), F32), ((1, 3, 4), F32)], SSM_IN,
               **SSM_FLAGS, return_state=I(1), save=I(0)))
SSM_ONE_CHUNK = [f32(1, 9, 4), f32(1, 9, 4), -f32(4, 3), f32(1, 9, 3), f32(1, 9, 3)]
error_case("fusex_selective_scan_fwd: results: expected 1 (y), got 2",  # one chunk: no saved states
           raw("fusex_selective_scan_fwd", [((1, 9, 4), F32), ((1, 0, 4, 3), F32)], SSM_ONE_CHUNK,
               **SSM_FLAGS, return_state=I(0), save=I(1)))
error_case("fusex_selective_scan_bwd: operands: expected 6 (x, dt, a, b, c, dy), got 7",
           raw("fusex_selective_scan_bwd", [((1, 9, 4), F32), ((1, 9, 4), F32), ((4, 3), F32), ((1, 9, 3), F32),
                                            ((1, 9, 3), F32)],
               SSM_ONE_CHUNK + [f32(1, 1, 4, 3), f32(1, 9, 4)], **SSM_FLAGS, has_dstate=I(0)))
error_case("fusex_selective_scan_bwd: x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {9,4}",
           raw("fusex_selective_scan_bwd", [((9, 4), F32)], [f32(9, 4)] + SSM_ONE_CHUNK[1:] + [f32(1, 9, 4)],
               **SSM_FLAGS, has_dstate=I(0)))
error_case("fusex_selective_scan_bwd: operands: expected 7 (x, dt, a, b, c, [saved], dy), got 3",
           raw("fusex_selective_scan_bwd", [((1, 9, 4), F32)], SSM_ONE_CHUNK[:3], **SSM_FLAGS, has_dstate=I(0)))
SSM_GRADS = [((1, 40, 4), F32), ((1, 40, 4), F32), ((4, 3), F32), ((1, 40, 3), F32), ((1, 40, 3), F32)]
error_case("fusex_selective_scan_bwd: dy: expected shape {1,40,4} [batch, seqlen, dim], got {1,40,3}",
           raw("fusex_selective_scan_bwd", SSM_GRADS, SSM_IN + [f32(1, 2, 4, 3), f32(1, 40, 3)],
               **SSM_FLAGS, has_dstate=I(0)))
error_case("fusex_selective_scan_bwd: dstate: expected shape {1,4,3} [batch, dim, dstate], got {1,4,4}",
           raw("fusex_selective_scan_bwd", SSM_GRADS, SSM_IN + [f32(1, 2, 4, 3), f32(1, 40, 4), f32(1, 4, 4)],
               **SSM_FLAGS, has_dstate=I(1)))
error_case("fusex_selective_scan_bwd: da: expected type {f,32}, got {f,16}",
           raw("fusex_selective_scan_bwd", SSM_GRADS[:2] + [((4, 3), F16)] + SSM_GRADS[3:],
               SSM_IN + [f32(1, 2, 4, 3), f32(1, 40, 4)], **SSM_FLAGS, has_dstate=I(0)))
error_case("fusex_selective_scan_bwd: operands: expected 7 (x, dt, a, b, c, saved, dy), got 6",
           raw("fusex_selective_scan_bwd", SSM_GRADS, SSM_IN + [f32(1, 40, 4)], **SSM_FLAGS, has_dstate=I(0)))
error_case("fusex_selective_scan_step: new_state: expected type {f,32}, got {bf,16}",
           raw("fusex_selective_scan_step", [((2, 4), F32), ((2, 4, 3), BF16)],
               [f32(2, 4, 3), f32(2, 4), f32(2, 4), -f32(4, 3), f32(2, 3), f32(2, 3)],
               dt_softplus=I(0), has_d=I(0), has_z=I(0), has_dt_bias=I(0)))

if ON_CUDA:
    error_case("fusex_selective_scan_fwd: x: expected type {f,32}, {bf,16} or {f,16} on cuda:0 "
               "({f,64} runs on cpu only), got {f,64}",
               ssm_fwd(x=of(F64, 2, 5, 4), dt=of(F64, 2, 5, 4), b=of(F64, 2, 5, 3), c=of(F64, 2, 5, 3)))
    error_case("fusex_selective_scan_fwd: a: expected dstate <= 256 on cuda:0 [dim, dstate], got 257",
               ssm_fwd(a=-f32(4, 257), b=f32(2, 5, 257), c=f32(2, 5, 257)))
    error_case("fusex_mingru_fwd: z_logits: expected type {f,32}, {bf,16} or {f,16} on cuda:0",
               lambda: fj.mingru(of(F64, 2, 3, 4), of(F64, 2, 3, 4)))
else:
    error_case(f"fusex_selective_scan_fwd: x: expected a float type ({FLOATS} or {{f,64}}), got {{s,32}}",
               ssm_fwd(x=of(jnp.int32, 2, 5, 4)))


@case(f"bad input: {len(ERRORS)} calls, each a clean exception naming the argument")
def bad_inputs():
    failures = []
    for expected, fn, args, exc in ERRORS:
        try:
            with jax.default_device(DEVICE):
                jax.block_until_ready(jax.jit(fn)(*args) if not exc else fn(*args))
        except Exception as e:  # noqa: BLE001 - the test inspects what came
            wanted = exc or jax.errors.JaxRuntimeError
            if not isinstance(e, wanted) or expected not in str(e):
                failures.append(f"expected {wanted.__name__} with {expected!r}, got {type(e).__name__}: {e}")
            continue
        failures.append(f"expected an error with {expected!r}, got none")
    if failures:
        raise AssertionError(f"{len(failures)} of {len(ERRORS)}:\n  " + "\n  ".join(failures))


# ---- main ----


def main():
    print(f"fusex_jax tests: jax {jax.__version__} on {DEVICE} ({DEVICE.platform}), library {fj.library_path()}, "
          f"FUSEX_SEED={SEED}")
    if ON_CUDA:
        why = fj.cuda_unavailable_reason()
        if why:
            print(f"FAIL: fusex's CUDA handlers cannot run: {why}")
            return 1
    failed, ran, elsewhere = [], 0, 0
    start = time.time()
    for name, fn in CASES:
        if ONLY and ONLY not in name:
            continue
        t0 = time.time()
        ran += 1
        STATS["case_worst"] = 0.0
        try:
            note = fn()
            elsewhere += bool(note)
            worst = f", worst error {STATS['case_worst']:.2g} of its tolerance" if STATS["case_worst"] else ""
            print(f"  ok   {name} ({time.time() - t0:.1f}s{worst}){' [' + note + ']' if note else ''}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, counted, the run goes on
            failed.append(name)
            print(f"  FAIL {name}: {type(e).__name__}: {e}", flush=True)
            if not isinstance(e, AssertionError):
                traceback.print_exc()
    errs = ", ".join(f"tol {k}: max {v:.3g}" for k, v in sorted(STATS["max_err"].items()))
    print(f"fusex_jax: {ran - elsewhere - len(failed)} of {ran - elsewhere} cases passed ({elsewhere} more are for "
          f"the other platform), {STATS['compared']} comparisons ({errs}), {len(ERRORS)} bad inputs, "
          f"{time.time() - start:.0f}s, FUSEX_SEED={SEED}")
    if failed:
        print("failed:\n  " + "\n  ".join(failed))
    return 1 if failed or ran == elsewhere else 0


if __name__ == "__main__":
    sys.exit(main())
