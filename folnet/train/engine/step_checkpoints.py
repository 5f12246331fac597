"""Training checkpoints: written atomically, found on resume, checked before they are trusted.

Layout of one checkpoint, ``OUT/checkpoints/step_N/``::

    config.json         model config + the run's PretrainConfig and step   (folnet format)
    model.safetensors   weights                                            (folnet format)
    tokenizer.json      the tokenizer, also as a BERT vocab.txt
    vocab.txt
    trainer.pt          optimizer, scheduler, GradScaler, RNG states (python, numpy, torch,
                        CUDA, per rank), the MLM collator's generator, the data position
                        (epoch, micro-batch in epoch), counters, and that a manifest was
                        written
    checksums.json      the SHA-256 of every other file (`folnet.checksums`), written last

Under ``--fsdp`` a checkpoint is sharded (`folnet.train.engine.sharded`): ``shards/`` (the
weights and optimiser state, one file per rank, torch.distributed.checkpoint) in place of
model.safetensors, and trainer.pt without the optimiser (`SHARDED_KEY` says so).

Why a directory rename: every file is written into ``checkpoints/.tmp-step_N-*``, fsynced, and
the directory is renamed to ``step_N`` in one atomic step (`atomic_write_dir`), so a
crash (SIGKILL, power loss, full disk) during a save leaves either the old set of checkpoints or
the new one, never a half-written ``step_N``. Old checkpoints are renamed aside before they are
deleted for the same reason (`folnet.atomic_write.discard_dir`). `list_checkpoints` only ever sees
complete directories.

Why ``--resume`` falls back to an older checkpoint: a complete directory can still be damaged
afterwards (a failing disk, a bad copy, a user's stray edit), and the checksums find it. The
run then resumes from the newest checkpoint that is intact, says which ones it skipped and
why, and leaves them on disk for the user to inspect. A checkpoint named explicitly
(``--resume DIR``) never falls back: the user asked for that one.

Why a missing ``checksums.json`` can be damage: folnet writes one with every checkpoint, so a
checkpoint without it lost it (a copy that left it out, a stray delete), and its files can no
longer be checked -- a flipped weight byte would resume silently. Its ``trainer.pt`` says a
manifest was written (``"manifest": "checksums.json"``, `MANIFEST_KEY`), and such a checkpoint
counts as damaged. One without that entry was written before checksums existed and gets the
checks its formats allow, and resumes (checkpoints are a promise).
"""

from __future__ import annotations

import json
import os
import random
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from folnet.arch import load_weights, read_metadata, run_checkpoints
from folnet.arch.io.model_dir import SHARDS_DIR, STEP_DIR, is_sharded_checkpoint
from folnet.atomic_write import (
    WriteError,
    atomic_write_dir,
    discard_dir,
    remove_leftovers,
    warn,
    writing,
)
from folnet.checksums import MANIFEST, read_manifest, verify_files, write_manifest
from folnet.errors import FolnetError

__all__ = [
    "MANIFEST_KEY",
    "SHARDED_KEY",
    "TRAINER_FILE",
    "Saveable",
    "capture_rng",
    "check_architecture",
    "check_intact",
    "checkpoint_dir",
    "checkpoint_step",
    "describe",
    "list_checkpoints",
    "load_trainer_state",
    "load_weights_into",
    "prune_checkpoints",
    "read_run_config",
    "remove_stale_temporaries",
    "resolve_resume",
    "restore_rng",
    "save_checkpoint",
    "write_checkpoint_files",
]

TRAINER_FILE = "trainer.pt"
TRAINER_FORMAT = "folnet-trainer"
TRAINER_VERSION = 1
#: The trainer state's entry saying that ``checksums.json`` was written with the checkpoint.
MANIFEST_KEY = "manifest"
#: The trainer state's entry of a sharded checkpoint: the folder of its weight and optimiser
#: shards (`folnet.train.engine.sharded`), whose optimiser state is not in trainer.pt.
SHARDED_KEY = "shards"


def checkpoint_dir(out: str | os.PathLike[str]) -> Path:
    return Path(out) / "checkpoints"


def list_checkpoints(out: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``OUT/checkpoints`` as (step, path), oldest first."""
    return run_checkpoints(out)


def resolve_resume(out: str | os.PathLike[str], resume: str | None
                   ) -> tuple[Path | None, tuple[str, ...]]:
    """The checkpoint a ``--resume`` value names and lines saying which damaged ones were
    skipped: 'latest' (the newest intact one; one must exist), 'auto' (the same, else a
    fresh start) or a checkpoint directory (checked, never replaced by another)."""
    if resume is None:
        return None, ()
    if resume in ("latest", "auto"):
        found = list_checkpoints(out)
        damaged: list[tuple[str, str]] = []
        for _step, path in reversed(found):
            try:
                check_intact(path)
            except FolnetError as exc:
                damaged.append((path.name, str(exc)))
                continue
            notes = [f"--resume: skipped checkpoint {name}, which is damaged ({why}); it is "
                     f"left on disk" for name, why in damaged]
            if notes:
                notes.append(f"--resume: resuming from {path.name}, the newest intact "
                             f"checkpoint")
            return path, tuple(notes)
        if found:
            raise FolnetError(f"--resume: no intact checkpoint under "
                              f"{str(checkpoint_dir(out))!r}: " + "; ".join(
                                  f"{name}: {why}" for name, why in damaged))
        if resume == "auto":
            return None, ()
        raise FolnetError(f"--resume: no checkpoint to resume under "
                          f"{str(checkpoint_dir(out))!r}")
    path = Path(resume)
    if not path.is_dir():
        raise FolnetError(f"--resume {resume!r}: no such checkpoint directory")
    check_intact(path)
    return path, ()


def check_intact(checkpoint: Path) -> None:
    """Raise a `FolnetError` naming the damaged file unless `checkpoint` is whole: its config
    is ours, its files are there, and every file matches ``checksums.json``. A checkpoint
    whose trainer state says a manifest was written with it and that has none is damaged. One
    written before checksums existed gets the checks its formats allow (the trainer state's
    zip CRCs, the weights' header and length)."""
    checkpoint = Path(checkpoint)
    read_metadata(checkpoint)
    sharded = is_sharded_checkpoint(checkpoint)
    weights = f"{SHARDS_DIR}/.metadata" if sharded else "model.safetensors"
    for name in (weights, TRAINER_FILE):
        if not (checkpoint / name).is_file():
            raise FolnetError(f"checkpoint {str(checkpoint)!r} has no {name} (not a training "
                              f"checkpoint, or an incomplete copy)")
    if read_manifest(checkpoint) is not None:
        verify_files(checkpoint)
        return
    if sharded:  # written with a manifest always: one without lost it
        raise FolnetError(f"{checkpoint / MANIFEST}: missing from a sharded checkpoint, which "
                          f"folnet writes with one: deleted or not copied, so the "
                          f"checkpoint's files cannot be checked")
    _check_legacy_files(checkpoint)
    if _manifest_was_written(checkpoint / TRAINER_FILE):
        raise FolnetError(f"{checkpoint / MANIFEST}: missing, though folnet wrote it with this "
                          f"checkpoint ({TRAINER_FILE} says so): deleted or not copied, so "
                          f"the checkpoint's files cannot be checked")


def _manifest_was_written(trainer: Path) -> bool:
    """Whether `trainer` (a ``trainer.pt`` whose zip CRCs passed) records that checksums.json
    was written beside it. Read without running pickled code and with its tensors mapped, not
    read. A file that does not load says nothing here: `load_trainer_state` names it."""
    try:
        state = torch.load(trainer, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a refused pickle, a foreign file: the same faults load_trainer_state has
        return False
    return isinstance(state, dict) and state.get(MANIFEST_KEY) == MANIFEST


def _check_legacy_files(checkpoint: Path) -> None:
    """What can be checked of a checkpoint without a manifest, without unpickling anything."""
    from safetensors import safe_open

    trainer = checkpoint / TRAINER_FILE
    try:
        with zipfile.ZipFile(trainer) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise FolnetError(f"{trainer}: corrupt or truncated training state ({exc})") from None
    if bad is not None:
        raise FolnetError(f"{trainer}: corrupt or truncated training state (member {bad!r} "
                          f"fails its CRC check)")
    weights = checkpoint / "model.safetensors"
    try:
        with safe_open(str(weights), framework="pt") as handle:
            handle.keys()
    except Exception as exc:  # safetensors reports a bad header as its own error type
        raise FolnetError(f"{weights}: corrupt or truncated weights ({exc})") from None


def remove_stale_temporaries(out: str | os.PathLike[str]) -> None:
    """Delete what crashed saves and deletions left anywhere in the run directory (never a
    complete checkpoint): ``.tmp-*`` and ``.trash-*`` (`folnet.atomic_write.remove_leftovers`). Only
    while holding the directory's `folnet.train.engine.lock.RunLock`: a live run's temporaries
    look exactly like a dead one's."""
    remove_leftovers(out)


# -- RNG ---------------------------------------------------------------------------------------


def capture_rng(device: torch.device) -> dict[str, Any]:
    """Every global random state this process draws from (dropout, shuffles, numpy)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: Mapping[str, Any], device: torch.device) -> None:
    random.setstate(_as_python_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _as_python_state(value: Any) -> tuple:
    """`random.setstate` wants nested tuples; a round trip may hand back lists."""
    if isinstance(value, list):
        return tuple(_as_python_state(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_as_python_state(v) for v in value)
    return value


# -- saving ------------------------------------------------------------------------------------


class Saveable(Protocol):
    """What writes itself into a checkpoint directory (the tokenizer: tokenizer.json,
    vocab.txt)."""

    def save(self, directory: str | os.PathLike[str]) -> Any: ...


def save_checkpoint(out: str | os.PathLike[str], step: int, *,
                    write_model: Callable[[Path], None], tokenizer: Saveable,
                    trainer_state: Mapping[str, Any], keep_last: int) -> Path:
    """Write ``OUT/checkpoints/step_{step}`` atomically, then keep only the last `keep_last`.

    ``write_model(dir)`` writes config.json + model.safetensors (`save_pretrained`). A full
    disk or a read-only folder is a `folnet.atomic_write.WriteError` naming the file, and the
    checkpoints already written are left as they were.
    """
    final = atomic_write_dir(checkpoint_dir(out) / f"step_{step}", lambda directory:
                             write_checkpoint_files(directory, write_model=write_model,
                                                    tokenizer=tokenizer,
                                                    trainer_state=trainer_state))
    prune_checkpoints(out, keep_last)
    return final


def write_checkpoint_files(directory: Path, *, write_model: Callable[[Path], None],
                           tokenizer: Saveable, trainer_state: Mapping[str, Any]) -> None:
    """Fill a checkpoint's temporary `directory`: the model (``write_model``), tokenizer,
    trainer.pt, then checksums.json over every file there (a sharded checkpoint's shards
    too, written before this is called)."""
    write_model(directory)
    tokenizer.save(directory)
    payload = {"format": TRAINER_FORMAT, "version": TRAINER_VERSION, **trainer_state,
               MANIFEST_KEY: MANIFEST}  # a checkpoint without it is then known damaged
    # through a Python file: a full disk is then an OSError (torch's own writer reports
    # it as a bare RuntimeError), which becomes a one-line error naming the file
    with writing(directory / TRAINER_FILE), open(directory / TRAINER_FILE, "wb") as handle:
        torch.save(payload, handle)
    write_manifest(directory)  # last: it covers every other file


def prune_checkpoints(out: str | os.PathLike[str], keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (renamed aside first)."""
    for _step, path in list_checkpoints(out)[:-keep_last]:
        try:
            discard_dir(path)  # a trash it cannot empty is said in a warning line
        except WriteError as exc:  # pruning is housekeeping: the new checkpoint is safe
            warn(f"keeping an old checkpoint: {exc}")


# -- loading -----------------------------------------------------------------------------------


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """Read ``trainer.pt``; a missing, truncated or foreign file is a FolnetError naming it."""
    path = Path(checkpoint) / TRAINER_FILE
    if not path.is_file():
        raise FolnetError(f"checkpoint {str(checkpoint)!r} has no {TRAINER_FILE} (not a "
                          f"training checkpoint, or an incomplete copy)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, bad pickle, unreadable file
        raise FolnetError(f"{path}: corrupt or truncated training state "
                          f"({type(exc).__name__}: {_one_line(str(exc))[:200]})") from None
    if not isinstance(state, dict) or state.get("format") != TRAINER_FORMAT:
        raise FolnetError(f"{path}: not a folnet training state")
    if state.get("version") != TRAINER_VERSION:
        raise FolnetError(f"{path}: training-state version {state.get('version')!r} is not "
                          f"supported (expected {TRAINER_VERSION})")
    return state


def _one_line(text: str) -> str:
    """`text` without terminal colour codes and line breaks (torch's messages have both): an
    error is printed as one line."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())


def read_run_config(checkpoint: Path) -> dict[str, Any]:
    """The PretrainConfig a checkpoint was written under (from its config.json)."""
    meta = read_metadata(checkpoint)
    run = meta.get("pretrain")
    if not isinstance(run, dict):
        raise FolnetError(f"{Path(checkpoint) / 'config.json'}: no pretraining run config "
                          f"(was it written by folnet pretrain?)")
    return run


def checkpoint_step(checkpoint: Path) -> int:
    """The optimiser step a checkpoint was written at: its config.json's ``step``, else its
    ``step_N`` name. Read before the (larger) trainer state, to check a new ``--steps``."""
    step = read_metadata(checkpoint).get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    match = STEP_DIR.match(Path(checkpoint).name)
    if match is None:
        raise FolnetError(f"{Path(checkpoint) / 'config.json'}: no step recorded, and the "
                          f"directory is not named step_N")
    return int(match.group(1))


_MODEL_OPTION = {"ops": "--ops", "vocab_size": "--vocab-size/--tokenizer"}


def load_weights_into(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load a checkpoint's weights into `model` after checking both describe one architecture.

    A different architecture names the options that make it; corrupt or truncated files are
    FolnetErrors naming the file.
    """
    check_architecture(model, checkpoint)
    load_weights(model, checkpoint)


def check_architecture(model: torch.nn.Module, checkpoint: Path) -> None:
    """Refuse a checkpoint whose config.json describes another architecture than `model`'s,
    naming the options that make the difference (a sharded checkpoint's weights are loaded
    later, into the sharded model, but checked here first like any other's)."""
    checkpoint = Path(checkpoint)
    meta = read_metadata(checkpoint)
    saved = dict(meta.get("model") or {})
    mine = model.cfg.to_dict()
    diffs = [k for k in sorted(set(saved) | set(mine)) if saved.get(k) != mine.get(k)]
    if diffs or meta.get("head") != model.head:
        shown = ", ".join(f"{_MODEL_OPTION.get(k, f'--preset/--model {k}')}: checkpoint "
                          f"{saved.get(k)!r}, now {mine.get(k)!r}" for k in diffs[:6])
        raise FolnetError(f"--resume: checkpoint {str(checkpoint)!r} holds a different "
                          f"architecture ({shown or 'head ' + repr(meta.get('head'))})")


def describe(checkpoint: Path) -> str:
    """One line for logs: which step and when."""
    try:
        meta = json.loads((Path(checkpoint) / "config.json").read_text())
        return f"{checkpoint} (step {meta.get('step')})"
    except (OSError, json.JSONDecodeError):
        return str(checkpoint)
