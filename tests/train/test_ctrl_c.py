"""Ctrl-C as a user's terminal sends it: a real SIGINT to the process group of a running
``folnet pretrain`` or ``folnet finetune``, at a step of the training loop. Each ends with
exit status 130 and folnet's one line last, no traceback; the interrupted pretraining resumes
from its checkpoint. (tests/train/test_ablate_procs.py does the same for ``folnet ablate``'s
parent and rows; tests/train/test_run_ownership.py the interruption before the first step.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT

from folnet.cli import main

KINSHIP = ["--ops", "j.a", "--preset", "tiny", "--data", "kinship", "--kinship-documents", "40",
           "--vocab-size", "200", "--seq-len", "32", "--batch-size", "4", "--log-every", "1",
           "--no-progress", "--no-tensorboard"]
FINETUNE = ["--task", "kinship", "--kinship-train-size", "64", "--kinship-test-per-k", "2",
            "--log-every", "1",
            "--batch-size", "4", "--eval-batch-size", "64", "--no-progress", "--no-tensorboard"]


def _terminal_signals() -> None:
    """Ctrl-C's default action, as in a terminal's foreground job (a suite started in the
    background ignores SIGINT, and its children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "folnet", *argv], env=env,
                                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_terminal_signals, start_new_session=True)


def _logged_steps(path: Path) -> int:
    """The steps a run's log.jsonl holds so far (0 before it exists)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if line.strip() and "loss" in json.loads(line))


def _ctrl_c_once(proc: subprocess.Popen, log: Path, ready, what: str) -> str:
    """Wait for ``ready()``, SIGINT the process group, and return everything it printed."""
    deadline = time.monotonic() + 120
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} never got going:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"{what} did not stop on Ctrl-C:\n{log.read_text()[-3000:]}") from None
    return log.read_text()


def _one_line_last(printed: str, command: str, status: int) -> str:
    assert status == 130, printed[-3000:]
    assert "Traceback" not in printed and "KeyboardInterrupt" not in printed, printed[-3000:]
    last = printed.strip().splitlines()[-1]
    assert last.startswith(f"folnet {command}: "), printed[-3000:]
    return last


def test_ctrl_c_mid_pretraining_is_one_line_and_the_run_resumes(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "pretrain.log"
    proc = _start(["pretrain", *KINSHIP, "--steps", "100000", "--save-every", "2",
                   "--out", str(out)], log)
    printed = _ctrl_c_once(proc, log, lambda: _logged_steps(out / "log.jsonl") >= 3,
                           "the pretraining")
    last = _one_line_last(printed, "pretrain", proc.returncode)
    assert "interrupted at step" in last and "--resume" in last, last
    steps = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    assert steps, "no checkpoint left to resume from"
    # the run goes on from its last checkpoint, to two steps past it
    assert main(["pretrain", "--resume", str(out), "--steps", str(steps[-1] + 2)]) == 0
    assert (out / "final" / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ctrl-c") / "pretrained"
    assert main(["pretrain", *KINSHIP, "--steps", "2", "--save-every", "2",
                 "--out", str(out)]) == 0
    return out / "final"


def test_ctrl_c_mid_finetuning_is_one_line(tmp_path, pretrained):
    out = tmp_path / "ft"
    log = tmp_path / "finetune.log"
    proc = _start(["finetune", "--from", str(pretrained), *FINETUNE, "--max-steps", "100000",
                   "--out", str(out)], log)
    printed = _ctrl_c_once(proc, log, lambda: "step 3/" in log.read_text(), "the finetuning")
    last = _one_line_last(printed, "finetune", proc.returncode)
    assert "interrupted" in last, last
