"""Text-to-text FOLNets: no leak from the future (every operator alone and jmc.atp, both
kinds), PrefixLM visibility, the rectangular operator path, checkpoints, bad input."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from tolerances import assert_close

import folnet
from folnet.ops import compile_operator
from folnet.ops.masks import causal_form

pytestmark = pytest.mark.usefixtures("one_thread")

V, T = 50, 7
# (ops, whether tokens interact: perturbing token 0 must then move the last position's outputs)
OPS = [("j.", True), ("c.", True), ("m.a", True), (".a", True), (".p", False), (".at", True),
       ("jmc.atp", True)]


def tiny(ops="jmc.atp", kind="decoder", seed=0, **kw):
    kw.setdefault("vocab_size", V)  # these tests read the final binary rows
    return tiny_model(ops, kind, seed=seed, eval_mode=True, relations=True, **kw)


def ids(B=2, n=T, seed=0):
    return torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed))


def perturbed(x, after, seed):
    """x with every token after position ``after`` replaced by a different one."""
    y = x.clone()
    shift = torch.randint(1, V, y[:, after + 1 :].shape,
                          generator=torch.Generator().manual_seed(seed))
    y[:, after + 1 :] = (y[:, after + 1 :] + shift) % V
    return y


def rows(out, t):
    """Every output of positions <= t: logits, unary atoms, binary rows."""
    return out.logits[:, : t + 1], out.sequence_output[:, : t + 1], out.relation_output[:, : t + 1]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))



@pytest.mark.parametrize(("ops", "interacts"), OPS)
@torch.no_grad()
def test_decoder_no_leak_from_the_future(ops, interacts):
    model, x = tiny(ops), ids()
    base = model(x)
    upper = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert torch.count_nonzero(base.relation_output[:, upper]) == 0  # lower-triangular atoms
    for t in range(T - 1):
        out = model(perturbed(x, t, seed=t))
        assert same(rows(out, t), rows(base, t)), f"{ops}: position <= {t} saw the future"
        assert not torch.equal(out.sequence_output[:, t + 1 :], base.sequence_output[:, t + 1 :])
    moved = model(torch.cat([(x[:, :1] + 1) % V, x[:, 1:]], 1))  # token 0 changed
    changed = not (torch.equal(moved.sequence_output[:, -1], base.sequence_output[:, -1])
                   and torch.equal(moved.relation_output[:, -1], base.relation_output[:, -1]))
    assert changed == interacts, f"{ops}: the last position should {'' if interacts else 'not '}" \
                                 f"depend on token 0"


def test_registered_operator_is_causal_too(trans_first):
    model, x = tiny(f"j.a{trans_first}"), ids()
    with torch.no_grad():
        base = model(x)
        for t in (1, 4):
            assert same(rows(model(perturbed(x, t, seed=t)), t), rows(base, t))


def test_cjoin_decoder_form_is_the_papers():
    """The released c reduces over the binary stream's first index (v_s(a, x)); causally that
    keeps a == x only, so the decoder reads the premise as v_s(x, a) with a <= x."""
    c = causal_form(folnet.get_operator("c"))
    assert c.premise == ("x", "a", "s") and c.kernel == ("a", "s", "h") and c.mask == ("premise",)
    K = torch.randn(1, 5, 3, 2, dtype=torch.float64)  # K_sh(a)
    v = torch.randn(1, 5, 5, 3, dtype=torch.float64)
    for spec, informative in ((c, True), (folnet.get_operator("c"), False)):
        op = compile_operator(spec, "einsum", causal=True)
        base = op(K, v)
        for x in range(1, 5):
            for a in range(x):  # an earlier position's relation to x
                w = v.clone()
                w[:, x, a] += 1.0  # c: v_s(x, a) (paper); released: v_s(a, x) read at [x, a]
                w[:, a, x] += 1.0
                moved = not torch.equal(op(K, w)[:, x], base[:, x])
                assert moved == informative, (spec.premise, x, a)
    assert causal_form(folnet.get_operator("t")) is folnet.get_operator("t")
    assert causal_form(folnet.get_operator("j")) is folnet.get_operator("j")


@pytest.mark.numerics
@pytest.mark.parametrize("ops", ["j.", "c.", "m.a", ".at", "jmc.atp"])
@torch.no_grad()
def test_prefix_lm_prefix_is_bidirectional_targets_causal(ops):
    model, x, p = tiny(ops), ids(), 4
    base = model(x, prefix_lengths=p)
    # a later prefix token reaches the first position; without the prefix it could not
    later = x.clone()
    later[:, p - 1] = (later[:, p - 1] + 1) % V  # the last prefix token
    moved = model(later, prefix_lengths=p)
    assert not torch.equal(moved.sequence_output[:, 0], base.sequence_output[:, 0]) or \
        not torch.equal(moved.relation_output[:, 0], base.relation_output[:, 0])
    # nothing after the prefix leaks into the prefix or into earlier targets
    for t in range(p - 1, T - 1):
        assert same(rows(model(perturbed(x, t, seed=t), prefix_lengths=p), t), rows(base, t))
    # per-row prefixes; prefix 0 is a causal LM
    assert torch.equal(model(x, prefix_lengths=0).logits, model(x).logits)
    mixed = model(x, prefix_lengths=torch.tensor([p, 0]))
    assert torch.equal(mixed.logits[0], base.logits[0])
    assert_close(mixed.logits[1], model(x).logits[1], rtol=0, atol=1e-6,
                 what=f"{ops} prefix 0 in a mixed batch")


@pytest.mark.parametrize("ops", [op for op, _ in OPS])
@torch.no_grad()
def test_encoder_decoder_no_leak_and_sees_the_input(ops):
    model, x, y = tiny(ops, "encoder-decoder"), ids(n=5, seed=1), ids()
    base = model(x, y)
    M, n = y.shape[1], x.shape[1] + y.shape[1]
    assert base.relation_output.shape == (2, M, n, 16)
    future = torch.ones(M, M, dtype=torch.bool).triu(1)
    assert torch.count_nonzero(base.relation_output[:, :, x.shape[1] :][:, future]) == 0
    for t in range(M - 1):
        assert same(rows(model(x, perturbed(y, t, seed=t)), t), rows(base, t)), (ops, t)
    other = model((x + 1) % V, y)
    if ops not in (".p",):  # p alone never relates two tokens
        assert not torch.equal(other.sequence_output[:, 0], base.sequence_output[:, 0]) or \
            not torch.equal(other.relation_output[:, 0], base.relation_output[:, 0])


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_checkpoint_round_trip(kind, tmp_path):
    model, x = tiny("jmc.atp", kind), ids()
    args = (x,) if kind == "decoder" else (x, x[:, :4])
    model.save_pretrained(tmp_path)
    loaded = folnet.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.cfg == model.cfg
    with torch.no_grad():
        assert torch.equal(loaded(*args).logits, model(*args).logits)


@pytest.mark.numerics
def test_losses_count_targets_only_and_train():
    model, x = tiny("jmc.atp"), ids()
    model.train()
    out = model(x, labels=x, prefix_lengths=3)
    logits = out.logits[:, 2:-1]  # positions predicting tokens 3.. (after the prefix)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 3:].flatten())
    assert_close(out.loss, want, rtol=1e-5, atol=1e-5, what="prefix LM loss")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(8):
        loss = model(x, labels=x).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m(torch.zeros(2, 0, dtype=torch.long)), r"input_ids is empty"),
        (lambda m: m(torch.zeros(0, 3, dtype=torch.long)), r"input_ids is empty"),
        (lambda m: m(torch.full((1, 3), V)), rf"input_ids contain id {V}, outside the "
                                             rf"vocabulary: ids must be in \[0, vocab_size"),
        (lambda m: m(torch.full((1, 3), -1)), r"input_ids contain id -1"),
        (lambda m: m(torch.zeros(1, 3)), r"input_ids must be integer token ids"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), prefix_lengths=4),
         r"prefix_lengths\[0\] = 4 is longer than the sequence \(3 tokens\)"),
        (lambda m: m(torch.zeros(2, 3, dtype=torch.long), prefix_lengths=[1, 2, 3]),
         r"prefix_lengths must have one entry per row"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), prefix_lengths=-1),
         r"prefix_lengths\[0\] = -1 is negative"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), labels=torch.zeros(1, 4)),
         r"labels must be an integer tensor"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4)),
         r"attention_mask must be a tensor shaped like input_ids"),
    ],
)
def test_bad_decoder_input(call, match):
    with pytest.raises(folnet.FolnetError, match=match):
        call(tiny("j.a"))


def test_bad_encoder_decoder_input_and_builds():
    model = tiny("j.a", "encoder-decoder")
    x = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"decoder_input_ids contain id {V + 3}"):
        model(x, torch.full((1, 2), V + 3))
    with pytest.raises(folnet.FolnetError, match=r"decoder_input_ids is empty"):
        model(x, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(folnet.FolnetError, match=r"give decoder_input_ids, or labels"):
        model(x)
    with pytest.raises(folnet.FolnetError, match=r"position 'rpe\*' is not supported"):
        tiny("j.a", position="rpe*")
    with pytest.raises(folnet.FolnetError, match=r"head 'qa' is unknown for kind 'decoder'"):
        tiny("j.a", head="qa")
