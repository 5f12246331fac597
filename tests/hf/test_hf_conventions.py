"""The transformers conventions folnet's HF classes follow (the ones transformers' common
tests check, `tests/conformance/`), each against an independent reference: attentions as
(B, H, T, T) tensors on the output's path, transformers 5 activation checkpointing with its
kwargs, ``inputs_embeds``, ``shift_labels``, ``attn_implementation``, settable config sizes,
problem types as BERT's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: E402

import folnet.hf as fh  # noqa: E402
from folnet.errors import FolnetError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V, T, B = 50, 7, 3


def _config(kind="encoder", **kw):
    return fh.FolnetConfig(ops="jmc.atp", preset="tiny", kind=kind, D1=32, D2=8, L=2, H=4,
                           F1=37, vocab_size=V, **kw)


def _ids(seed=0, length=T):
    return torch.randint(1, V, (B, length), generator=torch.Generator().manual_seed(seed))


CLASSES = {"encoder": fh.FolnetForMaskedLM, "decoder": fh.FolnetForCausalLM,
           "encoder-decoder": fh.FolnetForConditionalGeneration}


def _model(kind, **kw):
    torch.manual_seed(0)
    return CLASSES[kind](_config(kind, **kw))


def _extra(kind, seed=1):
    return {"decoder_input_ids": _ids(seed, 5)} if kind == "encoder-decoder" else {}


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_attentions_are_one_head_map_per_layer_on_the_outputs_path(kind):
    """attentions[l] is (B, H, T, T), rows summing to 1, equal to operator_attentions[l]['j']
    (the first attention-shaped operator); a gradient reaches it, and asking for it leaves
    the outputs as they were."""
    model = _model(kind).eval()
    ids = _ids()
    out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == 2 and len(out.operator_attentions) == 2
    for att, kernels in zip(out.attentions, out.operator_attentions, strict=True):
        assert att.shape == (B, 4, T, T) and att is kernels["j"]
        assert set(kernels) >= {"j", "m", "c"}
        torch.testing.assert_close(att.sum(-1), torch.ones(B, 4, T), rtol=0, atol=1e-5)
    out.attentions[0].retain_grad()
    out.logits.sum().backward()
    assert out.attentions[0].grad is not None and out.attentions[0].grad.abs().sum() > 0
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    torch.testing.assert_close(out.logits.detach(), plain, rtol=0, atol=1e-5)


def test_attention_shaped_operators():
    from folnet.hf.outputs import attention_shaped

    assert [s for s in "jmcabpt" if attention_shaped(s)] == ["j", "m"]


@pytest.mark.parametrize("kind", list(CLASSES))
def test_activation_checkpointing_is_transformers_own_with_its_kwargs(kind):
    """Every layer is a transformers GradientCheckpointingLayer; enabling runs the given
    checkpoint function with the given kwargs, once per layer in the forward and again in
    the backward, and the gradients equal those without checkpointing."""
    model = _model(kind, dropout=0.0).train()
    ids, labels = _ids(), _ids(2, 5 if kind == "encoder-decoder" else T)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert len(layers) == (4 if kind == "encoder-decoder" else 2)
    loss = model(input_ids=ids, labels=labels, **_extra(kind)).loss
    want = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert not model.is_activation_checkpointing
    calls = []
    real = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(kwargs)
        return real(fn, *args, **kwargs)

    model.activation_checkpointing_enable({"use_reentrant": False, "preserve_rng_state": False})
    assert model.is_activation_checkpointing
    for layer in layers:
        assert layer._gradient_checkpointing_func.func is torch.utils.checkpoint.checkpoint
        assert layer._gradient_checkpointing_func.keywords == {"use_reentrant": False,
                                                              "preserve_rng_state": False}
        layer._gradient_checkpointing_func = lambda fn, *a, _k=layer: counting(
            fn, *a, use_reentrant=False)
    loss = model(input_ids=ids, labels=labels, **_extra(kind)).loss
    got = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert len(calls) == len(layers)
    for a, b in zip(want, got, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing


def test_reentrant_checkpointing_of_the_encoder_decoder_is_refused():
    model = _model("encoder-decoder")
    with pytest.raises(FolnetError, match="use_reentrant=True"):
        model.activation_checkpointing_enable({"use_reentrant": True})


@pytest.mark.parametrize("kind", list(CLASSES))
def test_inputs_embeds_match_input_ids(kind):
    model = _model(kind).eval()
    ids, word = _ids(), model.get_input_embeddings()
    extra = _extra(kind)
    with torch.no_grad():
        want = model(input_ids=ids, **extra).logits
        given = {"decoder_inputs_embeds": word(extra["decoder_input_ids"])} if extra else {}
        got = model(inputs_embeds=word(ids), **given).logits
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        # the vectors are read (a scale would not show: the atoms are layer-normalised)
        other = model(inputs_embeds=word(ids) + torch.randn(B, T, 32), **given).logits
    assert not torch.equal(other, want)
    with pytest.raises(FolnetError, match="not both"):
        model(input_ids=ids, inputs_embeds=word(ids), **extra)


def test_shift_labels_are_the_causal_targets():
    """shift_labels are the targets of each position as given; labels are then not read."""
    model = _model("decoder").eval()
    ids = _ids()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        shifted = torch.cat([ids[:, 1:], torch.full((B, 1), -100)], 1)
        plain = model(input_ids=ids, labels=ids).loss
        given = model(input_ids=ids, labels=ids, shift_labels=shifted).loss
        other = model(input_ids=ids, labels=_ids(5), shift_labels=shifted).loss
        mine = model(input_ids=ids, shift_labels=_ids(6)).loss
    torch.testing.assert_close(given, plain, rtol=1e-6, atol=1e-6)
    assert torch.equal(given, other)
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), _ids(6).reshape(-1))
    assert abs(float(mine) - float(want)) < 1e-5


def test_eager_runs_every_operator_on_the_reference_and_agrees_with_sdpa():
    ids = _ids()
    torch.manual_seed(0)
    eager = fh.FolnetForMaskedLM(_config(attn_implementation="eager")).eval()
    torch.manual_seed(0)
    default = fh.FolnetForMaskedLM(_config()).eval()
    assert default.config._attn_implementation == "sdpa"
    assert eager.native.cfg.backend == "einsum" and default.native.cfg.backend == "auto"
    with torch.no_grad():
        torch.testing.assert_close(eager(input_ids=ids).logits, default(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)


def test_sizes_are_settable_mirrored_in_the_file_and_a_disagreeing_file_refused(tmp_path):
    config = _config()
    config.hidden_size, config.num_hidden_layers = 16, 1
    assert config.model["D1"] == 16 and config.model["L"] == 1
    model = fh.FolnetModel(config)
    assert model.native.cfg.D1 == 16 and len(model.native.encoder.layers) == 1
    config.save_pretrained(tmp_path)
    data = (tmp_path / "config.json").read_text()
    assert '"hidden_size": 16' in data and '"num_hidden_layers": 1' in data
    assert fh.FolnetConfig.from_pretrained(tmp_path).to_dict() == config.to_dict()
    (tmp_path / "config.json").write_text(data.replace('"hidden_size": 16', '"hidden_size": 9'))
    with pytest.raises(FolnetError, match=r"hidden_size disagrees with model\.D1 \(16\)"):
        fh.FolnetConfig.from_pretrained(tmp_path)


def test_text_configs_keep_their_num_labels():
    assert len(_config("decoder", num_labels=5).id2label) == 5
    assert len(_config("encoder-decoder", num_labels=3).label2id) == 3


def test_an_explicit_problem_type_is_the_loss_bert_computes():
    """Regression over three outputs (BERT's MSE against (B, 3) targets), where folnet once
    inferred a classification from the label count."""
    torch.manual_seed(0)
    model = fh.FolnetForSequenceClassification(
        _config(num_labels=3, problem_type="regression")).eval()
    targets = torch.rand(B, 3)
    with torch.no_grad():
        out = model(input_ids=_ids(), labels=targets)
    want = F.mse_loss(out.logits.double(), targets.double())
    assert abs(float(out.loss) - float(want)) < 1e-6


BASES = {"encoder": fh.FolnetModel, "decoder": fh.FolnetDecoderModel,
         "encoder-decoder": fh.FolnetEncoderDecoderModel}


@pytest.mark.parametrize("kind", ["encoder", "decoder", "encoder-decoder"])
def test_a_base_model_under_the_prefix_with_the_native_names_on_disk(kind, tmp_path):
    """Each head class holds its base model under ``base_model_prefix``; the base model's
    states are the native model's final states; the weights keep the native names on disk
    (a folder of an earlier version, here a native save, loads); a saved base model loads
    into the head class with exactly the head's weights missing."""
    from safetensors import safe_open

    import folnet

    torch.manual_seed(0)
    native = folnet.build_model("jmc.atp", preset="tiny", kind=kind, D1=32, D2=8, L=2, H=4,
                                F1=37, vocab_size=V, head="mlm" if kind == "encoder" else None)
    native.eval().save_pretrained(tmp_path / "native")
    model = CLASSES[kind].from_pretrained(tmp_path / "native").eval()
    base = model.base_model
    assert type(base) is BASES[kind] and base is getattr(model, model.base_model_prefix)
    assert base.base_model is base
    with torch.no_grad():
        want = native(_ids(), **_extra(kind))
        torch.testing.assert_close(model(input_ids=_ids(), **_extra(kind)).logits,
                                   want.mlm_logits if kind == "encoder" else want.logits,
                                   rtol=0, atol=0)
        torch.testing.assert_close(base(input_ids=_ids(), **_extra(kind)).last_hidden_state,
                                   want.sequence_output, rtol=0, atol=0)
    model.save_pretrained(tmp_path / "hf")
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == sorted(native.state_dict())
    assert folnet.from_pretrained(tmp_path / "hf").head == native.head

    base.save_pretrained(tmp_path / "base")
    meta = folnet.arch.read_metadata(tmp_path / "base")
    assert meta["head"] is None and meta["architectures"] == [BASES[kind].__name__]
    assert model.config.head == native.head  # the shared config is the head class's still
    if kind == "encoder":  # the bare encoder is a native model of its own
        assert folnet.from_pretrained(tmp_path / "base").head is None
    again, info = CLASSES[kind].from_pretrained(tmp_path / "base", output_loading_info=True)
    head = {k for k in native.state_dict() if k.split(".")[0] in ("mlm", "lm")}
    assert set(info["missing_keys"]) == head and not info["unexpected_keys"]
    names = {k for k, _ in base.named_parameters()}
    for name, value in again.base_model.named_parameters():
        assert name in names
        torch.testing.assert_close(value, dict(base.named_parameters())[name], rtol=0, atol=0)
