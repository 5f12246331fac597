"""Pretraining: MLM + NSP/SOP over a corpus, with LAMB/AdamW, AMP, DDP/FSDP and exact resume.

* `config` holds every option of ``folnet pretrain`` (`PretrainConfig`);
* `inputs` is what a run reads: its tokenizer, its dataset, its stream of micro-batches;
* `loop` is the run itself (`pretrain`): model, optimiser, steps, logs, checkpoints;
* `cli` registers the command; ``python -m folnet.train.pretrain`` (``__main__``) runs it,
  which is what ``torchrun ... -m folnet.train.pretrain`` launches on every process.

`pretrain`, `PretrainConfig` and `load_pretrain_config` are importable from here; they are
imported on first use, so that registering the command does not load the training code.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PretrainConfig", "load_pretrain_config", "pretrain"]

_HOMES = {"PretrainConfig": "config", "load_pretrain_config": "config", "pretrain": "loop"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
