"""Notebook hygiene: every chapter is in the table of contents, stored clean, and self-contained."""

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"]


def _toc_files(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root"):
                yield value
            else:
                yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


TOC = list(_toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text())))


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 2


def test_every_notebook_is_in_the_toc_and_every_toc_entry_exists():
    in_toc = {t.removesuffix(".ipynb").removesuffix(".md") for t in TOC}
    for nb in NOTEBOOKS:
        assert f"book/{nb.stem}" in in_toc, f"{nb.name} is not listed in _toc.yml"
    for entry in in_toc:
        assert any((ROOT / (entry + ext)).exists() for ext in (".ipynb", ".md")), (
            f"_toc.yml lists missing {entry}"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["kernelspec"]["language"] == "python"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a code cell has stored outputs"
            assert cell.execution_count is None, (
                f"{path.name}: a code cell has an execution count"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_localbook_from_the_configured_repository(path):
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code").source
    assert 'importlib.util.find_spec("localbook") is None' in first
    assert f"git+{REPO_URL}" in first, (
        "the install cell must use repository.url from _config.yml"
    )
    assert "LOCALBOOK_SOURCE" in first
    # it installs localbook and nothing else
    assert first.count("pip") == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_structure(path):
    nb = nbformat.read(path, as_version=4)
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    exercises = re.findall(r"```\{exercise\}", md)
    solutions = re.findall(r"```\{solution\}", md)
    assert len(exercises) >= 4, f"{path.name}: at least 4 exercises expected"
    assert len(solutions) >= len(exercises), (
        f"{path.name}: every exercise needs a solution"
    )
    assert re.search(r"\{prf:(theorem|lemma|proposition)\}", md), (
        f"{path.name}: no theorem/lemma block"
    )
    assert "{prf:proof}" in md
    assert "{cite}" in md or "{cite:" in md, f"{path.name}: cites nothing"
    assert re.search(
        r"^\s*(assert |torch\.testing\.assert_close|np\.testing\.assert)", code, re.M
    ), f"{path.name}: no assert cell checks a derivation"
    assert "import localbook" in code


def test_citation_keys_exist():
    bib = (ROOT / "references.bib").read_text()
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    for path in NOTEBOOKS:
        text = path.read_text()
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text):
            for key in group.split(","):
                assert key.strip() in keys, f"{path.name} cites unknown key {key!r}"


# --- the page column, the build sandbox, and glued numbers ------------------------------------
MAX_CODE_LINE = 88


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page_column(path):
    nb = nbformat.read(path, as_version=4)
    long = [
        (i, line)
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for line in c.source.splitlines()
        if len(line) > MAX_CODE_LINE
    ]
    assert not long, (
        f"{path.name}: {len(long)} code lines longer than {MAX_CODE_LINE}: {long[:3]}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_writes_under_tmp(path):
    code = "\n".join(
        c.source
        for c in nbformat.read(path, as_version=4).cells
        if c.cell_type == "code"
    )
    assert not re.search(r"""["']/tmp\b""", code), (
        f"{path.name}: use tempfile, not a fixed /tmp path"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glued_name_in_the_prose_is_glued_by_the_code(path):
    nb = nbformat.read(path, as_version=4)
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    used = {m.split(":")[0] for m in re.findall(r"\{glue(?::\w+)?\}`([^`]+)`", md)}
    literal = set(re.findall(r"""glue\(\s*["']([^"']+)["']""", code))
    prefixes = re.findall(
        r"""glue\(\s*f["']([^"'{]*)\{""", code
    )  # glue(f"name_{i}", ...)
    missing = sorted(
        k
        for k in used
        if k not in literal and not any(k.startswith(p) for p in prefixes)
    )
    assert not missing, (
        f"{path.name}: the prose shows glued names the code never glues: {missing}"
    )


def _myst_tokens(text):
    """Tokens of a markdown cell as MyST parses it with the book's extensions."""
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    config = MdParserConfig(
        enable_extensions=set(CONFIG["parse"]["myst_enable_extensions"])
    )
    stack = list(create_md_parser(config, RendererHTML).parse(text))
    while stack:
        tok = stack.pop()
        yield tok
        stack.extend(tok.children or [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_math_delimiters_pair_up_as_myst_reads_them(path):
    """A line that starts with "+ " or "- " inside inline math begins a markdown list and
    breaks the paragraph; a "$$" glued to a text line pairs with the wrong "$". Either way prose
    (and glue roles) ends up inside math, where MathJax shows it as TeX or fails."""
    nb = nbformat.read(path, as_version=4)
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for tok in _myst_tokens(cell.source):
            if tok.type.startswith("math") and (
                "{glue" in tok.content or "`" in tok.content
            ):
                bad.append(f"cell {i}: {tok.content[:80]!r}")
    assert not bad, "prose parsed as math:\n" + "\n".join(bad)
