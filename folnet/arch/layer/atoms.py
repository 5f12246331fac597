"""Base atoms: token ids (and segments, and absolute positions) into the unary stream, clipped
relative distances into the binary stream (paper Appendix A.4, with the released code's
numbering -- docs/design.md section 5). One module for every kind of model.

Positions count from each row's first real token (`token_positions`): a row padded on the left
gets the positions, and so the atoms, of the same row unpadded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.ops.primitives import dropout, layer_norm
from folnet.tracing import traced


def token_positions(pad: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """Position of every token, counted from its row's first real token: (B, n), or (1, n)
    without a padding mask. Leading pads sit at 0 (masked out of every reduction anyway); pads
    after the first real token keep counting, so right padding changes nothing."""
    pos = torch.arange(n, device=device)[None]  # (1, n)
    if pad is None:
        return pos
    first = pad.to(torch.int8).argmax(dim=1, keepdim=True)  # (B, 1) index of the first real
    return (pos - first).clamp_min(0)  # (B, n)


def relative_position_ids(token_type_ids: torch.Tensor, delta: int,
                          positions: torch.Tensor | None = None) -> torch.Tensor:
    """The clipped-distance id of every token pair (row t, column tau): ``(B, T) -> (B, T, T)``.

    Same segment, t, tau > 0: ``min(tau - t, delta - 1)`` when tau >= t, else
    ``2 delta - min(t - tau, delta - 1)``; different segments: ``delta``; t = 0 < tau:
    ``2 delta``; tau = 0 < t: ``2 delta + 1``; (0, 0): 0. Ids lie in ``[0, 2 delta + 1]``.
    ``positions`` ((B|1, T)) are the t and tau of each column; None: 0..T-1, whose two id
    squares -- within a segment, across segments -- are made once per length and device
    (`_squares`), so a step's ids are one comparison of the segments and one select.
    """
    T = token_type_ids.shape[1]
    if positions is None and not traced():
        within, across = _squares(T, delta, token_type_ids.device)
    else:
        pos = (torch.arange(T, device=token_type_ids.device)[None] if positions is None
               else positions)  # (B|1, T)
        within, across = _id_squares(pos, delta)
    same = token_type_ids[:, :, None] == token_type_ids[:, None, :]  # (B, T, T)
    return torch.where(same, within, across)  # (B, T, T)


def _id_squares(pos: torch.Tensor, delta: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids of every pair of positions ``pos`` (B|1, T) when both tokens are of one segment,
    and when they are not: (B|1, T, T) each. Pairs with a first token (position 0) take their
    own ids in both."""
    diff = pos[:, None, :] - pos[:, :, None]  # (B|1, T, T) tau - t
    clip = diff.abs().clamp(max=delta - 1)
    ids = torch.where(diff >= 0, clip, 2 * delta - clip)
    first = pos == 0  # (B|1, T): pairs with the first token take their own ids, any segment
    row, col = first[:, :, None], first[:, None, :]
    within = torch.where(row, torch.where(col, 0, 2 * delta),
                         torch.where(col, 2 * delta + 1, ids))
    return within, torch.where(row | col, within, delta)


#: (T, delta, device) -> the two id squares of positions 0..T-1: a handful of lengths per run.
_SQUARES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_SQUARES_KEPT = 16


def _squares(T: int, delta: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (T, delta, device)
    squares = _SQUARES.get(key)
    if squares is None:
        if len(_SQUARES) >= _SQUARES_KEPT:
            _SQUARES.pop(next(iter(_SQUARES)))
        with torch.no_grad():
            squares = _id_squares(torch.arange(T, device=device)[None], delta)
        _SQUARES[key] = squares
    return squares


class Atoms(nn.Module):
    """Embeds ids into the two streams: ``u1 (B, Q, D1)`` and ``u2 (B, Q, n, D2)`` (Q = n for
    a full sequence; Q query rows against a longer domain of n tokens otherwise).

    Unary: word (+ token type) (+ absolute position) embedding, LayerNorm without affine
    parameters, dropout. Binary: the relative-distance embedding looked up by pair id, LayerNorm,
    dropout; zeros without RPE. ``shared_word`` (the encoder's word embedding, for an
    encoder-decoder's decoder) is referenced, not registered, so the state dict holds it once.
    """

    def __init__(self, cfg: ModelConfig, *, token_types: bool = True,
                 shared_word: nn.Embedding | None = None):
        super().__init__()
        self.cfg = cfg
        if shared_word is None:
            self.word = nn.Embedding(cfg.padded_vocab, cfg.D1)
        else:
            object.__setattr__(self, "_shared_word", shared_word)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.D1) if token_types else None
        self.absolute = (nn.Embedding(cfg.max_positions, cfg.D1) if cfg.absolute_positions
                         else None)
        self.relative = (nn.Embedding(2 * cfg.delta + 2, cfg.D2) if cfg.relative_atoms
                         else None)

    @property
    def embedding(self) -> nn.Embedding:
        """The word embedding (owned or shared); the LM heads tie their decoder to it."""
        return self._modules["word"] if "word" in self._modules else self._shared_word

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                positions: torch.Tensor, rel_ids: torch.Tensor | None, n: int,
                keep: torch.Tensor | None = None, *, redraw: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids and token types (B, Q); positions (B|1, Q); rel_ids (B|1, Q, n) when the
        binary stream starts from relative positions; ``keep`` (B|1, Q, n, 1) zeroes the pairs
        a causal row cannot see (lower-triangular atoms). ``redraw``: see `binary`."""
        u1 = self.unary(input_ids, token_type_ids, positions)
        return u1, self.binary(rel_ids, u1, n, keep, redraw=redraw)

    def unary(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
              positions: torch.Tensor) -> torch.Tensor:
        """The unary atoms (B, Q, D1), their dropout drawn first (before `binary`'s)."""
        cfg = self.cfg
        u1 = self.embedding(input_ids)  # (B, Q, D1)
        if self.token_type is not None:
            u1 = u1 + self.token_type(token_type_ids)
        if self.absolute is not None:
            u1 = u1 + self.absolute(positions)
        return dropout(layer_norm(u1, cfg.D1, cfg.layer_norm_eps), cfg.dropout,
                       self.training)

    def binary(self, rel_ids: torch.Tensor | None, u1: torch.Tensor, n: int,
               keep: torch.Tensor | None = None, *, redraw: bool = False) -> torch.Tensor:
        """The binary atoms (B, Q, n, D2) of the rows of ``u1`` (B, Q, D1). Cheap to make
        again (a lookup in a small table), so an activation-checkpointed stack makes them
        inside its first layer's checkpoint rather than keeping them (`run_stack`). ``redraw``
        (a run that saves memory) keeps the dropout's generator state for the backward pass,
        not its mask, and draws the mask again there (`folnet.ops.primitives.dropout`)."""
        cfg = self.cfg
        B, Q = u1.shape[:2]
        if self.relative is not None:
            # LayerNorm is per row, so normalise the (2 delta + 2)-row table, then look up:
            # the same atoms as normalising the B x Q x n lookup, for a fraction of the work.
            table = layer_norm(self.relative.weight, cfg.D2, cfg.layer_norm_eps)
            u2 = F.embedding(rel_ids, table).expand(B, Q, n, cfg.D2)  # (B, Q, n, D2)
            u2 = dropout(u2, cfg.dropout, self.training, redraw=redraw)
        else:
            u2 = u1.new_zeros(B, Q, n, cfg.D2)
        return u2 if keep is None else u2 * keep
