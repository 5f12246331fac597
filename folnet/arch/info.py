"""`folnet info`: parameters per component, FLOPs per sequence, activation memory estimates.

The model is built on the ``meta`` device, so even the large preset costs no memory or time:
FLOPs come from ``torch.utils.flop_counter`` over a forward (and forward+backward = 3x) pass on
meta tensors, activation memory from the tensors autograd saves for the backward pass.

The sequence length is bounded (`check_seq_len`): by the model's ``max_positions`` where it has
an absolute-position table (a longer sequence cannot run), and by `MAX_INFO_SEQ_LEN` for every
model. Why the second bound: nothing is allocated, but the blocked estimate runs (T / 256)^2 row
blocks per layer (`folnet.arch.layer.memory_modes.BLOCK_PAIRS`), minutes at the bound and hours
at 32k; and at T = 10^9 the size of one B x T x T x D2 meta tensor does not fit a 64-bit
integer, which torch reports as "Storage size calculation overflowed".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch.utils.flop_counter import FlopCounterMode

from folnet.arch.config import ModelConfig
from folnet.arch.layer.atoms import relative_position_ids, token_positions
from folnet.arch.layer.domain import Domain
from folnet.arch.layer.memory_modes import AUTO_MIN_T
from folnet.arch.models.encoder import FolnetModel
from folnet.errors import FolnetError

#: The longest sequence `model_info` counts (see the module docstring).
MAX_INFO_SEQ_LEN = 4096


@dataclass(frozen=True)
class ModelInfo:
    ops: str
    seq_len: int
    params: dict[str, int]  # component -> parameter count
    total_params: int
    flops_forward: int  # per sequence
    activation_bytes: int  # saved for backward, per sequence, float32, the full square
    activation_bytes_blocked: int  # the same with the layers in row blocks

    def render(self) -> str:
        width = max(len(k) for k in self.params)
        lines = [f"FOLNet {self.ops!r}  (T = {self.seq_len})", "", "parameters:"]
        lines += [f"  {k:<{width}}  {v:>14,}" for k, v in self.params.items()]
        lines += [f"  {'total':<{width}}  {self.total_params:>14,}", ""]
        lines.append(f"FLOPs per sequence: forward {self.flops_forward / 1e9:,.2f} GFLOP, "
                     f"training step ~{3 * self.flops_forward / 1e9:,.2f} GFLOP")
        lines.append(f"FLOPs per token:    forward {self.flops_forward / self.seq_len / 1e6:,.1f}"
                     f" MFLOP")
        lines.append(f"activation memory (saved for backward, float32): "
                     f"{self.activation_bytes / 2**20:,.1f} MiB per sequence; "
                     f"{self.activation_bytes_blocked / 2**20:,.1f} MiB with the mixer and the "
                     f"binary FFN in row blocks (folnet.set_memory(model, 'blocked'); 'auto' "
                     f"blocks from T = {AUTO_MIN_T} on a CPU)")
        return "\n".join(lines)


def parameter_breakdown(model: FolnetModel) -> dict[str, int]:
    """Parameter counts per component: embeddings, each operator (projections + output), the two
    FFNs, the pooler and the head. Operator shares are read off the fused layout."""
    counts: dict[str, int] = defaultdict(int)
    enc = model.encoder
    for name, p in enc.atoms.named_parameters():
        counts[f"embedding.{name.split('.')[0]}"] += p.numel()
    for layer in enc.layers:
        nb = {"U": 0, "B": 0}
        for slot in layer.slots:
            key = f"operator {slot.spec.symbol} ({slot.spec.name})"
            for seg in (slot.kernel, slot.premise):
                d_in = model.cfg.D1 if seg.stream == "U" else model.cfg.D2
                counts[key] += seg.width * d_in + (seg.width if seg.bias else 0)
            d_out = model.cfg.D1 if slot.spec.typing.output == "U" else model.cfg.D2
            counts[key] += slot.out_width * d_out + d_out
            nb[slot.spec.typing.output] += 1
        counts["ffn (unary)"] += sum(p.numel() for p in layer.ffn_u.parameters())
        counts["ffn (binary)"] += sum(p.numel() for p in layer.ffn_b.parameters())
        for name in ("rel_key", "rel_value"):
            if hasattr(layer, name):
                counts["rpe* tables"] += getattr(layer, name).numel()
    counts["pooler"] = sum(p.numel() for p in enc.pooler.parameters())
    head = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoder."))
    if head:
        counts[f"head ({model.head})"] = head
    return dict(counts)


def _saved_and_flops(model: FolnetModel, seq_len: int, mode: str) -> tuple[int, int]:
    """Bytes autograd saves for the backward pass of one training forward of one sequence
    with every layer in memory ``mode``, and the forward's FLOPs."""
    device = next(model.parameters()).device
    ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[id(t)] = t.numel() * t.element_size()
        return t

    layers = list(model.encoder.layers)
    before = [(layer.memory_mode, layer.block_rows) for layer in layers]
    was_training = model.training
    model.train()
    try:
        for layer in layers:
            layer.memory_mode = mode
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with FlopCounterMode(display=False) as counter:
                types = torch.zeros_like(ids)
                rel = (relative_position_ids(types, model.cfg.delta)
                       if model.cfg.relative_ids else None)
                domain = Domain(n=seq_len, rel_ids=rel if model.cfg.position == "rpe*" else None)
                u1, _ = model.encoder(ids, types, domain, token_positions(None, seq_len, device),
                                      rel)
                model.encoder.pool(u1)
    finally:
        model.train(was_training)
        for layer, (mode_was, rows_was) in zip(layers, before, strict=True):
            layer.memory_mode, layer.block_rows = mode_was, rows_was
    return sum(saved.values()), int(counter.get_total_flops())


def saved_bytes(model: FolnetModel, seq_len: int, mode: str = "full") -> int:
    """Bytes autograd saves for the backward pass of one sequence of ``seq_len`` tokens with
    every layer in memory ``mode`` ('full' or 'blocked').

    Why extrapolated: every saved tensor is per token, per token pair or fixed, so the count is
    exactly quadratic in T (checked from 16 to 1,024 tokens in both modes: equal to 1e-13), and
    a long length is read off the parabola through T = 32, 64, 128 -- counting it directly
    would run the blocked path over thousands of row blocks, minutes even on the meta device.
    """
    if seq_len <= 128:
        return _saved_and_flops(model, seq_len, mode)[0]
    xs = (32, 64, 128)
    ys = [_saved_and_flops(model, x, mode)[0] for x in xs]
    total = Fraction(0)
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):  # Lagrange, in exact arithmetic
        term = Fraction(yi)
        for j, xj in enumerate(xs):
            if j != i:
                term *= Fraction(seq_len - xj, xi - xj)
        total += term
    return round(total)


def check_seq_len(seq_len: object, cfg: ModelConfig | None = None, *,
                  name: str = "seq_len") -> None:
    """Raise `FolnetError` naming ``name`` (the option or argument), the value and the limit
    unless ``seq_len`` is an integer from 1 to `MAX_INFO_SEQ_LEN` and, for a config ``cfg``
    with an absolute-position table, to its ``max_positions``. Cheap, so a caller runs it
    before building anything; without ``cfg`` only the first bound is checked."""
    limit, why = MAX_INFO_SEQ_LEN, "the longest sequence folnet info estimates"
    if cfg is not None and cfg.absolute_positions and cfg.max_positions < limit:
        limit, why = cfg.max_positions, (f"the model's max_positions: position {cfg.position!r} "
                                         f"has a table of that many rows")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= limit:
        raise FolnetError(f"{name} must be an integer from 1 to {limit:,} ({why}), got "
                          f"{seq_len!r}")


def model_info(model: FolnetModel, seq_len: int = 128) -> ModelInfo:
    """Count parameters, FLOPs and saved activations of ``model`` (any device; meta is best),
    the activations both for the full square and with the layers in row blocks. ``seq_len``
    is bounded (`check_seq_len`)."""
    check_seq_len(seq_len, model.cfg)
    full, flops = _saved_and_flops(model, seq_len, "full")
    blocked, _ = _saved_and_flops(model, seq_len, "blocked")
    params = parameter_breakdown(model)
    return ModelInfo(ops=str(model.plan), seq_len=seq_len, params=params,
                     total_params=sum(p.numel() for p in model.parameters()),
                     flops_forward=flops, activation_bytes=full,
                     activation_bytes_blocked=blocked)
