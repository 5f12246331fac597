"""The scripts of examples/ run: each one, as a user runs it (``python examples/NAME.py``),
from a folder outside the checkout, at the small sizes its own options allow. A script added
to examples/ without a line here fails `test_every_example_is_run`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from paths import ROOT

EXAMPLES = ROOT / "examples"

#: Each script and the options that keep it small here (its defaults are the real recipe).
RUNS = {
    "three_kinds.py": ([], ["saved and loaded: jmc.atp, the same outputs"]),
    "custom_operator.py": ([], ["registered q (bprod, B <- B x U)",
                                "reloaded j.aq without registering q: the same logits"]),
    "pretrain_finetune.py": (["--out", "runs", "--pretrain-steps", "2", "--finetune-steps",
                              "2", "--documents", "40", "--train-size", "16",
                              "--test-per-k", "2"],
                             ["pretrained j.at (tiny preset) for 2 steps", "k = 10"]),
    "decoder_text.py": (["--out", "runs", "--steps", "2", "--documents", "40", "--new-tokens",
                         "4"], ["pretrained a jmc.atp decoder for 2 steps",
                                "Judith is the daughter of|"]),
    "hf_trainer.py": (["--steps", "3"], ["FolnetForSequenceClassification over jmc.atp",
                                         "'eval_accuracy'"]),
}

pytestmark = pytest.mark.slow(seconds=30)


def test_every_example_is_run():
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == set(RUNS), f"examples/ and RUNS differ: {scripts ^ set(RUNS)}"


@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_example_runs(script, tmp_path):
    args, expected = RUNS[script]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    for text in expected:
        assert text in done.stdout, f"{script} did not print {text!r}:\n{done.stdout[-3000:]}"
