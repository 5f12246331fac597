"""`PretrainDataConfig`: how a corpus becomes pretraining examples, and the objectives it knows.

Kept apart from the datasets so that the run configuration (`folnet.train.pretrain.config`) can
check its options against `OBJECTIVES` without importing the tokenising machinery.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from folnet.errors import FolnetError, choices
from folnet.train.data.checks import canonical_encoding

__all__ = ["KIND_OBJECTIVES", "OBJECTIVES", "PretrainDataConfig"]

#: What each kind of model pretrains on: an encoder, masked tokens with a sentence-pair
#: objective (next-sentence or sentence-order prediction); a decoder, the next token over
#: packed documents ("clm", `folnet.train.data.packing`) or after a prefix it reads both ways
#: ("prefix", the PrefixLM: `folnet.train.data.prefix_rows`); an encoder-decoder, the spans
#: cut out of packed rows ("span", `folnet.train.data.spans`).
KIND_OBJECTIVES = {"encoder": ("nsp", "sop"), "decoder": ("clm", "prefix"),
                   "encoder-decoder": ("span",)}
OBJECTIVES = tuple(o for objectives in KIND_OBJECTIVES.values() for o in objectives)


#: The integer data options' lower bounds, checked here and by the run's options
#: (`folnet.train.pretrain.config.PretrainConfig`), each naming the field its own way.
DATA_AT_LEAST = {"seq_len": 8, "max_predictions": 1, "kinship_documents": 1, "seed": 0}


@dataclass(frozen=True)
class PretrainDataConfig:
    """How to turn a corpus into pretraining examples (and how to mask them later).

    `mlm_probability` and `max_predictions` are read by the collator, not the dataset; they
    are here so that one config describes the whole data side of a run.

    These defaults are the one place the data defaults are written: `PretrainConfig` (and so
    ``folnet pretrain`` and its ``--help``) takes from here the default of every field it
    shares with this class but ``cache_dir`` (unset, None, means OUT/cache for a run and no
    cache here), and ``folnet/specs/train/pretrain.toml`` does not repeat them.
    """

    seq_len: int = 128
    objective: str = "nsp"
    mlm_probability: float = 0.15
    max_predictions: int = 20
    short_seq_prob: float = 0.1
    seed: int = 0
    #: span corruption (the encoder-decoder's objective): the share of tokens cut out, and
    #: the spans' mean length
    span_rate: float = 0.15
    mean_span: float = 3.0
    #: the share of documents a decoder's or an encoder-decoder's run holds out to measure its
    #: held-out loss and perplexity (`folnet.train.pretrain.heldout`); 0: none
    heldout: float = 0.0
    cache_dir: str | os.PathLike[str] | None = None
    streaming: bool = False
    kinship_documents: int = 2000
    text_column: str = "text"
    #: how text, JSON and CSV files are decoded (`folnet.train.data.checks`)
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        def integer(name: str, low: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FolnetError(
                    f"PretrainDataConfig.{name} must be an integer >= {low}, got {value!r}"
                )

        for name, low in DATA_AT_LEAST.items():
            integer(name, low)
        if self.objective not in OBJECTIVES:
            raise FolnetError(
                f"PretrainDataConfig.objective must be {choices(OBJECTIVES)}, "
                f"got {self.objective!r}"
            )
        p = self.mlm_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
            raise FolnetError(f"PretrainDataConfig.mlm_probability must lie in (0, 1), got {p!r}")
        p = self.heldout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 0.5:
            raise FolnetError(f"PretrainDataConfig.heldout must lie in [0, 0.5), got {p!r}")
        p = self.span_rate
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
            raise FolnetError(f"PretrainDataConfig.span_rate must lie in (0, 1), got {p!r}")
        if (isinstance(self.mean_span, bool) or not isinstance(self.mean_span, (int, float))
                or self.mean_span < 1.0):
            raise FolnetError(f"PretrainDataConfig.mean_span must be >= 1, got "
                              f"{self.mean_span!r}")
        p = self.short_seq_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise FolnetError(f"PretrainDataConfig.short_seq_prob must lie in [0, 1), got {p!r}")
        if not isinstance(self.text_column, str) or not self.text_column:
            raise FolnetError(
                f"PretrainDataConfig.text_column must be a non-empty string, "
                f"got {self.text_column!r}"
            )
        canonical_encoding(self.encoding, "PretrainDataConfig.encoding")
        if not isinstance(self.streaming, bool):
            raise FolnetError(
                f"PretrainDataConfig.streaming must be a bool, got {self.streaming!r}"
            )
