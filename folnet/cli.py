"""The ``folnet`` command line: one sub-command per job, each a thin wrapper over the API."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from folnet.errors import FolnetError

_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable]] = {}


def register_command(
    name: str,
    help_text: str,
    configure: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int | None],
) -> None:
    """Add a sub-command: ``configure(parser)`` declares its options, ``run(args)`` does it."""
    _COMMANDS[name] = (help_text, configure, run)


def _ops_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true", help="print a markdown table")


def _ops_run(args: argparse.Namespace) -> int:
    from folnet.ops.table import registry_table

    print(registry_table(fmt="markdown" if args.markdown else "text"))
    return 0


register_command("ops", "print the operator registry (the paper's Table 2, from the data)",
                 _ops_configure, _ops_run)


def _load_subcommands() -> None:
    """Import the modules that register the heavier sub-commands (arch, train)."""
    import importlib

    for module in ("folnet.arch.cli", "folnet.train.pretrain.cli", "folnet.train.finetune.cli",
                   "folnet.train.ablate.cli"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def build_parser() -> argparse.ArgumentParser:
    _load_subcommands()
    parser = argparse.ArgumentParser(prog="folnet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, configure, _run) in _COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _help, _configure, run = _COMMANDS[args.command]
    try:
        return int(run(args) or 0)
    except FolnetError as exc:
        print(f"folnet {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
