"""SQuAD 2.0: the task, sliding-window features, and answer decoding; the questions are read
(the published JSON, or the ``rajpurkar/squad_v2`` rows) and checked by
`folnet.train.tasks.squad_data`, whose names are re-exported here.

A context longer than one input is cut into overlapping windows. Each feature is
``[CLS] question [SEP] window [SEP]`` (question first, as segment A, truncated to
``max_query_len`` tokens). ``doc_stride`` follows BERT's convention: it is the step between
the first tokens of consecutive windows, so with max_len 384 and a short question the
windows overlap by roughly 190 tokens and every answer of up to ~190 tokens is wholly inside
some window. Answer character spans are mapped to tokens with the tokenizer's character
offsets, which point into the original (un-normalised) context; an unanswerable question, or
an answer not wholly inside a window, targets position 0 ([CLS]), the "no answer" slot.

Post-processing picks, per question, the best-scoring valid span (start <= end, at most
``max_answer_len`` tokens, both inside the context) over all windows and compares it with the
null score, the smallest ``start[0] + end[0]`` over the windows: predicting "no answer" is
safest judged by the window that is least sure there is none.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from folnet.errors import FolnetError
from folnet.train.tasks.base import EncodedSplit, FinetuneDefaults, SplitData, TaskSpec
from folnet.train.tasks.encode import plain_tokenizer, special_ids
from folnet.train.tasks.hfdatasets import Published
from folnet.train.tasks.metrics import squad_evaluate
from folnet.train.tasks.registry import TaskFamily, read_files
from folnet.train.tasks.squad_data import (
    AnswerMismatch,
    SquadAnswer,
    SquadExample,
    parse_squad,
    read_squad,
    squad_example,
    squad_rows,
)

__all__ = ["FAMILY", "PUBLISHED", "SQUAD2", "AnswerMismatch", "SquadAnswer", "SquadExample",
           "SquadFeature", "encode_squad", "features_to_tensors", "parse_squad",
           "postprocess_predictions", "read_squad", "squad_example", "squad_rows"]

SQUAD2 = TaskSpec(
    name="squad2",
    kind="qa",
    labels=None,
    metrics=("exact", "f1"),
    main_metric="f1",
    splits=(("train", ("train-v2.0.json",)), ("validation", ("dev-v2.0.json",))),
    eval_splits=("validation",),
    seq_len=384,
    doc_stride=128,
    defaults=FinetuneDefaults(epochs=2, lr=9e-5, batch_size=32),
)


@dataclass(frozen=True)
class SquadFeature:
    """One window of one question. ``offset_mapping[i]`` is the (start, end) character span in
    the context of token i, or None for question, special and pad tokens; answer decoding
    only ever picks tokens whose offset is not None."""

    example_id: str
    window: int
    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]
    attention_mask: tuple[bool, ...]
    offset_mapping: tuple[tuple[int, int] | None, ...]
    start_position: int
    end_position: int


def _answer_tokens(
    offsets: Sequence[tuple[int, int]], answer: SquadAnswer, qid: str
) -> tuple[int, int]:
    """First and last context token overlapping the answer's character span."""
    lo, hi = answer.start, answer.start + len(answer.text)
    overlapping = [i for i, (s, e) in enumerate(offsets) if e > lo and s < hi]
    if not overlapping:
        raise FolnetError(
            f"question {qid!r}: answer {answer.text!r} at character {lo} covers no token"
        )
    return overlapping[0], overlapping[-1]


def encode_squad(
    examples: Sequence[SquadExample],
    tokenizer: Tokenizer,
    max_len: int = 384,
    doc_stride: int = 128,
    max_query_len: int = 64,
) -> list[SquadFeature]:
    """Sliding-window features of every example (in order; one or more per example). The
    training target is the first gold answer; evaluation uses `postprocess_predictions`."""
    if doc_stride < 1:
        raise FolnetError(f"doc_stride must be at least 1, got {doc_stride}")
    specials = special_ids(tokenizer)
    tokenizer = plain_tokenizer(tokenizer)
    questions = tokenizer.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    unique_contexts = list(dict.fromkeys(ex.context for ex in examples))
    encoded = tokenizer.encode_batch(unique_contexts, add_special_tokens=False)
    by_context = {
        c: (enc.ids, enc.offsets) for c, enc in zip(unique_contexts, encoded, strict=True)
    }

    features = []
    for ex, q_enc in zip(examples, questions, strict=True):
        q_ids = q_enc.ids[:max_query_len]
        doc_ids, doc_offsets = by_context[ex.context]
        room = max_len - len(q_ids) - 3
        if room < 1:
            raise FolnetError(
                f"max_len {max_len} leaves no room for the context after a {len(q_ids)}-token "
                "question and 3 special tokens"
            )
        span = None
        if not ex.is_impossible:
            span = _answer_tokens(doc_offsets, ex.answers[0], ex.qid)
        start, window = 0, 0
        while True:
            length = min(len(doc_ids) - start, room)
            ids = [
                specials.cls,
                *q_ids,
                specials.sep,
                *doc_ids[start : start + length],
                specials.sep,
            ]
            offsets: list[tuple[int, int] | None] = [None] * (len(q_ids) + 2)
            offsets += [tuple(o) for o in doc_offsets[start : start + length]]  # type: ignore[misc]
            offsets.append(None)
            types = [0] * (len(q_ids) + 2) + [1] * (length + 1)
            first_doc = len(q_ids) + 2
            s_pos = e_pos = 0
            if span is not None and span[0] >= start and span[1] < start + length:
                s_pos, e_pos = first_doc + span[0] - start, first_doc + span[1] - start
            pad = max_len - len(ids)
            features.append(
                SquadFeature(
                    example_id=ex.qid,
                    window=window,
                    input_ids=tuple(ids + [specials.pad] * pad),
                    token_type_ids=tuple(types + [0] * pad),
                    attention_mask=tuple([True] * len(ids) + [False] * pad),
                    offset_mapping=tuple(offsets + [None] * pad),
                    start_position=s_pos,
                    end_position=e_pos,
                )
            )
            if start + length >= len(doc_ids):
                break
            start += min(length, doc_stride)
            window += 1
    return features


def features_to_tensors(features: Sequence[SquadFeature]) -> dict[str, torch.Tensor]:
    """Batched model inputs and span targets of a list of features."""
    if not features:
        raise FolnetError("features_to_tensors got no features")
    return {
        "input_ids": torch.tensor([f.input_ids for f in features], dtype=torch.long),
        "token_type_ids": torch.tensor([f.token_type_ids for f in features], dtype=torch.long),
        "attention_mask": torch.tensor([f.attention_mask for f in features], dtype=torch.bool),
        "start_positions": torch.tensor([f.start_position for f in features], dtype=torch.long),
        "end_positions": torch.tensor([f.end_position for f in features], dtype=torch.long),
    }


def _as_array(logits: Any, name: str, features: Sequence[SquadFeature]) -> np.ndarray:
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    arr = np.asarray(logits, dtype=np.float64)
    width = len(features[0].input_ids) if features else 0
    if arr.shape != (len(features), width):
        raise FolnetError(
            f"{name} has shape {arr.shape}, expected (num_features, seq_len) = "
            f"({len(features)}, {width})"
        )
    return arr


def postprocess_predictions(
    examples: Sequence[SquadExample],
    features: Sequence[SquadFeature],
    start_logits: Any,
    end_logits: Any,
    n_best: int = 20,
    max_answer_len: int = 30,
    null_threshold: float = 0.0,
) -> dict[str, str]:
    """Answer text per question id ("" for no answer).

    Per window, the ``n_best`` highest start and end logits are paired into candidate spans;
    the best candidate over all windows (score start + end) is answered unless the null
    score beats it by more than ``null_threshold``. The text is the context slice between
    the candidate's first and last token offsets, so it keeps the original casing and spacing.
    """
    starts = _as_array(start_logits, "start_logits", features)
    ends = _as_array(end_logits, "end_logits", features)
    by_example: dict[str, list[int]] = defaultdict(list)
    for i, feature in enumerate(features):
        by_example[feature.example_id].append(i)

    predictions = {}
    for ex in examples:
        rows = by_example.get(ex.qid)
        if not rows:
            raise FolnetError(f"question {ex.qid!r} has no features")
        null_score = min(starts[r, 0] + ends[r, 0] for r in rows)
        best_score, best_text = -np.inf, ""
        for r in rows:
            offsets = features[r].offset_mapping
            top_s = np.argsort(-starts[r], kind="stable")[:n_best]
            top_e = np.argsort(-ends[r], kind="stable")[:n_best]
            for s in top_s:
                if offsets[s] is None:
                    continue
                for e in top_e:
                    if offsets[e] is None or e < s or e - s + 1 > max_answer_len:
                        continue
                    score = starts[r, s] + ends[r, e]
                    if score > best_score:
                        best_score = score
                        best_text = ex.context[offsets[s][0] : offsets[e][1]]  # type: ignore[index]
        if best_score == -np.inf or null_score - best_score > null_threshold:
            predictions[ex.qid] = ""
        else:
            predictions[ex.qid] = best_text
    return predictions


# -- the family: windows in, answers out ---------------------------------------------------------


def _encode(spec: TaskSpec, split: SplitData, tokenizer: Tokenizer,
            options: Mapping[str, Any]) -> EncodedSplit:
    """Windows of every question (``max_len``, ``doc_stride``, ``max_query_len`` options)."""
    examples = split.examples
    given = {key: options[key] for key in ("max_query_len",) if key in options}
    features = encode_squad(examples, tokenizer, max_len=options.get("max_len") or spec.seq_len,
                            doc_stride=options.get("doc_stride") or spec.doc_stride or 128,
                            **given)
    return EncodedSplit(split.split, split.source, [ex.qid for ex in examples],
                        [None if ex.is_impossible else ex.answers[0].text for ex in examples],
                        features_to_tensors(features), context=(tuple(examples), features))


def _score(spec: TaskSpec, split: EncodedSplit, outputs: Mapping[str, torch.Tensor],
           options: Mapping[str, Any]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """SQuAD 2.0's official metrics of the decoded answers (``n_best``, ``max_answer_len``,
    ``null_threshold`` options); a row per question with its gold answers joined by ||."""
    if split.context is None:
        raise FolnetError(f"split {split.name!r} was not encoded for QA")
    examples, features = split.context
    given = {key: options[key] for key in ("n_best", "max_answer_len", "null_threshold")
             if key in options}
    answers = postprocess_predictions(examples, features, outputs["start_logits"],
                                      outputs["end_logits"], **given)
    rows = [{"id": ex.qid, "prediction": answers[ex.qid],
             "label": " || ".join(a.text for a in ex.answers)} for ex in examples]
    return squad_evaluate(examples, answers), rows


PUBLISHED = Published("rajpurkar/squad_v2", ("id", "context", "question", "answers"), None,
                      squad_rows, dirs=("squad_v2",))


def _read(spec: TaskSpec, data_dir: str | Path | None, splits: Sequence[str],
          options: Mapping[str, Any]) -> dict[str, SplitData]:
    """Either format, with the ``skip_bad_answers`` option applied to both."""
    skip = bool(options.get("skip_bad_answers", False))
    published = dataclasses.replace(
        PUBLISHED, convert=lambda task, table: squad_rows(task, table, skip_bad_answers=skip))
    reader = read_files(lambda task, paths, split: read_squad(paths[0], skip_bad_answers=skip),
                        published={SQUAD2.name: published})
    return reader(spec, data_dir, splits, options)


FAMILY = TaskFamily("squad2", (SQUAD2,), read=_read, encode=_encode, score=_score,
                    official=lambda rows: {row["id"]: row["prediction"] for row in rows})
