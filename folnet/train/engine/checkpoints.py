"""Training checkpoints: written atomically, found on resume, checked before they are trusted.

Layout of one checkpoint, ``OUT/checkpoints/step_N/``::

    config.json         model config + the run's PretrainConfig and step   (folnet format)
    model.safetensors   weights                                            (folnet format)
    tokenizer.json      the tokenizer, also as a BERT vocab.txt
    vocab.txt
    trainer.pt          optimizer, scheduler, GradScaler, RNG states (python, numpy, torch,
                        CUDA, per rank), the MLM collator's generator, the data position
                        (epoch, micro-batch in epoch) and counters

Why a directory rename: every file is written into ``checkpoints/.tmp-step_N-*``, fsynced, and
the directory is renamed to ``step_N`` in one atomic step (`folnet.io.atomic_write_dir`), so a
crash (SIGKILL, power loss, full disk) during a save leaves either the old set of checkpoints or
the new one, never a half-written ``step_N``. Old checkpoints are renamed aside before they are
deleted for the same reason (`folnet.io.discard_dir`). `list_checkpoints` only ever sees
complete directories.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from folnet.arch import load_weights, read_metadata, run_checkpoints
from folnet.arch.checkpoint import STEP_DIR
from folnet.errors import FolnetError
from folnet.io import atomic_write_dir, discard_dir

__all__ = [
    "TRAINER_FILE",
    "Saveable",
    "capture_rng",
    "checkpoint_dir",
    "checkpoint_step",
    "describe",
    "list_checkpoints",
    "load_trainer_state",
    "load_weights_into",
    "read_run_config",
    "remove_stale_temporaries",
    "resolve_resume",
    "restore_rng",
    "save_checkpoint",
]

TRAINER_FILE = "trainer.pt"
TRAINER_FORMAT = "folnet-trainer"
TRAINER_VERSION = 1


def checkpoint_dir(out: str | os.PathLike[str]) -> Path:
    return Path(out) / "checkpoints"


def list_checkpoints(out: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``OUT/checkpoints`` as (step, path), oldest first."""
    return run_checkpoints(out)


def resolve_resume(out: str | os.PathLike[str], resume: str | None) -> Path | None:
    """The checkpoint a ``--resume`` value names: 'latest' (one must exist), 'auto' (the
    latest if any, else a fresh start) or a checkpoint directory."""
    if resume is None:
        return None
    if resume in ("latest", "auto"):
        found = list_checkpoints(out)
        if found:
            return found[-1][1]
        if resume == "auto":
            return None
        raise FolnetError(f"--resume: no checkpoint to resume under "
                          f"{str(checkpoint_dir(out))!r}")
    path = Path(resume)
    if not path.is_dir():
        raise FolnetError(f"--resume {resume!r}: no such checkpoint directory")
    return path


def remove_stale_temporaries(out: str | os.PathLike[str]) -> None:
    """Delete what crashed saves and deletions left behind (never a complete checkpoint)."""
    root = checkpoint_dir(out)
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(entry, ignore_errors=True)


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

    ``write_model(dir)`` writes config.json + model.safetensors (`save_pretrained`).
    """
    def write(directory: Path) -> None:
        write_model(directory)
        tokenizer.save(directory)
        payload = {"format": TRAINER_FORMAT, "version": TRAINER_VERSION, **trainer_state}
        torch.save(payload, directory / TRAINER_FILE)

    final = atomic_write_dir(checkpoint_dir(out) / f"step_{step}", write)
    for _step, path in list_checkpoints(out)[:-keep_last]:
        discard_dir(path)
    return final


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
                          f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(state, dict) or state.get("format") != TRAINER_FORMAT:
        raise FolnetError(f"{path}: not a folnet training state")
    if state.get("version") != TRAINER_VERSION:
        raise FolnetError(f"{path}: training-state version {state.get('version')!r} is not "
                          f"supported (expected {TRAINER_VERSION})")
    return state


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
    load_weights(model, checkpoint)


def describe(checkpoint: Path) -> str:
    """One line for logs: which step and when."""
    try:
        meta = json.loads((Path(checkpoint) / "config.json").read_text())
        return f"{checkpoint} (step {meta.get('step')})"
    except (OSError, json.JSONDecodeError):
        return str(checkpoint)
