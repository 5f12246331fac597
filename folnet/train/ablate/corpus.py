"""An ablation's pretraining corpus, with the finetuning tasks' held-out questions kept out.

Why: the embedded corpora come from the same world as the kinship tasks, and nothing kept them
apart: ``kinship-symbolic`` states the answer of each of its questions, and drawn with the
demo's settings each seed's corpus held 100-105 of the 650 k = 2 test questions (and 57-64 of
the 800 validation questions), answers included. So when a plan pretrains on
an embedded corpus and finetunes on a generated kinship task, the ablation writes the corpus
itself, once per pretraining seed, without every validation and test question of its tasks (at
every value of a [compare] sweep) and without any other question or story from their families
(`folnet.train.data.kinship.heldout`); every row's pretraining of that seed reads the file::

    OUT/corpus/<data>-seed_<s>.txt    documents separated by an empty line, a sentence a line
    OUT/corpus/<data>-seed_<s>.json   what was held out, and what the report says about it

A plan whose corpus is a file of its own is left as it is (nothing here can vouch for it), and
so is one without a kinship task (nothing to hold out); the report says which case it is.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from folnet.atomic_write import atomic_write_json, atomic_write_text
from folnet.train.data.documents import EMBEDDED, kinship_documents, kinship_examples
from folnet.train.data.kinship import (
    HeldOut,
    KinshipExample,
    chain_of,
    question_key,
    symbolic_documents,
)
from folnet.train.data.sources import KINSHIP_SYMBOLIC
from folnet.train.tasks import family_of
from folnet.train.tasks import kinship as kinship_task

__all__ = ["HELD_OUT_SPLITS", "corpus_file", "describe_corpora", "held_out_questions",
           "holds_out", "write_corpus"]

#: The task splits a pretraining corpus must not contain (the recipe is chosen on validation).
HELD_OUT_SPLITS = ("validation", "test")


def holds_out(data: str, tasks: Sequence[str]) -> bool:
    """Whether the ablation writes its corpus with held-out questions kept out: an embedded
    corpus, and at least one generated kinship task to keep out of it."""
    return data in EMBEDDED and any(family_of(t) is kinship_task.FAMILY for t in tasks)


def corpus_file(out: Path, data: str, seed: int) -> Path:
    """Where the corpus of pretraining seed ``seed`` is written."""
    return out / "corpus" / f"{data}-seed_{seed}.txt"


def held_out_questions(options: Iterable[Mapping[str, Any]]
                       ) -> dict[str, list[KinshipExample]]:
    """The held-out splits' questions of every finetuning run in ``options`` (each a run's
    settings, `FinetuneConfig.to_dict`), each question once."""
    out: dict[str, list[KinshipExample]] = {split: [] for split in HELD_OUT_SPLITS}
    seen: set[tuple[str, frozenset]] = set()
    for run in options:
        questions = kinship_task.kinship_questions(run)
        for split in HELD_OUT_SPLITS:
            for q in questions[split]:
                key = (q.family, question_key(q))
                if key not in seen:
                    seen.add(key)
                    out[split].append(q)
    return out


def _twins(corpus: list[KinshipExample], tests: list[KinshipExample]) -> dict[str, list[int]]:
    """Per chain length k: how many test questions have a question of the same shape (the
    same relation words along the chain) in the corpus, and how many there are."""
    shapes = {chain_of(e) for e in corpus}
    total = Counter(q.k for q in tests)
    twins = Counter(q.k for q in tests if chain_of(q) in shapes)
    return {str(k): [twins[k], total[k]] for k in sorted(total)}


def write_corpus(out: Path, data: str, *, documents: int, seed: int,
                 held: Mapping[str, list[KinshipExample]], tasks: Sequence[str]) -> Path:
    """Write the corpus of pretraining seed ``seed`` (unless it is there) without the
    questions and families of ``held``; returns its path. Deterministic, so two seed processes
    writing it at once write the same bytes."""
    path = corpus_file(out, data, seed)
    info_path = path.with_suffix(".json")
    if path.is_file() and info_path.is_file():
        return path
    everything = [q for split in HELD_OUT_SPLITS for q in held[split]]
    held_out = HeldOut.of(everything)
    kept = None  # a question corpus's questions: drawn once, for its documents and its shapes
    if data == KINSHIP_SYMBOLIC:
        kept = kinship_examples(documents, seed, held_out)
        docs = list(symbolic_documents(kept))  # as kinship_documents makes them
    else:
        docs = kinship_documents(data, documents, seed, held_out)
    info: dict[str, Any] = {
        "data": data, "seed": seed, "documents": len(docs), "tasks": list(tasks),
        "held_out": {"splits": list(HELD_OUT_SPLITS), "questions": len(held_out.questions),
                     "families": len(held_out.families)},
        "unfiltered_held": None, "test_shape_twins": None}
    if kept is not None:  # a corpus of questions: what it would have held, and shapes
        info["unfiltered_held"] = sum(e in held_out for e in kinship_examples(documents, seed))
        info["test_shape_twins"] = _twins(kept, held["test"])
    atomic_write_text(path, "\n\n".join("\n".join(d) for d in docs) + "\n")
    atomic_write_json(info_path, info)
    return path


def _read_info(path: str) -> dict[str, Any] | None:
    """The record `write_corpus` left beside a corpus file; None for any other corpus."""
    info = Path(path).with_suffix(".json")
    if not path.endswith(".txt") or not info.is_file():
        return None
    return json.loads(info.read_text())


def describe_corpora(data: str, tasks: Sequence[str], used: Iterable[str]) -> str:
    """The report's paragraph on what the pretraining read and how the held-out questions
    were kept out of it; ``used`` is the corpus each finished seed's pretraining read."""
    used = sorted(set(used))
    if not holds_out(data, tasks):
        why = ("no finetuning task is a generated kinship task, so there is nothing to hold "
               "out" if data in EMBEDDED else "it is not generated here, so nothing vouches "
               "that it holds none of the test questions")
        return f"**Pretraining corpus**: `{data}` as given; {why}."
    infos = [(p, info) for p in used if (info := _read_info(p)) is not None]
    lines = []
    if infos:
        first = infos[0][1]
        held = first["held_out"]
        kept = ("a question whose family tree (its fingerprint: the people, their genders, "
                "couples and children) or whose symbolic facts (the question itself, in any "
                "order) match a held-out one" if data == KINSHIP_SYMBOLIC else
                "a story about the family of a held-out question")
        lines.append(
            f"**Pretraining corpus and held-out questions**: each pretraining seed reads "
            f"`{data}` ({first['documents']} documents) as written to OUT/corpus/ with the "
            f"{'/'.join(held['splits'])} questions of {', '.join(first['tasks'])} (at every "
            f"finetuning setting: {held['questions']} questions, {held['families']} families) "
            f"kept out: {kept} is skipped and the generator's next one taken (a test asserts "
            f"that no held-out question or family is left in).")
        would = [info["unfiltered_held"] for _, info in infos]
        if all(w is not None for w in would):
            lines.append(f"Drawn without this, the corpora would have held "
                         f"{', '.join(map(str, would))} held-out question(s) (seeds "
                         f"{', '.join(str(i['seed']) for _, i in infos)}).")
        twins = first.get("test_shape_twins")
        if twins:
            shares = ", ".join(f"k = {k}: {n} of {total}" for k, (n, total)
                               in sorted(twins.items(), key=lambda kv: int(kv[0])) if n)
            lines.append(f"Not kept out: questions of the same shape (the same relation words "
                         f"along the chain, other entity tokens) -- test questions with one in "
                         f"the seed-{first['seed']} corpus: {shares or 'none'}; the finetuning "
                         f"training set has such twins at the trained lengths as well, and the "
                         f"corpus holds no question of the untrained lengths.")
    bare = [p for p in used if _read_info(p) is None]
    if bare:
        lines.append(f"Seeds that pretrained on {', '.join(f'`{b}`' for b in bare)} read the "
                     f"corpus as drawn, held-out questions not kept out (a run directory "
                     f"begun by an earlier folnet).")
    return " ".join(lines)
