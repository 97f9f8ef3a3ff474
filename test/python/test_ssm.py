"""fusex_jax's selective scan (test/python/test_fusex_jax.py runs it):
forward, gradient and step under jax.jit against a lax.scan reference in
f64, over awkward shapes and every option; the saved states' shape;
problems with nothing to scan; bad input, at trace time with the op
layer's messages and through the handlers; the scalar options."""

from fxtest import *  # noqa: F401,F403


# ---- the reference (f64, plain jax.numpy and lax.scan) ----


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



large_ssm_case(4, 1024, 1024, 16, 1, F32)   # the warp-specialized forward
large_ssm_case(2, 300, 256, 16, 1, BF16)
large_ssm_case(2, 257, 512, 128, 2, F32)    # the sliced forward and backward
large_ssm_case(1, 200, 256, 256, 1, BF16)


# ---- bad input: at trace time (the op layer's messages), and through the handlers ----


def ssm_fwd(**kw):
    def run(x=f32(2, 5, 4), dt=f32(2, 5, 4), a=-f32(4, 3), b=f32(2, 5, 3), c=f32(2, 5, 3), **opts):
        return fj.selective_scan(x, dt, a, b, c, **opts)
    return lambda: run(**kw)


FLOATS = "{f,32}, {bf,16}, {f,16}"
error_case(f"x: expected a float type ({FLOATS}", ssm_fwd(x=of(jnp.int32, 2, 5, 4)))
error_case("x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,5}",
           ssm_fwd(x=f32(2, 5)))
error_case("dt: expected shape {2,5,4} [batch, seqlen, dim], got {2,5,3}",
           ssm_fwd(dt=f32(2, 5, 3)))
error_case("dt: expected type {f,32}, got {bf,16}", ssm_fwd(dt=of(BF16, 2, 5, 4)))
error_case("a: expected shape {4,3} [dim, dstate], got {5,3}", ssm_fwd(a=f32(5, 3)))
error_case("a: expected rank 2 [dim, dstate], got rank 1 shape {4}", ssm_fwd(a=f32(4)))
error_case("b: expected a number of groups that divides dim 4 "
           "[batch, seqlen, groups, dstate], got 3", ssm_fwd(b=f32(2, 5, 3, 3), c=f32(2, 5, 3, 3)))
error_case("b: expected shape {2,5,3} [batch, seqlen, dstate], got {2,4,3}",
           ssm_fwd(b=f32(2, 4, 3)))
error_case("c: expected shape {2,5,3} (the shape of b), got {2,5,2}",
           ssm_fwd(c=f32(2, 5, 2)))
error_case("b: expected a float type", ssm_fwd(b=of(jnp.int8, 2, 5, 3)))
error_case("d: expected shape {4} [dim], got {5}", ssm_fwd(d=f32(5)))
error_case("z: expected type {f,32}, got {f,16}", ssm_fwd(z=of(F16, 2, 5, 4)))
error_case("dt_bias: expected shape {4} [dim], got {3}", ssm_fwd(dt_bias=f32(3)))
error_case("h0: expected shape {2,4,3} [batch, dim, dstate], got {2,4,2}",
           ssm_fwd(h0=f32(2, 4, 2)))
error_case("a: expected a float type", ssm_fwd(a=of(jnp.int32, 4, 3)))


def ssm_step(**kw):
    def run(state=f32(2, 4, 3), x=f32(2, 4), dt=f32(2, 4), a=-f32(4, 3), b=f32(2, 3), c=f32(2, 3), **opts):
        return fj.selective_scan_step(state, x, dt, a, b, c, **opts)
    return lambda: run(**kw)


error_case("state: expected type {f,32}", ssm_step(state=of(BF16, 2, 4, 3)))
error_case("state: expected shape {2,4,3} [batch, dim, dstate], got {2,4,4}",
           ssm_step(state=f32(2, 4, 4)))
error_case("x: expected rank 2 [batch, dim], got rank 3 shape {2,1,4}",
           ssm_step(x=f32(2, 1, 4)))
error_case("b: expected rank 2 [batch, dstate] or rank 3 [batch, groups, dstate], "
           "got rank 1 shape {3}", ssm_step(b=f32(3), c=f32(3)))
error_case("z: expected shape {2,4} [batch, dim], got {2,5}", ssm_step(z=f32(2, 5)))

SSM_FLAGS = dict(dt_softplus=I(0), has_d=I(0), has_z=I(0), has_dt_bias=I(0), has_h0=I(0))
SSM_IN = [f32(1, 40, 4), f32(1, 40, 4), -f32(4, 3), f32(1, 40, 3), f32(1, 40, 3)]
handler_error_case("fusex_selective_scan_fwd: saved: expected shape {1,2,4,3} ([batch, nsaved, dim, dstate], the states "
           "entering each chunk after the first), got {1,3,4,3}",
           raw("fusex_selective_scan_fwd", [((1, 40, 4), F32), ((1, 3, 4, 3), F32)], SSM_IN,
               **SSM_FLAGS, return_state=I(0), save=I(1)))
handler_error_case("fusex_selective_scan_fwd: saved: expected type {f,32}, got {bf,16}",
           raw("fusex_selective_scan_fwd", [((1, 40, 4), F32), ((1, 2, 4, 3), BF16)], SSM_IN,
               **SSM_FLAGS, return_state=I(0), save=I(1)))
handler_error_case("fusex_selective_scan_fwd: state: expected shape {1,4,3} [batch, dim, dstate], got {1,3,4}",
           raw("fusex_selective_scan_fwd", [((1, 40, 4), F32), ((1, 3, 4), F32)], SSM_IN,
               **SSM_FLAGS, return_state=I(1), save=I(0)))
SSM_ONE_CHUNK = [f32(1, 9, 4), f32(1, 9, 4), -f32(4, 3), f32(1, 9, 3), f32(1, 9, 3)]
handler_error_case("fusex_selective_scan_fwd: results: expected 1 (y), got 2",  # one chunk: no saved states
           raw("fusex_selective_scan_fwd", [((1, 9, 4), F32), ((1, 0, 4, 3), F32)], SSM_ONE_CHUNK,
               **SSM_FLAGS, return_state=I(0), save=I(1)))
handler_error_case("fusex_selective_scan_bwd: operands: expected 6 (x, dt, a, b, c, dy), got 7",
           raw("fusex_selective_scan_bwd", [((1, 9, 4), F32), ((1, 9, 4), F32), ((4, 3), F32), ((1, 9, 3), F32),
                                            ((1, 9, 3), F32)],
               SSM_ONE_CHUNK + [f32(1, 1, 4, 3), f32(1, 9, 4)], **SSM_FLAGS, has_dstate=I(0)))
handler_error_case("fusex_selective_scan_bwd: x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {9,4}",
           raw("fusex_selective_scan_bwd", [((9, 4), F32)], [f32(9, 4)] + SSM_ONE_CHUNK[1:] + [f32(1, 9, 4)],
               **SSM_FLAGS, has_dstate=I(0)))
handler_error_case("fusex_selective_scan_bwd: operands: expected 7 (x, dt, a, b, c, [saved], dy), got 3",
           raw("fusex_selective_scan_bwd", [((1, 9, 4), F32)], SSM_ONE_CHUNK[:3], **SSM_FLAGS, has_dstate=I(0)))
SSM_GRADS = [((1, 40, 4), F32), ((1, 40, 4), F32), ((4, 3), F32), ((1, 40, 3), F32), ((1, 40, 3), F32)]
handler_error_case("fusex_selective_scan_bwd: dy: expected shape {1,40,4} [batch, seqlen, dim], got {1,40,3}",
           raw("fusex_selective_scan_bwd", SSM_GRADS, SSM_IN + [f32(1, 2, 4, 3), f32(1, 40, 3)],
               **SSM_FLAGS, has_dstate=I(0)))
handler_error_case("fusex_selective_scan_bwd: dstate: expected shape {1,4,3} [batch, dim, dstate], got {1,4,4}",
           raw("fusex_selective_scan_bwd", SSM_GRADS, SSM_IN + [f32(1, 2, 4, 3), f32(1, 40, 4), f32(1, 4, 4)],
               **SSM_FLAGS, has_dstate=I(1)))
handler_error_case("fusex_selective_scan_bwd: da: expected type {f,32}, got {f,16}",
           raw("fusex_selective_scan_bwd", SSM_GRADS[:2] + [((4, 3), F16)] + SSM_GRADS[3:],
               SSM_IN + [f32(1, 2, 4, 3), f32(1, 40, 4)], **SSM_FLAGS, has_dstate=I(0)))
handler_error_case("fusex_selective_scan_bwd: operands: expected 7 (x, dt, a, b, c, saved, dy), got 6",
           raw("fusex_selective_scan_bwd", SSM_GRADS, SSM_IN + [f32(1, 40, 4)], **SSM_FLAGS, has_dstate=I(0)))
handler_error_case("fusex_selective_scan_step: new_state: expected type {f,32}, got {bf,16}",
           raw("fusex_selective_scan_step", [((2, 4), F32), ((2, 4, 3), BF16)],
               [f32(2, 4, 3), f32(2, 4), f32(2, 4), -f32(4, 3), f32(2, 3), f32(2, 3)],
               dt_softplus=I(0), has_d=I(0), has_z=I(0), has_dt_bias=I(0)))

if ON_CUDA:
    # The CUDA backend's limits: the Host rules at trace time take them,
    # the CUDA handler refuses them when the program runs.
    handler_error_case("fusex_selective_scan_fwd: x: expected type {f,32}, {bf,16} or {f,16} on cuda:0 "
                       "({f,64} runs on cpu only), got {f,64}",
                       ssm_fwd(x=of(F64, 2, 5, 4), dt=of(F64, 2, 5, 4), b=of(F64, 2, 5, 3), c=of(F64, 2, 5, 3)))
    handler_error_case("fusex_selective_scan_fwd: a: expected dstate <= 256 on cuda:0 [dim, dstate], got 257",
                       ssm_fwd(a=-f32(4, 257), b=f32(2, 5, 257), c=f32(2, 5, 257)))
error_case(f"x: expected a float type ({FLOATS} or {{f,64}}), got {{s,32}}", ssm_fwd(x=of(jnp.int32, 2, 5, 4)))


# ---- the scalar options ----


def ssm_scalar_call(step):
    r = rng(f"scalars ssm {step}")
    x, dt, a, b, c, d, z, dt_bias, h0 = ssm_inputs(r, 2, 1 if step else 20, 4, 3, 1, F32, F32, {"d", "h0"})
    if step:
        state = jnp.asarray(h0, F32)
        args = (state, x[:, 0], dt[:, 0], a, b[:, 0], c[:, 0])
        fn = fj.selective_scan_step
    else:
        args, fn = (x, jnp.abs(dt), a, b, c), fj.selective_scan

    def call(**opts):
        return jax.jit(lambda *xs: fn(*xs, **opts))(*on(DEVICE, args))
    return call


scalar_options_case("selective_scan_fwd", ssm_scalar_call(False))
scalar_options_case("selective_scan_step", ssm_scalar_call(True))


@case("selective_scan_saved_shape: sizes beyond int64 and dimensions that are not integers are refused")
def saved_shapes_not_int64():
    big = 2**64 + 2
    expect = [
        (((big, 40, 4), (4, 3), (big, 40, 3)),
         f"x: expected a tuple of non-negative integers, each at most 2^48, got {{{big},40,4}}"),
        (((2, 40, 4), (4, 2**63), (2, 40, 3)),
         f"a: expected a tuple of non-negative integers, each at most 2^48, got {{4,{2**63}}}"),
        (((2, 40, 4), (4, 3), (2, 40, -2**64)), f"b: expected a tuple of non-negative integers, got {{2,40,{-2**64}}}"),
        (((2.0, 40, 4), (4, 3), (2, 40, 3)), "x: expected a tuple of non-negative integers, got {2.0,40,4}"),
        (((2, 40, 4), (4, "3"), (2, 40, 3)), "a: expected a tuple of non-negative integers, got {4,3}"),
        (((2, True, 4), (4, 3), (2, 40, 3)), "x: expected a tuple of non-negative integers, got {2,True,4}"),
        (((2, 2**40, 2**20), (2**20, 3), (2, 2**40, 3)), "x: expected a shape of at most 2^48 elements, "
                                                         "got {2,1099511627776,1048576}"),
    ]
    for (xs, as_, bs), want in expect:
        try:
            got = fj.selective_scan_saved_shape(xs, as_, bs, F32)
        except fj.ArgumentError as e:
            if str(e) != want:
                raise AssertionError(f"saved shape of x {xs} a {as_} b {bs}: {e!r}, expected {want!r}") from None
            continue
        raise AssertionError(f"saved shape of x {xs} a {as_} b {bs}: {got}, expected the error {want!r}")
    # numpy's integers are integers
    got = fj.selective_scan_saved_shape((np.int64(2), np.int32(40), 8), (8, np.uint8(16)), (2, 40, 16), F32)
    if got != (2, 2, 8, 16):
        raise AssertionError(f"numpy sizes: {got}")


@case("selective_scan: forward and gradients replay bit for bit from 8 threads at once")
def replays_under_threads():
    """Issue 45's reproducer: the same jitted forward + gradient called from
    8 threads at once, each result bit-equal to a single-threaded one (every
    reduced gradient summed in a fixed order). 200 calls on CUDA, where the
    order once depended on scheduling; 24 on the CPU."""
    import concurrent.futures

    name = "selective_scan replay"
    x, dt, a, b, c, d, z, dt_bias, h0 = ssm_inputs(rng(name), 3, 40, 8, 5, 1, F32, F32, ALL)

    def loss(x, dt, a, b, c, d, z, dt_bias, h0):
        y, h = fj.selective_scan(x, dt, a, b, c, d=d, z=z, dt_bias=dt_bias, h0=h0, dt_softplus=True,
                                 return_state=True)
        return jnp.sum(y * y) + jnp.sum(h * h)

    step = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(9))))
    args = [jax.device_put(v, DEVICE) for v in (x, dt, a, b, c, d, z, dt_bias, h0)]

    def run(_):
        value, grads = step(*args)
        return [np.asarray(value)] + [np.asarray(g) for g in grads]

    want = run(None)
    calls = 200 if ON_CUDA else 24
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, range(calls)))
    names = ["loss", "dx", "ddt", "da", "db", "dc", "dd", "dz", "ddt_bias", "dh0"]
    for k, got in enumerate(results):
        for what, g, w in zip(names, got, want):
            if not np.array_equal(g, w):
                raise AssertionError(f"call {k}: {what} differs from the single-threaded result "
                                     f"(max |diff| {np.max(np.abs(g - w)):.3g})")
