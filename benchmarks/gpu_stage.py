"""What a stage of benchmarks/gpu_check.py runs with: its device, its deadline, and the events
it hands the report (one JSON line each, appended to the rows file as each result is made)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch


class StageContext:
    """A stage's settings and its channel to the report."""

    def __init__(self, rows: str, settings: dict[str, Any]) -> None:
        self.rows = rows
        self.dry_run = bool(settings.get("dry_run"))
        self.deadline = float(settings["deadline"])
        self.device = "cuda" if torch.cuda.is_available() and not self.dry_run else "cpu"
        self.longest = 0.0  # the longest measurement so far, the guess for the next

    def _emit(self, event: dict) -> None:
        with open(self.rows, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event, default=_plain) + "\n")

    def append(self, key: str, value: Any) -> None:
        self._emit({"op": "append", "key": key, "value": value})

    def set(self, key: str, value: Any) -> None:
        self._emit({"op": "set", "key": key, "value": value})

    def left(self) -> float:
        return self.deadline - time.time()

    def measure(self, what: str, fn: Callable[[], dict | None], key: str = "rows",
                guess: float | None = None) -> dict | None:
        """``fn()``'s row appended under ``key`` -- or, when the time left is under 1.5x the
        longest measurement so far (or ``guess``), "WHAT: skipped: out of time" under
        "skipped"; an exception becomes a row with its "error" (the stage goes on). The
        device's memory is released after each measurement."""
        need = 1.5 * max(self.longest, guess or 0.0)
        if self.left() < need:
            self.append("skipped", f"{what}: skipped: out of time")
            return None
        start = time.time()
        try:
            row = fn()
        except Exception as exc:  # an OOM or a kernel's refusal: recorded, the stage goes on
            row = {"what": what, "error": f"{type(exc).__name__}: {str(exc).strip()[:400]}"}
        finally:
            self.release()
        self.longest = max(self.longest, time.time() - start)
        if row is not None:
            row.setdefault("seconds_total", round(time.time() - start, 2))
            self.append(key, row)
        return row

    def release(self) -> None:
        import gc

        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def _plain(value: Any) -> Any:
    """JSON for what json cannot write itself (tensors, dtypes, paths)."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)
