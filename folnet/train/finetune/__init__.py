"""Finetuning: a pretrained FOLNet under a task head, trained over seeds and scored.

* `config` holds every option of ``folnet finetune`` (`FinetuneConfig`);
* `data` reads and encodes a task's splits through its registered family (`folnet.train.tasks`);
* `checkpoint` loads the pretrained encoder under a new head and saves the finetuned model;
* `loop` is the generic training loop and batched prediction;
* `evaluate` scores splits and writes predictions (``folnet evaluate``);
* `run` is the whole multi-seed run (``folnet finetune``);
* `heads` trains multiple-choice and token-classification heads from Python;
* `cli` registers both commands.

`finetune`, `FinetuneConfig` and `load_finetune_config` are importable from here; they are
imported on first use, so that registering the commands does not load the training code.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FinetuneConfig", "finetune", "load_finetune_config"]

_HOMES = {"FinetuneConfig": "config", "load_finetune_config": "config", "finetune": "run"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
