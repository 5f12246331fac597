"""One corpus in every format `--data` accepts reads to the same examples, and a streamed run
killed with SIGKILL resumes to the weights of an uninterrupted one."""

from __future__ import annotations

import bz2
import csv
import gzip
import importlib.util
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from runs import kill_at_first_checkpoint

from folnet.errors import FolnetError
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.corpus import build_pretraining_dataset
from folnet.train.data.documents import iter_documents, split_sentences
from folnet.train.data.kinship import pretraining_documents
from folnet.train.data.streaming import iter_pretraining_examples
from folnet.train.data.tokenizer import train_tokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.runlog import read_log

pytestmark = pytest.mark.usefixtures("one_thread")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}


def kinship_texts(count: int) -> list[str]:
    """Documents with several lines (a line break is a sentence boundary) and commas, quotes
    and non-ASCII text inside, which CSV and JSON must carry through unchanged."""
    texts = []
    for d, document in enumerate(pretraining_documents(count, seed=3)):
        lines = [" ".join(str(s).split()) for s in document]
        lines.append(f'Note {d}: "quoted", comma, café.')
        texts.append("\n".join(lines))
    return texts


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return kinship_texts(40)


@pytest.fixture(scope="module")
def tok(texts):
    return train_tokenizer(texts=[s for t in texts for s in split_sentences(t)], vocab_size=400)


def write_formats(root: Path, texts: list[str]) -> dict[str, tuple[Path | str, str]]:
    """The corpus as every accepted kind of input: name -> (--data, --text-column)."""
    import datasets

    root.mkdir(parents=True, exist_ok=True)
    plain = "\n\n".join(texts) + "\n"
    (root / "c.txt").write_text(plain, encoding="utf-8")
    for suffix, opener in ((".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)):
        with opener(root / f"c.txt{suffix}", "wt", encoding="utf-8") as handle:
            handle.write(plain)
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))
    (root / "c.jsonl").write_text(lines, encoding="utf-8")
    with gzip.open(root / "c.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(lines)
    (root / "c.json").write_text(json.dumps([{"text": t} for t in texts]), encoding="utf-8")
    with (root / "c.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "body"])
        writer.writerows(enumerate(texts))
    table = datasets.Dataset.from_dict({"text": texts, "id": list(range(len(texts)))})
    table.to_parquet(str(root / "c.parquet"))
    table.save_to_disk(str(root / "saved"))
    datasets.DatasetDict({"train": table}).save_to_disk(str(root / "saved_dict"))
    arrow = next((root / "saved").glob("*.arrow"))  # save_to_disk writes Arrow stream files
    (root / "c.arrow").write_bytes(arrow.read_bytes())
    shards = root / "shards"
    shards.mkdir()
    half = len(texts) // 2
    (shards / "part-0.txt").write_text("\n\n".join(texts[:half]), encoding="utf-8")
    (shards / "part-1.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[half:]), encoding="utf-8")
    formats: dict[str, tuple[Path | str, str]] = {
        name: (root / name, "text")
        for name in ("c.txt", "c.txt.gz", "c.txt.bz2", "c.txt.xz", "c.jsonl", "c.jsonl.gz",
                     "c.json", "c.parquet", "c.arrow", "saved", "saved_dict", "shards")}
    formats["c.csv"] = (root / "c.csv", "body")
    formats["glob"] = (str(shards / "part-*"), "text")
    if importlib.util.find_spec("zstandard") is not None:
        import zstandard

        (root / "c.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(plain.encode()))
        formats["c.txt.zst"] = (root / "c.txt.zst", "text")
    return formats


def test_every_format_gives_the_same_tokenised_examples(tmp_path, texts, tok):
    formats = write_formats(tmp_path / "data", texts)
    assert {"c.txt", "c.txt.gz", "c.jsonl", "c.csv", "c.parquet", "saved"} <= set(formats)
    expected_documents = [split_sentences(t) for t in texts]
    config = PretrainDataConfig(seq_len=48, seed=5)
    reference = build_pretraining_dataset(formats["c.txt"][0], tok, config)
    assert reference.num_documents == len(texts) and len(reference) > len(texts)
    streamed_reference = [e["input_ids"] for e in iter_pretraining_examples(
        formats["c.txt"][0], tok, PretrainDataConfig(seq_len=48, seed=5, streaming=True))]
    for name, (data, column) in formats.items():
        assert list(iter_documents(data, text_column=column)) == expected_documents, name
        dataset = build_pretraining_dataset(
            data, tok, PretrainDataConfig(seq_len=48, seed=5, text_column=column))
        for field in ("tokens", "offsets", "len_a", "labels"):
            assert np.array_equal(getattr(dataset, field), getattr(reference, field)), (name, field)
        stream = iter_pretraining_examples(
            data, tok, PretrainDataConfig(seq_len=48, seed=5, streaming=True, text_column=column))
        streamed = [e["input_ids"] for e in stream]
        assert len(streamed) == len(streamed_reference), name
        assert all(torch.equal(a, b) for a, b in zip(streamed, streamed_reference, strict=True))


def test_text_column_is_part_of_the_cache_key(tmp_path, tok):
    import datasets

    path = tmp_path / "two.parquet"
    datasets.Dataset.from_dict({
        "text": [f"Alpha {i} one. Alpha two. Alpha three." for i in range(20)],
        "body": [f"Beta {i} one. Beta two. Beta three." for i in range(20)],
    }).to_parquet(str(path))
    cache = tmp_path / "cache"
    first = build_pretraining_dataset(path, tok, PretrainDataConfig(seq_len=32, cache_dir=cache))
    other = build_pretraining_dataset(
        path, tok, PretrainDataConfig(seq_len=32, cache_dir=cache, text_column="body"))
    assert first.cache_status == "miss" and other.cache_status == "miss"
    assert "alpha" in tok.decode(first[0]["input_ids"]).lower()
    assert "beta" in tok.decode(other[0]["input_ids"]).lower()
    with pytest.raises(FolnetError, match=r"has no column 'title' \(columns: \['body', 'text'\]\)"):
        build_pretraining_dataset(path, tok, PretrainDataConfig(seq_len=32, text_column="title"))


# -- streamed run: SIGKILL, then --resume -------------------------------------------------------


def run_args(out: Path, data: Path, tokenizer: Path, steps: int, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--data", str(data), "--text-column", "body", "--streaming",
            "--tokenizer", str(tokenizer), "--seq-len", "32", "--batch-size", "8",
            "--grad-accum", "2", "--steps", str(steps), "--lr", "5e-3", "--warmup-ratio", "0.1",
            "--log-every", "1", "--save-every", "3", "--keep-last", "2", "--deterministic",
            "--no-progress", "--no-tensorboard", "--out", str(out), *extra]


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "folnet.train.pretrain", *args],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_streamed_run_killed_and_resumed_matches_an_uninterrupted_one(tmp_path, texts, tok):
    """An 8-document CSV streams 16 micro-batches of 4 per epoch, so 15 steps of two
    micro-batches cross an epoch: the resumed run replays the stream of the saved epoch up to
    the saved block."""
    data = tmp_path / "corpus.csv"
    with data.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "body"])
        writer.writerows(enumerate(texts[:8]))
    tokenizer = tmp_path / "tok"
    tok.save(tokenizer)
    steps = 15
    reference = launch(run_args(tmp_path / "ref", data, tokenizer, steps))
    victim = launch(run_args(tmp_path / "run", data, tokenizer, steps))
    kill_at_first_checkpoint(victim, tmp_path / "run")
    assert not (tmp_path / "run" / "final").exists(), "the run finished before the kill"
    assert ckpt.list_checkpoints(tmp_path / "run")[-1][0] < steps
    assert reference.wait() == 0, reference.stdout.read().decode()
    ref_log = read_log(tmp_path / "ref" / "log.jsonl")
    assert max(r["epoch"] for r in ref_log if "epoch" in r) >= 1, "the run never left epoch 0"

    resumed = launch(run_args(tmp_path / "run", data, tokenizer, steps, "--resume"))
    output = resumed.communicate()[0].decode()
    assert resumed.returncode == 0, output
    assert "resumed from" in output
    a = load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    run_log = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in run_log] == list(range(1, steps + 1))
    assert [r["loss"] for r in run_log] == [r["loss"] for r in ref_log]
