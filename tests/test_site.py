"""The built website in a real browser: headless Chromium from Debian's packages, driven by
Playwright (its Python package only, never a downloaded browser), on ``_build/html`` served from
127.0.0.1. Every page of the table of contents: no console errors or page errors, no request
leaving 127.0.0.1 (so nothing depends on a CDN), every <img> loaded, math typeset by MathJax
(``mjx-container`` for every math node, no raw ``$$``, no TeX errors), on notebook pages
well-formed Colab and Binder launch links; the search page finds a word. Each chapter's first
screen is saved under ``_build/screenshots/``. On every chapter page at 1280 and 1600 px, no
code block (``div.highlight pre``: code cells, their outputs, code in the prose) is wider than
its box, so none scrolls sideways (the code column of ``_static/localbook.css``).

Run after ``make book`` (``make test`` does); ``LOCALBOOK_SITE`` may point at another build.
"""

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.site]

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("LOCALBOOK_SITE", ROOT / "_build" / "html"))
BOOK_ROOT = (
    SITE.parent.parent if "LOCALBOOK_SITE" in os.environ else ROOT
)  # where _toc.yml/_config.yml are
SHOTS = SITE.parent / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def toc_files(toc_path: Path):
    """Every ``file`` of a jb-book ``_toc.yml``, in reading order, with its extension if found."""
    toc = yaml.safe_load(toc_path.read_text())
    out = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                out.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    resolved = []
    for f in out:
        f = re.sub(r"\.(md|ipynb)$", "", f)
        ext = next((x for x in (".ipynb", ".md") if (BOOK_ROOT / (f + x)).exists()), "")
        resolved.append((f, ext))
    return resolved


def repository():
    cfg = yaml.safe_load((BOOK_ROOT / "_config.yml").read_text())
    parts = urlparse(cfg["repository"]["url"]).path.strip("/").split("/")
    return parts[0], parts[1], cfg["repository"].get("branch", "main")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built site at {SITE}: run `make book` first")
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE))
    )
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(
            "Debian's chromium is not installed: run `make browser` (apt-get install -y chromium)"
        )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.problems = []
    pg.external = []

    def on_console(msg):
        if msg.type == "error":
            pg.problems.append(f"console error: {msg.text}")

    def route(r):
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            r.continue_()
        else:  # nothing may come from outside: the tested site must work offline
            pg.external.append(r.request.url)
            r.abort()

    pg.on("console", on_console)
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    pg.on(
        "requestfailed",
        lambda r: (
            pg.problems.append(f"request failed: {r.url} ({r.failure})")
            if urlparse(r.url).hostname == "127.0.0.1"
            else None
        ),
    )
    pg.route("**/*", route)
    yield pg
    ctx.close()


PAGES = toc_files(BOOK_ROOT / "_toc.yml") if (BOOK_ROOT / "_toc.yml").exists() else []

CHECK_PAGE_JS = """
async () => {
  // images: make lazy ones load, then wait for each
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; setTimeout(r, 5000); })));
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));
  // math: wait for MathJax when the page loads it
  let mathjax = null;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    if (MathJax.typesetPromise) { await MathJax.typesetPromise(); }
    mathjax = MathJax.version;
  }
  const mathNodes = Array.from(document.querySelectorAll('article .math, main .math'));
  const untypeset = mathNodes.filter(n => !n.querySelector('mjx-container')).map(n => n.textContent.slice(0, 60));
  const article = document.querySelector('article') || document.querySelector('main') || document.body;
  const clone = article.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, .highlight, textarea').forEach(n => n.remove());
  const text = clone.textContent;
  return {
    broken, mathjax, nMath: mathNodes.length,
    nTypeset: document.querySelectorAll('mjx-container').length,
    untypeset,
    texErrors: Array.from(document.querySelectorAll('mjx-merror, [data-mjx-error]')).map(n => (n.getAttribute('data-mjx-error') || n.textContent).slice(0, 80)),
    rawDisplayMath: (text.match(/\\$\\$/g) || []).length,
    rawInlineTeX: (text.match(/\\\\\\(|\\\\\\[/g) || []).length,
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    title: document.title,
    emptyWidgets: document.querySelectorAll('.jupyter-widgets:empty, .widget-area:empty').length,
  };
}
"""


def test_toc_lists_pages():
    assert PAGES, "no _toc.yml next to the site"


@pytest.mark.parametrize("doc,ext", PAGES, ids=[d for d, _ in PAGES])
def test_page(doc, ext, server, page):
    resp = page.goto(f"{server}/{doc}.html", wait_until="load")
    assert resp is not None and resp.ok, (
        f"{doc}.html: HTTP {resp.status if resp else 'no response'}"
    )
    r = page.evaluate(CHECK_PAGE_JS)
    page.wait_for_timeout(200)  # late console messages
    assert not page.external, (
        f"requests leaving 127.0.0.1 (a CDN?): {page.external[:5]}"
    )
    assert not page.problems, "\n".join(page.problems[:10])
    assert not r["broken"], f"images that did not load: {r['broken']}"
    if r["nMath"]:
        assert r["mathjax"], "the page has math but MathJax did not start"
        assert r["mathjax"].startswith("3."), r["mathjax"]
        assert not r["untypeset"], f"math not typeset: {r['untypeset'][:3]}"
        assert r["nTypeset"] >= r["nMath"]
    assert not r["texErrors"], f"TeX errors: {r['texErrors'][:5]}"
    assert r["rawDisplayMath"] == 0, "raw $$ in the page text: math not parsed"
    assert r["rawInlineTeX"] == 0, (
        "raw \\( or \\[ in the page text: MathJax did not typeset it"
    )
    assert r["emptyWidgets"] == 0, "an empty widget box"
    if ext == ".ipynb":
        org, repo, branch = repository()
        name = doc.split("/")[-1]
        colab = f"https://colab.research.google.com/github/{org}/{repo}/blob/{branch}/{doc}.ipynb"
        assert colab in r["links"], (
            f"no Colab link {colab}; launch links: {[l for l in r['links'] if 'colab' in l or 'binder' in l]}"
        )
        binder = [
            l
            for l in r["links"]
            if l.startswith(f"https://mybinder.org/v2/gh/{org}/{repo}/{branch}?")
        ]
        assert binder and f"{doc}.ipynb" in binder[0], (
            f"no well-formed Binder link for {name}"
        )
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(
            path=str(SHOTS / f"{name}.png")
        )  # the first screen, as a reader sees it
        problems = code_width_problems(page, doc)
        assert not problems, f"{doc}: " + "\n".join(problems)


def test_search_page_finds_a_word(server, page):
    page.goto(f"{server}/search.html?q=kernel", wait_until="load")
    page.wait_for_selector("#search-results li", timeout=20000)
    n = page.locator("#search-results li").count()
    assert n > 0
    assert not page.external, page.external[:5]
    assert not [
        p for p in page.problems if "console error" in p or "page error" in p
    ], page.problems


CODE_WIDTH_JS = """
async () => {
  await document.fonts.ready;
  // lay out what is folded too: hidden inputs (<details>) and solution dropdowns (togglebutton)
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(n => n.classList.remove('toggle-hidden'));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const article = document.querySelector('article') || document.body;
  return Array.from(article.querySelectorAll('div.highlight pre'))
    .filter(p => p.clientWidth > 0)
    .map(p => ({
      over: p.scrollWidth - p.clientWidth,
      box: p.clientWidth,
      longest: Math.max(...p.textContent.split('\\n').map(l => l.length)),
      kind: p.closest('.cell_output, .output') ? 'output' : 'code',
      fontPx: parseFloat(getComputedStyle(p).fontSize),
      first: p.textContent.trim().split('\\n')[0].slice(0, 60),
    }));
}
"""

WIDTHS = [1280, 1600]  # a common laptop window, and a wide one


def code_width_problems(pg, doc):
    """No code block scrolls sideways: code lines are <= 88 characters (a test of the
    notebooks checks that), and the code column holds 88 characters at these widths. Run on
    a chapter page already loaded (by test_page, after its screenshot: this unfolds what is
    folded), so that each chapter is loaded once."""
    problems = []
    for width in WIDTHS:
        pg.set_viewport_size({"width": width, "height": 900})
        blocks = pg.evaluate(CODE_WIDTH_JS)
        assert blocks, f"{doc}: no code blocks measured"
        wide = sorted((b for b in blocks if b["over"] > 0), key=lambda b: -b["over"])
        if wide:
            problems.append(
                f"at {width} px {len(wide)} of {len(blocks)} code blocks scroll "
                f"sideways, the worst by {wide[0]['over']} px: "
                + "; ".join(
                    f"{b['kind']} {b['longest']} chars in {b['box']} px at "
                    f"{b['fontPx']} px: {b['first']!r}"
                    for b in wide[:3]
                )
            )
    return problems
