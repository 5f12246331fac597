"""The built documentation site, as a reader opens it from disk (README "Documentation").

The site is built once here, strictly, into a temporary folder (the build `make docs` and
`make test` run). Then: no page loads a script or a style sheet from the network; no API page
shows a private name of folnet in a signature (docs/hooks/griffe_defaults.py puts a field's
value where its declaration called a private helper); and the search answers on a page opened
by file:// in a headless Chromium with the network cut off -- which it does only through
docs/javascripts/iframe-worker.js (mkdocs.yml, extra.polyfills), as browsers start no Web
Worker on a page opened from a file. The browser test is skipped, saying why, where no Chromium
is installed (``FOLNET_CHROMIUM`` names one that is not on PATH). And ``make docs PY=...``, the
build from an environment of one's own, installs nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from cdp import Chromium, find_chromium
from paths import ROOT

#: The site's tests share one build (about 50 s on 2 cores), and the first to run pays it.
long_run = pytest.mark.long(seconds=60)
#: A word the pages use often (the operators' pages, the API, the design).
WORD = "operator"
#: What a page may not point at: the network, by scheme or scheme-relative.
REMOTE = re.compile(r"^\s*(?:https?:)?//", re.IGNORECASE)
#: A private name: a leading underscore that is not a dunder's.
PRIVATE = re.compile(r"(?<!\w)_(?!_)[A-Za-z]\w*")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make docs` builds it (--strict) into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


#: The elements that make the browser load something, and the attribute that says what.
LOADED = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src",
          "audio": "src", "video": "src", "embed": "src", "object": "data"}


class _Fetches(HTMLParser):
    """The addresses a page makes the browser load: scripts, style sheets and icons, images,
    frames, media."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = LOADED.get(tag)
        values = dict(attrs)
        if tag == "link" and not {"stylesheet", "icon", "preload", "modulepreload",
                                  "manifest"} & set((values.get("rel") or "").split()):
            return  # a link that names a page (canonical, next) is not loaded
        if wanted and values.get(wanted):
            self.urls.append(values[wanted])


def fetched(page: Path) -> list[str]:
    """What ``page`` loads when it opens."""
    parser = _Fetches()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.urls


@long_run
def test_no_page_loads_anything_from_the_network(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 30, f"only {len(pages)} pages built"
    remote = {f"{p.relative_to(site)}: {url}" for p in pages for url in fetched(p)
              if REMOTE.match(url)}
    assert not remote, "pages load from the network:\n" + "\n".join(sorted(remote)[:20])
    index = fetched(site / "index.html")
    assert any(url.endswith("javascripts/iframe-worker.js") for url in index), index


def signatures(page: Path) -> list[str]:
    """The text of every signature block on an API page (tags stripped)."""
    html = page.read_text(encoding="utf-8")
    blocks = re.findall(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', html, re.S)
    return [re.sub(r"<[^>]+>", "", block) for block in blocks]


@long_run
def test_no_api_page_shows_a_private_name_in_a_signature(site: Path) -> None:
    pages = sorted((site / "reference" / "api").glob("*.html"))
    assert {p.stem for p in pages} >= {"models", "operators", "hf", "training"}
    training = signatures(site / "reference" / "api" / "training.html")
    assert any("PretrainConfig" in s for s in training), "no signature of PretrainConfig"
    shown = {f"{p.stem}: {name}" for p in pages for text in signatures(p)
             for name in PRIVATE.findall(text)}
    assert not shown, "private names in signatures:\n" + "\n".join(sorted(shown))
    text = (site / "reference" / "api" / "training.html").read_text(encoding="utf-8")
    for helper in ("_data_option", "_operator_tables"):
        assert helper not in text, helper


#: What the page reports once the text is typed: the search element's visibility, the
#: results' count and where they link.
STATE = """(() => {
  const search = document.querySelector('[data-md-component="search"]');
  const box = search && search.getBoundingClientRect();
  const links = [...document.querySelectorAll('.md-search-result__item a')];
  return {
    search: !!search,
    visible: !!search && !search.closest('[hidden]') && box.width > 0 && box.height > 0
             && getComputedStyle(search).visibility !== 'hidden',
    items: document.querySelectorAll('.md-search-result__item').length,
    meta: (document.querySelector('.md-search-result__meta') || {}).textContent || '',
    links: links.map(a => a.href),
  };
})()"""


def _click(browser: Chromium, session: str, selector: str) -> None:
    """A mouse click at the middle of the element ``selector`` names, as a reader clicks."""
    x, y = browser.evaluate(session, f"""(() => {{
      const box = document.querySelector({selector!r}).getBoundingClientRect();
      return [box.x + box.width / 2, box.y + box.height / 2];
    }})()""")
    for kind in ("mousePressed", "mouseReleased"):
        browser.command("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                      "button": "left", "clickCount": 1},
                        session)


def _type(browser: Chromium, session: str, text: str) -> None:
    """``text`` typed key by key into the focused element, as a reader types it."""
    for char in text:
        browser.command("Input.dispatchKeyEvent", {"type": "keyDown", "key": char,
                                                   "text": char}, session)
        browser.command("Input.dispatchKeyEvent", {"type": "keyUp", "key": char}, session)


def search_from_disk(browser: Chromium, page: Path, word: str,
                     timeout: float = 30.0) -> dict:
    """Open ``page`` by file:// with the network off, type ``word`` into the search box and
    return the page's state (`STATE`) once results show, or at ``timeout``."""
    session = browser.open_page()
    browser.command("Network.enable", session=session)
    browser.command("Network.emulateNetworkConditions",
                    {"offline": True, "latency": 0, "downloadThroughput": -1,
                     "uploadThroughput": -1}, session)
    browser.command("Emulation.setDeviceMetricsOverride",
                    {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                    session)
    browser.command("Page.enable", session=session)
    browser.command("Page.navigate", {"url": page.as_uri()}, session)
    browser.wait_for_event("Page.loadEventFired", timeout)
    _click(browser, session, ".md-search__input")
    _type(browser, session, word)
    deadline = time.monotonic() + timeout
    state = browser.evaluate(session, STATE)
    while state["items"] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        state = browser.evaluate(session, STATE)
    requests = [e["params"]["request"]["url"] for e in browser.events
                if e.get("method") == "Network.requestWillBeSent"]
    state["remote_requests"] = [url for url in requests if url.startswith(("http:", "https:"))]
    return state


def _no_network_flags() -> list[str]:
    """Chromium with nowhere to connect: every host unresolvable, every request to a proxy
    that is not there."""
    return ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
            "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]


@long_run
def test_search_answers_on_a_page_opened_from_disk_offline(site: Path,
                                                          tmp_path: Path) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium to open the site with (none of chromium, google-chrome on "
                    "PATH; FOLNET_CHROMIUM names one): the search from file:// is unchecked")
    with Chromium(binary, tmp_path, *_no_network_flags()) as browser:
        state = search_from_disk(browser, site / "index.html", WORD)
    assert state["search"], "no search element on the page"
    assert state["visible"], f"the search element is hidden: {state}"
    assert state["items"] > 0, f"no results for {WORD!r}: {state['meta']!r}"
    assert re.search(r"\d", state["meta"]), state["meta"]
    assert not state["remote_requests"], state["remote_requests"]
    targets = set()
    for link in state["links"]:
        parts = urlsplit(link)
        assert parts.scheme == "file", link
        targets.add(Path(unquote(parts.path)))
    assert targets and all(t.is_file() and t.is_relative_to(site) for t in targets), targets


@pytest.mark.parametrize("python", ["python3", "/opt/elsewhere/bin/python"])
def test_make_docs_with_a_python_of_ones_own_installs_nothing(python: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH: the Makefile's docs target is unchecked")
    done = subprocess.run(["make", "-n", "--no-print-directory", "docs", f"PY={python}"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert not [line for line in lines if "pip install" in line or " venv " in line], lines
    assert any(f"{python} -m mkdocs build --strict" in line for line in lines), lines


def test_make_docs_by_default_sets_up_the_venv_first() -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH: the Makefile's docs target is unchecked")
    done = subprocess.run(["make", "-n", "-B", "--no-print-directory", "docs",
                           "VENV=/opt/elsewhere"], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    assert "-e '.[train,hf,dev]'" in done.stdout, done.stdout
    assert "/opt/elsewhere/bin/python -m mkdocs build --strict" in done.stdout
