"""`RowMask`: a keep mask drawn piece by piece over row spans, each span's rows drawn again from
the generator states alone -- the same bits as one `keep_mask` draw -- so that the recomputed
row blocks (the mixer's and the binary FFN's residual dropout) keep states, not the mask."""

from __future__ import annotations

import math
import sys

import pytest
import torch

import folnet
from folnet.ops.primitives import keep_mask
from folnet.ops.primitives.dropout import RowMask

pytestmark = pytest.mark.numerics


def _one_draw(shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The keep mask's definition in one call: 64-bit words, four 15-bit lanes each."""
    n = math.prod(shape)
    words = torch.empty(-(-n // 4), dtype=torch.int64).random_()
    return ((words.view(torch.int16)[:n] & 0x7FFF) >= round(p * 2**15)).view(shape)


def _spans(count: int, rows: int) -> list[tuple[int, int]]:
    return [(r0, min(count, r0 + rows)) for r0 in range(0, count, rows)]


CASES = [((2, 11, 11, 4), 3), ((3, 8, 8, 8), 8), ((1, 9, 4), 2), ((2, 6, 5, 4), 4)]


@pytest.mark.parametrize(("shape", "rows"), CASES)
def test_drawn_in_row_pieces_it_is_one_draws_mask(monkeypatch, shape, rows):
    """Pieces (chunks of 7 words inside each, so most end in a partial chunk) give one draw's
    bits and leave the generator where one draw leaves it."""
    monkeypatch.setattr(sys.modules["folnet.ops.primitives.dropout"], "_CHUNK_WORDS", 7)
    torch.manual_seed(3)
    want, after_want = _one_draw(shape, 0.3), torch.rand(4)
    torch.manual_seed(3)
    got, rows_mask = RowMask.draw(shape, 0.3, "cpu", _spans(shape[1], rows))
    after_got = torch.rand(4)
    assert rows_mask is not None and len(rows_mask.states) == shape[0] * -(-shape[1] // rows)
    assert got.dtype == torch.bool and torch.equal(got, want)
    assert torch.equal(after_got, after_want)
    assert 0.2 < 1 - got.float().mean().item() < 0.4


@pytest.mark.parametrize(("shape", "rows"), CASES)
def test_each_spans_rows_are_drawn_again_in_any_order(shape, rows):
    torch.manual_seed(8)
    mask, rows_mask = RowMask.draw(shape, 0.25, "cpu", _spans(shape[1], rows))
    torch.manual_seed(21)
    want_next = torch.rand(5)
    torch.manual_seed(21)
    order = list(rows_mask.spans)
    order = order[1::2] + order[::-1][::2]  # neither the draw's order nor all distinct
    for r0, r1 in order:
        assert torch.equal(rows_mask.rows(r0, r1), mask[:, r0:r1]), (r0, r1)
    assert torch.equal(torch.rand(5), want_next)  # the generator is where it was


@pytest.mark.parametrize(("shape", "spans"), [
    ((2, 5, 3), [(0, 3), (3, 5)]),  # 3 rows x 3: a piece of 9 lanes splits a word
    ((2, 8, 4), [(0, 4), (5, 8)]),  # a gap: rows 4 are not drawn by any piece
    ((2, 8, 4), [(0, 4)]),  # short of the last row
])
def test_pieces_that_cannot_be_drawn_alone_keep_the_mask(shape, spans):
    torch.manual_seed(5)
    want = keep_mask(shape, 0.4, "cpu")
    torch.manual_seed(5)
    got, rows_mask = RowMask.draw(shape, 0.4, "cpu", spans)
    assert rows_mask is None and torch.equal(got, want)


def _blocked_step(ops: str, kind: str):
    """A blocked, dropped-out step: its loss, gradients, the bool tensors autograd saved (by
    element count) and the binary stream's width."""
    torch.manual_seed(0)
    model = folnet.build_model(ops, preset="tiny", kind=kind, vocab_size=50, dropout=0.2,
                               attention_dropout=0.0).train()
    folnet.set_memory(model, "blocked", block_rows=4)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 50, (2, 12), generator=g)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bool:
            saved.append(t.numel())
        return t

    torch.manual_seed(7)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=x)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads, saved, model.cfg.D2


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_recomputed_stages_keep_states_not_masks(monkeypatch, kind):
    """The blocks' residual masks are not saved for the backward pass, and the step is the
    one that saves them, to the bit: patched to keep the masks, the same step saves one bool
    tensor more per mask drawn over row spans (the mixer's and the FFN's)."""
    drawn, real = [], RowMask.draw

    def counted(shape, p, device, spans):
        mask, rows = real(shape, p, device, spans)
        assert rows is not None
        drawn.append(mask.numel())
        return mask, rows

    monkeypatch.setattr(RowMask, "draw", staticmethod(counted))
    loss, grads, saved, d2 = _blocked_step("jmc.atp", kind)
    assert len(drawn) >= 2  # a layer writing the binary stream: both stages
    # the one square left: the binary atoms' dropout, kept as a mask outside activation
    # checkpointing
    assert saved.count(2 * 12 * 12 * d2) == 1, saved

    def keeps(shape, p, device, spans):
        return keep_mask(shape, p, device), None

    monkeypatch.setattr(RowMask, "draw", staticmethod(keeps))
    loss_kept, grads_kept, saved_kept, _ = _blocked_step("jmc.atp", kind)
    for size in set(drawn):
        assert saved_kept.count(size) - saved.count(size) == drawn.count(size), size
    assert torch.equal(loss, loss_kept) and grads.keys() == grads_kept.keys()
    for name, g in grads.items():
        assert torch.equal(g, grads_kept[name]), name


def test_states_drawn_over_other_blocks_are_refused():
    """A `RowMask` is read by the blocks it was drawn over, or refused at once: the FFN kernel
    with another block size, and the recomputed function with other spans."""
    from folnet.errors import FolnetError
    from folnet.ops.primitives import binary_ffn
    from folnet.ops.primitives.recompute import Slab, recompute_blocks

    g = torch.Generator().manual_seed(0)
    n = torch.randn(2, 8, 8, 4, generator=g)
    weights = [torch.randn(s, generator=g) for s in ((16, 8), (16,), (4, 16), (4,), (4, 4), (4,))]
    keep, rows_mask = RowMask.draw(n.shape, 0.1, "cpu", _spans(8, 4))
    with pytest.raises(FolnetError, match="redrawn is keep's row mask over blocks of 2 rows"):
        binary_ffn(n, *weights, rows=2, keep=keep, p=0.1, redrawn=rows_mask)
    with pytest.raises(FolnetError, match="only in blocks of rows; got rows=None with redrawn"):
        binary_ffn(n, *weights, redrawn=rows_mask)
    with pytest.raises(ValueError, match=r"redrawn inputs \['drop'\]: read by rows of dim 1"):
        recompute_blocks(lambda b: {"y": b.slabs["d"].float()}, _spans(8, 2), {"drop": keep},
                         [], {"d": Slab("drop", 1)}, redrawn={"drop": rows_mask})
    out = binary_ffn(n, *weights, rows=4, keep=keep, p=0.1, redrawn=rows_mask)
    assert out.shape == n.shape
