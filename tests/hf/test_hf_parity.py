"""What a BERT user does to a sequence classifier, done to folnet and to a tiny BERT in the same
test: PEFT's SEQ_CLS task trains the head, a replaced head takes effect, multi-label float
targets get the binary cross-entropy, config overrides at load (folnet's names and BERT's),
set_input_embeddings, ``return_dict=False`` at load, the config attributes tools read, and
torch.compile of the forward as one graph."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")
peft = pytest.importorskip("peft", reason="the [hf] extra is not installed")

import torch.nn.functional as F  # noqa: E402

import folnet  # noqa: E402
import folnet.hf  # noqa: E402  (registers the Auto classes)
from folnet.errors import FolnetError  # noqa: E402
from folnet.hf import FolnetConfig, FolnetForSequenceClassification  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V, C = 100, 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folnet classifier and a tiny BERT classifier, each saved to a directory."""
    root = tmp_path_factory.mktemp("parity")
    torch.manual_seed(0)
    folnet.build_model("jmc.atp", preset="tiny", vocab_size=V, head="classification",
                       num_labels=C).save_pretrained(root / "folnet")
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     num_labels=C)
    transformers.BertForSequenceClassification(config).save_pretrained(root / "bert")
    return {"folnet": root / "folnet", "bert": root / "bert"}


def _load(directory, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForSequenceClassification.from_pretrained(directory,
                                                                               **kwargs)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded row
    return ids, mask


ANCHORS = ("folnet", "bert")


@pytest.mark.parametrize("which", ANCHORS)
def test_peft_seq_cls_trains_the_head(saved, which):
    """PEFT keeps a trainable copy of the head (modules_to_save); the forward must read it:
    it gets a gradient, and a step moves it while the frozen original stays."""
    model = _load(saved[which]).train()
    target = ["proj_u"] if which == "folnet" else ["query", "value"]
    tuned = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=4,
                                                       target_modules=target))
    copies = {n: p for n, p in tuned.named_parameters()
              if p.requires_grad and "modules_to_save" in n}
    assert copies, "PEFT made no trainable copy of the head"
    original = {n: p.detach().clone() for n, p in tuned.named_parameters()
                if "original_module" in n}
    optimiser = torch.optim.SGD([p for p in tuned.parameters() if p.requires_grad], lr=0.5)
    ids, mask = _batch()
    before = {n: p.detach().clone() for n, p in copies.items()}
    loss = tuned(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2, 1])).loss
    loss.backward()
    for name, p in copies.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    optimiser.step()
    for name, p in copies.items():
        assert not torch.equal(p.detach(), before[name]), name
    for name, p in tuned.named_parameters():
        if "original_module" in name:
            assert torch.equal(p.detach(), original[name]), name
    with torch.no_grad():  # and the logits are the trained copy's
        tuned.eval()
        logits = tuned(input_ids=ids, attention_mask=mask).logits
        head = next(m for n, m in tuned.named_modules()
                    if n.endswith("modules_to_save.default"))
        pooled = (tuned.base_model.model.native(ids, attention_mask=mask).pooled_output
                  if which == "folnet" else
                  tuned.base_model.model.bert(ids, attention_mask=mask).pooler_output)
        linear = head.linear if which == "folnet" else head
        assert torch.allclose(logits, linear(pooled), atol=1e-6)


@pytest.mark.parametrize("which", ANCHORS)
def test_a_replaced_head_takes_effect(saved, which):
    model = _load(saved[which]).eval()
    ids, mask = _batch(1)
    new = torch.nn.Linear(model.config.hidden_size, C)
    with torch.no_grad():
        new.weight.fill_(0.0)
        new.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
        model.classifier = new  # the whole head, as PEFT and users replace it
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(logits, torch.tensor([1.0, 2.0, 3.0]).expand(4, C))
    if which == "folnet":
        assert model.native.classifier is new


@pytest.mark.parametrize("which", ANCHORS)
def test_multi_label_float_targets_get_the_binary_cross_entropy(saved, which):
    model = _load(saved[which], problem_type="multi_label_classification").eval()
    ids, mask = _batch(2)
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0],
                            [0.0, 1.0, 0.0]])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=targets)
    want = F.binary_cross_entropy_with_logits(out.logits.double(), targets.double())
    assert abs(float(out.loss) - float(want)) < 1e-6
    soft = F.cross_entropy(out.logits.double(), targets.double())  # what folnet computed once
    assert abs(float(out.loss) - float(soft)) > 1e-3
    inferred = _load(saved[which]).eval()  # no problem_type: float labels mean multi-label
    with torch.no_grad():
        again = inferred(input_ids=ids, attention_mask=mask, labels=targets)
    assert inferred.config.problem_type == "multi_label_classification"
    assert abs(float(again.loss) - float(want)) < 1e-6


def test_each_problem_type_is_transformers_loss_and_bad_labels_are_refused(saved):
    """An explicit ``problem_type`` gets its loss whatever the label count, as BERT's does
    (regression over 3 outputs is MSE against (B, 3) targets); labels of the wrong form for it
    are refused by name."""
    ids, mask = _batch()
    targets = torch.rand(4, C)
    model = _load(saved["folnet"], problem_type="regression").eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=targets)
    assert abs(float(out.loss) - float(F.mse_loss(out.logits.double(), targets.double()))) < 1e-6
    wrong = [("regression", torch.tensor([0.1, 0.2, 0.3, 0.4]), "regression targets"),
             ("single_label_classification", torch.rand(4, C), "float32 labels"),
             ("multi_label_classification", torch.tensor([0, 1, 2, 1]), "logits' shape"),
             ("ranking", torch.tensor([0, 1, 2, 1]), "problem_type 'ranking' is unknown")]
    for kind, labels, needle in wrong:
        model = _load(saved["folnet"]).eval()
        try:
            model.config.problem_type = kind
        except Exception as exc:  # strict configs (transformers 5.17) refuse it themselves
            assert kind == "ranking" and "problem_type" in str(exc), exc
            continue
        with pytest.raises(FolnetError, match=needle):
            model(input_ids=ids, attention_mask=mask, labels=labels)
    model = _load(saved["folnet"]).eval()
    with pytest.raises(FolnetError, match=r"must have the logits' shape \(4, 3\)"):
        model.native(ids, attention_mask=mask, labels=torch.rand(4))


@pytest.mark.parametrize(("which", "kwargs"), [
    ("folnet", {"dropout": 0.0}), ("folnet", {"hidden_dropout_prob": 0.0}),
    ("folnet", {"attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0}),
    ("bert", {"hidden_dropout_prob": 0.0}),
])
def test_config_overrides_at_load(saved, which, kwargs):
    model = _load(saved[which], **kwargs)
    assert model.config.hidden_dropout_prob == 0.0
    if which == "folnet":
        assert model.config.model["dropout"] == 0.0 and model.native.cfg.dropout == 0.0
        if "attention_probs_dropout_prob" in kwargs:
            assert model.native.cfg.kernel_dropout == 0.0
        ids, mask = _batch(3)  # no dropout left: train mode gives the eval outputs
        with torch.no_grad():
            assert torch.equal(model.train()(input_ids=ids, attention_mask=mask).logits,
                               model.eval()(input_ids=ids, attention_mask=mask).logits)


def test_sizes_are_settable_and_other_sizes_do_not_load_silently(saved):
    """A config's sizes are what the model is built with (set before building, as BERT's);
    loading weights into other sizes fails, as BERT's, unless the mismatch is waived."""
    config = FolnetConfig.from_pretrained(saved["folnet"])
    config.hidden_size, config.num_attention_heads = 32, 2
    model = FolnetForSequenceClassification(config)
    assert model.native.cfg.D1 == 32 and model.native.cfg.H == 2
    assert model.classifier.linear.in_features == 32
    with pytest.raises(RuntimeError, match="mismatch"):
        _load(saved["folnet"], hidden_size=128)
    assert _load(saved["folnet"], hidden_size=64).config.hidden_size == 64
    with pytest.raises(FolnetError, match=r"hidden_dropout_prob \(folnet's dropout\): dropout "
                                          r"must be a number in \[0, 1\), got 1.5"):
        _load(saved["folnet"], hidden_dropout_prob=1.5)


@pytest.mark.parametrize("which", ANCHORS)
def test_the_config_attributes_tools_read(saved, which):
    config = _load(saved[which]).config
    for name in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                 "max_position_embeddings", "layer_norm_eps", "vocab_size",
                 "hidden_dropout_prob", "initializer_range", "type_vocab_size"):
        assert isinstance(getattr(config, name), (int, float)), name
    if which == "folnet":
        model = config.model
        assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers,
                config.intermediate_size, config.max_position_embeddings) == (
            model["D1"], model["H"], model["L"], model["F1"], model["max_positions"])
        assert config.tie_word_embeddings is False  # a classifier has no tied decoder


def test_text_configs_say_their_tokens_cache_and_tying(tmp_path):
    folnet.build_model("j.a", kind="decoder", preset="tiny",
                       vocab_size=V).save_pretrained(tmp_path / "lm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm")
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=2, vocab_size=V))
    for config in (lm.config, gpt2.config):
        assert config.use_cache is True and config.tie_word_embeddings is True
        assert hasattr(config, "bos_token_id") and hasattr(config, "eos_token_id")
        assert config.num_hidden_layers >= 1 and config.hidden_size in (32, 64)
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight


@pytest.mark.parametrize("which", ANCHORS)
def test_return_dict_false_at_load_gives_tuples(saved, which):
    model = _load(saved[which], return_dict=False).eval()
    ids, mask = _batch(4)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2, 0]))
        given = model(input_ids=ids, attention_mask=mask, return_dict=True)
    assert isinstance(out, tuple) and out[0].dim() == 0 and out[1].shape == (4, C)
    assert torch.equal(out[1], given.logits)


@pytest.mark.parametrize("which", ANCHORS)
def test_set_input_embeddings(saved, which, tmp_path):
    model = _load(saved[which]).eval()
    old = model.get_input_embeddings()
    new = torch.nn.Embedding(*old.weight.shape)
    with torch.no_grad():
        new.weight.copy_(old.weight * 2.0)
    ids, mask = _batch(5)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        model.set_input_embeddings(new)
        after = model(input_ids=ids, attention_mask=mask).logits
    assert model.get_input_embeddings() is new and not torch.equal(before, after)
    if which == "folnet":  # the same as a model whose embedding holds those rows
        reference = _load(saved["folnet"]).eval()
        with torch.no_grad():
            reference.get_input_embeddings().weight.mul_(2.0)
            assert torch.equal(reference(input_ids=ids, attention_mask=mask).logits, after)
        rows = old.weight.shape[0] + 5  # another shape, as BERT takes it: the vocabulary
        bigger = torch.nn.Embedding(rows, old.weight.shape[1])
        model.set_input_embeddings(bigger)
        assert model.config.vocab_size == rows and model.native.cfg.vocab_size == rows
        with torch.no_grad():
            model(input_ids=torch.full_like(ids, rows - 1), attention_mask=mask)
        with pytest.warns(UserWarning, match="width D1 is"):
            model.set_input_embeddings(torch.nn.Embedding(10, 10))
        assert model.get_input_embeddings().weight.shape == (10, 10)
        with pytest.raises(FolnetError, match="2-D weight"):
            model.set_input_embeddings(torch.nn.Linear(3, 4, bias=False).weight)


def test_set_input_embeddings_reaches_the_tied_mlm_decoder(tmp_path):
    folnet.build_model("jmc.atp", preset="tiny", vocab_size=V,
                       head="mlm").save_pretrained(tmp_path / "mlm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm").eval()
    new = torch.nn.Embedding(*model.get_input_embeddings().weight.shape)
    model.set_input_embeddings(new)
    assert model.get_output_embeddings() is new
    assert model.native.mlm._word is new


@pytest.mark.parametrize("which", ANCHORS)
def test_the_forward_compiles_to_one_graph(saved, which):
    model = _load(saved[which]).eval()
    ids, mask = _batch(6)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), [
        str(b.reason)[:200] for b in explained.break_reasons]
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
        want = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
