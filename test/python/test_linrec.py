"""fusex_jax's linear recurrences (test/python/test_fusex_jax.py runs
them): every op's forward, gradient and step under jax.jit against a
lax.scan reference in f64, over awkward shapes and every option; problems
with nothing to scan; vmap; bad input, at trace time with the op layer's
messages and through the handlers; the scalar options, liquid's dt of
every kind."""

from fxtest import *  # noqa: F401,F403


# ---- the reference (f64, plain jax.numpy and lax.scan) ----


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



# ---- bad input: at trace time (the op layer's messages), and through the handlers ----

error_case("b: expected shape {2,3,4} ([batch, seqlen, hidden], as a), got {2,3,5}",
           lambda: fj.linear_scan(f32(2, 3, 4), f32(2, 3, 5)))
error_case("cand: expected type {f,32}, got {f,16}",
           lambda: fj.mingru(f32(2, 3, 4), of(F16, 2, 3, 4)))
error_case("f_logits: expected rank 3 [batch, seqlen, hidden], got rank 2 shape {2,4}",
           lambda: fj.minlstm(f32(2, 4), f32(2, 4), f32(2, 4)))
error_case("cand: expected shape {2,3,4} ([batch, seqlen, hidden], as f_logits), got {2,4}",
           lambda: fj.minlstm(f32(2, 3, 4), f32(2, 3, 4), f32(2, 4)))
error_case("h0: expected type {f,32}, got {bf,16}",
           lambda: fj.mingru(f32(2, 3, 4), f32(2, 3, 4), h0=of(BF16, 2, 4)))
error_case("h0: expected type {f,16} or {f,32}, got {bf,16}",
           lambda: fj.mingru(of(F16, 2, 3, 4), of(F16, 2, 3, 4), h0=of(BF16, 2, 4)))
error_case("h0: expected shape {2,4} ([batch, hidden]), got {2,5}",
           lambda: fj.linear_scan(f32(2, 3, 4), f32(2, 3, 4), h0=f32(2, 5)))
error_case("a: expected a float type", lambda: fj.linear_scan(of(jnp.int32, 2, 3, 4),
                                                                                      of(jnp.int32, 2, 3, 4)))
error_case("tau: expected shape {4} ([hidden]), got {5}",
           lambda: fj.liquid(f32(2, 3, 4), f32(5), f32(4)))
error_case("a: expected shape {4} ([hidden]), got {2,4}",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(2, 4)))
error_case("dt: expected shape {2,3,1} ([batch, seqlen, 1]), got {2,3,2}",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=f32(2, 3, 2)))
error_case("dt: expected a positive number or a tensor ([batch, seqlen, 1]), got -1",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=-1.0))
error_case("dt: expected a positive number or a tensor ([batch, seqlen, 1]), got 0",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=0))
error_case("dt: expected a positive number or a tensor ([batch, seqlen, 1]), got inf",
           lambda: fj.liquid(f32(2, 3, 4), f32(4), f32(4), dt=float("inf")))
error_case("dt: expected a positive number or a tensor ([batch, 1]), got nan",
           lambda: fj.liquid_step(f32(2, 4), f32(2, 4), f32(4), f32(4), dt=float("nan")))
error_case("dt: expected shape {2,1} ([batch, 1]), got {2,3,1}",
           lambda: fj.liquid_step(f32(2, 4), f32(2, 4), f32(4), f32(4), dt=f32(2, 3, 1)))
error_case("state: expected shape {2,4} ([batch, hidden]), got {2,5}",
           lambda: fj.mingru_step(f32(2, 5), f32(2, 4), f32(2, 4)))
error_case("a: expected rank 2 [batch, hidden], got rank 3 shape {2,3,4}",
           lambda: fj.linear_scan_step(f32(2, 4), f32(2, 3, 4), f32(2, 3, 4)))
error_case("candidate_activation: expected identity or g, got 'relu'",
           lambda: fj.mingru(f32(2, 3, 4), f32(2, 3, 4), candidate_activation="relu"))


SCAN_FLAGS = dict(reverse=I(0), has_h0=I(0), return_state=I(0))
handler_error_case("fusex_linear_scan_fwd: has_h0: expected an attribute 0 or 1 (i64), got none",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, reverse=I(0), return_state=I(0)))
handler_error_case("fusex_linear_scan_fwd: attributes: expected only reverse, has_h0, return_state, got revers",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, revers=I(0), has_h0=I(0),
               return_state=I(0)))
handler_error_case("fusex_linear_scan_fwd: reverse: expected 0 or 1, got 2",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, **dict(SCAN_FLAGS, reverse=I(2))))
handler_error_case("fusex_linear_scan_fwd: reverse: expected an integer attribute 0 or 1 (i64), got an f32",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2,
               **dict(SCAN_FLAGS, reverse=np.float32(1))))
handler_error_case("fusex_linear_scan_fwd: reverse: expected an integer attribute 0 or 1 (i64), got a string",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, **dict(SCAN_FLAGS, reverse="yes")))
handler_error_case("fusex_liquid_fwd: dt: expected a number attribute (f64), got a string",
           raw("fusex_liquid_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4), f32(4), f32(4)], reverse=I(0), has_h0=I(0),
               return_state=I(0), has_dt=I(0), dt="1"))
handler_error_case("fusex_linear_scan_fwd: operands: expected 3 (a, b, h0), got 2",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2, **dict(SCAN_FLAGS, has_h0=I(1))))
handler_error_case("fusex_linear_scan_fwd: results: expected 2 (h, state), got 1",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(2, 3, 4)] * 2,
               **dict(SCAN_FLAGS, return_state=I(1))))
handler_error_case("fusex_linear_scan_fwd: h: expected shape {2,3,4} ([batch, seqlen, hidden]), got {2,3,5}",
           raw("fusex_linear_scan_fwd", [((2, 3, 5), F32)], [f32(2, 3, 4)] * 2, **SCAN_FLAGS))
handler_error_case("fusex_linear_scan_fwd: h: expected type {f,32}, got {bf,16}",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), BF16)], [f32(2, 3, 4)] * 2, **SCAN_FLAGS))
handler_error_case("fusex_linear_scan_fwd: state: expected type {f,32}, got {f,16}",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F16), ((2, 4), F16)], [of(F16, 2, 3, 4)] * 2,
               **dict(SCAN_FLAGS, return_state=I(1))))
handler_error_case("fusex_linear_scan_fwd: a: expected rank at most 8, got rank 9",
           raw("fusex_linear_scan_fwd", [((2, 3, 4), F32)], [f32(*[1] * 9), f32(2, 3, 4)], **SCAN_FLAGS))
handler_error_case("fusex_linear_scan_bwd: h: expected shape {2,3,4} ([batch, seqlen, hidden], the forward's output), "
           "got {2,3,5}", raw("fusex_linear_scan_bwd", [((2, 3, 4), F32)] * 2,
                              [f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 5), f32(2, 3, 4)],
                              reverse=I(0), has_h0=I(0), has_dstate=I(0)))
handler_error_case("fusex_linear_scan_bwd: dh: expected type {f,32}, got {bf,16}",
           raw("fusex_linear_scan_bwd", [((2, 3, 4), F32)] * 2,
               [f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 4), of(BF16, 2, 3, 4)],
               reverse=I(0), has_h0=I(0), has_dstate=I(0)))
handler_error_case("fusex_linear_scan_bwd: db: expected shape {2,3,4} (the shape of its input), got {2,3,3}",
           raw("fusex_linear_scan_bwd", [((2, 3, 4), F32), ((2, 3, 3), F32)], [f32(2, 3, 4)] * 4,
               reverse=I(0), has_h0=I(0), has_dstate=I(0)))
handler_error_case("fusex_liquid_bwd: results: expected 4 (df_logits, dtau, da, ddt), got 3",
           raw("fusex_liquid_bwd", [((2, 3, 4), F32), ((4,), F32), ((4,), F32)],
               [f32(2, 3, 4), f32(4), f32(4), f32(2, 3, 1), f32(2, 3, 4), f32(2, 3, 4)],
               reverse=I(0), has_h0=I(0), has_dstate=I(0), has_dt=I(1), dt=np.float64(1)))
handler_error_case("fusex_linear_scan_step: new_state: expected shape {2,4} (the shape of state), got {2,5}",
           raw("fusex_linear_scan_step", [((2, 4), F32), ((2, 5), F32)], [f32(2, 4)] * 3, reverse=I(0)))

if ON_CUDA:
    handler_error_case("fusex_mingru_fwd: z_logits: expected type {f,32}, {bf,16} or {f,16} on cuda:0",
                       lambda: fj.mingru(of(F64, 2, 3, 4), of(F64, 2, 3, 4)))


# ---- the scalar options: every kind of scalar, liquid's dt included ----


def linrec_scalar_call(op, step):
    r = rng(f"scalars {op} {step}")
    seq, params = linrec_inputs(r, op, 2, 1 if step else 5, 3, F32)
    if step:
        seq = tuple(t[:, 0] for t in seq)
    state = (normal(r, (2, 3), F32),) if step else ()
    fn = getattr(fj, op + ("_step" if step else ""))

    def call(**opts):
        return jax.jit(lambda *xs: fn(*xs, **opts))(*on(DEVICE, state + seq + params))
    return call


for op in ("linear_scan", "mingru", "minlstm", "liquid"):
    if option_kinds(describe(op + "_fwd")):
        scalar_options_case(op + "_fwd", linrec_scalar_call(op, False))
    if option_kinds(describe(op + "_step")):
        scalar_options_case(op + "_step", linrec_scalar_call(op, True))


@case("liquid: a concrete dt of any kind is the number, checked as a Python float is; a traced one a tensor")
def liquid_dt_kinds():
    r = rng("liquid dt kinds")
    (f,), (tau, lam) = linrec_inputs(r, "liquid", 2, 6, 3, F32)
    args = on(DEVICE, (f, tau, lam))
    base = jax.jit(lambda *xs: fj.liquid(*xs, dt=float(np.float32(0.3))))(*args)
    for dt in (np.float32(0.3), np.array(0.3, np.float32), jnp.asarray(0.3, F32)):
        expect_equal(f"dt={dt!r}", jax.jit(lambda *xs: fj.liquid(*xs, dt=dt))(*args), base)
    # The three: a numpy scalar below zero, a complex one, a boolean.
    for dt, got in ((np.float32(-1.0), "-1"), (1j, "1j"), (True, "True")):
        try:
            jax.jit(lambda *xs: fj.liquid(*xs, dt=dt))(*args)
        except fj.ArgumentError as e:
            want = f"dt: expected a positive number or a tensor ([batch, seqlen, 1]), got {got}"
            if str(e) != want:
                raise AssertionError(f"dt={dt!r}: {str(e)!r}, expected {want!r}") from None
            continue
        raise AssertionError(f"dt={dt!r} was taken")
    # A traced dt of shape () is an operand with a gradient: the sum of the
    # broadcast tensor's.
    g = jax.jit(jax.grad(lambda d: jnp.sum(fj.liquid(*args, dt=d)), argnums=0))(jnp.asarray(0.3, F32))
    g_tensor = jax.jit(jax.grad(lambda d: jnp.sum(fj.liquid(*args, dt=d))))(jnp.full((2, 6, 1), 0.3, F32))
    check("traced dt's gradient", g, jnp.sum(g_tensor), 1e-5)
