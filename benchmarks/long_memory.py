"""Training memory on long sequences: the full square against the row-blocked layers.

    python benchmarks/long_memory.py                                   # small, T 512, batch 2
    python benchmarks/long_memory.py --seq-len 128,256,512 --batch 1 --checkpointing off

Each measurement runs in a fresh process, its allocator tuned as the training commands tune
it for that length (`folnet.runtime.tune_cpu_allocator`): build the model (pretraining head,
as ``folnet pretrain`` builds it), take one short AdamW step at T = 16 so that gradients and
optimizer state exist (the steady state), read the resident set, reset its peak through
/proc/self/clear_refs, take one MLM + NSP step at the measured length and report the peak
above the steady state and the step's time. Modes alternate round by round (and swap who goes
first), so the time ratios compare neighbours on a shared machine. Results go to
results/long_memory.json.

``--device cuda`` measures the same step on a GPU, where the caching allocator counts the
tensors themselves: the peak of ``torch.cuda.max_memory_allocated`` above what is allocated in
the steady state. It has no heap holes, so it checks the per-tensor account of the CPU peak
(docs/design.md, section 7).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, table, write_json

import folnet
from folnet.runtime import tune_cpu_allocator

OUT = Path(__file__).resolve().parents[1] / "results" / "long_memory.json"


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _batch(batch: int, seq_len: int, vocab: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq_len), generator=g)
    types = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]  # ~15% masked positions
    return tuple(t.to(device) for t in (ids, types, labels, torch.zeros(batch, dtype=torch.long)))


def measure(case: dict) -> dict:
    """One configuration in this process (see the module docstring)."""
    mode, _, allocator = case["mode"].partition("@")
    # as the training commands tune it for this length; "@heap": everything on the heap, as
    # for short sequences (and for every length before the long-sequence rule)
    tune_cpu_allocator(None if allocator == "heap" else case["seq_len"])
    device = case.get("device", "cpu")
    torch.manual_seed(0)
    extra = {"backend": case["backend"]} if case.get("backend") else {}
    model = folnet.build_model(case["ops"], preset=case["preset"], head="pretraining",
                               vocab_size=case["vocab"], **extra).train()
    if not case.get("as_built"):
        model.gather_mlm, model.relations = True, False  # as pretraining runs it
    elif case.get("relations"):
        model.relations = True  # the final binary stream asked for (earlier versions' default)
    if case["checkpointing"]:
        model.set_activation_checkpointing(True)
    if mode == "baseline":  # what the released code materialises, op by op
        # the per-operator oracle lives with the tests (imported here: a "before" checkout
        # need not run it)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from baseline import BaselineFolnet

        model = BaselineFolnet(model)
    else:
        folnet.set_memory(model, mode, block_rows=case["block_rows"])
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(seq_len: int) -> float:
        ids, types, labels, nsp = _batch(case["batch"], seq_len, case["vocab"], device)
        opt.zero_grad(set_to_none=False)
        loss = model(ids, types, mlm_labels=labels, nsp_labels=nsp).loss
        loss.backward()
        opt.step()
        return float(loss.detach())

    step(16)  # gradients and AdamW state exist from here on
    if device == "cuda":  # the allocator's own count of live tensor bytes
        torch.cuda.synchronize()
        steady = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    else:
        steady = _status_mb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set to now
    start = time.perf_counter()
    loss = step(case["seq_len"])  # float(loss) synchronises a GPU
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device == "cuda"
            else _status_mb("VmHWM"))
    return {**case, "steady_mb": steady, "peak_above_mb": peak - steady,
            "seconds": seconds, "loss": loss}


def _run(case: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--ops", default="jmc.atp")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq-len", default="512", help="comma-separated lengths")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--checkpointing", default="on", choices=("on", "off"))
    ap.add_argument("--modes", default="full,blocked",
                    help="auto (folnet picks from T, as a user's model does), full, blocked "
                         "and/or baseline (tests/baseline.py, never checkpointed); "
                         "MODE@heap keeps every allocation on the heap (folnet.runtime)")
    ap.add_argument("--baseline-max-t", type=int, default=512,
                    help="longest T the baseline runs at (it materialises far more)")
    ap.add_argument("--block-rows", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: the peak of allocated tensor bytes, not the resident set")
    ap.add_argument("--backend", default=None,
                    help="the operators' backend (build_model's backend=); default auto")
    ap.add_argument("--as-built", action="store_true",
                    help="the model as a user builds it (MLM logits at every position, the "
                         "final binary stream only if --relations), not as pretraining runs it")
    ap.add_argument("--relations", action="store_true",
                    help="with --as-built: model.relations = True (the final binary stream)")
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(measure(json.loads(args.case))))
        return 0
    rows = []
    for seq_len in (int(t) for t in args.seq_len.split(",")):
        modes = [m for m in args.modes.split(",")
                 if m != "baseline" or seq_len <= args.baseline_max_t]
        got: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                case = {"ops": args.ops, "preset": args.preset, "seq_len": seq_len,
                        "batch": args.batch, "vocab": args.vocab, "mode": mode,
                        "block_rows": args.block_rows,
                        "checkpointing": args.checkpointing == "on",
                        "as_built": args.as_built, "relations": args.relations,
                        "device": args.device, "backend": args.backend}
                got[mode].append(_run(case))
                print(f"T {seq_len} {mode}: peak above steady "
                      f"{got[mode][-1]['peak_above_mb']:.0f} MiB, "
                      f"{got[mode][-1]['seconds']:.2f} s", flush=True)
        first = got[modes[0]]
        for mode in modes:
            runs = got[mode]
            rows.append({"seq_len": seq_len, "mode": mode,
                         "peak_above_mb": statistics.median(r["peak_above_mb"] for r in runs),
                         "seconds": statistics.median(r["seconds"] for r in runs),
                         "time_vs_first": statistics.median(
                             r["seconds"] / f["seconds"] for r, f in zip(runs, first,
                                                                         strict=True)),
                         "loss": runs[0]["loss"]})
    for mode in dict.fromkeys(r["mode"] for r in rows):  # growth exponent over the lengths
        points = [(r["seq_len"], r["peak_above_mb"]) for r in rows if r["mode"] == mode]
        if len(points) >= 2:
            (t0, m0), (t1, m1) = points[-2], points[-1]
            print(f"{mode}: peak grows as T^{math.log(m1 / m0) / math.log(t1 / t0):.2f} "
                  f"from T {t0} to {t1}")
            for r in rows:
                if r["mode"] == mode:
                    r["exponent_last"] = math.log(m1 / m0) / math.log(t1 / t0)
    print(table(rows, [("seq_len", "T", "d"), ("mode", "mode", "s"),
                       ("peak_above_mb", "peak above steady MiB", ".0f"),
                       ("seconds", "step s", ".2f"),
                       ("time_vs_first", f"time / {args.modes.split(',')[0]}", ".2f")]))
    write_json(OUT, {"machine": machine(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
