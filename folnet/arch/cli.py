"""Sub-commands of the architecture layer: ``folnet info`` and ``folnet convert``."""

from __future__ import annotations

import argparse

import torch

from folnet.cli import register_command


def _info_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", help="operator string, e.g. jmc.atp")
    p.add_argument("--preset", default="base", help="tiny, small, base or large")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--D2", type=int, default=None)
    p.add_argument("--position", default=None)


def _info_run(args: argparse.Namespace) -> int:
    from folnet.arch.build import build_model
    from folnet.arch.info import model_info
    from folnet.errors import FolnetError

    if args.seq_len < 1:
        raise FolnetError(f"--seq-len must be >= 1, got {args.seq_len}")
    overrides = {k: v for k, v in (("vocab_size", args.vocab_size), ("D2", args.D2),
                                   ("position", args.position)) if v is not None}
    with torch.device("meta"):
        model = build_model(args.ops, preset=args.preset, **overrides)
    print(model_info(model, args.seq_len).render())
    return 0


def _convert_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("prefix", help="released checkpoint prefix: PREFIX.cfg and PREFIX.pt")
    p.add_argument("outdir", help="directory for config.json + model.safetensors")


def _convert_run(args: argparse.Namespace) -> int:
    from folnet.arch.checkpoint import save_pretrained
    from folnet.arch.official import load_official

    model = load_official(args.prefix)
    save_pretrained(model, args.outdir)
    print(f"converted {args.prefix} ({model.plan}, head {model.head}) -> {args.outdir}")
    return 0


register_command("info", "parameters per component, FLOPs per sequence, activation memory",
                 _info_configure, _info_run)
register_command("convert", "convert a released FOLNet checkpoint (PREFIX.cfg/.pt) to ours",
                 _convert_configure, _convert_run)
