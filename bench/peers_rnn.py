"""cuDNN's GRU and LSTM through PyTorch at the shapes of dev/rnn_bench (the
issue's targets), on the GPU, as the peer fusex's rows are compared with.

    python3 bench/peers_rnn.py [--reps 30] [--out FILE] [--dtype f32|f32-exact|bf16|both]

Prints one markdown table. Per case:

- eager us: the forward (torch.no_grad, batch_first nn.GRU / nn.LSTM), or
  the forward with the backward of every parameter and of x and h0
  (fwd+bwd), timed by CUDA events around the call after a 200 us spin
  kernel (torch.cuda._sleep), so that the host's launches are not what is
  timed; median of `reps`.
- graph us: the same replayed from a CUDA graph (cudaGraphLaunch): what a
  caller that captured it pays on the device.
- host us: the eager call plus torch.cuda.synchronize(), from the host.

The step case is one frame of both layers (seq 1, h and c carried), what an
agent calls once a frame: its graph replay is the issue's "35.7 us GRU,
29.5 us LSTM" row. cudnn.benchmark is on; the weights are flattened into
cuDNN's one buffer. The f32 rows leave TF32 at PyTorch's default (cuDNN's
RNNs may use TF32 for f32: torch.backends.cudnn.allow_tf32 is True by
default); the f32-exact rows turn it off, the products fusex's f32 computes.

Run it beside build/rnn_bench in one GPU call:

    make nif && make -f dev/Makefile build/rnn_bench
    FUSEX_PRIV=priv build/rnn_bench --markdown 1 && python3 bench/peers_rnn.py
"""

import argparse
import statistics
import sys
import time

try:
    import torch
except ImportError:  # the table needs torch; say so and leave
    print("peers_rnn: torch is not installed", file=sys.stderr)
    sys.exit(2)

# op, layers, batch, seqlen, input, hidden, mode, target (fusex's, us)
CASES = [
    ("gru", 2, 1, 60, 512, 512, "fwd", 150),
    ("gru", 2, 64, 60, 512, 512, "fwd+bwd", 1500),
    ("gru", 2, 256, 60, 512, 512, "fwd", 1000),
    ("lstm", 2, 1, 60, 512, 512, "fwd", 150),
    ("lstm", 2, 64, 60, 512, 512, "fwd+bwd", 1800),
    ("lstm", 2, 256, 60, 512, 512, "fwd", 1000),
    ("gru", 2, 1, 1, 512, 512, "step", 8),
    ("lstm", 2, 1, 1, 512, 512, "step", 8),
    ("gru", 1, 16, 1024, 1024, 1024, "fwd", None),
    ("gru", 1, 4, 32, 2048, 2048, "fwd", None),
]

DTYPES = {"f32": torch.float32, "f32-exact": torch.float32, "bf16": torch.bfloat16}


def make(op, layers, batch, seqlen, inp, hidden, dtype):
    cls = torch.nn.GRU if op == "gru" else torch.nn.LSTM
    net = cls(inp, hidden, num_layers=layers, batch_first=True).cuda().to(dtype)
    # one contiguous weight buffer, as cuDNN wants it (else it compacts
    # the weights again every call and the eager rows time that too)
    net.flatten_parameters()
    x = torch.randn(batch, seqlen, inp, device="cuda", dtype=dtype)
    h0 = torch.randn(layers, batch, hidden, device="cuda", dtype=dtype)
    state = h0 if op == "gru" else (h0, torch.randn_like(h0))
    return net, x, state


def runner(net, x, state, mode):
    if mode == "fwd+bwd":
        x = x.clone().requires_grad_(True)
        if isinstance(state, tuple):
            state = tuple(s.clone().requires_grad_(True) for s in state)
        else:
            state = state.clone().requires_grad_(True)
        dy = torch.randn(x.shape[0], x.shape[1], net.hidden_size, device="cuda", dtype=x.dtype)

        def call():
            y, _ = net(x, state)
            y.backward(dy)

        return call

    def call():
        with torch.no_grad():
            return net(x, state)

    return call


def time_events(call, reps):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        torch.cuda._sleep(200_000)  # ~200 us of device work ahead of the call
        start.record()
        call()
        stop.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(out)


def time_host(call, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def time_graph(call, reps):
    """The call captured in a CUDA graph and replayed; None where it cannot
    be captured (a backward through autograd's own streams)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        return time_events(graph.replay, reps)
    except Exception as e:  # noqa: BLE001: any capture failure means "no graph row"
        print(f"peers_rnn: no CUDA graph for this case: {e}", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out")
    ap.add_argument("--dtype", default="both", choices=["f32", "f32-exact", "bf16", "both"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("peers_rnn: no CUDA device", file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.benchmark = True
    # f32-exact: cuDNN without TF32, the products fusex's f32 computes
    dtypes = ["f32", "f32-exact", "bf16"] if args.dtype == "both" else [args.dtype]
    lines = [
        f"cuDNN {torch.backends.cudnn.version()} through PyTorch {torch.__version__} on "
        f"{torch.cuda.get_device_name()} (cudnn.allow_tf32={torch.backends.cudnn.allow_tf32})",
        "",
        "| op | shape | dtype | eager us | graph us | host us | fusex target us |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for dt in dtypes:
        torch.backends.cudnn.allow_tf32 = dt != "f32-exact"
        for op, layers, b, l, i, h, mode, target in CASES:
            net, x, state = make(op, layers, b, l, i, h, DTYPES[dt])
            call = runner(net, x, state, mode)
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            eager = time_events(call, args.reps)
            graph = time_graph(call, args.reps) if mode != "fwd+bwd" else None
            host = time_host(call, args.reps)
            shape = f"B{b} L{l} I{i} H{h} x{layers}"
            g = f"{graph:.1f}" if graph is not None else "-"
            t = f"{target}" if target else "-"
            lines.append(f"| {op} {mode} | {shape} | {dt} | {eager:.1f} | {g} | {host:.1f} | {t} |")
            print(lines[-1], file=sys.stderr)
            del net, x, state, call
            torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
