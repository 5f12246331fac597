"""Configs are checked before anything is allocated, and the model's own faults are clear: every
bad field of config.json or of a released ``.cfg`` is a FolnetError naming the file and the
field; sizes are bounded and compared with the weights file's shapes before the model is built;
a model too large for memory is refused with its sizes; empty batches name their shape; a loss
with nothing to predict is 0, never NaN."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from model_dirs import edited_copy, setter
from paths import OFFICIAL, ROOT

import folnet
from folnet.arch.models.base import FolnetBase


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny MLM checkpoint (config.json + model.safetensors) to copy and damage."""
    directory = tmp_path_factory.mktemp("ckpt") / "good"
    torch.manual_seed(0)
    folnet.build_model("j.a", preset="tiny", vocab_size=200, head="mlm").save_pretrained(directory)
    return directory


@pytest.fixture
def constructions(monkeypatch) -> list[str]:
    """The device of every model construction (meta: shapes only; cpu: allocated)."""
    seen: list[str] = []
    original = FolnetBase.__init__

    def recording(self, *args, **kwargs):
        seen.append(torch.get_default_device().type)
        original(self, *args, **kwargs)

    monkeypatch.setattr(FolnetBase, "__init__", recording)
    return seen


BAD_FIELDS = [
    ("model.dropout", "abc"),
    ("model", None),
    ("num_labels", "abc"),
    ("model.operators", "abc"),
    ("model.layer_norm_eps", "x"),  # was accepted, and failed only at the first forward
    ("model.vocab_size", 2.5),
    ("model.position", None),
    ("model.attention_dropout", "0.1"),
    ("model.initializer_range", [0.02]),
    ("model.operators", {"symbol": "q"}),
    ("model.ops", 7),
    ("head", 3),
    ("model.dropout", float("nan")),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS,
                         ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_a_bad_config_json_field_names_the_file_and_the_field(saved, tmp_path, field, value):
    directory = edited_copy(saved, tmp_path, setter(field, value))
    with pytest.raises(folnet.FolnetError) as info:
        folnet.from_pretrained(directory)
    message = str(info.value)
    assert str(directory / "config.json") in message
    assert field.split(".")[-1] in message and repr(value) in message


def test_an_unknown_saved_head_or_operator_names_the_file(saved, tmp_path):
    directory = edited_copy(saved, tmp_path, setter("head", "ranking"))
    with pytest.raises(folnet.FolnetError, match=r"config\.json.*head 'ranking' is unknown"):
        folnet.from_pretrained(directory)
    directory = edited_copy(saved, tmp_path / "op", setter("model.operators", [5]))
    with pytest.raises(folnet.FolnetError, match=r"config\.json: model\.operators\[0\] must be "
                                                 r"an operator spec table \(an object\), got 5"):
        folnet.from_pretrained(directory)
    directory = edited_copy(saved, tmp_path / "spec", setter("model.operators", [{"symbol": "q"}]))
    with pytest.raises(folnet.FolnetError, match=r"config\.json: .*operator 'q'"):
        folnet.from_pretrained(directory)


@pytest.mark.parametrize("content", [b"[1, 2, 3]", random.Random(0).randbytes(512),
                                     b'{"format": "folnet", "model": [1, 2]}', b"\xef\xbb\xbf{"],
                         ids=["array", "random-bytes", "model-array", "bom-truncated"])
def test_a_config_json_that_is_not_an_object_names_the_file(saved, tmp_path, content):
    target = tmp_path / "ckpt"
    shutil.copytree(saved, target)
    (target / "config.json").write_bytes(content)
    with pytest.raises(folnet.FolnetError, match=r"config\.json"):
        folnet.from_pretrained(target)


def test_absurd_sizes_beside_small_weights_fail_before_allocation(saved, tmp_path, constructions):
    directory = edited_copy(saved, tmp_path, setter("model.D1", 10**9))
    start = time.perf_counter()
    with pytest.raises(folnet.FolnetError, match=r"config\.json: model\.D1 must be an integer "
                                                 r"in \[1, 65536\], got 1000000000"):
        folnet.from_pretrained(directory)
    assert time.perf_counter() - start < 2.0
    assert "cpu" not in constructions  # nothing was allocated


def test_sizes_that_disagree_with_the_weights_name_the_tensor(saved, tmp_path, constructions):
    directory = edited_copy(saved, tmp_path, setter("model.D1", 128))
    with pytest.raises(folnet.FolnetError) as info:
        folnet.from_pretrained(directory)
    message = str(info.value)
    assert "model.safetensors" in message and "'encoder.atoms.word.weight'" in message
    assert "(200, 64)" in message and "(200, 128)" in message and "D1=128" in message
    assert constructions == ["meta"]  # the shapes were compared before any allocation
    directory = edited_copy(saved, tmp_path / "more", setter("model.L", 3))
    with pytest.raises(folnet.FolnetError, match=r"missing keys \['encoder\.layers\.2\."):
        folnet.from_pretrained(directory)


def test_a_model_too_large_for_memory_names_its_sizes():
    start = time.perf_counter()
    with pytest.raises(folnet.FolnetError) as info:
        folnet.build_model("j.a", preset="tiny", D1=65536, F1=2**18, L=64)
    message = str(info.value)
    assert "D1=65536" in message and "F1=262144" in message and "L=64" in message
    assert "parameters" in message and "GiB" in message and "memory" in message
    assert time.perf_counter() - start < 10.0


def test_the_memory_limit_can_be_set_and_meta_builds_are_free(monkeypatch):
    monkeypatch.setenv("FOLNET_MAX_MODEL_BYTES", "100000")
    with pytest.raises(folnet.FolnetError, match=r"imply 2\d\d,\d\d\d parameters .* more than "
                                                 r"the 97\.7 KiB of FOLNET_MAX_MODEL_BYTES"):
        folnet.build_model("j.a", preset="tiny")
    with torch.device("meta"):  # nothing is allocated, so nothing is refused
        assert folnet.build_model("j.a", preset="tiny").encoder.atoms.embedding.weight.is_meta
    monkeypatch.setenv("FOLNET_MAX_MODEL_BYTES", "lots")
    with pytest.raises(folnet.FolnetError, match="FOLNET_MAX_MODEL_BYTES must be a positive"):
        folnet.build_model("j.a", preset="tiny")


# -- released .cfg files ------------------------------------------------------------------------


def _released(tmp_path: Path, change) -> Path:
    """A copy of the released-format fixture whose .cfg went through ``change(raw)``."""
    prefix = tmp_path / "rel"
    raw = json.loads(Path(str(OFFICIAL) + ".cfg").read_text())
    change(raw)
    Path(str(prefix) + ".cfg").write_text(json.dumps(raw))
    shutil.copyfile(str(OFFICIAL) + ".pt", str(prefix) + ".pt")
    return prefix


BAD_RELEASED = [
    ("num_layers", "2"),
    ("num_layers", "two"),
    ("predicate_dims", [0, 64]),
    ("intermediate_dims", "128"),
    ("mixer_ops", ["join", "assoc"]),
    ("mixer_ops", {"1": "join", "2": ["assoc"]}),
    ("mixer_ops", {"1": ["join", "nope"], "2": ["assoc"]}),
    ("relative_position", "false"),
    ("vocab_size", None),
    ("num_heads", 10**9),
    ("hidden_dropout_prob", "0.1"),
    ("layer_norm_eps", -1.0),
]


@pytest.mark.parametrize(("field", "value"), BAD_RELEASED,
                         ids=[f"{f}={v!r}" for f, v in BAD_RELEASED])
def test_a_bad_released_cfg_field_names_the_file_and_the_field(tmp_path, field, value):
    prefix = _released(tmp_path, lambda raw: raw.__setitem__(field, value))
    with pytest.raises(folnet.FolnetError) as info:
        folnet.load_official(prefix)
    message = str(info.value)
    assert f"{prefix}.cfg" in message and field in message


def test_released_sizes_that_disagree_with_the_weights_fail_before_allocation(tmp_path,
                                                                              constructions):
    prefix = _released(tmp_path, lambda raw: raw.__setitem__("predicate_dims", [0, 96, 16]))
    with pytest.raises(folnet.FolnetError, match=r"rel\.pt: key 'folnet\.encoder\.word_embd\."
                                                 r"weight' has shape \(1008, 64\), expected "
                                                 r"\(1008, 96\)"):
        folnet.load_official(prefix)
    assert constructions == ["meta"]


def test_convert_exits_2_with_one_line_for_a_bad_released_cfg(tmp_path):
    prefix = _released(tmp_path, lambda raw: raw.__setitem__("mixer_ops", ["join"]))
    result = subprocess.run([sys.executable, "-m", "folnet", "convert", str(prefix),
                             str(tmp_path / "out")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert f"{prefix}.cfg" in lines[0] and "mixer_ops" in lines[0]


# -- empty batches --------------------------------------------------------------------------


def test_empty_batches_name_the_shape_of_input_ids():
    for kind in ("encoder", "decoder", "encoder-decoder"):
        model = folnet.build_model("j.a", preset="tiny", kind=kind, vocab_size=50)
        for shape in ((0, 5), (2, 0)):
            ids = torch.zeros(shape, dtype=torch.long)
            args = {"decoder_input_ids": torch.ones(2, 3, dtype=torch.long)} if (
                kind == "encoder-decoder") else {}
            with pytest.raises(folnet.FolnetError,
                               match=rf"input_ids is empty \(shape \({shape[0]}, {shape[1]}\)\)"):
                model(ids, **args)
    choice = folnet.build_model("j.a", preset="tiny", vocab_size=50, head="multiple-choice")
    with pytest.raises(folnet.FolnetError, match=r"input_ids is empty \(shape \(2, 0, 5\)\)"):
        choice(torch.zeros(2, 0, 5, dtype=torch.long))


# -- losses with nothing to predict -----------------------------------------------------------


def _zero_and_connected(loss: torch.Tensor, model: torch.nn.Module) -> None:
    """The loss is exactly 0, attached to the graph, and its gradients are all zero."""
    assert loss is not None and loss.detach().item() == 0.0
    assert loss.requires_grad
    model.zero_grad()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.all(g == 0) for g in grads)


def test_mlm_with_every_label_ignored_gives_a_zero_loss():
    torch.manual_seed(0)
    ids = torch.randint(5, 50, (2, 6))
    for head in ("mlm", "pretraining"):
        for gather in (False, True):
            model = folnet.build_model("j.a", preset="tiny", vocab_size=50, head=head)
            model.gather_mlm = gather
            extra = {"nsp_labels": torch.full((2,), -100)} if head == "pretraining" else {}
            out = model(ids, mlm_labels=torch.full((2, 6), -100), **extra)
            _zero_and_connected(out.loss, model)
    model = folnet.build_model("j.a", preset="tiny", vocab_size=50, head="token-classification")
    _zero_and_connected(model(ids, labels=torch.full((2, 6), -100)).loss, model)
    model = folnet.build_model("j.a", preset="tiny", vocab_size=50, head="classification")
    _zero_and_connected(model(ids, labels=torch.full((2,), -100)).loss, model)


def test_text_models_with_no_target_give_a_zero_loss():
    torch.manual_seed(0)
    decoder = folnet.build_model("j.a", preset="tiny", kind="decoder", vocab_size=50)
    one = torch.tensor([[7], [9]])
    _zero_and_connected(decoder(one, labels=one).loss, decoder)  # a one-token decoder row
    ids = torch.randint(5, 50, (2, 4))
    _zero_and_connected(decoder(ids, labels=ids, prefix_lengths=4).loss, decoder)  # all prefix
    encdec = folnet.build_model("j.a", preset="tiny", kind="encoder-decoder", vocab_size=50)
    _zero_and_connected(encdec(ids, labels=torch.full((2, 3), -100)).loss, encdec)


def test_with_targets_the_loss_is_the_usual_mean():
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", vocab_size=50, head="mlm").eval()
    ids = torch.randint(5, 50, (2, 6))
    labels = torch.full((2, 6), -100)
    labels[0, 2], labels[1, 4] = 11, 23
    out = model(ids, mlm_labels=labels)
    want = F.cross_entropy(out.mlm_logits.flatten(0, 1).float(), labels.flatten())
    assert torch.equal(out.loss, want)
    decoder = folnet.build_model("j.a", preset="tiny", kind="decoder", vocab_size=50).eval()
    out = decoder(ids, labels=ids)
    want = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    assert torch.equal(out.loss, want)
