"""Family stories in English: the fact sentences of a family tree, and the pretraining corpus.

Every sentence is true of its tree. A fact states one parent/child/spouse/sibling pair in one
of many phrasings (`FACT_TEMPLATES`), from either side; a derived fact states a relation that a
reader must otherwise infer ("X is Y's grandmother"); filler mentions relatives in passing.
`pretraining_documents` is the ``--data kinship`` corpus; `folnet.train.data.kinship.questions`
states the facts of its chains with the same sentences.
"""

from __future__ import annotations

import random
from collections.abc import Collection

from folnet.train.data.kinship.world import (
    BASE_KINDS,
    INVERSE,
    MALE,
    FamilyTree,
    TreePlan,
    base_kind,
    kind_word,
    random_tree,
    reach_from,
    relatives,
)
from folnet.train.options import check_count

__all__ = ["FACT_TEMPLATES", "Fact", "pretraining_documents", "state_fact", "told_fact"]

# Fact templates: "{y} is {x}'s {rel}"; {inv} is x's word as seen from y, {xpos}/{ypos} are
# his/her and {xobj}/{yobj} him/her. No template has a period other than its last character.
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


def _words(tree: FamilyTree, x: int, y: int, kind: str, inverse: str) -> dict[str, str]:
    def pos(p: int) -> str:
        return "his" if tree.genders[p] == MALE else "her"

    def obj(p: int) -> str:
        return "him" if tree.genders[p] == MALE else "her"

    return {"x": tree.names[x], "y": tree.names[y], "rel": kind_word(kind, tree.genders[y]),
            "inv": kind_word(inverse, tree.genders[x]), "xpos": pos(x), "ypos": pos(y),
            "xobj": obj(x), "yobj": obj(y)}


#: A stated fact as data: (x, word, y, inverse) says "y is x's <word>" and "x is y's
#: <inverse>" (two names and the relation word from each side, which gives both genders).
Fact = tuple[str, str, str, str]


def told_fact(rng: random.Random, tree: FamilyTree, x: int, y: int) -> tuple[str, Fact]:
    """One directly related pair as a sentence, from either side and with a random template,
    and the same fact as data (x, word, y, inverse), read from the side the sentence took."""
    if rng.random() < 0.5:
        x, y = y, x
    kind = base_kind(tree, x, y)
    if kind is None:
        raise RuntimeError(f"{tree.names[x]} and {tree.names[y]} are not directly related")
    template = rng.choice(FACT_TEMPLATES[kind])
    words = _words(tree, x, y, kind, INVERSE[kind])
    return template.format(**words), (words["x"], words["rel"], words["y"], words["inv"])


def state_fact(rng: random.Random, tree: FamilyTree, x: int, y: int) -> str:
    """One directly related pair as a sentence (`told_fact` without the triple)."""
    return told_fact(rng, tree, x, y)[0]


def _state_derived(rng: random.Random, tree: FamilyTree, x: int, y: int, kind: str) -> str:
    template = rng.choice(FACT_TEMPLATES["derived"])
    return template.format(**_words(tree, x, y, kind, INVERSE[kind]))


def _document(rng: random.Random) -> tuple[list[str], str]:
    """One story and the fingerprint of its family."""
    tree = random_tree(rng, TreePlan(generations=rng.randint(3, 5), max_children=4,
                                     max_people=rng.randint(18, 40)))
    focus = rng.randrange(len(tree))
    near = sorted(b for b, r in reach_from(tree, focus).items() if r.households <= 2)
    pairs = sorted({(min(x, y), max(x, y)) for x in near for h in tree.households(x)
                    for y in tree.members(h) if x != y})
    sentences = [state_fact(rng, tree, x, y)
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
    return sentences, tree.fingerprint()


def pretraining_documents(num_documents: int, seed: int = 0,
                          exclude_families: Collection[str] = ()) -> list[list[str]]:
    """``num_documents`` family stories, each a list of at least 8 sentences; seeded.

    Each story centres on one person of a fresh random family: stated parent/child/spouse/sibling
    facts, derived relations ("X is Y's grandmother") and narrative filler, all true of the tree,
    in shuffled order so that a language model must not rely on a fixed layout. A story whose
    family's fingerprint is in ``exclude_families`` (`FamilyTree.fingerprint`) is left out and
    the stream's next one taken.
    """
    n = check_count("num_documents", num_documents, 1)
    seed = check_count("seed", seed, -(2**63))
    rng = random.Random(f"kinship/documents/{seed}")
    out = []
    while len(out) < n:
        document, family = _document(rng)
        if len(document) >= 8 and family not in exclude_families:
            out.append(document)
    return out
