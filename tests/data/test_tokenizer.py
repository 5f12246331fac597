"""WordPiece tokenizer: training, special ids, pair layout, save/load round trips, errors."""

from __future__ import annotations

import json
import random

import pytest
from english import stdlib_docstrings

from folnet.errors import FolnetError
from folnet.train.data.tokenizer import (
    SPECIAL_TOKENS,
    FolnetTokenizer,
    load_tokenizer,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    paragraphs = [p for doc in stdlib_docstrings() for p in doc]
    return paragraphs[:4000]


@pytest.fixture(scope="module")
def tok(texts) -> FolnetTokenizer:
    return train_tokenizer(texts=texts, vocab_size=3000)


@pytest.fixture(scope="module")
def samples(texts) -> list[str]:
    rng = random.Random(7)
    return rng.sample(texts, 200)


def test_special_tokens_come_first(tok):
    assert SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    ids = (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id)
    assert ids == (0, 1, 2, 3, 4)
    assert tok.special_ids == frozenset(range(5))
    assert tok.vocab_size == 3000 == len(tok.vocab())
    assert tok.vocab()[:5] == list(SPECIAL_TOKENS)


def test_uncased_wordpiece(tok):
    ids = tok.encode("The Tokenizer SPLITS unbelievably long words")
    assert ids == tok.encode("the tokenizer splits unbelievably long words")
    pieces = tok.convert_ids_to_tokens(ids)
    assert any(p.startswith("##") for p in pieces)  # continuing subwords use the BERT prefix
    assert not tok.special_ids & set(ids)  # encode adds no [CLS]/[SEP]
    assert tok.decode(ids) == "the tokenizer splits unbelievably long words"


def test_literal_special_strings_stay_text(tok):
    ids = tok.encode("keep [SEP] and [MASK] as text")
    assert not tok.special_ids & set(ids)
    parsed = tok.encode("keep [SEP] and [MASK] as text", parse_special=True)
    assert tok.sep_id in parsed and tok.mask_id in parsed


def test_post_processor_layout(tok):
    pair = tok.tokenizer.encode("first segment here", "and the second one")
    a, b = tok.encode("first segment here"), tok.encode("and the second one")
    assert pair.ids == [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
    assert pair.type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    single = tok.tokenizer.encode("only one")
    assert single.ids == [tok.cls_id, *tok.encode("only one"), tok.sep_id]
    assert set(single.type_ids) == {0}


def test_save_and_load_round_trip(tok, samples, tmp_path):
    out = tok.save(tmp_path / "tok")
    assert (out / "tokenizer.json").is_file() and (out / "vocab.txt").is_file()
    vocab_lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab_lines == tok.vocab()
    from_json = load_tokenizer(out / "tokenizer.json")
    from_dir = load_tokenizer(out)
    from_vocab = load_tokenizer(out / "vocab.txt")
    for other in (from_json, from_dir, from_vocab):
        assert other.fingerprint == tok.fingerprint
        assert other.vocab_size == tok.vocab_size
        assert [other.encode(s) for s in samples] == [tok.encode(s) for s in samples]
        pair = other.tokenizer.encode("a b c", "d e")
        assert pair.type_ids == tok.tokenizer.encode("a b c", "d e").type_ids


def test_vocab_txt_casing_is_inferred(texts, tmp_path):
    cased = train_tokenizer(texts=texts[:1500], vocab_size=1500, lowercase=False)
    assert any(t != t.lower() for t in cased.vocab()[5:])
    cased.save(tmp_path)
    loaded = load_tokenizer(tmp_path / "vocab.txt")
    assert loaded.encode("Return The Value") != loaded.encode("return the value")
    assert loaded.fingerprint == cased.fingerprint
    forced = load_tokenizer(tmp_path / "vocab.txt", lowercase=True)
    assert forced.encode("Return") == forced.encode("return")


def test_fingerprint_tracks_vocabulary(tok, texts, tmp_path):
    assert len(tok.fingerprint) == 16
    assert tok.fingerprint == tok.fingerprint
    smaller = train_tokenizer(texts=texts, vocab_size=2000)
    assert smaller.fingerprint != tok.fingerprint
    tok.save(tmp_path)
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    lines[10], lines[11] = lines[11], lines[10]  # same tokens, different ids
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert load_tokenizer(tmp_path / "vocab.txt").fingerprint != tok.fingerprint


def test_train_from_files(texts, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts[:2000]), encoding="utf-8")
    tok = train_tokenizer([path], vocab_size=1200, min_frequency=3)
    assert tok.vocab_size == 1200
    assert (tok.pad_id, tok.mask_id) == (0, 4)
    assert tok.unk_id not in tok.encode(texts[0])


def test_missing_special_tokens_in_vocab_txt(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n##s\n", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"vocab\.txt.*lacks the special token\(s\) '\[MASK\]'"):
        load_tokenizer(path)


def test_missing_special_tokens_in_tokenizer_json(tok, tmp_path):
    tok.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    config["added_tokens"] = [
        t for t in config["added_tokens"] if t["content"] not in ("[PAD]", "[MASK]")
    ]
    vocab = config["model"]["vocab"]
    for name in ("[PAD]", "[MASK]"):
        vocab[f"unused{vocab.pop(name)}"] = len(vocab) + 10_000  # keep ids, drop the names
    config["post_processor"] = None
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(FolnetError) as info:
        load_tokenizer(broken)
    message = str(info.value)
    assert "broken.json" in message and "'[PAD]'" in message and "'[MASK]'" in message
    assert "'[CLS]'" not in message


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FolnetError, match=r"tokenizer file .*nope\.json.* does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(FolnetError, match=r"neither tokenizer\.json nor vocab\.txt"):
        load_tokenizer(tmp_path)
    garbage = tmp_path / "tokenizer.json"
    garbage.write_text("{not json", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"cannot read tokenizer file .*tokenizer\.json"):
        load_tokenizer(garbage)
    other = tmp_path / "vocab.bin"
    other.write_bytes(b"\x00\x01")
    with pytest.raises(FolnetError, match=r"vocab\.bin.*unknown type '\.bin'"):
        load_tokenizer(other)
    empty = tmp_path / "empty" / "vocab.txt"
    empty.parent.mkdir()
    empty.write_text("", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"vocabulary file .*vocab\.txt.* is empty"):
        load_tokenizer(empty.parent)


def test_train_errors(tmp_path):
    with pytest.raises(FolnetError, match="needs `files` or `texts`"):
        train_tokenizer()
    with pytest.raises(FolnetError, match="vocab_size must exceed 5"):
        train_tokenizer(texts=["a b"], vocab_size=5)
    with pytest.raises(FolnetError, match="min_frequency must be a positive integer"):
        train_tokenizer(texts=["a b"], min_frequency=0)
    with pytest.raises(FolnetError, match=r"training file .*missing\.txt.* does not exist"):
        train_tokenizer([tmp_path / "missing.txt"])
    with pytest.raises(FolnetError, match="training corpus is empty"):
        train_tokenizer(texts=[], vocab_size=100)


_TRAIN_AND_PRINT = """
import json, sys
from folnet.train.data.kinship import pretraining_documents
from folnet.train.data.tokenizer import train_tokenizer
docs = pretraining_documents(300)
tok = train_tokenizer(texts=(s for d in docs for s in d), vocab_size=400)
print(json.dumps(tok.vocab()))
"""


def test_training_is_deterministic_across_processes():
    # The `tokenizers` trainer numbers continuing pieces in hash-map order, which differs from
    # process to process; the vocabularies of separate processes must still be identical.
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", _TRAIN_AND_PRINT], capture_output=True,
                           text=True, check=True, timeout=120).stdout for _ in range(3)]
    vocabs = [json.loads(out) for out in runs]
    assert len(vocabs[0]) == 400 and vocabs[0][:5] == list(SPECIAL_TOKENS)
    assert vocabs[0] == vocabs[1] == vocabs[2]
    # the pieces registered to fix the ids are ordinary word pieces, not special tokens
    from folnet.train.data.kinship import pretraining_documents

    docs = pretraining_documents(300)
    tok = train_tokenizer(texts=[s for d in docs for s in d], vocab_size=400)
    assert tok.vocab() == vocabs[0]
    assert "##a" in tok.vocab()
    assert {t.content for t in tok.tokenizer.get_added_tokens_decoder().values()} == set(
        SPECIAL_TOKENS)


def test_texts_may_be_a_factory_read_twice():
    calls = []

    def texts():
        calls.append(1)
        return iter(["the cat sat on the mat", "the dog sat on the log"] * 5)

    tok = train_tokenizer(texts=texts, vocab_size=60)
    assert len(calls) == 2  # the alphabet pass and the training pass
    assert tok.encode("the cat") == [tok.tokenizer.token_to_id("the"),
                                     tok.tokenizer.token_to_id("cat")]
