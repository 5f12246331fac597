"""Reader for FOLIO (natural-language first-order-logic reasoning) jsonl files, and for the
``yale-nlp/FOLIO`` rows in a datasets format (`folio_rows`).

Each line is a JSON object with ``premises`` (a list of sentences in FOLIO v1, one string in
v2), ``conclusion`` and ``label``. The premises become segment A (list items joined with
single spaces) and the conclusion segment B, so the model sees "premises [SEP] conclusion".
FOLIO v2 spells the third label "Uncertain" where v1 says "Unknown"; both map to "Unknown" so
that one label set covers both releases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError
from folnet.read_files import parse_json
from folnet.train.tasks.base import Example, FinetuneDefaults, TaskSpec
from folnet.train.tasks.classify import encode_split, score_split
from folnet.train.tasks.hfdatasets import Published, RowTable
from folnet.train.tasks.registry import TaskFamily, read_files

__all__ = ["FAMILY", "FOLIO", "PUBLISHED", "folio_example", "folio_rows", "read_folio"]

FOLIO = TaskSpec(
    name="folio",
    kind="classification",
    labels=("True", "False", "Unknown"),
    metrics=("accuracy",),
    main_metric="accuracy",
    splits=(
        ("train", ("folio-train.jsonl", "train.jsonl", "folio_v2_train.jsonl")),
        ("validation", ("folio-validation.jsonl", "validation.jsonl",
                        "folio_v2_validation.jsonl")),
    ),
    eval_splits=("validation",),
    seq_len=512,
    defaults=FinetuneDefaults(epochs=60, lr=7e-5, batch_size=16),
)

_ALIASES = {"Uncertain": "Unknown"}


def _text(value: object, field: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if field == "premises":
            return " ".join(v.strip() for v in value)
    raise FolnetError(f"{where}: field {field!r} must be a string, got {value!r}")


def folio_example(task: TaskSpec, record: Mapping[str, Any], guid: str, where: str,
                  split: str) -> Example:
    """One FOLIO record (a JSON line or a published row) as an example: premises as segment A,
    the conclusion as segment B, the label with "Uncertain" read as "Unknown"."""
    premises = _text(record["premises"], "premises", where)
    conclusion = _text(record["conclusion"], "conclusion", where)
    if record.get("label") is None:
        if not split.startswith("test"):
            raise FolnetError(f"{where}: missing field 'label' in a {split} file")
        label = None
    else:
        raw = str(record["label"])
        label = _ALIASES.get(raw, raw)
        task.label_id(label, where)
    return Example(guid, premises, conclusion, label)


def read_folio(task: TaskSpec, path: str | Path, split: str) -> list[Example]:
    """Examples of one FOLIO jsonl file; blank lines are allowed, anything else that is not a
    JSON object with the three fields is an error quoting the file and 1-based line."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = parse_json(line, where)
            except json.JSONDecodeError as exc:
                raise FolnetError(f"{where}: not a valid JSON line ({exc.msg})") from None
            if not isinstance(record, dict):
                raise FolnetError(f"{where}: expected a JSON object, got {type(record).__name__}")
            missing = [k for k in ("premises", "conclusion") if k not in record]
            if missing:
                raise FolnetError(f"{where}: missing field(s) {missing!r}")
            out.append(folio_example(task, record, f"{split}-{line_no}", where, split))
    return out


def folio_rows(task: TaskSpec, table: RowTable) -> list[Example]:
    """Examples of FOLIO as ``yale-nlp/FOLIO`` publishes it; guids are
    ``<split>-<example_id>``."""
    return [folio_example(task, row, table.guid(i, "example_id"), table.where(i), table.split)
            for i, row in enumerate(table.rows)]


PUBLISHED = Published("yale-nlp/FOLIO", ("premises", "conclusion"), "label", folio_rows)

FAMILY = TaskFamily("folio", (FOLIO,), read=read_files(lambda spec, paths, split:
                                                       read_folio(spec, paths[0], split),
                                                       published={FOLIO.name: PUBLISHED}),
                    encode=encode_split, score=score_split)
