"""The symbolic kinship task: deterministic, the same questions as the English task, and labels
that an independent reading of the facts agrees with."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from folnet.errors import FolnetError
from folnet.train.ablate.plan import load_plan
from folnet.train.data.documents import iter_documents
from folnet.train.data.kinship import (
    ENTITIES,
    KinshipExample,
    symbolic,
    symbolic_documents,
    systematic_split,
)
from folnet.train.data.kinship.symbolic import ROLES, symbolic_tokens
from folnet.train.tasks.registry import read_split

# -- an independent reading of a story's facts ---------------------------------------------------
# Rebuilds the family from the stated facts alone (parent edges, marriages, siblings, closed
# under "siblings share parents", "a child's two parents are married", ...), then names the
# relation by definition. Nothing here comes from the generator's tree or its rules.

_MALE = {"husband", "father", "son", "brother"}
_NAMES = {"spouse": ("husband", "wife"), "parent": ("father", "mother"),
          "child": ("son", "daughter"), "sibling": ("brother", "sister"),
          "grandparent": ("grandfather", "grandmother"),
          "grandchild": ("grandson", "granddaughter"),
          "pibling": ("uncle", "aunt"), "nibling": ("nephew", "niece"),
          "parent-in-law": ("father-in-law", "mother-in-law"),
          "child-in-law": ("son-in-law", "daughter-in-law"),
          "sibling-in-law": ("brother-in-law", "sister-in-law")}


def _family(facts):
    male, parents, spouse, siblings = {}, defaultdict(set), {}, defaultdict(set)
    for x, word, y, inverse in facts:
        male[y], male[x] = word in _MALE, inverse in _MALE
        if word in ("husband", "wife"):
            spouse[x], spouse[y] = y, x
        elif word in ("father", "mother"):
            parents[x].add(y)
        elif word in ("son", "daughter"):
            parents[y].add(x)
        else:
            siblings[x].add(y)
            siblings[y].add(x)
    people = set(male)
    changed = True
    while changed:
        changed = False
        for a in people:
            known = set(parents[a]) | {spouse[p] for p in parents[a] if p in spouse}
            for s in siblings[a]:
                known |= parents[s]
            if known != parents[a]:
                parents[a], changed = known, True
            pair = sorted(parents[a])
            if len(pair) == 2 and spouse.get(pair[0]) != pair[1]:
                spouse[pair[0]], spouse[pair[1]], changed = pair[1], pair[0], True
            for b in people:
                if b != a and b not in siblings[a] and (
                        parents[a] & parents[b] or any(b in siblings[s] for s in siblings[a])):
                    siblings[a].add(b)
                    siblings[b].add(a)
                    changed = True
    return male, parents, spouse, siblings


def _relation(facts, first, second):
    """Every word that names ``second`` as ``first``'s relative."""
    male, parents, spouse, siblings = _family(facts)
    a, b = first, second

    def children(p):
        return {c for c in male if p in parents[c]}

    mates = {spouse[a]} if a in spouse else set()
    mates_siblings = {s for m in mates for s in siblings[m]}
    parents_siblings = {s for p in parents[a] for s in siblings[p]}
    kinds = {
        "spouse": b in mates,
        "parent": b in parents[a],
        "child": a in parents[b],
        "sibling": b in siblings[a],
        "grandparent": any(b in parents[p] for p in parents[a]),
        "grandchild": any(a in parents[p] for p in parents[b]),
        "pibling": b in parents_siblings | {spouse[s] for s in parents_siblings if s in spouse},
        "nibling": any(b in children(x) for x in siblings[a] | mates_siblings),
        "parent-in-law": any(b in parents[m] for m in mates),
        "child-in-law": any(spouse.get(c) == b for c in children(a)),
        "sibling-in-law": b in mates_siblings | {spouse[s] for s in siblings[a] if s in spouse},
    }
    return [_NAMES[k][0 if male[b] else 1] for k, holds in kinds.items() if holds]


@pytest.fixture(scope="module")
def split():
    return systematic_split(train_size=400, test_size_per_k=30, seed=3, distractors=0)


def test_labels_agree_with_an_independent_composition_of_the_facts(split):
    checked = 0
    for part in ("train", "validation", "test"):
        for example in split[part]:
            q = symbolic(example)
            assert _relation(q.facts, q.first, q.second) == [q.label], (q.story, q.label)
            # the English story states the same facts: its names, in the same order
            assert _relation(example.facts, example.first, example.second) == [example.label]
            checked += 1
    assert checked == 400 + 40 + 30 * 9


def test_with_distractors_the_labels_still_agree():
    split = systematic_split(train_size=60, test_size_per_k=4, distractors=4, seed=1)
    for example in split["train"] + split["test"]:
        q = symbolic(example)
        assert len(q.facts) == example.k + 4
        assert _relation(q.facts, q.first, q.second) == [q.label]


def test_rendering(split):
    vocabulary = set(symbolic_tokens())
    for example in split["test"]:
        q = symbolic(example)
        assert q.query == f"{ROLES[0]} {ROLES[1]}" and (q.first, q.second) == ROLES
        assert q.label == example.label and q.k == example.k
        words = q.story.split()
        assert set(words) <= vocabulary and words.count(".") == len(example.facts) == example.k
        # every fact is "x word y inverse ." over the renamed people, in the story's order
        rename = {}
        for (x, w, y, inv), (sx, sw, sy, sinv) in zip(example.facts, q.facts, strict=True):
            assert (w, inv) == (sw, sinv)
            assert rename.setdefault(x, sx) == sx and rename.setdefault(y, sy) == sy
        assert rename[example.first] == "qa" and rename[example.second] == "qb"
        others = [v for k, v in rename.items() if k not in (example.first, example.second)]
        assert len(set(others)) == len(others) and set(others) <= set(ENTITIES)


def test_deterministic_and_the_same_questions_as_the_english_task(split):
    again = systematic_split(train_size=400, test_size_per_k=30, seed=3, distractors=0)
    assert [symbolic(e) for e in again["test"]] == [symbolic(e) for e in split["test"]]
    other = systematic_split(train_size=400, test_size_per_k=30, seed=4, distractors=0)
    assert [symbolic(e).story for e in other["test"]] != [symbolic(e).story for e in split["test"]]
    options = {"kinship_train_size": 400, "kinship_test_per_k": 30, "data_seed": 3}
    english = read_split("kinship", None, "test", options)
    symbols = read_split("kinship/symbolic", None, "test", options)
    assert [e.label for e in english.examples] == [e.label for e in symbols.examples]
    assert english.columns["k"] == symbols.columns["k"] == tuple(
        k for k in range(2, 11) for _ in range(30))
    assert [e.text_a for e in symbols.examples] == [symbolic(e).story for e in split["test"]]


def test_pretraining_documents_state_the_answer_last():
    examples = systematic_split(train_size=20, test_size_per_k=1)["train"]
    for example, document in zip(examples, symbolic_documents(examples), strict=True):
        q = symbolic(example)
        assert len(document) == example.k + 1
        assert document[-1] == f"qa {q.label} qb ."
        assert " ".join(document[:-1]) == q.story
    corpus = list(iter_documents("kinship-symbolic", kinship_documents=12, seed=5))
    assert len(corpus) == 12 and corpus == list(iter_documents("kinship-symbolic",
                                                               kinship_documents=12, seed=5))
    assert all(set(" ".join(d).split()) <= set(symbolic_tokens()) for d in corpus)


def test_hand_made_questions_without_facts_are_refused():
    with pytest.raises(FolnetError, match="no facts to render"):
        symbolic(KinshipExample("A is B's son.", "How is A related to B?", "son", 2, "B", "A"))


def test_the_demo_test_split_measures_every_k_to_within_two_points():
    """The standard error of an accuracy over n questions is at most 0.5 / sqrt(n)."""
    plan = load_plan("demo")
    finetune = dict(plan.finetune)
    per_k = finetune["kinship_test_per_k"]
    assert 0.5 / math.sqrt(per_k) < 0.02
    assert plan.tasks == ("kinship/symbolic",) and plan.data == "kinship-symbolic"
    assert plan.seeds >= 3
    assert finetune.get("kinship_test_k", list(range(2, 11))) == list(range(2, 11))
