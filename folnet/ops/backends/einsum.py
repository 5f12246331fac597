"""The reference backend: masks, the kernel activation, then one opt_einsum contraction, on any
device and dtype. Every other backend is tested against it."""

from __future__ import annotations

import functools

import opt_einsum
import torch

from folnet.ops import masks
from folnet.ops.backends.base import Backend, activated_kernel
from folnet.tracing import traced


@functools.lru_cache(maxsize=1024)
def _expression(equation: str, shapes: tuple[tuple[int, ...], ...]):
    return opt_einsum.contract_expression(equation, *shapes)


class EinsumBackend(Backend):
    """Kernel and premise materialised in the spec's layouts; causal calls broadcast a kernel
    that lacks the query token over it (per-query normalisation)."""

    name = "einsum"

    def why_not(self, spec, call):
        return None

    def run(self, op, kernel, premise, pad, *, order, dropout_p, premasked=frozenset()):
        spec = op.spec
        K, kidx = activated_kernel(spec, kernel, pad, order=order, dropout_p=dropout_p,
                                   premasked="kernel" in premasked)
        return contract(spec, K, kidx, premise, order=order, premasked=premasked)


def contract(spec, K: torch.Tensor, kidx: tuple[str, ...], premise, *, order,
             premasked=frozenset()) -> torch.Tensor:
    """An activated kernel ``K`` (laid out as ``kidx``) contracted with the premise (the
    spec's premise mask applied): the output laid out as the spec's. The einsum backend's
    contraction, and `folnet.ops.compiler.CompiledOperator.run_recorded`'s."""
    v = premise.laid_out(spec.premise)
    pkeep = masks.premise_keep(spec, spec.premise, order=order,
                               premasked="premise" in premasked)
    if pkeep is not None:
        v = v * pkeep
    k, p, o = ("".join(t) for t in (kidx, spec.premise, spec.output))
    equation = f"b{k},b{p}->b{o}"
    if traced():
        return torch.einsum(equation, K, v)  # symbolic shapes: no cache keyed by them
    return _expression(equation, (tuple(K.shape), tuple(v.shape)))(K, v, backend="torch")
