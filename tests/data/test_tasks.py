"""Task registry, readers for the published file formats, error messages, and encoding."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from wordpiece import make_tokenizer

from folnet.errors import FolnetError
from folnet.train.tasks import (
    IGNORE_INDEX,
    TASKS,
    Example,
    encode_examples,
    family_of,
    get_task,
    read_split,
    register_family,
    truncate_longest_first,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def tsv(*rows: tuple[str, ...]) -> str:
    return "".join("\t".join(r) + "\n" for r in rows)


# ------------------------------------------------------------------------------ registry


def test_registry_table() -> None:
    assert list(TASKS) == [
        "glue/mnli", "glue/qqp", "glue/qnli", "glue/sst2", "glue/cola", "glue/stsb",
        "glue/mrpc", "glue/rte", "squad2", "folio", "clutrr", "clutrr/generate", "kinship",
        "kinship/symbolic", "kinship/generate", "kinship/symbolic/generate",
    ]  # fmt: skip
    # every task is read, encoded and scored by its registered family; only the kinship ones are
    # generated (no data directory); the generation twins are their family's
    assert {name: family_of(name).name for name in TASKS} == {
        name: name.split("/")[0] for name in TASKS}
    assert [name for name in TASKS if family_of(name).generated] == [
        "kinship", "kinship/symbolic", "kinship/generate", "kinship/symbolic/generate"]
    assert [name for name in TASKS if get_task(name).kind == "generation"] == [
        "clutrr/generate", "kinship/generate", "kinship/symbolic/generate"]
    assert family_of("squad2").official is not None and family_of("glue/rte").official is None
    mnli = get_task("glue/mnli")
    assert mnli.eval_splits == ("validation_matched", "validation_mismatched")
    assert mnli.split_files("validation_mismatched") == ("dev_mismatched.tsv",)
    assert (mnli.defaults.epochs, mnli.defaults.lr, mnli.defaults.batch_size) == (3, 8e-5, 32)
    cola = get_task("glue/cola")
    assert cola.metrics == ("mcc",) and cola.seq_len == 128
    assert (cola.defaults.epochs, cola.defaults.lr, cola.defaults.batch_size) == (10, 1e-4, 16)
    stsb = get_task("glue/stsb")
    assert stsb.kind == "regression" and stsb.labels is None and stsb.num_labels == 1
    assert stsb.metrics == ("pearson", "spearman")
    assert get_task("glue/qqp").metrics == ("accuracy", "f1")
    assert get_task("glue/mrpc").metrics == ("accuracy", "f1")
    squad = get_task("squad2")
    assert (squad.kind, squad.seq_len, squad.doc_stride) == ("qa", 384, 128)
    assert (squad.defaults.epochs, squad.defaults.lr, squad.defaults.batch_size) == (2, 9e-5, 32)
    folio = get_task("folio")
    assert folio.labels == ("True", "False", "Unknown") and folio.seq_len == 512
    assert (folio.defaults.epochs, folio.defaults.lr) == (60, 7e-5)
    clutrr = get_task("clutrr")
    assert clutrr.seq_len == 256 and (clutrr.defaults.epochs, clutrr.defaults.lr) == (100, 5e-5)
    for task in TASKS.values():
        d = task.defaults
        assert (d.warmup_ratio, d.adam_eps, d.adam_betas) == (0.06, 1e-6, (0.9, 0.999))
        assert (d.weight_decay, d.dropout, d.schedule) == (0.01, 0.1, "linear")
        assert task.main_metric in task.metrics
    with pytest.raises(FolnetError, match=r"unknown task 'glue/sts'.*'glue/stsb'.*'squad2'"):
        get_task("glue/sts")
    with pytest.raises(FolnetError, match=r"has no split 'dev'.*'validation'"):
        get_task("glue/rte").split_files("dev")


def test_kinship_is_read_through_the_registry_like_every_task() -> None:
    options = {"kinship_train_size": 10, "kinship_test_per_k": 2, "kinship_test_k": [2, 5],
               "data_seed": 3, "seed": 99}  # the run's seed does not choose the questions
    test = read_split("kinship", None, "test", options)
    assert test.task is TASKS["kinship"] and test.source == "generated"
    assert test.columns["k"] == (2, 2, 5, 5)
    assert [ex.guid for ex in test.examples] == ["test-0-k2", "test-1-k2", "test-2-k5",
                                                 "test-3-k5"]
    assert all(ex.label in TASKS["kinship"].labels for ex in test.examples)
    again = read_split("kinship", None, "test", {**options, "seed": 0})
    assert again.examples == test.examples
    assert test.head(3).columns["k"] == (2, 2, 5) and len(test.head(3).examples) == 3
    with pytest.raises(FolnetError, match="'kinship' is already registered"):
        register_family(family_of("kinship"))


# ------------------------------------------------------------------------------ GLUE

MNLI_HEAD = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
             "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
             "sentence2")  # fmt: skip


def mnli_row(i: int, s1: str, s2: str, *labels: str) -> tuple[str, ...]:
    return (str(i), "p", "q", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, *labels)


def test_mnli_train_dev_and_test(tmp_path: Path) -> None:
    d = tmp_path / "MNLI"  # the download layout: data_dir/MNLI/*.tsv is found too
    write(d / "train.tsv", tsv((*MNLI_HEAD, "label1", "gold_label"),
                               mnli_row(0, "A man sleeps.", "A man rests.", "entailment",
                                        "entailment")))  # fmt: skip
    write(d / "dev_matched.tsv", tsv(
        (*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"),
        mnli_row(1, "It rains.", "It is dry.", *(["contradiction"] * 6)),
    ))  # fmt: skip
    write(d / "dev_mismatched.tsv", tsv(
        (*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"),
        mnli_row(2, "Cats purr.", "Dogs bark.", *(["neutral"] * 6)),
    ))  # fmt: skip
    write(d / "test_matched.tsv", tsv(MNLI_HEAD, mnli_row(3, "One.", "Two.")))
    train = read_split("glue/mnli", tmp_path, "train")
    assert train.examples == (Example("train-2", "A man sleeps.", "A man rests.", "entailment"),)
    assert read_split("glue/mnli", d, "validation_matched").examples[0].label == "contradiction"
    mm = read_split("glue/mnli", d, "validation_mismatched").examples[0]
    assert (mm.text_a, mm.label) == ("Cats purr.", "neutral")
    test = read_split("glue/mnli", d, "test_matched").examples
    assert test == (Example("test_matched-2", "One.", "Two.", None),)


def test_qqp_qnli_rte(tmp_path: Path) -> None:
    write(tmp_path / "qqp" / "train.tsv", tsv(
        ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
        ("7", "1", "2", "How do I cook rice?", "How to cook rice?", "1"),
        ("8", "3", "4", "What is 2+2?", "Who is he?", "0"),
    ))  # fmt: skip
    write(tmp_path / "qqp" / "test.tsv", tsv(
        ("id", "question1", "question2"), ("0", "Is it?", "Is it not?")))  # fmt: skip
    qqp = read_split("glue/qqp", tmp_path / "qqp", "train").examples
    assert [(e.text_a, e.text_b, e.label) for e in qqp] == [
        ("How do I cook rice?", "How to cook rice?", "1"), ("What is 2+2?", "Who is he?", "0"),
    ]  # fmt: skip
    assert read_split("glue/qqp", tmp_path / "qqp", "test").examples[0].label is None

    write(tmp_path / "qnli" / "dev.tsv", tsv(
        ("index", "question", "sentence", "label"),
        ("0", "Where is it?", "It is here.", "entailment"),
        ("1", "Why?", "No reason.", "not_entailment"),
    ))  # fmt: skip
    qnli = read_split("glue/qnli", tmp_path / "qnli", "validation").examples
    assert [e.label for e in qnli] == ["entailment", "not_entailment"]
    assert qnli[0].text_a == "Where is it?" and qnli[0].text_b == "It is here."

    write(
        tmp_path / "RTE" / "train.tsv",
        tsv(("index", "sentence1", "sentence2", "label"), ("0", "A b.", "C d.", "not_entailment")),
    )
    rte = read_split("glue/rte", tmp_path, "train").examples  # found under data_dir/RTE
    assert rte[0] == Example("train-2", "A b.", "C d.", "not_entailment")


def test_sst2_keeps_quote_characters(tmp_path: Path) -> None:
    # QUOTE_NONE: an unbalanced quote is text, not the start of a quoted field
    write(
        tmp_path / "train.tsv",
        tsv(("sentence", "label"), ('a "gripping film ', "1"), ('he said "dull', "0")),
    )
    write(tmp_path / "test.tsv", tsv(("index", "sentence"), ("0", "fine .")))
    ex = read_split("glue/sst2", tmp_path, "train").examples
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [
        ('a "gripping film ', None, "1"),
        ('he said "dull', None, "0"),
    ]
    assert read_split("glue/sst2", tmp_path, "test").examples == (
        Example("test-2", "fine .", None, None),
    )


def test_cola_headerless_and_test_with_header(tmp_path: Path) -> None:
    write(tmp_path / "train.tsv", tsv(
        ("gj04", "1", "", "Our friends won't buy this analysis."),
        ("gj04", "0", "*", "They drank the pub."),
    ))  # fmt: skip
    write(tmp_path / "test.tsv", tsv(("index", "sentence"), ("0", "Bill left.")))
    ex = read_split("glue/cola", tmp_path, "train").examples
    assert ex == (Example("train-1", "Our friends won't buy this analysis.", None, "1"),
                  Example("train-2", "They drank the pub.", None, "0"))  # fmt: skip
    assert read_split("glue/cola", tmp_path, "test").examples[0].label is None


def test_stsb_scores_and_bad_score(tmp_path: Path) -> None:
    head = ("index", "genre", "filename", "year", "old_index", "source1", "source2",
            "sentence1", "sentence2", "score")  # fmt: skip
    write(tmp_path / "train.tsv", tsv(
        head, ("0", "main-captions", "MSRvid", "2012test", "0001", "none", "none",
               "A plane is taking off.", "An air plane is taking off.", "5.000")))  # fmt: skip
    ex = read_split("glue/stsb", tmp_path, "train").examples[0]
    assert ex.label == 5.0 and ex.text_b == "An air plane is taking off."
    write(tmp_path / "dev.tsv", tsv(
        head, ("0", "g", "f", "y", "o", "s", "s", "A.", "B.", "abc")))  # fmt: skip
    with pytest.raises(FolnetError, match=r"dev\.tsv:2: score 'abc' is not a number"):
        read_split("glue/stsb", tmp_path, "validation")


def test_mrpc_with_byte_order_mark(tmp_path: Path) -> None:
    write(tmp_path / "train.tsv", "\ufeff" + tsv(
        ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
        ("1", "702876", "702977", "He said so .", "So he said .")))  # fmt: skip
    write(
        tmp_path / "test.tsv",
        tsv(("index", "#1 ID", "#2 ID", "#1 String", "#2 String"), ("0", "1", "2", "X .", "Y .")),
    )
    assert read_split("glue/mrpc", tmp_path, "train").examples == (
        Example("train-2", "He said so .", "So he said .", "1"),
    )
    assert read_split("glue/mrpc", tmp_path, "test").examples[0].label is None


# ------------------------------------------------------------------------------ errors


def test_missing_split_file_names_path_and_listing(tmp_path: Path) -> None:
    write(tmp_path / "train.tsv", tsv(("index", "sentence1", "sentence2", "label")))
    write(tmp_path / "notes.txt", "x")
    with pytest.raises(FolnetError) as err:
        read_split("glue/rte", tmp_path, "validation")
    msg = str(err.value)
    assert str(tmp_path / "dev.tsv") in msg and str(tmp_path / "RTE" / "dev.tsv") in msg
    assert "notes.txt, train.tsv" in msg


def test_wrong_column_count_quotes_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "dev.tsv", tsv(
        ("index", "sentence1", "sentence2", "label"),
        ("0", "A.", "B.", "entailment"),
        ("1", "only two"),
    ))  # fmt: skip
    with pytest.raises(FolnetError, match=r"dev\.tsv:3: expected 4 tab-separated columns.*found 2"):
        read_split("glue/rte", tmp_path, "validation")


def test_cola_wrong_column_count(tmp_path: Path) -> None:
    write(tmp_path / "dev.tsv", tsv(("gj04", "1", "", "Fine."), ("gj04", "1", "Bad.")))
    with pytest.raises(FolnetError, match=r"dev\.tsv:2: expected 4 .*CoLA.*no header"):
        read_split("glue/cola", tmp_path, "validation")


def test_label_outside_label_set(tmp_path: Path) -> None:
    write(
        tmp_path / "train.tsv",
        tsv(("index", "sentence1", "sentence2", "label"), ("0", "A.", "B.", "maybe")),
    )
    with pytest.raises(FolnetError) as err:
        read_split("glue/rte", tmp_path, "train")
    msg = str(err.value)
    assert "train.tsv:2" in msg and "'maybe'" in msg
    assert "'entailment' or 'not_entailment'" in msg


def test_labelled_split_without_label_column(tmp_path: Path) -> None:
    write(tmp_path / "train.tsv", tsv(("index", "sentence1", "sentence2"), ("0", "A.", "B.")))
    with pytest.raises(FolnetError, match=r"train\.tsv:1: no 'label' column in the header"):
        read_split("glue/rte", tmp_path, "train")


# ------------------------------------------------------------------------------ FOLIO


def folio_line(premises: object, conclusion: str, label: str) -> str:
    return json.dumps({"story_id": 1, "premises": premises, "conclusion": conclusion,
                       "label": label}) + "\n"  # fmt: skip


def test_folio_reader(tmp_path: Path) -> None:
    write(tmp_path / "folio-train.jsonl",
          folio_line(["All cats purr.", "Tom is a cat."], "Tom purrs.", "True")
          + "\n"
          + folio_line("No dogs fly.\nRex is a dog.", "Rex flies.", "False"))  # fmt: skip
    write(tmp_path / "validation.jsonl", folio_line(["A."], "B.", "Uncertain"))
    train = read_split("folio", tmp_path, "train")
    assert train.examples == (
        Example("train-1", "All cats purr. Tom is a cat.", "Tom purrs.", "True"),
        Example("train-3", "No dogs fly.\nRex is a dog.", "Rex flies.", "False"),
    )
    assert read_split("folio", tmp_path, "validation").examples[0].label == "Unknown"


def test_folio_errors(tmp_path: Path) -> None:
    write(tmp_path / "train.jsonl", folio_line(["A."], "B.", "True") + "{not json\n")
    with pytest.raises(FolnetError, match=r"train\.jsonl:2: not a valid JSON line"):
        read_split("folio", tmp_path, "train")
    write(tmp_path / "train.jsonl", folio_line(["A."], "B.", "Maybe"))
    with pytest.raises(FolnetError, match=r"train\.jsonl:1: label 'Maybe'.*'True', 'False' or"):
        read_split("folio", tmp_path, "train")
    write(tmp_path / "train.jsonl", json.dumps({"premises": ["A."], "label": "True"}) + "\n")
    with pytest.raises(FolnetError, match=r"train\.jsonl:1: missing field.*'conclusion'"):
        read_split("folio", tmp_path, "train")


# ------------------------------------------------------------------------------ CLUTRR

CLUTRR_HEAD = ["", "id", "story", "query", "target", "task_name"]


def write_clutrr(path: Path, rows: list[tuple[str, str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CLUTRR_HEAD)
        for i, (story, query, target) in enumerate(rows):
            writer.writerow([i, f"id{i}", story, query, target, "task_1.2"])


def test_clutrr_reader_and_labels(tmp_path: Path) -> None:
    write_clutrr(tmp_path / "1.2,1.3_train.csv", [
        ("[Anna] has a son, [Tom].", "('Anna', 'Tom')", "son"),
        ("[Bo] and his sister [Al] sang.", "('Bo', 'Al')", "sister"),
        ("[Cy]'s son is [Di].", "('Cy', 'Di')", "son"),
    ])  # fmt: skip
    write_clutrr(tmp_path / "1.2_test.csv", [("[Ed], mother of [Fi].", "('Fi', 'Ed')", "son")])
    train = read_split("clutrr", tmp_path, "train")
    assert train.task.labels == ("sister", "son")  # sorted set of train targets
    first = train.examples[0]
    assert first.text_a == "[Anna] has a son, [Tom]."  # quoted comma kept
    assert first.text_b == "How is Tom related to Anna?" and first.label == "son"
    assert first.guid == "1.2,1.3_train-2"
    test = read_split("clutrr", tmp_path, "test")
    assert test.task.labels == ("sister", "son") and test.examples[0].text_b.endswith("Fi?")


def test_clutrr_errors(tmp_path: Path) -> None:
    write_clutrr(tmp_path / "a_train.csv", [("[A] x [B].", "('A', 'B')", "son")])
    write_clutrr(
        tmp_path / "a_test.csv",
        [("[A] x [B].", "('A', 'B')", "son"), ("[C] y [D].", "('C', 'D')", "aunt")],
    )
    with pytest.raises(FolnetError) as err:
        read_split("clutrr", tmp_path, "test")
    msg = str(err.value)
    assert "a_test.csv:3" in msg and "'aunt'" in msg and "train labels: son" in msg
    write_clutrr(tmp_path / "a_test.csv", [("[A] x [B].", "A and B", "son")])
    with pytest.raises(FolnetError, match=r"a_test\.csv:2: query 'A and B' is not a pair"):
        read_split("clutrr", tmp_path, "test")


# ------------------------------------------------------------------------------ encoding

WORDS = "the cat sat on mat a dog ran far away big red house tree one two three four five six"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = make_tokenizer([WORDS] * 5, 400)
    for word in WORDS.split():  # every test word is a single token
        assert tok.encode(word, add_special_tokens=False).tokens == [word]
    return tok


def ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def test_encode_pair_layout(tokenizer: Tokenizer) -> None:
    task = get_task("glue/rte")
    ex = Example("g", "The cat sat", "a dog ran far away", "not_entailment")
    out = encode_examples(task, [ex], tokenizer, max_len=12)
    cls, sep, pad = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    a, b = ids(tokenizer, "the cat sat"), ids(tokenizer, "a dog ran far away")
    # [CLS] a(3) [SEP] b(5) [SEP] = 11 real tokens, 1 pad
    assert out["input_ids"][0].tolist() == [cls, *a, sep, *b, sep, pad]
    assert out["token_type_ids"][0].tolist() == [0] * 5 + [1] * 6 + [0]
    assert out["attention_mask"][0].tolist() == [True] * 11 + [False]
    assert out["labels"].tolist() == [1] and out["labels"].dtype == torch.long
    assert out["input_ids"].dtype == torch.long and out["attention_mask"].dtype == torch.bool


def test_truncation_longest_first(tokenizer: Tokenizer) -> None:
    # a = 6, b = 2, budget 5: excess 3, all taken from the longer a -> (3, 2)
    assert truncate_longest_first([1, 2, 3, 4, 5, 6], [7, 8], 5) == ([1, 2, 3], [7, 8])
    # a = b = 4, budget 5: tie -> b (4, 3); a longer -> a (3, 3); tie -> b (3, 2)
    assert truncate_longest_first([1, 2, 3, 4], [5, 6, 7, 8], 5) == ([1, 2, 3], [5, 6])
    ex = Example("g", "one two three four five six", "big red", "entailment")
    out = encode_examples("glue/rte", [ex], tokenizer, max_len=8)  # room for 5 text tokens
    decoded = tokenizer.decode(out["input_ids"][0].tolist())
    assert decoded == "one two three big red"
    assert out["attention_mask"][0].all() and out["token_type_ids"][0].tolist() == [0] * 5 + [1] * 3


def test_encode_single_regression_and_unlabelled(tokenizer: Tokenizer) -> None:
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    sst = encode_examples(
        "glue/sst2",
        [Example("g", "big red house", None, "1"), Example("h", "tree", None, None)],
        tokenizer,
        6,
    )
    assert sst["input_ids"][0].tolist()[:5] == [cls, *ids(tokenizer, "big red house"), sep]
    assert sst["token_type_ids"].sum() == 0
    assert sst["labels"].tolist() == [1, IGNORE_INDEX]
    sts = encode_examples("glue/stsb", [Example("g", "a", "b", 3.8)], tokenizer)
    assert sts["input_ids"].shape == (1, 128)  # task.seq_len by default
    assert sts["labels"].dtype == torch.float32 and sts["labels"].tolist() == [pytest.approx(3.8)]


def test_encode_errors_and_configured_tokenizer(tokenizer: Tokenizer) -> None:
    with pytest.raises(FolnetError, match="example 'g': label 'yes' is not a glue/rte label"):
        encode_examples("glue/rte", [Example("g", "a", "b", "yes")], tokenizer, 8)
    with pytest.raises(FolnetError, match="has no label set"):
        encode_examples("clutrr", [Example("g", "a", "b", "son")], tokenizer, 8)
    bare = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(FolnetError, match=r"no \[PAD\] token"):
        encode_examples("glue/rte", [Example("g", "a", "b", None)], bare, 8)
    # a caller's own truncation/padding settings neither interfere nor get changed
    configured = Tokenizer.from_str(tokenizer.to_str())
    configured.enable_truncation(2)
    configured.enable_padding(length=40)
    ex = [Example("g", "the cat sat", "a dog", "entailment")]
    same = encode_examples("glue/rte", ex, configured, 10)
    plain = encode_examples("glue/rte", ex, tokenizer, 10)
    assert torch.equal(same["input_ids"], plain["input_ids"])
    assert configured.truncation is not None and configured.padding is not None
