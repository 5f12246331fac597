"""Where every operator of a layer reads and writes: the fused projection layout.

A layer reads each stream once through one fused projection (the concatenation of every
operator's kernel or premise projection from that stream) and writes each stream once through
one fused output projection (docs/design.md section 4). `build_slots` lays the operators' channels
out in them; the released per-operator Linears are a loading concern (`folnet.arch.io.official`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.plan import LayerPlan
from folnet.errors import FolnetError
from folnet.ops.sizes import channel_sizes, evaluate
from folnet.ops.spec import ROLES, TOKEN_LETTERS, OperatorSpec
from folnet.tracing import traced

STREAMS = ("U", "B")


@dataclass(frozen=True)
class Segment:
    """A kernel or premise: where its channels sit in its stream's fused projection."""

    stream: str  # "U" or "B"
    start: int
    width: int
    channels: tuple[int, ...]  # channel sizes in the spec's index-list order
    bias: bool
    name: str = ""  # "j.kernel", "t.premise", ...: what `print(model)` shows


@dataclass(frozen=True)
class OperatorSlot:
    """Static facts of one operator inside a layer, computed once at build time."""

    spec: OperatorSpec
    kernel: Segment
    premise: Segment
    out_start: int  # offset of its output channels in its stream's fused output projection
    out_width: int
    out_channels: tuple[int, ...]  # output channel sizes in the spec's order
    kernel_scale: float  # applied before the softmax (softmax kernels only)
    out_scale: float  # every other constant scale, folded onto the (smaller) output

    def segment(self, role: str) -> Segment:
        return self.kernel if role == "kernel" else self.premise


def natural(idx: tuple[str, ...]) -> tuple[str, ...]:
    """Token letters first (in order), then channel letters (in order): how a projection lays a
    tensor out (channels last) before it is permuted into the spec's index order."""
    return tuple(c for c in idx if c in TOKEN_LETTERS) + tuple(
        c for c in idx if c not in TOKEN_LETTERS)


def build_slots(plan: LayerPlan, cfg: ModelConfig
                ) -> tuple[list[OperatorSlot], dict[str, list[Segment]], dict[str, int]]:
    """Lay every operator's kernel, premise and output channels out in the fused projections:
    the slots, the segments of each stream's projection, each stream's output width."""
    dims = cfg.dims
    offsets = {"U": 0, "B": 0}
    out_offsets = {"U": 0, "B": 0}
    segments: dict[str, list[Segment]] = {"U": [], "B": []}
    slots = []
    for spec in plan.ops:
        sizes = channel_sizes(spec.sizes, dims, symbol=spec.symbol)
        segs = {}
        for role in ROLES:
            stream = spec.stream(role)
            channels = tuple(sizes[c] for c in spec.channels(role))
            proj = spec.kernel_proj if role == "kernel" else spec.premise_proj
            seg = Segment(stream, offsets[stream], math.prod(channels), channels, proj.bias,
                          f"{spec.symbol}.{role}")
            offsets[stream] += seg.width
            segments[stream].append(seg)
            segs[role] = seg
        ks = evaluate(spec.kernel_proj.scale, dims)
        ps = evaluate(spec.premise_proj.scale, dims)
        softmax = spec.activation == "softmax"
        out_stream = spec.typing.output
        out_channels = tuple(sizes[c] for c in spec.channels("output"))
        width = math.prod(out_channels)
        slots.append(OperatorSlot(spec, segs["kernel"], segs["premise"], out_offsets[out_stream],
                                  width, out_channels, ks if softmax else 1.0,
                                  ps * (1.0 if softmax else ks)))
        out_offsets[out_stream] += width
    return slots, segments, out_offsets


class _QuantizationGuard:
    """Refuses to run float after a torch.ao.quantization pass went over the module.

    Why: torch's eager quantization (``quantize_dynamic``, ``convert``) looks a module's type up
    exactly, in its ``qconfig_spec`` and in its float-to-quantized mapping, so it leaves these
    `nn.Linear` subclasses float even when told to quantize ``nn.Linear`` -- silently, while the
    plain Linears around them become int8. Such a pass sets, then deletes, a ``qconfig`` on
    every module it visits; the deletion (the end of a ``convert``) is recorded here, and every
    read of the module (`folnet.arch.adapters`, its own forward) then fails, naming
    `folnet.arch.quantize.quantize_dynamic`, which takes the same arguments and covers these
    projections too (and clears the record where it leaves one float on purpose)."""

    @property
    def qconfig(self):
        try:
            return self.__dict__["_qconfig"]
        except KeyError:
            raise AttributeError("qconfig") from None  # getattr(m, "qconfig", d) gives d

    @qconfig.setter
    def qconfig(self, value) -> None:
        self.__dict__["_qconfig"] = value

    @qconfig.deleter
    def qconfig(self) -> None:
        self.__dict__.pop("_qconfig", None)
        self.__dict__["left_float"] = True

    def check_quantization(self) -> None:
        """Raise if a torch quantization pass left this projection float (see the class)."""
        if self.__dict__.get("left_float"):
            raise FolnetError(
                f"{type(self).__name__} ({self.extra_repr()}) is float32 after "
                f"torch.ao.quantization converted this model: torch matches module types "
                f"exactly, so it cannot reach folnet's fused operator projections; quantize "
                f"with folnet.quantize_dynamic(model, ...) instead (same arguments), which "
                f"covers them")


class FusedProjection(_QuantizationGuard, nn.Linear):
    """One Linear producing every segment a stream feeds; biases only where segments have one
    (``bias`` holds the biased segments' channels, in order). An `nn.Linear` (weight
    ``(width, d_in)``), so that tools that adapt Linears -- PEFT's LoRA -- take it; the layer
    reads it through `folnet.arch.adapters`."""

    def __init__(self, d_in: int, segments: list[Segment]):
        width = sum(s.width for s in segments)
        super().__init__(d_in, width, bias=False)
        self.width = width
        self.runs = tuple((s.width, s.bias) for s in segments)  # (width, biased) in order
        self.names = tuple(s.name for s in segments)
        biased = sum(s.width for s in segments if s.bias)
        self.bias = nn.Parameter(torch.zeros(biased)) if biased else None

    def reset_parameters(self) -> None:
        """Nothing: the model initialises every parameter (`FolnetBase.reset_parameters`), so
        building draws no random numbers here (nn.Linear's own init would shift every seeded
        model's weights)."""

    def extra_repr(self) -> str:
        parts = ", ".join(f"{name} {width}{'+bias' if biased else ''}"
                          for name, (width, biased) in zip(self.names, self.runs, strict=True))
        return f"in_features={self.in_features}, out_features={self.width}: {parts}"

    def full_bias(self) -> torch.Tensor | None:
        return self.full()

    def full(self) -> torch.Tensor | None:
        """The bias over every output channel (zeros where a segment has none), or None: one
        concatenation of the biased segments' pieces (one split, whose backward is one
        concatenation too) and views of a zero vector made once per device and dtype --
        rebuilt from fresh zeros and slices every step, it cost 7 launches a layer."""
        if self.bias is None or all(biased for _, biased in self.runs):
            return self.bias
        pieces = iter(torch.split(self.bias, [w for w, biased in self.runs if biased]))
        zeros = self._zeros(self.bias)
        return torch.cat([next(pieces) if biased else zeros[:width]
                          for width, biased in self.runs])

    def _zeros(self, like: torch.Tensor) -> torch.Tensor:
        """(max width,) zeros on ``like``'s device and dtype, kept (not while torch.compile
        traces: a tensor kept then would be a fake one)."""
        width = max(w for w, biased in self.runs if not biased)
        if traced():
            return like.new_zeros(width)
        key = (like.device, like.dtype)
        cache = self.__dict__.setdefault("_zero_cache", {})
        if key not in cache:
            cache[key] = torch.zeros(width, device=like.device, dtype=like.dtype)
        return cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_quantization()
        return F.linear(x, self.weight, self.full())


class FusedOutput(_QuantizationGuard, nn.Linear):
    """One Linear over the concatenated operator outputs, one bias per operator (summed), as the
    released per-operator output Linears are. ``outputs`` names each operator's output
    channels, in order: ``(("j", 64), ("m", 64), ...)``."""

    def __init__(self, d_in: int, d_out: int, outputs: tuple[tuple[str, int], ...]):
        super().__init__(d_in, d_out, bias=False)
        self.outputs = tuple(outputs)
        self.bias = nn.Parameter(torch.zeros(len(self.outputs), d_out))

    def reset_parameters(self) -> None:
        """Nothing, as `FusedProjection.reset_parameters`."""

    def extra_repr(self) -> str:
        parts = " + ".join(f"{symbol} {width}" for symbol, width in self.outputs)
        return f"in_features={self.in_features} ({parts}), out_features={self.out_features}"

    def full_bias(self) -> torch.Tensor:
        return self.bias.sum(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_quantization()
        return F.linear(x, self.weight, self.bias.sum(0))
