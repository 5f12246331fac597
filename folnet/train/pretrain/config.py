"""`PretrainConfig`: every pretraining option in one frozen dataclass, loadable from TOML.

Precedence, lowest first: the dataclass defaults, the defaults file
``folnet/specs/train/pretrain.toml`` (empty as shipped: a setting there must differ from the
dataclass's), a ``--config FILE`` (or a bundled name), then command-line flags. Each default is
written once: here, or, for an option that `PretrainDataConfig` also has (``seq_len``,
``objective``, ``encoding``, ...), in that dataclass. Each field maps to a flag of the same
name with dashes (``batch_size`` -> ``--batch-size``), so error messages name the flag a user
would type. Model size overrides (D1, D2, L, dropout, ...) go in a ``[model]`` table or
``--model KEY=VALUE``.

Why `batch_size` is the *global* batch (sequences per optimiser step over all processes and
accumulation micro-batches): the paper's 131,072-sequence batch is a property of the recipe, not
of the machine, and a run resumed on a different number of processes keeps its meaning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from folnet.arch.config import OVERRIDES
from folnet.arch.layer.memory_modes import MEMORY_MODES
from folnet.errors import FolnetError, choices
from folnet.ops.registry import ensure_registered, read_operator_file
from folnet.ops.spec import parse_spec, spec_to_dict
from folnet.read_files import read_json
from folnet.train.data.checks import canonical_encoding
from folnet.train.data.config import (
    DATA_AT_LEAST,
    KIND_OBJECTIVES,
    OBJECTIVES,
    PretrainDataConfig,
)
from folnet.train.data.tokenizer_inputs import MIN_BPE_VOCAB, TOKENIZER_MODELS
from folnet.train.engine.amp import PRECISIONS
from folnet.train.engine.memory_budget import parse_budget
from folnet.train.engine.optim import OPTIMIZERS, SCHEDULES
from folnet.train.options import Options, load_layered, option, specs_file

__all__ = ["MODEL_KEYS", "RESUME_FREE", "RESUME_RESCHEDULED", "PretrainConfig",
           "default_config_path", "load_pretrain_config"]

# Model fields a run may override: build_model's (`folnet.arch.config.OVERRIDES`) but
# vocab_size, which always comes from the tokenizer.
MODEL_KEYS = tuple(k for k in OVERRIDES if k != "vocab_size")
# Options that may differ between a run and its resumption (they do not change the result).
RESUME_FREE = frozenset({"cache_dir", "activation_checkpointing", "compile", "compile_mode",
                         "deterministic",
                         "device", "log_every", "save_every", "keep_last", "out", "resume",
                         "num_workers", "fsdp", "tensorboard", "progress", "max_bad_steps",
                         "memory_budget", "memory_mode"})
# Options a resumption may change at a cost: a new --steps (no fewer than the checkpoint's
# step) recomputes the learning-rate schedule; checked by `folnet.train.pretrain.start`.
RESUME_RESCHEDULED = frozenset({"steps"})

# The defaults of the data side of a run, written only in `PretrainDataConfig` (the dataset and
# collator read them from there when built without a run), so the two cannot drift.
_DATA_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(PretrainDataConfig)}


def _data_option(name: str, help_text: str) -> Any:
    """An option that `PretrainDataConfig` also has, with that dataclass's default (a name it
    lacks is a KeyError at import, not a silently different default)."""
    return option(_DATA_DEFAULTS[name], help_text)


def _model_overrides(flag: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """The ``[model]`` table (or ``--model`` pairs) as sorted (key, value) pairs, keys checked."""
    pairs = tuple(sorted(value.items())) if isinstance(value, Mapping) else tuple(value)
    for key, _value in pairs:
        if key not in MODEL_KEYS:
            raise FolnetError(f"{flag} {key}=...: unknown model field {key!r}; use "
                              f"{choices(MODEL_KEYS)} (vocab_size comes from the tokenizer)")
    return pairs


def _operator_tables(flag: str, value: Any) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """``--operators FILE`` (a TOML file of ``[[operator]]`` tables), or the tables themselves
    (a config's inline ``[[operators]]``, run_config.json): validated specs, stored as the
    spec tables so that run_config.json records the operators, not a path that may move."""
    if isinstance(value, (str, os.PathLike)):
        specs = read_operator_file(value, what=flag)
    elif isinstance(value, (list, tuple)):
        specs = [parse_spec(dict(t) if not isinstance(t, Mapping) else t) for t in value]
    else:
        raise FolnetError(f"{flag} must be a TOML file of [[operator]] tables or a list of "
                          f"operator tables, got {type(value).__name__}")
    return tuple(tuple(sorted(spec_to_dict(s).items())) for s in specs)


@dataclass(frozen=True)
class PretrainConfig(Options):
    """All options of a pretraining run (see the module docstring for precedence)."""

    ops: str = option("jmc.atp", "operator string of the architecture")
    kind: str = option("encoder", "what to pretrain: encoder (MLM with --objective nsp or sop), "
                       "decoder (the next token over packed documents: --objective clm, or "
                       "after a prefix read both ways: --objective prefix) or "
                       "encoder-decoder (spans cut out of packed rows: --objective span)")
    operators: tuple[tuple[tuple[str, Any], ...], ...] = option(
        (), "a TOML file of your own operators ([[operator]] tables, as "
            "folnet/specs/operators.toml), usable in --ops; recorded in run_config.json",
        parse=_operator_tables, metavar="FILE")
    preset: str = option("base", "model size preset: tiny, small, base or large")
    model: tuple[tuple[str, Any], ...] = option(
        (), "model overrides KEY=VALUE (D1, D2, L, ...)", parse=_model_overrides)
    data: str = option("kinship", "corpus: a file, a folder, a glob, a save_to_disk folder, "
                       "'kinship' or 'kinship-symbolic' (.txt .json .jsonl .csv .parquet .arrow; "
                       ".gz .bz2 .xz .zst)")
    # The data options: their defaults are `PretrainDataConfig`'s (see `_data_option`).
    text_column: str = _data_option("text_column", "the column that holds the text (json, csv, "
                                    "parquet, arrow, saved datasets)")
    encoding: str = _data_option("encoding", "how text, JSON and CSV corpus files are decoded "
                                 "(e.g. latin-1); a byte that does not decode is an error")
    kinship_documents: int = _data_option("kinship_documents",
                                          "documents of the generated kinship corpus")
    streaming: bool = _data_option("streaming",
                                   "stream the corpus instead of tokenising it up front")
    # Unset means OUT/cache here, but no cache at all in PretrainDataConfig: not the same default.
    cache_dir: str | None = option(None, "tokenised-data cache (default OUT/cache)")
    tokenizer: str | None = option(None, "tokenizer.json, vocab.txt or a directory; default: "
                                         "train one on the corpus")
    vocab_size: int = option(32768, "vocabulary size when training the tokenizer")
    tokenizer_model: str = option("wordpiece", "the tokenizer a run trains: wordpiece (BERT's, "
                                  "uncased) or bpe (byte-level, cased: text round-trips "
                                  "exactly and decodes as text; for generation)")
    seq_len: int = _data_option("seq_len", "tokens per sequence")
    objective: str = _data_option("objective", "an encoder's sentence-pair objective, nsp "
                                  "or sop; a decoder's, clm (the next token) or prefix (the "
                                  "PrefixLM: a document per row, the next token after a "
                                  "random prefix that reads both ways); an "
                                  "encoder-decoder's, span (span corruption)")
    span_rate: float = _data_option("span_rate", "span corruption: the share of each row's "
                                    "tokens cut out")
    mean_span: float = _data_option("mean_span", "span corruption: the spans' mean length")
    heldout: float = _data_option("heldout", "a decoder's or an encoder-decoder's: the share of "
                                  "documents held out, whose loss and perplexity are measured "
                                  "at every checkpoint (OUT/heldout.jsonl); 0: none")
    mlm_probability: float = _data_option("mlm_probability", "share of tokens chosen for MLM")
    max_predictions: int = _data_option("max_predictions",
                                        "at most this many MLM targets per sequence")
    batch_size: int = option(256, "global batch: sequences per optimiser step, all processes")
    grad_accum: int = option(1, "micro-batches accumulated per optimiser step (at least; "
                             "more when the step would not fit --memory-budget)")
    memory_budget: str = option("auto", "peak memory a step may use: a size (3GiB, 800MiB), "
                                "'auto' (CPU: 80%% of the available memory, shared by the "
                                "processes of the run; GPU: 90%% of the free memory) or "
                                "'off'; a batch over it is split into micro-batches")
    steps: int = option(8000, "optimiser steps")
    lr: float = option(1e-3, "peak learning rate")
    warmup_ratio: float = option(0.01, "share of the steps spent warming up")
    schedule: str = option("linear", "decay after warmup: linear, polynomial or constant")
    power: float = option(1.0, "exponent of the polynomial decay")
    min_lr_ratio: float = option(0.0, "final learning rate as a share of the peak")
    weight_decay: float = option(0.01, "weight decay (biases excluded)")
    beta1: float = option(0.9, "first-moment decay")
    beta2: float = option(0.999, "second-moment decay")
    eps: float = option(1e-6, "optimiser epsilon")
    clip_norm: float = option(0.0, "clip the global gradient norm to this (0: off)")
    max_bad_steps: int = option(3, "stop the run (exit status 1) after this many steps in a row "
                                "skipped for a NaN or inf loss or gradient norm")
    optimizer: str = option("lamb", "lamb or adamw")
    precision: str = option("fp32", "fp32, bf16 or fp16 (autocast; fp16 with loss scaling)")
    activation_checkpointing: bool = option(False, "recompute layers in backward to save memory")
    memory_mode: str = option("auto", "the layers' memory mode (folnet.set_memory): auto (CPU: "
                              "row blocks from T 256 on), full, blocked, or tight (the least "
                              "memory on long sequences, at about 1.3x the step's time)")
    trim_padding: bool = option(True, "cut each batch after its last column with a real token "
                                "(the binary stream costs T^2): the same result up to rounding "
                                "at dropout 0, other dropout draws otherwise")
    compile: bool = option(False, "torch.compile the step's forward, losses and metrics as one "
                           "graph (padding then not trimmed; slower than eager on CPU)")
    compile_mode: str = option("default", "torch.compile mode: default, reduce-overhead (CUDA "
                               "graphs: the step replayed from one capture; CUDA only) or "
                               "max-autotune")
    seed: int = _data_option("seed", "seed of data order, masks, dropout and initialisation")
    deterministic: bool = option(False, "torch.use_deterministic_algorithms(True)")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    log_every: int = option(10, "log every N steps")
    save_every: int = option(1000, "checkpoint every N steps (and at the end)")
    keep_last: int = option(3, "keep the last N checkpoints")
    out: str | None = option(None, "run directory (checkpoints, tokenizer, logs)")
    resume: str | None = option(None, "'latest', 'auto' (latest if any) or a checkpoint dir")
    init_from: str | None = option(
        None, "start a new run (step 0, fresh optimiser and schedule) from pretrained weights: "
              "a checkpoint, a run directory (its final model, else its latest checkpoint) or "
              "a saved model; the architecture and tokenizer come from them (--ops and "
              "--preset do not apply; --model may change only dropout, attention_dropout, "
              "backend)", metavar="CKPT_OR_RUN")
    num_workers: int = option(0, "DataLoader worker processes")
    fsdp: bool = option(False, "shard parameters with FSDP instead of DDP")
    tensorboard: bool = option(False, "also log to OUT/tensorboard (needs the tensorboard package)")
    progress: bool = option(True, "show a progress bar (off: a plain line per logged "
                                  "step and evaluation)")

    def __post_init__(self) -> None:
        self.check_types()
        self.check_at_least((*DATA_AT_LEAST.items(), ("vocab_size", 6), ("batch_size", 1),
                             ("grad_accum", 1), ("steps", 1), ("log_every", 1),
                             ("save_every", 1), ("keep_last", 1), ("num_workers", 0),
                             ("max_bad_steps", 1)))
        self.check_choices((("kind", tuple(KIND_OBJECTIVES)), ("objective", OBJECTIVES),
                            ("tokenizer_model", TOKENIZER_MODELS),
                            ("optimizer", OPTIMIZERS),
                            ("schedule", SCHEDULES), ("precision", PRECISIONS),
                            ("memory_mode", MEMORY_MODES)))
        self.check_within((("mlm_probability", 0.0, 1.0, True), ("span_rate", 0.0, 1.0, True),
                           ("warmup_ratio", 0.0, 1.0, False), ("min_lr_ratio", 0.0, 1.0, False),
                           ("beta1", 0.0, 1.0, True), ("beta2", 0.0, 1.0, True)))
        self.check_non_negative(("lr", "power", "weight_decay", "eps", "clip_norm"))
        if self.objective not in KIND_OBJECTIVES[self.kind]:
            wanted = " or ".join(KIND_OBJECTIVES[self.kind])
            raise FolnetError(f"--objective {self.objective} is not a{'n' * (self.kind[0] in 'ae')}"
                              f" {self.kind}'s: --kind {self.kind} pretrains with --objective "
                              f"{wanted}")
        if self.kind != "encoder" and self.streaming:
            raise FolnetError(f"--streaming makes an encoder's sentence pairs; an {self.kind}'s "
                              f"packed rows come from the tokenised corpus (drop --streaming)")
        if self.tokenizer_model == "bpe" and self.vocab_size < MIN_BPE_VOCAB:
            raise FolnetError(f"--vocab-size {self.vocab_size}: a byte-level BPE needs at least "
                              f"{MIN_BPE_VOCAB} (the special tokens and 256 bytes)")
        if not 0.0 <= self.heldout < 0.5:
            raise FolnetError(f"--heldout must lie in [0, 0.5), got {self.heldout}")
        if self.heldout and self.kind == "encoder":
            raise FolnetError("--heldout is a decoder's or an encoder-decoder's: an encoder's "
                              "sentence pairs keep every document")
        if self.span_rate <= 0.0:
            raise FolnetError(f"--span-rate must lie in (0, 1), got {self.span_rate}")
        if self.mean_span < 1.0:
            raise FolnetError(f"--mean-span must be >= 1, got {self.mean_span}")
        canonical_encoding(self.encoding, "--encoding")
        parse_budget(self.memory_budget)
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

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "model": dict(self.model),
                "operators": [dict(t) for t in self.operators]}

    def register_operators(self) -> None:
        """Register the run's own operators (``--operators``) before anything reads --ops."""
        ensure_registered([parse_spec(dict(t)) for t in self.operators], source="--operators")

    def resume_mismatches(self, saved: Mapping[str, Any]) -> list[str]:
        """Options whose value differs from the run that wrote a checkpoint, as flags (a new
        ``--steps`` is allowed and checked against the checkpoint's step by the caller)."""
        bad = []
        for name, value in self.to_dict().items():
            if name in RESUME_FREE or name in RESUME_RESCHEDULED or name not in saved:
                continue
            theirs = dict(saved[name]) if name == "model" else saved[name]
            if theirs != value:
                bad.append(f"{self.flag(name)} (checkpoint: {theirs!r}, now: {value!r})")
        return bad


def default_config_path() -> Path:
    return specs_file("train", "pretrain.toml")


def load_pretrain_config(path: str | os.PathLike[str] | None = None,
                         overrides: Mapping[str, Any] | None = None, *,
                         run: str | os.PathLike[str] | None = None) -> PretrainConfig:
    """Defaults file, then the options ``run`` recorded (its run_config.json: a resume need not
    retype them), then `path` (a TOML file), then `overrides` (e.g. parsed flags).

    Model overrides merge key by key (a ``--model D2=32`` keeps the file's ``L``).
    """
    recorded = None
    if run is not None:
        where = Path(run) / "run_config.json"
        data = read_json(where, what="run options")
        if not isinstance(data, Mapping):
            raise FolnetError(f"{where}: expected the run's options (an object)")
        recorded = (str(where), {k: v for k, v in data.items()
                                 if k not in ("resume", "out", "init_from")})
    return load_layered(PretrainConfig, default_config_path(), path, overrides,
                        tables=("model",), recorded=recorded)
