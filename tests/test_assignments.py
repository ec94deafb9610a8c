"""Student notebooks (`make assignments`): stubs replace solution code, solution markdown is
gone, self-checks stay, outputs are cleared, nothing of the solutions leaks, and the student
notebook runs with the stubs' NotImplementedError as its only errors."""
import ast
import os
import sys
from pathlib import Path

import nbformat
import pytest

from localbook.assignments import STUB_TAG, build_assignments, make_student_notebook, strip_solution_markdown, stub_code

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))

SOLUTION_CODE = '''import torch

def weighted_mean(x_star: float, x: torch.Tensor,
                  y: torch.Tensor, h: float) -> float:
    """Kernel-weighted mean of y around x_star."""
    weights_secret = torch.exp(-0.5 * ((x_star - x) / h) ** 2)
    return float((weights_secret * y).sum() / weights_secret.sum())

print("solution value", weighted_mean(0.0, torch.linspace(-1, 1, 5), torch.ones(5), 1.0))
lb.check.ch01.local_constant_fit(weighted_mean)'''


def _synthetic_chapter():
    nb = nbformat.v4.new_notebook()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb.cells = [
        md("# 9. A synthetic chapter"),
        code("import localbook as lb\nimport torch"),
        md("## Exercises\n\n```{exercise} Weighted mean\n:label: ex-09-mean\nWrite it.\n```\n\n"
           "```{solution} ex-09-mean\n:class: dropdown\nThe secret answer is the normalized sum.\n```"),
        code(SOLUTION_CODE, metadata={"tags": ["solution"]}),
        code("lb.check.ch01.local_constant_fit(weighted_mean)"),
        md("````{solution} ex-09-other\n:class: dropdown\n```{math}\nsecret = 1\n```\nStill hidden text.\n````"),
        code("total_secret = 2 + 2\nassert total_secret == 4", metadata={"tags": ["solution"]}),
        md("```{solution-start} ex-09-gated\n```\nGated hidden prose.\n"),
        code("gated_secret = 1"),
        md("```{solution-end}\n```\nAfter the gate."),
        code("print('kept')"),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="old output")]
    nb.cells[1].execution_count = 3
    return nb


def _code_lines(src):
    """Body lines of a solution (not signatures, docstrings, imports or self-check calls)."""
    tree = ast.parse(src)
    keep = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            for stmt in body:
                keep.update(range(stmt.lineno, stmt.end_lineno + 1))
    for stmt in tree.body:
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            if "check.ch" not in ast.unparse(stmt):
                keep.update(range(stmt.lineno, stmt.end_lineno + 1))
    lines = src.splitlines()
    return [lines[i - 1].strip() for i in sorted(keep) if len(lines[i - 1].strip()) > 12]


def _solution_markdown_lines(nb):
    out, gated = [], False
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        kept, gated = strip_solution_markdown(cell.source, gated)
        kept_lines = set(kept.splitlines())
        out += [l for l in cell.source.splitlines() if l not in kept_lines and len(l.strip()) > 12
                and not l.lstrip().startswith((":class:", "```", ":::"))]
    return out


def _all_text(nb):
    return "\n".join(c.source for c in nb.cells)


def assert_clean(original, student):
    text = _all_text(student)
    # compared line by line: a solution line that is only a fragment of a longer public line
    # (e.g. ".fit_transform(A),") is not a leak
    student_lines = {l.strip() for l in text.splitlines()}
    # a line that the chapter also has outside its solutions is not a leak
    public = set()
    gated = False
    for cell in original.cells:
        if cell.cell_type == "markdown":
            kept, gated = strip_solution_markdown(cell.source, gated)
            public |= {l.strip() for l in kept.splitlines()}
        elif "solution" not in cell.get("metadata", {}).get("tags", []) and not gated:
            public |= {l.strip() for l in cell.source.splitlines()}
    for cell in original.cells:
        if cell.cell_type == "code" and "solution" in cell.get("metadata", {}).get("tags", []):
            for line in _code_lines(cell.source):
                if line not in public:
                    assert line not in student_lines, f"solution code leaks into the student notebook: {line!r}"
    for line in _solution_markdown_lines(original):
        if line.strip() not in public:
            assert line not in text, f"solution text leaks: {line!r}"
    assert "{solution" not in text
    for cell in student.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
            assert "solution" not in cell.metadata.get("tags", [])
    n_solution = sum("solution" in c.get("metadata", {}).get("tags", []) for c in original.cells)
    n_stub = sum(STUB_TAG in c.get("metadata", {}).get("tags", []) for c in student.cells)
    assert n_stub >= n_solution
    originals_checks = [c.source for c in original.cells if c.cell_type == "code" and "check.ch" in c.source
                        and "solution" not in c.get("metadata", {}).get("tags", [])]
    for src in originals_checks:  # self-check cells survive verbatim
        assert src in text


def run_student(path: Path, timeout=300):
    """Execute a student notebook as a student would (friendly checks); return [(cell, error)]."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env_before = dict(os.environ)
    os.environ["LOCALBOOK_CHECK_STRICT"] = "0"
    os.environ["LOCALBOOK_STATIC"] = "1"
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    errors = [(c, o) for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    return nb, errors


# --- fast unit tests of the transformation ---------------------------------------------------
def test_stub_keeps_signature_docstring_imports_and_checks():
    stub = stub_code(SOLUTION_CODE)
    assert stub.splitlines()[0] == "import torch"
    assert "def weighted_mean(x_star: float, x: torch.Tensor,\n                  y: torch.Tensor, h: float) -> float:" in stub
    assert '"""Kernel-weighted mean of y around x_star."""' in stub
    assert "    # your code here\n    raise NotImplementedError" in stub
    assert "weights_secret" not in stub and "solution value" not in stub
    assert stub.rstrip().endswith("lb.check.ch01.local_constant_fit(weighted_mean)")
    compile(stub, "<stub>", "exec")


def test_stub_of_plain_code_and_one_liners_and_classes():
    assert stub_code("x = 1\nprint(x)") == "# your code here\nraise NotImplementedError"
    s = stub_code("def f(x): return 2 * x")
    assert s == "def f(x):\n    # your code here\n    raise NotImplementedError"
    s = stub_code('class A:\n    """Doc."""\n    def m(self):\n        return 1\n')
    assert '"""Doc."""' in s and "def m(self):" in s and "return 1" not in s
    compile(s, "<stub>", "exec")


def test_solution_markdown_removed_exercise_kept():
    md = "```{exercise} T\n:label: ex\nDo it.\n```\n\n```{solution} ex\n:class: dropdown\nHidden.\n```\nAfter."
    text, gated = strip_solution_markdown(md)
    assert text == "```{exercise} T\n:label: ex\nDo it.\n```\n\nAfter." and not gated
    text, _ = strip_solution_markdown(":::{solution} ex\nHidden\n:::\nKept")
    assert text == "Kept"


def test_synthetic_chapter_is_clean(tmp_path):
    original = _synthetic_chapter()
    student = make_student_notebook(original)
    assert_clean(original, student)
    text = _all_text(student)
    assert "gated_secret" not in text and "Gated hidden prose" not in text and "After the gate." in text
    assert "print('kept')" in text and "Student version" in text
    assert student.cells[0].source.startswith("# 9.")  # the title stays first
    nbformat.validate(student)


@pytest.mark.slow
def test_synthetic_student_notebook_runs_with_only_stub_errors(tmp_path):
    (tmp_path / "book").mkdir()
    nbformat.write(_synthetic_chapter(), tmp_path / "book" / "09_synthetic.ipynb")
    [path] = build_assignments(tmp_path / "book", tmp_path / "out")
    nb, errors = run_student(path, timeout=120)
    assert errors, "the plain-code stub must raise NotImplementedError"
    for cell, err in errors:
        assert err.ename == "NotImplementedError" and STUB_TAG in cell.metadata.get("tags", []), (err.ename, cell.source)
    outs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "not implemented yet" in outs and "kept" in outs


# --- the real chapters -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    if not CHAPTERS:
        pytest.skip("no chapters in book/ yet")
    out = tmp_path_factory.mktemp("assignments")
    build_assignments(ROOT / "book", out)
    return out


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_student_notebook_is_clean(chapter, student_dir):
    original = nbformat.read(chapter, as_version=4)
    student = nbformat.read(student_dir / chapter.name, as_version=4)
    assert_clean(original, student)
    assert student.cells[0].source == original.cells[0].source


def _defined_names(tree):
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _top_level_defined(tree):
    """Names a cell defines at top level (what later cells can see)."""
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        else:
            names |= _defined_names(ast.Module(body=[stmt], type_ignores=[]))
    return names


def names_only_solutions_defined(student):
    """Names that kept cells read but only removed solution code defined (static, fast)."""
    import builtins

    defined, problems = set(dir(builtins)) | {"__name__", "__file__", "get_ipython", "display"}, []
    for cell in student.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse("\n".join(l for l in cell.source.splitlines() if not l.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        if STUB_TAG not in cell.metadata.get("tags", []):
            local = _defined_names(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in defined | local:
                    problems.append(f"{node.id!r} in: {cell.source.splitlines()[0][:70]}")
        defined |= _top_level_defined(tree)
    return sorted(set(problems))


def test_static_name_check_finds_a_dependency_on_a_solution():
    nb = _synthetic_chapter()
    nb.cells.append(nbformat.v4.new_code_cell("print(total_secret)"))
    assert names_only_solutions_defined(make_student_notebook(nb)) == ["'total_secret' in: print(total_secret)"]
    assert names_only_solutions_defined(make_student_notebook(_synthetic_chapter())) == []


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_student_notebook_needs_nothing_from_a_solution(chapter, student_dir):
    """For every chapter: no kept cell reads a name that only a removed solution defined."""
    problems = names_only_solutions_defined(nbformat.read(student_dir / chapter.name, as_version=4))
    assert not problems, "kept cells read names only a removed solution defined: " + "; ".join(problems[:8])


# Running a student notebook costs as much as running the chapter: by default the chapters whose
# exercises have self-checks are run; LOCALBOOK_ASSIGNMENTS_EXECUTE=all runs every chapter.
_RUN = os.environ.get("LOCALBOOK_ASSIGNMENTS_EXECUTE", "01,02")
EXECUTED = [c for c in CHAPTERS if _RUN == "all" or c.name[:2] in _RUN.split(",")]


@pytest.mark.slow
@pytest.mark.parametrize("chapter", EXECUTED, ids=lambda p: p.stem)
def test_chapter_student_notebook_runs_with_only_stub_errors(chapter, student_dir):
    nb, errors = run_student(student_dir / chapter.name)
    for cell, err in errors:
        # the stubs' own error, raised in the stub cell or where a later cell calls the stub
        assert err.ename == "NotImplementedError", f"{err.ename}: {err.evalue} in\n{cell.source}"
    outs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    n_checks = sum("check.ch" in c.source for c in nb.cells if c.cell_type == "code" and STUB_TAG not in c.metadata.get("tags", []))
    assert outs.count("not implemented yet") >= n_checks  # every self-check met a stub, politely


def test_command_line(tmp_path):
    import subprocess

    (tmp_path / "book").mkdir()
    nbformat.write(_synthetic_chapter(), tmp_path / "book" / "09_synthetic.ipynb")
    r = subprocess.run([sys.executable, "-m", "localbook.assignments", str(tmp_path / "book"), str(tmp_path / "out")],
                       capture_output=True, text=True, check=True)
    assert "09_synthetic.ipynb" in r.stdout and (tmp_path / "out" / "09_synthetic.ipynb").exists()


def test_leak_check_catches_leaks():
    original = _synthetic_chapter()
    with pytest.raises(AssertionError, match="leaks"):
        assert_clean(original, original)  # the chapter itself is full of solutions
