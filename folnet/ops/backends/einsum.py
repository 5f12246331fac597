"""The reference backend: masks, the kernel activation, then one opt_einsum contraction, on any
device and dtype. Every other backend is tested against it."""

from __future__ import annotations

import functools

import opt_einsum

from folnet.ops import masks
from folnet.ops.backends.base import Backend, activate, query_rows


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
        K = kernel.laid_out(spec.kernel)
        v = premise.laid_out(spec.premise)
        kidx = masks.expanded_kernel(spec, order is not None)
        if kidx != spec.kernel:  # (B, *k) -> (B, q, *k): causal normalisation per query token
            ntok = K.shape[1 + spec.kernel.index(spec.rdim)]
            K = K.unsqueeze(1).expand(K.shape[0], query_rows(order, ntok), *K.shape[1:])
        K = activate(spec, K, kidx, order=order, pad=pad, dropout_p=dropout_p,
                     premasked="kernel" in premasked)
        pkeep = masks.premise_keep(spec, spec.premise, order=order,
                                   premasked="premise" in premasked)
        if pkeep is not None:
            v = v * pkeep
        k, p, o = ("".join(t) for t in (kidx, spec.premise, spec.output))
        expr = _expression(f"b{k},b{p}->b{o}", (tuple(K.shape), tuple(v.shape)))
        return expr(K, v, backend="torch")
