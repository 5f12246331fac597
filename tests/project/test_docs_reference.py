"""The documentation site covers what folnet offers: every public name of ``folnet`` and
``folnet.hf`` has an entry in the API reference, every command and option of ``folnet`` one in
the command-line reference, every page is in the navigation, and the citation is the same
wherever it is given. The strict build (`make docs`, the first step of `make test`) checks the
links and renders the entries; these tests check that nothing is left out of them."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import sys

import pytest
import yaml
from paths import ROOT

import folnet
import folnet.hf

DOCS = ROOT / "docs"
API = DOCS / "reference" / "api"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


@functools.cache
def _hook():
    """docs/hooks/generated.py, the build's generator of the reference pages."""
    spec = importlib.util.spec_from_file_location("folnet_docs_hook",
                                                  DOCS / "hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def documented() -> set[str]:
    """Every object an API page renders (its ``::: NAME`` directives)."""
    return {name for page in API.glob("*.md") for name in DIRECTIVE.findall(page.read_text())}


def public_names() -> set[str]:
    return ({f"folnet.{name}" for name in folnet.__all__}
            | {f"folnet.hf.{name}" for name in folnet.hf.__all__})


def test_every_public_name_has_an_api_entry():
    public, entries = public_names(), documented()
    missing = sorted(public - entries)
    assert not missing, f"public names without an entry in docs/reference/api/: {missing}"
    assert len(public) == len(folnet.__all__) + len(folnet.hf.__all__) >= 25


def test_every_api_entry_is_a_name_that_exists():
    """An entry for a name that went away is caught here too, not only by the build."""
    import importlib

    for name in sorted(documented()):
        module, _, attribute = name.rpartition(".")
        while module:
            try:
                owner = importlib.import_module(module)
                break
            except ModuleNotFoundError:  # a class member: folnet.X.method
                module, _, outer = module.rpartition(".")
                attribute = f"{outer}.{attribute}"
        for part in attribute.split("."):
            owner = getattr(owner, part)


def test_the_coverage_check_sees_a_dropped_name(monkeypatch):
    """The check above is not vacuous: a page without build_model's entry fails it."""
    text = (API / "models.md").read_text()
    assert "::: folnet.build_model\n" in text
    pages = {p: p.read_text() for p in API.glob("*.md")}
    pages[API / "models.md"] = text.replace("::: folnet.build_model\n", "")
    names = {n for t in pages.values() for n in DIRECTIVE.findall(t)}
    assert "folnet.build_model" in public_names() - names


def test_every_command_and_option_is_in_the_cli_reference():
    rendered = _hook().render((DOCS / "reference" / "cli.md").read_text(), "reference/cli.md")
    commands = _hook().commands()
    assert set(commands) >= {"pretrain", "finetune", "evaluate", "ablate", "ops", "info",
                             "convert", "env"}
    for name, parser in commands.items():
        section = rendered.split(f"\n## folnet {name}\n", 1)
        assert len(section) == 2, f"no section for folnet {name}"
        body = section[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if action.help is argparse.SUPPRESS or not action.option_strings:
                continue
            assert action.option_strings[0] in body, f"folnet {name} {action.option_strings[0]}"


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    listed = set(walk(config["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
             if p.relative_to(DOCS).parts[0] not in ("figures", "hooks")}
    assert listed == pages, f"not in nav: {pages - listed}; in nav, missing: {listed - pages}"


BIBTEX = re.compile(r"@inproceedings\{chen2023learning,.*?\n\s*\}", re.S)


def _entry(text: str) -> dict[str, str]:
    match = BIBTEX.search(text)
    assert match, "no @inproceedings{chen2023learning, ...} entry"
    return dict(re.findall(r"(\w+)\s*=\s*\{(.*?)\},?\s*$", match.group(0), re.M))


@pytest.mark.parametrize("where", ["README.md", "docs/citing.md", "CITATION.cff"])
def test_the_citation_is_the_paper_everywhere(where):
    text = (ROOT / where).read_text()
    if where.endswith(".cff"):  # the BibTeX is its leading comment
        text = "\n".join(line.removeprefix("#") for line in text.splitlines())
    entry = _entry(text)
    assert entry == {"title": "Learning Language Representations with Logical Inductive Bias",
                     "author": "Chen, Jianshu",
                     "booktitle": "International Conference on Learning Representations (ICLR)",
                     "year": "2023"}


def test_citation_cff_states_the_paper_and_the_release():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    paper = cff["preferred-citation"]
    assert paper["title"] == _entry((ROOT / "docs" / "citing.md").read_text())["title"]
    assert paper["authors"] == [{"family-names": "Chen", "given-names": "Jianshu"}]
    assert paper["year"] == 2023 and cff["license"] == "MIT"
    assert cff["version"] == folnet.__version__
    assert any(ref["type"] == "software" and "FOLNet" in ref["title"]
               for ref in cff["references"])
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_no_page_names_the_wrong_author():
    """The paper has one author, Jianshu Chen."""
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\(Wang,? ICLR|Wang et al", text), path
