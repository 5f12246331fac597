"""Checkpoints in and out of finetuning: a pretrained encoder under a new head, and the
finetuned model saved with its tokenizer and label set.

Why only ``encoder.*`` weights are carried over: a pretraining checkpoint's MLM and NSP heads
mean nothing to a classifier, and a task head must start from a fresh initialisation (drawn
from the run's seed, so seeds differ in it as in the paper's five runs). Why the vocabulary is
checked: a model whose embedding rows were trained for another tokenizer runs without any
error and silently learns nothing, so a size or fingerprint mismatch stops the run instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from folnet.arch import (
    FolnetModel,
    from_pretrained,
    read_metadata,
    resolve_model_dir,
)
from folnet.arch.head_table import HEADS, task_heads
from folnet.checksums import write_manifest
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import FolnetTokenizer, load_tokenizer

__all__ = ["build_task_model", "check_vocabulary", "load_finetuned", "resolve_checkpoint",
           "save_finetuned", "task_tokenizer"]


def resolve_checkpoint(path: str | Path | None, option: str = "--from") -> Path:
    """The model directory ``path`` names (`folnet.arch.resolve_model_dir`: itself, a run's
    ``final/``, ``model/`` or latest checkpoint)."""
    if path is None:
        raise FolnetError(f"{option} is required: a pretraining run directory or a folnet "
                          f"checkpoint directory")
    return resolve_model_dir(path, what=option)


def task_tokenizer(checkpoint: Path, override: str | Path | None = None) -> FolnetTokenizer:
    """The tokenizer saved beside the checkpoint, or ``override`` (``--tokenizer``)."""
    if override is not None:
        try:
            return load_tokenizer(override)
        except FolnetError as exc:
            raise FolnetError(f"--tokenizer: {exc}") from None
    if (checkpoint / "tokenizer.json").is_file() or (checkpoint / "vocab.txt").is_file():
        return load_tokenizer(checkpoint)
    raise FolnetError(f"checkpoint {str(checkpoint)!r} has no tokenizer.json or vocab.txt; "
                      f"pass --tokenizer with the tokenizer it was trained with")


def check_vocabulary(meta: dict[str, Any], tokenizer: FolnetTokenizer, where: str) -> None:
    """Refuse a tokenizer whose vocabulary is not the one the checkpoint's embedding has."""
    model_vocab = int(meta["model"]["vocab_size"])
    if model_vocab != tokenizer.vocab_size:
        raise FolnetError(f"{where}: the model's vocabulary has {model_vocab} tokens but the "
                          f"tokenizer has {tokenizer.vocab_size}: use the tokenizer the "
                          f"checkpoint was trained with")
    saved = meta.get("tokenizer_fingerprint")
    if saved is not None and saved != tokenizer.fingerprint:
        raise FolnetError(f"{where}: the checkpoint was trained with tokenizer fingerprint "
                          f"{saved} but the tokenizer's is {tokenizer.fingerprint} (same size, "
                          f"different vocabulary): use the tokenizer saved with the checkpoint")


def build_task_model(checkpoint: Path, head: str, num_labels: int = 2,
                     dropout: float | None = None) -> FolnetModel:
    """A model with a freshly initialised ``head`` over the checkpoint's encoder weights.

    Draws the head's initialisation from torch's global generator: seed it first.
    """
    if head not in task_heads():  # the table says: `folnet.arch.head_table.Head.task_head`
        raise FolnetError(f"head {head!r} is not a task head: expected one of {task_heads()}"
                          + ("" if head in HEADS else " (or register yours with "
                             "folnet.arch.register_head, task_head = True)"))
    kind = read_metadata(checkpoint).get("kind", "encoder")
    if kind != "encoder":
        raise FolnetError(f"{checkpoint}: a {kind!r} checkpoint cannot be finetuned here; the "
                          f"task heads sit on an encoder")
    runtime = {} if dropout is None else {"dropout": float(dropout)}
    model = from_pretrained(checkpoint, head=head, num_labels=num_labels, **runtime)
    model.relations = False  # no task head reads the final binary stream: skip computing it
    return model


def save_finetuned(model: FolnetModel, directory: Path, tokenizer: FolnetTokenizer, *,
                   task: str, labels: list[str] | None, extra: dict[str, Any]) -> Path:
    """``config.json`` (with task, labels and tokenizer fingerprint) + weights + tokenizer, and
    ``checksums.json`` over them (`folnet.checksums`: loading it checks the weights)."""
    info = {"task": task, "labels": labels, "tokenizer_fingerprint": tokenizer.fingerprint,
            "finetune": extra}
    if labels:  # the names transformers' pipelines and model cards show (not LABEL_0 ...)
        info.update(id2label={str(i): name for i, name in enumerate(labels)},
                    label2id={name: i for i, name in enumerate(labels)})
    model.save_pretrained(directory, info)
    tokenizer.save(directory)
    write_manifest(directory)
    return directory


def load_finetuned(path: str | Path, tokenizer: str | Path | None = None,
                   option: str = "--model") -> tuple[FolnetModel, FolnetTokenizer, dict[str, Any]]:
    """A finetuned model (``OUT/model`` or the directory itself), its tokenizer and metadata."""
    directory = resolve_checkpoint(path, option)
    meta = read_metadata(directory)
    head = meta.get("head")
    generated = head == "lm" and meta.get("task") is not None  # finetune.generation
    if head is not None and head not in HEADS:
        raise FolnetError(f"{option} {str(path)!r} holds a model with head {head!r}, which is "
                          f"not registered: register it (folnet.arch.register_head) first")
    if head not in task_heads() and not generated:
        raise FolnetError(f"{option} {str(path)!r} holds a {meta.get('head')!r} model, not a "
                          f"finetuned one; finetune it first with folnet finetune")
    tok = task_tokenizer(directory, tokenizer)
    check_vocabulary(meta, tok, f"{option} {str(path)!r}")
    return from_pretrained(directory), tok, meta
