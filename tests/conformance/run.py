"""transformers' own model and configuration tests, run on folnet's HF classes beside BERT and
GPT-2: ``make conformance``.

The tests are those of transformers' source distribution at the installed version (fetched
with pip, cached under ``--out``): ``tests/test_modeling_common.py`` (``ModelTesterMixin``) and
``tests/test_configuration_common.py`` (``ConfigTester``), unchanged. That distribution does not
ship the modules they import from elsewhere in transformers' repository -- the generation
(``GenerationTesterMixin``) and export (``ExportTesterMixin``) mixins, and the shared config
kwargs -- so the tree gets empty mixins for the first two (their tests do not run here; folnet's
generation is tested in tests/hf/test_hf_generate.py) and ``config_common_kwargs`` of its own.
The testers (`tests/conformance/testers.py`) and test classes (`tests/conformance/test_models.py`)
are folnet's, in the shape of transformers' ``BertModelTester``.

The report (``--report``, JSON) counts each test class's passed, failed and skipped tests and
compares folnet with BERT by test name: a test BERT or GPT-2 passes must pass for each folnet
class that runs it, or be listed in `tests/conformance/refused.toml` with the reason (the docs'
list, docs/hf.md). A refused test that passes, or a failure not listed, makes the run fail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import transformers

from folnet import read_files

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
from harness import machine  # noqa: E402  (the figures' machine record)

TAKEN = ("tests/test_modeling_common.py", "tests/test_configuration_common.py")
OURS = ("testers.py", "test_models.py")
CONTROLS = ("BertModelTest", "Gpt2ModelTest")
FOLNET = ("FolnetModelTest", "FolnetCausalLMTest", "FolnetSeq2SeqTest")

STUBS = {
    "exporters/test_export.py": '"""Not in the source distribution: its tests do not run."""\n\n\n'
                                "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": '"""Not in the source distribution: its tests do not run."""\n\n\n'
                                "class GenerationTesterMixin:\n    pass\n",
    # the general PreTrainedConfig arguments, each set to a value other than its default
    "utils/test_configuration_utils.py": (
        '"""General config arguments, each off its default (folnet\'s list: the source '
        'distribution lacks transformers\' own)."""\n\n'
        "config_common_kwargs = {\n"
        '    "return_dict": False, "output_hidden_states": True, "output_attentions": True,\n'
        '    "dtype": "float16", "chunk_size_feed_forward": 5, "architectures": ["BertModel"],\n'
        '    "id2label": {0: "label"}, "label2id": {"label": "0"},\n'
        '    "problem_type": "regression",\n'
        "}\n"),
}


def sdist(out: Path, version: str) -> Path:
    """transformers' source distribution at ``version`` (pip's cache, then the registry)."""
    path = out / f"transformers-{version}.tar.gz"
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"transformers=={version}", "-d", str(out)],
                       check=True)
    return path


def make_tree(out: Path, version: str) -> Path:
    """The test package: transformers' two files, the stubs, and folnet's test classes."""
    tree = out / f"tree-{version}"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "tests").mkdir(parents=True)
    with tarfile.open(sdist(out, version)) as tar:
        for name in TAKEN:
            member = tar.getmember(f"transformers-{version}/{name}")
            (tree / name).write_bytes(tar.extractfile(member).read())
    for name, text in STUBS.items():
        (tree / "tests" / name).parent.mkdir(exist_ok=True)
        (tree / "tests" / name).write_text(text)
    (tree / "tests" / "models").mkdir()
    for name in OURS:
        shutil.copy(HERE / name, tree / "tests" / "models" / name)
    for folder in ("", "exporters", "generation", "utils", "models"):
        (tree / "tests" / folder / "__init__.py").touch()
    return tree


def outcomes(junit: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """{test class: {test name: (outcome, message)}} from pytest's JUnit XML."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or "").splitlines()[0][:300] if node.get(
                    "message") else ""
                break
        found.setdefault(cls, {})[case.get("name", "")] = (outcome, message)
    return found


def compare(found: dict, refused: dict[str, dict]) -> dict:
    """Counts per class, and folnet's failures and skips against what the controls pass."""
    counts = {cls: {k: sum(o == k for o, _ in tests.values())
                    for k in ("passed", "failed", "skipped")} | {"total": len(tests)}
              for cls, tests in sorted(found.items())}
    control_passes = {name for cls in CONTROLS for name, (o, _) in found.get(cls, {}).items()
                      if o == "passed"}
    failed, skipped = {}, {}
    for cls in FOLNET:
        for name, (outcome, message) in found.get(cls, {}).items():
            if name in control_passes and outcome == "failed":
                failed.setdefault(name, {})[cls] = message
            elif name in control_passes and outcome == "skipped":
                skipped.setdefault(name, {})[cls] = message
    listed = {(name, cls) for name, entry in refused.items()
              for cls in entry.get("classes", FOLNET)}
    failing = {(name, cls) for name, by_class in failed.items() for cls in by_class}
    unlisted = sorted(f"{cls}.{name}" for name, cls in failing - listed)
    stale = sorted(f"{cls}.{name}" for name, cls in listed - failing
                   if found.get(cls, {}).get(name, ("",))[0] == "passed")
    return {"counts": counts, "failed_where_controls_pass": failed,
            "skipped_where_controls_pass": skipped, "refused": refused,
            "unlisted_failures": unlisted, "refused_but_passing": stale}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/conformance"))
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("-n", "--jobs", default="2", help="pytest-xdist processes")
    parser.add_argument("-k", default=None, help="pytest -k expression (a subset)")
    args = parser.parse_args(argv)
    version = transformers.__version__
    args.out.mkdir(parents=True, exist_ok=True)
    tree = make_tree(args.out.resolve(), version)
    junit = tree / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", args.jobs,
               "--rootdir", str(tree),
               "-W", "ignore::pytest.PytestUnknownMarkWarning", "--junitxml", str(junit),
               "-o", "junit_family=xunit1",
               "tests/models/test_models.py"] + (["-k", args.k] if args.k else [])
    env = {**os.environ, "PYTHONPATH": str(tree), "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    subprocess.run(command, cwd=tree, env=env, check=False)
    seconds = round(time.monotonic() - start)
    refused = read_files.load(HERE / "refused.toml")
    found = outcomes(junit)
    missing = [cls for cls in (*CONTROLS, *FOLNET) if len(found.get(cls, {})) < 10]
    if missing:  # a collection error: nothing compared
        print(f"no tests ran for {missing}: see the pytest output above")
        return 1
    report = {"transformers": version, "seconds": seconds, "jobs": args.jobs,
              "machine": machine(), **compare(found, refused)}
    text = json.dumps(report, indent=1, sort_keys=True)
    if args.report:
        args.report.write_text(text + "\n")
    for cls, c in report["counts"].items():
        print(f"{cls:22s} passed {c['passed']:4d}  failed {c['failed']:4d}  "
              f"skipped {c['skipped']:4d}  of {c['total']}")
    for key in report["unlisted_failures"]:
        cls, name = key.split(".")
        print(f"FAILS for folnet, passes for the controls: {key}: "
              f"{report['failed_where_controls_pass'][name][cls]}")
    for name in report["refused_but_passing"]:
        print(f"listed as refused in refused.toml but does not fail: {name}")
    print(f"{seconds} s")
    return 1 if report["unlisted_failures"] or report["refused_but_passing"] else 0


if __name__ == "__main__":
    sys.exit(main())
