"""Sphinx extension of the book (listed in ``_config.yml``): offline web assets and the API reference.

* When ``web_assets/`` (made by ``make web-assets`` from the npm packages pinned in
  ``package.json``) exists next to ``_config.yml``, the site serves its own MathJax 3 and
  ipywidgets renderer: ``html_static_path``, ``mathjax_path`` and ``nb_ipywidgets_js`` point at
  the local copies, so no page needs a CDN (``make book`` always makes them; the browser test
  fails on any request that leaves 127.0.0.1). Without the folder (a scratch build of one
  page) the CDN defaults stay.

* ``.. localbook-api::`` (inside an ``{eval-rst}`` block: it emits reStructuredText) writes the whole reference: one section per ``localbook`` module (the
  chapter modules in the order ``localbook/__init__.py`` imports them), its module docstring, a
  summary table and every public name of its ``__all__`` through autodoc. A module added to the
  package appears without editing the page.
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
NAMESPACES = ["datasets", "plotting", "widgets"]
TOOLS = ["assignments"]


def chapter_modules():
    """Modules of the chapter block of localbook/__init__.py, in import order."""
    src = (_package_dir() / "__init__.py").read_text(encoding="utf-8")
    return [m for m in re.findall(r"^from \.(\w+) import \*", src, flags=re.M) if m not in CORE]


def check_modules():
    return sorted(p.stem for p in (_package_dir() / "check").glob("ch[0-9][0-9].py"))


def _entries():
    """(module path, namespace the names are documented under, heading)"""
    out = [(f"localbook.{m}", "localbook", f"localbook.{m}") for m in CORE + chapter_modules()]
    out += [(f"localbook.{m}", f"localbook.{m}", f"localbook.{m}") for m in NAMESPACES]
    out += [(f"localbook.check.{m}", f"localbook.check.{m}", f"localbook.check.{m}") for m in check_modules()]
    out += [(f"localbook.{m}", f"localbook.{m}", f"localbook.{m}") for m in TOOLS]
    return out


def _rst(module, namespace, heading):
    mod = importlib.import_module(module)
    names = [n for n in getattr(mod, "__all__", []) if not n.startswith("_")]
    # the module docstring is read in the namespace its names are documented under, so that its
    # references (:func:`name`) resolve to the entries below
    lines = [heading, "-" * len(heading), "", f".. py:module:: {module}", "", f".. currentmodule:: {namespace}", ""]
    lines += inspect.cleandoc(mod.__doc__ or "").splitlines() + [""]
    documented = [n for n in names if inspect.isclass(getattr(mod, n)) or callable(getattr(mod, n))]
    if documented:
        lines += [".. autosummary::", ""] + [f"   {n}" for n in documented] + [""]
    for n in names:
        obj = getattr(mod, n)
        if inspect.isclass(obj):
            lines += [f".. autoclass:: {n}", "   :members:", ""]
        elif callable(obj):
            lines += [f".. autofunction:: {n}", ""]
        else:
            lines += [f".. py:data:: {n}", "", f"   A constant of ``{module}`` ({type(obj).__name__}); see the module's description above.", ""]
    return lines


class LocalbookAPI(SphinxDirective):
    has_content = False

    def run(self):
        lines = []
        for entry in _entries():
            lines += _rst(*entry) + [""]
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="localbook-api"), node)
        return node.children


_USES = {}


def _chapter_sources(srcdir):
    if not _USES:
        for nb in sorted((Path(srcdir) / "book").glob("[0-9][0-9]_*.ipynb")):
            cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
            _USES[f"book/{nb.stem}"] = "\n".join(
                "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                for c in cells if c.get("cell_type") == "code")
    return _USES


def add_used_in(app, what, name, obj, options, lines):
    if what not in ("function", "class") or "." not in name:
        return
    short = name.rsplit(".", 1)[1]
    pattern = re.compile(r"\b(?:lb|localbook)\.(?:[A-Za-z_]\w*\.)*" + re.escape(short) + r"\b")
    docs = [d for d, code in _chapter_sources(app.srcdir).items() if pattern.search(code) and d in app.env.found_docs]
    lines += ["", "**Used in:** " + (", ".join(f":doc:`/{d}`" for d in docs) if docs else "no chapter yet."), ""]


def use_local_web_assets(app, config):
    assets = Path(app.confdir) / "web_assets"
    if not (assets / "mathjax" / "tex-chtml.js").exists():
        return
    config.html_static_path = list(config.html_static_path) + [str(assets)]
    config.mathjax_path = "mathjax/tex-chtml.js"  # relative to _static/
    config.nb_ipywidgets_js = {"require.js": {}, "embed-amd.js": {}}


def setup(app):
    app.connect("config-inited", use_local_web_assets)
    app.add_directive("localbook-api", LocalbookAPI)
    app.connect("autodoc-process-docstring", add_used_in)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
