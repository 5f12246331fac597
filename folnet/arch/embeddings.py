"""Base atoms: token ids and segments into the unary stream, clipped relative distances into the
binary stream (paper Appendix A.4, with the released code's numbering -- DESIGN.md section 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch import kernels
from folnet.arch.config import ModelConfig


def relative_position_ids(token_type_ids: torch.Tensor, delta: int) -> torch.Tensor:
    """The clipped-distance id of every token pair (row t, column tau): ``(B, T) -> (B, T, T)``.

    Same segment, t, tau > 0: ``min(tau - t, delta - 1)`` when tau >= t, else
    ``2 delta - min(t - tau, delta - 1)``; different segments: ``delta``; t = 0 < tau:
    ``2 delta``; tau = 0 < t: ``2 delta + 1``; (0, 0): 0. Ids lie in ``[0, 2 delta + 1]``.
    """
    T = token_type_ids.shape[1]
    pos = torch.arange(T, device=token_type_ids.device)
    diff = pos[None, :] - pos[:, None]  # (T, T) tau - t
    clip = diff.abs().clamp(max=delta - 1)
    ids = torch.where(diff >= 0, clip, 2 * delta - clip)  # (T, T)
    same = token_type_ids[:, :, None] == token_type_ids[:, None, :]  # (B, T, T)
    ids = torch.where(same, ids, torch.full_like(ids, delta))  # (B, T, T)
    ids = ids.clone()
    ids[:, 0, 1:] = 2 * delta
    ids[:, 1:, 0] = 2 * delta + 1
    ids[:, 0, 0] = 0
    return ids


class BaseAtoms(nn.Module):
    """Embeds input ids into the two streams: ``u1 (B, T, D1)`` and ``u2 (B, T, T, D2)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.padded_vocab, cfg.D1)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.D1)
        self.absolute = nn.Embedding(cfg.max_positions, cfg.D1) if cfg.position == "ape" else None
        self.relative = (nn.Embedding(2 * cfg.delta + 2, cfg.D2) if cfg.position == "rpe"
                         else None)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                rel_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        B, T = input_ids.shape
        u1 = self.word(input_ids) + self.token_type(token_type_ids)  # (B, T, D1)
        if self.absolute is not None:
            u1 = u1 + self.absolute.weight[:T]
        u1 = kernels.dropout(F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps), cfg.dropout,
                             self.training)
        if self.relative is not None:
            # LayerNorm is per row, so normalise the (2 delta + 2)-row table, then look up:
            # the same atoms as normalising the B x T x T lookup, for a fraction of the work.
            table = F.layer_norm(self.relative.weight, (cfg.D2,), eps=cfg.layer_norm_eps)
            u2 = kernels.dropout(F.embedding(rel_ids, table), cfg.dropout,
                                 self.training)  # (B, T, T, D2)
        else:
            u2 = u1.new_zeros(B, T, T, cfg.D2)
        return u1, u2
