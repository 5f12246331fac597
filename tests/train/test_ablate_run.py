"""`folnet ablate` end to end: two rows x two seeds at a few steps; the report's means,
spreads and intervals recomputed from the per-seed results; resume skips finished seeds."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from runs import tiny_plan

from folnet.cli import main as cli_main
from folnet.train.ablate.stats import accuracy_spread
from folnet.train.finetune.evaluate import read_predictions

pytestmark = pytest.mark.usefixtures("one_thread")

PLAN = tiny_plan("two", """
[[rows]]
ops = "j.a"

[[rows]]
ops = "jmc.atp"
D2 = 8
name = "full D2=8"
""", seeds=2, description="two rows, a few steps")


def _predictions(out, row, seed):
    """The per-question answers of one seed, read from its finetuning prediction file (not
    from the result files the report is built from)."""
    rows = read_predictions(out / "rows" / row / f"seed_{seed}" / "finetune" / "kinship"
                            / "predictions" / "test.tsv")
    return [(int(r["k"]), r["prediction"] == r["label"]) for r in rows]


@pytest.mark.slow
def test_two_rows_two_seeds_end_to_end_and_resume(tmp_path, capsys):
    plan = tmp_path / "two.toml"
    plan.write_text(PLAN)
    out = tmp_path / "out"
    assert cli_main(["ablate", str(plan), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    for name in ("results.md", "results.csv", "results.json", "results.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["ops"] for r in rows] == ["j.a", "jmc.atp"]
    assert rows[1]["D2"] == 8 and rows[0]["D2"] == 16  # the tiny preset's D2 unless overridden
    assert rows[1]["params"] > rows[0]["params"]
    for r, slug in zip(rows, ("j.a_RPE", "full_D2=8"), strict=True):
        assert r["num_seeds"] == 2 and [s["seed"] for s in r["seeds"]] == [0, 1]
        assert r["params"] > 0 and r["flops_per_token"] > 0 and r["tokens_per_s"]["mean"] > 0
        assert r["pretrain_steps"] == 3 and len(r["loss_curve"]) == 3
        # each seed is a whole run: its own pretraining (seed s) and finetuning (seed s)
        configs = [json.loads((out / "rows" / slug / f"seed_{s}" / "pretrain"
                               / "run_config.json").read_text()) for s in (0, 1)]
        assert [c["seed"] for c in configs] == [0, 1]
        losses = [s["final_loss"] for s in r["seeds"]]
        assert losses[0] != losses[1]
        assert r["final_loss"]["mean"] == pytest.approx(np.mean(losses), abs=1e-12)
        # every accuracy: mean and std over the seeds' own metrics, and the interval of the
        # two-level bootstrap recomputed from the prediction files
        answers = [_predictions(out, slug, s) for s in (0, 1)]
        kin = r["metrics"]["kinship"]
        subsets = {"accuracy": lambda k: True, "accuracy_seen": lambda k: k in (2, 3),
                   "accuracy_unseen": lambda k: k == 4,
                   **{f"accuracy_k{k}": (lambda k0: lambda k: k == k0)(k) for k in (2, 3, 4)}}
        assert set(kin) == set(subsets)
        for name, keep in subsets.items():
            per_seed = [[hit for k, hit in a if keep(k)] for a in answers]
            values = [s["metrics"]["kinship"][name] for s in r["seeds"]]
            assert values == pytest.approx([np.mean(h) for h in per_seed], abs=1e-12)
            spread = kin[name]
            assert spread["mean"] == pytest.approx(np.mean(values), abs=1e-12)
            assert spread["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-12)
            again = accuracy_spread(per_seed)
            assert (spread["low"], spread["high"]) == pytest.approx((again.low, again.high))
            assert spread["low"] <= spread["mean"] <= spread["high"]
    md = (out / "results.md").read_text()
    assert "| 1 | FOLNet: j.a |" in md and "| 2 | FOLNet: jmc.atp |" in md
    assert "Differences between rows" in md and "2 seed(s) per row" in md
    first = rows[0]["metrics"]["kinship"]["accuracy_seen"]
    assert f"{first['mean']:.3f} ± {first['std']:.3f} [{first['low']:.3f}, " in md
    assert "FOLNet: jmc.atp" in printed
    with (out / "results.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [t["ops"] for t in table] == ["j.a", "jmc.atp"]
    for t, r in zip(table, rows, strict=True):
        for part in ("mean", "std", "low", "high"):
            assert float(t[f"kinship/accuracy_k3/{part}"]) == pytest.approx(
                r["metrics"]["kinship"]["accuracy_k3"][part])

    # An interrupted run resumes: finished seeds are skipped, an unfinished one is redone.
    seed0 = out / "rows" / "full_D2=8" / "seed_0"
    stamp = (seed0 / "result.json").stat().st_mtime_ns
    (out / "rows" / "full_D2=8" / "result.json").unlink()
    (out / "rows" / "full_D2=8" / "seed_1" / "result.json").unlink()
    assert cli_main(["ablate", str(plan), "--out", str(out), "--no-progress"]) == 0
    again = capsys.readouterr().out
    assert "[j.a RPE] finished earlier" in again
    assert "[full D2=8] seed 0 finished earlier" in again
    assert "[full D2=8] seed 1 finished earlier" not in again
    assert "[full D2=8] seed 1: pretraining" not in again  # its pretraining had finished
    assert (seed0 / "result.json").stat().st_mtime_ns == stamp
    rows_again = json.loads((out / "results.json").read_text())["rows"]
    assert [r["num_seeds"] for r in rows_again] == [2, 2]
    assert rows_again[1]["metrics"] == rows[1]["metrics"]  # same seeds, same answers

    # The same directory with a different plan is refused.
    other = tmp_path / "other.toml"
    other.write_text(PLAN.replace("steps = 3", "steps = 4"))
    assert cli_main(["ablate", str(other), "--out", str(out)]) == 2
    assert "holds a run of a different plan" in capsys.readouterr().err
