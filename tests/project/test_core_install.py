"""``pip install folnet`` without extras: what it must run, and what pyproject.toml declares.

The training packages are made unimportable in a subprocess by a ``sitecustomize.py`` that wraps
every finder of ``sys.meta_path``: a hidden package is not found at all (``find_spec`` returns
None), exactly as when it is not installed, so code probing for optional modules (torch probes
pandas, for one) behaves as it would on a core install. The declarations are checked against
the imports themselves: every third-party module folnet imports is declared in core or in one
extra, and every declared package is imported.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from folnet.commands import EXTRAS
from folnet.read_files import load as load_toml

HIDDEN = ("tokenizers", "datasets", "transformers", "accelerate", "tqdm", "matplotlib",
          "tensorboard", "xformers", "pyarrow", "pandas", "huggingface_hub")

SITECUSTOMIZE = f'''
import sys

HIDDEN = {set(HIDDEN)!r}


class Hide:
    """Wraps a finder; a hidden top-level package is not found, as if not installed."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return None if find is None else find(name, path, target)

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
'''

# Runs inside the blocked interpreter: the core API end to end, then two core commands.
API_SCRIPT = '''
import contextlib, importlib.util, io, json, sys, tempfile
hidden = {}
for name in sys.argv[1].split(","):
    try:
        __import__(name)
        hidden[name] = "imported"
    except ImportError:
        hidden[name] = "blocked" if importlib.util.find_spec(name) is None else "found"
import torch
import folnet
from folnet.arch import model_info
from folnet.cli import main

torch.manual_seed(0)
model = folnet.build_model("jmc.atp", preset="tiny", vocab_size=60, head="pretraining").eval()
directory = tempfile.mkdtemp()
model.save_pretrained(directory)
loaded = folnet.from_pretrained(directory).eval()
ids = torch.randint(5, 60, (2, 11))
mask = torch.ones_like(ids)
mask[1, 8:] = 0
with torch.no_grad():
    a, b = model(ids, attention_mask=mask), loaded(ids, attention_mask=mask)
same = sorted(a.keys()) == sorted(b.keys()) and all(torch.equal(a[k], b[k]) for k in a.keys())
info = model_info(loaded, 16)
outputs = {}
for argv in (["ops"], ["info", "jmc.atp", "--preset", "tiny"]):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(argv)
    outputs[argv[0]] = (code, buffer.getvalue())
print(json.dumps({"hidden": hidden, "same": same, "params": info.total_params,
                  "outputs": outputs,
                  "training": sorted(m for m in sys.modules if m.partition(".")[0] in
                                     sys.argv[1].split(","))}))
'''


@pytest.fixture(scope="module")
def core_env(tmp_path_factory) -> dict[str, str]:
    """An environment whose interpreter cannot import the training packages."""
    site = tmp_path_factory.mktemp("core-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, (str(site), str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _run(env: dict[str, str], *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_models_build_save_load_and_inspect_without_extras(core_env):
    done = _run(core_env, "-c", API_SCRIPT, ",".join(HIDDEN))
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["hidden"] == {name: "blocked" for name in HIDDEN}  # the blocker blocks
    assert result["same"] and result["params"] > 0
    assert result["training"] == []
    ops_code, ops_out = result["outputs"]["ops"]
    info_code, info_out = result["outputs"]["info"]
    assert ops_code == 0 and "trans" in ops_out
    assert info_code == 0 and "FLOPs per sequence" in info_out
    assert "Warning" not in done.stderr, done.stderr  # e.g. torch without numpy


@pytest.mark.slow
def test_help_and_a_training_command_without_its_extra(core_env, tmp_path):
    done = _run(core_env, "-m", "folnet", "--help")
    assert done.returncode == 0 and "pretrain" in done.stdout, done.stderr
    out = tmp_path / "run"
    done = _run(core_env, "-m", "folnet", "pretrain", "--out", str(out))
    assert done.returncode == 2
    assert done.stderr == ("folnet pretrain needs the [train] extra: pip install "
                           "'folnet[train]' (missing: tokenizers, tqdm, datasets)\n")
    assert done.stdout == "" and not out.exists()


@pytest.mark.slow
def test_tensorboard_asked_for_but_missing_is_one_line_and_training_goes_on(core_env,
                                                                            tmp_path):
    script = ("import sys\nfrom folnet.train.engine.runlog import TrainLogger, read_log\n"
              "for seed in (0, 1):\n"
              "    log = TrainLogger(sys.argv[1] + f'/seed_{seed}', fields=('step', 'loss'), "
              "tag='t', total_steps=1, tensorboard=True, progress=False)\n"
              "    log.log({'step': 1, 'loss': 0.5})\n    log.close()\n"
              "print(len(read_log(sys.argv[1] + '/seed_1/log.jsonl')))\n")
    done = _run(core_env, "-c", script, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "tensorboard" in lines[0] and "pip install tensorboard" in lines[0]


# -- what pyproject.toml declares ---------------------------------------------------------------

# imported but deliberately not declared: apex is not on PyPI (an optional fused LAMB)
UNDECLARED = {"apex"}
# declared but not imported by folnet: accelerate is what transformers' Trainer needs to train
# a folnet.hf model; peft adapts the operators' projections (folnet.arch.adapters reads its
# LoRA layers by their attributes, without importing it)
NOT_IMPORTED = {"accelerate", "peft"}


def _imported_modules() -> set[str]:
    """Top-level third-party modules folnet imports (statements and import_module("..."))."""
    found: set[str] = set()
    for path in (ROOT / "folnet").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None)
                  == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    tops = {name.partition(".")[0] for name in found}
    return tops - set(sys.stdlib_module_names) - {"folnet"}


def _names(requirements: list[str]) -> set[str]:
    return {req.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip().lower()
            for req in requirements}


def test_core_and_extras_declare_exactly_what_is_imported():
    project = load_toml(ROOT / "pyproject.toml")["project"]
    core = _names(project["dependencies"])
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    assert {k: set(v) for k, v in EXTRAS.items()} == {k: v for k, v in extras.items()
                                                      if k != "dev"}
    declared = core | set().union(*(v for k, v in extras.items() if k != "dev"))
    imported = {name.lower() for name in _imported_modules()}
    assert imported - declared == UNDECLARED
    assert declared - imported == NOT_IMPORTED
    assert {"torch", "safetensors", "opt_einsum", "numpy"} <= core
