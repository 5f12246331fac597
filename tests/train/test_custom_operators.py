"""A new operator from spec to report without writing Python: ``--operators FILE``
on the commands that build or read a model, a plan's ``[[operators]]``, a resume that needs
only ``--resume``, and an ablation plan run small with ``--set`` and ``--rows``.

Each test here fails on f00006c, where ``--ops j.aq`` was "unknown operator 'q'", a plan had no
way to declare one, ``--resume`` needed every option again and ``--rows`` took row labels only.
"""

from __future__ import annotations

import json

import pytest
from runs import cli_error, tiny_plan, write

import folnet
from folnet.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

OPERATOR = """
[[operator]]
symbol = "q"
name = "bprod"
typing = "B <- B x U"
kernel = "x y w"
premise = "x h w"
output = "x y h"
bdim = "x"
rdim = "w"
"""
TINY = ["--preset", "tiny", "--data", "kinship", "--kinship-documents", "30", "--vocab-size",
        "120", "--seq-len", "32", "--batch-size", "4", "--log-every", "1", "--no-progress"]


def _spec_file(tmp_path):
    return write(tmp_path / "my_ops.toml", OPERATOR)


def test_ops_and_info_show_a_declared_operator(tmp_path, capsys):
    spec = _spec_file(tmp_path)
    assert main(["ops", "--operators", str(spec)]) == 0
    assert "q    bprod  B <- B x U" in capsys.readouterr().out
    assert main(["info", "j.aq", "--preset", "tiny", "--operators", str(spec)]) == 0
    assert "operator q (bprod)" in capsys.readouterr().out
    folnet.unregister_operator("q")  # as in a new process
    err = cli_error(capsys, ["info", "j.aq", "--preset", "tiny"], command="info")
    assert "unknown operator 'q'" in err and "--operators FILE" in err


def test_pretrain_with_a_declared_operator_records_it_and_resumes_with_only_resume(tmp_path,
                                                                                   capsys):
    spec = _spec_file(tmp_path)
    run = tmp_path / "run"
    assert main(["pretrain", "--ops", "j.aq", "--operators", str(spec), *TINY, "--steps", "2",
                 "--save-every", "1", "--out", str(run)]) == 0
    recorded = json.loads((run / "run_config.json").read_text())
    assert [t["symbol"] for t in recorded["operators"]] == ["q"]
    meta = json.loads((run / "final" / "config.json").read_text())
    assert [t["symbol"] for t in meta["model"]["operators"]] == ["q"]
    folnet.unregister_operator("q")  # as in a new process: the run's record must suffice
    capsys.readouterr()
    assert main(["pretrain", "--resume", str(run), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "done: 3 steps" in out
    again = json.loads((run / "run_config.json").read_text())
    assert {k: v for k, v in again.items() if k not in ("steps", "resume")} == {
        k: v for k, v in recorded.items() if k not in ("steps", "resume")}
    assert again["steps"] == 3 and again["resume"] == "latest"
    folnet.unregister_operator("q")
    err = cli_error(capsys, ["pretrain", "--resume", str(run), "--steps", "4", "--lr", "0.5"])
    assert "--lr (checkpoint: 0.001, now: 0.5)" in err
    # and a finetune --from that run needs nothing more: the model directory carries q
    folnet.unregister_operator("q")
    assert main(["finetune", "--task", "kinship", "--from", str(run), "--max-steps", "2",
                 "--kinship-train-size", "16", "--kinship-test-per-k", "2", "--batch-size", "8",
                 "--no-progress", "--out", str(tmp_path / "ft")]) == 0
    assert (tmp_path / "ft" / "eval.json").is_file()


def test_a_bad_operator_file_is_one_line_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    missing = tmp_path / "none.toml"
    err = cli_error(capsys, ["pretrain", "--ops", "j.aq", "--operators", str(missing), *TINY,
                             "--out", str(run)])
    assert f"--operators {str(missing)!r} does not exist" in err
    builtin = write(tmp_path / "b.toml", OPERATOR.replace('"q"', '"j"'))
    err = cli_error(capsys, ["pretrain", "--operators", str(builtin), *TINY, "--out", str(run)])
    assert "declares ['j'], which are built-ins" in err
    assert not run.exists()


# the same operator as a plan's own table
PLAN = tiny_plan("custom", OPERATOR.replace("[[operator]]", "[[operators]]") + """
[[rows]]
ops = "j.a"

[[rows]]
ops = "j.aq"
""", steps=2)


def test_a_plan_declares_an_operator_and_runs_small_with_set_and_rows(tmp_path, capsys):
    plan = write(tmp_path / "custom.toml", PLAN)
    out = tmp_path / "out"
    assert main(["ablate", str(plan), "--set", "pretrain.steps=1", "--set", "seeds=1",
                 "--set", "finetune.max_steps=2", "--rows", "j.aq", "--out", str(out),
                 "--no-progress"]) == 0
    report = (out / "results.md").read_text()
    assert "j.aq" in report and "Operator `q` (bprod, B <- B x U) is declared" in report
    assert "--set pretrain.steps=1 --set seeds=1 --set finetune.max_steps=2" in report
    recorded = json.loads((out / "plan.json").read_text())
    assert recorded["pretrain"]["steps"] == 1 and recorded["seeds"] == 1
    assert [o["symbol"] for o in recorded["operators"]] == ["q"]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["ops"] for r in rows] == ["j.aq"]  # --rows took the operator string


@pytest.mark.parametrize(("argv", "needle"), [
    (["--rows", "j.x"], "--rows ['j.x'] names no row of the plan"),
    (["--set", "pretrain.stepz=1"], "unknown option(s) ['stepz']"),
    (["--set", "bogus=1"], "'bogus' is not a plan setting"),
    (["--set", "rows=1"], "'rows' is not a plan setting"),
    (["--set", "seeds"], "expected KEY=VALUE"),
])
def test_a_refused_ablation_start_leaves_nothing(tmp_path, capsys, argv, needle):
    plan = write(tmp_path / "custom.toml", PLAN)
    out = tmp_path / "out"
    err = cli_error(capsys, ["ablate", str(plan), *argv, "--out", str(out)], command="ablate")
    assert needle in err
    assert not out.exists()  # f00006c left plan.json and corpus/ for --rows j.x


def test_the_bundled_custom_operator_plan_loads_and_names_its_operator():
    from folnet.train.ablate.plan import load_plan

    plan = load_plan("custom-operator")
    assert [r.ops for r in plan.rows] == ["j.a", "j.aq", "j.ap"]
    assert [o["symbol"] for o in plan.operators] == ["q"]
    assert folnet.get_operator("q").name == "bprod"
