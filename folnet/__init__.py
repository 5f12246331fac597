"""folnet: FOLNet (First-Order Logic Network, ICLR 2023) as a PyTorch library.

Neural logic operators are declared as data (specs/operators.toml), validated, registered and
compiled into kernels (`folnet.ops`); architectures are built from operator strings such as
``"jmc.atp"`` (`folnet.arch`); pretraining and finetuning live in `folnet.train`.
"""

from folnet.arch import (
    FolnetModel,
    FolnetOutput,
    ModelConfig,
    build_model,
    from_pretrained,
    load_official,
    save_pretrained,
)
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
    "register_operator",
    "save_pretrained",
    "unregister_operator",
]
