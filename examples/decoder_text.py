"""A FOLNet decoder that writes: pretrain a small causal language model on the English kinship
stories with a byte-level BPE, then continue a few prompts and print the text it writes.

    python examples/decoder_text.py --out runs/decoder-text              # the recipe below
    python examples/decoder_text.py --out runs/quick --steps 20          # a smoke run

The recipe (``folnet pretrain --kind decoder --objective clm`` through the Python API): jmc.atp
at the tiny preset (D1 64, L 2, D2 16), 400 steps of batch 32 over 64-token rows of 3,000
packed documents, AdamW at 3e-3, a 1,000-token BPE. Generation is greedy through the cached
path; the text is the BPE's, decoded exactly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from folnet.arch import from_pretrained
from folnet.train.data.tokenizer import load_tokenizer
from folnet.train.pretrain.config import load_pretrain_config
from folnet.train.pretrain.loop import pretrain

PROMPTS = ("Judith is the daughter of", "John taught his son", "The whole family met at")


def write(out: str, steps: int, documents: int, new_tokens: int) -> list[tuple[str, str]]:
    """Pretrain the decoder into ``out``; each prompt with the text the decoder writes after
    it."""
    config = load_pretrain_config(None, {
        "kind": "decoder", "objective": "clm", "ops": "jmc.atp", "preset": "tiny",
        "model": {"dropout": 0.0}, "data": "kinship", "kinship_documents": documents,
        "tokenizer_model": "bpe", "vocab_size": 1000, "seq_len": 64, "batch_size": 32,
        "steps": steps, "optimizer": "adamw", "lr": 3e-3, "warmup_ratio": 0.05,
        "log_every": max(1, steps // 4), "save_every": steps, "out": out,
        "progress": False, "tensorboard": False})
    final = pretrain(config)  # OUT/final: the model and its tokenizer
    print(f"pretrained a {config.ops} decoder for {config.steps} steps -> {final}")
    model, tok = from_pretrained(Path(final)).eval(), load_tokenizer(final)
    written = []
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])  # the text itself: no [CLS] in a prompt
        with torch.no_grad():
            made = model.generate(ids, max_new_tokens=new_tokens, eos_token_id=tok.sep_id)
        written.append((prompt, tok.decode(made[0, ids.shape[1]:].tolist(),
                                           skip_special_tokens=True)))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/decoder-text", help="the pretraining run's folder")
    parser.add_argument("--steps", type=int, default=400, help="pretraining steps")
    parser.add_argument("--documents", type=int, default=3000, help="kinship documents")
    parser.add_argument("--new-tokens", type=int, default=24, help="tokens to generate")
    args = parser.parse_args()
    for prompt, said in write(args.out, args.steps, args.documents, args.new_tokens):
        print(f"{prompt}|{said}")


if __name__ == "__main__":
    main()
