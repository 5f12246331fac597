"""The dual-stream layer and what it is made of: the fused projections and their slots
(`slots`), the domain an operator runs over (`domain`), the mixer stage (`mixer`), the blocked
runner over the stages and its memory modes (`row_blocks`, `memory_modes`), a causal layer's
context hand-off (`context`), the Boolean FFNs (`ffn`), the static relative terms of rpe*
(`relative`), the input atoms (`atoms`) and the stack of layers (`stack`).

``from folnet.arch.layer import DualStreamLayer`` (the path before this folder existed) keeps
working.
"""

from folnet.arch.layer.dual_stream import DualStreamLayer

__all__ = ["DualStreamLayer"]
