"""The non-finite guard: NaN and inf are noticed, in pretraining and
finetuning.

A step whose loss or gradient norm is not finite is skipped (no update) and counted; a few in
a row stop the run with exit status 1 and a one-line message naming the step, the loss and the
likely cause; no checkpoint or final model with a non-finite tensor is ever written. Before the
guard, ``--lr 1e6`` logged null losses, saved NaN weights and exited 0; with fp16 the loss
scaler skipped every step silently.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from models import tiny_model
from paths import ROOT
from runs import tiny_pretrained_run
from safetensors.torch import load_file
from torch import nn

import folnet
import folnet.train.finetune.cli  # registers the finetune command
from folnet.cli import main
from folnet.train.data.tokenizer import train_tokenizer
from folnet.train.engine.runlog import read_log
from folnet.train.pretrain.loop import PretrainingForward

pytestmark = pytest.mark.usefixtures("one_thread")

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}
# The ARGS, with 10 steps logged at every step.
ARGS = ["--ops", "j.a", "--preset", "tiny", "--data", "kinship", "--kinship-documents", "200",
        "--vocab-size", "300", "--seq-len", "32", "--batch-size", "4", "--steps", "10",
        "--save-every", "5", "--keep-last", "3", "--log-every", "1", "--seed", "1",
        "--no-progress", "--no-tensorboard"]
ORIGINAL_FORWARD = PretrainingForward.forward
DIVERGE = ["--lr", "1e6", "--warmup-ratio", "0", "--optimizer", "adamw"]


def saved_tensors(out: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``model.safetensors`` under ``out``, keyed by file and name."""
    found = {}
    for path in sorted(out.rglob("*.safetensors")):
        for name, tensor in load_file(str(path)).items():
            found[f"{path.relative_to(out)}:{name}"] = tensor
    return found


def non_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, t in tensors.items() if t.is_floating_point() and not t.isfinite().all()]


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if ": error:" in line]


# -- pretraining ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_pretrain_divergence_stops_with_exit_1_and_saves_nothing_non_finite(tmp_path):
    """The issue's reproduction, through the real command: exit 1, one line, no NaN saved."""
    out = tmp_path / "X"
    done = subprocess.run([sys.executable, "-m", "folnet", "pretrain", *ARGS, *DIVERGE,
                           "--save-every", "1", "--out", str(out)],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = error_lines(done.stderr)
    assert line.startswith("folnet pretrain: error: pretraining stopped at step ")
    assert "loss nan" in line and "learning rate" in line and "--max-bad-steps 3" in line
    assert "done:" not in done.stdout
    assert "skipped" in done.stdout  # each skipped step is reported as it happens
    assert not (out / "final").exists()
    tensors = saved_tensors(out)
    assert tensors, "the checkpoints written before the divergence are kept"
    assert non_finite(tensors) == []
    # The log counts the skipped steps and holds no loss of a skipped step.
    records = read_log(out / "log.jsonl")
    assert records[-1]["skipped"] == 2 and records[0]["skipped"] == 0
    assert [r["loss"] is None for r in records][-2:] == [True, True]


def test_pretrain_fp16_overflow_stops_instead_of_saving_untrained_weights(tmp_path, capsys):
    out = tmp_path / "X"
    assert main(["pretrain", *ARGS, *DIVERGE, "--precision", "fp16", "--out", str(out)]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert "pretraining stopped at step" in line and "fp16" in line
    assert not (out / "final").exists()
    assert non_finite(saved_tensors(out)) == []


def nan_once(bad: int):
    """A replacement of ``PretrainingForward.forward`` whose call number ``bad`` (1-based)
    returns a NaN MLM loss (its gradients NaN too); 0 never does."""
    original, calls = ORIGINAL_FORWARD, [0]

    def forward(module, *args, **kwargs):
        calls[0] += 1
        mlm_sum, *rest = original(module, *args, **kwargs)
        if calls[0] == bad:
            mlm_sum = mlm_sum * float("nan")
        return (mlm_sum, *rest)

    return forward


def count_optimizer_steps() -> tuple[list[int], object]:
    steps: list[int] = []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: steps.append(1))
    return steps, handle


def test_pretrain_isolated_nan_step_is_skipped_and_counted(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(PretrainingForward, "forward", nan_once(bad=3))
    steps, handle = count_optimizer_steps()
    out = tmp_path / "run"
    try:
        assert main(["pretrain", *ARGS, "--optimizer", "adamw", "--out", str(out)]) == 0
    finally:
        handle.remove()
    assert len(steps) == 9, "the NaN step must not update the weights"
    text = capsys.readouterr().out
    assert "step 3 skipped: loss nan" in text and "done: 10 steps" in text
    records = read_log(out / "log.jsonl")
    assert [r["skipped"] for r in records] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert records[2]["loss"] is None and all(r["loss"] is not None for r in records[3:])
    tensors = saved_tensors(out)
    assert any(k.startswith("final") for k in tensors) and non_finite(tensors) == []


def test_one_allowed_bad_step_stops_at_the_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(PretrainingForward, "forward", nan_once(bad=2))
    out = tmp_path / "run"
    assert main(["pretrain", *ARGS, "--max-bad-steps", "1", "--out", str(out)]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert "stopped at step 2: loss nan" in line and "--max-bad-steps 1" in line
    capsys.readouterr()
    assert main(["pretrain", *ARGS, "--max-bad-steps", "0", "--out", str(out)]) == 2
    assert "--max-bad-steps must be >= 1, got 0" in capsys.readouterr().err


def test_skip_counts_survive_an_exact_resume(tmp_path, monkeypatch):
    """A run with a skipped step, stopped at a checkpoint and extended, equals one that ran
    straight through: same weights, same losses, the same skip count in the log."""
    common = [*ARGS, "--schedule", "constant", "--warmup-ratio", "0", "--save-every", "4",
              "--deterministic", "--seed", "2"]
    monkeypatch.setattr(PretrainingForward, "forward", nan_once(bad=3))
    assert main(["pretrain", *common, "--steps", "6", "--out", str(tmp_path / "ref")]) == 0
    monkeypatch.setattr(PretrainingForward, "forward", nan_once(bad=3))
    assert main(["pretrain", *common, "--steps", "4", "--out", str(tmp_path / "run")]) == 0
    monkeypatch.setattr(PretrainingForward, "forward", nan_once(bad=0))
    assert main(["pretrain", *common, "--steps", "6", "--resume", "latest",
                 "--out", str(tmp_path / "run")]) == 0
    ref, run = (load_file(str(tmp_path / d / "final" / "model.safetensors"))
                for d in ("ref", "run"))
    assert all(torch.equal(ref[k], run[k]) for k in ref)
    ref_log, run_log = (read_log(tmp_path / d / "log.jsonl") for d in ("ref", "run"))
    assert [r["loss"] for r in run_log] == [r["loss"] for r in ref_log]
    assert [r["skipped"] for r in run_log] == [0, 0, 1, 1, 1, 1]


@pytest.mark.slow
def test_two_processes_stop_together(tmp_path):
    """Under DDP every rank judges the same global loss and norm: both stop at the same step
    with exit status 1 (none waits forever for the other), keeping only finite checkpoints."""
    import socket

    from folnet.train.data.kinship import pretraining_documents

    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    train_tokenizer(texts=texts, vocab_size=300).save(tmp_path / "tok")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "X"
    args = [a for a in ARGS if a not in ("--vocab-size", "300")]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(port), "-m",
         "folnet.train.pretrain", *args, *DIVERGE, "--tokenizer", str(tmp_path / "tok"),
         "--save-every", "1", "--out", str(out)],
        env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    # each rank says it (their lines may interleave on the shared stderr), at the same step
    stops = re.findall(r"folnet pretrain: error: pretraining stopped at step (\d+)", done.stderr)
    assert len(stops) == 2 and stops[0] == stops[1], done.stderr[-3000:]
    assert not (out / "final").exists()
    tensors = saved_tensors(out)
    assert tensors and non_finite(tensors) == []


# -- the weights check ---------------------------------------------------------------------------


def _pretraining_model() -> nn.Module:
    return tiny_model("j.a", head="pretraining", vocab_size=50, dropout=None)


def test_non_finite_weights_are_never_written(tmp_path):
    from folnet.errors import FolnetError, NonFiniteError
    from folnet.train.engine.guard import check_finite_weights
    from folnet.train.engine.state import publish_final, write_model_fn

    model = _pretraining_model()
    check_finite_weights(model, "the model")  # a fresh model passes
    name, param = next(iter(model.named_parameters()))
    with torch.no_grad():
        param.view(-1)[3] = float("inf")
    with pytest.raises(NonFiniteError, match=f"1 of .* floating tensors .*{name}"):
        check_finite_weights(model, "the model")
    assert issubclass(NonFiniteError, FolnetError)
    with pytest.raises(NonFiniteError, match="final model"):
        publish_final(tmp_path, write_model_fn(model, model, {}, False, what="the final model"),
                      tokenizer=None)
    assert list(tmp_path.iterdir()) == []


# -- finetuning ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny pretraining run directory (RUN/final) and a few rows of RTE."""
    texts = ["the cat sat on the mat", "a dog runs in the park", "it rains in the city",
             "the man reads a book"]
    run = tiny_pretrained_run(tmp_path_factory.mktemp("pretrain"), texts, vocab_size=120)
    rows = ["index\tsentence1\tsentence2\tlabel"] + [
        f"{i}\t{texts[i % 4]}\t{texts[(i + 1) % 4]}\t{('entailment', 'not_entailment')[i % 2]}"
        for i in range(16)]
    (run / "RTE").mkdir()
    (run / "RTE" / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (run / "RTE" / "dev.tsv").write_text("\n".join(rows[:7]) + "\n", encoding="utf-8")
    return run


def finetune_args(pretrained: Path, out: Path, *extra: str) -> list[str]:
    return ["finetune", "--task", "glue/rte", "--data", str(pretrained / "RTE"), "--from",
            str(pretrained), "--out", str(out), "--epochs", "3", "--batch-size", "2",
            "--no-progress", "--no-tensorboard", "--log-every", "1", "--eval-batch-size", "8",
            *extra]


def test_finetune_divergence_stops_with_exit_1_and_writes_no_weights(tmp_path, pretrained,
                                                                     capsys):
    out = tmp_path / "out"
    assert main(finetune_args(pretrained, out, "--lr", "1e6", "--warmup-ratio", "0")) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith("folnet finetune: error: finetuning stopped at step ")
    assert "learning rate" in line
    assert not (out / "eval.json").exists() and not (out / "model").exists()
    assert non_finite(saved_tensors(out)) == []


def test_finetune_skipped_step_leaves_the_weights_unchanged():
    from folnet.train.finetune.loop import LoopSettings, finetune_model

    class NanLoss(nn.Module):
        """A linear regression whose loss is NaN on the batches marked bad."""

        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, input_ids, labels, bad):
            loss = (self.linear(input_ids.float()).squeeze(-1) - labels).pow(2).mean()
            return type("Out", (), {"loss": loss * (float("nan") if bool(bad.any()) else 1.0)})

    data = [{"input_ids": torch.ones(2, 3), "labels": torch.zeros(2),
             "bad": torch.tensor([i == 1, i == 1])} for i in range(3)]
    model = NanLoss()
    seen: list[dict[str, torch.Tensor]] = []

    def batches(epoch):
        for batch in data:
            seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            yield batch

    summary = finetune_model(model, batches, 3, epochs=1, settings=LoopSettings(
        lr=0.1, warmup_ratio=0.0, log_every=1))
    after = model.state_dict()
    assert summary["skipped"] == 1 and summary["steps"] == 3
    # step 1 updated the weights, step 2 (NaN) did not, step 3 did
    assert not torch.equal(seen[0]["linear.weight"], seen[1]["linear.weight"])
    assert torch.equal(seen[1]["linear.weight"], seen[2]["linear.weight"])
    assert not torch.equal(seen[2]["linear.weight"], after["linear.weight"])
    assert all(t.isfinite().all() for t in after.values())


def test_max_bad_steps_is_an_option_of_both_commands():
    from folnet.train.finetune.config import FinetuneConfig, load_finetune_config
    from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config

    assert load_pretrain_config().max_bad_steps == PretrainConfig().max_bad_steps == 3
    assert load_finetune_config().max_bad_steps == FinetuneConfig().max_bad_steps == 3
    with pytest.raises(folnet.errors.FolnetError, match="--max-bad-steps must be >= 1"):
        FinetuneConfig(max_bad_steps=0)
    # changing it on resume is allowed: it changes no result, only when a diverged run stops
    assert PretrainConfig(max_bad_steps=9).resume_mismatches(PretrainConfig().to_dict()) == []
    assert json.dumps(PretrainConfig().to_dict())  # still plain data


def test_step_guard_counts_fp16_overflows_only_below_scale_1():
    """A loss scaler overflowing while it finds its scale is how fp16 works: reported and
    counted in all, but only overflows at scale <= 1 (or a NaN loss) count towards a stop."""
    from folnet.errors import NonFiniteError
    from folnet.train.engine.guard import StepGuard

    guard = StepGuard(2, what="pretraining", lr=1e-3)
    for step, scale in enumerate([65536.0, 32768.0, 16384.0, 8192.0], start=1):
        note = guard.check(step, 5.0, float("inf"), scale)
        assert note.startswith(f"step {step} skipped: fp16 gradient overflow at loss scale")
    assert (guard.skipped, guard.in_a_row) == (4, 0)
    assert guard.check(5, 5.0, 1.5, 4096.0) is None
    assert "1 in a row" in guard.check(6, float("nan"), float("nan"), 4096.0)
    with pytest.raises(NonFiniteError, match=r"step 7: loss 5, gradient norm inf; 2 steps in a "
                                             r"row.*likely cause: fp16 overflow.*scale 1\b"):
        guard.check(7, 5.0, float("inf"), 1.0)


def test_step_guard_names_the_likely_cause():
    from folnet.errors import FolnetError, NonFiniteError
    from folnet.train.engine.guard import StepGuard

    guard = StepGuard(1, what="finetuning", lr=0.5)
    with pytest.raises(NonFiniteError, match=r"step 1: .*not one step was finite"):
        guard.check(1, float("inf"), 2.0)
    guard = StepGuard(2, what="finetuning", lr=0.5)
    assert guard.check(1, 3.0, 2.0) is None
    assert guard.check(2, 3.0, float("nan")) == ("step 2 skipped: loss 3, gradient norm nan "
                                                 "(1 in a row, 1 in all)")
    with pytest.raises(NonFiniteError, match=r"finetuning stopped at step 3: loss inf.*learning "
                                             r"rate \(0.5\) is likely too high"):
        guard.check(3, float("inf"), float("nan"))
    with pytest.raises(FolnetError, match="max_bad_steps must be an integer >= 1, got 0"):
        StepGuard(0, what="x", lr=1.0)
