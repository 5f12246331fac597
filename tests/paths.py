"""Where the tests find the repository's files, whatever folder of tests/ a test lives in."""

from __future__ import annotations

from pathlib import Path

#: The repository root (this file is tests/paths.py).
ROOT = Path(__file__).resolve().parent.parent
#: Stored files the tests compare with (tests/fixtures).
FIXTURES = ROOT / "tests" / "fixtures"
#: The released-format fixture: made by the released FOLNet code, with the outputs it computed.
OFFICIAL = FIXTURES / "official" / "tiny-jmc.atp"
#: Checkpoints saved by the code before the layer/stack redesign (made by make_fixtures.py there).
LEGACY = FIXTURES / "legacy"
#: The benchmark scripts some tests run (benchmarks/).
BENCHMARKS = ROOT / "benchmarks"
