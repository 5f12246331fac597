"""Token-by-token decoding shared by the decoder-only and encoder-decoder FOLNets.

A model prepares a *session*: the logits of the first new token and a ``step(tokens)`` that
appends one token per row and returns the next logits -- with the incremental cache
(`folnet.arch.models.cache`) or by recomputing the whole sequence. `decode` runs greedy or sampled
decoding on it. Every argument is checked before any computation; faults are `FolnetError`s
naming the argument and the limit.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

from folnet.arch.outputs import ModelOutput
from folnet.errors import FolnetError

Step = Callable[[torch.Tensor], torch.Tensor]  # (B,) new tokens -> (B, V) next logits


@dataclass(eq=False)
class GenerationOutput(ModelOutput):
    """What ``generate(..., return_logits=True)`` returns."""

    sequences: torch.Tensor | None = None  # (B, T0 + new): the prompt and the new tokens
    logits: torch.Tensor | None = None  # (B, new, V): the logits each new token came from


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_generation_args(*, max_new_tokens: object, used: int, limit: int, what: str,
                          do_sample: object, temperature: object, top_k: object,
                          vocab_size: int, eos_token_id: object, pad_token_id: object) -> None:
    """Validate decoding arguments. ``used`` positions are taken before the first new token
    (the prompt, or the decoder start token) out of ``limit`` (the config's max_positions)."""
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise FolnetError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if used + max_new_tokens > limit:
        raise FolnetError(
            f"max_new_tokens = {max_new_tokens} with {used} {what} makes {used + max_new_tokens} "
            f"positions, beyond the position limit max_positions = {limit}; ask for at most "
            f"{max(limit - used, 0)} new tokens or build the model with a larger max_positions")
    if not isinstance(do_sample, bool):
        raise FolnetError(f"do_sample must be True or False, got {do_sample!r}")
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
            or not math.isfinite(temperature) or temperature <= 0):
        raise FolnetError(f"temperature must be a finite number > 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise FolnetError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and (not _is_int(value) or not 0 <= value < vocab_size):
            raise FolnetError(f"{name} must be None or an id in [0, vocab_size = {vocab_size}), "
                              f"got {value!r}")


#: What ``generate(cache=...)`` takes: a cache that grows as needed, or one sized for the
#: whole generation whose step has fixed shapes (`folnet.arch.models.text.TextModel
#: .step_static`: compiled and captured once with ``compile``).
CACHES = ("dynamic", "static")
#: torch.compile modes ``generate(compile=...)`` takes besides True and False.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def check_cache_args(*, cache: object, compile: object, use_cache: object) -> None:
    """Validate ``generate``'s cache choice and compile request."""
    if cache not in CACHES:
        raise FolnetError(f"cache must be one of {CACHES}, got {cache!r}")
    if not isinstance(compile, bool) and compile not in COMPILE_MODES:
        raise FolnetError(f"compile must be True, False or a torch.compile mode "
                          f"{COMPILE_MODES}, got {compile!r}")
    if compile is not False and cache != "static":
        raise FolnetError(f"compile={compile!r} compiles the static cache's decoding step, "
                          f"whose shapes never change; pass cache='static' too")
    if cache == "static" and use_cache is False:
        raise FolnetError("cache='static' is a generation cache: it needs use_cache=True")


def next_tokens(logits: torch.Tensor, *, do_sample: bool, temperature: float,
                top_k: int | None, generator: torch.Generator | None) -> torch.Tensor:
    """(B, V) logits -> (B,) ids: argmax, or a sample from softmax(logits / temperature)
    restricted to the ``top_k`` most likely ids."""
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float() / temperature  # (B, V)
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def decode(first: torch.Tensor, step: Step, max_new_tokens: int, *, do_sample: bool,
           temperature: float, top_k: int | None, generator: torch.Generator | None,
           eos_token_id: int | None, pad_token_id: int | None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run decoding from the first logits (B, V): returns new ids (B, new) and their logits
    (B, new, V). A row that has produced ``eos_token_id`` continues with ``pad_token_id``
    (default: eos); decoding stops early once every row has."""
    fill = eos_token_id if pad_token_id is None else pad_token_id
    done = torch.zeros(first.shape[0], dtype=torch.bool, device=first.device)
    logits, tokens, scores = first, [], []
    for i in range(max_new_tokens):
        scores.append(logits)
        new = next_tokens(logits, do_sample=do_sample, temperature=temperature, top_k=top_k,
                          generator=generator)  # (B,)
        if eos_token_id is not None:
            new = torch.where(done, torch.full_like(new, fill), new)
            done = done | (new == eos_token_id)
        tokens.append(new)
        # (the early stop reads a value on the host: only when there is an eos to stop at)
        if i + 1 == max_new_tokens or (eos_token_id is not None and bool(done.all())):
            break
        logits = step(new)
    return torch.stack(tokens, dim=1), torch.stack(scores, dim=1)
