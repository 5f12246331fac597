"""The generated kinship questions handed from one process to another through a file
(`save_questions`, `load_questions`): an ablation's parent generates them to hold them out of
its corpora, and each seed process reads them instead of generating them again (seconds per
process). What is read is what would be generated, or nothing is read."""

from __future__ import annotations

import json

import pytest

from folnet.train.tasks import kinship

OPTIONS = {"kinship_train_size": 30, "kinship_test_per_k": 4, "kinship_test_k": [2, 3, 5],
           "data_seed": 3}


@pytest.fixture
def generations(monkeypatch):
    """A process that has generated nothing yet; counts the generator's calls."""
    calls = []
    real = kinship.systematic_split

    def counted(**arguments):
        calls.append(arguments)
        return real(**arguments)

    monkeypatch.setattr("folnet.train.tasks.kinship._MEMO", {})
    monkeypatch.setattr("folnet.train.tasks.kinship.systematic_split", counted)
    return calls


def _fresh_process(monkeypatch):
    monkeypatch.setattr("folnet.train.tasks.kinship._MEMO", {})


def test_a_saved_file_gives_the_generated_questions_without_generating(
        tmp_path, monkeypatch, generations):
    want = kinship.kinship_questions(OPTIONS)
    path = kinship.save_questions(tmp_path, OPTIONS)
    assert path == kinship.questions_file(tmp_path, OPTIONS) and path.parent == tmp_path
    assert len(generations) == 1
    _fresh_process(monkeypatch)
    assert kinship.load_questions(tmp_path, OPTIONS)
    got = kinship.kinship_questions(OPTIONS)
    assert len(generations) == 1  # read, not generated
    assert set(got) == {"train", "validation", "test"} and len(got["test"]) == 12
    for split, questions in want.items():
        assert got[split] == questions, split  # every field, the facts and family included
    assert all(q.facts and q.family for q in got["train"])


def test_a_file_for_other_arguments_is_not_read(tmp_path, monkeypatch, generations):
    kinship.save_questions(tmp_path, OPTIONS)
    other = {**OPTIONS, "data_seed": 4}
    assert kinship.questions_file(tmp_path, other) != kinship.questions_file(tmp_path, OPTIONS)
    _fresh_process(monkeypatch)
    assert not kinship.load_questions(tmp_path, other)  # its file is missing
    # a file copied under the other arguments' name still says whose questions it holds
    kinship.questions_file(tmp_path, OPTIONS).rename(kinship.questions_file(tmp_path, other))
    assert not kinship.load_questions(tmp_path, other)
    kinship.kinship_questions(other)
    assert generations[-1]["seed"] == 4


@pytest.mark.parametrize("damage", ["not json", "k as text", "a fact of three words",
                                    "a split missing", "a field missing"])
def test_a_damaged_file_is_not_read_and_the_questions_are_generated(
        tmp_path, monkeypatch, generations, damage):
    path = kinship.save_questions(tmp_path, OPTIONS)
    want = kinship.kinship_questions(OPTIONS)
    data = json.loads(path.read_text())
    if damage == "not json":
        path.write_text(path.read_text()[:-20])
    else:
        if damage == "k as text":
            data["splits"]["test"][5][3] = "2"
        elif damage == "a fact of three words":
            data["splits"]["train"][0][6][0] = data["splits"]["train"][0][6][0][:3]
        elif damage == "a split missing":
            del data["splits"]["validation"]
        else:
            data["splits"]["train"][2] = data["splits"]["train"][2][:7]
        path.write_text(json.dumps(data))
    _fresh_process(monkeypatch)
    assert not kinship.load_questions(tmp_path, OPTIONS)
    before = len(generations)
    assert kinship.kinship_questions(OPTIONS) == want
    assert len(generations) == before + 1
