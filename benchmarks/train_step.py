"""Training-step benchmark: one MLM + NSP step (forward, backward, AdamW) of a FOLNet.

    python benchmarks/train_step.py                      # the issue's configuration, T = 128
    python benchmarks/train_step.py --seq-len 512 --batch 2 --impls ours,baseline
    python benchmarks/train_step.py --preset base --batch 8

Default configuration (preset "small"): D1 256, D2 32, H 4, S 64, L 4, F1 1024, F2 128, vocab
8192, delta 64, batch 8, T 128. For each operator string, precision (float32, bf16 autocast),
backend and activation-checkpointing setting it reports the median step time, tokens/s, peak
memory, FLOPs per step (torch.utils.flop_counter) and the achieved FLOP/s as a fraction of a
large float32 matrix product measured in the same run. ``--impls baseline`` adds the
straightforward per-operator implementation of benchmarks/baseline.py for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import BaselineFolnet
from harness import (
    count_flops,
    machine,
    matmul_peak_gflops,
    median_seconds,
    peak_memory_mb,
    table,
    write_json,
)

import folnet

#: The released implementation's figures for the default configuration on this kind of machine
#: (2 CPU cores), from the performance issue: seconds per step and GFLOP per step.
RELEASED = {"jmc.atp": {"float32": 1.78, "bf16": 1.03, "gflop": 104.0},
            "j.a": {"float32": 0.90, "gflop": 58.0}}


def make_batch(batch: int, seq_len: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq_len), generator=g)
    ids[:, 0] = 2
    types = torch.zeros_like(ids)
    types[:, seq_len // 2 :] = 1
    labels = torch.full_like(ids, -100)
    for row in range(batch):  # 15% of the tokens, at most 20 per sequence, as in pretraining
        n = min(20, max(1, round(0.15 * seq_len)))
        where = torch.randperm(seq_len - 1, generator=g)[:n] + 1
        labels[row, where] = ids[row, where]
    nsp = torch.randint(0, 2, (batch,), generator=g)
    return ids, types, labels, nsp


def build(impl: str, ops: str, args, backend: str):
    torch.manual_seed(0)
    model = folnet.build_model(ops, preset=args.preset, head="pretraining",
                               vocab_size=args.vocab_size, backend=backend)
    if impl == "baseline":
        return BaselineFolnet(model)
    model.gather_mlm = True
    return model


def run_case(impl, ops, dtype_name, backend, ckpt, args, peak):
    model = build(impl, ops, args, backend).train()
    if ckpt and hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, types, labels, nsp = make_batch(args.batch, args.seq_len, args.vocab_size)
    autocast = torch.autocast("cpu" if args.device == "cpu" else "cuda", dtype=torch.bfloat16,
                              enabled=dtype_name == "bf16")
    model.to(args.device)
    ids, types, labels, nsp = (t.to(args.device) for t in (ids, types, labels, nsp))

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            out = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
        out.loss.backward()
        opt.step()
        return out.loss

    seconds = median_seconds(step, repeats=args.repeats, warmup=2, device=args.device)
    flops = count_flops(step)
    mem = peak_memory_mb(step, args.device)
    tokens = args.batch * args.seq_len
    row = {"impl": impl, "ops": ops, "dtype": dtype_name, "backend": backend,
           "ckpt": "on" if ckpt else "off", "T": args.seq_len, "B": args.batch,
           "step_s": seconds, "tokens_per_s": tokens / seconds, "gflop": flops / 1e9,
           "gflops": flops / seconds / 1e9, "peak_frac": flops / seconds / 1e9 / peak,
           "peak_mb": mem}
    ref = RELEASED.get(ops)
    if ref and args.preset == "small" and args.seq_len == 128 and args.batch == 8:
        # the released step's FLOPs over our time: the rate a like-for-like comparison implies
        row["vs_released"] = ref["float32"] / seconds
        row["released_equiv_frac"] = ref["gflop"] / seconds / peak
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="j.a,jmc.atp")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtypes", default="float32,bf16")
    ap.add_argument("--backends", default="auto")
    ap.add_argument("--checkpointing", default="off", help="off, on or off,on")
    ap.add_argument("--impls", default="ours")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default="results/train_step.json")
    args = ap.parse_args(argv)
    peak = matmul_peak_gflops(torch.float32, device=args.device)
    print(f"float32 matrix-product peak: {peak:.1f} GFLOP/s on {args.device}", flush=True)
    rows = []
    for impl in args.impls.split(","):
        for ops in args.ops.split(","):
            for dtype_name in args.dtypes.split(","):
                for backend in args.backends.split(","):
                    for ckpt in [c == "on" for c in args.checkpointing.split(",")]:
                        if impl == "baseline" and (backend != args.backends.split(",")[0]
                                                   or ckpt):
                            continue
                        row = run_case(impl, ops, dtype_name, backend, ckpt, args, peak)
                        rows.append(row)
                        print(f"  {impl:8s} {ops:8s} {dtype_name:7s} {backend:6s} "
                              f"ckpt={row['ckpt']:3s} {row['step_s']:.3f} s "
                              f"{row['tokens_per_s']:7.0f} tok/s {row['peak_frac']:.0%} of peak "
                              f"{row['peak_mb']:7.0f} MiB", flush=True)
    cols = [("impl", "impl", ""), ("ops", "ops", ""), ("dtype", "dtype", ""),
            ("backend", "backend", ""), ("ckpt", "ckpt", ""), ("step_s", "step s", ".3f"),
            ("tokens_per_s", "tokens/s", ".0f"), ("gflop", "GFLOP/step", ".1f"),
            ("gflops", "GFLOP/s", ".1f"), ("peak_frac", "of peak", ".0%"),
            ("peak_mb", "peak MiB", ".0f")]
    if any("vs_released" in r for r in rows):
        for r in rows:
            r.setdefault("vs_released", float("nan"))
            r.setdefault("released_equiv_frac", float("nan"))
        cols += [("vs_released", "x released", ".2f"),
                 ("released_equiv_frac", "released-FLOP rate", ".0%")]
    print()
    print(f"batch {args.batch}, T {args.seq_len}, preset {args.preset}; matmul peak "
          f"{peak:.1f} GFLOP/s")
    print(table(rows, cols))
    write_json(args.json, {"machine": machine(), "args": vars(args), "matmul_peak_gflops": peak,
                           "released_reference": RELEASED, "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
