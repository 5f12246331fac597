"""Our checkpoint format: a directory with ``config.json`` and ``model.safetensors``.

``config.json`` carries everything needed to rebuild the model: the architecture string, the
model config, the head, and the spec of every non-built-in operator the string uses (so loading
needs no registration code). Files are written atomically. Reading a directory back into a
model of the right kind is `folnet.arch.build.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from folnet.arch.config import ModelConfig
from folnet.errors import FolnetError
from folnet.files import read_json
from folnet.io import atomic_write, atomic_write_json
from folnet.ops.registry import get_operator, register_operator
from folnet.ops.spec import parse_spec

FORMAT = "folnet"
VERSION = 1


def model_metadata(model: Any) -> dict[str, Any]:
    """What config.json says of a model: enough to rebuild it (`folnet.from_pretrained`)."""
    return {
        "format": FORMAT,
        "version": VERSION,
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
                 lambda p: save_file(state, str(p), metadata={"format": FORMAT}))
    atomic_write_json(directory / "config.json", {**model_metadata(model), **(extra or {})})
    return directory


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """A checkpoint's config.json, checked to be ours."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FolnetError(f"checkpoint {str(directory)!r} has no config.json")
    meta = read_json(path, what="config.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise FolnetError(f"{path}: not a folnet checkpoint (format {found!r})")
    return meta


def ensure_operators(cfg: ModelConfig) -> None:
    """Register the custom operators a checkpoint carries (or check they match)."""
    for items in cfg.operators:
        spec = parse_spec(dict(items))
        try:
            existing = get_operator(spec.symbol)
        except FolnetError:
            register_operator(spec)
            continue
        if existing != spec:
            raise FolnetError(f"checkpoint operator {spec.symbol!r} ({spec.name}) differs from "
                              f"the registered {existing.symbol!r} ({existing.name}); "
                              f"unregister it first")


def read_weights(directory: str | Path, *, map_location: str = "cpu") -> dict[str, Any]:
    """The tensors of ``directory/model.safetensors``; a missing, corrupt or truncated file is a
    `FolnetError` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        raise FolnetError(f"checkpoint {str(directory)!r} has no model.safetensors")
    try:
        return load_file(str(weights), device=map_location)
    except (SafetensorError, OSError, ValueError) as exc:
        raise FolnetError(f"{weights}: corrupt or truncated weights ({exc})") from None


def load_weights(model: Any, directory: str | Path, *, only: str | None = None,
                 map_location: str = "cpu") -> None:
    """Load ``directory/model.safetensors`` into ``model``, strictly: every key must fit. With
    ``only="encoder."`` just the keys under that prefix are loaded and required (a new head
    over a pretrained encoder)."""
    state = read_weights(directory, map_location=map_location)
    if only is not None:
        state = {k: v for k, v in state.items() if k.startswith(only)}
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if only is None or k.startswith(only)]
    if missing or result.unexpected_keys:
        raise FolnetError(f"{Path(directory) / 'model.safetensors'}: weights do not fit its "
                          f"config.json: missing keys {missing[:8]}, unexpected keys "
                          f"{result.unexpected_keys[:8]}")
