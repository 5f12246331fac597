"""``folnet pretrain``: every `PretrainConfig` field as a flag, over an optional TOML file.

The flags are generated from the dataclass, so the command line, the TOML files under
``specs/train/`` and the Python API can never drift apart. Only flags the user actually gives
override the file (their argparse default is None).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
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


def add_config_flags(p: argparse.ArgumentParser, config_cls: type, flag: Callable[[str], str],
                     special: Mapping[str, Callable[[argparse.ArgumentParser, str], None]]
                     ) -> None:
    """One flag per field of the frozen dataclass ``config_cls`` (default None: only flags the
    user gives override the file); ``special`` adds a field's flag itself, given its help."""
    for f in dataclasses.fields(config_cls):
        text = f.metadata.get("help", "")
        kind = str(f.type).removesuffix(" | None")
        if f.name in special:
            special[f.name](p, text)
        elif kind == "bool":
            p.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None,
                           help=text)
        elif kind.startswith("tuple"):
            p.add_argument(flag(f.name), metavar="K,K-K", default=None, help=text)
        else:
            p.add_argument(flag(f.name), type=_SCALARS[kind], default=None, help=text,
                           metavar=_METAVARS[kind])


def given_options(args: argparse.Namespace, config_cls: type) -> dict[str, Any]:
    """The fields of ``config_cls`` that the command line set."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)
            if getattr(args, f.name, None) is not None}


def _pretrain_configure(p: argparse.ArgumentParser) -> None:
    from folnet.train.pretrain.config import PretrainConfig, flag

    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file of options (defaults: specs/train/pretrain.toml)")
    add_config_flags(p, PretrainConfig, flag, {
        "model": lambda q, text: q.add_argument(
            "--model", metavar="KEY=VALUE", action="append", type=_model_item, default=None,
            help=text + "; repeatable"),
        "resume": lambda q, text: q.add_argument(
            "--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
            help=text + " (bare --resume: latest)"),
    })


def _pretrain_run(args: argparse.Namespace) -> int:
    from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config
    from folnet.train.pretrain.loop import pretrain

    overrides = given_options(args, PretrainConfig)
    if "model" in overrides:
        overrides["model"] = dict(overrides["model"])  # the --model KEY=VALUE pairs
    config = load_pretrain_config(args.config, overrides)
    if config.out is None:
        raise FolnetError("--out is required: the run directory for checkpoints and logs")
    final = pretrain(config)
    if os.environ.get("RANK", "0") == "0":
        print(f"final model: {final}")
    return 0


register_command("pretrain", "pretrain a FOLNet with MLM + NSP/SOP (LAMB, AMP, DDP/FSDP, "
                 "exact resume)", _pretrain_configure, _pretrain_run)
