"""Multiple choice and token classification from the Python API.

Neither has a task in the paper, so there is no reader or command for them; these functions
turn plain Python data into the tensors the ``multiple-choice`` and ``token-classification``
heads take, and train them with the same loop as every other task::

    model = finetune_multiple_choice("runs/pretrain", contexts, choices, labels,
                                     epochs=3, batch_size=16)
    best = predict_multiple_choice(model, tokenizer, contexts, choices)

    model = finetune_token_classification("runs/pretrain", words, tags, ["O", "B-PER", ...])
    tags = predict_token_classification(model, tokenizer, words, ["O", "B-PER", ...])

Token labels go on the first sub-token of every word and -100 (ignored) on the rest, as in
the CoNLL finetuning scripts users know, so a word is tagged exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from folnet.arch import FolnetModel
from folnet.errors import FolnetError
from folnet.train.finetune.loop import LoopSettings, batches, finetune_model, num_batches, predict
from folnet.train.finetune.warm_start import build_task_model, resolve_checkpoint, task_tokenizer
from folnet.train.tasks.encode import IGNORE_INDEX, pack, plain_tokenizer, special_ids

__all__ = ["encode_multiple_choice", "encode_token_classification", "finetune_multiple_choice",
           "finetune_token_classification", "predict_multiple_choice",
           "predict_token_classification"]


def _raw(tokenizer: Any):
    """A `tokenizers.Tokenizer` from it or from a `FolnetTokenizer`."""
    return getattr(tokenizer, "tokenizer", tokenizer)


def encode_multiple_choice(contexts: Sequence[str], choices: Sequence[Sequence[str]],
                           labels: Sequence[int] | None, tokenizer: Any,
                           max_len: int = 128) -> dict[str, torch.Tensor]:
    """``(N, C, max_len)`` inputs pairing each context (segment A) with each of its C choices
    (segment B), and ``labels`` (N,) = index of the right choice (omitted when None)."""
    if len(contexts) != len(choices) or not contexts:
        raise FolnetError(f"multiple choice needs one choice list per context, got "
                          f"{len(contexts)} contexts and {len(choices)} choice lists")
    width = {len(c) for c in choices}
    if len(width) != 1 or 0 in width:
        raise FolnetError(f"every item needs the same (non-zero) number of choices, got "
                          f"{sorted(width)}")
    count = width.pop()
    raw = plain_tokenizer(_raw(tokenizer))
    specials = special_ids(raw)
    ids_a = [e.ids for e in raw.encode_batch(list(contexts), add_special_tokens=False)]
    flat = [c for item in choices for c in item]
    ids_b = [e.ids for e in raw.encode_batch(flat, add_special_tokens=False)]
    packed = [pack(ids_a[i // count], b, max_len, specials) for i, b in enumerate(ids_b)]
    shape = (len(contexts), count, max_len)
    out = {"input_ids": torch.tensor([p[0] for p in packed]).view(shape),
           "token_type_ids": torch.tensor([p[1] for p in packed]).view(shape),
           "attention_mask": torch.tensor([p[2] for p in packed]).view(shape)}
    if labels is not None:
        if len(labels) != len(contexts):
            raise FolnetError(f"{len(labels)} labels for {len(contexts)} items")
        bad = [(i, y) for i, y in enumerate(labels) if not 0 <= int(y) < count]
        if bad:
            raise FolnetError(f"item {bad[0][0]}: label {bad[0][1]} is not a choice index in "
                              f"[0, {count})")
        out["labels"] = torch.tensor([int(y) for y in labels])
    return out


def encode_token_classification(words: Sequence[Sequence[str]],
                                tags: Sequence[Sequence[str]] | None, label_list: Sequence[str],
                                tokenizer: Any, max_len: int = 128) -> dict[str, torch.Tensor]:
    """``[CLS] tokens [SEP]`` inputs of pre-split sentences, with ``labels`` on each word's
    first sub-token (-100 elsewhere) and ``word_index`` (the word a label position belongs
    to, -1 elsewhere). Words beyond ``max_len - 2`` sub-tokens are cut off."""
    raw = plain_tokenizer(_raw(tokenizer))
    specials = special_ids(raw)
    if tags is not None and len(tags) != len(words):
        raise FolnetError(f"{len(tags)} tag sequences for {len(words)} sentences")
    encodings = raw.encode_batch([list(w) for w in words], is_pretokenized=True,
                                 add_special_tokens=False)
    rows: dict[str, list[list[Any]]] = {k: [] for k in ("input_ids", "token_type_ids",
                                                        "attention_mask", "labels", "word_index")}
    for n, enc in enumerate(encodings):
        ids, types, mask = pack(enc.ids, None, max_len, specials)
        labels = [IGNORE_INDEX] * max_len
        index = [-1] * max_len
        previous = None
        for position, word in enumerate(enc.word_ids[: max_len - 2], start=1):
            if word is not None and word != previous:
                index[position] = word
                if tags is not None:
                    if len(tags[n]) != len(words[n]):
                        raise FolnetError(f"sentence {n}: {len(tags[n])} tags for "
                                          f"{len(words[n])} words")
                    tag = tags[n][word]
                    if tag not in label_list:
                        raise FolnetError(f"sentence {n}, word {word}: tag {tag!r} is not in "
                                          f"the label list {list(label_list)}")
                    labels[position] = list(label_list).index(tag)
            previous = word
        for key, value in (("input_ids", ids), ("token_type_ids", types),
                           ("attention_mask", mask), ("labels", labels), ("word_index", index)):
            rows[key].append(value)
    out = {k: torch.tensor(v, dtype=torch.bool if k == "attention_mask" else torch.long)
           for k, v in rows.items()}
    if tags is None:
        del out["labels"]
    return out


def _train(checkpoint: str | Path, head: str, num_labels: int, tensors: dict[str, torch.Tensor],
           *, epochs: int, batch_size: int, settings: LoopSettings, seed: int,
           device: str) -> FolnetModel:
    torch.manual_seed(seed)
    model = build_task_model(resolve_checkpoint(checkpoint), head, num_labels)
    order = torch.Generator().manual_seed(seed)
    finetune_model(model, lambda _epoch: batches(tensors, batch_size, shuffle=True,
                                                 generator=order),
                   num_batches(len(tensors["input_ids"]), batch_size), epochs=epochs,
                   settings=settings, device=device)
    return model


def finetune_multiple_choice(checkpoint: str | Path, contexts: Sequence[str],
                             choices: Sequence[Sequence[str]], labels: Sequence[int], *,
                             epochs: int = 3, batch_size: int = 16, max_len: int = 128,
                             settings: LoopSettings | None = None, seed: int = 0,
                             device: str = "cpu") -> FolnetModel:
    """A ``multiple-choice`` model over ``checkpoint``'s encoder, trained on the items."""
    tokenizer = task_tokenizer(resolve_checkpoint(checkpoint))
    tensors = encode_multiple_choice(contexts, choices, labels, tokenizer, max_len)
    return _train(checkpoint, "multiple-choice", 1, tensors, epochs=epochs,
                  batch_size=batch_size, settings=settings or LoopSettings(), seed=seed,
                  device=device)


def predict_multiple_choice(model: FolnetModel, tokenizer: Any, contexts: Sequence[str],
                            choices: Sequence[Sequence[str]], max_len: int = 128,
                            batch_size: int = 32) -> list[int]:
    """The index of the highest-scoring choice of every item."""
    tensors = encode_multiple_choice(contexts, choices, None, tokenizer, max_len)
    logits = predict(model, batches(tensors, batch_size))["logits"]  # (N, C)
    return logits.argmax(-1).tolist()


def finetune_token_classification(checkpoint: str | Path, words: Sequence[Sequence[str]],
                                  tags: Sequence[Sequence[str]], label_list: Sequence[str], *,
                                  epochs: int = 3, batch_size: int = 16, max_len: int = 128,
                                  settings: LoopSettings | None = None, seed: int = 0,
                                  device: str = "cpu") -> FolnetModel:
    """A ``token-classification`` model over ``checkpoint``'s encoder, trained on the tags."""
    tokenizer = task_tokenizer(resolve_checkpoint(checkpoint))
    tensors = encode_token_classification(words, tags, label_list, tokenizer, max_len)
    tensors.pop("word_index")
    return _train(checkpoint, "token-classification", len(label_list), tensors, epochs=epochs,
                  batch_size=batch_size, settings=settings or LoopSettings(), seed=seed,
                  device=device)


def predict_token_classification(model: FolnetModel, tokenizer: Any,
                                 words: Sequence[Sequence[str]], label_list: Sequence[str],
                                 max_len: int = 128, batch_size: int = 32) -> list[list[str]]:
    """One tag per word (words cut off by ``max_len`` get none, so lists may be shorter)."""
    tensors = encode_token_classification(words, None, label_list, tokenizer, max_len)
    index = tensors.pop("word_index")
    logits = predict(model, batches(tensors, batch_size), full_length=max_len)["logits"]
    best = logits.argmax(-1)  # (N, T)
    out = []
    for row in range(len(words)):
        positions = (index[row] >= 0).nonzero().flatten().tolist()
        out.append([label_list[int(best[row, p])] for p in positions])
    return out
