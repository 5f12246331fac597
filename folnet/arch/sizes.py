"""How large a model a config implies, known before a byte of it is allocated.

A config read from a file is trusted for nothing: its sizes are checked for range
(`folnet.arch.config.check_fields`), then the model is built on the ``meta`` device (shapes
only, no memory, milliseconds) and

* beside a weights file, every implied tensor shape is compared with the file's header
  (`weight_shapes` reads the safetensors header only, no tensor data): a config that
  disagrees with its weights is an error naming the tensor, before the model exists;
* without weights (``build_model`` with large sizes), the implied bytes of parameters and
  buffers are compared with the memory the model would be allocated in (`check_memory`).

The memory rule: the parameters alone (at their dtype, float32 unless the default dtype says
otherwise) must fit in the memory available now -- ``MemAvailable`` of /proc/meminfo on Linux,
else the physical memory (``os.sysconf``); on a CUDA default device the free device memory;
nothing is checked under a ``meta`` default device, where nothing is allocated.
``FOLNET_MAX_MODEL_BYTES`` sets the limit explicitly. The rule refuses what could never be
built; a model that fits can still run out of memory later (activations, optimizer state).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from folnet.errors import FolnetError

#: The environment variable that sets the memory limit (bytes) explicitly.
LIMIT_ENV = "FOLNET_MAX_MODEL_BYTES"
#: The config fields an error about an implied size quotes.
SIZE_FIELDS = ("D1", "D2", "L", "H", "S", "F1", "F2", "vocab_size", "max_positions")


def meta_model(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` run on the meta device: every tensor has its shape and dtype, none has
    memory."""
    with torch.device("meta"):
        return build()


def implied_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of a (meta) model."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def implied_bytes(model: nn.Module) -> tuple[int, int]:
    """Parameter count and bytes of parameters plus buffers of a (meta) model."""
    count = sum(p.numel() for p in model.parameters())
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return count, size


def describe_sizes(cfg: object) -> str:
    """``D1=64, D2=16, ...``: the sizes of a config, for error messages."""
    return ", ".join(f"{name}={getattr(cfg, name)}" for name in SIZE_FIELDS)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit() -> tuple[int, str] | None:
    """The bytes a model may take where it would be allocated now, and where that number comes
    from; None when nothing is allocated (meta) or nothing is known."""
    device = torch.get_default_device()
    if device.type == "meta":
        return None
    override = os.environ.get(LIMIT_ENV)
    if override:
        try:
            value = int(override)
        except ValueError:
            value = 0
        if value < 1:
            raise FolnetError(f"{LIMIT_ENV} must be a positive number of bytes, got "
                              f"{override!r}")
        return value, LIMIT_ENV
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free memory of {device}"
    if device.type != "cpu":
        return None
    available = _meminfo_available()
    if available is not None:
        return available, "available memory (MemAvailable)"
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory"
    except (ValueError, OSError, AttributeError):
        return None


def human_bytes(size: int) -> str:
    """``512 B``, ``3.5 MiB``, ``8,212.6 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} B"


def check_memory(model: nn.Module, cfg: object, what: str = "the model") -> None:
    """Refuse a (meta) model whose parameters and buffers exceed `memory_limit`, naming the
    config's sizes, the implied parameter count and bytes."""
    limit = memory_limit()
    if limit is None:
        return
    count, size = implied_bytes(model)
    if size > limit[0]:
        raise FolnetError(f"{what}: the sizes {describe_sizes(cfg)} imply {count:,} parameters "
                          f"({human_bytes(size)}), more than the {human_bytes(limit[0])} of "
                          f"{limit[1]}; lower the sizes (or set {LIMIT_ENV} to a limit in "
                          f"bytes)")


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a safetensors file, read from its header (no tensor data)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise FolnetError(f"{path}: corrupt or truncated weights ({exc})") from None


def check_shapes(expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]],
                 where: str, *, only: str | None = None, config: str = "its config") -> None:
    """Every tensor ``expected`` (the config's model) is in ``found`` (the weights file) with
    the same shape, and ``found`` has no other; with ``only``, just the keys under that
    prefix. A mismatch names the tensor, both shapes and the config."""
    if only is not None:
        expected = {k: v for k, v in expected.items() if k.startswith(only)}
        found = {k: v for k, v in found.items() if k.startswith(only)}
    for key, shape in expected.items():
        if key in found and tuple(found[key]) != tuple(shape):
            raise FolnetError(f"{where}: tensor {key!r} has shape {tuple(found[key])} but "
                              f"{config} implies {tuple(shape)}")
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    if missing or unexpected:
        raise FolnetError(f"{where}: weights do not fit {config}: missing keys {missing[:8]}, "
                          f"unexpected keys {unexpected[:8]}")
