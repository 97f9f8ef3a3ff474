#!/usr/bin/env python3
"""The PyTorch side of fusex's cross-process CUDA IPC test (fusex_ipc_SUITE).

    torch_ipc.py probe
        exit 0 when torch and a CUDA device are usable, else print why, exit 3
    torch_ipc.py serve DTYPE N SEED
        allocate a CUDA tensor of N random values (seeded) at an offset inside
        a larger storage, print its IPC handle as
        "export handle=HEX offset=BYTES size=BYTES", then serve stdin lines:
        "verify FACTOR" checks that the tensor now holds FACTOR * the original
        values (the BEAM wrote them through the mapping); "exit" ends.
    torch_ipc.py check DTYPE N SEED FACTOR HANDLE OFFSET SIZE
        open a handle fusex exported, in a process of its own, and check that
        it holds FACTOR * the original values, every one.

Handles are the 64-byte cudaIpcMemHandle_t that EXLA and fusex exchange.
PyTorch's own storage handle (UntypedStorage._share_cuda_) wraps one: torch
2.x writes [version byte]['c'][64-byte cudaIpcMemHandle_t] for cudaMalloc
blocks, and its storage offset inside that allocation beside it.
"""
import ctypes
import glob
import os
import sys

# Expandable segments are not cudaMalloc blocks and have no legacy handle.
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"

HANDLE_SIZE = 64
PAD = 37  # elements before the shared tensor inside its storage: a real offset


def fail(msg, code=1):
    print(msg, flush=True)
    sys.exit(code)


def torch_or_skip():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
        fail(f"no torch: {e}", 3)
    if not torch.cuda.is_available():
        fail("torch found no CUDA device", 3)
    return torch


def dtype_of(torch, name):
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]


def reference(torch, dtype, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen, dtype=torch.float32).to(dtype)


def legacy_handle(raw):
    """The cudaIpcMemHandle_t inside torch's storage handle."""
    raw = bytes(raw)
    if len(raw) == HANDLE_SIZE:
        return raw
    if len(raw) >= 2 + HANDLE_SIZE and raw[1] == ord("c"):
        return raw[2:2 + HANDLE_SIZE]
    fail(f"unexpected torch storage handle ({len(raw)} bytes, type {raw[1:2]!r}): "
         "not a cudaMalloc block")


def serve(dtype_name, n, seed):
    torch = torch_or_skip()
    dtype = dtype_of(torch, dtype_name)
    storage = torch.full((PAD + n + 5,), float("nan"), dtype=dtype, device="cuda")
    x = storage[PAD:PAD + n]
    ref = reference(torch, dtype, n, seed)
    x.copy_(ref.cuda())
    torch.cuda.synchronize()  # the importer cannot order itself after our stream
    shared = x.untyped_storage()._share_cuda_()
    handle, storage_offset = legacy_handle(shared[1]), shared[3]
    offset = storage_offset + x.storage_offset() * x.element_size()
    print(f"export handle={handle.hex()} offset={offset} size={n * x.element_size()}",
          flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "exit":
            break
        if words[0] == "verify":
            torch.cuda.synchronize()
            report(torch, x.cpu(), (ref.float() * float(words[1])).to(dtype))
            untouched = torch.isnan(storage[:PAD].float()).all() and \
                torch.isnan(storage[PAD + n:].float()).all()
            if not untouched:
                print("FAIL: the BEAM wrote outside the shared tensor", flush=True)


def report(torch, got, want):
    if torch.equal(got, want):
        print("ok", flush=True)
        return
    bad = (got != want).nonzero().flatten()
    i = int(bad[0])
    print(f"FAIL: {bad.numel()} of {want.numel()} values differ; first at {i}: "
          f"got {float(got[i])}, want {float(want[i])}", flush=True)


def cudart(torch):
    """The CUDA runtime torch loaded (or any on the library path)."""
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    roots = [os.path.dirname(torch.__file__)] + sys.path
    for root in roots:
        names += glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libcudart.so*"))
        names += glob.glob(os.path.join(root, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
        names += glob.glob(os.path.join(root, "lib", "libcudart*.so*"))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    fail("no libcudart found to open an IPC handle with")


class IpcHandle(ctypes.Structure):
    """cudaIpcMemHandle_t: a struct, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * HANDLE_SIZE)]


class CudaArray:
    """Wraps a raw device pointer for torch.as_tensor (__cuda_array_interface__)."""

    def __init__(self, ptr, n, typestr):
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": typestr, "data": (ptr, False), "version": 2,
        }


def check(dtype_name, n, seed, factor, handle_hex, offset, size):
    torch = torch_or_skip()
    dtype = dtype_of(torch, dtype_name)
    torch.zeros(1, device="cuda")  # create the context on the device
    rt = cudart(torch)
    handle = IpcHandle.from_buffer_copy(bytes.fromhex(handle_hex))
    base = ctypes.c_void_p()
    # cudaIpcOpenMemHandle(void **, cudaIpcMemHandle_t, unsigned int flags)
    rt.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
    rt.cudaIpcOpenMemHandle.restype = ctypes.c_int
    rt.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
    err = rt.cudaIpcOpenMemHandle(ctypes.byref(base), handle, 1)  # LazyEnablePeerAccess
    if err != 0:
        fail(f"cudaIpcOpenMemHandle failed with cudaError {err}")
    element = torch.empty(0, dtype=dtype).element_size()
    if size != n * element:
        fail(f"size: expected {n * element} bytes, got {size}")
    # bf16 has no array-interface type string: view the bytes as int16.
    typestr = "<f4" if dtype == torch.float32 else "<i2"
    raw = torch.as_tensor(CudaArray(base.value + offset, n, typestr), device="cuda")
    got = raw.cpu().clone()
    if typestr == "<i2":
        got = got.view(dtype)
    rt.cudaIpcCloseMemHandle(base)
    report(torch, got, (reference(torch, dtype, n, seed).float() * factor).to(dtype))


def main(argv):
    if len(argv) >= 1 and argv[0] == "probe":
        torch_or_skip()
        print("ok", flush=True)
    elif len(argv) == 4 and argv[0] == "serve":
        serve(argv[1], int(argv[2]), int(argv[3]))
    elif len(argv) == 8 and argv[0] == "check":
        check(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), argv[5], int(argv[6]),
              int(argv[7]))
    else:
        fail(__doc__, 2)


if __name__ == "__main__":
    main(sys.argv[1:])
