"""Training logs: ``OUT/log.jsonl`` and ``OUT/log.csv`` (one record per logged step),
TensorBoard when it is installed, and a live tqdm progress bar.

Why JSONL first: one self-describing record per line survives a crash mid-write (a torn last
line is simply skipped by readers) and appends cheaply; the CSV is for spreadsheets. On
resume, records past the resumed step are dropped so the log reads as one uninterrupted run.
Only rank 0 logs (`TrainLogger(enabled=False)` does nothing).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from folnet.io import atomic_write_text

__all__ = ["CSV_FIELDS", "TrainLogger", "read_log"]

CSV_FIELDS = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm",
              "tokens_per_s", "samples_per_s", "elapsed", "epoch", "samples", "tokens")


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl``; a torn final line (crash mid-write) is ignored."""
    records = []
    path = Path(path)
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    return value


class TrainLogger:
    """Write step records to JSONL/CSV/TensorBoard and drive the progress bar."""

    def __init__(self, out: str | os.PathLike[str], *, enabled: bool = True, total_steps: int,
                 start_step: int = 0, tensorboard: bool = True, progress: bool = True,
                 objective: str = "nsp") -> None:
        self.enabled = enabled
        self.out = Path(out)
        self.objective = objective.upper()
        self._bar = None
        self._tb = None
        if not enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out / "log.jsonl"
        self.csv = self.out / "log.csv"
        self._truncate(start_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.out / "tensorboard"),
                                         purge_step=start_step + 1)
            except ImportError:  # tensorboard is optional
                self._tb = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="pretrain",
                             unit="step", dynamic_ncols=True, mininterval=0.5)

    def _truncate(self, start_step: int) -> None:
        """Keep only records up to `start_step` (all of them for a fresh run: none exist)."""
        kept = [r for r in read_log(self.jsonl) if int(r.get("step", 0)) <= start_step]
        if start_step == 0:
            kept = []
        atomic_write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for record in kept:
            writer.writerow(record)
        atomic_write_text(self.csv, buffer.getvalue())

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one step record (must hold ``step``) to every sink."""
        if not self.enabled:
            return
        clean = {k: _finite(v) for k, v in record.items()}
        with open(self.jsonl, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(clean) + "\n")
            handle.flush()
        with open(self.csv, "a", encoding="utf-8", newline="") as handle:
            csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore").writerow(clean)
        if self._tb is not None:
            for key, value in clean.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"pretrain/{key}", value, int(clean["step"]))
            self._tb.flush()
        if self._bar is not None:
            def num(key: str) -> float:
                value = clean.get(key)
                return float(value) if isinstance(value, (int, float)) else float("nan")

            self._bar.set_postfix_str(
                f"loss {num('loss'):.3f} mlm_acc {num('mlm_acc'):.3f} "
                f"{self.objective.lower()}_acc {num('nsp_acc'):.3f} "
                f"tok/s {num('tokens_per_s'):,.0f}", refresh=False)

    def advance(self, steps: int = 1) -> None:
        """Move the bar (its ETA comes from the step rate)."""
        if self._bar is not None:
            self._bar.update(steps)

    def message(self, text: str) -> None:
        """A line for the user that does not break the bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
