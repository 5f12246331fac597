"""The artefact users install, made and installed the way a user gets it, for the tests.

`build_dist` builds the sdist of a source tree (a copy of its build inputs) through setuptools' own
PEP 517 hooks (no network, no build front end), unpacks it and builds the wheel from the unpacked
sdist -- so the wheel tested is the one the sdist makes, and nothing the checkout holds beside its
tracked files (a stale ``build/``, an editable install's finder) can reach it. `fresh_env` makes a
new virtual environment, installs the wheel there (not editable, no index, no dependencies) and lets
it see the dependencies `make setup` installed through a ``.pth`` line: a plain path line, so the
``.pth`` files of that environment (its editable folnet among them) are not run.

Also a script: ``python tests/installed.py SOURCE OUT`` builds SOURCE's dist into OUT and prints
the wheel's path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

#: Environment variables a user's shell would not have and that would point a process at the
#: checkout (PYTHONPATH) or at other specs (FOLNET_SPECS).
CLEARED = ("PYTHONPATH", "FOLNET_SPECS", "PYTHONSTARTUP", "PYTHONHOME")

_HOOK = "import sys; from setuptools import build_meta as b; print(b.build_{}(sys.argv[1]))"


def _hook(kind: str, source: Path, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-c", _HOOK.format(kind), str(out)], cwd=source,
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"build_{kind} in {source} failed:\n{done.stderr[-3000:]}")
    return out / done.stdout.strip().splitlines()[-1]


#: What the build reads from a source tree (setuptools writes its egg-info beside them, so the
#: build runs on a copy: two builds of one checkout at once would race on it).
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "folnet")


def build_dist(source: Path, out: Path) -> tuple[Path, Path]:
    """(sdist, wheel) of the tree at ``source``, the wheel built from the unpacked sdist."""
    out.mkdir(parents=True, exist_ok=True)
    tree = out / "source"
    for name in BUILD_INPUTS:
        if (source / name).is_dir():
            shutil.copytree(source / name, tree / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            tree.mkdir(exist_ok=True)
            shutil.copy2(source / name, tree / name)
    sdist = _hook("sdist", tree, out)
    with tarfile.open(sdist) as archive:
        archive.extractall(out / "sdist", filter="data")
    unpacked = next((out / "sdist").iterdir())
    return sdist, _hook("wheel", unpacked, out)


def wheel_files(wheel: Path) -> set[str]:
    """The files of the package a wheel installs (its .dist-info left out)."""
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if not n.split("/")[0].endswith(".dist-info")}


def fresh_env(root: Path, wheel: Path, deps_python: str = sys.executable) -> Path:
    """A new environment at ``root`` with ``wheel`` installed; its python's path.

    ``deps_python`` is the interpreter whose environment lends the dependencies."""
    subprocess.run([deps_python, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                   "get_paths()['purelib'])"], capture_output=True, text=True,
                                  check=True).stdout.strip())
    lender = subprocess.run([deps_python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                             "['purelib'])"], capture_output=True, text=True,
                            check=True).stdout.strip()
    (purelib / "_folnet_test_deps.pth").write_text(lender + "\n")
    done = subprocess.run([deps_python, "-m", "pip", "--python", str(python), "install", "-q",
                           "--no-deps", "--no-index", "--no-compile", str(wheel)],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"installing {wheel.name} failed:\n{done.stderr[-3000:]}")
    return python


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no path into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(PYTHONNOUSERSITE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra)
    return env


if __name__ == "__main__":
    _, wheel_path = build_dist(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
    print(wheel_path)
