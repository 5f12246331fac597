"""Dynamic int8 quantization of folnet models, beside a tiny BERT quantized the same way.

torch's ``quantize_dynamic`` matches module types exactly and cannot reach the operators'
fused projections (`nn.Linear` subclasses): after it a folnet model refuses to run, naming
`folnet.arch.quantize.quantize_dynamic`, which takes the same arguments and quantizes them
too. Checked here: torch's call is refused; folnet's runs, every operator projection (and
every other Linear) is int8 afterwards, its int8 weights are the ones torch's own
``from_float`` makes from the same float weight, and its outputs are within a stated bound of
float32 -- beside the BERT anchor.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tolerances import assert_rel
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import per_channel_dynamic_qconfig

import folnet
from folnet.arch import adapters
from folnet.arch.layer.slots import FusedOutput, FusedProjection
from folnet.arch.quantize import QuantizedFusedOutput, QuantizedFusedProjection, quantize_dynamic
from folnet.errors import FolnetError

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # torch.ao's notices
              pytest.mark.filterwarnings("ignore:.*quantize_per_(tensor|channel).*")]

#: Logits of an int8 model against float32, relative error in norm. Measured on these seeded
#: tiny models (random weights; per-tensor int8 weights, 7-bit dynamic activations), the same
#: on both kernel sets: folnet encoder 0.022, decoder 0.019, encoder-decoder 0.018, BERT
#: 0.023; per-channel weights 0.021 (folnet), 0.015 (BERT). The error is the quantization's,
#: not a kernel set's rounding; the bound is 10x the largest.
INT8_REL = 0.25
#: float16 weights (float32 products): measured 2.2e-4 (folnet) and 5.0e-4 (BERT) on both
#: kernel sets; 20x the larger (5e-3 left BERT's at the 10x margin exactly).
FP16_REL = 1e-2

KINDS = ["encoder", "decoder", "encoder-decoder", "bert"]


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "bert":
        import transformers

        cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=100, num_labels=3)
        return transformers.BertForSequenceClassification(cfg).eval()
    return folnet.build_model("jmc.atp", preset="tiny", kind=kind, vocab_size=100, num_labels=3,
                              head="classification" if kind == "encoder" else None).eval()


def _logits(model: nn.Module, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[3, 10:] = 0
    kw = {"attention_mask": mask}
    if kind == "encoder-decoder":
        kw["decoder_input_ids"] = ids[:, :6]
    with torch.no_grad():
        return model(ids, **kw).logits


def _quantize(model: nn.Module, kind: str, spec=None, dtype=torch.qint8) -> nn.Module:
    spec = {nn.Linear} if spec is None else spec
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "bert":  # the anchor: torch's own call
            return torch.ao.quantization.quantize_dynamic(model, spec, dtype=dtype)
        return quantize_dynamic(model, spec, dtype=dtype)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_torch_call_is_refused(kind):
    """torch's call leaves the fused projections float32: the model says so and what to do,
    in one line, rather than run them float."""
    model = _model(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    with pytest.raises(FolnetError, match=r"folnet\.quantize_dynamic\(model, \.\.\.\)") as info:
        _logits(quantized, kind)
    assert "\n" not in str(info.value) and "exactly" in str(info.value)
    _logits(model, kind)  # the original (deep-copied by torch) still runs


@pytest.mark.numerics
@pytest.mark.parametrize("kind", KINDS)
def test_quantized_model_is_int8_and_close(kind):
    """Every Linear, the operators' projections included, is a dynamic int8 Linear afterwards;
    the logits are within `INT8_REL` of float32; the original model is untouched."""
    model = _model(kind)
    want = _logits(model, kind)
    fused = {name: type(m) for name, m in model.named_modules() if isinstance(m, FusedProjection
                                                                              | FusedOutput)}
    assert (kind == "bert") == (not fused)
    quantized = _quantize(model, kind)
    modules = dict(quantized.named_modules())
    assert not [n for n, m in modules.items() if type(m) in (nn.Linear, FusedProjection,
                                                             FusedOutput)]
    linears = [m for m in modules.values() if isinstance(m, DynamicLinear)]
    assert linears and all(m.weight().dtype == torch.qint8 for m in linears)
    for name, was in fused.items():
        now = {FusedProjection: QuantizedFusedProjection, FusedOutput: QuantizedFusedOutput}[was]
        assert type(modules[name]) is now, name
    assert_rel(_logits(quantized, kind), want, INT8_REL, f"{kind}: int8 logits")
    assert torch.equal(_logits(model, kind), want)  # inplace=False: a copy was quantized


def test_fused_weights_are_torchs_int8():
    """A fused projection's int8 weight and scale are those torch's own ``from_float`` makes
    of an nn.Linear holding the same weight (per tensor, and per output channel), and the
    layer reads them dequantized, with the full bias."""
    model = _model("encoder")
    layer = model.encoder.layers[0]
    for spec in ({nn.Linear}, {nn.Linear: per_channel_dynamic_qconfig}):
        quantized = _quantize(model, "encoder", spec)
        for name in ("proj_u", "proj_b", "out_u", "out_b"):
            fused, ours = getattr(layer, name), getattr(quantized.encoder.layers[0], name)
            plain = nn.Linear(fused.in_features, fused.out_features)
            plain.weight.data.copy_(fused.weight)
            plain.qconfig = (torch.ao.quantization.default_dynamic_qconfig
                             if isinstance(spec, set) else per_channel_dynamic_qconfig)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = DynamicLinear.from_float(plain)
            assert torch.equal(ours.weight().int_repr(), theirs.weight().int_repr()), name
            assert torch.equal(adapters.weight(ours), theirs.weight().dequantize()), name
            assert torch.equal(adapters.bias(ours), adapters.bias(fused).detach()), name


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["encoder", "bert"])
def test_float16_and_per_channel(kind):
    """The other dynamic schemes torch offers Linears: float16 weights, and int8 weights with
    a scale per output channel."""
    model = _model(kind)
    want = _logits(model, kind)
    half = _quantize(model, kind, dtype=torch.float16)
    assert all(m._packed_params.dtype == torch.float16 for m in half.modules()
               if isinstance(m, DynamicLinear))
    assert_rel(_logits(half, kind), want, FP16_REL, f"{kind}: float16 logits")
    channel = _quantize(model, kind, {nn.Linear: per_channel_dynamic_qconfig})
    assert all(m.weight().qscheme() == torch.per_channel_affine for m in channel.modules()
               if isinstance(m, DynamicLinear))
    assert_rel(_logits(channel, kind), want, INT8_REL, f"{kind}: per-channel int8 logits")


def test_spec_resolution_follows_torch():
    """Where torch quantizes a Linear, folnet quantizes the fused projections beside it: a
    spec naming one layer quantizes that layer's; a spec without nn.Linear none (and the
    model runs, unrefused, bit for bit as before)."""
    model = _model("encoder")
    one = _quantize(model, "encoder", {"encoder.layers.1": torch.ao.quantization.
                                       default_dynamic_qconfig})
    kinds = {n: type(m) for n, m in one.named_modules()}
    assert kinds["encoder.layers.1.proj_b"] is QuantizedFusedProjection
    assert kinds["encoder.layers.1.ffn_b.inp"] is DynamicLinear
    assert kinds["encoder.layers.0.proj_b"] is FusedProjection
    assert kinds["encoder.layers.0.ffn_b.inp"] is nn.Linear
    _logits(one, "encoder")
    none = _quantize(model, "encoder", {nn.LSTM})
    assert torch.equal(_logits(none, "encoder"), _logits(model, "encoder"))


def test_quantized_decoder_generates():
    """Generation reads the layers' context channels through the same weights."""
    model = _quantize(_model("decoder"), "decoder")
    prompt = torch.randint(5, 100, (2, 5), generator=torch.Generator().manual_seed(4))
    out = model.generate(prompt, max_new_tokens=4)
    assert out.shape == (2, 9) and torch.equal(out[:, :5], prompt)
