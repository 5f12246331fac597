"""Outputs assembled block by block of rows, each block recomputed in the backward pass.

Why: a long input's layer makes, per block of query rows, tensors of N2 channels per pair
(projections, kernels, premises); keeping every block's graph would keep them all. Here only
the inputs are saved; the backward pass reruns one block at a time and takes its gradients
with `torch.autograd.grad`, so at most one block's intermediates are alive.

Everything crosses the boundary by name: the caller hands ``inputs`` (a mapping), the
``slabs`` read by rows (`Slab`: which input, which axis) and, optionally, a `Prologue` that
makes the tensors every block reads whole; each block receives one `Block` holding them all by
the same names.

A ``residual`` (output name -> input name) adds that input to the output inside the function.
Its backward pass then sums the input's gradient into the output's incoming gradient itself
when autograd holds that tensor alone (`folnet.ops.primitives.owned`), so a long layer's backward
keeps one full-size gradient of its binary stream, not the incoming one and a total beside it.
The incoming rows of a block not yet run are its upstream, so what a block's column slab adds
to later blocks' rows waits in block-by-block pieces (`_Totals`) until those rows have run: at
most a quarter of the square.

Under a torch.func transform (``grad``, ``vmap``, ``jacrev``) nothing is recomputed: the
backward re-enters autograd on the layer's own parameters (``run`` reads them directly), which
a transform cannot follow, so the blocks run as plain differentiable ops and their outputs are
concatenated -- the same function, with every block's graph kept (the transform keeps them
anyway).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from folnet.ops.primitives.autocast import AutocastState
from folnet.ops.primitives.blocks import Block, Prologue, Slab, Tensors
from folnet.ops.primitives.dropout import RowMask
from folnet.ops.primitives.functorch import transformed
from folnet.ops.primitives.owned import incoming_alone
from folnet.ops.primitives.rng import replay, rng_state

__all__ = ["Block", "Prologue", "Slab", "recompute_blocks"]

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class _Job:
    """The non-tensor arguments of one `recompute_blocks` call, handed to the autograd
    Function as one object."""

    run: Callable[[Block], Tensors]
    spans: tuple[tuple[int, int], ...]
    names: tuple[Hashable, ...]  # the inputs', in the order their tensors are passed
    slabs: Mapping[Hashable, Slab]
    prologue: Prologue | None
    params: tuple[torch.Tensor, ...]
    residual: Mapping[Hashable, Hashable]  # output name -> the input added to it
    redrawn: Mapping[Hashable, RowMask]  # inputs not saved: read by rows, drawn again
    release: Callable[[], object] | None  # before the forward, around the backward
    outputs: list[Hashable] = field(default_factory=list)  # run's, set by the forward pass
    states: list[torch.Tensor] = field(default_factory=list)  # each span's RNG state, likewise

    def release_heap(self) -> None:
        """``release()`` when one was given (the "tight" memory mode's heap release)."""
        if self.release is not None:
            self.release()

    def block(self, r0: int, r1: int, inputs: Tensors, made: Tensors = _EMPTY,
              sinks: Tensors | None = None, slabs: Tensors | None = None) -> Block:
        """The `Block` for rows r0:r1; its slab views cut from ``inputs`` unless given."""
        if slabs is None:  # (a redrawn input is whole in the forward pass only)
            slabs = {name: inputs[s.source].narrow(s.dim, r0, r1 - r0)
                     for name, s in self.slabs.items() if s.source in inputs}
        return Block(r0, r1, inputs, slabs, made, sinks)

    def made(self, inputs: Tensors, *, concat: bool = False) -> Tensors:
        """The prologue's tensors over all rows (no autograd: the caller is a forward pass or
        wants values only; ``concat``: differentiable, under a torch.func transform)."""
        if self.prologue is None:
            return {}
        return _assemble(self.spans, lambda r0, r1: self.prologue.make(self.block(r0, r1, inputs)),
                         self.prologue.dims, concat=concat)


class _RecomputedBlocks(torch.autograd.Function):
    """The forward runs the prologue and every block without autograd and saves only the
    inputs (through ``save_for_backward``, so that an enclosing activation checkpoint drops
    them too). The backward reruns the prologue's values, then each block under the random
    and autocast state its forward had -- a slab's gradient goes into its slice of its
    input's, so no block makes a full-size gradient of what it reads by rows -- and last the
    prologue's own backward, from the gradients its outputs gathered in the sinks over the
    blocks. Parameter gradients come back as this function's input gradients, once per
    parameter, as a DistributedDataParallel hook expects. Not for torch.func transforms
    (`recompute_blocks` does not call it under one: see the module's docstring)."""

    @staticmethod
    def forward(job: _Job, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = dict(zip(job.names, tensors, strict=False))  # then the parameters
        device = tensors[0].device
        job.release_heap()  # the holes the layers before left, handed back first
        job.states.clear()
        made = job.made(inputs)

        def piece(r0: int, r1: int) -> Tensors:
            job.states.append(rng_state(device))
            return job.run(job.block(r0, r1, inputs, made))

        outs = _residuals(_assemble(job.spans, piece), job.residual, inputs)
        job.outputs.clear()
        job.outputs.extend(outs)  # their names, in the order of the tensors returned
        return tuple(outs.values())

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: tuple) -> None:
        job: _Job = inputs[0]
        tensors = inputs[1 : 1 + len(job.names)]
        ctx.job, ctx.states = job, list(job.states)
        ctx.autocast = AutocastState.capture(tensors[0].device)
        ctx.save_for_backward(*(t for name, t in zip(job.names, tensors, strict=True)
                                if name not in job.redrawn))
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        job: _Job = ctx.job
        # (unpacked once: under activation checkpointing a second unpack is an error)
        saved = dict(zip([n for n in job.names if n not in job.redrawn], ctx.saved_tensors,
                         strict=True))
        used = [name for name, g in zip(job.outputs, grads, strict=True) if g is not None]
        grads = dict(zip(job.outputs, grads, strict=True))
        job.release_heap()  # the holes earlier stages left, handed back first
        totals = _Totals(saved, job)
        if used:
            wanted = {name for k, name in enumerate(job.names) if ctx.needs_input_grad[1 + k]}
            for out, source in job.residual.items():
                if grads[out] is not None and source in wanted:
                    totals.start(source, grads[out])
            device = next(iter(saved.values())).device
            restore = functools.partial(AutocastState.restore, ctx.autocast)
            made: dict[Hashable, torch.Tensor] = {}
            if job.prologue is not None:  # its values only: its graph is rebuilt at the end
                with torch.no_grad(), restore():
                    made = {k: t.requires_grad_() for k, t in job.made(saved).items()}
            # each block adds its gradient of a made tensor into one total: in float32 when
            # the tensor is made in a lower precision (autocast), so that summing the blocks
            # rounds no more than the whole square's one product does
            sinks = {k: torch.zeros_like(t, dtype=_total_dtype(t.dtype)) for k, t in made.items()}
            for (r0, r1), state in zip(job.spans, ctx.states, strict=True):
                with replay(device, state), torch.enable_grad(), restore():
                    block = _leaves(job, saved, wanted, r0, r1, made, sinks)
                    outs = job.run(block)
                    got = totals.grads([outs[k] for k in used],
                                       [_rows(grads[k], outs[k], r0, r1) for k in used],
                                       block, wanted, made)
                for name, g in got.made.items():  # what autograd returned, not the sinks
                    sinks[name].add_(g)
                totals.add(got, r0, r1)
                del block, outs, got  # the block's graph, before the next block's
            totals.settle()  # every block's upstream is read: add straight in
            del made
            totals.prologue(wanted, sinks, restore)
        job.release_heap()  # and the ones this stage's blocks left
        return (None, *(totals.inputs.get(name) for name in job.names),
                *(totals.params.get(id(p)) for p in job.params))


@dataclass
class _Grads:
    """One span's gradients, by what they are of."""

    inputs: dict[Hashable, torch.Tensor]
    slabs: dict[Hashable, torch.Tensor]
    made: dict[Hashable, torch.Tensor]
    params: dict[int, torch.Tensor]


class _Totals:
    """The running gradient totals of the inputs (slabs into their slices) and parameters.

    An input whose total is an output's incoming gradient itself (`start`) is ``shared``:
    while ``deferring`` (the blocks running) the rows of that tensor a block has not yet run
    are its upstream, so a gradient a block adds to those rows waits in ``pending`` (by the
    first row of the block it waits for: (input, slab dim, c0, c1, piece)) until that block
    has run -- or, read whole by the blocks (a folded operand), in ``later``, one full-size
    total added when all have run."""

    def __init__(self, saved: Tensors, job: _Job):
        self.saved, self.job = saved, job
        self.inputs: dict[Hashable, torch.Tensor] = {}
        self.params: dict[int, torch.Tensor] = {}
        self.shared: set[Hashable] = set()
        self.pending: dict[int, list] = {}
        self.later: dict[Hashable, torch.Tensor] = {}  # a shared input's whole-read gradient
        self.deferring = True

    def start(self, name: Hashable, grad: torch.Tensor) -> None:
        """Input ``name``'s total begins as ``grad``, the incoming gradient of an output that
        is the input plus the blocks' (a residual): that very tensor when autograd holds it
        alone and it has the input's layout, else a copy."""
        like = self.saved[name]
        if (incoming_alone(grad) and grad.dtype == like.dtype and grad.shape == like.shape
                and grad.is_contiguous()):
            self.inputs[name] = grad
            self.shared.add(name)
        else:
            self.inputs[name] = like.new_empty(like.shape).copy_(grad)

    def grads(self, outputs: Sequence[torch.Tensor], upstream: Sequence[torch.Tensor],
              block: Block, wanted: set[Hashable], made: Tensors) -> _Grads:
        """`torch.autograd.grad` of ``outputs`` towards every wanted input, slab, made tensor
        and parameter needing one, returned by name."""
        targets: dict[tuple[str, Hashable], torch.Tensor] = {}
        targets.update({("inputs", n): block.inputs[n] for n in wanted})
        targets.update({("slabs", n): v for n, v in block.slabs.items()
                        if self.job.slabs[n].source in wanted})
        targets.update({("made", n): t for n, t in made.items()})
        targets.update({("params", id(p)): p for p in self.job.params if p.requires_grad})
        got = torch.autograd.grad(outputs, list(targets.values()), upstream, allow_unused=True)
        out = _Grads({}, {}, {}, {})
        for (kind, name), g in zip(targets, got, strict=True):
            if g is not None:
                getattr(out, kind)[name] = g
        return out

    def add(self, got: _Grads, r0: int, r1: int) -> None:
        """One span's gradients into the totals: a slab's into its rows of its input's; into a
        shared total, first what waited for rows r0:r1 (their upstream is read now)."""
        if self.deferring:
            for name, dim, c0, c1, piece in self.pending.pop(r0, ()):
                self.inputs[name].narrow(1, r0, r1 - r0).narrow(dim, c0, c1 - c0).add_(piece)
        for name, g in got.inputs.items():  # an input read whole: every row at once
            _accumulate(self.later if name in self.shared and self.deferring else self.inputs,
                        name, g)
        for name, g in got.slabs.items():
            slab = self.job.slabs[name]
            if slab.source not in self.inputs:
                self.inputs[slab.source] = torch.zeros_like(self.saved[slab.source])
            if slab.source in self.shared and self.deferring and slab.dim != 1:
                self._defer(slab.source, slab.dim, r0, r1, g, r1)
            else:
                self.inputs[slab.source].narrow(slab.dim, r0, r1 - r0).add_(g)
        for key, g in got.params.items():
            _accumulate(self.params, key, g)

    def settle(self) -> None:
        """Every block has run: what waited is added, and from here gradients go straight in."""
        if self.pending:
            raise RuntimeError(f"gradients still waiting for rows {sorted(self.pending)}")
        for name, g in self.later.items():
            self.inputs[name].add_(g)
        self.later.clear()
        self.deferring = False

    def _defer(self, name: Hashable, dim: int, c0: int, c1: int, g: torch.Tensor, done: int
               ) -> None:
        """Add ``g`` (every row, on dim 1; columns c0:c1 of dim ``dim``) to the shared total
        ``name``: rows below ``done`` now, each later block's rows when it has run (a copy of
        them: a view would keep all of ``g``)."""
        total = self.inputs[name]
        total.narrow(1, 0, done).narrow(dim, c0, c1 - c0).add_(g.narrow(1, 0, done))
        for q0, q1 in self.job.spans:
            if q0 >= done:
                self.pending.setdefault(q0, []).append(
                    (name, dim, c0, c1, g.narrow(1, q0, q1 - q0).clone()))

    def prologue(self, wanted: set[Hashable], sinks: dict[Hashable, torch.Tensor],
                 restore: Callable) -> None:
        """The prologue's backward, span by span, from the sinks that were added to."""
        names = [k for k, sink in sinks.items() if sink._version > 0]
        if not names:
            return
        job = self.job
        for r0, r1 in job.spans:
            with torch.enable_grad(), restore():
                block = _leaves(job, self.saved, wanted, r0, r1, {}, None)
                made = job.prologue.make(block)
                got = self.grads([made[k] for k in names],
                                 [sinks[k].narrow(job.prologue.dims[k], r0, r1 - r0)
                                  .to(made[k].dtype) for k in names],
                                 block, wanted, {})
            self.add(got, r0, r1)
            del block, made, got


def _rows(grad: torch.Tensor, out: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows r0:r1 of an output's incoming gradient as the block's output takes it (its dtype:
    a residual in a wider dtype widened the function's output)."""
    rows = grad.narrow(1, r0, r1 - r0)
    return rows if rows.dtype == out.dtype else rows.to(out.dtype)


def _residuals(outs: dict, residual: Mapping[Hashable, Hashable], inputs: Tensors, *,
               inplace: bool = True) -> dict:
    """Each output named in ``residual`` plus the input it names: written into the output (a
    fresh tensor the blocks wrote) when their dtypes agree and ``inplace``, else a new one."""
    for out, source in residual.items():
        t, res = outs[out], inputs[source]
        outs[out] = t.add_(res) if inplace and t.dtype == res.dtype else res + t
    return outs


def _leaves(job: _Job, saved: Tensors, wanted: set[Hashable], r0: int, r1: int,
            made: Tensors, sinks: Tensors | None) -> Block:
    """The block of rows r0:r1 for a recomputation: detached inputs and slab views, requiring
    gradients where their input is wanted."""
    inputs = {n: t.detach().requires_grad_(n in wanted) for n, t in saved.items()}
    slabs = {name: job.redrawn[s.source].rows(r0, r1) if s.source in job.redrawn
             else saved[s.source].narrow(s.dim, r0, r1 - r0).detach().requires_grad_(
                 s.source in wanted) for name, s in job.slabs.items()}
    return job.block(r0, r1, inputs, made, sinks, slabs)


def _assemble(spans: Sequence[tuple[int, int]], make: Callable, dims: Mapping | None = None,
              *, concat: bool = False) -> dict:
    """``make(r0, r1)``'s tensors (by name) for every span, written into whole tensors along
    ``dims`` (default 1) as they come: no list of pieces then a concatenation, whose pieces
    would sit on the heap between larger tensors. ``concat``: concatenated after all, which
    autograd and torch.func follow (a write into an unbatched whole is no batched op)."""
    if concat:
        pieces: dict = {}
        for r0, r1 in spans:
            for key, t in make(r0, r1).items():
                pieces.setdefault(key, []).append(t)
        return {key: torch.cat(ts, 1 if dims is None else dims[key])
                for key, ts in pieces.items()}
    total = spans[-1][1]
    outs: dict = {}
    for r0, r1 in spans:
        pieces = make(r0, r1)
        for key, t in pieces.items():
            d = 1 if dims is None else dims[key]
            if key not in outs:
                shape = list(t.shape)
                shape[d] = total
                outs[key] = t.new_empty(shape)
            outs[key].narrow(d, r0, r1 - r0).copy_(t)
        del pieces
    return outs


def _total_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a sum of block gradients of a ``dtype`` tensor is kept in: float32 for the
    half types, else ``dtype`` itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _accumulate(total: dict, key: Hashable, grad: torch.Tensor) -> None:
    if key in total:
        total[key].add_(grad)
    else:  # the first gradient may be an expanded view (a broadcast bias): own it
        total[key] = grad.contiguous()


def recompute_blocks(run: Callable[[Block], Tensors], spans: Sequence[tuple[int, int]],
                     inputs: Tensors, params: Sequence[torch.Tensor],
                     slabs: Mapping[Hashable, Slab] = _EMPTY, prologue: Prologue | None = None,
                     residual: Mapping[Hashable, Hashable] = _EMPTY,
                     redrawn: Mapping[Hashable, RowMask] = _EMPTY,
                     release: Callable[[], object] | None = None
                     ) -> dict[Hashable, torch.Tensor]:
    """``run(block)`` for every span of rows, its outputs (by name, each with the rows on dim
    1) concatenated over the spans, recomputed span by span in the backward pass. ``run`` and
    the prologue may read ``params`` (the parameters they use) directly; every other tensor
    they differentiate must come through ``inputs``. ``residual`` names, for an output, an
    input of its shape added to it (see the module's docstring). Under no autograd it is a
    plain loop; under a torch.func transform a plain differentiable one (nothing
    recomputed). ``redrawn`` names inputs (a `RowMask`'s mask, drawn over ``spans``) read
    only through slabs of dim 1 and not saved: the backward pass draws each block's rows
    again. ``release`` (if given) is called at the start of the forward pass and at the start
    and the end of the backward pass: the ``"tight"`` memory mode hands the heap's free pages
    back there (`folnet.libc.release_free_memory`), so that the holes the blocks leave are not
    resident while the next stage runs -- in the forward pass too, where, with activation
    checkpointing, the heap otherwise grew layer by layer to the step's peak (base preset)."""
    if any(r.spans != tuple(spans) for r in redrawn.values()) or any(
            s.source in redrawn and s.dim != 1 for s in slabs.values()):
        raise ValueError(f"redrawn inputs {list(redrawn)}: read by rows of dim 1 only, over "
                         f"the spans they were drawn over ({tuple(spans)})")
    job = _Job(run, tuple(spans), tuple(inputs), dict(slabs), prologue, tuple(params),
               dict(residual), dict(redrawn), release)
    tensors = dict(inputs)
    if transformed() or not torch.is_grad_enabled():
        # plain ops; under a transform built out of place (a write into an unbatched whole is
        # no batched op)
        concat = transformed()
        made = job.made(tensors, concat=concat)
        outs = _assemble(job.spans, lambda r0, r1: run(job.block(r0, r1, tensors, made)),
                         concat=concat)
        return _residuals(outs, job.residual, tensors, inplace=not concat)
    outs = _RecomputedBlocks.apply(job, *tensors.values(), *job.params)
    return dict(zip(job.outputs, outs, strict=True))
