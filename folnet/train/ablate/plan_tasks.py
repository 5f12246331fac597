"""An ablation plan's tasks checked against the task registry (`folnet.train.tasks`): that
they exist, have their data, and fit the kind of model each row pretrains. Apart from
`folnet.train.ablate.plan` because they read the registry, not the plan's own fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError
from folnet.train.tasks import family_of, get_task

__all__ = ["check_kinds", "check_tasks"]


def check_kinds(name: str, rows: Sequence[Any], tasks: tuple[str, ...]) -> None:
    """Every task fits every row's kind (``rows``: the plan's `AblationRow`s): a task answered
    by generation needs a decoder or an encoder-decoder (loss CLM or SPAN), every other task an
    encoder (MLM.NSP or MLM.SOP)."""
    for task in tasks:
        generative = get_task(task).kind == "generation"
        for i, row in enumerate(rows):
            if (row.kind != "encoder") != generative:
                need = "CLM, PREFIX or SPAN (a decoder or an encoder-decoder)" if generative else \
                    "MLM.NSP or MLM.SOP (an encoder)"
                raise FolnetError(f"plan {name!r} row {i + 1} ({row.name!r}): loss {row.loss} "
                                  f"pretrains a model of kind {row.kind!r}, and task {task!r} "
                                  f"needs loss {need}")


def check_tasks(name: str, tasks: tuple[str, ...], task_data: Mapping[str, str]) -> None:
    """The plan's tasks: at least one, each registered, each with its data directory where
    the task reads files (a generated task needs none); ``task_data`` names no other task."""
    if not tasks:
        raise FolnetError(f"plan {name!r}: 'tasks' is empty; e.g. tasks = [\"kinship\"]")
    extra = sorted(set(task_data) - set(tasks))
    if extra:
        raise FolnetError(f"plan {name!r}: task_data names task(s) {extra} not in tasks")
    for task in tasks:
        try:
            get_task(task)
        except FolnetError as exc:
            raise FolnetError(f"plan {name!r}: task {task!r}: {exc}") from None
        if family_of(task).generated:
            continue
        path = task_data.get(task)
        if path is None:
            raise FolnetError(f"plan {name!r}: task {task!r} needs its data directory: add "
                              f"task_data = {{ \"{task}\" = \"DIR\" }} or --task-data "
                              f"{task}=DIR")
        if not Path(path).is_dir():
            raise FolnetError(f"plan {name!r}: data directory {path!r} of task {task!r} does "
                              f"not exist")
