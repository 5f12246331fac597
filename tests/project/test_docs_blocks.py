"""Every example of the documentation site runs as written.

Each page of docs/ is read as a reader follows it: its fenced blocks in order, in a fresh
empty folder of its own, the Python blocks of one page in one namespace (as pasted into one
session). What a block is, by its fence and the HTML comment on the line above it:

* ```` ```python ````: executed, always. A block that only includes a script of examples/
  (``--8<-- "examples/NAME.py"``) is run by tests/project/test_examples.py instead.
* ```` ```bash ```` (or sh, shell, console): must say which it is. ``<!-- run -->`` executes it
  in the page's folder: a block of ``folnet`` commands through `folnet.cli.main` in the
  runner's process (what the console script calls, without a torch import per command),
  anything else with ``bash -e`` (``folnet`` on its PATH is this interpreter's ``-m folnet``);
  ``<!-- not run: REASON -->`` leaves it out, and the reason may not be empty.
* ```` ```toml title="NAME" ````: written to NAME in the page's folder (later blocks use it).
* ``<!-- files: PATH ... -->`` above a block copies those files of the checkout into the
  page's folder first.

All pages run in one child process (torch is imported once), which reports each page's
outcome; a test per page reads it. ``python tests/project/test_docs_blocks.py PAGE.md ...``
runs pages by hand.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
DOCS = ROOT / "docs"
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w+-]*)(?P<rest>.*)$")
COMMENT = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")
INCLUDE = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')


@dataclass(frozen=True)
class Block:
    page: str        # relative to docs/
    line: int        # 1-based line of the opening fence
    lang: str
    title: str | None
    directive: str   # the HTML comment just above, '' if none
    code: str

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    def include(self) -> str | None:
        """The examples/ script a Python block only includes, else None."""
        lines = [line for line in self.code.splitlines() if line.strip()]
        match = INCLUDE.match(lines[0]) if len(lines) == 1 else None
        return match.group("path") if match else None


def pages() -> list[Path]:
    """The site's pages: every markdown file under docs/ but the figures' copied reports."""
    return sorted(p for p in DOCS.rglob("*.md")
                  if "figures" not in p.relative_to(DOCS).parts
                  and "hooks" not in p.relative_to(DOCS).parts)


def blocks(path: Path, docs: Path = DOCS) -> list[Block]:
    """The fenced blocks of a page under ``docs``, in order, each with the comment above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match.group("indent")), match.group("fence")
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:])
            i += 1
        i += 1  # the closing fence
        above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        comment = COMMENT.match(above)
        title = re.search(r'title="([^"]+)"', match.group("rest"))
        found.append(Block(path.relative_to(docs).as_posix(), start + 1,
                           match.group("lang").lower(), title.group(1) if title else None,
                           comment.group("body") if comment else "", "\n".join(body) + "\n"))
    return found


def shell_decision(block: Block) -> tuple[bool, str]:
    """(run it?, why not) for a shell block; a missing or empty decision is an error."""
    if block.directive == "run":
        return True, ""
    if block.directive.startswith("not run:") and block.directive[8:].strip():
        return False, block.directive[8:].strip()
    raise AssertionError(f"{block.where}: a shell block needs <!-- run --> or "
                         f"<!-- not run: REASON --> on the line above it")


# -- the child process: run pages -----------------------------------------------------------------


def _folnet_on_path(bin_dir: Path) -> None:
    """A ``folnet`` command that is this interpreter's ``-m folnet``."""
    script = bin_dir / "folnet"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m folnet "$@"\n')
    script.chmod(0o755)


def commands(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blanks gone."""
    joined = code.replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def run_shell(block: Block) -> str | None:
    """Run a shell block in the current folder; what went wrong, or None. A block of
    ``folnet`` commands only runs them through `folnet.cli.main` in this process -- the
    function the ``folnet`` console script calls -- which spares a torch import per command;
    anything else runs under ``bash -e``."""
    import shlex

    from folnet.cli import main as folnet_main

    lines = commands(block.code)
    if lines and all(line.startswith("folnet ") for line in lines):
        for line in lines:
            output = io.StringIO()
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                try:
                    status = folnet_main(shlex.split(line)[1:])
                except SystemExit as exc:
                    status = exc.code
            if status:
                return f"{line!r} exited {status}:\n{output.getvalue()[-4000:]}"
        return None
    done = subprocess.run(["bash", "-e", "-c", block.code], text=True, capture_output=True,
                          timeout=300)
    if done.returncode:
        return f"exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return None


def run_page(path: Path, work: Path) -> dict:
    """Run one page's blocks in ``work``; what ran, what was left out and why, and the
    first failure (with its traceback and the block's output so far)."""
    import torch

    import folnet

    work.mkdir(parents=True)
    namespace: dict = {"__name__": "__main__"}
    before = {spec.symbol for spec in folnet.operators()}
    torch.manual_seed(0)
    report = {"python": 0, "shell": 0, "not_run": [], "included": [], "error": None,
              "seconds": 0.0}
    started = time.perf_counter()
    here = os.getcwd()
    os.chdir(work)
    try:
        for block in blocks(path):
            if block.directive.startswith("files:"):
                for name in block.directive[6:].split():
                    shutil.copy(ROOT / name, work / Path(name).name)
            if block.lang == "toml" and block.title:
                (work / block.title).write_text(block.code)
            elif block.lang == "python" and block.include():
                report["included"].append(block.include())
            elif block.lang == "python":
                output = io.StringIO()
                try:
                    with contextlib.redirect_stdout(output):
                        exec(compile(block.code, block.where, "exec"), namespace)
                except BaseException:
                    report["error"] = (f"{block.where} failed:\n{traceback.format_exc()}"
                                       f"\n-- its output --\n{output.getvalue()[-2000:]}")
                    break
                report["python"] += 1
            elif block.lang in SHELL:
                run, why = shell_decision(block)
                if not run:
                    report["not_run"].append(f"{block.where}: {why}")
                    continue
                failure = run_shell(block)
                if failure:
                    report["error"] = f"{block.where}: {failure}"
                    break
                report["shell"] += 1
    except AssertionError as exc:
        report["error"] = str(exc)
    finally:
        os.chdir(here)
        for spec in folnet.operators():
            if spec.symbol not in before:
                folnet.unregister_operator(spec.symbol)
    report["seconds"] = round(time.perf_counter() - started, 2)
    return report


def main(argv: list[str]) -> None:
    """Run the pages named (all when none) and print one JSON object: page -> report."""
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="folnet-docs-"))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    _folnet_on_path(bin_dir)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    os.environ["TMPDIR"] = str(root)  # what the examples' mkdtemp() makes is cleaned up below
    tempfile.tempdir = None
    chosen = [Path(a).resolve() for a in argv] or pages()
    results = {}
    try:
        for i, path in enumerate(chosen):
            results[path.relative_to(DOCS).as_posix()] = run_page(path, root / f"page{i}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results))


# -- the tests ------------------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    pytestmark = pytest.mark.long(seconds=40)

    @pytest.fixture(scope="module")
    def outcomes() -> dict:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(HERE)], cwd=ROOT, env=env, text=True,
                              capture_output=True, timeout=900)
        assert done.returncode == 0, done.stderr[-6000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    @pytest.mark.parametrize("page", [p.relative_to(DOCS).as_posix() for p in pages()])
    def test_every_block_of_the_page_runs(outcomes, page):
        outcome = outcomes[page]
        assert outcome["error"] is None, outcome["error"]

    def test_the_pages_hold_examples_that_ran(outcomes):
        """The runner really ran something: a parser that found no blocks would pass every
        page above."""
        ran = sum(o["python"] for o in outcomes.values())
        shells = sum(o["shell"] for o in outcomes.values())
        assert ran >= 30 and shells >= 5, (ran, shells)
        assert outcomes["getting-started/quickstart.md"]["python"] >= 2

    def test_the_included_scripts_are_the_examples(outcomes):
        """A block that only includes a script is left to test_examples.py: it must be one of
        examples/, and every script there is shown on some page."""
        included = {path for o in outcomes.values() for path in o["included"]}
        scripts = {p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.py")}
        assert included == scripts and scripts

    def test_a_shell_block_says_whether_it_runs():
        """Checked on every page without running anything: a block with no decision, or
        'not run' without a reason, is refused (the runner stops there too)."""
        undecided = []
        for path in pages():
            for block in blocks(path):
                if block.lang in SHELL:
                    try:
                        shell_decision(block)
                    except AssertionError as exc:
                        undecided.append(str(exc))
        assert not undecided, "\n".join(undecided)

    def test_the_block_reader_on_a_page_of_each_kind(tmp_path):
        """The reader itself, on a page made for it: each kind of block and directive is told
        apart, and a shell block without a decision is an error."""
        page = tmp_path / "page.md"
        page.write_text('Text\n\n```python\nx = 1\n```\n\n<!-- not run: needs a GPU -->\n'
                        '```bash\nfolnet pretrain --device cuda\n```\n\n<!-- run -->\n'
                        '```bash\nfolnet ops\n```\n\n```toml title="a.toml"\nk = 1\n```\n\n'
                        '```python\n--8<-- "examples/x.py"\n```\n\n```bash\nls\n```\n')
        read = blocks(page, tmp_path)
        found = [(b.lang, b.title, b.directive, b.include()) for b in read]
        assert found == [("python", None, "", None), ("bash", None, "not run: needs a GPU", None),
                         ("bash", None, "run", None), ("toml", "a.toml", "", None),
                         ("python", None, "", "examples/x.py"), ("bash", None, "", None)]
        assert [shell_decision(b) for b in read[1:3]] == [(False, "needs a GPU"), (True, "")]
        assert read[0].where == "docs/page.md:3"
        assert read[1].code == "folnet pretrain --device cuda\n"
        with pytest.raises(AssertionError, match="needs <!-- run -->"):
            shell_decision(read[-1])


if __name__ == "__main__":
    main(sys.argv[1:])
