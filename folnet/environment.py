"""What a bug report needs to say about the machine: ``folnet env``.

Versions of the optional packages are read from their installed metadata, not by importing
them (transformers alone takes seconds to import); torch is imported, since only it can say
which device and which CPU kernels a run would use.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path

from folnet import __version__

__all__ = ["OPTIONAL", "report"]

#: Packages whose versions change folnet's behaviour or that issues ask about.
OPTIONAL = ("transformers", "peft", "accelerate", "tokenizers", "datasets", "safetensors",
            "opt_einsum", "numpy", "xformers", "triton")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _torch_lines() -> list[str]:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a core dependency
        return [f"torch: cannot be imported ({exc})"]
    lines = [f"torch: {torch.__version__} (CUDA build {torch.version.cuda or 'none'})",
             f"CPU kernels: {torch.backends.cpu.get_cpu_capability()}, "
             f"{torch.get_num_threads()} threads, {platform.machine()}"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            lines.append(f"cuda:{index}: {props.name}, compute capability "
                         f"{props.major}.{props.minor}, {props.total_memory / 2**30:.1f} GiB")
    else:
        lines.append("CUDA: not available")
    return lines


def report() -> str:
    """Lines naming folnet (and where it is installed), Python, the platform, torch with its
    device and CPU kernel set, and the optional packages."""
    where = Path(__file__).resolve().parent
    lines = [f"folnet: {__version__} ({where})",
             f"python: {sys.version.split()[0]} ({platform.python_implementation()})",
             f"platform: {platform.platform()}"]
    lines += _torch_lines()
    lines += [f"{name}: {_version(name)}" for name in OPTIONAL]
    return "\n".join(lines)
