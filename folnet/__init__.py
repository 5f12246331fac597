"""folnet: FOLNet (First-Order Logic Network, ICLR 2023) as a PyTorch library.

Neural logic operators are declared as data (specs/operators.toml), validated, registered and
compiled into kernels (`folnet.ops`); architectures are built from operator strings such as
``"jmc.atp"`` (`folnet.arch`); pretraining and finetuning live in `folnet.train`.
"""

from folnet.errors import FolnetError
from folnet.ops import (
    OperatorSpec,
    compile_operator,
    get_operator,
    operators,
    register_operator,
    unregister_operator,
)

__version__ = "0.1.0"

__all__ = [
    "FolnetError",
    "OperatorSpec",
    "__version__",
    "compile_operator",
    "get_operator",
    "operators",
    "register_operator",
    "unregister_operator",
]
