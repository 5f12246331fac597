"""Shared pieces of the run tests: a tiny pretrained run directory, a file writer, killing a
pretraining process once its first checkpoint exists, and reading a command's one-line error."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import folnet
from folnet.cli import main
from folnet.train.data.tokenizer import train_tokenizer


def tiny_pretrained_run(run: Path, texts: Sequence[str], *, vocab_size: int,
                        repeat: int = 4) -> Path:
    """RUN/final holding a one-layer tiny jmc.atp pretraining model and a tokenizer trained on
    ``texts`` (seeded: the same weights every time)."""
    tokenizer = train_tokenizer(texts=list(texts) * repeat, vocab_size=vocab_size)
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", L=1,
                               vocab_size=tokenizer.vocab_size)
    model.save_pretrained(run / "final", {"step": 0})
    tokenizer.save(run / "final")
    return run


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def kill_at_first_checkpoint(victim: subprocess.Popen, out: Path, *,
                             timeout: float = 120.0) -> None:
    """SIGKILL ``victim`` as soon as OUT/checkpoints holds a complete ``step_*`` (checkpoints
    appear by an atomic rename, so one that is listed is whole)."""
    root = out / "checkpoints"
    deadline = time.monotonic() + timeout
    while not (root.is_dir() and any(p.name.startswith("step_") for p in root.iterdir())):
        assert victim.poll() is None, victim.stdout.read().decode()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL


def cli_error(capsys, args: list[str], command: str = "pretrain") -> str:
    """The stderr of ``folnet ARGS``, which must fail with exit 2 and folnet's one-line error."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"folnet {command}: error:")
    return err


def tiny_plan(name: str, rows: str, *, seeds: int = 1, steps: int | str = 3,
              save_every: int = 100, description: str = "") -> str:
    """An ablation plan at the tests' budget -- a few pretraining steps of the tiny preset on
    the kinship corpus, three finetuning steps on 36 kinship questions -- with ``rows`` (its
    ``[[rows]]`` tables) appended."""
    return f"""
name = "{name}"
description = "{description}"
data = "kinship"
tasks = ["kinship"]
seeds = {seeds}

[pretrain]
preset = "tiny"
steps = {steps}
kinship_documents = 30
vocab_size = 300
seq_len = 32
batch_size = 4
log_every = 1
save_every = {save_every}
keep_last = 1

[finetune]
max_steps = 3
batch_size = 8
kinship_train_size = 24
kinship_test_per_k = 4
kinship_test_k = [2, 3, 4]
eval_batch_size = 16
{rows}"""
