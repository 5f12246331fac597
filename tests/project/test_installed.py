"""What users get: the wheel, built from the sdist, installed (not editable) into a fresh
environment and used from a folder outside the checkout (tests/installed.py makes both).

The checks a user makes, in the order they make them: the package imports with every module
and spec of the tree, its metadata states what it needs and the environment meets it, every
Python block of the README runs, and the commands of the README's Quick start and Install
sections run: ``folnet --version``, ``env``, ``ops``, ``info``, ``python -m folnet``,
``convert`` of the released fixture, a pretraining of two steps, a finetune from it, a tiny
``ablate`` plan and the ``folnet.hf`` Auto classes on what they wrote. Every process runs in a
temporary folder with no path into the checkout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from installed import build_dist, fresh_env, user_env, wheel_files
from paths import OFFICIAL, ROOT

import folnet

pytestmark = pytest.mark.slow(seconds=60)

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> tuple[Path, Path]:
    return build_dist(ROOT, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def env(dist, tmp_path_factory) -> Path:
    """The fresh environment's python."""
    return fresh_env(tmp_path_factory.mktemp("env") / "venv", dist[1])


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A working folder outside the checkout."""
    folder = tmp_path_factory.mktemp("user")
    assert ROOT not in folder.parents
    return folder


def _run(python: Path, args: list[str], cwd: Path, timeout: float = 300) -> str:
    """``python ARGS`` in ``cwd`` as a user would run it; its stdout (it must succeed)."""
    done = subprocess.run([str(python), *args], cwd=cwd, env=user_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=timeout, check=False)
    shown = " ".join(args)[:80]
    assert done.returncode == 0, f"{shown} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    return done.stdout


def _folnet(env: Path, *args: str, cwd: Path) -> str:
    return _run(env.parent / "folnet", list(args), cwd)  # the console script pip made


def test_the_wheel_holds_every_module_and_spec_of_the_tree(dist):
    sdist, wheel = dist
    tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "folnet").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert any(name.startswith("folnet/specs/models/") for name in tree)
    assert wheel_files(wheel) == tree
    assert wheel.name == f"folnet-{folnet.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:  # the licence travels with the package
        licence = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert len(licence) == 1
        assert archive.read(licence[0]) == (ROOT / "LICENSE").read_bytes()
    assert sdist.name == f"folnet-{folnet.__version__}.tar.gz"


def test_metadata_states_what_it_needs_and_the_environment_meets_it(env, outside):
    script = """
import importlib.metadata as md, json
from packaging.requirements import Requirement
meta = md.metadata("folnet")
unmet = []
for text in md.requires("folnet"):
    req = Requirement(text)
    for extra in ("", "train", "hf"):
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append((text, have))
            break
print(json.dumps({"version": meta["Version"], "requires": md.requires("folnet"),
                  "classifiers": meta.get_all("Classifier"), "unmet": unmet,
                  "description": meta.get_payload()[:200],
                  "type": meta["Description-Content-Type"]}))
"""
    meta = json.loads(_run(env, ["-c", script], outside))
    assert meta["version"] == folnet.__version__
    torch_req = next(r for r in meta["requires"] if r.startswith("torch"))
    assert re.fullmatch(r"torch<?>=2\.\d+(,<?>=?\d.*)?", torch_req.replace(" ", ""))
    assert meta["unmet"] == []  # the environment the tests run in meets the declared ranges
    assert "Programming Language :: Python :: 3" in meta["classifiers"]
    assert meta["type"] == "text/markdown"
    assert meta["description"].startswith("# folnet")


def test_every_module_imports_from_the_installed_package(env, outside):
    script = """
import importlib, importlib.util, json, pkgutil, sys, folnet
names = [m.name for m in pkgutil.walk_packages(folnet.__path__, "folnet.")]
# the Triton kernels' module needs Triton (the gpu extra; folnet imports it only when present)
needs = {"folnet.ops.primitives.triton_residual_norm": "triton"}
for name in names:
    if name.endswith(".__main__"):  # those run a command
        continue
    if name in needs and importlib.util.find_spec(needs[name]) is None:
        continue
    importlib.import_module(name)
import folnet.read_files as rf
offered = [name for name in dir(folnet) if getattr(folnet, name, None) is None]
print(json.dumps({"file": folnet.__file__, "modules": names, "specs": str(rf.specs_dir()),
                  "unusable": offered}))
"""
    result = json.loads(_run(env, ["-c", script], outside))
    installed = Path(result["file"]).parent
    assert ROOT not in installed.parents and env.parent.parent in installed.parents
    assert Path(result["specs"]) == installed / "specs"
    assert result["unusable"] == []  # every name dir(folnet) offers can be had
    tree = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for p in (ROOT / "folnet").rglob("*.py")} - {"folnet"}
    assert set(result["modules"]) == tree


def test_the_readme_python_blocks_run_as_written(env, outside):
    """In order, in one interpreter, as a reader pasting them into one session would."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    script = "\n".join(f"# -- block {i}\n{b}" for i, b in enumerate(blocks))
    _run(env, ["-c", script], outside, timeout=600)


def _quick_start_commands() -> list[list[str]]:
    """The README Quick start's folnet commands, as argument lists (continuations joined)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quick start"):]
    section = section[:section.index("\n## ", 3)]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["folnet", "pretrain"], ["folnet", "finetune"]]
    return [c[1:] for c in commands]


def test_the_commands_a_user_runs(env, outside):
    version = _folnet(env, "--version", cwd=outside)
    assert version.startswith(f"folnet {folnet.__version__}")
    report = _folnet(env, "env", cwd=outside)
    assert "torch" in report and "folnet" in report
    assert "trans" in _folnet(env, "ops", cwd=outside)
    assert "FLOPs per sequence" in _folnet(env, "info", "jmc.atp", "--preset", "tiny",
                                           cwd=outside)
    assert "pretrain" in _run(env, ["-m", "folnet", "--help"], outside)
    converted = outside / "converted"
    _folnet(env, "convert", str(OFFICIAL), str(converted), cwd=outside)
    assert (converted / "model.safetensors").is_file()

    # the Quick start's pretrain and finetune, at two steps and a few questions
    pretrain, finetune = _quick_start_commands()
    _folnet(env, *pretrain, "--steps", "2", "--kinship-documents", "40", "--batch-size", "4",
            "--vocab-size", "200", "--save-every", "2", "--no-progress", cwd=outside)
    run = outside / pretrain[pretrain.index("--out") + 1]
    assert (run / "final" / "model.safetensors").is_file()
    _folnet(env, *finetune, "--max-steps", "2", "--kinship-train-size", "16",
            "--kinship-test-per-k", "2", "--no-progress", cwd=outside)
    evaluated = outside / finetune[finetune.index("--out") + 1] / "eval.json"
    assert evaluated.is_file()

    # (folnet ablate of a bundled plan, run small: test_a_new_operator_from_spec_to_...)

    # the Auto classes read what the commands wrote
    script = """
import sys, torch, folnet.hf
from transformers import AutoModelForMaskedLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
mlm = AutoModelForMaskedLM.from_pretrained(sys.argv[1]).eval()
batch = tok(["alice is the mother of bob"], return_tensors="pt")
print(tuple(mlm(**batch).logits.shape), type(mlm).__name__)
"""
    printed = _run(env, ["-c", script, str(run / "final")], outside)
    assert printed.strip().endswith("FolnetForMaskedLM")


def test_the_console_script_is_the_installed_one(env):
    script = (env.parent / "folnet").read_text()
    assert script.startswith(f"#!{env}")
    assert sys.executable != str(env)


def test_a_new_operator_from_spec_to_ablation_report(env, tmp_path):
    """The custom-operator walk, from an empty folder outside the checkout on the installed
    wheel: an operator declared in a TOML file, `ops` and `info` showing it, a 2-step
    pretraining with it, a finetune from that run, a resume with only --resume, and the bundled
    custom-operator plan's report, run small with --set."""
    (tmp_path / "my_ops.toml").write_text(
        '[[operator]]\nsymbol = "q"\nname = "bprod"\ntyping = "B <- B x U"\n'
        'kernel = "x y w"\npremise = "x h w"\noutput = "x y h"\nbdim = "x"\nrdim = "w"\n')
    assert "q    bprod  B <- B x U" in _folnet(env, "ops", "--operators", "my_ops.toml",
                                                  cwd=tmp_path)
    assert "operator q (bprod)" in _folnet(env, "info", "j.aq", "--preset", "tiny",
                                           "--operators", "my_ops.toml", cwd=tmp_path)
    tiny = ["--preset", "tiny", "--data", "kinship", "--kinship-documents", "30",
            "--vocab-size", "120", "--seq-len", "32", "--batch-size", "4", "--no-progress"]
    _folnet(env, "pretrain", "--ops", "j.aq", "--operators", "my_ops.toml", *tiny, "--steps",
            "2", "--save-every", "1", "--out", "run", cwd=tmp_path)
    resumed = _folnet(env, "pretrain", "--resume", "run", "--steps", "3", cwd=tmp_path)
    assert "resumed from" in resumed and "done: 3 steps" in resumed
    _folnet(env, "finetune", "--task", "kinship", "--from", "run", "--max-steps", "2",
            "--kinship-train-size", "16", "--kinship-test-per-k", "2", "--no-progress",
            "--out", "ft", cwd=tmp_path)
    assert (tmp_path / "ft" / "eval.json").is_file()
    _folnet(env, "ablate", "custom-operator", "--set", "seeds=1", "--set", "pretrain.steps=1",
            "--set", "pretrain.kinship_documents=40", "--set", "finetune.max_steps=2",
            "--set", "finetune.kinship_train_size=16", "--set", "finetune.kinship_test_per_k=2",
            "--rows", "j.aq", "--out", "ablation", "--no-progress", cwd=tmp_path)
    report = (tmp_path / "ablation" / "results.md").read_text()
    assert "| j.aq RPE |" in report and "Operator `q` (bprod, B <- B x U)" in report
