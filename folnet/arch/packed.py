"""A decoder's packed rows: several documents' pieces in one row, numbered by ``document_ids``
(B, T) (`folnet.train.data.packing` makes them), each computing what it would alone.

Three things make a piece independent of its neighbours: a position sees only earlier
positions of its own piece (`document_visibility`: causal and block-diagonal), positions count
from the piece's first token (`document_positions`: the atoms' absolute positions and the
relative ids), and no piece's first token is a target of the previous piece's last position
(`document_labels`). The binary stream keeps no cross-piece pair either: a causal layer
multiplies it by the visibility after every update (`folnet.arch.layer.dual_stream`).
"""

from __future__ import annotations

import torch

from folnet.arch.objectives import IGNORE
from folnet.errors import FolnetError

__all__ = ["check_documents", "document_labels", "document_positions", "document_visibility"]


def check_documents(document_ids: object, shape: tuple[int, int]) -> torch.Tensor:
    """Integer document ids of exactly ``shape`` (B, T)."""
    if not isinstance(document_ids, torch.Tensor) or document_ids.is_floating_point() or (
            document_ids.dtype == torch.bool):
        raise FolnetError(f"document_ids must be an integer tensor, got "
                          f"{getattr(document_ids, 'dtype', type(document_ids).__name__)}")
    if tuple(document_ids.shape) != shape:
        raise FolnetError(f"document_ids must have the shape of input_ids {shape}, got "
                          f"{tuple(document_ids.shape)}")
    return document_ids


def _starts(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the first token of each piece (a change of id, and every row's first)."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return starts


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) each token's position counted from its piece's first token."""
    at = torch.arange(document_ids.shape[1], device=document_ids.device)[None]  # (1, T)
    first = torch.where(_starts(document_ids), at, 0).cummax(dim=1).values  # (B, T)
    return at - first


def document_visibility(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T, T) keep[row, col]: col <= row, in the same piece."""
    T = document_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=document_ids.device).tril()
    return causal[None] & (document_ids[:, :, None] == document_ids[:, None, :])


def document_labels(labels: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
    """``labels`` with each piece's first token ignored: position i predicts labels[i + 1],
    which a piece's first token must not be for the previous piece's last position."""
    return labels.masked_fill(_starts(document_ids), IGNORE)
