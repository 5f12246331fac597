"""The benchmark stages of benchmarks/gpu_check.py, on the existing measuring code: a training
step (train_step.run_case), each operator per backend (ops.case) with one layer against the
naive layer of tests/baseline.py, and generation (generate.case). One process per stage; each
measurement in it releases the device's memory before the next (`StageContext.measure`).

The float32 rows run with TF32 matrix products (what a GPU user runs). MFU is the step's
FLOPs as benchmarks/train_step.py counts them (torch's counter: the blocked path's
recomputation at T >= 256 included) per second, against a bf16 matrix product measured in the
same process, for both dtypes; ``mfu_info`` the same with `folnet info`'s forward FLOPs x 3
(which count the last layer's binary operators, skipped in pretraining, and not the heads).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from gpu_stage import StageContext
from harness import count_flops, matmul_peak_gflops, median_seconds, peak_resident_mb, resident_mb

import folnet
from folnet.arch.info import model_info
from folnet.arch.layer.domain import Domain
from folnet.arch.layer.memory_modes import auto_blocks
from folnet.train.engine.memory_budget import StepMemory
from folnet.train.pretrain.config import load_pretrain_config
from folnet.train.pretrain.fit import pretraining_step_memory

GiB = 2**30
OPS = "jmc.atp"
TESTS = Path(__file__).resolve().parents[1] / "tests"  # tests/baseline.py, the naive layer
#: The card the batch sizes are chosen for (an H100's 80 GB; a larger card gets the same
#: batches, so the figures of the two compare), and the share of it a step's estimate may take.
REFERENCE_CARD = 80e9
CARD_SHARE = 0.45


def _tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def _peaks(ctx: StageContext) -> dict[str, float]:
    """bf16 and float32 (TF32) matrix-product peaks of this device, GFLOP/s."""
    n = 256 if ctx.dry_run else 8192
    return {"bf16_gflops": matmul_peak_gflops(torch.bfloat16, n=n, device=ctx.device),
            "fp32_tf32_gflops": matmul_peak_gflops(torch.float32, n=n, device=ctx.device)}


def _estimates(preset: str, seq_len: int, vocab: int, device: str) -> dict:
    """folnet's own figures for a pretraining step: the fit estimate (``memory``, a
    `StepMemory`), and from `folnet info` the parameters, the activations saved per sequence
    (``per_seq``, the layers' mode at this length) and the forward FLOPs per sequence."""
    config = load_pretrain_config(None, {"ops": OPS, "preset": preset, "seq_len": seq_len})
    memory = pretraining_step_memory(config, vocab, torch.device(device))
    with torch.device("meta"):
        model = folnet.build_model(OPS, preset=preset, head="pretraining", vocab_size=vocab)
    info = model_info(model, seq_len)
    per_seq = (info.activation_bytes_blocked if auto_blocks(seq_len, torch.device(device).type)
               else info.activation_bytes)
    return {"memory": memory, "params": info.total_params, "per_seq": per_seq,
            "flops_forward": info.flops_forward}


def _batch_for(memory: StepMemory, dry_run: bool) -> int:
    """The largest power of two up to 64 whose estimated step takes at most `CARD_SHARE` of
    the reference card."""
    if dry_run:
        return 2
    batch = 64
    while batch > 1 and memory.peak(batch) > CARD_SHARE * REFERENCE_CARD:
        batch //= 2
    return batch


def _train_case(ctx: StageContext, case: dict, peaks: dict, est: dict) -> dict:
    import train_step

    if ctx.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    row = train_step.run_case(case)
    peak = (torch.cuda.max_memory_allocated() if ctx.device == "cuda"
            else peak_resident_mb() * 2**20)  # the process's peak on a CPU
    b, fit = case["batch"], est["memory"].peak(case["batch"])
    model_gflop = 3 * est["flops_forward"] * b / 1e9
    own = peaks["bf16_gflops" if case["dtype"] == "bf16" else "fp32_tf32_gflops"]
    return {"preset": case["preset"], "T": case["seq_len"], "dtype": case["dtype"], "B": b,
            "step_s": row["step_s"], "tokens_per_s": row["tokens_per_s"],
            "model_gflop": model_gflop, "gflop": row["gflop"], "gflops": row["gflops"],
            "mfu": row["gflops"] / peaks["bf16_gflops"], "mfu_own_dtype_peak": row["gflops"] / own,
            "mfu_info": model_gflop / row["step_s"] / peaks["bf16_gflops"],
            "peak_gib": peak / GiB, "fit_gib": fit / GiB,
            "info_gib": (16 * est["params"] + est["per_seq"] * b) / GiB,
            "info_per_sequence_gib": est["per_seq"] / GiB, "peak_over_fit": peak / fit,
            "first_losses": row["first_losses"]}


def train_step_stage(ctx: StageContext) -> None:
    _tf32()
    peaks = _peaks(ctx)
    ctx.set("peaks", peaks)
    shapes = [("tiny", 16)] if ctx.dry_run else [
        ("small", 128), ("small", 512), ("base", 128), ("base", 512)]
    vocab = 300 if ctx.dry_run else 32768
    steps = {"warmup": 1, "repeats": 1} if ctx.dry_run else {"warmup": 2, "repeats": 3}
    ctx.set("settings", {"ops": OPS, "vocab": vocab, **steps, "tf32": True,
                         "batch_rule": f"largest power of 2 <= 64 with the fit estimate <= "
                                       f"{CARD_SHARE:.0%} of {REFERENCE_CARD / 1e9:.0f} GB"})
    for preset, seq_len in shapes:
        estimates = _estimates(preset, seq_len, vocab, ctx.device)
        batch = _batch_for(estimates["memory"], ctx.dry_run)
        for dtype in ("bf16", "float32"):
            case = {"impl": "ours", "ops": OPS, "dtype": dtype, "backend": "auto",
                    "allocator": "default", "ckpt": False, "compile": False, "preset": preset,
                    "vocab_size": vocab, "seq_len": seq_len, "batch": batch,
                    "device": ctx.device, "peak": peaks["bf16_gflops"], **steps}
            row = ctx.measure(f"{preset} T {seq_len} {dtype}",
                              lambda c=case, e=estimates: _train_case(ctx, c, peaks, e))
            if row is not None and "out of memory" in row.get("error", "").lower():
                half = {**case, "batch": max(1, batch // 2)}  # once, at half the batch
                ctx.measure(f"{preset} T {seq_len} {dtype} B {half['batch']}",
                            lambda c=half, e=estimates: _train_case(ctx, c, peaks, e))


def _layer_case(ctx: StageContext, impl: str, preset: str, seq_len: int, batch: int,
                repeats: int) -> dict:
    """One jmc.atp layer, forward + backward under bf16 autocast: folnet's (memory mode
    "auto" or "full") or the per-operator transcription of tests/baseline.py."""
    if str(TESTS) not in sys.path:
        sys.path.append(str(TESTS))
    from baseline import BaselineFolnet

    torch.manual_seed(0)
    model = folnet.build_model(OPS, preset=preset, L=1, vocab_size=100, dropout=0.0)
    folnet.set_memory(model, "full" if impl == "folnet full" else "auto")
    model.to(ctx.device).train()
    layer, cfg = model.encoder.layers[0], model.cfg
    g = torch.Generator(device=ctx.device).manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=ctx.device)

    u1, u2 = rand(batch, seq_len, cfg.D1), rand(batch, seq_len, seq_len, cfg.D2)  # (B,T,D1/D2)
    u1.requires_grad_(), u2.requires_grad_()
    g1, g2 = rand(*u1.shape), rand(*u2.shape)
    naive = BaselineFolnet(model) if impl == "baseline" else None

    def step() -> None:
        u1.grad = u2.grad = None
        layer.zero_grad(set_to_none=True)
        with torch.autocast(ctx.device, dtype=torch.bfloat16):
            out = (naive._layer(layer, u1, u2) if naive is not None
                   else layer(u1, u2, Domain(n=seq_len)))
        torch.autograd.backward(out, [g1.to(out[0].dtype), g2.to(out[1].dtype)])

    before = resident_mb(ctx.device)
    seconds = median_seconds(step, repeats=repeats, warmup=1, device=ctx.device)
    peak = peak_resident_mb(ctx.device) - before
    flops = count_flops(step)
    return {"impl": impl, "preset": preset, "T": seq_len, "B": batch, "ms": 1e3 * seconds,
            "gflop": flops / 1e9, "gflops": flops / seconds / 1e9, "peak_mb": peak}


def ops_stage(ctx: StageContext) -> None:
    import ops as ops_bench

    from folnet.ops.backends import BACKENDS

    _tf32()
    if ctx.dry_run:
        dims = {"D1": 64, "D2": 16, "H": 4, "S": 16, "F1": 128, "F2": 32}
        lengths, batch, repeats, layer = (16,), 2, 1, ("tiny", 1)
    else:
        dims = {"D1": 768, "D2": 64, "H": 12, "S": 64, "F1": 3072, "F2": 256}
        lengths, batch, repeats, layer = (512, 1024), 8, 3, ("base", 2)
    ctx.set("settings", {"batch": batch, "repeats": repeats, **dims, "tf32": True,
                         "layer": f"{OPS} {layer[0]} one layer, batch {layer[1]}, bf16 autocast"})
    said: set[str] = set()  # why a backend cannot run an operator, said once

    def one(symbol: str, backend: str, seq_len: int, dtype: str) -> dict | None:
        row, reason = ops_bench.case(symbol, backend, batch, seq_len, dims, ctx.device,
                                     getattr(torch, dtype), repeats)
        if row is None and f"{symbol}/{backend}: {reason}" not in said:
            said.add(f"{symbol}/{backend}: {reason}")
            ctx.append("not_run", f"{symbol}/{backend}: {reason}")
        return None if row is None else {**row, "dtype": dtype}

    for dtype in ("bfloat16",) if ctx.dry_run else ("bfloat16", "float32"):
        for seq_len in lengths:
            for symbol in "bcjmapt":
                for backend in BACKENDS:
                    ctx.measure(f"{symbol}/{backend} T {seq_len} {dtype}",
                                lambda a=(symbol, backend, seq_len, dtype): one(*a))
    for seq_len in lengths:
        for impl in ("folnet auto", "folnet full", "baseline"):
            ctx.measure(f"layer {impl} T {seq_len}", lambda i=impl, t=seq_len: _layer_case(
                ctx, i, layer[0], t, layer[1], repeats), key="layers")


class OnDevice:
    """A model for `generate.case`, which hands CPU prompts: moved to the device, and each
    generate waits for the device's queue, so that wall times are the device's."""

    def __init__(self, model, ctx: StageContext) -> None:
        self.model, self.ctx, self.cfg = model, ctx, model.cfg

    def generate(self, ids: torch.Tensor, new: int, **kw) -> object:
        out = self.model.generate(ids.to(self.ctx.device), new, **kw)
        self.ctx.sync()
        return out


def generate_stage(ctx: StageContext) -> None:
    import generate as gen

    presets = ("tiny",) if ctx.dry_run else ("tiny", "small")
    new, prompt_len = (8, 4) if ctx.dry_run else (256, 16)
    ctx.set("settings", {"ops": OPS, "kind": "decoder", "batch": 1, "prompt": prompt_len,
                         "dtype": "float32", "greedy": True})
    for preset in presets:
        def one(p=preset) -> dict:
            torch.manual_seed(0)
            model = folnet.build_model(OPS, preset=p, kind="decoder", dropout=0.0,
                                       max_positions=512).eval().to(ctx.device)
            prompt = torch.randint(0, model.cfg.vocab_size, (1, prompt_len),
                                   generator=torch.Generator().manual_seed(1))
            row = gen.case(OnDevice(model, ctx), prompt, new, budget=5.0 if ctx.dry_run
                           else 60.0, samples=5, repeats=2, static=not ctx.dry_run)
            return {"preset": p, "new_tokens": new, **row}
        ctx.measure(f"generate {preset}", one)


__all__ = ["generate_stage", "ops_stage", "train_step_stage"]
