"""Step census: what one steady-state training step asks of the hardware, op by op.

    python benchmarks/step_census.py                          # tiny, small, base; both paths
    python benchmarks/step_census.py --presets tiny --paths cuda --optimizer lamb
    python benchmarks/step_census.py --json docs/figures/step_census.json

Counts, in one MLM + NSP step (forward, loss, backward, gradient norm, optimiser step) of a
FOLNet built from a preset and of transformers' BertForPreTraining of the same width, depth,
heads and FFN width, side by side in one run:

* **launching ops**: every ATen call below autograd (a `TorchDispatchMode`) that would launch
  a kernel -- views, allocations without a fill, and reads of a tensor's metadata do not; a
  ``_foreach_`` op counts once (on CUDA it launches one kernel per chunk of tensors);
* **host syncs**: calls that make the host wait for the device's values -- ``item``,
  ``tolist``, ``nonzero``, boolean indexing, ``masked_select``, ``unique`` and the like -- on a
  tensor the step computed or moved to the device (the CPU batch the data loader made is the
  host's own: reading it is free);
* **bytes moved**: each launching op's tensor operands and results, read and written once
  (a lower bound of the traffic: a matrix product reads its operands more than once);
* **the floor** of those bytes: what the step's values cost if each were read once and written
  once per phase (forward, backward, optimiser, loop) -- per storage, the bytes of the union
  of the ranges its reads cover, plus those of the union its writes cover (an op's results,
  an in-place op's operand), where what a data-movement op writes (`MOVES`: a copy, a
  concatenation, a layout change, a zero fill, a gradient scattered into zeros) is no new
  value and is left out, as are reads of what it wrote (until an op writes a value there: a
  zero-filled buffer that a product accumulates into holds values). bytes / floor says how
  often the step passes over memory it need not: a LayerNorm whose output two projections
  read costs one read over the floor, a permuted copy of an operand its write and its read.
  It does not ask whether an intermediate value should exist (a fused kernel removes its
  write and its read, and the floor with them): the two figures are reported side by side.

Each is split by part of the model (atoms, mixer, unary FFN, binary FFN, heads, loss,
optimiser, the loop's own work): a forward op belongs to the innermost module running it, a
backward op to the module whose forward made the autograd node running it.

**Paths.** "cpu" is what folnet does on a CPU. "cuda" makes every kernel choice a CUDA device
makes (`folnet.ops.primitives.device.emulate`: backend priority, the whole square, torch's own
LayerNorm and dropout, the optimiser's fused form, no host-side value checks) while the
tensors stay on the CPU, so the counts are the CUDA step's without a GPU. Counts do not depend
on T or B (bytes do), and are deterministic: the tests hold them at their targets
(tests/project/test_step_census.py).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_json
from steps import Step, bert_step, folnet_step

import folnet
from folnet.ops.primitives.device import emulate

aten = torch.ops.aten

#: ATen ops that launch no kernel: allocations without a fill, aliases, metadata.
NO_LAUNCH = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
    "alias", "lift_fresh", "set_", "resize_", "_unsafe_view", "is_same_size", "record_stream",
    "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "_local_scalar_dense", "is_nonzero", "equal", "_assert_async",
    "_assert_scalar", "_functional_assert_async", "_record_function_enter",
    "_record_function_enter_new", "_record_function_exit",
})
#: Ops that read a tensor's values into the host (the device's queue drained first).
SYNC_OPS = frozenset({
    "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2",
    "unique_dim", "unique_consecutive", "equal", "is_nonzero", "_nested_tensor_from_mask",
    "masked_scatter", "argwhere",
})
#: Ops whose results hold no new value: copies, layouts, concatenations, fills (`Record.floor`).
MOVES = frozenset({
    "clone", "copy_", "_to_copy", "cat", "stack", "contiguous", "slice_backward",
    "select_backward", "as_strided_scatter", "zeros", "zeros_like", "new_zeros", "zero_",
    "fill_", "full", "new_full", "constant_pad_nd", "repeat", "expand_copy", "permute_copy",
    "transpose_copy", "unsqueeze_copy", "index_select", "narrow_copy", "split_with_sizes_copy",
    "unbind_copy", "scalar_tensor", "ones", "ones_like", "new_ones",
})
#: Ops whose boolean-tensor index is a sync (the output size is the count of true values).
BOOL_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
#: Ops whose sync depends on an argument: repeat_interleave without output_size.
_DEVICE_TAG = "_census_device"


def _name(func) -> str:
    return func.overloadpacket.__name__


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _is_device(t: torch.Tensor) -> bool:
    return getattr(t, _DEVICE_TAG, False)


def tag(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as the device's: what is computed from it is too, and reading it syncs."""
    setattr(t, _DEVICE_TAG, True)
    return t


def _syncs(func, args, kwargs) -> bool:
    """Whether this call would make the host wait for the device (given device operands)."""
    name = _name(func)
    if name in SYNC_OPS:
        return True
    if name == "repeat_interleave" and kwargs.get("output_size") is None \
            and any(isinstance(a, torch.Tensor) for a in args[1:2]):
        return True
    if name in BOOL_INDEX_OPS:  # a boolean mask as an index: its count sizes the result
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in indices or ())
    return False


@dataclass
class Record:
    """What a census counted: launching ops by (phase, part, op), bytes by (phase, part), and
    every sync with where it happened."""

    ops: collections.Counter = field(default_factory=collections.Counter)
    bytes: collections.Counter = field(default_factory=collections.Counter)
    op_bytes: collections.Counter = field(default_factory=collections.Counter)  # by op name
    syncs: list[tuple[str, str, str]] = field(default_factory=list)
    # (phase, "read" | "write", storage) -> the byte ranges touched: the floor's (`floor`)
    ranges: dict[tuple[str, str, int], list[tuple[int, int]]] = field(default_factory=dict)
    # every storage touched, held until the record is read, so that no address is reused
    # by a later tensor of the same step (which would merge two tensors' ranges)
    kept: list[Any] = field(default_factory=list, repr=False)
    copies: set[int] = field(default_factory=set)  # storages a data-movement op wrote last

    def launches(self, phase: str | None = None, part: str | None = None) -> int:
        return sum(n for (ph, pa, _), n in self.ops.items()
                   if phase in (None, ph) and part in (None, pa))

    def by(self, index: int) -> collections.Counter:
        out: collections.Counter = collections.Counter()
        for key, n in self.ops.items():
            out[key[index]] += n
        return out

    def moved(self, phase: str | None = None) -> int:
        return sum(n for (ph, _), n in self.bytes.items() if phase in (None, ph))

    def touch(self, phase: str, kind: str, t: torch.Tensor) -> None:
        """Record that ``t``'s bytes were read or written (``kind``) in ``phase``."""
        if t.numel() == 0 or t.layout != torch.strided:
            return
        storage = t.untyped_storage()
        self.kept.append(storage)
        if kind == "read" and storage.data_ptr() in self.copies:
            return  # a copy of a value read where it was made
        size = t.element_size()
        # the span a view reaches: from its first element to its last, whatever its strides
        last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
        start = t.storage_offset() * size
        self.ranges.setdefault((phase, kind, storage.data_ptr()), []).append(
            (start, start + (last + 1) * size))

    def floor(self, phase: str | None = None) -> int:
        """Bytes if every storage's ranges were read once and written once per phase."""
        total = 0
        for (ph, _, _), spans in self.ranges.items():
            if phase not in (None, ph):
                continue
            end = -1
            for lo, hi in sorted(spans):  # the union of the ranges
                if hi <= end:
                    continue
                total += hi - max(lo, end)
                end = hi
        return total

    def summary(self) -> dict[str, Any]:
        bytes_by_part: collections.Counter = collections.Counter()
        for (_, part), n in self.bytes.items():
            bytes_by_part[part] += n
        phases = sorted({ph for ph, _, _ in self.ranges})
        return {"launches": self.launches(), "syncs": len(self.syncs),
                "sync_ops": [f"{phase}/{part}: {op}" for phase, part, op in self.syncs],
                "bytes": self.moved(), "floor": self.floor(),
                "floor_by_phase": {ph: self.floor(ph) for ph in phases},
                "by_phase": dict(self.by(0)), "by_part": dict(self.by(1)),
                "bytes_by_part": dict(bytes_by_part), "top_ops": dict(self.by(2).most_common(12)),
                "top_op_bytes": dict(self.op_bytes.most_common(12))}


class Census(TorchDispatchMode):
    """Counts launching ops, bytes and syncs, attributing each to the current phase and part
    (`Parts`). Device provenance: tensors tagged with `tag` (parameters, the moved batch) and
    everything computed from them."""

    def __init__(self, parts: Parts) -> None:
        super().__init__()
        self.parts = parts
        self.record = Record()
        self.counting = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.counting:
            return out
        inputs = _tensors((args, kwargs))
        device = any(_is_device(t) for t in inputs)
        if device:
            for t in _tensors(out):
                tag(t)
        name = _name(func)
        phase, part = self.parts.where()
        if device and _syncs(func, args, kwargs):
            self.record.syncs.append((phase, part, name))
        if name in NO_LAUNCH or func.is_view:
            return out
        self.record.ops[phase, part, name] += 1
        results = _tensors(out)
        moved = sum(t.numel() * t.element_size() for t in inputs + results)
        self.record.bytes[phase, part] += moved
        self.record.op_bytes[name] += moved
        for t in inputs:
            self.record.touch(phase, "read", t)
        written = results + [a for a, arg in zip(args, func._schema.arguments, strict=False)
                             if isinstance(a, torch.Tensor) and arg.alias_info is not None
                             and arg.alias_info.is_write]
        for t in written:
            if t.layout != torch.strided:
                continue
            if name in MOVES:
                self.record.copies.add(t.untyped_storage().data_ptr())
                self.record.kept.append(t.untyped_storage())
            else:
                self.record.copies.discard(t.untyped_storage().data_ptr())
                self.record.touch(phase, "write", t)
        return out


class Parts:
    """Which phase and part of the step runs now.

    * backward: while autograd's engine evaluates a node -- the part of the module whose
      forward made that node (each module's post-hook claims the nodes its forward made);
    * optimiser: between the optimiser's step hooks;
    * forward: before the backward pass, the innermost module running (``part_of``: module
      path -> part; None: its parent's), or "loss" outside every module;
    * loop: after the backward pass began, outside the optimiser (the gradient norm, the
      step's metrics, the guard).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 part_of: Callable[[str], str | None]) -> None:
        self.names = {id(m): name for name, m in model.named_modules()}
        self.part_of = part_of
        self.stack: list[tuple[str, int]] = []
        self.nodes: dict[int, str] = {}
        self.backward_seen = False
        self.stepping = False
        self.optimizer = optimizer
        self.census: Census | None = None

    def where(self) -> tuple[str, str]:
        node = torch._C._current_autograd_node()
        if node is not None:
            self.backward_seen = True
            seq = node._sequence_nr()
            # a leaf's AccumulateGrad node (the largest numbers) adds into .grad
            return "backward", "grad accumulation" if seq >= 2**62 else self.nodes.get(seq,
                                                                                       "loss")
        if self.stepping:
            return "optimizer", "optimizer"
        if not self.backward_seen:
            return "forward", self.stack[-1][0] if self.stack else "loss"
        return "loop", "loop"

    def _watermark(self) -> int:
        """The autograd sequence number the next node will get (a probe, not counted)."""
        assert self.census is not None
        counting, self.census.counting = self.census.counting, False
        try:
            with torch.enable_grad():
                probe = torch.ones(1, requires_grad=True).mul(1)
            return probe.grad_fn._sequence_nr()
        finally:
            self.census.counting = counting

    def pre(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        part = None if name is None else self.part_of(name)
        if part is None:  # a module without a part of its own: its parent's
            part = self.stack[-1][0] if self.stack else "loss"
        self.stack.append((part, self._watermark()))

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        part, start = self.stack.pop()
        todo = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        seen: set[int] = set()
        while todo:  # every node made since this forward began; inner modules' keep theirs
            node = todo.pop()
            if node is None:
                continue
            seq = node._sequence_nr()
            if seq < start or seq in seen or seq >= 2**62:  # older, visited, a leaf
                continue
            seen.add(seq)
            self.nodes.setdefault(seq, part)
            todo.extend(nxt for nxt, _ in node.next_functions)

    def _step_begins(self, *args: Any) -> None:
        self.stepping = True

    def _step_ends(self, *args: Any) -> None:
        self.stepping = False

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        handles = [nn.modules.module.register_module_forward_pre_hook(self.pre),
                   nn.modules.module.register_module_forward_hook(self.post),
                   self.optimizer.register_step_pre_hook(self._step_begins),
                   self.optimizer.register_step_post_hook(self._step_ends)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


@contextlib.contextmanager
def _counted_reads(census: Census) -> Iterator[None]:
    """``tolist``, ``numpy`` and ``item`` of a device tensor are syncs too (on a CPU tensor
    ``tolist`` reads memory without dispatching, so the census would not see it)."""
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "item")}

    def wrap(name, fn):
        def read(self, *args, **kwargs):
            if census.counting and _is_device(self):
                census.record.syncs.append((*census.parts.where(), name))
            return fn(self, *args, **kwargs)
        return read

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def census(step: Step, warmup: int = 1) -> Record:
    """The record of one steady-state step (after ``warmup`` steps: lazy state made)."""
    with emulate("cuda" if step.path == "cuda" else "cpu"):
        for _ in range(warmup):
            step.run()
        for t in list(step.model.parameters()) + list(step.model.buffers()):
            tag(t)
        for state in step.optimizer.state.values():
            for t in _tensors(state):
                tag(t)
        parts = Parts(step.model, step.optimizer, step.part_of)
        mode = Census(parts)
        parts.census = mode
        with parts.hooked(), mode, _counted_reads(mode):
            step.run()
    mode.record.kept.clear()  # the step is over: its storages may go
    return mode.record


def optimizer_census(preset: str, optimizer: str, *, path: str = "cpu",
                     ops: str = "jmc.atp") -> Record:
    """The launching ops of one optimiser step alone, on a folnet model's gradients."""
    torch.manual_seed(0)
    from folnet.train.engine.optim import build_optimizer
    with emulate("cuda" if path == "cuda" else "cpu"):
        model = folnet.build_model(ops, preset=preset, head="pretraining")
        opt = build_optimizer(model, optimizer, lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)

    def run() -> None:
        opt.step()

    return census(Step(model, opt, lambda name: None, run, path))


# -- the command -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="tiny,small,base")
    parser.add_argument("--paths", default="cpu,cuda")
    parser.add_argument("--ops", default="jmc.atp")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--optimizer", default="adamw",
                        help="the folnet step's optimiser (lamb: folnet pretrain's default)")
    parser.add_argument("--no-bert", action="store_true", help="folnet only")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--label", default="", help="what was counted (e.g. a commit), kept "
                        "in the JSON for the figure that reads it")
    args = parser.parse_args(argv)
    rows = []
    for path in args.paths.split(","):
        for preset in args.presets.split(","):
            ours = census(folnet_step(preset, args.ops, path=path, batch=args.batch,
                                      seq_len=args.seq_len, optimizer=args.optimizer))
            row = {"preset": preset, "path": path, "ops": args.ops, "batch": args.batch,
                   "seq_len": args.seq_len, "optimizer": args.optimizer,
                   "folnet": ours.summary()}
            if not args.no_bert:
                row["bert"] = census(bert_step(preset, path=path, batch=args.batch,
                                               seq_len=args.seq_len)).summary()
            for name in ("lamb", "adamw"):
                row[f"{name}_alone"] = optimizer_census(preset, name, path=path,
                                                        ops=args.ops).launches()
            rows.append(row)
            _print(row)
    if args.json is not None:
        write_json(args.json, {"machine": machine(), "label": args.label, "rows": rows})
    return 0


def _print(row: dict) -> None:
    f, b = row["folnet"], row.get("bert")
    ratio = f"{f['launches'] / b['launches']:.2f}x BERT" if b else ""
    print(f"{row['preset']:>5} {row['path']:>4}: folnet {f['launches']:5d} launches, "
          f"{f['syncs']} syncs, {f['bytes'] / 1e6:8.1f} MB "
          f"({f['bytes'] / f['floor']:.2f}x its floor)"
          + (f" | BERT {b['launches']:5d}, {b['syncs']} syncs, {b['bytes'] / 1e6:8.1f} MB "
             f"| {ratio}" if b else "")
          + f" | LAMB alone {row['lamb_alone']}, AdamW {row['adamw_alone']}")
    print("       folnet by part:", dict(sorted(f["by_part"].items())))
    if b:
        print("       BERT by part:  ", dict(sorted(b["by_part"].items())))
    if f["syncs"]:
        print(f"       folnet syncs: {f['syncs']} ({', '.join(sorted(set(f['sync_ops'])))})")


if __name__ == "__main__":
    sys.exit(main())
