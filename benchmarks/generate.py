"""Generation benchmark: time per new token with and without the incremental cache.

    python benchmarks/generate.py                    # tiny and small, 64/256/512 new tokens
    python benchmarks/generate.py --presets tiny --lengths 64 --threads 1
    python benchmarks/generate.py --hf --lengths 256 # native generate against transformers'
    python benchmarks/generate.py --static           # + the static cache, eager and compiled

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

    python benchmarks/generate.py --assisted --lengths 128   # assisted decoding, prompt lookup
    python benchmarks/generate.py --compiled --lengths 128   # torch.compile'd steps, beside GPT-2

``--assisted``: transformers' greedy ``generate`` of a ``--presets`` target (default small)
alone, with a ``--assistant`` model (default the tiny preset) and with prompt lookup (3
candidates), alternating ``--repeats`` times; per-token times are medians. An assistant helps
only where it agrees with the target, so both first train ``--train-steps`` steps on the
same synthetic corpus (a token chain: the next token is f(token) with probability 0.9, f a
fixed random permutation of 128 ids); the prompt is a chain. Prompt lookup helps where the
text repeats the prompt: its prompt is a passage (new + 24 tokens along f) followed by the
passage's first 8 tokens again, so the continuation quotes the passage. Rows give the
target's calls per new token; each run must give greedy's tokens.
Writes results/generate_assisted.json.

``--compiled``: greedy steps of folnet's cached step (`FolnetForCausalLM.forward` with a
`FolnetCache`) eager and under ``torch.compile(fullgraph=True)`` (``--backend``), beside a GPT-2
of the preset's width, depth and heads (eager with its dynamic cache, compiled with a static
one), after a 16-token prompt run eagerly. The first compiled run (compiling included) is
timed apart; then eager and compiled runs alternate ``--repeats`` times (medians). Writes
results/generate_compiled.json.
"""

from __future__ import annotations

import argparse
import statistics
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
         repeats: int, static: bool = False) -> dict:
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
    row = {"cached_ms": 1e3 * cached, "recomputed_ms": 1e3 * full, "speedup": full / cached,
           "method": method}
    if static:  # the static cache, eager and its step compiled (CUDA graphs on CUDA)
        want = model.generate(prompt, new)
        if not torch.equal(model.generate(prompt, new, cache="static"), want):
            raise RuntimeError("the static cache's tokens differ from the dynamic cache's")
        row["static_ms"] = 1e3 * seconds(lambda: model.generate(prompt, new, cache="static"),
                                         repeats) / new
        begin = time.perf_counter()
        got = model.generate(prompt, new, cache="static", compile=True)
        row["compile_s"] = time.perf_counter() - begin
        if not torch.equal(got, want):
            raise RuntimeError("the compiled static step's tokens differ from the cache's")
        row["static_compiled_ms"] = 1e3 * seconds(
            lambda: model.generate(prompt, new, cache="static", compile=True), repeats) / new
        row["compiled_speedup"] = full / (row["static_compiled_ms"] / 1e3)
    return row


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


def chain(f: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """(batch, length) ids of the token chain: f(previous id) with probability 0.9, else any."""
    ids = torch.empty(batch, length, dtype=torch.long)
    ids[:, 0] = torch.randint(0, len(f), (batch,), generator=gen)
    for t in range(1, length):
        jump = torch.rand(batch, generator=gen) < 0.1
        ids[:, t] = torch.where(jump, torch.randint(0, len(f), (batch,), generator=gen),
                                f[ids[:, t - 1]])
    return ids


def trained_lm(preset: str, ops: str, f: torch.Tensor, steps: int, seed: int):
    """A decoder of ``preset`` after ``steps`` AdamW steps (batch 8 x 24 tokens) on the chain,
    as transformers' `FolnetForCausalLM`."""
    from folnet.hf import FolnetConfig, FolnetForCausalLM

    torch.manual_seed(seed)
    model = folnet.build_model(ops, preset=preset, kind="decoder", vocab_size=len(f),
                               dropout=0.0, max_positions=512)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = chain(f, 8, 24, gen)
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hf = FolnetForCausalLM(FolnetConfig.from_folnet(model.cfg, head="lm")).eval()
    hf.load_state_dict(model.state_dict())
    return hf


def compare_assisted(target, assistant, prompt: torch.Tensor, repetitive: torch.Tensor,
                     new: int, repeats: int) -> dict:
    """Greedy, assisted and prompt-lookup generate on ``target``, alternating (docstring)."""
    common = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False,
              "pad_token_id": 0}
    runs = {"greedy": (prompt, {}), "assisted": (prompt, {"assistant_model": assistant}),
            "greedy, repetitive": (repetitive, {}),
            "lookup": (repetitive, {"prompt_lookup_num_tokens": 3})}
    calls: list[int] = []
    hook = target.register_forward_pre_hook(lambda *_: calls.append(1))
    tokens, per_token = {}, {}
    for name, (ids, extra) in runs.items():  # the warm-up: tokens and the target's calls
        calls.clear()
        tokens[name] = target.generate(ids, **common, **extra)
        per_token[name] = len(calls) / new
    hook.remove()
    if not (torch.equal(tokens["assisted"], tokens["greedy"])
            and torch.equal(tokens["lookup"], tokens["greedy, repetitive"])):
        raise RuntimeError("assisted decoding or prompt lookup changed greedy's tokens")
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for i in range(repeats):
        for name in names[i % 4 :] + names[: i % 4]:  # each run first in turn
            ids, extra = runs[name]
            run = lambda ids=ids, extra=extra: target.generate(ids, **common, **extra)  # noqa: E731
            times[name].append(seconds(run) / new)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    return {"greedy_ms": ms["greedy"], "assisted_ms": ms["assisted"],
            "assisted_speedup": ms["greedy"] / ms["assisted"],
            "assisted_calls_per_token": per_token["assisted"],
            "repetitive_greedy_ms": ms["greedy, repetitive"], "lookup_ms": ms["lookup"],
            "lookup_speedup": ms["greedy, repetitive"] / ms["lookup"],
            "lookup_calls_per_token": per_token["lookup"], "repeats": repeats}


def _decode(start, step, new: int) -> tuple[torch.Tensor, float]:
    """Greedy decoding: ``start()`` runs the prompt (eager) and gives the first new token
    (1, 1) and the cache; ``step(token, cache, i)`` the next output. Returns the new tokens
    (1, new) and the seconds per step."""
    with torch.no_grad():
        token, cache = start()
        tokens = [token]
        begin = time.perf_counter()
        for i in range(new - 1):
            token = step(token, cache, i).logits[:, -1:].argmax(-1)
            tokens.append(token)
        return torch.cat(tokens, 1), (time.perf_counter() - begin) / (new - 1)


def _folnet_steps(model, prompt: torch.Tensor, compiled: bool, backend: str):
    from folnet.hf.text import CACHE

    def forward(token, cache):
        return model(input_ids=token, use_cache=True, **{CACHE: cache})

    inner = torch.compile(forward, fullgraph=True, backend=backend) if compiled else forward

    def start():
        out = model(prompt, use_cache=True)
        return out.logits[:, -1:].argmax(-1), getattr(out, CACHE)

    return start, lambda token, cache, i: inner(token, cache)


def _gpt2_steps(model, prompt: torch.Tensor, new: int, compiled: bool, backend: str):
    """GPT-2's steps: eager with its dynamic cache; compiled with a static one (transformers'
    way to compile decoding), its position given as a tensor (not a number to specialise)."""
    from transformers import StaticCache

    from folnet.hf.text import CACHE

    def forward(token, cache, position):
        return model(input_ids=token, position_ids=position, use_cache=True, **{CACHE: cache})

    inner = torch.compile(forward, fullgraph=True, backend=backend) if compiled else forward
    T0 = prompt.shape[1]

    def start():
        given = ({CACHE: StaticCache(config=model.config, max_cache_len=T0 + new)}
                 if compiled else {})
        out = model(prompt, use_cache=True, **given)
        return out.logits[:, -1:].argmax(-1), getattr(out, CACHE)

    return start, lambda token, cache, i: inner(token, cache, torch.tensor([[T0 + i]]))


def compare_compiled(preset: str, ops: str, new: int, repeats: int, backend: str) -> list:
    """Eager and compiled steps of folnet's decoder and of GPT-2 at its size (docstring)."""
    import transformers

    from folnet.hf import FolnetConfig, FolnetForCausalLM

    vocab = 1000
    torch.manual_seed(0)
    native = folnet.build_model(ops, preset=preset, kind="decoder", vocab_size=vocab,
                                dropout=0.0, max_positions=512)
    cfg = native.cfg
    folnet_lm = FolnetForCausalLM(FolnetConfig.from_folnet(cfg, head="lm")).eval()
    folnet_lm.load_state_dict(native.state_dict())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_positions=512, n_embd=cfg.D1, n_layer=cfg.L, n_head=cfg.H,
        n_inner=cfg.F1, bos_token_id=0, eos_token_id=None)).eval()
    prompt = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    rows = []
    for name, model in (("folnet", folnet_lm), ("gpt2", gpt2)):
        torch._dynamo.reset()
        make = (_folnet_steps if name == "folnet" else
                lambda m, p, c, b: _gpt2_steps(m, p, new, c, b))
        eager, compiled = make(model, prompt, False, backend), make(model, prompt, True, backend)
        want, _ = _decode(*eager, new)
        begin = time.perf_counter()
        got, _ = _decode(*compiled, new)  # compiles
        first = time.perf_counter() - begin
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for i in range(repeats):
            for kind in (("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")):
                times[kind].append(_decode(*(eager if kind == "eager" else compiled), new)[1])
        ms = {kind: 1e3 * statistics.median(t) for kind, t in times.items()}
        params = sum(p.numel() for p in model.parameters())
        rows.append({"preset": preset, "model": name, "params": params, "new_tokens": new,
                     "eager_ms": ms["eager"], "compiled_ms": ms["compiled"],
                     "speedup": ms["eager"] / ms["compiled"], "first_compiled_s": first,
                     "same_tokens": bool(torch.equal(got, want)), "backend": backend})
    return rows


def run_assisted(args) -> list:
    """``--assisted``: each target preset against the trained assistant (docstring)."""
    f = torch.randperm(128, generator=torch.Generator().manual_seed(0))
    assistant = trained_lm(args.assistant, args.ops, f, args.train_steps, seed=1)
    gen = torch.Generator().manual_seed(2)
    prompt = chain(f, 1, args.prompt, gen)
    rows = []
    for preset in args.presets:
        target = trained_lm(preset, args.ops, f, args.train_steps, seed=0)
        for new in args.lengths:
            passage = [int(prompt[0, 0])]
            while len(passage) < new + 24:
                passage.append(int(f[passage[-1]]))
            repetitive = torch.tensor([passage + passage[:8]])
            row = {"target": preset, "assistant": args.assistant, "ops": args.ops,
                   "train_steps": args.train_steps, "new_tokens": new,
                   **compare_assisted(target, assistant, prompt, repetitive, new,
                                      args.repeats)}
            rows.append(row)
            print(f"{preset} + {args.assistant}, {new} tokens: assisted x"
                  f"{row['assisted_speedup']:.2f}, lookup x{row['lookup_speedup']:.2f}", flush=True)
    return rows


def run_compiled(args) -> list:
    """``--compiled``: eager and compiled steps of each preset and its GPT-2 (docstring)."""
    rows = []
    for preset in args.presets:
        for new in args.lengths:
            for row in compare_compiled(preset, args.ops, new, args.repeats, args.backend):
                rows.append(row)
                print(f"{preset} {row['model']}, {new} tokens: compiled x{row['speedup']:.2f}",
                      flush=True)
    return rows


def run_cached(args) -> list:
    """The default and ``--hf`` measurements (docstring)."""
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
                          repeats=args.repeats, static=args.static)}
            rows.append(row)
            print(f"{preset:6s} {new:4d} tokens: cached {row['cached_ms']:8.2f} ms/token, "
                  f"recomputed {row['recomputed_ms']:9.2f} ms/token ({row['method']}), "
                  f"x{row['speedup']:.1f}" + ("" if not args.static else
                                               f"; static {row['static_ms']:.2f}, compiled "
                                               f"{row['static_compiled_ms']:.2f} ms/token "
                                               f"(compile {row['compile_s']:.0f} s), "
                                               f"x{row['compiled_speedup']:.1f}"), flush=True)
    return rows


COLUMNS = {
    "hf": [("preset", "preset", ""), ("new_tokens", "new tokens", "d"),
           ("native_ms", "native ms/token", ".2f"), ("hf_ms", "transformers ms/token", ".2f"),
           ("hf_over_native", "transformers / native", ".3f")],
    "assisted": [("target", "target", ""), ("assistant", "assistant", ""),
                 ("new_tokens", "new tokens", "d"), ("greedy_ms", "greedy ms/token", ".2f"),
                 ("assisted_ms", "assisted ms/token", ".2f"),
                 ("assisted_speedup", "speed-up", ".2f"),
                 ("assisted_calls_per_token", "target calls/token", ".2f"),
                 ("repetitive_greedy_ms", "greedy ms/token (repetitive)", ".2f"),
                 ("lookup_ms", "lookup ms/token", ".2f"), ("lookup_speedup", "speed-up", ".2f"),
                 ("lookup_calls_per_token", "target calls/token", ".2f")],
    "compiled": [("preset", "size", ""), ("model", "model", ""), ("params", "parameters", "d"),
                 ("new_tokens", "new tokens", "d"), ("eager_ms", "eager ms/token", ".2f"),
                 ("compiled_ms", "compiled ms/token", ".2f"), ("speedup", "speed-up", ".2f"),
                 ("first_compiled_s", "first compiled run s", ".0f"),
                 ("same_tokens", "same tokens", "")],
    "cached": [("preset", "preset", ""), ("ops", "ops", ""), ("new_tokens", "new tokens", "d"),
               ("cached_ms", "cached ms/token", ".2f"),
               ("recomputed_ms", "recomputed ms/token", ".1f"), ("speedup", "speedup", ".1f"),
               ("method", "recomputed timing", "")],
}
STATIC = [("static_ms", "static cache ms/token", ".2f"),
          ("static_compiled_ms", "static, compiled ms/token", ".2f"),
          ("compiled_speedup", "compiled over recomputed", ".1f"),
          ("compile_s", "compile s", ".0f")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=None,
                    help="default tiny and small (small with --assisted)")
    ap.add_argument("--lengths", nargs="+", type=int, default=None,
                    help="new tokens; default 64 256 512 (128 with --assisted, --compiled)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--ops", default="jmc.atp")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--budget", type=float, default=120.0,
                    help="seconds a full recomputed run may take before it is sampled instead")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="default results/generate[_MODE].json")
    modes = ap.add_mutually_exclusive_group()
    modes.add_argument("--hf", action="store_true",
                       help="native generate against transformers' (see the docstring)")
    modes.add_argument("--assisted", action="store_true",
                       help="assisted decoding and prompt lookup against greedy")
    ap.add_argument("--static", action="store_true",
                    help="also the static cache (cache='static'), eager and its step compiled "
                         "(compile=True: CUDA graphs on CUDA)")
    modes.add_argument("--compiled", action="store_true",
                       help="torch.compile'd decoding steps against eager, beside GPT-2")
    ap.add_argument("--assistant", default="tiny", help="--assisted: the assistant's preset")
    ap.add_argument("--train-steps", type=int, default=60,
                    help="--assisted: training steps of target and assistant on the chain")
    ap.add_argument("--backend", default="inductor", help="--compiled: torch.compile backend")
    args = ap.parse_args(argv)
    mode = next((m for m in ("hf", "assisted", "compiled") if getattr(args, m)), "cached")
    args.presets = args.presets or (["small"] if args.assisted else ["tiny", "small"])
    args.lengths = args.lengths or ([128] if mode in ("assisted", "compiled")
                                    else [64, 256, 512])
    args.json = args.json or ("results/generate.json" if mode == "cached"
                              else f"results/generate_{mode}.json")
    if args.samples < 3 or args.samples % 2 == 0:
        ap.error(f"--samples must be odd and >= 3 (Simpson's rule), got {args.samples}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    run = {"assisted": run_assisted, "compiled": run_compiled}.get(mode, run_cached)
    rows = run(args)
    write_json(args.json, {"machine": machine(), "dtype": "float32", "batch": 1,
                           "threads": torch.get_num_threads(), "rows": rows})
    print()
    columns = COLUMNS["hf" if mode == "hf" else mode]
    print(table(rows, columns + (STATIC if mode == "cached" and args.static else [])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
