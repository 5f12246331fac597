"""Training-step benchmark: one MLM + NSP step (forward, backward, AdamW) of a FOLNet.

    python benchmarks/train_step.py                      # the issue's configuration, T = 128
    python benchmarks/train_step.py --seq-len 512 --batch 2 --impls ours,baseline
    python benchmarks/train_step.py --preset base --batch 8
    python benchmarks/train_step.py --breakdown          # + the GEMMs' time share and rate
    python benchmarks/train_step.py --compile off,on     # + torch.compile of the encoder
    python benchmarks/train_step.py --against /tmp/before --rounds 3   # A/B against a checkout

Default configuration (preset "small"): D1 256, D2 32, H 4, S 64, L 4, F1 1024, F2 128, vocab
8192, delta 64, batch 8, T 128. For each operator string, precision (float32, bf16 autocast),
backend and activation-checkpointing setting it reports the median step time, tokens/s, peak
memory, FLOPs per step (torch.utils.flop_counter) and the achieved FLOP/s as a fraction of a
large float32 matrix product measured in the same run (bf16 rows also against a bf16 product,
the yardstick for GPUs). ``--impls baseline`` adds the
straightforward per-operator implementation of tests/baseline.py for comparison.
``--against DIR`` measures this tree ("ours") against the folnet package of another checkout
("before", e.g. ``git worktree add /tmp/before HEAD~1``): each configuration (operators, dtype,
activation checkpointing) runs ``--rounds`` times for each side, the sides alternating (and
swapping who goes first) round by round, and the table gives each side's median step and the
median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    add_model_args,
    count_flops,
    machine,
    matmul_peak_gflops,
    median_seconds,
    other_checkout,
    paired_peak_runs,
    peak_resident_mb,
    resident_mb,
    table,
    time_breakdown,
    write_json,
)

import folnet
from folnet.runtime import tune_cpu_allocator

#: The released implementation's figures for the default configuration on this kind of machine
#: (2 CPU cores), from the performance issue: seconds per step and GFLOP per step.
RELEASED = {"jmc.atp": {"float32": 1.78, "bf16": 1.03, "gflop": 104.0},
            "j.a": {"float32": 0.90, "gflop": 58.0}}
#: ... which was 33% of the 179 GFLOP/s a large float32 matrix product reached there. Machines
#: differ, so comparisons go through this fraction of the peak measured in the same run.
RELEASED_PEAK_FRAC = 104.0 / 1.78 / 179.0


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


def training_step(model, args, dtype: str):
    """One MLM + NSP step with AdamW on the benchmark's batch; returns the loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = [t.to(args.device) for t in make_batch(args.batch, args.seq_len, args.vocab_size)]
    ids, types, labels, nsp = batch
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with autocast:
            out = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
        out.loss.backward()
        opt.step()
        return float(out.loss.detach())

    return step


def build(impl: str, ops: str, args, backend: str, **overrides):
    """The benchmark's seeded model (``overrides``: model fields, e.g. dropout=0.0)."""
    torch.manual_seed(0)
    model = folnet.build_model(ops, preset=args.preset, head="pretraining",
                               vocab_size=args.vocab_size, backend=backend, **overrides)
    if impl == "baseline":
        # the per-operator oracle lives with the tests (imported here: a "before" checkout
        # need not run it)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from baseline import BaselineFolnet

        return BaselineFolnet(model)
    model.gather_mlm = 20  # as pretraining runs it (max_predictions; a flag before the slots)
    model.relations = False
    return model


def run_case(case: dict) -> dict:
    """One configuration, measured in this (fresh) process: time, FLOPs, peak memory."""
    if case["allocator"] == "tuned":
        tune_cpu_allocator()
    torch.manual_seed(0)
    args = argparse.Namespace(**case)
    model = build(case["impl"], case["ops"], args, case["backend"]).train()
    if case["ckpt"] and hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(True)
    if case.get("compile"):
        model.encoder.compile()  # as `folnet pretrain --compile` does
    model.to(args.device)
    step = training_step(model, args, case["dtype"])

    before = resident_mb(args.device)
    losses = [step() for _ in range(args.warmup)]
    seconds = median_seconds(step, repeats=args.repeats, warmup=0, device=args.device)
    peak = peak_resident_mb(args.device) - before
    flops = count_flops(step)
    tokens = args.batch * args.seq_len
    row = {**{k: case[k] for k in ("impl", "ops", "dtype", "backend", "allocator")},
           "ckpt": "on" if case["ckpt"] else "off",
           "compile": "on" if case.get("compile") else "off", "T": args.seq_len, "B": args.batch,
           "step_s": seconds, "tokens_per_s": tokens / seconds, "gflop": flops / 1e9,
           "gflops": flops / seconds / 1e9, "peak_frac": flops / seconds / 1e9 / case["peak"],
           "peak_mb": peak, "first_losses": losses, "folnet": str(Path(folnet.__file__).parent)}
    if case.get("breakdown"):
        # nearly all counted FLOPs are matrix products, so this is their achieved rate; it
        # bounds what removing every other operator could give
        split = time_breakdown(step)
        row["gemm_share"] = split["gemm_share"]
        row["gemm_frac_of_peak"] = flops / (seconds * split["gemm_share"]) / 1e9 / case["peak"]
        row["top_ops"] = split["top"]
    runs = []
    if case.get("paired_peak", False):
        runs = paired_peak_runs(step, n=case["probe_n"], device=args.device,
                                repeats=args.repeats)
        row["paired_peak_frac"] = statistics.median(flops / s / 1e9 / p for s, p in runs)
        row["paired_peak_gflops"] = statistics.median(p for _, p in runs)
        row["paired_runs"] = [[s, p] for s, p in runs]  # (step seconds, peak GFLOP/s) pairs
    ref = RELEASED.get(case["ops"])
    if ref and args.preset == "small" and args.seq_len == 128 and args.batch == 8:
        # the released step's FLOPs over our time, as a fraction of this machine's peak: the
        # released code reached 33% of its machine's peak in float32
        row["released_equiv_frac"] = ref["gflop"] / seconds / case["peak"]
        row["vs_released"] = row["released_equiv_frac"] / RELEASED_PEAK_FRAC
        if runs:
            row["vs_released_paired"] = statistics.median(
                ref["gflop"] / s / p / RELEASED_PEAK_FRAC for s, p in runs)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap, ops="j.a,jmc.atp")
    ap.add_argument("--dtypes", default="float32,bf16")
    ap.add_argument("--backends", default="auto")
    ap.add_argument("--checkpointing", default="off", help="off, on or off,on")
    ap.add_argument("--compile", default="off",
                    help="off, on or off,on: torch.compile the encoder (the first warm-up step "
                         "compiles; ours only)")
    ap.add_argument("--impls", default="ours")
    ap.add_argument("--against", default=None,
                    help="a checkout of the code before (its folnet package is imported by the "
                         "'before' cases): an A/B run, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of an --against run")
    ap.add_argument("--allocator", default="tuned", help="tuned, default or tuned,default")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--paired-peak", action=argparse.BooleanOptionalAction, default=True,
                    help="also time --repeats steps each between two peak measurements and "
                         "report the fraction of the peak of the step's own moment")
    ap.add_argument("--breakdown", action="store_true",
                    help="profile one step: time share and rate of the matrix products")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--peak-size", type=int, default=None,
                    help="side of the square products that measure the peak (default 2048 on "
                         "CPU, 8192 on CUDA)")
    ap.add_argument("--json", default="results/train_step.json")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = ap.parse_args(argv)
    if args.case:
        print("CASE " + json.dumps(run_case(json.loads(args.case))), flush=True)
        return 0
    size = args.peak_size if args.peak_size is not None else (
        8192 if args.device.startswith("cuda") else 2048)
    if size < 1:
        ap.error(f"--peak-size must be >= 1, got {size}")
    if args.against is not None:  # before any measuring
        args.against = str(other_checkout(args.against, "train_step.py"))
    peak = matmul_peak_gflops(torch.float32, n=size, device=args.device)
    if args.against is not None:
        print(f"matrix-product peak on {args.device}: float32 {peak:.1f} GFLOP/s", flush=True)
        return _ab(args, peak, size)
    bf16_peak = matmul_peak_gflops(torch.bfloat16, n=size, device=args.device)
    print(f"matrix-product peak on {args.device}: float32 {peak:.1f} GFLOP/s, bf16 "
          f"{bf16_peak:.1f}", flush=True)
    rows = []
    for impl, ops, dtype_name, backend, ckpt, alloc, comp in itertools.product(
            args.impls.split(","), args.ops.split(","), args.dtypes.split(","),
            args.backends.split(","), [c == "on" for c in args.checkpointing.split(",")],
            args.allocator.split(","), [c == "on" for c in args.compile.split(",")]):
        if impl == "baseline" and (backend != args.backends.split(",")[0] or ckpt or comp):
            continue
        case = {**vars(args), "impl": impl, "ops": ops, "dtype": dtype_name, "backend": backend,
                "ckpt": ckpt, "allocator": alloc, "compile": comp, "peak": peak,
                "probe_n": size, "case": None}
        row = _spawn(case)
        rows.append(row)
        print(f"  {impl:8s} {ops:8s} {dtype_name:7s} {backend:6s} ckpt={row['ckpt']:3s} "
              f"compile={row['compile']:3s} {alloc:7s} {row['step_s']:.3f} s "
              f"{row['tokens_per_s']:7.0f} tok/s "
              f"{row['peak_frac']:.0%} of peak {row['peak_mb']:7.0f} MiB", flush=True)
    # the peak again at the end: on a shared machine one measurement can catch a busy moment
    # and flatter every ratio, so the larger of the two is the reference
    end_peak = matmul_peak_gflops(torch.float32, n=size, device=args.device)
    if end_peak > peak:
        for r in rows:
            for key in ("peak_frac", "gemm_frac_of_peak", "released_equiv_frac", "vs_released"):
                if key in r:
                    r[key] *= peak / end_peak
    bf16_peak = max(bf16_peak, matmul_peak_gflops(torch.bfloat16, n=size, device=args.device))
    print(f"matrix-product peak at the end: float32 {end_peak:.1f} GFLOP/s", flush=True)
    peak = max(peak, end_peak)
    for r in rows:  # bf16 rows against what a bf16 product reaches (the GPU figure's yardstick)
        r["bf16_peak_frac"] = r["gflops"] / bf16_peak if r["dtype"] == "bf16" else float("nan")
    cols = [("impl", "impl", ""), ("ops", "ops", ""), ("dtype", "dtype", ""),
            ("backend", "backend", ""), ("ckpt", "ckpt", ""), ("compile", "compile", ""),
            ("allocator", "allocator", ""),
            ("step_s", "step s", ".3f"), ("tokens_per_s", "tokens/s", ".0f"),
            ("gflop", "GFLOP/step", ".1f"), ("gflops", "GFLOP/s", ".1f"),
            ("peak_frac", "of peak", ".0%"), ("bf16_peak_frac", "of bf16 peak", ".0%"),
            ("peak_mb", "peak MiB", ".0f")]
    if args.breakdown:
        cols += [("gemm_share", "GEMM time share", ".0%"),
                 ("gemm_frac_of_peak", "GEMM rate / peak", ".0%")]
    if args.paired_peak:
        cols += [("paired_peak_frac", "of own-moment peak", ".0%")]
    if any("vs_released" in r for r in rows):
        for r in rows:
            for key in ("vs_released", "released_equiv_frac", "vs_released_paired"):
                r.setdefault(key, float("nan"))
        cols += [("released_equiv_frac", "released FLOPs / time / peak", ".0%"),
                 ("vs_released", "x released (estimate)", ".2f")]
        if args.paired_peak:
            cols += [("vs_released_paired", "x released (estimate, own-moment peak)", ".2f")]
    print()
    print(f"batch {args.batch}, T {args.seq_len}, preset {args.preset}; matmul peak float32 "
          f"{peak:.1f} GFLOP/s, bf16 {bf16_peak:.1f}; each row measured in its own process")
    print(table(rows, cols))
    if any("vs_released" in r for r in rows):
        print("\nx released is an ESTIMATE, not a side-by-side measurement: the released code's "
              "step was timed once on another 2-core CPU (jmc.atp 1.78 s float32, 1.03 s bf16; "
              "33% of that machine's float32 peak) and is scaled here by this machine's "
              "measured peak. On a machine of another kind (AMX, AVX-512, a GPU) time the "
              "released code beside ours instead.")
    write_json(args.json, {"machine": machine(), "args": vars(args), "matmul_peak_gflops": peak,
                           "bf16_matmul_peak_gflops": bf16_peak,
                           "released_reference": RELEASED, "rows": rows})
    print(f"wrote {args.json}")
    return 0


def _ab(args, peak: float, size: int) -> int:
    """This tree against ``--against``, alternating; one row per side and configuration."""
    before = Path(args.against)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    rows = []
    for ops, dtype_name, ckpt in itertools.product(
            args.ops.split(","), args.dtypes.split(","),
            [c == "on" for c in args.checkpointing.split(",")]):
        steps: dict[str, list[dict]] = {"ours": [], "before": []}
        for r in range(args.rounds):
            for side in (("ours", "before") if r % 2 == 0 else ("before", "ours")):
                case = {**vars(args), "impl": "ours", "ops": ops, "dtype": dtype_name,
                        "backend": args.backends.split(",")[0], "ckpt": ckpt,
                        "allocator": "tuned", "compile": False, "peak": peak, "probe_n": size,
                        "case": None, "paired_peak": False, "breakdown": False}
                row = _spawn(case, pythonpath=str(before) if side == "before" else None)
                steps[side].append(row)
                print(f"  round {r + 1} {side:6s} {ops:8s} {dtype_name:7s} ckpt={ckpt!s:5s} "
                      f"{row['step_s']:.3f} s {row['peak_mb']:7.0f} MiB  ({row['folnet']})",
                      flush=True)
        ratios = [b["step_s"] / o["step_s"] for o, b in zip(steps["ours"], steps["before"],
                                                             strict=True)]
        for side, runs in steps.items():
            rows.append({"side": side, "ops": ops, "dtype": dtype_name,
                         "checkpointing": "on" if ckpt else "off",
                         "step_s": statistics.median(r["step_s"] for r in runs),
                         "peak_mb": statistics.median(r["peak_mb"] for r in runs),
                         "gflop": runs[0]["gflop"], "rounds": [r["step_s"] for r in runs],
                         "before_over_ours": statistics.median(ratios)})
    print()
    print(f"ours = {Path(__file__).resolve().parent.parent}, before = {before}; batch "
          f"{args.batch}, T {args.seq_len}, preset {args.preset}, {args.rounds} rounds "
          f"alternating, each case in its own process")
    print(table(rows, [("side", "side", ""), ("ops", "ops", ""), ("dtype", "dtype", ""),
                       ("checkpointing", "checkpointing", ""),
                       ("step_s", "median step s", ".3f"), ("peak_mb", "peak MiB", ".0f"),
                       ("gflop", "GFLOP/step", ".1f"),
                       ("before_over_ours", "before / ours (median of rounds)", ".3f")]))
    write_json(args.json, {"machine": machine(), "args": vars(args), "against": str(before),
                           "matmul_peak_gflops": peak, "rows": rows})
    print(f"wrote {args.json}")
    return 0


def _spawn(case: dict, pythonpath: str | None = None) -> dict:
    """Run one case in a fresh interpreter so peak memory and allocator state are its own;
    ``pythonpath`` puts another checkout's folnet first (an --against run's "before" side)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)],
                          capture_output=True, text=True, check=False, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            return json.loads(line[5:])
    raise RuntimeError(f"case {case['impl']}/{case['ops']}/{case['dtype']} failed:\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


if __name__ == "__main__":
    sys.exit(main())
