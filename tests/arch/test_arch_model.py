"""build_model: plans, inputs, heads, padding, gradients, overfitting, checkpoints, info."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from older_dirs import as_written_before_checksums
from tolerances import assert_close

import folnet
from folnet.arch.plan import parse_layer, parse_plan
from folnet.cli import main as cli_main


def tiny(ops="jmc.atp", **kw):
    return tiny_model(ops, **kw)


def batch(B=2, T=12, vocab=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    ids[:, 0] = 2
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2 :] = 1
    return ids, types


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"operator string '' is empty"),
        ("jmcatp", r"operator string 'jmcatp' has no dot; write unary-output operators, one dot"),
        ("j.a.t", r"has more than one dot"),
        (".", r"names no operator"),
        ("jz.a", r"unknown operator 'z'; known: c \(cjoin, U <- U x B\), j \(join"),
        ("ja.t", r"'a' \(assoc, B <- U x U\) outputs binary atoms but stands before the dot; "
                 r"move it after the dot"),
        ("j.am", r"'m' \(mu, U <- B x B\) outputs unary atoms but stands after the dot; move it "
                 r"before the dot"),
        ("jj.a", r"repeats 'j'"),
        ("jb.a", r"'b' \(bool\) is the FFN stage that follows every mixer; remove it"),
    ],
)
def test_bad_operator_strings(text, match):
    with pytest.raises(folnet.FolnetError, match=match):
        parse_layer(text)


def test_plans_round_trip_and_per_layer():
    assert str(parse_layer("jmc.atp")) == "jmc.atp"
    assert str(parse_layer("j.")) == "j."
    plan = parse_plan("jmc.atp|j.a", 2)
    assert [str(layer) for layer in plan.layers] == ["jmc.atp", "j.a"]
    assert str(plan) == "jmc.atp|j.a"
    with pytest.raises(folnet.FolnetError, match="describes 3 layers but L = 2"):
        parse_plan(["j.a"] * 3, 2)
    model = tiny("jmc.atp|j.a")
    assert [str(layer.plan) for layer in model.encoder.layers] == ["jmc.atp", "j.a"]
    ids, types = batch()
    assert model(ids, types).sequence_output.shape == (2, 12, 64)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda ids, t: dict(input_ids=ids.float()), r"input_ids must be integer token ids"),
        (lambda ids, t: dict(input_ids=ids + 100), r"id \d+, outside the vocabulary: ids must "
                                                     r"be in \[0, vocab_size = 100\)"),
        (lambda ids, t: dict(input_ids=ids - 50), r"contain id -\d+, outside the vocabulary: "
                                                    r"ids must be in \[0, vocab_size = 100\)"),
        (lambda ids, t: dict(input_ids=ids[0]), r"input_ids must have shape \(batch, tokens\)"),
        (lambda ids, t: dict(input_ids=ids, token_type_ids=t[:, :5]),
         r"token_type_ids must be a tensor shaped like input_ids \(2, 12\), got \(2, 5\)"),
        (lambda ids, t: dict(input_ids=ids, token_type_ids=t + 2),
         r"token_type_ids contain 3, outside \[0, type_vocab_size = 2\)"),
        (lambda ids, t: dict(input_ids=ids, attention_mask=torch.ones(2, 7)),
         r"attention_mask must be a tensor shaped like input_ids \(2, 12\), got \(2, 7\)"),
    ],
)
def test_bad_inputs_are_named(make, match):
    model = tiny()
    ids, types = batch()
    with pytest.raises(folnet.FolnetError, match=match):
        model(**make(ids, types))


def test_absolute_positions_have_a_limit_rpe_does_not():
    ids = torch.randint(5, 100, (1, 520))
    with pytest.raises(folnet.FolnetError, match=r"520 tokens but the absolute-position table "
                                                 r"has max_positions = 512 rows"):
        tiny("j.a", position="ape")(ids)
    out = tiny("j.a", position="rpe")(ids, output_relations=True)
    assert out.relation_output.shape == (1, 520, 520, 16)


@pytest.mark.numerics
@pytest.mark.parametrize("position", ["rpe", "ape", "rpe*", "none"])
def test_position_modes_run_and_differ(position):
    model = tiny("jm.atp", position=position)
    ids, types = batch()
    out = model(ids, types)
    assert torch.isfinite(out.sequence_output).all()
    # moving a token changes the output at other positions except without any position info
    shifted = ids.clone()
    shifted[:, [3, 4]] = ids[:, [4, 3]]
    out2 = model(shifted, types)
    # (position 5 shares segment 0 with tokens 3 and 4, so its relative ids tell them apart)
    here, there = out.sequence_output[:, 5], out2.sequence_output[:, 5]
    if position == "none":  # the same sums in another order
        assert_close(there, here, rtol=0, atol=1e-5, what="swapped tokens without positions")
    else:  # moved by far more than that bound
        assert float((there - here).abs().max()) > 1e-4


@pytest.mark.numerics
def test_padding_mask_equals_truncated_sequences():
    """With attention_mask, outputs at real positions equal those of the unpadded sequences."""
    model = tiny("jmc.atp").eval()
    ids, types = batch(B=2, T=12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, 8:] = 0
    padded = ids.clone()
    padded[0, 8:] = 0
    model.relations = True  # relation_output is compared too
    with torch.no_grad():
        full = model(padded, types, attention_mask=mask)
        short = model(padded[:1, :8], types[:1, :8])
        unmasked = model(padded, types)
    assert_close(full.sequence_output[0, :8], short.sequence_output[0], rtol=1e-5, atol=1e-5,
                 what="sequence_output")
    assert_close(full.relation_output[0, :8, :8], short.relation_output[0], rtol=1e-5,
                 atol=1e-5, what="relation_output")
    assert not torch.allclose(unmasked.sequence_output[0, :8], short.sequence_output[0],
                              atol=1e-4)


def test_gradients_reach_every_parameter():
    model = tiny("jmc.atp", head="pretraining")
    ids, types = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    out = model(ids, types, mlm_labels=labels, nsp_labels=torch.tensor([0, 1]),
                output_relations=True)
    # The last layer's binary branch reaches only relation_output (the pretraining losses read
    # the unary atoms, as in the paper), so the check includes a term on it.
    (out.loss + out.relation_output.pow(2).mean()).backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not dead


@pytest.mark.slow
def test_tiny_model_overfits_a_fixed_mlm_batch():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="mlm", vocab_size=200, dropout=0.0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (8, 24), generator=g)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(ids.shape, generator=g) < 0.15
    labels[pick] = ids[pick]
    inputs = ids.masked_fill(pick, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(200):
        opt.zero_grad()
        loss = model(inputs, mlm_labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


@pytest.mark.parametrize(
    ("head", "kwargs", "field", "shape"),
    [
        ("pretraining", {"mlm_labels": "mlm", "nsp_labels": torch.tensor([0, 1])},
         "nsp_logits", (2, 2)),
        ("mlm", {"mlm_labels": "mlm"}, "mlm_logits", (2, 12, 100)),
        ("classification", {"labels": torch.tensor([2, 0])}, "logits", (2, 3)),
        ("qa", {"start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([3, 4])},
         "start_logits", (2, 12)),
        ("token-classification", {"labels": "tokens"}, "logits", (2, 12, 3)),
    ],
)
def test_heads_give_logits_and_losses(head, kwargs, field, shape):
    model = tiny(head=head, num_labels=3) if head in ("classification",
                                                       "token-classification") else tiny(head=head)
    ids, types = batch()
    labels = {k: (ids.masked_fill(torch.rand(ids.shape) > 0.3, -100) if v == "mlm" else
                  torch.randint(0, 3, ids.shape) if v == "tokens" else v)
              for k, v in kwargs.items()}
    out = model(ids, types, **labels)
    assert getattr(out, field).shape == shape
    assert out.loss is not None and out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert model(ids, types).loss is None


def test_regression_and_multiple_choice_heads():
    model = tiny(head="classification", num_labels=1)
    ids, types = batch()
    out = model(ids, types, labels=torch.tensor([0.5, -1.0]))
    assert out.logits.shape == (2, 1) and out.loss > 0
    mc = tiny(head="multiple-choice")
    ids3 = torch.randint(5, 100, (2, 4, 10))
    out = mc(ids3, labels=torch.tensor([1, 3]))
    assert out.logits.shape == (2, 4) and torch.isfinite(out.loss)
    with pytest.raises(folnet.FolnetError, match=r"head 'ranking' is unknown"):
        tiny(head="ranking")


def test_save_and_load_round_trip_with_a_custom_operator(tmp_path):
    folnet.register_operator(symbol="q", name="bprod_ckpt", typing="B <- B x U",
                             kernel="x y w", premise="x h w", output="x y h", bdim="x",
                             rdim="w", sizes={"w": "D2"})
    try:
        model = tiny("j.aqt", head="classification", num_labels=3).eval()
        ids, types = batch()
        before = model(ids, types).logits
        model.save_pretrained(tmp_path / "ckpt")
    finally:
        folnet.unregister_operator("q")
    loaded = folnet.from_pretrained(tmp_path / "ckpt").eval()  # registers 'q' from the file
    try:
        assert str(loaded.plan) == "j.aqt" and loaded.head == "classification"
        assert torch.equal(loaded(ids, types).logits, before)
    finally:
        folnet.unregister_operator("q")


def test_corrupt_checkpoints_are_errors(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(folnet.FolnetError, match=r"model\.safetensors.*checksums\.json"):
        folnet.from_pretrained(tmp_path / "c")  # the manifest sees it first
    as_written_before_checksums(tmp_path / "c")  # without one, the reader still refuses it
    with pytest.raises(folnet.FolnetError, match="corrupt or truncated weights"):
        folnet.from_pretrained(tmp_path / "c")
    with pytest.raises(folnet.FolnetError, match=r"checkpoint '.*missing' does not exist"):
        folnet.from_pretrained(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(folnet.FolnetError, match=r"is not a folnet checkpoint: expected a "
                                                 r"directory with config\.json"):
        folnet.from_pretrained(tmp_path / "empty")


def test_unknown_override_and_preset():
    with pytest.raises(folnet.FolnetError, match=r"unknown override\(s\) \['D3'\]"):
        folnet.build_model("j.a", preset="tiny", D3=4)
    with pytest.raises(folnet.FolnetError, match="preset 'huge' is unknown"):
        folnet.build_model("j.a", preset="huge")
    with pytest.raises(folnet.FolnetError, match="position 'alibi' is unknown"):
        folnet.build_model("j.a", preset="tiny", position="alibi")


def test_info_cli(capsys):
    assert cli_main(["info", "jmc.atp", "--preset", "base", "--vocab-size", "30522"]) == 0
    out = capsys.readouterr().out
    assert "138,381,952" in out and "operator t (trans)" in out
    assert "GFLOP" in out and "MiB per sequence" in out
