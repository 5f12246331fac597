"""Input checks shared by every kind of model, run before any computation.

Every fault is a `FolnetError` (a `ValueError`) naming the argument, the value and the limit it
breaks. Types and shapes are always checked. *Values* (ids in range, a real token in every mask
row, prefix lengths) are checked when the inputs are on the CPU, where it costs nothing; on an
accelerator each such check would make the host wait for the device, so they are skipped unless
asked for (``model.validate = True``), and they are never run while torch.compile or
torch.export traces (`values_checked`). Nothing here makes the computation depend on values: a
given attention mask is always applied, even when it masks nothing.
"""

from __future__ import annotations

import torch

from folnet.arch.config import ModelConfig
from folnet.errors import FolnetError
from folnet.ops.primitives.device import kernel_device
from folnet.ops.primitives.functorch import vmap_active
from folnet.tracing import traced


def values_checked(tensor: torch.Tensor, validate: bool | None = None) -> bool:
    """Whether this call checks input values: ``validate`` when given, else on the CPU only;
    never while torch.compile or torch.export traces, nor under torch.func.vmap (the checks
    read values, which a batched tensor does not hand out)."""
    if traced() or vmap_active():
        return False
    return validate if validate is not None else kernel_device(tensor.device) == "cpu"


def check_ids(cfg: ModelConfig, ids: object, name: str = "input_ids", *,
              values: bool = True) -> torch.Tensor:
    """Token ids (B, T), B, T >= 1, every id in [0, vocab_size) (with ``values``), T within
    an absolute-position table."""
    if not isinstance(ids, torch.Tensor):
        raise FolnetError(f"{name} must be a tensor of token ids, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise FolnetError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise FolnetError(f"{name} must have shape (batch, tokens), got {tuple(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise FolnetError(f"{name} is empty (shape {tuple(ids.shape)}); give at least one "
                          f"sequence of at least one token")
    if values:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= cfg.vocab_size:
            bad = lo if lo < 0 else hi
            raise FolnetError(f"{name} contain id {bad}, outside the vocabulary: ids must be in "
                              f"[0, vocab_size = {cfg.vocab_size})")
    if cfg.absolute_positions and ids.shape[1] > cfg.max_positions:
        raise FolnetError(f"{name} have {ids.shape[1]} tokens but the absolute-position table "
                          f"has max_positions = {cfg.max_positions} rows (use position='rpe' "
                          f"for any length)")
    return ids


def check_token_types(cfg: ModelConfig, types: object, ids: torch.Tensor, *,
                      values: bool = True) -> torch.Tensor:
    """Segment ids shaped like ``ids`` in [0, type_vocab_size); zeros when None."""
    if types is None:
        return torch.zeros_like(ids)
    if not isinstance(types, torch.Tensor) or tuple(types.shape) != tuple(ids.shape):
        raise FolnetError(f"token_type_ids must be a tensor shaped like input_ids "
                          f"{tuple(ids.shape)}, got {tuple(getattr(types, 'shape', ()))}")
    if types.is_floating_point() or types.dtype == torch.bool:
        raise FolnetError(f"token_type_ids must be integers, got {types.dtype}")
    if values:
        lo, hi = int(types.min()), int(types.max())
        if lo < 0 or hi >= cfg.type_vocab_size:
            raise FolnetError(f"token_type_ids contain {lo if lo < 0 else hi}, outside [0, "
                              f"type_vocab_size = {cfg.type_vocab_size})")
    return types


def check_mask(mask: object, ids: torch.Tensor, name: str = "attention_mask",
               ids_name: str = "input_ids", *, values: bool = True) -> torch.Tensor | None:
    """A (B, T) padding mask (1 = real token) as bools, or None when none is given. A mask of
    all ones gives the unmasked outputs (masked entries are the only ones it changes)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
        raise FolnetError(f"{name} must be a tensor shaped like {ids_name} "
                          f"{tuple(ids.shape)}, got {tuple(getattr(mask, 'shape', ()))}")
    keep = mask.to(torch.bool)
    if values and not bool(keep.any(dim=1).all()):
        raise FolnetError(f"{name} has a row with no real token; every sequence needs at "
                          f"least one position set to 1")
    return keep


def check_prefix(prefix_lengths: object, batch: int, tokens: int,
                 device: torch.device, *, values: bool = True) -> torch.Tensor | None:
    """PrefixLM prefix lengths: an int or (B,) integers in [0, T]; None for a causal LM."""
    if prefix_lengths is None:
        return None
    if isinstance(prefix_lengths, bool):
        raise FolnetError(f"prefix_lengths must be integers, got {prefix_lengths!r}")
    if isinstance(prefix_lengths, int):
        prefix_lengths = torch.full((batch,), prefix_lengths, dtype=torch.long)
    elif not isinstance(prefix_lengths, torch.Tensor):
        prefix_lengths = torch.as_tensor(prefix_lengths)
    if prefix_lengths.is_floating_point() or prefix_lengths.dtype == torch.bool:
        raise FolnetError(f"prefix_lengths must be integers, got dtype {prefix_lengths.dtype}")
    if tuple(prefix_lengths.shape) != (batch,):
        raise FolnetError(f"prefix_lengths must have one entry per row, shape ({batch},), got "
                          f"{tuple(prefix_lengths.shape)}")
    for i, p in enumerate(prefix_lengths.tolist() if values else ()):
        if p < 0:
            raise FolnetError(f"prefix_lengths[{i}] = {p} is negative")
        if p > tokens:
            raise FolnetError(f"prefix_lengths[{i}] = {p} is longer than the sequence "
                              f"({tokens} tokens)")
    return prefix_lengths.to(device=device, dtype=torch.long)


def check_labels(labels: object, shape: tuple[int, ...], name: str = "labels") -> torch.Tensor:
    """Integer labels of exactly ``shape``."""
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point():
        raise FolnetError(f"{name} must be an integer tensor, got "
                          f"{getattr(labels, 'dtype', type(labels).__name__)}")
    if tuple(labels.shape) != shape:
        raise FolnetError(f"{name} must have shape {shape}, got {tuple(labels.shape)}")
    return labels
