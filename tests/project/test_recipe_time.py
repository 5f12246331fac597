"""The quick start's time, stated in five places, is one measurement's: every place says the
minutes that docs/figures/kinship_recipe.json (benchmarks/recipe_time.py) gives, rounded, and
the README and the quick start page name the machine it was measured on."""

from __future__ import annotations

import json
import re

import pytest
from paths import ROOT

RECORD = ROOT / "docs" / "figures" / "kinship_recipe.json"
#: Where the README and the quick start page state both runs' times.
BOTH = re.compile(r"pretraining ~(\d+) minutes.*?finetuning ~(\d+) minutes", re.S)


def _record() -> dict:
    return json.loads(RECORD.read_text())


def measured() -> tuple[int, int]:
    """The pretraining's and the finetuning's minutes, as the places state them."""
    record = _record()
    return (round(record["pretrain"]["estimate_minutes"]),
            round(record["finetune"]["estimate_minutes"]))


def _minutes(path: str, anchor: str) -> int:
    """The ``~N minutes`` within the comment lines around ``anchor`` in ``path``."""
    text = (ROOT / path).read_text()
    at = text.index(anchor)
    comment = text[text.rfind("\n\n", 0, at) + 1:text.find("\n\n", at)]
    found = re.findall(r"~(\d+) minutes", comment)
    assert len(found) == 1, f"{path}: {found} near {anchor!r}"
    return int(found[0])


def test_the_record_measures_the_shipped_configs_on_a_named_machine():
    record = _record()
    assert record["pretrain"]["config_steps"] == 800
    assert record["finetune"]["config_steps"] == 1000
    assert record["machine"]["cpu_model"] and record["machine"]["vector_isa"]


@pytest.mark.parametrize(("path", "anchor", "run"), [
    ("Makefile", "kinship-fixture:", 0),
    ("folnet/specs/train/kinship-tiny.toml", "A laptop-sized pretraining", 0),
    ("folnet/specs/train/kinship-finetune.toml", "Finetuning on the kinship", 1),
])
def test_each_comment_states_the_measured_minutes(path, anchor, run):
    assert _minutes(path, anchor) == measured()[run], path


@pytest.mark.parametrize("path", ["README.md", "docs/getting-started/quickstart.md"])
def test_the_quick_start_states_both_times_and_the_machine(path):
    text = (ROOT / path).read_text()
    found = BOTH.findall(text)
    assert len(found) == 1, f"{path}: {found}"
    assert tuple(int(m) for m in found[0]) == measured(), path
    machine = _record()["machine"]
    at = BOTH.search(text)
    sentence = text[at.start():text.find("\n\n", at.end())]
    for fact in (machine["cpu_model"], machine["vector_isa"], f"{machine['cores']} cores"):
        assert fact in sentence, f"{path}: {fact!r} not in {sentence!r}"
