"""What the kernels need to know of torch.func (functorch): whether a transform is running, and
what a running vmap asks of random draws.

Why: under a transform (``grad``, ``vmap``, ``jacrev`` ...) the kernels change *how* they
compute, never *what*:

* oneDNN's linear has neither a batching rule nor a derivative formula, so the products run as
  plain torch ops (`folnet.ops.primitives.linear.onednn_ok`);
* a buffer filled in place (an output written block by block of rows, a weight gradient summed
  over blocks) is built out of place instead: under vmap an unbatched buffer cannot take a
  batched value in place;
* a block recomputed in the backward pass (`folnet.ops.primitives.recompute`) re-enters autograd
  on the layer's own parameters, which a transform cannot follow: the blocks run as plain
  differentiable ops instead, keeping their graphs (a transform keeps them anyway);
* dropout draws one mask per call through torch's default generator: under vmap that is
  torch's ``randomness="same"``, and the other modes are refused
  (`folnet.ops.primitives.dropout.keep_mask`).

Inside an autograd Function's forward under ``grad`` no transform is running (torch runs it on
the unwrapped tensors), so the eager fast path applies there; under ``vmap`` one is.
"""

from __future__ import annotations

import torch

__all__ = ["transformed", "vmap_active", "vmap_randomness"]

try:  # private modules of torch.func: looked up once, absent meaning "no transform"
    from torch._C._functorch import peek_interpreter_stack as _peek
    from torch._functorch.pyfunctorch import TransformType as _TransformType
    from torch._functorch.pyfunctorch import (
        retrieve_all_functorch_interpreters as _interpreters,
    )
except ImportError:  # pragma: no cover - every supported torch has them
    _peek = None


def transformed() -> bool:
    """True while a torch.func transform is running (one C call, ~70 ns). False while
    torch.compile traces: the kernels take plain ops there anyway, and dynamo cannot trace
    the interpreter stack (each look was a graph break)."""
    if _peek is None or torch.compiler.is_compiling():
        return False
    return _peek() is not None


def vmap_randomness() -> tuple[str, ...]:
    """The ``randomness`` argument ("error", "same" or "different") of every torch.func.vmap
    running now, outermost first; empty outside vmap."""
    if not transformed():
        return ()
    return tuple(i.randomness() for i in _interpreters() if i.key() == _TransformType.Vmap)


def vmap_active() -> bool:
    """True while a torch.func.vmap runs (whatever other transforms run with it)."""
    return bool(vmap_randomness())

