"""The byte-level BPE tokenizer (`folnet.train.data.bpe`): exact round trips, one vocabulary
whatever the process, folnet's special ids, no special token around a single text, and the
saved directory as transformers loads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from folnet.errors import FolnetError
from folnet.train.data.bpe import MIN_BPE_VOCAB, train_bpe_tokenizer
from folnet.train.data.tokenizer import SPECIAL_TOKENS, load_tokenizer

TEXTS = ["The mother of Alice is Carol.", "Bob is the son-in-law of Dave.",
         "Erin's grandfather, Frank, lives in Zürich -- naïvely!"] * 40
HARD = ["  two  spaces, a tab\there, a new\nline", "emoji 🙂 and 中文 and ﬁ ligature",
        "ALL CAPS and MiXeD", "", "son-in-law's (sister)?", "1,234.5e-6 %$#@"]


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(texts=TEXTS, vocab_size=400)


def test_every_text_round_trips_and_decodes_as_text(tok):
    for text in TEXTS[:3] + HARD:
        ids = tok.encode(text)
        assert tok.decode(ids) == text, text
    assert tok.decode(tok.encode("Bob is the son-in-law of Dave.")) == \
        "Bob is the son-in-law of Dave."  # no "son - in - law", no "##"


def test_the_specials_keep_their_ids_and_a_single_text_gets_none(tok):
    assert [tok.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.pad_id, tok.cls_id, tok.sep_id) == (0, 2, 3) and not tok.wordpiece
    single = tok.tokenizer.encode("Bob is here.")
    assert single.ids == tok.encode("Bob is here.")  # no [CLS]/[SEP] around a prompt
    pair = tok.tokenizer.encode("Bob.", "Carol.")
    assert tok.sep_id in pair.ids and tok.cls_id not in pair.ids
    assert tok.vocab_size <= 400


def test_the_same_texts_give_the_same_vocabulary_in_another_process(tok, tmp_path):
    again = train_bpe_tokenizer(texts=TEXTS, vocab_size=400)
    assert again.tokenizer.to_str() == tok.tokenizer.to_str()
    code = ("import sys; from folnet.train.data.bpe import train_bpe_tokenizer; "
            f"t = train_bpe_tokenizer(texts={TEXTS!r}, vocab_size=400); t.save(sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "other")], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert load_tokenizer(tmp_path / "other").fingerprint == tok.fingerprint


def test_the_saved_directory_loads_in_folnet_and_transformers(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok.save(tmp_path / "tok")
    assert not (tmp_path / "tok" / "vocab.txt").exists()  # a BPE is its merges too
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"]) == ("[CLS]", "[SEP]")
    again = load_tokenizer(tmp_path / "tok")
    assert again.fingerprint == tok.fingerprint and again.encode("Zürich") == tok.encode("Zürich")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    text = "Erin's grandfather, Frank."
    assert hf(text)["input_ids"] == tok.encode(text)  # no specials added to a prompt
    assert hf.decode(hf(text)["input_ids"]) == text
    assert hf.eos_token_id == tok.sep_id


def test_span_sentinels_are_special_tokens_that_transformers_loads(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    with_them = tok.with_sentinels(100)
    ids = with_them.sentinel_ids
    assert ids == list(range(tok.vocab_size, tok.vocab_size + 100)) and tok.sentinel_ids == []
    text = "Erin <extra_id_3> Frank."
    assert with_them.encode(text) == tok.encode(text)  # never parsed out of text
    said = with_them.decode([*tok.encode("Erin"), ids[3], *tok.encode(" Frank")])
    assert "<extra_id_3>" in said
    assert with_them.decode([ids[3], *tok.encode("Frank")], skip_special_tokens=True) == "Frank"
    with_them.save(tmp_path / "s")
    again = load_tokenizer(tmp_path / "s")
    assert again.sentinel_ids == ids and again.fingerprint == with_them.fingerprint
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "s"))
    assert hf.convert_tokens_to_ids("<extra_id_7>") == ids[7]
    assert "<extra_id_99>" in hf.all_special_tokens  # additional_special_tokens, as 4.x names it
    assert len(hf) == with_them.vocab_size


def test_a_documents_sentences_end_to_end_decode_as_its_text(tok):
    from folnet.train.data.pairs import tokenise_documents

    document = ["Erin's grandfather is Frank.", "Frank has a sister, Ada.", "Ada sings."]
    (arrays,) = tokenise_documents([document], tok)
    ids = [int(t) for a in arrays for t in a]
    assert tok.decode(ids) == " ".join(document)  # a space between sentences, no other


def test_bad_sizes_and_an_empty_corpus_are_refused():
    with pytest.raises(FolnetError, match=f"at least {MIN_BPE_VOCAB} for a byte-level BPE"):
        train_bpe_tokenizer(texts=TEXTS, vocab_size=100)
    with pytest.raises(FolnetError, match="the training corpus is empty"):
        train_bpe_tokenizer(texts=[], vocab_size=400)
