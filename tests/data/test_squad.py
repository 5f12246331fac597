"""SQuAD 2.0: reader, sliding-window features, answer-span mapping and post-processing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from wordpiece import make_tokenizer

from folnet.errors import FolnetError
from folnet.train.tasks import (
    SquadAnswer,
    SquadExample,
    encode_squad,
    features_to_tensors,
    postprocess_predictions,
    read_split,
)
from folnet.train.tasks.metrics import normalize_answer, squad_evaluate

FILLER = "The river flows past old stone bridges and quiet green fields. "
ANSWER = "Biscuit Barkley"
CONTEXT = FILLER * 60 + f"Near the mill lives a dog called {ANSWER}, loved by all."
QUESTION = "What is the dog called?"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return make_tokenizer([CONTEXT, QUESTION, "Who owns the cat?"], 300)


def answerable() -> SquadExample:
    start = CONTEXT.index(ANSWER)
    return SquadExample("q1", "t", QUESTION, CONTEXT, (SquadAnswer(ANSWER, start),), False)


def unanswerable() -> SquadExample:
    return SquadExample("q2", "t", "Who owns the cat?", CONTEXT, (), True)


def doc_token_count(tok: Tokenizer) -> int:
    return len(tok.encode(CONTEXT, add_special_tokens=False).ids)


@pytest.mark.parametrize(("max_len", "stride"), [(64, 16), (384, 128)])
def test_windows_and_answer_span(tokenizer: Tokenizer, max_len: int, stride: int) -> None:
    doc = tokenizer.encode(CONTEXT, add_special_tokens=False)
    q_ids = tokenizer.encode(QUESTION, add_special_tokens=False).ids
    assert len(doc.ids) > 700  # several windows even at max_len 384
    feats = encode_squad([answerable()], tokenizer, max_len=max_len, doc_stride=stride)
    room = max_len - len(q_ids) - 3
    assert len(feats) == -(-(len(doc.ids) - room) // stride) + 1  # ceil((N - room) / stride) + 1
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    # the answer's token span in the whole document, from its character offsets
    lo, hi = CONTEXT.index(ANSWER), CONTEXT.index(ANSWER) + len(ANSWER)
    span = [i for i, (s, e) in enumerate(doc.offsets) if e > lo and s < hi]
    hits = []
    for k, f in enumerate(feats):
        assert f.window == k and f.example_id == "q1" and len(f.input_ids) == max_len
        # [CLS] question [SEP] window [SEP] pad...; segment B = window + its [SEP]
        assert f.input_ids[: len(q_ids) + 2] == (cls, *q_ids, sep)
        first = len(q_ids) + 2
        n_real = sum(f.attention_mask)
        assert f.input_ids[n_real - 1] == sep
        assert f.token_type_ids[:n_real] == (0,) * first + (1,) * (n_real - first)
        assert f.offset_mapping[:first] == (None,) * first and f.offset_mapping[n_real - 1] is None
        # window k starts at document token k * stride (BERT's doc_stride convention)
        assert f.offset_mapping[first] == doc.offsets[k * stride]
        window_tokens = range(k * stride, k * stride + n_real - first - 1)
        if span[0] in window_tokens and span[-1] in window_tokens:
            hits.append(k)
            s, e = f.start_position, f.end_position
            assert (s, e) == (first + span[0] - k * stride, first + span[-1] - k * stride)
            assert CONTEXT[f.offset_mapping[s][0] : f.offset_mapping[e][1]] == ANSWER
            decoded = tokenizer.decode(list(f.input_ids[s : e + 1]))
            assert normalize_answer(decoded) == normalize_answer(ANSWER)
        else:  # answer absent or only partly inside: the no-answer slot
            assert (f.start_position, f.end_position) == (0, 0)
    assert hits and min(hits) > 0  # the answer near the end lands in a later window only


def test_unanswerable_points_at_cls(tokenizer: Tokenizer) -> None:
    feats = encode_squad([unanswerable()], tokenizer, max_len=64, doc_stride=16)
    assert len(feats) > 1
    assert all((f.start_position, f.end_position) == (0, 0) for f in feats)
    batch = features_to_tensors(feats)
    assert batch["input_ids"].shape == (len(feats), 64)
    assert batch["start_positions"].tolist() == [0] * len(feats)


def test_encode_squad_errors(tokenizer: Tokenizer) -> None:
    with pytest.raises(FolnetError, match="leaves no room for the context"):
        encode_squad([answerable()], tokenizer, max_len=8)
    bad = SquadExample("q9", "t", "Q?", "abc   def", (SquadAnswer("  ", 3),), False)
    with pytest.raises(FolnetError, match="question 'q9': answer '  ' at character 3 covers no"):
        encode_squad([bad], tokenizer, max_len=32)


def synthetic_logits(feats, k: int, s: int, e: int, null: float) -> tuple[np.ndarray, np.ndarray]:
    """Zero logits except 5 + 5 on the span (s, e) of feature k and ``null`` at [CLS]."""
    start = np.zeros((len(feats), len(feats[0].input_ids)))
    end = np.zeros_like(start)
    start[k, s], end[k, e] = 5.0, 5.0
    start[:, 0] = null
    return start, end


def test_postprocess_picks_span_and_null(tokenizer: Tokenizer) -> None:
    examples = [answerable()]
    feats = encode_squad(examples, tokenizer, max_len=64, doc_stride=16)
    k = next(i for i, f in enumerate(feats) if f.start_position > 0)
    s, e = feats[k].start_position, feats[k].end_position
    # best span 5 + 5 = 10 vs null 0 + 0 = 0 -> the span
    start, end = synthetic_logits(feats, k, s, e, null=0.0)
    assert postprocess_predictions(examples, feats, start, end) == {"q1": ANSWER}
    # null 20 in every window: 20 - 10 > 0 -> no answer
    start, end = synthetic_logits(feats, k, s, e, null=20.0)
    assert postprocess_predictions(examples, feats, start, end) == {"q1": ""}
    # null score is the MIN over windows: one window with null 0 -> the span wins again
    start[len(feats) - 1, 0] = 0.0
    assert postprocess_predictions(examples, feats, start, end) == {"q1": ANSWER}
    # threshold: null 8 vs span 10 -> difference -2; answered at threshold 0, not at -3
    start, end = synthetic_logits(feats, k, s, e, null=8.0)
    assert postprocess_predictions(examples, feats, start, end)["q1"] == ANSWER
    assert postprocess_predictions(examples, feats, start, end, null_threshold=-3.0)["q1"] == ""


def test_postprocess_rejects_invalid_spans(tokenizer: Tokenizer) -> None:
    examples = [answerable()]
    feats = encode_squad(examples, tokenizer, max_len=64, doc_stride=16)
    k = next(i for i, f in enumerate(feats) if f.start_position > 0)
    s, e = feats[k].start_position, feats[k].end_position
    start, end = synthetic_logits(feats, k, s, e, null=-50.0)
    # higher-scoring but invalid pairs: a start on a question token (1), an end before the
    # start (s-1 vs s), and spans longer than max_answer_len (start s-35 with end s-1 or e:
    # 35 or e-s+36 tokens); every pairing of the 9s with anything is invalid
    assert feats[k].offset_mapping[1] is None and feats[k].offset_mapping[s - 35] is not None
    start[k, 1] = 9.0
    end[k, s - 1] = 9.0
    start[k, s - 35] = 9.0
    got = postprocess_predictions(examples, feats, start, end, max_answer_len=30)
    assert got == {"q1": ANSWER}
    # with a looser length limit the 35-token span (9 + 9 = 18 > 10) is taken instead
    loose = postprocess_predictions(examples, feats, start, end, max_answer_len=40)["q1"]
    assert loose != ANSWER and loose.endswith("called")
    with pytest.raises(FolnetError, match="start_logits has shape"):
        postprocess_predictions(examples, feats, start[:, :10], end)


def test_reader_and_end_to_end_scoring(tmp_path: Path, tokenizer: Tokenizer) -> None:
    start = CONTEXT.index(ANSWER)
    data = {"version": "v2.0", "data": [{"title": "Dogs", "paragraphs": [{
        "context": CONTEXT,
        "qas": [
            {"id": "q1", "question": QUESTION, "is_impossible": False,
             "answers": [{"text": ANSWER, "answer_start": start},
                         {"text": "Biscuit", "answer_start": start}]},
            {"id": "q2", "question": "Who owns the cat?", "is_impossible": True,
             "answers": [], "plausible_answers": [{"text": "mill", "answer_start": 5}]},
        ]}]}]}  # fmt: skip
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(data))
    split = read_split("squad2", tmp_path, "validation")
    assert split.task.name == "squad2" and len(split.examples) == 2
    q1, q2 = split.examples
    assert q1.answers == (SquadAnswer(ANSWER, start), SquadAnswer("Biscuit", start))
    assert q2.is_impossible and q2.answers == () and q1.title == "Dogs"

    feats = encode_squad(split.examples, tokenizer, max_len=64, doc_stride=16)
    k = next(i for i, f in enumerate(feats) if f.example_id == "q1" and f.start_position > 0)
    start_l, end_l = synthetic_logits(feats, k, feats[k].start_position, feats[k].end_position, 0)
    q2_rows = [i for i, f in enumerate(feats) if f.example_id == "q2"]
    start_l[q2_rows, 0] = 30.0  # q2: null wins everywhere
    preds = postprocess_predictions(split.examples, feats, start_l, end_l)
    assert preds == {"q1": ANSWER, "q2": ""}
    scores = squad_evaluate(tmp_path / "dev-v2.0.json", preds)
    assert scores["exact"] == 100.0 and scores["f1"] == 100.0 and scores["total"] == 2.0


def test_reader_errors(tmp_path: Path) -> None:
    (tmp_path / "train-v2.0.json").write_text('{"data": [\n{"title": \n')
    with pytest.raises(FolnetError, match=r"train-v2\.0\.json:3: not valid JSON"):
        read_split("squad2", tmp_path, "train")
    para = {
        "context": "short",
        "qas": [
            {
                "id": "x1",
                "question": "?",
                "is_impossible": False,
                "answers": [{"text": "longer text", "answer_start": 2}],
            }
        ],
    }
    (tmp_path / "train-v2.0.json").write_text(json.dumps({"data": [{"paragraphs": [para]}]}))
    with pytest.raises(FolnetError, match=r"question 'x1': answer_start 2 .* outside the context"):
        read_split("squad2", tmp_path, "train")
    para["qas"][0]["answers"] = []
    (tmp_path / "train-v2.0.json").write_text(json.dumps({"data": [{"paragraphs": [para]}]}))
    with pytest.raises(FolnetError, match="question 'x1': answerable question with no answers"):
        read_split("squad2", tmp_path, "train")
    with pytest.raises(FolnetError, match=r"expected the file .*dev-v2\.0\.json.*train-v2\.0"):
        read_split("squad2", tmp_path, "validation")
