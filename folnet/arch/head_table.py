"""The one table of heads: `HEADS`, by name, and what the rest of folnet asks of an entry.

A head (`Head`) is its modules and forward pass and, as attributes of the same entry, what
other parts of folnet need to know about it, read through the functions here: the `folnet.hf`
class a saved model names in config.json (`hf_class`), the heads finetuning may put on a
pretrained encoder (`task_heads`) and the one ``folnet finetune`` gives a kind of task
(`head_for_task`), the heads whose decoder is the word embedding (`is_tied`). Nothing else
keeps a list of heads, so a registered head (`register_head`) is saved, loaded -- once
registered again in the loading process -- and finetuned like a built-in one
(`folnet.arch.heads` registers those).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from folnet.arch.config import KINDS, ModelConfig
from folnet.errors import FolnetError, choices


@dataclass
class Targets:
    """The labels a forward pass may get, and how the MLM logits are wanted."""

    labels: torch.Tensor | None = None
    mlm_labels: torch.Tensor | None = None
    nsp_labels: torch.Tensor | None = None
    start_positions: torch.Tensor | None = None
    end_positions: torch.Tensor | None = None
    gather_mlm: bool | int = False  # True: the predicted positions; P: P slots per row
    values: bool = False  # the labels' values are checked (`folnet.arch.inputs`)


class Head:
    """A head: ``build`` gives its modules by attribute name, ``forward`` fills the output's
    fields from them and returns its losses.

    ``hf_classes``: for each kind, the `folnet.hf` class that loads a model with this head
    (config.json's ``architectures``, which transformers' pipelines read); a head without one
    saves and loads natively and config.json names no architecture. ``task_head``: finetuning
    may put it on a pretrained encoder (`folnet.train.finetune.warm_start`). ``task_kinds``:
    the kinds of finetuning task (`folnet.train.tasks.base.KINDS`) ``folnet finetune`` gives
    it -- of the heads claiming a kind, the last registered. ``tied``: its decoder is the word
    embedding itself."""

    name = "?"
    kinds: tuple[str, ...] = ("encoder",)
    multiple_choice = False  # inputs (batch, choices, tokens)
    hf_classes: ClassVar[Mapping[str, str]] = {}
    task_head = False
    task_kinds: tuple[str, ...] = ()
    tied = False

    def build(self, cfg: ModelConfig, num_labels: int, word: nn.Embedding
              ) -> dict[str, nn.Module]:
        raise NotImplementedError

    def forward(self, model: nn.Module, out: Any, targets: Targets) -> list[torch.Tensor]:
        raise NotImplementedError


#: The one table of heads, by name (`register_head`).
HEADS: dict[str, Head] = {}
#: The `folnet.hf` class of a model without a head, by kind (the text kinds always have one).
BARE_HF_CLASSES: Mapping[str, str] = {"encoder": "FolnetModel"}


def _check_head(head: Head) -> None:
    """Refuse a head whose entry the rest of folnet could not read: each fault names the
    attribute, the value given and what it must be."""
    if not isinstance(head, Head):
        raise FolnetError(f"register_head: expected an instance of folnet.arch.Head, got "
                          f"{type(head).__name__}")
    name = head.name
    if not isinstance(name, str) or not name.strip() or name in ("?", "none"):
        raise FolnetError(f"head name {name!r}: must be a non-empty string other than '?' and "
                          f"'none' ('none' asks from_pretrained for the bare model)")
    where = f"head {name!r}"
    kinds = head.kinds
    if (not isinstance(kinds, tuple) or not kinds
            or not all(isinstance(k, str) and k in KINDS for k in kinds)):
        raise FolnetError(f"{where}: kinds {kinds!r} must be a non-empty tuple of {KINDS}")
    classes = head.hf_classes
    if not isinstance(classes, Mapping) or not all(
            k in kinds and isinstance(v, str) and v.isidentifier() for k, v in classes.items()):
        raise FolnetError(f"{where}: hf_classes {classes!r} must map kinds of the head "
                          f"({kinds}) to folnet.hf class names")
    tasks = head.task_kinds
    if not isinstance(tasks, tuple) or not all(isinstance(t, str) and t for t in tasks):
        raise FolnetError(f"{where}: task_kinds {tasks!r} must be a tuple of task kinds "
                          f"(folnet.train.tasks.base.KINDS)")
    if (head.task_head or tasks) and "encoder" not in kinds:
        raise FolnetError(f"{where}: a task head sits on a pretrained encoder, and its kinds "
                          f"{kinds} do not include 'encoder'")
    if tasks and not head.task_head:
        raise FolnetError(f"{where}: task_kinds {tasks} needs task_head = True (finetuning "
                          f"only puts task heads on an encoder)")


def register_head(head: Head) -> Head:
    """Add a head under ``head.name`` (a duplicate name is refused; `unregister_head` removes
    one). Its attributes are checked here (`Head`)."""
    _check_head(head)
    if head.name in HEADS:
        raise FolnetError(f"head {head.name!r} is already registered")
    HEADS[head.name] = head
    return head


def head_names(kind: str) -> tuple[str, ...]:
    """The heads a kind of model can carry."""
    return tuple(name for name, head in HEADS.items() if kind in head.kinds)


def get_head(name: str, kind: str) -> Head:
    """The head ``name`` for a model of ``kind``; a miss lists what fits."""
    head = HEADS.get(name)
    if head is None:
        raise FolnetError(f"head {name!r} is unknown: no head of that name is registered "
                          f"(folnet.arch.register_head adds one; a model saved with a head "
                          f"of yours loads once it is registered again); heads for kind "
                          f"{kind!r}: None or {choices(head_names(kind))}")
    if kind not in head.kinds:
        raise FolnetError(f"head {name!r} is unknown for kind {kind!r}; use None or "
                          f"{choices(head_names(kind))}")
    return head


def hf_class(kind: str, head: str | None) -> str | None:
    """The `folnet.hf` class that loads a model of ``kind`` with ``head`` (None: the bare
    model), as config.json's ``architectures`` names it; None for a head that names none (a
    registered head: the model is loaded by `folnet.from_pretrained`, the head registered)."""
    if head is None:
        return BARE_HF_CLASSES.get(kind)
    entry = HEADS.get(head)
    return None if entry is None else entry.hf_classes.get(kind)


def is_tied(head: str | None) -> bool:
    """Whether the head's decoder is the word embedding itself (the MLM and LM heads)."""
    entry = HEADS.get(head) if head is not None else None
    return entry is not None and entry.tied


def task_heads() -> tuple[str, ...]:
    """The heads finetuning may put on a pretrained encoder."""
    return tuple(name for name, head in HEADS.items() if head.task_head)


def head_for_task(task_kind: str) -> str:
    """The head ``folnet finetune`` gives a task of ``task_kind``: of the heads whose
    ``task_kinds`` claim it, the last registered (a registered head takes a kind over from
    the built-in one; `unregister_head` gives it back)."""
    claiming = [name for name, head in HEADS.items() if task_kind in head.task_kinds]
    if not claiming:
        known = sorted({k for head in HEADS.values() for k in head.task_kinds})
        raise FolnetError(f"no registered head finetunes a task of kind {task_kind!r}; the "
                          f"heads' task_kinds cover {known}")
    return claiming[-1]
