"""Chain-reasoning questions about generated families: the kinship task's data.

`reasoning_examples` and `systematic_split` pose CLUTRR-style questions (in the spirit of Sinha
et al. 2019, with our own generator): a story states ``k`` facts forming a chain from ``first``
to ``second``, in shuffled order and with optional irrelevant facts, and the query asks "How is
<second> related to <first>?". The label is the word X in "<second> is <first>'s X", read off
the family tree by `relation_of`, never by composing relations along the chain. Training on
k = 2, 3 (`TRAIN_K`) and testing on k up to `MAX_K` measures systematic generalisation.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from folnet.errors import FolnetError
from folnet.train.data.kinship.stories import Fact, told_fact
from folnet.train.data.kinship.world import (
    BASE_KINDS,
    KIND_WORDS,
    RELATIONS,
    FamilyTree,
    TreePlan,
    chain_between,
    kind_word,
    random_tree,
    reach_from,
    relation_of,
    relatives,
)
from folnet.train.options import check_count

__all__ = ["MAX_DISTRACTORS", "MAX_K", "MIN_K", "TEST_K", "TRAIN_K", "KinshipExample",
           "majority_baseline", "reasoning_examples", "systematic_split"]

#: Chain lengths the generator supports (longer chains need ever larger single households).
MIN_K, MAX_K = 2, 10
#: Irrelevant facts a story may carry on top of its chain.
MAX_DISTRACTORS = 10
#: The lengths the benchmark trains on, and those it tests (every supported length).
TRAIN_K: tuple[int, ...] = (2, 3)
TEST_K: tuple[int, ...] = tuple(range(MIN_K, MAX_K + 1))

# The kind of every relation word ("aunt" -> "pibling").
_KIND_OF = {word: kind for kind, pair in KIND_WORDS.items() for word in pair}


@dataclass(frozen=True)
class KinshipExample:
    """One question: ``story`` (k chain facts plus distractors, shuffled), ``query`` and answer.

    ``label`` answers the query "How is <second> related to <first>?": <second> is <first>'s
    <label>. The chain of facts runs from ``first`` to ``second``. ``facts`` holds what
    ``story`` says as data, one (x, word, y, inverse) per sentence ("y is x's word, x is y's
    inverse"), which the
    symbolic rendering (`folnet.train.data.kinship.symbolic`) writes without templates.
    ``family`` is the fingerprint of the family tree the question was drawn from
    (`FamilyTree.fingerprint`), by which pretraining corpora keep test families out.
    """

    story: str
    query: str
    label: str
    k: int
    first: str
    second: str
    facts: tuple[Fact, ...] = ()  # the story's facts as (x, word, y, inverse), in story order
    family: str = ""  # FamilyTree.fingerprint() of the question's family


def _plan_for(k: int, distractors: int, wanted: str | None) -> TreePlan:
    """Bigger households and more generations for longer chains and more distractors.

    A chain between a person and their parent, child, spouse or sibling never leaves their shared
    household (households hang together as a tree), so such a chain of length k needs a household
    of k + 1 people: for those labels every couple of the tree gets k - 1 children.
    """
    people = 16 + 5 * k + 2 * distractors
    if k > 3 and wanted is not None and _KIND_OF[wanted] in BASE_KINDS:
        return TreePlan(generations=3, min_children=k - 1, max_children=k - 1,
                        max_inlaw_siblings=1, max_people=people)
    return TreePlan(
        generations=3 if k <= 3 else 4,
        max_children=2 + (k + 1) // 2,
        max_inlaw_siblings=1 + k // 3,
        max_people=people,
    )


def _try_example(
    rng: random.Random, tree: FamilyTree, k: int, distractors: int, wanted: str | None
) -> KinshipExample | None:
    """Pick a start, an end and a k-step chain between them in ``tree``, if any.

    The end must be ``wanted``'s kind of relative of the start, or any answerable one if None.
    """
    for _ in range(8):
        a = rng.randrange(len(tree))
        kin = relatives(tree, a)
        if wanted is not None and all(_KIND_OF[wanted] != kinds[0] for kinds in kin.values()):
            continue
        reach = reach_from(tree, a)
        by_label: dict[str, list[int]] = {}
        for b, kinds in kin.items():
            r = reach[b]
            if r.households <= k <= r.households + r.spare:
                by_label.setdefault(kind_word(kinds[0], tree.genders[b]), []).append(b)
        if not by_label or (wanted is not None and wanted not in by_label):
            continue
        label = wanted if wanted is not None else rng.choice(sorted(by_label))
        b = rng.choice(by_label[label])
        chain = chain_between(rng, tree, reach, b, k)
        if len(set(chain)) != k + 1 or relation_of(tree, a, b) != label:
            raise RuntimeError("kinship chain construction broke its own invariant")
        facts = [told_fact(rng, tree, x, y) for x, y in itertools.pairwise(chain)]
        # Distractors hang new people off the story one at a time, so the stated facts stay a
        # tree and the chain remains the only route from first to second.
        told = set(chain)
        for _ in range(distractors):
            options = [(x, y) for x in sorted(told) for h in tree.households(x)
                       for y in tree.members(h) if y not in told]
            if not options:
                return None
            x, y = rng.choice(options)
            told.add(y)
            facts.append(told_fact(rng, tree, x, y))
        rng.shuffle(facts)  # sentences and their triples move together
        first, second = tree.names[a], tree.names[b]
        return KinshipExample(story=" ".join(text for text, _ in facts),
                              query=f"How is {second} related to {first}?", label=label, k=k,
                              first=first, second=second, facts=tuple(t for _, t in facts),
                              family=tree.fingerprint())
    return None


def _example(rng: random.Random, k: int, distractors: int) -> KinshipExample:
    """One example of chain length ``k``; the label is drawn first, uniformly from RELATIONS.

    Drawing the label first keeps the label distribution (nearly) uniform at every k, so accuracy
    per k is not confounded by a shifting label prior and the majority baseline stays near 1/22.
    Should a label prove very hard to reach at this k, any label is accepted after 200 trees.
    """
    wanted = rng.choice(RELATIONS)
    for attempt in range(1000):
        target = wanted if attempt < 200 else None
        tree = random_tree(rng, _plan_for(k, distractors, target))
        found = _try_example(rng, tree, k, distractors, target)
        if found is not None:
            return found
    raise RuntimeError(f"could not build a kinship chain of length {k}")  # not seen in practice


def _check_ks(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise FolnetError(f"{name} must be a non-empty sequence of chain lengths, got {values!r}")
    ks = tuple(check_count(f"{name} entry (chain length k)", v, MIN_K, MAX_K) for v in values)
    if len(set(ks)) != len(ks):
        raise FolnetError(f"{name} must not repeat a chain length, got {values!r}")
    return ks


#: Redraws in a row after which `_draw` gives up: a ``skip`` that refuses this many questions
#: of one chain length in a row refuses (nearly) all of them, and would never let it finish.
MAX_REDRAWS = 10_000


def _draw(
    key: str, ks: Sequence[int], distractors: int,
    skip: Callable[[KinshipExample], bool] | None = None,
) -> list[KinshipExample]:
    """One example per entry of ``ks``, from the random stream ``key``; an example that
    ``skip`` refuses is replaced by the next one of the same length from the stream."""
    rng = random.Random(key)  # str seeds are hashed with SHA-512: stable across runs and hosts
    out = []
    for k in ks:
        example = _example(rng, k, distractors)
        redraws = 0
        while skip is not None and skip(example):
            redraws += 1
            if redraws > MAX_REDRAWS:
                raise FolnetError(f"kinship questions of chain length {k}: {MAX_REDRAWS} drawn "
                                  f"in a row were all excluded; exclude fewer")
            example = _example(rng, k, distractors)
        out.append(example)
    return out


def _balanced(rng: random.Random, n: int, ks: tuple[int, ...]) -> list[int]:
    order = [ks[i % len(ks)] for i in range(n)]
    rng.shuffle(order)
    return order


def reasoning_examples(
    num_examples: int, k_values: Sequence[int] = TRAIN_K, seed: int = 0, distractors: int = 0,
    exclude: Callable[[KinshipExample], bool] | None = None,
) -> list[KinshipExample]:
    """``num_examples`` chain questions; each k of ``k_values`` gets the same share (+-1).

    Deterministic in ``seed``; labels are close to uniform over RELATIONS at every k.
    ``distractors`` irrelevant (but true) facts about people off the chain join each story.
    A question ``exclude`` refuses is replaced by the stream's next one of the same length
    (how a pretraining corpus keeps held-out questions out: `kinship.heldout`).
    """
    n = check_count("num_examples", num_examples, 1)
    ks = _check_ks("k_values", k_values)
    d = check_count("distractors", distractors, 0, MAX_DISTRACTORS)
    seed = check_count("seed", seed, -(2**63))
    order = _balanced(random.Random(f"kinship/order/{seed}"), n, ks)
    return _draw(f"kinship/reasoning/{seed}", order, d, exclude)


def systematic_split(
    train_size: int = 2000,
    test_size_per_k: int = 100,
    train_k: Sequence[int] = TRAIN_K,
    test_k: Sequence[int] = TEST_K,
    seed: int = 0,
    distractors: int = 0,
) -> dict[str, list[KinshipExample]]:
    """Train on short chains, test on every length: the systematic-generalisation benchmark.

    "train" has ``train_size`` examples over ``train_k``; "validation" has a tenth of that (at
    least one) over the same lengths; "test" has ``test_size_per_k`` examples for each length of
    ``test_k``, ordered by k. Each part comes from its own random stream, and no validation or
    test example repeats a (story, query) pair of an earlier part.
    """
    n_train = check_count("train_size", train_size, 1)
    n_test = check_count("test_size_per_k", test_size_per_k, 1)
    ks_train = _check_ks("train_k", train_k)
    ks_test = _check_ks("test_k", test_k)
    d = check_count("distractors", distractors, 0, MAX_DISTRACTORS)
    seed = check_count("seed", seed, -(2**63))
    base = f"kinship/split/{seed}"
    order = random.Random(f"{base}/order")
    train = _draw(f"{base}/train", _balanced(order, n_train, ks_train), d)
    seen = {(e.story, e.query) for e in train}

    def repeated(example: KinshipExample) -> bool:
        return (example.story, example.query) in seen

    validation = _draw(f"{base}/validation",
                       _balanced(order, max(1, n_train // 10), ks_train), d, repeated)
    seen |= {(e.story, e.query) for e in validation}
    test = _draw(f"{base}/test", [k for k in sorted(ks_test) for _ in range(n_test)], d,
                 repeated)
    return {"train": train, "validation": validation, "test": test}


def majority_baseline(examples: Sequence[KinshipExample]) -> float:
    """Accuracy of always answering the most common label of ``examples``: the bar to beat."""
    if not examples:
        raise FolnetError("majority_baseline needs at least 1 example, got 0")
    counts = Counter(e.label for e in examples)
    return max(counts.values()) / len(examples)


