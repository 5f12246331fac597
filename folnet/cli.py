"""The ``folnet`` command line: one sub-command per job, each a thin wrapper over the API.

This module holds the parsing, ``main`` and the commands a core install runs (``ops``,
``info``, ``convert``, ``env``); the training commands register from ``folnet.train.*.cli``,
all of them in the one registry of `folnet.commands`.

Why registration is split from configuration: every command module is imported to list the
commands, so importing one must be cheap (no torch, no training package). A command's options
are declared (``configure``) only when that command runs or asks for its help, and its training
packages are imported only inside ``run``. ``folnet --help`` thus never loads torch, and a
command whose optional packages are missing says which extra to install in one line.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from folnet import __version__
from folnet.checksums import strict_checksums
from folnet.commands import (
    EXTRAS,
    add_operators_flag,
    commands,
    register_command,
    register_operator_file,
)
from folnet.errors import FolnetError, NonFiniteError, choices

__all__ = ["DefaultsFormatter", "OneLineParser", "build_parser", "main", "missing_modules"]

DESCRIPTION = ("FOLNet (First-Order Logic Network): inspect operators and models, convert "
               "released checkpoints, pretrain, finetune, evaluate and run ablations.")


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with ``(default: X)`` for every option that has a real default.

    Unlike argparse's ArgumentDefaultsHelpFormatter it says nothing for None, False and empty
    defaults (flags whose default is "not given"), where "(default: None)" would only confuse.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("(default" in text or default is None or default is False or default == []
                or default is argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def _ops_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    add_operators_flag(p)


def _ops_run(args: argparse.Namespace) -> int:
    from folnet.ops.table import registry_table

    print(registry_table(fmt="markdown" if args.markdown else "text"))
    return 0


register_command("ops", "print the operator registry (the paper's Table 2, from the data)",
                 _ops_configure, _ops_run)


# -- info and convert: the architecture layer's commands, which a core install runs. They live
# here because importing any module of folnet.arch loads the models (and torch) -------------


def _info_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", help="operator string, e.g. jmc.atp")
    p.add_argument("--preset", default="base", help="model size preset: tiny, small, base or "
                   "large (folnet/specs/models/)")
    p.add_argument("--seq-len", type=int, default=128, metavar="N",
                   help="tokens per sequence the FLOPs and activation memory are counted for")
    p.add_argument("--vocab-size", type=int, default=None, metavar="N",
                   help="vocabulary size (default: the preset's)")
    p.add_argument("--D2", type=int, default=None, metavar="N",
                   help="width of the binary (relation) stream (default: the preset's)")
    p.add_argument("--position", default=None,
                   help="position encoding: rpe, ape, ape+rpe, rpe* or none (default: the "
                   "preset's, rpe)")
    add_operators_flag(p)


def _info_run(args: argparse.Namespace) -> int:
    import torch

    from folnet.arch.build import build_model
    from folnet.arch.config import SIZE_LIMITS
    from folnet.arch.info import check_seq_len, model_info

    # every integer option is range-checked before anything is built, naming the option
    check_seq_len(args.seq_len, name="--seq-len")
    for option, name in (("--vocab-size", "vocab_size"), ("--D2", "D2")):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= SIZE_LIMITS[name]:
            raise FolnetError(f"{option} must be an integer from 1 to {SIZE_LIMITS[name]:,}, "
                              f"got {value}")
    overrides = {k: v for k, v in (("vocab_size", args.vocab_size), ("D2", args.D2),
                                   ("position", args.position)) if v is not None}
    with torch.device("meta"):
        model = build_model(args.ops, preset=args.preset, **overrides)
    check_seq_len(args.seq_len, model.cfg, name="--seq-len")  # the model's max_positions
    print(model_info(model, args.seq_len).render())
    return 0


def _convert_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("prefix", help="released checkpoint prefix (PREFIX.cfg and PREFIX.pt), or "
                   "a sharded training checkpoint (folnet pretrain --fsdp: "
                   "RUN/checkpoints/step_N)")
    p.add_argument("outdir", help="directory for config.json + model.safetensors (for a "
                   "sharded checkpoint: a new directory, which also gets its tokenizer)")


def _convert_run(args: argparse.Namespace) -> int:
    """Why the output folder is checked first and its writes wrapped: a file in its place, a
    missing or read-only parent would otherwise surface as an OSError traceback, after the
    conversion was done for nothing."""
    from pathlib import Path

    from folnet.arch.convert import load_official
    from folnet.arch.io.model_dir import is_sharded_checkpoint, save_pretrained
    from folnet.atomic_write import writing

    outdir = Path(args.outdir)
    if is_sharded_checkpoint(args.prefix):
        from folnet.arch.convert import convert_sharded

        with writing(outdir):
            convert_sharded(args.prefix, outdir)
        print(f"converted sharded checkpoint {args.prefix} -> {args.outdir}")
        return 0
    if outdir.exists() and not outdir.is_dir():
        raise FolnetError(f"outdir {str(outdir)!r} exists and is not a directory: name a new "
                          f"or existing directory for config.json and model.safetensors")
    model = load_official(args.prefix)
    with writing(outdir):
        save_pretrained(model, outdir)
    print(f"converted {args.prefix} ({model.plan}, head {model.head}) -> {args.outdir}")
    return 0


def _env_run(args: argparse.Namespace) -> int:
    from folnet.environment import report

    print(report())
    return 0


register_command("env", "what a bug report needs: folnet, Python, torch, the device or CPU "
                 "kernels, the optional packages", lambda p: None, _env_run)
register_command("info", "parameters per component, FLOPs per sequence, activation memory",
                 _info_configure, _info_run)
register_command("convert", "convert a released FOLNet checkpoint (PREFIX.cfg/.pt), or a "
                 "sharded training checkpoint, to a model directory",
                 _convert_configure, _convert_run)


def _load_subcommands() -> None:
    """Import the modules that register the training sub-commands (cheap: see the
    docstring); imported here, not at the top, so that ``import folnet.cli`` stays light."""
    # each registers its commands on import
    import folnet.train.ablate.cli
    import folnet.train.finetune.cli
    import folnet.train.pretrain.cli  # noqa: F401


def _extra_of(module: str) -> str:
    return next(name for name, modules in EXTRAS.items() if module in modules)


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The modules of ``modules`` that cannot be imported (found without importing them)."""
    missing = []
    for module in modules:
        if module in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder refusing it, or a broken parent
            found = False
        if not found:
            missing.append(module)
    return missing


def _missing_extra_message(command: str, missing: Sequence[str]) -> str:
    extras = sorted({_extra_of(m) for m in missing})
    spelled = ",".join(extras)
    return (f"folnet {command} needs the [{spelled}] extra: pip install 'folnet[{spelled}]' "
            f"(missing: {', '.join(missing)})")


class OneLineParser(argparse.ArgumentParser):
    """argparse as the folnet commands use it: no abbreviated options (``--step 2`` was taken
    as ``--steps 2``: a typo must not silently mean another option), and a usage error is one
    line on stderr that names the closest option or command, not the whole usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {self.suggest(message)}\n")

    def options(self) -> list[str]:
        return [o for action in self._actions for o in action.option_strings]

    def suggest(self, message: str) -> str:
        """``message`` with "did you mean" added for an unrecognised option."""
        if not message.startswith("unrecognized arguments:"):
            return message
        given = message.split(":", 1)[1].split()
        wrong = next((w for w in given if w.startswith("-")), given[0] if given else "")
        name = wrong.split("=", 1)[0]
        known = {o.lstrip("-"): o for o in self.options()}  # the dashes alone are no likeness
        close = difflib.get_close_matches(name.lstrip("-"), list(known), n=1, cutoff=0.6)
        hint = f"; did you mean {known[close[0]]}?" if close else f"; see {self.prog} --help"
        return f"unrecognized {'option' if name.startswith('-') else 'argument'} {name!r}{hint}"


def unknown_command(word: str) -> str:
    """The one line for a command that does not exist, with the closest one."""
    close = difflib.get_close_matches(word, list(commands()), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}?" if close else f"use {choices(sorted(commands()))}"
    return f"folnet: error: unknown command {word!r}; {hint}"


def _command_in(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv``: its first word that is not an option (the top-level
    options, --help and --version, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(command: str | None = None
                 ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and one sub-parser per command; only ``command``'s options are declared
    (every command's when None, as tests and documentation want)."""
    _load_subcommands()
    parser = OneLineParser(prog="folnet", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"folnet {__version__}",
                        help="print the version of folnet and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=OneLineParser)
    parsers = {}
    for name, cmd in commands().items():
        parsers[name] = sub.add_parser(name, help=cmd.help, description=cmd.help,
                                       formatter_class=DefaultsFormatter)
        if command is None or name == command:
            cmd.configure(parsers[name])
            parsers[name].add_argument(
                "--strict-checksums", action="store_true",
                help="refuse a model directory without checksums.json instead of loading it "
                     "unchecked with a warning (also: FOLNET_STRICT_CHECKSUMS=1)")
    return parser, parsers


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; user errors (bad options, missing extras) are one line and exit 2; a
    training run stopped by NaN or inf (`NonFiniteError`) is one line and exits 1; Ctrl-C is one
    line and exits 130."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    _load_subcommands()
    if command is not None and command not in commands():
        print(unknown_command(command), file=sys.stderr)
        return 2
    parser, parsers = build_parser(command or "")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the sub-command's usage, not the top-level one
        parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    cmd = commands()[args.command]
    missing = missing_modules(cmd.requires)
    if missing:
        print(_missing_extra_message(args.command, missing), file=sys.stderr)
        return 2
    try:
        register_operator_file(args)  # --operators, before anything reads an operator string
        with strict_checksums(bool(getattr(args, "strict_checksums", False))):
            return int(cmd.run(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C: one line (where a run says how to go on)
        print(f"folnet {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130
    except NonFiniteError as exc:  # the run failed, the command was right: not 2
        print(f"folnet {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except FolnetError as exc:
        print(f"folnet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional module the command did not declare
        top = (exc.name or "").split(".")[0]
        if not any(top in modules for modules in EXTRAS.values()):
            raise
        print(_missing_extra_message(args.command, [top]), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
