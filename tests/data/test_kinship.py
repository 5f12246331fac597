"""The kinship world: relation rules on hand-built trees, generated chains, splits and errors."""

from __future__ import annotations

import itertools
import random
import re
import time
from collections import Counter, deque

import pytest

from folnet.errors import FolnetError
from folnet.train.data.kinship import (
    FACT_TEMPLATES,
    MAX_K,
    KinshipExample,
    majority_baseline,
    pretraining_documents,
    reasoning_examples,
    systematic_split,
)
from folnet.train.data.kinship.world import (
    BASE_KINDS,
    FEMALE,
    FEMALE_NAMES,
    MALE,
    MALE_NAMES,
    RELATIONS,
    FamilyTree,
    TreePlan,
    base_kind,
    chain_between,
    random_tree,
    reach_from,
    relation_of,
    relatives,
)

NAMES = frozenset(MALE_NAMES) | frozenset(FEMALE_NAMES)
WORD = re.compile(r"\b[A-Z][a-z]+\b")


def sentences(story: str) -> list[str]:
    return [s.strip() for s in re.findall(r"[^.]+\.", story)]


def names_in(sentence: str) -> set[str]:
    return {w for w in WORD.findall(sentence) if w in NAMES}


# --- the relation function on a hand-built family -----------------------------------------------


@pytest.fixture(scope="module")
def family() -> tuple[FamilyTree, dict[str, int]]:
    """Four generations around Tom, with in-laws on both sides and uncles by blood and marriage."""
    t = FamilyTree()
    ids: dict[str, int] = {}

    def person(name: str, gender: str, household: int | None = None) -> int:
        ids[name] = (t.add_person(name, gender) if household is None
                     else t.add_child(household, name, gender))
        return ids[name]

    grand = t.marry(person("Harold", MALE), person("Edith", FEMALE))
    maternal = t.marry(person("Frank", MALE), person("Fiona", FEMALE))
    t.marry(person("Paul", MALE, grand), person("Mary", FEMALE, maternal))
    t.marry(person("Alice", FEMALE, grand), person("Bob", MALE))
    t.marry(person("Sam", MALE, maternal), person("Zoe", FEMALE))
    person("Sue", FEMALE, maternal)
    home = t.marriage[ids["Paul"]]
    assert home is not None
    in_laws = t.marry(person("Walter", MALE), person("Wilma", FEMALE))
    own = t.marry(person("Tom", MALE, home), person("Wendy", FEMALE, in_laws))
    person("Will", MALE, in_laws)
    person("Wanda", FEMALE, in_laws)
    tina = t.marry(person("Tina", FEMALE, home), person("Victor", MALE))
    person("Ned", MALE, tina)
    person("Nia", FEMALE, tina)
    t.marry(person("Leo", MALE, own), person("Lily", FEMALE))
    t.marry(person("Lea", FEMALE, own), person("Liam", MALE))
    cousins = t.marriage[ids["Alice"]]
    assert cousins is not None
    person("Carl", MALE, cousins)
    sam = t.marriage[ids["Sam"]]
    assert sam is not None
    person("Nick", MALE, sam)
    return t, ids


EXPECTED = [  # (first, second, "second is first's ...")
    ("Tom", "Wendy", "wife"), ("Wendy", "Tom", "husband"), ("Tom", "Paul", "father"),
    ("Tom", "Mary", "mother"), ("Tom", "Leo", "son"), ("Tom", "Lea", "daughter"),
    ("Tina", "Tom", "brother"), ("Tom", "Tina", "sister"), ("Tom", "Harold", "grandfather"),
    ("Tom", "Fiona", "grandmother"), ("Harold", "Tom", "grandson"),
    ("Edith", "Tina", "granddaughter"), ("Tom", "Sam", "uncle"), ("Tom", "Bob", "uncle"),
    ("Tom", "Alice", "aunt"), ("Tom", "Zoe", "aunt"), ("Tom", "Ned", "nephew"),
    ("Tom", "Nia", "niece"), ("Paul", "Nick", "nephew"), ("Bob", "Tom", "nephew"),
    ("Tom", "Walter", "father-in-law"), ("Tom", "Wilma", "mother-in-law"),
    ("Tom", "Liam", "son-in-law"), ("Tom", "Lily", "daughter-in-law"),
    ("Tom", "Will", "brother-in-law"), ("Tom", "Victor", "brother-in-law"),
    ("Tom", "Wanda", "sister-in-law"), ("Wendy", "Tina", "sister-in-law"),
]


@pytest.mark.parametrize(("first", "second", "label"), EXPECTED)
def test_relation_of_hand_built(family, first, second, label):
    tree, ids = family
    assert relation_of(tree, ids[first], ids[second]) == label


def test_hand_built_cases_cover_every_label(family):
    assert {label for _, _, label in EXPECTED} == set(RELATIONS)
    assert len(RELATIONS) == len(set(RELATIONS)) == 22


@pytest.mark.parametrize(("first", "second"), [
    ("Tom", "Tom"), ("Tom", "Carl"),  # self, cousin
    ("Harold", "Leo"), ("Leo", "Harold"),  # great-grandchild, great-grandfather
    ("Wendy", "Victor"),  # spouse's sibling's spouse
    ("Walter", "Paul"),  # child's parent-in-law
])
def test_relations_outside_the_label_set(family, first, second):
    tree, ids = family
    assert relation_of(tree, ids[first], ids[second]) is None


def test_relations_are_unique_and_converse(family):
    tree, _ = family
    converse = {"spouse": "spouse", "parent": "child", "child": "parent", "sibling": "sibling",
                "grandparent": "grandchild", "grandchild": "grandparent", "pibling": "nibling",
                "nibling": "pibling", "parent-in-law": "child-in-law",
                "child-in-law": "parent-in-law", "sibling-in-law": "sibling-in-law"}
    for a in range(len(tree)):
        for b, kinds in relatives(tree, a).items():
            assert len(kinds) == 1, (tree.names[a], tree.names[b], kinds)
            assert relatives(tree, b)[a] == [converse[kinds[0]]]


def test_world_rules_are_enforced():
    t = FamilyTree()
    a, b, c = t.add_person("Anna", FEMALE), t.add_person("Boris", MALE), t.add_person("Carl", MALE)
    t.marry(a, b)
    with pytest.raises(ValueError, match="already married"):
        t.marry(a, c)
    with pytest.raises(ValueError, match="already used"):
        t.add_person("Anna", FEMALE)


# --- generated trees agree with an independent composition table -------------------------------

COMPOSE = {  # kind of y for x, kind of z for y -> kind of z for x (z != x)
    ("parent", "parent"): "grandparent", ("parent", "sibling"): "pibling",
    ("parent", "spouse"): "parent", ("parent", "child"): "sibling",
    ("child", "child"): "grandchild", ("child", "spouse"): "child-in-law",
    ("child", "parent"): "spouse", ("child", "sibling"): "child",
    ("spouse", "parent"): "parent-in-law", ("spouse", "sibling"): "sibling-in-law",
    ("spouse", "child"): "child", ("sibling", "spouse"): "sibling-in-law",
    ("sibling", "child"): "nibling", ("sibling", "parent"): "parent",
    ("sibling", "sibling"): "sibling",
}


def test_generated_trees_match_two_step_composition():
    rng = random.Random(7)
    checked = Counter()
    for _ in range(15):
        tree = random_tree(rng, TreePlan(generations=4, max_children=4, max_people=60))
        for x in range(len(tree)):
            kin = relatives(tree, x)
            assert all(len(kinds) == 1 for kinds in kin.values())
            near = {y for h in tree.households(x) for y in tree.members(h)} - {x}
            for y in near:
                for h in tree.households(y):
                    for z in tree.members(h):
                        if z in (x, y):
                            continue
                        pair = (base_kind(tree, x, y), base_kind(tree, y, z))
                        assert kin.get(z) == [COMPOSE[pair]], pair
                        checked[pair] += 1
    assert set(checked) == set(COMPOSE)


def test_chain_between_builds_simple_paths_of_length_k():
    rng = random.Random(3)
    tree = random_tree(rng, TreePlan(generations=3, min_children=9, max_children=9,
                                     max_people=80))
    a = tree.couples[0][0]
    reach = reach_from(tree, a)
    for b, r in reach.items():
        for k in range(max(r.households, 1), min(r.households + r.spare, MAX_K) + 1):
            path = chain_between(rng, tree, reach, b, k)
            assert path[0] == a and path[-1] == b and len(path) == k + 1 == len(set(path))
            assert all(base_kind(tree, x, y) in BASE_KINDS for x, y in itertools.pairwise(path))


# --- reasoning examples -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed() -> list[KinshipExample]:
    return reasoning_examples(450, k_values=tuple(range(2, MAX_K + 1)), seed=5, distractors=2)


def test_examples_are_deterministic_by_seed():
    first = reasoning_examples(40, (2, 3, 7), seed=11)
    assert first == reasoning_examples(40, (2, 3, 7), seed=11)
    assert first != reasoning_examples(40, (2, 3, 7), seed=12)
    assert reasoning_examples(5) == reasoning_examples(5, (2, 3), 0, 0)


def test_labels_in_set_and_balanced_over_k(mixed):
    assert all(e.label in RELATIONS for e in mixed)
    assert Counter(e.k for e in mixed) == {k: 50 for k in range(2, MAX_K + 1)}
    assert len({e.label for e in mixed}) == len(RELATIONS)
    assert majority_baseline(mixed) < 0.15


def test_story_is_a_chain_of_k_facts_plus_distractors(mixed):
    for e in mixed:
        facts = sentences(e.story)
        assert len(facts) == e.k + 2
        assert e.query == f"How is {e.second} related to {e.first}?"
        assert e.first != e.second and {e.first, e.second} <= names_in(e.story)
        graph: dict[str, set[str]] = {}
        for fact in facts:
            pair = names_in(fact)
            assert len(pair) == 2, fact
            x, y = pair
            graph.setdefault(x, set()).add(y)
            graph.setdefault(y, set()).add(x)
        # the stated facts form a tree, so the chain is the only route between the two names
        assert len(graph) == len(facts) + 1
        depth = {e.first: 0}
        queue = deque([e.first])
        while queue:
            x = queue.popleft()
            for y in graph[x] - depth.keys():
                depth[y] = depth[x] + 1
                queue.append(y)
        assert len(depth) == len(graph) and depth[e.second] == e.k


def test_stories_are_shuffled(mixed):
    # with shuffling the sentence naming `first` is not always the first sentence
    starts = [e.first in names_in(sentences(e.story)[0]) for e in mixed if e.k >= 4]
    assert 0 < sum(starts) < len(starts) * 0.6


def test_template_variety(mixed):
    assert all(len(v) >= 10 for v in FACT_TEMPLATES.values())
    relation_words = sorted(RELATIONS, key=len, reverse=True)
    relation_words += ["brother", "sister", "siblings"]

    def shape(sentence: str) -> str:
        out = WORD.sub(lambda m: "N" if m.group() in NAMES else m.group(), sentence)
        for word in relation_words:
            out = re.sub(rf"\b{re.escape(word)}\b", "R", out)
        return re.sub(r"\b(his|her|him)\b", "P", out)

    shapes = {shape(s) for e in mixed for s in sentences(e.story)}
    # 4 base kinds x 12 templates, a few of which coincide once the relation word is masked
    assert len(shapes) >= 30


def test_generation_is_fast():
    start = time.perf_counter()
    examples = reasoning_examples(2000)
    assert len(examples) == 2000
    assert time.perf_counter() - start < 5.0


# --- the split ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split() -> dict[str, list[KinshipExample]]:
    return systematic_split(train_size=300, test_size_per_k=20, seed=2)


def test_split_sizes_and_k(split):
    assert set(split) == {"train", "validation", "test"}
    assert len(split["train"]) == 300 and len(split["validation"]) == 30
    assert Counter(e.k for e in split["train"]) == {2: 150, 3: 150}
    assert {e.k for e in split["validation"]} == {2, 3}
    assert Counter(e.k for e in split["test"]) == {k: 20 for k in range(2, 11)}
    assert [e.k for e in split["test"]] == sorted(e.k for e in split["test"])


def test_split_has_no_overlap_and_is_deterministic(split):
    train = {(e.story, e.query) for e in split["train"]}
    assert not train & {(e.story, e.query) for e in split["test"]}
    assert not train & {(e.story, e.query) for e in split["validation"]}
    again = systematic_split(train_size=300, test_size_per_k=20, seed=2)
    assert again == split
    assert systematic_split(train_size=300, test_size_per_k=20, seed=3)["test"] != split["test"]


# --- pretraining documents ----------------------------------------------------------------------


def test_documents():
    docs = pretraining_documents(60, seed=4)
    assert len(docs) == 60 and all(len(d) >= 8 for d in docs)
    assert all(isinstance(s, str) and s.endswith(".") for d in docs for s in d)
    assert docs == pretraining_documents(60, seed=4)
    assert docs != pretraining_documents(60, seed=5)
    text = " ".join(s for d in docs for s in d)
    for word in ("grandmother", "uncle", "in-law", "went to the market", "married"):
        assert word in text
    assert len({s for d in docs for s in d}) > 0.9 * sum(map(len, docs))


def test_name_lists():
    assert len(MALE_NAMES) + len(FEMALE_NAMES) >= 200
    assert not set(MALE_NAMES) & set(FEMALE_NAMES)
    assert len(set(MALE_NAMES)) == len(MALE_NAMES)


# --- baseline and errors ------------------------------------------------------------------------


def test_majority_baseline():
    def ex(label: str) -> KinshipExample:
        return KinshipExample(story="", query="", label=label, k=2, first="A", second="B")

    assert majority_baseline([ex("aunt"), ex("uncle"), ex("aunt"), ex("son")]) == 0.5
    assert majority_baseline([ex("wife")]) == 1.0
    with pytest.raises(FolnetError, match="at least 1 example"):
        majority_baseline([])


@pytest.mark.parametrize(("call", "message"), [
    (lambda: pretraining_documents(0), "num_documents must be at least 1, got 0"),
    (lambda: pretraining_documents(3, seed="x"), "seed must be an integer, got 'x'"),
    (lambda: reasoning_examples(0), "num_examples must be at least 1, got 0"),
    (lambda: reasoning_examples(2.5), "num_examples must be an integer, got 2.5"),
    (lambda: reasoning_examples(5, k_values=(1, 2)), r"k_values entry .* at least 2, got 1"),
    (lambda: reasoning_examples(5, k_values=(2, 11)), r"k_values entry .* at most 10, got 11"),
    (lambda: reasoning_examples(5, k_values=()), "k_values must be a non-empty sequence"),
    (lambda: reasoning_examples(5, k_values=(2, 2)), "k_values must not repeat"),
    (lambda: reasoning_examples(5, distractors=-1), "distractors must be at least 0, got -1"),
    (lambda: reasoning_examples(5, distractors=11), "distractors must be at most 10, got 11"),
    (lambda: systematic_split(train_size=0), "train_size must be at least 1, got 0"),
    (lambda: systematic_split(test_size_per_k=-3), "test_size_per_k must be at least 1, got -3"),
    (lambda: systematic_split(train_k=(2, 12)), r"train_k entry .* at most 10, got 12"),
    (lambda: systematic_split(test_k="23"), "test_k must be a non-empty sequence"),
])
def test_bad_arguments(call, message):
    with pytest.raises(FolnetError, match=message):
        call()
