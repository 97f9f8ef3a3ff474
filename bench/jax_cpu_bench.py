"""JAX's own CPU code on the cases of dev/cpu_bench (the CPU fast path):
each recurrence as a jitted ``lax.scan`` and as a jitted
``lax.associative_scan``, in one process, median of ``--reps`` calls after
warm-up. A benchmark, not a test; on a machine other processes share, take
medians of several runs (docs/CPU.md).

    py=$(bash tools/jax_venv.sh build/jax-venv)
    $py bench/jax_cpu_bench.py [--reps 21] [--only mingru]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402


def timed(fn, args, reps):
    out = fn(*args)
    jax.block_until_ready(out)
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times), min(times)


# ---- the linear recurrences: (a, b) per step, h = a h + b ----

def coeffs(kind, xs):
    if kind == "linear_scan":
        a, b = xs
        return a, b
    if kind == "mingru":
        zl, cand = xs
        z = jax.nn.sigmoid(zl)
        return 1.0 - z, z * cand
    if kind == "minlstm":
        fl, il, cand = xs
        d = jax.nn.softplus(-il) - jax.nn.softplus(-fl)
        return jax.nn.sigmoid(d), jax.nn.sigmoid(-d) * cand
    if kind == "liquid":
        fl, tau, lam = xs
        f = jax.nn.sigmoid(fl)
        den = 1.0 + 0.1 * (1.0 / tau + f)
        return 1.0 / den, 0.1 * f * lam / den
    raise ValueError(kind)


def linrec_scan(kind):
    def run(*xs):
        a, b = coeffs(kind, xs)

        def step(h, ab):
            h = ab[0] * h + ab[1]
            return h, h

        h0 = jnp.zeros_like(a[:, 0])
        _, hs = lax.scan(step, h0, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))
        return jnp.swapaxes(hs, 0, 1)

    return run


def linrec_assoc(kind):
    def run(*xs):
        a, b = coeffs(kind, xs)

        def combine(x, y):
            return x[0] * y[0], y[0] * x[1] + y[1]

        _, h = lax.associative_scan(combine, (a, b), axis=1)
        return h

    return run


def with_grad(fwd, nargs):
    def loss(*args):
        xs, dh = args[:nargs], args[nargs]
        return jnp.sum(fwd(*xs) * dh)

    return jax.grad(loss, argnums=tuple(range(nargs)))


def linrec_inputs(kind, B, L, H, key):
    ks = jax.random.split(key, 4)
    shape = (B, L, H)
    if kind == "linear_scan":
        return [jax.random.uniform(ks[0], shape, minval=0.5, maxval=1.0), jax.random.normal(ks[1], shape)]
    if kind == "mingru":
        return [jax.random.normal(ks[0], shape), jax.random.normal(ks[1], shape)]
    if kind == "minlstm":
        return [jax.random.normal(ks[i], shape) for i in range(3)]
    return [jax.random.normal(ks[0], shape), jax.random.uniform(ks[1], (H,), minval=0.5, maxval=2.0),
            jax.random.normal(ks[2], (H,))]


def mingru_step(h, zl, cand):
    z = jax.nn.sigmoid(zl)
    return (1.0 - z) * h + z * cand


# ---- the selective scan, every option (d, z, dt_bias, softplus) ----

def ssm_scan(x, dt, a, b, c, d, z, bias):
    delta = jax.nn.softplus(dt + bias)  # [B, L, D]

    def step(h, inp):
        xt, dtt, bt, ct = inp
        h = jnp.exp(dtt[..., None] * a) * h + (dtt * xt)[..., None] * bt[:, None, :]
        return h, jnp.einsum("bdn,bn->bd", h, ct)

    h0 = jnp.zeros((x.shape[0], x.shape[2], a.shape[1]), x.dtype)
    sw = lambda t: jnp.swapaxes(t, 0, 1)  # noqa: E731
    _, ys = lax.scan(step, h0, (sw(x), sw(delta), sw(b), sw(c)))
    y = sw(ys) + d * x
    return y * jax.nn.silu(z)


def ssm_assoc(x, dt, a, b, c, d, z, bias):
    delta = jax.nn.softplus(dt + bias)
    da = jnp.exp(delta[..., None] * a)  # [B, L, D, N]
    dbx = (delta * x)[..., None] * b[:, :, None, :]

    def combine(p, q):
        return p[0] * q[0], q[0] * p[1] + q[1]

    _, h = lax.associative_scan(combine, (da, dbx), axis=1)
    y = jnp.einsum("bldn,bln->bld", h, c) + d * x
    return y * jax.nn.silu(z)


def ssm_inputs(B, L, D, N, key):
    ks = jax.random.split(key, 8)
    return [jax.random.uniform(ks[0], (B, L, D), minval=-1, maxval=1),
            jax.random.uniform(ks[1], (B, L, D), minval=-3, maxval=0),
            jax.random.uniform(ks[2], (D, N), minval=-4, maxval=-0.5),
            jax.random.uniform(ks[3], (B, L, N), minval=-1, maxval=1),
            jax.random.uniform(ks[4], (B, L, N), minval=-1, maxval=1),
            jax.random.uniform(ks[5], (D,), minval=-1, maxval=1),
            jax.random.uniform(ks[6], (B, L, D), minval=-2, maxval=2),
            jax.random.uniform(ks[7], (D,), minval=-0.5, maxval=0.5)]


def ssm_step(h, x, dt, a, b, c, d, z, bias):
    delta = jax.nn.softplus(dt + bias)
    h = jnp.exp(delta[..., None] * a) * h + (delta * x)[..., None] * b[:, None, :]
    y = jnp.einsum("bdn,bn->bd", h, c) + d * x
    return h, y * jax.nn.silu(z)


def adamw(p, g, m, v, t):
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = jnp.sqrt(v) / jnp.sqrt(1 - b2 ** t) + eps
    return p - lr / (1 - b1 ** t) * m / denom, m, v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    key = jax.random.PRNGKey(0)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({os.cpu_count()} cores), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, median of {args.reps}\n")
    print(f"| {'case (f32)':44} | {'lax.scan µs':>12} | {'assoc µs':>12} | {'best µs':>10} |")
    print(f"|{'-' * 46}|{'-' * 13}:|{'-' * 13}:|{'-' * 11}:|")

    def row(name, scan_fn, assoc_fn, inputs):
        if args.only and args.only not in name:
            return
        s = timed(jax.jit(scan_fn), inputs, args.reps)[0] if scan_fn else float("nan")
        a = timed(jax.jit(assoc_fn), inputs, args.reps)[0] if assoc_fn else float("nan")
        best = min(x for x in (s, a) if x == x)
        print(f"| {name:44} | {s:12.1f} | {a:12.1f} | {best:10.1f} |", flush=True)

    for kind, B, L, H in [("mingru", 4, 1024, 512), ("mingru", 1, 32, 512), ("mingru", 16, 256, 256),
                          ("linear_scan", 4, 1024, 512), ("minlstm", 4, 1024, 512), ("liquid", 4, 1024, 512)]:
        xs = linrec_inputs(kind, B, L, H, key)
        row(f"{kind} B{B} L{L} H{H} fwd", linrec_scan(kind), linrec_assoc(kind), xs)
    xs = linrec_inputs("mingru", 4, 1024, 512, key)
    dh = jax.random.normal(key, (4, 1024, 512))
    row("mingru B4 L1024 H512 fwd+bwd", with_grad(linrec_scan("mingru"), 2), with_grad(linrec_assoc("mingru"), 2),
        xs + [dh])
    for B, H in [(16, 512), (1, 64)]:
        frame = [jax.random.normal(key, (B, H)) for _ in range(3)]
        row(f"mingru B{B} L1 H{H} step", mingru_step, None, frame)
    for B, L, D, N in [(2, 256, 256, 16), (1, 32, 512, 16)]:
        xs = ssm_inputs(B, L, D, N, key)
        row(f"selective_scan B{B} L{L} D{D} N{N} fwd", ssm_scan, ssm_assoc, xs)
        if B == 2:
            dy = jax.random.normal(key, (B, L, D))
            row(f"selective_scan B{B} L{L} D{D} N{N} fwd+bwd", with_grad(ssm_scan, 8), with_grad(ssm_assoc, 8),
                xs + [dy])
    xs = ssm_inputs(16, 1, 512, 16, key)
    frame = [jnp.zeros((16, 512, 16))] + [t[:, 0] if t.ndim == 3 else t for t in xs]
    row("selective_scan B16 L1 D512 N16 step", ssm_step, None, frame)
    n = 4 << 20
    p, g = jax.random.normal(key, (n,)), jax.random.normal(key, (n,))
    row(f"AdamW {n} f32 params", adamw, None, [p, g, jnp.zeros(n), jnp.zeros(n), jnp.float32(1.0)])


if __name__ == "__main__":
    main()
