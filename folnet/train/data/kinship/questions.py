"""An embedded, deterministic kinship world: a pretraining corpus and a chain-reasoning task.

Needs no files or downloads, so every machine and every test sees exactly the same data.

* `pretraining_documents` writes short stories about random families (stated facts, derived facts
  such as "X is Y's grandmother" and some narrative filler) for ``--data kinship``.
* `reasoning_examples` and `systematic_split` pose CLUTRR-style questions (in the spirit of Sinha
  et al. 2019, with our own generator): a story states ``k`` facts forming a chain from ``first``
  to ``second``, in shuffled order and with optional irrelevant facts, and the query asks
  "How is <second> related to <first>?". The label is the word X in "<second> is <first>'s X",
  read off the family tree by `relation_of`, never by composing relations along the chain.
  Training on k = 2, 3 and testing on k up to `MAX_K` measures systematic generalisation.
"""

from __future__ import annotations

import itertools
import operator
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from folnet.errors import FolnetError
from folnet.train.data.kinship.world import (
    BASE_KINDS,
    FEMALE_NAMES,
    INVERSE,
    KIND_WORDS,
    MALE,
    MALE_NAMES,
    RELATIONS,
    FamilyTree,
    TreePlan,
    base_kind,
    chain_between,
    kind_word,
    random_tree,
    reach_from,
    relation_of,
    relatives,
)

__all__ = [
    "FACT_TEMPLATES",
    "FEMALE_NAMES",
    "MALE_NAMES",
    "MAX_DISTRACTORS",
    "MAX_K",
    "MIN_K",
    "RELATIONS",
    "KinshipExample",
    "majority_baseline",
    "pretraining_documents",
    "reasoning_examples",
    "relation_of",
    "systematic_split",
]

#: Chain lengths the generator supports (longer chains need ever larger single households).
MIN_K, MAX_K = 2, 10
#: Irrelevant facts a story may carry on top of its chain.
MAX_DISTRACTORS = 10

# Fact templates: "{y} is {x}'s {rel}"; {inv} is x's word as seen from y, {xpos}/{ypos} are
# his/her and {xobj}/{yobj} him/her. No template has a period other than its last character.
_KIND_OF = {word: kind for kind, pair in KIND_WORDS.items() for word in pair}

_COMMON = ("{y} is {x}'s {rel}.", "{x}'s {rel} is {y}.", "{y} is the {rel} of {x}.")
FACT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "parent": (*_COMMON,
        "{x} is the {inv} of {y}.", "{x}'s {rel} is called {y}.",
        "{x} was raised by {xpos} {rel}, {y}.",
        "{x} often calls {xpos} {rel} {y} on Sunday evenings.",
        "{y} is proud of {ypos} {inv} {x}.", "{y} taught {ypos} {inv} {x} how to ride a bike.",
        "{x} looks a lot like {xpos} {rel}, {y}.", "{x} visited {xpos} {rel} {y} in the hospital.",
        "{y} picked up {ypos} {inv} {x} from school."),
    "child": (*_COMMON,
        "{x} is the {inv} of {y}.", "{x} has a {rel} named {y}.",
        "{x} tucked {xpos} {rel} {y} into bed.",
        "{y} grew up listening to stories from {ypos} {inv}, {x}.",
        "{x} drove {xpos} {rel} {y} to football practice.",
        "{x} knitted a sweater for {xpos} {rel} {y}.",
        "{y} phoned {ypos} {inv} {x} to share some good news.",
        "{x} is very proud of {xpos} {rel}, {y}.",
        "{x} and {xpos} {rel} {y} planted a tree in the garden."),
    "spouse": (*_COMMON,
        "{x} is married to {y}.", "{x} and {y} are married.", "{x} married {y} many years ago.",
        "{x} and {xpos} {rel} {y} live in a house by the river.",
        "{x} went on holiday with {xpos} {rel}, {y}.",
        "{x} and {y} celebrated their wedding anniversary.",
        "{x} bought flowers for {xpos} {rel} {y}.", "{y} cooked dinner for {ypos} {inv}, {x}.",
        "{x} and {xpos} {rel}, {y}, danced at the party."),
    "sibling": (*_COMMON,
        "{x} and {y} are siblings.", "{x} has a {rel} named {y}.",
        "{x} grew up with {xpos} {rel} {y}.",
        "{x} and {xpos} {rel} {y} played together as children.",
        "{x} visited {xpos} {rel}, {y}, last weekend.",
        "{x} borrowed a book from {xpos} {rel} {y}.",
        "{y} called {ypos} {inv} {x} to wish {xobj} a happy birthday.",
        "{x} shares a flat with {xpos} {rel}, {y}.",
        "{y} and {ypos} {inv} {x} argued about the last piece of cake."),
    "derived": (*_COMMON,
        "{x} is {y}'s {inv}.", "{x} has a {rel} named {y}.",
        "{x} visited {xpos} {rel} {y} last summer.",
        "{x} received a letter from {xpos} {rel}, {y}.", "{y} gave {ypos} {inv} {x} a present.",
        "{x} stayed with {xpos} {rel} {y} for a week.",
        "{x} and {xpos} {rel} {y} went fishing."),
}

# Narrative filler for the pretraining documents: true relations, but stated in passing.
_FILLER_RELATED = (
    "{x} and {xpos} {rel} {y} went to the market.", "{x} baked a cake with {xpos} {rel} {y}.",
    "{x} and {xpos} {rel} {y} walked along the beach.",
    "{x} helped {xpos} {rel} {y} paint the fence.",
    "{x} wrote a long letter to {xpos} {rel} {y}.",
    "{x} and {xpos} {rel} {y} watched a film together.",
    "{x} gave {xpos} {rel} {y} a scarf for the winter.",
    "{x} drove {xpos} {rel} {y} to the station.",
)
_FILLER_ALONE = (
    "{x} works as {job}.", "{x} likes to {hobby} in the evening.",
    "{x} now lives in a {place}.", "{x} has a dog that follows {xobj} everywhere.",
    "The whole family met at {x}'s house for dinner.",
    "Everyone agreed that {x} told the best jokes.",
    "It rained all day, so {x} stayed at home.",
)
_JOBS = ("a teacher", "a nurse", "a carpenter", "a baker", "a doctor", "a pilot", "a farmer",
         "a librarian", "an engineer", "a chef", "a lawyer", "an architect")
_HOBBIES = ("read", "paint", "play the piano", "go running", "garden", "write poems", "cook")
_PLACES = ("village by the sea", "town in the hills", "farmhouse", "flat above a bakery",
           "cottage near the woods")


@dataclass(frozen=True)
class KinshipExample:
    """One question: ``story`` (k chain facts plus distractors, shuffled), ``query`` and answer.

    ``label`` answers the query "How is <second> related to <first>?": <second> is <first>'s
    <label>. The chain of facts runs from ``first`` to ``second``.
    """

    story: str
    query: str
    label: str
    k: int
    first: str
    second: str


def _words(tree: FamilyTree, x: int, y: int, kind: str, inverse: str) -> dict[str, str]:
    def pos(p: int) -> str:
        return "his" if tree.genders[p] == MALE else "her"

    def obj(p: int) -> str:
        return "him" if tree.genders[p] == MALE else "her"

    return {"x": tree.names[x], "y": tree.names[y], "rel": kind_word(kind, tree.genders[y]),
            "inv": kind_word(inverse, tree.genders[x]), "xpos": pos(x), "ypos": pos(y),
            "xobj": obj(x), "yobj": obj(y)}


def _state_fact(rng: random.Random, tree: FamilyTree, x: int, y: int) -> str:
    """One directly related pair as a sentence, from either side and with a random template."""
    if rng.random() < 0.5:
        x, y = y, x
    kind = base_kind(tree, x, y)
    if kind is None:
        raise RuntimeError(f"{tree.names[x]} and {tree.names[y]} are not directly related")
    template = rng.choice(FACT_TEMPLATES[kind])
    return template.format(**_words(tree, x, y, kind, INVERSE[kind]))


def _state_derived(rng: random.Random, tree: FamilyTree, x: int, y: int, kind: str) -> str:
    template = rng.choice(FACT_TEMPLATES["derived"])
    return template.format(**_words(tree, x, y, kind, INVERSE[kind]))


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
        facts = [_state_fact(rng, tree, x, y) for x, y in itertools.pairwise(chain)]
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
            facts.append(_state_fact(rng, tree, x, y))
        rng.shuffle(facts)
        first, second = tree.names[a], tree.names[b]
        return KinshipExample(story=" ".join(facts), query=f"How is {second} related to {first}?",
                              label=label, k=k, first=first, second=second)
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


def _check_count(name: str, value: object, low: int, high: int | None = None) -> int:
    """Validate an integer argument, naming it, its value and the allowed range on failure."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = None
    if number is None or isinstance(value, bool):
        raise FolnetError(f"{name} must be an integer, got {value!r}")
    if number < low:
        raise FolnetError(f"{name} must be at least {low}, got {number}")
    if high is not None and number > high:
        raise FolnetError(f"{name} must be at most {high}, got {number}")
    return number


def _check_ks(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise FolnetError(f"{name} must be a non-empty sequence of chain lengths, got {values!r}")
    ks = tuple(_check_count(f"{name} entry (chain length k)", v, MIN_K, MAX_K) for v in values)
    if len(set(ks)) != len(ks):
        raise FolnetError(f"{name} must not repeat a chain length, got {values!r}")
    return ks


def _draw(
    key: str, ks: Sequence[int], distractors: int, exclude: set[tuple[str, str]] | None = None
) -> list[KinshipExample]:
    """One example per entry of ``ks``, from the random stream ``key``, skipping ``exclude``."""
    rng = random.Random(key)  # str seeds are hashed with SHA-512: stable across runs and hosts
    out = []
    for k in ks:
        example = _example(rng, k, distractors)
        while exclude is not None and (example.story, example.query) in exclude:
            example = _example(rng, k, distractors)
        out.append(example)
    return out


def _balanced(rng: random.Random, n: int, ks: tuple[int, ...]) -> list[int]:
    order = [ks[i % len(ks)] for i in range(n)]
    rng.shuffle(order)
    return order


def reasoning_examples(
    num_examples: int, k_values: Sequence[int] = (2, 3), seed: int = 0, distractors: int = 0
) -> list[KinshipExample]:
    """``num_examples`` chain questions; each k of ``k_values`` gets the same share (+-1).

    Deterministic in ``seed``; labels are close to uniform over RELATIONS at every k.
    ``distractors`` irrelevant (but true) facts about people off the chain join each story.
    """
    n = _check_count("num_examples", num_examples, 1)
    ks = _check_ks("k_values", k_values)
    d = _check_count("distractors", distractors, 0, MAX_DISTRACTORS)
    seed = _check_count("seed", seed, -(2**63))
    order = _balanced(random.Random(f"kinship/order/{seed}"), n, ks)
    return _draw(f"kinship/reasoning/{seed}", order, d)


def systematic_split(
    train_size: int = 2000,
    test_size_per_k: int = 100,
    train_k: Sequence[int] = (2, 3),
    test_k: Sequence[int] = tuple(range(2, 11)),
    seed: int = 0,
    distractors: int = 0,
) -> dict[str, list[KinshipExample]]:
    """Train on short chains, test on every length: the systematic-generalisation benchmark.

    "train" has ``train_size`` examples over ``train_k``; "validation" has a tenth of that (at
    least one) over the same lengths; "test" has ``test_size_per_k`` examples for each length of
    ``test_k``, ordered by k. Each part comes from its own random stream, and no validation or
    test example repeats a (story, query) pair of an earlier part.
    """
    n_train = _check_count("train_size", train_size, 1)
    n_test = _check_count("test_size_per_k", test_size_per_k, 1)
    ks_train = _check_ks("train_k", train_k)
    ks_test = _check_ks("test_k", test_k)
    d = _check_count("distractors", distractors, 0, MAX_DISTRACTORS)
    seed = _check_count("seed", seed, -(2**63))
    base = f"kinship/split/{seed}"
    order = random.Random(f"{base}/order")
    train = _draw(f"{base}/train", _balanced(order, n_train, ks_train), d)
    seen = {(e.story, e.query) for e in train}
    validation = _draw(f"{base}/validation",
                       _balanced(order, max(1, n_train // 10), ks_train), d, seen)
    seen |= {(e.story, e.query) for e in validation}
    test = _draw(f"{base}/test", [k for k in sorted(ks_test) for _ in range(n_test)], d, seen)
    return {"train": train, "validation": validation, "test": test}


def majority_baseline(examples: Sequence[KinshipExample]) -> float:
    """Accuracy of always answering the most common label of ``examples``: the bar to beat."""
    if not examples:
        raise FolnetError("majority_baseline needs at least 1 example, got 0")
    counts = Counter(e.label for e in examples)
    return max(counts.values()) / len(examples)


def _document(rng: random.Random) -> list[str]:
    tree = random_tree(rng, TreePlan(generations=rng.randint(3, 5), max_children=4,
                                     max_people=rng.randint(18, 40)))
    focus = rng.randrange(len(tree))
    near = sorted(b for b, r in reach_from(tree, focus).items() if r.households <= 2)
    pairs = sorted({(min(x, y), max(x, y)) for x in near for h in tree.households(x)
                    for y in tree.members(h) if x != y})
    sentences = [_state_fact(rng, tree, x, y)
                 for x, y in rng.sample(pairs, min(len(pairs), rng.randint(5, 9)))]
    derived = [(a, b, kinds[0]) for a in rng.sample(near, min(len(near), 6))
               for b, kinds in relatives(tree, a).items() if kinds[0] not in BASE_KINDS]
    for a, b, kind in rng.sample(derived, min(len(derived), rng.randint(2, 4))):
        sentences.append(_state_derived(rng, tree, a, b, kind))
    for _ in range(rng.randint(2, 4)):
        x = rng.choice(near)
        related = relatives(tree, x)
        if related and rng.random() < 0.6:
            y = rng.choice(sorted(related))
            words = _words(tree, x, y, related[y][0], INVERSE[related[y][0]])
            sentences.append(rng.choice(_FILLER_RELATED).format(**words))
        else:
            sentences.append(rng.choice(_FILLER_ALONE).format(
                x=tree.names[x], xobj="him" if tree.genders[x] == MALE else "her",
                job=rng.choice(_JOBS), hobby=rng.choice(_HOBBIES), place=rng.choice(_PLACES)))
    rng.shuffle(sentences)
    return sentences


def pretraining_documents(num_documents: int, seed: int = 0) -> list[list[str]]:
    """``num_documents`` family stories, each a list of at least 8 sentences; seeded.

    Each story centres on one person of a fresh random family: stated parent/child/spouse/sibling
    facts, derived relations ("X is Y's grandmother") and narrative filler, all true of the tree,
    in shuffled order so that a language model must not rely on a fixed layout.
    """
    n = _check_count("num_documents", num_documents, 1)
    seed = _check_count("seed", seed, -(2**63))
    rng = random.Random(f"kinship/documents/{seed}")
    out = []
    while len(out) < n:
        document = _document(rng)
        if len(document) >= 8:
            out.append(document)
    return out

