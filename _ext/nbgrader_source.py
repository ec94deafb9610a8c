"""Make chapters nbgrader *source* notebooks: ``python _ext/nbgrader_source.py book/*.ipynb``.

Idempotent (a cell that already carries ``metadata.nbgrader`` is left as it is) and safe on any
chapter (one without exercises or self-checks is left unchanged). Only metadata and marker lines
are added; the one exception is a self-check call, which becomes ``assert lb.check....(fn)``.

* **Code solutions** (code cells tagged ``solution``) become nbgrader solution cells. Each
  top-level function (and each method of a top-level class) keeps its ``def`` line(s) and
  docstring; its body is wrapped in ``### BEGIN SOLUTION`` / ``### END SOLUTION``, which
  ``nbgrader generate_assignment`` replaces by ``# YOUR CODE HERE`` / ``raise
  NotImplementedError()``. Every other run of top-level statements (not imports, not
  ``lb.check`` calls) is a region of its own; a cell Python cannot parse is one region.
* **Self-checks**: the code cell right after a solution cell (cells tagged ``remove-cell`` in
  between are skipped) that calls ``lb.check.<chapter>.<name>(fn)`` becomes an autograded test
  cell (``grade``, ``locked``, :data:`CHECK_POINTS` points). nbgrader scores a test cell by
  whether it *raises*, in a plain kernel where the checks are friendly (they print a hint and
  return ``False``), so each call becomes ``assert lb.check....(fn)``: students still read the
  hint, and a wrong or missing answer fails the cell.
* **Written answers**: a ``{solution}`` block of an exercise that no self-check grades is
  wrapped in ``### BEGIN SOLUTION`` / ``### END SOLUTION`` lines, and its markdown cell becomes
  a manually graded answer cell (:data:`WRITTEN_POINTS` points); the release shows
  ``YOUR ANSWER HERE`` there. The prose explaining a self-checked code solution is not a
  written answer: ``_ext/assignments.py`` removes it before nbgrader runs, as it removes the
  hidden instructor checks (code cells tagged ``remove-cell``).

The website hides the marker lines (``_ext/localbook_sphinx.py``), so pages render as before.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

SCHEMA_VERSION = 3
CHECK_POINTS = 1
WRITTEN_POINTS = 1
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MARKER = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
# nbgrader itself treats any line *containing* these words as a marker
NBGRADER_MARKER = re.compile(r"(BEGIN|END) SOLUTION")
SOLUTION_FENCE = re.compile(
    r"^(?P<indent>\s*)(?P<fence>`{3,}|:{3,})\s*\{solution\}\s*(?P<label>\S*)"
)
EXERCISE_LABEL = re.compile(r"^\s*:label:\s*(?P<label>\S+)")
CHECK_CALL = re.compile(r"(?:^|\.)check\.\w+\.\w+$")

__all__ = ["convert_notebook", "convert_path", "code_regions", "is_check_call", "main"]


# --- code cells ------------------------------------------------------------------------------
def _tags(cell) -> List[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def is_check_call(stmt: ast.stmt) -> bool:
    """A statement ``<...>.check.<chapter>.<name>(...)`` (a self-check call, its value unused)."""
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and bool(CHECK_CALL.search(ast.unparse(stmt.value.func)))
    )


def _docstring(node) -> Optional[ast.stmt]:
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first
    return None


def _header_end(lines: List[str], node) -> int:
    """1-based line of the ``:`` that ends the header of a ``def``/``class``."""
    text = "\n".join(lines[node.lineno - 1 :]) + "\n"
    depth, seen = 0, False
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string in ("def", "class"):
                seen = True
            elif tok.type == tokenize.OP and seen:
                if tok.string in "([{":
                    depth += 1
                elif tok.string in ")]}":
                    depth -= 1
                elif tok.string == ":" and depth == 0:
                    return node.lineno + tok.start[0] - 1
    except tokenize.TokenError:
        pass
    return node.body[0].lineno


Region = Tuple[int, int, str]  # first and last 1-based line, indentation of the markers


def _body_region(lines: List[str], node) -> Optional[Region]:
    """The lines of a function body after its docstring, or None (nothing to hide)."""
    doc = _docstring(node)
    body = node.body[1:] if doc is not None else node.body
    if not body:
        return None
    after = doc.end_lineno if doc is not None else _header_end(lines, node)
    first, last = body[0].lineno, max(s.end_lineno for s in body)
    if (
        first <= after
    ):  # ``def f(x): return x`` or code on the docstring's line: not splittable
        raise ValueError("body shares a line with the header")
    indent = re.match(r"\s*", lines[first - 1]).group(0)
    return _extend(lines, first, last, indent, floor=after)


def _start(stmt) -> int:
    return min([d.lineno for d in getattr(stmt, "decorator_list", [])] + [stmt.lineno])


def _is_comment(line: str, indent: str) -> bool:
    return line.strip().startswith("#") and line.startswith(indent)


def _extend(
    lines: List[str], first: int, last: int, indent: str, floor: int = 0
) -> Region:
    """Take in the comment lines right above a region, and those after it up to a dedent or
    the end of the cell (comments explain the solution)."""
    while first - 1 > floor and _is_comment(lines[first - 2], indent):
        first -= 1
    j = last
    while j < len(lines) and (not lines[j].strip() or _is_comment(lines[j], indent)):
        j += 1
    if j == len(lines) or (indent and not lines[j].startswith(indent)):
        while last < j and (
            _is_comment(lines[last], indent)
            or (not lines[last].strip() and any(l.strip() for l in lines[last:j]))
        ):
            last += 1
    return (first, last, indent)


def _block_regions(lines: List[str], stmts, top: bool) -> List[Region]:
    """Regions of a module (``top``) or class body: definitions keep their headers."""
    regions: List[Region] = []
    run: List[ast.stmt] = []

    def flush():
        if run:
            first = min(_start(s) for s in run)
            indent = re.match(r"\s*", lines[first - 1]).group(0)
            regions.append(
                _extend(lines, first, max(s.end_lineno for s in run), indent)
            )
            run.clear()

    for i, stmt in enumerate(stmts):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            flush()
            try:
                r = _body_region(lines, stmt)
            except ValueError:
                run.append(stmt)  # hide the whole definition
                continue
            if r:
                regions.append(r)
        elif isinstance(stmt, ast.ClassDef):
            flush()
            doc = _docstring(stmt)
            inner = stmt.body[1:] if doc is not None else stmt.body
            if inner and inner[0].lineno <= (
                doc.end_lineno if doc else _header_end(lines, stmt)
            ):
                run.append(stmt)
                continue
            regions += _block_regions(lines, inner, top=False)
        elif top and (
            isinstance(stmt, (ast.Import, ast.ImportFrom)) or is_check_call(stmt)
        ):
            flush()
        else:
            run.append(stmt)
    flush()
    return regions


def code_regions(source: str) -> List[Region]:
    """Where the markers go in a code solution (see the module docstring)."""
    lines = source.split("\n")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    if tree is None:
        body = [i + 1 for i, line in enumerate(lines) if line.strip()]
        return [(body[0], body[-1], "")] if body else []
    out: List[Region] = []
    for first, last, indent in sorted(_block_regions(lines, tree.body, top=True)):
        if out and first <= out[-1][1]:  # a comment both regions claimed
            first = out[-1][1] + 1
        out.append((first, last, indent))
    return out


def wrap_code(source: str) -> str:
    lines = source.split("\n")
    regions = code_regions(source)
    if not regions:
        return source
    for first, last, indent in sorted(regions, reverse=True):
        lines[last:last] = [indent + END]
        lines[first - 1 : first - 1] = [indent + BEGIN]
    return "\n".join(lines)


def assert_checks(source: str) -> str:
    """``lb.check.chNN.name(fn);`` → ``assert lb.check.chNN.name(fn)`` (top-level calls)."""
    tree = ast.parse(source)
    lines = source.split("\n")
    for stmt in sorted(
        (s for s in tree.body if is_check_call(s)), key=lambda s: -s.lineno
    ):
        first, last = stmt.lineno - 1, stmt.end_lineno - 1
        end = lines[last].encode()  # ast's column offsets count UTF-8 bytes
        rest = re.sub(
            r"^\s*;", "", end[stmt.end_col_offset :].decode()
        )  # ";" hid True/False
        lines[last] = end[: stmt.end_col_offset].decode() + (
            "  " + rest.strip() if rest.strip() else ""
        )
        start = lines[first].encode()
        lines[first] = (
            start[: stmt.col_offset] + b"assert " + start[stmt.col_offset :]
        ).decode()
    return "\n".join(lines)


# --- markdown cells --------------------------------------------------------------------------
def _block_end(lines: List[str], i: int, fence: str) -> int:
    """Index of the line closing the fenced block opened at line ``i``."""
    close = re.compile(
        r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$"
    )
    for j in range(i + 1, len(lines)):
        if close.match(lines[j]):
            return j
    return len(lines) - 1


def solution_blocks(source: str) -> List[Tuple[int, int, str]]:
    """``(first, last, label)`` of each ``{solution}`` block (0-based line indices)."""
    lines, out, i = source.split("\n"), [], 0
    while i < len(lines):
        m = SOLUTION_FENCE.match(lines[i])
        if m:
            j = _block_end(lines, i, m.group("fence"))
            out.append((i, j, m.group("label")))
            i = j + 1
        else:
            i += 1
    return out


def _in_region(lines: List[str], i: int) -> bool:
    depth = 0
    for line in lines[:i]:
        if MARKER.match(line):
            depth = 1 if "BEGIN" in line else 0
    return depth == 1


def wrap_markdown(source: str, keep_last: bool) -> Tuple[str, List[str]]:
    """Wrap the ``{solution}`` blocks of a markdown cell (not the last one if ``keep_last``).

    Returns the new source and the labels of the wrapped blocks.
    """
    lines = source.split("\n")
    blocks = [b for b in solution_blocks(source) if not _in_region(lines, b[0])]
    if keep_last and blocks:
        blocks = blocks[:-1]
    for first, last, _ in reversed(blocks):
        lines[last + 1 : last + 1] = [END]
        lines[first:first] = [BEGIN]
    return "\n".join(lines), [b[2] for b in blocks]


# --- the notebook ----------------------------------------------------------------------------
def _meta(
    grade_id: str, *, solution: bool, grade: bool, locked: bool, points=None
) -> Dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": SCHEMA_VERSION,
        "solution": solution,
        "task": False,
    }
    if grade:
        meta["points"] = points
    return meta


def _is_self_check_cell(cell) -> bool:
    if (
        cell.get("cell_type") != "code"
        or "solution" in _tags(cell)
        or "remove-cell" in _tags(cell)
    ):
        return False
    try:
        tree = ast.parse(cell["source"])
    except SyntaxError:
        return False
    return any(
        is_check_call(s)
        or (isinstance(s, ast.Assert) and is_check_call(ast.Expr(value=s.test)))
        for s in tree.body
    )


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def convert_notebook(nb) -> int:
    """Convert an ``nbformat`` notebook in place (see the module docstring); returns the number
    of cells changed."""
    cells = nb.cells
    for c in cells:
        c["source"] = _src(c)
    used: Set[str] = {
        c.metadata["nbgrader"]["grade_id"]
        for c in cells
        if "nbgrader" in c.get("metadata", {}) and "grade_id" in c.metadata["nbgrader"]
    }

    def new_id(base: str) -> str:
        gid, k = base, 2
        while gid in used:
            gid, k = f"{base}-{k}", k + 1
        used.add(gid)
        return gid

    # which cells are self-checks of a solution, and which exercise each cell belongs to
    label, labels, checks, last_code = None, [], set(), None
    for i, c in enumerate(cells):
        if c.cell_type == "markdown":
            for line in c.source.split("\n"):
                m = EXERCISE_LABEL.match(line)
                if m:
                    label = m.group("label")
        labels.append(label)
        if c.cell_type == "code" and "remove-cell" not in _tags(c):
            if (
                last_code is not None
                and "solution" in _tags(cells[last_code])
                and _is_self_check_cell(c)
            ):
                checks.add(i)
            last_code = i
    changed = 0
    for i, c in enumerate(cells):
        if "nbgrader" in c.metadata:
            continue
        base = labels[i] or f"cell-{c.get('id') or i}"
        if c.cell_type == "code" and "solution" in _tags(c):
            if not any(MARKER.match(line) for line in c.source.split("\n")):
                c.source = wrap_code(c.source)
            if any(MARKER.match(line) for line in c.source.split("\n")):
                c.metadata["nbgrader"] = _meta(
                    new_id(f"{base}-code"), solution=True, grade=False, locked=False
                )
                changed += 1
        elif i in checks:
            c.source = assert_checks(c.source)
            c.metadata["nbgrader"] = _meta(
                new_id(f"{base}-check"),
                solution=False,
                grade=True,
                locked=True,
                points=CHECK_POINTS,
            )
            changed += 1
        elif c.cell_type == "markdown" and solution_blocks(c.source):
            # the last block belongs to the cell's last exercise: self-checked when a check
            # cell follows before the next exercise
            nxt = next(
                (
                    j
                    for j in range(i + 1, len(cells))
                    if cells[j].cell_type == "markdown"
                    and "{exercise}" in cells[j].source
                ),
                len(cells),
            )
            graded = any(j in checks for j in range(i + 1, nxt))
            c.source, wrapped = wrap_markdown(c.source, keep_last=graded)
            if wrapped or any(MARKER.match(line) for line in c.source.split("\n")):
                gid = new_id(f"{wrapped[0] if wrapped and wrapped[0] else base}-answer")
                c.metadata["nbgrader"] = _meta(
                    gid, solution=True, grade=True, locked=False, points=WRITTEN_POINTS
                )
                changed += 1
    return changed


def convert_path(path) -> int:
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    n = convert_notebook(nb)
    if n:
        nbformat.validate(nb)
        nbformat.write(nb, path)
    return n


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(
            "usage: python _ext/nbgrader_source.py NOTEBOOK.ipynb ...", file=sys.stderr
        )
        return 2
    for p in argv:
        n = convert_path(p)
        print(f"{p}: {n} cells converted" if n else f"{p}: nothing to convert")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
