"""rpe*'s static relative terms read from the operator specs (folnet/arch/layer/relative.py).

A registered operator typed and laid out like ``j`` or ``a`` gets the same static term as the
built-in; the term matches a loop over its definition (Appendix C's degenerate ``m`` and
``p``) for index layouts other than the built-ins'; operators of other typings get none; an
operator of a self-attention typing that the static term cannot be read from is refused,
named."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from tolerances import assert_close

import folnet
from folnet.arch.layer.domain import Domain
from folnet.arch.layer.relative import (
    StaticForm,
    check_static_relative,
    static_form,
    static_relative,
)
from folnet.ops.spec import spec_to_dict

pytestmark = pytest.mark.usefixtures("one_thread")

B, T, H, S, R = 2, 7, 3, 4, 10  # R: table rows (2 delta + 2)
DIMS = {"D1": 64, "D2": 16, "H": 4, "S": 16, "F1": 128, "F2": 32}  # the tiny preset's


def _copy(source: str, symbol: str, name: str, **changes) -> folnet.OperatorSpec:
    """Register the built-in ``source`` again under another symbol and name."""
    data = spec_to_dict(folnet.get_operator(source))
    data.update(symbol=symbol, name=name, **changes)
    return folnet.register_operator(data)


def _model(ops: str, state=None):
    model = tiny_model(ops, position="rpe*", eval_mode=True)
    if state is not None:
        model.load_state_dict(state)
    return model


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (2, 12), generator=g)
    types = torch.zeros(2, 12, dtype=torch.long)
    types[:, 6:] = 1
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # padding
    return ids, types, mask


def _run(model):
    ids, types, mask = _inputs()
    with torch.no_grad():
        out = model(ids, types, attention_mask=mask, output_relations=True)
    return out.sequence_output, out.relation_output


def _with_tables(model, **tables):
    """The model with the named rpe* tables (``rel_key``, ``rel_value``) of every layer
    replaced by ``fill`` (a float) -- a copy."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k in state:
        for name, fill in tables.items():
            if k.endswith(name):
                state[k].fill_(fill)
    return state


def test_built_in_forms():
    assert static_form(folnet.get_operator("j")) == StaticForm("value", "x", "a", "s")
    assert static_form(folnet.get_operator("a")) == StaticForm("key", "x", "y", "w")
    for symbol in "bcmpt":  # the paper's rpe* touches self-attention only
        assert static_form(folnet.get_operator(symbol)) is None


def test_other_typings_get_no_term():
    bprod = folnet.register_operator(  # B <- B x U: its unary premise is at the query
        symbol="q", name="bprod_rel", typing="B <- B x U", kernel="x y w", premise="x h w",
        output="x y h", bdim="x", rdim="w")
    assert static_form(bprod) is None
    domain = Domain(n=T, rel_ids=torch.zeros(1, T, T, dtype=torch.long))
    K = torch.randn(B, T, T, S)
    assert static_relative(bprod, K, domain, torch.randn(R, S), torch.randn(R, S)) == 0.0
    check_static_relative(bprod, DIMS)  # nothing to refuse


@pytest.mark.parametrize(("builtin", "copy"), [("j.a", "k.e"), ("jmc.atp", "kmc.etp")])
def test_registered_copies_get_the_same_terms(builtin, copy):
    _copy("j", "k", "join_copy")
    _copy("a", "e", "assoc_copy")
    assert static_form(folnet.get_operator("k")) == static_form(folnet.get_operator("j"))
    assert static_form(folnet.get_operator("e")) == static_form(folnet.get_operator("a"))
    ref = _model(builtin)
    state = ref.state_dict()
    with torch.no_grad():  # tables far from zero, so that every term counts
        for k, v in state.items():
            if k.endswith(("rel_key", "rel_value")):
                v.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(len(k)))
    ref.load_state_dict(state)
    mine = _model(copy, state)  # the same weights, every name the same
    want_u, want_b = _run(ref)
    got_u, got_b = _run(mine)
    assert torch.equal(got_u, want_u) and torch.equal(got_b, want_b)
    # each copy's term is applied: zeroing the table it reads changes the outputs
    for table in ("rel_value", "rel_key"):
        zero_u, zero_b = _run(_model(copy, _with_tables(mine, **{table: 0.0})))
        assert float((zero_u - got_u).abs().max()) > 1e-3, f"{table} of the copy unused"
        assert float((zero_b - got_b).abs().max()) > 1e-3, f"{table} of the copy unused"


# -- against a loop over the definition, float64, with padding -----------------------------------

def _domain(rel_batch: int):
    g = torch.Generator().manual_seed(2)
    rel = torch.randint(0, R, (rel_batch, T, T), generator=g)  # not symmetric
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 5:] = False
    return Domain(n=T, pad=pad, rel_ids=rel), rel.expand(B, T, T), pad


def _laid_out(t: torch.Tensor, have: tuple[str, ...], want: str) -> torch.Tensor:
    return t.permute([0] + [1 + have.index(c) for c in want])


def _value_reference(Kc, value, rel, pad):
    """sum_a softmax_a(K_h(x, a)) r_s(id(x, a)) over real tokens a; Kc (B, x, a, h)."""
    out = torch.zeros(B, T, H, value.shape[1], dtype=torch.float64)
    for b in range(B):
        real = [a for a in range(T) if pad[b, a]]
        for x in range(T):
            for h in range(H):
                p = torch.softmax(Kc[b, x, real, h], dim=0)
                for i, a in enumerate(real):
                    out[b, x, h] += p[i] * value[rel[b, x, a]]
    return out  # (B, x, h, s)


def _key_reference(Kc, key, rel):
    """sum_w K_hw(x) r_w(id(x, y)); Kc (B, x, h, w)."""
    out = torch.zeros(B, T, T, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for y in range(T):
                for h in range(H):
                    out[b, x, y, h] = sum(Kc[b, x, h, w] * key[rel[b, x, y], w]
                                          for w in range(key.shape[1]))
    return out  # (B, x, y, h)


VALUE_SPECS = {
    "j": None,
    # the same operator laid out otherwise: kernel (a, h, x), output (s, x, h)
    "v": dict(symbol="v", name="join_shuffled", typing="U <- B x U", kernel="a h x",
              premise="s a h", output="s x h", bdim="h", rdim="a", activation="softmax"),
}
KEY_SPECS = {
    "a": None,
    "k": dict(symbol="k", name="assoc_shuffled", typing="B <- U x U", kernel="w x h",
              premise="h w y", output="x h y", bdim="h", rdim="w"),
}


def _spec(symbol, data):
    return folnet.get_operator(symbol) if data is None else folnet.register_operator(data)


@pytest.mark.numerics
@pytest.mark.parametrize("rel_batch", [B, 1])
@pytest.mark.parametrize("symbol", list(VALUE_SPECS))
def test_value_form_matches_a_loop(symbol, rel_batch):
    spec = _spec(symbol, VALUE_SPECS[symbol])
    domain, rel, pad = _domain(rel_batch)
    g = torch.Generator().manual_seed(3)
    Kc = torch.randn(B, T, T, H, dtype=torch.float64, generator=g)  # (B, x, a, h)
    value = torch.randn(R, S, dtype=torch.float64, generator=g)
    K = _laid_out(Kc, ("x", "a", "h"), spec.kernel)
    got = static_relative(spec, K, domain, torch.full((R, S), torch.nan, dtype=torch.float64),
                          value)  # the key table is not read
    want = _value_reference(Kc, value, rel, pad)
    assert_close(_laid_out(got, spec.output, "xhs"), want, rtol=1e-12, atol=1e-12,
                 what=f"{symbol} value term")
    # query rows of the domain (blocked rows): the rows of the same term
    rows = torch.arange(2, 5)
    sub = Domain(n=T, pad=domain.pad, rows=rows, rel_ids=domain.rel_ids[:, 2:5])
    part = static_relative(spec, _laid_out(Kc[:, 2:5], ("x", "a", "h"), spec.kernel), sub,
                           value, value)
    assert_close(_laid_out(part, spec.output, "xhs"), want[:, 2:5], rtol=1e-12, atol=1e-12,
                 what=f"{symbol} value term, rows 2:5")


@pytest.mark.numerics
@pytest.mark.parametrize("rel_batch", [B, 1])
@pytest.mark.parametrize("symbol", list(KEY_SPECS))
def test_key_form_matches_a_loop(symbol, rel_batch):
    spec = _spec(symbol, KEY_SPECS[symbol])
    domain, rel, _ = _domain(rel_batch)
    g = torch.Generator().manual_seed(4)
    Kc = torch.randn(B, T, H, S, dtype=torch.float64, generator=g)  # (B, x, h, w)
    key = torch.randn(R, S, dtype=torch.float64, generator=g)
    K = _laid_out(Kc, ("x", "h", "w"), spec.kernel)
    got = static_relative(spec, K, domain, key,
                          torch.full((R, S), torch.nan, dtype=torch.float64))
    want = _key_reference(Kc, key, rel)
    assert_close(_laid_out(got, spec.output, "xyh"), want, rtol=1e-12, atol=1e-12,
                 what=f"{symbol} key term")
    sub = Domain(n=T, pad=domain.pad, rows=torch.arange(2, 5), rel_ids=domain.rel_ids[:, 2:5])
    part = static_relative(spec, _laid_out(Kc[:, 2:5], ("x", "h", "w"), spec.kernel), sub,
                           key, key)
    assert_close(_laid_out(part, spec.output, "xyh"), want[:, 2:5], rtol=1e-12, atol=1e-12,
                 what=f"{symbol} key term, rows 2:5")


# -- refusals -------------------------------------------------------------------------------------

REFUSED = [
    # the score's query side is the premise: the kernel sits at the output's column
    (dict(symbol="e", name="assoc_flipped", typing="B <- U x U", kernel="y h w",
          premise="x h w", output="x y h", bdim="h", rdim="w"),
     r"operator 'e' \(assoc_flipped\): position 'rpe\*' .* 'B <- U x U' .* its kernel is at "
     r"'y', not at the query 'x'"),
    # two premise channels the table would supply
    (dict(symbol="e", name="join_wide", typing="U <- B x U", kernel="x a h", premise="a h s w",
          output="x h s w", bdim="h", rdim="a", activation="softmax"),
     r"operator 'e' \(join_wide\): position 'rpe\*' .* 'U <- B x U' .* premise channels "
     r"\['s', 'w'\]"),
    # the value channel is not S wide
    (dict(symbol="e", name="join_d1", typing="U <- B x U", kernel="x a h", premise="a h s",
          output="x h s", bdim="h", rdim="a", activation="softmax", sizes={"s": "D1"}),
     r"operator 'e' \(join_d1\): position 'rpe\*' .* its channel 's' is D1 = 64 wide, not "
     r"S = 16"),
]


@pytest.mark.parametrize(("data", "match"), REFUSED, ids=[d["name"] for d, _ in REFUSED])
def test_unreadable_self_attention_operators_are_refused(data, match):
    spec = folnet.register_operator(data)
    with pytest.raises(folnet.FolnetError, match=match):
        check_static_relative(spec, DIMS)
    ops = "e.a" if spec.typing.output == "U" else "j.e"
    ids, types, mask = _inputs()
    # refused when the layer is built (`check_static_relative`), widths included: never
    # silently skipped, never a shape error at run time
    with pytest.raises(folnet.FolnetError, match=r"operator 'e' .* position 'rpe\*'"):
        _model(ops)
    # without rpe* the operator is fine
    torch.manual_seed(0)
    model = folnet.build_model(ops, preset="tiny", position="rpe", vocab_size=100)
    assert torch.isfinite(model(ids, types, attention_mask=mask).sequence_output).all()
