"""Loads priv/fusex_xla.so and registers its targets with JAX.

The library describes its ops (``fusex_xla_op_describe``: one JSON object
each, the op layer's descriptions) and hands out an XLA FFI handler per op
and platform (``fusex_xla_op_handler``); JAX's ``cpu`` is XLA's ``Host`` and
JAX's GPU platform is registered as ``CUDA`` (upper case: XLA's name for
it).
"""

import ctypes
import json
import os

import jax

# JAX's platform name -> the library's platform code.
PLATFORMS = {"cpu": 0, "CUDA": 1}


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
    lib.fusex_xla_op_count.argtypes = []
    lib.fusex_xla_op_count.restype = ctypes.c_int
    lib.fusex_xla_op_describe.argtypes = [ctypes.c_int]
    lib.fusex_xla_op_describe.restype = ctypes.c_char_p
    lib.fusex_xla_dtypes_json.argtypes = []
    lib.fusex_xla_dtypes_json.restype = ctypes.c_char_p
    lib.fusex_xla_op_index.argtypes = [ctypes.c_char_p]
    lib.fusex_xla_op_index.restype = ctypes.c_int
    lib.fusex_xla_op_handler.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.fusex_xla_op_handler.restype = ctypes.c_void_p
    I32P, I64P, F64P = (ctypes.POINTER(t) for t in (ctypes.c_int32, ctypes.c_int64, ctypes.c_double))
    lib.fusex_xla_op_check.argtypes = [ctypes.c_int, ctypes.c_int, I32P, I32P, I32P, I64P, F64P, I32P, I32P, I32P,
                                       I64P, ctypes.c_char_p, ctypes.c_size_t]
    lib.fusex_xla_op_check.restype = ctypes.c_int
    descriptions = tuple(json.loads(lib.fusex_xla_op_describe(i)) for i in range(lib.fusex_xla_op_count()))
    for op, d in enumerate(descriptions):
        for platform, code in PLATFORMS.items():
            handler = ctypes.c_void_p(lib.fusex_xla_op_handler(op, code))
            jax.ffi.register_ffi_target(d["target"], jax.ffi.pycapsule(handler), platform=platform)
    return lib, descriptions


LIB, DESCRIPTIONS = _load()
# The targets, in the library's order ("fusex_selective_scan_fwd", ...).
TARGETS = tuple(d["target"] for d in DESCRIPTIONS)


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
