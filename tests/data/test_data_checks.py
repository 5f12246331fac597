"""Data that is wrong must be refused, not trained on.

SQuAD answers are checked against their context and booleans parsed strictly; corpora that are
not text (control characters, bytes the encoding cannot decode) are refused with the file and
the share measured, and ``--encoding`` reads Latin-1 text correctly; a trained vocabulary never
exceeds ``vocab_size``; a pathological line is split before the tokenizer sees it, in linear
time; a GLUE TSV with bad bytes names its file and line; a corrupt cache entry is rebuilt.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from paths import ROOT

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from folnet.errors import FolnetError
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.corpus import build_pretraining_dataset
from folnet.train.data.documents import MAX_SENTENCE_CHARS, iter_documents, split_sentences
from folnet.train.data.kinship import pretraining_documents
from folnet.train.data.tokenizer import train_tokenizer
from folnet.train.finetune.config import FinetuneConfig
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.tasks import get_task, read_split
from folnet.train.tasks.glue import read_glue
from folnet.train.tasks.squad import read_squad

# -- SQuAD ---------------------------------------------------------------------------------------

CONTEXT = "The dog Biscuit lives near the old mill. It likes long walks by the river."
GOOD = {"id": "q-good", "question": "Who lives near the mill?", "is_impossible": False,
        "answers": [{"text": "Biscuit", "answer_start": 8}]}
SHIFTED = {"id": "q-shifted", "question": "What does the dog like?", "is_impossible": False,
           "answers": [{"text": "long walks", "answer_start": 40}]}  # really at 50
NONE = {"id": "q-none", "question": "Who owns the cat?", "is_impossible": True, "answers": []}


def write_squad(path: Path, *qas: dict) -> Path:
    data = {"version": "v2.0",
            "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": list(qas)}]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_squad_rows(path: Path, *qas: dict) -> Path:
    """The questions as ``rajpurkar/squad_v2`` publishes them: one JSON line per question."""
    rows = [{"id": qa["id"], "title": "t", "context": CONTEXT, "question": qa["question"],
             "answers": {"text": [a["text"] for a in qa["answers"]],
                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for qa in qas]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_squad_answer_not_at_its_start_is_an_error_naming_the_question(tmp_path):
    assert CONTEXT[50:60] == "long walks" and CONTEXT[40:50] != "long walks"
    path = write_squad(tmp_path / "train-v2.0.json", GOOD, SHIFTED, NONE)
    with pytest.raises(FolnetError, match=r"train-v2\.0\.json.*'q-shifted'.*'long walks'.*40"):
        read_squad(path)


def test_skip_bad_answers_drops_those_questions_and_reports_the_count(tmp_path, capsys):
    write_squad(tmp_path / "train-v2.0.json", GOOD, SHIFTED, NONE)
    with pytest.raises(FolnetError, match="q-shifted"):
        read_split("squad2", tmp_path, "train")
    split = read_split("squad2", tmp_path, "train", {"skip_bad_answers": True})
    assert re.search(r"folnet: warning: .*train-v2\.0\.json: skipped 1 question.*q-shifted",
                     capsys.readouterr().err)
    assert [ex.qid for ex in split.examples] == ["q-good", "q-none"]
    # the finetune option that turns it on
    assert FinetuneConfig(skip_bad_answers=True).to_dict()["skip_bad_answers"] is True
    assert FinetuneConfig().skip_bad_answers is False


def test_published_squad_rows_are_checked_the_same_way(tmp_path, capsys):
    write_squad_rows(tmp_path / "train.jsonl", GOOD, SHIFTED, NONE)
    with pytest.raises(FolnetError, match=r"train\.jsonl.*'q-shifted'.*'long walks'"):
        read_split("squad2", tmp_path, "train")
    split = read_split("squad2", tmp_path, "train", {"skip_bad_answers": True})
    assert "skipped 1 question" in capsys.readouterr().err
    assert [ex.qid for ex in split.examples] == ["q-good", "q-none"]


@pytest.mark.parametrize("value", ["false", "true", 0, None])
def test_is_impossible_must_be_a_json_boolean(tmp_path, value):
    bad = {**GOOD, "id": "q-string", "is_impossible": value}
    path = write_squad(tmp_path / "dev-v2.0.json", bad)
    with pytest.raises(FolnetError, match=r"dev-v2\.0\.json.*'q-string'.*is_impossible.*true "
                                          r"or false"):
        read_squad(path)


# -- corpora that are not text -------------------------------------------------------------------

FRENCH = ("Le café est fermé le lundi. Un thé coûte deux euros à la gare. "
          "Élise préfère la crème brûlée au gâteau. Nous irons à Noël chez ma tante.")


def french_documents(count: int = 40) -> str:
    return "\n\n".join(f"{FRENCH} Le numéro {i} est noté." for i in range(count)) + "\n"


def test_tokenizer_training_files_are_decoded_strictly(tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(french_documents().encode("latin-1"))
    # before: read with errors="replace", whose U+FFFD the normaliser drops: "café" -> "caf"
    with pytest.raises(FolnetError, match=r"latin\.txt.*not valid utf-8 on line 1 \(byte 0xe9"):
        train_tokenizer([latin], vocab_size=300)
    cased = train_tokenizer([latin], vocab_size=300, lowercase=False, encoding="latin-1")
    assert cased.decode(cased.encode("Le café est fermé")) == "Le café est fermé"


def test_random_bytes_are_refused_naming_the_file_and_the_share(tmp_path):
    path = tmp_path / "noise.txt"
    path.write_bytes(random.Random(0).randbytes(300_000))
    with pytest.raises(FolnetError, match=r"noise\.txt.*not text: \d+\.\d% of .*limit is 1%"):
        list(iter_documents(path))
    # read as Latin-1 every byte decodes, but a quarter of them are control characters
    with pytest.raises(FolnetError, match=r"noise\.txt.*not text: 2\d\.\d% "):
        list(iter_documents(path, encoding="latin-1"))


def test_control_characters_are_refused_beyond_one_percent(tmp_path):
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta"]
    noisy = "".join(rng.choice(words) + " " + chr(rng.randrange(1, 9)) for _ in range(20_000))
    path = tmp_path / "controls.txt"
    path.write_text(noisy, encoding="utf-8")  # valid UTF-8, but not text
    with pytest.raises(FolnetError, match=r"controls\.txt.*not text: \d+\.\d% .*control"):
        list(iter_documents(path))
    # a stray control character here and there is text with a flaw (the normaliser drops it)
    clean = tmp_path / "mostly.txt"
    clean.write_text(("The cat sat on the mat. The dog sat on the log.\n" * 20 + "\x07") * 50,
                     "utf-8")
    assert len(list(iter_documents(clean))) == 1


def test_control_characters_in_a_parquet_column_are_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = ["\x01\x02\x03\x04 word" * 50] * 20
    path = tmp_path / "binary.parquet"
    datasets.Dataset.from_dict({"text": rows}).to_parquet(str(path))
    with pytest.raises(FolnetError, match=r"binary\.parquet.*not text: \d+\.\d%"):
        list(iter_documents(path))


def test_latin1_is_refused_by_default_and_read_correctly_with_its_encoding(tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(french_documents().encode("latin-1"))
    twin = tmp_path / "twin.txt"
    twin.write_text(french_documents(), encoding="utf-8")
    with pytest.raises(FolnetError, match=r"latin\.txt.*not valid utf-8.*line 1.*--encoding"):
        list(iter_documents(latin))
    docs = list(iter_documents(latin, encoding="latin-1"))
    assert docs == list(iter_documents(twin))
    assert "Le café est fermé le lundi." in docs[0]
    sentences = [s for d in docs for s in d]
    cased = train_tokenizer(texts=sentences, vocab_size=300, lowercase=False)
    assert cased.decode(cased.encode("Le café est fermé")) == "Le café est fermé"
    # through the dataset: the same ids as the UTF-8 twin
    tok = train_tokenizer(texts=sentences, vocab_size=300)
    config = PretrainDataConfig(seq_len=32, encoding="latin-1")
    from_latin = build_pretraining_dataset(latin, tok, config)
    from_twin = build_pretraining_dataset(twin, tok, PretrainDataConfig(seq_len=32))
    assert len(from_latin) == len(from_twin) > 0
    assert all((from_latin[i]["input_ids"] == from_twin[i]["input_ids"]).all()
               for i in range(len(from_twin)))


def test_an_encoding_the_reader_would_ignore_is_refused(tmp_path):
    import gzip

    path = tmp_path / "latin.txt.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(french_documents().encode("latin-1"))
    # datasets' text reader decodes a compressed file as UTF-8 whatever it is told
    with pytest.raises(FolnetError, match=r"latin\.txt\.gz.*--encoding latin-1 cannot be "
                                          r"applied to a compressed text file"):
        list(iter_documents(path, encoding="latin-1"))
    with pytest.raises(FolnetError, match=r"latin\.txt\.gz.*not valid utf-8.*--encoding"):
        list(iter_documents(path))  # and the sample decodes it, compressed or not


def test_encoding_option(tmp_path):
    assert PretrainConfig().encoding == "utf-8"
    assert PretrainConfig(encoding="latin-1").encoding == "latin-1"
    with pytest.raises(FolnetError, match=r"--encoding.*'klingon'.*not an encoding"):
        PretrainConfig(encoding="klingon")
    with pytest.raises(FolnetError, match=r"encoding.*'klingon'"):
        PretrainDataConfig(encoding="klingon")


@pytest.mark.slow
def test_cli_refuses_a_binary_corpus_before_writing_anything(tmp_path):
    noise = tmp_path / "noise.txt"
    noise.write_bytes(random.Random(2).randbytes(100_000))
    out = tmp_path / "run"
    args = ["--ops", "j.a", "--preset", "tiny", "--data", str(noise), "--vocab-size", "300",
            "--seq-len", "32", "--batch-size", "4", "--steps", "2", "--no-progress",
            "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "folnet", "pretrain", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "noise.txt" in lines[0] and "not text" in lines[0], lines
    assert not out.exists()


# -- the vocabulary ------------------------------------------------------------------------------


def many_characters_texts() -> list[str]:
    """500 texts over 2,302 distinct characters (1,865 once the uncased normaliser has folded
    case and accents); 'a' and 'b' are the most frequent."""
    rng = random.Random(3)
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 1500)] + \
            [chr(c) for c in range(0x0100, 0x0100 + 800)]
    return [" ".join("ab" + "".join(rng.choice(chars) for _ in range(4)) for _ in range(20))
            for _ in range(500)]


def test_trained_vocabulary_never_exceeds_vocab_size():
    texts = many_characters_texts()
    for size in (200, 41):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tok = train_tokenizer(texts=texts, vocab_size=size)
        assert tok.vocab_size <= size
        (warning,) = caught  # the characters left out are said, not silently dropped
        assert re.search(rf"1,\d{{3}} distinct characters.*vocab_size {size}", str(warning.message))
        vocab = tok.vocab()
        assert {"a", "##b"} <= set(vocab)  # the most frequent characters are kept
    with pytest.raises(FolnetError, match=r"vocab_size 6 .*no room"):
        train_tokenizer(texts=texts, vocab_size=6)


# -- pathological lines --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_long_line_without_a_sentence_end_is_split_before_the_tokenizer(tmp_path):
    path = tmp_path / "long.txt"
    line = "the quick brown fox jumps over the lazy dog " * 80_000  # 3.5 MB, no sentence end
    path.write_text("A short document. It has two sentences.\n\n" + line + "\n", "utf-8")
    started = time.monotonic()
    docs = list(iter_documents(path))
    sentences = [s for d in docs for s in d]
    assert max(len(s) for s in sentences) <= MAX_SENTENCE_CHARS
    assert sum(len(s) for s in docs[1]) >= len(line) - len(docs[1]) - 1  # nothing lost
    tok = train_tokenizer(texts=sentences, vocab_size=300)
    ids = tok.encode_batch(sentences)
    assert sum(map(len, ids)) > 700_000
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("line", ["he met Dr. Smith and Dr. Jones and " * 9_000,  # 315 kB
                                  "." * 30_000,
                                  "Wait!" + "?" * 30_000 + " Then"])
def test_sentence_splitting_is_linear_on_pathological_lines(line):
    started = time.monotonic()
    sentences = split_sentences(line)
    assert time.monotonic() - started < 10
    assert max(len(s) for s in sentences) <= MAX_SENTENCE_CHARS
    assert "".join(sentences).replace(" ", "") == line.replace(" ", "")


def test_a_run_without_whitespace_is_cut_with_a_warning_naming_the_file(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_text("Some text first. Then a blob.\n" + "x" * 2_000_000 + "\n", "utf-8")
    with pytest.warns(UserWarning, match=r"blob\.txt.*without whitespace"):
        docs = list(iter_documents(path))
    pieces = docs[0][2:]
    assert len(pieces) == -(-2_000_000 // MAX_SENTENCE_CHARS)
    assert all(len(p) <= MAX_SENTENCE_CHARS for p in pieces)


# -- GLUE TSV and the cache ----------------------------------------------------------------------


@pytest.mark.parametrize("bad_line", [3, 600])
def test_glue_tsv_with_bad_bytes_names_the_file_and_line(tmp_path, bad_line):
    rows = [b"index\tsentence1\tsentence2\tlabel"]
    for i in range(1, 700):
        text = b"The caf\xe9 is open." if i + 1 == bad_line else b"The cafe is open."
        rows.append(b"%d\t%s\tIt is open.\tentailment" % (i, text))
    path = tmp_path / "dev.tsv"
    path.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(FolnetError, match=rf"dev\.tsv:{bad_line}: .*not valid UTF-8"):
        read_glue(get_task("glue/rte"), path, "validation")


def test_corrupt_cache_meta_is_rebuilt(tmp_path):
    docs = pretraining_documents(60, seed=0)
    tok = train_tokenizer(texts=[s for d in docs for s in d], vocab_size=300)
    config = PretrainDataConfig(seq_len=32, kinship_documents=60, cache_dir=tmp_path)
    first = build_pretraining_dataset("kinship", tok, config)
    assert first.cache_status == "miss"
    (examples_meta,) = tmp_path.glob("examples-*/meta.json")
    examples_meta.write_bytes(b"\x00{not json")
    again = build_pretraining_dataset("kinship", tok, config)
    assert again.cache_status == "corpus" and len(again) == len(first)
    assert json.loads(examples_meta.read_text("utf-8"))["num_documents"] == 60  # rewritten
    (corpus_meta,) = tmp_path.glob("corpus-*/meta.json")
    corpus_meta.write_text("[1, 2", "utf-8")
    third = build_pretraining_dataset("kinship", tok, config)
    assert third.cache_status == "examples"  # the examples entry does not need the corpus's
    for entry in tmp_path.glob("examples-*"):
        for item in entry.iterdir():
            item.unlink()
        entry.rmdir()
    fourth = build_pretraining_dataset("kinship", tok, config)
    assert fourth.cache_status == "miss" and len(fourth) == len(first)
    assert isinstance(json.loads(corpus_meta.read_text("utf-8")), dict)
    assert all((fourth[i]["input_ids"] == first[i]["input_ids"]).all() for i in range(10))
