"""Kernel backends for compiled operators, and the one table that orders them per device.

* ``fused``: each operator contracted together with its projections in one multi-operand
  einsum (bidirectional calls over the full token square; folds projections when compiled with
  the model's dimensions);
* ``einsum``: the reference -- masks, activation and an opt_einsum contraction over the
  materialised kernel and premise, for every call;
* ``sdpa`` / ``xformers``: attention kernels for operators with attention shape.
"""

from folnet.ops.backends.attention import AttentionLayout, SdpaBackend, XformersBackend
from folnet.ops.backends.attention import attention_layout as attention_layout
from folnet.ops.backends.base import LAYOUTS, Backend, Call, Operand
from folnet.ops.backends.einsum import EinsumBackend
from folnet.ops.backends.fused import FusedBackend

BACKENDS: dict[str, Backend] = {
    b.name: b for b in (FusedBackend(), EinsumBackend(), SdpaBackend(), XformersBackend())
}

#: The order ``backend="auto"`` tries per device type; the first that supports a call runs it
#: (einsum supports every call). On CUDA xformers first for the operators it fits, then
#: einsum: SDPA takes its math path there (its fused kernels refuse the operators' permuted
#: bias, docs/gpu/), which adds a product of zero queries and keys to einsum's softmax and
#: product -- 76 of a tiny step's launches. The fused path has not been measured on a GPU:
#: name it, e.g. backend="xformers,fused", to try it.
#: On CPU the fused contraction first: benchmarks/ops.py measured SDPA's math path (taken
#: whenever the bias needs a gradient) slower than einsum for j and t, and a jmc.atp training
#: step with SDPA for j, m, c, t took 2.05 s against the fused path's 1.40 s.
PRIORITY: dict[str, tuple[str, ...]] = {
    "cuda": ("xformers", "einsum", "sdpa"),
    "cpu": ("fused", "einsum", "sdpa"),
}
DEFAULT_PRIORITY = ("fused", "einsum")

__all__ = ["BACKENDS", "DEFAULT_PRIORITY", "LAYOUTS", "PRIORITY", "AttentionLayout", "Backend",
           "Call", "Operand", "attention_layout"]
