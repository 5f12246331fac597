"""What a pretraining run reads: its tokenizer, its dataset and its stream of micro-batches.

Every rank reads the same global micro-batches (see `folnet.train.engine.distributed`); rank 0
alone trains the tokenizer and fills the example cache, and the other ranks wait for it and
then read what it wrote. Data faults are reported under ``--data``, the option that chose the
data.

`check_inputs` runs before the run writes anything: a run that fails on a typo must not leave a
half-made ``OUT`` behind for the corrected retry to trip over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from folnet.arch import build_model
from folnet.errors import FolnetError
from folnet.train.data.bpe import train_bpe_tokenizer
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.corpus import build_packed_dataset, build_pretraining_dataset
from folnet.train.data.documents import iter_documents, resolve_sources
from folnet.train.data.masking import PretrainingCollator
from folnet.train.data.prefix_rows import build_prefix_dataset
from folnet.train.data.sources import check_texts
from folnet.train.data.span_rows import SENTINELS, build_span_dataset
from folnet.train.data.tokenizer import FolnetTokenizer, load_tokenizer, train_tokenizer
from folnet.train.engine.distributed import DistContext, GlobalBatchSampler, barrier
from folnet.train.pretrain.config import PretrainConfig

__all__ = ["build_pretraining_model", "check_inputs", "micro_batches", "run_dataset",
           "run_tokenizer"]

T = TypeVar("T")


def check_inputs(config: PretrainConfig, tokenizer_from: Path | None) -> None:
    """Raise `FolnetError` for a bad ``--data`` source, ``--tokenizer`` or model option
    (``--ops``, ``--preset``, ``--model``) without writing anything.

    The corpus paths are checked (they exist, are of a known type, are not empty) and the
    first MiB of each text file is decoded with ``--encoding`` and checked to be text; a
    corpus that holds no usable text is still found only when the tokenizer trains on it.
    The model is built on the meta device, which checks every option without memory or time.
    """
    parts = _data_errors(lambda: resolve_sources(config.data))
    _data_errors(lambda: check_texts(parts, config.encoding))
    vocab_size = config.vocab_size  # a trained tokenizer's size is not known yet
    if tokenizer_from is not None:  # resumed, or the weights the run starts from
        vocab_size = load_tokenizer(tokenizer_from).vocab_size
    elif config.tokenizer is not None:
        try:
            vocab_size = load_tokenizer(config.tokenizer).vocab_size
        except FolnetError as exc:
            raise FolnetError(f"--tokenizer: {exc}") from None
    try:
        with torch.device("meta"):
            build_pretraining_model(config, vocab_size)
    except FolnetError as exc:
        raise FolnetError(f"{exc} (the model comes from --ops, --preset and --model)") from None


def build_pretraining_model(config: PretrainConfig, vocab_size: int) -> torch.nn.Module:
    """The model ``config`` pretrains: an encoder with the MLM and NSP/SOP heads, a decoder
    (its LM head), or an encoder-decoder (its vocabulary, the run's tokenizer's, ends in the
    span sentinels: `run_tokenizer`)."""
    if config.kind in ("decoder", "encoder-decoder"):
        return build_model(config.ops, preset=config.preset, kind=config.kind,
                           vocab_size=vocab_size, **config.model_overrides)
    return build_model(config.ops, preset=config.preset, head="pretraining",
                       vocab_size=vocab_size, **config.model_overrides)


def run_tokenizer(config: PretrainConfig, out: Path, source: Path | None,
                  ctx: DistContext) -> FolnetTokenizer:
    """The run's tokenizer: `source`'s (the checkpoint resumed, or the weights a run starts
    from, see `folnet.train.pretrain.start`), ``--tokenizer``'s, or one trained on the corpus
    by rank 0 (saved to ``OUT/tokenizer``, from which the other ranks load it). An
    encoder-decoder's ends in the `SENTINELS` span sentinels, added where missing."""
    sentinels = SENTINELS if config.kind == "encoder-decoder" else 0
    if source is not None:
        return load_tokenizer(source).with_sentinels(sentinels)
    if config.tokenizer is not None:
        try:
            return load_tokenizer(config.tokenizer).with_sentinels(sentinels)
        except FolnetError as exc:
            raise FolnetError(f"--tokenizer: {exc}") from None
    trained = out / "tokenizer"
    if ctx.is_main:
        def texts() -> Iterator[str]:  # read twice: training makes a first pass for the alphabet
            documents = iter_documents(config.data, kinship_documents=config.kinship_documents,
                                       text_column=config.text_column,
                                       seed=config.seed, encoding=config.encoding)
            return (sentence for document in documents for sentence in document)

        trainer = train_bpe_tokenizer if config.tokenizer_model == "bpe" else train_tokenizer
        tokenizer = _data_errors(lambda: trainer(texts=texts, vocab_size=config.vocab_size))
        tokenizer = tokenizer.with_sentinels(sentinels)
        tokenizer.model_max_length = config.seq_len
        tokenizer.save(trained)
    barrier(ctx)
    return tokenizer if ctx.is_main else load_tokenizer(trained)


def _data_errors(build: Callable[[], T]) -> T:
    """Prefix data faults with the option that chose the data."""
    try:
        return build()
    except FolnetError as exc:
        raise FolnetError(f"--data: {exc}") from None


def run_dataset(config: PretrainConfig, tokenizer: FolnetTokenizer, out: Path,
                ctx: DistContext) -> tuple[Dataset, Dataset | None, PretrainDataConfig]:
    """The run's examples (cached under ``--cache-dir``, default ``OUT/cache``, or streamed),
    its held-out rows (``--heldout``; else None) and the data configuration they were made
    with. Rank 0 fills the cache first."""
    data_config = PretrainDataConfig(
        seq_len=config.seq_len, objective=config.objective,
        mlm_probability=config.mlm_probability, max_predictions=config.max_predictions,
        span_rate=config.span_rate, mean_span=config.mean_span, heldout=config.heldout,
        seed=config.seed,
        cache_dir=config.cache_dir or str(out / "cache"),
        streaming=config.streaming, kinship_documents=config.kinship_documents,
        text_column=config.text_column, encoding=config.encoding)
    build = {"decoder": build_prefix_dataset if config.objective == "prefix" else
             build_packed_dataset, "encoder-decoder": build_span_dataset}.get(
        config.kind, build_pretraining_dataset)
    parts = ("train", "heldout") if config.heldout else ("train",)

    def made() -> list[Dataset]:
        if config.kind == "encoder":
            return [_data_errors(lambda: build(config.data, tokenizer, data_config))]
        return [_data_errors(lambda p=p: build(config.data, tokenizer, data_config, part=p))
                for p in parts]

    datasets = None
    if ctx.is_main:  # rank 0 fills the cache; the others then read it
        datasets = made()
    barrier(ctx)
    if datasets is None:
        datasets = made()
    return datasets[0], datasets[1] if len(datasets) > 1 else None, data_config


def micro_batches(dataset: Dataset, collator: PretrainingCollator, config: PretrainConfig,
                  start: tuple[int, int]) -> Iterator[tuple[int, int, dict[str, torch.Tensor]]]:
    """Endless (epoch, block, batch) of unmasked global micro-batches from `start` on; a batch
    holds ``[micro_batch, seq_len]`` tensors (``nsp_labels`` ``[micro_batch]``).

    Map-style data: `GlobalBatchSampler` resumes mid-epoch without replaying anything.
    Streamed data: the epoch's stream is replayed up to the saved block, since a stream
    cannot seek.
    """
    loader_rng = torch.Generator().manual_seed(config.seed)  # never the global RNG
    common = {"collate_fn": collator.collate, "num_workers": config.num_workers,
              "generator": loader_rng}
    epoch, block = start
    if not isinstance(dataset, IterableDataset):
        sampler = GlobalBatchSampler(len(dataset), config.micro_batch, seed=config.seed)
        if block >= sampler.batches_per_epoch:  # saved right at the end of an epoch
            epoch, block = epoch + 1, 0
        sampler.start = (epoch, block)
        for batch in DataLoader(dataset, batch_sampler=sampler, **common):
            yield epoch, block, batch
            block += 1
            if block == sampler.batches_per_epoch:
                epoch, block = epoch + 1, 0
        return
    while True:  # streaming: replay the epoch's stream up to the saved block
        dataset.set_epoch(epoch)
        produced = 0
        for i, batch in enumerate(DataLoader(dataset, batch_size=config.micro_batch,
                                             drop_last=True, **common)):
            produced += 1
            if i >= block:
                yield epoch, i, batch
        if produced == 0:
            raise FolnetError(f"--data yields fewer than one micro-batch of "
                              f"{config.micro_batch} sequences; lower --batch-size")
        epoch, block = epoch + 1, 0
