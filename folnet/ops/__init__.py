"""Neural logic operators as data: specs, registry, compiled kernels."""

from folnet.ops.backends import BACKENDS, PRIORITY, OpCall, Operand
from folnet.ops.compiler import BACKEND_NAMES, CompiledOperator, compile_operator
from folnet.ops.registry import (
    get_operator,
    operators,
    parse_spec_file,
    register_operator,
    unregister_operator,
)
from folnet.ops.spec import OperatorSpec, Projection, Typing, parse_spec, parse_typing

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "PRIORITY",
    "CompiledOperator",
    "OpCall",
    "Operand",
    "OperatorSpec",
    "Projection",
    "Typing",
    "compile_operator",
    "get_operator",
    "operators",
    "parse_spec",
    "parse_spec_file",
    "parse_typing",
    "register_operator",
    "unregister_operator",
]
