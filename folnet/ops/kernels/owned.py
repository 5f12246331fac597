"""Whether autograd alone holds a gradient, so that a backward pass may write into it.

Why: a recomputed function whose output is its input plus an update (a residual,
`folnet.ops.kernels.recompute`) can sum the input's gradient into the output's incoming
gradient itself instead of into a second full-size tensor -- but only if nothing else reads
that tensor afterwards. Autograd hands one gradient to several nodes where an op's backward
returns it unchanged for two inputs (an add), so the answer is read from torch's own reference
counts, as PyTorch's input buffer reads them before it adds in place. Those counts are private
API: a torch without them gets False (a copy, never a wrong sum).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["held_alone"]


def held_alone(t: torch.Tensor) -> bool:
    """Whether nothing but autograd's buffer holds ``t`` and its storage. A Python reference
    (a hook that keeps the gradient) is not counted: ask only of tensors no hook sees."""
    use = getattr(t, "_use_count", None)
    storage_use = getattr(torch._C, "_storage_Use_Count", None)
    if use is None or storage_use is None or t._base is not None:
        return False
    return use() == 1 and storage_use(t.untyped_storage()._cdata) == _storage_refs_alone()


@functools.cache
def _storage_refs_alone() -> int:
    """The storage count `held_alone` reads for a tensor that is alone: its own reference plus
    the one of the Python storage object asked for it."""
    alone = torch.empty(1)
    return torch._C._storage_Use_Count(alone.untyped_storage()._cdata)
