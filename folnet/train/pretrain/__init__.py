"""Pretraining: MLM + NSP/SOP over a corpus, with LAMB/AdamW, AMP, DDP/FSDP and exact resume.

* `config` holds every option of ``folnet pretrain`` (`PretrainConfig`);
* `inputs` is what a run reads: its tokenizer, its dataset, its stream of micro-batches;
* `setup_run` prepares a run (`set_up`): OUT claimed, data, model, optimiser, a resume restored;
* `loop` is the run itself (`pretrain`): the steps, their logs and checkpoints, the final model;
* `metrics` names what a step measures (`StepMetrics`) and makes the log records;
* `cli` registers the command; ``python -m folnet.train.pretrain`` (``__main__``) runs it,
  which is what ``torchrun ... -m folnet.train.pretrain`` launches on every process.

The package imports nothing itself: every ``folnet`` command imports ``cli`` to register
itself, and that must not load the training code.
"""
