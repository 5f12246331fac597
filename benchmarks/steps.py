"""The training steps the speed benchmarks measure: folnet's own (`folnet.train.pretrain.loop
.train_step`, as ``folnet pretrain`` runs it) and transformers' BertForPreTraining of the same
width, depth, heads and FFN width, each as one callable that takes a whole step.

Used by benchmarks/step_census.py (what a step launches), benchmarks/compile_step.py (eager
against compiled) and benchmarks/gpu_speed.py (the GPU check's speed stage).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import folnet
from folnet.ops.primitives.device import emulate


@dataclass
class Step:
    """One model's whole training step (``run``: forward, loss, backward, gradient norm,
    optimiser step), the modules and optimiser it uses, and how its modules name parts."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    part_of: Callable[[str], str | None]
    run: Callable[[], object]
    path: str = "cpu"


_FOLNET_PARTS = ((r"(^|\.)atoms($|\.)", "atoms"), (r"\.ffn_u($|\.)", "unary FFN"),
                 (r"\.ffn_b($|\.)", "binary FFN"), (r"\.layers\.\d+$", "mixer"),
                 (r"(^|\.)pooler$", "heads"), (r"(^|\.)(mlm|nsp)($|\.)", "heads"),
                 (r"^$", "model"))
_BERT_PARTS = ((r"\.embeddings($|\.)", "atoms"), (r"\.attention($|\.)", "mixer"),
               (r"\.(intermediate|output)($|\.)", "unary FFN"), (r"\.pooler($|\.)", "heads"),
               (r"^cls($|\.)", "heads"), (r"^$", "model"))


def _parts(table) -> Callable[[str], str | None]:
    compiled = [(re.compile(p), part) for p, part in table]

    def part_of(name: str) -> str | None:
        for pattern, part in compiled:
            if pattern.search(name):
                return part
        return None
    return part_of


def _batch(vocab: int, batch: int, seq_len: int, predictions: int, seed: int = 0
           ) -> dict[str, torch.Tensor]:
    """A masked batch: random ids, two segments, ``predictions`` targets per row, NSP labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq_len), generator=g)
    types = torch.zeros_like(ids)
    types[:, seq_len // 2:] = 1
    labels = torch.full_like(ids, -100)
    for row in range(batch):
        at = torch.randperm(seq_len - 1, generator=g)[:predictions] + 1
        labels[row, at] = ids[row, at]
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids),
            "mlm_labels": labels, "nsp_labels": torch.randint(0, 2, (batch,), generator=g)}


def folnet_step(preset: str, ops: str = "jmc.atp", *, path: str = "cpu", batch: int = 2,
                seq_len: int = 32, optimizer: str = "adamw", dropout: float = 0.1,
                backend: str = "auto", compile_mode: str | None = None,
                compile_backend: str = "inductor", device: str = "cpu",
                precision: str = "fp32", vocab_size: int | None = None, **model: Any) -> Step:
    """folnet's own pretraining step (`folnet.train.pretrain.loop.train_step`): the module
    DDP wraps, its loss, gradient norm, guard and optimiser, as ``folnet pretrain`` runs them
    on ``device`` (``path``: the device whose kernel choices a CPU run makes; the optimiser is
    built on them: on CUDA torch's fused AdamW). ``compile_mode``: as ``--compile`` compiles
    it; ``precision``: fp32 or bf16 (autocast)."""
    from folnet.train.data import masking
    from folnet.train.engine.distributed import DistContext
    from folnet.train.engine.guard import StepGuard
    from folnet.train.engine.optim import build_optimizer, build_scheduler
    from folnet.train.pretrain.config import PretrainConfig
    from folnet.train.pretrain.loop import train_step
    from folnet.train.pretrain.setup_run import PretrainingForward

    torch.manual_seed(0)
    extra = {} if vocab_size is None else {"vocab_size": vocab_size}
    with emulate("cuda" if path == "cuda" else "cpu"):
        net = folnet.build_model(ops, preset=preset, head="pretraining", dropout=dropout,
                                 attention_dropout=dropout, backend=backend, **extra,
                                 **model).to(device).train()
        defaults = PretrainConfig()
        # as setup_run sets it (a checkout before the slots, which a census "before" runs,
        # took max_predictions as a flag: its exact gather)
        most = getattr(masking, "most_targets", lambda t, p, m: m)
        net.gather_mlm = most(seq_len, defaults.mlm_probability, defaults.max_predictions)
        net.relations = False
        opt = build_optimizer(net, optimizer, lr=1e-4)
    config = PretrainConfig(batch_size=batch, seq_len=seq_len, optimizer=optimizer,
                            trim_padding=False, steps=10**6, compile=compile_mode is not None,
                            precision=precision)
    engine = PretrainingForward(net)
    if compile_mode is not None:  # as `folnet pretrain --compile` does (`compile_module`)
        engine.compile(fullgraph=True, mode=compile_mode, backend=compile_backend)
    run = _Run(config=config, ctx=DistContext(device=torch.device(device)), model=net,
               engine=engine, optimizer=opt,
               scheduler=build_scheduler(opt, 10**6, warmup_ratio=0.0),
               scaler=torch.amp.GradScaler(torch.device(device).type, enabled=False))
    guard = StepGuard(10**6, what="census", lr=1e-4)
    micro = [_batch(net.cfg.vocab_size, batch, seq_len, net.gather_mlm)]
    counter = iter(range(1, 10**9))
    return Step(net, opt, _parts(_FOLNET_PARTS),
                lambda: train_step(run, micro, guard, next(counter), slice(None)), path)


@dataclass
class _Run:
    """The parts of `folnet.train.pretrain.setup_run.Run` a step reads."""

    config: Any
    ctx: Any
    model: nn.Module
    engine: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any


def bert_step(preset: str, *, path: str = "cpu", batch: int = 2, seq_len: int = 32,
              dropout: float = 0.1, device: str = "cpu", precision: str = "fp32",
              compile_mode: str | None = None, compile_backend: str = "inductor",
              vocab_size: int | None = None) -> Step:
    """transformers' BertForPreTraining of the preset's width, depth, heads and FFN width
    (SDPA attention): MLM + NSP loss, backward, the global gradient norm, AdamW (fused on
    CUDA, as folnet's), on ``device``; ``precision`` bf16: autocast; ``compile_mode``: its
    forward and loss compiled (``fullgraph=False``: transformers' own graph breaks are its)."""
    from transformers import BertConfig, BertForPreTraining

    from folnet.train.engine.guard import gradient_norm
    from folnet.train.engine.optim import build_optimizer

    cfg = folnet.build_model("j.a", preset=preset).cfg
    vocab = cfg.vocab_size if vocab_size is None else vocab_size
    torch.manual_seed(0)
    bert = BertForPreTraining(BertConfig(
        vocab_size=vocab, hidden_size=cfg.D1, num_hidden_layers=cfg.L,
        num_attention_heads=cfg.H, intermediate_size=cfg.F1, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout, attn_implementation="sdpa",
        max_position_embeddings=max(512, seq_len))).to(device).train()
    with emulate("cuda" if path == "cuda" else "cpu"):
        opt = build_optimizer(bert, "adamw", lr=1e-4)
    b = {k: v.to(device) for k, v in _batch(vocab, batch, seq_len, 20).items()}
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                              enabled=precision == "bf16")

    def loss() -> torch.Tensor:
        with autocast:
            return bert(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                        attention_mask=b["attention_mask"], labels=b["mlm_labels"],
                        next_sentence_label=b["nsp_labels"]).loss

    forward = loss if compile_mode is None else torch.compile(loss, mode=compile_mode,
                                                              backend=compile_backend)

    def run() -> None:
        forward().backward()
        gradient_norm(bert)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Step(bert, opt, _parts(_BERT_PARTS), run, path)
