"""RPE* (paper Appendix C): static Shaw-style relative embeddings inside self-attention.

Shaw et al. add a static embedding of the clipped distance id(i, j) to the two per-token
vectors self-attention reads at the *other* position j: the value, ``x_j W^V + a^V_ij``
(their eq. 3), and the key, ``x_j W^K + a^K_ij`` (eq. 5). FOLNet's self-attention is the pair
``j`` (``U <- B x U``, "performs the self-attention operation") and ``a`` (``B <- U x U``,
"computes the self-attention scores") -- paper section 3, "Connection with transformers" --
and those two vectors are their unary premises: j's value v_hs(a), a's key v_hw(y). So rpe*
lifts an attention operator's unary premise v(z) to the binary v(z) + r(id(q, z)), q the
output's query letter, one table r per layer shared over the heads. The contraction is
linear in the premise, so the operator's output gains its own contraction of the activated
kernel with the static part alone -- Appendix C's degenerate ``m`` (values: the premise token
z is the R-dim, ``sum_a K_h(x, a) r_s(id(x, a))``) or ``p`` (keys: the table's channel is the
R-dim, ``sum_w K_hw(x) r_w(id(x, y))``).

Which operators get a term is read from the spec (`static_form`): the typing says whether it is
self-attention's apply (``U <- B x U``: value side) or its scores (``B <- U x U``: key side);
the index letters say where the query, the other token and the table's channel sit. Every
other typing gets nothing, as in the paper (``m``, ``p`` are the dynamic relatives themselves;
``b``, ``c``, ``t`` are not self-attention). An operator of one of the two typings whose letters
do not fit the form is refused with a `FolnetError` (`check_static_relative`), never skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from folnet.arch.layer.domain import Domain
from folnet.errors import FolnetError
from folnet.ops import OperatorSpec, masks
from folnet.ops.backends.base import activate
from folnet.ops.sizes import channel_sizes

#: typing -> which of the layer's tables the operator reads (Shaw's a^V or a^K)
TABLES = {"U <- B x U": "value", "B <- U x U": "key"}
_TABLE_LETTER = "r"  # the table rows (relative ids) in the einsums: no spec uses it


@dataclass(frozen=True)
class StaticForm:
    """Where rpe*'s static embedding enters one operator."""

    table: str  # "value" (the premise token is the R-dim) or "key" (the channel is the R-dim)
    query: str  # the output's query token: the row of the relative id
    other: str  # the premise's token: the column of the relative id
    channel: str  # the premise channel the table supplies (S wide); the rest are broadcast


def _refuse(spec: OperatorSpec, table: str, problem: str) -> FolnetError:
    like = "j (join)" if table == "value" else "a (assoc)"
    shape = ("a binary kernel over (query, R-dim token), a unary premise at the R-dim token "
             "and one S-wide premise channel not in the kernel" if table == "value" else
             "a unary kernel at the output's first token (the query), a unary premise at the "
             "other output token, no premise channel but the kernel's and an S-wide R-dim")
    return FolnetError(
        f"operator {spec.symbol!r} ({spec.name}): position 'rpe*' adds static relative "
        f"embeddings to self-attention operators typed 'U <- B x U' (values, like j) or "
        f"'B <- U x U' (keys, like a); this one is typed {str(spec.typing)!r} like {like}, "
        f"for which rpe* needs {shape}, but {problem}. Use another position mode (e.g. "
        f"'rpe') with this operator, or give it the index layout and sizes of {like}")


@functools.lru_cache(maxsize=256)
def static_form(spec: OperatorSpec) -> StaticForm | None:
    """The static term's form for ``spec``, None for an operator rpe* leaves alone; a
    `FolnetError` for a self-attention typing whose index letters do not fit it."""
    table = TABLES.get(str(spec.typing))
    if table is None:
        return None
    q = masks.query_letter(spec)
    (z,) = spec.tokens("premise")
    ktok = spec.tokens("kernel")
    if table == "value" and (z != spec.rdim or set(ktok) != {q, z}):
        raise _refuse(spec, table, f"its kernel is over {ktok} and its premise at {z!r} "
                                   f"(query {q!r}, R-dim {spec.rdim!r})")
    if table == "key" and ktok != (q,):
        raise _refuse(spec, table, f"its kernel is at {ktok[0]!r}, not at the query {q!r}: "
                                   "the query side of the score is its premise")
    # channels the table supplies: the premise's own, and the R-dim (a key's channel)
    own = [c for c in spec.channels("premise") if c == spec.rdim or c not in spec.kernel]
    if len(own) != 1:
        raise _refuse(spec, table, f"the table would have to supply the premise channels "
                                   f"{own} (one S-wide channel is supported)")
    return StaticForm(table, q, z, own[0])


def check_static_relative(spec: OperatorSpec, dims: Mapping[str, int]) -> None:
    """Refuse, when a layer is built, an operator rpe* cannot give its static term: one of a
    self-attention typing that `static_form` cannot read, or whose table channel is not S
    wide (the layer's tables are (2 delta + 2, S))."""
    form = static_form(spec)
    if form is None:
        return
    width = channel_sizes(spec.sizes, dims, symbol=spec.symbol)[form.channel]
    if width != dims["S"]:
        raise _refuse(spec, form.table, f"its channel {form.channel!r} is "
                                        f"{spec.size_expr(form.channel)} = {width} wide, "
                                        f"not S = {dims['S']}")


def static_relative(spec: OperatorSpec, K: torch.Tensor, domain: Domain, key: torch.Tensor,
                    value: torch.Tensor) -> torch.Tensor | float:
    """The static term added to the output of a self-attention operator, laid out as
    ``spec.output``; 0 for every other operator (`static_form`).

    ``K`` is the operator's kernel in the spec's layout, scaled, before its activation (which
    runs here as the backends run it: masks, softmax over the R-dim; no dropout); ``key`` and
    ``value`` are the (2 delta + 2, S) tables. The operator's constant output scale is applied
    to the sum by the layer, as to a premise's part."""
    form = static_form(spec)
    if form is None:
        return 0.0
    rel_ids = domain.rel_ids  # (B|1, Q, n): rows the query rows, columns the domain
    P = activate(spec, K, spec.kernel, order=domain.order(form.query), pad=domain.pad,
                 dropout_p=0.0)  # (B, *kernel)
    k, o, r = "".join(spec.kernel), "".join(spec.output), _TABLE_LETTER
    q, z, c = form.query, form.other, form.channel
    if form.table == "value":  # + sum_z P(q, z, ...) r_c(id(q, z))
        onehot = F.one_hot(rel_ids, value.shape[0]).to(P.dtype)  # (B|1, Q, n, R) over (q, z)
        return torch.einsum(f"b{k},b{q}{z}{r},{r}{c}->b{o}", P, onehot, value)
    # key: + sum_c P(q, ..., c) r_c(id(q, z)): score every table row, then pick id(q, z)
    kept = tuple(letter for letter in spec.kernel if letter != c)
    scores = torch.einsum(f"b{k},{r}{c}->b{''.join(kept)}{r}", P, key)  # (B, *kept, R)
    shape = [rel_ids.shape[0]] + [1] * len(kept) + [rel_ids.shape[2]]
    shape[1 + kept.index(q)] = rel_ids.shape[1]
    index = rel_ids.reshape(shape).expand(*scores.shape[:-1], -1)  # (B, *kept, n) id(q, z)
    picked = scores.gather(-1, index)  # (B, *kept, z)
    letters = (*kept, z)
    return picked.permute([0] + [1 + letters.index(letter) for letter in spec.output])
