"""Where a pretraining run starts: afresh, from its own checkpoint (``--resume``, possibly to
another ``--steps``), or from pretrained weights (``--init-from``).

`plan_start` decides and checks all of it before the run writes a file, so a refused resume or
a contradicting option leaves the run directory as it was. ``--resume`` (latest) takes the
newest intact checkpoint (`folnet.train.engine.step_checkpoints.resolve_resume`); the damaged ones
it skipped are named in the run's notes.

Why a resumption may change ``--steps`` and no other option: the total number of steps only
shapes the learning-rate schedule (the warmup length and the decay slope). The data order, the
masks, the RNG streams and the optimiser state do not depend on it, so a finished run can be
continued to a larger total (or an interrupted one ended sooner, but not before the step it
reached) with the schedule recomputed for the new total (`folnet.train.engine.optim.reschedule`).
Every other option changes what the saved state means and must match.

Why ``--init-from`` takes the whole architecture from the weights: they only fit the model they
were trained as, so ``--ops`` and ``--preset`` do not apply and the run's options record the
loaded architecture (``ops`` and every ``model`` field), which is also what a later ``--resume``
of that run rebuilds. ``--model`` may change only the fields that leave the weights' meaning
alone (`RUNTIME_FIELDS`: dropout, attention dropout, kernel backend); any other ``--model``
value that differs from the weights is refused rather than silently overridden. The tokenizer
comes with the weights when they carry one: embedding rows trained for one vocabulary mean
nothing under another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from folnet.arch import (
    ModelConfig,
    ensure_operators,
    load_weights,
    read_metadata,
    resolve_model_dir,
)
from folnet.arch.build import RUNTIME_FIELDS
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import FolnetTokenizer, load_tokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.pretrain.config import MODEL_KEYS, PretrainConfig

__all__ = ["RunStart", "adopt_architecture", "load_initial_weights", "plan_start"]


@dataclass(frozen=True)
class RunStart:
    """How a run starts, decided by `plan_start` before anything is written."""

    #: The run's options as it will record them (init_from and the adopted architecture in).
    config: PretrainConfig
    #: The checkpoint to resume from.
    resume: Path | None = None
    #: The model directory whose weights start a new run (``--init-from``, resolved).
    init_from: Path | None = None
    #: The directory whose tokenizer the run uses (else ``--tokenizer``, else a trained one).
    tokenizer_from: Path | None = None
    #: Whether the restored schedule must be recomputed for ``config.steps``.
    reschedule: bool = False
    #: Lines for the run log.
    notes: tuple[str, ...] = ()


def plan_start(config: PretrainConfig, out: Path) -> RunStart:
    """Check the run's options against what it starts from, and say how it starts."""
    if config.init_from is not None and config.resume is not None:
        raise FolnetError(f"--init-from {config.init_from!r} starts a new run and --resume "
                          f"{config.resume!r} continues one: pass only one of them")
    if config.init_from is not None:
        _refuse_existing_checkpoints(out)
        return _plan_init(config)
    target, skipped = ckpt.resolve_resume(out, config.resume)
    if target is None:
        _refuse_existing_checkpoints(out)
        return RunStart(config)
    start = _plan_resume(config, target)
    return dataclasses.replace(start, notes=(*skipped, *start.notes)) if skipped else start


def _refuse_existing_checkpoints(out: Path) -> None:
    existing = ckpt.list_checkpoints(out)
    if existing:
        raise FolnetError(f"--out {str(out)!r} already holds checkpoints (latest: step "
                          f"{existing[-1][0]}); pass --resume to continue that run or "
                          f"choose another --out")


def _plan_resume(config: PretrainConfig, target: Path) -> RunStart:
    """Resume from `target`: options checked, a new --steps checked against its step."""
    saved = ckpt.read_run_config(target)
    if saved.get("init_from") is not None:
        # A run started from pretrained weights: its record keeps where they came from, and
        # its architecture is the checkpoint's (the command that resumes it names neither).
        config = adopt_architecture(config.replace(init_from=saved["init_from"]),
                                    read_metadata(target), f"--resume {str(target)!r}")
    accum = saved.get("grad_accum")
    if (isinstance(accum, int) and config.grad_accum <= accum
            and config.batch_size % accum == 0):
        # the recorded split (raised to fit --memory-budget, perhaps) keeps the data order
        config = config.replace(grad_accum=accum)
    bad = config.resume_mismatches(saved)
    if bad:
        raise FolnetError(f"--resume: checkpoint {str(target)!r} was written with other "
                          f"options: {'; '.join(bad)}. Use the run's options, or start a new "
                          f"run with another --out")
    reached = ckpt.checkpoint_step(target)
    if config.steps < reached:
        raise FolnetError(f"--steps {config.steps} is fewer than the {reached} steps checkpoint "
                          f"{str(target)!r} already reached; pass --steps {reached} or more "
                          f"to continue it")
    previous = saved.get("steps")
    if previous == config.steps:
        return RunStart(config, resume=target, tokenizer_from=target)
    verb = "extending" if not isinstance(previous, int) or config.steps > previous else "shortening"
    note = (f"{verb} the run from {previous} to {config.steps} steps: learning-rate schedule "
            f"recomputed for {config.steps} total steps")
    return RunStart(config, resume=target, tokenizer_from=target, reschedule=True,
                    notes=(note,))


def _plan_init(config: PretrainConfig) -> RunStart:
    """Start a new run from the weights --init-from names."""
    given = config.init_from
    source = resolve_model_dir(given, what="--init-from")
    meta = read_metadata(source)
    where = f"--init-from {given!r}"
    if meta.get("kind", "encoder") != "encoder":
        raise FolnetError(f"{where}: {str(source)!r} holds a {meta.get('kind')!r} model; "
                          f"pretraining (MLM + NSP/SOP) starts from an encoder")
    config = adopt_architecture(config.replace(init_from=str(source)), meta, where)
    has_tokenizer = any((source / name).is_file() for name in ("tokenizer.json", "vocab.txt"))
    tokenizer = _init_tokenizer(config, source, has_tokenizer, where)
    vocab = dict(meta.get("model") or {}).get("vocab_size")
    if tokenizer.vocab_size != vocab:
        named = (f"the tokenizer saved with {where}" if has_tokenizer
                 else f"--tokenizer {config.tokenizer!r}")
        raise FolnetError(f"{named} has {tokenizer.vocab_size} tokens but the weights of "
                          f"{where} have a vocabulary of {vocab!r}: use the tokenizer they "
                          f"were trained with")
    arch = ", ".join(f"{k}={v}" for k, v in config.model if k in ("D1", "D2", "L", "H"))
    notes = [f"initialised from {source} (step {meta.get('step', '?')}): ops {config.ops!r}, "
             f"{arch}; the step count, optimiser and schedule start afresh"]
    if meta.get("head") != "pretraining":
        notes.append(f"{source} has head {meta.get('head')!r}: its encoder is loaded and the "
                     f"MLM and NSP/SOP heads start from a fresh initialisation")
    return RunStart(config, init_from=source,
                    tokenizer_from=source if has_tokenizer else None, notes=tuple(notes))


def _init_tokenizer(config: PretrainConfig, source: Path, has_tokenizer: bool,
                    where: str) -> FolnetTokenizer:
    """The tokenizer of an --init-from run: the one beside the weights (a --tokenizer given as
    well must be the same), else --tokenizer, which is then required."""
    given = None
    if config.tokenizer is not None:
        try:
            given = load_tokenizer(config.tokenizer)
        except FolnetError as exc:
            raise FolnetError(f"--tokenizer: {exc}") from None
    if not has_tokenizer:
        if given is None:
            raise FolnetError(f"{where}: {str(source)!r} has no tokenizer.json or vocab.txt; "
                              f"pass --tokenizer with the tokenizer its weights were trained "
                              f"with")
        return given
    own = load_tokenizer(source)
    if given is not None and given.fingerprint != own.fingerprint:
        raise FolnetError(f"--tokenizer {config.tokenizer!r} (fingerprint {given.fingerprint}) "
                          f"is not the tokenizer saved with {where} (fingerprint "
                          f"{own.fingerprint}); leave --tokenizer out to use the saved one")
    return own


def adopt_architecture(config: PretrainConfig, meta: Mapping[str, Any],
                       where: str) -> PretrainConfig:
    """`config` with the architecture of the weights `meta` (a config.json) describes: their
    ``ops`` and every model field, a ``--model`` value of `RUNTIME_FIELDS` kept. Registers the
    custom operators the weights carry, so the run can build the model from its options."""
    saved = _architecture(meta)
    for key, value in config.model:
        if key not in RUNTIME_FIELDS and saved.get(key) != value:
            raise FolnetError(f"--model {key}={value!r} contradicts the weights of {where}, "
                              f"which have {key}={saved.get(key)!r}: the architecture comes "
                              f"from the weights (--model may change only "
                              f"{', '.join(RUNTIME_FIELDS)})")
    ensure_operators(ModelConfig.from_dict(saved))
    model = {k: saved[k] for k in MODEL_KEYS}
    model.update((k, v) for k, v in config.model if k in RUNTIME_FIELDS)
    return config.replace(ops=saved["ops"], model=model)


def _architecture(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Every field of the model config a config.json describes, defaults filled in (a file
    written before a field existed lacks it, and the preset must not fill the gap)."""
    return ModelConfig.from_dict(dict(meta.get("model") or {})).to_dict()


def load_initial_weights(model: nn.Module, source: Path) -> None:
    """The weights of `source` into a new run's `model`: all of them when `source` is a
    pretraining model, else its encoder's (the heads keep their fresh initialisation).

    The architectures are checked equal (but for `RUNTIME_FIELDS`) although `plan_start` built
    the run's options from `source`: a model built from anything else must not half-load.
    """
    meta = read_metadata(source)
    saved, mine = _architecture(meta), model.cfg.to_dict()
    diffs = [k for k in sorted(set(saved) | set(mine))
             if k not in RUNTIME_FIELDS and saved.get(k) != mine.get(k)]
    if diffs:
        shown = ", ".join(f"{k}: weights {saved.get(k)!r}, model {mine.get(k)!r}"
                          for k in diffs[:6])
        raise FolnetError(f"--init-from {str(source)!r}: the run's model is not the "
                          f"architecture of the weights ({shown})")
    load_weights(model, source, only=None if meta.get("head") == model.head else "encoder.")
