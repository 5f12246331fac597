"""LoRA (PEFT) on the logic operators: the fused projections (``proj_u``, ``proj_b``), output
projections (``out_u``, ``out_b``) and the binary FFN are adaptable by the names ``print(model)``
shows, on every backend -- the fused backend's folded contractions and the row-blocked layers
included, which read the weights directly (`folnet.arch.adapters`). Only the adapters train,
saved adapters reload, and merging gives the adapted outputs. A tiny BERT with
``["query", "value"]`` is the anchor."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
peft = pytest.importorskip("peft", reason="the [hf] extra (peft) is not installed")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from tolerances import assert_close  # noqa: E402

import folnet  # noqa: E402
import folnet.hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V, T = 80, 11
OPERATORS = ["proj_u", "proj_b", "out_u", "out_b"]
#: (name, target_modules, memory mode, backend): the operators on the CPU's fused path, on the
#: einsum reference, in row blocks; the binary stream alone; everything
CASES = [
    ("operators-fused", OPERATORS, "full", "auto"),
    ("operators-einsum", OPERATORS, "full", "einsum"),
    ("operators-blocked", OPERATORS, "blocked", "auto"),
    ("binary-stream", ["proj_b", "out_b", "ffn_b.inp", "ffn_b.out", "ffn_b.skip"], "full",
     "auto"),
    ("everything", [*OPERATORS, "inp", "out", "skip", "transform"], "blocked", "auto"),
]


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (2, T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    labels = ids.masked_fill(torch.rand(ids.shape, generator=g) > 0.3, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _model(mode, backend, tmp_path):
    torch.manual_seed(0)
    native = folnet.build_model("jmc.atp", preset="tiny", head="mlm", vocab_size=V,
                                dropout=0.0, backend=backend)
    native.save_pretrained(tmp_path / "base")
    model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "base")
    folnet.set_memory(model.native, mode, block_rows=4)
    return model


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize(("name", "targets", "mode", "backend"), CASES,
                         ids=[c[0] for c in CASES])
def test_only_adapters_train_and_save_reload_merge_agree(tmp_path, name, targets, mode,
                                                         backend):
    model = _model(mode, backend, tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets)
    lora = peft.get_peft_model(model, config)
    trainable = {n: p for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    wrapped = [n for n, m in lora.named_modules() if hasattr(m, "lora_A")]
    expected = sum(1 for n, _ in model.named_modules()
                   if n and n.split(".")[-1] in {t.split(".")[-1] for t in targets}
                   and any(n.endswith(t) for t in targets))
    assert len(wrapped) == expected > 0
    count = sum(p.numel() for p in trainable.values())
    in_out = {n: (m.base_layer.in_features, m.base_layer.out_features)
              for n, m in lora.named_modules() if hasattr(m, "lora_A")}
    assert count == sum(4 * (i + o) for i, o in in_out.values())  # r (in + out) per module

    batch = _batch()
    opt = torch.optim.AdamW(trainable.values(), lr=1e-2)
    lora.train()
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = lora(**batch).loss
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]  # the adapters learn through every path they sit on
    lora.eval()
    after = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
             for k, v in lora.state_dict().items() if "lora_" not in k}
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == []  # the base model is untouched
    # every adapter moved (B starts at zero) but on what no loss reads: the last layer's
    # binary-stream updates, skipped without output_relations
    last = f"layers.{model.native.cfg.L - 1}."
    still = {n for n, p in trainable.items() if "lora_B" in n and not p.any()}
    assert all(last in n and (".out_b." in n or ".ffn_b." in n) for n in still), still
    with torch.no_grad():
        adapted = lora(**batch).logits

    lora.save_pretrained(tmp_path / "adapter")
    base = _model(mode, backend, tmp_path)
    reloaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        again = reloaded(**batch).logits
        merged = reloaded.merge_and_unload().eval()
        folnet.set_memory(merged.native, mode, block_rows=4)
        merged_out = merged(**batch).logits
    assert_close(again, adapted, rtol=1e-6, atol=1e-6, what=f"{name} reloaded adapter")
    assert_close(merged_out, adapted, rtol=1e-5, atol=1e-5, what=f"{name} merged")
    assert not any(hasattr(m, "lora_A") for m in merged.modules())


@pytest.mark.numerics
def test_the_adapter_reaches_the_fused_backends_folded_contraction(tmp_path):
    """On the fused backend ``p``'s premise is folded: the einsum reads proj_b's weight rows,
    not the module. A nonzero adapter must change that operator's output, exactly as the same
    update merged into the weight does."""
    model = _model("full", "auto", tmp_path)
    layer = model.native.encoder.layers[0]
    ids = _batch()["input_ids"][:, :6]
    call = layer.ops[0].describe_call(torch.zeros(1), padded=False, requires_grad=False)
    p = next(op for op in layer.ops if op.spec.symbol == "p")
    assert p.route(call).layouts["premise"] == "fold"  # the case under test
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["proj_b"],
                                                      init_lora_weights=False)).eval()
    with torch.no_grad():
        adapted = lora(input_ids=ids).logits
        merged = lora.merge_and_unload()(input_ids=ids).logits
    with torch.no_grad():
        plain = _model("full", "auto", tmp_path)(input_ids=ids).logits
    assert float((adapted - plain).abs().max()) > 1e-3
    assert_close(merged, adapted, rtol=1e-5, atol=1e-5, what="merged against adapted, folded")


def test_unsupported_adapter_settings_are_refused_by_name(tmp_path):
    model = _model("full", "auto", tmp_path)
    ids = _batch()["input_ids"]
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["proj_b"],
                                                      lora_dropout=0.1))
    with pytest.raises(folnet.FolnetError, match="lora_dropout must be 0 on folnet's fused"):
        lora(input_ids=ids)
    dora = peft.get_peft_model(_model("full", "auto", tmp_path),
                               peft.LoraConfig(r=2, target_modules=["proj_u"], use_dora=True))
    with pytest.raises(folnet.FolnetError, match="LoRA variants"):
        dora(input_ids=ids)
    ia3 = peft.get_peft_model(_model("full", "auto", tmp_path),
                              peft.IA3Config(target_modules=["proj_b"],
                                             feedforward_modules=[]))
    with pytest.raises(folnet.FolnetError, match="only LoRA adapters reach them"):
        ia3(input_ids=ids)


def test_the_anchor_and_folnet_take_the_same_calls(tmp_path):
    """BERT's ["query", "value"] and folnet's operator projections: the same PEFT calls, only
    adapters trainable in both."""
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64))
    folnet_model = _model("full", "auto", tmp_path)
    for model, targets in ((bert, ["query", "value"]), (folnet_model, ["proj_u", "proj_b"])):
        lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
        names = [n for n, p in lora.named_parameters() if p.requires_grad]
        assert names and all("lora_" in n for n in names)
        lora(**{k: v for k, v in _batch().items() if k != "labels"})
    layer = folnet_model.native.encoder.layers[0]  # (wrapped in place by PEFT)
    assert "j.kernel" in repr(layer.proj_b.base_layer)  # the names print(model) shows


@pytest.mark.numerics
@pytest.mark.parametrize(("name", "targets", "mode", "backend"), CASES,
                         ids=[c[0] for c in CASES])
def test_adapted_outputs_equal_an_explicit_w_plus_ba_model(tmp_path, name, targets, mode,
                                                           backend):
    """Every adapter is read on every path: the adapted model's logits equal those of a
    plain model whose weights were set by hand to W + (alpha / r) B A -- computed here from
    the adapter tensors, not by PEFT's merge, so an adapter a backend path skipped (and a
    merge that skipped it alike) cannot pass."""
    model = _model(mode, backend, tmp_path)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                             init_lora_weights=False)  # random A and B: every update nonzero
    lora = peft.get_peft_model(model, config).eval()
    batch = {k: v for k, v in _batch(3).items() if k != "labels"}
    with torch.no_grad():
        adapted = lora(**batch).logits
        weights = {}
        for module_name, module in lora.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            key = module_name.replace("base_model.model.", "") + ".weight"
            weights[key] = module.base_layer.weight + (8 / 4) * (b @ a)  # (out, in)
        reference = _model(mode, backend, tmp_path).eval()
        state = reference.state_dict()
        assert set(weights) <= set(state) and weights
        reference.load_state_dict({**state, **weights})
        want = reference(**batch).logits
        plain = _model(mode, backend, tmp_path).eval()(**batch).logits
    assert float((adapted - plain).abs().max()) > 1e-3  # the adapters matter here
    assert_close(adapted, want, rtol=1e-5, atol=1e-5, what=f"{name} adapted against W + BA")
