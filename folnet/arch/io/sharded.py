"""The format of sharded training checkpoints, and their shards read on one process.

``folnet pretrain --fsdp`` writes each checkpoint's weights and optimiser state as shards, one
file per rank, through torch.distributed.checkpoint (DCP) into ``step_N/shards/``, beside the
usual config.json, tokenizer files and trainer.pt (`folnet.train.engine.sharded`). Inside the
DCP state the weights sit under `MODEL_KEY`, keyed as in the bare model's ``state_dict()``
(the key of a model directory's model.safetensors), and the optimiser state under `OPTIM_KEY`.

Why a model directory stays one model.safetensors: finetuning, `folnet.from_pretrained` and
the Hugging Face classes read one file, with no process group and no knowledge of how many
ranks trained it. A sharded checkpoint is turned into such a directory by
`folnet.arch.convert.convert_sharded` (``folnet convert RUN/checkpoints/step_N DEST``): DCP
reads shards written by any number of ranks into whole tensors on one process (``no_dist``,
`load_shards`), so the conversion needs no torchrun.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from folnet.arch.io.model_dir import SHARDS_DIR, is_sharded_checkpoint, read_metadata
from folnet.checksums import read_manifest, verify_files
from folnet.errors import FolnetError

__all__ = ["KEPT_FIELDS", "MODEL_KEY", "OPTIM_KEY", "checked_metadata", "load_shards"]

#: The entry of a sharded checkpoint's DCP state holding the weights (bare-model keys).
MODEL_KEY = "model"
#: The entry holding the optimiser state (as `get_state_dict` names it: parameter FQNs).
OPTIM_KEY = "optim"
#: What config.json of a converted directory keeps of the checkpoint's besides the model.
KEPT_FIELDS = ("pretrain", "step")


def checked_metadata(checkpoint: Path) -> dict:
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


def load_shards(checkpoint: Path, state: dict[str, torch.Tensor]) -> None:
    """Fill ``state`` (a bare model's ``state_dict()``) in place from the checkpoint's shards;
    a weight the shards lack or hold with another shape is a FolnetError."""
    import torch.distributed.checkpoint as dcp

    try:
        with warnings.catch_warnings():  # DCP warns that it loads without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({MODEL_KEY: state}, checkpoint_id=str(checkpoint / SHARDS_DIR),
                     no_dist=True)
    except Exception as exc:  # DCP reports missing keys and shape faults as its own errors
        text = " ".join(str(exc).split())[:300]
        raise FolnetError(f"{checkpoint / SHARDS_DIR}: the shards do not hold the weights its "
                          f"config.json describes ({type(exc).__name__}: {text})") from None
