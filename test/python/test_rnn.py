"""fusex_jax's GRU and LSTM (test/python/test_fusex_jax.py runs them): the
forward and jax.grad of every input under jax.jit against a lax.scan
reference in f64 straight from PyTorch's equations, over awkward shapes
(hidden 1 and 37, input unlike hidden, one step, batches of 1 and 3, 1 and
3 layers, with and without h0 and c0); chains of steps equal to the
forward, and their gradients; empty sequences; bad input at trace time
with the op layer's messages; the scalar options."""

from fxtest import *  # noqa: F401,F403


# ---- the reference (f64, plain jax.numpy and lax.scan) ----


def gru_cell(h, x, w_ih, w_hh, b_ih, b_hh):
    ax_r, ax_z, ax_n = jnp.split(x @ w_ih.T + b_ih, 3, axis=-1)
    ah_r, ah_z, ah_n = jnp.split(h @ w_hh.T + b_hh, 3, axis=-1)
    r = jax.nn.sigmoid(ax_r + ah_r)
    z = jax.nn.sigmoid(ax_z + ah_z)
    n = jnp.tanh(ax_n + r * ah_n)
    return (1 - z) * n + z * h


def lstm_cell(hc, x, w_ih, w_hh, b_ih, b_hh):
    h, c = hc
    i, f, g, o = jnp.split(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def rnn_ref(cell, x, layers, h0=None, c0=None):
    """(y, h_n, c_n): c_n None for the GRU."""
    batch, hidden = x.shape[0], layers[0][1].shape[1]
    zeros = jnp.zeros((len(layers), batch, hidden), x.dtype)
    h0 = zeros if h0 is None else h0
    c0 = zeros if c0 is None else c0
    seq, hs, cs = jnp.swapaxes(x, 0, 1), [], []
    for k, params in enumerate(layers):
        if cell == "gru":
            def step(h, xt, params=params):
                h = gru_cell(h, xt, *params)
                return h, h
            h, seq = lax.scan(step, h0[k], seq)
            hs.append(h)
        else:
            def step(hc, xt, params=params):
                hc = lstm_cell(hc, xt, *params)
                return hc, hc[0]
            (h, c), seq = lax.scan(step, (h0[k], c0[k]), seq)
            hs.append(h)
            cs.append(c)
    return jnp.swapaxes(seq, 0, 1), jnp.stack(hs), (jnp.stack(cs) if cs else None)


# ---- inputs ----


def gates(cell):
    return 3 if cell == "gru" else 4


def rnn_layers(r, cell, inp, hidden, nlayers, dtype):
    s = 1 / np.sqrt(hidden)
    g = gates(cell) * hidden
    return tuple((uniform(r, (g, inp if k == 0 else hidden), dtype, -s, s), uniform(r, (g, hidden), dtype, -s, s),
                  uniform(r, (g,), dtype, -s, s), uniform(r, (g,), dtype, -s, s)) for k in range(nlayers))


def state_dtype(dtype):
    return F64 if jnp.dtype(dtype) == F64 else F32


# ---- forward and gradients ----


def rnn_case(cell, batch, seqlen, inp, hidden, nlayers, dtype, h0=False, c0=False, ret=False):
    name = (f"{cell} B{batch} L{seqlen} I{inp} H{hidden} x{nlayers} {jnp.dtype(dtype).name}{' h0' if h0 else ''}"
            f"{' c0' if c0 else ''}{' state' if ret else ''}")

    @case(name)
    def run():
        if ON_CUDA and jnp.dtype(dtype) == F64:
            return "cpu only"  # the CUDA kernels take f32, bf16 and f16; f64 is refused there
        r = rng(name)
        x = normal(r, (batch, seqlen, inp), dtype)
        layers = rnn_layers(r, cell, inp, hidden, nlayers, dtype)
        st = state_dtype(dtype)
        init_h = uniform(r, (nlayers, batch, hidden), st, -0.5, 0.5) if h0 else None
        init_c = uniform(r, (nlayers, batch, hidden), st, -0.5, 0.5) if c0 else None
        args = (x, init_h, init_c) + tuple(t for layer in layers for t in layer)

        def split(xs):
            return xs[0], xs[1], xs[2], tuple(tuple(xs[3 + 4 * k:7 + 4 * k]) for k in range(nlayers))

        def fusex_fn(*xs):
            x, h, c, ls = split(xs)
            if cell == "gru":
                out = fj.gru(x, ls, h0=h, return_state=ret)
                return out if ret else (out,)
            out = fj.lstm(x, ls, h0=h, c0=c, return_state=ret)
            return (out[0],) + tuple(out[1]) if ret else (out,)

        def ref_fn(*xs):
            x, h, c, ls = split(xs)
            y, h_n, c_n = rnn_ref(cell, x, ls, h, c)
            return ((y, h_n) + ((c_n,) if cell == "lstm" else ())) if ret else (y,)

        n_bt = batch * seqlen
        sums = [1, 1, 1] + [n_bt] * (4 * nlayers)
        grad_check(name, fusex_fn, ref_fn, args, TOL[jnp.dtype(dtype)], sums)


for cell in ("gru", "lstm"):
    rnn_case(cell, 1, 1, 1, 1, 1, F32)
    rnn_case(cell, 3, 5, 4, 37, 1, F32, h0=True, ret=True)
    rnn_case(cell, 2, 4, 3, 5, 3, F32, h0=True, c0=cell == "lstm", ret=True)
    rnn_case(cell, 1, 6, 6, 2, 2, F64, ret=True)
    rnn_case(cell, 3, 3, 5, 4, 3, F64, c0=cell == "lstm")
    rnn_case(cell, 2, 5, 3, 8, 2, BF16, h0=True, ret=True)


@case("gru and lstm: shapes and types of every result")
def rnn_shapes():
    r = rng("shapes")
    x = normal(r, (3, 4, 5), BF16)
    for cell in ("gru", "lstm"):
        layers = rnn_layers(r, cell, 5, 6, 2, BF16)
        fn = getattr(fj, cell)
        y, state = jax.jit(lambda x, ls: fn(x, ls, return_state=True))(x, layers)
        states = state if cell == "lstm" else (state,)
        if y.shape != (3, 4, 6) or y.dtype != BF16:
            raise AssertionError(f"{cell}: y {y.dtype}{y.shape}")
        for s in states:
            if s.shape != (2, 3, 6) or s.dtype != F32:
                raise AssertionError(f"{cell}: state {s.dtype}{s.shape}")


@case("gru and lstm: an empty sequence gives an empty y and the initial states")
def rnn_empty():
    r = rng("empty")
    x = normal(r, (2, 0, 3), F32)
    h0 = normal(r, (1, 2, 4), F32)
    for cell in ("gru", "lstm"):
        layers = rnn_layers(r, cell, 3, 4, 1, F32)
        y, state = jax.jit(lambda x, ls, h: getattr(fj, cell)(x, ls, h0=h, return_state=True))(x, layers, h0)
        h_n = state[0] if cell == "lstm" else state
        if y.shape != (2, 0, 4):
            raise AssertionError(f"{cell}: y {y.shape}")
        expect_equal(f"{cell} empty h_n", h_n, h0)


# ---- steps ----


def step_case(cell, batch, seqlen, inp, hidden, nlayers):
    name = f"{cell}_step chain B{batch} L{seqlen} I{inp} H{hidden} x{nlayers}"

    @case(name)
    def run():
        r = rng(name)
        x = normal(r, (batch, seqlen, inp), F32)
        layers = rnn_layers(r, cell, inp, hidden, nlayers, F32)
        h0 = uniform(r, (nlayers, batch, hidden), F32, -0.5, 0.5)
        c0 = uniform(r, (nlayers, batch, hidden), F32, -0.5, 0.5)

        def chain(x, layers, h0, c0):
            state = h0 if cell == "gru" else (h0, c0)
            ys = []
            for t in range(seqlen):
                if cell == "gru":
                    y, state = fj.gru_step(state, x[:, t], layers)
                else:
                    y, state = fj.lstm_step(state, x[:, t], layers)
                ys.append(y)
            return jnp.stack(ys, 1), state

        def forward(x, layers, h0, c0):
            if cell == "gru":
                return fj.gru(x, layers, h0=h0, return_state=True)
            return fj.lstm(x, layers, h0=h0, c0=c0, return_state=True)

        got = jax.jit(chain)(x, layers, h0, c0)
        want = jax.jit(forward)(x, layers, h0, c0)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            check(f"{name}: steps vs forward", g, w, TOL[jnp.dtype(F32)])

        # the step's gradient in every input: the reference's over one frame
        def step_loss(fn):
            def loss(h, c, x_t, layers):
                if fn == "fusex":
                    y, s = (fj.gru_step(h, x_t, layers) if cell == "gru" else fj.lstm_step((h, c), x_t, layers))
                else:
                    y, hn, cn = rnn_ref(cell, x_t[:, None], layers, h, c)
                    y, s = y[:, 0], (hn if cell == "gru" else (hn, cn))
                leaves = [y] + jax.tree_util.tree_leaves(s)
                return sum(jnp.sum(jnp.asarray(v, F64) * (k + 1) * 0.37) for k, v in enumerate(leaves))
            return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3) if cell == "lstm" else (0, 2, 3)))

        got = step_loss("fusex")(h0, c0, x[:, 0], layers)
        want = step_loss("ref")(*f64((h0, c0, x[:, 0], layers)))
        for k, (g, w) in enumerate(zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))):
            check(f"{name}: step gradient {k}", g, w, TOL[jnp.dtype(F32)] * (4 if ON_CUDA else 1))


for cell in ("gru", "lstm"):
    step_case(cell, 1, 4, 3, 1, 1)
    step_case(cell, 3, 3, 5, 37, 3)


# ---- the scalar options ----


def _gru_call(**opts):
    r = rng("gru options")
    x = normal(r, (2, 3, 4), F32)
    return fj.gru(x, rnn_layers(r, "gru", 4, 5, 2, F32), **opts)


def _lstm_call(**opts):
    r = rng("lstm options")
    x = normal(r, (2, 3, 4), F32)
    return fj.lstm(x, rnn_layers(r, "lstm", 4, 5, 1, F32), **opts)


scalar_options_case("gru_fwd", _gru_call)
scalar_options_case("lstm_fwd", _lstm_call)


# ---- bad input ----

_r = rng("rnn bad input")
_x = normal(_r, (2, 3, 5), F32)
_gl = rnn_layers(_r, "gru", 5, 4, 2, F32)
_ll = rnn_layers(_r, "lstm", 5, 4, 2, F32)
_h = jnp.zeros((2, 2, 4), F32)


def _with(layers, k, i, t):
    layers = [list(layer) for layer in layers]
    layers[k][i] = t
    return tuple(tuple(layer) for layer in layers)


error_case("layers[1].w_hh: expected shape {12,4} ([3*hidden, hidden]), got {12,5}",
           lambda x: fj.gru(x, _with(_gl, 1, 1, f32(12, 5))), _x)
error_case("layers[0].w_ih: expected shape {12,5} ([3*hidden, input]), got {12,4}",
           lambda x: fj.gru(x, _with(_gl, 0, 0, f32(12, 4))), _x)
error_case("layers[1].b_ih: expected shape {16} ([4*hidden]), got {15}",
           lambda x: fj.lstm(x, _with(_ll, 1, 2, f32(15))), _x)
error_case("layers[0].w_hh: expected type {f,32}, got {f,16}", lambda x: fj.gru(x, _with(_gl, 0, 1, of(F16, 12, 4))), _x)
error_case("layers[0].w_ih: expected shape {16,5} ([4*hidden, input])", lambda x: fj.lstm(x, _gl), _x)
error_case("layers: expected a non-empty sequence of (w_ih, w_hh, b_ih, b_hh), one per layer, got none",
           lambda x: fj.gru(x, []), _x)
error_case("layers[0]: expected a tuple (w_ih, w_hh, b_ih, b_hh), got ", lambda x: fj.gru(x, [_gl[0][:3]]), _x)
error_case("layers: expected an integer from 1 to 14, got 15", lambda x: fj.gru(x, [_gl[1]] * 15), f32(2, 3, 4))
error_case("x: expected rank 3", lambda x: fj.gru(x, _gl), f32(2, 5))
error_case("h0: expected shape {2,2,4}", lambda x, h: fj.gru(x, _gl, h0=h), _x, f32(1, 2, 4))
error_case("h: expected shape {2,2,4}", lambda h, x: fj.gru_step(h, x, _gl), f32(1, 2, 4), f32(2, 5))
error_case("h: expected type {f,32}", lambda h, x: fj.gru_step(h, x, _gl), of(F16, 2, 2, 4), f32(2, 5))
error_case("x: expected rank 2", lambda h, x: fj.gru_step(h, x, _gl), _h, _x)
error_case("c: expected shape {2,2,4}", lambda h, c, x: fj.lstm_step((h, c), x, _ll), _h, f32(2, 4), f32(2, 5))
error_case("state: expected a tuple (h, c) of two arrays [layers, batch, hidden], got ",
           lambda h, x: fj.lstm_step(h, x, _ll), _h, f32(2, 5))
error_case("unexpected keyword argument 'c0'", lambda x: fj.gru(x, _gl, c0=_h), _x, exc=TypeError)
