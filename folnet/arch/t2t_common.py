"""What the text-to-text FOLNets share: input checks, base atoms, masks, the output type and
the model base class (config, LM head, init, checkpoints, cached-row stepping).

Checks run before any computation and raise `FolnetError` (a `ValueError`) naming the argument
and the limit it breaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch import generation
from folnet.arch.config import ModelConfig
from folnet.arch.embeddings import relative_position_ids
from folnet.arch.kvcache import GenerationCache
from folnet.arch.plan import ArchPlan, parse_plan
from folnet.errors import FolnetError, choices
from folnet.ops import masks


def check_ids(cfg: ModelConfig, ids: object, name: str = "input_ids") -> torch.Tensor:
    """Token ids (B, T), T >= 1, every id in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor):
        raise FolnetError(f"{name} must be a tensor of token ids, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise FolnetError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise FolnetError(f"{name} must have shape (batch, tokens), got {tuple(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise FolnetError(f"{name} is empty (shape {tuple(ids.shape)}); give at least one "
                          f"sequence of at least one token")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= cfg.vocab_size:
        bad = lo if lo < 0 else hi
        raise FolnetError(f"{name} contain id {bad}, outside the vocabulary: ids must be in "
                          f"[0, vocab_size = {cfg.vocab_size})")
    if cfg.position == "ape" and ids.shape[1] > cfg.max_positions:
        raise FolnetError(f"{name} have {ids.shape[1]} tokens, beyond the absolute-position "
                          f"table's max_positions = {cfg.max_positions}")
    return ids


def check_mask(mask: object, ids: torch.Tensor, name: str,
               ids_name: str = "input_ids") -> torch.Tensor | None:
    """A (B, T) padding mask (1 = real token) as bools, or None when it masks nothing."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
        raise FolnetError(f"{name} must be a tensor shaped like {ids_name} "
                          f"{tuple(ids.shape)}, got {tuple(getattr(mask, 'shape', ()))}")
    keep = mask.to(torch.bool)
    if bool(keep.all()):
        return None
    if not bool(keep.any(dim=1).all()):
        raise FolnetError(f"{name} has a row with no real token; every sequence needs at "
                          f"least one position set to 1")
    return keep


def check_prefix(prefix_lengths: object, batch: int, tokens: int,
                 device: torch.device) -> torch.Tensor | None:
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
    for i, p in enumerate(prefix_lengths.tolist()):
        if p < 0:
            raise FolnetError(f"prefix_lengths[{i}] = {p} is negative")
        if p > tokens:
            raise FolnetError(f"prefix_lengths[{i}] = {p} is longer than the sequence "
                              f"({tokens} tokens)")
    return prefix_lengths.to(device=device, dtype=torch.long)


def check_labels(labels: object, shape: tuple[int, ...], name: str = "labels") -> torch.Tensor:
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point():
        raise FolnetError(f"{name} must be an integer tensor, got "
                          f"{getattr(labels, 'dtype', type(labels).__name__)}")
    if tuple(labels.shape) != shape:
        raise FolnetError(f"{name} must have shape {shape}, got {tuple(labels.shape)}")
    return labels


def visibility(n: int, device: torch.device, prefix: torch.Tensor | None = None,
               source: int = 0) -> torch.Tensor:
    """keep[row, col] of a decoder domain of n positions, (B|1, n, n): causal; plus a
    bidirectional block over each row's prefix (PrefixLM, ``prefix`` (B,)) or over the first
    ``source`` positions (the encoder-decoder's input tokens)."""
    if prefix is None and source == 0:
        return masks.tril(n, device).unsqueeze(0)
    if prefix is None:
        prefix = torch.tensor([source], device=device)
    return masks.prefix_visibility(prefix, n)


def domain_rel_ids(cfg: ModelConfig, n: int, device: torch.device,
                   source: int = 0) -> torch.Tensor | None:
    """Clipped relative-distance ids (1, n, n) of a decoder domain; the encoder-decoder's input
    positions (the first ``source``) form segment 0 and the targets segment 1, so every
    input->output relation starts from the 'different segment' id."""
    if cfg.position != "rpe":
        return None
    types = torch.zeros(1, n, dtype=torch.long, device=device)
    if source:
        types[:, source:] = 1
    return relative_position_ids(types, cfg.delta)


class DecoderAtoms(nn.Module):
    """Base atoms of decoder rows: word (+ absolute position) embedding into u1, relative-
    distance embedding into u2, LayerNorm without affine parameters and dropout, as the
    encoder's `BaseAtoms`; u2 is zeroed outside the visibility (lower-triangular atoms).

    ``shared_word`` (the encoder's word embedding) is referenced, not registered, so the state
    dict holds it once."""

    def __init__(self, cfg: ModelConfig, shared_word: nn.Embedding | None = None):
        super().__init__()
        self.cfg = cfg
        if shared_word is None:
            self.word = nn.Embedding(cfg.padded_vocab, cfg.D1)
        else:
            object.__setattr__(self, "_shared_word", shared_word)
        self.absolute = nn.Embedding(cfg.max_positions, cfg.D1) if cfg.position == "ape" else None
        self.relative = (nn.Embedding(2 * cfg.delta + 2, cfg.D2) if cfg.position == "rpe"
                         else None)
        self.dropout = nn.Dropout(cfg.dropout)

    @property
    def embedding(self) -> nn.Embedding:
        return self._modules["word"] if "word" in self._modules else self._shared_word

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, rel_ids: torch.Tensor | None,
                keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, Q) at decoder positions ``positions`` (Q,); rel_ids and keep (B|1, Q, n)."""
        cfg = self.cfg
        u1 = self.embedding(ids)  # (B, Q, D1)
        if self.absolute is not None:
            u1 = u1 + self.absolute(positions)
        u1 = self.dropout(F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps))
        B, Q, n = ids.shape[0], ids.shape[1], keep.shape[-1]
        if self.relative is not None:
            u2 = self.relative(rel_ids).expand(B, Q, n, cfg.D2)  # (B, Q, n, D2)
            u2 = self.dropout(F.layer_norm(u2, (cfg.D2,), eps=cfg.layer_norm_eps))
        else:
            u2 = u1.new_zeros(B, Q, n, cfg.D2)
        return u1, u2 * keep.unsqueeze(-1)


HEADS = ("lm",)


@dataclass
class TextOutput:
    """A text-to-text forward pass; for the encoder-decoder the sequence/relation outputs are the
    decoder's (M rows; relations over inputs then targets)."""

    logits: torch.Tensor  # (B, T, V) next-token logits
    sequence_output: torch.Tensor  # (B, T, D1) final unary atoms
    relation_output: torch.Tensor  # (B, T, n, D2) final binary atoms (n = T for decoder-only)
    loss: torch.Tensor | None = None
    encoder_sequence_output: torch.Tensor | None = None  # (B, N, D1)
    encoder_relation_output: torch.Tensor | None = None  # (B, N, N, D2)


def check_config(cfg: ModelConfig, kind: str, head: str | None) -> None:
    if cfg.kind != kind:
        raise FolnetError(f"config kind {cfg.kind!r} does not match {kind!r}")
    if cfg.position == "rpe*":
        raise FolnetError("position 'rpe*' is not supported by decoders; use 'rpe', 'ape' or "
                          "'none'")
    if head not in (None, *HEADS):
        raise FolnetError(f"head {head!r} is unknown for kind {kind!r}; use None or "
                          f"{choices(HEADS)} (both give the tied LM head)")


class TextModel(nn.Module):
    """What both kinds share: config, plan, LM head, init, checkpointing, final norms."""

    cfg: ModelConfig
    plan: ArchPlan

    def _setup(self, cfg: ModelConfig, kind: str, head: str | None) -> None:
        check_config(cfg, kind, head)
        self.cfg = cfg
        self.head = "lm"
        self.num_labels = cfg.vocab_size
        self.plan = parse_plan(cfg.ops, cfg.L)

    def reset_parameters(self) -> None:
        """BERT-style init: N(0, initializer_range) weights and embeddings, zero biases."""
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            else:
                nn.init.normal_(param, mean=0.0, std=self.cfg.initializer_range)

    def save_pretrained(self, directory, extra: dict[str, Any] | None = None):
        """Write ``config.json`` + ``model.safetensors`` (see `folnet.arch.checkpoint`)."""
        from folnet.arch.checkpoint import save_pretrained

        return save_pretrained(self, directory, extra)

    def _final(self, u1, u2):
        eps = self.cfg.layer_norm_eps
        return (F.layer_norm(u1, (self.cfg.D1,), eps=eps),
                F.layer_norm(u2, (self.cfg.D2,), eps=eps))  # LN(0) = 0: u2 stays masked

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm(hidden)[..., : self.cfg.vocab_size]  # (..., V)

    def _generation_args(self, used: int, what: str, **kw) -> None:
        generation.check_generation_args(used=used, limit=self.cfg.max_positions, what=what,
                                         vocab_size=self.cfg.vocab_size, **kw)

    def _step_rows(self, cache: GenerationCache, tokens: torch.Tensor, start: int,
                   offset: int) -> torch.Tensor:
        """Run new decoder rows (B, Q) at domain positions ``start..`` (decoder positions
        ``start - offset..``) through every layer, storing their context channels in the cache;
        returns their final unary atoms (B, Q, D1)."""
        atoms, layers = self._decoder()
        n = start + tokens.shape[1]
        rows = torch.arange(start, n, device=tokens.device)
        vis, pad = cache.masks(n)
        rel = None if cache.rel_ids is None else cache.rel_ids[:, start:n, :n]
        u1, u2 = atoms(tokens, rows - offset, rel, vis.index_select(1, rows))  # (B, Q[, n], D)
        for i, layer in enumerate(layers):
            u1, u2 = layer.forward_rows(u1, u2, cache.assembler(i, start), rows, vis, pad)
        cache.length = n
        return self._final(u1, u2)[0]

    @staticmethod
    def _finish(prompt, first, step, max_new_tokens, return_logits, **kw):
        new, logits = generation.decode(first, step, max_new_tokens, **kw)
        sequences = torch.cat([prompt, new], dim=1)
        return generation.GenerationOutput(sequences, logits) if return_logits else sequences
