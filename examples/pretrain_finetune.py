"""The quick start's two commands from Python: pretrain a tiny FOLNet on the generated kinship
corpus, finetune it to name the relation at the end of a chain of k facts (trained on k = 2, 3),
and print its test accuracy for every k.

    python examples/pretrain_finetune.py --out runs/kinship-py          # the bundled recipe
    python examples/pretrain_finetune.py --out runs/quick --pretrain-steps 50 --finetune-steps 100

The recipe is the bundled configs' (``folnet/specs/train/kinship-tiny.toml`` and
``kinship-finetune.toml``); the options below override a few of their keys, as flags would.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from folnet.read_files import specs_dir
from folnet.train.finetune.config import load_finetune_config
from folnet.train.finetune.run import finetune
from folnet.train.pretrain.config import load_pretrain_config
from folnet.train.pretrain.loop import pretrain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/kinship-py", help="folder for both runs")
    parser.add_argument("--pretrain-steps", type=int, help="default: the recipe's")
    parser.add_argument("--finetune-steps", type=int, help="default: the recipe's")
    parser.add_argument("--documents", type=int, help="kinship documents to pretrain on")
    parser.add_argument("--train-size", type=int, help="finetuning questions")
    parser.add_argument("--test-per-k", type=int, help="test questions per chain length")
    args = parser.parse_args()
    given = lambda **options: {k: v for k, v in options.items() if v is not None}  # noqa: E731
    out = Path(args.out)
    recipes = Path(str(specs_dir())) / "train"

    config = load_pretrain_config(recipes / "kinship-tiny.toml", given(
        out=str(out / "pretrain"), steps=args.pretrain_steps, kinship_documents=args.documents,
        save_every=args.pretrain_steps, progress=False))
    final = pretrain(config)  # OUT/final: the model and its tokenizer
    print(f"pretrained {config.ops} ({config.preset} preset) for {config.steps} steps -> {final}")

    config = load_finetune_config(recipes / "kinship-finetune.toml", given(
        checkpoint=str(out / "pretrain"), out=str(out / "finetune"), max_steps=args.finetune_steps,
        kinship_train_size=args.train_size, kinship_test_per_k=args.test_per_k,
        progress=False))
    report = finetune(config)  # what OUT/eval.json holds
    test = report["metrics"]["test"]
    ks = sorted(int(key[len("accuracy_k"):]) for key in test if key.startswith("accuracy_k"))
    print(f"finetuned on {config.task}; test accuracy (majority class) by chain length k:")
    for k in ks:
        accuracy, majority = test[f"accuracy_k{k}"], test[f"majority_baseline_k{k}"]
        print(f"  k = {k:2d}   {accuracy:.3f}   ({majority:.3f})")
    print(f"  seen k   {test['accuracy_seen']:.3f}, unseen k {test['accuracy_unseen']:.3f}")


if __name__ == "__main__":
    main()
