"""What a pretraining step measures, by name: `StepMetrics`, and the log record made from it.

A step adds its sums up on the device, micro-batch by micro-batch, in one float64 tensor
(`StepMetrics.pack`): one all-reduce sums it over the processes and one host transfer reads it
(`StepMetrics.unpack`), so naming the numbers costs no extra synchronisation. Sums, not means,
travel: a mean over a step (or over the steps since the last log record) is a sum over all its
sequences divided by their count, whatever the micro-batches and processes were.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = ["LM_LOG_FIELDS", "LOG_FIELDS", "StepMetrics", "bar_postfix", "log_fields",
           "log_record"]

_COUNTERS = ("lr", "grad_norm", "tokens_per_s", "samples_per_s", "elapsed", "epoch", "samples",
             "tokens", "skipped")
#: The columns of an encoder's ``OUT/log.csv`` (MLM and NSP/SOP): the keys of `log_record`.
LOG_FIELDS = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", *_COUNTERS)
#: A decoder's (the next token) and an encoder-decoder's (the spans): the loss per target
#: token, the accuracy and the perplexity.
LM_LOG_FIELDS = ("step", "loss", "lm_acc", "perplexity", *_COUNTERS)


def log_fields(objective: str) -> tuple[str, ...]:
    """The log's columns for ``objective``."""
    return LM_LOG_FIELDS if objective in ("clm", "prefix", "span") else LOG_FIELDS


@dataclass(frozen=True)
class StepMetrics:
    """Sums over the sequences of one step, or of the steps since the last log record: tensors
    while a step adds them up on the device, floats once unpacked. The token objective is an
    encoder's MLM or a decoder's next token; the sequence objective an encoder's NSP/SOP (a
    decoder has none: zero)."""

    token_loss_sum: float | torch.Tensor = 0.0  # cross-entropy summed over the token targets
    sequence_loss_sum: float | torch.Tensor = 0.0  # NSP/SOP cross-entropy summed over sequences
    token_correct: float | torch.Tensor = 0.0  # token targets predicted right
    sequence_correct: float | torch.Tensor = 0.0  # sequences whose label is predicted right
    targets: float | torch.Tensor = 0.0  # token targets (masked positions, next tokens)
    sequences: float | torch.Tensor = 0.0

    @classmethod
    def zeros(cls, device: torch.device) -> torch.Tensor:
        """A packed accumulator of zeros, ``[len(fields)]`` float64."""
        return torch.zeros(len(fields(cls)), dtype=torch.float64, device=device)

    def pack(self, device: torch.device) -> torch.Tensor:
        """The fields, in order, as one ``[len(fields)]`` float64 tensor on ``device`` (to add
        to an accumulator, all-reduce, read back with `unpack`). A Python number is filled in
        on the device, not copied there (a copy from pageable host memory waits for the
        device's queue)."""
        return torch.stack([value.to(torch.float64) if isinstance(value, torch.Tensor)
                            else torch.full((), value, dtype=torch.float64, device=device)
                            for value in (getattr(self, f.name) for f in fields(self))])

    @staticmethod
    def loss_of(packed: torch.Tensor) -> torch.Tensor:
        """`loss` of a packed tensor, on its device: () float64."""
        names = [f.name for f in fields(StepMetrics)]
        at = {name: packed[names.index(name)] for name in
              ("token_loss_sum", "targets", "sequence_loss_sum", "sequences")}
        return (at["token_loss_sum"] / at["targets"].clamp_min(1.0)
                + at["sequence_loss_sum"] / at["sequences"].clamp_min(1.0))

    @classmethod
    def unpack(cls, values: Sequence[float]) -> StepMetrics:
        """The named sums from a packed tensor's ``tolist()``."""
        if len(values) != len(fields(cls)):
            raise ValueError(f"expected {len(fields(cls))} sums, got {len(values)}")
        return cls(*values)

    @property
    def loss(self) -> float:
        """The objective: the token loss per target plus the sequence loss per sequence."""
        return (self.token_loss_sum / max(self.targets, 1.0)
                + self.sequence_loss_sum / max(self.sequences, 1.0))

    def means(self, objective: str = "nsp") -> dict[str, float | None]:
        """The logged losses and accuracies of ``objective`` (`log_fields`); None when no
        sequence was counted (every step since the last record was skipped, and skipped
        steps add nothing)."""
        targets, sequences = max(self.targets, 1.0), max(self.sequences, 1.0)
        token_loss = self.token_loss_sum / targets
        if objective in ("clm", "prefix", "span"):
            means = {"loss": token_loss, "lm_acc": self.token_correct / targets,
                     "perplexity": math.exp(min(token_loss, 700.0))}
        else:
            sequence_loss = self.sequence_loss_sum / sequences
            means = {"loss": token_loss + sequence_loss, "mlm_loss": token_loss,
                     "nsp_loss": sequence_loss, "mlm_acc": self.token_correct / targets,
                     "nsp_acc": self.sequence_correct / sequences}
        return dict.fromkeys(means) if self.sequences == 0 else means


def log_record(metrics: StepMetrics, *, step: int, lr: float, grad_norm: float | None,
               tokens: int, seconds: float, elapsed: float, state: Mapping[str, Any],
               objective: str = "nsp") -> dict[str, Any]:
    """One record of ``OUT/log.csv``: ``metrics`` summed over the updated steps since the last
    record (over ``seconds``, which read ``tokens``), the run's counters from ``state``."""
    return {"step": step, **metrics.means(objective), "lr": lr, "grad_norm": grad_norm,
            "tokens_per_s": tokens / seconds, "samples_per_s": metrics.sequences / seconds,
            "elapsed": elapsed, "epoch": state["epoch"], "samples": state["samples"],
            "tokens": state["tokens"], "skipped": state["skipped"]}


def bar_postfix(objective: str) -> Callable[[Mapping[str, Any]], str]:
    """What the progress bar shows after each logged step."""
    def render(record: Mapping[str, Any]) -> str:
        def num(key: str) -> float:
            value = record.get(key)
            return float(value) if isinstance(value, (int, float)) else float("nan")

        if objective in ("clm", "prefix", "span"):
            return (f"loss {num('loss'):.3f} ppl {num('perplexity'):.1f} lm_acc "
                    f"{num('lm_acc'):.3f} tok/s {num('tokens_per_s'):,.0f}")
        return (f"loss {num('loss'):.3f} mlm_acc {num('mlm_acc'):.3f} {objective}_acc "
                f"{num('nsp_acc'):.3f} tok/s {num('tokens_per_s'):,.0f}")

    return render
