"""A run owns its --out and nothing else: the lock never follows a link, clean-up
deletes only what folnet wrote, --out that is not a run's own is refused before anything is
written, a failed start leaves nothing, every run reads a model directory's tokenizer against
its checksums, and Ctrl-C is one line with exit 130."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from older_dirs import as_written_before_checksums

import folnet
import folnet.train.finetune.cli
from folnet.atomic_write import is_leftover, remove_leftovers
from folnet.cli import main
from folnet.errors import FolnetError

pytestmark = pytest.mark.usefixtures("one_thread")


def pretrain_args(out: Path | str, *extra: str, steps: int = 2) -> list[str]:
    return ["pretrain", "--ops", "j.a", "--preset", "tiny", "--data", "kinship",
            "--kinship-documents", "40", "--vocab-size", "200", "--seq-len", "32",
            "--batch-size", "4", "--steps", str(steps), "--save-every", "1", "--log-every",
            "1", "--no-progress", "--no-tensorboard", "--out", str(out), *extra]


FINETUNE = ["--task", "kinship", "--kinship-train-size", "16", "--kinship-test-per-k", "2",
            "--max-steps", "1", "--batch-size", "8", "--eval-batch-size", "64", "--no-progress",
            "--no-tensorboard"]


def one_line(capsys, argv: list[str], code: int = 2) -> str:
    """Run ``folnet ARGV``; it must exit ``code`` with exactly one line on stderr."""
    capsys.readouterr()
    got = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("owned") / "run"
    assert main(pretrain_args(out)) == 0
    return out


# -- the lock and the clean-up -----------------------------------------------------------------


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    line = one_line(capsys, pretrain_args(out))
    assert ".lock" in line and "link" in line
    assert victim.read_text() == "precious"
    assert tree(out) == [".lock"]  # nothing written beside it


def test_a_lock_that_is_a_fifo_is_refused_without_blocking(tmp_path, capsys, finished):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / ".lock").unlink()
    os.mkfifo(out / ".lock")
    line = one_line(capsys, pretrain_args(out, "--resume", steps=3))
    assert "not a regular file" in line


def test_a_link_inside_out_is_refused(tmp_path, capsys, finished):
    victim = tmp_path / "victim.jsonl"
    victim.write_text("keep\n")
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "log.jsonl").unlink()
    (out / "log.jsonl").symlink_to(victim)
    line = one_line(capsys, pretrain_args(out, "--resume", steps=3))
    assert "symbolic link" in line and "log.jsonl" in line
    assert victim.read_text() == "keep\n"


def test_leftover_names_are_only_folnets_own():
    ours = [".tmp-step_3-4242-0a0b0c0d", ".trash-final-1a2b3c4d", ".tmp-log.jsonl-9-00aa11bb",
            ".config.json.k2j3h4x9.tmp"]
    users = [".tmp-draft.txt", ".trash-ideas.md", ".session.vim.tmp", ".tmp-", ".trash-x",
             ".tmp-notes-12-xyz", "draft.tmp", ".notes.tmp"]
    assert [n for n in ours if not is_leftover(n)] == []
    assert [n for n in users if is_leftover(n)] == []


def test_user_files_in_a_run_survive_its_clean_up(tmp_path, capsys, finished):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    user = [out / ".tmp-draft.txt", out / "notes" / ".trash-ideas.md",
            out / "notes" / ".session.vim.tmp", out / "checkpoints" / ".tmp-mine"]
    for path in user:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    ours = out / "checkpoints" / ".tmp-step_9-4242-deadbeef"
    ours.mkdir()
    assert main(pretrain_args(out, "--resume", steps=3)) == 0
    assert all(p.read_text() == "mine" for p in user)
    assert not ours.exists()
    assert remove_leftovers(out) == [] and all(p.exists() for p in user)


def test_a_folder_of_user_files_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "thesis"
    files = {".tmp-draft.txt": "a", "notes/.trash-ideas.md": "b", "notes/.session.vim.tmp": "c"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = tree(out)
    line = one_line(capsys, pretrain_args(out))
    assert "is not a folnet run" in line and str(out) in line
    assert tree(out) == before
    assert {n: (out / n).read_text() for n in files} == files


@pytest.mark.parametrize("given", ["", " ", ".", "~", ".."])  # "/": see the next test
def test_out_that_is_not_a_runs_own_is_refused_before_anything_is_written(
        tmp_path, capsys, monkeypatch, given):
    home, work = tmp_path / "home", tmp_path / "home" / "work"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    line = one_line(capsys, pretrain_args(given))
    assert "--out" in line
    assert tree(home) == ["work", "work/keep.txt"]


def test_the_root_and_the_home_directory_are_refused_by_the_check_itself(tmp_path):
    # Checked on the function, not through a run: a run that failed to refuse "/" would fill
    # the root directory (as folnet once did) and walk all of it for clean-up.
    from folnet.train.engine.outdir import check_out

    for given, why in (("/", "root"), (os.path.expanduser("~"), "home directory"),
                       (str(Path.cwd().parent), "above the current")):
        with pytest.raises(FolnetError, match=why):
            check_out(given)
    assert check_out(tmp_path / "new") == tmp_path / "new"


def test_the_same_checks_guard_finetune_evaluate_and_ablate(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    for argv, command in ((["finetune", "--from", "nowhere", "--out", ".", *FINETUNE],
                           "finetune"),
                          (["evaluate", "--model", "nowhere", "--out", ""], "evaluate")):
        line = one_line(capsys, argv)
        assert line.startswith(f"folnet {command}: error: --out")
    from folnet.train.ablate.run import run_plan

    with pytest.raises(FolnetError, match="current directory"):
        run_plan(None, ".")  # the plan is never reached: --out is checked first
    assert tree(tmp_path) == ["keep.txt"]


# -- a failed start leaves nothing ---------------------------------------------------------------


def test_a_data_fault_found_after_the_lock_leaves_nothing(tmp_path, capsys):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("title,body\nA,Alice is the mother of Bob.\nB,Bob is the son of Alice.\n")
    blank = tmp_path / "blank.txt"
    blank.write_text("   \n\n \t \n")
    for data in (corpus, blank):
        out = tmp_path / f"out-{data.stem}"
        one_line(capsys, pretrain_args(out, "--data", str(data)))
        assert not out.exists()
    empty = tmp_path / "empty-out"  # an empty folder given: emptied again, kept
    empty.mkdir()
    one_line(capsys, pretrain_args(empty, "--data", str(corpus)))
    assert empty.is_dir() and tree(empty) == []


# -- integrity of what a run reads ---------------------------------------------------------------


def swap_two_token_ids(tokenizer_json: Path) -> None:
    payload = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = payload["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    tokenizer_json.write_text(json.dumps(payload), encoding="utf-8")


def test_a_tokenizer_with_swapped_ids_is_refused_wherever_a_run_is_read(
        tmp_path, capsys, finished):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    tokenizer = run / "final" / "tokenizer.json"
    swap_two_token_ids(tokenizer)
    line = one_line(capsys, ["finetune", "--from", str(run), "--out", str(tmp_path / "ft"),
                             *FINETUNE])
    assert str(tokenizer) in line and "corrupt" in line
    assert not (tmp_path / "ft").exists()
    line = one_line(capsys, pretrain_args(tmp_path / "again", "--init-from", str(run)))
    assert str(tokenizer) in line
    assert not (tmp_path / "again").exists()
    with pytest.raises(FolnetError, match=r"tokenizer\.json"):
        folnet.from_pretrained(run)


def test_a_directory_without_checksums_warns_once_or_is_refused_when_strict(
        tmp_path, capsys, finished, monkeypatch):
    final = tmp_path / "final"
    shutil.copytree(finished / "final", final)
    as_written_before_checksums(final)
    capsys.readouterr()
    folnet.from_pretrained(final)
    folnet.from_pretrained(final)
    err = capsys.readouterr().err
    assert err.count("has no checksums.json") == 1 and "UNCHECKED" in err
    line = one_line(capsys, ["finetune", "--from", str(final), "--out", str(tmp_path / "ft"),
                             "--strict-checksums", *FINETUNE])
    assert "has no checksums.json" in line and "strict" in line
    monkeypatch.setenv("FOLNET_STRICT_CHECKSUMS", "1")
    with pytest.raises(FolnetError, match=r"no checksums\.json"):
        folnet.from_pretrained(final)


# -- Ctrl-C -----------------------------------------------------------------------------------


def test_ctrl_c_in_pretraining_is_one_line_exit_130_naming_the_resume(
        tmp_path, capsys, monkeypatch):
    import folnet.train.pretrain.loop as loop

    real, calls = loop._optimizer_step, []

    def interrupted_at_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "_optimizer_step", interrupted_at_the_third)
    out = tmp_path / "run"
    line = one_line(capsys, pretrain_args(out, steps=5), code=130)
    assert "interrupted at step 2 of 5" in line and "--resume" in line and "step 2" in line
    monkeypatch.setattr(loop, "_optimizer_step", real)
    assert main(pretrain_args(out, "--resume", steps=5)) == 0


def test_ctrl_c_before_the_first_step_leaves_nothing(tmp_path, capsys, monkeypatch):
    import folnet.train.pretrain.setup_run as setup_run

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(setup_run, "build_pretraining_model", stop)
    out = tmp_path / "run"
    line = one_line(capsys, pretrain_args(out), code=130)
    assert line == "folnet pretrain: interrupted"
    assert not out.exists()


def test_a_folnet_directory_that_lost_its_manifest_is_refused(tmp_path, capsys, finished):
    """The hostile case: final/'s checksums.json deleted and a weight byte flipped loaded
    without a word. Its config.json says folnet wrote a manifest, so the directory is refused
    by every loader, the flip never read; one written before manifests still loads."""
    final = tmp_path / "final"
    shutil.copytree(finished / "final", final)
    (final / "checksums.json").unlink()
    weights = final / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(FolnetError, match=r"has lost its checksums\.json: its config\.json "
                                          r"says folnet wrote one"):
        folnet.from_pretrained(final)
    line = one_line(capsys, ["finetune", "--from", str(final), "--out", str(tmp_path / "ft"),
                             *FINETUNE])
    assert "has lost its checksums.json" in line and "write_model_manifest" in line
    assert not (tmp_path / "ft").exists()
