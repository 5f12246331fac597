"""``torch.compile`` of a training step's module: one graph, in place.

What compiles is the module a data-parallel wrapper holds (`folnet.train.pretrain.setup_run
.PretrainingForward`: the model's forward, its losses and its metrics), before it is wrapped,
with ``fullgraph=True``: a graph break would be a bug (folnet's forward has none for any kind:
tests/arch/test_compile.py), not a fallback to eager. Compiling in place keeps every
state-dict key, so checkpoints are the same files whether a run compiled or not.

``mode`` is torch's: "default"; "reduce-overhead" adds CUDA graphs (the step's launches
replayed from one capture: on a GPU the host's cost per launch, not the kernels, bounded the
small presets' steps), CUDA only; "max-autotune" also searches matrix-product configurations
(longer compiles).
"""

from __future__ import annotations

import torch
from torch import nn

from folnet.errors import FolnetError, choices

__all__ = ["COMPILE_MODES", "check_compile_mode", "compile_module"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def check_compile_mode(mode: str, device: torch.device) -> None:
    """Refuse a mode this device cannot run, naming the option."""
    if mode not in COMPILE_MODES:
        raise FolnetError(f"--compile-mode {mode!r} is unknown; use {choices(COMPILE_MODES)}")
    if mode == "reduce-overhead" and device.type != "cuda":
        raise FolnetError(f"--compile-mode reduce-overhead captures CUDA graphs and needs a CUDA "
                          f"device; this run is on {device} (use --compile-mode default)")


def compile_module(module: nn.Module, mode: str, device: torch.device) -> nn.Module:
    """``module`` compiled in place (``fullgraph=True``, ``mode``); returns it."""
    check_compile_mode(mode, device)
    module.compile(fullgraph=True, mode=mode)
    return module
