"""Reader for CLUTRR (kinship reasoning) CSV files as published (``<levels>_train.csv``,
``<level>_test.csv``), and for the ``CLUTRR/v1`` rows in a datasets format (`clutrr_rows`).

The columns used are ``story`` (segment A), ``query`` (a Python tuple literal of two names,
e.g. ``"('Anna', 'Tom')"``) and ``target`` (the relation name). The query becomes segment B
as a question, "How is Tom related to Anna?", following CLUTRR's convention that the target
relation r of the query (a, b) reads "b is a's r". The label set is not fixed in advance:
it is the sorted set of targets in the train file(s), so a test file whose target never occurs
in training is an error rather than an unlearnable class.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

from folnet.errors import FolnetError
from folnet.read_files import csv_rows
from folnet.train.tasks.base import Example, FinetuneDefaults, TaskSpec
from folnet.train.tasks.generation import encode_by_kind, generation_twin, score_by_kind
from folnet.train.tasks.hfdatasets import Published, RowTable
from folnet.train.tasks.registry import TaskFamily, read_files

__all__ = ["CLUTRR", "CLUTRR_GENERATE", "FAMILY", "PUBLISHED", "clutrr_example",
           "clutrr_labels", "clutrr_rows", "label_set", "question", "read_clutrr"]

CLUTRR = TaskSpec(
    name="clutrr",
    kind="classification",
    labels=None,
    metrics=("accuracy",),
    main_metric="accuracy",
    splits=(("train", ("*_train.csv",)), ("test", ("*_test.csv",))),
    eval_splits=("test",),
    seq_len=256,
    defaults=FinetuneDefaults(epochs=100, lr=5e-5, batch_size=16),
)

_COLUMNS = ("story", "query", "target")


def question(query: tuple[str, str]) -> str:
    """Segment B for a query pair (a, b): asks for b's relation to a."""
    first, second = query
    return f"How is {second} related to {first}?"


def _records(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(1-based line where the record starts, {column: value}) for every data record. Stories
    may contain quoted commas (and in principle newlines), so this is a standard CSV read;
    `csv_rows` names the file and line of a field too long (an unclosed quote, most likely)."""
    with path.open(encoding="utf-8", newline="") as handle:
        header: list[str] | None = None
        for line, fields in csv_rows(handle, str(path)):
            if not fields:
                continue
            if header is None:
                header = fields
                missing = [c for c in _COLUMNS if c not in header]
                if missing:
                    raise FolnetError(
                        f"{path}:{line}: the header {header!r} lacks column(s) {missing!r}"
                    )
                continue
            if len(fields) != len(header):
                raise FolnetError(
                    f"{path}:{line}: expected {len(header)} comma-separated columns (as the "
                    f"header has) but found {len(fields)}"
                )
            yield line, dict(zip(header, fields, strict=True))
        if header is None:
            raise FolnetError(f"{path}: the file is empty (expected a header row)")


def _parse_query(raw: str, where: str) -> tuple[str, str]:
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = None
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, str) for v in value)
    ):
        raise FolnetError(f"{where}: query {raw!r} is not a pair of names like \"('Anna', 'Tom')\"")
    return value[0], value[1]


def clutrr_example(task: TaskSpec, story: str, query: str, target: str, guid: str,
                   where: str) -> Example:
    """One CLUTRR record (a csv line or a published row) as an example: the story as segment
    A, the query as a question as segment B. With ``task.labels`` set (the train label set), a
    target outside it is an error."""
    names = _parse_query(query, where)
    target = target.strip()
    if not target:
        raise FolnetError(f"{where}: empty target")
    if task.labels is not None and target not in task.labels:
        raise FolnetError(
            f"{where}: label {target!r} does not occur in the CLUTRR train file(s); "
            f"train labels: {', '.join(task.labels)}"
        )
    return Example(guid, story, question(names), target)


def label_set(examples: Sequence[Example]) -> tuple[str, ...]:
    """The sorted set of targets of the (train) examples: CLUTRR's label set."""
    if not examples:
        raise FolnetError("no CLUTRR records in the train split")
    return tuple(sorted({str(ex.label) for ex in examples}))


def read_clutrr(task: TaskSpec, paths: Sequence[Path], split: str) -> list[Example]:
    """Examples of the given CLUTRR files (guids ``<file stem>-<line>``). The family's reader
    reads the train files with ``task.labels`` None and the other splits against their label
    set. A ``target_text`` column, when there is one (the csv export of ``CLUTRR/v1``, whose
    ``target`` is a class number), holds the relation."""
    out = []
    for path in paths:
        for line, record in _records(path):
            target = record.get("target_text", record["target"])
            out.append(clutrr_example(task, record["story"], record["query"], target,
                                      f"{path.stem}-{line}", f"{path}:{line}"))
    return out


def clutrr_labels(paths: Sequence[Path]) -> tuple[str, ...]:
    """The sorted set of targets over the given (train) files."""
    examples = read_clutrr(CLUTRR, paths, "train")
    if not examples:
        raise FolnetError(f"no CLUTRR records in {[str(p) for p in paths]!r}")
    return label_set(examples)


def clutrr_rows(task: TaskSpec, table: RowTable) -> list[Example]:
    """Examples of CLUTRR as ``CLUTRR/v1`` publishes it: the relation is ``target_text``
    (``target`` there is its class number); guids are ``<split>-<id>``."""
    return [clutrr_example(task, table.text(i, "story"), table.text(i, "query"),
                           table.text(i, "target_text"), table.guid(i, "id"), table.where(i))
            for i in range(len(table.rows))]


PUBLISHED = Published("CLUTRR/v1", ("story", "query"), "target_text", clutrr_rows)

#: CLUTRR answered by generation: the relation's word (`folnet.train.tasks.generation`).
CLUTRR_GENERATE = generation_twin(CLUTRR, CLUTRR.metrics)


FAMILY = TaskFamily("clutrr", (CLUTRR, CLUTRR_GENERATE),
                    read=read_files(read_clutrr, published={CLUTRR.name: PUBLISHED,
                                                            CLUTRR_GENERATE.name: PUBLISHED},
                                    labels_from=label_set),
                    encode=encode_by_kind, score=score_by_kind)
