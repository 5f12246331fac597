"""``folnet finetune`` and ``folnet evaluate``: thin wrappers over `finetune` and
`evaluate_checkpoint`.

As for ``folnet pretrain``, the finetune flags are generated from `FinetuneConfig`, so the
command line and the Python API cannot drift apart; only flags the user gives override the
defaults (their argparse default is None), and the help shows the defaults a run starts from
(the dataclass's, under ``folnet/specs/train/finetune.toml``, empty as shipped). Importing this
module registers both commands and must stay cheap (``folnet --help`` imports it): the training
code is imported inside them.
"""

from __future__ import annotations

import argparse

from folnet.commands import add_operators_flag, register_command
from folnet.train.options import add_flags, given_flags


def _finetune_configure(p: argparse.ArgumentParser) -> None:
    from folnet.train.finetune.config import FinetuneConfig, load_finetune_config

    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file of options over the defaults shown here; flags override both")
    # the options a run without --config or flags uses (unset ones, None, say in their help
    # what happens)
    shown = {k: v for k, v in load_finetune_config().to_dict().items() if v is not None}
    add_flags(p, FinetuneConfig, defaults=shown)
    add_operators_flag(p)


def _finetune_run(args: argparse.Namespace) -> int:
    from folnet.runtime import tune_cpu_allocator
    from folnet.train.finetune.config import FinetuneConfig, load_finetune_config
    from folnet.train.finetune.run import finetune

    tune_cpu_allocator()
    config = load_finetune_config(args.config, given_flags(args, FinetuneConfig))
    payload = finetune(config)
    metrics = payload["metrics"][payload["headline_split"]]
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if "_k" not in k)
    print(f"{payload['task']} {payload['headline_split']} (median of {len(payload['seeds'])} "
          f"seed(s)): {shown}")
    print(f"eval.json, predictions and model in {config.out}")
    return 0


def _evaluate_configure(p: argparse.ArgumentParser) -> None:
    from folnet.train.engine.amp import PRECISIONS

    p.add_argument("--model", required=True, metavar="DIR",
                   help="a finetuned model: folnet finetune's OUT or OUT/model")
    p.add_argument("--out", required=True, metavar="DIR", help="where eval.json and "
                   "predictions/ go")
    p.add_argument("--task", default=None, help="the task (default: the one the model was "
                   "finetuned on)")
    p.add_argument("--data", default=None, metavar="DIR", help="the task's data directory "
                   "(not needed for kinship)")
    p.add_argument("--splits", default=None, metavar="A,B",
                   help="splits to score (default: the task's evaluation splits)")
    p.add_argument("--batch-size", type=int, default=64, metavar="N",
                   help="examples scored per forward pass")
    add_operators_flag(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="fp32, bf16 or fp16 (autocast)")
    p.add_argument("--tokenizer", default=None, help="tokenizer to use instead of the model's")
    p.add_argument("--max-eval-examples", type=int, default=None, metavar="N",
                   help="score only the first N examples of each split")


def _evaluate_run(args: argparse.Namespace) -> int:
    from folnet.errors import FolnetError
    from folnet.runtime import tune_cpu_allocator
    from folnet.train.finetune.evaluate import evaluate_checkpoint

    tune_cpu_allocator()
    for name in ("batch_size", "max_eval_examples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise FolnetError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    splits = [s.strip() for s in args.splits.split(",") if s.strip()] if args.splits else None
    payload = evaluate_checkpoint(args.model, args.out, task=args.task, data=args.data,
                                  splits=splits, batch_size=args.batch_size, device=args.device,
                                  precision=args.precision, tokenizer=args.tokenizer,
                                  max_eval_examples=args.max_eval_examples)
    for split, metrics in payload["metrics"].items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if "_k" not in k)
        print(f"{payload['task']} {split}: {shown or 'unlabelled (predictions only)'}")
    print(f"eval.json and predictions in {args.out}")
    return 0


register_command("finetune", "finetune a pretrained FOLNet on GLUE, SQuAD 2.0, FOLIO, CLUTRR "
                 "or the kinship task (median over seeds)", _finetune_configure, _finetune_run,
                 requires=("tokenizers", "tqdm"))
register_command("evaluate", "score a finetuned FOLNet on a task's evaluation splits",
                 _evaluate_configure, _evaluate_run, requires=("tokenizers",))
