"""The course plan and the grading table of ``book/teaching.md`` agree with the chapters.

* The per-chapter table of *The grading scheme* (exercises, autograded, free-form, points) is
  recomputed from the notebooks: the ``{exercise}`` labels, the nbgrader cells
  (``_ext/nbgrader_source.py``: an autograded test cell per self-check, a manually graded answer
  cell per written answer, each with its points) and, independently, the exercise table of the
  book (``chapter_exercises`` of ``_ext/localbook_sphinx.py``: the ``lb.check`` call after an
  exercise). An exercise is autograded when an autograded cell belongs to it.
* Both semester plans (12 and 14 weeks) number their weeks 1..N, assign every chapter of
  ``_toc.yml`` exactly once, under its nbgrader assignment name, and never before a chapter it
  builds on (the **Builds on** line of the chapter frame, ``_ext/chapter_frame.py``, where the
  chapter has one).
"""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ROOT / "book" / "teaching.md"
sys.path.insert(0, str(ROOT / "_ext"))

EXERCISE = re.compile(r"^(?:`{3,}|:{3,})\{exercise\}")
LABEL = re.compile(r"^:label:\s*(\S+)")
CHECK = re.compile(r"\blb\.check\.ch\d+\.\w+\(|\blocalbook\.check\.ch\d+\.\w+\(")


def chapters():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [
        c["file"] for part in toc.get("parts", []) for c in part.get("chapters", [])
    ]
    return [f.split("/")[-1] for f in files if re.match(r"book/\d\d_", f)]


def grading(stem):
    """Exercises and points of one chapter, from its notebook's nbgrader cells."""
    cells = json.loads((ROOT / "book" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    labels, auto, checked, label = [], set(), set(), None
    points = {"auto": 0, "hand": 0}
    for c in cells["cells"]:
        text = "".join(c["source"])
        if c["cell_type"] == "markdown":
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if EXERCISE.match(line.strip()):
                    found = [
                        m.group(1) for m in map(LABEL.match, lines[i + 1 : i + 6]) if m
                    ]
                    assert found, f"{stem}: an exercise without a :label:"
                    label = found[0]
                    labels.append(label)
        g = c["metadata"].get("nbgrader", {})
        if g.get("grade"):
            assert label, f"{stem}: a graded cell before the first exercise"
            if g.get("solution"):
                points["hand"] += g["points"]
            else:
                points["auto"] += g["points"]
                auto.add(label)
                assert CHECK.search(text), (
                    f"{stem}: autograded cell {g['grade_id']} calls no lb.check"
                )
        elif c["cell_type"] == "code" and label and CHECK.search(text):
            checked.add(label)  # a self-check that nbgrader does not grade
    return labels, auto, checked, points


def table(heading_regex):
    """The rows (lists of cell texts) of the first table after a heading or bold line."""
    text = TEACHING.read_text(encoding="utf-8")
    m = re.search(heading_regex, text, re.M)
    assert m, f"no {heading_regex!r} in teaching.md"
    rows = []
    for line in text[m.end() :].splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table after {heading_regex!r}"
    return rows[0], rows[2:]  # header, body (without the --- line)


def doc_stem(cell):
    m = re.fullmatch(r"\{doc\}`(?:[^`<]*<)?(\d\d_\w+)>?`", cell)
    return m.group(1) if m else None


def test_grading_table_matches_the_notebooks():
    header, body = table(r"^## The grading scheme")
    assert header == [
        "chapter",
        "exercises",
        "autograded",
        "free-form",
        "points autograded",
        "points by hand",
    ]
    rows = {doc_stem(r[0]): [int(x) for x in r[1:]] for r in body if doc_stem(r[0])}
    assert list(rows) == chapters(), "one row per chapter, in the order of _toc.yml"
    total = [0] * 5
    for stem in chapters():
        labels, auto, checked, points = grading(stem)
        assert not checked, f"{stem}: self-checks nbgrader does not grade: {checked}"
        want = [
            len(labels),
            len(auto),
            len(labels) - len(auto),
            points["auto"],
            points["hand"],
        ]
        assert rows[stem] == want, (
            f"{stem}: teaching.md says {rows[stem]}, the notebook has {want} "
            "(exercises, autograded, free-form, points autograded, points by hand)"
        )
        total = [a + b for a, b in zip(total, want)]
    last = body[-1]
    assert last[0] == "all chapters" and [int(x) for x in last[1:]] == total


def test_autograded_exercises_are_the_self_checked_ones():
    """The book's exercise table (the ``lb.check`` call after an exercise) says the same."""
    from localbook_sphinx import chapter_exercises

    for stem in chapters():
        labels, auto, _, _ = grading(stem)
        _, exercises = chapter_exercises(ROOT / "book" / f"{stem}.ipynb")
        assert [e[0] for e in exercises] == labels, stem
        assert {e[0] for e in exercises if e[3]} == auto, stem
        assert all(re.fullmatch(rf"ex-{stem[:2]}-[\w-]+", label) for label in labels)


def plans():
    return {
        12: table(r"^\*\*12 weeks\*\*"),
        14: table(r"^\*\*14 weeks\*\*"),
    }


@pytest.mark.parametrize("weeks", [12, 14])
def test_plan_assigns_every_chapter_once(weeks):
    header, body = plans()[weeks]
    assert header == ["week", "chapter", "assignment"]
    assert [int(r[0]) for r in body] == list(range(1, weeks + 1))
    taught = [doc_stem(r[1]) for r in body if doc_stem(r[1])]
    assert sorted(taught) == sorted(chapters()), f"{weeks} weeks: {taught}"
    for r in body:
        if doc_stem(r[1]):
            assert r[2] == f"`{doc_stem(r[1])}`", f"week {r[0]}: assignment {r[2]}"


@pytest.mark.parametrize("weeks", [12, 14])
def test_plan_respects_builds_on(weeks):
    import chapter_frame

    _, body = plans()[weeks]
    week = {doc_stem(r[1]): int(r[0]) for r in body if doc_stem(r[1])}
    checked = 0
    for stem, w in week.items():
        for before in chapter_frame.read_frame(ROOT / "book" / f"{stem}.ipynb")[
            "builds_on"
        ]:
            before = before.split("/")[-1]
            if before in week:
                checked += 1
                assert week[before] < w, (
                    f"{weeks} weeks: {stem} (week {w}) builds on {before} "
                    f"(week {week[before]})"
                )
    if not checked:
        pytest.skip("no chapter has a Builds on line yet")
