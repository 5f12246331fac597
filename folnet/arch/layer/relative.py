"""RPE* (paper Appendix C): static Shaw-style relative embeddings inside ``j`` and ``a`` --
the degenerate ``m`` (values) and ``p`` (keys) with one table per layer indexed by the
clipped-distance id of each token pair (`folnet.arch.atoms.relative_position_ids`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folnet.arch.layer.domain import Domain
from folnet.ops import OperatorSpec, masks


def static_relative(spec: OperatorSpec, K: torch.Tensor, domain: Domain, key: torch.Tensor,
                    value: torch.Tensor) -> torch.Tensor | float:
    """The static term added to the output of ``j`` or ``a`` (0 for every other operator).

    ``K`` is the operator's kernel in the spec's layout, scaled, before its activation;
    ``key`` and ``value`` are the (2 delta + 2, S) tables."""
    rel_ids = domain.rel_ids  # (B|1, T, T)
    if spec.name == "join":  # + sum_a softmax(K_h(x, a)) r_s(id(x, a))
        keep = masks.kernel_keep(spec, spec.kernel, order=domain.order(masks.query_letter(spec)),
                                 pad=domain.pad)
        if keep is not None:
            K = K.masked_fill(~keep, masks.fill_value(K.dtype))
        probs = torch.softmax(K, dim=2)  # (B, X, A, H)
        onehot = F.one_hot(rel_ids, value.shape[0]).to(probs.dtype)  # (B, X, A, R)
        return torch.einsum("bxah,bxar,rs->bxhs", probs, onehot, value)
    if spec.name == "assoc":  # + sum_w q_hw(x) r_w(id(x, y))
        scores = torch.einsum("bxhw,rw->bxhr", K, key)  # (B, X, H, R)
        index = rel_ids.unsqueeze(2).expand(scores.shape[0], -1, scores.shape[2], -1)
        # (B, X, Y, H); the operator's constant scale is applied to the sum by the layer
        return scores.gather(3, index).permute(0, 1, 3, 2)
    return 0.0
