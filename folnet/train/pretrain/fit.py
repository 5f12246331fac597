"""Pretraining's side of fitting the step to the machine (`folnet.train.engine.memory_budget`).

The estimate is made on a meta-device copy of the run's model (no memory, little time): the
`folnet.arch.info` count of what autograd saves per sequence, in the memory mode the layers
will run at this length, plus the head's logits: an encoder's at the predicted positions, a
decoder's at every position (a decoder's layers are counted on an encoder of the same shape).
"""

from __future__ import annotations

import torch

from folnet.arch.info import saved_bytes
from folnet.arch.layer.memory_modes import auto_blocks
from folnet.train.engine.memory_budget import Fit, StepMemory, fit_batch, resolve_budget
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.pretrain.inputs import build_pretraining_model

__all__ = ["fit_pretraining_batch", "pretraining_step_memory"]


def pretraining_step_memory(config: PretrainConfig, vocab_size: int, device: torch.device
                            ) -> StepMemory:
    """`StepMemory` of one pretraining step of ``config``'s model on ``device``."""
    with torch.device("meta"):
        # a decoder's layers save what an encoder's of the same shape save, plus a visibility
        # matrix per sequence (small beside the square): counted on the encoder
        model = build_pretraining_model(config.replace(kind="encoder", objective="nsp",
                                                       heldout=0.0),
                                        vocab_size)
    # the layers' mode on the run's device ("tight" saves what "blocked" saves: the inputs of
    # each recomputed stage)
    mode = config.memory_mode
    if mode == "auto":
        mode = "blocked" if auto_blocks(config.seq_len, device.type) else "full"
    saved = saved_bytes(model, config.seq_len, mode)
    parameters = sum(p.numel() for p in model.parameters())
    # the logits, their softmax and gradient, float32 x 3: an encoder's at the predicted
    # positions [P, V], a decoder's at every position [T, V]
    rows = {"decoder": config.seq_len, "encoder-decoder": config.seq_len}.get(
        config.kind, config.max_predictions)
    head = 3 * 4 * rows * vocab_size
    return StepMemory.of(saved, head, parameters, device)


def fit_pretraining_batch(config: PretrainConfig, vocab_size: int, device: torch.device,
                          world_size: int) -> tuple[PretrainConfig, Fit]:
    """``config`` with the fewest micro-batches (``grad_accum``, never fewer than asked) whose
    step fits ``--memory-budget``, and the `Fit` (its ``message`` says what was split)."""
    memory = pretraining_step_memory(config, vocab_size, device)
    budget, source = resolve_budget(config.memory_budget, device, memory=memory)
    fit = fit_batch(config.batch_size, config.grad_accum, world_size, memory, budget, source,
                    seq_len=config.seq_len)
    return config.replace(grad_accum=fit.grad_accum), fit
