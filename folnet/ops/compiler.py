"""Compile an operator spec into a callable kernel: ``op(kernel, premise, mask=None)``.

Tensors are batch first and laid out as the spec's index lists say, e.g. for ``j``
(``kernel = "x a h"``, ``premise = "a h s"``, ``output = "x h s"``)::

    op = compile_operator("j")            # backend="auto", causal=False
    u = op(K, v, mask)                    # K (B, T, T, H), v (B, T, H, S) -> u (B, T, H, S)

The kernel is given *before* its activation (the compiled operator applies the masks, the
softmax over the R-dim and the attention dropout). ``backend="auto"`` takes the first backend
of the device's priority list (`folnet.ops.backends.PRIORITY`) that supports the call;
`explain` says why each backend was or was not taken. ``op.rows(...)`` evaluates a causal
operator at some query rows of a longer token domain (cached generation, a decoder's targets
after the encoder's inputs). A model's layer compiles its operators with the model's ``dims``
and hands them projected operands through `CompiledOperator.run` in the layout the selected
backend asks for (`CompiledOperator.route`), folded projections included. Compiled operators
are cached per (spec, backend, causal, dims), their contraction plans per shape.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from folnet.errors import FolnetError, choices
from folnet.ops import masks
from folnet.ops.backends import BACKENDS, DEFAULT_PRIORITY, PRIORITY, Backend, OpCall, Operand
from folnet.ops.backends.base import activated_kernel
from folnet.ops.backends.einsum import contract
from folnet.ops.primitives import dropout
from folnet.ops.primitives.device import kernel_device
from folnet.ops.registry import get_operator
from folnet.ops.spec import ROLES, TOKEN_LETTERS, OperatorSpec
from folnet.tracing import traced

BACKEND_NAMES = ("auto", *BACKENDS)


def parse_backend(backend: object) -> tuple[str, ...] | None:
    """A backend choice as a priority list: None for "auto" (the device's `PRIORITY`), else
    the names of ``"sdpa"`` or ``"sdpa,fused"`` (the first that supports a call runs it)."""
    if not isinstance(backend, str) or not backend.strip():
        raise FolnetError(f"backend must be a string like 'auto', 'einsum' or 'sdpa,fused', "
                          f"got {backend!r}")
    if backend == "auto":
        return None
    names = tuple(n.strip() for n in backend.split(","))
    for name in names:
        if name not in BACKENDS:
            raise FolnetError(f"backend {name!r} is unknown; use {choices(BACKEND_NAMES)} or a "
                              f"comma-separated priority list of {choices(BACKENDS)}")
    return names


@dataclass(frozen=True)
class Route:
    """How one call runs: the backend chosen for it and the layout ("cl", "cf" or "fold") it
    wants each of the kernel and premise in. A layer asks its operator for the route
    (`CompiledOperator.route`), projects the operands as it says and hands it back to
    `CompiledOperator.run`: the layer talks to its operators, never to their backends."""

    backend: Backend
    layouts: Mapping[str, str]  # by role


class CompiledOperator:
    """A spec bound to a backend choice, a causal flag and optionally the model dimensions its
    projections have; call it on (kernel, premise, mask)."""

    def __init__(self, spec: OperatorSpec, backend: str = "auto", causal: bool = False,
                 dims: tuple[tuple[str, int], ...] | None = None):
        names = parse_backend(backend)
        if names is not None:
            reasons = [(n, BACKENDS[n].why_not_spec(spec, bool(causal))) for n in names]
            if all(r is not None for _, r in reasons):
                raise FolnetError(_cannot(spec, backend, reasons))
        self.spec = spec
        self.backend = backend
        self.causal = bool(causal)
        self.dims = dims
        # each backend's decisions, made once here and never while a call is traced
        self.prepared = {name: b.prepare(spec, self.causal, dims) for name, b in BACKENDS.items()}
        self._layouts: dict[str, dict[str, str]] = {}  # `route_by`'s, by backend name

    def __repr__(self) -> str:
        return (f"CompiledOperator({self.spec.symbol} {self.spec.name}: {self.spec.equation!r}, "
                f"activation={self.spec.activation}, backend={self.backend!r}, "
                f"causal={self.causal})")

    # -- dispatch ------------------------------------------------------------------------------
    def describe_call(self, tensor: torch.Tensor, *, padded: bool, requires_grad: bool,
                      rows: bool = False, materialise: bool = False) -> OpCall:
        """The `OpCall` a backend decides on, for tensors like ``tensor``."""
        return OpCall(device=tensor.device, dtype=tensor.dtype, causal=self.causal,
                      padded=padded, requires_grad=requires_grad, rows=rows,
                      materialise=materialise)

    def select(self, call: OpCall) -> Backend:
        """The backend that runs ``call`` (raises if a forced backend cannot)."""
        # (while tracing, the function itself: torch.compile would skip the cache and warn)
        select = _select.__wrapped__ if traced() else _select
        return select(self.spec, self.backend, call, kernel_device(call.device))

    def route(self, call: OpCall) -> Route:
        """The backend that runs ``call`` and the layouts it wants (`Route`)."""
        return self.route_by(self.select(call))

    def route_by(self, backend: Backend) -> Route:
        """The route through ``backend``: how it wants the projected kernel and premise, "cl"
        (channels last), "cf" (channels first) or "fold" (the stream and the projection
        weight)."""
        layouts = self._layouts.get(backend.name)
        if layouts is None:  # a backend's layouts are fixed once the operator is compiled
            layouts = self._layouts[backend.name] = {role: backend.layout(self, role)
                                                     for role in ROLES}
        return Route(backend, layouts)

    def explain(self, kernel: torch.Tensor, premise: torch.Tensor,
                mask: torch.Tensor | None = None, *, rows: torch.Tensor | None = None) -> str:
        """Which backend runs these inputs, and why each other one does not."""
        call = self.describe_call(kernel, padded=mask is not None, rows=rows is not None,
                                  requires_grad=kernel.requires_grad or premise.requires_grad)
        chosen = self.select(call)
        lines = [f"{self!r} on {call.device.type}/{call.dtype}: runs on {chosen.name!r}"]
        if self.dims is not None:
            lay = ", ".join(f"{r} {chosen.layout(self, r)}" for r in ROLES)
            lines[0] += f" ({lay})"
        for name, backend in BACKENDS.items():
            reason = backend.why_not(self.spec, call)
            lines.append(f"  {name}: {'supported' if reason is None else reason}")
        return "\n".join(lines)

    # -- the layer's entry -----------------------------------------------------------------------
    def run(self, kernel: Operand, premise: Operand, pad: torch.Tensor | None, *,
            order: masks.Visibility | None, dropout_p: float = 0.0,
            premasked: frozenset[str] = frozenset(), route: Route | None = None
            ) -> torch.Tensor:
        """Contract operands already laid out as ``route`` asked (no checks: a model's layer
        calls this with tensors it built). Returns the output laid out as the spec's."""
        if route is None:
            t = kernel.tensor
            route = self.route(self.describe_call(
                t, padded=pad is not None, rows=order is not None and order.rows is not None,
                requires_grad=t.requires_grad or premise.tensor.requires_grad))
        return route.backend.run(self, kernel, premise, pad, order=order, dropout_p=dropout_p,
                                 premasked=premasked)

    def probabilities(self, kernel: Operand, pad: torch.Tensor | None, *,
                      order: masks.Visibility | None,
                      premasked: frozenset[str] = frozenset()) -> torch.Tensor:
        """A softmax operator's activated kernel -- masks and the softmax over the R-dim, no
        dropout -- laid out channels first, then tokens, the R-dim last: (B, h, x, a) for
        ``j``, ``m`` and ``t``, (B, s, h, a) for ``c`` (what ``output_attentions`` returns)."""
        spec = self.spec
        if spec.activation != "softmax":
            raise FolnetError(f"operator {spec.symbol!r} has no softmax kernel to return")
        K, kidx = activated_kernel(spec, kernel, pad, order=order,
                                   premasked="kernel" in premasked)
        return K.permute(self._probability_order(kidx))

    def _probability_order(self, kidx: tuple[str, ...]) -> list[int]:
        """The permutation from a kernel laid out as ``kidx`` to `probabilities`' layout."""
        rdim = self.spec.rdim
        letters = (*(c for c in kidx if c not in TOKEN_LETTERS),
                   *(c for c in kidx if c in TOKEN_LETTERS and c != rdim), rdim)
        return [0] + [1 + kidx.index(c) for c in letters]

    def run_recorded(self, kernel: Operand, premise: Operand, pad: torch.Tensor | None, *,
                     order: masks.Visibility | None, dropout_p: float = 0.0,
                     premasked: frozenset[str] = frozenset()
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """`run` on the reference contraction, with `probabilities` -- the very tensor the
        output is computed from (then dropped out), so that gradients reach it: what
        ``output_attentions`` returns, and ``attentions[l].retain_grad()`` reads."""
        spec = self.spec
        if spec.activation != "softmax":
            raise FolnetError(f"operator {spec.symbol!r} has no softmax kernel to return")
        K, kidx = activated_kernel(spec, kernel, pad, order=order,
                                   premasked="kernel" in premasked)
        order_ = self._probability_order(kidx)
        probs = K.permute(order_)
        K = probs.permute([order_.index(i) for i in range(len(order_))])  # kidx again, via probs
        dropped = dropout(K, dropout_p, True) if dropout_p > 0.0 else K
        return contract(spec, dropped, kidx, premise, order=order, premasked=premasked), probs

    # -- the public entries ----------------------------------------------------------------------
    def __call__(self, kernel: torch.Tensor, premise: torch.Tensor,
                 mask: torch.Tensor | None = None, *, dropout_p: float = 0.0,
                 visible: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                 premasked: frozenset[str] = frozenset()) -> torch.Tensor:
        """Apply the operator. ``mask`` (B, n) bool marks real tokens; ``visible`` ((n, n) or
        (B, n, n) bool, keep[row, col]) replaces plain causal order in a causal operator, e.g.
        `folnet.ops.masks.prefix_visibility` for a PrefixLM. With ``rows`` (Q,) the query
        letter's axis holds those domain positions only (see `rows`)."""
        n = self._check(kernel, premise, mask, rows)
        order = None
        if self.causal:
            order = masks.tril(n, kernel.device) if visible is None else visible
            if order.dtype != torch.bool or tuple(order.shape[-2:]) != (n, n):
                raise FolnetError(f"operator {self.spec.symbol!r}: visible must be a bool "
                                  f"(T, T) or (B, T, T) tensor with T = {n}, got "
                                  f"{order.dtype} {tuple(order.shape)}")
            matrix = order if order.ndim == 3 else order.unsqueeze(0)
            order = masks.Visibility(matrix, masks.query_letter(self.spec), rows)
        elif visible is not None:
            raise FolnetError(f"operator {self.spec.symbol!r}: visible applies to causal "
                              f"operators only; compile with causal=True")
        bad = sorted(set(premasked) - set(ROLES))
        if bad:
            raise FolnetError(f"operator {self.spec.symbol!r}: premasked names {bad}; use "
                              f"{choices(ROLES)}")
        call = self.describe_call(kernel, padded=mask is not None, rows=rows is not None,
                                  requires_grad=kernel.requires_grad or premise.requires_grad)
        return self.run(Operand(kernel, self.spec.kernel), Operand(premise, self.spec.premise),
                        mask, order=order, dropout_p=float(dropout_p),
                        premasked=frozenset(premasked), route=self.route(call))

    def rows(self, kernel: torch.Tensor, premise: torch.Tensor, *, rows: torch.Tensor,
             visible: torch.Tensor | None = None, mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, premasked: frozenset[str] = frozenset()) -> torch.Tensor:
        """The operator at query rows only: the query letter's axis has ``len(rows)`` entries
        at domain positions ``rows`` (Q,), every other token axis spans the whole domain of n
        tokens; ``visible`` (B|1, n, n) and ``mask`` (B, n) are over the domain. With ``rows =
        arange(n)`` this is the plain call. ``premasked`` names binary tensors ("kernel",
        "premise") that already carry their Table 5 mask (never a softmax kernel, whose masked
        entries must be -inf-like, not zero): re-masking the cached O(n^2) premise of ``t`` at
        every generation step would cost more than ``t`` itself."""
        return self(kernel, premise, mask, dropout_p=dropout_p, visible=visible, rows=rows,
                    premasked=premasked)

    # -- checks --------------------------------------------------------------------------------
    def _check(self, kernel, premise, mask, rows) -> int:
        """Validate the tensors; returns the domain length n."""
        spec = self.spec
        q = masks.query_letter(spec)
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
        if rows is not None:
            if not isinstance(rows, torch.Tensor) or rows.ndim != 1 or rows.is_floating_point():
                raise FolnetError(f"operator {spec.symbol!r}: rows must be a 1-d integer "
                                  f"tensor of domain positions")
            if q in sizes and sizes[q] != rows.numel():
                raise FolnetError(f"operator {spec.symbol!r}: the query index {q!r} has "
                                  f"{sizes[q]} entries but rows names {rows.numel()}")
        tokens = {sizes[c] for c in sizes if c in TOKEN_LETTERS and not (rows is not None
                                                                          and c == q)}
        n = max(tokens) if tokens else (sizes.get(q, 0))
        if (self.causal or mask is not None or rows is not None) and len(tokens) > 1:
            raise FolnetError(f"operator {spec.symbol!r}: causal or padding masks need every "
                              f"token index of one length, got {sorted(tokens)}")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise FolnetError(f"operator {spec.symbol!r}: mask must be a bool tensor "
                                  f"(True = real token), got {getattr(mask, 'dtype', mask)}")
            if tuple(mask.shape) != (sizes["b"], n):
                raise FolnetError(f"operator {spec.symbol!r}: mask must have shape "
                                  f"(batch, tokens) = {(sizes['b'], n)}, got "
                                  f"{tuple(mask.shape)}")
        return n


def _cannot(spec: OperatorSpec, backend: str, reasons: list[tuple[str, str | None]]) -> str:
    why = "; ".join(f"{n}: {r}" for n, r in reasons) if len(reasons) > 1 else reasons[0][1]
    return (f"operator {spec.symbol!r} cannot run on backend {backend!r}: {why}; use "
            f"backend='auto' or 'einsum'")


@functools.lru_cache(maxsize=1024)
def _select(spec: OperatorSpec, backend: str, call: OpCall, device_type: str) -> Backend:
    """The backend for ``call``: the first of ``backend``'s list, or of ``device_type``'s
    priority (`folnet.ops.primitives.device.kernel_device`), that supports it."""
    names = parse_backend(backend)
    order = names or PRIORITY.get(device_type, DEFAULT_PRIORITY)
    reasons = []
    for name in order:
        reason = BACKENDS[name].why_not(spec, call)
        if reason is None:
            return BACKENDS[name]
        reasons.append((name, reason))
    # 'auto' ends its priority with einsum, which runs every call: only a named list gets here
    raise FolnetError(_cannot(spec, backend, reasons))


@functools.lru_cache(maxsize=256)
def _compile(spec: OperatorSpec, backend: str, causal: bool,
             dims: tuple[tuple[str, int], ...] | None) -> CompiledOperator:
    return CompiledOperator(spec, backend, causal, dims)


def compile_operator(op: str | OperatorSpec, backend: str = "auto", *, causal: bool = False,
                     dims: Mapping[str, int] | None = None) -> CompiledOperator:
    """Compile an operator (symbol, name or spec) for a backend -- "auto", one name of
    `BACKENDS`, or a comma-separated priority list such as "sdpa,fused" -- cached. ``dims``
    (the model's D1, D2, H, S, F1, F2) lets the fused backend plan which projections to fold."""
    frozen = None if dims is None else tuple(sorted(dims.items()))
    return _compile(get_operator(op), backend, bool(causal), frozen)
