"""fusex for JAX: fused recurrences (Mamba's selective scan, linear scans,
MinGRU, MinLSTM, Liquid) as XLA custom calls, with their own backward
kernels, under ``jax.jit`` and ``jax.grad``.

Importing the package loads ``priv/fusex_xla.so`` (or ``FUSEX_XLA_LIB``) and
registers its targets for the ``cpu`` and ``CUDA`` platforms. The CPU
handlers run fusex's CPU backend (f64 accumulation); the CUDA ones launch
fusex's kernels on XLA's stream, with scratch from XLA's allocator.
Semantics are those of the Erlang API (docs/SSM.md, docs/LINREC.md);
the targets themselves are documented in docs/XLA.md.
"""

from ._lib import TARGETS, library_path
from ._ops import (cuda_unavailable_reason, linear_scan, linear_scan_step, liquid, liquid_step, mingru,
                   mingru_step, minlstm, minlstm_step, selective_scan, selective_scan_saved_shape,
                   selective_scan_step)

__all__ = [
    "TARGETS", "library_path", "cuda_unavailable_reason", "selective_scan", "selective_scan_step",
    "selective_scan_saved_shape", "linear_scan", "linear_scan_step", "mingru", "mingru_step", "minlstm",
    "minlstm_step", "liquid", "liquid_step",
]
