"""The book's PDF (``make pdf``): ``_build/latex/localization-methods.pdf`` and its LaTeX log.

* every page of ``_toc.yml`` is in it: the first ``# `` heading of each chapter and appendix
  appears in the PDF's text (``pdftotext`` from poppler-utils, which ``make pdf`` installs);
* it typesets cleanly: the final xelatex pass logs at most ``MAX_MISSING_GLYPHS`` missing
  characters (a glyph the font lacks prints nothing), at most ``MAX_OVERFULL`` overfull lines
  wider than ``OVERFULL_PT`` and none wider than ``MAX_OVERFULL_PT`` (text running into the
  margin), and no undefined reference;
* it has the website's figures: on every page, the ``<img>`` of the HTML article equal the
  ``\\sphinxincludegraphics`` of that page's part of the ``.tex``;
* the website offers it: the PDF is in the site's root and every page links to it.

The tests on the PDF are ``slow`` (``make pdf-test`` runs them after ``make pdf``, and after
``make book`` for the figures; when no PDF is there, the fixture builds it with ``make pdf``). The
fast ones check the LaTeX that ``_ext/localbook_sphinx.py`` generates: every MathJax macro of
``_config.yml`` defined for LaTeX, and the glyph fallback.
"""

import html
import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

slow = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LATEX = ROOT / "_build" / "latex"
SITE = ROOT / "_build" / "html"
NAME = "localization-methods"

MAX_MISSING_GLYPHS = 0
#: overfull lines (hbox) that stick out of the text block by more than OVERFULL_PT are counted:
#: at most MAX_OVERFULL of them, and none by more than MAX_OVERFULL_PT (into the margin)
OVERFULL_PT = 5.0
MAX_OVERFULL = 5
MAX_OVERFULL_PT = 20.0


sys.path.insert(0, str(ROOT / "_ext"))
import localbook_sphinx  # noqa: E402


def toc_docs():
    """Every ``file`` of ``_toc.yml`` in reading order, the root first."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                out.append(re.sub(r"\.(md|ipynb)$", "", e["file"]))
            walk(e.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return out


def heading(doc: str) -> str:
    """The first level-1 heading of a chapter (notebook or MyST page), as plain text."""
    path = ROOT / f"{doc}.ipynb"
    if path.exists():
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
        )
    else:
        text = (ROOT / f"{doc}.md").read_text()
    title = next(line[2:] for line in text.splitlines() if line.startswith("# "))
    return re.sub(r"[`*_]", "", title).strip()


def squash(text: str) -> str:
    """Letters and digits only, case-folded: immune to line breaks, hyphens and ligatures."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return re.sub(r"[\W_]+", "", text)


@pytest.fixture(scope="module")
def pdf():
    path = LATEX / f"{NAME}.pdf"
    if not path.is_file():
        subprocess.run(["make", "pdf"], cwd=ROOT, check=True)
    return path


@pytest.fixture(scope="module")
def pdf_text(pdf):
    assert shutil.which("pdftotext"), (
        "pdftotext missing: make tex installs poppler-utils"
    )
    out = subprocess.run(
        ["pdftotext", "-enc", "UTF-8", str(pdf), "-"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


@pytest.fixture(scope="module")
def log(pdf):
    return (LATEX / f"{NAME}.log").read_text(encoding="utf-8", errors="replace")


@pytest.fixture(scope="module")
def tex(pdf):
    return (LATEX / f"{NAME}.tex").read_text(encoding="utf-8")


@slow
def test_pdf_has_pages(pdf):
    out = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True)
    pages = int(re.search(r"^Pages:\s+(\d+)", out.stdout, re.M).group(1))
    assert pages > 12 * 5, f"only {pages} pages"


@slow
@pytest.mark.parametrize("doc", toc_docs())
def test_every_heading_in_pdf(doc, pdf_text):
    title = heading(doc)
    assert squash(title) in squash(pdf_text), f"{doc}: heading {title!r} not in the PDF"


@slow
def test_no_missing_glyphs(log):
    missing = re.findall(r"^Missing character: .*$", log, re.M)
    assert len(missing) <= MAX_MISSING_GLYPHS, (
        f"{len(missing)} missing glyphs, e.g. {sorted(set(missing))[:5]}"
    )


@slow
def test_overfull_boxes(log):
    """Lines wider than the text block: a few slight ones, none running into the margin."""
    widths = [
        float(w)
        for w in re.findall(r"^Overfull \\hbox \((\d+\.\d+)pt too wide", log, re.M)
    ]
    big = [w for w in widths if w > OVERFULL_PT]
    assert len(big) <= MAX_OVERFULL, (
        f"{len(big)} overfull lines wider than {OVERFULL_PT}pt ({len(widths)} in all)"
    )
    where = re.findall(r"^Overfull \\hbox .*", log, re.M)
    assert max(widths, default=0) <= MAX_OVERFULL_PT, (
        f"a line {max(widths):.0f}pt too wide (limit {MAX_OVERFULL_PT}pt), in "
        f"localization-methods.log: {where}"
    )


@slow
def test_references_resolved(log):
    undefined = re.findall(r"LaTeX Warning: (?:Reference|Citation) .* undefined", log)
    assert not undefined, undefined[:5]


def html_images(doc: str) -> int:
    """``<img>`` inside the page's article (the sidebar's logo and icons are not counted)."""
    page = (SITE / f"{doc}.html").read_text(encoding="utf-8")
    start = page.index("<article")
    end = page.index("</article>", start)
    return len(re.findall(r"<img\b", page[start:end]))


def tex_sections(tex: str, docs: list) -> dict:
    """The ``.tex`` cut into the pages of ``docs``: Sphinx labels each page ``\\label{\\detokenize{doc::doc}}``."""
    marks = []
    for doc in docs:
        key = "\\label{\\detokenize{" + doc + "::doc}}"
        pos = tex.find(key)
        marks.append((pos if pos >= 0 else None, doc))
    found = sorted((p, d) for p, d in marks if p is not None)
    out = {d: None for d in docs}
    for i, (pos, doc) in enumerate(found):
        end = found[i + 1][0] if i + 1 < len(found) else len(tex)
        out[doc] = tex[pos:end]
    return out


@slow
def test_figures_match_website(tex):
    if not (SITE / "index.html").exists():
        pytest.fail("no website in _build/html: run make book first")
    docs = [d for d in toc_docs() if (SITE / f"{d}.html").exists()]
    parts = tex_sections(tex, docs)
    rows = []
    for doc in docs:
        n_html = html_images(doc)
        n_tex = (
            len(re.findall(r"\\sphinxincludegraphics\b", parts[doc]))
            if parts[doc] is not None
            else -1
        )
        if n_html != n_tex:
            rows.append(f"{doc}: {n_html} on the website, {n_tex} in the PDF")
    assert not rows, "\n".join(rows)
    total = len(re.findall(r"\\sphinxincludegraphics\b", tex))
    assert total >= sum(html_images(d) for d in docs) > 12


@slow
def test_website_links_the_pdf(pdf):
    assert (SITE / f"{NAME}.pdf").is_file(), "make pdf copies the PDF into the site"
    for doc in toc_docs():
        page = (SITE / f"{doc}.html").read_text(encoding="utf-8")
        hrefs = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', page)]
        links = [h for h in hrefs if h.endswith(f"{NAME}.pdf")]
        assert links, f"{doc}.html has no link to the PDF"
        target = (SITE / doc).parent / links[0]
        assert target.resolve() == (SITE / f"{NAME}.pdf").resolve()


def test_every_mathjax_macro_is_defined_for_latex():
    """One table: each macro of ``mathjax3_config.tex.macros`` becomes a LaTeX command."""
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    macros = cfg["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
    tex = localbook_sphinx.latex_macros(macros)
    for name, body in macros.items():
        assert f"\\renewcommand{{\\{name}}}{{{body}}}" in tex, name
    assert "\\providecommand{\\P}{}\\renewcommand{\\P}{\\mathbb{P}}" in tex  # \P exists
    two = localbook_sphinx.latex_macros({"norm": ["\\lVert #1 \\rVert_{#2}", 2]})
    assert two.endswith("\\renewcommand{\\norm}[2]{\\lVert #1 \\rVert_{#2}}")


def test_glyph_fallback_characters(tmp_path):
    """Characters beyond Latin-1 get a fallback, except those unicode-math owns and the rest."""
    (tmp_path / "book").mkdir()
    (tmp_path / "localbook").mkdir()
    # super/subscripts, a root, a fraction (unicode-math's), a format character, punctuation
    (tmp_path / "book" / "a.md").write_text(
        "# é ℓ ⁻² ᵢ ᵀ √ ⅓ \u200b — ’\n", encoding="utf-8"
    )
    cell = {"cell_type": "code", "source": ["x = 1  # ≫ ℓ\n"]}
    (tmp_path / "book" / "b.ipynb").write_text(
        json.dumps({"cells": [cell]}, ensure_ascii=True), encoding="utf-8"
    )
    (tmp_path / "localbook" / "m.py").write_text('print("∫")\n', encoding="utf-8")
    assert localbook_sphinx.book_characters(tmp_path) == ["ℓ", "∫", "≫"]
    tex = localbook_sphinx.latex_glyph_fallback(["ℓ", "≫"])
    assert "\\lbfallbackchar{8467}\\lbfallbackchar{8811}" in tex  # decimal, not hex
    assert tex.count("{") == tex.count("}")
    assert localbook_sphinx.book_characters(ROOT)  # the book has some
