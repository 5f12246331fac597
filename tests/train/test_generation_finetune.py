"""Text-to-text finetuning (`folnet.train.finetune.generation`): the training rows of each kind
against a hand layout, a decoder and an encoder-decoder taught a rule they then answer by
generation, and exact match / F1 against hand counts."""

from __future__ import annotations

import pytest
import torch

import folnet
from folnet.errors import FolnetError
from folnet.train.data.tokenizer import train_tokenizer
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
    with pytest.raises(FolnetError, match="needs a decoder or an encoder-decoder; the "
                                          "checkpoint is an encoder"):
        finetune_generation(tmp_path / "enc", ["a"], ["b"])
