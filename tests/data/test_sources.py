"""Plain text files are split into paragraphs by folnet itself (`folnet.train.data.sources
.paragraphs`), not by `datasets`: the records must be the ones `datasets`' text builder makes,
on every kind of separator, line ending and chunk boundary."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from folnet.errors import FolnetError
from folnet.train.data.sources import paragraphs, read_texts

datasets = pytest.importorskip("datasets")

PIECES = ["qa mother p19 son .", "naïve — ünïcode ✓", "x", " leading space", "tab\there",
          "", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", "\r\r", " \n \n", "\u2028"]


def _datasets_paragraphs(path: Path, encoding: str = "utf-8") -> list[str]:
    stream = datasets.load_dataset("text", data_files=[str(path)], split="train",
                                   streaming=True, sample_by="paragraph", encoding=encoding)
    return [record["text"] for record in stream]


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 60)))


def test_paragraphs_are_the_ones_datasets_makes(tmp_path):
    rng = random.Random(0)
    texts = [_random_text(rng) for _ in range(40)]
    texts += ["", "\n\n", "a\n\nb\n\n", "\n\na", "a\n\n\n\nb", "a\r\n\r\nb\r\n"]
    for k, text in enumerate(texts):
        path = tmp_path / f"t{k}.txt"
        path.write_bytes(text.encode("utf-8"))
        expected = _datasets_paragraphs(path)
        assert list(paragraphs(path)) == expected, repr(text)
        # chunk boundaries anywhere (one character at a time, and a few more) change nothing
        for chunk in (1, 2, 3, 7):
            assert list(paragraphs(path, chunk=chunk)) == expected, (repr(text), chunk)


def test_a_corpus_file_reads_as_before(tmp_path):
    """read_texts on a plain .txt gives datasets' records (a kinship-like corpus), and
    another encoding is applied."""
    rng = random.Random(1)
    docs = ["\n".join(f"p{rng.randint(0, 30)} son p{rng.randint(0, 30)} mother ."
                      for _ in range(rng.randint(1, 5))) for _ in range(300)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    got = list(read_texts("text", path))
    assert got == _datasets_paragraphs(path) and len(got) == 300
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café au lait\n\nthé\n".encode("latin-1"))
    assert list(read_texts("text", latin, encoding="latin-1")) == ["café au lait", "thé\n"]
    assert list(read_texts("text", latin, encoding="latin-1")) == _datasets_paragraphs(
        latin, "latin-1")


def test_undecodable_text_names_the_file(tmp_path):
    """A file whose bytes past the sampled first MiB do not decode: the error names it."""
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok text here.\n\n" * 80_000 + b"\xff\xfe broken\n")
    with pytest.raises(FolnetError, match=r"bad\.txt.*--encoding"):
        list(read_texts("text", path))


def test_reading_a_text_corpus_does_not_import_datasets(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("a b .\n\nc d .\n", encoding="utf-8")
    code = ("import sys; from pathlib import Path; "
            "from folnet.train.data.sources import read_texts; "
            f"print(list(read_texts('text', Path({str(path)!r})))); "
            "print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["['a b .', 'c d .\\n']", "False"]
