"""Models from the checkpoints that are not model directories: the released FOLNet code's
``PREFIX.cfg`` + ``PREFIX.pt`` (`load_official`) and sharded training checkpoints
(`read_sharded_model`, `convert_sharded`), what ``folnet convert`` turns into model directories.

Why here and not in `folnet.arch.io`: the formats are read there (`folnet.arch.io.official`,
`folnet.arch.io.sharded`), below the models, which save themselves through
`folnet.arch.io.model_dir`; building the model a checkpoint describes needs the models, so it
sits above them, beside `folnet.arch.build`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn

from folnet.arch.build import model_from_config, read_config
from folnet.arch.io.model_dir import read_metadata, save_pretrained, saved_num_labels
from folnet.arch.io.official import read_released, released_state
from folnet.arch.io.sharded import KEPT_FIELDS, checked_metadata, load_shards
from folnet.arch.models.encoder import FolnetModel
from folnet.arch.sizes import check_memory, meta_model
from folnet.atomic_write import atomic_write_dir
from folnet.checksums import TOKENIZER_FILES, write_model_manifest
from folnet.errors import FolnetError

__all__ = ["convert_sharded", "load_official", "read_sharded_model"]


def load_official(prefix: str | Path, *, head: str | None = "auto",
                  backend: str = "auto") -> FolnetModel:
    """Load ``prefix.cfg`` + ``prefix.pt`` (released format) into our model.

    ``head="auto"`` picks the head the checkpoint carries (pretraining, mlm, classification or
    none); pass a head name to insist on one, or None for the bare encoder (head keys are then
    left unused, which is allowed). ``backend`` forces the operators' backend
    (`folnet.ops.compiler.BACKEND_NAMES`).
    """
    cfg, src, head, num_labels = read_released(prefix, head, backend)
    weights = Path(f"{prefix}.pt")
    try:  # shapes only: every released key and shape is checked before anything is allocated
        shell = meta_model(lambda: FolnetModel(cfg, head=head, num_labels=num_labels))
    except FolnetError as exc:
        raise FolnetError(f"{prefix}.cfg: {exc}") from None
    released_state(shell, src, head, weights)
    check_memory(shell, cfg, f"{prefix}.cfg")
    src.used.clear()
    model = FolnetModel(cfg, head=head, num_labels=num_labels)
    model.load_state_dict(released_state(model, src, head, weights), strict=True)
    return model.eval()


def read_sharded_model(checkpoint: str | os.PathLike[str]) -> nn.Module:
    """The model of a sharded checkpoint with its weights, on the CPU of this one process
    (written by any number of ranks). Checked first: config.json, and every file against
    checksums.json; a weight the shards lack or hold with another shape is a FolnetError."""
    checkpoint = Path(checkpoint)
    meta = checked_metadata(checkpoint)
    cfg = read_config(checkpoint, meta)
    model = model_from_config(cfg, head=meta.get("head"), num_labels=saved_num_labels(meta))
    state = model.state_dict()
    load_shards(checkpoint, state)
    model.load_state_dict(state)  # the loaded tensors are the model's; this asserts the keys
    return model


def convert_sharded(checkpoint: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Write `checkpoint` (sharded) as a model directory `dest`: config.json, one
    model.safetensors and the tokenizer files, with checksums.json. `dest` must be new or an
    empty directory (it is written atomically, never merged into what is there)."""
    checkpoint, dest = Path(checkpoint), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FolnetError(f"DEST {str(dest)!r} exists and is not an empty directory: name a "
                          f"new directory for the converted model")
    model = read_sharded_model(checkpoint)
    meta = read_metadata(checkpoint)
    extra = {k: meta[k] for k in KEPT_FIELDS if k in meta}

    def write(directory: Path) -> None:
        save_pretrained(model, directory, extra)
        for name in TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                shutil.copyfile(checkpoint / name, directory / name)
        write_model_manifest(directory)  # again: now the tokenizer files are there too

    if dest.is_dir():
        dest.rmdir()  # empty (checked above): the atomic write puts the new one in its place
    return atomic_write_dir(dest, write)
