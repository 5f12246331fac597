"""`folnet ablate` across kinds: a decoder row (loss CLM) and an encoder-decoder row (loss SPAN)
pretrained and finetuned on the kinship questions answered by generation, end to end at a few
steps; each row's runs are of its kind, and the report's accuracies are the prediction
files'."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from runs import tiny_plan

import folnet
from folnet.arch import from_pretrained, read_metadata
from folnet.cli import main as cli_main
from folnet.train.finetune.evaluate import read_predictions

pytestmark = pytest.mark.usefixtures("one_thread")

PLAN = tiny_plan("kinds", """
[[rows]]
ops = "j.a"
loss = "CLM"

[[rows]]
ops = "j.a"
loss = "SPAN"
""", seeds=2, description="both generative kinds").replace('tasks = ["kinship"]',
                                                            'tasks = ["kinship/generate"]')


@pytest.mark.slow(seconds=40)
def test_a_decoder_row_and_an_encoder_decoder_row_end_to_end(tmp_path):
    plan = tmp_path / "kinds.toml"
    plan.write_text(PLAN)
    out = tmp_path / "out"
    assert cli_main(["ablate", str(plan), "--out", str(out), "--no-progress"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["name"], r["loss"]) for r in rows] == [("j.a RPE CLM", "CLM"),
                                                     ("j.a RPE SPAN", "SPAN")]
    for r, slug, kind in zip(rows, ("j.a_RPE_CLM", "j.a_RPE_SPAN"),
                             ("decoder", "encoder-decoder"), strict=True):
        assert r["num_seeds"] == 2 and r["final_loss"]["mean"] > 0
        accuracies = []
        for seed in (0, 1):
            run = out / "rows" / slug / f"seed_{seed}"
            config = json.loads((run / "pretrain" / "run_config.json").read_text())
            assert config["kind"] == kind
            assert config["objective"] == ("clm" if kind == "decoder" else "span")
            meta = json.loads((run / "finetune" / "kinship-generate" / "model"
                               / "config.json").read_text())
            assert meta["kind"] == kind and meta["task"] == "kinship/generate"
            said = read_predictions(run / "finetune" / "kinship-generate" / "predictions"
                                    / "test.tsv")
            assert {s["k"] for s in said} == {"2", "3", "4"}
            accuracies.append(np.mean([s["prediction"] == s["label"] for s in said]))
        spread = r["metrics"]["kinship/generate"]["accuracy"]
        assert spread["mean"] == pytest.approx(np.mean(accuracies), abs=1e-12)
    report = (out / "results.md").read_text()
    assert "| CLM |" in report and "| SPAN |" in report


@pytest.mark.slow(seconds=30)
def test_a_decoder_row_pretrained_against_scratch(tmp_path):
    """The [compare] arms for a decoder: scratch is the decoder's initialisation, both arms
    answer the same questions, and the report gives the pretraining gain."""
    plan = tmp_path / "arms.toml"
    plan.write_text(tiny_plan("arms", """
[[rows]]
ops = "j.a"
loss = "CLM"

[compare]
scratch_steps = 1
""").replace('tasks = ["kinship"]', 'tasks = ["kinship/generate"]'))
    out = tmp_path / "out"
    assert cli_main(["ablate", str(plan), "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "results.json").read_text())
    (row,) = report["rows"]
    assert [(c["arm"], c["pretrain_steps"]) for c in row["cells"]] == [("pretrained", 3),
                                                                        ("scratch", 1)]
    assert {g["metric"] for g in report["gains"] if g["row"] == row["name"]} >= {
        "accuracy_seen", "accuracy_unseen"}
    seed = out / "rows" / "j.a_RPE_CLM" / "seed_0"
    ids = [[r["id"] for r in read_predictions(seed / "cells" / arm / "finetune"
                                              / "kinship-generate" / "predictions" / "test.tsv")]
           for arm in ("pretrained", "scratch")]
    assert ids[0] == ids[1] and len(ids[0]) == 12
    torch.manual_seed(0)
    vocab = read_metadata(seed / "scratch" / "final")["model"]["vocab_size"]
    init = folnet.build_model("j.a", preset="tiny", kind="decoder",
                              vocab_size=vocab).state_dict()
    scratch = from_pretrained(seed / "scratch" / "final").state_dict()
    assert init.keys() == scratch.keys() and all(torch.equal(init[k], scratch[k]) for k in init)
