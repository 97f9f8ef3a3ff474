"""fusex's kernels called from jitted JAX functions (XLA custom calls), GPU.

    PYTHONPATH=python python3 bench/jax_bench.py [--reps 100] [--out FILE]

Prints one table (markdown) with, per case:

- kernel us: the device time of one call: every kernel and memset the call
  runs on the GPU, summed, from JAX's profiler trace (CUPTI), over the reps
  (a mean: the trace is not split into calls). Compare with `make bench`'s "median us" of the same op on the
  same machine (the NIF path, events around the op): the kernels are the same.
- pipelined us: wall time per call of `reps` calls enqueued back to back and
  waited for once (the kernel time plus any gap the host leaves).
- e2e us: one jitted call plus `block_until_ready`, median: from the call until
  the result is ready for the caller.
- JAX's own best for the large selective scan: `lax.associative_scan` over
  the (decay, input) pairs, [batch, seqlen, dim, dstate] materialized.

Inputs as in src/fusex_bench_ssm.erl and fusex_bench_linrec.erl: f32, every
selective-scan option on (d, z, dt_bias, softplus).
"""

import argparse
import glob
import gzip
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

import fusex_jax as fj


def median_us(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def pipelined_us(fn, reps):
    jax.block_until_ready(fn())
    t0 = time.perf_counter()
    out = None
    for _ in range(reps):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) * 1e6 / reps


def device_time_us(fn, reps):
    """Per call: the GPU's busy time (its kernels and memsets, the trace's
    stream lines) over `reps` calls, divided by reps; None where the
    profiler gives no device activity (no CUPTI)."""
    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as logdir:
        jax.profiler.start_trace(logdir)
        try:
            for _ in range(reps):
                jax.block_until_ready(fn())
        finally:
            jax.profiler.stop_trace()
        traces = glob.glob(os.path.join(logdir, "**", "*.trace.json.gz"), recursive=True)
        if not traces:
            print("  (no profiler trace written)", file=sys.stderr)
            return None
        with gzip.open(max(traces, key=os.path.getmtime)) as f:
            events = json.load(f).get("traceEvents", [])
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names[(e["pid"], e.get("tid")) if e["name"] == "thread_name" else (e["pid"], None)] = \
                str(e.get("args", {}).get("name", ""))
    gpu_pids = {pid for (pid, tid), name in names.items() if tid is None and "GPU" in name}
    if os.environ.get("FUSEX_TRACE_HOST"):
        # where the host's time goes per call: the heaviest host-side events
        host = {}
        for e in events:
            if e.get("ph") == "X" and e.get("pid") not in gpu_pids and "dur" in e:
                host.setdefault(e.get("name", "?"), []).append(e["dur"])
        top = sorted(host.items(), key=lambda kv: -sum(kv[1]))[:12]
        for name, durs in top:
            print(f"    host {name[:70]:70s} {len(durs) / reps:6.1f}/call {sum(durs) / len(durs):8.1f} us",
                  file=sys.stderr)
    streams = {(pid, tid) for (pid, tid), name in names.items()
               if tid is not None and pid in gpu_pids and name.startswith("Stream")}
    on_streams = [e for e in events
                  if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in streams and "dur" in e]
    busy = sum(e["dur"] for e in on_streams)
    # fusex's own kernels and copies, apart from what XLA adds around them
    # (a gradient's loss, its ones, ...): names in namespace fx::cuda
    ours = sum(e["dur"] for e in on_streams if "fx::cuda" in e.get("name", "") or "_ZN2fx4cuda" in e.get("name", ""))
    if ours and ours != busy:
        print(f"    fusex's kernels {ours / reps:.1f} us/call of {busy / reps:.1f}", file=sys.stderr)
    if not busy:
        print("  (no GPU stream activity in the trace; its threads: %s)"
              % sorted({n for (p, t), n in names.items() if p in gpu_pids}), file=sys.stderr)
        return None
    return busy / reps


def ssm_inputs(key, batch, seqlen, dim, dstate):
    k = jax.random.split(key, 8)
    x = jax.random.normal(k[0], (batch, seqlen, dim), jnp.float32)
    dt = jax.random.normal(k[1], (batch, seqlen, dim), jnp.float32) * 0.5
    a = -jnp.exp(jax.random.normal(k[2], (dim, dstate), jnp.float32) * 0.5)
    b = jax.random.normal(k[3], (batch, seqlen, dstate), jnp.float32)
    c = jax.random.normal(k[4], (batch, seqlen, dstate), jnp.float32)
    d = jax.random.normal(k[5], (dim,), jnp.float32)
    z = jax.random.normal(k[6], (batch, seqlen, dim), jnp.float32)
    dt_bias = jax.random.normal(k[7], (dim,), jnp.float32) * 0.3
    return x, dt, a, b, c, d, z, dt_bias


def ssm_fusex(x, dt, a, b, c, d, z, dt_bias):
    return fj.selective_scan(x, dt, a, b, c, d=d, z=z, dt_bias=dt_bias, dt_softplus=True)


def ssm_associative(x, dt, a, b, c, d, z, dt_bias):
    """The selective scan as JAX writes it best: one associative scan over
    the pairs (exp(delta a), delta b x) of every (step, channel, state)."""
    delta = jax.nn.softplus(dt + dt_bias)
    decay = jnp.exp(delta[..., None] * a)
    inject = (delta * x)[..., None] * b[:, :, None, :]

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, h = lax.associative_scan(combine, (decay, inject), axis=1)
    y = jnp.einsum("bldn,bln->bld", h, c) + d * x
    return y * jax.nn.silu(z)


def grad_of(fn, nargs):
    def loss(*xs):
        return jnp.sum(fn(*xs))
    return jax.grad(loss, argnums=tuple(range(nargs)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--no-assoc", action="store_true", help="skip JAX's associative scan")
    parser.add_argument("--smoke", action="store_true",
                        help="small shapes on the CPU: checks that the script runs (no timing worth reading)")
    args = parser.parse_args()

    if args.smoke:
        dev = jax.devices("cpu")[0]
        sizes = dict(big=(2, 64, 32, 16), small=(1, 32, 512, 16), gru=(2, 64, 32))
    else:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        why = fj.cuda_unavailable_reason()
        if not gpus or why:
            sys.exit(f"jax_bench: needs a GPU and fusex's CUDA backend (JAX devices {jax.devices()}; fusex: {why})")
        dev = gpus[0]
        sizes = dict(big=(8, 2048, 1536, 16), small=(1, 32, 512, 16), gru=(16, 1024, 1024))
    key = jax.random.PRNGKey(0)
    rows = []

    def row(op, shape, fn, inputs, kernel=True, pipelined=True, note=""):
        f = jax.jit(fn)
        call = lambda: f(*inputs)  # noqa: E731
        jax.block_until_ready(call())
        rows.append({
            "op": op, "shape": shape,
            "kernel": device_time_us(call, args.reps) if kernel else None,
            "pipelined": pipelined_us(call, args.reps) if pipelined else None,
            "e2e": median_us(call, args.reps),
            "note": note,
        })
        print(f"  {op} {shape}: {rows[-1]}", file=sys.stderr, flush=True)

    big_shape = "B{} L{} D{} N{}".format(*sizes["big"])
    big = jax.device_put(ssm_inputs(key, *sizes["big"]), dev)
    row("selective_scan fwd", big_shape, ssm_fusex, big)
    row("selective_scan fwd+bwd", big_shape, grad_of(ssm_fusex, 8), big)
    small = jax.device_put(ssm_inputs(key, 1, 32, 512, 16), dev)
    row("selective_scan fwd", "B1 L32 D512 N16", ssm_fusex, small)
    state = jnp.zeros((1, 512, 16), jnp.float32)
    step_in = jax.device_put((state, small[0][:, 0], small[1][:, 0], small[2], small[3][:, 0], small[4][:, 0]), dev)
    row("selective_scan_step", "B1 D512 N16", lambda s, x, dt, a, b, c: fj.selective_scan_step(s, x, dt, a, b, c),
        step_in)

    k1, k2 = jax.random.split(key)
    gru_shape = "B{} L{} H{}".format(*sizes["gru"])
    gru = jax.device_put((jax.random.normal(k1, sizes["gru"], jnp.float32),
                          jax.random.normal(k2, sizes["gru"], jnp.float32)), dev)
    row("mingru fwd", gru_shape, lambda zl, cv: fj.mingru(zl, cv), gru)
    row("mingru fwd+bwd", gru_shape, grad_of(lambda zl, cv: fj.mingru(zl, cv), 2), gru)
    gru_small = jax.device_put((jax.random.normal(k1, (1, 32, 512), jnp.float32),
                                jax.random.normal(k2, (1, 32, 512), jnp.float32)), dev)
    row("mingru fwd", "B1 L32 H512", lambda zl, cv: fj.mingru(zl, cv), gru_small)

    if not args.no_assoc:
        y_fusex = jax.jit(ssm_fusex)(*big)
        y_assoc = jax.jit(ssm_associative)(*big)
        err = float(jnp.linalg.norm(y_fusex - y_assoc) / jnp.linalg.norm(y_assoc))
        del y_fusex, y_assoc
        row("JAX lax.associative_scan selective scan fwd", big_shape, ssm_associative, big,
            pipelined=False, note=f"rel-L2 vs fusex {err:.1e}")

    # What a jitted call costs in JAX itself on this machine, with no fusex
    # in it: the same inputs through XLA's own fused elementwise kernels.
    row("JAX floor: jitted x * 2 (no custom call)", "B1 L32 D512", lambda x: x * 2.0, small[:1])
    row("JAX floor: jitted sum of 8 inputs (no custom call)", "B1 L32 D512",
        lambda x, dt, a, b, c, d, z, bias: x * 2.0 + dt + z + d + bias + jnp.sum(a) + jnp.sum(b) + jnp.sum(c),
        small)
    row("JAX floor: jitted x * 2 (no custom call)", big_shape, lambda x: x * 2.0, big[:1])

    def fmt(v):
        return "-" if v is None else f"{v:.1f}"

    lines = [
        f"fusex for JAX on {dev.device_kind} (jax {jax.__version__}), {args.reps} reps; "
        "kernel us from the profiler trace (device time per call, mean), e2e = jitted call + block_until_ready "
        "(median)",
        "",
        "| op | shape | kernel us | pipelined us/call | e2e us | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape']} | {fmt(r['kernel'])} | {fmt(r['pipelined'])} | {fmt(r['e2e'])} "
                     f"| {r['note']} |")
    fwd = rows[0]  # the large selective scan forward
    assoc = [r for r in rows if r["op"].startswith("JAX lax.associative_scan")]
    if assoc:
        lines.append("")
        lines.append(f"JAX's associative scan / fusex (e2e): {assoc[0]['e2e'] / fwd['e2e']:.1f}x")
        if assoc[0]["kernel"] is not None and fwd["kernel"] is not None:
            lines.append(f"JAX's associative scan / fusex (kernel): {assoc[0]['kernel'] / fwd['kernel']:.1f}x")
    small_row = next(r for r in rows if r["op"] == "selective_scan fwd" and r["shape"].startswith("B1"))
    if small_row["kernel"] is not None:
        lines.append(f"B1 L32: e2e - kernel = {small_row['e2e'] - small_row['kernel']:.1f} us")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
