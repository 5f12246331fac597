"""What every kind of FOLNet model shares: its config and plan, its head, initialisation,
activation checkpointing, checkpoints, and the names its weights have in checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from folnet.arch.checkpoint import save_pretrained
from folnet.arch.config import ModelConfig
from folnet.arch.heads import Head, get_head
from folnet.arch.plan import ArchPlan, parse_plan
from folnet.arch.stack import Stack
from folnet.errors import FolnetError


class FolnetBase(nn.Module):
    """A FOLNet of one kind (set by `folnet.arch.kinds.register_kind`) with an optional head.

    ``STATE_KEYS`` maps module paths to the key prefixes checkpoints use, where the two differ
    (the text models were saved with flat names: ``atoms.*`` for ``decoder.atoms.*``): applied
    by ``state_dict`` and reversed by ``load_state_dict``, so every checkpoint keeps its keys.
    """

    kind: ClassVar[str] = "?"
    default_head: ClassVar[str | None] = None
    STATE_KEYS: ClassVar[tuple[tuple[str, str], ...]] = ()

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
            if num_labels < 1:
                raise FolnetError(f"num_labels must be >= 1 for head {self.head!r}, got "
                                  f"{num_labels}")
        self.num_labels = num_labels
        if self.STATE_KEYS:
            self.register_state_dict_post_hook(_saved_names)
            self.register_load_state_dict_pre_hook(_module_names)

    def add_head(self, word: nn.Embedding) -> None:
        """Register the head's modules under their checkpoint names."""
        if self.head_spec is not None:
            for name, module in self.head_spec.build(self.cfg, self.num_labels, word).items():
                self.add_module(name, module)

    def stacks(self) -> list[Stack]:
        return [m for m in self.children() if isinstance(m, Stack)]

    def reset_parameters(self) -> None:
        """BERT-style init: N(0, initializer_range) weights and embeddings, zero biases."""
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            else:
                nn.init.normal_(param, mean=0.0, std=self.cfg.initializer_range)

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each layer in the backward pass instead of keeping its activations."""
        for stack in self.stacks():
            stack.checkpointing = bool(enabled)

    def save_pretrained(self, directory: str | Path, extra: dict[str, Any] | None = None
                        ) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (see `folnet.arch.checkpoint`)."""
        return save_pretrained(self, directory, extra)


def _saved_names(module: FolnetBase, state_dict: dict, prefix: str, local_metadata) -> None:
    for key in list(state_dict):
        for path, saved in module.STATE_KEYS:
            if key.startswith(prefix + path):
                state_dict[prefix + saved + key[len(prefix + path):]] = state_dict.pop(key)
                break


def _module_names(module: FolnetBase, state_dict: dict, prefix: str, *args) -> None:
    for key in list(state_dict):
        for path, saved in module.STATE_KEYS:
            if key.startswith(prefix + saved):
                state_dict[prefix + path + key[len(prefix + saved):]] = state_dict.pop(key)
                break
