"""A folnet classifier trained by transformers' Trainer, as a BERT would be: a tokenizer and a
model directory loaded by the Auto classes, a `datasets.Dataset` tokenised by the tokenizer,
batches padded by `DataCollatorWithPadding`, then `evaluate()`.

The task is a toy one: is the sentence about the mother or the father?

    python examples/hf_trainer.py
    python examples/hf_trainer.py --steps 200 --ops j.at
"""

from __future__ import annotations

import argparse
import random
import tempfile

import datasets
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

import folnet
import folnet.hf  # registers the folnet classes with the Auto classes
from folnet.train.data.tokenizer import train_tokenizer

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank"]


def sentences(count: int, seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(count):
        a, b = rng.sample(NAMES, 2)
        label = rng.randrange(2)
        texts.append(f"{a} is the {'mother' if label == 0 else 'father'} of {b}")
        labels.append(label)
    return {"text": texts, "label": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--ops", default="jmc.atp", help="operator string (default jmc.atp)")
    args = parser.parse_args()
    work = tempfile.mkdtemp()

    # a tokenizer and a model directory, as folnet's training commands write them
    train = sentences(256, seed=0)
    train_tokenizer(texts=train["text"], vocab_size=64).save(work)
    folnet.build_model(args.ops, preset="tiny", vocab_size=64, head="classification",
                       num_labels=2, dropout=0.0).save_pretrained(work)

    tokenizer = AutoTokenizer.from_pretrained(work)
    model = AutoModelForSequenceClassification.from_pretrained(work)
    print(f"{type(model).__name__} over {model.config.model['ops']}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")

    def tokenise(rows):
        return tokenizer(rows["text"])

    splits = {name: datasets.Dataset.from_dict(sentences(n, seed)).map(tokenise, batched=True)
              for name, n, seed in (("train", 256, 0), ("test", 64, 1))}
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=work, max_steps=args.steps, learning_rate=3e-3,
                               per_device_train_batch_size=16, report_to=[], save_strategy="no",
                               logging_steps=max(1, args.steps // 4), use_cpu=True),
        train_dataset=splits["train"].remove_columns("text"),
        eval_dataset=splits["test"].remove_columns("text"),
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1)
                                                      == p.label_ids).mean())},
    )
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
