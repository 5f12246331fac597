"""Dynamic quantization of a folnet model: torch's ``quantize_dynamic``, and the operators'
fused projections, which it cannot reach.

Why a wrapper: ``torch.ao.quantization.quantize_dynamic`` decides what to quantize by looking
each module's *exact* type up, in its ``qconfig_spec`` (``propagate_qconfig_``) and in its
float-to-quantized ``mapping`` (``swap_module``). `FusedProjection` and `FusedOutput` are
`nn.Linear` subclasses (so that PEFT takes them), which neither lookup matches: told to
quantize ``{nn.Linear}`` it makes every plain Linear int8 and leaves the projections that carry
most of a layer's weights float32 -- and the layer then refuses to run them
(`folnet.arch.layer.slots`). `quantize_dynamic` here takes the same arguments, runs torch's
call unchanged, then gives each fused projection the qconfig an ``nn.Linear`` in its place
would have got (its name, else its type or ``nn.Linear``, else its parent's, as torch resolves
them) and swaps it for a quantized counterpart holding the same layout.

What then runs in int8: the modules a layer calls (the unary output ``out_u``, the unary FFN,
``cross_*``, the heads) run torch's dynamic int8 product. The ones it reads as weights -- folded
into an einsum, cut into segments, inside the binary FFN kernel -- read the dequantized weight
(the int8 values times their scale) and compute in float32: the binary stream's products are
tall and thin (B T^2 rows, tens of columns), where the int8 product is slower than oneDNN's
float32 on the CPU tried (`folnet.arch.adapters`, docs/results/measurements.md).
benchmarks/quantize.py measures the model's agreement with float32 and its speed, beside a
BERT quantized the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import qconfig as tq

from folnet.arch.layer.slots import FusedOutput, FusedProjection
from folnet.errors import FolnetError

__all__ = ["QuantizedFusedOutput", "QuantizedFusedProjection", "quantize_dynamic"]

_FUSED = (FusedProjection, FusedOutput)


def _set_default(dtype: torch.dtype) -> Any:
    """The qconfig torch gives every type of a ``qconfig_spec`` set for ``dtype``."""
    return {torch.qint8: tq.default_dynamic_qconfig,
            torch.float16: tq.float16_dynamic_qconfig,
            torch.quint8: tq.float_qparams_weight_only_qconfig,
            torch.quint4x2: tq.float_qparams_weight_only_qconfig_4bit}.get(dtype)


def _as_dict(qconfig_spec: Any, dtype: torch.dtype) -> dict:
    """``qconfig_spec`` (None, a set of types, or a dict of types and names) as the dict torch
    reads; for None only its ``nn.Linear`` entry matters here (torch's default quantizes
    Linears for qint8 and float16 only)."""
    if qconfig_spec is None:
        if dtype in (torch.qint8, torch.float16):
            return {nn.Linear: _set_default(dtype)}
        return {}
    if isinstance(qconfig_spec, set):
        return dict.fromkeys(qconfig_spec, _set_default(dtype))
    return dict(qconfig_spec)


def _fused(model: nn.Module, spec: dict) -> Iterator[tuple[nn.Module, str, nn.Module, Any]]:
    """(parent, name, module, qconfig) of every fused projection under ``model``, the qconfig
    resolved as torch's ``propagate_qconfig_`` would for an ``nn.Linear`` there: the module's
    full name, else its type (or ``nn.Linear``), else its parent's qconfig."""
    stack: list[tuple[nn.Module | None, str, str, nn.Module, Any]] = [(None, "", "", model, None)]
    while stack:
        parent, name, prefix, module, inherited = stack.pop()
        own = spec.get(type(module), inherited)
        if isinstance(module, _FUSED) and type(module) not in spec:
            own = spec.get(nn.Linear, inherited)
        own = spec.get(prefix, own)
        if isinstance(module, _FUSED):
            yield parent, name, module, own
        for child_name, child in module.named_children():
            stack.append((module, child_name, f"{prefix}.{child_name}" if prefix else child_name,
                          child, own))


def _quantized_weight(weight: torch.Tensor, qconfig: Any) -> tuple[torch.Tensor, torch.dtype]:
    """``weight`` (out, in) as the qconfig's weight observer quantizes it (qint8, per tensor
    or per output channel), or in float for float16 packing; and that dtype."""
    make = qconfig.weight if qconfig is not None and qconfig.weight is not None else \
        tq.default_dynamic_qconfig.weight
    observer = make()
    w = weight.detach().float()  # (out, in)
    if observer.dtype == torch.float16:
        return w, torch.float16
    if observer.dtype != torch.qint8:
        raise FolnetError(f"dynamic quantization of folnet's fused projections needs qint8 or "
                          f"float16 weights, got dtype={observer.dtype} from the qconfig's "
                          f"weight observer {type(observer).__name__}")
    observer(w)
    scale, zero_point = observer.calculate_qparams()
    if observer.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine):
        return torch.quantize_per_channel(w, scale.double(), zero_point.long(), observer.ch_axis,
                                          torch.qint8), torch.qint8
    return torch.quantize_per_tensor(w, float(scale), int(zero_point), torch.qint8), torch.qint8


class QuantizedFusedProjection(DynamicLinear):
    """A `FusedProjection` with its weight quantized: torch's dynamic quantized Linear, keeping
    the layout the layer reads (``width``, ``runs``, ``names``). Its packed bias is the full
    one, zeros where a segment has none."""

    def __init__(self, in_features: int, runs: tuple[tuple[int, bool], ...],
                 names: tuple[str, ...], dtype: torch.dtype = torch.qint8):
        width = sum(w for w, _ in runs)
        super().__init__(in_features, width, dtype=dtype)
        self.width, self.runs, self.names = width, tuple(runs), tuple(names)

    @classmethod
    def from_fused(cls, mod: FusedProjection, qconfig: Any) -> QuantizedFusedProjection:
        qweight, dtype = _quantized_weight(mod.weight, qconfig)
        q = cls(mod.in_features, mod.runs, mod.names, dtype=dtype)
        full = mod.full()
        q.set_weight_bias(qweight, None if full is None else full.detach().float())
        return q

    def _get_name(self) -> str:
        return "DynamicQuantizedFusedProjection"

    def extra_repr(self) -> str:
        parts = ", ".join(f"{name} {width}{'+bias' if biased else ''}"
                          for name, (width, biased) in zip(self.names, self.runs, strict=True))
        return (f"in_features={self.in_features}, out_features={self.width}: {parts}, "
                f"dtype={self._packed_params.dtype}")


class QuantizedFusedOutput(DynamicLinear):
    """A `FusedOutput` with its weight quantized: torch's dynamic quantized Linear, keeping
    ``outputs``; its packed bias is the per-operator biases summed, as `FusedOutput` adds
    them."""

    def __init__(self, in_features: int, out_features: int,
                 outputs: tuple[tuple[str, int], ...], dtype: torch.dtype = torch.qint8):
        super().__init__(in_features, out_features, dtype=dtype)
        self.outputs = tuple(outputs)

    @classmethod
    def from_fused(cls, mod: FusedOutput, qconfig: Any) -> QuantizedFusedOutput:
        qweight, dtype = _quantized_weight(mod.weight, qconfig)
        q = cls(mod.in_features, mod.out_features, mod.outputs, dtype=dtype)
        q.set_weight_bias(qweight, mod.bias.detach().float().sum(0))  # (n_ops, D) -> (D,)
        return q

    def _get_name(self) -> str:
        return "DynamicQuantizedFusedOutput"

    def extra_repr(self) -> str:
        parts = " + ".join(f"{symbol} {width}" for symbol, width in self.outputs)
        return (f"in_features={self.in_features} ({parts}), out_features={self.out_features}, "
                f"dtype={self._packed_params.dtype}")


_QUANTIZED = {FusedProjection: QuantizedFusedProjection, FusedOutput: QuantizedFusedOutput}


def quantize_dynamic(model: nn.Module, qconfig_spec: Any = None, dtype: torch.dtype = torch.qint8,
                     mapping: dict | None = None, inplace: bool = False) -> nn.Module:
    """``torch.ao.quantization.quantize_dynamic(model, qconfig_spec, dtype, mapping, inplace)``
    that also quantizes folnet's fused operator projections wherever an ``nn.Linear`` in their
    place would be (see the module's docstring): ``folnet.quantize_dynamic(model,
    {torch.nn.Linear}, dtype=torch.qint8)``. A ``mapping`` without ``nn.Linear`` leaves them
    float, as it leaves Linears. Returns the quantized model (``model`` itself with
    ``inplace``)."""
    from torch.ao.quantization import quantize_dynamic as torch_quantize_dynamic

    model = torch_quantize_dynamic(model, qconfig_spec, dtype=dtype, mapping=mapping,
                                   inplace=inplace)
    spec = _as_dict(qconfig_spec, dtype)
    linears = mapping is None or nn.Linear in mapping
    for parent, name, module, qconfig in list(_fused(model, spec)):
        wanted = qconfig is not None and (linears or type(module) in mapping)
        if not wanted:  # left float on purpose, not a module torch skipped: drop the mark
            module.__dict__.pop("left_float", None)
            continue
        parent._modules[name] = _QUANTIZED[type(module)].from_fused(module, qconfig)
    return model
