"""One numbering across the book: a chapter's place in ``_toc.yml`` is its number, and its file,
exercise labels, self-check module, assignment and title follow it (so that "exercise 4.2" on a
syllabus is found under that name in the book, the student notebook, the check and the grader).
"""

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import chapter_frame  # noqa: E402


def chapters():
    """``[(number, stem)]`` of the numbered parts of _toc.yml, in order."""
    return chapter_frame.chapter_stems(ROOT)


def _text(stem):
    nb = json.loads((ROOT / "book" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    return nb, ["".join(c["source"]) for c in nb["cells"]]


def test_twelve_numbered_chapters_and_unnumbered_appendices():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    assert len(chapters()) == 12
    appendix = [p for p in toc["parts"] if not p.get("numbered")]
    assert [p["caption"] for p in appendix] == ["Appendices"]


@pytest.mark.parametrize("number,stem", chapters())
def test_file_labels_checks_and_title_follow_the_chapter_number(number, stem):
    assert stem.startswith(f"{number:02d}_"), stem
    nb, sources = _text(stem)
    text = "\n".join(sources)
    labels = re.findall(r":label: (\S+)", text)
    exercises = [lab for lab in labels if "ex-" in lab]
    assert exercises, f"{stem} has no exercises"
    assert all(lab.startswith(f"ex-{number:02d}-") for lab in exercises), exercises
    # every numbered label the chapter defines (theorems, sections, figures, ...) and every
    # MyST target carries the chapter's number: "Theorem 9.2" is thm-09-*, not thm-07-*
    targets = re.findall(r"^\((\S+)\)=", text, flags=re.M)
    numbered = [lab for lab in labels + targets if re.match(r"[a-z]+-\d\d[a-z]?-", lab)]
    wrong = [lab for lab in numbered if lab.split("-")[1][:2] != f"{number:02d}"]
    assert not wrong, f"{stem} defines labels numbered for another chapter: {wrong}"
    checks = set(re.findall(r"lb\.check\.(\w+)\.", text))
    assert checks <= {f"ch{number:02d}"}, checks
    # the table of contents numbers the title; a hand-written number would show twice
    title = next(
        s for c, s in zip(nb["cells"], sources) if c["cell_type"] == "markdown"
    )
    assert re.match(r"# [^\d]", title), title.splitlines()[0]


def test_every_check_module_belongs_to_the_chapter_of_its_number():
    numbers = {f"ch{n:02d}": (n, stem) for n, stem in chapters()}
    modules = sorted(p.stem for p in (ROOT / "localbook" / "check").glob("ch*.py"))
    assert set(modules) <= set(numbers), modules
    for module in modules:
        n, stem = numbers[module]
        first = (
            (ROOT / "localbook" / "check" / f"{module}.py").read_text().splitlines()[0]
        )
        assert f"chapter {n} " in first, (module, first)
        assert f"lb.check.{module}." in "\n".join(_text(stem)[1]), (module, stem)


def test_old_pages_redirect_to_existing_chapters():
    spec = importlib.util.spec_from_file_location(
        "localbook_sphinx_numbering", ROOT / "_ext" / "localbook_sphinx.py"
    )
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    stems = {stem for _, stem in chapters()}
    assert set(ext.REDIRECTS.values()) <= stems
    assert not set(ext.REDIRECTS) & stems
    assert all(not (ROOT / "book" / f"{old}.ipynb").exists() for old in ext.REDIRECTS)


def test_nbval_schedule_names_every_chapter():
    """book/conftest.py orders the chapters longest first for `make nbval`: a renamed chapter
    would silently lose its place in the table (it would run first, not fail)."""
    tree = ast.parse((ROOT / "book" / "conftest.py").read_text(encoding="utf-8"))
    [table] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["SECONDS"]
    ]
    assert set(ast.literal_eval(table)) == {stem for _, stem in chapters()}
