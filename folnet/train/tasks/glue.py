"""Readers for the GLUE TSV files exactly as distributed (``glue_data/<TASK>/*.tsv``), and for
GLUE as ``nyu-mll/glue`` publishes it (`glue_rows`, see `hfdatasets`).

Columns are found by header name rather than position because the layouts differ between
splits of one task (MNLI dev has five annotator columns that train lacks, test files lack the
label). CoLA's train/dev files are the exception: they have no header and four fixed columns
(source, label, original mark, sentence). Files are read with ``csv.QUOTE_NONE`` because
GLUE sentences contain unbalanced quote characters that are text, not quoting. Every row must
have as many fields as the header; a short or long row is an error quoting the file and its
1-based line, never a silent skip. A field may be up to `folnet.read_files.CSV_FIELD_LIMIT`
characters long (the csv module alone stops at 131,072 with an error naming no file); a longer
one is an error naming the file, its line and the limit.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from folnet.errors import FolnetError
from folnet.read_files import csv_rows
from folnet.train.data.checks import first_undecodable_line
from folnet.train.tasks.base import Example, FinetuneDefaults, TaskSpec
from folnet.train.tasks.classify import encode_split, score_split
from folnet.train.tasks.hfdatasets import Published, RowTable
from folnet.train.tasks.registry import TaskFamily, read_files

__all__ = ["FAMILY", "GLUE_BIG", "GLUE_SMALL", "PUBLISHED", "TASKS", "glue_rows", "read_glue"]

GLUE_SMALL = FinetuneDefaults(epochs=10, lr=1e-4, batch_size=16)
GLUE_BIG = FinetuneDefaults(epochs=3, lr=8e-5, batch_size=32)


def _glue(
    name: str,
    labels: tuple[str, ...] | None,
    metrics: tuple[str, ...],
    subdir: str,
    defaults: FinetuneDefaults,
    mnli: bool = False,
) -> TaskSpec:
    if mnli:
        splits = (
            ("train", ("train.tsv",)),
            ("validation_matched", ("dev_matched.tsv",)),
            ("validation_mismatched", ("dev_mismatched.tsv",)),
            ("test_matched", ("test_matched.tsv",)),
            ("test_mismatched", ("test_mismatched.tsv",)),
        )
        eval_splits = ("validation_matched", "validation_mismatched")
    else:
        splits = (("train", ("train.tsv",)), ("validation", ("dev.tsv",)), ("test", ("test.tsv",)))
        eval_splits = ("validation",)
    return TaskSpec(
        name=f"glue/{name}",
        kind="regression" if labels is None else "classification",
        labels=labels,
        metrics=metrics,
        main_metric=metrics[0],
        splits=splits,
        eval_splits=eval_splits,
        seq_len=128,
        defaults=defaults,
        data_subdir=subdir,
    )


_BINARY = ("0", "1")
_ENTAIL = ("entailment", "not_entailment")

TASKS = (
    _glue("mnli", ("entailment", "neutral", "contradiction"), ("accuracy",), "MNLI", GLUE_BIG,
          mnli=True),
    _glue("qqp", _BINARY, ("accuracy", "f1"), "QQP", GLUE_BIG),
    _glue("qnli", _ENTAIL, ("accuracy",), "QNLI", GLUE_BIG),
    _glue("sst2", _BINARY, ("accuracy",), "SST-2", GLUE_BIG),
    _glue("cola", _BINARY, ("mcc",), "CoLA", GLUE_SMALL),
    _glue("stsb", None, ("pearson", "spearman"), "STS-B", GLUE_SMALL),
    _glue("mrpc", _BINARY, ("accuracy", "f1"), "MRPC", GLUE_SMALL),
    _glue("rte", _ENTAIL, ("accuracy",), "RTE", GLUE_SMALL),
)


@dataclass(frozen=True)
class _Layout:
    """Header names of the columns one GLUE task uses (None: the task has no such column).
    ``headerless`` names the fixed columns of train/dev files that have no header (CoLA).
    ``hub`` is the task's config in ``nyu-mll/glue``, ``hub_a``/``hub_b`` its text columns
    there and ``hub_labels`` the `ClassLabel` names whose order its integer labels follow --
    position i is the task's label i (``labels``), so both formats train the same classes."""

    text_a: str
    text_b: str | None
    label: str
    hub: str
    hub_a: str
    hub_b: str | None
    hub_labels: tuple[str, ...] | None
    headerless: tuple[str, ...] | None = None


_LAYOUTS = {
    "glue/mnli": _Layout("sentence1", "sentence2", "gold_label", "mnli", "premise", "hypothesis",
                         ("entailment", "neutral", "contradiction")),
    "glue/qqp": _Layout("question1", "question2", "is_duplicate", "qqp", "question1",
                        "question2", ("not_duplicate", "duplicate")),
    "glue/qnli": _Layout("question", "sentence", "label", "qnli", "question", "sentence",
                         ("entailment", "not_entailment")),
    "glue/sst2": _Layout("sentence", None, "label", "sst2", "sentence", None,
                         ("negative", "positive")),
    "glue/cola": _Layout("sentence", None, "label", "cola", "sentence", None,
                         ("unacceptable", "acceptable"),
                         headerless=("source", "label", "original_mark", "sentence")),
    "glue/stsb": _Layout("sentence1", "sentence2", "score", "stsb", "sentence1", "sentence2",
                         None),
    "glue/mrpc": _Layout("#1 String", "#2 String", "Quality", "mrpc", "sentence1", "sentence2",
                         ("not_equivalent", "equivalent")),
    "glue/rte": _Layout("sentence1", "sentence2", "label", "rte", "sentence1", "sentence2",
                        ("entailment", "not_entailment")),
}


def _layout(task: TaskSpec, reader: str) -> _Layout:
    layout = _LAYOUTS.get(task.name)
    if layout is None:
        raise FolnetError(f"{reader}: {task.name!r} is not a GLUE task")
    return layout


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, fields) for every non-blank line. ``utf-8-sig`` drops the byte
    order mark that MRPC's files start with; with QUOTE_NONE one record is one line. Bytes
    that are not UTF-8 are an error naming the line that holds them."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            for line, fields in csv_rows(handle, str(path), delimiter="\t",
                                         quoting=csv.QUOTE_NONE):
                if fields:
                    yield line, fields
    except UnicodeDecodeError:
        # the decoder runs blocks ahead of the reader: find the line that holds the bytes
        bad = first_undecodable_line(path, "utf-8-sig")
        where = f"{path}:{bad[0]}: not valid UTF-8 ({bad[1]})" if bad else \
            f"{path}: not valid UTF-8"
        raise FolnetError(f"{where}; GLUE files are UTF-8 text") from None


def _check_width(path: Path, line: int, fields: list[str], width: int, what: str) -> None:
    if len(fields) != width:
        shown = "\t".join(fields)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise FolnetError(
            f"{path}:{line}: expected {width} tab-separated columns ({what}) but found "
            f"{len(fields)}: {shown!r}"
        )


def _parse_label(task: TaskSpec, raw: str, where: str) -> str | float:
    if task.kind == "regression":
        try:
            value = float(raw)
        except ValueError:
            raise FolnetError(f"{where}: score {raw!r} is not a number") from None
        if value != value:  # NaN
            raise FolnetError(f"{where}: score {raw!r} is not a number")
        return value
    task.label_id(raw, where)  # raises with the valid labels when unknown
    return raw


def _read_headerless(task: TaskSpec, layout: _Layout, path: Path, split: str) -> list[Example]:
    """A file without a header, its columns fixed (CoLA's train and dev files)."""
    columns = {name: i for i, name in enumerate(layout.headerless or ())}
    what = (f"{', '.join(columns).replace('_', ' ')}; {task.data_subdir or task.name} "
            f"train/dev files have no header")
    out = []
    for line, fields in _rows(path):
        _check_width(path, line, fields, len(columns), what)
        label = _parse_label(task, fields[columns[layout.label]], f"{path}:{line}")
        out.append(Example(f"{split}-{line}", fields[columns[layout.text_a]], None, label))
    return out


def read_glue(task: TaskSpec, path: str | Path, split: str) -> list[Example]:
    """Examples of one GLUE split file. A split whose file has no label column (the
    published test files) is read with ``label=None``; a train/dev file without one is an
    error, since silently training on unlabelled rows would be a bug."""
    path = Path(path)
    layout = _layout(task, "read_glue")
    if layout.headerless is not None and not split.startswith("test"):
        return _read_headerless(task, layout, path, split)
    rows = _rows(path)
    try:
        header_line, header = next(rows)
    except StopIteration:
        raise FolnetError(f"{path}: the file is empty (expected a header row)") from None
    columns = {name: i for i, name in enumerate(header)}

    def column(name: str) -> int:
        if name not in columns:
            raise FolnetError(f"{path}:{header_line}: no {name!r} column in the header {header!r}")
        return columns[name]

    ia = column(layout.text_a)
    ib = column(layout.text_b) if layout.text_b is not None else None
    if layout.label in columns:
        il: int | None = columns[layout.label]
    elif split.startswith("test"):
        il = None
    else:
        column(layout.label)  # raises: a labelled split needs its label column
        il = None
    what = "as many as the header has"
    out = []
    for line, fields in rows:
        _check_width(path, line, fields, len(header), what)
        where = f"{path}:{line}"
        label = None if il is None else _parse_label(task, fields[il], where)
        text_b = None if ib is None else fields[ib]
        out.append(Example(f"{split}-{line}", fields[ia], text_b, label))
    return out


def _hub_label(task: TaskSpec, layout: _Layout, value: object, where: str) -> str | float | None:
    """A published label as the task's label: -1 (or none) marks an unlabelled row, an integer
    is a class number in the `ClassLabel` order, a string a class name of either format."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                         and value == -1):
        return None
    if task.kind == "regression":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise FolnetError(f"{where}: score {value!r} is not a number")
        if isinstance(value, float) and float(np.float32(value)) == value:
            # a float32 score (STS-B's published dtype) as the decimal it was written as --
            # the TSV's "3.800", not 3.7999999523 -- so both formats give the same targets
            value = str(np.float32(value))
        return _parse_label(task, str(value), where)
    names = layout.hub_labels or ()
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(names):
            raise FolnetError(f"{where}: label {value} is not a {task.name} class number: "
                              f"expected 0..{len(names) - 1} ({', '.join(names)}) or -1")
        return _parse_label(task, (task.labels or ())[value], where)
    if isinstance(value, str):
        mapped = dict(zip(names, task.labels or (), strict=True)).get(value, value)
        return _parse_label(task, mapped, where)
    raise FolnetError(f"{where}: label {value!r} is neither a class number nor a class name")


def glue_rows(task: TaskSpec, table: RowTable) -> list[Example]:
    """Examples of one GLUE split as ``nyu-mll/glue`` publishes it; guids are
    ``<split>-<idx>``. A label column typed `ClassLabel` must name the classes in the
    published order, so integer labels cannot silently mean other classes."""
    layout = _layout(task, "glue_rows")
    given = table.class_names.get("label")
    if given is not None and layout.hub_labels is not None and given != layout.hub_labels:
        raise FolnetError(f"{table.source}: the label column's classes are {list(given)}, "
                          f"expected {list(layout.hub_labels)} (nyu-mll/glue {layout.hub})")
    out = []
    for i, row in enumerate(table.rows):
        text_b = None if layout.hub_b is None else table.text(i, layout.hub_b)
        label = _hub_label(task, layout, row.get("label"), table.where(i))
        out.append(Example(table.guid(i, "idx"), table.text(i, layout.hub_a), text_b, label))
    return out


PUBLISHED = {
    name: Published(f"nyu-mll/glue {layout.hub}",
                    tuple(c for c in (layout.hub_a, layout.hub_b) if c is not None), "label",
                    glue_rows, dirs=(layout.hub,))
    for name, layout in _LAYOUTS.items()
}

FAMILY = TaskFamily("glue", TASKS, read=read_files(lambda spec, paths, split:
                                                    read_glue(spec, paths[0], split),
                                                    published=PUBLISHED),
                    encode=encode_split, score=score_split)
