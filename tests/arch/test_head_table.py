"""A head of one's own (`folnet.arch.register_head`) lives in the one table of heads
(`folnet.arch.head_table.HEADS`) and nothing else: it saves, loads and finetunes like a
built-in one, and a finetuned classifier's label names reach config.json's ``id2label``.

Before: heads lived in four tables (arch/heads.py, io/model_dir.py's HF class names,
finetune/warm_start.py's task heads, finetune/data.py's task head), and ``save_pretrained`` of a
registered head raised KeyError ('encoder', 'myhead') with a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from runs import tiny_pretrained_run, write
from torch import nn

import folnet
from folnet.arch import Head, register_head, unregister_head
from folnet.arch.head_table import HEADS, head_for_task, hf_class, task_heads
from folnet.arch.heads import classification_loss
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.finetune.warm_start import load_finetuned

pytestmark = pytest.mark.usefixtures("one_thread")


class MeanPool(Head):
    """Classifies the mean of the token states (the built-in head reads the pooled [CLS])."""

    name = "mean-pool"
    task_head = True
    task_kinds = ("classification",)

    def build(self, cfg, num_labels, word):
        return {"scorer": nn.Linear(cfg.D1, num_labels)}

    def forward(self, model, out, targets):
        out.logits = model.scorer(out.sequence_output.mean(dim=1))  # (B, T, D1) -> (B, C)
        return [] if targets.labels is None else [classification_loss(out.logits,
                                                                      targets.labels)]


@pytest.fixture
def mean_pool() -> Iterator[MeanPool]:
    head = register_head(MeanPool())
    yield head
    if "mean-pool" in HEADS:
        unregister_head("mean-pool")


def test_a_registered_head_saves_and_loads(tmp_path, mean_pool):
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", L=1, vocab_size=64, head="mean-pool",
                               num_labels=3).eval()
    ids = torch.randint(5, 64, (2, 9))
    want = model(input_ids=ids).logits
    assert want.shape == (2, 3) and float(want.detach().abs().sum()) > 0
    model.save_pretrained(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["head"] == "mean-pool" and "architectures" not in meta  # no folnet.hf class
    assert hf_class("encoder", "mean-pool") is None
    assert hf_class("encoder", "classification") == "FolnetForSequenceClassification"

    unregister_head("mean-pool")  # as a new process that has not registered it
    with pytest.raises(FolnetError, match=r"head 'mean-pool' is unknown: no head of that name "
                                          r"is registered.*register_head"):
        folnet.from_pretrained(tmp_path / "m")
    register_head(MeanPool())
    again = folnet.from_pretrained(tmp_path / "m").eval()
    assert again.head == "mean-pool"
    torch.testing.assert_close(again(input_ids=ids).logits, want, rtol=0, atol=0)


def test_a_registered_head_finetunes_and_label_names_reach_id2label(tmp_path, mean_pool):
    texts = ["the cat sat on the mat", "a dog runs in the park", "it rains in the city",
             "the man reads a book"]
    run = tiny_pretrained_run(tmp_path / "pre", texts, vocab_size=120)
    labels = ("entailment", "not_entailment")
    rows = ["index\tsentence1\tsentence2\tlabel"]
    rows += [f"{i}\t{texts[i % 4]}\t{texts[(i + 1) % 4]}\t{labels[i % 2]}" for i in range(8)]
    write(tmp_path / "RTE" / "train.tsv", "\n".join(rows) + "\n")
    write(tmp_path / "RTE" / "dev.tsv", "\n".join(rows[:5]) + "\n")
    assert head_for_task("classification") == "mean-pool"  # the last registered claims it
    assert "mean-pool" in task_heads()
    out = tmp_path / "out"
    assert main(["finetune", "--task", "glue/rte", "--from", str(run), "--data",
                 str(tmp_path / "RTE"), "--out", str(out), "--epochs", "1", "--batch-size",
                 "4", "--no-progress", "--no-tensorboard"]) == 0
    meta = json.loads((out / "model" / "config.json").read_text())
    assert meta["head"] == "mean-pool"
    assert meta["id2label"] == {"0": "entailment", "1": "not_entailment"}
    assert meta["label2id"] == {"entailment": 0, "not_entailment": 1}
    model, _, _ = load_finetuned(out)
    assert model.head == "mean-pool" and model.scorer.out_features == 2

    unregister_head("mean-pool")  # the built-in head takes the kind back
    assert head_for_task("classification") == "classification"
    with pytest.raises(FolnetError, match="head 'mean-pool', which is not registered"):
        load_finetuned(out)


class _Bad(Head):
    name = "bad"


@pytest.mark.parametrize(("attribute", "value", "message"), [
    ("name", "", "head name '': must be a non-empty string"),
    ("kinds", ("encoder", "mixer"), r"head 'bad': kinds \('encoder', 'mixer'\) must be"),
    ("hf_classes", {"decoder": "FolnetForCausalLM"}, "hf_classes .* must map kinds of the head"),
    ("task_kinds", ("classification",), "task_kinds .* needs task_head = True"),
])
def test_a_head_whose_entry_cannot_be_read_is_refused(attribute, value, message):
    head = _Bad()
    setattr(head, attribute, value)
    with pytest.raises(FolnetError, match=message):
        register_head(head)
    assert "bad" not in HEADS and "" not in HEADS
    with pytest.raises(FolnetError, match="'classification' is built in"):
        unregister_head("classification")
    with pytest.raises(FolnetError, match="head 'bad' is not registered"):
        unregister_head("bad")


def test_the_table_is_the_only_list_of_heads():
    """No module keeps its own list of head names (the four tables there were before)."""
    root = Path(folnet.__file__).parent
    for stale in ("HF_CLASSES", "TASK_HEADS"):
        holders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                   if re.search(rf"\b{stale}\b", p.read_text(encoding="utf-8"))]
        assert holders == [], (stale, holders)
