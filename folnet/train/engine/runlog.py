"""Training logs: ``OUT/log.jsonl`` and ``OUT/log.csv`` (one record per logged step),
TensorBoard when asked for, and a live tqdm progress bar.

Why JSONL first: one self-describing record per line survives a crash mid-write (a torn last
line is simply skipped by readers) and appends cheaply; the CSV is for spreadsheets and holds
the training-step records (those with a ``loss``) in the caller's columns. On resume, records
past the resumed step are dropped so the log reads as one uninterrupted run. Only rank 0 logs
(`TrainLogger(enabled=False)` does nothing). Pretraining and finetuning use the same logger and
differ only in their columns, their TensorBoard tag and what the bar shows.

TensorBoard is off by default and no extra installs it: asked for (``--tensorboard``) without
the package, a run says so once on stderr and keeps training on the JSONL/CSV logs, rather than
failing an hours-long job over a dashboard or silently dropping what the user asked for.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from folnet.atomic_write import atomic_write_text

__all__ = ["TrainLogger", "read_log"]


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


@functools.cache
def _say_tensorboard_missing(reason: str) -> None:
    """One line per process (a finetuning run opens a logger per seed)."""
    print(f"folnet: --tensorboard is on but TensorBoard cannot be used ({reason}); logging to "
          f"log.jsonl and log.csv only (pip install tensorboard)", file=sys.stderr, flush=True)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    return value


class TrainLogger:
    """Write step records to JSONL/CSV/TensorBoard and drive the progress bar.

    ``fields`` are the CSV columns; TensorBoard scalars are ``<tag>/<key>`` (keys that already
    hold a ``/``, such as ``eval/validation/accuracy``, are kept as they are); ``postfix``
    renders a step record for the bar, ``desc`` names it (default: the tag). ``start_step`` > 0
    resumes: later records are dropped. ``lines`` (for a run without the bar, ``--no-progress``):
    a plain line on stdout per logged record instead -- a training record as ``DESC step
    N/TOTAL: POSTFIX``, an evaluation as each split's first metric -- so that a log file shows
    the run is alive (no carriage returns).
    """

    def __init__(self, out: str | os.PathLike[str], *, fields: Sequence[str], tag: str,
                 total_steps: int, postfix: Callable[[Mapping[str, Any]], str] | None = None,
                 desc: str | None = None, enabled: bool = True, start_step: int = 0,
                 tensorboard: bool = False, progress: bool = True,
                 lines: bool = False) -> None:
        self.enabled = enabled
        self.out = Path(out)
        self.fields = tuple(fields)
        self.tag = tag
        self.postfix = postfix
        self.desc = desc or tag
        self.total_steps = total_steps
        self.lines = lines and not progress
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
            except ImportError as exc:  # tensorboard is optional: say so, keep training
                _say_tensorboard_missing(str(exc).splitlines()[0] if str(exc) else "not installed")
                self._tb = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc=desc or tag, unit="step",
                             dynamic_ncols=True, mininterval=0.5)

    def _truncate(self, start_step: int) -> None:
        """Keep only records up to `start_step` (none for a fresh run)."""
        kept = [r for r in read_log(self.jsonl) if int(r.get("step", 0)) <= start_step]
        if start_step == 0:
            kept = []
        atomic_write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(r for r in kept if "loss" in r)
        atomic_write_text(self.csv, buffer.getvalue())

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one record (must hold ``step``) to every sink."""
        if not self.enabled:
            return
        clean = {k: _finite(v) for k, v in record.items()}
        with open(self.jsonl, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(clean) + "\n")
            handle.flush()
        if "loss" in clean:
            with open(self.csv, "a", encoding="utf-8", newline="") as handle:
                csv.DictWriter(handle, fieldnames=self.fields,
                               extrasaction="ignore").writerow(clean)
        if self._tb is not None:
            for key, value in clean.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key if "/" in key else f"{self.tag}/{key}", value,
                                        int(clean["step"]))
            self._tb.flush()
        if self._bar is not None and self.postfix is not None and "loss" in clean:
            self._bar.set_postfix_str(self.postfix(clean), refresh=False)
        elif self.lines:
            line = self._line(clean)
            if line is not None:
                print(line, flush=True)

    def _line(self, record: Mapping[str, Any]) -> str | None:
        """The plain progress line of a record (`lines`); None for one that is neither a
        training step nor an evaluation."""
        step = record.get("step")
        if "loss" in record:
            shown = (self.postfix(record) if self.postfix is not None
                     else f"loss {record['loss']}")
            return f"{self.desc} step {step}/{self.total_steps}: {shown}"
        firsts: dict[str, str] = {}  # split -> its first metric, as the record orders them
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "eval" and isinstance(value, (int, float)):
                firsts.setdefault(parts[1], f"{parts[1]} {parts[2]} {value:.4f}")
        if not firsts:
            return None
        return f"{self.desc} step {step}: eval {', '.join(firsts.values())}"

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
