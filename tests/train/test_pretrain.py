"""`folnet pretrain`: configuration, the run directory, bad input, and learning on English."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import pytest
import torch
from runs import cli_error

import folnet
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.engine.runlog import read_log
from folnet.train.pretrain.config import PretrainConfig, default_config_path, load_pretrain_config
from folnet.train.pretrain.loop import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")

SPECS = default_config_path().parent


def tiny_run(out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "tiny", "--data", "kinship", "--kinship-documents", "40",
            "--vocab-size", "200", "--seq-len", "32", "--batch-size", "4", "--steps", "4",
            "--log-every", "2", "--save-every", "2", "--no-progress", "--out", str(out),
            *extra]


# -- configuration -----------------------------------------------------------------------------


def test_defaults_file_matches_the_dataclass():
    assert load_pretrain_config() == PretrainConfig()
    kin = load_pretrain_config(SPECS / "kinship-tiny.toml")
    assert (kin.preset, kin.data, kin.batch_size, kin.ops) == ("tiny", "kinship", 32, "j.at")
    assert kin.model_overrides["initializer_range"] == 0.15


def test_file_then_flags_override_and_model_tables_merge(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('preset = "small"\nsteps = 50\nlr = 1\n[model]\nD2 = 8\nL = 3\n')
    config = load_pretrain_config(path, {"steps": 7, "model": {"L": 1}})
    assert (config.preset, config.steps, config.lr) == ("small", 7, 1.0)
    assert isinstance(config.lr, float)
    assert config.model_overrides == {"D2": 8, "L": 1}
    assert config.objective == "nsp"  # untouched defaults stay


def test_config_errors_name_the_file_or_the_flag(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("batch_sise = 8\n")
    with pytest.raises(FolnetError, match=r"bad\.toml.*batch_sise"):
        load_pretrain_config(path)
    with pytest.raises(FolnetError, match="--batch-size must be >= 1"):
        PretrainConfig(batch_size=0)
    with pytest.raises(FolnetError, match="--objective 'mlm' is unknown"):
        PretrainConfig(objective="mlm")
    with pytest.raises(FolnetError, match="--grad-accum 3"):
        PretrainConfig(batch_size=8, grad_accum=3)
    with pytest.raises(FolnetError, match="--model vocab_size"):
        PretrainConfig(model={"vocab_size": 10})
    with pytest.raises(FolnetError, match="--steps must be an integer"):
        PretrainConfig(steps=1.5)
    with pytest.raises(FolnetError, match="--config"):
        load_pretrain_config(tmp_path / "missing.toml")


# -- a run and its directory -------------------------------------------------------------------


def test_run_directory_holds_checkpoints_tokenizer_logs_and_final_model(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny_run(out, "--num-workers", "1", "--keep-last", "5")) == 0
    printed = capsys.readouterr().out
    closing = [line for line in printed.splitlines() if "final model" in line]
    assert closing == [f"done: 4 steps; final model and tokenizer in {out / 'final'}"]
    # --no-progress: a plain line per logged step (every 2), no bar's carriage returns
    steps = [line.split(":")[0] for line in printed.splitlines() if " step " in line]
    assert [s.split()[-1] for s in steps if "/4" in s] == ["2/4", "4/4"], printed
    assert "\r" not in printed
    for step in (2, 4):
        ckpt = out / "checkpoints" / f"step_{step}"
        names = {p.name for p in ckpt.iterdir()}
        assert {"config.json", "model.safetensors", "trainer.pt", "tokenizer.json",
                "vocab.txt"} <= names
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    records = read_log(out / "log.jsonl")
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "tokens_per_s",
                    "elapsed"):
            assert isinstance(record[key], float) and math.isfinite(record[key]), key
        assert record["tokens_per_s"] > 0
        assert record["loss"] == pytest.approx(record["mlm_loss"] + record["nsp_loss"])
    assert (out / "log.csv").read_text().splitlines()[0].startswith("step,loss,mlm_loss")
    model = folnet.from_pretrained(out / "final")
    tokenizer = load_tokenizer(out / "final")
    assert model.head == "pretraining" and model.cfg.vocab_size == tokenizer.vocab_size
    ids = torch.tensor([[tokenizer.cls_id, *tokenizer.encode("alice is the mother of bob"),
                         tokenizer.sep_id]])
    assert model.eval()(ids).mlm_logits.shape == (1, ids.shape[1], tokenizer.vocab_size)


def test_the_trained_tokenizer_is_written_to_out_once(tmp_path, monkeypatch):
    """Other ranks load OUT/tokenizer right after the barrier; rank 0 writing it a second time
    then raced them (a rank once read a half-written tokenizer_config.json under DDP)."""
    from folnet.train.data.tokenizer import FolnetTokenizer

    out = tmp_path / "run"
    saved: list[Path] = []
    original = FolnetTokenizer.save

    def counting(self, directory):
        saved.append(Path(directory))
        return original(self, directory)

    monkeypatch.setattr(FolnetTokenizer, "save", counting)
    assert main(tiny_run(out)) == 0
    assert saved.count(out / "tokenizer") == 1
    assert json.loads((out / "tokenizer" / "tokenizer_config.json").read_text())[
        "model_max_length"] > 0


def test_mixed_precision_and_activation_checkpointing_run(tmp_path):
    for precision in ("bf16", "fp16"):
        config = PretrainConfig(preset="tiny", data="kinship", kinship_documents=40,
                                vocab_size=200, seq_len=32, batch_size=4, steps=2, log_every=1,
                                precision=precision, activation_checkpointing=True,
                                optimizer="adamw", progress=False, tensorboard=False,
                                out=str(tmp_path / precision))
        pretrain(config)
        losses = [r["loss"] for r in read_log(tmp_path / precision / "log.jsonl")]
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_memory_mode_reaches_every_layer_and_a_tight_run_trains(tmp_path, monkeypatch):
    """--memory-mode sets the layers' mode (`folnet.set_memory`); a run in "tight" recomputes
    its blocks and returns the heap around each mixer stage's backward pass."""
    import folnet.arch.layer.row_blocks as blocked
    import folnet.train.pretrain.setup_run as setup_run

    with pytest.raises(FolnetError, match=r"--memory-mode 'tiled' is unknown; use 'auto', "
                                          r"'full', 'blocked' or 'tight'"):
        PretrainConfig(memory_mode="tiled")
    modes, released = [], []
    real = setup_run.set_memory
    monkeypatch.setattr(setup_run, "set_memory",
                        lambda model, mode: (modes.append(mode), real(model, mode))[1])
    monkeypatch.setattr(blocked, "release_free_memory", lambda: released.append(1))
    config = PretrainConfig(preset="tiny", data="kinship", kinship_documents=40, vocab_size=200,
                            seq_len=32, batch_size=4, steps=2, log_every=1, optimizer="adamw",
                            memory_mode="tight", progress=False, out=str(tmp_path / "run"))
    pretrain(config)
    losses = [r["loss"] for r in read_log(tmp_path / "run" / "log.jsonl")]
    assert modes == ["tight"] and len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert len(released) == 2 * 2 * 3  # 2 steps x 2 layers x (forward, backward twice)


# -- bad input ---------------------------------------------------------------------------------


def test_missing_and_empty_data_paths(tmp_path, capsys):
    missing = tmp_path / "nowhere.txt"
    args = tiny_run(tmp_path / "a")
    args[args.index("kinship")] = str(missing)
    err = cli_error(capsys, args)
    assert "--data" in err and str(missing) in err and "does not exist" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    args[args.index(str(missing))] = str(empty)
    err = cli_error(capsys, args)
    assert str(empty) in err and "empty" in err


def test_corpus_without_a_usable_document(tmp_path, capsys):
    corpus = tmp_path / "lonely.txt"
    corpus.write_text("".join(f"Sentence number {i} stands alone.\n\n" for i in range(30)))
    args = tiny_run(tmp_path / "a")
    args[args.index("kinship")] = str(corpus)
    err = cli_error(capsys, args)
    assert "--data" in err and str(corpus) in err and "no usable document" in err


def test_tokenizer_without_special_tokens(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "a", "is"]) + "\n")
    err = cli_error(capsys, [*tiny_run(tmp_path / "a"), "--tokenizer", str(vocab)])
    assert "--tokenizer" in err and str(vocab) in err and "[MASK]" in err


# -- learning on real English ------------------------------------------------------------------


def unigram_entropy(dataset, collator) -> tuple[float, float]:
    """Entropy (nats) of the masked-token targets, and the share of the commonest target:
    the MLM loss and accuracy of the best context-free predictor."""
    counts: collections.Counter[int] = collections.Counter()
    for start in range(0, len(dataset), 512):
        batch = collator([dataset[i] for i in range(start, min(start + 512, len(dataset)))])
        labels = batch["mlm_labels"]
        counts.update(labels[labels != -100].tolist())
    total = sum(counts.values())
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    return entropy, max(counts.values()) / total


@pytest.mark.slow
def test_mlm_loss_falls_well_below_the_unigram_entropy_on_english(tmp_path):
    from english import write_english_corpus

    from folnet.train.data.config import PretrainDataConfig
    from folnet.train.data.corpus import build_pretraining_dataset
    from folnet.train.data.masking import PretrainingCollator
    from folnet.train.data.tokenizer import train_tokenizer

    corpus = write_english_corpus(tmp_path / "english.txt", max_bytes=1_500_000)
    assert corpus.stat().st_size > 1_000_000
    train_tokenizer([corpus], vocab_size=4000).save(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    data = PretrainDataConfig(seq_len=32, cache_dir=str(tmp_path / "cache"))
    baseline, top_share = unigram_entropy(build_pretraining_dataset(corpus, tokenizer, data),
                                          PretrainingCollator.from_config(tokenizer, data))
    # LAMB at the paper's peak learning rate scale; j.a (FOLNet's attention-only variant) and
    # 32 tokens keep the binary stream small enough for 600 CPU steps.
    config = PretrainConfig(ops="j.a", preset="tiny", model={"dropout": 0.0},
                            data=str(corpus), tokenizer=str(tmp_path / "tok"), seq_len=32,
                            batch_size=32, steps=600, lr=2e-2, warmup_ratio=0.05,
                            log_every=20, save_every=600, cache_dir=str(tmp_path / "cache"),
                            progress=False, tensorboard=False, out=str(tmp_path / "run"))
    pretrain(config)
    log = read_log(tmp_path / "run" / "log.jsonl")
    first = log[0]["mlm_loss"]
    final = sum(r["mlm_loss"] for r in log[-3:]) / 3  # the last 60 steps
    accuracy = sum(r["mlm_acc"] for r in log[-3:]) / 3
    print(f"unigram entropy {baseline:.3f} nats; MLM loss {first:.3f} -> {final:.3f}; "
          f"accuracy {accuracy:.3f} (commonest target {top_share:.3f})")
    assert first > baseline + 1.0  # starts near uniform over the vocabulary
    assert final < baseline - 0.5, (final, baseline)
    assert accuracy > 2 * top_share


def test_trimmed_batches_train_as_the_padded_ones(tmp_path, monkeypatch):
    """The loop cuts each batch after its last real column (--trim-padding, on by default):
    at dropout 0 the losses, gradient norms and final weights equal the run that keeps
    seq_len columns, up to the order of floating-point sums (dropout draws over the batch's
    shape, so with dropout the masks differ), and the trimmed run really saw shorter
    batches."""
    import folnet.train.pretrain.loop as loop

    widths: list[tuple[int, int]] = []
    original = loop.trim_padding

    def recording(batch):
        cut = original(batch)
        widths.append((batch["input_ids"].shape[1], cut["input_ids"].shape[1]))
        return cut

    monkeypatch.setattr(loop, "trim_padding", recording)
    runs = {}
    for name, flag in (("trimmed", "--trim-padding"), ("padded", "--no-trim-padding")):
        assert main(tiny_run(tmp_path / name, "--data", "kinship-symbolic", "--seq-len", "64",
                            "--log-every", "1", "--model", "dropout=0.0", flag)) == 0
        runs[name] = read_log(tmp_path / name / "log.jsonl")
    assert len(widths) == 4 and all(cut < full == 64 for full, cut in widths), widths
    for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
        trimmed = [r[key] for r in runs["trimmed"]]
        padded = [r[key] for r in runs["padded"]]
        assert trimmed == pytest.approx(padded, rel=1e-4, abs=1e-6), key
    assert [r["mlm_acc"] for r in runs["trimmed"]] == [r["mlm_acc"] for r in runs["padded"]]
    a = folnet.from_pretrained(tmp_path / "trimmed" / "final").state_dict()
    b = folnet.from_pretrained(tmp_path / "padded" / "final").state_dict()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, worst


def test_deterministic_mode_is_set_only_when_it_changes_and_the_callers_comes_back(
        tmp_path, monkeypatch):
    """torch's first use_deterministic_algorithms call imports its compiler stack (about 1 s per
    process): a run at the default it already has makes no call; a run that changes it
    restores the caller's mode, warn_only included."""
    calls = []
    real = torch.use_deterministic_algorithms

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "use_deterministic_algorithms", counting)
    assert not torch.are_deterministic_algorithms_enabled()
    assert main(tiny_run(tmp_path / "default")) == 0
    assert calls == []
    real(True, warn_only=True)
    try:
        assert main(tiny_run(tmp_path / "strict", "--deterministic")) == 0
        assert calls == [((True,), {"warn_only": False}), ((True,), {"warn_only": True})]
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        real(False)
