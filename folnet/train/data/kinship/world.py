"""The family trees behind the kinship corpus: people, marriages, children and the relation rules.

The rest of `folnet.train.data.kinship` turns these trees into pretraining text and into
chain-reasoning examples; this module only knows about families. Labels are never computed by
composing a table of relations along a chain: `relatives` reads them off the tree with one
explicit rule per kind, so a chain of any length gets the label the family really has.

The world is deliberately simple, and the simplicity is what makes every chain answerable:
marriages are monogamous and permanent, every child has exactly one father and one mother who
are married to each other, and people marrying into the tree arrive from outside it (possibly
with their own parents and siblings). So each couple and its children form a "household" in which
everybody is a parent, child, spouse or sibling of everybody else, every person belongs to at most
two households (the one they were born into and the one they married into) and households hang
together as a tree. A path between two people therefore crosses a fixed sequence of households,
and the relation of its ends follows from the facts along the path plus those world rules.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass, field

from folnet.errors import FolnetError

MALE, FEMALE = "m", "f"

#: Relation kinds in the order `relatives` reports them, each with its (male, female) word.
KIND_WORDS: dict[str, tuple[str, str]] = {
    "spouse": ("husband", "wife"),
    "parent": ("father", "mother"),
    "child": ("son", "daughter"),
    "sibling": ("brother", "sister"),
    "grandparent": ("grandfather", "grandmother"),
    "grandchild": ("grandson", "granddaughter"),
    "pibling": ("uncle", "aunt"),
    "nibling": ("nephew", "niece"),
    "parent-in-law": ("father-in-law", "mother-in-law"),
    "child-in-law": ("son-in-law", "daughter-in-law"),
    "sibling-in-law": ("brother-in-law", "sister-in-law"),
}

#: The closed label set: every word of `KIND_WORDS`, male before female.
RELATIONS: tuple[str, ...] = tuple(word for pair in KIND_WORDS.values() for word in pair)

#: The edge kinds a story states directly; everything else must be inferred.
BASE_KINDS = ("parent", "child", "spouse", "sibling")

#: Each kind's converse: if y is x's <kind> then x is y's <INVERSE[kind]>.
INVERSE = {
    "spouse": "spouse", "parent": "child", "child": "parent", "sibling": "sibling",
    "grandparent": "grandchild", "grandchild": "grandparent", "pibling": "nibling",
    "nibling": "pibling", "parent-in-law": "child-in-law", "child-in-law": "parent-in-law",
    "sibling-in-law": "sibling-in-law",
}

MALE_NAMES: tuple[str, ...] = tuple("""
Aaron Adam Adrian Alan Albert Alex Alfred Andrew Anthony Arthur Benjamin Bernard Boris Bruno
Caleb Carl Charles Christopher Colin Conrad Daniel David Dennis Dominic Douglas Edgar Edmund
Edward Elias Emil Eric Ethan Felix Fernando Francis Frederick Gabriel George Gerald Gordon
Gregory Harold Henry Hugo Ian Isaac Ivan Jacob James Jason Jeremy Joel John Jonathan Joseph
Julian Kenneth Kevin Lars Leon Leonard Lewis Liam Lorenzo Lucas Luke Malcolm Marcus Martin
Matthew Maxwell Michael Milan Nathan Neil Nicholas Noah Oliver Oscar Owen Patrick Paul Peter
Philip Quentin Rafael Raymond Richard Robert Roger Roland Samuel Sebastian Simon Stefan Stephen
Theodore Thomas Timothy Tobias Victor Vincent Walter Wesley William Xavier Yusuf Zachary Omar
Hassan Kenji Ravi Diego Mateo Anton Bruce Cedric Declan Enzo
""".split())

FEMALE_NAMES: tuple[str, ...] = tuple("""
Abigail Ada Agnes Alice Amelia Anna Beatrice Bella Bianca Brenda Camille Carla Caroline
Catherine Cecilia Charlotte Chloe Clara Claudia Cora Dana Daphne Deborah Diana Dorothy Edith
Eleanor Elena Eliza Ella Eloise Emily Emma Erica Esther Eva Fiona Frances Gemma Gloria Greta
Hannah Harriet Heidi Helen Ida Ines Irene Isabel Jane Janet Jessica Joan Josephine Judith Julia
Karen Kate Laura Leah Lena Linda Lisa Louise Lucy Lydia Mabel Madeline Margaret Maria Marion
Martha Mary Matilda Megan Mia Miriam Monica Nadia Naomi Natalie Nina Nora Olga Olivia Paula
Penelope Priya Rachel Rebecca Rita Sabrina Sally Sandra Sara Sophia Stella Susan Tanya Teresa
Ursula Vera Victoria Wendy Yasmin Yvonne Zoe Aisha Fatima Keiko Lucia Agatha Beryl Colette
""".split())

#: Upper bound on people per tree, so that names never run out and trees stay cheap to build.
MAX_PEOPLE = 90


def kind_word(kind: str, gender: str) -> str:
    """The English word for ``kind`` said of a person of ``gender`` ("parent", "f" -> "mother")."""
    male, female = KIND_WORDS[kind]
    return male if gender == MALE else female


@dataclass
class FamilyTree:
    """People (by integer id) with names, genders, one marriage each and children per couple.

    Built only through `add_person`, `marry` and `add_child`, which enforce the world rules
    (no remarriage, children belong to a married couple, unique names).
    """

    names: list[str] = field(default_factory=list)
    genders: list[str] = field(default_factory=list)
    spouse: list[int | None] = field(default_factory=list)
    birth: list[int | None] = field(default_factory=list)  # household born into
    marriage: list[int | None] = field(default_factory=list)  # household married into
    couples: list[tuple[int, int]] = field(default_factory=list)  # household -> (husband, wife)
    kids: list[list[int]] = field(default_factory=list)  # household -> children

    def __len__(self) -> int:
        return len(self.names)

    def add_person(self, name: str, gender: str) -> int:
        """A new person with no recorded parents (a founder or someone marrying in)."""
        if gender not in (MALE, FEMALE):
            raise FolnetError(f"gender must be {MALE!r} or {FEMALE!r}, got {gender!r}")
        if name in self.names:
            raise FolnetError(f"name {name!r} is already used in this tree")
        self.names.append(name)
        self.genders.append(gender)
        self.spouse.append(None)
        self.birth.append(None)
        self.marriage.append(None)
        return len(self.names) - 1

    def marry(self, a: int, b: int) -> int:
        """Marry two unmarried people of different genders; returns their new household."""
        if self.spouse[a] is not None or self.spouse[b] is not None:
            raise FolnetError(f"{self.names[a]} or {self.names[b]} is already married")
        if self.genders[a] == self.genders[b]:
            raise FolnetError("this world only has husband-and-wife couples")
        husband, wife = (a, b) if self.genders[a] == MALE else (b, a)
        self.spouse[a], self.spouse[b] = b, a
        self.couples.append((husband, wife))
        self.kids.append([])
        self.marriage[a] = self.marriage[b] = len(self.couples) - 1
        return len(self.couples) - 1

    def add_child(self, household: int, name: str, gender: str) -> int:
        """A child of the couple heading ``household``."""
        child = self.add_person(name, gender)
        self.birth[child] = household
        self.kids[household].append(child)
        return child

    def members(self, household: int) -> list[int]:
        """Husband, wife and children of a household: everybody directly related to everybody."""
        return [*self.couples[household], *self.kids[household]]

    def households(self, person: int) -> list[int]:
        """The (at most two) households a person belongs to."""
        return [h for h in (self.birth[person], self.marriage[person]) if h is not None]

    def parents(self, person: int) -> list[int]:
        household = self.birth[person]
        return [] if household is None else list(self.couples[household])

    def children(self, person: int) -> list[int]:
        household = self.marriage[person]
        return [] if household is None else list(self.kids[household])

    def siblings(self, person: int) -> list[int]:
        household = self.birth[person]
        return [] if household is None else [c for c in self.kids[household] if c != person]

    def spouses(self, people: list[int]) -> list[int]:
        return [s for s in (self.spouse[p] for p in people) if s is not None]

    def fingerprint(self) -> str:
        """A digest of the whole family -- its people (names are unique in a tree), their
        genders, the couples and their children -- whatever order they were added in: what
        decides whether a question and a pretraining document come from the same family
        (`folnet.train.data.kinship.heldout`)."""
        people = sorted(zip(self.names, self.genders, strict=True))
        couples = sorted((self.names[h], self.names[w], *sorted(self.names[c] for c in kids))
                         for (h, w), kids in zip(self.couples, self.kids, strict=True))
        return hashlib.sha256(repr((people, couples)).encode()).hexdigest()[:16]


def relatives(tree: FamilyTree, a: int) -> dict[int, list[str]]:
    """Every relative of ``a`` in the label set, mapped to the kinds "b is a's <kind>" that hold.

    One explicit rule per kind, applied to the tree itself. In trees grown by `random_tree` each
    relative holds exactly one kind (the household structure rules out overlaps); hand-built trees
    may break the world rules, and then the list shows every reading.
    """
    parents, children = tree.parents(a), tree.children(a)
    siblings = tree.siblings(a)
    spouse = [] if tree.spouse[a] is None else [tree.spouse[a]]
    spouse_siblings = [x for s in spouse for x in tree.siblings(s)]
    parent_siblings = [x for p in parents for x in tree.siblings(p)]
    rules: list[tuple[str, list[int]]] = [
        ("spouse", spouse),
        ("parent", parents),
        ("child", children),
        ("sibling", siblings),
        ("grandparent", [g for p in parents for g in tree.parents(p)]),
        ("grandchild", [g for c in children for g in tree.children(c)]),
        # an uncle or aunt is a parent's sibling or the spouse of one (by marriage)
        ("pibling", parent_siblings + tree.spouses(parent_siblings)),
        # the converse: a child of one's own sibling or of one's spouse's sibling
        ("nibling", [n for x in siblings + spouse_siblings for n in tree.children(x)]),
        ("parent-in-law", [p for s in spouse for p in tree.parents(s)]),
        ("child-in-law", tree.spouses(children)),
        ("sibling-in-law", spouse_siblings + tree.spouses(siblings)),
    ]
    found: dict[int, list[str]] = {}
    for kind, people in rules:
        for b in people:
            if b != a and kind not in found.setdefault(b, []):
                found[b].append(kind)
    return found


def relation_of(tree: FamilyTree, first: int, second: int) -> str | None:
    """The label answering "how is ``second`` related to ``first``?" ("second is first's X").

    None when ``second`` is not in the label set's reach of ``first`` (a cousin, a
    great-grandparent, a spouse's sibling's spouse ...) or is ``first`` itself.
    """
    kinds = relatives(tree, first).get(second)
    return kind_word(kinds[0], tree.genders[second]) if kinds else None


def base_kind(tree: FamilyTree, x: int, y: int) -> str | None:
    """The directly stated kind "y is x's <kind>" (parent, child, spouse, sibling), if any."""
    if tree.spouse[x] == y:
        return "spouse"
    if y in tree.parents(x):
        return "parent"
    if x in tree.parents(y):
        return "child"
    if tree.birth[x] is not None and tree.birth[x] == tree.birth[y] and x != y:
        return "sibling"
    return None


@dataclass(frozen=True)
class Reach:
    """How ``a`` reaches one person: households crossed, spare people on the way, predecessor."""

    households: int
    spare: int  # people inside the crossed households that a longer path may also visit
    previous: int
    via: int  # household shared with ``previous``


def reach_from(tree: FamilyTree, a: int, max_households: int = 3) -> dict[int, Reach]:
    """Breadth-first search over households from ``a``, at most ``max_households`` deep.

    Households form a tree, so the sequence of households between two people is unique and every
    path between them crosses exactly those households (a person is the only door between their
    two households). A path of k steps exists iff ``households <= k <= households + spare``.
    Every relative in the label set is at most three households away, hence the default depth.
    """
    out: dict[int, Reach] = {a: Reach(0, 0, a, -1)}
    seen_households: set[int] = set()
    queue = deque([a])
    while queue:
        x = queue.popleft()
        here = out[x]
        if here.households >= max_households:
            continue
        for h in tree.households(x):
            if h in seen_households:
                continue
            seen_households.add(h)
            members = tree.members(h)
            for y in members:
                if y not in out:
                    out[y] = Reach(here.households + 1, here.spare + len(members) - 2, x, h)
                    queue.append(y)
    return out


def chain_between(
    rng: random.Random, tree: FamilyTree, reach: dict[int, Reach], b: int, k: int
) -> list[int]:
    """A random simple path of exactly ``k`` steps from the search root to ``b``.

    Crosses the unique household sequence and spends the ``k - households`` extra steps visiting
    other members of those households (any two members of a household are directly related).
    The caller guarantees feasibility via `Reach`.
    """
    doors = [b]
    crossed: list[int] = []
    while reach[doors[-1]].households > 0:
        step = reach[doors[-1]]
        crossed.append(step.via)
        doors.append(step.previous)
    doors.reverse()
    crossed.reverse()
    spare = [
        (i, y) for i, h in enumerate(crossed)
        for y in tree.members(h) if y not in (doors[i], doors[i + 1])
    ]
    chosen = rng.sample(spare, k - len(crossed))
    path = [doors[0]]
    for i in range(len(crossed)):
        inside = [y for j, y in chosen if j == i]
        rng.shuffle(inside)
        path += [*inside, doors[i + 1]]
    return path


@dataclass(frozen=True)
class TreePlan:
    """Shape of a random family: sizes scale with the chain length a story needs."""

    generations: int = 3
    min_children: int = 1
    max_children: int = 3
    marry_prob: float = 0.75
    inlaw_family_prob: float = 0.6
    max_inlaw_siblings: int = 2
    max_people: int = 40


class _Names:
    """Per-tree supply of unique names of each gender, in a seeded random order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.left = {MALE: rng.sample(MALE_NAMES, len(MALE_NAMES)),
                     FEMALE: rng.sample(FEMALE_NAMES, len(FEMALE_NAMES))}

    def gender(self) -> str:
        return MALE if self.rng.random() < 0.5 else FEMALE

    def take(self, gender: str) -> str:
        return self.left[gender].pop()


def random_tree(rng: random.Random, plan: TreePlan) -> FamilyTree:
    """Grow a family from one founding couple, generation by generation, within ``plan``.

    Children marry people from outside the tree; some of those (and the founders) bring their own
    parents and siblings, which gives the tree in-laws, uncles by marriage and so on.
    """
    tree = FamilyTree()
    names = _Names(rng)
    limit = min(plan.max_people, MAX_PEOPLE)

    def newcomer(gender: str, with_family: bool) -> int:
        if not with_family or len(tree) + 3 > limit:
            return tree.add_person(names.take(gender), gender)
        father = tree.add_person(names.take(MALE), MALE)
        home = tree.marry(father, tree.add_person(names.take(FEMALE), FEMALE))
        person = tree.add_child(home, names.take(gender), gender)
        for _ in range(rng.randint(0, plan.max_inlaw_siblings)):
            if len(tree) >= limit:
                break
            g = names.gender()
            tree.add_child(home, names.take(g), g)
        return person

    founder = newcomer(MALE, rng.random() < plan.inlaw_family_prob)
    first = tree.marry(founder, newcomer(FEMALE, rng.random() < plan.inlaw_family_prob))
    frontier = deque([(first, 0)])
    while frontier:
        household, generation = frontier.popleft()
        if generation + 1 >= plan.generations:
            continue
        for _ in range(rng.randint(plan.min_children, plan.max_children)):
            if len(tree) + 2 > limit:
                return tree
            gender = names.gender()
            child = tree.add_child(household, names.take(gender), gender)
            if rng.random() < plan.marry_prob:
                other = FEMALE if gender == MALE else MALE
                partner = newcomer(other, rng.random() < plan.inlaw_family_prob)
                frontier.append((tree.marry(child, partner), generation + 1))
    return tree
