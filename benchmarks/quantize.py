"""Dynamic int8 quantization: agreement with float32 and eval speed, folnet beside BERT.

    python benchmarks/quantize.py             # small preset, batch 8, T 128, 1 and 2 threads
    python benchmarks/quantize.py --threads 1 --repeats 3

Each model is built from a seed (random weights: no checkpoint is needed, and a trained model
agrees at least as well, its logits being less nearly tied), put in eval mode and quantized by
``quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`` -- folnet's (`folnet.arch.quantize`,
which also covers the operators' fused projections) and torch's for the anchor, a BERT with
folnet's unary sizes (hidden D1, L layers, H heads, intermediate F1, the same vocabulary) --
and, as a second row each, with per-output-channel weight scales
(``{nn.Linear: per_channel_dynamic_qconfig}``). Both read the same random ids with a padding
mask that is not all ones; both have an MLM head, so that every real token gives an argmax.

Agreement: the relative error (in norm) of the real tokens' logits against float32, and the
share of real tokens whose argmax is unchanged. Speed: the median eval forward (no autograd)
over ``--repeats`` after one warm-up, float32 and quantized alternating, at each thread count.
Writes results/quantize.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, table, timed, write_json

import folnet
from folnet.arch.quantize import quantize_dynamic


def folnet_model(args) -> nn.Module:
    torch.manual_seed(0)
    return folnet.build_model(args.ops, preset=args.preset, head="mlm").eval()


def bert_model(cfg) -> nn.Module:
    """The anchor: a BERT with the folnet model's unary sizes."""
    import transformers

    torch.manual_seed(0)
    bert = transformers.BertConfig(hidden_size=cfg.D1, num_hidden_layers=cfg.L,
                                   num_attention_heads=cfg.H, intermediate_size=cfg.F1,
                                   vocab_size=cfg.vocab_size, max_position_embeddings=512)
    return transformers.BertForMaskedLM(bert).eval()


def inputs(args, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, T) and a padding mask: row b keeps T - b * T // (2 B) tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (args.batch, args.seq_len), generator=g)
    mask = torch.ones_like(ids)
    for b in range(args.batch):
        mask[b, args.seq_len - b * args.seq_len // (2 * args.batch):] = 0
    return ids, mask


def agreement(ref: torch.Tensor, got: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Relative error of the real tokens' logits (in norm), share of unchanged argmaxes."""
    real = mask.bool()
    r, g = ref[real].double(), got[real].double()  # (real tokens, vocab)
    return float((g - r).norm() / r.norm()), float((g.argmax(-1) == r.argmax(-1)).double().mean())


def measure(name: str, scheme: str, fp32: nn.Module, quant: nn.Module, ids: torch.Tensor,
            mask: torch.Tensor, args) -> list[dict]:
    """One row per thread count: agreement (once) and the two models' median forwards."""
    def run(model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            out = model(ids, attention_mask=mask)
        return out.logits if getattr(out, "mlm_logits", None) is None else out.mlm_logits

    rel, agree = agreement(run(fp32), run(quant), mask)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        run(fp32), run(quant)  # warm-up
        times: dict[str, list[float]] = {"fp32": [], "int8": []}
        for i in range(args.repeats):
            for side in (("fp32", "int8") if i % 2 == 0 else ("int8", "fp32")):
                times[side].append(timed(lambda m=(fp32 if side == "fp32" else quant): run(m)))
        fp, q = statistics.median(times["fp32"]), statistics.median(times["int8"])
        rows.append({"model": name, "scheme": scheme, "threads": threads, "rel_err": rel,
                     "argmax_agree": agree, "fp32_s": fp, "int8_s": q, "speedup": fp / q})
        print(f"  {name} {scheme} threads {threads}: rel {rel:.3g}, argmax {agree:.4f}, "
              f"fp32 {fp:.3f} s, int8 {q:.3f} s", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="jmc.atp")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="results/quantize.json")
    args = ap.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.ao's notices
    warnings.filterwarnings("ignore", message=".*quantize_per_(tensor|channel).*")
    model = folnet_model(args)
    cfg = model.cfg
    anchor = bert_model(cfg)
    ids, mask = inputs(args, cfg.vocab_size)
    schemes = {"per-tensor": {nn.Linear},
               "per-channel": {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}}
    rows = []
    for scheme, spec in schemes.items():
        rows += measure(f"folnet {args.ops}", scheme, model,
                        quantize_dynamic(model, spec, dtype=torch.qint8), ids, mask, args)
        rows += measure("BERT (anchor)", scheme, anchor,
                        torch.ao.quantization.quantize_dynamic(anchor, spec, dtype=torch.qint8),
                        ids, mask, args)
    print()
    print(f"preset {args.preset} (D1 {cfg.D1}, D2 {cfg.D2}, L {cfg.L}), batch {args.batch}, "
          f"T {args.seq_len}, eval forward, median of {args.repeats}; the anchor is a BERT of "
          f"hidden {cfg.D1}, {cfg.L} layers, {cfg.H} heads, intermediate {cfg.F1}")
    print(table(rows, [("model", "model", ""), ("scheme", "int8 weights", ""),
                       ("threads", "threads", "d"), ("rel_err", "logits rel. error", ".2e"),
                       ("argmax_agree", "argmax agreement", ".4f"),
                       ("fp32_s", "fp32 s", ".3f"), ("int8_s", "int8 s", ".3f"),
                       ("speedup", "fp32 / int8", ".2f")]))
    write_json(args.json, {"machine": machine(), "args": vars(args), "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
