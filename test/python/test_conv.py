"""fusex_jax's causal depthwise convolution (test/python/test_fusex_jax.py
runs it): the forward, its gradient and the step under jax.jit against a
plain jax.numpy reference in f64, over awkward shapes (D 1, 37; W 1, 3, 4,
7; L 1, 2, W - 1) and every option; bad input, at trace time with the op
layer's messages and through the handlers; the scalar options, the
activation of every kind."""

from fxtest import *  # noqa: F401,F403


# ---- the reference (f64, plain jax.numpy) ----


def conv_ref(x, w, bias, initial_state, silu):
    """y_t[d] = act(bias[d] + sum_k w[d, k] x_{t-(W-1)+k}[d]), the inputs
    before the first the initial state's (oldest first); the final state
    is the last W - 1 inputs."""
    batch, seqlen, dim = x.shape
    width = w.shape[1]
    state = jnp.zeros((batch, dim, width - 1), x.dtype) if initial_state is None else initial_state
    padded = jnp.concatenate([jnp.swapaxes(state, 1, 2), x], axis=1)
    y = sum(padded[:, k:k + seqlen, :] * w[:, k] for k in range(width))
    if bias is not None:
        y = y + bias
    if silu:
        y = y * jax.nn.sigmoid(y)
    return y, jnp.swapaxes(padded[:, seqlen:, :], 1, 2)


def conv_inputs(r, batch, seqlen, dim, width, dtype, wdtype, opts):
    x = normal(r, (batch, seqlen, dim), dtype)
    w = normal(r, (dim, width), wdtype, 0.5)
    bias = normal(r, (dim,), wdtype) if "bias" in opts else None
    init = normal(r, (batch, dim, width - 1), dtype) if "init" in opts else None
    return x, w, bias, init


def conv_case(batch, seqlen, dim, width, dtype, opts=(), wdtype=None, cuda=True):
    wdtype = wdtype or dtype
    name = (f"causal_conv1d B{batch} L{seqlen} D{dim} W{width} {jnp.dtype(dtype).name} w {jnp.dtype(wdtype).name}"
            f" {'+'.join(sorted(opts)) or 'plain'}")
    silu, ret = "silu" in opts, "state" in opts

    @case(name)
    def run():
        if ON_CUDA and not cuda:
            return "cpu only"
        args = conv_inputs(rng(name), batch, seqlen, dim, width, dtype, wdtype, opts)

        def fusex_fn(x, w, bias, init):
            out = fj.causal_conv1d(x, w, bias, activation="silu" if silu else None, initial_state=init,
                                   return_state=ret)
            return out if ret else (out,)

        def ref_fn(x, w, bias, init):
            y, final = conv_ref(x, w, bias, init, silu)
            return (y, final) if ret else (y,)

        n = batch * seqlen
        grad_check(name, fusex_fn, ref_fn, args, TOL[jnp.dtype(dtype)], [1, n, n, 1])


conv_case(1, 1, 1, 1, F32)
conv_case(2, 7, 37, 4, F32, ("bias", "silu", "init", "state"))
conv_case(2, 7, 37, 4, F32, ("silu",))
conv_case(3, 6, 4, 7, F32, ("bias", "state"))
conv_case(2, 3, 2, 1, F32, ("bias", "silu", "state"))
conv_case(2, 2, 5, 3, F32, ("init", "state"))          # L = W - 1
conv_case(1, 1, 3, 4, F32, ("init", "state", "bias"))  # L < W - 1: the final state is partly the initial one's
conv_case(2, 3, 5, 4, F32, ("init", "silu"))           # L = W - 1, the final state unused
conv_case(1, 2, 1, 3, F32, ("bias", "init", "state"))  # D 1, L 2
conv_case(2, 40, 16, 16, F32, ("bias", "silu", "init", "state"))
conv_case(2, 9, 16, 4, BF16, ("bias", "silu", "init", "state"), wdtype=F32)
conv_case(2, 9, 16, 4, BF16, ("bias",))
conv_case(1, 5, 8, 3, F16, ("silu", "init", "state"))
conv_case(2, 5, 3, 4, F64, ("bias", "silu", "init", "state"), cuda=False)


def conv_step_case(batch, dim, width, dtype, opts=(), wdtype=None):
    wdtype = wdtype or dtype
    name = (f"causal_conv1d_step B{batch} D{dim} W{width} {jnp.dtype(dtype).name} w {jnp.dtype(wdtype).name}"
            f" {'+'.join(sorted(opts)) or 'plain'}")
    silu = "silu" in opts

    @case(name)
    def run():
        r = rng(name)
        x, w, bias, _ = conv_inputs(r, batch, 1, dim, width, dtype, wdtype, opts)
        state = normal(r, (batch, dim, width - 1), dtype)

        def fusex_fn(state, x_t, w, bias):
            return fj.causal_conv1d_step(state, x_t, w, bias, activation="silu" if silu else None)

        def ref_fn(state, x_t, w, bias):
            y, final = conv_ref(x_t[:, None], w, bias, state, silu)
            return y[:, 0], final

        grad_check(name, fusex_fn, ref_fn, (state, x[:, 0], w, bias), TOL[jnp.dtype(dtype)], [1, 1, batch, batch])


conv_step_case(1, 1, 2, F32)
conv_step_case(2, 3, 1, F32, ("bias",))  # W 1: an empty state
conv_step_case(3, 37, 4, F32, ("bias", "silu"))
conv_step_case(2, 5, 7, F32, ("silu",))
conv_step_case(2, 16, 4, BF16, ("bias", "silu"), wdtype=F32)
conv_step_case(2, 8, 3, F16, ("bias",))


@case("causal_conv1d: the forward's final state continues as the steps' state")
def conv_stream():
    r = rng("conv stream")
    x, w, bias, _ = conv_inputs(r, 2, 9, 6, 4, F32, F32, ("bias",))
    x, w, bias = on(DEVICE, (x, w, bias))
    y_all = jax.jit(lambda x, w, b: fj.causal_conv1d(x, w, b, activation="silu"))(x, w, bias)
    y_head, state = jax.jit(lambda x, w, b: fj.causal_conv1d(x, w, b, activation="silu", return_state=True))(
        x[:, :5], w, bias)
    step = jax.jit(lambda s, x_t, w, b: fj.causal_conv1d_step(s, x_t, w, b, activation="silu"))
    ys = [y_head]
    for t in range(5, 9):
        y_t, state = step(state, x[:, t], w, bias)
        ys.append(y_t[:, None])
    check("stream", jnp.concatenate(ys, axis=1), y_all, 1e-6)


@case("causal_conv1d under vmap (sequential) equals a loop")
def conv_vmapped():
    r = rng("conv vmap")
    x, w = normal(r, (3, 2, 11, 6), F32), normal(r, (6, 4), F32)
    got = jax.jit(jax.vmap(lambda x: fj.causal_conv1d(x, w, activation="silu")))(on(DEVICE, x))
    for i in range(3):
        check(f"vmap row {i}", got[i], fj.causal_conv1d(on(DEVICE, x[i]), w, activation="silu"),
              0.0 if not ON_CUDA else 1e-6)


# ---- bad input: at trace time (the op layer's messages), and through the handlers ----


def conv_fwd(x=None, w=None, **opts):
    x = f32(2, 3, 4) if x is None else x
    w = f32(4, 3) if w is None else w
    return lambda: fj.causal_conv1d(x, w, **opts)


error_case(f"x: expected a float type ({FLOATS}", conv_fwd(x=of(jnp.int32, 2, 3, 4)))
error_case("x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,4}", conv_fwd(x=f32(2, 4)))
error_case("w: expected shape {4,3} [dim, width], got {5,3}", conv_fwd(w=f32(5, 3)))
error_case("w: expected rank 2 [dim, width], got rank 1 shape {4}", conv_fwd(w=f32(4)))
error_case("w: expected a width of 1 to 16 [dim, width], got shape {4,17}", conv_fwd(w=f32(4, 17)))
error_case("w: expected a width of 1 to 16 [dim, width], got shape {4,0}", conv_fwd(w=f32(4, 0)))
error_case("bias: expected shape {4} [dim], got {3}", conv_fwd(bias=f32(3)))
error_case("initial_state: expected shape {2,4,2} [batch, dim, width - 1], got {2,4,3}",
           conv_fwd(initial_state=f32(2, 4, 3)))
error_case("initial_state: expected type {f,32}, got {f,16}", conv_fwd(initial_state=of(F16, 2, 4, 2)))
error_case("activation: expected none or silu, got 'relu'", conv_fwd(activation="relu"))
error_case("activation: expected none or silu, got 1", conv_fwd(activation=1))
error_case("return_state: expected true or false, got 1", conv_fwd(return_state=1))
error_case("state: expected shape {2,4,2} [batch, dim, width - 1], got {2,4}",
           lambda: fj.causal_conv1d_step(f32(2, 4), f32(2, 4), f32(4, 3)))
error_case("x: expected rank 2 [batch, dim], got rank 3 shape {2,3,4}",
           lambda: fj.causal_conv1d_step(f32(2, 4, 2), f32(2, 3, 4), f32(4, 3)))
error_case("state: expected type {f,32}, got {f,16}",
           lambda: fj.causal_conv1d_step(of(F16, 2, 4, 2), f32(2, 4), f32(4, 3)))
error_case("activation: expected none or silu, got 'gelu'",
           lambda: fj.causal_conv1d_step(f32(2, 4, 2), f32(2, 4), f32(4, 3), activation="gelu"))

CONV_FLAGS = dict(activation=I(0), has_bias=I(0), has_initial_state=I(0), return_state=I(0))
handler_error_case("fusex_causal_conv1d_fwd: activation: expected 0 to 1 (none or silu), got 2",
                   raw("fusex_causal_conv1d_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4), f32(4, 3)],
                       **dict(CONV_FLAGS, activation=I(2))))
handler_error_case("fusex_causal_conv1d_fwd: activation: expected an attribute 0 to 1 (i64: none or silu), got none",
                   raw("fusex_causal_conv1d_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4), f32(4, 3)],
                       has_bias=I(0), has_initial_state=I(0), return_state=I(0)))
handler_error_case("fusex_causal_conv1d_step: new_state: expected shape {2,4,2}",
                   raw("fusex_causal_conv1d_step", [((2, 4), F32), ((2, 4, 3), F32)],
                       [f32(2, 4, 2), f32(2, 4), f32(4, 3)], activation=I(0), has_bias=I(0)))


# ---- the scalar options: every kind of scalar, the activation's names ----


def conv_scalar_call(step):
    r = rng(f"conv scalars {step}")
    x, w, bias, _ = conv_inputs(r, 2, 5, 3, 4, F32, F32, ("bias",))
    if step:
        args = (normal(r, (2, 3, 3), F32), x[:, 0], w, bias)

        def call(**opts):
            return jax.jit(lambda s, x, w, b: fj.causal_conv1d_step(s, x, w, b, **opts))(*on(DEVICE, args))
    else:
        def call(**opts):
            return jax.jit(lambda x, w, b: fj.causal_conv1d(x, w, b, **opts))(*on(DEVICE, (x, w, bias)))
    return call


scalar_options_case("causal_conv1d_fwd", conv_scalar_call(False))
scalar_options_case("causal_conv1d_step", conv_scalar_call(True))
