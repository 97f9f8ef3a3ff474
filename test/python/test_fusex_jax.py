"""fusex for JAX: every op under jax.jit, forward and jax.grad, against plain
jax.numpy / lax.scan references (f64), over awkward shapes and every
option; bad input refused at trace time with the op layer's messages and
through the handlers; every kind of scalar for every scalar option; the
exact StableHLO form EXLA emits.

    PYTHONPATH=python python3 test/python/test_fusex_jax.py

The runner (test/python/fxtest.py) says what the environment picks
(FUSEX_JAX_PLATFORM, FUSEX_SEED, FUSEX_JAX_ONLY) and the tolerances. Each
family's cases are in test/python/test_<family>.py, found here: every
family the library describes has one.
"""

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fxtest import *  # noqa: E402,F401,F403
import fxtest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILY_FILES = sorted(f[len("test_"):-len(".py")] for f in os.listdir(HERE)
                      if f.startswith("test_") and f.endswith(".py") and f != "test_fusex_jax.py")
for family in FAMILY_FILES:
    importlib.import_module(f"test_{family}")


@case("every family the library describes has its test file and its public functions")
def families_covered():
    missing = [f for f in fj.FAMILIES if f not in FAMILY_FILES]
    if missing:
        raise AssertionError(f"families without test/python/test_<family>.py: {missing}")
    public = [f"{d['op']}{'_step' if d['dir'] == 'step' else ''}" for d in fj.DESCRIPTIONS if d["dir"] != "bwd"]
    absent = [name for name in public if not callable(getattr(fj, name, None)) or name not in fj.__all__]
    if absent:
        raise AssertionError(f"described ops without a public function in fusex_jax: {absent}")


# ---- the form EXLA emits (the selective scan's, MinGRU's and Liquid's targets) ----


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
    x, dt, a, b, c, d, _, _, _ = importlib.import_module("test_ssm").ssm_inputs(r, batch, seqlen, dim, dstate, 1, F32, F32, {"d"})
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



if __name__ == "__main__":
    sys.exit(fxtest.main())
