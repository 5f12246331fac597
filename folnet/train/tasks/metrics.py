"""Evaluation metrics for the finetuning tasks, written in plain numpy/python.

Why not sklearn/scipy: they are heavy optional dependencies, and their degenerate-case
behaviour (NaN plus a warning for a constant predictor) is the wrong default for model
selection. Here every metric returns a finite float: a constant predictor scores MCC 0,
Pearson 0 and Spearman 0 ("no correlation"), and F1 with no positives anywhere scores 0.

Classification metrics take integer class ids (already arg-maxed); regression metrics take
floats. SQuAD metrics follow the SQuAD 2.0 evaluation rules (answer normalisation,
max over gold answers, the no-answer rule) and report percentages as the official
evaluation does.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from folnet.errors import FolnetError, choices
from folnet.read_files import parse_json

__all__ = [
    "METRICS",
    "accuracy",
    "compute_metrics",
    "f1_binary",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson",
    "spearman",
    "squad_evaluate",
    "squad_exact",
    "squad_f1",
]


def _pair(predictions: Any, labels: Any, *, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as 1-D arrays of equal, non-zero length (torch tensors are accepted)."""
    arrays = []
    for name, value in (("predictions", predictions), ("labels", labels)):
        if hasattr(value, "detach"):  # a torch tensor, without importing torch here
            value = value.detach().cpu().numpy()
        raw = np.asarray(value)
        if dtype is np.int64 and raw.dtype.kind == "f" and not np.all(np.mod(raw, 1) == 0):
            raise FolnetError(
                f"metric got fractional {name}: class metrics need integer class ids "
                "(arg-max the logits first)"
            )
        try:
            arr = raw.astype(dtype).reshape(-1)
        except (TypeError, ValueError):
            head = raw.reshape(-1)[:5]
            raise FolnetError(f"metric got {name} that are not numbers: {head!r}") from None
        if arr.size == 0:
            raise FolnetError(f"metric got no {name}: at least one item is needed")
        if dtype is np.float64 and not np.all(np.isfinite(arr)):
            raise FolnetError(f"metric got non-finite {name} (NaN or inf)")
        arrays.append(arr)
    p, y = arrays
    if p.shape != y.shape:
        raise FolnetError(f"metric got {p.size} predictions but {y.size} labels")
    return p, y


def accuracy(predictions: Any, labels: Any) -> float:
    """Fraction of items whose predicted class id equals the label."""
    p, y = _pair(predictions, labels, dtype=np.int64)
    return float(np.mean(p == y))


def f1_binary(predictions: Any, labels: Any, positive: int = 1) -> float:
    """F1 of the positive class: 2TP / (2TP + FP + FN); 0 when there are no positives at all
    (neither predicted nor gold), rather than an undefined 0/0."""
    p, y = _pair(predictions, labels, dtype=np.int64)
    tp = int(np.sum((p == positive) & (y == positive)))
    fp = int(np.sum((p == positive) & (y != positive)))
    fn = int(np.sum((p != positive) & (y == positive)))
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def matthews_corrcoef(predictions: Any, labels: Any) -> float:
    """Matthews correlation (multi-class form, reduces to the binary formula for 2 classes).

    With C the confusion matrix, c = trace(C), s = n items, p_k / t_k = predicted / true
    counts of class k: MCC = (c*s - sum p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)).
    A zero denominator (constant predictions or constant labels) gives 0, not NaN.
    """
    p, y = _pair(predictions, labels, dtype=np.int64)
    classes = np.union1d(p, y)
    p_idx = np.searchsorted(classes, p)
    y_idx = np.searchsorted(classes, y)
    k = classes.size
    s = float(p.size)
    c = float(np.sum(p_idx == y_idx))
    p_counts = np.bincount(p_idx, minlength=k).astype(np.float64)
    t_counts = np.bincount(y_idx, minlength=k).astype(np.float64)
    cov = c * s - float(p_counts @ t_counts)
    var_p = s * s - float(p_counts @ p_counts)
    var_t = s * s - float(t_counts @ t_counts)
    if var_p <= 0.0 or var_t <= 0.0:
        return 0.0
    return float(cov / np.sqrt(var_p * var_t))


def _pearson_arrays(x: np.ndarray, y: np.ndarray) -> float:
    xc = x - x.mean()
    yc = y - y.mean()
    denom = float(np.sqrt((xc @ xc) * (yc @ yc)))
    if denom == 0.0:
        return 0.0
    return float(np.clip((xc @ yc) / denom, -1.0, 1.0))


def pearson(predictions: Any, labels: Any) -> float:
    """Pearson correlation; 0 when either side is constant (zero variance)."""
    p, y = _pair(predictions, labels, dtype=np.float64)
    return _pearson_arrays(p, y)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks where tied values share the mean of the ranks they span."""
    n = x.size
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    cuts = np.flatnonzero(np.diff(xs) != 0) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    # positions start..end-1 (0-based) -> ranks start+1..end; their mean is (start+1+end)/2
    group_rank = (starts + 1 + ends) / 2.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(group_rank, ends - starts)
    return ranks


def spearman(predictions: Any, labels: Any) -> float:
    """Spearman correlation: Pearson of the average ranks (ties averaged); 0 if constant."""
    p, y = _pair(predictions, labels, dtype=np.float64)
    return _pearson_arrays(_average_ranks(p), _average_ranks(y))


METRICS: Mapping[str, Callable[[Any, Any], float]] = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_metrics(names: Iterable[str], predictions: Any, labels: Any) -> dict[str, float]:
    """Every named classification/regression metric on the same predictions and labels.

    SQuAD's ``exact``/``f1`` need the question set, not id arrays: use `squad_evaluate`.
    """
    out: dict[str, float] = {}
    for name in names:
        if name not in METRICS:
            raise FolnetError(
                f"unknown metric {name!r}: expected {choices(METRICS)} "
                "(SQuAD exact/f1 come from squad_evaluate)"
            )
        out[name] = METRICS[name](predictions, labels)
    return out


# ---------------------------------------------------------------------------------------------
# SQuAD 2.0

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLE = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation: lowercase, drop ASCII punctuation, drop the articles
    a/an/the as whole words, collapse runs of whitespace to one space (and strip)."""
    lowered = text.lower()
    no_punct = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLE.sub(" ", no_punct)
    return " ".join(no_articles.split())


def _gold_or_null(golds: Sequence[str]) -> list[str]:
    """Gold answers that survive normalisation; an unanswerable question has the single
    gold answer "" so that only an (effectively) empty prediction matches it."""
    kept = [g for g in golds if normalize_answer(g)]
    return kept or [""]


def _exact_one(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1_one(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # no-answer rule: an empty gold (or empty prediction) only matches emptiness
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_exact(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer; an empty gold list
    (unanswerable) scores 1 iff the prediction normalises to ""."""
    return max(_exact_one(prediction, g) for g in _gold_or_null(golds))


def squad_f1(prediction: str, golds: Sequence[str]) -> float:
    """Best token-overlap F1 over the gold answers (bag of normalised tokens)."""
    return max(_f1_one(prediction, g) for g in _gold_or_null(golds))


def _questions(dataset: Any) -> list[tuple[str, list[str]]]:
    """(qid, gold answer texts) pairs from a SQuAD JSON path/dict or parsed examples."""
    if isinstance(dataset, (str, Path)):
        path = Path(dataset)
        try:
            dataset = parse_json(path.read_text(encoding="utf-8"), str(path))
        except FileNotFoundError:
            raise FolnetError(f"SQuAD file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as exc:
            raise FolnetError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        except UnicodeDecodeError:
            raise FolnetError(f"{path}: not valid UTF-8; a SQuAD file is UTF-8 JSON") from None
    if isinstance(dataset, Mapping):
        if not isinstance(dataset.get("data"), list):
            raise FolnetError("SQuAD dataset JSON must have a top-level 'data' list")
        out = []
        for article in dataset["data"]:
            for paragraph in article.get("paragraphs", []):
                for qa in paragraph.get("qas", []):
                    impossible = bool(qa.get("is_impossible", False))
                    answers = [] if impossible else [a["text"] for a in qa.get("answers", [])]
                    out.append((str(qa["id"]), answers))
        return out
    out = []
    for ex in dataset:  # SquadExample-like: qid, answers (with .text), is_impossible
        answers = [] if ex.is_impossible else [a.text for a in ex.answers]
        out.append((str(ex.qid), answers))
    return out


def squad_evaluate(dataset: Any, predictions: Mapping[str, str]) -> dict[str, float]:
    """SQuAD 2.0 scores in percent: overall, answerable-only (HasAns) and unanswerable-only
    (NoAns), plus the question counts.

    ``dataset`` is a path to (or the parsed dict of) a SQuAD JSON file, or a sequence of
    `SquadExample`s. Every question needs a prediction and every prediction a question: a
    mismatch raises instead of silently changing the denominator.
    """
    questions = _questions(dataset)
    if not questions:
        raise FolnetError("squad_evaluate got a dataset with no questions")
    qids = {q for q, _ in questions}
    missing = [q for q, _ in questions if q not in predictions]
    if missing:
        raise FolnetError(
            f"no prediction for {len(missing)} of {len(questions)} questions, e.g. {missing[:3]!r}"
        )
    extra = [q for q in predictions if q not in qids]
    if extra:
        raise FolnetError(
            f"{len(extra)} predictions are for question ids not in the dataset, e.g. {extra[:3]!r}"
        )
    sums = {"has": [0.0, 0.0, 0], "no": [0.0, 0.0, 0]}
    for qid, golds in questions:
        pred = predictions[qid]
        bucket = sums["has" if golds else "no"]
        bucket[0] += squad_exact(pred, golds)
        bucket[1] += squad_f1(pred, golds)
        bucket[2] += 1

    def pct(total: float, count: int) -> float:
        return 100.0 * total / count if count else 0.0

    has, no = sums["has"], sums["no"]
    n = len(questions)
    return {
        "exact": pct(has[0] + no[0], n),
        "f1": pct(has[1] + no[1], n),
        "HasAns_exact": pct(has[0], int(has[2])),
        "HasAns_f1": pct(has[1], int(has[2])),
        "NoAns_exact": pct(no[0], int(no[2])),
        "NoAns_f1": pct(no[1], int(no[2])),
        "HasAns_total": float(has[2]),
        "NoAns_total": float(no[2]),
        "total": float(n),
    }
