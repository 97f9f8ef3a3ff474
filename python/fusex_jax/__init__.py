"""fusex for JAX: fused recurrences and state-space models as XLA custom
calls, with their own backward kernels, under ``jax.jit`` and ``jax.grad``.

Importing the package loads ``priv/fusex_xla.so`` (or ``FUSEX_XLA_LIB``) and
registers its targets for the ``cpu`` and ``CUDA`` platforms. The CPU
handlers run fusex's CPU backend (f64 accumulation); the CUDA ones launch
fusex's kernels on XLA's stream, with scratch from XLA's allocator.
Semantics are those of the Erlang API (docs/SSM.md, docs/LINREC.md,
docs/LAYERS.md);
the targets themselves are documented in docs/XLA.md.

Each kernel family the library describes has its public functions in the
module of the family's name (``fusex_jax.ssm``, ``fusex_jax.linrec``, ...),
all exported here.
"""

import importlib
import importlib.util

from ._lib import DESCRIPTIONS, TARGETS, ArgumentError, cuda_unavailable_reason, library_path

__all__ = ["DESCRIPTIONS", "FAMILIES", "TARGETS", "ArgumentError", "library_path", "cuda_unavailable_reason"]

# The families in the library's order, each module's public functions.
FAMILIES = tuple(dict.fromkeys(d["family"] for d in DESCRIPTIONS))
for _family in FAMILIES:
    if importlib.util.find_spec(f".{_family}", __name__) is None:
        continue
    _module = importlib.import_module(f".{_family}", __name__)
    for _name in _module.__all__:
        globals()[_name] = getattr(_module, _name)
    __all__ += _module.__all__
del _family, _module, _name
