"""Exact resume after SIGKILL, checkpoint integrity, and resume refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from older_dirs import as_written_before_checksums
from runs import kill_at_first_checkpoint
from safetensors.torch import load_file

import folnet
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.runlog import read_log

pytestmark = pytest.mark.usefixtures("one_thread")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def kin_tokenizer(tmp_path_factory) -> str:
    """One tokenizer for every run: WordPiece training orders equal-count tokens by hash, so
    two trainings in two processes may number the vocabulary differently."""
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.tokenizer import train_tokenizer

    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts=texts, vocab_size=300).save(path)
    return str(path)


def run_args(out: Path, tokenizer: str, steps: int, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "tiny", "--data", "kinship", "--kinship-documents", "60",
            "--tokenizer", tokenizer, "--seq-len", "32", "--batch-size", "8", "--grad-accum",
            "2", "--steps", str(steps), "--lr", "5e-3", "--warmup-ratio", "0.1",
            "--log-every", "1", "--save-every", "3", "--keep-last", "2", "--deterministic",
            "--no-progress", "--no-tensorboard", "--out", str(out), *extra]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "folnet.train.pretrain", *args[1:]],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, kin_tokenizer):
    steps = 15
    # Uninterrupted reference (dropout stays at the preset's 0.1: RNG restore is exercised).
    reference = launch(run_args(tmp_path / "ref", kin_tokenizer, steps))
    # The victim: killed with SIGKILL as soon as its first checkpoint is complete.
    victim = launch(run_args(tmp_path / "run", kin_tokenizer, steps))
    kill_at_first_checkpoint(victim, tmp_path / "run")
    root = tmp_path / "run" / "checkpoints"
    assert not (tmp_path / "run" / "final").exists(), "the run finished before the kill"
    killed_at = ckpt.list_checkpoints(tmp_path / "run")[-1][0]
    assert killed_at < steps
    assert reference.wait() == 0, reference.stdout.read().decode()

    resumed = launch(run_args(tmp_path / "run", kin_tokenizer, steps, "--resume"))
    output = resumed.communicate()[0].decode()
    assert resumed.returncode == 0, output
    assert "resumed from" in output
    a, b = weights(tmp_path / "ref" / "final"), weights(tmp_path / "run" / "final")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    # The log reads as one run: the same losses at the same steps, no duplicates.
    ref_log = read_log(tmp_path / "ref" / "log.jsonl")
    run_log = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in run_log] == list(range(1, steps + 1))
    assert [r["loss"] for r in run_log] == [r["loss"] for r in ref_log]
    assert [p.name for _, p in ckpt.list_checkpoints(tmp_path / "run")] == ["step_12", "step_15"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, kin_tokenizer) -> Path:
    out = tmp_path_factory.mktemp("done") / "run"
    assert main(run_args(out, kin_tokenizer, 6)) == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def resume_error(out: Path, tokenizer: str, capsys, *extra: str) -> str:
    capsys.readouterr()
    assert main(run_args(out, tokenizer, 6, "--resume", *extra)) == 2
    return capsys.readouterr().err


def test_truncated_trainer_state_is_an_error_naming_the_file(tmp_path, finished_run,
                                                             kin_tokenizer, capsys):
    out = copy_run(finished_run, tmp_path / "run")
    state = out / "checkpoints" / "step_6" / "trainer.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    # named explicitly: a plain --resume would fall back to step_3 (tests/train/test_rundir.py)
    err = resume_error(out, kin_tokenizer, capsys, str(state.parent))
    assert err.startswith("folnet pretrain: error:")
    assert str(state) in err and "corrupt or truncated" in err


def test_truncated_weights_are_an_error_naming_the_file(tmp_path, finished_run, kin_tokenizer,
                                                        capsys):
    out = copy_run(finished_run, tmp_path / "run")
    model = out / "checkpoints" / "step_6" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:1000])
    err = resume_error(out, kin_tokenizer, capsys, str(model.parent))
    assert str(model) in err and "corrupt or truncated" in err


def test_corrupt_config_is_an_error_naming_the_file(tmp_path, finished_run, kin_tokenizer,
                                                    capsys):
    out = copy_run(finished_run, tmp_path / "run")
    config = out / "checkpoints" / "step_6" / "config.json"
    config.write_text('{"format": "folnet", "model": ')
    err = resume_error(out, kin_tokenizer, capsys, str(config.parent))
    assert str(config) in err and "corrupt" in err


def test_resume_with_another_architecture_names_the_option(finished_run, kin_tokenizer,
                                                           capsys):
    err = resume_error(finished_run, kin_tokenizer, capsys, "--ops", "j.a")
    assert "--ops" in err and "'jmc.atp'" in err and "'j.a'" in err
    err = resume_error(finished_run, kin_tokenizer, capsys, "--model", "D2=8")
    assert "--model" in err and "D2" in err
    err = resume_error(finished_run, kin_tokenizer, capsys, "--batch-size", "4")
    assert "--batch-size" in err


def test_resume_without_a_checkpoint_and_fresh_run_over_one(tmp_path, finished_run,
                                                            kin_tokenizer, capsys):
    err = resume_error(tmp_path / "empty", kin_tokenizer, capsys)
    assert "--resume" in err and "no checkpoint" in err
    capsys.readouterr()
    assert main(run_args(finished_run, kin_tokenizer, 6)) == 2
    assert "already holds checkpoints" in capsys.readouterr().err


def test_load_weights_checks_the_architecture(finished_run):
    model = folnet.build_model("j.a", preset="tiny", head="pretraining", vocab_size=300)
    with pytest.raises(FolnetError, match="different architecture"):
        ckpt.load_weights_into(model, finished_run / "checkpoints" / "step_6")


def test_a_crash_during_save_leaves_the_last_good_checkpoint(tmp_path, finished_run,
                                                             monkeypatch):
    out = copy_run(finished_run, tmp_path / "run")
    good = ckpt.list_checkpoints(out)
    tokenizer = load_tokenizer(out / "tokenizer")
    model = folnet.from_pretrained(good[-1][1])
    state = ckpt.load_trainer_state(good[-1][1])

    def half_then_crash(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")        # the first bytes of a save...
        raise OSError("No space left on device")  # ...then the disk fills up

    monkeypatch.setattr(ckpt.torch, "save", half_then_crash)
    with pytest.raises(OSError, match="No space"):
        ckpt.save_checkpoint(out, 9, write_model=model.save_pretrained, tokenizer=tokenizer,
                             trainer_state=state, keep_last=1)
    monkeypatch.undo()
    assert ckpt.list_checkpoints(out) == good  # nothing new, nothing pruned
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    latest = good[-1][1]
    assert ckpt.load_trainer_state(latest)["step"] == 6
    ckpt.load_weights_into(folnet.from_pretrained(latest), latest)
    # A save that succeeds prunes down to keep_last, removing the older ones.
    ckpt.save_checkpoint(out, 9, write_model=model.save_pretrained, tokenizer=tokenizer,
                         trainer_state=state, keep_last=1)
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [9]


# -- a checkpoint that lost its checksums.json -------------------------------------


def flip_weight_byte(weights_file: Path) -> None:
    """One byte of tensor data changed, the safetensors header left valid: only a checksum
    can tell."""
    data = bytearray(weights_file.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start + (len(data) - start) // 2] ^= 0x10
    weights_file.write_bytes(bytes(data))


def lose_manifest(checkpoint: Path, *, flip: bool = True) -> None:
    """What a copy that left checksums.json out, then a failing disk, make of a checkpoint."""
    (checkpoint / "checksums.json").unlink()
    if flip:
        flip_weight_byte(checkpoint / "model.safetensors")


def test_a_checkpoint_without_its_manifest_is_skipped_for_the_newest_intact_one(
        tmp_path, finished_run, kin_tokenizer, capsys):
    out = copy_run(finished_run, tmp_path / "run")
    damaged = out / "checkpoints" / "step_6"
    lose_manifest(damaged)
    capsys.readouterr()
    assert main(run_args(out, kin_tokenizer, 6, "--resume")) == 0
    captured = capsys.readouterr()
    said = [line for line in captured.out.splitlines() if "step_6" in line and "skipped" in line]
    assert len(said) == 1, captured.out
    assert f"{damaged / 'checksums.json'}: missing" in said[0] and "trainer.pt" in said[0]
    assert "resuming from step_3, the newest intact checkpoint" in captured.out
    assert "UNCHECKED" not in captured.err  # the damaged checkpoint was never loaded
    # Resumed from step_3, the run ends where the uninterrupted one did, bit for bit.
    a, b = weights(finished_run / "final"), weights(out / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_no_intact_checkpoint_and_a_named_one_without_manifest_are_one_line(
        tmp_path, finished_run, kin_tokenizer, capsys):
    out = copy_run(finished_run, tmp_path / "run")
    named = out / "checkpoints" / "step_6"
    lose_manifest(named)
    err = resume_error(out, kin_tokenizer, capsys, str(named))  # named: never replaced
    assert len(err.strip().splitlines()) == 1
    assert f"{named / 'checksums.json'}: missing" in err
    lose_manifest(out / "checkpoints" / "step_3", flip=False)
    err = resume_error(out, kin_tokenizer, capsys)
    assert len(err.strip().splitlines()) == 1
    assert "no intact checkpoint" in err and "step_3" in err and "step_6" in err
    assert err.count("checksums.json: missing") == 2


def test_a_checkpoint_from_before_checksums_still_resumes(tmp_path, finished_run, kin_tokenizer,
                                                         capsys):
    """A checkpoint whose trainer state does not say a manifest was written (folnet wrote none
    then) resumes as it always did, with the one no-manifest warning: a promise."""
    out = copy_run(finished_run, tmp_path / "run")
    for _step, path in ckpt.list_checkpoints(out):
        state = ckpt.load_trainer_state(path)
        assert state.pop(ckpt.MANIFEST_KEY) == "checksums.json"
        torch.save(state, path / ckpt.TRAINER_FILE)
        as_written_before_checksums(path)
        ckpt.check_intact(path)
    capsys.readouterr()
    assert main(run_args(out, kin_tokenizer, 9, "--resume")) == 0
    captured = capsys.readouterr()
    assert f"resumed from {out / 'checkpoints' / 'step_6'} (step 6)" in captured.out
    warnings = [line for line in captured.err.splitlines() if "has no checksums.json" in line]
    assert len(warnings) == 1 and "step_6" in warnings[0], captured.err
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [6, 9]
