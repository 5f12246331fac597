"""The registry of ``folnet`` sub-commands, which the command modules fill and `folnet.cli`
reads.

Why a module of its own: the command modules (``folnet.train.pretrain.cli``,
``folnet.train.finetune.cli``, ``folnet.train.ablate.cli`` and `folnet.cli`'s own) register
here, and `folnet.cli` imports them to list the commands; with the registry in `folnet.cli`
each of them imported back the module that imports it. This module imports nothing of folnet's
training packages and no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from folnet.errors import FolnetError

__all__ = ["EXTRAS", "Command", "add_operators_flag", "commands", "register_command",
           "register_operator_file"]

#: The optional extras of pyproject.toml and the modules folnet imports from each (module and
#: distribution names are the same for all of them). A test keeps this equal to pyproject.
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("datasets", "matplotlib", "tokenizers", "tqdm", "zstandard"),
    "hf": ("accelerate", "peft", "transformers"),
    "gpu": ("triton", "xformers"),
    "cluster": ("submitit",),
}


@dataclass(frozen=True)
class Command:
    """A sub-command: ``configure(parser)`` declares its options, ``run(args)`` does it, and
    ``requires`` names the optional modules ``run`` imports (checked before it starts)."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    requires: tuple[str, ...] = ()


_COMMANDS: dict[str, Command] = {}


def register_command(name: str, help_text: str,
                     configure: Callable[[argparse.ArgumentParser], None],
                     run: Callable[[argparse.Namespace], int | None], *,
                     requires: Sequence[str] = ()) -> None:
    """Add a sub-command. ``requires`` lists modules of `EXTRAS` that ``run`` needs; a missing
    one stops the command with the extra to install instead of a traceback."""
    unknown = sorted(set(requires) - {m for mods in EXTRAS.values() for m in mods})
    if unknown:
        raise FolnetError(f"register_command {name!r}: requires {unknown} are in no extra; "
                          f"known: {sorted(m for mods in EXTRAS.values() for m in mods)}")
    _COMMANDS[name] = Command(help_text, configure, run, tuple(requires))


def commands() -> Mapping[str, Command]:
    """The registered sub-commands by name, in the order they registered (read-only)."""
    return MappingProxyType(_COMMANDS)


def add_operators_flag(p: argparse.ArgumentParser) -> None:
    """``--operators FILE`` on a command that builds or reads a model: the user's operators,
    registered before the command runs (`register_operator_file`)."""
    p.add_argument("--operators", metavar="FILE", default=None, dest="operator_file",
                   help="a TOML file of your own operators ([[operator]] tables, as "
                   "folnet/specs/operators.toml), registered before the command runs")


def register_operator_file(args: argparse.Namespace) -> list[Any]:
    """Register the operators of ``--operators FILE`` (if given); returns their specs."""
    path = getattr(args, "operator_file", None)
    if path is None:
        return []
    from folnet.ops.registry import ensure_registered, read_operator_file

    specs = read_operator_file(path, what="--operators")
    ensure_registered(specs, source=f"--operators {path!r}")
    return specs
