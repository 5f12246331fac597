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
    ModelConfig,
    ensure_operators,
    from_pretrained,
    load_weights,
    read_metadata,
)
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import FolnetTokenizer, load_tokenizer

__all__ = ["build_task_model", "check_vocabulary", "load_finetuned", "resolve_checkpoint",
           "save_finetuned", "task_tokenizer"]

TASK_HEADS = ("classification", "multiple-choice", "qa", "token-classification")


def resolve_checkpoint(path: str | Path | None, option: str = "--from") -> Path:
    """The checkpoint directory ``path`` names: itself when it holds ``config.json`` and
    ``model.safetensors``, or the ``final/`` (else ``model/``) directory of a run."""
    if path is None:
        raise FolnetError(f"{option} is required: a pretraining run directory or a folnet "
                          f"checkpoint directory")
    root = Path(path)
    if not root.exists():
        raise FolnetError(f"{option} {str(root)!r} does not exist")
    for candidate in (root, root / "final", root / "model"):
        if (candidate / "config.json").is_file() and (candidate / "model.safetensors").is_file():
            try:
                read_metadata(candidate)
            except FolnetError as exc:
                raise FolnetError(f"{option} {str(root)!r}: {exc}") from None
            return candidate
    hint = ""
    if (root / "checkpoints").is_dir():
        hint = (f"; the run has no final/ yet -- give one of its checkpoints, e.g. "
                f"{str(root / 'checkpoints')!r}/step_N")
    raise FolnetError(f"{option} {str(root)!r} is not a folnet checkpoint: expected a directory "
                      f"with config.json and model.safetensors, or a run directory with "
                      f"final/{hint}")


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


def _config(meta: dict[str, Any], where: str, dropout: float | None) -> ModelConfig:
    if meta.get("kind", "encoder") != "encoder":
        raise FolnetError(f"{where}: a {meta.get('kind')!r} checkpoint cannot be finetuned "
                          f"here; the task heads sit on an encoder")
    cfg = ModelConfig.from_dict(meta["model"])
    ensure_operators(cfg)
    return cfg if dropout is None else cfg.replace(dropout=float(dropout))


def build_task_model(checkpoint: Path, head: str, num_labels: int = 2,
                     dropout: float | None = None) -> FolnetModel:
    """A model with a freshly initialised ``head`` over the checkpoint's encoder weights.

    Draws the head's initialisation from torch's global generator: seed it first.
    """
    if head not in TASK_HEADS:
        raise FolnetError(f"head {head!r} is not a task head: expected one of {TASK_HEADS}")
    meta = read_metadata(checkpoint)
    model = FolnetModel(_config(meta, str(checkpoint), dropout), head=head, num_labels=num_labels)
    load_weights(model, checkpoint, only="encoder.")
    model.relations = False  # no task head reads the final binary stream: skip computing it
    return model


def save_finetuned(model: FolnetModel, directory: Path, tokenizer: FolnetTokenizer, *,
                   task: str, labels: list[str] | None, extra: dict[str, Any]) -> Path:
    """``config.json`` (with task, labels and tokenizer fingerprint) + weights + tokenizer."""
    info = {"task": task, "labels": labels, "tokenizer_fingerprint": tokenizer.fingerprint,
            "finetune": extra}
    model.save_pretrained(directory, info)
    tokenizer.save(directory)
    return directory


def load_finetuned(path: str | Path, tokenizer: str | Path | None = None,
                   option: str = "--model") -> tuple[FolnetModel, FolnetTokenizer, dict[str, Any]]:
    """A finetuned model (``OUT/model`` or the directory itself), its tokenizer and metadata."""
    directory = resolve_checkpoint(path, option)
    meta = read_metadata(directory)
    if meta.get("head") not in TASK_HEADS:
        raise FolnetError(f"{option} {str(path)!r} holds a {meta.get('head')!r} model, not a "
                          f"finetuned one; finetune it first with folnet finetune")
    tok = task_tokenizer(directory, tokenizer)
    check_vocabulary(meta, tok, f"{option} {str(path)!r}")
    _config(meta, str(directory), None)
    return from_pretrained(directory), tok, meta
