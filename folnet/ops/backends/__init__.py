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
from folnet.ops.backends.base import LAYOUTS, Backend, OpCall, Operand
from folnet.ops.backends.einsum import EinsumBackend
from folnet.ops.backends.fused import FusedBackend

BACKENDS: dict[str, Backend] = {
    b.name: b for b in (FusedBackend(), EinsumBackend(), SdpaBackend(), XformersBackend())
}

#: The order ``backend="auto"`` tries per device type; the first that supports a call runs it
#: (einsum supports every call). On CUDA xformers first for the operators it fits, then
#: einsum: SDPA takes its math path there (its fused kernels refuse the operators' permuted
#: bias, docs/gpu/), which adds a product of zero queries and keys to einsum's softmax and
#: product: launches einsum does not make. The fused path is not in the GPU's order, having
#: no GPU timing to support it: name it, e.g. backend="xformers,fused", to try it.
#: On CPU the fused contraction first: SDPA's math path (taken whenever the bias needs a
#: gradient) is slower than einsum for j and t, and slower than the fused path over a whole
#: training step (docs/results/measurements.md).
PRIORITY: dict[str, tuple[str, ...]] = {
    "cuda": ("xformers", "einsum", "sdpa"),
    "cpu": ("fused", "einsum", "sdpa"),
}
DEFAULT_PRIORITY = ("fused", "einsum")

__all__ = ["BACKENDS", "DEFAULT_PRIORITY", "LAYOUTS", "PRIORITY", "AttentionLayout", "Backend",
           "OpCall", "Operand", "attention_layout"]
