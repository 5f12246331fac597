"""Text-to-text finetuning (`folnet.train.finetune.generation`, `folnet.train.tasks.generation`):
the training rows of each kind against a hand layout, a decoder and an encoder-decoder taught a
rule they then answer by generation, exact match / F1 against hand counts, and the generation
tasks (kinship/generate, clutrr/generate) through ``folnet finetune`` and ``folnet evaluate``."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest
import torch

import folnet
from folnet.cli import main as folnet_main
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import train_tokenizer
from folnet.train.finetune.evaluate import read_predictions
from folnet.train.finetune.generation import (
    encode_generation,
    finetune_generation,
    generate_answers,
    score_answers,
)
from folnet.train.finetune.loop import LoopSettings

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
ANSWER = {n: ("sister" if i % 2 else "brother") for i, n in enumerate(NAMES)}


@pytest.fixture(scope="module")
def tok():
    texts = [f"who is {n} ? {a}" for n, a in ANSWER.items()] * 8
    return train_tokenizer(texts=texts, vocab_size=120)


def test_the_rows_of_each_kind(tok):
    rows = encode_generation(["who is bob ?"], ["sister"], tok, "decoder")
    prompt, answer = tok.encode("who is bob ?"), tok.encode("sister")
    assert rows["input_ids"][0].tolist() == [*prompt, *answer, tok.sep_id]
    assert rows["labels"][0].tolist() == [-100] * len(prompt) + [*answer, tok.sep_id]
    rows = encode_generation(["who is bob ?", "who is alice ?"], ["sister", "brother"], tok,
                             "encoder-decoder")
    assert rows["input_ids"][1].tolist() == tok.encode("who is alice ?")
    assert rows["labels"][0].tolist() == [*answer, tok.sep_id]
    with pytest.raises(FolnetError, match="one answer per prompt, got 2 prompts and 1"):
        encode_generation(["a", "b"], ["c"], tok, "decoder")
    with pytest.raises(FolnetError, match="kind must be 'decoder' or 'encoder-decoder'"):
        encode_generation(["a"], ["c"], tok, "encoder")


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_each_kind_learns_to_answer_by_generating(tmp_path, tok, kind):
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", kind=kind, vocab_size=tok.vocab_size,
                               dropout=0.0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save(tmp_path / "ckpt")
    prompts = [f"who is {n} ?" for n in NAMES]
    golds = [ANSWER[n] for n in NAMES]
    before = score_answers(generate_answers(model.eval(), tok, prompts), golds)
    tuned = finetune_generation(tmp_path / "ckpt", prompts * 4, golds * 4, epochs=40,
                                batch_size=16, settings=LoopSettings(lr=5e-3, warmup_ratio=0.1))
    after = score_answers(generate_answers(tuned, tok, prompts), golds)
    # from guessing (one word for all: at most 50) to the rule, all but a name at most
    assert before["exact_match"] <= 50 and after["exact_match"] >= 85, (before, after)


def test_exact_match_and_f1_by_hand():
    scores = score_answers(["Sister.", "grand mother", "uncle"], ["sister", "grandmother",
                                                                  "great uncle"])
    assert scores["exact_match"] == pytest.approx(100 / 3)
    # F1: 1, 0 (no common token), 2 * (1 * 0.5) / 1.5 = 2/3
    assert scores["f1"] == pytest.approx(100 * (1 + 0 + 2 / 3) / 3)
    with pytest.raises(FolnetError, match="one prediction per answer"):
        score_answers(["a"], [])


def test_an_encoder_checkpoint_is_refused(tmp_path, tok):
    model = folnet.build_model("j.a", preset="tiny", vocab_size=tok.vocab_size)
    model.save_pretrained(tmp_path / "enc")
    tok.save(tmp_path / "enc")
    with pytest.raises(FolnetError, match="needs a decoder or an encoder-decoder; this is an "
                                          "encoder"):
        finetune_generation(tmp_path / "enc", ["a"], ["b"])
    code = folnet_main(["finetune", "--task", "kinship/generate", "--from", str(tmp_path / "enc"),
                        "--out", str(tmp_path / "out"), "--no-progress"])
    assert code != 0 and not (tmp_path / "out" / "eval.json").exists()


# -- the generation tasks ------------------------------------------------------------------

def test_a_split_as_prompts_and_answers_by_hand(tok):
    from folnet.train.tasks import Example, SplitData, family_of, get_task
    from folnet.train.tasks.generation import answer_rows, pad_rows

    spec = get_task("clutrr/generate")
    spec = dataclasses.replace(spec, labels=("brother", "sister"))
    story = "who is bob ? " * 10
    examples = (Example("a", story, "who is alice ?", "sister"),
                Example("b", "who is bob ?", None, None))
    split = family_of(spec).encode(spec, SplitData(spec, "test", (), examples), tok.tokenizer,
                                   {"max_len": 12})
    answer = [*tok.encode("sister"), tok.sep_id]
    room = 1 + max(len(tok.encode(w)) for w in ("brother", "sister"))
    prompt = tok.encode(f"{story} who is alice ?")[-(12 - room):]  # its end: the question
    assert split.tensors["prompt_ids"][0, :len(prompt)].tolist() == prompt
    assert split.tensors["prompt_mask"][0].sum() == len(prompt)
    assert split.tensors["prompt_ids"][1, :3].tolist() == tok.encode("who is bob ?")[:3]
    assert split.tensors["answer_ids"][0, :len(answer)].tolist() == answer
    assert split.tensors["answer_mask"].sum(-1).tolist() == [len(answer), 0]
    # generated rows: an answer, [SEP], then anything; and one that never ends
    made, _ = pad_rows([[*tok.encode("sister"), tok.sep_id, 7, 7],
                        [*tok.encode("brother"), *tok.encode("brother")]], tok.pad_id)
    assert answer_rows(made, split.context) == ["sister", "brother brother"]


def test_a_label_is_named_as_its_decoded_text_and_scored_by_hand():
    from folnet.train.tasks import Example, SplitData, get_task
    from folnet.train.tasks.generation import encode_prompts, pad_rows, score_generation

    words = ["son-in-law", "sister", "brother", "the", "of"]
    wordpiece = train_tokenizer(texts=[" ".join(words)] * 20, vocab_size=80)
    spec = get_task("clutrr/generate")
    spec = dataclasses.replace(spec, labels=("brother", "sister", "son-in-law"))
    examples = tuple(Example(str(i), "the", "of", g)
                     for i, g in enumerate(["son-in-law", "sister", "brother", "sister"]))
    split = encode_prompts(spec, SplitData(spec, "test", (), examples), wordpiece.tokenizer, {})
    assert wordpiece.decode(wordpiece.encode("son-in-law")) == "son - in - law"
    said = ["son-in-law", "sister", "sister of", "the"]  # right, right, wrong, wrong
    made, _ = pad_rows([[*wordpiece.encode(w), wordpiece.sep_id] for w in said],
                       wordpiece.pad_id)
    metrics, rows = score_generation(spec, split, {"generated": made}, {})
    assert [r["prediction"] for r in rows] == ["son-in-law", "sister", "sister of", "the"]
    assert metrics["exact_match"] == pytest.approx(50.0) and metrics["accuracy"] == 0.5
    # F1: 1, 1, 0 ("sister of" and "brother" share no word), 0 ("the", an article,
    # normalises to nothing)
    assert metrics["f1"] == pytest.approx(100 * (1 + 1 + 0 + 0) / 4)


KINSHIP_RUN = ["--kinship-train-size", "48", "--kinship-test-per-k", "4", "--kinship-test-k",
               "2-4", "--max-steps", "6", "--batch-size", "8", "--lr", "3e-3",
               "--no-progress"]


def _checkpoint(where: Path, tok, kind: str) -> Path:
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", kind=kind, vocab_size=tok.vocab_size)
    model.save_pretrained(where)
    tok.save(where)
    return where


@pytest.fixture(scope="module")
def kin_tok():
    from folnet.train.data.kinship import pretraining_documents, symbolic
    from folnet.train.tasks.kinship import kinship_questions

    texts = [s for d in pretraining_documents(60, seed=0) for s in d]
    questions = kinship_questions({"kinship_train_size": 48, "kinship_test_per_k": 4})
    texts += [f"{q.story} {q.query} {q.label}" for q in map(symbolic, questions["train"])]
    return train_tokenizer(texts=texts, vocab_size=160)


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_folnet_finetune_answers_kinship_by_generation(tmp_path, kin_tok, kind):
    ckpt = _checkpoint(tmp_path / "ckpt", kin_tok, kind)
    out = tmp_path / "out"
    assert folnet_main(["finetune", "--task", "kinship/symbolic/generate", "--from", str(ckpt),
                        "--out", str(out), *KINSHIP_RUN]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["main_metric"] == "accuracy" and result["headline_split"] == "test"
    rows = read_predictions(out / "predictions" / "test.tsv")
    assert list(rows[0]) == ["id", "prediction", "label", "k"] and len(rows) == 12
    test = result["metrics"]["test"]
    right = [r["prediction"] == r["label"] for r in rows]
    assert test["exact_match"] == pytest.approx(100 * sum(right) / len(rows))
    assert test["accuracy"] == pytest.approx(sum(right) / len(rows))
    for k in (2, 3, 4):
        at = [ok for ok, r in zip(right, rows, strict=True) if r["k"] == str(k)]
        assert test[f"accuracy_k{k}"] == pytest.approx(sum(at) / len(at))
    meta = json.loads((out / "model" / "config.json").read_text())
    assert meta["task"] == "kinship/symbolic/generate" and meta["kind"] == kind
    # the saved model scores the same through folnet evaluate
    assert folnet_main(["evaluate", "--model", str(out / "model"), "--out",
                        str(tmp_path / "ev")]) == 0
    again = json.loads((tmp_path / "ev" / "eval.json").read_text())["metrics"]["test"]
    assert again == pytest.approx(test)


def test_folnet_finetune_answers_clutrr_by_generation(tmp_path, kin_tok):
    rows = [("[Anna] is the mother of [Tom].", "('Anna', 'Tom')", "son"),
            ("[Bob] is married to [Cara].", "('Bob', 'Cara')", "wife"),
            ("[Eli] is the father of [Fay].", "('Eli', 'Fay')", "daughter")]

    def table(items):
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["id", "story", "query", "target"])
        writer.writerows([f"id{i}", *r] for i, r in enumerate(items))
        return buffer.getvalue()

    data = tmp_path / "clutrr"
    data.mkdir()
    (data / "1.2_train.csv").write_text(table(rows * 4))
    (data / "1.2_test.csv").write_text(table(rows))
    ckpt = _checkpoint(tmp_path / "ckpt", kin_tok, "decoder")
    out = tmp_path / "out"
    assert folnet_main(["finetune", "--task", "clutrr/generate", "--data", str(data), "--from",
                        str(ckpt), "--out", str(out), "--max-steps", "4", "--batch-size", "4",
                        "--no-progress"]) == 0
    said = read_predictions(out / "predictions" / "test.tsv")
    assert [r["label"] for r in said] == ["son", "wife", "daughter"]
    test = json.loads((out / "eval.json").read_text())["metrics"]["test"]
    assert test["exact_match"] == pytest.approx(
        100 * sum(r["prediction"] == r["label"] for r in said) / 3)
