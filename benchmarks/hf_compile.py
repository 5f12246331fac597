"""torch.compile beside BERT: a sequence classifier's forward + backward, eager and compiled.

    python benchmarks/hf_compile.py                       # small preset vs BERT of its size
    python benchmarks/hf_compile.py --seq-len 64 --batch 4 --repeats 5 --backend aot_eager

Both models are built through their transformers classes at the same width, depth, heads and
FFN size (folnet's small preset: D1 256, L 4, H 4, F1 1024; BERT hidden 256, 4 layers, 4 heads,
intermediate 1024; vocabulary 8192), dropout 0. Per model: the graph and break count of the
forward (torch._dynamo.explain), the first compiled step (compilation included), then eager
and compiled steps alternating, each the median of ``--repeats``. Prints a markdown table and
writes results/hf_compile.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_json

import folnet
import folnet.hf  # registers the Auto classes


def _models(vocab: int) -> dict[str, torch.nn.Module]:
    import transformers

    torch.manual_seed(0)
    directory = tempfile.mkdtemp()
    folnet.build_model("jmc.atp", preset="small", vocab_size=vocab, head="classification",
                       num_labels=3, dropout=0.0).save_pretrained(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = transformers.AutoModelForSequenceClassification.from_pretrained(directory)
    cfg = ours.config
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=vocab, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3))
    return {"folnet jmc.atp": ours.train(), "BERT": bert.train()}


def _step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    model(**batch).loss.backward()
    for p in model.parameters():
        p.grad = None
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend")
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, args.vocab, (args.batch, args.seq_len), generator=g)
    mask = torch.ones_like(ids)
    mask[0, args.seq_len // 2:] = 0
    batch = {"input_ids": ids, "attention_mask": mask,
             "labels": torch.randint(0, 3, (args.batch,), generator=g)}
    rows = []
    for name, model in _models(args.vocab).items():
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(**batch)
        compiled = torch.compile(model, backend=args.backend)
        first = _step(compiled, batch)
        eager, fast = [], []
        for _ in range(args.repeats):
            eager.append(_step(model, batch))
            fast.append(_step(compiled, batch))
        rows.append({"model": name, "graphs": explained.graph_count,
                     "breaks": explained.graph_break_count, "first_compiled_s": first,
                     "eager_s": statistics.median(eager), "compiled_s": statistics.median(fast)})
    print(f"batch {args.batch}, T {args.seq_len}, forward + backward, backend {args.backend}\n")
    print("| model | graphs | breaks | first compiled step s | eager s | compiled s | "
          "eager / compiled |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['graphs']} | {r['breaks']} | {r['first_compiled_s']:.1f} | "
              f"{r['eager_s']:.3f} | {r['compiled_s']:.3f} | "
              f"{r['eager_s'] / r['compiled_s']:.2f} |")
    ours, bert = rows
    print(f"\nfolnet / BERT: eager {ours['eager_s'] / bert['eager_s']:.2f}x, compiled "
          f"{ours['compiled_s'] / bert['compiled_s']:.2f}x")
    write_json("results/hf_compile.json", {"machine": machine(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
