"""Loads priv/fusex_xla.so and registers its targets with JAX.

The library holds one XLA FFI handler per target and platform
(``fusex_<op>_<dir>_host``, ``fusex_<op>_<dir>_cuda``); JAX's ``cpu`` is
XLA's ``Host`` and JAX's GPU platform is registered as ``CUDA`` (upper
case: XLA's name for it).
"""

import ctypes
import os

import jax

OPS = ("selective_scan", "linear_scan", "mingru", "minlstm", "liquid")
DIRECTIONS = ("fwd", "bwd", "step")
TARGETS = tuple(f"fusex_{op}_{d}" for op in OPS for d in DIRECTIONS)

# JAX's platform name -> the suffix of the handler symbols.
PLATFORMS = {"cpu": "host", "CUDA": "cuda"}


def library_path():
    """``FUSEX_XLA_LIB``, else ``priv/fusex_xla.so`` of the fusex checkout
    this package lies in (``python/fusex_jax`` -> ``priv``)."""
    path = os.environ.get("FUSEX_XLA_LIB")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "priv", "fusex_xla.so"))


def _load():
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(
            f"fusex_jax: {path} not found: `make` builds it where the XLA FFI headers are found "
            "(it says why when it does not), or set FUSEX_XLA_LIB")
    lib = ctypes.CDLL(path)  # RTLD_LOCAL: the core inside stays private
    lib.fusex_xla_ssm_saved_shape.argtypes = [ctypes.c_int64] * 5 + [
        ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_size_t]
    lib.fusex_xla_ssm_saved_shape.restype = ctypes.c_int
    lib.fusex_xla_cuda_unavailable_reason.argtypes = []
    lib.fusex_xla_cuda_unavailable_reason.restype = ctypes.c_char_p
    for target in TARGETS:
        for platform, suffix in PLATFORMS.items():
            handler = getattr(lib, f"{target}_{suffix}")
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform=platform)
    return lib


LIB = _load()


def saved_shape(batch, seqlen, dim, dstate, groups, dtype_name):
    """The selective scan's saved states' shape: the library's one rule."""
    out = (ctypes.c_int64 * 4)()
    msg = ctypes.create_string_buffer(256)
    rc = LIB.fusex_xla_ssm_saved_shape(batch, seqlen, dim, dstate, groups, dtype_name.encode(), out, msg,
                                       ctypes.sizeof(msg))
    if rc != 0:
        raise TypeError(msg.value.decode())
    return tuple(int(v) for v in out)


def cuda_unavailable_reason():
    """None when the CUDA handlers can run, else why not (a string)."""
    why = LIB.fusex_xla_cuda_unavailable_reason()
    return None if why is None else why.decode()
