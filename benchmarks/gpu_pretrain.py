"""The pretraining stage of benchmarks/gpu_check.py: the bundled kinship-tiny run (tiny preset
on the generated kinship corpus, no files, no dropout) for 200 steps in fp32, then in bf16,
through folnet's Python API (`folnet pretrain` declares ``datasets`` a requirement; the kinship
corpus needs neither it nor ``zstandard``).

Both runs see the same tokenizer (the bf16 run reuses the fp32 run's), the same data order and
masks (one seed), so their loss curves differ by bf16 rounding alone. Reported: each run's
first and last loss and speed, and the curves' largest per-step relative difference against
the bound of tests/train/test_bf16_curve.py (2%), plus the same over 10-step means.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bf16_curve import compare
from gpu_stage import StageContext

#: tests/train/test_bf16_curve.py's bound on the per-step relative difference of the curves.
BF16_CURVE_BOUND = 0.02
WINDOW = 10


def _run(ctx: StageContext, root: Path, precision: str, steps: int) -> dict:
    from folnet.train.engine.runlog import read_log
    from folnet.train.pretrain.config import load_pretrain_config
    from folnet.train.pretrain.loop import pretrain

    overrides = {"steps": steps, "log_every": 1, "save_every": steps, "keep_last": 1,
                 "progress": False, "tensorboard": False, "precision": precision,
                 "device": ctx.device, "out": str(root / precision)}
    if ctx.dry_run:
        overrides["kinship_documents"] = 100
    if (root / "fp32" / "tokenizer").is_dir():
        overrides["tokenizer"] = str(root / "fp32" / "tokenizer")
    config = load_pretrain_config("kinship-tiny", overrides)
    start = time.time()
    pretrain(config)
    seconds = time.time() - start
    log = read_log(root / precision / "log.jsonl")
    losses = [r["loss"] for r in log]
    speeds = [r["tokens_per_s"] for r in log[1:]] or [log[0]["tokens_per_s"]]
    head, tail = losses[: min(WINDOW, len(losses))], losses[-min(WINDOW, len(losses)):]
    return {"precision": precision, "steps": len(losses), "first_loss": losses[0],
            "last_loss": losses[-1], "first_mean": sum(head) / len(head),
            "last_mean": sum(tail) / len(tail), "loss_falls": sum(tail) < sum(head),
            "seconds": seconds, "tokens_per_s": sorted(speeds)[len(speeds) // 2],
            "settings": {k: v for k, v in config.to_dict().items()
                         if k in ("ops", "preset", "model", "seq_len", "batch_size", "lr",
                                  "optimizer", "grad_accum")},
            "losses": losses}


def _windowed(values: list[float]) -> list[float]:
    return [sum(values[i:i + WINDOW]) / len(values[i:i + WINDOW])
            for i in range(0, len(values), WINDOW)]


def pretrain_stage(ctx: StageContext) -> None:
    steps = 3 if ctx.dry_run else 200
    runs = {}
    with tempfile.TemporaryDirectory(prefix="folnet-gpu-pretrain-") as tmp:
        for precision in ("fp32", "bf16"):
            row = ctx.measure(f"pretrain {precision}",
                              lambda p=precision: _run(ctx, Path(tmp), p, steps), key="runs")
            if row is not None and "losses" in row:
                runs[precision] = row["losses"]
    if len(runs) < 2:
        return
    per_step = compare(runs["fp32"], runs["bf16"])
    windows = compare(_windowed(runs["fp32"]), _windowed(runs["bf16"]))
    ctx.set("comparison", {
        "max_rel_diff": per_step["max_rel_diff"], "worst_step": per_step["worst_step"],
        "mean_rel_diff": per_step["mean_rel_diff"], "bound": BF16_CURVE_BOUND,
        "within_bound": per_step["max_rel_diff"] <= BF16_CURVE_BOUND,
        f"max_rel_diff_{WINDOW}_step_means": windows["max_rel_diff"]})


__all__ = ["pretrain_stage"]
