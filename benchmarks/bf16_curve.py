"""bf16 autocast against float32: the loss curve over the first training steps.

    python benchmarks/bf16_curve.py                    # jmc.atp, small preset, 50 steps
    python benchmarks/bf16_curve.py --ops j.a --steps 100

Both runs start from the same initial weights and see the same batches and dropout masks (the
masks come from torch's default generator, seeded identically), so the two curves differ only
by bf16 rounding. The batches are learnable -- tokens with Zipf frequencies from a small part
of the vocabulary, half the sequences repeating their first segment -- so the curve falls and
the comparison covers a model that is learning, not one sitting at the uniform-prediction loss.
Reports the largest per-step relative difference |bf16 - fp32| / fp32 and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_model_args, machine, write_json
from train_step import build

from folnet.runtime import tune_cpu_allocator


def learnable_batch(batch: int, seq_len: int, vocab: int, seed: int):
    """MLM + NSP inputs with structure to learn: [CLS] x [SEP] x' [SEP], tokens drawn with
    Zipf frequencies (weight 1 / rank) from ids 5..min(vocab, 505); 15% of the positions
    masked (at most 20 per sequence); NSP label 1 when x' repeats x, 0 when it is an
    independent draw. The skewed frequencies are learnt within tens of steps, the copy later."""
    g = torch.Generator().manual_seed(seed)
    half = (seq_len - 3) // 2
    hi = min(vocab, 505)
    zipf = 1.0 / torch.arange(1, hi - 5 + 1, dtype=torch.float64)
    draw = torch.multinomial(zipf, 2 * batch * half, replacement=True, generator=g) + 5
    first, other = draw.view(2, batch, half)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    second = torch.where(nsp[:, None].bool(), first, other)
    cls, sep = torch.full((batch, 1), 2), torch.full((batch, 1), 3)
    ids = torch.cat([cls, first, sep, second, sep], dim=1)
    ids = torch.cat([ids, torch.zeros(batch, seq_len - ids.shape[1], dtype=torch.long)], 1)
    types = torch.zeros_like(ids)
    types[:, half + 2 :] = 1
    labels = torch.full_like(ids, -100)
    n = min(20, max(1, round(0.15 * seq_len)))
    for row in range(batch):
        where = torch.randperm(2 * half, generator=g)[:n]
        where = torch.where(where < half, where + 1, where + 2)  # skip [CLS] and the first [SEP]
        labels[row, where] = ids[row, where]
        ids[row, where] = 4  # [MASK]
    return ids, types, labels, nsp


def curve(ops: str, args, bf16: bool) -> list[float]:
    """Losses of ``args.steps`` AdamW steps from a fixed initialisation, on ``args.device``
    (the CPU when it names none), with ``args.model`` overrides when it has them."""
    device = torch.device(getattr(args, "device", "cpu"))
    # seeded, as pretraining runs it
    model = build("ours", ops, args, "auto", **getattr(args, "model", {})).train()
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = max(1, args.steps // 5)  # a linear warm-up over the first fifth of the steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    torch.manual_seed(1)  # the dropout masks: the same draws in both runs
    losses = []
    for step in range(args.steps):
        batch = learnable_batch(args.batch, args.seq_len, args.vocab_size, seed=step)
        ids, types, labels, nsp = (t.to(device) for t in batch)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
        out.loss.backward()
        opt.step()
        sched.step()
        losses.append(float(out.loss.detach()))
        print(f"\r  {'bf16' if bf16 else 'fp32'} step {step + 1}/{args.steps} "
              f"loss {losses[-1]:.4f}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return losses


def compare(fp32: list[float], bf16: list[float]) -> dict:
    rel = [abs(b - f) / abs(f) for f, b in zip(fp32, bf16, strict=True)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    return {"max_rel_diff": rel[worst], "worst_step": worst + 1,
            "mean_rel_diff": sum(rel) / len(rel), "fp32": fp32, "bf16": bf16}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap, ops="jmc.atp")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json", default="results/bf16_curve.json")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    tune_cpu_allocator()
    results = {}
    for ops in args.ops.split(","):
        results[ops] = compare(curve(ops, args, False), curve(ops, args, True))
        r = results[ops]
        print(f"{ops}: loss {r['fp32'][0]:.3f} -> {r['fp32'][-1]:.3f} (fp32), "
              f"{r['bf16'][0]:.3f} -> {r['bf16'][-1]:.3f} (bf16); largest per-step "
              f"difference {r['max_rel_diff']:.2%} at step {r['worst_step']}, mean "
              f"{r['mean_rel_diff']:.2%}", flush=True)
    write_json(args.json, {"machine": machine(), "args": vars(args), "results": results})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
