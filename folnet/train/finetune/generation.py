"""Text-to-text finetuning: a pretrained decoder or encoder-decoder taught to answer prompts by
generating the answer, scored by exact match and token F1 (`folnet.train.tasks.generation`).

``folnet finetune --task kinship/generate`` (or ``clutrr/generate``) runs it through the usual
run machinery; from the Python API::

    model = finetune_generation("runs/decoder", prompts, answers, epochs=3, batch_size=16)
    answers = generate_answers(model, tokenizer, prompts)
    scores = score_answers(answers, gold)            # {"exact_match": ..., "f1": ...}

A split arrives as prompts and answers (``prompt_ids``/``prompt_mask``, ``answer_ids``/
``answer_mask``: right-padded, the answer ending in [SEP]); `text_to_text_batch` lays a batch
out for the model's kind:

* decoder: the row ``prompt answer [SEP]``, padded on the right; the loss counts the answer's
  tokens and the end token only (the prompt's labels are -100);
* encoder-decoder: the prompt is the encoder's input, ``answer [SEP]`` the decoder's target.

Answers are generated greedily through the cached generation path until [SEP] (or the task's
longest answer): `generate_split`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from folnet.arch import from_pretrained, read_metadata
from folnet.errors import FolnetError
from folnet.train.engine.amp import autocast
from folnet.train.finetune.loop import LoopSettings, batches, finetune_model, num_batches
from folnet.train.finetune.warm_start import resolve_checkpoint
from folnet.train.tasks.encode import IGNORE_INDEX
from folnet.train.tasks.generation import pad_rows
from folnet.train.tasks.metrics import squad_exact, squad_f1

__all__ = ["build_generation_model", "encode_generation", "finetune_generation",
           "generate_answers", "generate_split", "score_answers", "text_to_text_batch",
           "text_to_text_batches"]

GENERATIVE = ("decoder", "encoder-decoder")


def _kind(kind: str, where: str) -> str:
    if kind not in GENERATIVE:
        raise FolnetError(f"{where}: text-to-text finetuning needs a decoder or an "
                          f"encoder-decoder; this is an {kind} (pretrain one with folnet "
                          f"pretrain --kind decoder or --kind encoder-decoder)")
    return kind


def build_generation_model(checkpoint: Path, dropout: float | None = None) -> nn.Module:
    """The checkpoint's decoder or encoder-decoder with its LM head, ready to finetune."""
    _kind(read_metadata(checkpoint).get("kind", "encoder"), str(checkpoint))
    runtime = {} if dropout is None else {"dropout": float(dropout)}
    return from_pretrained(checkpoint, head="lm", **runtime)


def _rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [row[: int(n)] for row, n in zip(ids.tolist(), mask.sum(-1).tolist(), strict=True)]


def text_to_text_batch(kind: str, batch: Mapping[str, torch.Tensor], pad: int
                       ) -> dict[str, torch.Tensor]:
    """A batch of prompts and answers as the model of ``kind`` trains on it (module
    docstring), trimmed to its longest row."""
    prompts = _rows(batch["prompt_ids"], batch["prompt_mask"])
    answers = _rows(batch["answer_ids"], batch["answer_mask"])
    if kind == "encoder-decoder":
        input_ids, attention_mask = pad_rows(prompts, pad)
        answer_ids, answer_mask = pad_rows(answers, pad)
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "labels": answer_ids.masked_fill(answer_mask == 0, IGNORE_INDEX),
                "decoder_attention_mask": answer_mask}
    input_ids, attention_mask = pad_rows([p + a for p, a in zip(prompts, answers, strict=True)],
                                         pad)
    labels, _ = pad_rows([[IGNORE_INDEX] * len(p) + a
                          for p, a in zip(prompts, answers, strict=True)], IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def text_to_text_batches(kind: str, tensors: Mapping[str, torch.Tensor], batch_size: int, *,
                         pad: int, generator: torch.Generator | None = None
                         ) -> Iterator[dict[str, torch.Tensor]]:
    """Shuffled training batches of a prompt/answer split, laid out for ``kind``."""
    for batch in batches(tensors, batch_size, shuffle=True, generator=generator):
        yield text_to_text_batch(kind, batch, pad)


@torch.no_grad()
def generate_split(model: nn.Module, tensors: Mapping[str, torch.Tensor], *, end: int,
                   pad: int, max_new_tokens: int, batch_size: int = 32,
                   device: torch.device | str = "cpu", precision: str = "fp32"
                   ) -> dict[str, torch.Tensor]:
    """``generated`` [N, max_new_tokens]: each prompt's answer, greedy through the cached
    path, padded with ``pad`` after its end."""
    kind = _kind(model.cfg.kind, "the model")
    device = torch.device(device)
    model.to(device).eval()
    rows = _rows(tensors["prompt_ids"], tensors["prompt_mask"])
    out = torch.full((len(rows), max_new_tokens), pad, dtype=torch.long)
    for start in range(0, len(rows), batch_size):
        asked = rows[start:start + batch_size]
        width = max(len(p) for p in asked)
        # a batch's prompts share one length: padded on the left (generate's rule), masked
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in asked], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in asked],
                            device=device)
        with autocast(precision, device):
            made = model.generate(ids, max_new_tokens=max_new_tokens, attention_mask=mask,
                                  eos_token_id=end, pad_token_id=pad)
        new = made[:, width:] if kind == "decoder" else made[:, 1:]  # past the decoder's start
        out[start:start + len(asked), :new.shape[1]] = new.cpu()
    return {"generated": out}


def _split(prompts: Sequence[str], answers: Sequence[str], tokenizer: Any, max_len: int
           ) -> dict[str, torch.Tensor]:
    if len(prompts) != len(answers) or not prompts:
        raise FolnetError(f"text-to-text finetuning needs one answer per prompt, got "
                          f"{len(prompts)} prompts and {len(answers)} answers")
    said = [[*tokenizer.encode(a), tokenizer.sep_id] for a in answers]
    keep = max(1, max_len - max(len(a) for a in said))
    asked = [tokenizer.encode(p)[-keep:] for p in prompts]  # the prompt's end: the question
    prompt_ids, prompt_mask = pad_rows(asked, tokenizer.pad_id)
    answer_ids, answer_mask = pad_rows(said, tokenizer.pad_id)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "answer_ids": answer_ids,
            "answer_mask": answer_mask}


def encode_generation(prompts: Sequence[str], answers: Sequence[str], tokenizer: Any, kind: str,
                      max_len: int = 256) -> dict[str, torch.Tensor]:
    """The training tensors of ``kind`` ("decoder" or "encoder-decoder") for prompt-answer
    pairs (see the module docstring)."""
    if kind not in GENERATIVE:
        raise FolnetError(f"kind must be 'decoder' or 'encoder-decoder', got {kind!r}")
    return text_to_text_batch(kind, _split(prompts, answers, tokenizer, max_len),
                              tokenizer.pad_id)


def finetune_generation(checkpoint: str | Path, prompts: Sequence[str], answers: Sequence[str],
                        *, epochs: int = 3, batch_size: int = 16,
                        settings: LoopSettings | None = None, seed: int = 0,
                        max_len: int = 256, device: str = "cpu") -> nn.Module:
    """A pretrained decoder or encoder-decoder (a saved model directory, or a run's) finetuned
    to generate ``answers`` from ``prompts``; its tokenizer is the checkpoint's."""
    from folnet.train.data.tokenizer import load_tokenizer

    where = resolve_checkpoint(checkpoint)
    torch.manual_seed(seed)
    model = build_generation_model(where)
    tokenizer = load_tokenizer(where)
    tensors = _split(prompts, answers, tokenizer, max_len)
    order = torch.Generator().manual_seed(seed)
    finetune_model(model, lambda _epoch: text_to_text_batches(
                       model.cfg.kind, tensors, batch_size, pad=tokenizer.pad_id,
                       generator=order),
                   num_batches(len(prompts), batch_size), epochs=epochs,
                   settings=settings or LoopSettings(lr=1e-3), device=device)
    return model.eval()


def generate_answers(model: nn.Module, tokenizer: Any, prompts: Sequence[str], *,
                     max_new_tokens: int = 8, batch_size: int = 32, max_len: int = 256
                     ) -> list[str]:
    """Each prompt's answer, generated greedily until [SEP] and decoded."""
    tensors = _split(prompts, [""] * len(prompts), tokenizer, max_len)
    device = next(model.parameters()).device
    made = generate_split(model, tensors, end=tokenizer.sep_id, pad=tokenizer.pad_id,
                          max_new_tokens=max_new_tokens, batch_size=batch_size, device=device)
    out = []
    for row in made["generated"].tolist():
        row = row[: row.index(tokenizer.sep_id)] if tokenizer.sep_id in row else row
        out.append(tokenizer.decode([t for t in row if t != tokenizer.pad_id],
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
