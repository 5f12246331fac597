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
        v = premise.laid_out(spec.premise)
        K, kidx = activated_kernel(spec, kernel, pad, order=order, dropout_p=dropout_p,
                                   premasked="kernel" in premasked)
        pkeep = masks.premise_keep(spec, spec.premise, order=order,
                                   premasked="premise" in premasked)
        if pkeep is not None:
            v = v * pkeep
        k, p, o = ("".join(t) for t in (kidx, spec.premise, spec.output))
        equation = f"b{k},b{p}->b{o}"
        if traced():
            return torch.einsum(equation, K, v)  # symbolic shapes: no cache keyed by them
        return _expression(equation, (tuple(K.shape), tuple(v.shape)))(K, v, backend="torch")
