"""Dynamic masked-language-model masking (BERT's 80/10/10 rule), vectorised in torch.

Why masking lives in the collator and not in the dataset: a mask drawn once and stored would
show the model the same corrupted positions every epoch (BERT's "static" masking); drawing it
per batch from a generator owned by the collator gives a fresh mask each time an example is
seen, while the generator state (saved in a checkpoint) makes a resumed run draw exactly the
masks an uninterrupted run would have drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from folnet.errors import FolnetError

__all__ = ["IGNORE_INDEX", "PretrainingCollator", "SpecialIds", "mask_tokens", "most_targets"]

IGNORE_INDEX = -100  # label value that torch.nn.functional.cross_entropy skips by default


class _HasSpecialIds(Protocol):
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int


@dataclass(frozen=True)
class SpecialIds:
    """The five special-token ids masking needs (a picklable stand-in for the tokenizer)."""

    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer: _HasSpecialIds) -> SpecialIds:
        return cls(
            pad_id=int(tokenizer.pad_id),
            unk_id=int(tokenizer.unk_id),
            cls_id=int(tokenizer.cls_id),
            sep_id=int(tokenizer.sep_id),
            mask_id=int(tokenizer.mask_id),
        )

    @property
    def all(self) -> frozenset[int]:
        return frozenset((self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id))


def _as_special_ids(specials: SpecialIds | _HasSpecialIds) -> SpecialIds:
    if isinstance(specials, SpecialIds):
        return specials
    try:
        return SpecialIds.from_tokenizer(specials)
    except AttributeError as exc:
        raise FolnetError(
            f"expected a SpecialIds or a tokenizer with pad_id/unk_id/cls_id/sep_id/mask_id, "
            f"got {type(specials).__name__}"
        ) from exc


def _check_probability(name: str, value: float, *, closed: bool = False) -> None:
    ok = 0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
        interval = "[0, 1]" if closed else "(0, 1)"
        raise FolnetError(f"{name} must lie in {interval}, got {value!r}")


def _check_masking(input_ids: torch.Tensor, special_ids: SpecialIds | _HasSpecialIds,
                   mlm_probability: float, max_predictions: int, vocab_size: int,
                   mask_replace_prob: float, random_replace_prob: float) -> SpecialIds:
    """`mask_tokens`' arguments checked, each fault named; returns the special ids."""
    if input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise FolnetError(
            f"input_ids must be a 2-D LongTensor [B, T], got {input_ids.dtype} of shape "
            f"{tuple(input_ids.shape)}"
        )
    _check_probability("mlm_probability", mlm_probability)
    _check_probability("mask_replace_prob", mask_replace_prob, closed=True)
    _check_probability("random_replace_prob", random_replace_prob, closed=True)
    if mask_replace_prob + random_replace_prob > 1.0:
        raise FolnetError(
            f"mask_replace_prob + random_replace_prob must be <= 1, got "
            f"{mask_replace_prob} + {random_replace_prob}"
        )
    if isinstance(max_predictions, bool) or not isinstance(max_predictions, int):
        raise FolnetError(f"max_predictions must be an integer, got {max_predictions!r}")
    if max_predictions < 1:
        raise FolnetError(f"max_predictions must be >= 1, got {max_predictions}")
    specials = _as_special_ids(special_ids)
    special_list = sorted(specials.all)
    if vocab_size <= max(special_list) or vocab_size <= len(special_list):
        raise FolnetError(f"vocab_size {vocab_size} is too small for the special ids")

    return specials


def most_targets(seq_len: int, mlm_probability: float, max_predictions: int) -> int:
    """The most MLM targets `mask_tokens` picks in a row of ``seq_len`` tokens: k is the
    eligible count times the probability, rounded stochastically (at most its floor + 1),
    capped at ``max_predictions`` -- the slots a static gather needs per sequence
    (`folnet.arch.heads.gather_masked`), no more: each slot costs a row of the vocabulary
    projection."""
    return max(1, min(max_predictions, math.floor(seq_len * mlm_probability) + 1))


def mask_tokens(
    input_ids: torch.Tensor,
    special_ids: SpecialIds | _HasSpecialIds,
    *,
    mlm_probability: float = 0.15,
    max_predictions: int = 20,
    generator: torch.Generator,
    vocab_size: int,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose MLM targets per row and corrupt them; return `(masked_input_ids, mlm_labels)`.

    Per row with n eligible tokens (not special, not padding), k = n * mlm_probability
    rounded stochastically (so short rows are not biased by rounding), at least 1 when n > 0,
    at most `max_predictions` and n; k distinct eligible positions are chosen uniformly. Of
    the chosen, `mask_replace_prob` become [MASK], `random_replace_prob` a random
    non-special token, the rest stay. Labels hold the original id at chosen positions and
    -100 elsewhere. Randomness comes only from `generator`, so equal generator states give
    equal masks. The input is not modified.
    """
    specials = _check_masking(input_ids, special_ids, mlm_probability, max_predictions,
                              vocab_size, mask_replace_prob, random_replace_prob)
    special_list = sorted(specials.all)

    device = input_ids.device
    gen_device = generator.device
    batch, length = input_ids.shape
    ids = input_ids.to(gen_device)  # [B, T]
    special_tensor = torch.tensor(special_list, dtype=torch.long, device=gen_device)
    eligible = ~torch.isin(ids, special_tensor)  # [B, T] bool

    # How many to predict per row: stochastic rounding keeps E[k] = n * p exactly.
    n_eligible = eligible.sum(dim=1)  # [B]
    jitter = torch.rand(batch, generator=generator, device=gen_device)  # [B]
    k = torch.floor(n_eligible.to(torch.float64) * mlm_probability + jitter).long()  # [B]
    k = k.clamp(min=1, max=max_predictions)
    k = torch.minimum(k, n_eligible)  # rows with no eligible token predict nothing

    # Which positions: rank random scores; ineligible positions score 2 and sort last.
    scores = torch.rand(batch, length, generator=generator, device=gen_device)  # [B, T]
    scores = scores.masked_fill(~eligible, 2.0)
    order = scores.argsort(dim=1)  # [B, T] positions by ascending score
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(length, device=gen_device).expand(batch, length))
    chosen = (ranks < k.unsqueeze(1)) & eligible  # [B, T] bool

    # What to do with them: one uniform draw decides [MASK] / random / keep.
    action = torch.rand(batch, length, generator=generator, device=gen_device)  # [B, T]
    to_mask = chosen & (action < mask_replace_prob)
    to_random = chosen & (action >= mask_replace_prob)
    to_random &= action < mask_replace_prob + random_replace_prob

    # Random replacements are drawn from the non-special ids only.
    is_special = torch.zeros(vocab_size, dtype=torch.bool, device=gen_device)
    is_special[special_tensor] = True
    ordinary = torch.nonzero(~is_special).squeeze(1)  # [V - n_special]
    pick = torch.randint(
        len(ordinary), (batch, length), generator=generator, device=gen_device
    )  # [B, T]
    random_tokens = ordinary[pick]  # [B, T]

    masked = ids.clone()
    masked[to_mask] = specials.mask_id
    masked[to_random] = random_tokens[to_random]
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))  # [B, T]
    return masked.to(device), labels.to(device)


class PretrainingCollator:
    """Stack dataset items into a batch and apply fresh MLM masks from its own generator.

    `collate` only stacks (no randomness) and `apply_mask` only masks, so a DataLoader with
    worker processes can run `collate_fn=collator.collate` in the workers and call
    `collator.apply_mask(batch)` in the main process: worker copies of the generator would
    otherwise draw correlated masks and their state would never reach a checkpoint.
    Calling the collator does both (right for `num_workers=0`).
    """

    KEYS = ("input_ids", "token_type_ids", "attention_mask", "nsp_labels")

    def __init__(
        self,
        special_ids: SpecialIds | _HasSpecialIds,
        *,
        vocab_size: int | None = None,
        mlm_probability: float = 0.15,
        max_predictions: int = 20,
        seed: int = 0,
    ) -> None:
        self.special_ids = _as_special_ids(special_ids)
        if vocab_size is None:
            vocab_size = getattr(special_ids, "vocab_size", None)
        if vocab_size is None:
            raise FolnetError("vocab_size is required when special_ids is not a tokenizer")
        _check_probability("mlm_probability", mlm_probability)
        if isinstance(max_predictions, bool) or not isinstance(max_predictions, int):
            raise FolnetError(f"max_predictions must be an integer, got {max_predictions!r}")
        if max_predictions < 1:
            raise FolnetError(f"max_predictions must be >= 1, got {max_predictions}")
        self.vocab_size = int(vocab_size)
        self.mlm_probability = float(mlm_probability)
        self.max_predictions = max_predictions
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def from_config(cls, tokenizer: Any, config: Any) -> PretrainingCollator:
        """Build from a tokenizer and a `PretrainDataConfig` (mlm_probability, max_predictions,
        seed)."""
        return cls(
            tokenizer,
            vocab_size=tokenizer.vocab_size,
            mlm_probability=config.mlm_probability,
            max_predictions=config.max_predictions,
            seed=config.seed,
        )

    def collate(self, items: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Stack items: `[T]` tensors become `[B, T]`, scalar `nsp_labels` become `[B]`."""
        if not items:
            raise FolnetError("cannot collate an empty list of examples")
        missing = [key for key in self.KEYS if key not in items[0]]
        if missing:
            raise FolnetError(f"dataset items lack the key(s) {missing}")
        return {key: torch.stack([item[key] for item in items]) for key in self.KEYS}

    def apply_mask(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return a copy of `batch` with masked `input_ids` and added `mlm_labels` [B, T]."""
        masked, labels = mask_tokens(
            batch["input_ids"],
            self.special_ids,
            mlm_probability=self.mlm_probability,
            max_predictions=self.max_predictions,
            generator=self.generator,
            vocab_size=self.vocab_size,
        )
        out = dict(batch)
        out["input_ids"] = masked
        out["mlm_labels"] = labels
        return out

    def __call__(self, items: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return self.apply_mask(self.collate(items))

    def state_dict(self) -> dict[str, Any]:
        """Generator state plus the settings it was drawn under (checked on load)."""
        return {
            "generator_state": self.generator.get_state(),
            "seed": self.seed,
            "mlm_probability": self.mlm_probability,
            "max_predictions": self.max_predictions,
            "vocab_size": self.vocab_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the exact mask sequence of the run that saved `state`."""
        if "generator_state" not in state:
            raise FolnetError("collator state lacks 'generator_state'")
        for key in ("mlm_probability", "max_predictions", "vocab_size"):
            if key in state and state[key] != getattr(self, key):
                raise FolnetError(
                    f"collator state was saved with {key}={state[key]!r} but this collator "
                    f"has {key}={getattr(self, key)!r}; masks would not continue the same way"
                )
        self.generator.set_state(state["generator_state"])
        self.seed = int(state.get("seed", self.seed))
