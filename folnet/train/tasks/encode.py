"""Turning `Example`s into fixed-length model inputs with a `tokenizers.Tokenizer`.

The layout is BERT's: ``[CLS] A [SEP] B [SEP]`` with token type 0 on ``[CLS] A [SEP]`` and 1
on ``B [SEP]`` (``[CLS] A [SEP]`` alone for single-sentence tasks), padded with ``[PAD]`` to
``max_len``; ``attention_mask`` is True on real tokens. Pairs that are too long lose tokens
from the end of the currently longer segment, one at a time (longest-first, B on ties), so a
short hypothesis is never cut to make room for a long premise. The special tokens are looked
up by name in the tokenizer's vocabulary and added here, never by the tokenizer's own
post-processor, so any tokenizer with the five BERT specials works the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from folnet.errors import FolnetError
from folnet.train.tasks.base import Example, TaskSpec
from folnet.train.tasks.registry import get_task

IGNORE_INDEX = -100


@dataclass(frozen=True)
class SpecialIds:
    """Vocabulary ids of the special tokens the encoders insert."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


def special_ids(tokenizer: Tokenizer) -> SpecialIds:
    """Look the five BERT special tokens up; a tokenizer lacking one cannot be used."""
    found = {}
    for field, token in (
        ("pad", "[PAD]"),
        ("unk", "[UNK]"),
        ("cls", "[CLS]"),
        ("sep", "[SEP]"),
        ("mask", "[MASK]"),
    ):
        idx = tokenizer.token_to_id(token)
        if idx is None:
            raise FolnetError(
                f"the tokenizer has no {token} token (needs [PAD] [UNK] [CLS] [SEP] [MASK])"
            )
        found[field] = idx
    return SpecialIds(**found)


def plain_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer itself, or a copy with truncation and padding switched off when the caller
    configured them: both would act before this module's own pair truncation and padding."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def truncate_longest_first(
    ids_a: list[int], ids_b: list[int], budget: int
) -> tuple[list[int], list[int]]:
    """Drop tokens from the end of the longer segment (B when equal) until
    ``len(a) + len(b) <= budget``."""
    a, b = list(ids_a), list(ids_b)
    excess = len(a) + len(b) - budget
    while excess > 0:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
        excess -= 1
    return a, b


def pack(
    ids_a: Sequence[int], ids_b: Sequence[int] | None, max_len: int, specials: SpecialIds
) -> tuple[list[int], list[int], list[bool]]:
    """(input_ids, token_type_ids, attention_mask) of one item, truncated and padded."""
    if ids_b is None:
        if max_len < 2:
            raise FolnetError(f"max_len {max_len} cannot hold [CLS] A [SEP]")
        a = list(ids_a)[: max_len - 2]
        ids = [specials.cls, *a, specials.sep]
        types = [0] * len(ids)
    else:
        if max_len < 3:
            raise FolnetError(f"max_len {max_len} cannot hold [CLS] A [SEP] B [SEP]")
        a, b = truncate_longest_first(list(ids_a), list(ids_b), max_len - 3)
        ids = [specials.cls, *a, specials.sep, *b, specials.sep]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    real = len(ids)
    pad = max_len - real
    return ids + [specials.pad] * pad, types + [0] * pad, [True] * real + [False] * pad


def _token_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [enc.ids for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]


def encode_examples(
    task: TaskSpec | str,
    examples: Sequence[Example],
    tokenizer: Tokenizer,
    max_len: int | None = None,
) -> dict[str, torch.Tensor]:
    """Model inputs for a classification or regression task.

    Returns ``input_ids``/``token_type_ids`` (long, ``(N, max_len)``), ``attention_mask``
    (bool) and ``labels``: class indices into ``task.labels`` (long) or scores (float). An
    unlabelled example (test split) gets the ignore index -100, or NaN for regression, so a
    test set encodes without a separate code path. ``max_len`` defaults to ``task.seq_len``.
    """
    task = get_task(task)
    if task.kind == "qa":
        raise FolnetError(f"{task.name} is a QA task: use squad.encode_squad")
    if not examples:
        raise FolnetError(f"encode_examples got no examples for {task.name}")
    max_len = task.seq_len if max_len is None else max_len
    specials = special_ids(tokenizer)
    tokenizer = plain_tokenizer(tokenizer)
    ids_a = _token_ids(tokenizer, [ex.text_a for ex in examples])
    pair_rows = [i for i, ex in enumerate(examples) if ex.text_b is not None]
    ids_b_list = _token_ids(tokenizer, [examples[i].text_b for i in pair_rows])  # type: ignore[misc]
    ids_b: list[list[int] | None] = [None] * len(examples)
    for row, ids in zip(pair_rows, ids_b_list, strict=True):
        ids_b[row] = ids

    input_ids, token_types, masks, labels = [], [], [], []
    for ex, a, b in zip(examples, ids_a, ids_b, strict=True):
        ids, types, mask = pack(a, b, max_len, specials)
        input_ids.append(ids)
        token_types.append(types)
        masks.append(mask)
        if ex.label is None:
            labels.append(float("nan") if task.kind == "regression" else IGNORE_INDEX)
        elif task.kind == "regression":
            labels.append(float(ex.label))
        else:
            labels.append(task.label_id(str(ex.label), f"example {ex.guid!r}"))
    label_dtype = torch.float32 if task.kind == "regression" else torch.long
    return {
        "input_ids": torch.tensor(input_ids, dtype=torch.long),
        "token_type_ids": torch.tensor(token_types, dtype=torch.long),
        "attention_mask": torch.tensor(masks, dtype=torch.bool),
        "labels": torch.tensor(labels, dtype=label_dtype),
    }
