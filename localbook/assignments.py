"""Student notebooks: the chapters with their solutions taken out.

``python -m localbook.assignments book _build/assignments`` (``make assignments``) writes one
``NN_name.ipynb`` per chapter ``book/NN_name.ipynb`` in which

* every code cell tagged ``solution`` becomes a stub: each top-level function (or class) keeps
  its ``def`` line(s) and docstring and gets the body ``# your code here`` /
  ``raise NotImplementedError``; other top-level code is dropped, except imports and self-check
  calls (``lb.check...``), which stay; a cell without a function becomes
  ``# your code here`` / ``raise NotImplementedError``;
* every ``{solution}`` block (and every ``{solution-start}`` … ``{solution-end}`` region) is removed
  from the markdown, and a markdown cell left empty is dropped;
* code cells tagged ``remove-cell`` (the instructor's hidden checks of a written solution, which
  read the solution's names and are never shown on the website) are dropped;
* self-check cells and everything else are kept, outputs and execution counts are cleared, and a
  note under the title says what the student's part is.

Stub cells are tagged ``student-stub`` (instead of ``solution``) so tests can find them.
"""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import List, Optional, Tuple

__all__ = ["stub_code", "strip_solution_markdown", "make_student_notebook", "build_assignments"]

STUB_BODY = ["# your code here", "raise NotImplementedError"]
STUB_TAG = "student-stub"
# plain Markdown (a blockquote), so it reads the same in Jupyter, Colab and the book
NOTE = (
    "> **Student version.** Solutions are removed: cells that say `# your code here` are yours to "
    "complete (replace `raise NotImplementedError`). Cells calling `lb.check` test your answer on "
    "fresh random cases and print a hint when something is off."
)

_FENCE_OPEN = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|:{3,})\s*\{(?P<name>solution(?:-start|-end)?)\}")


def _header_end_line(lines: List[str], node: ast.AST) -> int:
    """1-based line holding the ``:`` that ends the ``def``/``class`` header of ``node``."""
    start = node.lineno
    text = "\n".join(lines[start - 1 :]) + "\n"
    depth = 0
    seen_kw = False
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string in ("def", "class"):
                seen_kw = True
            elif tok.type == tokenize.OP and seen_kw:
                if tok.string in "([{":
                    depth += 1
                elif tok.string in ")]}":
                    depth -= 1
                elif tok.string == ":" and depth == 0:
                    return start + tok.start[0] - 1
    except tokenize.TokenError:
        pass
    return node.body[0].lineno  # pragma: no cover


def _docstring_node(node) -> Optional[ast.Expr]:
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _stub_def(lines: List[str], node) -> List[str]:
    """The stub of one function or class definition, with its original header and docstring."""
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    end = _header_end_line(lines, node)
    indent = " " * (node.col_offset + 4)
    head = lines[start - 1 : end]
    last = head[-1]
    colon = _colon_index(last)
    if colon is not None and last[colon + 1 :].strip() and not last[colon + 1 :].strip().startswith("#"):
        head[-1] = last[: colon + 1]  # a one-line ``def f(x): return x``
    out = list(head)
    doc = _docstring_node(node)
    if doc is not None and doc.lineno > end:
        out += lines[doc.lineno - 1 : doc.end_lineno]
    elif doc is not None:  # docstring on the header line: re-emit it
        out.append(indent + repr(doc.value.value))
    if isinstance(node, ast.ClassDef):
        methods = [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for m in methods:
            out += [""] + _stub_def(lines, m)
        if not methods:
            out += [indent + s for s in STUB_BODY]
    else:
        out += [indent + s for s in STUB_BODY]
    return out


def _colon_index(line: str) -> Optional[int]:
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except tokenize.TokenError:
        return None
    depth, offset = 0, len(line) - len(line.lstrip())
    for tok in toks:
        if tok.type == tokenize.OP:
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            elif tok.string == ":" and depth == 0:
                return offset + tok.start[1]
    return None


def _is_self_check(stmt: ast.stmt) -> bool:
    """A top-level statement that calls ``...check.chNN.<name>(...)`` (kept in the stub)."""
    src = ast.unparse(stmt)
    return bool(re.search(r"\bcheck\.ch\d+\.\w+\(", src))


def stub_code(source: str) -> str:
    """Replace a solution cell's code by stubs: signatures and docstrings kept, bodies removed."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    lines = source.splitlines()
    out: List[str] = []
    defs = 0
    if tree is not None:
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if out:
                    out += [""] if defs == 0 else ["", ""]
                out += _stub_def(lines, stmt)
                defs += 1
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                out += lines[stmt.lineno - 1 : stmt.end_lineno]  # decorators and hints may need them
            elif _is_self_check(stmt):
                out += ["", ""] + lines[stmt.lineno - 1 : stmt.end_lineno]
    if not defs:
        out = STUB_BODY + ([""] + out if out else [])
    while out and not out[0].strip():
        out.pop(0)
    return "\n".join(out)


def strip_solution_markdown(source: str, in_gated: bool = False) -> Tuple[str, bool]:
    """Remove ``{solution}`` blocks and gated ``{solution-start}``…``{solution-end}`` text.

    Returns the remaining markdown and whether a gated region is still open at the end of it.
    """
    lines = source.splitlines()
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE_OPEN.match(line)
        if in_gated:
            if m and m.group("name") == "solution-end":
                in_gated = False
                i = _skip_block(lines, i, m.group("fence"))
            else:
                i += 1
            continue
        if m and m.group("name") == "solution":
            i = _skip_block(lines, i, m.group("fence"))
            continue
        if m and m.group("name") == "solution-start":
            in_gated = True
            i = _skip_block(lines, i, m.group("fence"))
            continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    return text, in_gated


def _skip_block(lines: List[str], i: int, fence: str) -> int:
    """Index after the fenced block opening at line ``i`` (closing: the fence char, ≥ as many)."""
    char, count = fence[0], len(fence)
    close = re.compile(r"^\s*" + re.escape(char) + "{" + str(count) + r",}\s*$")
    j = i + 1
    while j < len(lines):
        if close.match(lines[j]):
            return j + 1
        j += 1
    return j


def make_student_notebook(nb):
    """A student copy of the notebook object ``nb`` (an ``nbformat`` notebook), see the module doc."""
    import copy

    import nbformat

    nb = copy.deepcopy(nb)
    cells = []
    gated = False
    for cell in nb.cells:
        tags = list(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "markdown":
            text, gated_after = strip_solution_markdown(cell.source, gated)
            gated = gated_after
            if not text.strip():
                continue
            cell.source = text
        elif cell.cell_type == "code":
            if "remove-cell" in tags:
                continue  # a hidden check of a solution: it reads names only the solution defines
            if "solution" in tags or gated:
                cell.source = stub_code(cell.source)
                cell.metadata["tags"] = [t for t in tags if t != "solution"] + [STUB_TAG]
            cell.outputs = []
            cell.execution_count = None
        cells.append(cell)
    # the note goes right under the title cell
    note = nbformat.v4.new_markdown_cell(NOTE)
    note["id"] = "student-note"
    pos = 1 if cells and cells[0].cell_type == "markdown" and cells[0].source.lstrip().startswith("#") else 0
    cells.insert(pos, note)
    nb.cells = cells
    nb.metadata.setdefault("localbook", {})["student"] = True
    for c in nb.cells:
        c.get("metadata", {}).pop("execution", None)
    return nb


def build_assignments(book_dir, out_dir) -> List[Path]:
    """Write a student notebook for every chapter ``NN_*.ipynb`` in ``book_dir``; return their paths."""
    import nbformat

    book_dir, out_dir = Path(book_dir), Path(out_dir)
    chapters = sorted(p for p in book_dir.glob("[0-9][0-9]_*.ipynb"))
    if not chapters:
        raise FileNotFoundError(f"no chapter notebooks (NN_name.ipynb) in {book_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in chapters:
        nb = nbformat.read(path, as_version=4)
        student = make_student_notebook(nb)
        nbformat.validate(student)
        target = out_dir / path.name
        nbformat.write(student, target)
        written.append(target)
    return written


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m localbook.assignments BOOK_DIR OUT_DIR", file=sys.stderr)
        return 2
    for p in build_assignments(argv[0], argv[1]):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
