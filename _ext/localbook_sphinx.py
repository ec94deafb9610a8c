"""Sphinx extension of the book (listed in ``_config.yml``): offline web assets and the API reference.

* When ``web_assets/`` (made by ``make web-assets`` from the npm packages pinned in
  ``package.json``) exists next to ``_config.yml``, the site serves its own MathJax 3 and
  ipywidgets renderer: ``html_static_path``, ``mathjax_path`` and ``nb_ipywidgets_js`` point at
  the local copies, so no page needs a CDN (``make book`` always makes them; the browser test
  fails on any request that leaves 127.0.0.1). Without the folder (a scratch build of one
  page) the CDN defaults stay.
* Repeated inline scripts are dropped from each page (a JB1 + sphinx-thebe duplicate that throws a
  console error on every page).

* ``.. localbook-api::`` (inside an ``{eval-rst}`` block: it emits reStructuredText) writes the whole reference: one section per ``localbook`` module (the
  chapter modules in the order ``localbook/__init__.py`` imports them), its module docstring, a
  summary table and every public name of its ``__all__`` through autodoc. A module added to the
  package appears without editing the page.
* ``.. localbook-exercises::`` (book/teaching.md) tables every chapter's exercises: code or
  theory, and the ``lb.check`` self-check that grades it, read from the notebooks at build time.
* The chapters are nbgrader source notebooks (``_ext/nbgrader_source.py``): the pages hide the
  ``### BEGIN SOLUTION`` / ``### END SOLUTION`` marker lines of code and markdown cells (removed
  from the notebook text as it is read, before execution), so exercises and their folded
  solutions render as in a plain notebook.
* Every documented function or class gets a "Used in" line linking the chapters whose code
  cells call it (``lb.name``, ``localbook.name``, ``lb.module.name``), found by scanning
  ``book/NN_*.ipynb`` under the source folder at build time; only chapters that are part of the book are linked.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _package_dir() -> Path:
    import localbook

    return Path(localbook.__file__).resolve().parent


# modules re-exported at the top level (documented as ``localbook.name``), then the namespaces
CORE = ["kernels", "local_mean"]
NAMESPACES = [
    "datasets",
    "plotting",
    "widgets",
    "estimators",
    "impute",
    "notebook",
    "compiled",
    "sagl_study",
]
TOOLS: list = []  # book tooling modules of the package (none: assignments live in _ext/)


def chapter_modules():
    """Modules of the chapter block of localbook/__init__.py, in import order."""
    src = (_package_dir() / "__init__.py").read_text(encoding="utf-8")
    return [
        m
        for m in re.findall(r"^from \.(\w+) import \*", src, flags=re.M)
        if m not in CORE
    ]


def check_modules():
    return sorted(
        p.stem
        for p in (_package_dir() / "check").glob("*.py")
        if not p.stem.startswith("_")
    )


def _entries():
    """(module path, namespace the names are documented under, heading)"""
    out = [
        (f"localbook.{m}", "localbook", f"localbook.{m}")
        for m in CORE + chapter_modules()
    ]
    out += [(f"localbook.{m}", f"localbook.{m}", f"localbook.{m}") for m in NAMESPACES]
    out += [
        (f"localbook.check.{m}", f"localbook.check.{m}", f"localbook.check.{m}")
        for m in check_modules()
    ]
    out += [(f"localbook.{m}", f"localbook.{m}", f"localbook.{m}") for m in TOOLS]
    return out


def _rst(module, namespace, heading):
    mod = importlib.import_module(module)
    names = [n for n in getattr(mod, "__all__", []) if not n.startswith("_")]
    # the module docstring is read in the namespace its names are documented under, so that its
    # references (:func:`name`) resolve to the entries below
    lines = [
        heading,
        "-" * len(heading),
        "",
        f".. py:module:: {module}",
        "",
        f".. currentmodule:: {namespace}",
        "",
    ]
    lines += inspect.cleandoc(mod.__doc__ or "").splitlines() + [""]
    documented = [
        n
        for n in names
        if inspect.isclass(getattr(mod, n)) or callable(getattr(mod, n))
    ]
    if documented:
        lines += (
            [".. autosummary::", "   :nosignatures:", ""]
            + [f"   {n}" for n in documented]
            + [""]
        )
    for n in names:
        obj = getattr(mod, n)
        if inspect.isclass(obj):
            # only what localbook itself defines: scikit-learn attaches generated methods
            # (set_score_request, ...) whose docstrings point into scikit-learn's own docs
            own = [
                m
                for m, v in vars(obj).items()
                if not m.startswith("_")
                and (callable(v) or isinstance(v, property))
                and getattr(getattr(v, "fget", v), "__module__", "").startswith(
                    "localbook"
                )
            ]
            lines += (
                [f".. autoclass:: {n}"]
                + ([f"   :members: {', '.join(own)}"] if own else [])
                + [""]
            )
        elif callable(obj):
            lines += [f".. autofunction:: {n}", ""]
        else:
            lines += [
                f".. py:data:: {n}",
                "",
                f"   A constant of ``{module}`` ({type(obj).__name__}); see the module's description above.",
                "",
            ]
    return lines


class LocalbookAPI(SphinxDirective):
    has_content = False

    def run(self):
        lines = []
        for entry in _entries():
            lines += _rst(*entry) + [""]
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(
            self.state, StringList(lines, source="localbook-api"), node
        )
        return node.children


_USES = {}
# a localbook name in code, with its modules: lb.check.ch01.local_constant_fit
_CHAIN = re.compile(r"\b(?:lb|localbook)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _chapter_names(srcdir):
    """``{"book/NN_name": {every name after lb. in the chapter's code}}``, read once: each
    part of a dotted chain counts (``lb.datasets.make_x`` uses ``datasets`` and ``make_x``).
    One pass per chapter instead of one regular-expression search per documented name and
    chapter (4,500 searches, 5.6 s of the build)."""
    if not _USES:
        for nb in sorted((Path(srcdir) / "book").glob("[0-9][0-9]_*.ipynb")):
            cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
            code = "\n".join(
                "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                for c in cells
                if c.get("cell_type") == "code"
            )
            _USES[f"book/{nb.stem}"] = {
                part for chain in _CHAIN.findall(code) for part in chain.split(".")
            }
    return _USES


def add_used_in(app, what, name, obj, options, lines):
    if what not in ("function", "class") or "." not in name:
        return
    short = name.rsplit(".", 1)[1]
    docs = [
        d
        for d, names in _chapter_names(app.srcdir).items()
        if short in names and d in app.env.found_docs
    ]
    lines += [
        "",
        "**Used in:** "
        + (", ".join(f":doc:`/{d}`" for d in docs) if docs else "no chapter yet."),
        "",
    ]


def cache_numref_targets(app):
    """Sphinx 7.4 unpickles the target document's whole doctree for every ``{numref}`` (137
    per build of this book, 11 s of a 57 s build) only to read the target node. Within one
    resolving pass one unpickled copy per document serves them all; the copies are dropped
    when the build ends. Only that lookup is cached: every other caller of
    ``env.get_doctree`` (which may change what it gets) still gets a fresh copy."""
    from sphinx.domains.std import StandardDomain

    original = getattr(StandardDomain, "_resolve_numref_xref", None)
    if original is None or getattr(original, "_localbook_cached", False):
        return  # another Sphinx: nothing to speed up, nothing to break
    copies = {}

    def resolve(self, env, *args, **kwargs):
        def get_doctree(docname):
            if (id(env), docname) not in copies:
                copies[id(env), docname] = type(env).get_doctree(env, docname)
            return copies[id(env), docname]

        env.get_doctree = get_doctree  # this call only; the class's method otherwise
        try:
            return original(self, env, *args, **kwargs)
        finally:
            del env.get_doctree

    resolve._localbook_cached = True
    StandardDomain._resolve_numref_xref = resolve
    app.connect("build-finished", lambda app, exc: copies.clear())


_EXERCISE = re.compile(r"^(?:`{3,}|:{3,})\{exercise\}\s*(?P<title>.*)$")
_LABEL = re.compile(r"^:label:\s*(?P<label>\S+)")
_CHECK = re.compile(r"\bcheck\.(ch\d+)\.(\w+)\(")


def chapter_exercises(path: Path):
    """``(title, [(label, title, kind, check)])`` of one chapter notebook, in order.

    ``kind`` is "code" when a cell tagged ``solution`` follows the exercise (before the next one),
    else "theory"; ``check`` names the ``lb.check`` function an untagged cell calls on the answer.
    """
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    src = lambda c: (
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    )  # noqa: E731
    title, out = path.stem, []
    for c in cells:
        text = src(c)
        if c.get("cell_type") == "markdown":
            if title == path.stem and text.lstrip().startswith("# "):
                title = text.lstrip()[2:].splitlines()[0].strip()
            lines = text.splitlines()
            for i, line in enumerate(lines):
                m = _EXERCISE.match(line.strip())
                if m:
                    label = next(
                        (
                            lm.group("label")
                            for lm in map(_LABEL.match, lines[i + 1 : i + 6])
                            if lm
                        ),
                        None,
                    )
                    out.append(
                        [
                            label,
                            m.group("title").strip() or _excerpt(lines[i + 1 :]),
                            "theory",
                            None,
                        ]
                    )
        elif out:
            tags = c.get("metadata", {}).get("tags", [])
            if "solution" in tags:
                out[-1][2] = "code"
            else:
                m = _CHECK.search(text)
                if m:
                    out[-1][3] = f"{m.group(1)}.{m.group(2)}"
    return title, [tuple(e) for e in out]


def _excerpt(lines, limit: int = 90) -> str:
    """The first sentence of an exercise's text (options skipped), as reStructuredText."""
    body = []
    for line in lines:
        if re.match(r"^(`{3,}|:{3,})\s*$", line.strip()):
            break
        if not line.startswith(":"):
            body.append(line.strip())
    text = " ".join(t for t in body if t)
    text = re.sub(
        r"\{([\w:-]+)\}`([^`]*)`",
        lambda m: f"\x00{m.group(1)}\x01{m.group(2)}\x02",
        text,
    )  # MyST roles
    text = re.sub(r"\*\*|(?<!\\)\*", "", text)
    sentence = re.split(r"(?<=[.?!:])\s", text, maxsplit=1)[0]
    if len(sentence) > limit:
        cut = sentence[:limit]
        if cut.count("$") % 2:  # do not cut inside math
            cut = cut[: cut.rfind("$")]
        sentence = cut.rsplit(" ", 1)[0] + " …"
    sentence = sentence.replace("`", "")
    sentence = re.sub(
        r"\x00([\w:-]+)\x01([^\x02]*)\x02",
        lambda m: f":{m.group(1)}:`{m.group(2)}`",
        sentence,
    )
    sentence = re.sub(r"\x00[^\x02]*$", "…", sentence)  # a role cut by the length limit
    parts = sentence.split("$")
    if len(parts) % 2 == 0:  # unbalanced: drop the math markers
        return sentence.replace("$", "") or "Exercise"
    parts = [re.sub(r"\s+", " ", p) for p in parts]
    out = ""
    for k, p in enumerate(parts):
        if k % 2 == 0:
            out += p
        else:  # inline math needs whitespace around it in reST; an escaped space glues it to text
            before = "" if (not out or out.endswith(" ")) else "\\ "
            nxt = parts[k + 1] if k + 1 < len(parts) else ""
            after = "" if (not nxt or nxt.startswith(" ")) else "\\ "
            out += f"{before}:math:`{p.strip()}`{after}"
    out = out.strip()
    if re.match(
        r"^(\(?[a-zA-Z0-9]{1,2}[.)]|[-*+] )", out
    ):  # "(a) ..." would start an enumerated list
        out = "\\" + out
    return out or "Exercise"


class LocalbookExercises(SphinxDirective):
    """A table per chapter of its exercises: kind (code/theory) and the self-check that grades it."""

    has_content = False

    def run(self):
        lines = []
        for nb in sorted((Path(self.env.srcdir) / "book").glob("[0-9][0-9]_*.ipynb")):
            doc = f"book/{nb.stem}"
            if doc not in self.env.found_docs:
                continue
            self.env.note_dependency(str(nb))
            title, exercises = chapter_exercises(nb)
            lines += [f":doc:`{title} </{doc}>`", ""]
            if not exercises:
                lines += ["   No exercises yet.", ""]
                continue
            lines += [
                ".. list-table::",
                "   :header-rows: 1",
                "   :widths: 50 15 35",
                "",
                "   * - Exercise",
                "     - Kind",
                "     - Self-check",
            ]
            for label, etitle, kind, check in exercises:
                ref = f"{etitle} (:ref:`{label}`)" if label else etitle
                lines += [
                    f"   * - {ref}",
                    f"     - {kind}",
                    f"     - ``lb.check.{check}``" if check else "     - —",
                ]
            n_code = sum(e[2] == "code" for e in exercises)
            n_checked = sum(bool(e[3]) for e in exercises)
            lines += [
                "",
                f"{len(exercises)} exercises: {n_code} with code, {n_checked} graded by a self-check.",
                "",
            ]
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(
            self.state, StringList(lines, source="localbook-exercises"), node
        )
        return node.children


def use_local_web_assets(app, config):
    assets = Path(app.confdir) / "web_assets"
    if not (assets / "mathjax" / "tex-chtml.js").exists():
        return
    config.html_static_path = list(config.html_static_path) + [str(assets)]
    config.mathjax_path = "mathjax/tex-chtml.js"  # relative to _static/
    config.nb_ipywidgets_js = {"require.js": {}, "embed-amd.js": {}}


def dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated inline scripts (JB1 + sphinx-thebe add the thebe config twice, which throws
    "Identifier 'THEBE_JS_URL' has already been declared" in every page)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        attrs = (
            js.attributes
            if hasattr(type(js), "__slots__") or "attributes" in vars(js)
            else {}
        )
        key = (
            str(getattr(js, "filename", js) or ""),
            tuple(sorted((k, str(v)) for k, v in attrs.items())),
        )
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    context["script_files"] = kept


SOLUTION_MARKER = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")


def strip_solution_markers(text: str) -> str:
    """A notebook's JSON text without nbgrader's solution marker lines in any cell."""
    nb = json.loads(text)
    changed = False
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        lines = src.split("\n")
        kept = [line for line in lines if not SOLUTION_MARKER.match(line)]
        if len(kept) != len(lines):
            cell["source"] = "\n".join(kept)
            changed = True
    return json.dumps(nb, ensure_ascii=False, indent=1) if changed else text


def hide_solution_markers(app, docname, source):
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        source[0] = strip_solution_markers(source[0])


#: Earlier file names of the chapters (before the files were numbered by their place in
#: _toc.yml): each old page becomes a small HTML stub that redirects to the chapter.
REDIRECTS = {
    "02b_local_decisions": "03_local_decisions",
    "03_mean_shift": "04_mean_shift",
    "04_denoising": "05_denoising",
    "04b_learning_kernels": "06_learning_kernels",
    "05_attention": "07_attention",
    "06_entmax": "08_entmax",
    "07_sparse_graphs": "09_sparse_graphs",
    "08_memorization": "10_memorization",
    "09_embeddings": "11_embeddings",
    "10_imputation": "12_imputation",
}

_STUB = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Moved: {new}</title>
<link rel="canonical" href="{new}.html">
<meta http-equiv="refresh" content="0; url={new}.html">
</head><body><p>This chapter is now at <a href="{new}.html">{new}.html</a>.</p></body></html>
"""


def write_redirects(app, exception):
    """One stub per old chapter page, in the HTML output (never over a real page)."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / "book"
    for old, new in REDIRECTS.items():
        if (out / f"{new}.html").is_file() and not (out / f"{old}.html").exists():
            (out / f"{old}.html").write_text(_STUB.format(new=new), encoding="utf-8")


def draw_reading_map(app):
    """Draw the intro's reading map from the chapters' **Builds on:** lines (chapter_frame)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import chapter_frame

    root = Path(app.srcdir)
    chapter_frame.draw_reading_map(root, root / "book" / "_generated" / "reading_map")


#: The book's PDF (``make pdf``): ``_build/latex/<PDF_NAME>``, copied into the site's root.
PDF_NAME = "localization-methods.pdf"


def latex_macros(macros: dict) -> str:
    r"""LaTeX definitions of a MathJax ``tex.macros`` table, one line each.

    ``{"R": "\\mathbb{R}"}`` gives ``\providecommand{\R}{}\renewcommand{\R}{\mathbb{R}}``
    (so a name LaTeX already has, like ``\P``, is redefined as in MathJax); a value
    ``[body, n]`` defines a macro of ``n`` arguments.
    """
    lines = []
    for name, body in macros.items():
        nargs = 0
        if isinstance(body, (list, tuple)):
            body, nargs = body[0], int(body[1])
        args = f"[{nargs}]" if nargs else ""
        lines.append(
            f"\\providecommand{{\\{name}}}{{}}\\renewcommand{{\\{name}}}{args}{{{body}}}"
        )
    return "\n".join(lines)


def add_pdf_button(app, pagename, templatename, context, doctree):
    """A header button on every page that downloads the whole book as a PDF."""
    buttons = context.get("header_buttons")
    if buttons is None:
        return
    buttons.append(
        {
            "type": "link",
            "url": context["pathto"](PDF_NAME, 1),
            "text": "PDF",
            "tooltip": "Download the whole book (PDF)",
            "icon": "fas fa-file-pdf",
            "label": "download-book-pdf-button",
        }
    )


UNICODE_MATH_ACTIVE = ("<super>", "<sub>", "<fraction>")


def book_characters(root: Path) -> list:
    """The characters beyond Latin-1 that the chapters and the package may print, sorted.

    Read from the chapters' cells (``book/*.ipynb``), the book's pages (``book/*.md``) and the
    package's sources (``localbook/**/*.py``, which print messages and self-check results);
    control, format, combining and private-use characters, general punctuation (dashes, quotes,
    which every font of the PDF has, primes included) and the characters that ``unicode-math``
    (which the PDF loads) makes active itself are left out: super- and subscripts, vulgar
    fractions and the roots ``√∛∜``.
    """
    import unicodedata

    texts = [p.read_text(encoding="utf-8") for p in sorted(root.glob("book/*.md"))]
    texts += [
        p.read_text(encoding="utf-8") for p in sorted(root.glob("localbook/**/*.py"))
    ]
    for path in sorted(root.glob("book/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
            src = cell.get("source", "")
            texts.append("".join(src) if isinstance(src, list) else src)
    chars = {c for text in texts for c in text if ord(c) > 0xFF}
    return sorted(
        c
        for c in chars
        if unicodedata.category(c)[0] not in "CZ"
        and unicodedata.category(c) not in ("Mn", "Me", "Mc")
        and not 0x2000 <= ord(c) <= 0x206F
        and not unicodedata.decomposition(c).startswith(UNICODE_MATH_ACTIVE)
        and c not in "√∛∜"
    )


def latex_glyph_fallback(chars) -> str:
    r"""LaTeX that prints each of ``chars`` from a font that has it (xelatex has no fallback).

    At the end of ``\begin{document}`` (after ``unicode-math`` has set up its symbols) each
    character becomes active: in text, the current font's glyph when it has one
    (``\iffontchar``), else DejaVu Sans's, else FreeSerif's; in math, what it was before
    (``unicode-math``'s meaning, such as ``\int`` for ``∫``, or the plain character); in PDF
    bookmarks, the plain character. So the code font may lack ``ℓ`` or ``≫`` without a blank
    in the PDF.
    """
    codes = "".join(
        f"\\lbfallbackchar{{{ord(c)}}}" for c in chars
    )  # decimal: \\lowercase
    return "\n".join(
        [
            r"\newfontfamily\lbfallbackfont{DejaVu Sans}[Scale=MatchLowercase]",
            r"\newfontfamily\lbfallbackfontb{FreeSerif}[Scale=MatchLowercase]",
            r"\newcommand\lbglyphtext[1]{\iffontchar\font#1 \char#1 \else{\lbfallbackfont"
            r"\iffontchar\font#1 \char#1 \else\lbfallbackfontb\char#1 \fi}\fi}",
            r"\newcommand\lbpdfchars{}",
            r"\makeatletter",
            r"\newcommand\lbfallbackchar[1]{\begingroup\lccode`\~=#1 \lowercase{\endgroup",
            r"  \ifdefined~\global\expandafter\let\csname lbmath#1\endcsname~%",
            r"  \else\expandafter\xdef\csname lbmath#1\endcsname{\Uchar#1 }\fi",
            r"  \protected\gdef~{\ifmmode\expandafter\@firstoftwo\else"
            r"\expandafter\@secondoftwo\fi{\csname lbmath#1\endcsname}{\lbglyphtext{#1}}}%",
            r"  \xdef\lbpdfchars{\unexpanded\expandafter{\lbpdfchars}"
            r"\def\noexpand~{\Uchar#1 }}}\global\catcode#1=13 }",
            r"\makeatother",
            r"\AddToHook{begindocument/end}{" + codes,
            r"  \pdfstringdefDisableCommands{\lbpdfchars}}",
        ]
    )


def label_exercises_for_latex(app, doctree, docname):
    r"""LaTeX targets for ``{ref}`` links to exercises, such as the teaching page's table.

    sphinx-exercise labels an exercise ``exercise:<label>`` in LaTeX, but a ``{ref}`` to it
    becomes ``\ref{<docname>:<label>}``, undefined in the PDF. Before each exercise, this adds
    that label too, numbered as the exercise's title (``Exercise 1.7.1``).
    """
    if app.builder.format != "latex":
        return
    from sphinx_exercise.nodes import exercise_enumerable_node

    registry = getattr(app.env, "sphinx_exercise_registry", {})
    for node in list(doctree.findall(exercise_enumerable_node)):
        label = node.get("label")
        doc = registry.get(label, {}).get("docname")
        number = re.search(r"\d+(?:\.\d+)*", node.children[0].astext())
        if not (label and doc and number):
            continue
        tex = (
            "\\phantomsection\\expandafter\\def\\csname @currentlabel\\endcsname"
            f"{{{number.group(0)}}}\\label{{\\detokenize{{{doc}:{label}}}}}\n"
        )
        node.parent.insert(node.parent.index(node), nodes.raw("", tex, format="latex"))


def copy_pdf_into_site(app):
    """An HTML build copies the PDF that ``make pdf`` built, when there is one, into the site."""
    pdf = Path(app.outdir).parent / "latex" / PDF_NAME
    if pdf.is_file() and app.builder.format == "html":
        app.config.html_extra_path = list(app.config.html_extra_path) + [str(pdf)]


def configure_pdf(app, config):
    """One macro table for both outputs, and the PDF on the website.

    The LaTeX preamble gets the MathJax macros of ``_config.yml`` (``mathjax3_config``), so
    the PDF typesets the same ``\\R``, ``\\argmin``, ... as the site, and a glyph fallback for
    the characters the book uses (``latex_glyph_fallback``); ``{ref}`` links to exercises
    resolve in the PDF (``label_exercises_for_latex``). The HTML pages get a
    download button for the book's PDF; when ``make pdf`` has built it, the HTML build also
    copies it into the site (``html_extra_path``), and ``make pdf`` copies it there itself.
    """
    macros = (config.mathjax3_config or {}).get("tex", {}).get("macros", {})
    elements = dict(config.latex_elements or {})
    elements["preamble"] = (
        elements.get("preamble", "")
        + "\n% the MathJax macros of _config.yml (mathjax3_config.tex.macros)\n"
        + latex_macros(macros)
        + "\n% glyphs the fonts lack come from another font\n"
        + latex_glyph_fallback(book_characters(Path(app.srcdir)))
        + "\n"
    )
    config.latex_elements = elements
    app.connect("builder-inited", copy_pdf_into_site)
    app.connect("html-page-context", add_pdf_button, priority=502)
    app.connect("doctree-resolved", label_exercises_for_latex)


def setup(app):
    app.connect("config-inited", use_local_web_assets)
    app.connect("builder-inited", draw_reading_map)
    app.connect("build-finished", write_redirects)
    app.connect("source-read", hide_solution_markers)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    app.add_directive("localbook-api", LocalbookAPI)
    app.add_directive("localbook-exercises", LocalbookExercises)
    app.connect("autodoc-process-docstring", add_used_in)
    app.connect("config-inited", configure_pdf)
    cache_numref_targets(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
