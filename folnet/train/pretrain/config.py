"""`PretrainConfig`: every pretraining option in one frozen dataclass, loadable from TOML.

Precedence, lowest first: the defaults in ``specs/train/pretrain.toml`` (kept equal to the
dataclass defaults by a test), a ``--config FILE``, then command-line flags. Each field maps to
a flag of the same name with dashes (``batch_size`` -> ``--batch-size``), so error messages
name the flag a user would type. Model size overrides (D1, D2, L, dropout, ...) go in a
``[model]`` table or ``--model KEY=VALUE``.

Why `batch_size` is the *global* batch (sequences per optimiser step over all processes and
accumulation micro-batches): the paper's 131,072-sequence batch is a property of the recipe, not
of the machine, and a run resumed on a different number of processes keeps its meaning.
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

__all__ = ["RESUME_FREE", "PretrainConfig", "default_config_path", "flag", "load_pretrain_config"]

OBJECTIVES = ("nsp", "sop")
OPTIMIZERS = ("lamb", "adamw")
SCHEDULES = ("linear", "polynomial", "constant")
PRECISIONS = ("fp32", "bf16", "fp16")
# Model fields a user may override; vocab_size always comes from the tokenizer.
MODEL_KEYS = ("D1", "D2", "L", "H", "S", "F1", "F2", "delta", "position", "type_vocab_size",
              "dropout", "attention_dropout", "backend", "max_positions", "layer_norm_eps",
              "initializer_range")
# Options that may differ between a run and its resumption (they do not change the result).
RESUME_FREE = frozenset({"cache_dir", "activation_checkpointing", "compile", "deterministic",
                         "device", "log_every", "save_every", "keep_last", "out", "resume",
                         "num_workers", "fsdp", "tensorboard", "progress"})


def _opt(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


def config_from_dict(cls: type, data: Mapping[str, Any], source: str) -> Any:
    """``cls(**data)`` for a config dataclass, unknown keys named with their ``source``."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise FolnetError(f"{source}: unknown option(s) {unknown}; known: {sorted(known)}")
    return cls(**dict(data))


def flag(name: str) -> str:
    """The command-line flag of a config field."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class PretrainConfig:
    """All options of a pretraining run (see the module docstring for precedence)."""

    ops: str = _opt("jmc.atp", "operator string of the architecture")
    preset: str = _opt("base", "model size preset: tiny, small, base or large")
    model: tuple[tuple[str, Any], ...] = _opt((), "model overrides KEY=VALUE (D1, D2, L, ...)")
    data: str = _opt("kinship", "corpus: a file, a directory, a saved dataset, or 'kinship'")
    kinship_documents: int = _opt(2000, "documents of the generated kinship corpus")
    streaming: bool = _opt(False, "stream the corpus instead of tokenising it up front")
    cache_dir: str | None = _opt(None, "tokenised-data cache (default OUT/cache)")
    tokenizer: str | None = _opt(None, "tokenizer.json, vocab.txt or a directory; default: "
                                       "train one on the corpus")
    vocab_size: int = _opt(32768, "vocabulary size when training the tokenizer")
    seq_len: int = _opt(128, "tokens per sequence")
    objective: str = _opt("nsp", "sentence-pair objective: nsp or sop")
    mlm_probability: float = _opt(0.15, "share of tokens chosen for MLM")
    max_predictions: int = _opt(20, "at most this many MLM targets per sequence")
    batch_size: int = _opt(256, "global batch: sequences per optimiser step, all processes")
    grad_accum: int = _opt(1, "micro-batches accumulated per optimiser step")
    steps: int = _opt(8000, "optimiser steps")
    lr: float = _opt(1e-3, "peak learning rate")
    warmup_ratio: float = _opt(0.01, "share of the steps spent warming up")
    schedule: str = _opt("linear", "decay after warmup: linear, polynomial or constant")
    power: float = _opt(1.0, "exponent of the polynomial decay")
    min_lr_ratio: float = _opt(0.0, "final learning rate as a share of the peak")
    weight_decay: float = _opt(0.01, "weight decay (biases excluded)")
    beta1: float = _opt(0.9, "first-moment decay")
    beta2: float = _opt(0.999, "second-moment decay")
    eps: float = _opt(1e-6, "optimiser epsilon")
    clip_norm: float = _opt(0.0, "clip the global gradient norm to this (0: off)")
    optimizer: str = _opt("lamb", "lamb or adamw")
    precision: str = _opt("fp32", "fp32, bf16 or fp16 (autocast; fp16 with loss scaling)")
    activation_checkpointing: bool = _opt(False, "recompute layers in backward to save memory")
    compile: bool = _opt(False, "torch.compile the encoder (slower than eager on CPU)")
    seed: int = _opt(0, "seed of data order, masks, dropout and initialisation")
    deterministic: bool = _opt(False, "torch.use_deterministic_algorithms(True)")
    device: str = _opt("auto", "auto, cpu, cuda or cuda:N")
    log_every: int = _opt(10, "log every N steps")
    save_every: int = _opt(1000, "checkpoint every N steps (and at the end)")
    keep_last: int = _opt(3, "keep the last N checkpoints")
    out: str | None = _opt(None, "run directory (checkpoints, tokenizer, logs)")
    resume: str | None = _opt(None, "'latest', 'auto' (latest if any) or a checkpoint dir")
    num_workers: int = _opt(0, "DataLoader worker processes")
    fsdp: bool = _opt(False, "shard parameters with FSDP instead of DDP")
    tensorboard: bool = _opt(True, "also log to OUT/tensorboard when tensorboard imports")
    progress: bool = _opt(True, "show a progress bar")

    def __post_init__(self) -> None:
        model = self.model
        if isinstance(model, Mapping):
            model = tuple(sorted(model.items()))
            object.__setattr__(self, "model", model)
        for key, _value in model:
            if key not in MODEL_KEYS:
                raise FolnetError(f"--model {key}=...: unknown model field {key!r}; use "
                                  f"{choices(MODEL_KEYS)} (vocab_size comes from the tokenizer)")
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
            if f.type == "float" and isinstance(getattr(self, f.name), int):
                object.__setattr__(self, f.name, float(getattr(self, f.name)))
        for name, low in (("kinship_documents", 1), ("vocab_size", 6), ("seq_len", 8),
                          ("max_predictions", 1), ("batch_size", 1), ("grad_accum", 1),
                          ("steps", 1), ("log_every", 1), ("save_every", 1), ("keep_last", 1),
                          ("num_workers", 0), ("seed", 0)):
            if getattr(self, name) < low:
                raise FolnetError(f"{flag(name)} must be >= {low}, got {getattr(self, name)}")
        for name, allowed in (("objective", OBJECTIVES), ("optimizer", OPTIMIZERS),
                              ("schedule", SCHEDULES), ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise FolnetError(f"{flag(name)} {getattr(self, name)!r} is unknown; use "
                                  f"{choices(allowed)}")
        for name, lo, hi, open_hi in (("mlm_probability", 0.0, 1.0, True),
                                      ("warmup_ratio", 0.0, 1.0, False),
                                      ("min_lr_ratio", 0.0, 1.0, False),
                                      ("beta1", 0.0, 1.0, True), ("beta2", 0.0, 1.0, True)):
            value = getattr(self, name)
            if not (lo <= value < hi if open_hi else lo <= value <= hi):
                raise FolnetError(f"{flag(name)} must lie in [{lo}, {hi}{')' if open_hi else ']'}"
                                  f", got {value}")
        for name in ("lr", "power", "weight_decay", "eps", "clip_norm"):
            if not getattr(self, name) >= 0.0:
                raise FolnetError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.power == 0.0:
            raise FolnetError("--power must be > 0")
        if self.batch_size % self.grad_accum:
            raise FolnetError(f"--batch-size {self.batch_size} is not divisible by --grad-accum "
                              f"{self.grad_accum}")

    @property
    def model_overrides(self) -> dict[str, Any]:
        return dict(self.model)

    @property
    def micro_batch(self) -> int:
        """Rows of one global micro-batch (before splitting over processes)."""
        return self.batch_size // self.grad_accum

    def replace(self, **changes: Any) -> PretrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["model"] = dict(self.model)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> PretrainConfig:
        return config_from_dict(cls, data, source)

    def resume_mismatches(self, saved: Mapping[str, Any]) -> list[str]:
        """Options whose value differs from the run that wrote a checkpoint, as flags."""
        mine = self.to_dict()
        bad = []
        for name, value in mine.items():
            if name in RESUME_FREE or name not in saved:
                continue
            theirs = saved[name]
            if name == "model":
                theirs = dict(theirs)
            if theirs != value:
                bad.append(f"{flag(name)} (checkpoint: {theirs!r}, now: {value!r})")
        return bad


_TYPES = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,)}
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}


def _check_type(name: str, value: Any, annotation: Any) -> None:
    text = str(annotation)
    if name == "model":
        return
    optional = text.endswith("| None")
    if value is None:
        if optional:
            return
        raise FolnetError(f"{flag(name)} must be set, got None")
    base = text.removesuffix(" | None")
    allowed = _TYPES.get(base)
    if allowed is None:  # pragma: no cover - a field added without a type rule
        return
    if not isinstance(value, allowed) or (isinstance(value, bool) and base != "bool"):
        raise FolnetError(f"{flag(name)} must be {_KINDS[base]}, got {value!r}")


def default_config_path() -> Path:
    return _toml.specs_dir() / "train" / "pretrain.toml"


def _flatten(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """TOML tables -> config fields: ``[model]`` is the overrides; other keys stay flat."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "model":
            if not isinstance(value, Mapping):
                raise FolnetError(f"{source}: 'model' must be a table of model fields")
            flat["model"] = dict(value)
        elif isinstance(value, Mapping):
            raise FolnetError(f"{source}: unknown table [{key}]; only [model] is allowed")
        else:
            flat[key] = value
    return flat


def load_pretrain_config(path: str | os.PathLike[str] | None = None,
                         overrides: Mapping[str, Any] | None = None) -> PretrainConfig:
    """Defaults file, then `path` (a TOML file), then `overrides` (e.g. parsed flags).

    Model overrides merge key by key (a ``--model D2=32`` keeps the file's ``L``).
    """
    merged = _flatten(_toml.load(default_config_path()), str(default_config_path()))
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FolnetError(f"--config {str(path)!r} does not exist")
        layers.append((str(path), _flatten(_toml.load(path), str(path))))
    if overrides:
        layers.append(("command line", dict(overrides)))
    for source, layer in layers:
        for key, value in layer.items():
            if key == "model":
                merged["model"] = {**dict(merged.get("model", {})), **dict(value)}
            else:
                merged[key] = value
        PretrainConfig.from_dict(merged, source=source)  # unknown keys name their source
    return PretrainConfig.from_dict(merged)
