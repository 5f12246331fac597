"""What pretraining adds (`folnet ablate` with a [compare] table): the plan's format and its
errors; the held-out corpus, which keeps the tasks' validation and test questions and their
families out of pretraining; the paired gain against hand-computed references; and a tiny
run of both arms at two label budgets, resumed."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from runs import tiny_plan

import folnet
from folnet.arch import from_pretrained, read_metadata
from folnet.cli import main as cli_main
from folnet.train.ablate.corpus import held_out_questions, write_corpus
from folnet.train.ablate.figure import plot_sweep
from folnet.train.ablate.gain import gains
from folnet.train.ablate.plan import Compare, load_plan, parse_plan_dict, plan_to_dict
from folnet.train.ablate.run import run_plan
from folnet.train.ablate.stats import difference_interval, paired_difference_interval
from folnet.train.ablate.summary import question_hits, summarise_cells, summarise_row
from folnet.train.data import kinship
from folnet.train.data.documents import iter_documents, kinship_examples
from folnet.train.data.kinship import stories
from folnet.train.finetune.evaluate import read_predictions
from folnet.train.tasks import family_of

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = {
    "name": "t", "data": "kinship-symbolic", "tasks": ["kinship/symbolic"],
    "pretrain": {"preset": "tiny", "steps": 20},
    "finetune": {"max_steps": 10},
    "rows": [{"ops": "j.a"}, {"ops": "jmc.atp"}],
}


def plan(**changes):
    return parse_plan_dict({**BASE, **changes}, source="test.toml")


def load_plan_text(text: str, where):
    path = where / "plan.toml"
    path.write_text(text)
    return load_plan(path)


# -- the plan ------------------------------------------------------------------------------


def test_compare_parses_and_survives_plan_json():
    p = plan(compare={"scratch_steps": 1, "sweep": {"kinship_train_size": [400, 1000]}})
    c = p.compare
    assert (c.scratch_steps, c.option, c.values) == (1, "kinship_train_size", (400, 1000))
    assert c.cells() == [("pretrained", 400), ("pretrained", 1000), ("scratch", 400),
                         ("scratch", 1000)]
    assert c.cell_name("scratch", 400) == "scratch-kinship_train_size=400"
    assert c.overrides(1000) == {"kinship_train_size": 1000}
    data = json.loads(json.dumps(plan_to_dict(p)))  # what OUT/plan.json holds
    assert data["compare"] == {"scratch_steps": 1, "sweep": {"kinship_train_size": [400, 1000]}}
    assert parse_plan_dict(data).compare == c  # the row processes of --jobs N read it back
    bare = plan(compare={"scratch_steps": 2}).compare  # no sweep: [finetune] as it is
    assert bare.cells() == [("pretrained", None), ("scratch", None)]
    assert bare.cell_name("pretrained", None) == "pretrained" and bare.overrides(None) == {}
    # a plan without [compare] writes the plan.json it wrote before
    assert plan().compare is None and "compare" not in plan_to_dict(plan())
    assert "compare" not in plan_to_dict(load_plan("demo"))


@pytest.mark.parametrize(("compare", "match"), [
    ({"scratch_steps": 1, "sweeps": {}}, r"\[compare\]: unknown key\(s\) \['sweeps'\]"),
    ({"scratch_steps": 0}, r"scratch_steps must be an integer >= 1, got 0 .*learning rate 0"),
    ({"scratch_steps": True}, r"scratch_steps must be an integer >= 1, got True"),
    ({"scratch_steps": 20}, r"scratch_steps = 20 must be fewer than the pretraining steps "
                            r"\(20\)"),
    ({"sweep": [400]}, r"sweep must be a table of one \[finetune\] option"),
    ({"sweep": {"kinship_train_size": [4], "max_steps": [5]}}, r"sweep must be a table of one"),
    ({"sweep": {"label_budget": [4]}}, r"sweep option 'label_budget' is no \[finetune\] option"),
    ({"sweep": {"data_seed": [0, 1]}}, r"sweep option 'data_seed' cannot be swept"),
    ({"sweep": {"max_steps": [5]}}, r"sweep option 'max_steps' is set in \[finetune\] too "
                                    r"\(10\)"),
    ({"sweep": {"kinship_train_size": []}}, r"sweep kinship_train_size must be a non-empty "
                                            r"list of values, got \[\]"),
    ({"sweep": {"kinship_train_size": [400, 400]}}, r"repeats a value: \[400, 400\]"),
    ({"sweep": {"kinship_train_size": [400, 0]}}, r"sweep kinship_train_size = 0: "
                                                  r"--kinship-train-size must be >= 1, got 0"),
    ("yes", r"\[compare\] must be a table, got 'yes'"),
])
def test_bad_compare_fails_before_training(compare, match):
    with pytest.raises(folnet.FolnetError, match=match):
        plan(compare=compare)


def test_steps_override_is_checked_against_scratch_steps():
    data = {**BASE, "compare": {"scratch_steps": 5}}
    with pytest.raises(folnet.FolnetError, match=r"scratch_steps = 5 must be fewer .* \(5\)"):
        parse_plan_dict(data, overrides={"steps": 5})


# -- the held-out corpus -------------------------------------------------------------------

CORPUS_OPTIONS = {"kinship_train_size": 40, "kinship_test_per_k": 200,
                  "kinship_test_k": [2, 3, 4], "data_seed": 0}


def _facts(sentences: list[str]) -> frozenset[tuple[str, ...]]:
    """A symbolic question or document as its set of facts ("x word y inverse ."): parsed
    from the text, not by the code under test."""
    facts = [tuple(s.split()[:-1]) for s in sentences]
    return frozenset(f for f in facts if len(f) == 4)


def test_corpus_holds_no_test_question_nor_its_family(tmp_path):
    """The symbolic corpus drawn as before held test questions verbatim (with their answers);
    the ablation's corpus holds none of them and none of their families, and pretraining
    reads exactly what was checked."""
    budgets = [dict(CORPUS_OPTIONS, kinship_train_size=n) for n in (40, 60)]
    held = held_out_questions(budgets)
    task = family_of("kinship/symbolic")
    spec = next(s for s in task.tasks if s.name == "kinship/symbolic")
    test_questions = []  # as the finetuning reads them: its rendered stories
    for options in budgets:
        split = task.read(spec, None, ["validation", "test"], options)
        test_questions += [_facts(e.text_a.replace(" . ", " .\n").splitlines())
                           for name in ("validation", "test") for e in split[name].examples]
    assert len(test_questions) == (600 + 4) + (600 + 6)  # test 200 per k; validation a tenth

    drawn = list(kinship.symbolic_documents(kinship.reasoning_examples(400, seed=3)))
    leaked = [d for d in drawn if _facts(d[:-1]) in set(test_questions)]
    assert len(leaked) > 0  # so the check below can fail

    path = write_corpus(tmp_path, "kinship-symbolic", documents=400, seed=3, held=held,
                        tasks=["kinship/symbolic"])
    documents = list(iter_documents(str(path)))  # as pretraining reads the file
    assert len(documents) == 400
    assert not {_facts(d[:-1]) for d in documents} & set(test_questions)
    examples = kinship_examples(400, 3, kinship.HeldOut.of(
        [q for split in held.values() for q in split]))
    assert documents == list(kinship.symbolic_documents(examples))  # the file is these
    test_families = {q.family for options in budgets for name in ("validation", "test")
                     for q in kinship.systematic_split(
                         train_size=options["kinship_train_size"], test_size_per_k=200,
                         test_k=(2, 3, 4), seed=0)[name]}
    assert not {e.family for e in examples} & test_families
    info = json.loads(path.with_suffix(".json").read_text())
    assert info["unfiltered_held"] >= len(leaked)
    twins, total = info["test_shape_twins"]["2"]
    assert total == 200 and 0 < twins <= 200 and info["test_shape_twins"]["4"][0] == 0
    # rewriting is a no-op: row processes may race to it
    stamp = path.stat().st_mtime_ns
    write_corpus(tmp_path, "kinship-symbolic", documents=400, seed=3, held=held,
                 tasks=["kinship/symbolic"])
    assert path.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("kind", ["kinship", "kinship-symbolic"])
def test_a_corpus_file_reads_as_the_embedded_corpus(tmp_path, kind):
    """Nothing held out, the file the ablation writes is the corpus ``--data KIND`` reads."""
    path = write_corpus(tmp_path, kind, documents=60, seed=1, tasks=[],
                        held={"validation": [], "test": []})
    assert list(iter_documents(str(path))) == list(
        iter_documents(kind, kinship_documents=60, seed=1))


def test_held_out_families_are_skipped():
    """Families never meet by chance, so the family rule is checked by holding out families
    the corpora would otherwise contain."""
    drawn = kinship.reasoning_examples(30, seed=9)
    held = kinship.HeldOut(families=frozenset(e.family for e in drawn[:10]))
    kept = kinship.reasoning_examples(30, seed=9, exclude=held)
    assert len(kept) == 30 and not {e.family for e in kept} & held.families
    assert [e.k for e in kept] == [e.k for e in drawn]  # same lengths: the next of each k
    stories_drawn = kinship.pretraining_documents(6, seed=2)
    rng = random.Random("kinship/documents/2")
    first, family = stories._document(rng)
    assert first == stories_drawn[0]  # (at least 8 sentences, so it was kept)
    assert kinship.pretraining_documents(6, seed=2, exclude_families={family}) \
        == [*stories_drawn[1:], kinship.pretraining_documents(7, seed=2)[6]]


# -- the paired gain -----------------------------------------------------------------------


def _seed(arm: str, value: int, seed: int, correct: list[int], ks: list[int]) -> dict:
    answers = {"correct": correct, "k": ks, "train_k": [2, 3]}
    metrics = {n: float(np.mean(h)) for n, h in question_hits(answers).items()}
    return {"arm": arm, "value": value, "pretrain_steps": 20 if arm == "pretrained" else 1,
            "pretrain_updates": 19 if arm == "pretrained" else 0, "metrics": {"k": metrics},
            "baselines": {"k": {}}, "answers": {"k": answers}, "finetune_curves": {},
            "pretrain_seconds": 1.0, "finetune_seconds": 1.0, "loss_curve": []}


def _row(name: str, hits: dict[str, list[list[int]]], ks: list[int]) -> dict:
    """A [compare] row summary from per-arm, per-seed answers at one budget (400)."""
    seeds = [{"name": name, "ops": "j.a", "position": "rpe", "D2": 16, "loss": "MLM.NSP",
              "paper": {}, "params": 1, "flops_per_token": 1.0, "seed": s,
              "cells": [_seed(arm, 400, s, hits[arm][s], ks) for arm in ("pretrained", "scratch")]}
             for s in range(len(hits["pretrained"]))]
    return summarise_cells(seeds)


def test_gain_is_the_paired_difference():
    rng = np.random.default_rng(0)
    ks = [2] * 150 + [3] * 150
    # seeds of very different skill, and pretraining adding about 6 points to each
    base = [0.3, 0.6, 0.85]
    scratch = [list((rng.random(300) < p).astype(int)) for p in base]
    pre = [[max(c, int(rng.random() < 0.09)) for c in s] for s in scratch]
    row = _row("r", {"pretrained": pre, "scratch": scratch}, ks)
    (g,) = gains([row], [400], "k", "accuracy")
    per_seed = [np.mean(a) - np.mean(b) for a, b in zip(pre, scratch, strict=True)]
    assert g.diff == pytest.approx(np.mean(per_seed), abs=1e-12)  # by hand
    assert g.pretrained == pytest.approx(np.mean([np.mean(a) for a in pre]), abs=1e-12)
    assert g.seeds == 3 and g.real and 0 < g.low < g.diff < g.high
    # against a bootstrap written out: seeds, then each seed's questions, drawn for both arms
    draws = np.random.default_rng(1)
    replicates = []
    for _ in range(3000):
        diffs = []
        for s in draws.integers(0, 3, size=3):
            q = draws.integers(0, 300, size=300)
            diffs.append(np.mean(np.asarray(pre[s])[q]) - np.mean(np.asarray(scratch[s])[q]))
        replicates.append(np.mean(diffs))
    low, high = np.percentile(replicates, [2.5, 97.5])
    assert (g.low, g.high) == pytest.approx((low, high), abs=0.006)
    # unpaired, the seeds' spread (0.3 to 0.85) swamps the same gap: why the pairing
    lo, hi = difference_interval(pre, scratch)
    assert lo < 0 < hi
    (seen,) = gains([row], [400], "k", "accuracy_seen")  # the subsets pair the same way
    assert seen.diff == pytest.approx(g.diff, abs=1e-12)


def test_gain_edge_cases_and_pairing_errors():
    ks = [2, 2, 3, 3]
    row = _row("r", {"pretrained": [[1, 1, 1, 1]], "scratch": [[0, 0, 0, 0]]}, ks)
    (g,) = gains([row], [400], "k", "accuracy")
    assert (g.diff, g.low, g.high) == (1.0, 1.0, 1.0)  # one seed, every answer flipped
    same = _row("r", {"pretrained": [[1, 0, 1, 0]] * 2, "scratch": [[1, 0, 1, 0]] * 2}, ks)
    (g,) = gains([same], [400], "k", "accuracy")
    assert (g.diff, g.low, g.high) == (0.0, 0.0, 0.0) and not g.real
    assert gains([row], [1000], "k", "accuracy") == []  # no such budget
    other = json.loads(json.dumps(row))
    other["cells"][1]["seeds"][0]["answers"]["k"]["k"] = [2, 3, 2, 3]
    with pytest.raises(folnet.FolnetError, match="answered different questions"):
        gains([other], [400], "k", "accuracy")
    with pytest.raises(folnet.FolnetError, match="paired arms answer the same questions"):
        paired_difference_interval([[True, False]], [[True]])
    with pytest.raises(folnet.FolnetError, match="the same seeds: 2 and 1"):
        paired_difference_interval([[True], [False]], [[True]])


def test_a_run_directory_from_before_still_reports(tmp_path):
    """Rows an earlier folnet finished (no [compare], no held-out corpus) are read back and
    reported, and the report says their seeds read the corpus as drawn."""
    old = load_plan_text(tiny_plan("old", '[[rows]]\nops = "j.a"\n', seeds=2), tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(plan_to_dict(old)))  # as written then
    ks = [2] * 4 + [3] * 4 + [4] * 4
    seeds = []
    for s in range(2):
        cell = _seed("pretrained", 0, s, [1, 0] * 6, ks)
        seeds.append({"name": "j.a RPE", "ops": "j.a", "position": "rpe", "D2": 16,
                      "loss": "MLM.NSP", "paper": {}, "params": 1000, "flops_per_token": 1e6,
                      "seed": s, "tokens_per_s": 10.0, "mlm_loss": 5.0, "final_loss": 5.5,
                      **{k: v for k, v in cell.items() if k not in ("arm", "value")}})
    row = out / "rows" / "j.a_RPE"
    row.mkdir(parents=True)
    (row / "result.json").write_text(json.dumps(summarise_row(seeds)))
    paths = run_plan(old, out, progress=False)
    md = paths["md"].read_text()
    assert "| 1 | FOLNet: j.a |" in md and "Pretraining gain" not in md
    assert "Seeds that pretrained on `kinship` read the corpus as drawn" in md
    assert (out / "corpus" / "kinship-seed_1.txt").is_file()  # ready for unfinished seeds


# -- a real run ----------------------------------------------------------------------------

PLAN = tiny_plan("cmp", """
[[rows]]
ops = "j.a"

[[rows]]
ops = "jmc.atp"

[compare]
scratch_steps = 1
sweep = { kinship_train_size = [16, 32] }
""", seeds=2, steps=4).replace('data = "kinship"', 'data = "kinship-symbolic"').replace(
    'tasks = ["kinship"]', 'tasks = ["kinship/symbolic"]').replace(
    "kinship_train_size = 24\n", "").replace("vocab_size = 300", "vocab_size = 80")


def _answers(cell_dir):
    """The test questions a cell answered (their ids) and whether it answered each of those
    on the trained lengths right, from its prediction file."""
    rows = read_predictions(cell_dir / "finetune" / "kinship-symbolic" / "predictions"
                            / "test.tsv")
    return ([r["id"] for r in rows],
            [r["prediction"] == r["label"] for r in rows if int(r["k"]) in (2, 3)])


@pytest.mark.slow(seconds=25)
def test_both_arms_at_two_budgets_end_to_end_and_resume(tmp_path, capsys):
    plan_file = tmp_path / "cmp.toml"
    plan_file.write_text(PLAN)
    out = tmp_path / "out"
    assert cli_main(["ablate", str(plan_file), "--out", str(out), "--jobs", "2",
                     "--no-progress"]) == 0
    capsys.readouterr()
    for name in ("results.md", "results.csv", "results.json", "results.png",
                 "results_by_k.png"):
        assert (out / name).is_file(), name
    report = json.loads((out / "results.json").read_text())
    rows = report["rows"]
    assert [r["name"] for r in rows] == ["j.a RPE", "jmc.atp RPE"]
    # the questions of both budgets, generated once for the corpora, for the seed processes
    assert len(list((out / "corpus").glob("kinship-questions-*.json"))) == 2
    for r in rows:
        assert [(c["arm"], c["value"]) for c in r["cells"]] == [
            ("pretrained", 16), ("pretrained", 32), ("scratch", 16), ("scratch", 32)]
        assert [c["pretrain_steps"] for c in r["cells"]] == [4, 4, 1, 1]
        for s in range(2):
            seed = out / "rows" / r["name"].replace(" ", "_") / f"seed_{s}"
            # every cell answers the same test questions; the budgets train on their own
            ids = [_answers(seed / "cells" / f"{arm}-kinship_train_size={n}")[0]
                   for arm in ("pretrained", "scratch") for n in (16, 32)]
            assert len(ids[0]) == 12 and all(i == ids[0] for i in ids)
            sizes = [json.loads((seed / "cells" / f"scratch-kinship_train_size={n}" /
                                 "finetune" / "kinship-symbolic" / "run_config.json")
                                .read_text())["config"]["kinship_train_size"] for n in (16, 32)]
            assert sizes == [16, 32]
            # both arms pretrain on the seed's held-out corpus; scratch is the initialisation
            configs = [json.loads((seed / d / "run_config.json").read_text())
                       for d in ("pretrain", "scratch")]
            assert {c["data"] for c in configs} == {str(out / "corpus" /
                                                        f"kinship-symbolic-seed_{s}.txt")}
            assert [c["steps"] for c in configs] == [4, 1] and configs[1]["seed"] == s
            torch.manual_seed(s)
            vocab = read_metadata(seed / "scratch" / "final")["model"]["vocab_size"]
            init = folnet.build_model(r["ops"], preset="tiny", head="pretraining",
                                      vocab_size=vocab).state_dict()
            scratch = from_pretrained(seed / "scratch" / "final").state_dict()
            assert init.keys() == scratch.keys()
            assert all(torch.equal(init[k], scratch[k]) for k in init)
        # each gain on seen k: the means' difference, and its interval recomputed from the
        # prediction files
        for n in (16, 32):
            hits = {arm: [_answers(out / "rows" / r["name"].replace(" ", "_") / f"seed_{s}"
                                   / "cells" / f"{arm}-kinship_train_size={n}")[1]
                          for s in range(2)] for arm in ("pretrained", "scratch")}
            (g,) = [g for g in report["gains"] if g["row"] == r["name"] and g["value"] == n
                    and g["metric"] == "accuracy_seen"]
            by_seed = [np.mean(a) - np.mean(b) for a, b in zip(*hits.values(), strict=True)]
            assert g["gain"] == pytest.approx(np.mean(by_seed), abs=1e-12)
            assert (g["low"], g["high"]) == pytest.approx(
                paired_difference_interval(*hits.values()), abs=1e-12)
    md = (out / "results.md").read_text()
    assert "Pretraining gain: pretrained minus scratch" in md
    assert "at learning rate 0 (the warmup's first step): its weights are the initialisation" in md
    assert "**Pretraining corpus and held-out questions**" in md
    assert "### Pretrained rows, kinship_train_size = 32" in md
    assert re.search(r"\| j\.a RPE \| 16 \| 2 \| 0\.\d{3} \| 0\.\d{3} \| [+-]0\.\d{3} ", md)

    # Resume: a finished cell is not run again, an unfinished one is, without pretraining.
    row = out / "rows" / "jmc.atp_RPE"
    keep = row / "seed_1" / "cells" / "pretrained-kinship_train_size=16" / "result.json"
    stamp = keep.stat().st_mtime_ns
    (row / "result.json").unlink()
    (row / "seed_1" / "result.json").unlink()
    redo = row / "seed_1" / "cells" / "scratch-kinship_train_size=32"
    (redo / "result.json").unlink()
    (redo / "finetune" / "kinship-symbolic" / "eval.json").unlink()  # its finetune: unfinished
    assert cli_main(["ablate", str(plan_file), "--out", str(out), "--no-progress"]) == 0
    again = capsys.readouterr().out
    assert "[j.a RPE] finished earlier" in again
    assert "[jmc.atp RPE] seed 0 finished earlier" in again
    assert ": pretraining" not in again  # both arms of seed 1 had finished pretraining
    assert "[jmc.atp RPE] seed 1 scratch-kinship_train_size=32: finetuning" in again
    assert "seed 1 pretrained-kinship_train_size=16: finetuning" not in again
    assert keep.stat().st_mtime_ns == stamp
    assert json.loads((out / "results.json").read_text())["gains"] == report["gains"]



@pytest.mark.parametrize("compare", [Compare(1, "kinship_train_size", (1000,)), Compare(1)])
def test_one_budget_draws_both_arms_with_their_intervals(tmp_path, compare):
    """One value swept (or none): the figure is drawn as whiskers, one pair per row, not as
    bands a single point cannot show."""
    pytest.importorskip("matplotlib")
    value = compare.values[0]
    spread = {"mean": 0.8, "low": 0.7, "high": 0.9}
    rows = [{"name": name, "cells": [{"arm": arm, "value": value,
                                      "metrics": {"kinship/symbolic": {"accuracy_seen": spread}}}
                                     for arm in ("pretrained", "scratch")]}
            for name in ("j.a RPE", "jmc.atp RPE")]
    path = plot_sweep(rows, compare, [("kinship/symbolic", "accuracy_seen")],
                      tmp_path / "results.png", title="one budget")
    assert path == tmp_path / "results.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
