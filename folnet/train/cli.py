"""``folnet pretrain``: every `PretrainConfig` field as a flag, over an optional TOML file.

The flags are generated from the dataclass, so the command line, the TOML files under
``specs/train/`` and the Python API can never drift apart. Only flags the user actually gives
override the file (their argparse default is None).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from folnet.cli import register_command
from folnet.errors import FolnetError

_SCALARS = {"str": str, "int": int, "float": float}
_METAVARS = {"str": "TEXT", "int": "N", "float": "X"}


def _model_item(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as int, float, or else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = (part.strip() for part in text.split("=", 1))
    for cast in (int, float):
        try:
            return key, cast(raw)
        except ValueError:
            continue
    return key, raw


def _pretrain_configure(p: argparse.ArgumentParser) -> None:
    from folnet.train.pretrain_config import PretrainConfig, flag

    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file of options (defaults: specs/train/pretrain.toml)")
    for f in dataclasses.fields(PretrainConfig):
        text = f.metadata.get("help", "")
        kind = str(f.type).removesuffix(" | None")
        if f.name == "model":
            p.add_argument("--model", metavar="KEY=VALUE", action="append", type=_model_item,
                           default=None, help=text + "; repeatable")
        elif f.name == "resume":
            p.add_argument("--resume", nargs="?", const="latest", default=None,
                           metavar="CHECKPOINT", help=text + " (bare --resume: latest)")
        elif kind == "bool":
            p.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None,
                           help=text)
        else:
            p.add_argument(flag(f.name), type=_SCALARS[kind], default=None, help=text,
                           metavar=_METAVARS[kind])


def _pretrain_run(args: argparse.Namespace) -> int:
    from folnet.train.pretrain import pretrain
    from folnet.train.pretrain_config import PretrainConfig, load_pretrain_config

    overrides: dict[str, Any] = {}
    for f in dataclasses.fields(PretrainConfig):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        overrides[f.name] = dict(value) if f.name == "model" else value
    config = load_pretrain_config(args.config, overrides)
    if config.out is None:
        raise FolnetError("--out is required: the run directory for checkpoints and logs")
    final = pretrain(config)
    if os.environ.get("RANK", "0") == "0":
        print(f"final model: {final}")
    return 0


register_command("pretrain", "pretrain a FOLNet with MLM + NSP/SOP (LAMB, AMP, DDP/FSDP, "
                 "exact resume)", _pretrain_configure, _pretrain_run)
