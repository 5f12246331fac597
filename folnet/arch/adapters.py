"""The weights a layer contracts, adapters included.

A layer does not call its fused projections as modules: the fused backend folds a binary
projection's weight rows into its einsum, the segmented projection reads only some rows, the
binary FFN runs its own autograd function, and a recomputed block of rows must not run module
hooks. A PEFT adapter that wraps one of these modules (``proj_u``, ``proj_b``, ``out_b``,
``ffn_b.inp`` ...) would then be skipped silently. So every such read goes through `weight`
and `bias` here: the wrapped module's own tensors, plus the low-rank update of every active,
unmerged LoRA adapter (``scaling * B @ A``, differentiable in A and B). The same weight reaches
every backend and the row-blocked path, and merging (``merge_and_unload``) gives the same
function.

A module torch's dynamic quantization swapped in (``torch.ao.nn.quantized.dynamic.Linear``,
whose ``weight`` is a method returning int8 values and their scale, its bias one returning
floats), or folnet's own quantized fused projections (`folnet.arch.quantize`), is read as its
dequantized weight: the int8 values times their scale, contracted in float32. The binary
stream's products are tall and thin, where torch's dynamic int8 GEMM is slower than oneDNN's
float32 on the CPU tried, and running the unary projection's in int8 gains nothing beyond the
noise (docs/results/measurements.md). A fused projection that a torch quantization pass left
float is refused (`folnet.arch.layer.slots`).

An adapter's dropout acts on a module's input, which these contractions never form on its
own, and LoRA variants (DoRA, ...) are not a weight update: both are refused, naming the
module, rather than ignored. Modules the layer does call (``out_u``, the unary FFN, the
encoder-decoder's ``cross_u``/``cross_b``, the heads) take any adapter PEFT offers.
"""

from __future__ import annotations

import torch
from torch import nn

from folnet.errors import FolnetError

__all__ = ["bias", "quantized", "unwrap", "weight"]


def unwrap(module: nn.Module) -> nn.Module:
    """The module an adapter wraps (itself when there is none)."""
    while isinstance(getattr(module, "base_layer", None), nn.Module):
        module = module.base_layer
    return module


def quantized(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's quantized Linears (dynamic or static), which hold
    their weight packed and return it from a method. Duck-typed: importing torch.ao's
    quantized modules for the check would cost every ``import folnet`` their import."""
    return hasattr(module, "_packed_params") and callable(getattr(module, "weight", None))


def _checked(own: nn.Module) -> nn.Module:
    """``own``, unless a torch quantization pass left it float where it must not be."""
    check = getattr(own, "check_quantization", None)
    if check is not None:
        check()
    return own


def _lora_delta(module: nn.Module) -> torch.Tensor | None:
    """The summed update of ``module``'s active, unmerged LoRA adapters, or None."""
    if module is unwrap(module):
        return None
    if not (hasattr(module, "lora_A") and hasattr(module, "get_delta_weight")):
        raise FolnetError(f"{type(module).__name__} wraps a fused folnet projection, whose "
                          f"weights the layer contracts directly: only LoRA adapters reach "
                          f"them")
    if module.disable_adapters:
        if module.merged:  # as PEFT's own forward does
            module.unmerge()
        return None
    if module.merged:
        return None
    total = None
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(
                name):
            raise FolnetError(f"adapter {name!r}: LoRA variants (DoRA, ...) are not supported "
                              f"on folnet's fused projections; use plain LoRA there")
        if not isinstance(module.lora_dropout[name], nn.Identity):
            raise FolnetError(f"adapter {name!r}: lora_dropout must be 0 on folnet's fused "
                              f"projections (proj_u, proj_b, out_b, ffn_b.*): the layer "
                              f"contracts their weights directly and never forms the input "
                              f"a dropout would act on")
        if getattr(module, "lora_bias", {}).get(name):
            raise FolnetError(f"adapter {name!r}: lora_bias is not supported on folnet's fused "
                              f"projections")
        delta = module.get_delta_weight(name)
        total = delta if total is None else total + delta
    return total


def weight(module: nn.Module) -> torch.Tensor:
    """The weight ``module`` applies: its own, plus its LoRA adapters' update."""
    own = _checked(unwrap(module))
    w = own.weight().dequantize() if quantized(own) else own.weight  # (out, in)
    delta = _lora_delta(module)
    return w if delta is None else w + delta.to(w.dtype)


def bias(module: nn.Module) -> torch.Tensor | None:
    """The bias ``module`` adds over its whole output (a fused projection's segments without
    one read as zeros, a fused output's per-operator rows summed)."""
    own = _checked(unwrap(module))
    if quantized(own):
        return own.bias()
    return own.full_bias() if hasattr(own, "full_bias") else own.bias
