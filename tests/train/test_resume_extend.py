"""Continuing a pretraining run to more steps (``--resume`` with a larger ``--steps``) and
starting a new run from pretrained weights (``--init-from``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from runs import cli_error
from safetensors.torch import load_file

from folnet.cli import main
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.runlog import read_log

pytestmark = pytest.mark.usefixtures("one_thread")

LR, WARMUP = 2e-2, 0.1


@pytest.fixture(scope="module")
def kin_tokenizer(tmp_path_factory) -> str:
    """One tokenizer for every run (WordPiece training may number ties differently)."""
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.tokenizer import train_tokenizer

    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts=texts, vocab_size=300).save(path)
    return str(path)


def run_args(out: Path, steps: int, *extra: str, documents: int = 60) -> list[str]:
    """A tiny run: 60 steps take a few seconds on one thread."""
    return ["pretrain", "--preset", "tiny", "--data", "kinship", "--kinship-documents",
            str(documents), "--seq-len", "32", "--batch-size", "8", "--grad-accum", "2",
            "--steps", str(steps), "--lr", str(LR), "--warmup-ratio", str(WARMUP),
            "--log-every", "1", "--save-every", "20", "--keep-last", "2", "--deterministic",
            "--no-progress", "--no-tensorboard", "--out", str(out), *extra]


def expected_lr(step: int, total: int) -> float:
    """The learning rate of optimiser step `step` (1-based) in a run of `total` steps: warmup
    over ceil(ratio * total) steps, then linear decay to 0 at `total` (written out here, not
    taken from folnet.train.engine.optim)."""
    warmup = math.ceil(WARMUP * total)
    done = step - 1  # steps taken before this one
    if done < warmup:
        return LR * done / warmup
    return LR * (1.0 - (done - warmup) / (total - warmup))


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def snapshot(directory: Path) -> dict[str, int]:
    """Every file under `directory` with its modification time (ns): what a refusal must
    leave alone (but the run lock's own file, which records who last held it)."""
    return {str(p): p.stat().st_mtime_ns for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, kin_tokenizer) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(run_args(out, 60, "--tokenizer", kin_tokenizer)) == 0
    return out


# -- --resume with a larger --steps ------------------------------------------------------------


@pytest.mark.slow
def test_a_finished_run_continues_to_more_steps_on_a_recomputed_schedule(
        tmp_path, finished_run, kin_tokenizer, capsys):
    # What a finished run leaves: its final model and a complete checkpoint at its last step.
    assert (finished_run / "final" / "model.safetensors").is_file()
    last_step, last = ckpt.list_checkpoints(finished_run)[-1]
    assert last_step == 60 and ckpt.load_trainer_state(last)["step"] == 60
    before = read_log(finished_run / "log.jsonl")

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    capsys.readouterr()
    assert main(run_args(out, 80, "--tokenizer", kin_tokenizer, "--resume")) == 0
    printed = capsys.readouterr().out
    assert f"resumed from {out / 'checkpoints' / 'step_60'} (step 60)" in printed
    assert ("extending the run from 60 to 80 steps: learning-rate schedule recomputed for 80 "
            "total steps") in printed

    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 81))
    assert log[:60] == before  # the first 60 steps are the finished run's, untouched
    for record in log[:60]:
        assert record["lr"] == pytest.approx(expected_lr(record["step"], 60), rel=1e-12, abs=0)
    for record in log[60:]:  # steps 61-80 follow the schedule of an 80-step run
        assert record["lr"] == pytest.approx(expected_lr(record["step"], 80), rel=1e-12, abs=0)
    assert log[60]["lr"] > 0.25 * LR  # the rate rises again: the old schedule had ended at 0
    assert all(math.isfinite(r["loss"]) for r in log)
    # The data position continues: the sample count goes on from where step 60 left it.
    assert [r["samples"] for r in log] == [8 * s for s in range(1, 81)]
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [60, 80]
    assert ckpt.load_trainer_state(out / "checkpoints" / "step_80")["step"] == 80
    assert json.loads((out / "final" / "config.json").read_text())["step"] == 80
    assert json.loads((out / "run_config.json").read_text())["steps"] == 80


def test_a_resume_still_refuses_other_options_and_fewer_steps_than_reached(
        finished_run, kin_tokenizer, capsys):
    untouched = snapshot(finished_run)
    err = cli_error(capsys, run_args(finished_run, 80, "--tokenizer", kin_tokenizer, "--resume",
                                    "--lr", "0.001"))
    assert "--lr (checkpoint: 0.02, now: 0.001)" in err and "--steps" not in err
    err = cli_error(capsys, run_args(finished_run, 59, "--tokenizer", kin_tokenizer, "--resume"))
    assert "--steps 59" in err and "60 steps" in err and "step_60" in err
    assert snapshot(finished_run) == untouched  # refused before anything was written


@pytest.mark.slow
@pytest.mark.parametrize("streaming", [False, True], ids=["map-style", "streaming"])
def test_continued_runs_equal_an_uninterrupted_one_bit_for_bit(tmp_path, kin_tokenizer,
                                                               streaming):
    """Under a constant schedule a new total changes no learning rate, so 12 steps continued
    to 17 and then to 20 must be the uninterrupted 20-step run exactly: same batches (the data
    stream goes on where it stopped), masks, dropout and optimiser state. With 10 documents an
    epoch is 17 micro-batches: the first resume lands mid-epoch, the second at an epoch's end.
    """
    extra = ["--tokenizer", kin_tokenizer, "--schedule", "constant", "--warmup-ratio", "0",
             *(["--streaming"] if streaming else [])]
    assert main(run_args(tmp_path / "ref", 20, *extra, documents=10)) == 0
    out = tmp_path / "run"
    assert main(run_args(out, 12, *extra, documents=10)) == 0
    assert main(run_args(out, 17, *extra, "--resume", documents=10)) == 0
    assert main(run_args(out, 20, *extra, "--resume", documents=10)) == 0
    assert same_weights(weights(tmp_path / "ref" / "final"), weights(out / "final"))
    ref, run = read_log(tmp_path / "ref" / "log.jsonl"), read_log(out / "log.jsonl")
    assert [r["step"] for r in run] == list(range(1, 21))
    for key in ("loss", "lr", "epoch", "samples", "tokens", "grad_norm"):
        assert [r[key] for r in run] == [r[key] for r in ref], key
    assert run[-1]["epoch"] >= 2  # the runs crossed epochs after the resumes


# -- --init-from ---------------------------------------------------------------------------------


def test_init_from_starts_a_new_run_from_the_weights_of_a_run(tmp_path, finished_run,
                                                              kin_tokenizer, capsys):
    source = finished_run / "final"
    out = tmp_path / "new"
    common = ["--save-every", "1", "--keep-last", "3", "--model", "dropout=0.0"]
    capsys.readouterr()
    # No --tokenizer: the run takes the one saved with the weights.
    assert main(run_args(out, 3, *common, "--init-from", str(finished_run))) == 0
    assert f"initialised from {source} (step 60)" in capsys.readouterr().out
    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log] == [1, 2, 3]  # the step count restarts
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [1, 2, 3]
    # The first step runs at rate 0 (warmup), so the weights after it are the loaded ones.
    assert log[0]["lr"] == 0.0
    assert same_weights(weights(source), weights(out / "checkpoints" / "step_1"))
    assert not same_weights(weights(source), weights(out / "final"))  # and training moves on
    assert load_tokenizer(out / "tokenizer").fingerprint == load_tokenizer(source).fingerprint
    recorded = json.loads((out / "run_config.json").read_text())
    assert recorded["init_from"] == str(source)
    assert recorded["model"]["D2"] == 16 and recorded["model"]["dropout"] == 0.0

    # The same run from a fresh initialisation starts from a clearly higher loss.
    fresh = tmp_path / "fresh"
    assert main(run_args(fresh, 1, *common, "--tokenizer", kin_tokenizer)) == 0
    fresh_loss, loaded_loss = read_log(fresh / "log.jsonl")[0]["loss"], log[0]["loss"]
    assert loaded_loss < fresh_loss - 0.25, (loaded_loss, fresh_loss)

    # Resuming the new run needs no --init-from (and may not have it); its record keeps it.
    capsys.readouterr()
    assert main(run_args(out, 5, *common, "--resume")) == 0
    assert "extending the run from 3 to 5 steps" in capsys.readouterr().out
    assert [r["step"] for r in read_log(out / "log.jsonl")] == [1, 2, 3, 4, 5]
    assert json.loads((out / "run_config.json").read_text())["init_from"] == str(source)


def test_init_from_refusals_name_the_options(tmp_path, finished_run, capsys):
    out = tmp_path / "new"
    init = ["--init-from", str(finished_run)]
    err = cli_error(capsys, run_args(out, 3, *init, "--resume"))
    assert "--init-from" in err and "--resume" in err
    err = cli_error(capsys, run_args(out, 3, *init, "--model", "D2=8"))
    assert "--model D2=8" in err and "D2=16" in err
    err = cli_error(capsys, run_args(out, 3, "--init-from", str(tmp_path / "nowhere")))
    assert "--init-from" in err and "does not exist" in err
    from folnet.train.data.tokenizer import train_tokenizer

    other = tmp_path / "other-tok"
    train_tokenizer(texts=["alice is the mother of bob"] * 4, vocab_size=60).save(other)
    err = cli_error(capsys, run_args(out, 3, *init, "--tokenizer", str(other)))
    assert "--tokenizer" in err and "fingerprint" in err
    assert not out.exists()  # every refusal came before the run wrote anything


def test_reschedule_gives_a_restored_scheduler_the_rule_of_a_new_total():
    from folnet.train.engine.optim import Lamb, build_scheduler, reschedule, schedule_rule

    def scheduler(total: int):
        opt = Lamb([torch.nn.Parameter(torch.ones(2))], lr=LR)
        return opt, build_scheduler(opt, total, warmup_ratio=WARMUP)

    opt, sched = scheduler(60)
    for _ in range(60):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    opt, sched = scheduler(60)
    sched.load_state_dict(saved)
    reschedule(sched, schedule_rule(80, warmup_ratio=WARMUP))
    for step in range(61, 81):  # the rate of step s is set after step s - 1
        assert sched.get_last_lr()[0] == pytest.approx(expected_lr(step, 80), rel=1e-12)
        assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0]
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == 0.0
