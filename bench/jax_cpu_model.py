"""JAX's own CPU code on the resident-model cases of bench/model_frame.c:
a 2-layer Mamba (d_model 256, expand 2, d_state 16, d_conv 4, dt_rank 16,
residual) answering one frame at batch 1 and 32, the same model over a
window of 32 frames from zero states, and a 2-layer GRU (hidden 512) frame
at batch 1. The layer math is docs/MODELS.md's (mamba_simple.py's Mamba,
PyTorch's nn.GRU); every case is one jitted function whose states go in and
come out (donated, so XLA may update them in place), timed with
block_until_ready: median and p99 of --reps calls after warm-up, in one
process. Each case runs with the weights in two layouts: PyTorch's [out, in]
(x @ w.T) and Flax's kernels [in, out] (x @ k); XLA's CPU code differs
between them (a product fused with its bias add over a transposed weight
runs as a plain loop), and the best of the two is JAX's number. A benchmark, not a test; on a machine other processes share, run
it beside the fusex side (bench/model_frame.c) and compare within a run.

    py=$(bash tools/jax_venv.sh build/jax-venv)
    $py bench/jax_cpu_model.py [--reps 2000] [--only mamba]
"""

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

D_MODEL, EXPAND, D_STATE, D_CONV, DT_RANK = 256, 2, 16, 4, 16
GRU_H = 512


def uniform(key, shape, bound):
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def mamba_params(key, d=D_MODEL):
    e, n, k, r = EXPAND * d, D_STATE, D_CONV, DT_RANK
    ks = jax.random.split(key, 10)
    return {
        "w_in_x": uniform(ks[0], (e, d), d ** -0.5), "w_in_z": uniform(ks[1], (e, d), d ** -0.5),
        "w_conv": uniform(ks[2], (e, k), k ** -0.5), "b_conv": uniform(ks[3], (e,), k ** -0.5),
        "w_x_dt": uniform(ks[4], (r, e), e ** -0.5), "w_x_b": uniform(ks[5], (n, e), e ** -0.5),
        "w_x_c": uniform(ks[6], (n, e), e ** -0.5), "w_dt": uniform(ks[7], (e, r), r ** -0.5),
        "b_dt": jnp.log(jnp.expm1(jnp.full((e,), 0.01, jnp.float32))),
        "a": -jnp.tile(jnp.arange(1, n + 1, dtype=jnp.float32), (e, 1)),
        "d": jnp.ones((e,), jnp.float32), "w_out": uniform(ks[8], (d, e), e ** -0.5),
    }


PRODUCTS = ("w_in_x", "w_in_z", "w_x_dt", "w_x_b", "w_x_c", "w_dt", "w_out", "w_ih", "w_hh")


def to_kernels(params):
    """The same weights as Flax kernels [in, out]."""
    return [{k: (v.T.copy() if k in PRODUCTS else v) for k, v in p.items()} for p in params]


def mm(x, w, kernels):
    return x @ w if kernels else x @ w.T


def mamba_frame_layer(p, conv, h, x, kernels):
    """One frame of one block: conv [B, E, K-1], h [B, E, N], x [B, d]."""
    xin, z = mm(x, p["w_in_x"], kernels), mm(x, p["w_in_z"], kernels)
    window = jnp.concatenate([conv, xin[:, :, None]], axis=2)  # [B, E, K], oldest first
    u = jax.nn.silu(jnp.sum(window * p["w_conv"], axis=2) + p["b_conv"])
    b, c = mm(u, p["w_x_b"], kernels), mm(u, p["w_x_c"], kernels)
    dt = mm(mm(u, p["w_x_dt"], kernels), p["w_dt"], kernels)
    delta = jax.nn.softplus(dt + p["b_dt"])
    h = jnp.exp(delta[:, :, None] * p["a"]) * h + (delta * u)[:, :, None] * b[:, None, :]
    y = jnp.einsum("ben,bn->be", h, c) + p["d"] * u
    out = mm(y * jax.nn.silu(z), p["w_out"], kernels)
    return window[:, :, 1:], h, x + out


def mamba_frame(params, convs, hs, x, kernels):
    new_convs, new_hs = [], []
    for p, conv, h in zip(params, convs, hs):
        conv, h, x = mamba_frame_layer(p, conv, h, x, kernels)
        new_convs.append(conv)
        new_hs.append(h)
    return new_convs, new_hs, x


def mamba_window_layer(p, x, kernels):
    """A window of one block from zero states: x [B, L, d]; the products over
    the whole window, the recurrence a lax.scan."""
    bsz, seqlen, _ = x.shape
    xin, z = mm(x, p["w_in_x"], kernels), mm(x, p["w_in_z"], kernels)  # [B, L, E]
    padded = jnp.pad(xin, ((0, 0), (D_CONV - 1, 0), (0, 0)))
    conv = sum(padded[:, k:k + seqlen, :] * p["w_conv"][:, k] for k in range(D_CONV))
    u = jax.nn.silu(conv + p["b_conv"])
    b, c = mm(u, p["w_x_b"], kernels), mm(u, p["w_x_c"], kernels)
    delta = jax.nn.softplus(mm(mm(u, p["w_x_dt"], kernels), p["w_dt"], kernels) + p["b_dt"])

    def step(h, inp):
        ut, dtt, bt, ct = inp
        h = jnp.exp(dtt[:, :, None] * p["a"]) * h + (dtt * ut)[:, :, None] * bt[:, None, :]
        return h, jnp.einsum("ben,bn->be", h, ct)

    h0 = jnp.zeros((bsz, xin.shape[2], D_STATE), x.dtype)
    sw = lambda t: jnp.swapaxes(t, 0, 1)  # noqa: E731
    h, ys = lax.scan(step, h0, (sw(u), sw(delta), sw(b), sw(c)))
    y = sw(ys) + p["d"] * u
    out = mm(y * jax.nn.silu(z), p["w_out"], kernels)
    return padded[:, seqlen:, :], h, x + out


def mamba_window(params, x, kernels):
    states = []
    for p in params:
        conv, h, x = mamba_window_layer(p, x, kernels)
        states.append((conv, h))
    return states, x


def gru_params(key, inp, hidden):
    ks = jax.random.split(key, 4)
    bound = hidden ** -0.5
    return {"w_ih": uniform(ks[0], (3 * hidden, inp), bound), "w_hh": uniform(ks[1], (3 * hidden, hidden), bound),
            "b_ih": uniform(ks[2], (3 * hidden,), bound), "b_hh": uniform(ks[3], (3 * hidden,), bound)}


def gru_frame(params, hs, x, kernels):
    """nn.GRU's step for each layer: hs [layers, B, H], x [B, in]."""
    new = []
    for p, h in zip(params, hs):
        ax, ah = mm(x, p["w_ih"], kernels) + p["b_ih"], mm(h, p["w_hh"], kernels) + p["b_hh"]
        ar, az, an = jnp.split(ax, 3, axis=1)
        hr, hz, hn = jnp.split(ah, 3, axis=1)
        r, zg = jax.nn.sigmoid(ar + hr), jax.nn.sigmoid(az + hz)
        n = jnp.tanh(an + r * hn)
        x = (1.0 - zg) * n + zg * h
        new.append(x)
    return jnp.stack(new), x


def timed(call, reps):
    for _ in range(20):
        jax.block_until_ready(call())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return statistics.median(times), times[len(times) * 99 // 100]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    key = jax.random.PRNGKey(0)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({os.cpu_count()} cores), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, median and p99 of {args.reps} calls (jitted)\n")

    def row(name, make_call, reps):
        if args.only and args.only not in name:
            return
        best = None
        for kernels in (False, True):
            p50, p99 = timed(make_call(kernels), reps)
            layout = "kernels [in, out]" if kernels else "torch [out, in]"
            print(f"jax: {name:40} {layout:17} p50 {p50:9.1f} us  p99 {p99:9.1f} us", flush=True)
            best = (p50, p99) if best is None or p50 < best[0] else best
        print(f"jax: {name:40} {'best':17} p50 {best[0]:9.1f} us  p99 {best[1]:9.1f} us", flush=True)

    torch_params = [mamba_params(k) for k in jax.random.split(key, 2)]
    layouts = {False: torch_params, True: to_kernels(torch_params)}
    e = EXPAND * D_MODEL

    def mamba_call(batch):
        frame = jax.random.normal(key, (batch, D_MODEL))

        def make(kernels):
            params = layouts[kernels]
            state = {"convs": [jnp.zeros((batch, e, D_CONV - 1)) for _ in params],
                     "hs": [jnp.zeros((batch, e, D_STATE)) for _ in params]}
            step = jax.jit(functools.partial(mamba_frame, kernels=kernels), donate_argnums=(1, 2))

            def call():
                state["convs"], state["hs"], out = step(params, state["convs"], state["hs"], frame)
                return out

            return call

        return make

    for batch in (1, 32):
        row(f"2-layer Mamba d256 N16 B{batch} frame", mamba_call(batch), args.reps)
    window = jax.random.normal(key, (1, 32, D_MODEL))

    def window_call(kernels):
        run = jax.jit(functools.partial(mamba_window, kernels=kernels))
        return lambda: run(layouts[kernels], window)[1]

    row("2-layer Mamba d256 N16 B1 L32 window", window_call, max(args.reps // 4, 10))
    gru_torch = [gru_params(k, GRU_H, GRU_H) for k in jax.random.split(key, 2)]
    gru_layouts = {False: gru_torch, True: to_kernels(gru_torch)}
    gframe = jax.random.normal(key, (1, GRU_H))

    def gru_call(kernels):
        gstate = {"hs": jnp.zeros((2, 1, GRU_H))}
        step = jax.jit(functools.partial(gru_frame, kernels=kernels), donate_argnums=(1,))

        def call():
            gstate["hs"], out = step(gru_layouts[kernels], gstate["hs"], gframe)
            return out

        return call

    row("2-layer GRU H512 B1 frame", gru_call, args.reps)

if __name__ == "__main__":
    main()
