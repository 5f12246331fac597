"""What every training loop shares:

* `amp`: bf16/fp16 autocast and loss scaling; `optim` and `lamb`: the optimisers and warmup
  schedules; `compiled`: the compiled training step;
* `distributed`: devices, torchrun processes, DDP/FSDP, batch sharding; `peers`: joining the
  other machines' ranks (the network interface, one-line ends for a peer lost or unreachable);
* `step_checkpoints`: atomic training checkpoints on disk, found and checked on resume;
  `sharded`: FSDP's checkpoints, written by every rank; `state`: what each rank saves and
  restores;
* `guard`: non-finite losses and weights; `memory_budget`: fitting a step's batch to the
  memory; `lock` and `outdir`: one run per ``--out``, owning only it; `runlog`: the JSONL/CSV/
  TensorBoard logs and the progress lines; `procs`: child processes that end with their
  parent.
"""
