"""folnet: FOLNet (First-Order Logic Network, ICLR 2023) as a PyTorch library.

Neural logic operators are declared as data (folnet/specs/operators.toml), validated, registered and
compiled into kernels (`folnet.ops`); architectures are built from operator strings such as
``"jmc.atp"`` (`folnet.arch`); pretraining and finetuning live in `folnet.train`.

The names below are imported on first use (PEP 562 ``__getattr__``). Why: every ``folnet``
command, ``folnet --help`` included, first imports this package, and importing torch costs more
than a second; a command that never builds a model should not pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from folnet.errors import FolnetError

#: The package's version; pyproject.toml reads it from here (one place to bump).
__version__ = "0.2.0"

# public name -> the module that defines it
_EXPORTS = {
    "FolnetModel": "folnet.arch", "FolnetOutput": "folnet.arch", "ModelConfig": "folnet.arch",
    "build_model": "folnet.arch", "from_pretrained": "folnet.arch",
    "load_official": "folnet.arch", "save_pretrained": "folnet.arch",
    "set_memory": "folnet.arch", "quantize_dynamic": "folnet.arch.quantize",
    "OperatorSpec": "folnet.ops", "compile_operator": "folnet.ops",
    "get_operator": "folnet.ops", "operators": "folnet.ops",
    "register_operator": "folnet.ops", "unregister_operator": "folnet.ops",
}
# modules reachable as attributes after a bare ``import folnet``, as they were when the names
# above were imported eagerly
_SUBMODULES = frozenset({"arch", "ops", "train", "hf", "runtime", "cli"})

if TYPE_CHECKING:  # what static tools see; at run time `__getattr__` imports these
    from folnet.arch import (
        FolnetModel,
        FolnetOutput,
        ModelConfig,
        build_model,
        from_pretrained,
        load_official,
        save_pretrained,
        set_memory,
    )
    from folnet.arch.quantize import quantize_dynamic
    from folnet.ops import (
        OperatorSpec,
        compile_operator,
        get_operator,
        operators,
        register_operator,
        unregister_operator,
    )

__all__ = [
    "FolnetError",
    "FolnetModel",
    "FolnetOutput",
    "ModelConfig",
    "OperatorSpec",
    "__version__",
    "build_model",
    "compile_operator",
    "from_pretrained",
    "get_operator",
    "load_official",
    "operators",
    "quantize_dynamic",
    "register_operator",
    "save_pretrained",
    "set_memory",
    "unregister_operator",
]


def __getattr__(name: str) -> Any:
    """Import a public name (or a sub-package) the first time it is asked for."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"folnet.{name}")
    raise AttributeError(f"module 'folnet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
