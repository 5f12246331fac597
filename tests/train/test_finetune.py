"""`folnet finetune` / `folnet evaluate` end to end on small files in every published format.

A tiny "pretrained" checkpoint is made once per module in the layout `folnet pretrain` writes
(``RUN/final/`` with config.json, model.safetensors, tokenizer.json, vocab.txt); each test
writes a few rows of one task's files, finetunes through the CLI entry point and checks
eval.json and the prediction files row by row.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

import pytest
from runs import tiny_pretrained_run, write

from folnet.cli import main
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.engine.runlog import read_log
from folnet.train.finetune.evaluate import read_predictions

pytestmark = pytest.mark.usefixtures("one_thread")

PREMISES = [
    "the cat sat on the mat", "a dog is running in the park", "the man is not happy today",
    "two girls play football on the beach", "it rains in the city tonight",
    "the old woman reads a long book", "a boy eats an apple", "the sun shines over the hills",
]
FAST = ["--epochs", "1", "--batch-size", "4", "--no-progress", "--no-tensorboard",
        "--log-every", "1", "--eval-batch-size", "8"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A pretraining run directory: RUN/final holds a tiny model and its tokenizer."""
    texts = [*PREMISES, "how is anna related to tom ? who is she ?", "true false unknown"]
    return tiny_pretrained_run(tmp_path_factory.mktemp("pretrain"), texts, vocab_size=160)


def tsv(rows: list[list[str]]) -> str:
    return "".join("\t".join(map(str, r)) + "\n" for r in rows)


def run_finetune(task: str, data: Path | None, pretrained: Path, out: Path, *extra: str) -> dict:
    args = ["finetune", "--task", task, "--from", str(pretrained), "--out", str(out), *FAST,
            *extra]
    if data is not None:
        args += ["--data", str(data)]
    assert main(args) == 0
    return json.loads((out / "eval.json").read_text())


def check_model_dir(out: Path, task: str) -> None:
    meta = json.loads((out / "model" / "config.json").read_text())
    assert meta["task"] == task and meta["format"] == "folnet"
    assert meta["tokenizer_fingerprint"] == load_tokenizer(out / "model").fingerprint
    assert (out / "model" / "model.safetensors").is_file()


# -- GLUE ----------------------------------------------------------------------------------------


def rte_dir(root: Path, n_train: int = 12, n_dev: int = 6) -> Path:
    header = ["index", "sentence1", "sentence2", "label"]
    labels = ("entailment", "not_entailment")
    rows = [[i, PREMISES[i % 8], PREMISES[(i + 1) % 8], labels[i % 2]] for i in range(n_train)]
    dev = [[i, PREMISES[(i + 3) % 8], PREMISES[i % 8], labels[(i // 2) % 2]] for i in range(n_dev)]
    write(root / "train.tsv", tsv([header, *rows]))
    write(root / "dev.tsv", tsv([header, *dev]))
    return root


def test_rte_two_seeds_median_predictions_logs_and_evaluate(tmp_path, pretrained, capsys):
    data = rte_dir(tmp_path / "RTE")
    out = tmp_path / "out"
    result = run_finetune("glue/rte", data, pretrained, out, "--seeds", "2", "--epochs", "2",
                          "--eval-every-epoch", "--keep", "best")
    assert "glue/rte validation (median of 2 seed(s)): accuracy" in capsys.readouterr().out
    assert result["task"] == "glue/rte" and result["main_metric"] == "accuracy"
    assert result["seeds"] == [0, 1] and result["headline_split"] == "validation"
    per_seed = [result["per_seed"][s]["validation"]["accuracy"] for s in ("0", "1")]
    assert all(a * 6 == pytest.approx(round(a * 6), abs=1e-9) for a in per_seed)  # of 6 pairs
    assert result["metrics"]["validation"]["accuracy"] == pytest.approx(statistics.median(per_seed))
    assert result["headline"] == result["metrics"]["validation"]["accuracy"]
    # Table 7 defaults where no flag was given; the flags where one was
    assert result["hyper"]["lr"] == 1e-4 and result["hyper"]["max_len"] == 128
    assert result["hyper"]["epochs"] == 2 and result["hyper"]["batch_size"] == 4
    assert [h["epoch"] for h in result["history"]["0"]] == [1, 2]

    rows = read_predictions(out / "predictions" / "validation.tsv")
    assert [r["id"] for r in rows] == [f"validation-{line}" for line in range(2, 8)]
    assert {r["prediction"] for r in rows} <= {"entailment", "not_entailment"}
    assert [r["label"] for r in rows] == [("entailment", "not_entailment")[(i // 2) % 2]
                                          for i in range(6)]
    chosen = str(result["chosen_seed"])
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
    assert accuracy == pytest.approx(result["per_seed"][chosen]["validation"]["accuracy"])
    check_model_dir(out, "glue/rte")
    assert not (out / "seed_0" / "model").exists() and not (out / "seed_1" / "model").exists()

    records = read_log(out / "seed_0" / "log.jsonl")
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))  # 12 rows / 4 per batch x 2 epochs
    assert all(r["loss"] > 0 and r["lr"] >= 0 and r["samples_per_s"] > 0 for r in steps)
    evals = [r for r in records if "eval/validation/accuracy" in r]
    assert len(evals) == 3  # after each of the 2 epochs, and the final model
    assert (out / "seed_0" / "log.csv").read_text().startswith("step,epoch,loss,lr")

    again = tmp_path / "again"
    assert main(["evaluate", "--model", str(out), "--data", str(data), "--out", str(again)]) == 0
    scored = json.loads((again / "eval.json").read_text())
    assert scored["metrics"] == result["per_seed"][chosen]
    assert read_predictions(again / "predictions" / "validation.tsv") == rows


def test_stsb_regression_scores_correlations(tmp_path, pretrained):
    header = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
              "sentence1", "sentence2", "score"]
    rows = [[i, "main", "f", "2012", i, "s", "s", PREMISES[i % 8], PREMISES[(i + i // 8) % 8],
             f"{(i * 0.7) % 5:.2f}"] for i in range(12)]
    data = tmp_path / "STS-B"
    write(data / "train.tsv", tsv([header, *rows]))
    write(data / "dev.tsv", tsv([header, *rows[:7]]))
    result = run_finetune("glue/stsb", data, pretrained, tmp_path / "out")
    metrics = result["metrics"]["validation"]
    assert set(metrics) == {"pearson", "spearman"}
    rows_out = read_predictions(tmp_path / "out" / "predictions" / "validation.tsv")
    labels = [float(r["label"]) for r in rows_out]
    assert labels == [float(r[-1]) for r in rows[:7]]
    predictions = [float(r["prediction"]) for r in rows_out]
    # both correlations again by hand from the written predictions (rounded when written:
    # 2e-4 apart measured, so 2e-3)
    assert metrics["pearson"] == pytest.approx(statistics.correlation(predictions, labels),
                                               abs=2e-3)
    assert metrics["spearman"] == pytest.approx(
        statistics.correlation(average_ranks(predictions), average_ranks(labels)), abs=2e-3)
    meta = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert meta["num_labels"] == 1 and meta["labels"] is None


def average_ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank (what Spearman's correlation ranks by)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for position in order[i:j + 1]:
            ranks[position] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def test_cola_headerless_files_and_mcc(tmp_path, pretrained):
    rows = [["gj04", str(i % 2), "" if i % 2 else "*", PREMISES[i % 8]] for i in range(10)]
    data = tmp_path / "CoLA"
    write(data / "train.tsv", tsv(rows))
    write(data / "dev.tsv", tsv(rows[:5]))
    result = run_finetune("glue/cola", data, pretrained, tmp_path / "out")
    assert set(result["metrics"]["validation"]) == {"mcc"}
    rows_out = read_predictions(tmp_path / "out" / "predictions" / "validation.tsv")
    assert [r["label"] for r in rows_out] == ["0", "1", "0", "1", "0"]
    assert {r["prediction"] for r in rows_out} <= {"0", "1"}
    pairs = [(r["prediction"], r["label"]) for r in rows_out]  # Matthews' formula by hand
    tp, tn = pairs.count(("1", "1")), pairs.count(("0", "0"))
    fp, fn = pairs.count(("1", "0")), pairs.count(("0", "1"))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    mcc = (tp * tn - fp * fn) / denominator if denominator else 0.0
    assert result["metrics"]["validation"]["mcc"] == pytest.approx(mcc, abs=1e-9)


def test_mnli_scores_both_validation_splits(tmp_path, pretrained):
    header = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "gold_label"]
    labels = ("entailment", "neutral", "contradiction")
    rows = [[i, i, i, "g", PREMISES[i % 8], PREMISES[(i + 2) % 8], labels[i % 3]]
            for i in range(9)]
    data = tmp_path / "MNLI"
    write(data / "train.tsv", tsv([header, *rows]))
    write(data / "dev_matched.tsv", tsv([header, *rows[:4]]))
    write(data / "dev_mismatched.tsv", tsv([header, *rows[4:7]]))
    result = run_finetune("glue/mnli", tmp_path, pretrained, tmp_path / "out")  # via MNLI/
    assert set(result["metrics"]) == {"validation_matched", "validation_mismatched"}
    assert len(read_predictions(tmp_path / "out" / "predictions"
                                / "validation_mismatched.tsv")) == 3


# -- SQuAD 2.0, FOLIO, CLUTRR --------------------------------------------------------------------


def squad_json(n: int) -> dict:
    context = ("the old woman reads a long book in the city . " * 3
               + "the cat sat on the mat . a boy eats an apple .")
    qas = []
    for i in range(n):
        if i % 3 == 2:
            qas.append({"id": f"q{i}", "question": "who plays football ?", "answers": [],
                        "is_impossible": True})
        else:
            answer = "the mat" if i % 3 == 0 else "an apple"
            qas.append({"id": f"q{i}", "question": "where did the cat sit ?" if i % 3 == 0
                        else "what does the boy eat ?", "is_impossible": False,
                        "answers": [{"text": answer, "answer_start": context.index(answer)}]})
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}


def test_squad2_windows_no_answer_rule_and_official_predictions(tmp_path, pretrained):
    data = tmp_path / "squad"
    write(data / "train-v2.0.json", json.dumps(squad_json(6)))
    write(data / "dev-v2.0.json", json.dumps(squad_json(5)))
    out = tmp_path / "out"
    result = run_finetune("squad2", data, pretrained, out, "--max-len", "32", "--doc-stride",
                          "8")
    metrics = result["metrics"]["validation"]
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert 0.0 <= metrics[key] <= 100.0, key
    assert (metrics["HasAns_total"], metrics["NoAns_total"], metrics["total"]) == (4, 1, 5)
    official = json.loads((out / "predictions" / "validation.json").read_text())
    assert sorted(official) == [f"q{i}" for i in range(5)]
    assert all(isinstance(v, str) for v in official.values())
    rows = read_predictions(out / "predictions" / "validation.tsv")
    assert [r["label"] for r in rows] == ["the mat", "an apple", "", "the mat", "an apple"]
    assert {r["id"]: r["prediction"] for r in rows} == official
    assert result["hyper"]["doc_stride"] == 8


def test_folio_jsonl_premise_lists_and_uncertain_alias(tmp_path, pretrained):
    labels = ("True", "False", "Uncertain")
    lines = [json.dumps({"premises": PREMISES[i % 8: i % 8 + 2], "conclusion": PREMISES[i % 5],
                         "label": labels[i % 3]}) for i in range(9)]
    data = tmp_path / "folio"
    write(data / "folio-train.jsonl", "\n".join(lines) + "\n")
    write(data / "folio-validation.jsonl", "\n".join(lines[:4]) + "\n")
    result = run_finetune("folio", data, pretrained, tmp_path / "out", "--max-len", "48")
    rows = read_predictions(tmp_path / "out" / "predictions" / "validation.tsv")
    assert result["metrics"]["validation"]["accuracy"] == pytest.approx(
        sum(r["prediction"] == r["label"] for r in rows) / len(rows))
    assert [r["label"] for r in rows] == ["True", "False", "Unknown", "True"]
    assert {r["prediction"] for r in rows} <= {"True", "False", "Unknown"}
    assert result["labels"] == ["True", "False", "Unknown"]


def clutrr_csv(rows: list[tuple[str, str, str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["", "id", "story", "query", "target", "clean_story"])
    for i, (story, query, target) in enumerate(rows):
        writer.writerow([i, f"id{i}", story, query, target, story])
    return buffer.getvalue()


CLUTRR_ROWS = [
    ("[Anna] is the mother of [Tom]. [Tom] has a sister, [Eve].", "('Anna', 'Eve')", "daughter"),
    ("[Bob] is married to [Cara]. [Cara] has a son, [Dan].", "('Bob', 'Dan')", "son"),
    ("[Eli] is the father of [Fay], who married [Gus].", "('Eli', 'Gus')", "son-in-law"),
    ("[Hal] and [Ida] are siblings. [Ida] has a son, [Jon].", "('Hal', 'Jon')", "nephew"),
]


def test_clutrr_csv_labels_from_train_file(tmp_path, pretrained):
    data = tmp_path / "clutrr"
    write(data / "1.2,1.3_train.csv", clutrr_csv(CLUTRR_ROWS * 2))
    write(data / "1.2_test.csv", clutrr_csv(CLUTRR_ROWS[:3]))
    out = tmp_path / "out"
    result = run_finetune("clutrr", data, pretrained, out, "--max-len", "40")
    assert result["labels"] == sorted({r[2] for r in CLUTRR_ROWS})
    assert result["headline_split"] == "test"
    rows = read_predictions(out / "predictions" / "test.tsv")
    assert result["metrics"]["test"]["accuracy"] == pytest.approx(
        sum(r["prediction"] == r["label"] for r in rows) / len(rows))
    assert [r["id"] for r in rows] == ["1.2_test-2", "1.2_test-3", "1.2_test-4"]
    assert [r["label"] for r in rows] == ["daughter", "son", "son-in-law"]
    meta = json.loads((out / "model" / "config.json").read_text())
    assert meta["labels"] == result["labels"]
    # the label names reach transformers, where pipelines and model cards read them
    assert meta["id2label"] == {str(i): name for i, name in enumerate(result["labels"])}
    transformers = pytest.importorskip("transformers")
    import folnet.hf  # noqa: F401  (registers the Auto classes)

    config = transformers.AutoConfig.from_pretrained(str(out / "model"))
    assert [config.id2label[i] for i in range(len(result["labels"]))] == result["labels"]
    assert config.label2id["son-in-law"] == result["labels"].index("son-in-law")
