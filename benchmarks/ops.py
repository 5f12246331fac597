"""Per-operator kernel benchmark: forward+backward time, peak memory and FLOPs per backend.

    python benchmarks/ops.py                       # batch 8, T = 128 and 512, D2 64, H 12, S 64
    python benchmarks/ops.py --seq-len 128 --ops jt --repeats 3 --json results/ops.json

Inputs are the operator's kernel and premise laid out as its spec says, with channel sizes from
the spec's size expressions (h = H, s = w = S; t's heads are the D2 channels). Each case runs
forward, then backward with a random output gradient.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    count_flops,
    machine,
    matmul_peak_gflops,
    median_seconds,
    peak_resident_mb,
    resident_mb,
    table,
    write_json,
)

import folnet
from folnet.ops.backends import BACKENDS, OpCall
from folnet.ops.compiler import compile_operator
from folnet.ops.sizes import evaluate_int
from folnet.runtime import tune_cpu_allocator


def case(symbol: str, backend: str, batch: int, seq_len: int, dims: dict, device: str,
         dtype: torch.dtype, repeats: int):
    spec = folnet.get_operator(symbol)
    sizes = {c: seq_len for c in "xya"}
    sizes.update({c: evaluate_int(e, dims, what=c) for c, e in spec.sizes})
    call = OpCall(torch.device(device), dtype, False, False, True)
    reason = BACKENDS[backend].why_not(spec, call)
    if reason is not None:
        return None, reason
    g = torch.Generator(device=device).manual_seed(0)

    def make(role):
        shape = (batch, *(sizes[c] for c in spec.tensor(role)))
        return torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()

    k, v = make("kernel"), make("premise")
    op = compile_operator(symbol, backend)
    grad = torch.randn(op(k, v).shape, generator=g, device=device).to(dtype)

    def step():
        k.grad = v.grad = None
        op(k, v).backward(grad)

    before = resident_mb(device)
    seconds = median_seconds(step, repeats=repeats, warmup=1, device=device)
    mem = peak_resident_mb(device) - before
    flops = count_flops(step)
    return {"op": symbol, "backend": backend, "T": seq_len, "ms": seconds * 1e3,
            "gflop": flops / 1e9, "gflops": flops / seconds / 1e9, "peak_mb": mem}, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="bcjmapt", help="operator symbols (default: all built-ins)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--seq-len", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--D2", type=int, default=64)
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--S", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default="results/ops.json")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, printed as JSON
    args = ap.parse_args(argv)
    if args.case:
        tune_cpu_allocator()
        c = json.loads(args.case)
        row, reason = case(c["op"], c["backend"], c["batch"], c["T"], c["dims"], c["device"],
                           getattr(torch, c["dtype"]), c["repeats"])
        print("CASE " + json.dumps({"row": row, "reason": reason}), flush=True)
        return 0
    dtype = getattr(torch, args.dtype)
    dims = {"D1": 768, "D2": args.D2, "H": args.H, "S": args.S, "F1": 3072, "F2": 256}
    peak = matmul_peak_gflops(dtype, device=args.device)
    print(f"matrix-product peak: {peak:.1f} GFLOP/s ({args.dtype}, {args.device})")
    rows, skipped = [], []
    for seq_len in args.seq_len:
        for symbol in args.ops:
            for backend in args.backends.split(","):
                row, reason = _spawn({"op": symbol, "backend": backend, "batch": args.batch,
                                      "T": seq_len, "dims": dims, "device": args.device,
                                      "dtype": args.dtype, "repeats": args.repeats})
                if row is None:
                    skipped.append(f"{symbol}/{backend}: {reason}")
                    continue
                row["peak_frac"] = row["gflops"] / peak
                rows.append(row)
                print(f"  {symbol} {backend:8s} T={seq_len:4d} {row['ms']:9.1f} ms "
                      f"{row['gflops']:7.1f} GFLOP/s {row['peak_mb']:8.0f} MiB", flush=True)
    print()
    print(table(rows, [("op", "op", ""), ("backend", "backend", ""), ("T", "T", "d"),
                       ("ms", "fwd+bwd ms", ".1f"), ("gflop", "GFLOP", ".2f"),
                       ("gflops", "GFLOP/s", ".1f"), ("peak_frac", "of peak", ".0%"),
                       ("peak_mb", "peak MiB", ".0f")]))
    print("\nnot run: " + "; ".join(sorted(set(skipped))))
    write_json(args.json, {"machine": machine(), "args": vars(args), "matmul_peak_gflops": peak,
                           "rows": rows, "skipped": sorted(set(skipped))})
    print(f"wrote {args.json}")
    return 0


def _spawn(c: dict):
    """Each case in a fresh process, so that its peak memory is its own."""
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(c)],
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            out = json.loads(line[5:])
            return out["row"], out["reason"]
    raise RuntimeError(f"case {c} failed:\n{proc.stderr[-4000:]}")


if __name__ == "__main__":
    sys.exit(main())
