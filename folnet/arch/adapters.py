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

An adapter's dropout acts on a module's input, which these contractions never form on its
own, and LoRA variants (DoRA, ...) are not a weight update: both are refused, naming the
module, rather than ignored. Modules the layer does call (``out_u``, the unary FFN, the
encoder-decoder's ``cross_u``/``cross_b``, the heads) take any adapter PEFT offers.
"""

from __future__ import annotations

import torch
from torch import nn

from folnet.errors import FolnetError

__all__ = ["bias", "unwrap", "weight"]


def unwrap(module: nn.Module) -> nn.Module:
    """The module an adapter wraps (itself when there is none)."""
    while isinstance(getattr(module, "base_layer", None), nn.Module):
        module = module.base_layer
    return module


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
    own = unwrap(module).weight
    delta = _lora_delta(module)
    return own if delta is None else own + delta.to(own.dtype)


def bias(module: nn.Module) -> torch.Tensor | None:
    """The bias ``module`` adds over its whole output (a fused projection's segments without
    one read as zeros, a fused output's per-operator rows summed)."""
    own = unwrap(module)
    return own.full_bias() if hasattr(own, "full_bias") else own.bias
