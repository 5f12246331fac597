"""Data-parallel pretraining: batch sharding, and torchrun (gloo) against one process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tolerances import assert_at_most

from folnet.arch.convert import read_sharded_model
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.engine.distributed import (
    DistContext,
    GlobalBatchSampler,
    resolve_device,
    shard_slice,
    shutdown,
)
from folnet.train.engine.runlog import read_log

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}


def test_global_batches_are_deterministic_and_resume_mid_epoch():
    sampler = GlobalBatchSampler(23, 4, seed=3)
    assert sampler.batches_per_epoch == 5  # the last 3 examples of an epoch are dropped
    stream = iter(sampler)
    first = [next(stream) for _ in range(12)]
    assert sorted(i for b in first[:5] for i in b) == sorted(set(i for b in first[:5] for i in b))
    assert first[:5] != first[5:10]  # a new order each epoch
    again = iter(GlobalBatchSampler(23, 4, seed=3, start=(1, 2)))
    assert [next(again) for _ in range(5)] == first[7:12]
    with pytest.raises(FolnetError, match="fewer than one global micro-batch"):
        GlobalBatchSampler(3, 4)


def test_rank_shards_tile_the_global_micro_batch():
    rows = torch.arange(12)
    shards = [rows[shard_slice(12, DistContext(rank=r, world_size=3))] for r in range(3)]
    assert torch.equal(torch.cat(shards), rows)
    with pytest.raises(FolnetError, match="cannot be split evenly"):
        shard_slice(10, DistContext(rank=0, world_size=3))


def test_resolve_device_names_what_it_cannot_give(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        for name in ("cuda", "cuda:0"):  # asked for and absent: refused now, not at first use
            with pytest.raises(FolnetError, match=f"--device '{name}' was requested but CUDA"):
                resolve_device(name)
    with pytest.raises(FolnetError, match=r"--device 'gpu' is not a torch device \(use auto"):
        resolve_device("gpu")
    # On a machine with two GPUs: auto and cuda give each torchrun process the GPU of its
    # local rank; cuda:N is GPU N, and a GPU that is not there is named with the limit.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 1)
    assert resolve_device("cuda:1", local_rank=0) == torch.device("cuda", 1)
    with pytest.raises(FolnetError, match=r"'cuda:2': this machine has 2 CUDA device\(s\), "
                                          r"cuda:0 to cuda:1"):
        resolve_device("cuda:2")


class _Holder:
    """Stands for FSDP's states: an object in a reference cycle that holds the process group."""

    def __init__(self, group: object) -> None:
        self.group = group
        self.me = self


def test_shutdown_frees_cycles_that_hold_the_group_before_destroying_it(tmp_path, monkeypatch):
    import torch.distributed as dist

    assert not dist.is_initialized()  # (no test leaves a group behind)
    destroy = dist.destroy_process_group
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        holder = _Holder(dist.group.WORLD)
        alive = weakref.ref(holder)
        del holder  # unreachable now, but only a collection frees a cycle
        assert alive() is not None
        seen: list[bool] = []

        def recorded(*args: object, **kwargs: object) -> None:
            seen.append(alive() is None)
            destroy(*args, **kwargs)

        monkeypatch.setattr(dist, "destroy_process_group", recorded)
        shutdown(DistContext(rank=0, world_size=1, owns_group=True), finished=True)
        assert seen == [True]  # the cycle went before the group did
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            destroy()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A fixed tokenizer and the single-process reference run (dropout 0)."""
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("ddp")
    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    train_tokenizer(texts=texts, vocab_size=300).save(root / "tok")
    args = ["--preset", "tiny", "--model", "dropout=0.0", "--data", "kinship",
            "--kinship-documents", "60", "--tokenizer", str(root / "tok"), "--seq-len", "32",
            "--batch-size", "8", "--grad-accum", "2", "--steps", "4", "--lr", "1e-2",
            "--log-every", "1", "--save-every", "2", "--no-progress", "--no-tensorboard"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["pretrain", *args, "--out", str(root / "one")]) == 0
    finally:
        torch.set_num_threads(threads)
    return root, args


def torchrun(args: list[str], out: Path) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "-m", "folnet.train.pretrain", *args, "--out", str(out)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


def max_difference(a: Path, b: Path) -> float:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert x.keys() == y.keys()
    return max(float((x[k] - y[k]).abs().max()) for k in x)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_gloo_processes_match_one_process(setup, mode):
    """Global batch 8 = 2 accumulation micro-batches of 4 rows, each split 2 + 2 over the
    ranks; the loss is normalised by the global target counts, so the gradient, and hence the
    weights, equal the single-process run's up to float rounding."""
    root, args = setup
    extra = ["--fsdp"] if mode == "fsdp" else []
    torchrun([*args, *extra], root / mode)
    difference = max_difference(root / "one" / "final", root / mode / "final")
    print(f"{mode}: max |w_2proc - w_1proc| = {difference:.3g}")
    assert_at_most(difference, 1e-6, f"{mode} weights against one process")
    one = read_log(root / "one" / "log.jsonl")
    two = read_log(root / mode / "log.jsonl")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(one, two, strict=True):  # metrics are reduced over both ranks
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["mlm_acc"] == pytest.approx(a["mlm_acc"])
        assert b["tokens"] == a["tokens"]
    # The checkpoint holds one RNG state per rank and the weights: whole under DDP, sharded
    # under FSDP (every rank's shards, read here into one model: test_sharded_checkpoints)
    step = root / mode / "checkpoints" / "step_4"
    state = torch.load(step / "trainer.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    if mode == "fsdp":
        want = load_file(str(root / "one" / "checkpoints" / "step_4" / "model.safetensors"))
        got = read_sharded_model(step).state_dict()
        assert got.keys() == want.keys()
        difference = max(float((got[k] - want[k]).abs().max()) for k in want)
    else:
        difference = max_difference(root / "one" / "checkpoints" / "step_4", step)
    assert_at_most(difference, 1e-6, f"{mode} checkpoint weights against one process")
