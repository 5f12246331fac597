"""Sharded checkpoints (``folnet pretrain --fsdp``): the layout, a resume at another world
size, a whole checkpoint resumed under FSDP, and the conversion to a model directory."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tolerances import assert_at_most

import folnet
from folnet.arch.convert import read_sharded_model
from folnet.arch.io.model_dir import SHARDS_DIR
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.distributed import init_distributed, shutdown
from folnet.train.engine.runlog import read_log
from folnet.train.engine.sharded import model_prefix, temporary_name

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}
#: Resumed at another world size against resumed at the same one, max |difference| over the
#: final weights: FSDP reduces the gradients over another number of shards, so the sums round
#: differently. Measured 1.1e-8 (2 -> 1 and 1 -> 2) here; 2e-7 leaves more than 10x.
RESHARD_ABS = 2e-7


# -- fast: the pure parts --------------------------------------------------------------------


def test_temporary_name_is_a_leftover_the_next_run_removes(tmp_path):
    from folnet.atomic_write import is_leftover

    final = tmp_path / "checkpoints" / "step_4"
    name = temporary_name(final, "0123abcd")
    assert name.parent == final.parent and is_leftover(name.name)
    with pytest.raises(FolnetError, match=r"token 'xyz' must be 8 hex digits"):
        temporary_name(final, "xyz")


def test_model_prefix_names_the_model_inside_its_engine():
    inner = torch.nn.Linear(2, 2)
    engine = torch.nn.Sequential()
    engine.add_module("model", inner)
    assert model_prefix(engine, inner) == "model."
    assert model_prefix(inner, inner) == ""
    with pytest.raises(FolnetError, match="does not contain the model"):
        model_prefix(engine, torch.nn.Linear(2, 2))


def test_a_sharded_checkpoint_is_refused_as_a_model_directory_with_how_to_convert(tmp_path):
    model = folnet.build_model("jmc.atp", preset="tiny")
    step = tmp_path / "run" / "checkpoints" / "step_2"
    model.save_pretrained(step)
    (step / "model.safetensors").unlink()
    (step / SHARDS_DIR).mkdir()
    for path in (step, tmp_path / "run"):  # the checkpoint itself, or a run without final/
        with pytest.raises(FolnetError, match=r"sharded training checkpoint .* `folnet "
                                              r"convert .*step_2 DEST`"):
            folnet.from_pretrained(path)
    with pytest.raises(FolnetError, match=r"has no shards/.metadata"):
        ckpt.check_intact(step)


def test_fsdp_gives_a_single_process_a_group_of_one(monkeypatch):
    import torch.distributed as dist

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not init_distributed("cpu").owns_group
    ctx = init_distributed("cpu", group=True)
    try:
        assert ctx.owns_group and dist.get_world_size() == 1 and not ctx.is_distributed
    finally:
        shutdown(ctx, finished=True)
    assert not dist.is_initialized()


# -- slow: torchrun (gloo) runs ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int, args: list[str], out: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "-m", "folnet.train.pretrain", *args, "--out", str(out)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two FSDP runs of 4 steps, checkpoints at 2 and 4: with 2 processes and with 1."""
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("sharded")
    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    train_tokenizer(texts=texts, vocab_size=300).save(root / "tok")
    args = ["--preset", "tiny", "--model", "dropout=0.0", "--data", "kinship",
            "--kinship-documents", "60", "--tokenizer", str(root / "tok"), "--seq-len", "32",
            "--batch-size", "8", "--grad-accum", "2", "--steps", "4", "--lr", "1e-2",
            "--log-every", "1", "--save-every", "2", "--no-progress", "--no-tensorboard"]
    for nproc in (2, 1):
        torchrun(nproc, [*args, "--fsdp"], root / f"fsdp{nproc}")
    return root, args


def resumed(source: Path, dest: Path, nproc: int, *extra: str) -> Path:
    """`source`'s run from its step_2 checkpoint to the end, with `nproc` processes."""
    shutil.copytree(source, dest)
    shutil.rmtree(dest / "final")
    for step, path in ckpt.list_checkpoints(dest):
        if step > 2:
            shutil.rmtree(path)
    torchrun(nproc, ["--resume", *extra], dest)
    return dest


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| over every key (the keys must be the same)."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.numerics
def test_every_rank_writes_its_shards_and_no_model_file(runs):
    root, _ = runs
    for nproc in (2, 1):
        step = root / f"fsdp{nproc}" / "checkpoints" / "step_2"
        assert not (step / "model.safetensors").exists()
        shards = sorted(p.name for p in (step / SHARDS_DIR).iterdir())
        assert shards == [".metadata", *(f"__{r}_0.distcp" for r in range(nproc))]
        listed = json.loads((step / "checksums.json").read_text())["files"]
        assert {f"{SHARDS_DIR}/{name}" for name in shards} <= set(listed)
        ckpt.check_intact(step)
        trainer = ckpt.load_trainer_state(step)
        assert trainer[ckpt.SHARDED_KEY] == SHARDS_DIR and "optimizer" not in trainer
        assert trainer["world_size"] == nproc and len(trainer["rng"]) == nproc
    # what a save cut short leaves (a rank killed while writing its shards): a temporary the
    # listing never sees, which the next run in OUT deletes
    run = root / "killed"
    shutil.copytree(root / "fsdp2", run)
    cut = temporary_name(run / "checkpoints" / "step_6", "0123abcd") / SHARDS_DIR
    cut.mkdir(parents=True)
    (cut / "__0_0.distcp").write_bytes(b"half")
    assert [step for step, _ in ckpt.list_checkpoints(run)] == [2, 4]
    assert ckpt.resolve_resume(run, "latest")[0] == run / "checkpoints" / "step_4"
    ckpt.remove_stale_temporaries(run)
    assert not cut.parent.exists()
    # a damaged shard is found by the checksums, and --resume would skip the checkpoint
    copy = root / "damaged"
    shutil.copytree(root / "fsdp2" / "checkpoints" / "step_2", copy)
    shard = copy / SHARDS_DIR / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, (0, 0))  # older than the manifest: damage, not a rewrite
    with pytest.raises(FolnetError, match=r"__1_0\.distcp"):
        ckpt.check_intact(copy)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("source,other", [(2, 1), (1, 2)])
def test_a_sharded_checkpoint_resumes_at_another_world_size(runs, source, other):
    """DCP reshards on load: the run resumed with `other` processes trains as the one resumed
    with `source` processes, up to the rounding of the other reduction order."""
    root, _ = runs
    run = root / f"fsdp{source}"
    same = resumed(run, root / f"resume{source}to{source}", source)
    changed = resumed(run, root / f"resume{source}to{other}", other)
    # at the same size the resume is exact: the uninterrupted run's weights, bit for bit
    assert max_difference(final_weights(same), final_weights(run)) == 0.0
    difference = max_difference(final_weights(same), final_weights(changed))
    print(f"{source} -> {other} processes: max |w - w_same| = {difference:.3g}")
    assert_at_most(difference, RESHARD_ABS, f"resumed {source} -> {other} against {source}")
    a, b = read_log(same / "log.jsonl"), read_log(changed / "log.jsonl")
    assert [r["step"] for r in b][-2:] == [3, 4]
    for x, y in zip(a[-2:], b[-2:], strict=True):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-5) and y["tokens"] == x["tokens"]
    # the new checkpoints are sharded at the new world size
    assert len(list((changed / "checkpoints" / "step_4" / SHARDS_DIR).glob("*.distcp"))) == other


@pytest.mark.slow
@pytest.mark.numerics
def test_convert_writes_a_model_directory_of_the_steps_weights(runs, tmp_path, capsys):
    root, _ = runs
    step = root / "fsdp2" / "checkpoints" / "step_4"
    assert main(["convert", str(step), str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert (tmp_path / "model" / "tokenizer.json").is_file()
    model = folnet.from_pretrained(tmp_path / "model")
    want = final_weights(root / "fsdp2")  # final/ is the weights after step 4, gathered
    got = model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["step"] == 4
    read = read_sharded_model(root / "fsdp1" / "checkpoints" / "step_4")  # one rank's too
    assert all(torch.equal(read.state_dict()[k], v)
               for k, v in final_weights(root / "fsdp1").items())
    assert main(["convert", str(step), str(tmp_path / "model")]) == 2  # not over a model
    assert "exists and is not an empty directory" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.numerics
def test_an_fsdp_run_resumes_a_whole_checkpoint(runs, tmp_path):
    """Checkpoints written before sharding (whole: model.safetensors, the full optimiser
    state) still resume, with or without --fsdp and at any world size."""
    _, args = runs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["pretrain", *args, "--out", str(tmp_path / "whole")]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "whole" / "checkpoints" / "step_2" / "model.safetensors").is_file()
    fsdp = resumed(tmp_path / "whole", tmp_path / "fsdp", 2, "--fsdp")
    assert (fsdp / "checkpoints" / "step_4" / SHARDS_DIR).is_dir()
    difference = max_difference(final_weights(tmp_path / "whole"), final_weights(fsdp))
    print(f"whole checkpoint resumed under FSDP: max |w - w_whole| = {difference:.3g}")
    assert_at_most(difference, 1e-6, "a whole checkpoint resumed with 2 FSDP processes")


@pytest.mark.slow
@pytest.mark.numerics
def test_a_sharded_checkpoint_resumes_without_fsdp(runs, tmp_path):
    """One process without --fsdp (no process group) reads the shards whole, and goes on
    writing whole checkpoints."""
    root, _ = runs
    dest = tmp_path / "plain"
    shutil.copytree(root / "fsdp2", dest)
    shutil.rmtree(dest / "final")
    shutil.rmtree(dest / "checkpoints" / "step_4")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["pretrain", "--out", str(dest), "--resume", "--no-fsdp"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (dest / "checkpoints" / "step_4" / "model.safetensors").is_file()
    difference = max_difference(final_weights(root / "fsdp2"), final_weights(dest))
    print(f"2 FSDP processes -> 1 without FSDP: max |w - w_2| = {difference:.3g}")
    assert_at_most(difference, RESHARD_ABS, "a sharded checkpoint resumed without FSDP")
