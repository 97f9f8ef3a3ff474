#!/usr/bin/env python3
"""PyTorch's side of dev/mamba_bench's rows (the rest of a Mamba block), for
the same GPU call: causal depthwise conv1d (F.conv1d with groups=D, eager;
Dao-AILab's causal_conv1d where it is installed), RMSNorm / LayerNorm with
the residual add (eager and torch.compile), and the linear layer (cuBLAS(Lt)
through F.linear / torch.matmul). Prints a markdown table.

    python3 bench/peers_mamba.py [--reps N] [--only SUBSTRING]

Timing: the GPU is kept busy (torch.cuda._sleep) while the host enqueues
the timed work, then CUDA events around it: kernel time without launch
gaps, as fusex's benches measure (median of --reps). "host us" is the call
plus torch.cuda.synchronize() on an idle GPU: what a one-frame caller
waits for. The floor counts each input read once and each output written
once (the column says which tensors); GB/s and % copy are over it, % copy
against a device-to-device copy measured first.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SLEEP_CYCLES = 2_000_000  # ~1 ms at H200 clocks: covers the host's enqueue of one row


def kernel_us(fn, reps):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def host_us(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def copy_bandwidth():
    a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = kernel_us(lambda: b.copy_(a), 20)
    return 2 * a.numel() / (us * 1e3)


ROWS = []


def row(name, peer, shape, dtype, us, floor_bytes, what, flops=0.0, host=None, note=""):
    ROWS.append((name, peer, shape, dtype, us, floor_bytes, what, flops, host, note))


def size(dtype):
    return torch.tensor([], dtype=dtype).element_size()


# ---- causal conv1d ----

def conv_rows(reps, B=8, L=2048, D=1536, W=4):
    for dtype in (torch.float32, torch.bfloat16):
        es = size(dtype)
        n = B * L * D * es
        params = D * (W + 1) * es
        x_cf = torch.randn(B, D, L, device="cuda", dtype=dtype)      # channels first, as F.conv1d wants
        x_cl = torch.randn(B, L, D, device="cuda", dtype=dtype)      # channels last, fusex's layout
        w = torch.randn(D, 1, W, device="cuda", dtype=dtype) * 0.5
        b = torch.randn(D, device="cuda", dtype=dtype) * 0.5

        def conv(x):
            return F.silu(F.conv1d(x, w, b, padding=W - 1, groups=D)[..., :L])

        shape = f"B{B} L{L} D{D} W{W} silu +bias"
        row("causal_conv1d fwd", "F.conv1d(groups=D) eager, [B, D, L] input", shape, dtype,
            kernel_us(lambda: conv(x_cf), reps), 2 * n + params, "x, y")
        row("causal_conv1d fwd", "F.conv1d(groups=D) eager, [B, L, D] input transposed", shape, dtype,
            kernel_us(lambda: conv(x_cl.transpose(1, 2)).transpose(1, 2).contiguous(), reps), 2 * n + params,
            "x, y")
        if dtype == torch.float32:
            xg = x_cf.clone().requires_grad_(True)
            wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            dy = torch.randn(B, D, L, device="cuda", dtype=dtype)

            def fwd_bwd():
                y = F.silu(F.conv1d(xg, wg, bg, padding=W - 1, groups=D)[..., :L])
                y.backward(dy)

            row("causal_conv1d fwd+bwd", "F.conv1d(groups=D) eager + autograd", shape, dtype,
                kernel_us(fwd_bwd, reps), 5 * n + 3 * params, "x, y + x, dy, dx")
        try:
            from causal_conv1d import causal_conv1d_fn  # Dao-AILab/causal-conv1d

            w2 = w[:, 0, :].contiguous()
            # channels last: a [B, D, L] view of [B, L, D] memory, which the package reads in place
            x_view = x_cl.transpose(1, 2)
            row("causal_conv1d fwd", "causal_conv1d_fn (channels last)", shape, dtype,
                kernel_us(lambda: causal_conv1d_fn(x_view, w2, b, activation="silu"), reps), 2 * n + params, "x, y")
        except Exception as err:  # not installed, or no kernel for the layout
            row("causal_conv1d fwd", f"causal_conv1d_fn: not run ({type(err).__name__})", shape, dtype,
                float("nan"), 2 * n + params, "x, y")
    # one step of a frame: y and the rolled state, as a caller does it in eager PyTorch
    state = torch.randn(1, D, W - 1, device="cuda")
    x1 = torch.randn(1, D, device="cuda")
    w2 = torch.randn(D, W, device="cuda")
    b2 = torch.randn(D, device="cuda")

    def step():
        window = torch.cat([state, x1[:, :, None]], dim=2)
        y = F.silu((window * w2).sum(-1) + b2)
        state.copy_(window[:, :, 1:])
        return y

    row("causal_conv1d step", "eager (cat, mul, sum, silu, copy)", f"B1 D{D} W{W}", torch.float32,
        kernel_us(step, reps), (2 * D + 2 * D * (W - 1) + D * (W + 1)) * 4, "x, y, state r+w",
        host=host_us(step, reps))


# ---- norms ----

def rms_norm(x, weight, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_residual(x, r, w):
    s = x + r
    return rms_norm(s, w, 1e-5), s


def layer_silu(x, w, b):
    return F.silu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5))


def norm_rows(reps, rows=65536, hidden=1024):
    compiled_rms = torch.compile(rms_residual)
    compiled_layer = torch.compile(layer_silu)
    for dtype in (torch.float32, torch.bfloat16):
        es = size(dtype)
        n = rows * hidden * es
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        r = torch.randn_like(x)
        w = torch.rand(hidden, device="cuda", dtype=dtype) + 0.5
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        shape = f"{rows}x{hidden}"
        for peer, fn in (("eager", rms_residual), ("torch.compile", compiled_rms)):
            row("rms_norm + residual fwd", peer, shape + " +residual", dtype, kernel_us(lambda: fn(x, r, w), reps),
                4 * n + rows * 4, "x, r, y, s")
        for peer, fn in (("eager", layer_silu), ("torch.compile", compiled_layer)):
            row("layer_norm + silu fwd", peer, shape + " (silu(layer_norm(x)))", dtype,
                kernel_us(lambda: fn(x, w, b), reps), 2 * n, "x, y")
        if dtype == torch.float32:
            xg, rg, wg = x.clone().requires_grad_(True), r.clone().requires_grad_(True), w.clone().requires_grad_(True)
            dy = torch.randn_like(x)
            for peer, fn in (("eager + autograd", rms_residual), ("torch.compile + autograd", compiled_rms)):
                def fwd_bwd(fn=fn):
                    y, _ = fn(xg, rg, wg)
                    y.backward(dy)

                row("rms_norm + residual fwd+bwd", peer, shape + " +residual", dtype, kernel_us(fwd_bwd, reps),
                    8 * n + 2 * rows * 4, "x, r, y, s + s, dy, dx, dr")
    long_x = torch.randn(256, 65537, device="cuda")
    long_w = torch.rand(65537, device="cuda") + 0.5
    long_r = torch.randn_like(long_x)
    row("rms_norm + residual fwd", "eager", "256x65537 +residual", torch.float32,
        kernel_us(lambda: rms_residual(long_x, long_r, long_w), reps), 4 * long_x.numel() * 4, "x, r, y, s")


# ---- linear ----

def linear_rows(reps):
    for dtype, rows, k, n in ((torch.bfloat16, 16384, 768, 3072), (torch.float32, 16384, 768, 3072)):
        es = size(dtype)
        x = torch.randn(rows, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.05
        b = torch.randn(n, device="cuda", dtype=dtype)
        floor = (rows * k + n * k + rows * n) * es
        f = 2.0 * rows * k * n
        shape = f"{rows}x{k} -> {n}"
        row("linear fwd", "F.linear (cuBLASLt, bias epilogue)", shape + " none +bias", dtype,
            kernel_us(lambda: F.linear(x, w, b), reps), floor, "x, w, y", f)
        row("linear fwd", "torch.matmul(x, w.t()) (cuBLAS, no bias)", shape + " none", dtype,
            kernel_us(lambda: torch.matmul(x, w.t()), reps), floor, "x, w, y", f)
        if dtype == torch.bfloat16:
            row("linear fwd", "F.gelu(F.linear, approximate=tanh) eager", shape + " gelu +bias", dtype,
                kernel_us(lambda: F.gelu(F.linear(x, w, b), approximate="tanh"), reps), floor, "x, w, y", f)
            row("linear fwd", "F.silu(F.linear) eager", shape + " silu +bias", dtype,
                kernel_us(lambda: F.silu(F.linear(x, w, b)), reps), floor, "x, w, y", f)
            xg, wg, bg = x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            dy = torch.randn(rows, n, device="cuda", dtype=dtype)

            def bwd():
                xg.grad = wg.grad = bg.grad = None
                torch.autograd.backward(F.linear(xg, wg, bg), dy)

            row("linear fwd+bwd", "F.linear + autograd", shape + " none +bias", dtype, kernel_us(bwd, reps),
                floor + (2 * (rows * k + n * k) + rows * n) * es, "fwd + x, w, dy, dx, dw", 3 * f)
    x1 = torch.randn(1, 256, device="cuda")
    w1 = torch.randn(1024, 256, device="cuda")
    b1 = torch.randn(1024, device="cuda")
    row("linear fwd", "F.linear", "1x256 -> 1024 none +bias", torch.float32, kernel_us(lambda: F.linear(x1, w1, b1), reps),
        (256 + 1024 * 256 + 1024) * 4, "x, w, y", 2.0 * 256 * 1024, host=host_us(lambda: F.linear(x1, w1, b1), reps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--only", default="", help="run the row groups whose name holds this (conv, norm, linear)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # exact f32, as fusex's default
    torch.backends.cudnn.allow_tf32 = False
    bw = copy_bandwidth()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; copy bandwidth {bw:.0f} GB/s (read + write)\n")
    for name, fn in (("conv", conv_rows), ("norm", norm_rows), ("linear", linear_rows)):
        if args.only in name:
            fn(args.reps)
    print("| op | peer | shape | dtype | kernel us | floor (bytes of) | GB/s | % copy | TFLOP/s | host us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, peer, shape, dtype, us, floor, what, flops, host, _ in ROWS:
        gbs = floor / (us * 1e3) if us == us else float("nan")
        tf = f"{flops / (us * 1e6):.1f}" if flops and us == us else "-"
        hs = f"{host:.2f}" if host is not None else "-"
        dt = str(dtype).replace("torch.", "")
        print(f"| {name} | {peer} | {shape} | {dt} | {us:.2f} | {floor / 1e6:.1f} MB ({what}) | {gbs:.0f} | "
              f"{100 * gbs / bw:.1f} | {tf} | {hs} |")


if __name__ == "__main__":
    main()
