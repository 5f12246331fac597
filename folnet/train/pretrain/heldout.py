"""A decoder's or an encoder-decoder's held-out loss: the run's objective over the documents
``--heldout`` kept out of training (`folnet.train.data.packing.heldout_documents`), computed at
every checkpoint and appended to ``OUT/heldout.jsonl`` (step, loss per target token,
perplexity, rows, targets).

Every process reads the same rows and runs its shard of each batch through the run's engine
(so FSDP's sharded layers run as in training), in eval mode (no dropout: the measurement draws
no random number, and a resumed run measures what the uninterrupted one did); the sums are
reduced over the processes.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from torch.utils.data import DataLoader

from folnet.train.engine.amp import autocast
from folnet.train.engine.distributed import all_reduce_sum, shard_slice, to_device
from folnet.train.pretrain.objectives import engine_inputs

__all__ = ["HELDOUT_LOG", "measure_heldout"]

#: The file a run's held-out measurements are appended to, under OUT.
HELDOUT_LOG = "heldout.jsonl"


def measure_heldout(run: Any, step: int) -> dict[str, float] | None:
    """Measure ``run``'s held-out rows at ``step`` and record it (rank 0 writes); None when the
    run holds none out."""
    if run.heldout is None:
        return None
    config, ctx = run.config, run.ctx
    rows = shard_slice(config.micro_batch, ctx)
    sums = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # loss sum, targets
    # with several processes every one runs every batch (FSDP gathers its layers in each
    # forward): a last batch too small to shard is left out
    loader = DataLoader(run.heldout, batch_size=config.micro_batch, shuffle=False,
                        collate_fn=run.collator.collate,
                        drop_last=ctx.world_size > 1 and len(run.heldout) >= config.micro_batch)
    was_training = run.engine.training
    run.engine.eval()
    try:
        with torch.no_grad():
            for batch in loader:
                here = {k: v[rows] for k, v in batch.items()}
                if here["input_ids"].shape[0] == 0:  # one process, or too few rows to shard
                    continue
                local = to_device(here, ctx.device)
                with autocast(config.precision, ctx.device):
                    loss_sum, _, _, _, targets = run.engine(
                        *engine_inputs(config.kind, local, local["attention_mask"]))
                sums += torch.stack([loss_sum.double(), targets.double()])
    finally:
        run.engine.train(was_training)
    loss_sum, targets = all_reduce_sum(sums, ctx).tolist()
    loss = loss_sum / max(targets, 1.0)
    record = {"step": step, "loss": loss, "perplexity": math.exp(min(loss, 700.0)),
              "rows": len(run.heldout), "targets": int(targets)}
    if ctx.is_main:
        with open(run.out / HELDOUT_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
        run.logger.message(f"step {step}: held-out loss {loss:.4f}, perplexity "
                           f"{record['perplexity']:.2f} ({len(run.heldout)} rows)")
    return record
