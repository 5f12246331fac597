"""The project's own design document: every "docs/design.md section N" that the code, the specs,
the tests and the README cite exists there, and nothing cites a design file outside the
repository."""

from __future__ import annotations

import re
from pathlib import Path

from paths import ROOT

DESIGN = ROOT / "docs" / "design.md"
CITE = re.compile(r"design\.md(?:\s+|\s*\n\s*#?\s*)section\s+(\d+)", re.IGNORECASE)


def _sources() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder, pattern in (("folnet", "*.py"), ("folnet/specs", "*.toml"), ("tests", "*.py"),
                            ("benchmarks", "*.py")):
        found = sorted((ROOT / folder).rglob(pattern))
        assert found, f"no {pattern} under {folder}/"  # a folder that moved fails here
        files += found
    return files


def _sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\. ", DESIGN.read_text(), re.MULTILINE)}


def test_every_cited_section_exists():
    sections = _sections()
    assert sections == set(range(1, len(sections) + 1)) and len(sections) >= 9
    cited = {}
    for path in _sources():
        for match in CITE.finditer(path.read_text(encoding="utf-8")):
            cited.setdefault(int(match.group(1)), []).append(path.relative_to(ROOT))
    assert len(cited) >= 5  # the references this test is for are really found
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert not missing, f"cited sections missing from docs/design.md: {missing}"


def test_no_reference_to_a_design_file_outside_the_repository():
    here = Path(__file__).resolve()
    stale = [str(p.relative_to(ROOT)) for p in _sources()
             if p != here and "DESIGN.md" in p.read_text(encoding="utf-8")]
    assert not stale, f"cite docs/design.md instead: {stale}"
