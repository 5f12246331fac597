"""A pytest plugin for benchmarks/gpu_check.py: each test's result as one JSON line, written the
moment the test ends, so a run killed at its time limit still tells what passed and what ran.

    FOLNET_GPU_CHECK_ROWS=rows.jsonl python -m pytest -p gpu_pytest tests/ops/test_cuda.py

(with benchmarks/ on PYTHONPATH). Each line is an event of the check's report
(`gpu_report.Report.apply`): ``set running`` when a test starts, ``append tests`` with the
test's id, outcome, seconds, the first lines of its failure or its skip reason and the
properties it recorded (``record_property``) when it ends.
"""

from __future__ import annotations

import json
import os

import pytest

ROWS = "FOLNET_GPU_CHECK_ROWS"
#: Lines of a failure's message kept in the report.
MESSAGE_LINES = 8


def _emit(event: dict) -> None:
    path = os.environ.get(ROWS)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")


def _message(report: pytest.TestReport) -> str:
    """A skip's reason, or a failure's assertion lines (pytest's "E" lines), else its tail."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    lines = report.longreprtext.splitlines()
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    return "\n".join((errors or lines[-MESSAGE_LINES:])[:MESSAGE_LINES])


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _emit({"op": "set", "key": "running", "value": nodeid})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per test: its setup's outcome when that did not pass (a skip from a fixture),
    else its call's; a teardown that fails adds an error."""
    if report.when == "call" or (report.when == "setup" and not report.passed) or (
            report.when == "teardown" and report.failed):
        outcome = "error" if report.when != "call" and report.failed else report.outcome
        _emit({"op": "append", "key": "tests", "value": {
            "test": report.nodeid, "outcome": outcome, "seconds": round(report.duration, 3),
            "message": "" if report.passed else _message(report),
            "properties": dict(report.user_properties)}})
    if report.when == "teardown":
        _emit({"op": "set", "key": "running", "value": None})
