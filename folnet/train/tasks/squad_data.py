"""SQuAD 2.0 questions as read: the published JSON (`read_squad`) or the ``rajpurkar/squad_v2``
rows (`squad_rows`), every answer checked against its context.

Why a module of its own: what makes a question usable -- its answer text really at its
``answer_start``, ``is_impossible`` a real boolean -- is data validation, apart from the
windowing and decoding in `folnet.train.tasks.squad`. A question that fails is an error naming
the file and the question id; with ``skip_bad_answers`` (``--skip-bad-answers``) a question
whose answer is elsewhere is left out instead, and the count reported as one warning line on
stderr (`folnet.atomic_write.warn`, as every other warning of a run: a Python warning printed the
module's path and source line around it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folnet.atomic_write import warn
from folnet.errors import FolnetError
from folnet.read_files import parse_json
from folnet.train.data.checks import first_undecodable_line
from folnet.train.tasks.base import TaskSpec
from folnet.train.tasks.hfdatasets import RowTable

__all__ = ["AnswerMismatch", "SquadAnswer", "SquadExample", "parse_squad", "read_squad",
           "squad_example", "squad_rows"]


@dataclass(frozen=True)
class SquadAnswer:
    text: str
    start: int  # character offset into the context


@dataclass(frozen=True)
class SquadExample:
    """One question; ``answers`` is empty when ``is_impossible``."""

    qid: str
    title: str
    question: str
    context: str
    answers: tuple[SquadAnswer, ...]
    is_impossible: bool


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise FolnetError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FolnetError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


class AnswerMismatch(FolnetError):
    """An answer whose text is not the context at its ``answer_start``: the one data fault a
    run may be told to skip (``skip_bad_answers``) rather than stop at."""


def squad_example(qid: str, title: str, question: str, context: str,
                  answers: Sequence[tuple[str, int]], impossible: bool,
                  where: str) -> SquadExample:
    """One question, every answer checked to be the context's text at its ``answer_start``:
    the one check both formats (the nested JSON and the published rows) go through. An answer
    elsewhere would train on the wrong span without a word; it raises `AnswerMismatch`."""
    found = []
    if not impossible:
        for text, start in answers:
            if start < 0 or start + len(text) > len(context):
                raise AnswerMismatch(
                    f"{where}: answer_start {start} with text {text!r} lies outside "
                    f"the context ({len(context)} characters)"
                )
            if context[start : start + len(text)] != text:
                at = context[start : start + len(text)]
                raise AnswerMismatch(
                    f"{where}: the answer {text!r} is not at answer_start {start} (the context "
                    f"there reads {at!r}); fix the data or pass --skip-bad-answers"
                )
            found.append(SquadAnswer(text, start))
        if not found:
            raise FolnetError(f"{where}: answerable question with no answers")
    return SquadExample(qid, title, question, context, tuple(found), impossible)


class _Skipped:
    """The questions `AnswerMismatch` dropped from one file (``skip_bad_answers``), reported
    once the file is read."""

    def __init__(self, skip: bool) -> None:
        self.skip, self.ids = skip, []

    def report(self, source: str) -> None:
        if self.ids:
            shown = ", ".join(repr(q) for q in self.ids[:5])
            more = f", ... ({len(self.ids)} in all)" if len(self.ids) > 5 else ""
            warn(f"{source}: skipped {len(self.ids)} question(s) whose answer text is not at "
                 f"its answer_start (--skip-bad-answers): {shown}{more}")


def _impossible(qa: dict[str, Any], where: str) -> bool:
    """``is_impossible``: absent (SQuAD v1.1) is False; otherwise a JSON true or false only,
    since a string "false" is truthy and would silently make the question unanswerable."""
    value = qa.get("is_impossible", False)
    if not isinstance(value, bool):
        raise FolnetError(f"{where}: is_impossible must be true or false (a JSON boolean), "
                          f"got {value!r}")
    return value


def parse_squad(data: Mapping[str, Any], source: str = "<squad json>", *,
                skip_bad_answers: bool = False) -> list[SquadExample]:
    """Examples of a parsed SQuAD v1.1/v2.0 JSON object (``is_impossible`` absent = False).
    With `skip_bad_answers`, a question whose answer is not at its ``answer_start`` is left
    out (and the count reported) instead of being an error."""
    articles = _need(data, "data", list, source)
    out = []
    skipped = _Skipped(skip_bad_answers)
    for a_idx, article in enumerate(articles):
        title = str(article.get("title", "")) if isinstance(article, dict) else ""
        for p_idx, paragraph in enumerate(
            _need(article, "paragraphs", list, f"{source} data[{a_idx}]")
        ):
            where_p = f"{source} data[{a_idx}].paragraphs[{p_idx}]"
            context = _need(paragraph, "context", str, where_p)
            for qa in _need(paragraph, "qas", list, where_p):
                qid = str(_need(qa, "id", (str, int), f"{where_p}.qas"))
                where = f"{source} question {qid!r}"
                question = _need(qa, "question", str, where)
                impossible = _impossible(qa, where)
                answers = []
                if not impossible:
                    answers = [(_need(ans, "text", str, where),
                                _need(ans, "answer_start", int, where))
                               for ans in _need(qa, "answers", list, where)]
                try:
                    out.append(squad_example(qid, title, question, context, answers,
                                             impossible, where))
                except AnswerMismatch:
                    if not skipped.skip:
                        raise
                    skipped.ids.append(qid)
    skipped.report(source)
    return out


def squad_rows(task: TaskSpec, table: RowTable, *,
               skip_bad_answers: bool = False) -> list[SquadExample]:
    """Examples of SQuAD 2.0 as ``rajpurkar/squad_v2`` publishes it, one row per question:
    ``answers`` is ``{"text": [...], "answer_start": [...]}``, empty lists for a question
    with no answer (an ``is_impossible`` column, where an export has one, must be a boolean
    that agrees). Answers are checked as in `parse_squad`."""
    out = []
    skipped = _Skipped(skip_bad_answers)
    for i, row in enumerate(table.rows):
        qid = row["id"]
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise FolnetError(f"{table.where(i)}: column 'id' holds {qid!r}, expected a string")
        where = f"{table.where(i)} (question {str(qid)!r})"
        answers = row["answers"]
        texts = answers.get("text") if isinstance(answers, dict) else None
        starts = answers.get("answer_start") if isinstance(answers, dict) else None
        if (not isinstance(texts, list) or not isinstance(starts, list)
                or len(texts) != len(starts)
                or not all(isinstance(t, str) for t in texts)
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in starts)):
            raise FolnetError(f"{where}: 'answers' must be {{'text': [str, ...], "
                              f"'answer_start': [int, ...]}} of equal length, got {answers!r}")
        if row.get("is_impossible") is not None and _impossible(row, where) != (not texts):
            raise FolnetError(f"{where}: is_impossible is {row['is_impossible']} but the "
                              f"question has {len(texts)} answer(s)")
        title = row.get("title")
        try:
            out.append(squad_example(str(qid), title if isinstance(title, str) else "",
                                     table.text(i, "question"), table.text(i, "context"),
                                     list(zip(texts, starts, strict=True)), not texts, where))
        except AnswerMismatch:
            if not skipped.skip:
                raise
            skipped.ids.append(str(qid))
    skipped.report(table.source)
    return out


def read_squad(path: str | Path, *, skip_bad_answers: bool = False) -> list[SquadExample]:
    """Examples of a SQuAD JSON file (``train-v2.0.json`` / ``dev-v2.0.json``); see
    `parse_squad` for `skip_bad_answers`."""
    path = Path(path)
    try:
        data = parse_json(path.read_text(encoding="utf-8"), str(path))
    except json.JSONDecodeError as exc:
        raise FolnetError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        bad = first_undecodable_line(path)
        where = f":{bad[0]}: not valid UTF-8 ({bad[1]})" if bad else ": not valid UTF-8"
        raise FolnetError(f"{path}{where}; a SQuAD file is UTF-8 JSON") from None
    return parse_squad(data, str(path), skip_bad_answers=skip_bad_answers)
