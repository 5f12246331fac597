"""``folnet pretrain``: every `PretrainConfig` field as a flag, over an optional TOML file.

The flags are generated from the dataclass (`folnet.train.options.add_flags`), so the command
line, the TOML files under ``folnet/specs/train/`` and the Python API can never drift apart.
Only flags the user actually gives override the file (their argparse default is None); the help
shows the defaults a run starts from, loaded the way a run loads them (the dataclass defaults,
under whatever ``folnet/specs/train/pretrain.toml`` sets: nothing, as shipped), so the help
cannot show a value the run would not use.

The run itself prints the one closing line ("done: N steps; final model and tokenizer in ..."),
so this wrapper prints nothing after it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from folnet.commands import register_command
from folnet.errors import FolnetError
from folnet.train.options import add_flags, given_flags


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


def run_defaults() -> dict[str, Any]:
    """The options a run without ``--config`` or flags uses, as the help shows them (unset
    options, None, are left out: their help says what happens)."""
    from folnet.train.pretrain.config import load_pretrain_config

    return {k: v for k, v in load_pretrain_config().to_dict().items() if v is not None}


def _configure(p: argparse.ArgumentParser) -> None:
    from folnet.train.pretrain.config import PretrainConfig

    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file of options over the defaults shown here; flags override both")
    add_flags(p, PretrainConfig, {
        "model": lambda q, text: q.add_argument(
            "--model", metavar="KEY=VALUE", action="append", type=_model_item, default=None,
            help=text + "; repeatable"),
        "resume": lambda q, text: q.add_argument(
            "--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
            help=text + " (bare --resume: latest)"),
    }, defaults=run_defaults())


def resumed_run(overrides: dict[str, Any]) -> Path | None:
    """The run a ``--resume`` continues, whose run_config.json then gives every option not
    given again (a changed one is refused, naming it). ``--resume RUN`` names the run
    directory itself (or one of its checkpoints) and stands for ``--out RUN --resume``;
    ``--resume`` with ``--out RUN`` reads RUN. None when nothing is resumed, or OUT holds no
    run yet (``--resume auto`` on a new OUT)."""
    resume, out = overrides.get("resume"), overrides.get("out")
    if resume is None:
        return None
    if out is None and resume not in ("latest", "auto"):
        given = Path(resume)
        run = given if (given / "run_config.json").is_file() else given.parent.parent
        if (run / "run_config.json").is_file() and (run == given
                                                    or given.parent.name == "checkpoints"):
            overrides["out"] = str(run)
            if run == given:
                overrides["resume"] = "latest"
            return run
        return None
    run = Path(out) if out is not None else None
    return run if run is not None and (run / "run_config.json").is_file() else None


def _run(args: argparse.Namespace) -> int:
    from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config
    from folnet.train.pretrain.loop import pretrain

    overrides = given_flags(args, PretrainConfig)
    if "model" in overrides:
        overrides["model"] = dict(overrides["model"])  # the --model KEY=VALUE pairs
    config = load_pretrain_config(args.config, overrides, run=resumed_run(overrides))
    if config.out is None:
        raise FolnetError("--out is required: the run directory for checkpoints and logs")
    pretrain(config)  # its logger prints the final line (rank 0 only)
    return 0


register_command("pretrain", "pretrain a FOLNet with MLM + NSP/SOP (LAMB, AMP, DDP/FSDP, "
                 "exact resume)", _configure, _run, requires=("tokenizers", "tqdm", "datasets"))
