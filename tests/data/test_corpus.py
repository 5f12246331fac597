"""Pretraining data: sources, sentence splitting, NSP/SOP pairs, layout, cache, streaming."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from english import stdlib_docstrings, write_english_corpus

from folnet.errors import FolnetError
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.corpus import PretrainingDataset, build_pretraining_dataset
from folnet.train.data.documents import iter_documents, split_sentences
from folnet.train.data.streaming import StreamingPretrainingDataset, iter_pretraining_examples
from folnet.train.data.tokenizer import train_tokenizer

STORY = re.compile(r"story (\d+) line (\d+) is here")


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    return write_english_corpus(tmp_path_factory.mktemp("en") / "english.txt", 1_500_000)


@pytest.fixture(scope="module")
def tok(english):
    return train_tokenizer([english], vocab_size=6000)


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    """300 documents of 10 numbered sentences: order and origin are visible after decoding."""
    path = tmp_path_factory.mktemp("stories") / "stories.txt"
    docs = [" ".join(f"Story {d} line {j} is here." for j in range(10)) for d in range(300)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def check_layout(example, tok, seq_len):
    ids, types, att = example["input_ids"], example["token_type_ids"], example["attention_mask"]
    assert ids.shape == types.shape == att.shape == (seq_len,)
    assert (ids.dtype, types.dtype, att.dtype) == (torch.long, torch.long, torch.bool)
    assert example["nsp_labels"].shape == () and example["nsp_labels"].item() in (0, 1)
    assert ids[0] == tok.cls_id and (ids[1:] != tok.cls_id).all()
    seps = (ids == tok.sep_id).nonzero().flatten().tolist()
    assert len(seps) == 2
    first, second = seps
    assert 1 < first < second - 1  # A and B both non-empty
    assert (types[: first + 1] == 0).all() and (types[first + 1 : second + 1] == 1).all()
    assert (types[second + 1 :] == 0).all()
    assert torch.equal(~att, ids == tok.pad_id)
    assert (ids[second + 1 :] == tok.pad_id).all() and att[: second + 1].all()


def stories_in(tok, ids):
    return [(int(s), int(j)) for s, j in STORY.findall(tok.decode(ids))]


def story_pairs(dataset, tok):
    """(story sentences of A, of B, label) for each pair of ``dataset`` whose two sides both
    hold story sentences."""
    for i in range(len(dataset)):
        a, b, label = dataset.pair(i)
        sa, sb = stories_in(tok, a), stories_in(tok, b)
        if sa and sb:
            yield sa, sb, label


# -- text sources --------------------------------------------------------------------------------


def test_english_corpus_is_large_real_and_deterministic(tmp_path):
    stdlib_docstrings.cache_clear()
    start = time.perf_counter()
    path = write_english_corpus(tmp_path / "a.txt")
    assert time.perf_counter() - start < 20
    data = path.read_bytes()
    assert 1_000_000 < len(data) <= 3_000_000
    text = data.decode("utf-8")
    ordinary = sum(c.isascii() and (c.isalnum() or c in " \n.,;:'\"()-") for c in text)
    assert ordinary / len(text) > 0.95
    words = re.findall(r"[a-z]+", text.lower())
    top = [w for w, _ in Counter(words).most_common(12)]
    assert {"the", "of", "to", "a", "is"} <= set(top)
    assert Counter(words)["the"] / len(words) > 0.03
    assert write_english_corpus(tmp_path / "b.txt").read_bytes() == data
    small = write_english_corpus(tmp_path / "c.txt", max_bytes=50_000).read_bytes()
    assert 40_000 < len(small) <= 50_000 and data.startswith(small)
    assert len(list(iter_documents(path))) > 1000
    with pytest.raises(FolnetError, match="max_bytes must be a positive integer"):
        write_english_corpus(tmp_path / "d.txt", max_bytes=0)


def test_split_sentences():
    assert split_sentences("Dr. Smith went home. He slept!  Did he? Yes.") == [
        "Dr. Smith went home.",
        "He slept!",
        "Did he?",
        "Yes.",
    ]
    text = 'Use 3.5 mm, e.g. this one. J. R. R. Tolkien wrote it. "Stop." Then (quietly.) Go'
    assert split_sentences(text) == [
        "Use 3.5 mm, e.g. this one.",
        "J. R. R. Tolkien wrote it.",
        '"Stop."',
        "Then (quietly.)",
        "Go",
    ]
    assert split_sentences("no boundary. here because lower case") == [
        "no boundary. here because lower case"
    ]
    assert split_sentences("line one\n  line two.  Three\n\n \n") == [
        "line one",
        "line two.",
        "Three",
    ]
    assert split_sentences("   ") == []


def test_every_source_format_reads_the_same_documents(tmp_path):
    docs = [f"Doc {d} opens. It has a middle! Does it end? Yes." for d in range(30)]
    expected = [split_sentences(d) for d in docs]
    (tmp_path / "c.txt").write_text("\n\n\n".join(docs), encoding="utf-8")
    lines = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs))
    (tmp_path / "c.jsonl").write_text(lines, encoding="utf-8")
    (tmp_path / "c.json").write_text(json.dumps([{"text": d} for d in docs]), encoding="utf-8")
    import datasets

    datasets.Dataset.from_dict({"text": docs}).to_parquet(str(tmp_path / "c.parquet"))

    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})}).save_to_disk(
        str(tmp_path / "saved_dict")
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("\n\n".join(docs[:10]), encoding="utf-8")
    (folder / "b.jsonl").write_text(lines.split("\n", 10)[-1], encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    for name in ("c.txt", "c.jsonl", "c.json", "c.parquet", "saved", "saved_dict", "folder"):
        assert list(iter_documents(tmp_path / name)) == expected, name
    both = list(iter_documents([tmp_path / "c.txt", str(tmp_path / "c.jsonl")]))
    assert both == expected + expected


def test_kinship_source(tok):
    from folnet.train.data.kinship import pretraining_documents

    assert list(iter_documents("kinship", kinship_documents=20, seed=4)) == [
        [" ".join(s.split()) for s in doc] for doc in pretraining_documents(20, seed=4)
    ]
    config = PretrainDataConfig(seq_len=64, kinship_documents=150, seed=4)
    dataset = build_pretraining_dataset("kinship", tok, config)
    assert dataset.num_documents == 150 and len(dataset) > 150
    for i in range(0, len(dataset), 7):
        check_layout(dataset[i], tok, 64)
    assert 0.35 < dataset.labels.mean() < 0.65
    streamed = iter_pretraining_examples("kinship", tok, config, document_window=16)
    check_layout(next(streamed), tok, 64)


# -- pairs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_layout_and_label_balance_on_real_text(english, tok, objective):
    config = PretrainDataConfig(objective=objective, seq_len=128, seed=1)
    dataset = build_pretraining_dataset(english, tok, config)
    assert isinstance(dataset, PretrainingDataset) and len(dataset) >= 2000
    assert dataset.cache_status == "disabled"
    for i in range(0, len(dataset), 2):
        check_layout(dataset[i], tok, 128)
    labels = np.asarray(dataset.labels)
    assert abs(labels.mean() - 0.5) < 0.05
    lengths = [int(dataset[i]["attention_mask"].sum()) for i in range(len(dataset))]
    assert max(lengths) == 128 and min(lengths) < 40  # full pairs and some short_seq_prob ones


def test_nsp_pairs_continue_or_come_from_elsewhere(stories, tok):
    dataset = build_pretraining_dataset(stories, tok, PretrainDataConfig(seq_len=48, seed=2))
    checked = Counter()
    for sa, sb, label in story_pairs(dataset, tok):
        checked[label] += 1
        if label == 0:  # is next: same story, B right after A
            assert {s for s, _ in sa} == {s for s, _ in sb} and len({s for s, _ in sa}) == 1
            assert max(j for _, j in sa) < min(j for _, j in sb)
        else:  # not next: B from another story
            assert {s for s, _ in sa}.isdisjoint(s for s, _ in sb)
    assert checked[0] > 300 and checked[1] > 300
    assert sum(checked.values()) > 0.9 * len(dataset)


def test_sop_swapped_pairs_are_swapped(stories, tok):
    config = PretrainDataConfig(seq_len=48, objective="sop", seed=2)
    dataset = build_pretraining_dataset(stories, tok, config)
    checked = Counter()
    for sa, sb, label in story_pairs(dataset, tok):
        checked[label] += 1
        assert len({s for s, _ in sa + sb}) == 1  # SOP never leaves the document
        if label == 0:
            assert max(j for _, j in sa) < min(j for _, j in sb)
        else:
            assert min(j for _, j in sa) > max(j for _, j in sb)
    assert checked[0] > 200 and checked[1] > 200
    assert sum(checked.values()) > 0.9 * len(dataset)


def test_deterministic_by_seed(stories, tok):
    def build(seed):
        return build_pretraining_dataset(stories, tok, PretrainDataConfig(seq_len=48, seed=seed))

    a, b, c = build(5), build(5), build(6)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.labels, b.labels)
    assert all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(0, len(a), 9))
    assert not np.array_equal(a.labels[: len(c)], c.labels[: len(a)])


# -- cache ---------------------------------------------------------------------------------------


def test_cache_is_reused_and_invalidated(tmp_path, tok, monkeypatch):
    corpus = tmp_path / "stories.txt"
    corpus.write_text(
        "\n\n".join(f"Story {d} begins. Then it goes on. It ends." for d in range(200)),
        encoding="utf-8",
    )
    calls = []
    original = tok.encode_batch
    monkeypatch.setattr(tok, "encode_batch", lambda texts: calls.append(1) or original(texts))
    config = PretrainDataConfig(seq_len=32, cache_dir=tmp_path / "cache")

    first = build_pretraining_dataset(corpus, tok, config)
    assert first.cache_status == "miss" and not first.from_cache and calls
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()) == [
        "corpus",
        "examples",
    ]
    calls.clear()
    second = build_pretraining_dataset(corpus, tok, config)
    assert second.from_cache and second.cache_status == "examples" and not calls
    assert isinstance(second.tokens, np.memmap)
    assert len(second) == len(first) and second.num_documents == 200
    assert all(torch.equal(first[i]["input_ids"], second[i]["input_ids"]) for i in range(50))

    # a different seq_len re-pairs from the cached tokens without calling the tokenizer
    third = build_pretraining_dataset(
        corpus, tok, PretrainDataConfig(seq_len=16, cache_dir=config.cache_dir)
    )
    assert third.cache_status == "corpus" and not calls
    # masking options do not affect the examples: same entry
    masking_only = PretrainDataConfig(seq_len=32, cache_dir=config.cache_dir, max_predictions=5)
    assert build_pretraining_dataset(corpus, tok, masking_only).from_cache

    # editing the corpus invalidates both levels
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("\n\nA new story starts. And it ends.\n")
    fourth = build_pretraining_dataset(corpus, tok, config)
    assert fourth.cache_status == "miss" and calls and fourth.num_documents == 201


# -- streaming -----------------------------------------------------------------------------------


def test_streaming_yields_valid_balanced_examples(english, tok):
    config = PretrainDataConfig(seq_len=128, seed=3)
    stream = iter_pretraining_examples(english, tok, config, document_window=200)
    examples = [next(stream) for _ in range(1200)]
    for example in examples:
        check_layout(example, tok, 128)
    labels = torch.stack([e["nsp_labels"] for e in examples]).float()
    assert abs(labels.mean().item() - 0.5) < 0.05
    mapped = build_pretraining_dataset(english, tok, config)
    stream_len = np.mean([e["attention_mask"].sum().item() for e in examples])
    map_len = np.mean([mapped[i]["attention_mask"].sum().item() for i in range(0, 3000, 3)])
    assert abs(stream_len - map_len) / map_len < 0.1  # same pairing, same length profile

    again = iter_pretraining_examples(english, tok, config, document_window=200)
    assert all(torch.equal(next(again)["input_ids"], e["input_ids"]) for e in examples[:50])
    other = iter_pretraining_examples(english, tok, config, document_window=200, epoch=1)
    assert not all(torch.equal(next(other)["input_ids"], e["input_ids"]) for e in examples[:50])


def test_streaming_is_lazy(tmp_path, tok):
    good = tmp_path / "a-good.jsonl"
    good.write_text("".join(
        json.dumps({"text": f"Part {d} one. Part two. Part three."}) + "\n" for d in range(1000)
    ), encoding="utf-8")  # well past the 256-document tokenising batch
    (tmp_path / "b-broken.jsonl").write_text('{"text": "fine."}\n{broken\n', encoding="utf-8")
    config = PretrainDataConfig(seq_len=24, streaming=True)
    stream = iter_pretraining_examples(tmp_path, tok, config, document_window=4, shuffle_buffer=1)
    check_layout(next(stream), tok, 24)  # served before the broken file is ever read
    with pytest.raises(FolnetError, match=r"cannot read '.*b-broken\.jsonl' as json: JSON parse"):
        list(stream)


def test_streaming_dataset_with_dataloader(stories, tok):
    config = PretrainDataConfig(seq_len=48, objective="sop", streaming=True)
    dataset = build_pretraining_dataset(stories, tok, config)
    assert isinstance(dataset, StreamingPretrainingDataset)
    batch = next(iter(DataLoader(dataset, batch_size=16)))
    assert batch["input_ids"].shape == (16, 48) and batch["nsp_labels"].shape == (16,)
    total = sum(1 for _ in dataset)
    dataset.set_epoch(1)
    assert total > 300 and sum(1 for _ in dataset) > 300
    halves = [list(iter_pretraining_examples(stories, tok, config, shard=(k, 2))) for k in range(2)]
    assert all(len(h) > 100 for h in halves)


# -- errors --------------------------------------------------------------------------------------


def test_source_errors(tmp_path, tok):
    config = PretrainDataConfig(seq_len=32)
    with pytest.raises(FolnetError, match=r"corpus path '.*nope\.txt' does not exist"):
        build_pretraining_dataset(tmp_path / "nope.txt", tok, config)
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"corpus file '.*empty\.txt' is empty"):
        build_pretraining_dataset(tmp_path / "empty.txt", tok, config)
    (tmp_path / "hollow").mkdir()
    (tmp_path / "hollow" / "readme.md").write_text("x", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"corpus directory '.*hollow' is empty"):
        build_pretraining_dataset(tmp_path / "hollow", tok, config)
    (tmp_path / "data.docx").write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"data\.docx' has unsupported type '\.docx'; expected"):
        build_pretraining_dataset(tmp_path / "data.docx", tok, config)
    (tmp_path / "data.parquet.gz").write_text("x", encoding="utf-8")
    with pytest.raises(FolnetError, match=r"unsupported type '\.parquet\.gz'"):
        build_pretraining_dataset(tmp_path / "data.parquet.gz", tok, config)
    with pytest.raises(FolnetError, match=r"corpus pattern '.*\*\.jsonl' matches no file .*"
                                          r"\(0 match\(es\) in all\)"):
        build_pretraining_dataset(str(tmp_path / "*.jsonl"), tok, config)
    with pytest.raises(FolnetError, match="empty list"):
        build_pretraining_dataset([], tok, config)


def test_unusable_corpus_errors(tmp_path, tok):
    one_liners = tmp_path / "short.txt"
    one_liners.write_text("\n\n".join(f"Only sentence {i}." for i in range(50)), encoding="utf-8")
    for objective in ("nsp", "sop"):
        with pytest.raises(FolnetError, match=r"short\.txt' has no usable document: 50 non-emp"):
            build_pretraining_dataset(one_liners, tok, PretrainDataConfig(objective=objective))
    single = tmp_path / "single.txt"
    single.write_text("One doc. With two sentences. And three.\n", encoding="utf-8")
    with pytest.raises(FolnetError, match="single document; NSP needs at least 2"):
        build_pretraining_dataset(single, tok, PretrainDataConfig())
    assert len(build_pretraining_dataset(single, tok, PretrainDataConfig(objective="sop"))) == 1
    with pytest.raises(FolnetError, match="single document; NSP needs at least 2"):
        list(iter_pretraining_examples(single, tok, PretrainDataConfig()))
    with pytest.raises(FolnetError, match="no usable document"):
        list(iter_pretraining_examples(one_liners, tok, PretrainDataConfig()))
    with pytest.raises(FolnetError, match=r"shard must be \(index, count\)"):
        iter_pretraining_examples(single, tok, PretrainDataConfig(), shard=(2, 2))


def test_malformed_records(tmp_path, tok):
    import datasets

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "No text. At all."}\n{"body": "no text"}\n', encoding="utf-8")
    with pytest.raises(FolnetError, match=r"bad\.jsonl' has no column 'text' \(columns: "
                                          r"\['body'\]\); pick one with --text-column"):
        list(iter_documents(bad))
    assert list(iter_documents(bad, text_column="body")) == [["No text.", "At all."], ["no text"]]
    mixed = tmp_path / "mixed.jsonl"  # a record without the column reads as null: skipped
    mixed.write_text('{"text": "Fine. Fine."}\n{"body": "x"}\n{"text": "Ok."}\n', encoding="utf-8")
    assert list(iter_documents(mixed)) == [["Fine.", "Fine."], ["Ok."]]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"text": "a"}, ', encoding="utf-8")
    with pytest.raises(FolnetError, match=r"cannot read '.*broken\.json' as json"):
        list(iter_documents(broken))
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": "Fine."}\n{"text": 7}\n', encoding="utf-8")
    with pytest.raises(FolnetError, match=r"numbers\.jsonl' record 2: column 'text' holds int 7"):
        list(iter_documents(numbers))
    datasets.Dataset.from_dict({"body": ["x"]}).to_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(FolnetError, match=r"t\.parquet' has no column 'text' \(columns: "
                                          r"\['body'\]\)"):
        list(iter_documents(tmp_path / "t.parquet"))
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(FolnetError, match=r"saved' has no column 'text' \(columns: \['body'\]"):
        list(iter_documents(tmp_path / "saved"))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("seq_len", 4, r"seq_len must be an integer >= 8, got 4"),
        ("seq_len", True, r"seq_len must be an integer >= 8"),
        ("objective", "mlm",
         r"objective must be 'nsp', 'sop', 'clm', 'prefix' or 'span', got 'mlm'"),
        ("mlm_probability", 0.0, r"mlm_probability must lie in \(0, 1\), got 0.0"),
        ("mlm_probability", 1.2, r"mlm_probability must lie in \(0, 1\)"),
        ("short_seq_prob", 1.0, r"short_seq_prob must lie in \[0, 1\)"),
        ("max_predictions", 0, r"max_predictions must be an integer >= 1"),
        ("kinship_documents", 0, r"kinship_documents must be an integer >= 1"),
        ("seed", -1, r"seed must be an integer >= 0"),
        ("streaming", "yes", r"streaming must be a bool"),
    ],
)
def test_config_errors(field, value, message):
    with pytest.raises(FolnetError, match=f"PretrainDataConfig.{message}"):
        PretrainDataConfig(**{field: value})
