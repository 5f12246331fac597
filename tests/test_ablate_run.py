"""`folnet ablate` end to end: a two-row plan at a few steps; outputs; resume skips rows."""

from __future__ import annotations

import csv
import json

import pytest

from folnet.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")

PLAN = """
name = "two"
description = "two rows, a few steps"
data = "kinship"
tasks = ["kinship"]
seeds = 1

[pretrain]
preset = "tiny"
steps = 3
kinship_documents = 30
vocab_size = 300
seq_len = 32
batch_size = 4
log_every = 1
save_every = 100
keep_last = 1

[finetune]
max_steps = 3
batch_size = 8
kinship_train_size = 24
kinship_test_per_k = 4
kinship_test_k = [2, 3, 4]
eval_batch_size = 16

[[rows]]
ops = "j.a"

[[rows]]
ops = "jmc.atp"
D2 = 8
name = "full D2=8"
"""


def test_two_row_plan_end_to_end_and_resume(tmp_path, capsys):
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
    for r in rows:
        assert r["params"] > 0 and r["flops_per_token"] > 0 and r["tokens_per_s"] > 0
        assert r["pretrain_steps"] == 3 and len(r["loss_curve"]) == 3
        kin = r["metrics"]["kinship"]
        assert kin and all(0.0 <= v <= 1.0 for v in kin.values())
    assert rows[1]["params"] > rows[0]["params"]
    md = (out / "results.md").read_text()
    assert "| 1 | FOLNet: j.a |" in md and "| 2 | FOLNet: jmc.atp |" in md
    assert "FOLNet: jmc.atp" in printed
    with (out / "results.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [t["ops"] for t in table] == ["j.a", "jmc.atp"]

    # An interrupted run resumes: finished rows are skipped, an unfinished one is redone.
    (out / "rows" / "full_D2=8" / "result.json").unlink()
    assert cli_main(["ablate", str(plan), "--out", str(out), "--no-progress"]) == 0
    again = capsys.readouterr().out
    assert "[j.a RPE] finished earlier" in again
    assert "[full D2=8] finished earlier" not in again
    assert len(json.loads((out / "results.json").read_text())["rows"]) == 2

    # The same directory with a different plan is refused.
    other = tmp_path / "other.toml"
    other.write_text(PLAN.replace("steps = 3", "steps = 4"))
    assert cli_main(["ablate", str(other), "--out", str(out)]) == 2
    assert "holds a run of a different plan" in capsys.readouterr().err
