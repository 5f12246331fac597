"""Is a corpus file text? The checks that keep binary data and wrongly decoded text out of a run.

Two things are counted, in characters, as the corpus is read:

* characters that are not text: control characters other than tab, line and page breaks
  (C0 and C1 controls, DEL), and U+FFFD, the replacement character that stands for bytes some
  earlier tool could not decode;
* bytes that ``--encoding`` (default utf-8) cannot decode.

Why: random or binary bytes read as text decode to a stream of control characters and
undecodable bytes, and the tokenizer's normaliser silently drops both, so such a file would
train on whatever is left, and a tokenizer trained on it learns the fragments as words
(docs/results/measurements.md). The rules:

* up to `MAX_BAD_SHARE` (1%) of a file's characters may be control characters -- a stray NUL or
  bell is a flaw of real text, and the normaliser drops it; beyond that the file is refused as
  "not text", naming the share found;
* an undecodable byte is never tolerated: the text it belonged to would be lost without a word
  (Latin-1 "café" read as UTF-8 becomes "caf"), so one is an error naming the file, the line,
  the share of such bytes and ``--encoding``.

When: `check_sample` decodes the first `SAMPLE_BYTES` (1 MiB) of every plain or compressed
text, JSON or CSV file -- cheap enough to run before a run writes anything, and run again when
the file is read. `TextMeter` then counts the non-text characters of every record of every
format (parquet, arrow and saved datasets hold decoded strings, and a text file may turn
binary after its first MiB) while it is read, refusing the file once their share passes the
limit: judged from the first MiB of characters on, and at the end of the file. Past the
sample, an undecodable byte stops the `datasets` reader, which `folnet.train.data.sources`
reports naming the file and ``--encoding``.

One check is about structure, not text: `check_json_depth` refuses a JSON or JSON Lines file
with a line nested more than `MAX_JSON_DEPTH` levels deep before `datasets` reads it, since
pyarrow's JSON parser (the one `datasets` tries first) recurses on the native stack and a line
nested about 175,000 deep killed the process with a segmentation fault -- no exception, no
message, nothing to catch.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import re
from pathlib import Path
from typing import IO

import numpy as np

from folnet.errors import FolnetError

__all__ = ["MAX_BAD_SHARE", "MAX_JSON_DEPTH", "SAMPLE_BYTES", "TextMeter", "canonical_encoding",
           "check_json_depth", "check_sample", "first_undecodable_line", "is_utf8"]

#: The largest share of a file's characters that may be control characters (or U+FFFD).
MAX_BAD_SHARE = 0.01
#: How much of each text-format file is decoded up front.
SAMPLE_BYTES = 1 << 20

# C0 controls but tab, line feed, vertical tab, form feed and carriage return; DEL; C1
# controls; U+FFFD. Undecodable bytes appear as lone surrogates (the surrogateescape handler).
_NOT_TEXT = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")
_UNDECODABLE = re.compile("[\udc80-\udcff]")
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_SAMPLED = frozenset({"text", "json", "csv"})  # the builders that decode bytes themselves
#: The deepest nesting of arrays and objects a line of a JSON file read through `datasets` may
#: have: as deep as Python's own parser goes (its default recursion limit), below the 1,024
#: levels of the parser `datasets` falls back to, far above any real record.
MAX_JSON_DEPTH = 1000
_SCAN_BYTES = 1 << 16  # how much of a JSON file `check_json_depth` takes at a time
# a JSON string (escapes included), or an unclosed one to the end of its line; written as
# runs of plain bytes between escapes, which the regex engine matches a run at a time
_JSON_STRING = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"?')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def canonical_encoding(name: object, field: str = "encoding") -> str:
    """The codec's canonical name (``latin-1`` -> ``iso8859-1``); an unknown one is an error
    naming ``field``."""
    if not isinstance(name, str) or not name:
        raise FolnetError(f"{field} must be the name of a text encoding, got {name!r}")
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise FolnetError(f"{field} {name!r} is not an encoding Python knows (e.g. utf-8, "
                          f"latin-1, cp1252)") from None
    if not getattr(info, "_is_text_encoding", True):
        raise FolnetError(f"{field} {name!r} is not a text encoding")
    return info.name


def is_utf8(encoding: str) -> bool:
    return canonical_encoding(encoding) == "utf-8"


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def _not_text(path: Path, bad: int, total: int, where: str, what: str) -> FolnetError:
    return FolnetError(
        f"corpus file {str(path)!r} is not text: {_percent(bad / total)} of {where} "
        f"{total:,} characters are {what} (the limit is 1%)")


class TextMeter:
    """Counts the non-text characters of one file's records as they are read (see the module
    docstring) and raises `FolnetError` once they pass `MAX_BAD_SHARE`."""

    def __init__(self, path: Path, encoding: str) -> None:
        self.path, self.encoding = path, encoding
        self.total = self.bad = 0

    def add(self, text: str) -> None:
        """Count one record; from the first `SAMPLE_BYTES` characters on, judge the file."""
        self.total += len(text)
        self.bad += len(_NOT_TEXT.findall(text))
        if self.total >= SAMPLE_BYTES:
            self._judge("its first")

    def finish(self) -> None:
        """Judge the whole file (a small file is judged only here)."""
        self._judge("its")

    def _judge(self, where: str) -> None:
        if self.bad > MAX_BAD_SHARE * self.total:
            raise _not_text(self.path, self.bad, self.total, where,
                            "control characters or U+FFFD (undecodable bytes)")


def _open_binary(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed by its suffix (.gz .bz2 .xz .zst)."""
    suffix = path.suffix.lower()
    if suffix == ".zst":
        import zstandard  # the caller checked it is installed (sources._format_of)

        return zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
    opener = _OPENERS.get(suffix)
    return opener(path, "rb") if opener is not None else path.open("rb")


def _read_sample(path: Path) -> tuple[bytes, bool]:
    """Up to `SAMPLE_BYTES` decompressed bytes, and whether that is the whole file."""
    chunks, size = [], 0
    try:
        with _open_binary(path) as handle:
            while size < SAMPLE_BYTES:
                chunk = handle.read(SAMPLE_BYTES - size)
                if not chunk:
                    return b"".join(chunks), True
                chunks.append(chunk)
                size += len(chunk)
    except (OSError, EOFError, lzma.LZMAError, ValueError) as exc:
        message = " ".join(str(exc).split())
        raise FolnetError(f"cannot read corpus file {str(path)!r}: {message}") from None
    return b"".join(chunks), False


def check_sample(kind: str, path: Path, encoding: str = "utf-8") -> None:
    """Decode the first `SAMPLE_BYTES` of a text, JSON or CSV file with ``encoding`` and raise
    `FolnetError` if bytes do not decode or if it is not text (see the module docstring);
    other formats (parquet, arrow, saved datasets) are left to `TextMeter`."""
    if kind not in _SAMPLED:
        return
    data, whole = _read_sample(path)
    decoder = codecs.getincrementaldecoder(encoding)(errors="surrogateescape")
    text = decoder.decode(data, final=whole)  # a character cut at the sample's end waits
    if not text:
        return
    undecodable = len(_UNDECODABLE.findall(text))
    controls = len(_NOT_TEXT.findall(text))
    where = "its" if whole else "its first"
    if controls > MAX_BAD_SHARE * len(text):
        also = (f" and {_percent(undecodable / len(text))} are bytes that are not valid "
                f"{encoding}" if undecodable else "")
        raise _not_text(path, controls, len(text), where, f"control characters{also}")
    first = _UNDECODABLE.search(text)
    if first is not None:
        line = text.count("\n", 0, first.start()) + 1
        byte = ord(first.group()) - 0xDC00
        raise FolnetError(
            f"corpus file {str(path)!r} is not valid {encoding}: {undecodable:,} byte(s) of "
            f"{where} {len(data):,} ({_percent(undecodable / len(data))}) cannot be decoded, "
            f"the first (0x{byte:02x}) on line {line}; if it is text in another encoding, "
            f"pass --encoding (e.g. latin-1 or cp1252)")


def first_undecodable_line(path: Path, encoding: str = "utf-8") -> tuple[int, str] | None:
    """(1-based line number, the decoder's reason) of the first line of an uncompressed file
    that `encoding` cannot decode, or None. For messages after a decoding error: a text
    reader decodes ahead in blocks, so the line it had reached is not the line at fault."""
    decoder = codecs.getincrementaldecoder(encoding)()
    line = 0
    with path.open("rb") as handle:
        for line, raw in enumerate(handle, 1):
            try:
                decoder.decode(raw)
            except UnicodeDecodeError as exc:
                return line, f"byte 0x{exc.object[exc.start]:02x}: {exc.reason}"
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            return line, f"the file ends inside a character: {exc.reason}"
    return None


def _line_depth(line: bytes) -> int:
    """The deepest nesting of arrays and objects in one JSON line (as UTF-8 or another
    ASCII-safe encoding), brackets inside strings not counted; a parser stops at the first
    error, so this bounds how deep any parser goes into the line."""
    brackets = _JSON_STRING.sub(b"", line).translate(None, _NOT_BRACKETS)
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max(initial=0))


def _openers(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{")


def check_json_depth(path: Path, encoding: str = "utf-8", what: str = "corpus file") -> None:
    """Raise `FolnetError` naming ``what``, the file and the line when a line of a JSON or
    JSON Lines file (plain or compressed) nests arrays and objects more than `MAX_JSON_DEPTH`
    levels deep (see the module docstring for why).

    A line nests at most as deep as it has opening brackets, so only a line with more than
    `MAX_JSON_DEPTH` of them has its depth counted exactly (strings skipped); a stretch of the
    file with fewer costs two byte counts. Each byte is read once and a line longer than a read
    is joined once, so a file on one line (a whole JSON array) costs linear time. Text in an
    encoding other than UTF-8 is decoded and counted as UTF-8, where no byte of a multi-byte
    character can pass for a bracket."""
    utf8 = is_utf8(encoding)
    decoder = None if utf8 else codecs.getincrementaldecoder(encoding)(errors="replace")
    pending: list[bytes] = []  # the pieces of a line not yet complete
    opened = 0  # opening brackets in those pieces
    line = 1  # the number of the line `pending` starts
    try:
        handle = _open_binary(path)
    except OSError as exc:
        raise FolnetError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    with handle:
        while True:
            try:
                raw = handle.read(_SCAN_BYTES)
            except (OSError, EOFError, lzma.LZMAError, ValueError) as exc:
                message = " ".join(str(exc).split())
                raise FolnetError(f"cannot read {what} {str(path)!r}: {message}") from None
            chunk = raw if decoder is None else decoder.decode(raw, final=not raw).encode()
            cut = chunk.rfind(b"\n") + 1 if raw else len(chunk)
            if raw and cut == 0:  # no line ends here: the line goes on
                pending.append(chunk)
                opened += _openers(chunk)
                continue
            head, rest = chunk[:cut], chunk[cut:]
            if opened + _openers(head) > MAX_JSON_DEPTH:
                block = b"".join([*pending, head])
                for number, text in enumerate(block.split(b"\n"), line):
                    depth = _line_depth(text) if _openers(text) > MAX_JSON_DEPTH else 0
                    if depth > MAX_JSON_DEPTH:
                        raise FolnetError(
                            f"{what} {str(path)!r}, line {number}: JSON nested {depth:,} "
                            f"levels deep, more than the {MAX_JSON_DEPTH:,} that are read "
                            f"(deeper nesting crashes the JSON parser of `datasets`)")
            line += head.count(b"\n")
            pending, opened = [rest], _openers(rest)
            if not raw:
                return
