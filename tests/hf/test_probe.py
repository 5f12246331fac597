"""Probing and changing a loaded FOLNet as BERT/GPT-2 users do: every layer's states
(``output_hidden_states``, ``output_relations``), the attention-like operators' kernels
(``output_attentions``), a resized vocabulary, and the small things (loading info, the
checkpointing flag, ``print(model)``, the saved config). A tiny BERT is the anchor."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from models import tiny_model  # noqa: E402
from tolerances import assert_close  # noqa: E402

import folnet  # noqa: E402
import folnet.hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V, T = 90, 9


def _model(ops="jmc.atp", kind="encoder", head="mlm", **kw):
    return tiny_model(ops, kind, head=head, vocab_size=V, eval_mode=True, **kw)


def _ids(B=2, seed=0):
    return torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def bert():
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     attn_implementation="eager")  # returns attentions
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(config).eval()


@pytest.mark.numerics
def test_hidden_states_are_each_layers_unary_stream():
    """L + 1 states: after the atoms, after each layer, and last the final normalised stream
    (the sequence output); each equals running the atoms and layers by hand."""
    model = _model()
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_hidden_states=True, output_relations=True)
        L = model.cfg.L
        assert len(out.hidden_states) == len(out.relation_states) == L + 1
        assert torch.equal(out.hidden_states[-1], out.sequence_output)
        assert torch.equal(out.relation_states[-1], out.relation_output)
        enc = model.encoder
        from folnet.arch.layer.atoms import relative_position_ids, token_positions
        from folnet.arch.layer.domain import Domain

        pad = mask.bool()
        positions = token_positions(pad, T, ids.device)
        rel = relative_position_ids(torch.zeros_like(ids), model.cfg.delta, positions)
        u1, u2 = enc.atoms(ids, torch.zeros_like(ids), positions, rel, T)
        for i, layer in enumerate(enc.layers):
            assert torch.equal(out.hidden_states[i], u1) and torch.equal(out.relation_states[i],
                                                                          u2)
            u1, u2 = layer(u1, u2, Domain(n=T, pad=pad))
        assert_close(out.hidden_states[-1], F.layer_norm(u1, (model.cfg.D1,), eps=1e-12),
                     rtol=0, atol=0, what="final state")
    assert model(ids, output_hidden_states=True).relation_states is None  # not asked for


@pytest.mark.numerics
def test_attentions_are_the_softmax_kernels_by_operator():
    """One dict per layer, {symbol: activated kernel}: probabilities over the reduction token
    (rows sum to 1, padded keys get 0). j's equals softmax over its kernel projection of the
    layer's normalised binary input, computed by hand."""
    model = _model("jmc.atp")
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True,
                    output_relations=True)
    cfg = model.cfg
    assert len(out.attentions) == cfg.L
    for i, layer_att in enumerate(out.attentions):
        assert set(layer_att) == {"j", "m", "c", "t"}  # the softmax operators of jmc.atp
        assert layer_att["j"].shape == (2, cfg.H, T, T) and layer_att["t"].shape[1] == cfg.D2
        assert layer_att["c"].shape == (2, cfg.S, cfg.H, T)
        for probs in layer_att.values():
            assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)), rtol=0, atol=1e-5,
                         what=f"layer {i} rows sum to 1")
            assert float(probs[0, ..., -3:].abs().max()) == 0.0  # padded keys
        # j's kernel by hand: LN(u2) -> the j.kernel rows of proj_b -> softmax over a
        layer = model.encoder.layers[i]
        seg = layer.slots[0].kernel  # j is the first operator
        n2 = F.layer_norm(out.relation_states[i], (cfg.D2,), eps=cfg.layer_norm_eps)
        K = n2 @ layer.proj_b.weight[seg.start : seg.start + seg.width].T  # (B, x, a, H)
        K = K * layer.slots[0].kernel_scale
        K = K.masked_fill(~mask.bool()[:, None, :, None], torch.finfo(K.dtype).min)
        want = torch.softmax(K, dim=2).permute(0, 3, 1, 2)  # (B, H, x, a)
        assert_close(layer_att["j"], want, rtol=0, atol=1e-6, what=f"layer {i} j by hand")


@pytest.mark.numerics
def test_attentions_of_a_blocked_model_cover_the_whole_square():
    """A model in row blocks computes a call that asks for attentions over the full square."""
    model = folnet.set_memory(_model(), "blocked", block_rows=2)
    with torch.no_grad():
        blocked = model(_ids(), output_attentions=True)
        full = folnet.set_memory(_model(), "full")(_ids(), output_attentions=True)
    for a, b in zip(blocked.attentions, full.attentions, strict=True):
        for symbol in a:
            assert_close(a[symbol], b[symbol], rtol=0, atol=1e-6, what=f"blocked {symbol}")


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_text_models_return_states_too(kind):
    model = _model(kind=kind, head=None)
    ids = _ids()
    kw = {"decoder_input_ids": _ids(seed=1)[:, :5]} if kind == "encoder-decoder" else {}
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_attentions=True, **kw)
    L = model.cfg.L
    assert len(out.hidden_states) == L + 1 and len(out.attentions) == L
    assert torch.equal(out.hidden_states[-1], out.sequence_output)
    # causal: a query row gives no probability to later positions
    j = out.attentions[0]["j"]  # (B, H, x, a)
    x = j.shape[2]
    later = torch.ones(x, j.shape[3], dtype=torch.bool).triu(1 + j.shape[3] - x)
    assert float(j[..., later].abs().max()) == 0.0
    if kind == "encoder-decoder":
        assert len(out.encoder_hidden_states) == L + 1 and len(out.encoder_attentions) == L


def test_hf_classes_return_states_as_bert_does(tmp_path, bert):
    _model().save_pretrained(tmp_path)
    ours = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    ids = _ids()
    for model in (bert, ours):
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
        assert len(out.hidden_states) == model.config.num_hidden_layers + 1 \
            if model is bert else len(out.hidden_states) == ours.config.model["L"] + 1
        assert out.attentions is not None and len(out.attentions) == 2
        assert out.hidden_states[-1].shape == (2, T, out.hidden_states[0].shape[-1])
    assert ours(input_ids=ids).hidden_states is None  # not asked for: None, as BERT
    ours.config.output_hidden_states = True  # the config's default, as transformers reads it
    assert len(ours(input_ids=ids).hidden_states) == 3
    bare = transformers.AutoModel.from_pretrained(tmp_path).eval()
    out = bare(input_ids=ids, output_relations=True, output_hidden_states=True)
    assert out.relation_output.shape == (2, T, T, 16) and len(out.relation_states) == 3
    assert bare(input_ids=ids).relation_output is None


@pytest.mark.parametrize(("kind", "head"), [("encoder", "pretraining"), ("decoder", None),
                                            ("encoder-decoder", None)])
def test_resize_token_embeddings_native(kind, head):
    model = _model(kind=kind, head=head)
    ids = _ids()
    kw = {"decoder_input_ids": ids[:, :4]} if kind == "encoder-decoder" else {}
    field = "mlm_logits" if kind == "encoder" else "logits"
    with torch.no_grad():
        before = getattr(model(ids, **kw), field)
    old = model.word_embedding().weight[:V].clone()
    embedding = model.resize_token_embeddings(V + 13)
    assert embedding is model.word_embedding() and model.cfg.vocab_size == V + 13
    assert embedding.weight.shape[0] == V + 13  # exact: no padding unless asked
    new_rows = embedding.weight[V : V + 13]
    assert_close(new_rows, old.mean(0).expand_as(new_rows), rtol=0, atol=1e-3,
                 what="new rows at the old mean")  # transformers' mean_resizing
    with torch.no_grad():
        after = getattr(model(ids, **kw), field)
        assert after.shape[-1] == V + 13
        assert_close(after[..., :V], before, rtol=0, atol=0, what="old logits unchanged")
        new = torch.tensor([[V + 12, 3, V]])
        model(new, **({"decoder_input_ids": new} if kind == "encoder-decoder" else {}))
    model.resize_token_embeddings(V - 20, pad_to_multiple_of=16)
    assert model.word_embedding().weight.shape[0] == -(-(V - 20) // 16) * 16
    with pytest.raises(folnet.FolnetError, match=r"outside the vocabulary: .* vocab_size = 70"):
        model(ids, **kw)  # ids beyond the smaller vocabulary are refused, naming the limit


def test_resize_through_transformers_and_the_tied_head(tmp_path, bert):
    _model(head="mlm").save_pretrained(tmp_path / "m")
    ours = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "m").eval()
    for model in (bert, ours):
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        emb = model.resize_token_embeddings(V + 7)
        assert emb is model.get_input_embeddings()
        assert model.get_output_embeddings().weight is emb.weight
        assert model(input_ids=torch.tensor([[V + 6, 4]])).logits.shape[-1] >= V + 7
    assert ours.config.vocab_size == V + 7
    ours.save_pretrained(tmp_path / "resized")
    back = folnet.from_pretrained(tmp_path / "resized")
    assert back.cfg.vocab_size == V + 7
    assert back.word_embedding().weight.shape[0] == V + 7  # exact rows, through config.json
    emb = ours.resize_token_embeddings(V + 9, pad_to_multiple_of=64)
    assert emb.weight.shape[0] == 128 and ours.config.vocab_size == V + 9
    assert ours.config.model["vocab_multiple"] == 64
    with pytest.raises(ValueError, match=r"1\.3"):  # transformers' own check
        ours.resize_token_embeddings(V + 9, pad_to_multiple_of=1.3)
    clf = folnet.build_model("j.a", preset="tiny", head="classification", num_labels=2)
    clf.save_pretrained(tmp_path / "clf")
    assert transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "clf").get_output_embeddings() is None


def test_loading_info_checkpointing_flag_print_and_config(tmp_path, bert):
    _model(head="mlm").save_pretrained(tmp_path)
    bert.save_pretrained(tmp_path / "bert")
    for directory in (tmp_path / "bert", tmp_path):
        model, info = transformers.AutoModelForMaskedLM.from_pretrained(
            directory, output_loading_info=True)
        assert isinstance(model, transformers.PreTrainedModel)
        assert info["missing_keys"] == set() or info["missing_keys"] == []
        assert not model.is_gradient_checkpointing
        model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing
        model.gradient_checkpointing_disable()
        assert not model.is_gradient_checkpointing
    text = repr(model)
    assert "FusedProjection(in_features=16, out_features=88: j.kernel 4, m.kernel 4" in text
    assert "FusedOutput(in_features=192 (j 64 + m 64 + c 64), out_features=64)" in text
    assert "DualStreamLayer(\n        ops=jmc.atp, causal=False, memory='auto'" in text
    assert "preset" not in model.config.to_json_string(use_diff=True)  # not "base" for tiny
    assert model.config.model["D1"] == 64
