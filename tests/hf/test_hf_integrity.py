"""Model directories as the Hugging Face tools and folnet's own loaders read them:
accelerate's ``init_empty_weights`` + ``load_checkpoint_and_dispatch`` load a folnet directory
as they load BERT's (model.safetensors says ``format: pt``), directories written with folnet's
old ``format: folnet`` still load, a directory saved through transformers' ``save_pretrained``
loads without the no-manifest warning, and every file a save wrote is verified on load: one
edited byte in any of them is refused by `folnet.from_pretrained`, the Auto classes,
``--init-from`` and ``--from``, naming that file.

Why the file list of the last tests is read from the saved directory, never written here: a
file a writer adds (or a reader forgets) must fail them without anyone updating a list."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tolerances import assert_rel

import folnet
from folnet.checksums import MANIFEST, read_manifest, strict_checksums, write_model_manifest
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import FolnetTokenizer, load_tokenizer, train_tokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.state import publish_final

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")
accelerate = pytest.importorskip("accelerate", reason="the [hf] extra is not installed")


from older_dirs import as_written_before_checksums  # noqa: E402

import folnet.hf  # noqa: E402  (registers the Auto classes)
from folnet.hf import FolnetForPreTraining  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: Outputs of a model whose weights accelerate left file-mapped against the eager model's.
DISPATCHED_REL = 1e-6
#: The tokenizer files folnet writes beside a model (`FolnetTokenizer.save`): a floor for the
#: listing the tests read, so that an empty directory cannot pass them.
TOKENIZER_FILES = {"tokenizer.json", "vocab.txt", "tokenizer_config.json",
                   "special_tokens_map.json"}


def _ids(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, vocab, (2, 11), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    return ids, mask


def _metadata(directory: Path) -> dict[str, str] | None:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return handle.metadata()


def _dispatched(directory: Path, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The model `build` makes with empty (meta) weights, filled from `directory` by accelerate.
    device_map="auto" (all on the CPU here): with None, accelerate 1.15 on torch 2.13 takes
    torch.distributed's state-dict loader, which wants a process group, for BERT as well."""
    with accelerate.init_empty_weights():
        empty = build()
    assert next(empty.parameters()).device.type == "meta"
    model = accelerate.load_checkpoint_and_dispatch(empty, str(directory), device_map="auto")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    return model.eval()


# -- 1. accelerate's loaders, beside BERT ------------------------------------------------------


def test_accelerate_dispatches_folnet_and_bert_directories_to_their_eager_outputs(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    bert_config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, vocab_size=100, num_labels=3)
    bert = BertForSequenceClassification(bert_config).eval()
    bert.save_pretrained(tmp_path / "bert")
    native = folnet.build_model("jmc.atp", preset="tiny", vocab_size=100,
                                head="classification", num_labels=3).eval()
    native.save_pretrained(tmp_path / "folnet")
    assert _metadata(tmp_path / "folnet") == _metadata(tmp_path / "bert") == {"format": "pt"}
    config = transformers.AutoConfig.from_pretrained(tmp_path / "folnet")
    auto = transformers.AutoModelForSequenceClassification
    dispatched = {
        "bert": _dispatched(tmp_path / "bert",
                            lambda: BertForSequenceClassification(bert_config)),
        "folnet": _dispatched(tmp_path / "folnet", lambda: auto.from_config(config)),
    }
    ids, mask = _ids(100)
    with torch.no_grad():
        pairs = {"bert": (dispatched["bert"](ids, attention_mask=mask).logits,
                          bert(ids, attention_mask=mask).logits),
                 "folnet": (dispatched["folnet"](input_ids=ids, attention_mask=mask).logits,
                            native(ids, attention_mask=mask).logits)}
    for name, (got, want) in pairs.items():
        # accelerate keeps the tensors mapped from the file, unaligned, where the CPU kernels
        # may round otherwise (folnet.hf's from_pretrained copies them for that: ~1e-7
        # measured there); equal here, so 10x that is the bound, for BERT as for folnet
        assert_rel(got, want, DISPATCHED_REL, f"{name} dispatched by accelerate")


def test_a_directory_written_with_the_old_metadata_still_loads(tmp_path, capsys):
    """model.safetensors written as folnet wrote it before (``format: folnet``, made here by
    rewriting a fresh file's header) loads natively and through the Auto classes alike."""
    native = folnet.build_model("jmc.atp", preset="tiny", vocab_size=100,
                                head="classification", num_labels=3).eval()
    directory = native.save_pretrained(tmp_path / "old")
    weights = directory / "model.safetensors"
    save_file(load_file(str(weights)), str(weights), metadata={"format": "folnet"})
    as_written_before_checksums(directory)  # folnet wrote none with that metadata
    assert _metadata(directory) == {"format": "folnet"}
    ids, mask = _ids(100, seed=1)
    with torch.no_grad():
        want = native(ids, attention_mask=mask).logits
        got = folnet.from_pretrained(directory).eval()(ids, attention_mask=mask).logits
        auto = transformers.AutoModelForSequenceClassification.from_pretrained(directory)
        through_hf = auto.eval()(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, want) and torch.equal(through_hf, want)
    capsys.readouterr()


# -- 2. transformers' save path writes what the loaders check ----------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> FolnetTokenizer:
    from folnet.train.data.kinship import pretraining_documents

    texts = [s for doc in pretraining_documents(30, seed=0) for s in doc]
    return train_tokenizer(texts=texts, vocab_size=120)


def _hf_model(tokenizer: FolnetTokenizer, directory: Path) -> FolnetForPreTraining:
    torch.manual_seed(0)
    native = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", L=1,
                                vocab_size=tokenizer.vocab_size)
    native.save_pretrained(directory)
    return FolnetForPreTraining.from_pretrained(directory)


def test_a_directory_saved_through_transformers_loads_without_a_warning(tmp_path, tokenizer,
                                                                        capsys):
    """Fails until ``FolnetPreTrainedModel.save_pretrained`` (folnet/hf/pretrained.py) calls
    `folnet.checksums.write_model_manifest` after transformers' own save."""
    model = _hf_model(tokenizer, tmp_path / "native")
    saved = tmp_path / "saved"
    tokenizer.save(saved)  # a tokenizer first, as the README does: covered as well
    model.save_pretrained(saved)
    capsys.readouterr()
    transformers.AutoModelForPreTraining.from_pretrained(saved)
    folnet.from_pretrained(saved)
    err = capsys.readouterr().err
    assert "warning" not in err and MANIFEST not in err, err
    listed = set(read_manifest(saved) or {})
    assert listed == {p.name for p in saved.iterdir()} - {MANIFEST}
    assert {"config.json", "model.safetensors"} | TOKENIZER_FILES <= listed


def test_a_model_manifest_in_a_shared_folder_lists_the_model_only(tmp_path, tokenizer, capsys):
    """A Trainer's output_dir holds checkpoint-N/ and logs that grow after the model is saved:
    `write_model_manifest` lists the model and tokenizer files, so those are not damage."""
    model = _hf_model(tokenizer, tmp_path / "native")
    shared = tmp_path / "output_dir"
    (shared / "checkpoint-5").mkdir(parents=True)
    (shared / "checkpoint-5" / "optimizer.pt").write_bytes(b"state")
    (shared / "runs").mkdir()
    (shared / "runs" / "events.log").write_text("step 1\n")
    (shared / "notes.txt").write_text("lr 1e-3 looked best\n")
    tokenizer.save(shared)
    model.save_pretrained(shared)
    write_model_manifest(shared)
    listed = set(read_manifest(shared) or {})
    assert listed == {"config.json", "model.safetensors"} | TOKENIZER_FILES
    with open(shared / "runs" / "events.log", "a") as log:
        log.write("step 2\n")
    (shared / "notes.txt").write_text("lr 3e-4 after all\n")
    capsys.readouterr()
    folnet.from_pretrained(shared)
    transformers.AutoModelForPreTraining.from_pretrained(shared)
    assert "warning" not in capsys.readouterr().err


# -- 3. every file a save wrote is verified ----------------------------------------------------


@pytest.fixture(scope="module")
def saved_dirs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """A model directory of each kind folnet writes, each with its checksums.json: a
    pretraining run's final/ (`publish_final`), a step checkpoint (`save_checkpoint`, with its
    trainer state), and a directory saved through transformers with its tokenizer."""
    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", L=1,
                               vocab_size=tokenizer.vocab_size)
    publish_final(root / "run", lambda d: model.save_pretrained(d, {"step": 3}), tokenizer)
    step = ckpt.save_checkpoint(root / "run", 3, tokenizer=tokenizer, keep_last=1,
                                write_model=lambda d: model.save_pretrained(d, {"step": 3}),
                                trainer_state={"step": 3})
    hf = root / "hf"
    tokenizer.save(hf)
    _hf_model(tokenizer, root / "native").save_pretrained(hf)
    write_model_manifest(hf)  # what FolnetPreTrainedModel.save_pretrained is to call
    return {"final": root / "run" / "final", "checkpoint": step, "hf": hf}


def edit_one_byte(path: Path) -> None:
    """Change one byte of `path` in place, as a failing disk does (the modification time
    kept), so that the file still parses and loads -- only its checksum can tell: a space of
    an indented JSON file becomes a tab, a vocab.txt token gets an upper-case letter (the
    vocabulary is lowercase, so it stays unique), binary files get a bit flipped in their
    second half (past a safetensors header)."""
    times = path.stat()
    data = bytearray(path.read_bytes())
    if path.suffix == ".json":
        at = data.index(b"\n ") + 1
        data[at] = ord("\t")
    elif path.name == "vocab.txt":
        at = max(i for i, c in enumerate(data) if chr(c).islower())
        data[at] = ord(chr(data[at]).upper())
    else:
        data[len(data) * 3 // 4] ^= 0x10
    path.write_bytes(bytes(data))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))


def _copy(directory: Path, where: Path) -> Path:
    """A copy of `directory` under a folder of its own: the no-manifest warning is said once
    per directory and process, and each copy must be a directory not read before."""
    target = where / directory.name
    shutil.copytree(directory, target)
    return target


def _refused_natively(directory: Path, capsys, tmp_path: Path) -> str:
    with pytest.raises(FolnetError) as caught:
        folnet.from_pretrained(directory)
    return str(caught.value)


def _refused_by_auto_class(directory: Path, capsys, tmp_path: Path) -> str:
    with pytest.raises(FolnetError) as caught:
        transformers.AutoModelForPreTraining.from_pretrained(directory)
    return str(caught.value)


def _cli_refusal(argv: list[str], command: str, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"folnet {command}: error: "), err
    return err


def _refused_by_init_from(directory: Path, capsys, tmp_path: Path) -> str:
    out = tmp_path / "init-run"
    line = _cli_refusal(["pretrain", "--init-from", str(directory), "--data", "kinship",
                         "--kinship-documents", "30", "--seq-len", "32", "--batch-size", "4",
                         "--steps", "1", "--no-progress", "--no-tensorboard", "--out",
                         str(out)], "pretrain", capsys)
    assert not out.exists()
    return line


def _refused_by_from(directory: Path, capsys, tmp_path: Path) -> str:
    out = tmp_path / "finetune-run"
    # a run small enough that a missing check fails the test in seconds, not minutes
    line = _cli_refusal(["finetune", "--config", "kinship-finetune", "--from", str(directory),
                         "--max-steps", "1", "--seeds", "1", "--kinship-train-size", "8",
                         "--kinship-test-per-k", "2", "--kinship-test-k", "2",
                         "--no-progress", "--out", str(out)], "finetune", capsys)
    assert not out.exists()
    return line


LOADERS = {"folnet.from_pretrained": _refused_natively,
           "AutoModelForPreTraining": _refused_by_auto_class,
           "pretrain --init-from": _refused_by_init_from, "finetune --from": _refused_by_from}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("source", ["final", "checkpoint", "hf"])
def test_one_edited_byte_in_any_file_a_save_wrote_is_refused(saved_dirs, source, loader,
                                                              tmp_path, capsys):
    saved = saved_dirs[source]
    written = sorted(p.name for p in saved.iterdir() if p.name != MANIFEST)
    assert {"config.json", "model.safetensors"} | TOKENIZER_FILES <= set(written)
    if source == "checkpoint":
        assert ckpt.TRAINER_FILE in written
    for name in written:
        copy = _copy(saved, tmp_path / name)
        edit_one_byte(copy / name)
        message = LOADERS[loader](copy, capsys, tmp_path)
        assert f"{copy / name}: corrupt or truncated" in message, (name, message)
        assert f"recorded in {MANIFEST}" in message, (name, message)


@pytest.mark.parametrize("source", ["final", "checkpoint", "hf"])
def test_the_edits_are_only_visible_to_the_checksums(saved_dirs, source, tmp_path, capsys):
    """Without checksums.json every edited copy loads (with the no-manifest warning): the
    refusals above come from the checksums, not from a file that no longer parses."""
    saved = saved_dirs[source]
    for name in sorted(p.name for p in saved.iterdir() if p.name != MANIFEST):
        copy = _copy(saved, tmp_path / name)
        edit_one_byte(copy / name)
        as_written_before_checksums(copy)
        folnet.from_pretrained(copy)
        load_tokenizer(copy)
        assert "has no checksums.json" in capsys.readouterr().err


def test_a_tokenizer_saved_into_the_model_folder_by_transformers_still_loads(saved_dirs,
                                                                              tmp_path, capsys):
    """The everyday habit: AutoTokenizer.from_pretrained(d).save_pretrained(d). The rewritten
    tokenizer files still map text to the same ids, so both loaders take the folder, with one
    warning that names the file; a rewrite that changes the ids, or rewritten weights, is
    refused as a rewrite, not as disk damage; re-recording the folder clears it."""
    transformers = pytest.importorskip("transformers")
    folder = _copy(saved_dirs["hf"], tmp_path / "habit")
    assert read_manifest(folder) and "tokenizer" in json.loads((folder / MANIFEST).read_text())
    transformers.AutoTokenizer.from_pretrained(str(folder)).save_pretrained(str(folder))
    rewritten = [n for n in read_manifest(folder)
                 if n in TOKENIZER_FILES and (folder / n).stat().st_mtime_ns
                 > (folder / MANIFEST).stat().st_mtime_ns]
    assert rewritten, "transformers wrote no tokenizer file"
    capsys.readouterr()
    model = folnet.from_pretrained(folder)
    said = capsys.readouterr().err
    assert "was rewritten after folnet saved" in said and "is loaded" in said
    assert transformers.AutoModelForPreTraining.from_pretrained(str(folder)) is not None
    assert model.cfg.vocab_size == load_tokenizer(folder).vocab_size
    # other ids: refused, and said to be a rewrite
    swapped = _copy(saved_dirs["hf"], tmp_path / "swapped")
    payload = json.loads((swapped / "tokenizer.json").read_text())
    vocab = payload["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(payload))
    with pytest.raises(FolnetError, match=r"rewritten after folnet saved .* no longer maps "
                                          r"text to the ids the model learnt"):
        folnet.from_pretrained(swapped)
    # weights rewritten whole (another library's save_file): loaded unverified, with a
    # warning that says so; refused under strict checksums; recorded again, they load quietly
    weights = _copy(saved_dirs["hf"], tmp_path / "weights")
    tensors = load_file(weights / "model.safetensors")
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1.0  # another file: new values, written whole
    # the same tensors under the header folnet wrote: the bytes changed in place -- refused
    save_file(tensors, weights / "model.safetensors", metadata={"format": "pt"})
    os.utime(weights / "model.safetensors")  # a later write (the clock may not have moved)
    with pytest.raises(FolnetError, match="under the very header folnet wrote"):
        folnet.from_pretrained(weights)
    # another layout (here another save's metadata): another library's save
    save_file(tensors, weights / "model.safetensors", metadata={"format": "pt", "by": "other"})
    os.utime(weights / "model.safetensors")
    capsys.readouterr()
    assert folnet.from_pretrained(weights) is not None
    said = capsys.readouterr().err
    assert "complete safetensors file" in said and "UNVERIFIED" in said, said
    with strict_checksums(), pytest.raises(FolnetError, match="or rewritten"):
        folnet.from_pretrained(weights)
    # a manifest written before headers were recorded cannot tell a rewrite: refused
    manifest = json.loads((weights / MANIFEST).read_text())
    assert set(manifest["headers"]) == {"model.safetensors"}
    old = _copy(weights, tmp_path / "old-manifest")
    (old / MANIFEST).write_text(json.dumps({k: v for k, v in manifest.items()
                                            if k != "headers"}))
    os.utime(old / "model.safetensors", ns=(time.time_ns() + 10**9,) * 2)
    with pytest.raises(FolnetError, match="or rewritten"):
        folnet.from_pretrained(old)
    # a rewritten file that is not whole (truncated, or its header hit) is refused
    broken = _copy(saved_dirs["hf"], tmp_path / "broken")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[:-3])
    os.utime(broken / "model.safetensors")
    with pytest.raises(FolnetError, match=r"corrupt or truncated, or rewritten: .* newer than "
                                          r"checksums\.json .*write_model_manifest"):
        folnet.from_pretrained(broken)
    write_model_manifest(weights)
    capsys.readouterr()
    assert folnet.from_pretrained(weights) is not None
    assert "UNVERIFIED" not in capsys.readouterr().err
