"""Sharded training checkpoints read on one process, and converted to a model directory.

``folnet pretrain --fsdp`` writes each checkpoint's weights and optimiser state as shards, one
file per rank, through torch.distributed.checkpoint (DCP) into ``step_N/shards/``, beside the
usual config.json, tokenizer files and trainer.pt (`folnet.train.engine.sharded`). Inside the
DCP state the weights sit under `MODEL_KEY`, keyed as in the bare model's ``state_dict()``
(the key of a model directory's model.safetensors), and the optimiser state under `OPTIM_KEY`.

Why a model directory stays one model.safetensors: finetuning, `folnet.from_pretrained` and
the Hugging Face classes read one file, with no process group and no knowledge of how many
ranks trained it. A sharded checkpoint is turned into such a directory by `convert_sharded`
(``folnet convert RUN/checkpoints/step_N DEST``): DCP reads shards written by any number of
ranks into whole tensors on one process (``no_dist``), so the conversion needs no torchrun.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

from torch import nn

from folnet.arch.build import model_from_config, read_config
from folnet.arch.io.model_dir import (
    SHARDS_DIR,
    is_sharded_checkpoint,
    read_metadata,
    save_pretrained,
    saved_num_labels,
)
from folnet.atomic_write import atomic_write_dir
from folnet.checksums import TOKENIZER_FILES, read_manifest, verify_files, write_model_manifest
from folnet.errors import FolnetError

__all__ = ["MODEL_KEY", "OPTIM_KEY", "convert_sharded", "read_sharded_model"]

#: The entry of a sharded checkpoint's DCP state holding the weights (bare-model keys).
MODEL_KEY = "model"
#: The entry holding the optimiser state (as `get_state_dict` names it: parameter FQNs).
OPTIM_KEY = "optim"
#: What config.json of a converted directory keeps of the checkpoint's besides the model.
KEPT_FIELDS = ("pretrain", "step")


def _check_checkpoint(checkpoint: Path) -> dict:
    """The checkpoint's config.json after checking it is a whole sharded checkpoint."""
    if not checkpoint.is_dir():
        raise FolnetError(f"checkpoint {str(checkpoint)!r}: no such directory")
    if not is_sharded_checkpoint(checkpoint):
        raise FolnetError(f"checkpoint {str(checkpoint)!r} is not a sharded checkpoint: "
                          f"expected a {SHARDS_DIR}/ folder and no model.safetensors")
    if read_manifest(checkpoint) is None:  # folnet always writes one with the shards
        raise FolnetError(f"checkpoint {str(checkpoint)!r} has no checksums.json: its shards "
                          f"cannot be checked (an incomplete copy?)")
    verify_files(checkpoint)
    return read_metadata(checkpoint)


def read_sharded_model(checkpoint: str | os.PathLike[str]) -> nn.Module:
    """The model of a sharded checkpoint with its weights, on the CPU of this one process
    (written by any number of ranks). Checked first: config.json, and every file against
    checksums.json; a weight the shards lack or hold with another shape is a FolnetError."""
    import torch.distributed.checkpoint as dcp

    checkpoint = Path(checkpoint)
    meta = _check_checkpoint(checkpoint)
    cfg = read_config(checkpoint, meta)
    model = model_from_config(cfg, head=meta.get("head"), num_labels=saved_num_labels(meta))
    state = model.state_dict()
    try:
        with warnings.catch_warnings():  # DCP warns that it loads without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({MODEL_KEY: state}, checkpoint_id=str(checkpoint / SHARDS_DIR),
                     no_dist=True)
    except Exception as exc:  # DCP reports missing keys and shape faults as its own errors
        text = " ".join(str(exc).split())[:300]
        raise FolnetError(f"{checkpoint / SHARDS_DIR}: the shards do not hold the weights its "
                          f"config.json describes ({type(exc).__name__}: {text})") from None
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
