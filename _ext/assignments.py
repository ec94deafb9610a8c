"""Student notebooks with nbgrader: ``python _ext/assignments.py book _build/assignments``.

``make assignments`` runs this. ``OUT`` becomes an nbgrader course directory: for every chapter
``book/NN_name.ipynb`` it writes the instructor's version ``source/NN_name/NN_name.ipynb`` and
runs ``nbgrader generate_assignment NN_name``, which writes the student version
``release/NN_name/NN_name.ipynb`` (and records the assignment in ``gradebook.db``).

The chapters are nbgrader source notebooks (``_ext/nbgrader_source.py`` adds the metadata and
the ``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers; a chapter not converted yet is
converted on the fly, in the copy). nbgrader replaces the marked solutions by stubs, keeps the
autograded self-check cells locked, and turns written answers into ``YOUR ANSWER HERE``. This
module adds only what nbgrader lacks:

* code cells tagged ``remove-cell`` (the instructor's hidden checks of written solutions: they
  read the solutions' names and never appear on the website) are dropped;
* ``{solution}`` blocks outside nbgrader's regions (the prose explaining a self-checked code
  solution) are removed, and a markdown cell left empty is dropped;
* a note under the title tells the student what is theirs to do.

nbgrader is needed only here and in the tests (``requirements.txt``), not by ``localbook``.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nbgrader_source import MARKER, SOLUTION_FENCE, convert_notebook, _block_end  # noqa: E402

__all__ = ["strip_solution_markdown", "source_notebook", "build_course", "main"]

NOTE_ID = "student-note"
# plain Markdown (a blockquote), so it reads the same in Jupyter, Colab and the book
NOTE = (
    "> **Student version.** Solutions are removed: complete the cells that say `# YOUR CODE HERE` "
    "(replace `raise NotImplementedError()`) and write your answers where it says "
    "`YOUR ANSWER HERE`. Cells calling `lb.check` test your function on fresh random cases and "
    "print a hint when something is off; they are the autograder's tests, so leave them as they "
    "are."
)


def strip_solution_markdown(source: str) -> str:
    """Remove the ``{solution}`` blocks that are not inside an nbgrader solution region."""
    lines, out, i, in_region = source.split("\n"), [], 0, False
    while i < len(lines):
        line = lines[i]
        if MARKER.match(line):
            in_region = "BEGIN" in line
        m = None if in_region else SOLUTION_FENCE.match(line)
        if m:
            i = _block_end(lines, i, m.group("fence")) + 1
            continue
        out.append(line)
        i += 1
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


def source_notebook(nb):
    """The nbgrader source of a chapter (an ``nbformat`` notebook; a converted copy is returned)."""
    import nbformat

    nb = copy.deepcopy(nb)
    convert_notebook(nb)  # a no-op on a converted chapter
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            if "remove-cell" in cell.metadata.get("tags", []):
                continue
            cell.outputs, cell.execution_count = [], None
        elif cell.cell_type == "markdown":
            cell.source = strip_solution_markdown(cell.source)
            if not cell.source.strip() and "nbgrader" not in cell.metadata:
                continue
        cells.append(cell)
    title = (
        bool(cells)
        and cells[0].cell_type == "markdown"
        and cells[0].source.lstrip().startswith("#")
    )
    if not any(c.get("id") == NOTE_ID for c in cells):
        note = nbformat.v4.new_markdown_cell(NOTE)
        note["id"] = NOTE_ID
        cells.insert(1 if title else 0, note)
    nb.cells = cells
    return nb


def _generate(course: Path, name: str) -> Tuple[bool, str]:
    """``nbgrader generate_assignment NAME --force`` in ``course`` (in-process: nbgrader's API)."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    c = Config()
    c.CourseDirectory.root = str(course)
    path = os.environ.get("PATH", "")
    # a new gradebook is made by running ``alembic``, a script next to this Python
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])
    try:
        result = NbGraderAPI(config=c).generate_assignment(
            name, force=True, create=True
        )
    finally:
        os.environ["PATH"] = path
    return bool(result["success"]), result.get("log", "") + result.get("error", "")


def build_course(
    book_dir, course_dir, chapters: Optional[Iterable[str]] = None
) -> List[Path]:
    """Write ``source/`` and the nbgrader ``release/`` of every chapter (or of the ``chapters``
    named by stem); returns the release notebooks' paths."""
    import nbformat

    book_dir, course = Path(book_dir), Path(course_dir).resolve()
    paths = sorted(book_dir.glob("[0-9][0-9]*_*.ipynb"))
    if chapters is not None:
        wanted = set(chapters)
        paths = [p for p in paths if p.stem in wanted]
    released = []
    for path in paths:
        name = path.stem
        src = course / "source" / name / path.name
        src.parent.mkdir(parents=True, exist_ok=True)
        nb = source_notebook(nbformat.read(path, as_version=4))
        nbformat.validate(nb)
        nbformat.write(nb, src)
        ok, log = _generate(course, name)
        target = course / "release" / name / path.name
        if not ok or not target.exists():
            raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{log}")
        released.append(target)
    return released


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(
            "usage: python _ext/assignments.py BOOK_DIR COURSE_DIR [CHAPTER ...]",
            file=sys.stderr,
        )
        return 2
    for p in build_course(argv[0], argv[1], argv[2:] or None):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
