#!/usr/bin/env python3
"""The peers of the resident-model rows (issue 43) in the same GPU call as
fusex's (bench/model_frame.c, `make bench BENCH_ARGS="--ops model"`):
one frame of a 2-layer Mamba (d_model 256, d_state 16, expand 2, d_conv 4,
each layer an RMSNorm then a Mamba block with its residual: the spec
fusex's rows use) at batch 1 and 32, as PyTorch replays it from a CUDA graph
and as jitted JAX runs it; a 2-layer GRU H512 frame, cuDNN from a CUDA graph
and jitted JAX; a 32-frame window of the Mamba in jitted JAX; and a training
step of a 2-layer Mamba d768 B8 L2048 f32 in JAX with fusex's selective scan
in the graph (XLA's GEMMs at highest precision, the AdamW update in jnp).

    python3 bench/peers_model.py [--reps N] [--only SUBSTRING] [--no-jax] [--no-train]

Every number is what a caller sees: the call (a graph replay, a jitted
call) plus waiting for its result (torch.cuda.synchronize,
block_until_ready), median and p99 over --reps after warm-up, inputs
rotated among eight. Weights are drawn at random: only time is compared.
"""
import argparse
import math
import statistics
import sys
import time

D_MODEL, D_STATE, EXPAND, D_CONV = 256, 16, 2, 4


def stats(times):
    times = sorted(times)
    return statistics.median(times), times[min(len(times) - 1, len(times) * 99 // 100)]


def host_times(fn, reps, warm=50):
    for _ in range(warm):
        fn(0)
    out = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return stats(out)


def row(case, peer, p50, p99, note=""):
    print(f"| {case} | {peer} | {p50:.1f} | {p99:.1f} | {note} |", flush=True)


# ---- PyTorch ----

def torch_rows(reps, only):
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def mamba_params(d_model, gen):
        e, n, k = EXPAND * d_model, D_STATE, D_CONV
        r = math.ceil(d_model / 16)

        def u(*shape, fan):
            return ((torch.rand(*shape, generator=gen) * 2 - 1) / math.sqrt(fan)).to(dev)

        return dict(norm=torch.ones(d_model, device=dev), w_in=u(2 * e, d_model, fan=d_model),
                    w_conv=u(e, k, fan=k), b_conv=u(e, fan=k), w_x=u(r + 2 * n, e, fan=e),
                    w_dt=u(e, r, fan=r), b_dt=u(e, fan=r),
                    a=-torch.arange(1, n + 1, dtype=torch.float32, device=dev).repeat(e, 1),
                    d=torch.ones(e, device=dev), w_out=u(d_model, e, fan=e), r=r)

    def mamba_step(x, p, conv_state, ssm_state):
        h = F.rms_norm(x, (x.shape[-1],), p["norm"], 1e-5)
        xi, z = (h @ p["w_in"].t()).chunk(2, dim=-1)
        conv_state.copy_(torch.roll(conv_state, shifts=-1, dims=-1))
        conv_state[:, :, -1] = xi
        xi = F.silu((conv_state * p["w_conv"]).sum(-1) + p["b_conv"])
        dt, b, c = torch.split(xi @ p["w_x"].t(), [p["r"], D_STATE, D_STATE], dim=-1)
        dt = F.softplus(dt @ p["w_dt"].t() + p["b_dt"])
        da = torch.exp(dt.unsqueeze(-1) * p["a"])
        ssm_state.copy_(ssm_state * da + (dt * xi).unsqueeze(-1) * b.unsqueeze(1))
        y = (ssm_state @ c.unsqueeze(-1)).squeeze(-1) + p["d"] * xi
        return h + (y * F.silu(z)) @ p["w_out"].t()

    def graph_frame(batch):
        gen = torch.Generator().manual_seed(1)
        layers = [mamba_params(D_MODEL, gen) for _ in range(2)]
        e = EXPAND * D_MODEL
        conv = [torch.zeros(batch, e, D_CONV, device=dev) for _ in layers]
        ssm = [torch.zeros(batch, e, D_STATE, device=dev) for _ in layers]
        frames = [torch.randn(batch, D_MODEL, device=dev) for _ in range(8)]
        static_in = torch.zeros(batch, D_MODEL, device=dev)

        def frame():
            x = static_in
            for p, cs, ss in zip(layers, conv, ssm):
                x = mamba_step(x, p, cs, ss)
            return x

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                frame()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = frame()

        def replay(i):
            static_in.copy_(frames[i % 8])
            graph.replay()
            torch.cuda.synchronize()
            return static_out

        return replay

    if "mamba" in only:
        for batch in (1, 32):
            p50, p99 = host_times(graph_frame(batch), reps)
            row(f"2-layer Mamba d256 N16 frame B{batch}", "PyTorch, CUDA graph replay + sync", p50, p99)

    if "gru" in only:
        gru = torch.nn.GRU(512, 512, num_layers=2, batch_first=True).to(dev)
        static_x = torch.zeros(1, 1, 512, device=dev)
        static_h = torch.zeros(2, 1, 512, device=dev)
        frames = [torch.randn(1, 1, 512, device=dev) for _ in range(8)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(3):
                gru(static_x, static_h)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            out, h_new = gru(static_x, static_h)
            static_h.copy_(h_new)

        def replay(i):
            static_x.copy_(frames[i % 8])
            graph.replay()
            torch.cuda.synchronize()
            return out

        p50, p99 = host_times(replay, reps)
        row("2-layer GRU H512 frame B1", "cuDNN (PyTorch), CUDA graph replay + sync", p50, p99)


# ---- JAX ----

def jax_mamba_params(key, d_model, jnp, jax):
    e, n, k = EXPAND * d_model, D_STATE, D_CONV
    r = math.ceil(d_model / 16)
    keys = jax.random.split(key, 8)

    def u(kk, shape, fan):
        return jax.random.uniform(kk, shape, jnp.float32, -1.0, 1.0) / math.sqrt(fan)

    return dict(norm=jnp.ones(d_model), w_in=u(keys[0], (2 * e, d_model), d_model),
                w_conv=u(keys[1], (e, k), k), b_conv=u(keys[2], (e,), k),
                w_x=u(keys[3], (r + 2 * n, e), e), w_dt=u(keys[4], (e, r), r), b_dt=u(keys[5], (e,), r),
                a=-jnp.tile(jnp.arange(1, n + 1, dtype=jnp.float32), (e, 1)), d=jnp.ones(e),
                w_out=u(keys[6], (d_model, e), e)), r


def jax_rows(reps, only, train):
    import jax
    import jax.numpy as jnp

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w

    def step(p, r, x, conv_state, ssm_state):
        h = rms(x, p["norm"])
        xi, z = jnp.split(h @ p["w_in"].T, 2, axis=-1)
        conv_state = jnp.concatenate([conv_state[:, :, 1:], xi[:, :, None]], axis=-1)
        xi = jax.nn.silu(jnp.sum(conv_state * p["w_conv"], -1) + p["b_conv"])
        proj = xi @ p["w_x"].T
        dt, b, c = proj[:, :r], proj[:, r:r + D_STATE], proj[:, r + D_STATE:]
        dt = jax.nn.softplus(dt @ p["w_dt"].T + p["b_dt"])
        ssm_state = ssm_state * jnp.exp(dt[:, :, None] * p["a"]) + (dt * xi)[:, :, None] * b[:, None, :]
        y = jnp.einsum("ben,bn->be", ssm_state, c) + p["d"] * xi
        return h + (y * jax.nn.silu(z)) @ p["w_out"].T, conv_state, ssm_state

    params = [jax_mamba_params(k, D_MODEL, jnp, jax) for k in jax.random.split(jax.random.PRNGKey(1), 2)]
    r = params[0][1]
    layers = [p for p, _ in params]
    e = EXPAND * D_MODEL

    @jax.jit
    def frame(layers, x, states):
        new = []
        for p, (cs, ss) in zip(layers, states):
            x, cs, ss = step(p, r, x, cs, ss)
            new.append((cs, ss))
        return x, new

    def run_frames(batch):
        states = [(jnp.zeros((batch, e, D_CONV)), jnp.zeros((batch, e, D_STATE))) for _ in layers]
        frames = [jax.random.normal(jax.random.PRNGKey(i), (batch, D_MODEL)) for i in range(8)]
        box = {"s": states}

        def call(i):
            y, box["s"] = frame(layers, frames[i % 8], box["s"])
            y.block_until_ready()

        return call

    if "mamba" in only:
        for batch in (1, 32):
            p50, p99 = host_times(run_frames(batch), reps)
            row(f"2-layer Mamba d256 N16 frame B{batch}", f"jitted JAX {jax.__version__}", p50, p99)

        @jax.jit
        def window(layers, xs):
            def one(states, x):
                y, states = frame(layers, x, states)
                return states, y
            states = [(jnp.zeros((1, e, D_CONV)), jnp.zeros((1, e, D_STATE))) for _ in layers]
            states, ys = jax.lax.scan(one, states, jnp.swapaxes(xs, 0, 1))
            return jnp.swapaxes(ys, 0, 1), states

        wins = [jax.random.normal(jax.random.PRNGKey(i), (1, 32, D_MODEL)) for i in range(8)]

        def call_window(i):
            y, _ = window(layers, wins[i % 8])
            y.block_until_ready()

        p50, p99 = host_times(call_window, reps)
        row("2-layer Mamba d256 N16 window B1 L32", f"jitted JAX {jax.__version__} (lax.scan of frames)", p50, p99)

    if "gru" in only:
        def gru_cell(p, x, h):
            gi = x @ p["w_ih"].T + p["b_ih"]
            gh = h @ p["w_hh"].T + p["b_hh"]
            ir, iz, inn = jnp.split(gi, 3, -1)
            hr, hz, hn = jnp.split(gh, 3, -1)
            rr, zz = jax.nn.sigmoid(ir + hr), jax.nn.sigmoid(iz + hz)
            n = jnp.tanh(inn + rr * hn)
            return (1 - zz) * n + zz * h

        ks = jax.random.split(jax.random.PRNGKey(2), 8)
        gp = [dict(w_ih=jax.random.uniform(ks[4 * i], (1536, 512)) / 22.6,
                   w_hh=jax.random.uniform(ks[4 * i + 1], (1536, 512)) / 22.6,
                   b_ih=jax.random.uniform(ks[4 * i + 2], (1536,)) / 22.6,
                   b_hh=jax.random.uniform(ks[4 * i + 3], (1536,)) / 22.6) for i in range(2)]

        @jax.jit
        def gru_frame(gp, x, hs):
            new = []
            for p, h in zip(gp, hs):
                x = gru_cell(p, x, h)
                new.append(x)
            return x, new

        frames = [jax.random.normal(jax.random.PRNGKey(i), (1, 512)) for i in range(8)]
        box = {"h": [jnp.zeros((1, 512)) for _ in gp]}

        def call(i):
            y, box["h"] = gru_frame(gp, frames[i % 8], box["h"])
            y.block_until_ready()

        p50, p99 = host_times(call, reps)
        row("2-layer GRU H512 frame B1", f"jitted JAX {jax.__version__}", p50, p99)

    if train and "train" in only:
        train_row(jax, jnp)


def train_row(jax, jnp):
    """A 2-layer Mamba d768 B8 L2048 f32 training step in JAX, fusex's scan
    in the graph: forward (RMSNorm, in_proj, the causal depthwise conv
    through lax.conv_general_dilated, x_proj, dt_proj, fusex_jax's selective
    scan, out_proj), MSE against a target, the gradients, and AdamW."""
    import fusex_jax

    d_model, batch, seqlen = 768, 8, 2048
    e = EXPAND * d_model
    params = [jax_mamba_params(k, d_model, jnp, jax) for k in jax.random.split(jax.random.PRNGKey(3), 2)]
    r = params[0][1]
    layers = [p for p, _ in params]

    def block(p, x):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * p["norm"]
        xi, z = jnp.split(h @ p["w_in"].T, 2, axis=-1)
        xc = jax.lax.conv_general_dilated(xi, p["w_conv"][:, :, None].transpose(1, 2, 0), (1,),
                                          [(D_CONV - 1, 0)], dimension_numbers=("NWC", "WIO", "NWC"),
                                          feature_group_count=e)
        u = jax.nn.silu(xc + p["b_conv"])
        proj = u @ p["w_x"].T
        dt, b, c = proj[..., :r], proj[..., r:r + D_STATE], proj[..., r + D_STATE:]
        dt = dt @ p["w_dt"].T
        y = fusex_jax.selective_scan(u, dt, p["a"], b, c, d=p["d"], z=z, dt_bias=p["b_dt"], dt_softplus=True)
        return h + y @ p["w_out"].T

    def loss(layers, x, t):
        for p in layers:
            x = block(p, x)
        return jnp.mean((x - t) ** 2)

    trainable = [{k: v for k, v in p.items() if k != "a"} for p in layers]

    def full(tr):
        return [dict(t, a=p["a"]) for t, p in zip(tr, layers)]

    @jax.jit
    def train_step(tr, m, v, count, x, t):
        value, grads = jax.value_and_grad(lambda tr: loss(full(tr), x, t))(tr)
        count = count + 1
        b1, b2, lr, wd, eps = 0.9, 0.999, 1e-3, 0.01, 1e-8
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count
        tr = jax.tree.map(lambda p, m, v: p - lr * (m / c1 / (jnp.sqrt(v / c2) + eps) + wd * p), tr, m, v)
        return tr, m, v, count, value

    with jax.default_matmul_precision("highest"):
        x = jax.random.normal(jax.random.PRNGKey(4), (batch, seqlen, d_model))
        t = jax.random.normal(jax.random.PRNGKey(5), (batch, seqlen, d_model))
        m = jax.tree.map(jnp.zeros_like, trainable)
        v = jax.tree.map(jnp.zeros_like, trainable)
        box = {"s": (trainable, m, v, jnp.float32(0))}

        def call(_):
            tr, m, v, count, value = train_step(*box["s"], x, t)
            box["s"] = (tr, m, v, count)
            value.block_until_ready()

        p50, p99 = host_times(call, 20, warm=3)
    row("training step, 2-layer Mamba d768 B8 L2048 f32", "JAX + fusex's scan in-graph, highest precision", p50, p99)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--only", default="mamba,gru,train")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-train", action="store_true")
    args = ap.parse_args()
    only = args.only
    print("| case | peer | p50 us | p99 us | note |\n|---|---|---:|---:|---|", flush=True)
    try:
        torch_rows(args.reps, only)
    except Exception as exc:  # a missing torch or GPU leaves JAX's rows standing
        print(f"torch rows failed: {exc!r}", file=sys.stderr)
    if not args.no_jax:
        jax_rows(args.reps, only, not args.no_train)


if __name__ == "__main__":
    main()
