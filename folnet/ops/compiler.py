"""Compile an operator spec into a callable kernel: ``op(kernel, premise, mask=None)``.

Tensors are batch first and laid out as the spec's index lists say, e.g. for ``j``
(``kernel = "x a h"``, ``premise = "a h s"``, ``output = "x h s"``)::

    op = compile_operator("j")            # backend="auto", causal=False
    u = op(K, v, mask)                    # K (B, T, T, H), v (B, T, H, S) -> u (B, T, H, S)

The kernel is given *before* its activation (the compiled operator applies the softmax over the
R-dim, the masks and the attention dropout). ``backend="auto"`` picks the first backend of the
device's priority list that supports the call and otherwise falls back to einsum; `explain`
says why each backend was or was not taken. Compiled operators are cached per (spec, backend,
causal) and their contraction plans per shape, so nothing is re-parsed on the hot path.
"""

from __future__ import annotations

import functools

import torch

from folnet.errors import FolnetError, choices
from folnet.ops import masks
from folnet.ops.backends import BACKENDS, Backend, Call
from folnet.ops.registry import get_operator
from folnet.ops.spec import TOKEN_LETTERS, OperatorSpec

#: Backend order tried by ``backend="auto"`` per device type. On CUDA the fused kernels come
#: first. On CPU, einsum first: benchmarks/ops.py measured SDPA's math path (taken whenever the
#: bias needs a gradient) slower than einsum for j and t, and no faster in inference.
PRIORITY = {
    "cuda": ("xformers", "sdpa", "einsum"),
    "cpu": ("einsum", "sdpa"),
}
BACKEND_NAMES = ("auto", *BACKENDS)


class CompiledOperator:
    """A spec bound to a backend choice and a causal flag; call it on (kernel, premise, mask)."""

    def __init__(self, spec: OperatorSpec, backend: str = "auto", causal: bool = False):
        if backend not in BACKEND_NAMES:
            raise FolnetError(f"backend {backend!r} is unknown; use {choices(BACKEND_NAMES)}")
        if backend != "auto":
            reason = BACKENDS[backend].why_not_spec(spec, bool(causal))
            if reason is not None:
                raise FolnetError(_cannot(spec, backend, reason))
        self.spec = spec
        self.backend = backend
        self.causal = bool(causal)

    def __repr__(self) -> str:
        return (f"CompiledOperator({self.spec.symbol} {self.spec.name}: {self.spec.equation!r}, "
                f"activation={self.spec.activation}, backend={self.backend!r}, "
                f"causal={self.causal})")

    # -- checks --------------------------------------------------------------------------------
    def _check(self, kernel, premise, mask) -> int:
        spec = self.spec
        sizes: dict[str, int] = {}
        for role, t, idx in (("kernel", kernel, spec.kernel), ("premise", premise, spec.premise)):
            if not isinstance(t, torch.Tensor):
                raise FolnetError(f"operator {spec.symbol!r}: {role} must be a tensor, "
                                  f"got {type(t).__name__}")
            if t.ndim != len(idx) + 1:
                raise FolnetError(
                    f"operator {spec.symbol!r}: {role} must have {len(idx) + 1} dims laid out "
                    f"(batch, {', '.join(idx)}), got shape {tuple(t.shape)}")
            if not t.is_floating_point():
                raise FolnetError(f"operator {spec.symbol!r}: {role} must be floating point, "
                                  f"got {t.dtype}")
            for letter, n in zip(("b", *idx), t.shape, strict=True):
                if sizes.setdefault(letter, n) != n:
                    raise FolnetError(
                        f"operator {spec.symbol!r}: index {letter!r} has size {sizes[letter]} in "
                        f"the kernel but {n} in the {role} (shape {tuple(t.shape)})")
        if kernel.dtype != premise.dtype or kernel.device != premise.device:
            raise FolnetError(f"operator {spec.symbol!r}: kernel ({kernel.dtype}, {kernel.device})"
                              f" and premise ({premise.dtype}, {premise.device}) must match")
        tokens = {sizes[c] for c in sizes if c in TOKEN_LETTERS}
        ntok = max(tokens) if tokens else 0
        if (self.causal or mask is not None) and len(tokens) > 1:
            raise FolnetError(f"operator {spec.symbol!r}: causal or padding masks need every "
                              f"token index of one length, got {sorted(tokens)}")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise FolnetError(f"operator {spec.symbol!r}: mask must be a bool tensor "
                                  f"(True = real token), got {getattr(mask, 'dtype', mask)}")
            if tuple(mask.shape) != (sizes["b"], ntok):
                raise FolnetError(f"operator {spec.symbol!r}: mask must have shape "
                                  f"(batch, tokens) = {(sizes['b'], ntok)}, got "
                                  f"{tuple(mask.shape)}")
        return ntok

    # -- dispatch ------------------------------------------------------------------------------
    def _call_of(self, kernel, premise, mask) -> Call:
        return Call(device=kernel.device, dtype=kernel.dtype, causal=self.causal,
                    padded=mask is not None,
                    requires_grad=kernel.requires_grad or premise.requires_grad)

    def select(self, call: Call) -> Backend:
        """The backend that runs ``call`` (raises if a forced backend cannot)."""
        return _select(self.spec, self.backend, call)

    def explain(self, kernel: torch.Tensor, premise: torch.Tensor, mask=None) -> str:
        """Which backend runs these inputs, and why each other one does not."""
        call = self._call_of(kernel, premise, mask)
        chosen = self.select(call).name
        lines = [f"{self!r} on {call.device.type}/{call.dtype}: runs on {chosen!r}"]
        for name, backend in BACKENDS.items():
            reason = backend.why_not(self.spec, call)
            lines.append(f"  {name}: {'supported' if reason is None else reason}")
        return "\n".join(lines)

    def __call__(self, kernel: torch.Tensor, premise: torch.Tensor,
                 mask: torch.Tensor | None = None, *, dropout_p: float = 0.0,
                 visible: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the operator. ``mask`` (B, T) bool marks real tokens; ``visible`` ((T, T) or
        (B, T, T) bool, keep[row, col]) replaces plain causal order in a causal operator, e.g.
        `folnet.ops.masks.prefix_visibility` for a PrefixLM."""
        ntok = self._check(kernel, premise, mask)
        order = None
        if self.causal:
            order = masks.tril(ntok, kernel.device) if visible is None else visible
            if order.dtype != torch.bool or tuple(order.shape[-2:]) != (ntok, ntok):
                raise FolnetError(f"operator {self.spec.symbol!r}: visible must be a bool "
                                  f"(T, T) or (B, T, T) tensor with T = {ntok}, got "
                                  f"{order.dtype} {tuple(order.shape)}")
        elif visible is not None:
            raise FolnetError(f"operator {self.spec.symbol!r}: visible applies to causal "
                              f"operators only; compile with causal=True")
        backend = self.select(self._call_of(kernel, premise, mask))
        return backend.run(self.spec, kernel, premise, mask, order=order,
                           dropout_p=float(dropout_p), ntok=ntok)


def _cannot(spec: OperatorSpec, backend: str, reason: str) -> str:
    return (f"operator {spec.symbol!r} cannot run on backend {backend!r}: {reason}; use "
            f"backend='auto' or 'einsum'")


@functools.lru_cache(maxsize=1024)
def _select(spec: OperatorSpec, backend: str, call: Call) -> Backend:
    if backend != "auto":
        reason = BACKENDS[backend].why_not(spec, call)
        if reason is not None:
            raise FolnetError(_cannot(spec, backend, reason))
        return BACKENDS[backend]
    for name in PRIORITY.get(call.device.type, ("einsum",)):
        if BACKENDS[name].why_not(spec, call) is None:
            return BACKENDS[name]
    return BACKENDS["einsum"]


@functools.lru_cache(maxsize=256)
def _compile(spec: OperatorSpec, backend: str, causal: bool) -> CompiledOperator:
    return CompiledOperator(spec, backend, causal)


def compile_operator(op: str | OperatorSpec, backend: str = "auto", *,
                     causal: bool = False) -> CompiledOperator:
    """Compile an operator (symbol, name or spec) for a backend; cached."""
    return _compile(get_operator(op), backend, bool(causal))
