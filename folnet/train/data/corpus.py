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

The dataset holds no MLM masks: `folnet.train.data.masking.PretrainingCollator` draws a new mask
each time an example is batched (dynamic masking).

Why two caches: tokenising is the expensive step and depends only on the corpus and the
tokenizer, while pairing depends on `seq_len`, `objective`, `short_seq_prob` and `seed`. So
`cache_dir/corpus-<key>/` keeps the tokenised sentences and `cache_dir/examples-<key>/` the
pairs; changing `seq_len` re-pairs without re-tokenising.

Why flat memory-mapped `.npy` arrays (tokens, offsets, segment-A lengths, labels) and not a
`datasets` Arrow table: examples are read one at a time in random order, and there the arrays
are several times faster than `load_from_disk` rows, and faster still than its numpy format
(`benchmarks/example_store.py`, docs/results/measurements.md). Reading the corpus itself goes
through `datasets` (`folnet.train.data.sources`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from folnet.atomic_write import atomic_write_dir
from folnet.errors import FolnetError
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.documents import (
    CorpusSource,
    read_documents,
    resolve_sources,
    source_signature,
)
from folnet.train.data.packing import heldout_documents, pack_documents
from folnet.train.data.pairs import (
    Document,
    Example,
    ExampleLayout,
    segment_pairs,
    token_dtype,
    tokenise_documents,
)
from folnet.train.data.streaming import StreamingPretrainingDataset
from folnet.train.data.tokenizer import FolnetTokenizer

__all__ = ["PackedDataset", "PretrainingDataset", "build_packed_dataset",
           "build_pretraining_dataset"]

_CACHE_FORMAT = 2  # bump when the on-disk layout or the pairing algorithm changes


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


def _load(directory: Path | None,
          names: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """Memory-mapped arrays and the metadata of a complete cache entry, or None when it is
    absent or damaged (a meta.json that is not a JSON object, an array that does not load):
    a damaged entry is rebuilt and replaced (`_save`), never a reason to stop a run."""
    if directory is None or not (directory / "meta.json").is_file():
        return None
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            return None
        return {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in names}, meta
    # JSONDecodeError and UnicodeDecodeError are ValueErrors; a meta.json nested deeper than
    # the parser follows raises RecursionError, which is not
    except (OSError, ValueError, RecursionError):
        return None


def _save(directory: Path | None, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write the entry atomically: readers never see half of one. An entry another process
    finished first is kept, unless it is damaged (`_load` refused it): then it is replaced."""
    if directory is None:
        return

    def write(tmp: Path) -> None:
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", array)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")

    damaged = directory.exists() and _load(directory, tuple(arrays)) is None
    atomic_write_dir(directory, write, replace=damaged)


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
        self._layout = ExampleLayout(tokenizer, config.seq_len)

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
        for a, b, label in segment_pairs(document, config, rng, other_for(index)):
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
    documents = read_documents(parts, kinship_documents=config.kinship_documents, seed=config.seed,
                               text_column=config.text_column, encoding=config.encoding)
    for document in _progress(tokenise_documents(documents, tokenizer), "tokenising"):
        tokens.extend(document)
        sentence_lengths.extend(len(s) for s in document)
        document_sizes.append(len(document))
    return {
        "tokens": np.concatenate(tokens) if tokens else np.zeros(0, dtype=token_dtype(tokenizer)),
        "sentences": np.concatenate([[0], np.cumsum(sentence_lengths, dtype=np.int64)]),
        "documents": np.concatenate([[0], np.cumsum(document_sizes, dtype=np.int64)]),
    }


def _where(source: CorpusSource) -> str:
    """The corpus as an error message names it."""
    if isinstance(source, (str, os.PathLike)):
        return repr(str(source))
    return repr([str(s) for s in source])


@dataclass(frozen=True)
class _Corpus:
    """Where a corpus's tokenised sentences are cached: its key (the sources, the options that
    read them and the tokenizer) and the cache's root (None: no cache)."""

    key: str
    signature: Any
    root: Path | None

    @classmethod
    def of(cls, parts: list[tuple[str, Path | None]], tokenizer: FolnetTokenizer,
           config: PretrainDataConfig) -> _Corpus:
        signature = source_signature(
            parts, kinship_documents=config.kinship_documents, seed=config.seed,
            text_column=config.text_column, encoding=config.encoding,
        )
        root = Path(config.cache_dir).expanduser() if config.cache_dir is not None else None
        return cls(_key("corpus", _CACHE_FORMAT, signature, tokenizer.fingerprint), signature,
                   root)

    def tokens(self, parts: list[tuple[str, Path | None]], tokenizer: FolnetTokenizer,
               config: PretrainDataConfig) -> tuple[dict[str, np.ndarray], str]:
        """The tokenised corpus (from the cache, or made and saved) and what the cache gave:
        "corpus" (reused), "miss" (made and saved) or "disabled" (no cache)."""
        directory = self.root / f"corpus-{self.key}" if self.root else None
        loaded = _load(directory, ("tokens", "sentences", "documents"))
        if loaded is not None:
            return loaded[0], "corpus"
        corpus = _tokenised_corpus(parts, tokenizer, config)
        _save(directory, corpus, {"source": self.signature, "tokenizer": tokenizer.fingerprint})
        return corpus, "miss" if self.root else "disabled"


def build_pretraining_dataset(
    source: CorpusSource,
    tokenizer: FolnetTokenizer,
    config: PretrainDataConfig | None = None,
) -> PretrainingDataset | IterableDataset:
    """Tokenise `source`, pair sentences and return a map-style dataset (deterministic given
    `config.seed`), reusing `config.cache_dir` entries when source files, tokenizer and
    config are unchanged. With `config.streaming`, return a `StreamingPretrainingDataset`
    instead (nothing cached, nothing held in memory beyond bounded buffers)."""
    config = config or PretrainDataConfig()
    parts = resolve_sources(source)  # raises on missing/empty/unknown paths before any work
    if config.streaming:
        return StreamingPretrainingDataset(source, tokenizer, config)
    where = _where(source)
    corpus = _Corpus.of(parts, tokenizer, config)
    pair_fields = (config.seq_len, config.objective, config.short_seq_prob, config.seed)
    examples_key = _key("examples", _CACHE_FORMAT, corpus.key, *pair_fields)
    examples_dir = corpus.root / f"examples-{examples_key}" if corpus.root else None
    names = ("tokens", "offsets", "len_a", "labels")

    def dataset(arrays: dict[str, np.ndarray], status: str, documents: int) -> PretrainingDataset:
        return PretrainingDataset(
            arrays, tokenizer, config, cache_status=status, num_documents=documents
        )

    cached = _load(examples_dir, names)
    if cached is not None:
        count = cached[1].get("num_documents")  # informational: 0 when unreadable
        return dataset(cached[0], "examples", count if isinstance(count, int) else 0)

    tokens, status = corpus.tokens(parts, tokenizer, config)
    documents = _documents_from_arrays(tokens)
    _check_usable(documents, config, where)
    arrays = _build_examples(documents, config, tokens["tokens"].dtype)
    meta = {"config": asdict(config), "num_documents": len(documents), "corpus": corpus.key}
    _save(examples_dir, arrays, meta)
    saved = _load(examples_dir, names)
    if saved is not None:  # serve the memory-mapped copy: same data, less RAM
        arrays = saved[0]
    return dataset(arrays, status, len(documents))



# -- a decoder's packed rows -------------------------------------------------------------------


class PackedDataset(Dataset):
    """A decoder's pretraining rows: the corpus's documents packed end to end
    (`folnet.train.data.packing`), each row ``input_ids``, ``document_ids`` and
    ``attention_mask`` (seq_len,); `cache_status` as `PretrainingDataset`'s, "rows" when the
    rows came from the cache."""

    def __init__(self, arrays: dict[str, np.ndarray], *, cache_status: str,
                 num_documents: int) -> None:
        self.ids, self.documents = arrays["ids"], arrays["documents"]  # (N, T) each
        self.lengths = arrays["lengths"]  # (N,) real tokens of each row
        self.cache_status, self.num_documents = cache_status, num_documents

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> Example:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row index {index} out of range for {len(self)} rows")
        ids = torch.from_numpy(np.asarray(self.ids[index], dtype=np.int64))
        mask = torch.arange(ids.shape[0]) < int(self.lengths[index])
        return {"input_ids": ids, "attention_mask": mask.long(),
                "document_ids": torch.from_numpy(np.asarray(self.documents[index],
                                                            dtype=np.int64))}


def build_packed_dataset(source: CorpusSource, tokenizer: FolnetTokenizer,
                         config: PretrainDataConfig | None = None, *, part: str = "train"
                         ) -> PackedDataset:
    """Tokenise `source` (the cache shared with `build_pretraining_dataset`) and pack its
    documents, each ending in [SEP], into rows of ``config.seq_len`` (for the PrefixLM, objective
    "prefix", a document per row); cached as its own entry.
    ``part``: the documents `heldout_documents` leaves for training ("train") or holds out
    ("heldout") at ``config.heldout``."""
    config = config or PretrainDataConfig(objective="clm")
    parts = resolve_sources(source)
    corpus = _Corpus.of(parts, tokenizer, config)
    alone = config.objective == "prefix"  # a document per row (`pack_documents`)
    key = _key("rows", _CACHE_FORMAT, corpus.key, config.seq_len, config.heldout, config.seed,
               part, *(("alone",) if alone else ()))
    rows_dir = corpus.root / f"rows-{key}" if corpus.root else None
    names = ("ids", "documents", "lengths")
    cached = _load(rows_dir, names)
    if cached is not None:
        count = cached[1].get("num_documents")
        return PackedDataset(cached[0], cache_status="rows",
                             num_documents=count if isinstance(count, int) else 0)
    tokens, status = corpus.tokens(parts, tokenizer, config)
    documents = _documents_from_arrays(tokens)
    held = heldout_documents(len(documents), config.heldout, config.seed)
    documents = [d for i, d in enumerate(documents) if (i in held) == (part == "heldout")]
    rows = list(pack_documents((np.concatenate(d) for d in documents if d), config.seq_len,
                               end=tokenizer.sep_id, pad=tokenizer.pad_id, alone=alone))
    if not rows:
        raise FolnetError(f"corpus {_where(source)} holds no token to pack"
                          + (" in its held-out documents" if part == "heldout" else ""))
    arrays = {"ids": np.stack([r[0] for r in rows]).astype(tokens["tokens"].dtype),
              "documents": np.stack([r[1] for r in rows]).astype(np.int32),
              "lengths": np.asarray([r[2] for r in rows], dtype=np.int32)}
    _save(rows_dir, arrays, {"seq_len": config.seq_len, "num_documents": len(documents),
                             "corpus": corpus.key})
    saved = _load(rows_dir, names)
    return PackedDataset(saved[0] if saved is not None else arrays, cache_status=status,
                         num_documents=len(documents))
