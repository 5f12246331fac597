"""Metrics against values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from folnet.errors import FolnetError
from folnet.train.tasks import parse_squad
from folnet.train.tasks.metrics import (
    accuracy,
    compute_metrics,
    f1_binary,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad_evaluate,
    squad_exact,
    squad_f1,
)

# predictions / labels shared by the binary tests:
#   pos:    0  1  2  3  4
#   pred:   1  1  0  1  0
#   gold:   1  0  0  1  1
#   -> TP = {0, 3} = 2, FP = {1} = 1, TN = {2} = 1, FN = {4} = 1
PRED = [1, 1, 0, 1, 0]
GOLD = [1, 0, 0, 1, 1]


def test_accuracy() -> None:
    # matches at positions 0, 2, 3 -> 3 / 5
    assert accuracy(PRED, GOLD) == pytest.approx(0.6)
    # torch tensors are accepted: 2 of 4 equal
    assert accuracy(torch.tensor([1, 0, 1, 1]), torch.tensor([1, 1, 1, 0])) == 0.5


def test_f1_binary() -> None:
    # F1 = 2TP / (2TP + FP + FN) = 4 / (4 + 1 + 1) = 2/3
    assert f1_binary(PRED, GOLD) == pytest.approx(2 / 3)
    # positive class 0: TP = {2} = 1, FP = {4} = 1, FN = {1} = 1 -> 2 / (2 + 1 + 1) = 0.5
    assert f1_binary(PRED, GOLD, positive=0) == pytest.approx(0.5)


def test_f1_degenerate() -> None:
    # no positive anywhere: 0/0 is reported as 0, not NaN
    assert f1_binary([0, 0, 0], [0, 0, 0]) == 0.0
    # never predicting the positive class: TP = 0, FN = 1 -> 0 / 1 = 0
    assert f1_binary([0, 0], [1, 0]) == 0.0


def test_mcc_binary() -> None:
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))
    #   = (2*1 - 1*1) / sqrt(3 * 3 * 2 * 2) = 1 / 6
    assert matthews_corrcoef(PRED, GOLD) == pytest.approx(1 / 6)
    assert matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == pytest.approx(-1.0)


def test_mcc_multiclass() -> None:
    # pred [0, 1, 2, 0], gold [0, 1, 1, 2]: s = 4 items, c = 2 correct (positions 0, 1)
    # predicted counts p = (2, 1, 1), true counts t = (1, 2, 1), sum p*t = 2 + 2 + 1 = 5
    # cov = c*s - 5 = 3; s^2 - sum p^2 = 16 - 6 = 10; s^2 - sum t^2 = 16 - 6 = 10
    # MCC = 3 / sqrt(10 * 10) = 0.3
    assert matthews_corrcoef([0, 1, 2, 0], [0, 1, 1, 2]) == pytest.approx(0.3)


def test_mcc_degenerate_is_zero_not_nan() -> None:
    # constant predictions: s^2 - sum p^2 = 9 - 9 = 0 -> 0 by definition
    assert matthews_corrcoef([1, 1, 1], [0, 1, 1]) == 0.0
    # constant labels
    assert matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0
    # everything constant and correct: still 0 (no correlation is measurable)
    assert matthews_corrcoef([1, 1], [1, 1]) == 0.0


def test_pearson() -> None:
    # x = [1, 2, 3] (mean 2), y = [2, 4, 7] (mean 13/3)
    # xc = [-1, 0, 1], yc = [-7/3, -1/3, 8/3]; xc.yc = 7/3 + 8/3 = 5
    # |xc|^2 = 2, |yc|^2 = (49 + 1 + 64) / 9 = 114/9
    # r = 5 / sqrt(2 * 114/9) = 15 / sqrt(228)
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228))
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_pearson_constant_is_zero() -> None:
    assert pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0


def test_spearman_with_ties() -> None:
    # x = [1, 2, 2, 3] -> average ranks [1, 2.5, 2.5, 4]; y = [1, 3, 2, 4] -> ranks [1, 3, 2, 4]
    # both rank means are 2.5: xc = [-1.5, 0, 0, 1.5], yc = [-1.5, 0.5, -0.5, 1.5]
    # xc.yc = 2.25 + 2.25 = 4.5; |xc|^2 = 4.5; |yc|^2 = 2.25 + 0.25 + 0.25 + 2.25 = 5
    # rho = 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))


def test_spearman_monotonic_and_constant() -> None:
    # ranks of [1, 4, 9, 16] equal ranks of [1, 2, 3, 4] -> rho = 1 although r < 1
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [1, 4, 9, 16]) < 0.99
    assert spearman([5, 5, 5], [1, 2, 3]) == 0.0


def test_metric_input_errors() -> None:
    with pytest.raises(FolnetError, match="3 predictions but 2 labels"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(FolnetError, match="no predictions"):
        accuracy([], [])
    with pytest.raises(FolnetError, match="fractional"):
        accuracy([0.4, 0.6], [0, 1])
    with pytest.raises(FolnetError, match="non-finite"):
        pearson([1.0, float("nan")], [1.0, 2.0])


def test_compute_metrics() -> None:
    out = compute_metrics(("accuracy", "f1", "mcc"), np.array(PRED), np.array(GOLD))
    assert out == pytest.approx({"accuracy": 0.6, "f1": 2 / 3, "mcc": 1 / 6})
    with pytest.raises(FolnetError, match="unknown metric 'exact'"):
        compute_metrics(("exact",), PRED, GOLD)


# --------------------------------------------------------------------------------- SQuAD


def test_normalize_answer() -> None:
    # lowercase, punctuation gone, articles gone as whole words only, whitespace collapsed
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theatre anthem") == "theatre anthem"
    assert normalize_answer(" A. ") == ""


def test_squad_exact_and_f1() -> None:
    assert squad_exact("the Eiffel Tower", ["Eiffel Tower."]) == 1.0
    assert squad_exact("Eiffel", ["Eiffel Tower"]) == 0.0
    # pred tokens [big, cat, sat], gold [cat, sat, down]: common 2, P = R = 2/3 -> F1 = 2/3
    assert squad_f1("the big cat sat", ["a cat sat down"]) == pytest.approx(2 / 3)
    # max over gold answers: "dog" gives 0, the second gives 2/3
    assert squad_f1("the big cat sat", ["dog", "a cat sat down"]) == pytest.approx(2 / 3)
    # bag of tokens: pred [cat, cat] vs gold [cat]: common min(2, 1) = 1, P = 1/2, R = 1
    # F1 = 2 * 1/2 * 1 / (3/2) = 2/3
    assert squad_f1("cat cat", ["cat"]) == pytest.approx(2 / 3)


def test_squad_no_answer_rule() -> None:
    # unanswerable (no gold): 1 iff the prediction is empty after normalisation
    assert squad_exact("", []) == 1.0 and squad_f1("", []) == 1.0
    assert squad_exact("Paris", []) == 0.0 and squad_f1("Paris", []) == 0.0
    assert squad_exact("the", []) == 1.0  # normalises to ""
    # answerable question, empty prediction: 0
    assert squad_exact("", ["Paris"]) == 0.0 and squad_f1("", ["Paris"]) == 0.0


SQUAD_JSON = {
    "version": "v2.0",
    "data": [
        {
            "title": "T",
            "paragraphs": [
                {
                    "context": "Paris is big. The big red dog barked. London rains.",
                    "qas": [
                        {"id": "q1", "question": "capital?", "is_impossible": False,
                         "answers": [{"text": "Paris", "answer_start": 0}]},
                        {"id": "q2", "question": "what dog?", "is_impossible": False,
                         "answers": [{"text": "big red dog", "answer_start": 18},
                                     {"text": "red dog", "answer_start": 22}]},
                        {"id": "q3", "question": "who?", "is_impossible": True, "answers": [],
                         "plausible_answers": [{"text": "London", "answer_start": 38}]},
                        {"id": "q4", "question": "why?", "is_impossible": True, "answers": []},
                    ],
                }
            ],
        }
    ],
}  # fmt: skip
# q1: "paris" vs "Paris": exact 1, f1 1
# q2: "the red dog barked" -> [red, dog, barked]; vs [big, red, dog]: common 2, P = R = 2/3,
#     F1 2/3; vs [red, dog]: P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 0.8 -> exact 0, f1 0.8
# q3: "" on unanswerable: 1, 1;  q4: "London" on unanswerable: 0, 0
PREDS = {"q1": "paris", "q2": "the red dog barked", "q3": "", "q4": "London"}
EXPECTED = {
    "exact": 100 * 2 / 4,  # q1 + q3
    "f1": 100 * (1 + 0.8 + 1 + 0) / 4,  # 70
    "HasAns_exact": 100 * 1 / 2,
    "HasAns_f1": 100 * (1 + 0.8) / 2,  # 90
    "NoAns_exact": 100 * 1 / 2,
    "NoAns_f1": 100 * 1 / 2,
    "HasAns_total": 2.0,
    "NoAns_total": 2.0,
    "total": 4.0,
}


def test_squad_evaluate_dict_path_and_examples(tmp_path) -> None:
    assert squad_evaluate(SQUAD_JSON, PREDS) == pytest.approx(EXPECTED)
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(SQUAD_JSON))
    assert squad_evaluate(path, PREDS) == pytest.approx(EXPECTED)
    assert squad_evaluate(parse_squad(SQUAD_JSON), PREDS) == pytest.approx(EXPECTED)


def test_squad_evaluate_mismatched_predictions() -> None:
    with pytest.raises(FolnetError, match=r"no prediction for 1 of 4 questions.*'q4'"):
        squad_evaluate(SQUAD_JSON, {k: v for k, v in PREDS.items() if k != "q4"})
    with pytest.raises(FolnetError, match=r"not in the dataset.*'q9'"):
        squad_evaluate(SQUAD_JSON, {**PREDS, "q9": "x"})
