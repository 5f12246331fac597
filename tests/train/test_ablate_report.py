"""The ablation report on constructed rows: which differences it marks, and what it says."""

from __future__ import annotations

import numpy as np
import pytest

from folnet.train.ablate.report import csv_text, markdown_table, significance_text
from folnet.train.ablate.summary import compare_rows, question_hits, summarise_row

KS = [2, 3, 4, 5]
QUESTIONS = 300  # per k


def _seed(name: str, seed: int, accuracy_by_k: dict[int, float], rng) -> dict:
    """A seed result like `folnet.train.ablate.run` writes, its answers drawn at the given
    accuracy per chain length."""
    ks = [k for k in KS for _ in range(QUESTIONS)]
    correct = [int(rng.random() < accuracy_by_k[k]) for k in ks]
    answers = {"correct": correct, "k": ks, "train_k": [2, 3]}
    metrics = {n: float(np.mean(h)) for n, h in question_hits(answers).items()}
    return {"name": name, "ops": "j.a", "position": "rpe", "D2": 16, "loss": "MLM.NSP",
            "paper": {}, "params": 1000, "flops_per_token": 1e6, "pretrain_steps": 10,
            "seed": seed, "tokens_per_s": 100.0 + seed, "mlm_loss": 2.0 + 0.1 * seed,
            "final_loss": 2.5, "loss_curve": [[1, 3.0 + seed], [2, 2.0]],
            "metrics": {"kinship": metrics}, "baselines": {"kinship": {"majority_baseline": 0.05}},
            "answers": {"kinship": answers}, "finetune_curves": {"kinship": [[5, 1.0]]}}


def _row(name: str, accuracy_by_k: dict[int, float], *, seeds: int = 3, jitter: float = 0.0,
         seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    results = []
    for s in range(seeds):
        shift = jitter * (s - (seeds - 1) / 2)
        results.append(_seed(name, s, {k: min(1.0, max(0.0, a + shift))
                                         for k, a in accuracy_by_k.items()}, rng))
    return summarise_row(results)


FAR_A = {2: 0.95, 3: 0.9, 4: 0.6, 5: 0.4}
FAR_B = {2: 0.6, 3: 0.5, 4: 0.3, 5: 0.2}


def test_summary_of_a_row():
    row = _row("a", FAR_A)
    assert row["num_seeds"] == 3 and len(row["seeds"]) == 3
    seen = row["metrics"]["kinship"]["accuracy_seen"]
    per_seed = [s["metrics"]["kinship"]["accuracy_seen"] for s in row["seeds"]]
    assert seen["mean"] == pytest.approx(np.mean(per_seed))
    assert seen["std"] == pytest.approx(np.std(per_seed, ddof=1))
    assert seen["low"] < seen["mean"] < seen["high"]
    assert set(row["metrics"]["kinship"]) == {"accuracy", "accuracy_seen", "accuracy_unseen",
                                              *(f"accuracy_k{k}" for k in KS)}
    assert row["mlm_loss"]["mean"] == pytest.approx(2.1)
    assert row["loss_curve"] == [[1, 4.0], [2, 2.0]]  # mean over seeds, step by step


def test_far_apart_rows_are_marked_and_said_so():
    rows = [_row("strong", FAR_A, seed=1), _row("weak", FAR_B, seed=2)]
    text = significance_text(rows)
    for metric, expected in (("accuracy_seen", 0.375), ("accuracy_unseen", 0.25)):
        (diff,) = compare_rows(rows, "kinship", metric)
        assert diff.real and diff.better == "strong" and diff.worse == "weak"
        assert diff.low > 0 and diff.low < diff.diff < diff.high
        assert diff.diff == pytest.approx(expected, abs=0.05)
        assert (f"- strong is above weak by {diff.diff:+.3f} (95% interval [{diff.low:+.3f}, "
                f"{diff.high:+.3f}]): beyond the spread.") in text
    assert "no difference between rows exceeds the spread" not in text
    assert text in markdown_table(rows)


def test_rows_within_noise_are_not_marked_and_said_so():
    close = {k: a + 0.005 for k, a in FAR_A.items()}
    rows = [_row("one", FAR_A, seed=3), _row("two", close, seed=4)]
    for metric in ("accuracy_seen", "accuracy_unseen"):
        (diff,) = compare_rows(rows, "kinship", metric)
        assert not diff.real and diff.low < 0 < diff.high
    text = significance_text(rows)
    assert "beyond the spread" not in text
    assert text.count("no difference between rows exceeds the spread") == 2
    assert "within the spread" in text


def test_seed_noise_counts():
    """The same mean gap, but seeds that scatter by +-15 points: not marked."""
    shifted = {k: a - 0.08 for k, a in FAR_A.items()}
    steady = [_row("x", FAR_A, seed=5), _row("y", shifted, seed=6)]
    noisy = [_row("x", FAR_A, jitter=0.15, seed=5), _row("y", shifted, jitter=0.15, seed=6)]
    assert compare_rows(steady, "kinship", "accuracy_seen")[0].real
    assert not compare_rows(noisy, "kinship", "accuracy_seen")[0].real


def test_tables_show_mean_std_and_interval():
    rows = [_row("strong", FAR_A, seed=1), _row("weak", FAR_B, seed=2)]
    md = markdown_table(rows, title="t")
    s = rows[0]["metrics"]["kinship"]["accuracy_unseen"]
    assert f"{s['mean']:.3f} ± {s['std']:.3f} [{s['low']:.3f}, {s['high']:.3f}]" in md
    assert "| k=2 | k=3 | k=4 | k=5 |" in md
    m = rows[0]["mlm_loss"]
    assert f"{m['mean']:.3f} ± {m['std']:.3f} [{m['low']:.3f}, {m['high']:.3f}]" in md
    assert f"| {rows[0]['tokens_per_s']['mean']:.0f} ± 1 |" in md  # 100, 101, 102 tokens/s
    header, first, _ = csv_text(rows).splitlines()
    columns = header.split(",")
    values = dict(zip(columns, first.split(","), strict=True))
    assert float(values["kinship/accuracy_unseen/high"]) == pytest.approx(s["high"])
    assert float(values["tokens_per_s/mean"]) == pytest.approx(101.0)


def test_distance_from_the_majority_class_in_standard_errors():
    rows = [_row("strong", FAR_A, seed=1), _row("weak", FAR_B, seed=2)]
    for r in rows:  # the constructed seeds carry one overall baseline; add the seen one
        r["baselines"]["kinship"]["majority_baseline_seen"] = 0.1
    text = significance_text(rows)
    s = rows[1]["metrics"]["kinship"]["accuracy_seen"]
    z = (s["mean"] - 0.1) / ((s["high"] - s["low"]) / (2 * 1.96))
    assert z > 3
    assert "Above the majority class (0.100) on kinship accuracy_seen: strong " in text
    assert f"weak {z:.0f} SE." in text
