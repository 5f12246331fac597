"""Finetuning configuration, bad input (each by its message), and the Python API pieces:
the generic loop with multiple-choice and token-classification heads, batch trimming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tolerances import assert_close

import folnet
import folnet.train.finetune.cli  # registers the finetune and evaluate commands
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import load_tokenizer, train_tokenizer
from folnet.train.finetune.config import FinetuneConfig, load_finetune_config
from folnet.train.finetune.data import resolve_task
from folnet.train.finetune.from_python import (
    encode_token_classification,
    finetune_multiple_choice,
    finetune_token_classification,
    predict_multiple_choice,
    predict_token_classification,
)
from folnet.train.finetune.loop import LoopSettings, batches, trim

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat sat on the mat", "a dog runs in the park", "the man is not happy",
         "two girls play on the beach", "it rains in the city", "a boy eats an apple"]
QUICK = ["--epochs", "1", "--batch-size", "4", "--no-progress", "--no-tensorboard"]
HEADER = "index\tsentence1\tsentence2\tlabel\n"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("pretrain")
    tokenizer = train_tokenizer(texts=TEXTS * 4, vocab_size=120)
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", L=1,
                               vocab_size=tokenizer.vocab_size)
    model.save_pretrained(run / "final")
    tokenizer.save(run / "final")
    return run


def rte(root: Path, train: str | None = None, dev: str | None = None) -> Path:
    rows = [f"{i}\t{TEXTS[i % 6]}\t{TEXTS[(i + 1) % 6]}\t"
            f"{('entailment', 'not_entailment')[i % 2]}\n" for i in range(8)]
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.tsv").write_text(HEADER + ("".join(rows) if train is None else train))
    if dev is not False:
        (root / "dev.tsv").write_text(HEADER + ("".join(rows[:4]) if dev is None else dev))
    return root


def fails(args: list[str], capsys) -> str:
    """Run the CLI, expect exit code 2, return the error line."""
    assert main(args) == 2
    return capsys.readouterr().err


def finetune_args(data: Path | str, pretrained: Path | str, out: Path, task="glue/rte"):
    return ["finetune", "--task", task, "--data", str(data), "--from", str(pretrained),
            "--out", str(out), *QUICK]


# -- configuration -------------------------------------------------------------------------------


def test_defaults_file_matches_the_dataclass_and_task_defaults_resolve(tmp_path):
    assert load_finetune_config() == FinetuneConfig()
    hyper = FinetuneConfig().hyper(resolve_task("glue/rte"))
    assert (hyper.epochs, hyper.lr, hyper.batch_size, hyper.max_len) == (10, 1e-4, 16, 128)
    assert (hyper.warmup_ratio, hyper.weight_decay, hyper.adam_eps, hyper.betas,
            hyper.dropout) == (0.06, 0.01, 1e-6, (0.9, 0.999), 0.1)
    assert FinetuneConfig().hyper(resolve_task("squad2")).doc_stride == 128
    assert FinetuneConfig().hyper(resolve_task("kinship")).epochs == 100
    mnli = FinetuneConfig(lr=2e-5, max_len=64).hyper(resolve_task("glue/mnli"))
    assert (mnli.epochs, mnli.lr, mnli.batch_size, mnli.max_len) == (3, 2e-5, 32, 64)
    path = tmp_path / "ft.toml"
    path.write_text('task = "folio"\nseeds = 5\nkinship_train_k = "2-4"\n')
    config = load_finetune_config(path, {"seeds": 3})
    assert (config.task, config.seeds, config.kinship_train_k) == ("folio", 3, (2, 3, 4))
    assert config.seed_list == [0, 1, 2]


@pytest.mark.parametrize(("changes", "message"), [
    ({"seeds": 0}, "--seeds must be >= 1, got 0"),
    ({"lr": -1.0}, "--lr must be >= 0"),
    ({"keep": "first"}, "--keep 'first' is unknown"),
    ({"precision": "fp8"}, "--precision 'fp8' is unknown"),
    ({"epochs": 1.5}, "--epochs must be an integer"),
    ({"kinship_train_k": "2,11"}, "--kinship-train-k must list distinct chain lengths"),
    ({"warmup_ratio": 2.0}, r"--warmup-ratio must lie in \[0.0, 1.0\]"),
])
def test_bad_options_name_the_flag(changes, message):
    with pytest.raises(FolnetError, match=message):
        FinetuneConfig(**changes)


def test_cli_seeds_below_one_and_unknown_option_in_file(tmp_path, pretrained, capsys):
    err = fails([*finetune_args(rte(tmp_path / "RTE"), pretrained, tmp_path / "o"), "--seeds",
                 "0"], capsys)
    assert "folnet finetune: error: --seeds must be >= 1, got 0" in err
    bad = tmp_path / "bad.toml"
    bad.write_text("sedes = 3\n")
    err = fails(["finetune", "--config", str(bad)], capsys)
    assert "bad.toml: unknown option(s) ['sedes']" in err


# -- bad input -----------------------------------------------------------------------------------


def test_missing_split_file_names_it(tmp_path, pretrained, capsys):
    data = rte(tmp_path / "RTE", dev=False)
    err = fails(finetune_args(data, pretrained, tmp_path / "o"), capsys)
    assert "glue/rte split 'validation': expected the file" in err
    assert str(data / "dev.tsv") in err and "holds: train.tsv" in err


def test_malformed_row_is_quoted_with_its_line(tmp_path, pretrained, capsys):
    data = rte(tmp_path / "RTE", train="0\ta\tb\tentailment\n1\tonly two\tcolumns\n")
    err = fails(finetune_args(data, pretrained, tmp_path / "o"), capsys)
    assert f"{data / 'train.tsv'}:3: expected 4 tab-separated columns" in err


def test_label_outside_the_label_set(tmp_path, pretrained, capsys):
    data = rte(tmp_path / "RTE", dev="0\ta cat\ta dog\tmaybe\n")
    err = fails(finetune_args(data, pretrained, tmp_path / "o"), capsys)
    assert f"{data / 'dev.tsv'}:2: label 'maybe' is not a glue/rte label" in err


def test_evaluate_refuses_labels_the_model_never_learned(tmp_path, pretrained, capsys):
    data = tmp_path / "clutrr"
    data.mkdir()
    head = ",id,story,query,target\n"
    rows = "".join(f"{i},x,[A] met [B].,\"('A', 'B')\",{t}\n"
                   for i, t in enumerate(["son", "aunt", "son", "aunt"]))
    (data / "1.2_train.csv").write_text(head + rows)
    (data / "1.2_test.csv").write_text(head + rows)
    out = tmp_path / "out"
    assert main(finetune_args(data, pretrained, out, task="clutrr")) == 0
    (data / "1.2_test.csv").write_text(head + "0,x,[A] met [B].,\"('A', 'B')\",niece\n")
    err = fails(["evaluate", "--model", str(out), "--data", str(data), "--out",
                 str(tmp_path / "ev")], capsys)
    assert "1.2_test.csv:2: label 'niece' does not occur in the CLUTRR train file(s)" in err
    err = fails(["evaluate", "--model", str(out), "--task", "glue/rte", "--data", str(data),
                 "--out", str(tmp_path / "ev")], capsys)
    assert "was finetuned on 'clutrr', not 'glue/rte'" in err


def test_vocabulary_mismatch_by_size_and_by_fingerprint(tmp_path, pretrained, capsys):
    data = rte(tmp_path / "RTE")
    other = train_tokenizer(texts=TEXTS * 4, vocab_size=90)
    other.save(tmp_path / "small_tok")
    err = fails([*finetune_args(data, pretrained, tmp_path / "o"), "--tokenizer",
                 str(tmp_path / "small_tok")], capsys)
    tok = load_tokenizer(pretrained / "final")
    assert (f"the model's vocabulary has {tok.vocab_size} tokens but the tokenizer has "
            f"{other.vocab_size}") in err
    out = tmp_path / "out"
    assert main(finetune_args(data, pretrained, out)) == 0
    vocab = (out / "model" / "vocab.txt").read_text().splitlines()
    vocab[-1], vocab[-2] = vocab[-2], vocab[-1]  # same size, other ids
    (tmp_path / "swapped").mkdir()
    (tmp_path / "swapped" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    err = fails(["evaluate", "--model", str(out), "--data", str(data), "--out",
                 str(tmp_path / "ev"), "--tokenizer", str(tmp_path / "swapped" / "vocab.txt")],
                capsys)
    assert "tokenizer fingerprint" in err and "same size, different vocabulary" in err


def test_from_must_be_a_folnet_checkpoint(tmp_path, pretrained, capsys):
    data = rte(tmp_path / "RTE")
    err = fails(finetune_args(data, tmp_path / "nowhere", tmp_path / "o"), capsys)
    assert f"--from {str(tmp_path / 'nowhere')!r} does not exist" in err
    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    err = fails(finetune_args(data, empty, tmp_path / "o"), capsys)
    assert "is not a folnet checkpoint" in err and "the run has no final/ yet" in err
    foreign = tmp_path / "foreign"
    shutil.copytree(pretrained / "final", foreign)
    (foreign / "config.json").write_text(json.dumps({"format": "huggingface"}))
    (foreign / "checksums.json").unlink()  # edited by hand: the manifest would refuse it first
    err = fails(finetune_args(data, foreign, tmp_path / "o"), capsys)
    assert "not a folnet checkpoint (format 'huggingface')" in err
    notok = tmp_path / "notok"
    shutil.copytree(pretrained / "final", notok)
    (notok / "tokenizer.json").unlink()
    (notok / "vocab.txt").unlink()
    err = fails(finetune_args(data, notok, tmp_path / "o"), capsys)
    assert "has no tokenizer.json or vocab.txt; pass --tokenizer" in err


def test_task_data_and_output_errors(tmp_path, pretrained, capsys):
    data = rte(tmp_path / "RTE")
    err = fails(finetune_args(data, pretrained, tmp_path / "o", task="glue/wnli"), capsys)
    assert "--task 'glue/wnli' is unknown: expected 'glue/mnli'" in err and "'kinship'" in err
    err = fails(["finetune", "--task", "glue/rte", "--from", str(pretrained), "--out",
                 str(tmp_path / "o")], capsys)
    assert "--data is required for glue/rte" in err
    err = fails(finetune_args("kinship_data", pretrained, tmp_path / "o", task="kinship"),
                capsys)
    assert "the kinship task is generated, give --data kinship or no --data" in err
    err = fails(["finetune", "--task", "glue/rte", "--data", str(data), "--from",
                 str(pretrained)], capsys)
    assert "--out is required" in err
    clutrr = tmp_path / "clutrr"
    err = fails([*finetune_args(clutrr, pretrained, tmp_path / "o", task="clutrr"), "--keep",
                 "best"], capsys)
    assert "--keep best chooses the epoch by a validation split, and clutrr has none" in err
    out = tmp_path / "done"
    assert main(finetune_args(data, pretrained, out)) == 0
    err = fails(finetune_args(data, pretrained, out), capsys)
    assert "already holds a finetuning run (eval.json); pass --overwrite" in err
    assert main([*finetune_args(data, pretrained, out), "--overwrite"]) == 0
    err = fails(["evaluate", "--model", str(pretrained), "--data", str(data), "--out",
                 str(tmp_path / "ev")], capsys)
    assert "holds a 'pretraining' model, not a finetuned one" in err


def test_unlabelled_test_split_gets_predictions_without_metrics(tmp_path, pretrained):
    data = rte(tmp_path / "RTE")
    (data / "test.tsv").write_text("index\tsentence1\tsentence2\n0\ta cat\ta dog\n1\tx\ty\n")
    out = tmp_path / "out"
    assert main(finetune_args(data, pretrained, out)) == 0
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(data), "--splits",
                 "validation,test", "--out", str(tmp_path / "ev")]) == 0
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert result["metrics"]["test"] == {} and "accuracy" in result["metrics"]["validation"]
    lines = (tmp_path / "ev" / "predictions" / "test.tsv").read_text().splitlines()
    assert lines[0] == "id\tprediction\tlabel" and len(lines) == 3
    assert all(line.split("\t")[2] == "" for line in lines[1:])


# -- Python API ----------------------------------------------------------------------------------


@pytest.mark.numerics
def test_trimmed_batches_give_the_same_outputs_as_padded_ones():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="classification", num_labels=3,
                               L=1, vocab_size=50).eval()
    ids = torch.randint(5, 50, (3, 12))
    mask = torch.zeros(3, 12, dtype=torch.bool)
    for row, length in enumerate((5, 7, 4)):
        mask[row, :length] = True
    full = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
            "labels": torch.tensor([0, 1, 2])}
    cut = trim(full)
    assert cut["input_ids"].shape == (3, 7) and cut["labels"].shape == (3,)
    with torch.no_grad():
        padded = model(**{k: v for k, v in full.items() if k != "labels"}).logits
        trimmed = model(**{k: v for k, v in cut.items() if k != "labels"}).logits
    assert_close(trimmed, padded, rtol=1e-5, atol=1e-6, what="trimmed logits")
    rows = [b["input_ids"].shape[0] for b in batches(full, 2)]
    assert rows == [2, 1]


def test_multiple_choice_and_token_classification_api(pretrained):
    tokenizer = load_tokenizer(pretrained / "final")
    contexts = [TEXTS[i % 6] for i in range(8)]
    choices = [[TEXTS[(i + 1) % 6], TEXTS[i % 6], TEXTS[(i + 2) % 6]] for i in range(8)]
    settings = LoopSettings(lr=1e-3, warmup_ratio=0.0)
    model = finetune_multiple_choice(pretrained, contexts, choices, [1] * 8, epochs=2,
                                     batch_size=4, max_len=24, settings=settings)
    picked = predict_multiple_choice(model, tokenizer, contexts, choices, max_len=24)
    assert len(picked) == 8 and all(p in (0, 1, 2) for p in picked)
    assert model.head == "multiple-choice"

    words = [t.split() for t in TEXTS]
    tags = [["ANIMAL" if w in ("cat", "dog") else "O" for w in s] for s in words]
    encoded = encode_token_classification(words, tags, ["O", "ANIMAL"], tokenizer, max_len=12)
    first = encoded["labels"][0]  # [CLS] the cat sat on the mat [SEP]: one label per word
    assert first[0] == -100 and (first != -100).sum() == len(words[0])
    assert first[2] == 1 and encoded["word_index"][0, 1:7].tolist() == list(range(6))
    model = finetune_token_classification(
        pretrained, words * 4, tags * 4, ["O", "ANIMAL"], epochs=4, batch_size=4, max_len=12,
        settings=LoopSettings(lr=3e-3, warmup_ratio=0.0))
    predicted = predict_token_classification(model, tokenizer, words, ["O", "ANIMAL"],
                                             max_len=12)
    assert [len(p) for p in predicted] == [len(w) for w in words]
    correct = sum(p == t for ps, ts in zip(predicted, tags, strict=True)
                  for p, t in zip(ps, ts, strict=True))
    assert correct / sum(len(t) for t in tags) >= 0.9
    with pytest.raises(FolnetError, match="tag 'PLANT' is not in the label list"):
        encode_token_classification([["cat"]], [["PLANT"]], ["O", "ANIMAL"], tokenizer)
