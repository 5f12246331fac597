"""Growing or shrinking a model's vocabulary after new tokens were added to its tokenizer.

The word embedding has ``padded_vocab`` rows (the vocabulary rounded up to a multiple of
``vocab_multiple``: 8 as built, what was asked after a resize);
the MLM and LM heads are tied to it and carry one bias entry per row. Resizing replaces the
embedding's weight in place (the module object stays, so every head and the encoder-decoder's
decoder atoms, which hold the module, stay tied to it), resizes those biases, and gives every
module of the model the config with the new ``vocab_size``.

New rows follow the convention transformers uses (``mean_resizing``): drawn around the mean of
the old rows with 1e-9 of their covariance (exactly the mean where that covariance is not
positive definite), so that the new tokens start with the logits of an average old token and
barely move the model's predictions; the heads' new bias entries likewise, around the old
mean. Without ``mean_resizing`` they are drawn like a fresh model's (N(0, initializer_range),
zero biases). Rows of the padding beyond the vocabulary are never read and start as a fresh
model's.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from folnet.arch.config import SIZE_LIMITS, ModelConfig
from folnet.errors import FolnetError

__all__ = ["replace_word_embedding", "resize_vocabulary"]


def _mean_rows(old: torch.Tensor, count: int, generator: torch.Generator | None
               ) -> torch.Tensor:
    """``count`` rows around the mean of ``old`` (R, D) with 1e-9 of its covariance."""
    rows = old.detach().float()
    mean = rows.mean(0)  # (D,)
    centred = rows - mean
    cov = 1e-9 * (centred.T @ centred) / rows.shape[0]  # (D, D)
    factor, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0:  # not positive definite: the mean itself
        return mean.expand(count, -1).clone()
    noise = torch.randn(count, rows.shape[1], generator=generator)
    return mean + noise @ factor.T  # (count, D)


def resize_vocabulary(model: nn.Module, vocab_size: int, *, mean_resizing: bool = True,
                      pad_to_multiple_of: int | None = None,
                      generator: torch.Generator | None = None) -> nn.Embedding:
    """Resize ``model``'s vocabulary to ``vocab_size`` ids, the embedding to exactly that many
    rows -- or, with ``pad_to_multiple_of``, rounded up to a multiple of it (as transformers'
    ``resize_token_embeddings``); returns the word embedding."""
    cfg: ModelConfig = model.cfg
    for name, value, limit in (("vocab_size", vocab_size, SIZE_LIMITS["vocab_size"]),
                               ("pad_to_multiple_of", 1 if pad_to_multiple_of is None
                                else pad_to_multiple_of, SIZE_LIMITS["vocab_multiple"])):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise FolnetError(f"{name} must be an integer in [1, {limit}], got {value!r}")
    new_cfg = cfg.replace(vocab_size=vocab_size, vocab_multiple=pad_to_multiple_of or 1)
    if new_cfg.padded_vocab == cfg.padded_vocab and vocab_size == cfg.vocab_size:
        return model.word_embedding()
    old_v, rows = cfg.vocab_size, new_cfg.padded_vocab
    kept = min(old_v, vocab_size)
    word = model.word_embedding()
    old = word.weight
    with torch.no_grad():
        weight = old.new_empty(rows, old.shape[1]).normal_(0.0, cfg.initializer_range,
                                                            generator=generator)
        weight[:kept] = old[:kept]
        if vocab_size > old_v and mean_resizing:
            weight[old_v:vocab_size] = _mean_rows(old[:old_v], vocab_size - old_v,
                                                  generator).to(old.dtype)
    word.weight = nn.Parameter(weight, requires_grad=old.requires_grad)
    word.num_embeddings = rows
    for module in model.modules():  # the heads tied to the embedding: one bias per row
        if getattr(module, "_word", None) is word and isinstance(getattr(module, "bias", None),
                                                                 nn.Parameter):
            module.bias = nn.Parameter(_resized_bias(module.bias, old_v, vocab_size, rows,
                                                     mean_resizing, generator),
                                       requires_grad=module.bias.requires_grad)
    _give_config(model, cfg, new_cfg)
    if getattr(model, "num_labels", None) == old_v and model.head == "lm":
        model.num_labels = vocab_size  # a text model's outputs are its vocabulary
    return word


def _give_config(model: nn.Module, old: ModelConfig, new: ModelConfig) -> None:
    """Every module of ``model`` that holds ``old`` gets ``new``."""
    for module in model.modules():
        if getattr(module, "cfg", None) is old:
            module.cfg = new


def _resized_bias(bias: torch.Tensor, old_v: int, new_v: int, rows: int, mean_resizing: bool,
                  generator: torch.Generator | None) -> torch.Tensor:
    kept = min(old_v, new_v)
    with torch.no_grad():
        out = bias.new_zeros(rows)
        out[:kept] = bias[:kept]
        if new_v > old_v and mean_resizing:
            old = bias[:old_v].detach().float()
            spread = 1e-9 * float(old.std()) if old_v > 1 else 0.0
            noise = torch.randn(new_v - old_v, generator=generator) * spread
            out[old_v:new_v] = (old.mean() + noise).to(bias.dtype)
    return out


def replace_word_embedding(model: nn.Module, new: nn.Module) -> nn.Module:
    """Put ``new`` wherever ``model`` holds its word embedding -- the atoms that own or share
    it and every head tied to it -- so the model reads and predicts through ``new`` alone
    (transformers' ``set_input_embeddings``; PEFT's trainable-token wrappers use it).

    An embedding of another shape is taken too, as transformers' models take it: the
    vocabulary becomes its rows (no padding) and the tied heads' biases are cut or extended
    with zeros; one whose width is not D1 is kept with a warning, since no forward pass can
    read it (growing the vocabulary the usual way is ``resize_token_embeddings``)."""
    old = model.word_embedding()
    weight = getattr(new, "weight", None)
    if not isinstance(new, nn.Module) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise FolnetError(f"set_input_embeddings needs a module with a 2-D weight (an "
                          f"nn.Embedding), got {type(new).__name__}")
    cfg: ModelConfig = model.cfg
    if tuple(weight.shape) != tuple(old.weight.shape):
        rows = weight.shape[0]
        if weight.shape[1] != cfg.D1:
            warnings.warn(f"set_input_embeddings: the new embedding is {rows} x "
                          f"{weight.shape[1]}, the model's width D1 is {cfg.D1}: its forward "
                          f"fails until an embedding of width {cfg.D1} is set", stacklevel=3)
        for module in model.modules():
            if getattr(module, "_word", None) is old and isinstance(
                    getattr(module, "bias", None), nn.Parameter):
                with torch.no_grad():
                    bias = module.bias.new_zeros(rows)
                    kept = min(rows, module.bias.shape[0])
                    bias[:kept] = module.bias[:kept]
                module.bias = nn.Parameter(bias, requires_grad=module.bias.requires_grad)
        _give_config(model, cfg, cfg.replace(vocab_size=rows, vocab_multiple=1))
    for module in model.modules():
        for name, child in list(module._modules.items()):
            if child is old:
                module._modules[name] = new
        for name in ("_word", "_shared_word"):  # tied heads, a decoder's shared atoms
            if module.__dict__.get(name) is old:
                object.__setattr__(module, name, new)
    return new
