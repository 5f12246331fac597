"""What every training loop shares: `amp` (bf16/fp16 autocast, loss scaling), `optim` (LAMB,
AdamW, warmup schedules), `distributed` (devices, torchrun processes, DDP/FSDP, batch
sharding), `runlog` (JSONL/CSV/TensorBoard logs and the progress bar), `checkpoints` (atomic
training checkpoints on disk), `state` (what each rank saves and restores) and `procs`
(child processes that end with their parent)."""
