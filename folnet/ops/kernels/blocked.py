"""The binary Boolean FFN evaluated in blocks of query rows (a first piece of the row-blocked
binary stream for long sequences).

Over a full square the stage reads ``[u2(x, y), u2(y, x)]`` for every pair, so its hidden layer
is B x T x T x F2 -- at F2 = 4 D2 the largest tensor of a layer. Row by row nothing else is
needed: the rows ``x`` of a block read their own row slab ``u2(x, :)`` and the column slab
``u2(:, x)``. `blocked_binary_ffn` runs the stage one block of rows at a time, keeps only its
input for the backward pass and recomputes each block's hidden layer there, so no full-size
hidden layer (nor its GELU, nor their gradients) is ever alive: the stage's working set is one
block's, ``rows / T`` of the full one. Results equal the unblocked stage up to the order in which
the weight gradients are summed (float32: ~1e-7 relative).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from folnet.errors import FolnetError
from folnet.ops.kernels.autocast import autocast_dtype, cast
from folnet.ops.kernels.dropout import masked_scale
from folnet.ops.kernels.linear import mm_linear, wgrad

__all__ = ["blocked_binary_ffn", "recompute_blocks"]


def _block(n: torch.Tensor, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows r0:r1 of the square as (u2(x, :), u2(:, x) transposed): two (B, R, T, D2)."""
    return n[:, r0:r1], n[:, :, r0:r1].transpose(1, 2)


class _BlockedBinaryFFN(torch.autograd.Function):
    """``out = W_o gelu(W_i [n, n^T] + b_i) + b_o + W_s n^T + b_s``, block by block, with the
    products on the CPU fast path (`folnet.ops.kernels.linear`) where it applies; with a keep
    mask, ``out * keep * scale`` (its residual dropout), so that the gradient it receives is
    the residual's own, not a second full-size tensor."""

    @staticmethod
    def forward(ctx, n, w_in, b_in, w_out, b_out, w_skip, b_skip, rows, keep, scale):
        d2 = n.shape[-1]
        out = torch.empty_like(n)  # (B, T, T, D2)
        for r0 in range(0, n.shape[1], rows):
            r1 = min(n.shape[1], r0 + rows)
            own, across = _block(n, r0, r1)  # (B, R, T, D2) each
            both = torch.cat([own, across], -1).view(-1, 2 * d2)  # (P, 2 D2), P = B R T
            piece = mm_linear(F.gelu(mm_linear(both, w_in, b_in)), w_out, b_out)  # (P, D2)
            piece = piece.addmm_(both[:, d2:], w_skip.t()).add_(b_skip).view(own.shape)
            out[:, r0:r1] = piece if keep is None else masked_scale(piece, keep[:, r0:r1],
                                                                    scale)
        ctx.save_for_backward(n, w_in, b_in, w_out, w_skip, keep)
        ctx.rows, ctx.scale = rows, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        n, w_in, b_in, w_out, w_skip, keep = ctx.saved_tensors
        d2 = n.shape[-1]
        w_out_t, w_in_t = w_out.t().contiguous(), w_in.t().contiguous()
        grad_n = torch.zeros_like(n)
        grad_w_in, grad_b_in = torch.zeros_like(w_in), torch.zeros_like(b_in)
        grad_w_out, grad_w_skip = torch.zeros_like(w_out), torch.zeros_like(w_skip)
        grad_b = torch.zeros_like(w_out[:, 0])
        for r0 in range(0, n.shape[1], ctx.rows):
            r1 = min(n.shape[1], r0 + ctx.rows)
            own, across = _block(n, r0, r1)
            both = torch.cat([own, across], -1).view(-1, 2 * d2)  # (P, 2 D2)
            h = mm_linear(both, w_in, b_in)  # (P, F2) recomputed
            g = grad[:, r0:r1]  # (B, R, T, D2)
            g = (g if keep is None else masked_scale(g, keep[:, r0:r1], ctx.scale)).reshape(
                -1, d2)  # (P, D2)
            grad_w_out += wgrad(g, F.gelu(h))
            grad_b += g.sum(0)
            grad_h = torch.ops.aten.gelu_backward(mm_linear(g, w_out_t, None), h)  # (P, F2)
            del h
            grad_w_in += wgrad(grad_h, both)
            grad_b_in += grad_h.sum(0)
            grad_both = mm_linear(grad_h, w_in_t, None)  # (P, 2 D2)
            del grad_h
            grad_w_skip += wgrad(g, both[:, d2:].contiguous())
            shape = own.shape  # (B, R, T, D2)
            grad_n[:, r0:r1] += grad_both[:, :d2].view(shape)
            # d/d u2(y, x) for the block's x: the FFN's second half and the skip Linear
            grad_across = grad_both[:, d2:].addmm(g, w_skip).view(shape)
            grad_n[:, :, r0:r1] += grad_across.transpose(1, 2)
        return (grad_n, grad_w_in, grad_b_in, grad_w_out, grad_b, grad_w_skip, grad_b, None,
                None, None)


def blocked_binary_ffn(n: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor,
                       w_out: torch.Tensor, b_out: torch.Tensor, w_skip: torch.Tensor,
                       b_skip: torch.Tensor, rows: int, keep: torch.Tensor | None = None,
                       p: float = 0.0) -> torch.Tensor:
    """The binary FFN over a full square ``n`` (B, T, T, D2), ``rows`` query rows at a time
    (a positive integer; ``rows >= T`` is one block). ``keep`` (a bool `keep_mask` of n's
    shape) applies dropout of rate ``p`` to the output, block by block."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise FolnetError(f"block rows must be a positive integer, got {rows!r}")
    if n.ndim != 4 or n.shape[1] != n.shape[2]:
        raise FolnetError(f"blocked_binary_ffn needs a full square (B, T, T, D2), got "
                         f"{tuple(n.shape)}")
    # under autocast: one cast of every input, then plain products in that dtype
    dtype = autocast_dtype(n.device, devices=("cpu", "cuda"))
    if dtype is not None:
        with torch.autocast(n.device.type, enabled=False):
            return blocked_binary_ffn(*cast(dtype, n, w_in, b_in, w_out, b_out, w_skip, b_skip),
                                      rows=rows, keep=keep, p=p)
    scale = 1.0 / (1.0 - p) if keep is not None else 1.0
    return _BlockedBinaryFFN.apply(n, w_in, b_in, w_out, b_out, w_skip, b_skip, rows, keep,
                                   scale)


class _RecomputedBlocks(torch.autograd.Function):
    """Outputs assembled block by block from ``run`` without keeping any block's graph: the
    forward runs the prologue and every block without autograd and saves only the inputs
    (through ``save_for_backward``, so an enclosing activation checkpoint drops them too); the
    backward reruns the prologue, then each block under the random and autocast state its
    forward had, taking its gradients with ``torch.autograd.grad`` -- a slab's into its slice of
    its input's gradient, so no block makes a full-size gradient of what it reads by rows --
    and last the prologue's, from the gradients its outputs gathered over the blocks (in the
    sinks ``run`` may add to in place, one full-size tensor each).
    Parameter gradients come back as this function's own input gradients, once per
    parameter, as a DistributedDataParallel hook expects."""

    @staticmethod
    def forward(ctx, run, prologue, spans, slabs, params, *tensors):
        inputs = tensors[: len(tensors) - len(params)]  # then the parameters, for their grads
        device = inputs[0].device
        ctx.run, ctx.prologue, ctx.spans, ctx.slabs, ctx.params = run, prologue, spans, slabs, \
            params
        ctx.autocast = _autocast_state(device)
        ctx.states = []
        made = _made(prologue, spans, slabs, inputs)

        def piece(r0, r1):
            ctx.states.append(_rng_state(device))
            views = _views(inputs, slabs, r0, r1)
            return run(r0, r1, inputs, views, made, (None,) * len(made))

        outs = _assemble(spans, piece)
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        return outs

    @staticmethod
    def backward(ctx, *grads):
        inputs = ctx.saved_tensors
        skip = (None,) * 5
        used = [k for k, g in enumerate(grads) if g is not None]
        if not used:
            return skip + (None,) * len(inputs) + (None,) * len(ctx.params)
        device = inputs[0].device
        wanted = [i for i in range(len(inputs)) if ctx.needs_input_grad[5 + i]]
        slabs = [(k, i, dim) for k, (i, dim) in enumerate(ctx.slabs) if i in wanted]
        params = [p for p in ctx.params if p.requires_grad]
        by_input: dict[int, torch.Tensor] = {}
        by_param: dict[int, torch.Tensor] = {}
        made: tuple[torch.Tensor, ...] = ()
        if ctx.prologue is not None:  # its values only: its graph is rebuilt at the end
            with torch.no_grad(), _autocast(device, ctx.autocast):
                made = tuple(m.requires_grad_() for m in _made(ctx.prologue, ctx.spans,
                                                                 ctx.slabs, inputs))
        # the made tensors' gradients, summed over the blocks: by ``run`` in place (its sinks)
        # or, as autograd returns them, here
        sinks = tuple(torch.zeros_like(m) for m in made)
        for (r0, r1), state in zip(ctx.spans, ctx.states, strict=True):
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
                    torch.enable_grad(), _autocast(device, ctx.autocast):
                _set_rng_state(device, state)
                leaves, views = _leaves(inputs, ctx.slabs, wanted, r0, r1)
                outs = ctx.run(r0, r1, leaves, views, made, sinks)
                got = list(torch.autograd.grad(
                    [outs[k] for k in used],
                    [leaves[i] for i in wanted] + [views[k] for k, _, _ in slabs] + list(made)
                    + params,
                    [grads[k].narrow(1, r0, r1 - r0) for k in used], allow_unused=True))
            for j in range(len(made)):  # (taken out of the middle of got)
                g = got.pop(len(wanted) + len(slabs))
                if g is not None:
                    sinks[j].add_(g)
            _gather(got, wanted, slabs, params, inputs, by_input, by_param, r0, r1)
            del leaves, views, outs, got  # the block's graph, before the next block's
        del made
        fn, dims = ctx.prologue if ctx.prologue is not None else (None, ())
        js = [j for j, sink in enumerate(sinks) if sink._version > 0]  # (added to)
        for r0, r1 in ctx.spans if js else ():  # the prologue's backward, span by span
            with torch.enable_grad(), _autocast(device, ctx.autocast):
                leaves, views = _leaves(inputs, ctx.slabs, wanted, r0, r1)
                made = fn(r0, r1, leaves, views)
                got = list(torch.autograd.grad(
                    [made[j] for j in js],
                    [leaves[i] for i in wanted] + [views[k] for k, _, _ in slabs] + params,
                    [sinks[j].narrow(dims[j], r0, r1 - r0) for j in js], allow_unused=True))
            _gather(got, wanted, slabs, params, inputs, by_input, by_param, r0, r1)
            del leaves, views, made, got
        return (*skip, *(by_input.get(i) for i in range(len(inputs))),
                *(by_param.get(id(p)) for p in ctx.params))


def _made(prologue, spans, slabs, inputs) -> tuple[torch.Tensor, ...]:
    """What the prologue makes for all rows: its spans' outputs concatenated, each along its
    row dimension (no autograd: the caller is a forward or takes values only)."""
    if prologue is None:
        return ()
    fn, dims = prologue
    return _assemble(spans, lambda r0, r1: fn(r0, r1, inputs, _views(inputs, slabs, r0, r1)),
                     dims)


def _views(inputs, slabs, r0: int, r1: int) -> list[torch.Tensor]:
    """Each slab's rows r0:r1, as views."""
    return [inputs[i].narrow(dim, r0, r1 - r0) for i, dim in slabs]


def _leaves(inputs, slabs, wanted, r0: int, r1: int):
    """Detached copies (views) of the inputs and of their slabs' rows r0:r1 for one span's
    recomputation, requiring gradients where the input is wanted."""
    leaves = [t.detach().requires_grad_(i in wanted) for i, t in enumerate(inputs)]
    views = [v.detach().requires_grad_(i in wanted)
             for v, (i, _) in zip(_views(inputs, slabs, r0, r1), slabs, strict=True)]
    return leaves, views


def _assemble(spans, make, dims=None) -> tuple[torch.Tensor, ...]:
    """``make(r0, r1)``'s tensors for every span, written into whole tensors along ``dims``
    (default 1) as they come: no list of pieces then a concatenation, whose pieces would sit on
    the heap between larger tensors."""
    total = spans[-1][1]
    outs: list[torch.Tensor] = []
    for r0, r1 in spans:
        pieces = make(r0, r1)
        dims = dims or (1,) * len(pieces)
        if not outs:
            for t, d in zip(pieces, dims, strict=True):
                shape = list(t.shape)
                shape[d] = total
                outs.append(t.new_empty(shape))
        for out, t, d in zip(outs, pieces, dims, strict=True):
            out.narrow(d, r0, r1 - r0).copy_(t)
        del pieces
    return tuple(outs)


def _gather(got, wanted, slabs, params, inputs, by_input, by_param, r0, r1) -> None:
    """Add one span's gradients -- of the wanted inputs, of their slabs (into their slices),
    of the parameters, in that order in ``got`` -- to the running totals."""
    for i in wanted:
        _accumulate(by_input, i, got.pop(0))
    for _, i, dim in slabs:
        g = got.pop(0)
        if g is not None:
            if i not in by_input:
                by_input[i] = torch.zeros_like(inputs[i])
            by_input[i].narrow(dim, r0, r1 - r0).add_(g)
    for p in params:
        _accumulate(by_param, id(p), got.pop(0))


def _accumulate(total: dict, key, grad: torch.Tensor | None) -> None:
    if grad is None:
        return
    if key in total:
        total[key].add_(grad)
    else:  # the first gradient may be an expanded view (a broadcast bias): own it
        total[key] = grad.contiguous()


def _autocast_state(device: torch.device) -> tuple[bool, torch.dtype] | None:
    """Whether autocast is on for ``device`` and in which dtype (None: a device without it)."""
    if device.type not in ("cpu", "cuda"):
        return None
    return torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)


def _autocast(device: torch.device, state: tuple[bool, torch.dtype] | None):
    """A context restoring the autocast state a forward had (a backward runs outside it)."""
    if state is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=state[1], enabled=state[0])


def _rng_state(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def recompute_blocks(run: Callable[..., tuple[torch.Tensor, ...]],
                     spans: Sequence[tuple[int, int]], inputs: Sequence[torch.Tensor],
                     params: Sequence[torch.Tensor], slabs: Sequence[tuple[int, int]] = (),
                     prologue: tuple[Callable[..., tuple[torch.Tensor, ...]],
                                     tuple[int, ...]] | None = None
                     ) -> tuple[torch.Tensor, ...]:
    """``run(r0, r1, inputs, views, made, sinks)`` for every span of rows, its outputs (each
    with the rows on dim 1) concatenated over the spans, recomputed span by span in backward
    (see `_RecomputedBlocks`). ``views[k]`` is ``inputs[i].narrow(dim, r0, r1 - r0)`` for the
    k-th ``(i, dim)`` of ``slabs``: read a block's slab through it, not by slicing the input,
    so that its gradient is slab-sized. ``prologue = (fn, dims)`` makes what every block reads
    whole: ``fn(r0, r1, inputs, views)`` returns its rows r0:r1 along ``dims``; ``made`` is
    their concatenation over the spans (``()`` without a prologue). ``sinks`` are None in the
    forward pass; in the backward pass, zeros like ``made``, to which ``run`` may add the
    gradient of a made tensor in place (`folnet.ops.kernels.sink`) -- what autograd returns
    for it is added there too. ``run`` and ``fn`` may read ``params`` (the parameters they
    use) directly; every other tensor they differentiate must come through ``inputs``. Under
    no autograd it is a plain loop."""
    if not torch.is_grad_enabled():
        made = _made(prologue, spans, slabs, inputs)
        return _assemble(spans, lambda r0, r1: run(r0, r1, inputs, _views(inputs, slabs, r0, r1),
                                                   made, (None,) * len(made)))
    params = tuple(params)
    return _RecomputedBlocks.apply(run, prologue, tuple(spans), tuple(slabs), params, *inputs,
                                   *params)
