"""folnet in the Hugging Face stack: the Auto classes load folnet directories and give the
native outputs bit for bit (the same computation in this process), directories saved through
transformers load natively, the released-format fixture and the legacy directories match their
stored outputs through the HF classes (at tests/tolerances.py's STORED_REL), AutoTokenizer
reads a folnet tokenizer directory, and Trainer trains a folnet classifier."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")
datasets = pytest.importorskip("datasets", reason="the [train] extra is not installed")

from paths import FIXTURES  # noqa: E402
from tolerances import assert_stored  # noqa: E402

import folnet  # noqa: E402
import folnet.hf  # noqa: E402  (registers the Auto classes)
from folnet.hf import FolnetConfig, FolnetForSequenceClassification  # noqa: E402

AUTO = transformers
V = 100


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (3, 12), generator=g)
    types = torch.zeros_like(ids)
    types[:, 7:] = 1
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, types, mask


def _saved(tmp_path, head, **kw):
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", vocab_size=V, head=head, **kw).eval()
    model.save_pretrained(tmp_path / (head or "bare"))
    return model, tmp_path / (head or "bare")


@pytest.mark.parametrize(("head", "auto", "field", "hf_field"), [
    ("classification", "AutoModelForSequenceClassification", "logits", "logits"),
    ("mlm", "AutoModelForMaskedLM", "mlm_logits", "logits"),
    (None, "AutoModel", "sequence_output", "last_hidden_state"),
    ("classification", "AutoModel", "pooled_output", "pooler_output"),
])
def test_auto_classes_give_the_native_outputs_bit_for_bit(tmp_path, head, auto, field, hf_field):
    native, directory = _saved(tmp_path, head, **({"num_labels": 3} if head else {}))
    config = AUTO.AutoConfig.from_pretrained(directory)
    assert isinstance(config, FolnetConfig) and config.head == head
    model = getattr(AUTO, auto).from_pretrained(directory).eval()
    assert type(model).__name__ == {"AutoModel": "FolnetModel"}.get(
        auto, auto.replace("AutoModel", "Folnet"))
    ids, types, mask = _batch()
    with torch.no_grad():
        want = getattr(native(ids, types, attention_mask=mask), field)
        got = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert torch.equal(getattr(got, hf_field), want)
    assert got[hf_field] is getattr(got, hf_field) and isinstance(got, dict)


def test_hf_saved_directory_loads_natively_and_heads_carry_over(tmp_path):
    native, directory = _saved(tmp_path, "classification", num_labels=3)
    hf = FolnetForSequenceClassification.from_pretrained(directory).eval()
    hf.save_pretrained(tmp_path / "via_hf")
    back = folnet.from_pretrained(tmp_path / "via_hf").eval()
    assert back.head == "classification" and back.num_labels == 3
    ids, types, mask = _batch(1)
    with torch.no_grad():
        assert torch.equal(back(ids, types, mask).logits, native(ids, types, mask).logits)
    assert sorted(hf.state_dict()) == sorted(native.state_dict())


def test_loss_first_and_labels_as_collators_give_them(tmp_path):
    _, directory = _saved(tmp_path, "mlm")
    model = AUTO.AutoModelForMaskedLM.from_pretrained(directory)
    ids, _types, mask = _batch(2)
    labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(3))
                             > 0.3, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert out[0] is out["loss"] is out.loss and out.loss.ndim == 0
    assert list(out.keys()) == ["loss", "logits"]


@pytest.mark.numerics
def test_old_folnet_directories_load_through_the_folnet_classes():
    """Directories written before config.json said model_type (the legacy fixtures) load with
    the explicit classes and give the outputs the old code gave."""
    from safetensors.torch import load_file

    directory = FIXTURES / "legacy" / "encoder-classification"
    ref = load_file(str(directory / "reference.safetensors"))
    model = FolnetForSequenceClassification.from_pretrained(directory).eval()
    with torch.no_grad():
        out = model(ref["input_ids"], attention_mask=ref["attention_mask"],
                    token_type_ids=ref["token_type_ids"])
    assert_stored(out.logits, ref["padded.logits"], "padded.logits")


@pytest.mark.numerics
def test_released_fixture_through_the_hf_classes(tmp_path):
    prefix = FIXTURES / "official" / "tiny-jmc.atp"
    ref = torch.load(str(prefix) + ".reference.pt", weights_only=True)
    folnet.load_official(prefix).save_pretrained(tmp_path / "released")
    model = AUTO.AutoModelForPreTraining.from_pretrained(tmp_path / "released").eval()
    with torch.no_grad():
        out = model(input_ids=ref["input_ids"], token_type_ids=ref["token_type_ids"])
    assert_stored(out.prediction_logits, ref["mlm_logits"], "mlm_logits")
    assert_stored(out.seq_relationship_logits, ref["nsp_logits"], "nsp_logits")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.tokenizer import train_tokenizer

    texts = [s for doc in pretraining_documents(60, seed=0) for s in doc]
    tokenizer = train_tokenizer(texts=texts, vocab_size=200)
    tokenizer.model_max_length = 64
    return tokenizer.save(tmp_path_factory.mktemp("tok"))


def test_auto_tokenizer_reads_a_folnet_tokenizer_directory(tokenizer_dir):
    from folnet.train.data.tokenizer import load_tokenizer

    tok = AUTO.AutoTokenizer.from_pretrained(tokenizer_dir)
    ours = load_tokenizer(tokenizer_dir)
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id,
            tok.mask_token_id) == (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id,
                                   ours.mask_id)
    assert tok.model_max_length == 64 == ours.model_max_length
    enc = tok("the mother of alice", "bob")
    assert enc["input_ids"][0] == ours.cls_id and enc["input_ids"][-1] == ours.sep_id
    assert enc["input_ids"] == ours.tokenizer.encode("the mother of alice", "bob").ids
    batch = AUTO.DataCollatorWithPadding(tok)([tok("a b c"), tok("a")])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 5)


def test_trainer_trains_a_folnet_classifier(tmp_path, tokenizer_dir):
    """30 Trainer steps on an in-memory dataset tokenised by AutoTokenizer and batched by
    DataCollatorWithPadding: the loss falls and evaluate() reports accuracy."""
    tok = AUTO.AutoTokenizer.from_pretrained(tokenizer_dir)
    names = ["alice", "bob", "carol", "dan", "eve", "frank"]
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(160):
        a, b = (names[int(j)] for j in torch.randint(0, len(names), (2,), generator=g))
        label = i % 2  # the kind of sentence decides the label
        rows.append({"text": f"{a} is the mother of {b}" if label else f"{b} and {a} went home",
                     "label": label})
    data = datasets.Dataset.from_list(rows).map(
        lambda r: tok(r["text"], truncation=True), remove_columns=["text"])
    split = data.train_test_split(test_size=32, seed=0)
    torch.manual_seed(0)
    config = FolnetConfig(ops="j.a", preset="tiny", vocab_size=len(tok), num_labels=2,
                          D1=32, F1=64, L=1, dropout=0.0)
    model = AUTO.AutoModelForSequenceClassification.from_config(config)
    args = AUTO.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=30,
                                  per_device_train_batch_size=16, learning_rate=1e-2,
                                  logging_steps=5, report_to=[], use_cpu=True, save_strategy="no",
                                  seed=0, disable_tqdm=True)

    def accuracy(pred):
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    trainer = AUTO.Trainer(model=model, args=args, train_dataset=split["train"],
                           eval_dataset=split["test"],
                           data_collator=AUTO.DataCollatorWithPadding(tok),
                           compute_metrics=accuracy)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and losses[-1] < 0.2 * losses[0], losses
    metrics = trainer.evaluate()
    assert metrics["eval_accuracy"] >= 0.9, metrics


def test_mlm_collator_batches_feed_the_model(tmp_path, tokenizer_dir):
    """DataCollatorForLanguageModeling's batches (masked ids, -100 labels) go straight in."""
    tok = AUTO.AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = AUTO.AutoModelForMaskedLM.from_config(
        FolnetConfig(ops="j.a", preset="tiny", vocab_size=len(tok)))
    collate = AUTO.DataCollatorForLanguageModeling(tok, mlm_probability=0.3, seed=0)
    batch = collate([tok("alice is the mother of bob"), tok("carol went home")])
    assert (batch["labels"] != -100).any() and (batch["input_ids"] == tok.mask_token_id).any()
    out = model(**batch)
    assert out.logits.shape == (*batch["input_ids"].shape, len(tok))
    assert torch.isfinite(out.loss) and out.loss > 0
