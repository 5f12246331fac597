"""Finetuning: a pretrained FOLNet under a task head, trained over seeds and scored.

* `config` holds every option of ``folnet finetune``; `data` reads and encodes a task's splits
  through its registered family (`folnet.train.tasks`); `checkpoint` loads the pretrained
  encoder and saves the finetuned model; `loop` is the generic training loop and prediction;
  `evaluate` scores splits and writes predictions (``folnet evaluate``); `run` is the whole
  multi-seed run (``folnet finetune``); `heads` trains multiple-choice and
  token-classification heads from Python.
"""

from folnet.train.finetune.config import FinetuneConfig, load_finetune_config
from folnet.train.finetune.run import finetune

__all__ = ["FinetuneConfig", "finetune", "load_finetune_config"]
