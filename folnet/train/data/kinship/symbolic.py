"""The kinship questions without English: facts as entity and relation tokens.

Why: the English task asks a model to read 60-odd templates, names and filler before it can
reason, which a small model does not learn in minutes. The symbolic rendering keeps exactly
the same questions (same generator, same chain lengths, same labels) and removes the reading:

    story  "qb son p2 father . p2 mother qa son ."      (x word y inverse: y is x's word)
    query  "qa qb"                                      (how is qb related to qa?)
    label  "husband"                                    (qb is qa's husband)

Each fact names both sides' relation words, so every person's gender is stated. The two people
of the query are named by their role, ``qa`` (the first) and ``qb`` (the second), wherever they
occur; everybody else becomes an entity token ``p0`` ... ``p23`` (`ENTITIES`), assigned at
random per question (deterministic in the question's text). So a model cannot learn anything
about a particular name, and to answer it must compose the facts along the chain, binding the
people between ``qa`` and ``qb`` by matching their tokens across facts -- the binary relations
FOLNet reasons over.

Why roles and not random tokens for the query pair too: with the query pair as random tokens
at the end, a small model (FOLNet or a plain transformer alike) stays for thousands of steps at
the accuracy that the bag of relation words allows, because finding the query's people in the
story must be learnt first; with roles it learns k = 2 quickly, and what remains is the
composition along the chain, the skill the ablation is about (docs/results/measurements.md).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Iterator

from folnet.errors import FolnetError
from folnet.train.data.kinship.questions import MAX_DISTRACTORS, MAX_K, KinshipExample
from folnet.train.data.kinship.world import RELATIONS

__all__ = ["END", "ENTITIES", "ROLES", "symbolic", "symbolic_documents", "symbolic_tokens"]

#: The query's people: "how is QB related to QA?"
ROLES: tuple[str, str] = ("qa", "qb")
#: Entity tokens for everybody else: enough for the longest chain with the most distractors
#: (k - 1 people between the query's two, and d more).
ENTITIES: tuple[str, ...] = tuple(f"p{i}" for i in range(MAX_K - 1 + MAX_DISTRACTORS + 4))
#: Ends a fact in the story (a sentence boundary for the tokenizer and for pretraining).
END = "."


def symbolic_tokens() -> tuple[str, ...]:
    """Every word a symbolic story or query can hold: roles, entities, relation words, `END`."""
    return (*ROLES, *ENTITIES, *RELATIONS, END)


def _entities(example: KinshipExample) -> dict[str, str]:
    """The role tokens for the query's people and a random entity token for everybody else,
    deterministic in the question's text."""
    people: list[str] = []
    for x, _, y, _ in example.facts:
        for name in (x, y):
            if name not in people:
                people.append(name)
    if example.first not in people or example.second not in people:
        raise FolnetError(f"kinship question {example.query!r}: the story's facts do not "
                          f"mention both people of the query")
    others = [p for p in people if p not in (example.first, example.second)]
    if len(others) > len(ENTITIES):
        raise FolnetError(f"kinship question {example.query!r}: {len(others)} people besides "
                          f"the query's, more than the {len(ENTITIES)} entity tokens")
    rng = random.Random(f"kinship/symbolic/{example.story}/{example.query}")
    names = dict(zip(others, rng.sample(ENTITIES, len(others)), strict=True))
    return {**names, example.first: ROLES[0], example.second: ROLES[1]}


def symbolic(example: KinshipExample) -> KinshipExample:
    """The same question in symbolic form (people renamed to entity tokens, story and query
    rewritten); needs the example's ``facts``, which every generated question has."""
    if not example.facts:
        raise FolnetError(f"kinship question {example.query!r} has no facts to render "
                          f"symbolically (made by hand, not by the generator?)")
    name = _entities(example)
    facts = tuple((name[x], word, name[y], inverse) for x, word, y, inverse in example.facts)
    story = " ".join(f"{x} {word} {y} {inverse} {END}" for x, word, y, inverse in facts)
    first, second = name[example.first], name[example.second]
    return dataclasses.replace(example, story=story, query=f"{first} {second}", first=first,
                               second=second, facts=facts)


def symbolic_documents(examples: Iterable[KinshipExample]) -> Iterator[list[str]]:
    """Pretraining documents: each question's facts in symbolic form, one sentence per fact,
    then the answer stated as a fact of its own ("first label second ."), so that masked
    language modelling on them asks for the compositions the task asks for."""
    for example in examples:
        q = symbolic(example)
        yield [*(f"{x} {word} {y} {inverse} {END}" for x, word, y, inverse in q.facts),
               f"{q.first} {q.label} {q.second} {END}"]
