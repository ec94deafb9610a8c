"""Every chapter opens with objectives, prerequisites and time and closes with a summary
(the format is in CONTRIBUTING.md, "Chapter frame"); the intro's reading map is drawn from them.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import chapter_frame  # noqa: E402

CHAPTERS = chapter_frame.chapter_stems(ROOT)


@pytest.mark.parametrize("number,stem", CHAPTERS, ids=[s for _, s in CHAPTERS])
def test_chapter_has_objectives_prerequisites_time_and_summary(number, stem):
    frame = chapter_frame.read_frame(ROOT / "book" / f"{stem}.ipynb")
    assert frame["problems"] == [], stem
    for text in frame["objectives"]:
        assert text.split()[0].islower(), (
            f"an objective starts with a verb: {text[:50]!r}"
        )
    earlier = {s for n, s in CHAPTERS if n < number}
    assert set(frame["builds_on"]) <= earlier, "prerequisites come earlier in the book"
    if number > 1:
        assert frame["builds_on"], (
            "every chapter after the first builds on an earlier one"
        )
    assert 20 <= frame["minutes"] <= 8 * 60, frame["time"]


def test_parser_reports_a_missing_frame(tmp_path):
    import json

    nb = {
        "cells": [{"cell_type": "markdown", "source": ["# T"], "metadata": {}}] * 2,
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    problems = chapter_frame.read_frame(path)["problems"]
    assert any("admonition" in p for p in problems)
    assert any("Summary" in p for p in problems)


def test_reading_map_is_drawn_from_the_builds_on_lines(tmp_path):
    nodes, edges = chapter_frame.draw_reading_map(ROOT, tmp_path / "map")
    assert [n for n, _, _ in nodes] == list(range(1, len(CHAPTERS) + 1))
    for stem in (s for _, s in CHAPTERS):
        deps = chapter_frame.read_frame(ROOT / "book" / f"{stem}.ipynb")["builds_on"]
        assert {a for a, b in edges if b == stem} == {Path(d).name for d in deps}
    svg = (tmp_path / "map.svg").read_text()
    assert svg.count("<svg") == 1 and (tmp_path / "map.png").stat().st_size > 1000


def test_transitive_reduction_drops_only_implied_edges():
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("a", "d"), ("e", "d")]
    kept = chapter_frame.transitive_reduction(edges)
    assert sorted(kept) == [("a", "b"), ("b", "c"), ("c", "d"), ("e", "d")]
