"""An embedded, deterministic kinship world: a pretraining corpus and a chain-reasoning task.

Needs no files or downloads, so every machine and every test sees exactly the same data.

* `world`: family trees and the rules that read relations off them;
* `stories`: fact sentences and `pretraining_documents`, short stories about random families
  (stated facts, derived facts such as "X is Y's grandmother" and some narrative filler) for
  ``--data kinship``;
* `questions`: `reasoning_examples` and `systematic_split`, CLUTRR-style questions whose answer
  is read off the tree (the task ``folnet finetune --task kinship`` trains on);
* `symbolic`: the same questions as entity and relation tokens (``--task kinship/symbolic``),
  and pretraining documents made of them (``--data kinship-symbolic``);
* `heldout`: which families and questions a pretraining corpus must keep out (`HeldOut`).
"""

from folnet.train.data.kinship.heldout import HeldOut, chain_of, question_key
from folnet.train.data.kinship.questions import (
    MAX_DISTRACTORS,
    MAX_K,
    MIN_K,
    TEST_K,
    TRAIN_K,
    KinshipExample,
    majority_baseline,
    reasoning_examples,
    systematic_split,
)
from folnet.train.data.kinship.stories import FACT_TEMPLATES, pretraining_documents
from folnet.train.data.kinship.symbolic import ENTITIES, symbolic, symbolic_documents
from folnet.train.data.kinship.world import FEMALE_NAMES, MALE_NAMES, RELATIONS, relation_of

__all__ = [
    "ENTITIES",
    "FACT_TEMPLATES",
    "FEMALE_NAMES",
    "MALE_NAMES",
    "MAX_DISTRACTORS",
    "MAX_K",
    "MIN_K",
    "RELATIONS",
    "TEST_K",
    "TRAIN_K",
    "HeldOut",
    "KinshipExample",
    "chain_of",
    "majority_baseline",
    "pretraining_documents",
    "question_key",
    "reasoning_examples",
    "relation_of",
    "symbolic",
    "symbolic_documents",
    "systematic_split",
]
