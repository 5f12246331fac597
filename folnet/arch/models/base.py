"""What every kind of FOLNet model shares: its config and plan, its head, initialisation,
activation checkpointing and checkpoints."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.head_table import Head, get_head
from folnet.arch.io.model_dir import save_pretrained
from folnet.arch.layer.stack import Stack
from folnet.arch.plan import ArchPlan, parse_plan
from folnet.arch.vocab import replace_word_embedding, resize_vocabulary
from folnet.errors import FolnetError


def initialise(named: Iterable[tuple[str, nn.Parameter]], std: float, *,
               zeros: Callable[..., Any] = nn.init.zeros_,
               normal: Callable[..., Any] = nn.init.normal_) -> None:
    """folnet's initialisation, written once: N(0, ``std``) weights and embeddings, zero
    biases; parameters on the meta device are skipped. The Hugging Face classes pass
    transformers' own ``zeros``/``normal`` (which skip weights already loaded)."""
    for name, param in named:
        if param.is_meta:
            continue
        if name.endswith("bias"):
            zeros(param)
        else:
            normal(param, mean=0.0, std=std)


class FolnetBase(nn.Module):
    """A FOLNet of one kind (set by `folnet.arch.kinds.register_kind`) with an optional head.

    Module paths are the checkpoints' key names (``encoder.layers.0.proj_b.weight``,
    ``atoms.word.weight``, ``mlm.bias``): a state dict needs no renaming on its way in or out.
    """

    kind: ClassVar[str] = "?"
    default_head: ClassVar[str | None] = None

    def __init__(self, cfg: ModelConfig, head: str | None = None, num_labels: int = 2, *,
                 plan: ArchPlan | None = None):
        super().__init__()
        if cfg.kind != self.kind:
            raise FolnetError(f"config kind {cfg.kind!r} does not match {self.kind!r}")
        self.cfg = cfg
        self.plan = plan if plan is not None else parse_plan(cfg.ops, cfg.L)
        self.head = head if head is not None else self.default_head
        self.head_spec: Head | None = None
        if self.head is not None:
            self.head_spec = get_head(self.head, self.kind)
            if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1:
                raise FolnetError(f"num_labels must be an integer >= 1 for head {self.head!r}, "
                                  f"got {num_labels!r}")
        self.num_labels = num_labels
        self.checkpointing = False  # recompute layers in the backward pass (text models)
        # check input values (ids in range, ...)? None: when the inputs are on the CPU, where
        # it is free; on an accelerator every check would wait for the device
        self.validate: bool | None = None

    def add_head(self, word: nn.Embedding) -> None:
        """Register the head's modules under their checkpoint names."""
        if self.head_spec is not None:
            for name, module in self.head_spec.build(self.cfg, self.num_labels, word).items():
                self.add_module(name, module)

    def word_embedding(self) -> nn.Embedding:
        """The word embedding (the LM heads' decoder is tied to it)."""
        raise NotImplementedError

    def resize_token_embeddings(self, vocab_size: int, *, mean_resizing: bool = True,
                                pad_to_multiple_of: int | None = None,
                                generator: torch.Generator | None = None) -> nn.Embedding:
        """Resize the vocabulary to ``vocab_size`` ids after tokens were added to (or removed
        from) the tokenizer: the word embedding (exactly ``vocab_size`` rows, or rounded up
        to ``pad_to_multiple_of``), the heads tied to it and the config (`folnet.arch.vocab`).
        Returns the word embedding."""
        return resize_vocabulary(self, vocab_size, mean_resizing=mean_resizing,
                                 pad_to_multiple_of=pad_to_multiple_of, generator=generator)

    def set_word_embedding(self, new: nn.Module) -> nn.Module:
        """Use ``new`` (same shape) as the word embedding everywhere it is read, the tied heads
        included (`folnet.arch.vocab.replace_word_embedding`)."""
        return replace_word_embedding(self, new)

    def reset_parameters(self) -> None:
        """BERT-style init: N(0, initializer_range) weights and embeddings, zero biases. A
        model on the meta device (built for its shapes, `folnet.arch.sizes`) has no values to
        set; skipping it keeps that build fast (on the meta device ``normal_`` costs more than
        the rest of the build, docs/results/measurements.md)."""
        initialise(self.named_parameters(), self.cfg.initializer_range)

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each layer in the backward pass instead of keeping its activations."""
        self.checkpointing = bool(enabled)
        for stack in self.children():
            if isinstance(stack, Stack):
                stack.checkpointing = bool(enabled)

    def save_pretrained(self, directory: str | Path, extra: dict[str, Any] | None = None
                        ) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (see `folnet.arch.io.model_dir`)."""
        return save_pretrained(self, directory, extra)

