"""Hand-written primitives for the binary stream's hot path (dropout, the tall-and-thin
products, the binary FFN, LayerNorm; on CUDA the residual add with LayerNorm), each with a
plain-torch fallback on other devices and under torch.compile; their autograd Functions
compose with torch.func (`folnet.ops.primitives.functorch`)."""

from folnet.ops.primitives.dropout import dropout, dropout_add, keep_mask
from folnet.ops.primitives.ffn import binary_ffn
from folnet.ops.primitives.linear import linear, segmented_linear, wgrad
from folnet.ops.primitives.norm import layer_norm

__all__ = ["binary_ffn", "dropout", "dropout_add", "keep_mask", "layer_norm", "linear",
           "segmented_linear", "wgrad"]
