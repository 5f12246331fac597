"""Hostile or unlucky input files end in one line -- a `FolnetError`, exit status 2 on the
command line -- never a traceback, a crash or a hang.

Each test drives the real entry point (``folnet.cli.main`` or the reader a command calls) on
a tiny file made to fail one way: a GLUE/CLUTRR field past the csv module's size limit, JSON
nested far deeper than a parser follows (SQuAD, FOLIO, corpora, published rows, a tokenizer's
config, an ablation plan), ``info`` asked for a billion tokens, ``convert`` handed a pickle
that is no state dict, the ``--skip-bad-answers`` count, and a FIFO or a link to /dev/zero
given as a corpus file.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from paths import OFFICIAL as RELEASED

import folnet
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.data.documents import iter_documents
from folnet.train.tasks import read_split

#: Nesting that Python's json parser refuses with RecursionError and that crashed pyarrow's
#: JSON parser (a segmentation fault) when `datasets` read a corpus line holding it.
DEEP = 200_000
#: Nesting past what is read, yet shallow enough for any parser to refuse without crashing.
MODERATE = 5_000
#: A field past the csv module's default limit (131,072), within folnet's (1 MiB).
WIDE = 200_000
#: A field past folnet's limit too.
TOO_WIDE = (1 << 20) + 10
SOURCE_ROOT = Path(folnet.__file__).resolve().parents[1]  # the code under test


def one_line(text: str) -> str:
    """The message, after checking it is one line and no traceback."""
    assert "Traceback" not in text, text[-2000:]
    lines = text.strip().splitlines()
    assert len(lines) == 1, text[-2000:]
    return lines[0]


def refused(call, *args, **kwargs) -> str:
    """The one line of the `FolnetError` ``call(*args, **kwargs)`` raises."""
    with pytest.raises(FolnetError) as caught:
        call(*args, **kwargs)
    return one_line(str(caught.value))


def cli_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a command prints to stderr when it exits 2."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    return one_line(err)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail (rather than hang) a test that blocks for 30 s -- opening a FIFO would."""
    def expired(signum, frame):
        raise TimeoutError("blocked for 30 s")

    before = signal.signal(signal.SIGALRM, expired)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


# -- 1. CSV and TSV fields past the csv module's limit --------------------------------------


def write_rte(directory: Path, sentence: str) -> Path:
    path = directory / "train.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n"
                    f"0\t{sentence}\tA short hypothesis.\tentailment\n"
                    "1\tA dog sleeps.\tAn animal sleeps.\tentailment\n", encoding="utf-8")
    return path


def test_a_glue_field_of_200_kb_is_read(tmp_path):
    write_rte(tmp_path, "w" * WIDE)
    examples = read_split("glue/rte", tmp_path, "train").examples
    assert [len(ex.text_a) for ex in examples] == [WIDE, len("A dog sleeps.")]


def test_a_glue_field_past_the_limit_names_the_file_line_and_limit(tmp_path):
    path = write_rte(tmp_path, "w" * TOO_WIDE)
    line = refused(read_split, "glue/rte", tmp_path, "train")
    assert f"{path}:2:" in line and "1,048,576" in line, line


def test_an_unclosed_quote_in_a_clutrr_csv_names_the_line_it_opens(tmp_path):
    path = tmp_path / "1.2_train.csv"
    path.write_text('story,query,target\n"[Anna] met [Tom]. ' + "x" * TOO_WIDE
                    + "\n\"('Anna', 'Tom')\",son\n", encoding="utf-8")
    line = refused(read_split, "clutrr", tmp_path, "train")
    assert f"{path}:2:" in line and "1,048,576" in line and "quote" in line, line


def test_a_corpus_csv_with_a_200_kb_field_is_read(tmp_path):
    """Corpus CSV goes through `datasets` (pandas), which has no field limit: checked, not
    changed."""
    path = tmp_path / "c.csv"
    path.write_text("text\n" + "Word " * (WIDE // 5) + "\nA second document.\n",
                    encoding="utf-8")
    documents = list(iter_documents(str(path)))
    assert len(documents) == 2 and sum(len(s) for s in documents[0]) >= WIDE - 200


# -- 2. JSON nested deeper than a parser follows ---------------------------------------------


def test_a_squad_file_nested_200000_deep_is_one_line(tmp_path):
    path = tmp_path / "train-v2.0.json"
    path.write_text('{"data": ' + nested(DEEP) + "}", encoding="utf-8")
    line = refused(read_split, "squad2", tmp_path, "train")
    assert str(path) in line and "nested too deeply" in line, line


def test_squad_evaluate_on_a_deep_file_is_one_line(tmp_path):
    from folnet.train.tasks.metrics import squad_evaluate

    path = tmp_path / "dev-v2.0.json"
    path.write_text(nested(DEEP), encoding="utf-8")
    line = refused(squad_evaluate, path, {})
    assert str(path) in line and "nested too deeply" in line, line


def test_a_folio_line_nested_too_deeply_names_its_line(tmp_path):
    path = tmp_path / "folio-train.jsonl"
    record = {"premises": "All dogs bark.", "conclusion": "Rex barks.", "label": "True"}
    path.write_text(json.dumps(record) + "\n" + nested(DEEP) + "\n", encoding="utf-8")
    line = refused(read_split, "folio", tmp_path, "train")
    assert f"{path}:2:" in line and "nested too deeply" in line, line


def test_a_deep_tokenizer_config_is_one_line(tmp_path):
    from folnet.train.data.tokenizer import load_tokenizer, train_tokenizer

    train_tokenizer(texts=["A dog barks.", "A cat sleeps."], vocab_size=40).save(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(nested(DEEP), encoding="utf-8")
    line = refused(load_tokenizer, tmp_path / "tokenizer.json")
    assert str(config) in line and "nested too deeply" in line, line


def test_a_deep_ablation_plan_is_one_line(tmp_path):
    from folnet.train.ablate.plan import load_plan

    path = tmp_path / "plan.json"
    path.write_text(nested(DEEP), encoding="utf-8")
    line = refused(load_plan, path)
    assert str(path) in line and "nested too deeply" in line, line


def test_published_rows_nested_too_deeply_are_refused_before_datasets_reads_them(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"id": "q1", "title": "t", "context": "c", "question": "q", '
                    '"answers": ' + nested(MODERATE) + "}\n", encoding="utf-8")
    line = refused(read_split, "squad2", tmp_path, "train")
    assert str(path) in line and "line 1" in line and "5,001 levels" in line, line


def test_a_corpus_jsonl_line_nested_200000_deep_is_one_line_not_a_crash(tmp_path):
    """Run in a child process: before the depth check, pyarrow's parser died of a
    segmentation fault on this file, which would take the test process with it."""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "A first document."}\n{"text": ' + nested(DEEP) + "}\n",
                    encoding="utf-8")
    code = ("import sys\n"
            "from folnet.errors import FolnetError\n"
            "from folnet.train.data.documents import iter_documents\n"
            "try:\n"
            "    list(iter_documents(sys.argv[1]))\n"
            "except FolnetError as exc:\n"
            "    print(exc)\n"
            "    sys.exit(2)\n")
    env = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT), "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    line = one_line(done.stdout)
    assert str(path) in line and "line 2" in line and "200,001 levels" in line, line


def test_brackets_inside_corpus_strings_are_not_nesting(tmp_path):
    """The depth check skips strings: a document of brackets is text, read as any other."""
    path = tmp_path / "brackets.jsonl"
    text = "[ " * MODERATE + "words " + "{ " * MODERATE
    path.write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": "Two."}) + "\n",
                    encoding="utf-8")
    assert len(list(iter_documents(str(path)))) == 2


# -- 3. info's integer options ---------------------------------------------------------------


def test_info_refuses_a_billion_tokens_before_building_anything(capsys):
    line = cli_refused(["info", "jmc.atp", "--preset", "base", "--seq-len", "1000000000"],
                       capsys)
    assert "--seq-len" in line and "1000000000" in line and "4,096" in line, line


def test_info_refuses_a_length_past_the_absolute_position_table(capsys):
    line = cli_refused(["info", "jmc.atp", "--preset", "tiny", "--position", "ape",
                        "--seq-len", "600"], capsys)
    assert "--seq-len" in line and "600" in line and "max_positions" in line, line
    assert "512" in line, line


@pytest.mark.parametrize("option", ["--vocab-size", "--D2"])
def test_info_names_the_option_of_a_size_out_of_range(option, capsys):
    line = cli_refused(["info", "jmc.atp", "--preset", "tiny", option, "10000000000000"],
                       capsys)
    assert option in line and "10000000000000" in line, line


# -- 4. convert on a pickle that is no state dict --------------------------------------------


class Unsafe:
    """Unpickling this opens (creates) a file: what loading an arbitrary pickle would run."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


class Thing:
    """An arbitrary object, saved by `torch.save` where a state dict belongs."""


def released_prefix(tmp_path: Path, name: str) -> Path:
    prefix = tmp_path / name
    shutil.copyfile(f"{RELEASED}.cfg", f"{prefix}.cfg")
    return prefix


@pytest.mark.parametrize("kind", ["object", "protocol-4", "code", "junk"])
def test_convert_of_a_pickle_that_is_no_state_dict_is_one_line(tmp_path, kind, capsys):
    prefix = released_prefix(tmp_path, "bad")
    weights = Path(f"{prefix}.pt")
    marker = tmp_path / "ran"
    if kind == "object":
        torch.save(Thing(), weights)
    elif kind == "protocol-4":
        weights.write_bytes(pickle.dumps({"weight": [1.0, 2.0]}, protocol=4))
    elif kind == "code":
        weights.write_bytes(pickle.dumps(Unsafe(marker), protocol=2))
    else:
        weights.write_bytes(b"hello, this is no pickle at all\n")
    line = cli_refused(["convert", str(prefix), str(tmp_path / "out")], capsys)
    assert str(weights) in line and "state dict" in line, line
    assert not marker.exists()  # nothing in the pickle ran
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["object", "code"])
def test_the_folnet_command_on_a_pickle_prints_one_line_and_nothing_of_torchs(tmp_path, kind):
    """As a user runs it: a process of its own, where torch's warnings and its loader's
    advice would reach stderr (pytest's capture of the in-process test above holds warnings
    back)."""
    prefix = released_prefix(tmp_path, "bad")
    weights = Path(f"{prefix}.pt")
    marker = tmp_path / "ran"
    if kind == "object":
        torch.save(Thing(), weights)
    else:
        weights.write_bytes(pickle.dumps(Unsafe(marker), protocol=2))
    done = subprocess.run([sys.executable, "-m", "folnet", "convert", str(prefix),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "default"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("folnet convert: error: "), done.stderr
    assert "weights_only=False" not in done.stderr and "WeightsUnpickler" not in done.stderr
    assert not marker.exists()


# -- 5. the --skip-bad-answers count ---------------------------------------------------------


def test_skipped_answers_are_one_warning_line(tmp_path, capsys):
    context = "The dog Biscuit lives near the old mill."
    questions = [{"id": "q-good", "question": "Who lives there?",
                  "answers": [{"text": "Biscuit", "answer_start": 8}]},
                 {"id": "q-shifted", "question": "Where?",
                  "answers": [{"text": "old mill", "answer_start": 3}]}]
    data = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": questions}]}]}
    path = tmp_path / "train-v2.0.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    split = read_split("squad2", tmp_path, "train", {"skip_bad_answers": True})
    assert [ex.qid for ex in split.examples] == ["q-good"]
    line = one_line(capsys.readouterr().err)
    assert line.startswith("folnet: warning: ") and str(path) in line, line
    assert "skipped 1 question" in line and "'q-shifted'" in line and "Warning:" not in line


# -- 6. a corpus path that is not a regular file ---------------------------------------------


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "something.txt"
    os.mkfifo(path)
    return path


@pytest.mark.usefixtures("deadline")
def test_a_fifo_corpus_is_refused_without_opening_it(fifo):
    line = refused(iter_documents, str(fifo))
    assert str(fifo) in line and "not a regular file" in line and "FIFO" in line, line


@pytest.mark.usefixtures("deadline")
def test_a_link_to_dev_zero_is_refused(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    link = tmp_path / "something.txt"
    link.symlink_to("/dev/zero")
    line = refused(iter_documents, str(link))
    assert str(link) in line and "not a regular file" in line and "device" in line, line


@pytest.mark.usefixtures("deadline", "one_thread")
def test_pretrain_on_a_fifo_is_one_line(tmp_path, fifo, capsys):
    out = tmp_path / "run"
    line = cli_refused(["pretrain", "--preset", "tiny", "--data", str(fifo), "--steps", "1",
                        "--no-progress", "--out", str(out)], capsys)
    assert "--data" in line and str(fifo) in line and "not a regular file" in line, line
