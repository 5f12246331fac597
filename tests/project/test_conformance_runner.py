"""`make conformance`'s runner (tests/conformance/run.py) decides right, and its list of
refused tests is the one the docs show: a failure the controls pass and nobody listed fails
the run, a listed test that passes again is reported stale, a skip is neither."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from folnet import read_files

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers", reason="the [hf] extra is not installed")


def _runner():
    spec = importlib.util.spec_from_file_location("conformance_run",
                                                  ROOT / "tests" / "conformance" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_flags_unlisted_failures_and_stale_refusals():
    run = _runner()
    passed, failed, skipped = ("passed", ""), ("failed", "AssertionError"), ("skipped", "why")
    found = {"BertModelTest": {"test_a": passed, "test_b": passed, "test_c": passed,
                               "test_d": passed},
             "Gpt2ModelTest": {"test_a": passed},
             "FolnetModelTest": {"test_a": failed, "test_b": failed, "test_c": passed,
                                 "test_d": skipped},
             "FolnetCausalLMTest": {"test_a": passed, "test_b": failed}}
    refused = {"test_a": {"status": "refused", "reason": "r", "classes": ["FolnetModelTest"]},
               "test_c": {"status": "refused", "reason": "r"}}
    report = run.compare(found, refused)
    assert report["unlisted_failures"] == ["FolnetCausalLMTest.test_b",
                                           "FolnetModelTest.test_b"]
    assert report["refused_but_passing"] == ["FolnetModelTest.test_c"]  # not the absent ones
    assert report["skipped_where_controls_pass"] == {"test_d": {"FolnetModelTest": "why"}}
    assert report["counts"]["FolnetModelTest"] == {"passed": 1, "failed": 2, "skipped": 1,
                                                    "total": 4}


def test_every_refusal_has_a_reason_a_status_and_is_in_the_docs():
    run = _runner()
    refused = read_files.load(ROOT / "tests" / "conformance" / "refused.toml")
    page = (ROOT / "docs" / "how-to" / "transformers.md").read_text()
    assert "<!-- folnet:figure-conformance-refused -->" in page  # the list, made at build
    spec = importlib.util.spec_from_file_location("docs_generated",
                                                  ROOT / "docs" / "hooks" / "generated.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    docs = hooks.GENERATORS["figure-conformance-refused"]()
    assert refused
    for name, entry in refused.items():
        assert entry["status"] in ("refused", "open"), name
        assert len(entry["reason"]) > 40, name
        assert set(entry.get("classes", run.FOLNET)) <= set(run.FOLNET), name
        assert f"`{name}`" in docs and entry["status"] in docs, name
