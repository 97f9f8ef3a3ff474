"""fusex_jax's norms, rms_norm and layer_norm with the residual before them
and the gate after them (test/python/test_fusex_jax.py runs them): the
forward and the gradient of every input and the weights under jax.jit
against a plain jax.numpy reference in f64, over awkward shapes (rows of 1,
37 and 65,537 elements, ranks 1 to 3) and every option; bad input, at
trace time with the op layer's messages and through the handlers; every
kind of scalar for eps."""

from fxtest import *  # noqa: F401,F403


# ---- the reference (f64, plain jax.numpy) ----


def norm_ref(kind, x, weight, bias, residual, gate, eps):
    """s = x + residual; y = norm(s) * weight + bias, times silu(gate)."""
    s = x if residual is None else x + residual
    if kind == "rms_norm":
        xhat = s * lax.rsqrt(jnp.mean(s * s, axis=-1, keepdims=True) + eps)
    else:
        centred = s - jnp.mean(s, axis=-1, keepdims=True)
        xhat = centred * lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    y = xhat * weight
    if bias is not None:
        y = y + bias
    if gate is not None:
        y = y * gate * jax.nn.sigmoid(gate)
    return (y, s) if residual is not None else (y,)


def norm_call(kind, x, weight, bias, residual, gate, **opts):
    if kind == "rms_norm":
        out = fj.rms_norm(x, weight, residual=residual, gate=gate, bias=bias, **opts)
    else:
        out = fj.layer_norm(x, weight, bias, residual=residual, gate=gate, **opts)
    return out if residual is not None else (out,)


def norm_inputs(r, kind, shape, dtype, wdtype, opts, residual_dtype=None):
    hidden = shape[-1]
    x = normal(r, shape, dtype)
    weight = normal(r, (hidden,), wdtype)
    bias = normal(r, (hidden,), wdtype) if kind == "layer_norm" or "bias" in opts else None
    residual = normal(r, shape, residual_dtype or dtype) if "residual" in opts else None
    gate = normal(r, shape, dtype) if "gate" in opts else None
    return x, weight, bias, residual, gate


def norm_case(kind, shape, dtype, opts=(), wdtype=None, eps=1e-5, residual_dtype=None, cuda=True):
    wdtype = wdtype or dtype
    f32_residual = "f32" in opts
    name = (f"{kind} {'x'.join(map(str, shape))} {jnp.dtype(dtype).name} w {jnp.dtype(wdtype).name}"
            f"{' residual ' + jnp.dtype(residual_dtype).name if residual_dtype else ''}"
            f" {'+'.join(sorted(opts)) or 'plain'} eps {eps:g}")

    @case(name)
    def run():
        if ON_CUDA and not cuda:
            return "cpu only"
        args = norm_inputs(rng(name), kind, shape, dtype, wdtype, opts, residual_dtype)
        extra = {"residual_in_f32": True} if f32_residual else {}

        def fusex_fn(x, weight, bias, residual, gate):
            return norm_call(kind, x, weight, bias, residual, gate, eps=eps, **extra)

        def ref_fn(x, weight, bias, residual, gate):
            return norm_ref(kind, x, weight, bias, residual, gate, eps)

        rows = int(np.prod(shape[:-1]))
        grad_check(name, fusex_fn, ref_fn, args, TOL[jnp.dtype(dtype)], [1, rows, rows, 1, 1])
        if "residual" in opts:
            s_dtype = F32 if f32_residual else args[3].dtype
            got = jax.eval_shape(fusex_fn, *args)[1].dtype
            if got != s_dtype:
                raise AssertionError(f"{name}: s is {got}, expected {jnp.dtype(s_dtype).name}")


# Rows of one element: dx is rstd dn (1 - xhat^2), and with eps small
# against x^2 xhat^2 is near 1, which f32 statistics resolve to a few
# digits only; eps 1 keeps 1 - xhat^2 away from 0 in f32, f64 takes eps
# 0.01 (the curvature on the scale of sqrt(eps)).
for kind in ("rms_norm", "layer_norm"):
    norm_case(kind, (1,), F32, eps=1.0)                          # one row of one element
    norm_case(kind, (3, 1), F32, ("residual", "gate"), eps=1.0)  # rows of one element
    norm_case(kind, (5, 1), F64, ("residual", "gate", "bias"), eps=0.01, cuda=False)
    norm_case(kind, (4, 37), F32)
    norm_case(kind, (2, 5, 37), F32, ("residual", "gate", "bias"))
    norm_case(kind, (3, 64), F32, ("residual",), eps=0.0)
    norm_case(kind, (2, 3, 16), F32, ("gate",), eps=0.3)
    norm_case(kind, (1, 65537), F32, ("residual", "gate"))
    norm_case(kind, (6, 48), BF16, ("residual", "gate", "bias"), wdtype=F32)
    norm_case(kind, (6, 48), BF16, ("residual", "f32"), residual_dtype=F32)
    norm_case(kind, (6, 48), BF16, ("residual", "f32"))
    norm_case(kind, (2, 4, 24), F16, ("residual", "gate"))
    norm_case(kind, (3, 8), F16, ("bias",), wdtype=BF16)
    norm_case(kind, (3, 2, 9), F64, ("residual", "gate", "bias"), cuda=False)


@case("norms: a gradient through y alone, s unused, and through s alone")
def norm_partial_cotangents():
    r = rng("norm partial")
    x, weight, _, residual, gate = norm_inputs(r, "rms_norm", (4, 12), F32, F32, ("residual", "gate"))
    args = on(DEVICE, (x, weight, residual, gate))
    ref_args = on(CPU, f64((x, weight, residual, gate)))
    for which in (0, 1):
        def loss(fn):
            return lambda x, w, res, g: jnp.sum(jnp.sin(fn(x, w, res, g)[which].astype(F64)))

        got = jax.jit(jax.grad(loss(lambda x, w, res, g: fj.rms_norm(x, w, residual=res, gate=g)),
                               argnums=(0, 1, 2, 3)))(*args)
        want = jax.jit(jax.grad(loss(lambda x, w, res, g: norm_ref("rms_norm", x, w, None, res, g, 1e-5)),
                                argnums=(0, 1, 2, 3)))(*ref_args)
        against(f"through {'ys'[which]}", got, want, 1e-5, [1, 4, 1, 1])


# ---- bad input: at trace time (the op layer's messages), and through the handlers ----


def rms(x=None, w=None, **opts):
    x = f32(2, 8) if x is None else x
    w = f32(8) if w is None else w
    return lambda: fj.rms_norm(x, w, **opts)


def layer(x=None, w=None, b=None, **opts):
    x = f32(2, 8) if x is None else x
    w = f32(8) if w is None else w
    b = f32(8) if b is None else b
    return lambda: fj.layer_norm(x, w, b, **opts)


error_case(f"x: expected a float type ({FLOATS}", rms(x=of(jnp.int32, 2, 8)))
error_case("x: expected hidden >= 1 [..., hidden], got shape {2,0}", rms(x=f32(2, 0)))
error_case("weight: expected shape {8} [hidden], got {7}", rms(w=f32(7)))
error_case("bias: expected shape {8} [hidden], got {7}", rms(bias=f32(7)))
error_case("bias: expected shape {8} [hidden], got {7}", layer(b=f32(7)))
error_case("residual: expected shape {2,8} [..., hidden], got {2,7}", rms(residual=f32(2, 7)))
error_case("residual: expected type {f,32}, got {f,16}", rms(residual=of(F16, 2, 8)))
error_case("residual: expected type {bf,16} (x's) or {f,32}, got {f,16}",
           rms(x=of(BF16, 2, 8), residual=of(F16, 2, 8)))
error_case("gate: expected type {f,32}, got {f,16}", layer(gate=of(F16, 2, 8)))
error_case("gate: expected shape {2,8} [..., hidden], got {2,7}", rms(gate=f32(2, 7)))
error_case("eps: expected a finite number >= 0, got -1", rms(eps=-1))
error_case("eps: expected a finite number >= 0, got inf", layer(eps=float("inf")))
error_case("eps: expected a number, got 'small'", rms(eps="small"))
error_case("residual_in_f32: expected true or false, got 1", rms(residual=f32(2, 8), residual_in_f32=1))

RMS_FLAGS = dict(eps=np.float64(1e-5), residual_in_f32=I(0), has_bias=I(0), has_residual=I(0), has_gate=I(0),
                 save=I(0))
handler_error_case("fusex_rms_norm_fwd: eps: expected a finite number >= 0, got -1",
                   raw("fusex_rms_norm_fwd", [((2, 8), F32)], [f32(2, 8), f32(8)],
                       **dict(RMS_FLAGS, eps=np.float64(-1))))
handler_error_case("fusex_rms_norm_fwd: results: expected 2 (y, s)",
                   raw("fusex_rms_norm_fwd", [((2, 8), F32)], [f32(2, 8), f32(8), f32(2, 8)],
                       **dict(RMS_FLAGS, has_residual=I(1))))


# ---- the scalar options: every kind of scalar, eps's range ----

EPS_RANGE = [(v, f"eps: expected a finite number >= 0, got {refused_text(v)}")
             for v in (-1.0, -1, np.float32(-1), np.array(-0.5), jnp.asarray(-2.0, F32), -1e-30, float("inf"),
                       float("-inf"), float("nan"), np.float32("nan"), np.float64("inf"))]
# (an integer beyond int64 is a number, printed as the op layer prints it)
EPS_RANGE.append((-(10**30), "eps: expected a finite number >= 0, got -1e+30"))


def norm_scalar_call(kind):
    r = rng(f"norm scalars {kind}")
    x, weight, bias, residual, gate = norm_inputs(r, kind, (3, 5), F32, F32, ("residual", "gate"))
    args = on(DEVICE, (x, weight, bias, residual, gate))

    def call(**opts):
        return jax.jit(lambda *xs: norm_call(kind, *xs, **opts))(*args)
    return call


for kind in ("rms_norm", "layer_norm"):
    scalar_options_case(kind + "_fwd", norm_scalar_call(kind), range_refuses={"eps": EPS_RANGE})
