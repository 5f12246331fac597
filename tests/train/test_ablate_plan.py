"""Ablation plans are validated before anything trains; the shipped plans load."""

from __future__ import annotations

import pytest

import folnet
from folnet.cli import main as cli_main
from folnet.train.ablate.plan import load_plan, parse_plan_dict

BASE = {
    "name": "t",
    "data": "kinship",
    "tasks": ["kinship"],
    "pretrain": {"preset": "tiny", "steps": 2},
    "rows": [{"ops": "j.a"}, {"ops": "jmc.atp", "D2": 8, "name": "full"}],
}


def plan(**changes):
    data = {**BASE, **changes}
    return parse_plan_dict(data, source="test.toml")


def test_shipped_plans_load():
    table3 = load_plan("table3")
    assert len(table3.rows) == 13
    assert [r.ops for r in table3.rows][-3:] == ["jmc.atp", "jmc.atp", "jmc.atp"]
    assert table3.rows[0].position == "ape" and table3.rows[2].position == "rpe*"
    assert table3.rows[-1].loss == "MLM.SOP"
    demo = load_plan("demo")  # the paper's Table 3 order, then a row without positions
    assert [r.ops for r in demo.rows][:5] == ["j.a", "j.at", "j.atp", "jm.atp", "jmc.atp"]
    assert demo.rows[5].position == "none" and demo.seeds >= 3
    stories = load_plan("stories")  # pretraining on the English stories stays available
    assert stories.data == "kinship" and stories.tasks == ("kinship",)
    kinds = load_plan("kinds")  # the main job asked of the generative kinds
    assert [(r.ops, r.kind) for r in kinds.rows] == [
        ("j.a", "decoder"), ("jmc.atp", "decoder"), ("j.a", "encoder-decoder"),
        ("jmc.atp", "encoder-decoder")]
    assert [r.name for r in kinds.rows][:1] == ["j.a RPE CLM"]
    assert kinds.tasks == ("kinship/symbolic/generate",) and kinds.seeds >= 3


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"colour": 1}, r"unknown key\(s\) \['colour'\]"),
        ({"rows": [{"ops": "j.a", "width": 3}]},
         r"row 1: unknown key\(s\) \['width'\]"),
        ({"rows": [{"ops": "j.a"}, {"ops": "ja.t", "name": "bad"}]},
         r"row 2 \('bad'\): operator string 'ja.t': 'a' \(assoc"),
        ({"rows": [{"ops": "jz.a"}]}, r"row 1: operator string 'jz.a': unknown operator 'z'"),
        ({"rows": [{"name": "x"}]}, r"row 1 \('x'\): missing 'ops'"),
        ({"rows": [{"ops": "j.a", "position": "alibi"}]}, r"row 1: position 'alibi'"),
        ({"rows": [{"ops": "j.a", "loss": "MLM"}]}, r"row 1: loss 'MLM' is unknown"),
        ({"rows": [{"ops": "j.a"}, {"ops": "j.a"}]}, r"row 2 .*same name as row 1"),
        ({"rows": []}, r"has no \[\[rows\]\]"),
        ({"data": "/no/such/corpus"}, r"data path '/no/such/corpus' does not exist"),
        ({"tasks": ["glue/rte"]}, r"task 'glue/rte' needs its data directory"),
        ({"tasks": ["glue/nope"]}, r"task 'glue/nope'"),
        ({"pretrain": {"preset": "tiny", "steps": 0}}, r"--steps must be >= 1"),
        ({"pretrain": {"preset": "tiny", "ops": "j.a"}}, r"must not set 'ops'"),
        ({"finetune": {"seeds": 3}}, r"\[finetune\] must not set 'seeds'.*whole rows"),
        ({"pretrain": {"preset": "tiny", "lr_peak": 1}}, r"unknown option\(s\) \['lr_peak'\]"),
        ({"pretrain": {"preset": "tiny", "kind": "decoder"}}, r"must not set 'kind'"),
        ({"rows": [{"ops": "j.a", "loss": "CLM"}]},
         r"row 1 \('j.a RPE CLM'\): loss CLM pretrains a model of kind 'decoder', and task "
         r"'kinship' needs "
         r"loss MLM.NSP or MLM.SOP"),
        ({"rows": [{"ops": "j.a"}], "tasks": ["kinship/generate"]},
         r"task 'kinship/generate' needs loss CLM, PREFIX or SPAN"),
    ],
)
def test_bad_plans_fail_before_training(changes, match):
    with pytest.raises(folnet.FolnetError, match=match):
        plan(**changes)


def test_cli_fails_before_any_training(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[pretrain]\npreset = "tiny"\n[[rows]]\nops = "jmcatp"\n')
    assert cli_main(["ablate", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "row 1" in err and "has no dot" in err
    assert not (tmp_path / "out").exists()
    missing = ["ablate", "demo", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]
    assert cli_main(missing) == 2
    assert "does not exist" in capsys.readouterr().err


def test_overrides_apply():
    p = parse_plan_dict(BASE, source="x", overrides={"steps": 7, "preset": "small", "seeds": 3})
    assert dict(p.pretrain)["steps"] == 7 and dict(p.pretrain)["preset"] == "small"
    assert p.seeds == 3


def test_the_help_lists_every_bundled_plan(capsys):
    from folnet.read_files import specs_dir

    with pytest.raises(SystemExit):
        cli_main(["ablate", "--help"])
    said = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse's wrapping
    names = sorted(p.stem for p in (specs_dir() / "ablations").glob("*.toml"))
    assert {"custom-operator", "kinds", "pretraining"} <= set(names)
    assert f"a bundled plan ({', '.join(names)}:" in said
