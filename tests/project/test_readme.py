"""Every Python block of the README runs as written (in order, in one fresh interpreter, as a
reader pasting them into one session would)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from paths import ROOT

README = ROOT / "README.md"


@pytest.mark.slow
def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    script = "\n".join(f"# -- block {i}\n{b}" for i, b in enumerate(blocks))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
