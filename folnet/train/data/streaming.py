"""Streaming pretraining examples: corpora larger than memory, read document by document.

Same pairing as the map-style `folnet.train.data.corpus.PretrainingDataset` (both use
`folnet.train.data.pairs`), but documents are read lazily, "other document" segments for NSP
come from a window of nearby documents, and examples pass through a shuffle buffer. Nothing is
cached.
"""

from __future__ import annotations

import os
import random
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from torch.utils.data import IterableDataset, get_worker_info

from folnet.errors import FolnetError
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.documents import CorpusSource, read_documents, resolve_sources
from folnet.train.data.pairs import (
    Document,
    Example,
    ExampleLayout,
    segment_pairs,
    tokenise_documents,
)
from folnet.train.data.tokenizer import FolnetTokenizer

__all__ = ["StreamingPretrainingDataset", "iter_pretraining_examples"]


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
    layout = ExampleLayout(tokenizer, config.seq_len)
    documents = read_documents(parts, kinship_documents=config.kinship_documents, seed=config.seed,
                               text_column=config.text_column, encoding=config.encoding)
    mine = (d for i, d in enumerate(documents) if i % shard[1] == shard[0])
    tokenised = tokenise_documents(mine, tokenizer)
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
            for a, b, label in segment_pairs(current, config, rng, other):
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
