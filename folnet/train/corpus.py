"""Pretraining examples: BERT segment pairs for NSP or SOP, cached on disk or streamed.

Layout of every example (length `seq_len`):

    input_ids       [CLS] a1 .. an [SEP] b1 .. bm [SEP] [PAD] ..
    token_type_ids    0   0  ..  0   0    1  ..  1   1    0   ..
    attention_mask    1   1  ..  1   1    1  ..  1   1    0   ..

A and B are runs of whole sentences from one document, truncated (token by token, from the
longer side, at a random end) to fit. Labels, stored as `nsp_labels` for both objectives:

* NSP: 0 = B is the true continuation of A ("is next"), 1 = B comes from another random
  document ("not next"); each with probability 1/2.
* SOP: A and B are always consecutive; 0 = original order, 1 = swapped; each with
  probability 1/2.

The dataset holds no MLM masks: `folnet.train.masking.PretrainingCollator` draws a new mask
each time an example is batched (dynamic masking).

Why two caches: tokenising is the expensive step and depends only on the corpus and the
tokenizer, while pairing depends on `seq_len`, `objective`, `short_seq_prob` and `seed`. So
`cache_dir/corpus-<key>/` keeps the tokenised sentences and `cache_dir/examples-<key>/` the
pairs; changing `seq_len` re-pairs without re-tokenising.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from folnet.errors import FolnetError, choices
from folnet.train.textsource import (
    CorpusSource,
    iter_documents,
    read_documents,
    resolve_sources,
    source_signature,
    split_sentences,
)
from folnet.train.tokenizer import FolnetTokenizer

__all__ = [
    "OBJECTIVES",
    "PretrainDataConfig",
    "PretrainingDataset",
    "StreamingPretrainingDataset",
    "build_pretraining_dataset",
    "iter_documents",
    "iter_pretraining_examples",
    "split_sentences",
]

OBJECTIVES = ("nsp", "sop")
_CACHE_FORMAT = 1  # bump when the on-disk layout or the pairing algorithm changes
Example = dict[str, torch.Tensor]
Document = list[np.ndarray]  # one int array of token ids per sentence


@dataclass(frozen=True)
class PretrainDataConfig:
    """How to turn a corpus into pretraining examples (and how to mask them later).

    `mlm_probability` and `max_predictions` are read by the collator, not the dataset; they
    are here so that one config describes the whole data side of a run.
    """

    seq_len: int = 128
    objective: str = "nsp"
    mlm_probability: float = 0.15
    max_predictions: int = 20
    short_seq_prob: float = 0.1
    seed: int = 0
    cache_dir: str | os.PathLike[str] | None = None
    streaming: bool = False
    kinship_documents: int = 2000

    def __post_init__(self) -> None:
        def integer(name: str, low: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FolnetError(
                    f"PretrainDataConfig.{name} must be an integer >= {low}, got {value!r}"
                )

        integer("seq_len", 8)
        integer("max_predictions", 1)
        integer("kinship_documents", 1)
        integer("seed", 0)
        if self.objective not in OBJECTIVES:
            raise FolnetError(
                f"PretrainDataConfig.objective must be {choices(OBJECTIVES)}, "
                f"got {self.objective!r}"
            )
        p = self.mlm_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
            raise FolnetError(f"PretrainDataConfig.mlm_probability must lie in (0, 1), got {p!r}")
        p = self.short_seq_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise FolnetError(f"PretrainDataConfig.short_seq_prob must lie in [0, 1), got {p!r}")
        if not isinstance(self.streaming, bool):
            raise FolnetError(
                f"PretrainDataConfig.streaming must be a bool, got {self.streaming!r}"
            )


# -- pairing -----------------------------------------------------------------------------------


def _take(document: Document, start: int, target: int) -> np.ndarray:
    """Whole sentences from `start` on until at least `target` tokens (or the end)."""
    pieces, length = [], 0
    for sentence in document[start:]:
        pieces.append(sentence)
        length += len(sentence)
        if length >= target:
            break
    return np.concatenate(pieces)


def _truncate(
    a: np.ndarray, b: np.ndarray, limit: int, rng: random.Random
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's truncation in closed form: drop tokens from the longer side (B on ties), each
    from the front or the back with probability 1/2."""
    excess = len(a) + len(b) - limit
    if excess <= 0:
        return a, b
    diff = len(a) - len(b)
    first = min(abs(diff), excess)
    cut_a, cut_b = (first, 0) if diff > 0 else (0, first)
    rest = excess - first
    cut_a, cut_b = cut_a + rest // 2, cut_b + (rest + 1) // 2

    def cut(x: np.ndarray, n: int) -> np.ndarray:
        front = rng.getrandbits(n).bit_count() if n else 0  # Binomial(n, 1/2)
        return x[front : len(x) - (n - front)]

    return cut(a, cut_a), cut(b, cut_b)


def _pairs(
    document: Document,
    config: PretrainDataConfig,
    rng: random.Random,
    other_document: Callable[[], Document],
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """BERT's create_instances_from_document, with one change: a chunk is only closed once
    it has two sentences (a lone final sentence is dropped), so every example gets a fair
    coin for its label and NSP/SOP stay balanced."""
    limit = config.seq_len - 3  # room for [CLS], [SEP], [SEP]
    target = rng.randint(2, limit) if rng.random() < config.short_seq_prob else limit
    chunk: Document = []
    length, i = 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if (length >= target and len(chunk) >= 2) or i == len(document) - 1:
            if len(chunk) >= 2:
                a_end = rng.randint(1, len(chunk) - 1)
                a = np.concatenate(chunk[:a_end])
                if config.objective == "nsp" and rng.random() < 0.5:
                    other = other_document()
                    b = _take(other, rng.randrange(len(other)), max(1, target - len(a)))
                    label = 1
                    i -= len(chunk) - a_end  # the unused sentences start the next chunk
                else:
                    b = np.concatenate(chunk[a_end:])
                    label = 0
                    if config.objective == "sop" and rng.random() < 0.5:
                        a, b, label = b, a, 1
                a, b = _truncate(a, b, limit, rng)
                yield a, b, label
            chunk, length = [], 0
        i += 1


class _Layout:
    """Turns (A, B, label) into the padded tensors of one example."""

    def __init__(self, tokenizer: FolnetTokenizer, seq_len: int) -> None:
        self.cls, self.sep, self.pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
        self.seq_len = seq_len
        self.positions = np.arange(seq_len)

    def __call__(self, a: np.ndarray, b: np.ndarray, label: int) -> Example:
        la, lb, t = len(a), len(b), self.seq_len
        used = la + lb + 3
        ids = np.full(t, self.pad, dtype=np.int64)  # [T]
        ids[0], ids[la + 1], ids[used - 1] = self.cls, self.sep, self.sep
        ids[1 : la + 1] = a
        ids[la + 2 : used - 1] = b
        types = np.zeros(t, dtype=np.int64)  # [T]
        types[la + 2 : used] = 1
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy(self.positions < used),  # [T] bool
            "nsp_labels": torch.tensor(label, dtype=torch.long),
        }


# -- tokenising --------------------------------------------------------------------------------


def _tokenise(
    documents: Iterable[list[str]], tokenizer: FolnetTokenizer, batch_documents: int = 256
) -> Iterator[Document]:
    """Documents of sentences -> documents of id arrays; empty sentences/documents dropped.
    Sentences of `batch_documents` documents go to the Rust tokenizer in one call."""
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    batch: list[list[str]] = []

    def flush() -> Iterator[Document]:
        flat = [sentence for document in batch for sentence in document]
        ids = iter(tokenizer.encode_batch(flat))
        for document in batch:
            arrays = [np.asarray(next(ids), dtype=dtype) for _ in document]
            arrays = [a for a in arrays if len(a)]
            if arrays:
                yield arrays

    for document in documents:
        batch.append(document)
        if len(batch) >= batch_documents:
            yield from flush()
            batch = []
    yield from flush()


def _progress(iterable: Iterable[Any], desc: str) -> Iterable[Any]:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in the [train] extra; degrade to no bar
        return iterable
    return tqdm(iterable, desc=desc, unit=" docs", disable=None, mininterval=1.0)


# -- cache -------------------------------------------------------------------------------------


def _key(*parts: object) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def _load(directory: Path | None, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """Memory-mapped arrays of a complete cache entry, or None (absent or damaged)."""
    if directory is None or not (directory / "meta.json").is_file():
        return None
    try:
        return {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in names}
    except (OSError, ValueError):
        return None


def _save(directory: Path | None, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write to a temporary sibling, then rename: readers never see half an entry."""
    if directory is None:
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".tmp-{directory.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    for name, array in arrays.items():
        np.save(tmp / f"{name}.npy", array)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
    try:
        os.replace(tmp, directory)
    except OSError:  # another process finished the same entry first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def _documents_from_arrays(corpus: dict[str, np.ndarray]) -> list[Document]:
    tokens, sentences, documents = corpus["tokens"], corpus["sentences"], corpus["documents"]
    out = []
    for d in range(len(documents) - 1):
        bounds = sentences[documents[d] : documents[d + 1] + 1]
        out.append([tokens[s:e] for s, e in itertools.pairwise(bounds)])
    return out


def _check_usable(documents: list[Document], config: PretrainDataConfig, where: str) -> None:
    usable = sum(len(d) >= 2 for d in documents)
    if usable == 0:
        raise FolnetError(
            f"corpus {where} has no usable document: {len(documents)} non-empty document(s), "
            f"none with at least 2 sentences ({config.objective.upper()} pairs need two)"
        )
    if config.objective == "nsp" and len(documents) < 2:
        raise FolnetError(
            f"corpus {where} has a single document; NSP needs at least 2 "
            f"(random 'not next' segments come from other documents)"
        )


# -- map-style dataset -------------------------------------------------------------------------


class PretrainingDataset(Dataset):
    """All pairs of a corpus, fixed by `config.seed`; items are dicts of tensors (see module
    doc). Arrays are memory-mapped when they come from the cache.

    `cache_status` says what was reused: "examples" (nothing recomputed), "corpus" (tokens
    reused, pairs rebuilt), "miss" (built and saved) or "disabled" (no cache_dir).
    """

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        tokenizer: FolnetTokenizer,
        config: PretrainDataConfig,
        *,
        cache_status: str,
        num_documents: int,
    ) -> None:
        self.config = config
        self.cache_status = cache_status
        self.num_documents = num_documents
        self.tokens, self.offsets = arrays["tokens"], arrays["offsets"]
        self.len_a, self.labels = arrays["len_a"], arrays["labels"]
        self._layout = _Layout(tokenizer, config.seq_len)

    @property
    def from_cache(self) -> bool:
        """True when the examples were read from disk without tokenising or pairing."""
        return self.cache_status == "examples"

    def __len__(self) -> int:
        return len(self.labels)

    def pair(self, index: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Segment A ids, segment B ids (no specials) and the label of example `index`."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"example index {index} out of range for {len(self)} examples")
        index %= len(self)
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        split = start + int(self.len_a[index])
        ids = np.asarray(self.tokens[start:end], dtype=np.int64)
        return ids[: split - start], ids[split - start :], int(self.labels[index])

    def __getitem__(self, index: int) -> Example:
        return self._layout(*self.pair(index))


def _build_examples(
    documents: list[Document], config: PretrainDataConfig, dtype: np.dtype
) -> dict[str, np.ndarray]:
    rng = random.Random(f"folnet-pairs-{config.seed}")
    count = len(documents)

    def other_for(index: int) -> Callable[[], Document]:
        def pick() -> Document:
            j = rng.randrange(count - 1)
            return documents[j + (j >= index)]  # uniform over the other documents

        return pick

    pieces, lengths, len_a, labels = [], [0], [], []
    for index, document in enumerate(documents):
        if len(document) < 2:
            continue
        for a, b, label in _pairs(document, config, rng, other_for(index)):
            pieces.extend((a, b))
            lengths.append(len(a) + len(b))
            len_a.append(len(a))
            labels.append(label)
    return {
        "tokens": np.concatenate(pieces).astype(dtype, copy=False),
        "offsets": np.cumsum(np.asarray(lengths, dtype=np.int64)),
        "len_a": np.asarray(len_a, dtype=np.int32),
        "labels": np.asarray(labels, dtype=np.int8),
    }


def _tokenised_corpus(
    parts: list[tuple[str, Path | None]], tokenizer: FolnetTokenizer, config: PretrainDataConfig
) -> dict[str, np.ndarray]:
    tokens, sentence_lengths, document_sizes = [], [], []
    documents = read_documents(parts, kinship_documents=config.kinship_documents, seed=config.seed)
    for document in _progress(_tokenise(documents, tokenizer), "tokenising"):
        tokens.extend(document)
        sentence_lengths.extend(len(s) for s in document)
        document_sizes.append(len(document))
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    return {
        "tokens": np.concatenate(tokens) if tokens else np.zeros(0, dtype=dtype),
        "sentences": np.concatenate([[0], np.cumsum(sentence_lengths, dtype=np.int64)]),
        "documents": np.concatenate([[0], np.cumsum(document_sizes, dtype=np.int64)]),
    }


def build_pretraining_dataset(
    source: CorpusSource,
    tokenizer: FolnetTokenizer,
    config: PretrainDataConfig | None = None,
) -> PretrainingDataset | StreamingPretrainingDataset:
    """Tokenise `source`, pair sentences and return a map-style dataset (deterministic given
    `config.seed`), reusing `config.cache_dir` entries when source files, tokenizer and
    config are unchanged. With `config.streaming`, return a `StreamingPretrainingDataset`
    instead (nothing cached, nothing held in memory beyond bounded buffers)."""
    config = config or PretrainDataConfig()
    parts = resolve_sources(source)  # raises on missing/empty/unknown paths before any work
    if config.streaming:
        return StreamingPretrainingDataset(source, tokenizer, config)
    where = (
        repr(str(source))
        if isinstance(source, (str, os.PathLike))
        else repr([str(s) for s in source])
    )
    signature = source_signature(
        parts, kinship_documents=config.kinship_documents, seed=config.seed
    )
    corpus_key = _key("corpus", _CACHE_FORMAT, signature, tokenizer.fingerprint)
    pair_fields = (config.seq_len, config.objective, config.short_seq_prob, config.seed)
    examples_key = _key("examples", _CACHE_FORMAT, corpus_key, *pair_fields)
    root = Path(config.cache_dir).expanduser() if config.cache_dir is not None else None
    corpus_dir = root / f"corpus-{corpus_key}" if root else None
    examples_dir = root / f"examples-{examples_key}" if root else None
    names = ("tokens", "offsets", "len_a", "labels")

    def dataset(arrays: dict[str, np.ndarray], status: str, documents: int) -> PretrainingDataset:
        return PretrainingDataset(
            arrays, tokenizer, config, cache_status=status, num_documents=documents
        )

    cached = _load(examples_dir, names)
    if cached is not None:
        meta = json.loads((examples_dir / "meta.json").read_text(encoding="utf-8"))
        return dataset(cached, "examples", int(meta.get("num_documents", 0)))

    corpus = _load(corpus_dir, ("tokens", "sentences", "documents"))
    status = "corpus" if corpus is not None else ("miss" if root else "disabled")
    if corpus is None:
        corpus = _tokenised_corpus(parts, tokenizer, config)
        _save(corpus_dir, corpus, {"source": signature, "tokenizer": tokenizer.fingerprint})
    documents = _documents_from_arrays(corpus)
    _check_usable(documents, config, where)
    arrays = _build_examples(documents, config, corpus["tokens"].dtype)
    meta = {"config": asdict(config), "num_documents": len(documents), "corpus": corpus_key}
    _save(examples_dir, arrays, meta)
    if examples_dir is not None:  # serve the memory-mapped copy: same data, less RAM
        arrays = _load(examples_dir, names) or arrays
    return dataset(arrays, status, len(documents))


# -- streaming ---------------------------------------------------------------------------------


def iter_pretraining_examples(
    source: CorpusSource,
    tokenizer: FolnetTokenizer,
    config: PretrainDataConfig | None = None,
    *,
    document_window: int = 1000,
    shuffle_buffer: int = 1000,
    epoch: int = 0,
    shard: tuple[int, int] = (0, 1),
) -> Iterator[Example]:
    """Stream examples from `source` with bounded memory; deterministic given seed/epoch/shard.

    Documents are read and tokenised lazily. "Not next" segments (NSP) come from a window of
    up to `document_window` neighbouring documents instead of the whole corpus, and examples
    pass through a `shuffle_buffer`-sized buffer; apart from that the pairing is the one the
    map-style dataset uses. `shard=(k, n)` keeps documents k, k+n, k+2n, ... (one per
    DataLoader worker).
    """
    config = config or PretrainDataConfig()
    parts = resolve_sources(source)
    k, n = shard
    if not 0 <= k < n:
        raise FolnetError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
    if document_window < 2:
        raise FolnetError(f"document_window must be >= 2, got {document_window}")
    where = repr(str(source)) if isinstance(source, (str, os.PathLike)) else repr(source)
    return _stream(parts, tokenizer, config, document_window, shuffle_buffer, epoch, shard, where)


def _stream(
    parts: list[tuple[str, Path | None]],
    tokenizer: FolnetTokenizer,
    config: PretrainDataConfig,
    window: int,
    buffer_size: int,
    epoch: int,
    shard: tuple[int, int],
    where: str,
) -> Iterator[Example]:
    rng = random.Random(f"folnet-stream-{config.seed}-{epoch}-{shard[0]}-{shard[1]}")
    layout = _Layout(tokenizer, config.seq_len)
    documents = read_documents(parts, kinship_documents=config.kinship_documents, seed=config.seed)
    mine = (d for i, d in enumerate(documents) if i % shard[1] == shard[0])
    tokenised = _tokenise(mine, tokenizer)
    ahead: deque[Document] = deque()
    behind: deque[Document] = deque(maxlen=window // 2)

    def other() -> Document:
        pool = len(behind) + len(ahead)
        if pool == 0:
            raise FolnetError(f"corpus {where} has a single document; NSP needs at least 2")
        j = rng.randrange(pool)
        return behind[j] if j < len(behind) else ahead[j - len(behind)]

    def in_order() -> Iterator[Document]:  # each document once `ahead` has filled up
        for document in tokenised:
            ahead.append(document)
            if len(ahead) > window - window // 2:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()

    buffer: list[Example] = []
    produced = seen = 0
    for current in in_order():
        seen += 1
        if len(current) >= 2:
            for a, b, label in _pairs(current, config, rng, other):
                produced += 1
                yield from _through_buffer(buffer, buffer_size, layout(a, b, label), rng)
        behind.append(current)
    if produced == 0:
        raise FolnetError(
            f"corpus {where} has no usable document: {seen} non-empty "
            f"document(s), none with at least 2 sentences"
        )
    rng.shuffle(buffer)
    yield from buffer


def _through_buffer(
    buffer: list[Example], size: int, example: Example, rng: random.Random
) -> Iterator[Example]:
    """Reservoir-style shuffle: once full, emit a random resident and keep the newcomer."""
    if size <= 1:
        yield example
    elif len(buffer) < size:
        buffer.append(example)
    else:
        j = rng.randrange(size)
        buffer[j], example = example, buffer[j]
        yield example


class StreamingPretrainingDataset(IterableDataset):
    """`iter_pretraining_examples` as a torch IterableDataset: each DataLoader worker reads
    its own share of documents; call `set_epoch` to draw different pairs each epoch."""

    def __init__(
        self,
        source: CorpusSource,
        tokenizer: FolnetTokenizer,
        config: PretrainDataConfig,
        *,
        document_window: int = 1000,
        shuffle_buffer: int = 1000,
    ) -> None:
        resolve_sources(source)
        self.source, self.tokenizer, self.config = source, tokenizer, config
        self.document_window, self.shuffle_buffer = document_window, shuffle_buffer
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[Example]:
        info = get_worker_info()
        shard = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter_pretraining_examples(
            self.source,
            self.tokenizer,
            self.config,
            document_window=self.document_window,
            shuffle_buffer=self.shuffle_buffer,
            epoch=self.epoch,
            shard=shard,
        )
