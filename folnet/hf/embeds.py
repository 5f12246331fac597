"""``inputs_embeds``: a forward call on given input vectors instead of token ids.

folnet's models look their ids up in one word embedding (shared by an encoder-decoder's two
stacks) and never read the vectors any other way, so the transformers classes run the native
forward on placeholder ids and replace the lookup's result (`embeddings_given`): one path for
every kind, no second copy of the stacks' inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from folnet.errors import FolnetError


def ids_for(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
            names: str = "input_ids and inputs_embeds") -> torch.Tensor | None:
    """The ids a forward call runs on: ``input_ids``, or with ``inputs_embeds`` (B, [C,] T, D1)
    placeholder ids (zeros) of its shape, whose lookup `embeddings_given` replaces."""
    if inputs_embeds is None:
        return input_ids
    if input_ids is not None:
        raise FolnetError(f"{names}: give one of them, not both")
    if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() < 3:
        raise FolnetError(f"inputs_embeds must be a (batch, tokens, D1) tensor, got "
                          f"{getattr(inputs_embeds, 'shape', type(inputs_embeds).__name__)}")
    return torch.zeros(inputs_embeds.shape[:-1], dtype=torch.long,
                       device=inputs_embeds.device)


@contextlib.contextmanager
def embeddings_given(word: nn.Module, given: list[torch.Tensor | None]) -> Iterator[None]:
    """Inside, the word embedding's calls return the tensors of ``given`` in turn (None: its
    own lookup) -- the encoder's lookup comes first, then the decoder's -- and then its own
    again: ``inputs_embeds`` without a second path through every model kind. The tied heads
    read the embedding's weight, not its call, and are untouched."""
    queue = list(given)
    if not any(g is not None for g in queue):
        yield
        return

    def replace(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        embeds = queue.pop(0) if queue else None
        if embeds is None:
            return output
        if embeds.numel() != output.numel() or embeds.shape[-1] != output.shape[-1]:
            raise FolnetError(f"inputs_embeds: {tuple(embeds.shape)} does not match the "
                              f"lookup it replaces, {tuple(output.shape)}")
        return embeds.reshape(output.shape).to(output.dtype)

    handle = word.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()
