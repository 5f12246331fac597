"""`folnet pretrain --kind decoder` (the next token over packed documents, or after a prefix:
the PrefixLM) and `--kind encoder-decoder` (span corruption), through the same command, options
and run machinery as the encoder's: the log's own columns, the final model that generates, a
resume after SIGKILL equal to the uninterrupted run, and two gloo processes equal to one."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs import cli_error, kill_at_first_checkpoint, write
from safetensors.torch import load_file
from tolerances import assert_at_most

import folnet
from folnet.cli import main
from folnet.train.data.span_rows import SENTINELS
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.engine.runlog import read_log

pytestmark = pytest.mark.usefixtures("one_thread")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}
#: A real text: plain English paragraphs, one document each, blank lines between.
TEXT = """The river rises in the hills north of the town. In spring it floods the low fields, and
the farmers move their sheep to higher ground. By summer the water is low and clear.

The old mill stands where the river bends. It was built of grey stone two hundred years ago.
Nobody grinds flour there now, but children still play in the yard behind it.

A narrow bridge crosses the river below the mill. Carts used to cross it on market days. Now
people walk over it to reach the station on the far bank.
"""


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """One tokenizer for every run (two trainings may number equal-count tokens apart)."""
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.tokenizer import train_tokenizer

    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts=texts, vocab_size=300).save(path)
    return str(path)


#: Each kind beside the encoder, and its objective.
KINDS = {"decoder": "clm", "encoder-decoder": "span"}
#: ... and the decoder's PrefixLM too: (kind, objective).
RUNS = [("decoder", "clm"), ("decoder", "prefix"), ("encoder-decoder", "span")]


def args(out: Path, tokenizer: str, steps: int, *extra: str, kind: str = "decoder",
         objective: str | None = None) -> list[str]:
    objective = objective or KINDS[kind]
    return ["pretrain", "--kind", kind, "--objective", objective, "--preset", "tiny",
            "--data", "kinship", "--kinship-documents", "60", "--tokenizer", tokenizer,
            "--seq-len", "32", "--batch-size", "8", "--grad-accum", "2", "--steps", str(steps),
            "--lr", "5e-3", "--warmup-ratio", "0.1", "--log-every", "1", "--save-every", "3",
            "--keep-last", "2", "--deterministic", "--no-progress", "--no-tensorboard",
            "--out", str(out), *extra]


@pytest.mark.parametrize(("kind", "objective"), RUNS)
def test_each_kind_pretrains_on_kinship_and_its_model_generates(tmp_path, tokenizer_dir, kind,
                                                                objective):
    assert main(args(tmp_path / "run", tokenizer_dir, 12, "--optimizer", "adamw",
                     "--heldout", "0.1", "--save-every", "6", kind=kind,
                     objective=objective)) == 0
    log = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 13))
    assert {"loss", "lm_acc", "perplexity"} <= log[0].keys() and "mlm_loss" not in log[0]
    losses = [r["loss"] for r in log]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3  # it learns
    assert all(r["perplexity"] == pytest.approx(math.exp(r["loss"])) for r in log)
    # the held-out documents' loss, at each checkpoint: measured, falling
    heldout = [json.loads(line) for line in
               (tmp_path / "run" / "heldout.jsonl").read_text().splitlines()]
    assert [r["step"] for r in heldout] == [6, 12] and heldout[0]["rows"] > 0
    assert heldout[1]["loss"] < heldout[0]["loss"]
    assert heldout[1]["perplexity"] == pytest.approx(math.exp(heldout[1]["loss"]))
    final = tmp_path / "run" / "final"
    model = folnet.from_pretrained(final).eval()
    assert model.cfg.kind == kind
    tok = load_tokenizer(final)
    prompt = torch.tensor([tok.encode("the mother of")])
    out = model.generate(prompt, max_new_tokens=5)
    if kind == "decoder":  # the prompt, continued
        assert out.shape == (1, prompt.shape[1] + 5)
        assert torch.equal(out[:, : prompt.shape[1]], prompt)
    else:  # the decoder's tokens (behind its start token), the sentinels among the vocabulary
        assert out.shape[0] == 1 and 2 <= out.shape[1] <= 6
        assert model.cfg.vocab_size == tok.vocab_size and len(tok.sentinel_ids) == SENTINELS
        said = tok.decode(out[0].tolist())  # a sentinel decodes by its name, or is skipped
        assert all(f"<extra_id_{i}>" in said for i in range(SENTINELS) if
                   tok.sentinel_ids[i] in out[0].tolist())


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_pretrains_on_a_text_file(tmp_path, tokenizer_dir, kind):
    corpus = write(tmp_path / "river.txt", TEXT)
    command = args(tmp_path / "run", tokenizer_dir, 8, "--optimizer", "adamw", "--lr", "1e-2",
                   kind=kind)
    command[command.index("kinship")] = str(corpus)
    assert main(command) == 0
    losses = [r["loss"] for r in read_log(tmp_path / "run" / "log.jsonl")]
    assert len(losses) == 8 and losses[-1] < losses[0]


def test_a_decoder_with_its_own_bpe_tokenizer_generates_text(tmp_path):
    """No --tokenizer: the run trains a byte-level BPE on the corpus; the model's output
    decodes as text that begins with the prompt, exactly."""
    corpus = write(tmp_path / "river.txt", TEXT * 4)
    assert main(["pretrain", "--kind", "decoder", "--objective", "clm", "--preset", "tiny",
                 "--data", str(corpus), "--tokenizer-model", "bpe", "--vocab-size", "320",
                 "--seq-len", "32", "--batch-size", "8", "--steps", "6", "--lr", "1e-2",
                 "--optimizer", "adamw", "--log-every", "3", "--no-progress",
                 "--no-tensorboard", "--out", str(tmp_path / "run")]) == 0
    final = tmp_path / "run" / "final"
    tok, model = load_tokenizer(final), folnet.from_pretrained(final).eval()
    assert not tok.wordpiece
    prompt = "The old mill stands"
    ids = torch.tensor([tok.encode(prompt)])
    text = tok.decode(model.generate(ids, max_new_tokens=8)[0].tolist())
    assert text.startswith(prompt) and len(text) > len(prompt)


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize(("kind", "objective"), RUNS)
def test_sigkill_then_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, tokenizer_dir,
                                                                        kind, objective):
    def launch(command: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "folnet.train.pretrain", *command[1:]],
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    steps = 6
    run = {"kind": kind, "objective": objective}
    reference = launch(args(tmp_path / "ref", tokenizer_dir, steps, **run))
    victim = launch(args(tmp_path / "run", tokenizer_dir, steps, **run))
    kill_at_first_checkpoint(victim, tmp_path / "run")
    assert not (tmp_path / "run" / "final").exists(), "the run finished before the kill"
    assert reference.wait() == 0, reference.stdout.read().decode()
    resumed = launch(args(tmp_path / "run", tokenizer_dir, steps, "--resume", **run))
    output = resumed.communicate()[0].decode()
    assert resumed.returncode == 0 and "resumed from" in output, output
    a = load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ref_log = read_log(tmp_path / "ref" / "log.jsonl")
    run_log = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in run_log] == list(range(1, steps + 1))
    assert [r["loss"] for r in run_log] == [r["loss"] for r in ref_log]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow(seconds=40)
@pytest.mark.numerics
@pytest.mark.parametrize("kind", KINDS)
def test_two_gloo_processes_match_one_process(tmp_path, tokenizer_dir, kind):
    """Global batch 8 = 2 micro-batches of 4 rows, each split 2 + 2 over the ranks; the loss
    is normalised by the step's global count of next-token targets."""
    assert main(args(tmp_path / "one", tokenizer_dir, 4, "--model", "dropout=0.0",
                     kind=kind)) == 0
    two = args(tmp_path / "two", tokenizer_dir, 4, "--model", "dropout=0.0", kind=kind)[1:]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(_free_port()), "-m", "folnet.train.pretrain", *two],
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    x = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    y = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    assert x.keys() == y.keys()
    assert_at_most(max(float((x[k] - y[k]).abs().max()) for k in x), 1e-6,
                   f"{kind} weights, two processes against one")
    one_log, two_log = (read_log(tmp_path / d / "log.jsonl") for d in ("one", "two"))
    for a, b in zip(one_log, two_log, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["tokens"] == a["tokens"]


def test_the_objective_and_kind_must_agree(capsys, tmp_path):
    err = cli_error(capsys, ["pretrain", "--kind", "decoder", "--out", str(tmp_path / "a")])
    assert "--objective nsp is not a decoder's: --kind decoder pretrains with --objective clm " \
        "or prefix" in err
    err = cli_error(capsys, ["pretrain", "--objective", "clm", "--out", str(tmp_path / "b")])
    assert "--objective clm is not an encoder's: --kind encoder pretrains with --objective " \
           "nsp or sop" in err
    err = cli_error(capsys, ["pretrain", "--kind", "decoder", "--objective", "clm",
                             "--streaming", "--out", str(tmp_path / "c")])
    assert "--streaming makes an encoder's sentence pairs" in err
    err = cli_error(capsys, ["pretrain", "--kind", "seq2seq", "--out", str(tmp_path / "d")])
    assert "--kind" in err and "'encoder', 'decoder' or 'encoder-decoder'" in err
    err = cli_error(capsys, ["pretrain", "--kind", "encoder-decoder", "--objective", "span",
                             "--span-rate", "0", "--out", str(tmp_path / "e")])
    assert "--span-rate must lie in (0, 1), got 0.0" in err
    err = cli_error(capsys, ["pretrain", "--heldout", "0.1", "--out", str(tmp_path / "f")])
    assert "--heldout is a decoder's or an encoder-decoder's" in err
