"""Finetuning splits in the formats Hugging Face `datasets` publishes them in.

Why: most people get GLUE, SQuAD 2.0, FOLIO and CLUTRR from the Hugging Face hub today -- as
parquet shards, a ``save_to_disk`` folder, or json/jsonl/csv/arrow exports -- rather than as the
original TSV/json/csv files. A task's split may therefore be given, besides its original files,
as (looked for in ``--data``, then in the task's usual sub-folder and its hub config folder,
each also under ``data/``):

* a ``save_to_disk`` folder: a `DatasetDict` that has the split, or a `Dataset` folder named
  after the split (``train/``) -- a saved `DatasetDict` keeps each split in such a folder,
* data files named after the split, ``<split>.<ext>`` or shards ``<split>-*.<ext>`` (the hub
  layout, e.g. ``rte/validation-00000-of-00001.parquet``), with ext parquet, arrow, jsonl,
  json or csv, read by the `datasets` builder of that name.

The original files win when both are present, so a data directory that holds them reads the
same whatever hub files sit beside them.
Each family says how its task is published (`Published`: the columns, the label column, and
how one row becomes one example); this module locates a split, reads it through `datasets`
(``load_from_disk`` / ``load_dataset``, offline) and checks the columns before anything is
converted, so a file of the wrong dataset fails naming the columns found and expected -- before
any training. `datasets` is imported only here, and only when such a split is read.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError
from folnet.train.data.checks import check_json_depth
from folnet.train.data.sources import FORMATS, import_datasets, is_saved_dataset
from folnet.train.tasks.base import TaskSpec, missing_split, split_dirs, split_file_candidates

__all__ = ["BUILDERS", "Published", "RowSource", "RowTable", "find_rows",
           "locate_split", "read_rows"]

#: File suffix -> the `datasets.load_dataset` builder that reads it.
#: (The corpus formats less plain text: a task's rows need columns.)
BUILDERS = {suffix: builder for suffix, builder in FORMATS.items() if builder != "text"}


@dataclass(frozen=True)
class RowSource:
    """Where one split lies in a datasets format: a ``save_to_disk`` `Dataset` folder
    (``builder`` "saved"), or the data files of one `load_dataset` builder."""

    builder: str
    paths: tuple[Path, ...]

    def describe(self) -> str:
        """The source for messages."""
        return ", ".join(map(str, self.paths))


@dataclass(frozen=True)
class RowTable:
    """One split read as rows (a dict per row, in order) with the columns and, for columns
    typed `ClassLabel`, their class names -- which is how a published integer label is
    checked to mean what the task's label list says."""

    source: str
    split: str
    columns: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    class_names: Mapping[str, tuple[str, ...]]

    def where(self, row: int) -> str:
        """Row ``row`` (0-based) for messages."""
        return f"{self.source}: {self.split} row {row}"

    def guid(self, row: int, id_column: str | None) -> str:
        """``<split>-<id>``: the row's published id, so prediction rows can be joined back to
        the dataset, else its 0-based row number."""
        value = self.rows[row].get(id_column) if id_column else None
        return f"{self.split}-{row if value is None else value}"

    def text(self, row: int, column: str) -> str:
        """A text cell; anything but a string (a number a csv reader guessed, a null) is an
        error naming the row, not a text silently made up."""
        value = self.rows[row].get(column)
        if not isinstance(value, str):
            raise FolnetError(f"{self.where(row)}: column {column!r} holds "
                              f"{type(value).__name__} {value!r}, expected a string")
        return value


@dataclass(frozen=True)
class Published:
    """How one task is published in a datasets format.

    ``dataset`` names it for messages (``"nyu-mll/glue rte"``); ``columns`` must be in every
    split, ``label`` (the label column) in every split but a test one (test splits may be
    unlabelled); ``convert(task, table)`` turns a checked `RowTable` into the family's
    examples; ``dirs`` are the task's folder names inside a download of the dataset (the hub
    config, e.g. ``rte``)."""

    dataset: str
    columns: tuple[str, ...]
    label: str | None
    convert: Callable[[TaskSpec, RowTable], Sequence[Any]]
    dirs: tuple[str, ...] = ()

    def expected(self, split: str) -> tuple[str, ...]:
        """The columns ``split`` must have."""
        if self.label is None or split.startswith("test"):
            return self.columns
        return (*self.columns, self.label)


def _split_files(directory: Path, split: str) -> RowSource | None:
    """Data files named after ``split`` in ``directory``; two kinds of file for one split is an
    error rather than a guess."""
    by_builder: dict[str, list[Path]] = {}
    for path in sorted(directory.iterdir()):
        builder = BUILDERS.get(path.suffix.lower())
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        if builder and path.is_file() and (stem == split or stem.startswith(f"{split}-")):
            by_builder.setdefault(builder, []).append(path)
    if len(by_builder) > 1:
        found = ", ".join(str(p) for paths in by_builder.values() for p in paths)
        raise FolnetError(f"split {split!r} is given twice in {str(directory)!r}, in different "
                          f"formats: {found}; keep one")
    if not by_builder:
        return None
    [(builder, paths)] = by_builder.items()
    return RowSource(builder, tuple(paths))


def find_rows(directories: Sequence[Path], split: str) -> RowSource | None:
    """``split`` in a datasets format in the first of ``directories`` that has it (each also
    under ``data/``), or None."""
    for base in directories:
        for directory in (base, base / "data"):
            if not directory.is_dir():
                continue
            if is_saved_dataset(directory / split):  # a saved Dataset, or a DatasetDict's split
                return RowSource("saved", (directory / split,))
            found = _split_files(directory, split)
            if found is not None:
                return found
    return None


def locate_split(task: TaskSpec, data_dir: str | Path, split: str,
                 published: Published | None) -> list[Path] | RowSource:
    """Where ``split`` of ``task`` is: its original file(s) when present, else (for a task
    with a `Published` form) a datasets-format source; neither raises, naming both forms."""
    files = split_file_candidates(task, data_dir, split)
    if files:
        return files
    if published is None:
        raise missing_split(task, data_dir, split)
    dirs = split_dirs(task, data_dir)
    dirs += [Path(data_dir) / name for name in published.dirs]
    found = find_rows(dirs, split)
    if found is None:
        raise missing_split(task, data_dir, split, (
            f"or {published.dataset} rows in a datasets format: a save_to_disk DatasetDict "
            f"with a {split!r} split or Dataset folder {split}/, or files {split}.<ext> "
            f"or {split}-*.<ext> (ext: parquet, arrow, jsonl, json, csv) in "
            f"{', '.join(repr(str(d)) for d in dirs)} or their data/ folders"))
    return found


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars while reading (a finetuning run has its own output); the caller's
    setting is restored."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _table(dataset: Any, source: RowSource, published: Published, split: str,
           datasets: Any) -> RowTable:
    """Check the columns, then materialise the rows."""
    found = tuple(dataset.column_names)
    missing = [name for name in published.expected(split) if name not in found]
    if missing:
        raise FolnetError(
            f"{source.describe()}: the {split} split has the columns {list(found)}, expected "
            f"{list(published.expected(split))} as {published.dataset} publishes them "
            f"(missing: {missing})")
    names = {name: tuple(feature.names) for name, feature in dataset.features.items()
             if isinstance(feature, datasets.ClassLabel)}
    return RowTable(source.describe(), split, found, tuple(dataset.to_list()), names)


def read_rows(source: RowSource, published: Published, split: str) -> RowTable:
    """The rows of one split, read through `datasets` and checked against ``published``.

    Data files are converted into a temporary cache that is gone when this returns (the rows
    are materialised first), so reading leaves nothing in the user's `datasets` cache. JSON
    files are checked for lines nested too deeply first (`check_json_depth`): pyarrow's
    parser crashes the process on one, past any ``except``.
    """
    datasets = import_datasets(f"reading {source.describe()}")
    try:
        if source.builder == "json":
            for path in source.paths:
                check_json_depth(path, what="data file")
        with _quiet(datasets):
            if source.builder == "saved":
                loaded = datasets.load_from_disk(str(source.paths[0]))
                return _table(loaded, source, published, split, datasets)
            # csv: an empty field stays "" rather than becoming a NaN float
            options = {"na_filter": False} if source.builder == "csv" else {}
            with tempfile.TemporaryDirectory(prefix="folnet-datasets-") as cache:
                loaded = datasets.load_dataset(source.builder, split="train", cache_dir=cache,
                                               data_files=[str(p) for p in source.paths],
                                               **options)
                table = _table(loaded, source, published, split, datasets)
                del loaded  # the arrow files in the cache are memory-mapped
                return table
    except FolnetError:
        raise
    except Exception as exc:  # datasets/pyarrow raise many types for an unreadable file
        raise FolnetError(f"cannot read {source.describe()} as {source.builder} data: "
                          f"{type(exc).__name__}: {exc}") from None
