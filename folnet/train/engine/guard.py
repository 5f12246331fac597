"""The non-finite guard of the training loops: NaN and inf are noticed, never trained on, and
never saved.

`StepGuard` judges every optimiser step from its loss and gradient norm. A step whose loss or
gradient norm is not finite is *skipped*: the loop drops its update (the optimiser and its
state do not move) and the guard counts it; ``max_bad_steps`` skipped steps in a row stop the
run with a `NonFiniteError` (exit status 1 on the command line) whose one line names the step,
the loss and the likely cause. `check_finite_weights` is the last line of defence: every
writer of a checkpoint or a final model calls it first, so a file with a NaN or inf weight is
never written.

Why a skipped step still counts as a step (its batch is consumed, the step counter and the
learning-rate schedule move on, only the update is dropped): ``--steps``, ``--save-every`` and
the schedule then mean the same with or without skips, the data order of a run does not depend
on what its losses were, and a resumed run makes the same decisions as an uninterrupted one
(the counts are part of the trainer state). PyTorch's own fp16 recipe treats the loss scaler's
skipped steps the same way.

Why fp16 overflows are judged apart: the dynamic loss scaler starts high (2^16) and finds its
scale by overflowing -- a few skipped steps at the start of a healthy fp16 run are how it works
-- so an overflow of the gradients while the loss is finite is counted and reported but ends
the run only once the scale it happened at is at most 1, where the gradients overflow without
any scaling. A non-finite loss counts at once, in every precision.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from folnet.errors import FolnetError, NonFiniteError

__all__ = ["StepGuard", "advance_schedule", "check_finite_weights", "gradient_norm",
           "non_finite_tensors"]


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


class StepGuard:
    """Count skipped steps and stop a run after ``max_bad_steps`` of them in a row.

    ``what`` names the run in messages (``"pretraining"``); ``lr`` feeds the likely cause.
    ``skipped`` and ``in_a_row`` restore the counts of a resumed run.
    """

    def __init__(self, max_bad_steps: int, *, what: str, lr: float, skipped: int = 0,
                 in_a_row: int = 0) -> None:
        if isinstance(max_bad_steps, bool) or not isinstance(max_bad_steps, int) \
                or max_bad_steps < 1:
            raise FolnetError(f"max_bad_steps must be an integer >= 1, got {max_bad_steps!r}")
        self.max_bad_steps = int(max_bad_steps)
        self.what = what
        self.lr = float(lr)
        self.skipped = int(skipped)
        self.in_a_row = int(in_a_row)

    def check(self, step: int, loss: float, grad_norm: float | None,
              scale: float | None = None) -> str | None:
        """None when step ``step`` may update the weights; otherwise a one-line note of why it
        is skipped (the caller drops the update and reports the note).

        ``scale`` is the fp16 loss scale the step ran at (None without loss scaling). Raises
        `NonFiniteError` when this step makes ``max_bad_steps`` counted skips in a row.
        """
        loss_ok = math.isfinite(loss)
        norm_ok = grad_norm is None or math.isfinite(grad_norm)
        if loss_ok and norm_ok:
            self.in_a_row = 0
            return None
        self.skipped += 1
        overflow = loss_ok and scale is not None
        if overflow and scale > 1.0:
            return (f"step {step} skipped: fp16 gradient overflow at loss scale {scale:g} (the "
                    f"scaler lowers it; {self.skipped} skipped in all)")
        self.in_a_row += 1
        if self.in_a_row >= self.max_bad_steps:
            raise NonFiniteError(
                f"{self.what} stopped at step {step}: loss {_num(loss)}, gradient norm "
                f"{_num(grad_norm)}; {self.in_a_row} steps in a row were skipped "
                f"(--max-bad-steps {self.max_bad_steps}), {self.skipped} in all; likely cause: "
                f"{self._cause(step, loss_ok, scale)}; nothing non-finite was saved")
        return (f"step {step} skipped: loss {_num(loss)}, gradient norm {_num(grad_norm)} "
                f"({self.in_a_row} in a row, {self.skipped} in all)")

    def _cause(self, step: int, loss_ok: bool, scale: float | None) -> str:
        if scale is not None and loss_ok:
            return (f"fp16 overflow: the gradients overflow even at loss scale {scale:g}; use "
                    f"--precision bf16 or fp32, or lower --lr")
        if scale is not None:
            return (f"fp16 overflow in the forward pass or a diverged run (learning rate "
                    f"{self.lr:g}); use --precision bf16 or fp32, or lower --lr")
        if step == self.skipped:  # not one step was taken: the start itself is broken
            return ("not one step was finite: check the data, the --model settings and "
                    f"--precision, or lower --lr ({self.lr:g})")
        return (f"the training diverged: the learning rate ({self.lr:g}) is likely too high; "
                f"lower --lr, lengthen --warmup-ratio or clip with --clip-norm")


def non_finite_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating tensors that hold a NaN or an inf."""
    return [name for name, tensor in tensors
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


def check_finite_weights(weights: nn.Module | Mapping[str, torch.Tensor], what: str) -> None:
    """Refuse to save ``what`` when a floating tensor of ``weights`` (a module's state dict or
    a mapping of tensors) is not finite: call it before writing any checkpoint or model."""
    state = weights.state_dict() if isinstance(weights, nn.Module) else weights
    total = sum(1 for t in state.values() if t.is_floating_point())
    bad = non_finite_tensors(state.items())
    if bad:
        raise NonFiniteError(
            f"refusing to write {what}: {len(bad)} of {total} floating tensors hold NaN or inf "
            f"(first: {bad[0]}); the training diverged (lower --lr, or use --precision bf16 or "
            f"fp32 instead of fp16); checkpoints written earlier are intact")


def gradient_norm(model: nn.Module, clip_norm: float = 0.0) -> torch.Tensor:
    """The global L2 norm of the gradients (a 0-dim tensor; a full one under FSDP), clipping
    them to ``clip_norm`` when it is > 0. Call after unscaling fp16 gradients."""
    params = list(model.parameters())
    if clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
    else:  # the norm alone: the gradients are left untouched
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def advance_schedule(scheduler: LRScheduler, updated: bool) -> None:
    """``scheduler.step()`` after an optimiser step, taken or skipped (see the module
    docstring). Quiet about a skipped first update: PyTorch would warn that the schedule moved
    before the optimiser did, which a skip does on purpose."""
    if updated:
        scheduler.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()
