"""Measured figures cannot drift from what was measured: every figure file under docs/figures/
says when and on what it was measured, and the figures the README shows (it cannot render the
site's generated parts) are those files' own -- the table row for row, the line under it
word for word, the picture the run drew."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys

import pytest
from paths import ROOT

FIGURES = ROOT / "docs" / "figures"
README = ROOT / "README.md"


@functools.cache
def _hook():
    spec = importlib.util.spec_from_file_location("folnet_docs_hook",
                                                  ROOT / "docs" / "hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _records() -> list:
    return (sorted(FIGURES.glob("*.json")) + sorted(FIGURES.glob("*/record.json"))
            + sorted(FIGURES.glob("against-*/*.json"))
            + sorted(FIGURES.glob("step_census/*.json")))


@pytest.mark.parametrize("path", _records(), ids=lambda p: p.relative_to(FIGURES).as_posix())
def test_every_figure_file_says_when_and_where(path):
    machine = json.loads(path.read_text())["machine"]
    assert re.fullmatch(r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d", machine["time"])
    assert machine["torch"] and (machine.get("cuda") or machine.get("cpu_model")
                                 or machine.get("cpu"))


def test_the_figure_files_are_there():
    assert (FIGURES / "pretraining" / "record.json").is_file()
    assert len(_records()) >= 2


def test_the_readme_main_job_table_is_the_runs_own():
    section = _section("The main job")
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    report = (FIGURES / "pretraining" / "results.md").read_text().splitlines()
    assert len(rows) >= 3  # the header and a row per operator string
    for row in rows:
        assert row in report, f"README row not in docs/figures/pretraining/results.md: {row}"


def test_the_readme_says_when_and_where_as_the_record_does():
    section = _section("The main job")
    line = f"Measured by {_hook().figure_demo_record('pretraining')}."
    assert line in section.replace("\n", " ") or line in section, line


def test_the_readme_picture_is_the_runs_own():
    section = _section("The main job")
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section)
    assert pictures == ["docs/figures/pretraining/results.png"]
    assert (ROOT / pictures[0]).is_file()


def test_the_drift_checks_see_a_changed_figure(tmp_path):
    """Not vacuous: a README cell that differs from the report fails the row check."""
    report = (FIGURES / "pretraining" / "results.md").read_text().splitlines()
    row = next(line for line in report if line.startswith("| jmc.atp RPE | 1000 |"))
    cells = row.split(" | ")  # cells[3]: the pretrained arm's seen accuracy, as 0.xxx
    cells[3] = f"{float(cells[3]) + 0.01:.3f}"
    changed = " | ".join(cells)
    assert changed != row and changed not in report


def test_the_before_after_tables_show_every_measured_case():
    """Each `train_step.py --against` case and each long_memory before/after pair is a row of
    its page's table, with the figures of its files (a side's files, rounds run alternating,
    give the ends of the range its cell shows)."""
    hook = _hook()
    for folder in sorted(FIGURES.glob("against-*")):
        steps = any(not path.name.startswith("long_") for path in folder.glob("*.json"))
        text = (hook.figure_against(folder.name) if steps
                else hook.figure_memory_against(folder.name))
        for path in folder.glob("*.json"):
            data = json.loads(path.read_text())
            for run in data.get("runs", []):  # make_demo.json
                assert f"| {run['started']} | {run['side']} | `{run['commit']}` |" in text
                assert f"| {run['wall_s']:.1f} s | {run['rows_s']} s |" in text
            for row in data.get("rows", []):
                if path.name.startswith("long_memory_"):
                    continue  # by case and side below
                elif row["side"] == "ours":
                    assert f"{row['step_s']:.3f} s | {row['before_over_ours']:.2f} |" in text
        sides: dict[tuple, list[float]] = {}  # a case, side and mode's peaks over its files
        for path in folder.glob("long_memory_*.json"):
            for r in json.loads(path.read_text())["rows"]:
                key = (re.sub(r"_r\d+$", "", path.stem), r["mode"], r["seq_len"])
                sides.setdefault(key, []).append(r["peak_above_mb"])
        for key, peaks in sides.items():  # one value, or the range "779-840 MiB"
            low, high = format(min(peaks), ",.0f"), format(max(peaks), ",.0f")
            assert f"| {low} MiB |" in text if low == high else f"| {low}-{high} MiB |" in text, key
    with pytest.raises(hook.DocsError, match="no train_step"):
        hook.figure_against("pretraining")  # a folder without such files
    with pytest.raises(hook.DocsError, match="no long_memory"):
        hook.figure_memory_against("pretraining")


@pytest.mark.parametrize("folder", ["against-f00006c", "against-f00006c-epyc"])
def test_the_readme_demo_speed_is_the_records_own(folder):
    """The README's before/after `make demo` sentences (one per machine) quote make_demo.json's
    means and ratio."""
    record = json.loads((FIGURES / folder / "make_demo.json").read_text())
    before, after, ratio = _hook().seeds_per_minute(record)
    seeds = {r["side"]: r["seeds"] for r in record["runs"]}
    text = " ".join(_section("The main job").split())
    runs = sum(r["side"] == "after" for r in record["runs"])
    quoted = (f"took {after:.0f} s for {seeds['after']} seeds (mean of {runs} runs), and "
              f"{before:.0f} s for {seeds['before']} seeds at f00006c")
    # the ratio closes the same sentence
    assert re.search(re.escape(quoted) + r"[^.]*?" + re.escape(f": {ratio:.2f}x the seeds per "
                                                               f"minute"), text), quoted


def test_the_readme_step_census_sentence_is_the_records_own():
    """The README's launch, sync and byte counts are the base preset's CUDA-path rows of the
    census before and now (the latest census, bytes.json), and LAMB's."""
    def row(name: str) -> dict:
        data = json.loads((FIGURES / "step_census" / f"{name}.json").read_text())
        return next(r for r in data["rows"] if (r["preset"], r["path"]) == ("base", "cuda"))

    before, now = row("before"), row("bytes")  # bytes.json: the latest census
    text = " ".join(README.read_text(encoding="utf-8").split())
    quoted = (f"launched {before['folnet']['launches']:,} operations before the work on them "
              f"and launches {now['folnet']['launches']:,} now, BERT-base's "
              f"{now['bert']['launches']:,}; its host syncs went from "
              f"{before['folnet']['syncs']} to {now['folnet']['syncs']}, and LAMB from "
              f"{before['lamb_alone']:,} operations a step to {now['lamb_alone']:,}")
    assert quoted in text, quoted
    moved = (f"moves {now['folnet']['bytes'] / 1e9:.1f} GB at T {now['seq_len']}, batch "
             f"{now['batch']}: {now['folnet']['bytes'] / now['folnet']['floor']:.2f}x what its "
             f"values cost read and written once (BERT-base "
             f"{now['bert']['bytes'] / now['bert']['floor']:.2f}x)")
    assert moved in text, moved


def test_the_readme_demo_time_against_0d541cf_is_the_records_own():
    """The README's sentence on `make demo` before and after the step's speed work quotes
    make_demo.json's means (and, the arithmetic unchanged, the table is the same)."""
    record = json.loads((FIGURES / "against-0d541cf" / "make_demo.json").read_text())
    before, after, _ = _hook().seeds_per_minute(record)
    seeds = {r["side"]: r["seeds"] for r in record["runs"]}
    runs = sum(r["side"] == "after" for r in record["runs"])
    text = " ".join(_section("The main job").split())
    quoted = (f"took {after:.0f} s for {seeds['after']} seeds (mean of {runs} runs), and "
              f"{before:.0f} s for {seeds['before']} seeds at 0d541cf, with the same table")
    assert quoted in text, quoted
