"""An ablation's custom operators from ``--operators FILE``: the report names the file (not the
plan's ``[[operators]]``), and a rerun into the same ``--out`` without the flag registers them
from the run's plan.json -- a conflicting spec given again is refused, naming the field.

Before: the report said every operator "is declared by the plan ([[operators]])", and the
rerun failed with "unknown operator 'k'" although OUT/plan.json held the spec.
"""

from __future__ import annotations

import json

import pytest
from runs import cli_error, tiny_plan, write

import folnet
from folnet.cli import main
from folnet.errors import FolnetError
from folnet.train.ablate.operators import PLAN_SOURCE, Declared, file_source, plan_operators

pytestmark = pytest.mark.usefixtures("one_thread")

OPERATOR = """
[[operator]]
symbol = "k"
name = "kprod"
typing = "B <- B x U"
kernel = "x y w"
premise = "x h w"
output = "x y h"
bdim = "x"
rdim = "w"
"""
# the operator is not in the plan: only --operators declares it
PLAN = tiny_plan("flagged", """
[[rows]]
ops = "j.a"

[[rows]]
ops = "j.ak"
""", steps=1)
FAST = ["--set", "finetune.max_steps=1", "--no-progress"]


def test_the_report_names_the_file_and_a_rerun_needs_no_flag(tmp_path, capsys):
    plan = write(tmp_path / "flagged.toml", PLAN)
    spec = write(tmp_path / "my_ops.toml", OPERATOR)
    out = tmp_path / "out"
    assert main(["ablate", str(plan), "--operators", str(spec), "--rows", "j.a",
                 "--out", str(out), *FAST]) == 0
    report = (out / "results.md").read_text()
    assert f"Operator `k` (kprod, B <- B x U) is declared by the --operators file `{spec}`" \
        in report
    assert "by the plan ([[operators]])" not in report
    recorded = json.loads((out / "plan.json").read_text())
    assert [o["symbol"] for o in recorded["operators"]] == ["k"]
    assert recorded["operator_sources"] == {"k": file_source(spec)}

    folnet.unregister_operator("k")  # as in a new process: the run's record must suffice
    capsys.readouterr()
    assert main(["ablate", str(plan), "--rows", "j.ak", "--out", str(out), *FAST]) == 0
    assert "unknown operator" not in capsys.readouterr().err
    assert folnet.get_operator("k").name == "kprod"
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert sorted(r["ops"] for r in rows) == ["j.a", "j.ak"]  # the k row trained this time
    # the rerun's report still names where k came from, and plan.json is unchanged
    assert f"is declared by the --operators file `{spec}`" in (out / "results.md").read_text()
    assert json.loads((out / "plan.json").read_text()) == recorded

    # the same flag again is fine; a different spec of k for this OUT is refused, before
    # anything runs, naming the field, both specs and the record
    folnet.unregister_operator("k")
    assert main(["ablate", str(plan), "--operators", str(spec), "--out", str(out),
                 *FAST]) == 0
    folnet.unregister_operator("k")
    other = write(tmp_path / "other_ops.toml", OPERATOR.replace('rdim = "w"', 'rdim = "w"\n'
                                                                'activation = "softmax"'))
    before = sorted(p.name for p in out.iterdir())
    err = cli_error(capsys, ["ablate", str(plan), "--operators", str(other), "--out", str(out),
                             *FAST], command="ablate")
    assert f"the --operators file `{other}` declares operator 'k' otherwise than the run" in err
    assert "activation 'softmax' vs 'identity'" in err and str(out / "plan.json") in err
    assert sorted(p.name for p in out.iterdir()) == before


def test_one_symbol_declared_twice_differently_names_both_sources():
    table = dict(symbol="k", name="kprod", typing="B <- B x U", kernel="x y w",
                 premise="x h w", output="x y h", bdim="x", rdim="w")
    flag = Declared({**table, "activation": "softmax"}, file_source("ops.toml"))
    with pytest.raises(FolnetError) as caught:
        plan_operators([table], {}, [flag], "p")
    message = str(caught.value)
    assert "operator 'k' is declared by the plan ([[operators]]) and, differently, by the " \
           "--operators file `ops.toml`" in message
    assert "activation 'identity' vs 'softmax'" in message
    # the same spec from both: declared once, by the plan
    specs, sources = plan_operators([table], {}, [Declared(table, file_source("ops.toml"))], "p")
    assert [s["symbol"] for s in specs] == ["k"] and sources == (PLAN_SOURCE,)
