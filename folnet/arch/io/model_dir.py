"""Our checkpoint format: a directory with ``config.json`` and ``model.safetensors``.

``config.json`` carries everything needed to rebuild the model: the architecture string, the
model config, the head, and the spec of every non-built-in operator the string uses (so loading
needs no registration code). Files are written atomically. Reading a directory back into a
model of the right kind is `folnet.arch.build.from_pretrained`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from folnet.arch.config import NUM_LABELS_LIMIT, ModelConfig, check_num_labels
from folnet.arch.head_table import hf_class
from folnet.arch.sizes import check_shapes, implied_shapes, weight_shapes
from folnet.atomic_write import atomic_write, atomic_write_json
from folnet.checksums import MANIFEST, MANIFEST_PROMISE, verify_model_dir, write_model_manifest
from folnet.errors import FolnetError
from folnet.ops.registry import ensure_registered
from folnet.ops.spec import parse_spec
from folnet.read_files import read_json

FORMAT = "folnet"
#: The header metadata of model.safetensors. ``"pt"``, as transformers writes it, because
#: transformers' and accelerate's loaders (``load_checkpoint_and_dispatch``) refuse any other
#: value; folnet reads no metadata (what the model is, config.json says), so the files written
#: with ``{"format": "folnet"}`` before still load here and in the `folnet.hf` classes.
WEIGHTS_METADATA = {"format": "pt"}
VERSION = 2  # 2: config.json also says model_type and architectures (transformers reads it)
STEP_DIR = re.compile(r"^step_(\d+)$")
#: The folder of a sharded training checkpoint (``folnet pretrain --fsdp``) that holds its
#: weights and optimiser state as torch.distributed.checkpoint shards, in place of
#: model.safetensors (`folnet.arch.io.sharded`).
SHARDS_DIR = "shards"


def model_metadata(model: Any) -> dict[str, Any]:
    """What config.json says of a model: enough to rebuild it (`folnet.from_pretrained`).
    ``architectures`` (which transformers' pipelines read) names the `folnet.hf` class of its
    kind and head from the head's entry (`folnet.arch.head_table.hf_class`); a registered head
    without one gets no ``architectures``: config.json still records the head, and the model
    loads with `folnet.from_pretrained` once the head is registered again."""
    arch = hf_class(model.cfg.kind, model.head)
    return {
        "format": FORMAT,
        "version": VERSION,
        "model_type": "folnet",
        **({"architectures": [arch]} if arch is not None else {}),
        "ops": str(model.plan),
        "kind": model.cfg.kind,
        "head": model.head,
        "num_labels": model.num_labels,
        "model": model.cfg.to_dict(),
    }


def save_pretrained(model: Any, directory: str | Path,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``directory``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(directory / "model.safetensors",
                 lambda p: save_file(state, str(p), metadata=WEIGHTS_METADATA))
    # the config says a manifest comes with it: a directory that loses it is refused
    atomic_write_json(directory / "config.json", {**model_metadata(model), **(extra or {}),
                                                  MANIFEST_PROMISE: MANIFEST})
    write_model_manifest(directory)  # loading checks these files instead of warning
    return directory


def run_checkpoints(run: str | Path) -> list[tuple[int, Path]]:
    """The checkpoints of a training run, ``RUN/checkpoints/step_N``, as (N, path), oldest
    first. Only complete ones carry that name: a checkpoint is written under a temporary name
    and renamed when whole."""
    root = Path(run) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), entry) for entry in root.iterdir()
             if (m := STEP_DIR.match(entry.name)) and entry.is_dir()]
    return sorted(found)


def is_sharded_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` is a sharded training checkpoint: a ``shards/`` folder and no
    model.safetensors (`SHARDS_DIR`)."""
    directory = Path(directory)
    return (directory / SHARDS_DIR).is_dir() and not (directory / "model.safetensors").exists()


def sharded_refusal(checkpoint: str | Path, what: str) -> FolnetError:
    """The error for a model directory that is a sharded checkpoint, saying how to convert
    it: a model directory is one model.safetensors, which such a checkpoint does not have."""
    return FolnetError(f"{what} {str(checkpoint)!r} is a sharded training checkpoint (written "
                       f"by folnet pretrain --fsdp) and holds no model.safetensors: convert "
                       f"it to a model directory with `folnet convert {checkpoint} DEST`, "
                       f"or use the run's final/")


def resolve_model_dir(path: str | Path, *, what: str = "checkpoint") -> Path:
    """The model directory ``path`` names: itself when it holds config.json and
    model.safetensors; else a run's ``final/`` (a pretraining run), its ``model/`` (a
    finetuning run) or its latest checkpoint. A sharded checkpoint in the way (``path``
    itself, or a run's latest) is refused with how to convert it, never skipped for an older
    one."""
    root = Path(path)
    if not root.exists():
        raise FolnetError(f"{what} {str(root)!r} does not exist")
    candidates = [root, root / "final", root / "model"]
    candidates += [p for _, p in reversed(run_checkpoints(root))]
    for candidate in candidates:
        if is_sharded_checkpoint(candidate) and (candidate / "config.json").is_file():
            raise sharded_refusal(candidate, what)
        if (candidate / "config.json").is_file() and (candidate / "model.safetensors").is_file():
            try:
                verify_model_dir(candidate)  # config, weights and tokenizer, before any is read
                read_metadata(candidate)
            except FolnetError as exc:
                raise FolnetError(f"{what} {str(root)!r}: {exc}") from None
            return candidate
    hint = ("; the run has no final/ yet and no complete checkpoint"
            if (root / "checkpoints").is_dir() else "")
    raise FolnetError(f"{what} {str(root)!r} is not a folnet checkpoint: expected a directory "
                      f"with config.json and model.safetensors, or a run directory with "
                      f"final/, model/ or checkpoints/step_N{hint}")


def saved_num_labels(meta: dict[str, Any]) -> int:
    """The head's output count a config.json records (transformers writes id2label); the
    fields were checked by `read_metadata`."""
    if "num_labels" in meta:
        return int(meta["num_labels"])
    return len(meta.get("id2label") or {}) or 2


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """A checkpoint's config.json, checked to be ours, its top-level fields checked
    (`check_metadata`) and its model config under ``model`` checked whole
    (`folnet.arch.config.ModelConfig.from_dict`: every size in range, every custom operator's
    size and scale expression evaluated within bounds).

    Every loader (`folnet.from_pretrained`, ``--init-from``, ``--resume``, finetuning) reads
    config.json here, and model directories come from strangers: this is the one place where
    a hostile file is refused, fast, each fault one `FolnetError` line starting with the
    file's path."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FolnetError(f"checkpoint {str(directory)!r} has no config.json")
    meta = read_json(path, what="config.json")
    try:
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise FolnetError(f"not a folnet checkpoint (format {found!r})")
        check_metadata(meta)
        ModelConfig.from_dict(meta["model"], source="model.")
    except FolnetError as exc:
        raise FolnetError(f"{path}: {exc}") from None
    return meta


def check_metadata(meta: dict[str, Any], where: str = "") -> None:
    """The fields of config.json beside the model config: each fault a `FolnetError` naming
    ``where`` (the file; `read_metadata` leaves it empty and adds the path itself) and the
    field, so no raw TypeError, and no size torch cannot take, surfaces later."""
    prefix = f"{where}: " if where else ""

    def bad(name: str, want: str) -> FolnetError:
        return FolnetError(f"{prefix}field {name!r} must be {want}, got {meta[name]!r}")

    if "model" not in meta:
        raise FolnetError(f"{prefix}missing field 'model' (the model config)")
    if not isinstance(meta["model"], dict):
        raise bad("model", "an object of model config fields")
    value = meta.get("version")
    if "version" in meta and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 1):
        raise bad("version", "a positive integer")
    if "num_labels" in meta:
        check_num_labels(meta["num_labels"], f"{prefix}field 'num_labels'")
    labels = meta.get("id2label")
    if isinstance(labels, dict) and len(labels) > NUM_LABELS_LIMIT:
        raise FolnetError(f"{prefix}field 'id2label' has {len(labels)} entries, more than "
                          f"the limit {NUM_LABELS_LIMIT}")
    for name in ("ops", "kind", "head"):
        if meta.get(name) is not None and not isinstance(meta[name], str):
            raise bad(name, "a string" + (" or null" if name == "head" else ""))
    if meta.get("id2label") is not None and not isinstance(meta["id2label"], dict):
        raise bad("id2label", "an object")


def ensure_operators(cfg: ModelConfig) -> None:
    """Register the custom operators a checkpoint carries (or check they match)."""
    ensure_registered([parse_spec(dict(items)) for items in cfg.operators],
                      source="checkpoint")


def read_weights(directory: str | Path, *, map_location: str = "cpu") -> dict[str, Any]:
    """The tensors of ``directory/model.safetensors``; a missing, corrupt or truncated file is a
    `FolnetError` naming it. Where the directory has a ``checksums.json`` (`folnet.checksums`),
    the weights, config.json and tokenizer files are checked against it first: a flipped byte
    inside tensor data would otherwise load silently; without one, a warning (or an error under
    `folnet.checksums.strict_checksums`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        raise FolnetError(f"checkpoint {str(directory)!r} has no model.safetensors")
    verify_model_dir(directory)
    try:
        return load_file(str(weights), device=map_location)
    except (SafetensorError, OSError, ValueError) as exc:
        raise FolnetError(f"{weights}: corrupt or truncated weights ({exc})") from None


def load_weights(model: Any, directory: str | Path, *, only: str | None = None,
                 map_location: str = "cpu") -> None:
    """Load ``directory/model.safetensors`` into ``model``, strictly: every key must fit, with
    its shape (checked from the file's header before any tensor is read). With
    ``only="encoder."`` just the keys under that prefix are loaded and required (a new head
    over a pretrained encoder)."""
    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        raise FolnetError(f"checkpoint {str(directory)!r} has no model.safetensors")
    check_shapes(implied_shapes(model), weight_shapes(weights), str(weights), only=only,
                 config="its config.json")
    state = read_weights(directory, map_location=map_location)
    if only is not None:
        state = {k: v for k, v in state.items() if k.startswith(only)}
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if only is None or k.startswith(only)]
    if missing or result.unexpected_keys:
        raise FolnetError(f"{weights}: weights do not fit its config.json: missing keys "
                          f"{missing[:8]}, unexpected keys {result.unexpected_keys[:8]}")
