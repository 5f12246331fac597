"""The kinship questions answered by generation, per chain length k, for a decoder and an
encoder-decoder: each pretrained on the kinship corpus (`folnet pretrain --kind ...`), then
finetuned to generate the relation's word (`folnet.train.finetune.generation`) and scored by
exact match on test questions of every k.

    python benchmarks/kinship_generation.py --json docs/figures/kinship_generation.json
    python benchmarks/kinship_generation.py --steps 20 --train 64 --test 16    # a smoke run

Both kinds share the corpus, the tokenizer (trained once on it), the questions and the
seeds; the table gives each k's exact match, the share of test questions whose answer is that
k's most frequent training answer (a guess's score), and the time each part took.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, table, write_json

from folnet.cli import main as folnet_main
from folnet.train.data.kinship import pretraining_documents
from folnet.train.data.kinship.questions import reasoning_examples
from folnet.train.data.tokenizer import train_tokenizer
from folnet.train.finetune.generation import (
    finetune_generation,
    generate_answers,
    score_answers,
)
from folnet.train.finetune.loop import LoopSettings

KINDS = {"decoder": "clm", "encoder-decoder": "span"}


def _prompt(example) -> str:
    return f"{example.story} {example.query}"


def run(args: argparse.Namespace, work: Path) -> list[dict]:
    texts = [s for d in pretraining_documents(args.documents, seed=0) for s in d]
    train_tokenizer(texts=texts, vocab_size=args.vocab).save(work / "tok")
    train = reasoning_examples(args.train, k_values=(2, 3), seed=1)
    test = reasoning_examples(args.test, k_values=tuple(args.ks), seed=2)
    common = collections.Counter(e.label for e in train).most_common(1)[0][0]
    rows = []
    for kind, objective in KINDS.items():
        t0 = time.perf_counter()
        out = work / kind
        code = folnet_main(["pretrain", "--kind", kind, "--objective", objective, "--preset",
                            "tiny", "--data", "kinship", "--kinship-documents",
                            str(args.documents), "--tokenizer", str(work / "tok"),
                            "--seq-len", "64", "--batch-size", "16", "--steps",
                            str(args.steps), "--lr", "3e-3", "--optimizer", "adamw",
                            "--log-every", str(args.steps), "--save-every", str(args.steps),
                            "--no-progress", "--no-tensorboard", "--out", str(out)])
        if code != 0:
            raise SystemExit(f"pretraining the {kind} failed ({code})")
        t1 = time.perf_counter()
        model = finetune_generation(out / "final", [_prompt(e) for e in train],
                                    [e.label for e in train], epochs=args.epochs,
                                    batch_size=16, settings=LoopSettings(lr=args.lr))
        t2 = time.perf_counter()
        from folnet.train.data.tokenizer import load_tokenizer

        tok = load_tokenizer(out / "final")
        answers = generate_answers(model, tok, [_prompt(e) for e in test], max_new_tokens=6)
        t3 = time.perf_counter()
        for k in args.ks:
            at = [i for i, e in enumerate(test) if e.k == k]
            scores = score_answers([answers[i] for i in at], [test[i].label for i in at])
            guess = 100.0 * sum(test[i].label == common for i in at) / len(at)
            rows.append({"kind": kind, "k": k, "questions": len(at),
                         "exact_match": scores["exact_match"], "f1": scores["f1"],
                         "guess": guess, "pretrain_s": t1 - t0, "finetune_s": t2 - t1,
                         "generate_s": t3 - t2})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--documents", type=int, default=400, help="kinship corpus documents")
    p.add_argument("--vocab", type=int, default=600)
    p.add_argument("--steps", type=int, default=300, help="pretraining steps")
    p.add_argument("--train", type=int, default=1000, help="finetuning questions (k 2, 3)")
    p.add_argument("--test", type=int, default=300, help="test questions")
    p.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 5])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3, help="finetuning's peak learning rate")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = run(args, Path(work))
    print(table(rows, [("kind", "kind", ""), ("k", "k", "d"), ("questions", "questions", "d"),
                       ("exact_match", "exact match %", ".1f"), ("f1", "F1 %", ".1f"),
                       ("guess", "the commonest answer %", ".1f")]))
    if args.json:
        write_json(args.json, {"machine": machine(), "args": vars(args) | {"json": str(
            args.json)}, "rows": rows})


if __name__ == "__main__":
    main()
