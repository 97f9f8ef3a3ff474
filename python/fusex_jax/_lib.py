"""Loads priv/fusex_xla.so and registers its targets with JAX.

The library describes its ops (``fusex_xla_op_describe``: one JSON object
each, the op layer's descriptions), hands out an XLA FFI handler per op
and platform (``fusex_xla_op_handler``) and checks a call on shapes and
types alone (``fusex_xla_op_check``: the op layer's check, with its
messages, giving the results' types and shapes). JAX's ``cpu`` is XLA's
``Host`` and JAX's GPU platform is registered as ``CUDA`` (upper case:
XLA's name for it).
"""

import ctypes
import json
import os

import jax
import numpy as np

# JAX's platform name -> the library's platform code.
PLATFORMS = {"cpu": 0, "CUDA": 1}
HOST = 0
MAX_RANK = 8
FX_EBADARG = 1


class ArgumentError(ValueError, TypeError):
    """Bad input to a fusex_jax function, refused when it is called (at
    trace time under ``jax.jit``): the message is the op layer's, the one
    the Erlang API and ``Fusex.Defn`` give for the same input ("x: expected
    type {f,32}, got {bf,16}"). Both a ``ValueError`` and a ``TypeError``,
    as JAX raises either for bad shapes and types."""


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
# The targets, in the library's order ("fusex_<op>_fwd", ...).
TARGETS = tuple(d["target"] for d in DESCRIPTIONS)

# The element types by the library's codes, as numpy dtypes ("f32" ->
# float32, "bf16" -> JAX's bfloat16).
_SHORT = {"f32": "float32", "f64": "float64", "bf16": "bfloat16", "f16": "float16", "s32": "int32", "s64": "int64",
          "u8": "uint8"}
DTYPES = tuple(np.dtype(jax.numpy.dtype(_SHORT[t])) for t in json.loads(LIB.fusex_xla_dtypes_json()))
_CODES = {t: i for i, t in enumerate(DTYPES)}


def type_name(dtype):
    """A dtype as Nx (and the op layer's messages) spell it: ``{f,32}``."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return "{bf,16}"
    kind = {"f": "f", "i": "s", "u": "u", "b": "pred", "c": "c"}.get(dtype.kind, dtype.kind)
    return f"{{{kind},{dtype.itemsize * 8}}}"


def check(op, inputs, attrs, desc=None):
    """The op layer's check of a call of description ``op`` (its index) on
    the Host platform: ``inputs`` one ``(dtype, shape)`` or None per input
    of the description, ``attrs`` one number per attribute (presence
    attributes follow from the inputs given). Returns one ``(dtype, shape)``
    or None per result; raises ArgumentError with the op layer's message.
    ``desc``: the description with its repeated group written out once per
    repetition (one input and result per slot; docs/XLA.md), where it has
    one."""
    d = desc or DESCRIPTIONS[op]
    n_in, n_out = len(d["inputs"]), len(d["results"])
    present = (ctypes.c_int32 * max(n_in, 1))()
    dtypes = (ctypes.c_int32 * max(n_in, 1))()
    ranks = (ctypes.c_int32 * max(n_in, 1))()
    dims = (ctypes.c_int64 * (MAX_RANK * max(n_in, 1)))()
    for i, spec in enumerate(inputs):
        if spec is None:
            continue
        dtype, shape = np.dtype(spec[0]), tuple(spec[1])
        name = d["inputs"][i]["name"]
        if dtype not in _CODES:
            # The handler's words for an XLA type fusex has no code for.
            raise ArgumentError(f"{name}: expected a float type ({{f,32}}, {{bf,16}}, {{f,16}} or {{f,64}}), "
                                f"got {type_name(dtype)}")
        if len(shape) > MAX_RANK:
            raise ArgumentError(f"{name}: expected rank at most {MAX_RANK}, got rank {len(shape)}")
        present[i], dtypes[i], ranks[i] = 1, _CODES[dtype], len(shape)
        for k, n in enumerate(shape):
            dims[i * MAX_RANK + k] = n
    values = (ctypes.c_double * max(len(d["attrs"]), 1))(*attrs)
    out_present = (ctypes.c_int32 * max(n_out, 1))()
    out_dtypes = (ctypes.c_int32 * max(n_out, 1))()
    out_ranks = (ctypes.c_int32 * max(n_out, 1))()
    out_dims = (ctypes.c_int64 * (MAX_RANK * max(n_out, 1)))()
    msg = ctypes.create_string_buffer(512)
    rc = LIB.fusex_xla_op_check(op, HOST, present, dtypes, ranks, dims, values, out_present, out_dtypes, out_ranks,
                                out_dims, msg, ctypes.sizeof(msg))
    if rc == FX_EBADARG:
        raise ArgumentError(msg.value.decode())
    if rc != 0:
        raise RuntimeError(f"{d['target']}: {msg.value.decode()}")
    return tuple((DTYPES[out_dtypes[r]], tuple(out_dims[r * MAX_RANK + k] for k in range(out_ranks[r])))
                 if out_present[r] else None for r in range(n_out))


def saved_shape(batch, seqlen, dim, dstate, groups, dtype_name):
    """``fusex_xla_ssm_saved_shape``: the saved states' shape by the
    library's one rule (int64 sizes)."""
    out = (ctypes.c_int64 * 4)()
    msg = ctypes.create_string_buffer(256)
    rc = LIB.fusex_xla_ssm_saved_shape(batch, seqlen, dim, dstate, groups, dtype_name.encode(), out, msg,
                                       ctypes.sizeof(msg))
    if rc != 0:
        raise ArgumentError(msg.value.decode())
    return tuple(int(v) for v in out)


def cuda_unavailable_reason():
    """None when the CUDA handlers can run, else why not (a string)."""
    why = LIB.fusex_xla_cuda_unavailable_reason()
    return None if why is None else why.decode()
