"""The run directory: one run per ``--out``, files with the
umask's permissions, leftovers of killed writes cleaned, ``--resume`` past a damaged
checkpoint, checksums verified on load, and a full disk or read-only folder as one line."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from older_dirs import as_written_before_checksums

import folnet
import folnet.train.finetune.cli  # registers finetune and evaluate
from folnet.atomic_write import atomic_write_text
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.lock import LOCK_NAME, RunLock
from folnet.train.engine.runlog import read_log

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(folnet.__file__).resolve().parent.parent  # the tree under test, for subprocesses
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}


def args(out: Path, steps: int, *extra: str, save_every: int = 3, seed: int = 1) -> list[str]:
    return ["pretrain", "--ops", "j.a", "--preset", "tiny", "--data", "kinship",
            "--kinship-documents", "200", "--vocab-size", "300", "--seq-len", "32",
            "--batch-size", "4", "--steps", str(steps), "--save-every", str(save_every),
            "--keep-last", "2", "--log-every", "1", "--seed", str(seed), "--no-progress",
            "--no-tensorboard", "--out", str(out), *extra]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, command: str = "pretrain") -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"folnet {command}: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 6-step run: checkpoints step_3 and step_6, final/."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(args(out, 6)) == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def flip_tensor_byte(weights: Path) -> None:
    """Change one byte in the middle of the tensor data, leaving the header valid."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start + (len(data) - start) // 2] ^= 0x10
    weights.write_bytes(bytes(data))


def digests(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# -- problem 2: one run per output directory ----------------------------------------------------


#: A pretraining run that pauses in the middle of saving step_20 (its trainer state written,
#: the checkpoint still a temporary directory) for as long as the file argv[1] exists.
PAUSING_RUN = """
import sys, time, torch
from pathlib import Path
from folnet.cli import main
hold, real_save = Path(sys.argv[1]), torch.save
def save(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)
    if "step_20" in str(f.name if hasattr(f, "write") else f):  # a handle or a path
        deadline = time.monotonic() + 600
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
torch.save = save
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_second_run_into_a_live_runs_out_is_refused_at_once(tmp_path):
    out, hold = tmp_path / "run", tmp_path / "hold"
    hold.touch()
    first = subprocess.Popen([sys.executable, "-c", PAUSING_RUN, str(hold),
                              *args(out, 30, save_every=10)],
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        live: list[Path] = []
        while not live:  # the first run is saving step_20 (and has step_10)
            assert first.poll() is None, first.stdout.read().decode()
            assert time.monotonic() < deadline, "the first run never reached its second save"
            time.sleep(0.05)
            if (out / "checkpoints").is_dir():
                live = [p for p in (out / "checkpoints").iterdir()
                        if p.name.startswith(".tmp-step_20") and (p / "trainer.pt").is_file()]
        before = sorted(p.name for p in live[0].iterdir())
        # A --resume (as if to continue a crashed run) and a fresh run with another seed.
        second = [subprocess.Popen([sys.executable, "-m", "folnet", *argv], env=ENV,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for argv in (args(out, 30, "--resume", save_every=10),
                               args(out, 30, save_every=10, seed=2))]
        for proc in second:
            try:
                _, err = proc.communicate(timeout=300)
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert proc.returncode == 2, err
            line = one_line_error(err)
            assert f"{str(out)!r} is in use by another pretraining run: pid {first.pid}" in line
        # The first run's half-written checkpoint is untouched by the others' start-up.
        assert live[0].is_dir() and sorted(p.name for p in live[0].iterdir()) == before
        hold.unlink()
        output = first.communicate(timeout=600)[0].decode()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, output
    assert [r["step"] for r in read_log(out / "log.jsonl")] == list(range(1, 31))
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [20, 30]
    for _, path in ckpt.list_checkpoints(out):
        ckpt.check_intact(path)
    assert json.loads((out / "run_config.json").read_text())["seed"] == 1
    folnet.from_pretrained(out)  # final/, checked against its checksums


FINETUNE = ["--task", "kinship", "--kinship-train-size", "16", "--kinship-test-per-k", "2",
            "--max-steps", "2", "--batch-size", "8", "--eval-batch-size", "64", "--no-progress",
            "--no-tensorboard"]


def test_finetune_and_evaluate_refuse_an_out_in_use(tmp_path, finished, capsys):
    busy = tmp_path / "busy"
    with RunLock(busy, what="pretraining run"):
        code, _, err = run(["finetune", "--from", str(finished), "--out", str(busy),
                            *FINETUNE], capsys)
        assert code == 2
        assert f"{str(busy)!r} is in use by another pretraining run: pid {os.getpid()}" in \
            one_line_error(err, "finetune")
        assert main(["finetune", "--from", str(finished), "--out", str(tmp_path / "ft"),
                     *FINETUNE]) == 0
        code, _, err = run(["evaluate", "--model", str(tmp_path / "ft"), "--out", str(busy)],
                           capsys)
        assert code == 2
        assert "is in use by another pretraining run" in one_line_error(err, "evaluate")
    assert sorted(p.name for p in busy.iterdir()) == [LOCK_NAME]  # nothing written


# -- problem 7: permissions, leftovers, fallback, checksums -------------------------------------


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


def test_written_files_follow_the_umask(tmp_path, capsys):
    before = os.umask(0o022)
    try:
        pre, fine, scored = tmp_path / "pre", tmp_path / "ft", tmp_path / "scored"
        assert main(args(pre, 2, save_every=1)) == 0
        assert main(["finetune", "--from", str(pre), "--out", str(fine), *FINETUNE]) == 0
        assert main(["evaluate", "--model", str(fine), "--out", str(scored)]) == 0
        os.umask(0o002)
        atomic_write_text(tmp_path / "group" / "note.txt", "x")
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.txt", "x")
    finally:
        os.umask(before)
    expected = {
        pre: ["checkpoints/step_2/model.safetensors", "checkpoints/step_2/config.json",
              "checkpoints/step_2/trainer.pt", "checkpoints/step_2/checksums.json",
              "checkpoints/step_2/tokenizer.json", "final/model.safetensors",
              "final/config.json", "log.jsonl", "log.csv", "run_config.json",
              "tokenizer/tokenizer.json", "tokenizer/vocab.txt", LOCK_NAME],
        fine: ["eval.json", "run_config.json", "model/model.safetensors", "model/config.json",
               "model/tokenizer.json", "model/checksums.json", "seed_0/log.jsonl",
               "seed_0/metrics.json", "predictions/test.tsv"],
        scored: ["eval.json", "predictions/test.tsv"],
    }
    for root, names in expected.items():
        found = modes(root)
        wrong = {name: oct(mode) for name, mode in found.items()
                 if mode != (0o755 if (root / name).is_dir() else 0o644)}
        assert not wrong, f"{root}: not 0644 files / 0755 directories under umask 022: {wrong}"
        assert not [name for name in names if name not in found], sorted(found)
    assert stat.S_IMODE((tmp_path / "group" / "note.txt").stat().st_mode) == 0o664
    assert stat.S_IMODE((tmp_path / "group").stat().st_mode) == 0o775
    assert stat.S_IMODE((tmp_path / "private.txt").stat().st_mode) == 0o600


def test_leftovers_of_killed_writes_are_cleaned_at_the_next_start(tmp_path, finished, capsys):
    out = copy_run(finished, tmp_path / "run")
    planted = [out / ".tmp-final-4242-0a0b0c0d", out / ".trash-final-1a2b3c4d",
               out / "checkpoints" / ".tmp-step_9-4242-deadbeef",
               out / "checkpoints" / ".trash-step_0-0f0f0f0f"]
    for directory in planted:
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"half")
    files = [out / ".tmp-log.jsonl-4242-00aa11bb", out / ".run_config.json.k2j3h4x9.tmp"]
    for path in files:
        path.write_text("half")
    planted[-1].chmod(0o555)  # a read-only directory in the trash is deleted as well
    cache_temp = out / "cache" / ".tmp-shared-entry"  # the cache is shared: left alone
    cache_temp.mkdir(parents=True)
    code, _, err = run(args(out, 9, "--resume"), capsys)
    assert code == 0, err
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.name.startswith((".tmp-", ".trash-")) or p.name.endswith(".tmp"))
    assert left == ["cache/.tmp-shared-entry"]
    assert [r["step"] for r in read_log(out / "log.jsonl")] == list(range(1, 10))


def test_a_trash_that_cannot_be_deleted_is_said_and_removed_at_the_next_start(
        tmp_path, finished, capsys, monkeypatch):
    out = copy_run(finished, tmp_path / "run")
    latest = ckpt.list_checkpoints(out)[-1][1]
    model, tokenizer = folnet.from_pretrained(latest), load_tokenizer(latest)
    state = {**ckpt.load_trainer_state(latest), "step": 9}
    extra = {"pretrain": ckpt.read_run_config(latest), "step": 9}

    def refuse(path, ignore_errors=False, *a, **k):  # deleting another user's read-only files
        if not ignore_errors:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    capsys.readouterr()
    ckpt.save_checkpoint(out, 9, write_model=lambda d: model.save_pretrained(d, extra),
                         tokenizer=tokenizer, trainer_state=state, keep_last=1)
    monkeypatch.undo()
    err = capsys.readouterr().err
    trash = [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".trash-")]
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [9]
    assert len(trash) == 2, trash
    for path in trash:
        assert f"folnet: warning: could not delete {path}" in err and "[EACCES]" in err
    code, _, err = run(args(out, 9, "--resume"), capsys)  # finished already: only starts
    assert code == 0, err
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, finished, capsys):
    out = copy_run(finished, tmp_path / "run")
    damaged = out / "checkpoints" / "step_6"
    flip_tensor_byte(damaged / "model.safetensors")
    skipped = copy_run(out, tmp_path / "skipped")
    code, output, err = run(args(out, 6, "--resume"), capsys)
    assert code == 0, err
    assert (f"skipped checkpoint step_6, which is damaged ({damaged / 'model.safetensors'}: "
            f"corrupt or truncated") in output
    assert "resuming from step_3" in output and "resumed from" in output
    # Resumed from step 3, the run ends where the uninterrupted one did, bit for bit.
    a = folnet.from_pretrained(finished).state_dict()
    b = folnet.from_pretrained(out).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_log(out / "log.jsonl")] == list(range(1, 7))
    target, notes = ckpt.resolve_resume(skipped, "latest")
    assert target == skipped / "checkpoints" / "step_3"
    assert len(notes) == 2 and "step_6" in notes[0] and "step_3" in notes[1]
    assert (skipped / "checkpoints" / "step_6").is_dir()  # skipped, not deleted
    # An explicitly named checkpoint is never replaced by another; no intact one is an error.
    flip_tensor_byte(damaged / "model.safetensors")
    code, _, err = run(args(out, 6, "--resume", str(damaged)), capsys)
    assert code == 2
    assert f"{damaged / 'model.safetensors'}: corrupt or truncated" in one_line_error(err)
    flip_tensor_byte(out / "checkpoints" / "step_3" / "model.safetensors")
    code, _, err = run(args(out, 6, "--resume"), capsys)
    assert code == 2
    line = one_line_error(err)
    assert "no intact checkpoint" in line and "step_3" in line and "step_6" in line


def test_flipped_tensor_bytes_are_detected_on_load(tmp_path, finished):
    out = copy_run(finished, tmp_path / "run")
    for directory in (out / "final", out / "checkpoints" / "step_6"):
        weights = directory / "model.safetensors"
        flip_tensor_byte(weights)
        with pytest.raises(FolnetError, match="corrupt or truncated") as caught:
            folnet.from_pretrained(directory)
        assert str(weights) in str(caught.value)
    with pytest.raises(FolnetError, match=str(out / "final" / "model.safetensors")):
        folnet.from_pretrained(out)  # a run directory: its final/
    # Without a manifest (a directory written before checksums) the weights load as before.
    as_written_before_checksums(out / "final")
    folnet.from_pretrained(out / "final")


# -- problem 6: full disk, read-only folder ------------------------------------------------------


@pytest.mark.parametrize("fault", ["weights", "trainer state"])
def test_a_full_disk_is_one_line_and_earlier_checkpoints_survive(tmp_path, capsys,
                                                                 monkeypatch, fault):
    import safetensors.torch
    from safetensors import SafetensorError

    calls = []
    if fault == "weights":  # safetensors (Rust) reports the OS error as text
        real_save_file = safetensors.torch.save_file

        def save_file(tensors, filename, metadata=None):
            calls.append(filename)
            if len(calls) == 2:
                raise SafetensorError("Error while serializing: I/O error: No space left on "
                                      "device (os error 28)")
            return real_save_file(tensors, filename, metadata=metadata)

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
        name = "model.safetensors"
    else:  # a Python-level write fails part-way
        real_save = torch.save

        def save(obj, f, *a, **k):
            calls.append(f)
            if len(calls) == 2:
                if hasattr(f, "write"):
                    f.write(b"PK\x03\x04 half")
                else:
                    Path(f).write_bytes(b"PK\x03\x04 half")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_save(obj, f, *a, **k)

        monkeypatch.setattr(torch, "save", save)
        name = "trainer.pt"
    out = tmp_path / "run"
    code, _, err = run(args(out, 6, save_every=2), capsys)
    monkeypatch.undo()
    assert code == 2
    line = one_line_error(err)
    assert f"cannot write {out / 'checkpoints' / 'step_4'} ({name}): No space left on " \
           f"device [ENOSPC]" in line, line
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2]
    ckpt.check_intact(out / "checkpoints" / "step_2")
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


def read_only(monkeypatch, root: Path) -> None:
    """Make `root` read-only for this process. As root (a container) chmod does not stop
    writes, so the file operations that would fail on a read-only folder are made to fail
    here with the same error; otherwise the real permissions do it."""
    if os.geteuid() != 0:
        for path in [root, *root.rglob("*")]:
            path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
        return
    inside = str(root.resolve())

    def under(path) -> bool:
        if isinstance(path, int):
            return False
        full = os.path.abspath(os.fsdecode(path))
        return full == inside or full.startswith(inside + os.sep)

    def deny(path):
        raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))

    real_open, real_mkdir, real_io_open = os.open, os.mkdir, io.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def fake_os_open(path, flags, *a, **k):
        if under(path) and flags & writes:
            deny(path)
        return real_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if under(path) and not os.path.exists(path):
            deny(path)
        return real_mkdir(path, *a, **k)

    def fake_io_open(file, mode="r", *a, **k):
        if under(file) and any(c in mode for c in "wax+"):
            deny(file)
        return real_io_open(file, mode, *a, **k)

    def refuse(*paths, **_):
        for path in paths[:2]:
            if under(path):
                deny(path)
        raise AssertionError("unreachable")  # pragma: no cover

    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(io, "open", fake_io_open)
    monkeypatch.setattr(builtins, "open", fake_io_open)
    for name in ("replace", "rename", "unlink", "rmdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *p, _real=real, **k: (
            refuse(*p) if any(under(x) for x in p[:2]) else _real(*p, **k)))


def test_a_read_only_out_is_one_line_and_its_checkpoints_survive(tmp_path, finished, capsys,
                                                                  monkeypatch):
    out = copy_run(finished, tmp_path / "run")
    empty = tmp_path / "empty"
    empty.mkdir()
    before = digests(out)
    read_only(monkeypatch, out)
    read_only(monkeypatch, empty)
    try:
        for target, extra in ((out, ("--resume",)), (empty, ())):
            code, _, err = run(args(target, 9, *extra), capsys)
            assert code == 2
            line = one_line_error(err)
            assert str(target) in line and "Permission denied [EACCES]" in line, line
    finally:
        monkeypatch.undo()
        for path in [out, empty, *out.rglob("*")]:
            path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)
    assert digests(out) == before  # nothing written, nothing deleted
    assert not [p for p in empty.iterdir() if p.name != LOCK_NAME]
    ckpt.check_intact(out / "checkpoints" / "step_6")


def test_final_and_checkpoints_carry_a_checksum_manifest(finished):
    manifest = json.loads((finished / "final" / "checksums.json").read_text())
    assert manifest["algorithm"] == "sha256"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    step = json.loads((finished / "checkpoints" / "step_6" / "checksums.json").read_text())
    assert "trainer.pt" in step["files"]
    folnet.from_pretrained(finished)


class _Planted:
    """A pickle that would create a file when loaded with code execution allowed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_trainer_state_is_skipped_and_never_unpickled(tmp_path, finished, capsys):
    out = copy_run(finished, tmp_path / "run")
    marker = tmp_path / "executed"
    torch.save({"format": "folnet-trainer", "x": _Planted(marker)},
               out / "checkpoints" / "step_6" / "trainer.pt")
    code, output, err = run(args(out, 6, "--resume"), capsys)
    assert code == 0, err
    assert "skipped checkpoint step_6" in output and "trainer.pt" in output
    as_written_before_checksums(out / "checkpoints" / "step_6")
    torch.save({"format": "folnet-trainer", "x": _Planted(marker)},
               out / "checkpoints" / "step_6" / "trainer.pt")
    code, _, err = run(args(out, 6, "--resume"), capsys)
    warning, error = err.strip().splitlines()  # a directory without checksums is said first
    assert warning.startswith("folnet: warning:") and "has no checksums.json" in warning
    assert code == 2 and "step_6/trainer.pt" in one_line_error(error)
    assert not marker.exists()
