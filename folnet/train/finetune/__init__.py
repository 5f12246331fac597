"""Finetuning: a pretrained FOLNet under a task head, trained over seeds and scored.

* `config` holds every option of ``folnet finetune`` (`FinetuneConfig`);
* `data` reads and encodes a task's splits through its registered family (`folnet.train.tasks`);
* `warm_start` loads the pretrained encoder under a new head and saves the finetuned model;
* `loop` is the generic training loop and batched prediction;
* `evaluate` scores splits and writes predictions (``folnet evaluate``);
* `run` is the whole multi-seed run (``folnet finetune``);
* `from_python` trains multiple-choice and token-classification heads from Python data;
* `generation` finetunes the text kinds on text-to-text tasks from Python;
* `cli` registers both commands.

The package imports nothing itself: every ``folnet`` command imports ``cli`` to register
itself, and that must not load the training code.
"""
