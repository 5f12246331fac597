"""Generation benchmark: time per new token with and without the incremental cache.

    python benchmarks/generate.py                    # tiny and small, 64/256/512 new tokens
    python benchmarks/generate.py --presets tiny --lengths 64 --threads 1
    python benchmarks/generate.py --hf --lengths 256 # native generate against transformers'

Decoder-only FOLNet (``--ops``, default jmc.atp), float32, batch 1, a random prompt of 16
tokens, greedy decoding, eval mode. *Cached*: one ``generate(use_cache=True)`` run (best of
``--repeats``), divided by the number of new tokens. *Recomputed*: ``use_cache=False`` recomputes
the whole sequence for every new token, so its per-token time is the mean, over the run, of
one full forward at the current length. When a full run would exceed ``--budget`` seconds, that
mean is estimated from single steps timed (best of two) at ``--samples`` evenly spaced lengths
with Simpson's rule (exact for a step cost cubic in the length, as ``t``'s is), and the row says
"sampled". Writes results/generate.json and prints a markdown table.

``--hf`` compares instead folnet's own ``generate`` with transformers' ``GenerationMixin``
driving the same weights through `folnet.hf.FolnetForCausalLM` (both cached, greedy), the two
alternating ``--repeats`` times in one process; per-token time is the median run's, the ratio
the median of the pairs' ratios. Writes results/generate_hf.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, table, write_json

import folnet


def seconds(fn, repeats: int = 1) -> float:
    """Best wall time of ``repeats`` runs (the least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def one_step(model, length: int, vocab: int) -> float:
    """One recomputed decoding step at ``length`` tokens: the best of two runs (the first also
    warms up), which filters out the load of a shared machine."""
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(length))
    return min(seconds(lambda: model.generate(ids, 1, use_cache=False)) for _ in range(2))


def simpson_mean(values: list[float]) -> float:
    """Mean of a function over an interval from an odd number of evenly spaced samples."""
    weights = [1.0] + [4.0 if i % 2 else 2.0 for i in range(1, len(values) - 1)] + [1.0]
    return sum(w * v for w, v in zip(weights, values, strict=True)) / (3 * (len(values) - 1))


def case(model, prompt: torch.Tensor, new: int, *, budget: float, samples: int,
         repeats: int) -> dict:
    vocab = model.cfg.vocab_size
    model.generate(prompt, 4)  # warm-up
    cached = seconds(lambda: model.generate(prompt, new, use_cache=True), repeats) / new
    T0 = prompt.shape[1]
    last = one_step(model, T0 + new - 1, vocab)
    if last * new <= budget:
        full = seconds(lambda: model.generate(prompt, new, use_cache=False)) / new
        method = "full run"
    else:  # per-step time at evenly spaced lengths; Simpson mean over the run
        lengths = [T0 + round(i * (new - 1) / (samples - 1)) for i in range(samples)]
        steps = [last if n == T0 + new - 1 else one_step(model, n, vocab) for n in lengths]
        full = simpson_mean(steps)
        method = f"sampled ({samples} lengths)"
    return {"cached_ms": 1e3 * cached, "recomputed_ms": 1e3 * full, "speedup": full / cached,
            "method": method}


def compare_hf(model, prompt: torch.Tensor, new: int, repeats: int) -> dict:
    """Native and transformers' generate on the same weights, alternating (see docstring)."""
    from folnet.hf import FolnetConfig, FolnetForCausalLM

    hf = FolnetForCausalLM(FolnetConfig.from_folnet(model.cfg, head="lm")).eval()
    hf.load_state_dict(model.state_dict())
    native = lambda: model.generate(prompt, new)  # noqa: E731
    via_hf = lambda: hf.generate(prompt, max_new_tokens=new, min_new_tokens=new,  # noqa: E731
                                 do_sample=False, pad_token_id=0)
    if not torch.equal(native(), via_hf()):  # (also the warm-up)
        raise RuntimeError("native and transformers' greedy tokens differ")
    pairs = []
    for i in range(repeats):
        order = (native, via_hf) if i % 2 == 0 else (via_hf, native)
        times = {fn: seconds(fn) / new for fn in order}
        pairs.append((times[native], times[via_hf]))
    ratios = sorted(h / n for n, h in pairs)
    mid = sorted(pairs, key=lambda p: p[1] / p[0])[len(pairs) // 2]
    return {"native_ms": 1e3 * mid[0], "hf_ms": 1e3 * mid[1],
            "hf_over_native": ratios[len(ratios) // 2], "pairs": len(pairs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[64, 256, 512])
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--ops", default="jmc.atp")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--budget", type=float, default=120.0,
                    help="seconds a full recomputed run may take before it is sampled instead")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None,
                    help="default results/generate.json (results/generate_hf.json with --hf)")
    ap.add_argument("--hf", action="store_true",
                    help="native generate against transformers' (see the docstring)")
    args = ap.parse_args(argv)
    args.json = args.json or ("results/generate_hf.json" if args.hf else "results/generate.json")
    if args.samples < 3 or args.samples % 2 == 0:
        ap.error(f"--samples must be odd and >= 3 (Simpson's rule), got {args.samples}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for preset in args.presets:
        model = folnet.build_model(args.ops, preset=preset, kind="decoder", dropout=0.0,
                                   max_positions=max(512, args.prompt + max(args.lengths)))
        model.eval()
        prompt = torch.randint(0, model.cfg.vocab_size, (1, args.prompt),
                               generator=torch.Generator().manual_seed(1))
        for new in args.lengths:
            if args.hf:
                row = {"preset": preset, "ops": args.ops, "new_tokens": new,
                       **compare_hf(model, prompt, new, args.repeats)}
                rows.append(row)
                print(f"{preset:6s} {new:4d} tokens: native {row['native_ms']:.2f} ms/token, "
                      f"transformers {row['hf_ms']:.2f} ms/token, ratio "
                      f"{row['hf_over_native']:.3f}", flush=True)
                continue
            row = {"preset": preset, "ops": args.ops, "new_tokens": new, "prompt": args.prompt,
                   **case(model, prompt, new, budget=args.budget, samples=args.samples,
                          repeats=args.repeats)}
            rows.append(row)
            print(f"{preset:6s} {new:4d} tokens: cached {row['cached_ms']:8.2f} ms/token, "
                  f"recomputed {row['recomputed_ms']:9.2f} ms/token ({row['method']}), "
                  f"x{row['speedup']:.1f}", flush=True)
    write_json(args.json, {"machine": machine(), "dtype": "float32", "batch": 1,
                           "rows": rows})
    print()
    if args.hf:
        print(table(rows, [("preset", "preset", ""), ("new_tokens", "new tokens", "d"),
                           ("native_ms", "native ms/token", ".2f"),
                           ("hf_ms", "transformers ms/token", ".2f"),
                           ("hf_over_native", "transformers / native", ".3f")]))
        return 0
    print(table(rows, [("preset", "preset", ""), ("ops", "ops", ""),
                       ("new_tokens", "new tokens", "d"),
                       ("cached_ms", "cached ms/token", ".2f"),
                       ("recomputed_ms", "recomputed ms/token", ".1f"),
                       ("speedup", "speedup", ".1f"), ("method", "recomputed timing", "")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
