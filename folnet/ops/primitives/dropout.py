"""Dropout for the binary stream's hot path: a cheaper keep mask on the CPU, torch's own
kernel on CUDA.

``F.dropout`` draws one float per element through ``bernoulli_``; on a CPU that costs many
times an add (docs/results/measurements.md), and the binary stream (B x T x T x D2) gets
dropout twice per layer. Here the keep mask comes from 64-bit random words cut into four 15-bit
lanes (one RNG call per four elements) compared against ``p * 2**15``; the mask is stored as
bool (1 byte per element) for the backward pass. The draw uses torch's default generator, so
seeding and RNG-state checkpoints cover it. Every device draws this way: the row-blocked path
draws its masks with `keep_mask` (one per block, then handed in), so the whole square must draw
the same masks for the memory mode never to change the function computed.

On CUDA (`folnet.ops.primitives.device.kernel_device`) `dropout` and `dropout_add` call torch's
fused dropout instead (``native_dropout``, what ``F.dropout`` runs on CUDA, called by name so
that an emulated CUDA step on a CPU counts the same: one kernel forward, one backward, where
the keep mask takes seven launches): there the row blocks, when forced, draw their own masks,
so blocks and the whole square drop elements alike in distribution, not bit for bit;
`portable_masks`
makes every device draw the keep masks (the tests that compare the two memory modes under
dropout on a GPU). While torch.compile traces, the same: inductor draws it in its kernels.

Under torch.func.vmap a mask drawn this way is one for the whole batch: torch's
``randomness="same"``, which is therefore the one mode allowed there (the others are refused,
naming what to do); the autograd Functions below compose with torch.func's transforms.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise

import torch

from folnet.errors import FolnetError
from folnet.ops.primitives.device import kernel_device
from folnet.ops.primitives.functorch import transformed, vmap_randomness
from folnet.ops.primitives.rng import replay, rng_state
from folnet.tracing import traced

_LANES = 4  # 15-bit lanes per 64-bit random word
_portable = False  # `portable_masks`
_LEVELS = 1 << 15
#: Random words drawn at a time for a large mask on the CPU (2 MiB of int64).
_CHUNK_WORDS = 1 << 18


def native(device) -> bool:
    """Whether dropout on ``device`` is torch's fused kernel rather than a `keep_mask`: on
    CUDA, and while torch.compile traces; never under a torch.func transform (its vmap
    randomness rule is the keep mask's) nor inside `portable_masks`."""
    if transformed() or _portable:
        return False
    return traced() or kernel_device(device) != "cpu"


@contextmanager
def portable_masks() -> Iterator[None]:
    """Every device draws `keep_mask` masks inside the block (see the module's docstring)."""
    global _portable
    before, _portable = _portable, True
    try:
        yield
    finally:
        _portable = before


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device) -> torch.Tensor:
    """A bool tensor of ``shape`` that is True with probability ``1 - p`` (quantised to 2^-15).
    Under torch.func.vmap only with ``randomness="same"`` (`_check_vmap`)."""
    if transformed():
        _check_vmap(p)
    if traced():  # torch.compile cannot trace random_ on integers: a graph break per draw
        return torch.rand(shape, device=device) >= p
    n = 1
    for s in shape:
        n *= s
    threshold, n_words = round(p * _LEVELS), -(-n // _LANES)
    if kernel_device(device) != "cpu" or n_words <= _CHUNK_WORDS:
        words = torch.empty(n_words, dtype=torch.int64, device=device).random_()
        return _keep(words, n, threshold).view(shape)
    mask = torch.empty(n, dtype=torch.bool, device=device)
    _fill(mask, threshold)
    return mask.view(shape)


def _fill(flat: torch.Tensor, threshold: int) -> None:
    """Draw a CPU keep mask into the contiguous bool vector ``flat``, 2 MiB of random words at
    a time. The CPU generator hands out one 64-bit draw per word, in order, however the words
    are split: chunks draw the same bits as one call, with 2 MiB of words alive instead of two
    bytes per element (a whole square's residual mask: 32 MiB on the heap beside its mask)."""
    n = flat.numel()
    n_words = -(-n // _LANES)
    words = torch.empty(min(n_words, _CHUNK_WORDS), dtype=torch.int64)
    for w0 in range(0, n_words, _CHUNK_WORDS):
        chunk = words[:min(_CHUNK_WORDS, n_words - w0)].random_()
        e0 = w0 * _LANES
        e1 = min(n, e0 + chunk.numel() * _LANES)
        _keep(chunk, e1 - e0, threshold, out=flat[e0:e1])


def _keep(words: torch.Tensor, n: int, threshold: int, out: torch.Tensor | None = None
          ) -> torch.Tensor:
    """The first ``n`` 15-bit lanes of ``words`` (cut in place: the words are the caller's own
    scratch) at or above ``threshold``, as bool."""
    lanes = words.view(torch.int16)[:n].bitwise_and_(_LEVELS - 1)
    return torch.ge(lanes, threshold) if out is None else torch.ge(lanes, threshold, out=out)


@dataclass(frozen=True)
class RowMask:
    """A CPU keep mask kept as the generator states it was drawn from, piece by piece: one
    piece per index of its first axis and span of rows of its second (in the order one draw
    would make them), so that any span's rows -- (B, R, ...) -- can be drawn again alone.

    Why: a stage run in row blocks and recomputed in the backward pass
    (`folnet.ops.primitives.recompute`, `folnet.ops.primitives.ffn`) reads its residual's mask one
    block at a time; keeping these states (5 KB each) instead of the mask frees a quarter of
    the stream's float32 bytes between the passes, for one more draw of it."""

    shape: tuple[int, ...]
    p: float
    spans: tuple[tuple[int, int], ...]
    states: tuple[torch.Tensor, ...]  # piece (b, k) at b * len(spans) + k

    @classmethod
    def draw(cls, shape: torch.Size | tuple[int, ...], p: float, device,
             spans: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, RowMask | None]:
        """The mask -- the bits `keep_mask` draws for ``shape`` -- and its states; None for the
        states where pieces could not be drawn alone: another device than the CPU (whose
        generator numbers the draws of each call), a piece that splits a random word, or
        under a torch.func transform or tracing."""
        shape, spans = tuple(shape), tuple(spans)
        inner = 1
        for s in shape[2:]:
            inner *= s
        alone = (kernel_device(device) == "cpu" and not transformed() and not traced()
                 and len(shape) >= 2 and spans and spans[0][0] == 0
                 and spans[-1][1] == shape[1]
                 and all(a[1] == b[0] for a, b in pairwise(spans))
                 and all((r1 - r0) * inner % _LANES == 0 for r0, r1 in spans))
        if not alone:
            return keep_mask(shape, p, device), None
        threshold, states = round(p * _LEVELS), []
        mask = torch.empty(shape, dtype=torch.bool)
        for b in range(shape[0]):
            for r0, r1 in spans:
                states.append(torch.get_rng_state())
                _fill(mask[b, r0:r1].view(-1), threshold)
        return mask, cls(shape, p, spans, tuple(states))

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """Rows r0:r1 (one of the spans) of the mask, drawn again: (B, R, ...)."""
        k = self.spans.index((r0, r1))
        threshold = round(self.p * _LEVELS)
        out = torch.empty((self.shape[0], r1 - r0, *self.shape[2:]), dtype=torch.bool)
        with replay(torch.device("cpu"), self.states[k]):
            for b in range(self.shape[0]):
                torch.set_rng_state(self.states[b * len(self.spans) + k])
                _fill(out[b].view(-1), threshold)
        return out


def _check_vmap(p: float) -> None:
    """Refuse a draw under a vmap that asks for other than one mask for the batch: with
    ``randomness="different"`` each sample would need its own draw, which a mask drawn from a
    shape (the row blocks' masks are) cannot be, and ``"error"`` forbids any draw."""
    modes = [m for m in vmap_randomness() if m != "same"]
    if modes:
        raise FolnetError(f"dropout (p={p}) under torch.func.vmap(randomness={modes[0]!r}): folnet "
                          f"draws one dropout mask per call, shared by the batch; call "
                          f"model.eval() (or build with dropout=0) for per-sample gradients, or "
                          f"pass randomness='same' to share one mask")


def masked_scale(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * mask * scale`` in x's dtype, as ``where`` + an in-place scale: faster than the two
    products, with no float copy of the bool mask (docs/results/measurements.md)."""
    return torch.where(mask, x, 0.0).mul_(scale)


class _MaskedScale(torch.autograd.Function):
    """``x * mask * scale`` saving only the bool mask. Its forward and backward are torch ops
    that vmap batches, so torch.func generates the vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        return masked_scale(x, mask, scale)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        _, mask, ctx.scale = inputs
        ctx.save_for_backward(mask)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return masked_scale(grad, mask, ctx.scale), None, None


class _DropoutAdd(torch.autograd.Function):
    """``residual + dropout(x)`` in one pass, saving only the bool mask (torch.func generates
    the vmap rule, as for `_MaskedScale`)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(residual: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, scale: float
                ) -> torch.Tensor:
        return torch.addcmul(residual, x, mask, value=scale)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        _, x, mask, ctx.scale = inputs
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(mask)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        # in the update's dtype (bf16 under autocast) straight away, not via a float copy
        return grad, masked_scale(grad, mask, ctx.scale).to(ctx.x_dtype), None, None


class _RedrawnScale(torch.autograd.Function):
    """``x * keep_mask(x.shape, p) * scale``, saving the generator state the mask was drawn
    from (a few kilobytes) instead of the mask (a byte per element of x): the backward pass
    draws the same mask again. Eager mode only (`dropout` takes `_MaskedScale` under a
    torch.func transform or while tracing)."""

    @staticmethod
    def forward(x: torch.Tensor, state: torch.Tensor, p: float) -> torch.Tensor:
        return masked_scale(x, keep_mask(x.shape, p, x.device), 1.0 / (1.0 - p))

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        x, state, ctx.p = inputs
        ctx.shape, ctx.device = x.shape, x.device
        ctx.save_for_backward(state)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (state,) = ctx.saved_tensors
        with replay(ctx.device, state):
            mask = keep_mask(ctx.shape, ctx.p, ctx.device)
        return masked_scale(grad, mask, 1.0 / (1.0 - ctx.p)), None, None


def dropout(x: torch.Tensor, p: float, training: bool, *, redraw: bool = False
            ) -> torch.Tensor:
    """Inverted dropout with a `keep_mask`. ``redraw``: keep the generator state for the
    backward pass, not the mask, which it draws again -- a quarter of x's float32 bytes
    fewer held between the passes, for the time of a second draw
    (docs/results/measurements.md); taken where memory is what a run asked to save
    (activation checkpointing), never under a torch.func transform or while tracing. Both
    give the same bits and leave the generator in the same state."""
    if not training or p == 0.0:
        return x
    if native(x.device):
        return torch.native_dropout(x, p, True)[0]
    if redraw and not transformed() and not traced():
        return _RedrawnScale.apply(x, rng_state(x.device), p)
    return _MaskedScale.apply(x, keep_mask(x.shape, p, x.device), 1.0 / (1.0 - p))


def dropout_add(residual: torch.Tensor, x: torch.Tensor, p: float, training: bool,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """``residual + dropout(x)``: the residual update of every stage. ``mask`` (a `keep_mask`
    drawn earlier, on any device) replaces the draw."""
    if not training or p == 0.0:
        return residual + x
    if mask is None and native(x.device):
        return residual + torch.native_dropout(x, p, True)[0]
    if mask is None:
        mask = keep_mask(torch.broadcast_shapes(residual.shape, x.shape), p, x.device)
    return _DropoutAdd.apply(residual, x, mask, 1.0 / (1.0 - p))


def add_update(residual: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """``residual + update`` for an update made just now (already dropped out): written into
    it when the dtypes agree -- one full-size allocation fewer."""
    return update.add_(residual) if update.dtype == residual.dtype else residual + update
