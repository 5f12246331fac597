"""How a model's layers trade memory for recomputation on long sequences.

The binary stream is B x T x T x D2 per layer, and its stages' working sets are wider still:
the mixer's projections, kernels and premises (N2 channels per pair), the binary FFN's hidden
layer (F2 = 4 D2). Blocked, both stages run over blocks of query rows and recompute each
block in the backward pass (`folnet.arch.layer.row_blocks`, `folnet.ops.primitives.recompute`), so
what stays alive is the binary stream itself (and ``t``'s premise, which every row reads
whole). The mode is a property of a run, not of the architecture -- it changes what is kept
for the backward pass, never the function computed -- so it is set on a built model
(`set_memory`) and not saved:

* ``"auto"`` (default): on a CPU, blocked from `AUTO_MIN_T` tokens on, the full square below
  (where the full square's fused CPU kernels are faster and its memory small) and while
  tracing; on any other device the full square: each block's kernels are too small to fill a
  GPU, so there blocks cost a layer far more time than the memory they save is worth
  (docs/results/measurements.md). A run whose square does not fit asks for ``"blocked"``;
* ``"full"``: always the full square;
* ``"blocked"``: always blocked, ``block_rows`` rows at a time, by default as many rows as
  make `BLOCK_PAIRS` token pairs (batch x rows x columns) per block for that stage;
* ``"tight"``: blocked for the least memory, at some cost in time -- by default blocks of
  `TIGHT_PAIRS` (a quarter of `BLOCK_PAIRS` in both stages), and on a CPU the heap's
  free pages handed back to the operating system (`folnet.libc.release_free_memory`) before
  each recomputed mixer stage's forward pass and before and after its backward pass. What a
  step keeps beyond its tensors on a CPU is heap: freed blocks between tensors of other sizes,
  which the smaller blocks make smaller and the release returns. Together they lower a long
  step's resident peak, for a slower step (docs/results/measurements.md).
"""

from __future__ import annotations

from torch import nn

from folnet.errors import FolnetError, choices
from folnet.ops import masks
from folnet.ops.spec import ROLES, OperatorSpec
from folnet.tracing import traced

__all__ = ["AUTO_MIN_T", "BLOCK_PAIRS", "MEMORY_MODES", "TIGHT_PAIRS", "auto_blocks",
           "block_reach", "block_rows_for", "releases_heap", "set_memory"]

MEMORY_MODES = ("auto", "full", "blocked", "tight")
#: Sequence length from which ``"auto"`` blocks.
AUTO_MIN_T = 256
#: Token pairs per block unless told otherwise, per stage: the FFN's pairs carry its hidden
#: layer, wider than a mixer block's channels, so its blocks hold half as many. Larger blocks
#: raise a long step's peak; smaller mixer blocks slow the step, and smaller FFN blocks do not
#: lower the peak (docs/results/measurements.md).
BLOCK_PAIRS = {"mixer": 1 << 16, "ffn": 1 << 15}
#: The ``"tight"`` mode's token pairs per block: a quarter of `BLOCK_PAIRS` in both stages,
#: the sizes tried with the lowest peak when the heap is released; smaller FFN blocks do not
#: lower it further (docs/results/measurements.md). Each mixer block reads ``t``'s premise
#: whole and adds into its full-size gradient sink, so small mixer blocks cost time in
#: full-square passes; the FFN's blocks read slabs only.
TIGHT_PAIRS = {"mixer": 1 << 14, "ffn": 1 << 13}


def auto_blocks(tokens: int, device_type: str) -> bool:
    """Whether ``"auto"`` runs ``tokens`` query rows on ``device_type`` in blocks: on a CPU from
    `AUTO_MIN_T` on, never elsewhere (the module docstring says why). While torch.compile or
    torch.export traces, never: a branch on the length would pin a dynamic length to one side
    of `AUTO_MIN_T`."""
    if device_type != "cpu" or traced() or not isinstance(tokens, int):  # symbolic: tracing
        return False
    return tokens >= AUTO_MIN_T


def block_rows_for(tokens: int, mode: str, block_rows: int | None, *, row_pairs: int = 1,
                   stage: str = "mixer", device_type: str = "cpu") -> int | None:
    """Rows per block for ``tokens`` query rows of ``row_pairs`` pairs each (batch x columns)
    in ``stage`` ("mixer" or "ffn") on ``device_type``, or None for the full square."""
    if mode == "full" or (mode == "auto" and not auto_blocks(tokens, device_type)):
        return None
    pairs = TIGHT_PAIRS if mode == "tight" else BLOCK_PAIRS
    return block_rows or max(1, pairs[stage] // max(1, row_pairs))


def releases_heap(mode: str, device_type: str) -> bool:
    """Whether a layer in ``mode`` on ``device_type`` returns the heap's free pages around its
    recomputed stages: ``"tight"`` on a CPU (a GPU's caching allocator has no such heap)."""
    return mode == "tight" and device_type == "cpu"


def set_memory(model: nn.Module, mode: str = "auto", block_rows: int | None = None) -> nn.Module:
    """Set every dual-stream layer of ``model`` to ``mode`` (see the module docstring);
    returns the model."""
    if mode not in MEMORY_MODES:
        raise FolnetError(f"memory mode {mode!r} is unknown; use {choices(MEMORY_MODES)}")
    if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int)
                                   or block_rows < 1):
        raise FolnetError(f"block_rows must be a positive integer (query rows per block), got "
                          f"{block_rows!r}")
    layers = [m for m in model.modules() if hasattr(m, "memory_mode")]
    if not layers:
        raise FolnetError(f"set_memory: {type(model).__name__} has no FOLNet layer")
    for layer in layers:
        layer.memory_mode, layer.block_rows = mode, block_rows
    return model


def block_reach(specs: dict[int, OperatorSpec]) -> dict[str, list[tuple[int, str]]]:
    """The kernels and premises of the operators ``specs`` ({slot: spec}) as (slot, role), by
    what a block of query rows reads of them: ``"row"`` (first token the query letter: the
    block's rows), ``"col"`` (last token the query letter: its columns) or ``"all"``
    (neither: the whole tensor, made once for all blocks)."""
    keys: dict[str, list[tuple[int, str]]] = {"row": [], "col": [], "all": []}
    for i, spec in specs.items():
        q = masks.query_letter(spec)
        for role in ROLES:
            toks = spec.tokens(role)
            keys["row" if toks[0] == q else "col" if toks[-1] == q else "all"].append((i, role))
    return keys
