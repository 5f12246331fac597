"""Questions a pretraining corpus must not contain: held-out questions and their families.

Why: the ablation measures what pretraining adds to finetuning on the kinship task, so the
corpus it pretrains on must not hold the questions it is tested on (or validated on), nor any
other story about their families. Both corpora come from the same world as the task:

* ``kinship-symbolic`` is made of generated questions, each with its answer stated
  (`symbolic_documents`); its k = 2 questions have so few distinct symbolic forms that a corpus
  of 2,000 drawn independently of the task held about 100 of the demo's 650 k = 2 test
  questions (their facts, in some order);
* ``kinship`` is made of stories about random families (`pretraining_documents`).

A `HeldOut` names the families (`FamilyTree.fingerprint`) and the questions (`question_key`:
the symbolic facts, which fix story and query whatever their order) to keep out; the corpus
generators skip what it holds and draw the next item of their stream instead
(`reasoning_examples(exclude=...)`, `pretraining_documents(exclude_families=...)`).

Not kept out: questions of the same shape with other entity tokens ("qa father p3 ..." and
"qa father p7 ..."). At the trained chain lengths there are only a few hundred such shapes, and
the finetuning training set holds them as much as the corpus does; `chain_of` names a
question's shape so that a report can count them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from folnet.errors import FolnetError
from folnet.train.data.kinship.questions import KinshipExample
from folnet.train.data.kinship.stories import Fact
from folnet.train.data.kinship.symbolic import symbolic

__all__ = ["HeldOut", "chain_of", "question_key"]

#: A question as its symbolic facts (x, word, y, inverse), in no order.
QuestionKey = frozenset[Fact]


def question_key(example: KinshipExample) -> QuestionKey:
    """The question as a model reads it in symbolic form, up to the order of its facts: the
    query's people are the roles ``qa`` and ``qb`` inside the facts, so the facts fix the query
    too."""
    return frozenset(symbolic(example).facts)


def chain_of(example: KinshipExample) -> tuple[str, ...]:
    """The relation words along the question's chain, from ``first`` to ``second`` ("father",
    "sister": second is first's father's sister): its shape, whoever the people are."""
    steps: dict[str, list[tuple[str, str]]] = {}
    for x, word, y, inverse in example.facts:
        steps.setdefault(x, []).append((y, word))
        steps.setdefault(y, []).append((x, inverse))
    came: dict[str, tuple[str, str] | None] = {example.first: None}
    queue = deque([example.first])
    while queue:
        person = queue.popleft()
        for other, word in steps.get(person, ()):
            if other not in came:
                came[other] = (person, word)
                queue.append(other)
    if example.second not in came:
        raise FolnetError(f"kinship question {example.query!r}: no chain of facts from "
                          f"{example.first!r} to {example.second!r}")
    words: list[str] = []
    person = example.second
    while (step := came[person]) is not None:
        person, word = step
        words.append(word)
    return tuple(reversed(words))


@dataclass(frozen=True)
class HeldOut:
    """Families and questions to keep out of a pretraining corpus; ``example in held_out``
    says whether a generated question is one of them (or from one of their families)."""

    families: frozenset[str] = frozenset()
    questions: frozenset[QuestionKey] = frozenset()

    @classmethod
    def of(cls, examples: Iterable[KinshipExample]) -> HeldOut:
        """The families and questions of ``examples`` (generated ones: each knows its
        family)."""
        examples = list(examples)
        missing = [e.query for e in examples if not e.family]
        if missing:
            raise FolnetError(f"kinship question {missing[0]!r} has no family fingerprint (made "
                              f"by hand, not by the generator?); cannot hold its family out")
        return cls(frozenset(e.family for e in examples),
                   frozenset(question_key(e) for e in examples))

    def __contains__(self, example: object) -> bool:
        if not isinstance(example, KinshipExample):
            return False
        return example.family in self.families or question_key(example) in self.questions

    def __call__(self, example: KinshipExample) -> bool:
        """``example in self``: the ``exclude`` predicate of `reasoning_examples`."""
        return example in self
