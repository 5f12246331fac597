"""Shared measuring tools for the benchmarks: median wall time, peak memory, FLOPs, peak rate.

Peak memory on CPU is the process's peak resident set (VmHWM) above the level before the
measured work, so each configuration runs in a fresh process (the benchmarks spawn one per
case); on CUDA it is ``torch.cuda.max_memory_allocated``. FLOPs come from
``torch.utils.flop_counter``. The CPU allocator is tuned (`folnet.runtime`) as the CLI does.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def resident_mb(device: str = "cpu") -> float:
    """Memory in use now: resident set on CPU, allocated bytes on CUDA (MiB)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    return _status("VmRSS") / 2**20


def peak_resident_mb(device: str = "cpu") -> float:
    """The peak since the process started (CPU) or since `resident_mb` (CUDA), in MiB."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return _status("VmHWM") / 2**20


def timed(fn: Callable[[], object], device: str = "cpu") -> float:
    """Wall time of one ``fn()``, with the device's queue drained before and after."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
                   device: str = "cpu") -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, device) for _ in range(repeats))


def count_flops(fn: Callable[[], object]) -> int:
    """Total FLOPs (multiply-add = 2) of ``fn()`` as torch's flop counter sees them."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


#: Operators that are matrix products (what torch.utils.flop_counter counts), by profiler name.
GEMM_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::addmm_", "aten::baddbmm",
                      "aten::baddbmm_", "aten::addbmm", "aten::matmul", "aten::linear",
                      "mkldnn::_linear_pointwise", "aten::_convolution"})


def time_breakdown(fn: Callable[[], object], top: int = 8) -> dict[str, object]:
    """Where ``fn()``'s time goes: the share of the profiled self time spent in matrix
    products, and the operators with the largest shares. (The profiler adds a little time to
    every operator call, so the many small elementwise calls read slightly high.)"""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return {"gemm_share": gemm / total,
            "top": [(e.key, e.self_cpu_time_total / total) for e in events[:top]]}


def matmul_peak_gflops(dtype: torch.dtype = torch.float32, n: int = 2048, device: str = "cpu",
                       repeats: int = 5, trials: int = 3) -> float:
    """The rate (GFLOP/s) of a large square matrix product: the machine's practical peak, the
    best of ``trials`` medians (on a shared machine the best is the least disturbed)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = min(median_seconds(lambda: a @ b, repeats=repeats, warmup=2, device=device)
                  for _ in range(trials))
    return 2 * n**3 / seconds / 1e9


def paired_peak_runs(fn: Callable[[], object], n: int = 2048, dtype: torch.dtype = torch.float32,
                     device: str = "cpu", repeats: int = 5) -> list[tuple[float, float]]:
    """``(seconds, peak GFLOP/s)`` for each of ``repeats`` runs of ``fn()``, the peak measured
    right before and right after that run (the better of the two, each the better of two
    n x n products). On a shared machine the load changes from one second to the next; a run
    compared with the peak of its own moment gives a fraction of the peak that the load
    moves much less than a start-of-run peak does."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def probe() -> float:
        return 2 * n**3 / min(timed(lambda: a @ b, device), timed(lambda: a @ b, device)) / 1e9

    probe()  # warm
    rates = [probe()]
    runs = []
    for _ in range(repeats):
        seconds = timed(fn, device)
        rates.append(probe())
        runs.append((seconds, max(rates[-2], rates[-1])))
    return runs


def add_model_args(ap, ops: str) -> None:
    """The flags every training benchmark shares: operator strings, preset and the shape of
    the batch (defaults: the performance issue's configuration)."""
    ap.add_argument("--ops", default=ops, help="comma-separated operator strings")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)


def _cpu_model() -> str | None:
    """The CPU's model name (Linux), for the figures' "which machine"."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> dict[str, object]:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Render rows as a markdown table; columns are (key, header, format)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---:" if f else "---" for _, _, f in columns) + "|"
    body = ["| " + " | ".join(format(r[k], f) if f else str(r[k]) for k, _, f in columns) + " |"
            for r in rows]
    return "\n".join([head, rule, *body])


def other_checkout(path: str | Path, prog: str) -> Path:
    """The checkout ``--against`` names, resolved. One that holds no folnet package (a typo,
    a worktree not made yet) ends the script with one line, not a traceback from the process
    that would have run it."""
    root = Path(path).resolve()
    if not (root / "folnet" / "__init__.py").is_file():
        raise SystemExit(f"{prog}: error: --against {str(root)!r} holds no folnet package "
                         f"(make one with: git worktree add {root} HEAD)")
    return root
