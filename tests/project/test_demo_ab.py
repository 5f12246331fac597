"""benchmarks/demo_ab.py on a repository of two commits whose `make demo` is a stand-in: the
runs alternate, each side is timed in its own clone at its own commit, the seeds come from the
run's plan and the rows' time from its output, and the record is what the documentation's hook
renders. Refusals: a --work folder that is not empty, a demo that fails, an output without the
rows' line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import BENCHMARKS, ROOT

sys.path.insert(0, str(BENCHMARKS))
import demo_ab

MAKEFILE = """setup:
\ttouch made
demo:
\ttest -f made
\tmkdir -p runs/demo
\tprintf '{{"seeds": {seeds}}}' > runs/demo/plan.json
\tsleep 0.1
\t{extra}echo '== 2 row(s) in {rows} s'
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, seeds: int, rows: int, extra: str = "") -> str:
    (repo / "Makefile").write_text(MAKEFILE.format(seeds=seeds, rows=rows, extra=extra))
    _git(repo, "add", "Makefile")
    _git(repo, "commit", "-q", "-m", f"{seeds} seeds")
    return _git(repo, "rev-parse", "--short", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    before = _commit(repo, seeds=3, rows=7)
    after = _commit(repo, seeds=5, rows=4)
    return repo, before, after


def _hook():
    spec = importlib.util.spec_from_file_location("folnet_docs_hook_ab",
                                                  ROOT / "docs" / "hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sides_alternate_in_their_own_clones_and_the_hook_renders_them(repo, tmp_path):
    path, before, after = repo
    out = tmp_path / "make_demo.json"
    assert demo_ab.main([before, after, "--repo", str(path), "--rounds", "2",
                         "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    runs = record["runs"]
    assert [r["side"] for r in runs] == ["before", "after", "before", "after"]
    assert [r["commit"] for r in runs] == [before, after, before, after]
    assert [r["seeds"] for r in runs] == [3, 5, 3, 5]  # each clone ran its own commit
    assert [r["rows_s"] for r in runs] == [7, 4, 7, 4]
    assert all(r["wall_s"] >= 0.1 and r["cpu_s"] >= 0 for r in runs)  # (the stand-in sleeps)
    assert {r["clone"] for r in runs} == {f"before-{before}", f"after-{after}"}
    for r in runs:
        assert (tmp_path / "work" / f"{r['clone']}-setup.log").is_file()
    hook = _hook()
    mean_before, mean_after, ratio = hook.seeds_per_minute(record)
    walls = {side: [r["wall_s"] for r in runs if r["side"] == side] for side in ("before",
                                                                                  "after")}
    assert mean_before == pytest.approx(sum(walls["before"]) / 2)
    assert ratio == pytest.approx((5 / mean_after) / (3 / mean_before))
    text = hook.demo_against(record)
    for r in runs:
        assert f"| {r['started']} | {r['side']} | `{r['commit']}` |" in text


def test_a_work_folder_in_use_is_refused(repo, tmp_path, capsys):
    path, before, after = repo
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep").write_text("mine")
    with pytest.raises(SystemExit):
        demo_ab.main([before, after, "--repo", str(path), "--work", str(work),
                      "--json", str(tmp_path / "x.json")])
    assert "--work" in capsys.readouterr().err and (work / "keep").read_text() == "mine"
    with pytest.raises(SystemExit):
        demo_ab.main([before, after, "--repo", str(path), "--rounds", "0",
                      "--work", str(tmp_path / "w0"), "--json", str(tmp_path / "x.json")])
    assert "--rounds 0: at least 1" in capsys.readouterr().err


def test_a_failed_demo_or_one_without_its_rows_line_is_an_error(repo, tmp_path):
    path, before, _after = repo
    failing = _commit(path, seeds=5, rows=4, extra="false && ")
    with pytest.raises(RuntimeError, match=r"make demo in .* failed"):
        demo_ab.main([before, failing, "--repo", str(path), "--rounds", "1",
                      "--work", str(tmp_path / "w1"), "--json", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(ValueError, match=r"row\(s\) in S s' line"):
        demo_ab.rows_seconds("== started row 'j.a' seed 0\n")
    assert demo_ab.rows_seconds("x\n== 2 row(s) in 319 s\nmd: results.md\n") == 319
