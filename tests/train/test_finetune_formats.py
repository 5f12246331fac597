"""Finetuning data in the formats Hugging Face `datasets` publishes: the same examples, and the
same finetuned model, predictions and metrics, as from the original files.

Each test writes one random but realistic data set twice -- in the task's original files (GLUE
TSV, SQuAD json, FOLIO jsonl, CLUTRR csv) and in a datasets format with the published columns
(parquet shards in the hub layout, save_to_disk folders, json/jsonl/csv/arrow files) -- and
checks that both read to the same examples; for GLUE RTE and SQuAD 2.0 a tiny model is also
finetuned and evaluated from each through the CLI.
"""

from __future__ import annotations

import csv
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from paths import ROOT
from runs import tiny_pretrained_run, write
from safetensors.torch import load_file

from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.finetune.evaluate import read_predictions
from folnet.train.tasks import read_split

pytestmark = pytest.mark.usefixtures("one_thread")

SUBJECTS = ["the cat", "a dog", "the old woman", "two girls", "a boy", "the man", "my sister",
            "the teacher", "our neighbour", "the \"quiet\" child"]
VERBS = ["sat on", "is running in", "reads", "plays in", "eats", "walks past", "paints",
         "cleans", "doesn't like", "looks at"]
OBJECTS = ["the mat", "the park", "a long book", "the garden", "an apple", "the house",
           "the city", "the river", "a red car", "the hills"]
FAST = ["--epochs", "1", "--batch-size", "4", "--no-progress", "--no-tensorboard",
        "--log-every", "1", "--eval-batch-size", "8"]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ."


@pytest.fixture(scope="module", autouse=True)
def quiet_datasets():
    """No progress bars from the writers in these tests; the previous setting is restored."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    yield
    if not was_disabled:
        datasets.enable_progress_bars()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A pretraining run directory: RUN/final holds a tiny model and its tokenizer."""
    texts = [" ".join(SUBJECTS + VERBS + OBJECTS), "where did who what does eat sit ?"]
    return tiny_pretrained_run(tmp_path_factory.mktemp("pretrain"), texts, vocab_size=200,
                               repeat=8)


def dataset(rows: list[dict], features: datasets.Features | None = None) -> datasets.Dataset:
    return datasets.Dataset.from_list(rows, features=features)


def target(path: Path) -> str:
    """``path`` as a string for the `datasets` writers, its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


def same(examples_a, examples_b) -> None:
    """Equal examples up to the guid (a TSV line number vs a published idx)."""
    def key(ex):
        return (ex.text_a, ex.text_b, ex.label)

    assert [key(e) for e in examples_a] == [key(e) for e in examples_b]
    assert len(examples_a) > 0


# -- GLUE: every task's TSV and its nyu-mll/glue rows ------------------------------------------

# The ClassLabel names of nyu-mll/glue, written out here rather than taken from folnet, so
# that the label mapping is checked against the published order.
HUB_LABELS = {
    "rte": ["entailment", "not_entailment"], "qnli": ["entailment", "not_entailment"],
    "mnli": ["entailment", "neutral", "contradiction"], "mrpc": ["not_equivalent", "equivalent"],
    "qqp": ["not_duplicate", "duplicate"], "sst2": ["negative", "positive"],
    "cola": ["unacceptable", "acceptable"], "stsb": None,
}
HUB_TEXT = {"rte": ("sentence1", "sentence2"), "qnli": ("question", "sentence"),
            "mnli": ("premise", "hypothesis"), "mrpc": ("sentence1", "sentence2"),
            "qqp": ("question1", "question2"), "sst2": ("sentence", None),
            "cola": ("sentence", None), "stsb": ("sentence1", "sentence2")}


def tsv_row(config: str, i: int, a: str, b: str | None, label: str | None) -> dict:
    """One row of the original GLUE TSV of ``config`` (columns in the distributed order)."""
    rows = {
        "rte": {"index": i, "sentence1": a, "sentence2": b, "label": label},
        "qnli": {"index": i, "question": a, "sentence": b, "label": label},
        "mnli": {"index": i, "promptID": 7 * i, "pairID": f"{7 * i}n", "genre": "fiction",
                 "sentence1": a, "sentence2": b, "gold_label": label},
        "mrpc": {"Quality": label, "#1 ID": 2 * i, "#2 ID": 2 * i + 1, "#1 String": a,
                 "#2 String": b},
        "qqp": {"id": i, "qid1": 2 * i, "qid2": 2 * i + 1, "question1": a, "question2": b,
                "is_duplicate": label},
        "sst2": {"sentence": a, "label": label} if label is not None else {"index": i,
                                                                          "sentence": a},
        "cola": {"index": i, "sentence": a},  # CoLA's test file; train/dev have no header
        "stsb": {"index": i, "genre": "main-news", "filename": "msrvid", "year": "2012test",
                 "old_index": i, "source1": "none", "source2": "none", "sentence1": a,
                 "sentence2": b, "score": label},
    }[config]
    return {k: v for k, v in rows.items() if v is not None}


def glue_data(config: str, seed: int, sizes: dict[str, int]) -> dict[str, list[tuple]]:
    """Random rows (a, b, published label) per split; test splits are unlabelled (-1)."""
    rng = random.Random(seed)
    names = HUB_LABELS[config]
    out = {}
    for split, n in sizes.items():
        rows = []
        for _ in range(n):
            a = sentence(rng)
            b = sentence(rng) if HUB_TEXT[config][1] else None
            if split.startswith("test"):
                y = -1.0 if names is None else -1
            else:
                y = round(rng.uniform(0, 5), 3) if names is None else rng.randrange(len(names))
            rows.append((a, b, y))
        out[split] = rows
    return out


def write_glue_tsv(config: str, directory: Path, data: dict[str, list[tuple]]) -> Path:
    names = HUB_LABELS[config]
    files = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv",
             "validation_matched": "dev_matched.tsv", "test_matched": "test_matched.tsv"}
    for split, rows in data.items():
        lines = []
        for i, (a, b, y) in enumerate(rows):
            if split.startswith("test"):
                label = None
            elif names is None:
                label = f"{y:.3f}"
            elif config in ("rte", "qnli", "mnli"):
                label = names[y]  # these TSVs spell the class out
            else:
                label = str(y)  # 0/1 columns, 1 = the published class 1
            if config == "cola" and label is not None:
                lines.append(["gj04", label, "" if label == "1" else "*", a])
                continue
            row = tsv_row(config, i, a, b, label)
            if not lines:
                lines.append(list(row))
            lines.append([str(v) for v in row.values()])
        write(directory / files[split], "".join("\t".join(r) + "\n" for r in lines))
    return directory


def glue_dataset(config: str, rows: list[tuple]) -> datasets.Dataset:
    a_col, b_col = HUB_TEXT[config]
    names = HUB_LABELS[config]
    features = {a_col: datasets.Value("string")}
    if b_col:
        features[b_col] = datasets.Value("string")
    features["label"] = (datasets.Value("float32") if names is None
                         else datasets.ClassLabel(names=names))
    features["idx"] = datasets.Value("int32")
    records = [{a_col: a, **({b_col: b} if b_col else {}), "label": y, "idx": i}
               for i, (a, b, y) in enumerate(rows)]
    return dataset(records, datasets.Features(features))


def write_glue_hub(config: str, root: Path, data: dict[str, list[tuple]]) -> Path:
    """The nyu-mll/glue hub layout: ``<root>/<config>/<split>-00000-of-00001.parquet``."""
    for split, rows in data.items():
        glue_dataset(config, rows).to_parquet(
            target(root / config / f"{split}-00000-of-00001.parquet"))
    return root


@pytest.mark.parametrize("config", list(HUB_LABELS))
def test_every_glue_task_reads_the_same_from_tsv_and_hub_parquet(tmp_path, config):
    task = f"glue/{config}"
    splits = {"train": 9, "validation": 5, "test": 3}
    if config == "mnli":
        splits = {"train": 9, "validation_matched": 5, "test_matched": 3}
    data = glue_data(config, seed=len(config), sizes=splits)
    tsv_dir = write_glue_tsv(config, tmp_path / "tsv", data)
    hub = write_glue_hub(config, tmp_path / "glue", data)
    for split in splits:
        from_tsv = read_split(task, tsv_dir, split)
        from_hub = read_split(task, hub, split)  # found in glue/<config>/
        same(from_tsv.examples, from_hub.examples)
        assert [ex.guid for ex in from_hub.examples] == [f"{split}-{i}"
                                                         for i in range(splits[split])]
        assert from_hub.paths == (hub / config / f"{split}-00000-of-00001.parquet",)
        labels = [ex.label for ex in from_hub.examples]
        if split.startswith("test"):
            assert labels == [None] * splits[split]
        elif config == "stsb":
            assert labels == [y for _, _, y in data[split]]  # 3.8, not float32's 3.7999999
        else:
            assert set(labels) <= set(from_tsv.task.labels) and None not in labels


def test_glue_other_datasets_formats_read_the_same(tmp_path):
    """jsonl, json, csv and arrow files, a save_to_disk DatasetDict and save_to_disk folders
    per split; MNLI's two validation splits from one DatasetDict."""
    data = glue_data("rte", seed=3, sizes={"train": 8, "validation": 6, "test": 2})
    tsv_dir = write_glue_tsv("rte", tmp_path / "tsv", data)
    parts = {split: glue_dataset("rte", rows) for split, rows in data.items()}
    for split, part in parts.items():
        part.to_json(target(tmp_path / "jsonl" / f"{split}.jsonl"))
        part.to_json(target(tmp_path / "json" / f"{split}.json"), lines=False)
        part.to_csv(target(tmp_path / "csv" / f"{split}.csv"), index=False)
        part.save_to_disk(str(tmp_path / "folders" / split))
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "dict"))
    arrow = tmp_path / "arrow"
    arrow.mkdir()
    for split in parts:
        shard = tmp_path / "folders" / split / "data-00000-of-00001.arrow"
        (arrow / f"{split}.arrow").write_bytes(shard.read_bytes())
    for form in ("jsonl", "json", "csv", "arrow", "folders", "dict"):
        for split in parts:
            read = read_split("glue/rte", tmp_path / form, split)
            same(read_split("glue/rte", tsv_dir, split).examples, read.examples)
    saved = read_split("glue/rte", tmp_path / "dict", "train")
    assert saved.paths == (tmp_path / "dict" / "train",)

    mnli = glue_data("mnli", seed=4, sizes={"train": 6, "validation_matched": 4,
                                            "validation_mismatched": 3, "test_mismatched": 2})
    datasets.DatasetDict({s: glue_dataset("mnli", rows) for s, rows in mnli.items()}
                         ).save_to_disk(str(tmp_path / "mnli"))
    for split, rows in mnli.items():
        examples = read_split("glue/mnli", tmp_path / "mnli", split).examples
        names = HUB_LABELS["mnli"]
        assert [(e.text_a, e.text_b) for e in examples] == [(a, b) for a, b, _ in rows]
        assert [e.label for e in examples] == [None if y < 0 else names[y] for _, _, y in rows]


def run_finetune(task: str, data: Path, pretrained: Path, out: Path, *extra: str) -> dict:
    assert main(["finetune", "--task", task, "--from", str(pretrained), "--out", str(out),
                 "--data", str(data), *FAST, *extra]) == 0
    return json.loads((out / "eval.json").read_text())


def same_weights(run_a: Path, run_b: Path) -> None:
    a = load_file(str(run_a / "model" / "model.safetensors"))
    b = load_file(str(run_b / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rte_finetunes_and_evaluates_the_same_from_tsv_parquet_and_saved_dict(tmp_path,
                                                                             pretrained):
    data = glue_data("rte", seed=11, sizes={"train": 16, "validation": 8, "test": 4})
    tsv_dir = write_glue_tsv("rte", tmp_path / "RTE", data)
    hub = write_glue_hub("rte", tmp_path / "glue", data)
    saved = tmp_path / "rte_saved"
    datasets.DatasetDict({s: glue_dataset("rte", rows) for s, rows in data.items()}
                         ).save_to_disk(str(saved))
    runs = {}
    for name, where in (("tsv", tsv_dir), ("parquet", hub), ("saved", saved)):
        runs[name] = run_finetune("glue/rte", where, pretrained, tmp_path / f"out_{name}",
                                  "--epochs", "2")
    for name in ("parquet", "saved"):
        assert runs[name]["metrics"] == runs["tsv"]["metrics"]
        assert runs[name]["history"] == runs["tsv"]["history"]
        same_weights(tmp_path / "out_tsv", tmp_path / f"out_{name}")
    tsv_rows = read_predictions(tmp_path / "out_tsv" / "predictions" / "validation.tsv")
    hub_rows = read_predictions(tmp_path / "out_parquet" / "predictions" / "validation.tsv")
    assert [(r["prediction"], r["label"]) for r in hub_rows] == [
        (r["prediction"], r["label"]) for r in tsv_rows]
    assert [r["label"] for r in hub_rows] == [HUB_LABELS["rte"][y] for _, _, y in
                                              data["validation"]]
    assert [r["id"] for r in hub_rows] == [f"validation-{i}" for i in range(8)]
    accuracy = sum(r["prediction"] == r["label"] for r in hub_rows) / len(hub_rows)
    assert accuracy == pytest.approx(runs["parquet"]["metrics"]["validation"]["accuracy"])

    # the model finetuned from the TSVs, evaluated on the saved DatasetDict and on the TSVs
    scored = {}
    for name, where in (("tsv", tsv_dir), ("saved", saved)):
        assert main(["evaluate", "--model", str(tmp_path / "out_tsv"), "--data", str(where),
                     "--splits", "validation,test", "--out", str(tmp_path / f"ev_{name}")]) == 0
        scored[name] = json.loads((tmp_path / f"ev_{name}" / "eval.json").read_text())
    assert scored["saved"]["metrics"] == scored["tsv"]["metrics"]
    assert scored["saved"]["metrics"]["test"] == {}
    assert scored["saved"]["metrics"]["validation"] == runs["tsv"]["metrics"]["validation"]
    for split in ("validation", "test"):
        a = read_predictions(tmp_path / "ev_tsv" / "predictions" / f"{split}.tsv")
        b = read_predictions(tmp_path / "ev_saved" / "predictions" / f"{split}.tsv")
        assert [(r["prediction"], r["label"]) for r in a] == [
            (r["prediction"], r["label"]) for r in b]
    assert [r["label"] for r in b] == [""] * 4


# -- SQuAD 2.0 -------------------------------------------------------------------------------


def squad_questions(seed: int, n: int) -> list[dict]:
    """Random questions in the published row form; every third has no answer."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        context = " ".join(sentence(rng) for _ in range(rng.randint(3, 6)))
        title = rng.choice(["Pets", "Cities", "Books"])
        if i % 3 == 2:
            answers = {"text": [], "answer_start": []}
            question = f"who {rng.choice(VERBS)} the moon ?"
        else:
            answer = rng.choice([o for o in OBJECTS if o in context] or [context.split(" .")[0]])
            start = context.index(answer)
            texts, starts = [answer], [start]
            if i % 2:  # a second (overlapping) gold answer, as the dev set has
                texts.append(answer.split(" ", 1)[-1])
                starts.append(start + len(answer) - len(texts[1]))
            answers = {"text": texts, "answer_start": starts}
            question = f"what does {context.split()[1]} see ?"
        rows.append({"id": f"{seed:x}{i:05d}", "title": title, "context": context,
                     "question": question, "answers": answers})
    return rows


def squad_json(rows: list[dict]) -> dict:
    """The same questions in the original nested SQuAD 2.0 JSON."""
    articles: dict[str, dict[str, list]] = {}
    for row in rows:
        qas = articles.setdefault(row["title"], {}).setdefault(row["context"], [])
        answers = [{"text": t, "answer_start": s} for t, s in
                   zip(row["answers"]["text"], row["answers"]["answer_start"], strict=True)]
        qas.append({"id": row["id"], "question": row["question"], "answers": answers,
                    "is_impossible": not answers})
    return {"version": "v2.0", "data": [
        {"title": title, "paragraphs": [{"context": c, "qas": q} for c, q in paragraphs.items()]}
        for title, paragraphs in articles.items()]}


def nested_order(rows: list[dict]) -> list[dict]:
    """The questions in the order the nested JSON lists them (by article, then paragraph)."""
    order = [qa["id"] for article in squad_json(rows)["data"]
             for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    by_id = {row["id"]: row for row in rows}
    return [by_id[qid] for qid in order]


def test_squad2_finetunes_the_same_from_json_jsonl_and_saved_dict(tmp_path, pretrained):
    splits = {"train": nested_order(squad_questions(1, 9)),
              "validation": nested_order(squad_questions(2, 6))}
    original = tmp_path / "squad"
    write(original / "train-v2.0.json", json.dumps(squad_json(splits["train"])))
    write(original / "dev-v2.0.json", json.dumps(squad_json(splits["validation"])))
    jsonl, array, saved = tmp_path / "jsonl", tmp_path / "array", tmp_path / "saved"
    for split, rows in splits.items():
        write(jsonl / "squad_v2" / f"{split}.jsonl",
              "".join(json.dumps(row) + "\n" for row in rows))
        write(array / f"{split}.json", json.dumps(rows))
    datasets.DatasetDict({s: dataset(rows) for s, rows in splits.items()}).save_to_disk(
        str(saved))
    for split in splits:
        expected = read_split("squad2", original, split).examples
        for where in (jsonl, array, saved):
            assert read_split("squad2", where, split).examples == tuple(expected)
    assert any(ex.is_impossible for ex in expected)
    assert any(len(ex.answers) == 2 for ex in expected)

    runs = {}
    for name, where in (("json", original), ("jsonl", jsonl), ("saved", saved)):
        runs[name] = run_finetune("squad2", where, pretrained, tmp_path / f"out_{name}",
                                  "--max-len", "40", "--doc-stride", "16")
    for name in ("jsonl", "saved"):
        assert runs[name]["metrics"] == runs["json"]["metrics"]
        same_weights(tmp_path / "out_json", tmp_path / f"out_{name}")
        official = tmp_path / f"out_{name}" / "predictions" / "validation.json"
        assert official.read_text() == (tmp_path / "out_json" / "predictions" /
                                        "validation.json").read_text()
    metrics = runs["saved"]["metrics"]["validation"]
    assert (metrics["HasAns_total"], metrics["NoAns_total"]) == (4, 2)
    assert main(["evaluate", "--model", str(tmp_path / "out_json"), "--data", str(saved),
                 "--out", str(tmp_path / "ev")]) == 0
    scored = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert scored["metrics"] == runs["json"]["metrics"]


# -- FOLIO and CLUTRR ------------------------------------------------------------------------


def folio_rows(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        premises = "\n".join(sentence(rng) for _ in range(rng.randint(2, 4)))
        rows.append({"story_id": i // 2, "premises": premises, "premises-FOL": "P(a)\nQ(a)",
                     "conclusion": sentence(rng), "conclusion-FOL": "Q(a)",
                     "label": rng.choice(["True", "False", "Uncertain"]), "example_id": 100 + i})
    return rows


def test_folio_published_rows_read_like_the_jsonl(tmp_path):
    splits = {"train": folio_rows(5, 7), "validation": folio_rows(6, 4)}
    for split, rows in splits.items():
        write(tmp_path / "jsonl" / f"folio_v2_{split}.jsonl",
              "".join(json.dumps(r) + "\n" for r in rows))
        dataset(rows).to_parquet(target(tmp_path / "parquet" / "data" / f"{split}-00000.parquet"))
    datasets.DatasetDict({s: dataset(r) for s, r in splits.items()}).save_to_disk(
        str(tmp_path / "saved"))
    for split, rows in splits.items():
        original = read_split("folio", tmp_path / "jsonl", split).examples
        for form in ("parquet", "saved"):
            read = read_split("folio", tmp_path / form, split).examples
            same(original, read)
            assert [ex.guid for ex in read] == [f"{split}-{r['example_id']}" for r in rows]
        assert [ex.label for ex in original] == [
            "Unknown" if r["label"] == "Uncertain" else r["label"] for r in rows]


RELATIONS = ["aunt", "son-in-law", "grandfather", "brother", "sister", "father", "mother",
             "grandmother", "uncle", "daughter-in-law", "grandson", "granddaughter",
             "father-in-law", "mother-in-law", "nephew", "son", "daughter", "niece", "husband",
             "wife", "sister-in-law"]  # CLUTRR/v1's target numbering
NAMES = ["Anna", "Tom", "Eve", "Bob", "Cara", "Dan", "Eli", "Fay", "Gus", "Hal", "Ida", "Jon"]
CLUTRR_COLUMNS = ["id", "story", "query", "target", "target_text", "clean_story", "proof_state",
                  "f_comb", "task_name", "story_edges", "edge_types", "query_edge", "genders",
                  "task_split"]


def clutrr_rows(seed: int, n: int, relations: list[str]) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b, c = rng.sample(NAMES, 3)
        relation = relations[i % len(relations)]
        story = f"[{a}] went to see [{b}], who talks with [{c}], a friend of the family."
        rows.append({"id": f"{seed}-{i:04d}-abc", "story": story, "query": str((a, c)),
                     "target": RELATIONS.index(relation), "target_text": relation,
                     "clean_story": story, "proof_state": "[{...}]", "f_comb": "x-y",
                     "task_name": "task_1.2", "story_edges": "[(0, 1), (1, 2)]",
                     "edge_types": "['x', 'y']", "query_edge": "(0, 2)",
                     "genders": f"{a}:female,{b}:male,{c}:female", "task_split": "train"})
    return rows


def clutrr_csv(rows: list[dict], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def test_clutrr_published_rows_read_like_the_csv(tmp_path):
    splits = {"train": clutrr_rows(1, 10, ["son", "aunt", "niece", "grandfather"]),
              "test": clutrr_rows(2, 5, ["aunt", "son"])}
    for split, rows in splits.items():
        # the original files: ``target`` is the relation name
        original_rows = [{**r, "target": r["target_text"]} for r in rows]
        write(tmp_path / "orig" / f"1.2,1.3_{split}.csv",
              clutrr_csv(original_rows, ["", "id", "story", "query", "target", "clean_story"]))
        write(tmp_path / "csv" / f"{split}.csv", clutrr_csv(rows, CLUTRR_COLUMNS))
        # ... and CLUTRR/v1's own csv under the original name: target_text is read, not target
        write(tmp_path / "v1" / f"1.2,1.3_{split}.csv", clutrr_csv(rows, CLUTRR_COLUMNS))
        dataset(rows).to_parquet(target(tmp_path / "parquet" / f"{split}.parquet"))
    datasets.DatasetDict({s: dataset(r) for s, r in splits.items()}).save_to_disk(
        str(tmp_path / "saved"))
    for split, rows in splits.items():
        original = read_split("clutrr", tmp_path / "orig", split)
        assert original.task.labels == ("aunt", "grandfather", "niece", "son")
        for form in ("csv", "v1", "parquet", "saved"):
            read = read_split("clutrr", tmp_path / form, split)
            same(original.examples, read.examples)
            assert read.task.labels == original.task.labels
        read = read_split("clutrr", tmp_path / "saved", split)
        assert [ex.guid for ex in read.examples] == [f"{split}-{r['id']}" for r in rows]
        assert read.examples[0].text_b.startswith("How is ")
    bad = clutrr_rows(3, 2, ["wife"])
    dataset(bad).to_parquet(str(tmp_path / "parquet" / "test.parquet"))
    with pytest.raises(FolnetError, match=r"test\.parquet: test row 0: label 'wife' does not "
                                          r"occur in the CLUTRR train file"):
        read_split("clutrr", tmp_path / "parquet", "test")


# -- errors ----------------------------------------------------------------------------------


def test_wrong_columns_name_the_path_the_columns_found_and_expected(tmp_path, pretrained,
                                                                   capsys):
    mnli = glue_data("mnli", seed=1, sizes={"train": 4, "validation": 3})
    hub = write_glue_hub("mnli", tmp_path / "glue", mnli)
    wrong = hub / "mnli"  # MNLI's premise/hypothesis where RTE wants sentence1/sentence2
    with pytest.raises(FolnetError) as err:
        read_split("glue/rte", wrong, "train")
    message = str(err.value)
    assert str(wrong / "train-00000-of-00001.parquet") in message
    assert "columns ['premise', 'hypothesis', 'label', 'idx']" in message
    assert "expected ['sentence1', 'sentence2', 'label'] as nyu-mll/glue rte" in message

    # through the CLI: the run stops before training, with the same message
    out = tmp_path / "out"
    assert main(["finetune", "--task", "glue/rte", "--data", str(wrong), "--from",
                 str(pretrained), "--out", str(out), *FAST]) == 2
    assert "expected ['sentence1', 'sentence2', 'label']" in capsys.readouterr().err
    assert not (out / "eval.json").exists() and not (out / "model").exists()

    # a SQuAD json that is the nested original under a rows name
    write(tmp_path / "sq" / "train.json", json.dumps(squad_json(squad_questions(3, 2))))
    with pytest.raises(FolnetError, match=r"train\.json: the train split has the columns "
                                          r"\['version', 'data'\], expected \['id', 'context', "
                                          r"'question', 'answers'\]"):
        read_split("squad2", tmp_path / "sq", "train")


def test_label_and_layout_errors(tmp_path, monkeypatch):
    rows = glue_data("rte", seed=2, sizes={"validation": 3})["validation"]
    flipped = [{"sentence1": a, "sentence2": b, "label": y, "idx": i}
               for i, (a, b, y) in enumerate(rows)]
    features = datasets.Features({"sentence1": datasets.Value("string"),
                                  "sentence2": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["not_entailment",
                                                                      "entailment"]),
                                  "idx": datasets.Value("int32")})
    dataset(flipped, features).to_parquet(target(tmp_path / "flip" / "validation.parquet"))
    with pytest.raises(FolnetError, match=r"classes are \['not_entailment', 'entailment'\], "
                                          r"expected \['entailment', 'not_entailment'\]"):
        read_split("glue/rte", tmp_path / "flip", "validation")

    write(tmp_path / "big" / "validation.jsonl",
          json.dumps({"sentence1": "a", "sentence2": "b", "label": 2, "idx": 0}) + "\n")
    with pytest.raises(FolnetError, match=r"validation row 0: label 2 is not a glue/rte class "
                                          r"number: expected 0\.\.1"):
        read_split("glue/rte", tmp_path / "big", "validation")

    write(tmp_path / "num" / "validation.jsonl",
          json.dumps({"sentence1": 5, "sentence2": "b", "label": 0, "idx": 0}) + "\n")
    with pytest.raises(FolnetError, match=r"column 'sentence1' holds int 5, expected a string"):
        read_split("glue/rte", tmp_path / "num", "validation")

    write(tmp_path / "unl" / "train.jsonl",
          json.dumps({"sentence1": "a", "sentence2": "b", "idx": 0}) + "\n")
    with pytest.raises(FolnetError, match=r"expected \['sentence1', 'sentence2', 'label'\]"):
        read_split("glue/rte", tmp_path / "unl", "train")
    write(tmp_path / "unl" / "test.jsonl",  # a test split may come without labels
          json.dumps({"sentence1": "a", "sentence2": "b", "idx": 4}) + "\n")
    assert read_split("glue/rte", tmp_path / "unl", "test").examples[0].label is None

    write(tmp_path / "two" / "train.jsonl", "{}\n")
    write(tmp_path / "two" / "train-00000-of-00001.parquet", "")
    with pytest.raises(FolnetError, match=r"split 'train' is given twice .* in different formats"):
        read_split("glue/rte", tmp_path / "two", "train")

    with pytest.raises(FolnetError) as err:
        read_split("glue/rte", tmp_path / "big", "train")
    message = str(err.value)
    assert "expected the file" in message
    assert "or nyu-mll/glue rte rows in a datasets format" in message
    assert "holds: validation.jsonl" in message

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(FolnetError, match=r"needs the `datasets` package"):
        read_split("glue/rte", tmp_path / "big", "validation")


def test_original_files_win_and_shards_read_in_order(tmp_path):
    data = glue_data("rte", seed=8, sizes={"train": 6})["train"]
    write_glue_tsv("rte", tmp_path, {"train": data[:2]})
    first, second = glue_dataset("rte", data[:3]), glue_dataset("rte", data[3:])
    first.to_parquet(target(tmp_path / "train-00000-of-00002.parquet"))
    second.to_parquet(target(tmp_path / "train-00001-of-00002.parquet"))
    assert len(read_split("glue/rte", tmp_path, "train").examples) == 2  # train.tsv
    (tmp_path / "train.tsv").unlink()
    read = read_split("glue/rte", tmp_path, "train")
    assert [ex.text_a for ex in read.examples] == [a for a, _, _ in data]
    assert read.paths == (tmp_path / "train-00000-of-00002.parquet",
                          tmp_path / "train-00001-of-00002.parquet")


def test_the_tasks_package_imports_without_datasets():
    code = ("import sys; import folnet.train.finetune.cli, folnet.train.tasks; "
            "print(sorted(m for m in ('datasets', 'pyarrow', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"
