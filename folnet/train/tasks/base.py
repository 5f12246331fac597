"""Task specifications: what each finetuning task is, where its files are, how it is scored.

A `TaskSpec` is plain frozen data so that a training run can record exactly which task
definition it used; the readers (glue.py, squad.py, folio.py, clutrr.py) and the encoder
(encode.py) are functions of it. Hyper-parameter defaults come from Table 7 of the FOLNet
paper; every task shares the optimiser settings (Adam eps 1e-6, betas (0.9, 0.999), weight
decay 0.01, dropout 0.1, 6% linear warmup then linear decay) and differs in epochs, peak
learning rate and batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from folnet.errors import FolnetError, choices

KINDS = ("classification", "regression", "qa")


@dataclass(frozen=True)
class FinetuneDefaults:
    """Optimiser and schedule defaults for one task (FOLNet paper, Table 7)."""

    epochs: int
    lr: float
    batch_size: int
    warmup_ratio: float = 0.06
    adam_eps: float = 1e-6
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    dropout: float = 0.1
    schedule: str = "linear"


GLUE_SMALL = FinetuneDefaults(epochs=10, lr=1e-4, batch_size=16)
GLUE_BIG = FinetuneDefaults(epochs=3, lr=8e-5, batch_size=32)
SQUAD_DEFAULTS = FinetuneDefaults(epochs=2, lr=9e-5, batch_size=32)
FOLIO_DEFAULTS = FinetuneDefaults(epochs=60, lr=7e-5, batch_size=16)
CLUTRR_DEFAULTS = FinetuneDefaults(epochs=100, lr=5e-5, batch_size=16)


@dataclass(frozen=True)
class TaskSpec:
    """One finetuning task.

    ``splits`` maps a split name to the file names tried in order (glob patterns for CLUTRR,
    whose published files are named like ``1.2,1.3_train.csv``). ``labels`` is None for
    regression, for QA, and for CLUTRR until its label set is read from the train file (see
    `read_split`, which returns the task with ``labels`` filled in). ``data_subdir`` is the
    directory name the task has inside the usual download layout (e.g. ``glue_data/RTE``); a
    reader looks in ``data_dir`` first and then in ``data_dir/data_subdir``.
    """

    name: str
    kind: str
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    splits: tuple[tuple[str, tuple[str, ...]], ...]
    eval_splits: tuple[str, ...]
    seq_len: int
    defaults: FinetuneDefaults
    doc_stride: int | None = None
    data_subdir: str | None = None
    family: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FolnetError(f"task {self.name!r}: kind {self.kind!r} is not {choices(KINDS)}")
        if self.main_metric not in self.metrics:
            raise FolnetError(f"task {self.name!r}: main metric {self.main_metric!r} not listed")
        if self.kind == "regression" and self.labels is not None:
            raise FolnetError(f"task {self.name!r}: a regression task has no label list")
        if not self.family:
            object.__setattr__(self, "family", self.name.split("/")[0])

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)

    def split_files(self, split: str) -> tuple[str, ...]:
        """The candidate file names (or patterns) for ``split``."""
        for name, files in self.splits:
            if name == split:
                return files
        raise FolnetError(
            f"task {self.name!r} has no split {split!r}: expected {choices(self.split_names)}"
        )

    @property
    def num_labels(self) -> int:
        """Output width of the task head: 1 for regression, the label count otherwise."""
        if self.kind == "regression":
            return 1
        if self.labels is None:
            raise FolnetError(
                f"task {self.name!r} has no label set yet: read its train split with "
                "read_split, which returns the task with its labels"
            )
        return len(self.labels)

    def label_id(self, label: str, where: str) -> int:
        """Index of ``label``; ``where`` (file:line or guid) is quoted when it is unknown."""
        if self.labels is None:
            raise FolnetError(f"task {self.name!r} has no label set (needed at {where})")
        try:
            return self.labels.index(label)
        except ValueError:
            raise FolnetError(
                f"{where}: label {label!r} is not a {self.name} label: expected "
                f"{choices(self.labels)}"
            ) from None


@dataclass(frozen=True)
class Example:
    """One classification/regression item: a text (pair) and its label.

    ``label`` is the label name for classification, a float for regression and None for
    unlabelled (test) data; ``text_b`` is None for single-sentence tasks.
    """

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None


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

_TASK_LIST = (
    _glue(
        "mnli",
        ("entailment", "neutral", "contradiction"),
        ("accuracy",),
        "MNLI",
        GLUE_BIG,
        mnli=True,
    ),
    _glue("qqp", _BINARY, ("accuracy", "f1"), "QQP", GLUE_BIG),
    _glue("qnli", _ENTAIL, ("accuracy",), "QNLI", GLUE_BIG),
    _glue("sst2", _BINARY, ("accuracy",), "SST-2", GLUE_BIG),
    _glue("cola", _BINARY, ("mcc",), "CoLA", GLUE_SMALL),
    _glue("stsb", None, ("pearson", "spearman"), "STS-B", GLUE_SMALL),
    _glue("mrpc", _BINARY, ("accuracy", "f1"), "MRPC", GLUE_SMALL),
    _glue("rte", _ENTAIL, ("accuracy",), "RTE", GLUE_SMALL),
    TaskSpec(
        name="squad2",
        kind="qa",
        labels=None,
        metrics=("exact", "f1"),
        main_metric="f1",
        splits=(("train", ("train-v2.0.json",)), ("validation", ("dev-v2.0.json",))),
        eval_splits=("validation",),
        seq_len=384,
        doc_stride=128,
        defaults=SQUAD_DEFAULTS,
    ),
    TaskSpec(
        name="folio",
        kind="classification",
        labels=("True", "False", "Unknown"),
        metrics=("accuracy",),
        main_metric="accuracy",
        splits=(
            ("train", ("folio-train.jsonl", "train.jsonl", "folio_v2_train.jsonl")),
            (
                "validation",
                ("folio-validation.jsonl", "validation.jsonl", "folio_v2_validation.jsonl"),
            ),
        ),
        eval_splits=("validation",),
        seq_len=512,
        defaults=FOLIO_DEFAULTS,
    ),
    TaskSpec(
        name="clutrr",
        kind="classification",
        labels=None,
        metrics=("accuracy",),
        main_metric="accuracy",
        splits=(("train", ("*_train.csv",)), ("test", ("*_test.csv",))),
        eval_splits=("test",),
        seq_len=256,
        defaults=CLUTRR_DEFAULTS,
    ),
)

TASKS: dict[str, TaskSpec] = {t.name: t for t in _TASK_LIST}


def get_task(name: str | TaskSpec) -> TaskSpec:
    """The registered task called ``name`` (a `TaskSpec` is passed through unchanged)."""
    if isinstance(name, TaskSpec):
        return name
    try:
        return TASKS[name]
    except KeyError:
        raise FolnetError(f"unknown task {name!r}: expected {choices(TASKS)}") from None


def _listing(directory: Path) -> str:
    if not directory.is_dir():
        return f"{str(directory)!r} is not a directory"
    names = sorted(p.name for p in directory.iterdir())
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    return f"{str(directory)!r} holds: {shown or '(nothing)'}"


def find_split_files(task: TaskSpec, data_dir: str | Path, split: str) -> list[Path]:
    """The file(s) holding ``split`` of ``task``: the first candidate name that exists, in
    ``data_dir`` then ``data_dir/data_subdir``. Glob patterns may match several files (all are
    returned, sorted). A missing file raises, naming what was expected and what is there."""
    data_dir = Path(data_dir)
    candidates = task.split_files(split)
    dirs = [data_dir]
    if task.data_subdir:
        dirs.append(data_dir / task.data_subdir)
    for directory in dirs:
        for pattern in candidates:
            if any(ch in pattern for ch in "*?["):
                found = sorted(p for p in directory.glob(pattern) if p.is_file())
                if found:
                    return found
            elif (directory / pattern).is_file():
                return [directory / pattern]
    expected = " or ".join(repr(str(d / c)) for d in dirs for c in candidates)
    raise FolnetError(
        f"{task.name} split {split!r}: expected the file {expected}; {_listing(data_dir)}"
    )
