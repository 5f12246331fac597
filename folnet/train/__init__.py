"""Training FOLNet: pretraining, finetuning and operator ablations, in one folder per job.

* `data`      pretraining data: corpus documents, tokenizer, NSP/SOP pairs, masking, and the
              generated kinship world;
* `pretrain`  ``folnet pretrain``: MLM + NSP/SOP with exact resume;
* `finetune`  ``folnet finetune`` and ``folnet evaluate``: task heads over a pretrained encoder;
* `tasks`     the finetuning tasks (GLUE, SQuAD 2.0, FOLIO, CLUTRR, kinship), each a registered
              family that reads, encodes and scores its data;
* `ablate`    ``folnet ablate``: pretrain and finetune every row of a plan, then report;
* `engine`    what every training loop shares: mixed precision, optimisers and schedules,
              processes and devices, logs, checkpoints and training state;
* `options`   run options as frozen dataclasses, their flags and their layered TOML files.
"""
