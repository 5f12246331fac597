"""`FolnetConfig`: a folnet model config as transformers sees it.

A directory saved by `folnet.save_pretrained` already holds what this class reads: its
config.json says ``model_type: "folnet"`` and carries the folnet config under ``model`` (the
operator string, the sizes, the specs of custom operators), the ``kind`` and the ``head``. A
directory saved through transformers (``FolnetForX.save_pretrained``) keeps those keys, so
`folnet.from_pretrained` reads it back too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig

from folnet.arch import ModelConfig, ensure_operators
from folnet.arch.config import OVERRIDES, check_fields, check_num_labels, make_config
from folnet.errors import FolnetError

#: Every name a transformers user reaches a folnet model setting by -- folnet's
#: `ModelConfig` field first, then the BERT, GPT-2 and T5 names of the same thing -- the one
#: table `FolnetConfig`'s attributes are made from. All are settable: a config describes the
#: model to build (``config.hidden_size = 64`` before ``FolnetModel(config)``), and settings of
#: the run may change when a model is loaded (``from_pretrained(dir, hidden_dropout_prob=0.0)``);
#: weights of other sizes then fail to load unless ``ignore_mismatched_sizes=True``.
SETTINGS: dict[str, tuple[str, ...]] = {
    "dropout": ("dropout", "hidden_dropout_prob", "resid_pdrop", "embd_pdrop", "dropout_rate"),
    "attention_dropout": ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop"),
    "layer_norm_eps": ("layer_norm_eps", "layer_norm_epsilon"),
    "initializer_range": ("initializer_range",),
    "backend": ("backend",),
}
SIZES: dict[str, tuple[str, ...]] = {
    "D1": ("D1", "hidden_size", "n_embd", "d_model"),
    "L": ("L", "num_hidden_layers", "n_layer", "num_layers"),
    "H": ("H", "num_attention_heads", "n_head", "num_heads"),
    "S": ("S", "d_kv"),
    "F1": ("F1", "intermediate_size", "n_inner", "d_ff"),
    "max_positions": ("max_positions", "max_position_embeddings", "n_positions"),
    "vocab_size": ("vocab_size",),
    "type_vocab_size": ("type_vocab_size",),
    "D2": ("D2",), "F2": ("F2",), "delta": ("delta",), "position": ("position",),
}


def _setting(field: str, name: str) -> property:
    def get(self: FolnetConfig) -> Any:
        return self.model[field]

    def put(self: FolnetConfig, value: Any) -> None:
        check_fields({field: value}, f"{name} (folnet's {field}): " if name != field else "")
        self.model = {**self.model, field: value}

    return property(get, put, doc=f"folnet's ``{field}`` (settable; also at load)")


#: The BERT names of the sizes, also written to config.json beside ``model`` (tools read
#: ``hidden_size`` and ``vocab_size`` from the file); ``model`` stays the source, and a file
#: whose copies disagree with it is refused.
MIRRORED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "vocab_size", "type_vocab_size")


class FolnetConfig(PreTrainedConfig):
    """The folnet config (``model``), its kind and head, plus transformers' own fields."""

    model_type = "folnet"

    model: dict | None = None  # folnet.ModelConfig.to_dict(); None: ops on the preset
    ops: str | None = None  # operator string (with ``preset`` when ``model`` is None)
    preset: str | None = None  # the size preset ``model`` was made from, when it was
    kind: str = "encoder"
    head: str | None = None  # the head of the saved model
    format: str = "folnet"
    version: int = 2
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    use_cache: bool = True  # the text kinds' generate keeps folnet's own row cache
    # whether the head's decoder is the word embedding: set from the head when a model is
    # built (the MLM and LM heads are tied by construction, the others have no decoder)
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs: Any) -> None:
        if self.model is None:
            overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in OVERRIDES}
            self.preset = self.preset or "base"
            self.model = make_config(self.ops or "jmc.atp", preset_name=self.preset,
                                     kind=self.kind, overrides=overrides).to_dict()
        else:  # from a file: every field, and every operator expression, checked first
            ModelConfig.from_dict(self.model, source="model.")
            for name in MIRRORED:  # config.json's copies of the sizes must agree with model
                field = next(f for f, names in SIZES.items() if name in names)
                if name in kwargs and kwargs.pop(name) != self.model[field]:
                    raise FolnetError(f"{name} disagrees with model.{field} "
                                      f"({self.model[field]!r}): a config carries each size "
                                      f"once, in model; set {name} on the config instead")
        if kwargs.get("num_labels") is not None:  # transformers would build 2**63 labels
            check_num_labels(kwargs["num_labels"])
        self.ops = self.model.get("ops", self.ops)
        self.kind = self.model.get("kind", self.kind)
        if self.kind != "encoder" and kwargs.get("num_labels") == self.model["vocab_size"]:
            kwargs.pop("num_labels")  # a native text model's file: its outputs, not labels
        if self.kind == "encoder-decoder":  # what generate reads; 0 starts the native decoder
            kwargs.setdefault("is_encoder_decoder", True)
            kwargs.setdefault("decoder_start_token_id", 0)
        super().__post_init__(**kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike[str],
                        **kwargs: Any) -> FolnetConfig:
        """transformers' loading, with a fault of the file (a field out of range, a hostile
        operator expression) one `FolnetError` naming it, as `folnet.from_pretrained` does."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except FolnetError as exc:
            source = Path(pretrained_model_name_or_path)
            where = source / "config.json" if source.is_dir() else source
            raise FolnetError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """transformers' dict, without a preset when the model was not made from one (a saved
        folnet model's config carries its sizes, not the preset it may have started from)."""
        data = super().to_dict()
        if data.get("preset") is None:
            data.pop("preset", None)
        data.update({name: getattr(self, name) for name in MIRRORED})
        return data

    @classmethod
    def from_folnet(cls, cfg: ModelConfig, head: str | None = None, num_labels: int = 2,
                    **kwargs: Any) -> FolnetConfig:
        """The config of a native folnet model (``model.cfg``, ``model.head``)."""
        return cls(model=cfg.to_dict(), head=head, num_labels=num_labels, **kwargs)

    def model_config(self) -> ModelConfig:
        """The folnet `ModelConfig`, its custom operators registered."""
        try:
            cfg = ModelConfig.from_dict(self.model)
        except TypeError as exc:
            raise FolnetError(f"FolnetConfig.model is not a folnet model config: {exc}") from None
        ensure_operators(cfg)
        return cfg



for _field, _names in {**SETTINGS, **SIZES}.items():
    for _name in _names:
        setattr(FolnetConfig, _name, _setting(_field, _name))

