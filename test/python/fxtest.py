"""The shared runner of the fusex_jax suite (test/python/test_fusex_jax.py
runs it): cases registered by name, comparisons by rel-L2 against f64
references, the gradient check both ways, bad input that must raise, the
scalar kinds every scalar option is given, and main().

A family's cases live in test/python/test_<family>.py: it imports this
module (``from fxtest import *``), registers its cases with ``@case``,
``error_case`` and ``scalar_options_case``, and is found by the runner.

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
from jax import lax  # noqa: E402,F401 - for the family files

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


def expect_equal(what, got, want):
    """Exactly `want` (NaN never passes), shape and all."""
    check(what, got, want, 0.0)


# ---- bad input ----

ERRORS = []


def error_case(expected, fn, *args, exc=None):
    """`fn(*args)` under jax.jit raises: by default fusex's ArgumentError
    whose message starts with `expected` (the op layer's, at trace time:
    no target's name before it); with `exc` that exception, its message
    containing `expected`."""
    ERRORS.append((expected, fn, args, exc))


def handler_error_case(expected, fn, *args):
    """A call that only a handler refuses, when the program runs: a
    JaxRuntimeError whose message contains `expected` ("fusex_<target>:
    ...")."""
    error_case(expected, fn, *args, exc=jax.errors.JaxRuntimeError)


def f32(*shape):
    return jnp.ones(shape, F32)


def of(dtype, *shape):
    return jnp.ones(shape, dtype)


def raw(target, results, operands, **attrs):
    """An ffi_call with whatever operands, results and attributes."""
    def run():
        shapes = [jax.ShapeDtypeStruct(s, t) for s, t in results]
        return jax.ffi.ffi_call(target, shapes)(*operands, **attrs)
    return run


I = np.int64  # noqa: E741
FLOATS = "{f,32}, {bf,16}, {f,16}"


def bad_inputs():
    failures = []
    for expected, fn, args, exc in ERRORS:
        try:
            with jax.default_device(DEVICE):
                jax.block_until_ready(jax.jit(fn)(*args))
        except Exception as e:  # noqa: BLE001 - the test inspects what came
            if exc is None:
                if not isinstance(e, fj.ArgumentError) or not str(e).startswith(expected):
                    failures.append(f"expected ArgumentError {expected!r}, got {type(e).__name__}: {e}")
            elif not isinstance(e, exc) or expected not in str(e):
                failures.append(f"expected {exc.__name__} with {expected!r}, got {type(e).__name__}: {e}")
            continue
        failures.append(f"expected an error with {expected!r}, got none")
    if failures:
        raise AssertionError(f"{len(failures)} of {len(ERRORS)}:\n  " + "\n  ".join(failures))


# ---- the scalar options: every kind of scalar ----

# Kinds a flag takes (each with the boolean it stands for) and kinds it
# refuses; likewise a positive number's.
FLAG_TAKES = [(True, True), (False, False), (np.True_, True), (np.bool_(False), False), (np.array(True), True),
              (jnp.asarray(False), False)]
FLAG_REFUSES = [0, 1, 2, -1, np.int64(1), np.uint8(0), 0.0, 1.0, np.float32(1), 1j, np.complex64(0), "yes", None, b"1",
                [True], np.array([True]), jnp.asarray(1)]
NUMBER_TAKES = [0.7, 2, np.float32(0.7), np.float64(0.7), np.float16(0.5), jnp.bfloat16(0.5), np.int32(3), np.uint8(1),
                np.array(0.7), np.array(2, np.int64), jnp.asarray(0.7, F32), 10**30]
NUMBER_REFUSES = [0, -1.0, np.float32(-1), np.int32(0), np.array(-0.5), jnp.asarray(0.0), float("inf"), float("nan"),
                  np.float32("nan"), 10**400, True, np.True_, np.array(False), 1j, np.complex128(1), np.array(1 + 0j),
                  "1.0", b"1"]


def option_kinds(desc):
    """The scalar options of a description: {option: "flag" | "choice" |
    "enum" | "number"}."""
    kinds = {}
    for a in desc["attrs"]:
        if a["role"] != "option" or (a["option"] or a["name"]) not in desc["options"]:
            continue
        kind = a["kind"] if a["kind"] in ("number", "enum") else ("choice" if a["choices"] else "flag")
        kinds[a["option"] or a["name"]] = kind
    return kinds


# An enum (an activation) takes its names and None (its first); it
# refuses anything else, in the op layer's list of names.
def choice_list(choices):
    return ", ".join(choices[:-1]) + " or " + choices[-1]


ENUM_REFUSES = [1, 0, True, b"silu", np.int64(0), 0.0]

# A number that need not be positive (a norm's eps) takes zero too; the
# real values its range refuses are the family's to name (the op layer's
# own words, `range_refuses` of scalar_options_case), the rest it refuses
# as not a number.
NONNEGATIVE_TAKES = [0, 0.0, np.int32(0), jnp.asarray(0.0, F32)]
NOT_A_NUMBER = [10**400, True, np.True_, np.array(False), 1j, np.complex128(1), np.array(1 + 0j), "1.0", b"1", None,
                [1.0], np.array([0.5])]


def describe(name):
    return next(d for d in fj.DESCRIPTIONS if d["name"] == name)


def shown(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def scalar_options_case(desc_name, call, range_refuses=None):
    """Every scalar option of description `desc_name` given every kind of
    scalar: what it takes computes as the Python value it stands for
    (`call(**{option: value})` returns the public function's results),
    what it refuses raises ArgumentError naming the option. A number that
    need not be positive refuses the values `range_refuses[option]` lists
    ([(value, message)]) besides every kind that is no number."""
    @case(f"scalar options of {desc_name}: every kind of scalar, taken as its value or refused")
    def run():
        desc = describe(desc_name)
        kinds = option_kinds(desc)
        if not kinds:
            raise AssertionError(f"{desc_name} has no scalar options to test")
        counted = 0
        for option, kind in kinds.items():
            if kind == "flag":
                takes = FLAG_TAKES
                refuses = [(v, f"{option}: expected true or false, got {shown(v)}") for v in FLAG_REFUSES]
            elif kind == "choice":
                choices = next(a["choices"] for a in desc["attrs"] if a["option"] == option)
                takes = [(c, c) for c in choices] + [(np.str_(choices[1]), choices[1])]
                refuses = [(v, f"{option}: expected {choices[0]} or {choices[1]}, got {shown(v)}")
                           for v in [choices[1].upper(), 1, True, None, b"g", [choices[0]]]]
            elif kind == "enum":
                choices = next(a["choices"] for a in desc["attrs"] if (a["option"] or a["name"]) == option)
                takes = [(c, c) for c in choices] + [(None, choices[0]), (np.str_(choices[-1]), choices[-1])]
                refuses = [(v, f"{option}: expected {choice_list(choices)}, got {shown(v)}")
                           for v in ENUM_REFUSES + [choices[-1].upper(), choices[-1] + " ", [choices[0]]]]
            else:
                positive = next(a["positive"] for a in desc["attrs"] if (a["option"] or a["name"]) == option)
                values = NUMBER_TAKES + ([] if positive else NONNEGATIVE_TAKES)
                takes = [(v, float(np.asarray(v, np.float64)) if not isinstance(v, int) else float(v)) for v in values]
                layout = next((s["layout"] for s in desc["inputs"] if s["name"] == option), None)
                expected = ("a positive number" if positive else "a number") + (f" or a tensor ({layout})" if layout
                                                                                 else "")
                if positive:
                    refuses = [(v, f"{option}: expected {expected}, got {refused_text(v)}") for v in NUMBER_REFUSES]
                else:
                    refuses = [(v, f"{option}: expected {expected}, got {refused_text(v)}") for v in NOT_A_NUMBER]
                    refuses += (range_refuses or {}).get(option, [])
            for value, meaning in takes:
                got, want = call(**{option: value}), call(**{option: meaning})
                for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
                    expect_equal(f"{desc_name} {option}={shown(value)}", g, w)
                counted += 1
            for value, message in refuses:
                try:
                    call(**{option: value})
                except fj.ArgumentError as e:
                    if str(e) != message:
                        raise AssertionError(f"{desc_name} {option}={shown(value)}: {str(e)!r}, expected "
                                             f"{message!r}") from None
                    counted += 1
                    continue
                raise AssertionError(f"{desc_name} {option}={shown(value)}: taken, expected {message!r}")
        if not counted:
            raise AssertionError(f"{desc_name}: no kind of scalar tried")
    return run


def refused_text(v):
    """How a refused number appears in its message: a real one as the op
    layer prints it (%g), anything else as Python shows it."""
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, np.ndarray) and v.dtype == np.bool_):
        return shown(v)
    try:
        real = np.asarray(v)
    except Exception:  # noqa: BLE001
        return shown(v)
    if real.ndim != 0 or not (np.issubdtype(real.dtype, np.integer) or np.issubdtype(real.dtype, np.floating)
                              or real.dtype == jnp.bfloat16):
        return shown(v)
    try:
        x = float(v)
    except OverflowError:
        return shown(v)
    return "%g" % x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


# ---- main ----


def main():
    CASES.append((f"bad input: {len(ERRORS)} calls, each a clean exception naming the argument", bad_inputs))
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
