"""What a forward pass returns: dataclasses that also behave like the ordered dictionaries of
`transformers.utils.ModelOutput`, without needing transformers.

Fields that are None are not in the dictionary view; ``out[0]`` is the first field that is set
(the loss, when there is one: it comes first), ``out["logits"]`` a field by name, ``dict(out)``
and ``out.to_tuple()`` what is set, in field order. Each output class is a pytree node, so
``torch.export``, ``torch.compile`` and DDP see through it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.utils._pytree as pytree


class ModelOutput(OrderedDict):
    """Base of the output dataclasses (decorate subclasses with ``@dataclass(eq=False)``; every
    field defaults to None)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        pytree.register_pytree_node(
            cls, lambda out: (list(out.values()), list(out.keys())),
            lambda values, keys: cls(**dict(zip(keys, values, strict=True))),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        self._refresh()

    def _refresh(self) -> None:
        """The dictionary view: the fields that are set, in field order."""
        OrderedDict.clear(self)
        for f in fields(self):
            value = self.__dict__.get(f.name)
            if value is not None:
                OrderedDict.__setitem__(self, f.name, value)

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            return OrderedDict.__getitem__(self, key)
        return self.to_tuple()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in {f.name for f in fields(self)}:
            raise KeyError(f"{type(self).__name__} has no field {key!r}")
        setattr(self, key, value)

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"fields of {type(self).__name__} cannot be deleted; set them to None")

    def __reduce__(self):
        return type(self), (), {f.name: self.__dict__.get(f.name) for f in fields(self)}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def to_tuple(self) -> tuple[Any, ...]:
        """The fields that are set, in field order (the loss first when set)."""
        return tuple(self.values())


@dataclass(eq=False)
class FolnetOutput(ModelOutput):
    """An encoder's forward pass (with its head's fields)."""

    loss: torch.Tensor | None = None
    sequence_output: torch.Tensor | None = None  # (B, T, D1) final unary atoms
    pooled_output: torch.Tensor | None = None  # (B, D1) tanh(Linear) of token 0
    relation_output: torch.Tensor | None = None  # (B, T, T, D2) final binary atoms; only when
    # asked for (``output_relations=True`` or the model's ``relations``)
    mlm_logits: torch.Tensor | None = None  # (B, T, V) or (N, V) when only masked positions
    nsp_logits: torch.Tensor | None = None  # (B, 2)
    logits: torch.Tensor | None = None  # task head
    start_logits: torch.Tensor | None = None  # qa
    end_logits: torch.Tensor | None = None  # qa
    mlm_labels: torch.Tensor | None = None  # the labels matching mlm_logits rows when gathered
    # on request (`folnet.arch.layer.stack.Record`): L + 1 unary states (B, T, D1), the last the
    # sequence output; binary states (B, T, T, D2) likewise (with output_relations); per layer
    # {operator: activated softmax kernel}
    hidden_states: tuple[torch.Tensor, ...] | None = None
    relation_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[dict[str, torch.Tensor], ...] | None = None


@dataclass(eq=False)
class TextOutput(ModelOutput):
    """A text-to-text forward pass; for the encoder-decoder the sequence/relation outputs are the
    decoder's (M rows; relations over inputs then targets)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, V) next-token logits
    sequence_output: torch.Tensor | None = None  # (B, T, D1) final unary atoms
    relation_output: torch.Tensor | None = None  # (B, T, n, D2) final binary atoms
    encoder_sequence_output: torch.Tensor | None = None  # (B, N, D1)
    encoder_relation_output: torch.Tensor | None = None  # (B, N, N, D2)
    # on request, as `FolnetOutput`'s (the decoder's; then the encoder's)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    relation_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[dict[str, torch.Tensor], ...] | None = None
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_relation_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[dict[str, torch.Tensor], ...] | None = None


def recorded(record: Any, prefix: str = "") -> dict[str, Any]:
    """The output fields a `folnet.arch.layer.stack.Record` filled, as tuples (``prefix``
    "encoder_" for an encoder-decoder's encoder)."""
    if record is None:
        return {}
    pairs = (("hidden_states", record.hidden), ("relation_states", record.relations),
             ("attentions", record.attentions))
    return {prefix + name: tuple(value) for name, value in pairs if value is not None}
