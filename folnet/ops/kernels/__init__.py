"""Fast CPU kernels for the binary stream's hot path (dropout, the tall-and-thin products, the
binary FFN, LayerNorm), each with a plain-torch fallback on other devices and under
torch.compile; their autograd Functions compose with torch.func
(`folnet.ops.kernels.functorch`)."""

from folnet.ops.kernels.dropout import dropout, dropout_add, keep_mask
from folnet.ops.kernels.ffn import binary_ffn
from folnet.ops.kernels.linear import linear, segmented_linear, wgrad
from folnet.ops.kernels.norm import layer_norm

__all__ = ["binary_ffn", "dropout", "dropout_add", "keep_mask", "layer_norm", "linear",
           "segmented_linear", "wgrad"]
