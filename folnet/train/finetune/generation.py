"""Text-to-text finetuning from the Python API: a pretrained decoder or encoder-decoder taught to
answer prompts by generating the answer, scored by exact match and token F1 (SQuAD's
normalisation: `folnet.train.tasks.metrics`).

    model = finetune_generation("runs/decoder", prompts, answers, epochs=3, batch_size=16)
    answers = generate_answers(model, tokenizer, prompts)
    scores = score_answers(answers, gold)            # {"exact_match": ..., "f1": ...}

What the model learns from, by kind:

* decoder: the row ``prompt answer [SEP]``, padded on the right; the loss counts the answer's
  tokens and the end token only (the prompt's labels are -100);
* encoder-decoder: the prompt is the encoder's input, ``answer [SEP]`` the decoder's target.

Answers are generated greedily through the cached generation path until [SEP] (or
``max_new_tokens``). A prompt longer than ``max_len`` keeps its end (where the question is).
`folnet finetune` has no generation task yet; this is the library's text-to-text path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from folnet.arch import from_pretrained
from folnet.errors import FolnetError
from folnet.train.finetune.loop import LoopSettings, batches, finetune_model, num_batches
from folnet.train.finetune.warm_start import resolve_checkpoint
from folnet.train.tasks.encode import IGNORE_INDEX
from folnet.train.tasks.metrics import squad_exact, squad_f1

__all__ = ["encode_generation", "finetune_generation", "generate_answers", "score_answers"]

_GENERATIVE = ("decoder", "encoder-decoder")


def _kind(model: nn.Module) -> str:
    kind = model.cfg.kind
    if kind not in _GENERATIVE:
        raise FolnetError(f"text-to-text finetuning needs a decoder or an encoder-decoder; the "
                          f"checkpoint is an {kind}")
    return kind


def _rows(values: Sequence[list[int]], fill: int) -> torch.Tensor:
    width = max(len(v) for v in values)
    return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=torch.long)


def encode_generation(prompts: Sequence[str], answers: Sequence[str], tokenizer: Any, kind: str,
                      max_len: int = 256) -> dict[str, torch.Tensor]:
    """The training tensors of ``kind`` ("decoder" or "encoder-decoder") for prompt-answer
    pairs (see the module docstring)."""
    if len(prompts) != len(answers) or not prompts:
        raise FolnetError(f"text-to-text finetuning needs one answer per prompt, got "
                          f"{len(prompts)} prompts and {len(answers)} answers")
    if kind not in _GENERATIVE:
        raise FolnetError(f"kind must be 'decoder' or 'encoder-decoder', got {kind!r}")
    end, pad = tokenizer.sep_id, tokenizer.pad_id
    asked = [tokenizer.encode(p) for p in prompts]
    said = [[*tokenizer.encode(a), end] for a in answers]
    if kind == "encoder-decoder":
        inputs = [p[-max_len:] for p in asked]
        return {"input_ids": _rows(inputs, pad), "attention_mask": _rows([[1] * len(p)
                                                                          for p in inputs], 0),
                "labels": _rows(said, IGNORE_INDEX),
                "decoder_attention_mask": _rows([[1] * len(a) for a in said], 0)}
    rows, labels = [], []
    for p, a in zip(asked, said, strict=True):
        p = p[-max(1, max_len - len(a)):]  # the prompt's end: where the question is
        rows.append(p + a)
        labels.append([IGNORE_INDEX] * len(p) + a)
    return {"input_ids": _rows(rows, pad), "attention_mask": _rows([[1] * len(r) for r in rows],
                                                                   0),
            "labels": _rows(labels, IGNORE_INDEX)}


def finetune_generation(checkpoint: str | Path, prompts: Sequence[str], answers: Sequence[str],
                        *, epochs: int = 3, batch_size: int = 16,
                        settings: LoopSettings | None = None, seed: int = 0,
                        max_len: int = 256, device: str = "cpu") -> nn.Module:
    """A pretrained decoder or encoder-decoder (a saved model directory, or a run's) finetuned
    to generate ``answers`` from ``prompts``; its tokenizer is the checkpoint's."""
    from folnet.train.data.tokenizer import load_tokenizer

    where = resolve_checkpoint(checkpoint)
    torch.manual_seed(seed)
    model = from_pretrained(where)
    tensors = encode_generation(prompts, answers, load_tokenizer(where), _kind(model), max_len)
    order = torch.Generator().manual_seed(seed)
    finetune_model(model, lambda _epoch: batches(tensors, batch_size, shuffle=True,
                                                 generator=order),
                   num_batches(len(prompts), batch_size), epochs=epochs,
                   settings=settings or LoopSettings(lr=1e-3), device=device)
    return model.eval()


@torch.no_grad()
def generate_answers(model: nn.Module, tokenizer: Any, prompts: Sequence[str], *,
                     max_new_tokens: int = 8, batch_size: int = 32, max_len: int = 256
                     ) -> list[str]:
    """Each prompt's answer, generated greedily until [SEP] and decoded."""
    kind, end, pad = _kind(model), tokenizer.sep_id, tokenizer.pad_id
    device = next(model.parameters()).device
    model.eval()
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        asked = [tokenizer.encode(p)[-max_len:] for p in prompts[start:start + batch_size]]
        width = max(len(p) for p in asked)
        # prompts share one length: padded on the left (generate's rule), marked in the mask
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in asked], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in asked],
                            device=device)
        made = model.generate(ids, max_new_tokens=max_new_tokens, attention_mask=mask,
                              eos_token_id=end, pad_token_id=pad)
        new = made[:, width:] if kind == "decoder" else made[:, 1:]  # past the decoder's start
        for row in new.tolist():
            row = row[: row.index(end)] if end in row else row
            out.append(tokenizer.decode([t for t in row if t != pad],
                                        skip_special_tokens=True).strip())
    return out


def score_answers(predictions: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    """Exact match and token F1 (percent), SQuAD's normalisation."""
    if len(predictions) != len(golds) or not golds:
        raise FolnetError(f"score_answers needs one prediction per answer, got "
                          f"{len(predictions)} and {len(golds)}")
    em = sum(squad_exact(p, [g]) for p, g in zip(predictions, golds, strict=True))
    f1 = sum(squad_f1(p, [g]) for p, g in zip(predictions, golds, strict=True))
    return {"exact_match": 100.0 * em / len(golds), "f1": 100.0 * f1 / len(golds)}
