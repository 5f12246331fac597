"""`FinetuneConfig`: every option of ``folnet finetune`` in one frozen dataclass.

Optimiser fields that are None take the task's default from the paper's Table 7 (see
`folnet.train.tasks.base.FinetuneDefaults`); `FinetuneConfig.hyper` resolves them for one task
so that a run records the numbers it actually used. Precedence, lowest first: those task
defaults, ``specs/train/finetune.toml`` (kept equal to the dataclass defaults by a test), a
``--config FILE``, then command-line flags. Each field is the flag of the same name with dashes
(``batch_size`` -> ``--batch-size``), except ``checkpoint``, which is ``--from``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from folnet import _toml
from folnet.errors import FolnetError, choices
from folnet.train.pretrain.config import config_from_dict
from folnet.train.tasks.base import TaskSpec

__all__ = ["FinetuneConfig", "Hyper", "default_config_path", "flag", "load_finetune_config"]

PRECISIONS = ("fp32", "bf16", "fp16")
KEEP = ("last", "best")
SCHEDULES = ("linear", "constant")


def _opt(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


def flag(name: str) -> str:
    """The command-line flag of a config field."""
    return "--from" if name == "checkpoint" else "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Hyper:
    """The optimisation settings of one run, every task default resolved."""

    epochs: int
    lr: float
    batch_size: int
    warmup_ratio: float
    weight_decay: float
    adam_eps: float
    betas: tuple[float, float]
    dropout: float
    max_len: int
    doc_stride: int | None


@dataclass(frozen=True)
class FinetuneConfig:
    """All options of a finetuning run (see the module docstring for precedence)."""

    task: str | None = _opt(None, "glue/<task>, squad2, folio, clutrr or kinship")
    data: str | None = _opt(None, "the task's data directory ('kinship' or none for kinship)")
    checkpoint: str | None = _opt(None, "pretrained run directory (uses final/) or checkpoint")
    out: str | None = _opt(None, "output directory: eval.json, predictions, model, logs")
    tokenizer: str | None = _opt(None, "tokenizer to use instead of the checkpoint's own")
    seeds: int = _opt(1, "runs with seeds seed, seed+1, ...; the headline is their median")
    seed: int = _opt(0, "first seed (initialisation of the new head, dropout, data order)")
    epochs: int | None = _opt(None, "training epochs (default: the task's, paper Table 7)")
    max_steps: int | None = _opt(None, "stop after this many optimiser steps (overrides epochs)")
    lr: float | None = _opt(None, "peak learning rate (default: the task's)")
    batch_size: int | None = _opt(None, "training batch size (default: the task's)")
    warmup_ratio: float | None = _opt(None, "share of the steps spent warming up (default 0.06)")
    schedule: str = _opt("linear", "after warmup: 'linear' decay to 0 (the paper's) or "
                                   "'constant'")
    weight_decay: float | None = _opt(None, "AdamW weight decay, biases excluded (default 0.01)")
    adam_eps: float | None = _opt(None, "AdamW epsilon (default 1e-6)")
    beta1: float | None = _opt(None, "AdamW first-moment decay (default 0.9)")
    beta2: float | None = _opt(None, "AdamW second-moment decay (default 0.999)")
    dropout: float | None = _opt(None, "dropout of encoder and head (default 0.1)")
    clip_norm: float = _opt(0.0, "clip the global gradient norm to this (0: off, as the paper)")
    max_len: int | None = _opt(None, "tokens per input (default: the task's sequence length)")
    doc_stride: int | None = _opt(None, "SQuAD: step between context windows (default 128)")
    max_query_len: int = _opt(64, "SQuAD: question tokens kept")
    max_answer_len: int = _opt(30, "SQuAD: longest answer span in tokens")
    n_best: int = _opt(20, "SQuAD: start/end candidates per window")
    null_threshold: float = _opt(0.0, "SQuAD: answer 'no answer' when null beats the best span "
                                      "by more than this")
    eval_batch_size: int = _opt(64, "batch size for evaluation")
    group_by_length: bool = _opt(False, "batch training rows of similar length (less padding, "
                                        "faster on CPU)")
    eval_every_epoch: bool = _opt(False, "also evaluate (and log) after every epoch")
    keep: str = _opt("last", "model kept per seed: 'last' or 'best' (per-epoch validation)")
    keep_seed_models: bool = _opt(False, "keep every seed's model, not only the median seed's")
    overwrite: bool = _opt(False, "replace a finished run already in --out")
    max_train_examples: int | None = _opt(None, "use only the first N training examples")
    max_eval_examples: int | None = _opt(None, "use only the first N examples of each eval split")
    kinship_train_size: int = _opt(2000, "kinship: training questions")
    kinship_test_per_k: int = _opt(100, "kinship: test questions per chain length")
    kinship_train_k: tuple[int, ...] = _opt((2, 3), "kinship: chain lengths to train on")
    kinship_test_k: tuple[int, ...] = _opt(tuple(range(2, 11)), "kinship: chain lengths tested")
    kinship_distractors: int = _opt(0, "kinship: irrelevant facts added to every story")
    data_seed: int = _opt(0, "kinship: seed of the generated split (same for every run seed)")
    precision: str = _opt("fp32", "fp32, bf16 or fp16 (autocast; fp16 with loss scaling)")
    device: str = _opt("auto", "auto, cpu, cuda or cuda:N")
    log_every: int = _opt(10, "log every N steps")
    progress: bool = _opt(True, "show a progress bar")
    tensorboard: bool = _opt(True, "also log to TensorBoard when it is installed")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            value = _check_type(f.name, value, str(f.type))
            object.__setattr__(self, f.name, value)
        for name, low in (("seeds", 1), ("seed", 0), ("epochs", 1), ("max_steps", 1),
                          ("batch_size", 1), ("max_len", 8), ("doc_stride", 1),
                          ("max_query_len", 1), ("max_answer_len", 1), ("n_best", 1),
                          ("eval_batch_size", 1), ("log_every", 1), ("max_train_examples", 1),
                          ("max_eval_examples", 1), ("kinship_train_size", 1),
                          ("kinship_test_per_k", 1), ("kinship_distractors", 0),
                          ("data_seed", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise FolnetError(f"{flag(name)} must be >= {low}, got {value}")
        for name, allowed in (("precision", PRECISIONS), ("keep", KEEP),
                              ("schedule", SCHEDULES)):
            if getattr(self, name) not in allowed:
                raise FolnetError(f"{flag(name)} {getattr(self, name)!r} is unknown; use "
                                  f"{choices(allowed)}")
        for name, lo, hi, open_hi in (("warmup_ratio", 0.0, 1.0, False),
                                      ("beta1", 0.0, 1.0, True), ("beta2", 0.0, 1.0, True),
                                      ("dropout", 0.0, 1.0, True)):
            value = getattr(self, name)
            if value is not None and not (lo <= value < hi if open_hi else lo <= value <= hi):
                raise FolnetError(f"{flag(name)} must lie in [{lo}, {hi}{')' if open_hi else ']'}"
                                  f", got {value}")
        for name in ("lr", "weight_decay", "adam_eps", "clip_norm"):
            value = getattr(self, name)
            if value is not None and not value >= 0.0:
                raise FolnetError(f"{flag(name)} must be >= 0, got {value}")
        for name in ("kinship_train_k", "kinship_test_k"):
            ks = getattr(self, name)
            if not ks or any(not 2 <= k <= 10 for k in ks) or len(set(ks)) != len(ks):
                raise FolnetError(f"{flag(name)} must list distinct chain lengths in 2..10, "
                                  f"got {','.join(map(str, ks)) or '(none)'}")

    def hyper(self, task: TaskSpec) -> Hyper:
        """This run's settings for ``task``: the flags given, else the task's Table 7 values."""
        d = task.defaults

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        doc_stride = pick(self.doc_stride, task.doc_stride) if task.kind == "qa" else None
        return Hyper(
            epochs=pick(self.epochs, d.epochs), lr=pick(self.lr, d.lr),
            batch_size=pick(self.batch_size, d.batch_size),
            warmup_ratio=pick(self.warmup_ratio, d.warmup_ratio),
            weight_decay=pick(self.weight_decay, d.weight_decay),
            adam_eps=pick(self.adam_eps, d.adam_eps),
            betas=(pick(self.beta1, d.adam_betas[0]), pick(self.beta2, d.adam_betas[1])),
            dropout=pick(self.dropout, d.dropout), max_len=pick(self.max_len, task.seq_len),
            doc_stride=doc_stride)

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    def replace(self, **changes: Any) -> FinetuneConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("kinship_train_k", "kinship_test_k"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> FinetuneConfig:
        return config_from_dict(cls, data, source)


_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}


def parse_ks(value: Any) -> tuple[int, ...]:
    """Chain lengths from ``"2,3"``, ``"2-10"`` or a sequence of integers."""
    if isinstance(value, str):
        out: list[int] = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            lo, sep, hi = part.partition("-")
            try:
                out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
            except ValueError:
                raise FolnetError(f"chain lengths {value!r}: {part!r} is not N or N-M") from None
        return tuple(out)
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise FolnetError(f"chain lengths must be like '2,3' or '2-10', got {value!r}")


def _check_type(name: str, value: Any, annotation: str) -> Any:
    """The value, checked against the field's annotation (ints widen to floats)."""
    if annotation.startswith("tuple"):
        try:
            return parse_ks(value)
        except FolnetError as exc:
            raise FolnetError(f"{flag(name)}: {exc}") from None
    optional = annotation.endswith("| None")
    base = annotation.removesuffix(" | None")
    if value is None:
        if optional:
            return None
        raise FolnetError(f"{flag(name)} must be set, got None")
    allowed: tuple[type, ...] = {"str": (str,), "int": (int,), "float": (float, int),
                                 "bool": (bool,)}[base]
    if not isinstance(value, allowed) or (isinstance(value, bool) and base != "bool"):
        raise FolnetError(f"{flag(name)} must be {_KINDS[base]}, got {value!r}")
    return float(value) if base == "float" else value


def default_config_path() -> Path:
    return _toml.specs_dir() / "train" / "finetune.toml"


def load_finetune_config(path: str | os.PathLike[str] | None = None,
                         overrides: Mapping[str, Any] | None = None) -> FinetuneConfig:
    """Defaults file, then `path` (a TOML file of flat options), then `overrides`."""
    merged: dict[str, Any] = dict(_toml.load(default_config_path()))
    layers: list[tuple[str, Mapping[str, Any]]] = [(str(default_config_path()), merged)]
    if path is not None:
        if not Path(path).is_file():
            raise FolnetError(f"--config {str(path)!r} does not exist")
        layers.append((str(path), _toml.load(path)))
    if overrides:
        layers.append(("command line", dict(overrides)))
    combined: dict[str, Any] = {}
    for source, layer in layers:
        tables = [k for k, v in layer.items() if isinstance(v, Mapping)]
        if tables:
            raise FolnetError(f"{source}: tables are not allowed ({tables}); options are flat")
        combined.update(layer)
        FinetuneConfig.from_dict(combined, source=source)  # unknown keys name their source
    return FinetuneConfig.from_dict(combined)
