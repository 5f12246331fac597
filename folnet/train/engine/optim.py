"""Optimisers and learning-rate schedules for pretraining (LAMB) and finetuning (AdamW).

LAMB is folnet's own (`folnet.train.engine.lamb`: the published rule, in a few dozen launches
per step). NVIDIA Apex's `FusedLAMB` (the same rule with ``use_nvlamb=True``) is used instead
when `apex.optimizers` imports and the parameters live on CUDA; Apex is never installed for
you.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from folnet.errors import FolnetError, choices
from folnet.ops.primitives.device import kernel_device
from folnet.train.engine.lamb import Lamb

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "Lamb",
    "WarmupDecay",
    "apex_fused_lamb",
    "build_optimizer",
    "build_scheduler",
    "no_weight_decay",
    "parameter_groups",
    "reschedule",
    "schedule_rule",
    "step_unless",
    "warmup_steps_for",
]

OPTIMIZERS = ("lamb", "adamw")
SCHEDULES = ("linear", "polynomial", "constant")


def apex_fused_lamb() -> type | None:
    """NVIDIA Apex's FusedLAMB class when Apex itself imports (never the PyPI 'apex')."""
    try:
        from apex.optimizers import FusedLAMB  # type: ignore[import-not-found]
    except Exception:  # ImportError, or a broken CUDA extension build
        return None
    return FusedLAMB


def no_weight_decay(name: str, param: nn.Parameter) -> bool:
    """Biases and normalisation weights are not decayed (BERT's rule). Our LayerNorms have no
    parameters, so for FOLNet this is exactly 'every name ending in bias'."""
    lowered = name.lower()
    return lowered.endswith("bias") or "layernorm" in lowered or "layer_norm" in lowered


def parameter_groups(model: nn.Module, weight_decay: float,
                     exclude: Callable[[str, nn.Parameter], bool] = no_weight_decay
                     ) -> list[dict[str, Any]]:
    """Two optimiser groups: decayed weights and the excluded ones (weight_decay 0).

    Each group also carries the parameter names (``names``) so tests and logs can tell which
    tensors are decayed; torch optimisers keep extra group keys untouched.
    """
    decay: list[tuple[str, nn.Parameter]] = []
    keep: list[tuple[str, nn.Parameter]] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (keep if exclude(name, param) else decay).append((name, param))
    groups = []
    for members, wd in ((decay, weight_decay), (keep, 0.0)):
        if members:
            groups.append({"params": [p for _, p in members], "weight_decay": wd,
                           "names": [n for n, _ in members]})
    return groups


def build_optimizer(model: nn.Module, name: str = "lamb", *, lr: float = 1e-3,
                    weight_decay: float = 0.01, betas: tuple[float, float] = (0.9, 0.999),
                    eps: float = 1e-6, fused: str = "auto") -> Optimizer:
    """LAMB for pretraining, AdamW for finetuning, over `parameter_groups`.

    ``fused="auto"`` takes Apex FusedLAMB for LAMB on CUDA when Apex imports (and torch's fused
    AdamW on CUDA); ``"never"`` always uses the reference implementations.
    """
    if name not in OPTIMIZERS:
        raise FolnetError(f"optimizer {name!r} is unknown; use {choices(OPTIMIZERS)}")
    if fused not in ("auto", "never"):
        raise FolnetError(f"fused {fused!r} is unknown; use {choices(('auto', 'never'))}")
    groups = parameter_groups(model, weight_decay)
    if not groups:
        raise FolnetError("the model has no trainable parameters")
    on_cuda = all(kernel_device(p.device) == "cuda" for g in groups for p in g["params"])
    if name == "adamw":
        fused_adamw = fused == "auto" and on_cuda
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused_adamw or None)
    apex_cls = apex_fused_lamb() if fused == "auto" and on_cuda else None
    if apex_cls is not None:
        # Clipping is done by the training loop; Apex's internal global clip is disabled.
        return apex_cls(groups, lr=lr, betas=betas, eps=eps, bias_correction=True,
                        max_grad_norm=float("inf"), use_nvlamb=True)
    return Lamb(groups, lr=lr, betas=betas, eps=eps)


def step_unless(optimizer: Optimizer, bad: torch.Tensor) -> bool:
    """Step ``optimizer`` unless ``bad`` (a () bool tensor on its parameters' device) --
    judged on the device, so that the host need not wait for the step's loss -- and return
    True; or return False, doing nothing, for an optimiser that cannot skip there (Apex's
    FusedLAMB, torch's unfused AdamW): the caller then judges on the host. folnet's `Lamb`
    skips by ``step(skip=)``; torch's fused AdamW by the ``found_inf`` it reads from the
    optimiser (as `torch.amp.GradScaler` hands it over)."""
    if isinstance(optimizer, Lamb):
        optimizer.step(skip=bad)
        return True
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and optimizer.defaults.get(
            "fused"):
        optimizer.found_inf = bad.to(torch.float32)
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
        return True
    return False


def warmup_steps_for(total_steps: int, warmup_ratio: float) -> int:
    """Warmup length in optimiser steps: ``ceil(ratio * total)`` (as Hugging Face does)."""
    return math.ceil(total_steps * warmup_ratio)


class WarmupDecay:
    """The learning-rate factor at optimiser step ``s`` (0-based), a picklable callable.

    Warmup rises linearly from 0 (``s / warmup``); after it the factor decays to
    ``end_factor`` at ``total``: linearly, polynomially (``power``) or not at all (constant).
    Being an object, not a lambda, `LambdaLR.state_dict` saves its settings.
    """

    def __init__(self, total_steps: int, warmup_steps: int, schedule: str = "linear",
                 power: float = 1.0, end_factor: float = 0.0) -> None:
        if schedule not in SCHEDULES:
            raise FolnetError(f"schedule {schedule!r} is unknown; use {choices(SCHEDULES)}")
        if total_steps < 1:
            raise FolnetError(f"total steps must be >= 1, got {total_steps}")
        if not 0 <= warmup_steps <= total_steps:
            raise FolnetError(f"warmup steps must lie in [0, {total_steps}], got {warmup_steps}")
        if not power > 0:
            raise FolnetError(f"schedule power must be > 0, got {power!r}")
        if not 0.0 <= end_factor <= 1.0:
            raise FolnetError(f"end factor must lie in [0, 1], got {end_factor!r}")
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.schedule = schedule
        self.power = float(power)
        self.end_factor = float(end_factor)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        remaining = max(0.0, 1.0 - (step - self.warmup_steps) / span)
        shape = remaining if self.schedule == "linear" else remaining**self.power
        return self.end_factor + (1.0 - self.end_factor) * shape


def schedule_rule(total_steps: int, *, warmup_ratio: float = 0.01, schedule: str = "linear",
                  power: float = 1.0, end_factor: float = 0.0) -> WarmupDecay:
    """The `WarmupDecay` of a run of `total_steps` optimiser steps (warmup: `warmup_steps_for`)."""
    if not 0.0 <= warmup_ratio <= 1.0:
        raise FolnetError(f"warmup_ratio must lie in [0, 1], got {warmup_ratio!r}")
    return WarmupDecay(total_steps, warmup_steps_for(total_steps, warmup_ratio), schedule,
                       power, end_factor)


def build_scheduler(optimizer: Optimizer, total_steps: int, *, warmup_ratio: float = 0.01,
                    schedule: str = "linear", power: float = 1.0,
                    end_factor: float = 0.0) -> LambdaLR:
    """`LambdaLR` over `WarmupDecay`; call ``scheduler.step()`` after each optimiser step."""
    return LambdaLR(optimizer, schedule_rule(total_steps, warmup_ratio=warmup_ratio,
                                             schedule=schedule, power=power,
                                             end_factor=end_factor))


def reschedule(scheduler: LambdaLR, rule: Callable[[int], float]) -> None:
    """Give a restored scheduler a new rule and set the current learning rate from it.

    Why: a run continued to another total keeps its optimiser state and step count, but its
    warmup and decay must follow the new total. `LambdaLR.load_state_dict` brings back the
    saved rule's settings (a `WarmupDecay` is saved by its attributes), so the rule is swapped
    in after loading. Stepping again from one step back makes `LambdaLR` itself recompute the
    rate of the current step, write it into the optimiser's groups and report it from
    ``get_last_lr()``, exactly as its own ``step()`` after an optimiser step would.
    """
    scheduler.lr_lambdas = [rule] * len(scheduler.optimizer.param_groups)
    scheduler.last_epoch -= 1
    scheduler.step()
