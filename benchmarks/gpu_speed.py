"""The speed stage of benchmarks/gpu_check.py: what the step launches and how fast it runs,
eager and compiled, beside BERT of the same size, up to the largest batch that fits.

* ``census``: benchmarks/step_census.py on the device itself (ATen launches and host syncs
  per step, by phase) and, from torch's profiler, the CUDA kernels one step really launched,
  folnet's and BertForPreTraining's, tiny to base;
* ``steps``: folnet's pretraining step (`folnet.train.pretrain.loop.train_step`, AdamW) eager,
  compiled (``--compile``) and compiled with CUDA graphs (``--compile-mode reduce-overhead``),
  beside BERT eager and compiled, at small T 128 B 64 and base T 512 bf16: step time, tokens/s
  and MFU (the step's FLOPs, torch's counter, per second against a bf16 matrix product
  measured in the same process);
* ``largest batch``: base T 512 bf16, the batch doubled from the fit estimate's until the
  step no longer fits, with its step time and MFU, and the fit estimate beside the measured
  peak.

The dry run takes the tiny preset at toy sizes on the CPU, compiles with aot_eager (inductor's
trace without code generation) and leaves CUDA graphs out, saying so.
"""

from __future__ import annotations

import statistics
import time

import torch
from gpu_stage import StageContext
from harness import count_flops, matmul_peak_gflops
from step_census import census
from steps import bert_step, folnet_step

GiB = 2**30


def _kernels(run, device: str) -> int | None:
    """CUDA kernels one call of ``run`` launches (torch's profiler); None off CUDA."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def census_rows(ctx: StageContext) -> None:
    presets = ("tiny",) if ctx.dry_run else ("tiny", "small", "base")
    for preset in presets:
        def one(p=preset) -> dict:
            row = {"preset": p, "device": ctx.device}
            for name, make in (("folnet", folnet_step), ("bert", bert_step)):
                step = make(p, path="cuda", device=ctx.device)
                record = census(step)
                row[name] = {"launches": record.launches(), "syncs": len(record.syncs),
                             "by_phase": dict(record.by(0)),
                             "kernels": _kernels(step.run, ctx.device)}
            row["launch_ratio"] = row["folnet"]["launches"] / row["bert"]["launches"]
            if row["folnet"]["kernels"]:
                row["kernel_ratio"] = row["folnet"]["kernels"] / row["bert"]["kernels"]
            return row
        ctx.measure(f"census {preset}", one, key="census")


def _timed(ctx: StageContext, run, steps: int) -> float:
    ctx.sync()
    start = time.perf_counter()
    for _ in range(steps):
        run()
    ctx.sync()
    return (time.perf_counter() - start) / steps


def _step_row(ctx: StageContext, which: str, mode: str | None, preset: str, seq_len: int,
              batch: int, precision: str, peak: float, steps: int,
              flops: float | None = None) -> dict:
    """One side's step: built, its first call (a compile's) timed apart, then ``steps``; its
    FLOPs counted on an eager step (``flops``: given, a compiled step's are its eager one's)."""
    backend = "aot_eager" if ctx.dry_run else "inductor"
    kw = {"path": "cuda", "device": ctx.device, "batch": batch, "seq_len": seq_len,
          "precision": precision}
    if which == "folnet":
        step = folnet_step(preset, optimizer="adamw", compile_mode=mode,
                           compile_backend=backend, **kw)
    else:
        step = bert_step(preset, compile_mode=mode, compile_backend=backend, **kw)
    if ctx.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step.run()
    ctx.sync()
    first = time.perf_counter() - start
    step.run()  # (a second warm step: CUDA graphs record on the first replay)
    seconds = statistics.median(_timed(ctx, step.run, max(1, steps // 3)) for _ in range(3))
    row = {"model": which, "mode": mode or "eager", "preset": preset, "T": seq_len,
           "B": batch, "precision": precision, "step_ms": 1e3 * seconds,
           "tokens_per_s": batch * seq_len / seconds, "first_step_s": first}
    if ctx.device == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated() / GiB
        # the CUDA kernels of one step as torch's profiler sees them, compiled or not (under
        # CUDA graphs the host launches one graph for them)
        row["kernels"] = _kernels(step.run, ctx.device)
    if flops is None and mode is None:
        flops = count_flops(step.run)
    if flops is not None:
        row.update(gflop=flops / 1e9, mfu=flops / seconds / 1e9 / peak)
    return row


def steps_rows(ctx: StageContext, peak: float) -> None:
    if ctx.dry_run:
        shapes, steps = [("tiny", 16, 2, "fp32")], 2
    else:
        shapes, steps = [("small", 128, 64, "fp32"), ("base", 512, 8, "bf16")], 9
    modes = [None, "default"] + ([] if ctx.device != "cuda" else ["reduce-overhead"])
    if ctx.device != "cuda":
        ctx.append("not_run", "reduce-overhead (CUDA graphs): CUDA only")
    for preset, seq_len, batch, precision in shapes:
        for which in ("folnet", "bert"):
            flops = None
            for mode in modes:
                row = ctx.measure(
                    f"{which} {mode or 'eager'} {preset} T {seq_len} B {batch}",
                    lambda w=which, m=mode, f=flops, a=(preset, seq_len, batch, precision):
                    _step_row(ctx, w, m, *a, peak, steps, f), key="steps")
                if row is not None and "gflop" in row:
                    flops = row["gflop"] * 1e9


def largest_batch(ctx: StageContext, peak: float) -> None:
    """Double the batch from the fit estimate's until a step no longer fits."""
    from gpu_bench import _batch_for, _estimates

    preset, seq_len = ("tiny", 16) if ctx.dry_run else ("base", 512)
    vocab = 300 if ctx.dry_run else 32768
    est = _estimates(preset, seq_len, vocab, ctx.device)
    batch = _batch_for(est["memory"], ctx.dry_run)
    ceiling = 4 if ctx.dry_run else 256
    best = None
    while batch <= ceiling:
        row = ctx.measure(f"base T {seq_len} bf16 B {batch}", lambda b=batch: {
            **_step_row(ctx, "folnet", None, preset, seq_len, b, "bf16", peak, 3),
            "fit_gib": est["memory"].peak(b) / GiB}, key="largest")
        if row is None or "error" in row:
            break
        best = row
        batch *= 2
    ctx.set("largest_batch", None if best is None else best["B"])


def speed_stage(ctx: StageContext) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = matmul_peak_gflops(torch.bfloat16, n=256 if ctx.dry_run else 8192,
                              device=ctx.device)
    ctx.set("bf16_peak_gflops", peak)
    census_rows(ctx)
    steps_rows(ctx, peak)
    largest_batch(ctx, peak)


__all__ = ["speed_stage"]
