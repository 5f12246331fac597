"""Checkpoints saved by the code before the layer/stack redesign load bit-exactly (the weights
are data) and give the outputs that code gave (tests/fixtures/legacy, made by make_fixtures.py
there). The stored outputs are another machine's arithmetic: they are compared at
`tolerances.STORED_REL`, and greedy tokens where each leads its runner-up by far more than that
rounding (tests/tolerances.py)."""

from __future__ import annotations

import pytest
import torch
from paths import LEGACY
from safetensors.torch import load_file
from tolerances import assert_stored, assert_tokens_lead

import folnet

pytestmark = pytest.mark.numerics

ENCODERS = ["encoder-classification", "encoder-pretraining-ape", "encoder-qa-rpestar",
            "encoder-custom-op"]


def _load(name: str, backend: str | None = None):
    ref = load_file(str(LEGACY / name / "reference.safetensors"))
    runtime = {} if backend is None else {"backend": backend}
    model = folnet.from_pretrained(LEGACY / name, **runtime).eval()
    model.relations = True  # the stored outputs include the final binary stream
    return model, ref


@pytest.mark.parametrize("name", [*ENCODERS, "decoder", "decoder-ape", "encoder-decoder"])
def test_weights_load_bit_exactly(name):
    model, _ = _load(name)
    saved = load_file(str(LEGACY / name / "model.safetensors"))
    state = model.state_dict()
    assert sorted(state) == sorted(saved)
    for key, value in saved.items():
        assert torch.equal(state[key], value), key


def _encoder_runs(model, ref):
    ids, types, mask = ref["input_ids"], ref["token_type_ids"], ref["attention_mask"]
    with torch.no_grad():
        runs = {"": model(ids, token_type_ids=types),
                "padded.": model(ids, token_type_ids=types, attention_mask=mask)}
    pairs = []
    for key, want in ref.items():
        if key in ("input_ids", "token_type_ids", "attention_mask"):
            continue
        prefix, _, field = key.rpartition(".")
        pairs.append((key, getattr(runs[prefix + "." if prefix else ""], field), want))
    assert len(pairs) >= 6
    return pairs


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_outputs_match_the_stored_ones(name):
    model, ref = _load(name)
    for key, got, want in _encoder_runs(model, ref):
        assert_stored(got, want, key)


def test_rpe_star_layers_keep_the_materialised_path():
    """rpe* layers read every operator's kernel and premise materialised, as they did: auto
    takes einsum there, and forcing the fused path says why it cannot."""
    model, ref = _load("encoder-qa-rpestar")
    layer = model.encoder.layers[0]
    call = layer.ops[0].describe_call(ref["input_ids"].float(), padded=False, requires_grad=False,
                                      materialise=True)
    assert {op.select(call).name for op in layer.ops} == {"einsum"}
    with pytest.raises(folnet.FolnetError, match="asks for the materialised kernel"):
        _encoder_runs(_load("encoder-qa-rpestar", "fused")[0], ref)


@pytest.mark.parametrize("name", ["decoder", "decoder-ape"])
def test_decoder_outputs_match_the_stored_ones(name):
    model, ref = _load(name)
    ids = ref["input_ids"]
    with torch.no_grad():
        causal = model(ids)
        assert_stored(causal.logits, ref["logits"], "logits")
        assert_stored(causal.relation_output, ref["relation_output"], "relation_output")
        assert_stored(model(ids, prefix_lengths=ref["prefix_lengths"]).logits,
                      ref["prefix.logits"], "prefix.logits")
        assert_stored(model(ids, attention_mask=ref["attention_mask"]).logits,
                      ref["padded.logits"], "padded.logits")
    out = model.generate(ids[:, :5], max_new_tokens=6, return_logits=True)
    assert torch.equal(out.sequences[:, :5], ref["generated"][:, :5])
    assert_tokens_lead(out.logits, ref["generated"][:, 5:], "generated")


def test_encoder_decoder_outputs_match_the_stored_ones():
    model, ref = _load("encoder-decoder")
    ids, dec = ref["input_ids"], ref["decoder_input_ids"]
    with torch.no_grad():
        out = model(ids, decoder_input_ids=dec)
        padded = model(ids, decoder_input_ids=dec, attention_mask=ref["attention_mask"])
    for field in ("logits", "relation_output", "encoder_sequence_output",
                  "encoder_relation_output"):
        assert_stored(getattr(out, field), ref[field], field)
    assert_stored(padded.logits, ref["padded.logits"], "padded.logits")
    gen = model.generate(ids, max_new_tokens=5, return_logits=True)
    assert torch.equal(gen.sequences[:, :1], ref["generated"][:, :1])  # the start token
    assert_tokens_lead(gen.logits, ref["generated"][:, 1:], "generated")


@pytest.mark.parametrize("name", [*ENCODERS, "decoder", "decoder-ape", "encoder-decoder"])
def test_old_weights_metadata_loads_through_the_hf_classes(name):
    """These files say ``format: folnet`` in their safetensors header, as folnet wrote them
    before it wrote transformers' ``pt``; they load through the `folnet.hf` class of
    their kind and head with the weights the native loader reads."""
    pytest.importorskip("transformers", reason="the [hf] extra is not installed")
    from safetensors import safe_open

    import folnet.hf
    from folnet.arch.head_table import hf_class

    with safe_open(str(LEGACY / name / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "folnet"}
    native, _ = _load(name)
    cls = getattr(folnet.hf, hf_class(native.cfg.kind, native.head))
    model = cls.from_pretrained(LEGACY / name)
    state = model.state_dict()  # the text classes hold their base model under ``model.``
    want = {model.own_name(key): value for key, value in native.state_dict().items()}
    assert sorted(state) == sorted(want)
    assert all(torch.equal(state[key], want[key]) for key in want)
