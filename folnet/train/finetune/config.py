"""`FinetuneConfig`: every option of ``folnet finetune`` in one frozen dataclass.

Optimiser fields that are None take the task's default from the paper's Table 7 (see
`folnet.train.tasks.base.FinetuneDefaults`); `FinetuneConfig.hyper` resolves them for one task
so that a run records the numbers it actually used. Precedence, lowest first: those task
defaults, ``folnet/specs/train/finetune.toml`` (empty as shipped: the defaults are this
dataclass's; a setting there must differ from them), a ``--config FILE``, then command-line
flags. Each field is the flag of the same name with dashes
(``batch_size`` -> ``--batch-size``), except ``checkpoint``, which is ``--from``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from folnet.errors import FolnetError
from folnet.train.data.kinship import MAX_K, MIN_K, TEST_K, TRAIN_K
from folnet.train.engine.amp import PRECISIONS
from folnet.train.engine.optim import SCHEDULES
from folnet.train.options import Options, load_layered, option, specs_file

if TYPE_CHECKING:  # the tasks import tokenizers; the command line declares flags without it
    from folnet.train.tasks.base import TaskSpec

__all__ = ["FinetuneConfig", "Hyper", "default_config_path", "load_finetune_config", "parse_ks"]

KEEP = ("last", "best")
# Finetuning decays linearly (the paper's) or not at all; it has no --power for the polynomial.
FINETUNE_SCHEDULES = tuple(s for s in SCHEDULES if s != "polynomial")


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


def _chain_lengths(flag: str, value: Any) -> tuple[int, ...]:
    """A ``--kinship-*-k`` value: distinct chain lengths the generator supports."""
    try:
        ks = parse_ks(value)
    except FolnetError as exc:
        raise FolnetError(f"{flag}: {exc}") from None
    if not ks or any(not MIN_K <= k <= MAX_K for k in ks) or len(set(ks)) != len(ks):
        raise FolnetError(f"{flag} must list distinct chain lengths in {MIN_K}..{MAX_K}, "
                          f"got {','.join(map(str, ks)) or '(none)'}")
    return ks


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
class FinetuneConfig(Options):
    """All options of a finetuning run (see the module docstring for precedence)."""

    task: str | None = option(None, "glue/<task>, squad2, folio, clutrr, kinship or "
                                     "kinship/symbolic")
    data: str | None = option(None, "the task's data directory ('kinship' or none for kinship)")
    checkpoint: str | None = option(None, "pretrained run directory (uses final/) or checkpoint",
                                    flag="--from", metavar="CHECKPOINT")
    out: str | None = option(None, "output directory: eval.json, predictions, model, logs")
    tokenizer: str | None = option(None, "tokenizer to use instead of the checkpoint's own")
    seeds: int = option(1, "runs with seeds seed, seed+1, ...; the headline is their median")
    seed: int = option(0, "first seed (initialisation of the new head, dropout, data order)")
    epochs: int | None = option(None, "training epochs (default: the task's, paper Table 7)")
    max_steps: int | None = option(None, "stop after this many optimiser steps (overrides "
                                         "epochs)")
    lr: float | None = option(None, "peak learning rate (default: the task's)")
    batch_size: int | None = option(None, "training batch size (default: the task's)")
    warmup_ratio: float | None = option(None, "share of the steps spent warming up (default "
                                              "0.06)")
    schedule: str = option("linear", "after warmup: 'linear' decay to 0 (the paper's) or "
                                     "'constant'")
    weight_decay: float | None = option(None, "AdamW weight decay, biases excluded (default "
                                              "0.01)")
    adam_eps: float | None = option(None, "AdamW epsilon (default 1e-6)")
    beta1: float | None = option(None, "AdamW first-moment decay (default 0.9)")
    beta2: float | None = option(None, "AdamW second-moment decay (default 0.999)")
    dropout: float | None = option(None, "dropout of encoder and head (default 0.1)")
    clip_norm: float = option(0.0, "clip the global gradient norm to this (0: off, as the paper)")
    max_bad_steps: int = option(3, "stop the run (exit status 1) after this many steps in a row "
                                "skipped for a NaN or inf loss or gradient norm")
    max_len: int | None = option(None, "tokens per input (default: the task's sequence length)")
    doc_stride: int | None = option(None, "SQuAD: step between context windows (default 128)")
    max_query_len: int = option(64, "SQuAD: question tokens kept")
    max_answer_len: int = option(30, "SQuAD: longest answer span in tokens")
    n_best: int = option(20, "SQuAD: start/end candidates per window")
    null_threshold: float = option(0.0, "SQuAD: answer 'no answer' when null beats the best "
                                        "span by more than this")
    skip_bad_answers: bool = option(False, "SQuAD: leave out (and count) questions whose "
                                           "answer text is not at its answer_start, instead "
                                           "of stopping")
    eval_batch_size: int = option(64, "batch size for evaluation")
    group_by_length: bool = option(False, "batch training rows of similar length (less "
                                          "padding, faster on CPU)")
    eval_every_epoch: bool = option(False, "also evaluate (and log) after every epoch")
    keep: str = option("last", "model kept per seed: 'last' or 'best' (per-epoch validation)")
    keep_seed_models: bool = option(False, "keep every seed's model, not only the median "
                                           "seed's")
    overwrite: bool = option(False, "replace a finished run already in --out")
    max_train_examples: int | None = option(None, "use only the first N training examples")
    max_eval_examples: int | None = option(None, "use only the first N examples of each eval "
                                                 "split")
    kinship_train_size: int = option(2000, "kinship: training questions")
    kinship_test_per_k: int = option(100, "kinship: test questions per chain length")
    kinship_train_k: tuple[int, ...] = option(TRAIN_K, "kinship: chain lengths to train on",
                                              parse=_chain_lengths, metavar="K,K-K")
    kinship_test_k: tuple[int, ...] = option(TEST_K, "kinship: chain lengths tested",
                                             parse=_chain_lengths, metavar="K,K-K")
    kinship_distractors: int = option(0, "kinship: irrelevant facts added to every story")
    data_seed: int = option(0, "kinship: seed of the generated split (same for every run seed)")
    precision: str = option("fp32", "fp32, bf16 or fp16 (autocast; fp16 with loss scaling)")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    log_every: int = option(10, "log every N steps")
    progress: bool = option(True, "show a progress bar (off: a plain line per logged "
                                  "step and evaluation)")
    tensorboard: bool = option(False, "also log to OUT/seed_N/tensorboard (needs the "
                                      "tensorboard package)")

    def __post_init__(self) -> None:
        self.check_types()
        self.check_at_least((("seeds", 1), ("seed", 0), ("epochs", 1), ("max_steps", 1),
                             ("batch_size", 1), ("max_len", 8), ("doc_stride", 1),
                             ("max_query_len", 1), ("max_answer_len", 1), ("n_best", 1),
                             ("eval_batch_size", 1), ("log_every", 1),
                             ("max_train_examples", 1), ("max_eval_examples", 1),
                             ("kinship_train_size", 1), ("kinship_test_per_k", 1),
                             ("kinship_distractors", 0), ("data_seed", 0),
                             ("max_bad_steps", 1)))
        self.check_choices((("precision", PRECISIONS), ("keep", KEEP),
                            ("schedule", FINETUNE_SCHEDULES)))
        self.check_within((("warmup_ratio", 0.0, 1.0, False), ("beta1", 0.0, 1.0, True),
                           ("beta2", 0.0, 1.0, True), ("dropout", 0.0, 1.0, True)))
        self.check_non_negative(("lr", "weight_decay", "adam_eps", "clip_norm"))

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


def default_config_path() -> Path:
    return specs_file("train", "finetune.toml")


def load_finetune_config(path: str | os.PathLike[str] | None = None,
                         overrides: Mapping[str, Any] | None = None) -> FinetuneConfig:
    """Defaults file, then `path` (a TOML file of flat options), then `overrides`."""
    return load_layered(FinetuneConfig, default_config_path(), path, overrides)
