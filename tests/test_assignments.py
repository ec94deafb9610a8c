"""Coursework with nbgrader: the chapters are nbgrader source notebooks (_ext/nbgrader_source.py),
`make assignments` (_ext/assignments.py) releases them with `nbgrader generate_assignment`,
nothing of the solutions leaks into a release, a release runs with only its stubs' errors, and
nbgrader's autograder gives the instructor's solutions full marks and an untouched release less.
nbgrader is a test-only dependency (requirements.txt)."""

import ast
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import assignments as course  # noqa: E402  (_ext/assignments.py)
import nbgrader_source as ns  # noqa: E402
from localbook_sphinx import strip_solution_markers  # noqa: E402

CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]*_*.ipynb"))

SOLUTION_CODE = '''import torch

def weighted_mean(x_star: float, x: torch.Tensor,
                  y: torch.Tensor, h: float) -> float:
    """Kernel-weighted mean of y around x_star."""
    # normalized Gaussian weights
    weights_secret = torch.exp(-0.5 * ((x_star - x) / h) ** 2)
    return float((weights_secret * y).sum() / weights_secret.sum())


print("solution value", weighted_mean(0.0, torch.linspace(-1, 1, 5), torch.ones(5), 1.0))'''


def _synthetic_chapter():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb.cells = [
        md("# 9. A synthetic chapter"),
        code("import localbook as lb\nimport torch"),
        md(
            "## Exercises\n\n```{exercise} Weighted mean\n:label: ex-09-mean\nWrite it.\n```\n\n"
            "```{solution} ex-09-mean\n:class: dropdown\nThe secret explanation of the code.\n```"
        ),
        code(SOLUTION_CODE, metadata={"tags": ["solution"]}),
        code("lb.check.ch01.local_constant_fit(weighted_mean);"),
        md(
            "```{exercise}\n:label: ex-09-other\nProve it.\n```\n\n"
            "````{solution} ex-09-other\n:class: dropdown\n```{math}\nsecret = 1\n```\n"
            "Still hidden text.\n````\nAfter the answer."
        ),
        code(
            "# hidden check\nassert total_secret == 4",
            metadata={"tags": ["remove-cell"]},
        ),
        code(
            "total_secret = 2 + 2\nassert total_secret == 4",
            metadata={"tags": ["solution"]},
        ),
        code("print('kept')"),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="old output")]
    nb.cells[1].execution_count = 3
    return nb


def _converted(nb):
    nb = copy.deepcopy(nb)
    ns.convert_notebook(nb)
    return nb


def _clear_solutions(source: str) -> str:
    """What nbgrader's ClearSolutions makes of a cell (its default Python stub)."""
    from nbgrader.preprocessors import ClearSolutions

    cell = nbformat.v4.new_code_cell(source)
    ClearSolutions()._replace_solution_region(cell, "python")
    return cell.source


def _grader(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


# --- the converter ---------------------------------------------------------------------------
def test_solution_body_is_marked_signature_and_docstring_stay():
    stub = _clear_solutions(ns.wrap_code(SOLUTION_CODE))
    assert stub.startswith(
        "import torch\n\ndef weighted_mean(x_star: float, x: torch.Tensor,\n"
    )
    assert (
        '    """Kernel-weighted mean of y around x_star."""\n    # YOUR CODE HERE\n'
        in stub
    )
    assert "weights_secret" not in stub and "normalized" not in stub
    assert (
        "solution value" not in stub
    )  # the demo after the function is a region of its own
    compile(stub, "<stub>", "exec")
    assert (
        ns.wrap_code("x = 1\nprint(x)")
        == "### BEGIN SOLUTION\nx = 1\nprint(x)\n### END SOLUTION"
    )
    assert ns.wrap_code("def f(x): return 2 * x").startswith(
        "### BEGIN SOLUTION\ndef f"
    )
    s = _clear_solutions(
        ns.wrap_code('class A:\n    """Doc."""\n    def m(self):\n        return 1\n')
    )
    assert '"""Doc."""' in s and "def m(self):" in s and "return 1" not in s
    compile(s, "<stub>", "exec")
    assert ns.wrap_code("%timeit f(1)").startswith(
        "### BEGIN SOLUTION"
    )  # not Python: one region


def test_self_check_call_becomes_an_assert():
    assert (
        ns.assert_checks("lb.check.ch02.loo_shortcut(loo);  # note\nx = 1")
        == "assert lb.check.ch02.loo_shortcut(loo)  # note\nx = 1"
    )
    assert (
        ns.assert_checks("lb.check.ch06.sparsemax(f)")
        == "assert lb.check.ch06.sparsemax(f)"
    )
    assert ns.assert_checks("print(1)") == "print(1)"


def test_synthetic_chapter_converts_to_valid_nbgrader_metadata():
    from nbgrader.nbgraderformat import MetadataValidator

    nb = _converted(_synthetic_chapter())
    MetadataValidator().validate_nb(nb)
    meta = [_grader(c) for c in nb.cells]
    assert (
        meta[3]["solution"]
        and not meta[3]["grade"]
        and meta[3]["grade_id"] == "ex-09-mean-code"
    )
    assert (
        meta[4]["grade"] and meta[4]["locked"] and meta[4]["points"] == ns.CHECK_POINTS
    )
    assert (
        nb.cells[4].source == "assert lb.check.ch01.local_constant_fit(weighted_mean)"
    )
    # the self-checked code exercise's prose is no written answer; the proof is one
    assert meta[2] == {} and "BEGIN SOLUTION" not in nb.cells[2].source
    assert (
        meta[5]["solution"]
        and meta[5]["grade"]
        and meta[5]["points"] == ns.WRITTEN_POINTS
    )
    assert nb.cells[5].source.split("\n").count(ns.BEGIN) == 1
    assert (
        meta[6] == {} and meta[8] == {}
    )  # hidden checks and other cells are left alone
    assert meta[7]["solution"] and nb.cells[7].source.startswith(ns.BEGIN)
    assert len({m["grade_id"] for m in meta if m}) == sum(bool(m) for m in meta)


def test_converter_is_idempotent_and_leaves_other_notebooks_alone():
    once = _converted(_synthetic_chapter())
    twice = _converted(once)
    assert nbformat.writes(once) == nbformat.writes(twice)
    plain = nbformat.v4.new_notebook()
    plain.cells = [
        nbformat.v4.new_markdown_cell(
            "# T\n\n```{solution} x\nnot after an exercise\n```"
        ),
        nbformat.v4.new_code_cell("lb.check.ch01.knn_bandwidth(f)"),
    ]
    before = nbformat.writes(plain)
    # a check that follows no solution is no test cell; a lone {solution} block is written
    nb = _converted(plain)
    assert _grader(nb.cells[1]) == {} and nb.cells[1].source == plain.cells[1].source
    assert _grader(nb.cells[0])["grade"] and before != nbformat.writes(nb)
    empty = nbformat.v4.new_notebook()
    empty.cells = [
        nbformat.v4.new_markdown_cell("# T"),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    assert ns.convert_notebook(empty) == 0


def test_website_hides_the_markers():
    original = _synthetic_chapter()
    converted = _converted(original)
    shown = json.loads(strip_solution_markers(nbformat.writes(converted)))
    for i, (a, b) in enumerate(zip(original.cells, shown["cells"])):
        expected = a.source if i != 4 else "assert " + a.source.rstrip(";")
        assert "".join(b["source"]) == expected


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_an_nbgrader_source(chapter):
    """Every chapter is converted (rerunning the converter changes nothing) and valid for nbgrader."""
    from nbgrader.nbgraderformat import MetadataValidator

    nb = nbformat.read(chapter, as_version=4)
    text = nbformat.writes(nb)
    assert ns.convert_notebook(nb) == 0, (
        f"{chapter.name} is not an nbgrader source yet: run `python _ext/nbgrader_source.py {chapter.relative_to(ROOT)}`"
    )
    assert nbformat.writes(nb) == text
    MetadataValidator().validate_nb(nb)
    for cell in nb.cells:
        if "solution" in cell.metadata.get("tags", []):
            assert _grader(cell).get("solution"), cell.source[:80]
        for line in cell.source.split(
            "\n"
        ):  # nbgrader takes any line with these words for one
            assert not ns.NBGRADER_MARKER.search(line) or ns.MARKER.match(line), line


# --- releases of every chapter ---------------------------------------------------------------
@pytest.fixture(scope="module")
def course_dir(tmp_path_factory):
    pytest.importorskip("nbgrader")
    root = tmp_path_factory.mktemp("course")
    course.build_course(ROOT / "book", root)
    return root


def _release(root, chapter):
    return nbformat.read(root / "release" / chapter.stem / chapter.name, as_version=4)


def _source(root, chapter):
    return nbformat.read(root / "source" / chapter.stem / chapter.name, as_version=4)


def _solution_lines(nb):
    """Lines inside solution regions and {solution} blocks of a (converted) notebook."""
    out = []
    for cell in nb.cells:
        inside = False
        lines = cell.source.split("\n")
        blocks = {
            i for a, b, _ in ns.solution_blocks(cell.source) for i in range(a + 1, b)
        }
        for i, line in enumerate(lines):
            if ns.MARKER.match(line):
                inside = "BEGIN" in line
            elif (
                (inside or i in blocks)
                and len(line.strip()) > 12
                and not line.lstrip().startswith(":")
            ):
                out.append(line.strip())
    return out


def _public_lines(nb):
    """Lines of a notebook outside its solutions and hidden checks (a solution line that
    repeats one of them is no leak)."""
    out = set()
    for cell in nb.cells:
        if "remove-cell" in cell.metadata.get("tags", []):
            continue
        inside = False
        blocks = {
            i for a, b, _ in ns.solution_blocks(cell.source) for i in range(a, b + 1)
        }
        for i, line in enumerate(cell.source.split("\n")):
            if ns.MARKER.match(line):
                inside = "BEGIN" in line
            elif not inside and i not in blocks:
                out.add(line.strip())
    return out


def assert_clean(chapter_nb, release):
    nb = _converted(chapter_nb)
    public = _public_lines(nb)
    text = "\n".join(c.source for c in release.cells)
    released = {line.strip() for line in text.split("\n")}
    for line in _solution_lines(nb):
        if line not in public:
            assert line not in released, f"solution leaks into the release: {line!r}"
    assert "{solution" not in text and "BEGIN SOLUTION" not in text
    hidden = [c.source for c in nb.cells if "remove-cell" in c.metadata.get("tags", [])]
    for src in hidden:
        assert src not in text, "a hidden instructor check is in the release"
    for cell in release.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    checks = [c for c in nb.cells if _grader(c).get("grade") and c.cell_type == "code"]
    for c in checks:  # the autograded self-checks are released as they are, locked
        twin = [
            r
            for r in release.cells
            if _grader(r).get("grade_id") == _grader(c)["grade_id"]
        ]
        assert twin and twin[0].source == c.source and _grader(twin[0])["locked"]


def test_synthetic_release_is_clean(tmp_path):
    pytest.importorskip("nbgrader")
    (tmp_path / "book").mkdir()
    original = _synthetic_chapter()
    nbformat.write(original, tmp_path / "book" / "09_synthetic.ipynb")
    [path] = course.build_course(tmp_path / "book", tmp_path / "course")
    release = nbformat.read(path, as_version=4)
    assert_clean(original, release)
    text = "\n".join(c.source for c in release.cells)
    assert (
        "secret" not in text
        and "Still hidden" not in text
        and "weights_secret" not in text
    )
    assert (
        "After the answer." in text
        and "YOUR ANSWER HERE" in text
        and "print('kept')" in text
    )
    assert "Student version" in text and release.cells[0].source.startswith("# 9.")
    with pytest.raises(AssertionError, match="leaks"):
        assert_clean(
            original, _converted(original)
        )  # the chapter itself is full of solutions


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_release_is_clean(chapter, course_dir):
    original = nbformat.read(chapter, as_version=4)
    release = _release(course_dir, chapter)
    assert_clean(original, release)
    assert release.cells[0].source == original.cells[0].source


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
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        else:
            names |= _defined_names(ast.Module(body=[stmt], type_ignores=[]))
    return names


def names_only_solutions_defined(release):
    """Names that kept cells read but only a cleared solution defined (static, fast)."""
    import builtins

    defined, problems = (
        set(dir(builtins)) | {"__name__", "__file__", "get_ipython", "display"},
        [],
    )
    for cell in release.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(
                "\n".join(
                    line
                    for line in cell.source.splitlines()
                    if not line.lstrip().startswith(("%", "!"))
                )
            )
        except SyntaxError:
            continue
        if not _grader(cell).get("solution"):
            local = _defined_names(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Name)
                    and isinstance(node.ctx, ast.Load)
                    and node.id not in defined | local
                ):
                    problems.append(
                        f"{node.id!r} in: {cell.source.splitlines()[0][:70]}"
                    )
        defined |= _top_level_defined(tree)
    return sorted(set(problems))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_release_needs_nothing_from_a_solution(chapter, course_dir):
    problems = names_only_solutions_defined(_release(course_dir, chapter))
    assert not problems, "kept cells read names only a solution defined: " + "; ".join(
        problems[:8]
    )


def test_command_line(tmp_path):
    pytest.importorskip("nbgrader")
    (tmp_path / "book").mkdir()
    nbformat.write(_synthetic_chapter(), tmp_path / "book" / "09_synthetic.ipynb")
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "_ext" / "assignments.py"),
            str(tmp_path / "book"),
            str(tmp_path / "course"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        tmp_path / "course" / "release" / "09_synthetic" / "09_synthetic.ipynb"
    ).exists()
    assert (
        tmp_path / "course" / "source" / "09_synthetic" / "09_synthetic.ipynb"
    ).exists()


# --- running releases, and nbgrader's autograder ---------------------------------------------
def _plain_env():
    """A student's (and nbgrader's) kernel: static figures (a batch run of a live slider cell
    can stall: nbgrader once waited minutes on chapter 1's with the kernel idle) and friendly
    checks, as book/teaching.md tells an instructor to autograde."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALBOOK_")}
    env["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), env.get("PATH", "")]
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(LOCALBOOK_STATIC="1", LOCALBOOK_CHECK_STRICT="0")
    return env


def run_release(path: Path, timeout=300):
    """Execute a release as a student would (friendly checks); return the executed notebook."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_plain_env())
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=True,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def _errors(nb):
    """``[(cell, error output)]`` of an executed notebook."""
    return [
        (c, o)
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]


def assert_only_stub_errors(nb):
    """A release run as a student would: the stubs raise, and nothing else does."""
    errors = _errors(nb)
    assert errors, "the stubs must raise"
    for cell, err in errors:
        text = "".join(o.get("text", "") for o in cell.outputs)
        if (
            err.ename == "AssertionError"
        ):  # a self-check met a stub: it said so, then failed
            assert _grader(cell).get("grade") and "not implemented yet" in text, (
                cell.source
            )
        else:
            assert err.ename == "NotImplementedError", (
                f"{err.ename}: {err.evalue} in\n{cell.source}"
            )


# The autograde test below executes chapter 1's release as the untouched submission and holds
# it to assert_only_stub_errors; the other chapters' releases run here on request
# (LOCALBOOK_ASSIGNMENTS_EXECUTE=03,05 or =all), each a minute or more of CPU.
_REQUESTED = os.environ.get("LOCALBOOK_ASSIGNMENTS_EXECUTE", "")
EXECUTED = [
    c for c in CHAPTERS if _REQUESTED == "all" or c.name[:2] in _REQUESTED.split(",")
]


@pytest.mark.slow
@pytest.mark.parametrize("chapter", EXECUTED, ids=lambda p: p.stem)
def test_chapter_release_runs_with_only_stub_errors(chapter, course_dir):
    nb = run_release(course_dir / "release" / chapter.stem / chapter.name)
    assert_only_stub_errors(nb)


GRADED = "01_localization"


@pytest.mark.slow
def test_autograde_instructor_full_marks_untouched_release_less(tmp_path):
    """nbgrader's own pipeline, in a plain kernel: the instructor's source is a submission with
    full autograded marks and no error; the untouched release scores less, and only its stubs
    raise."""
    pytest.importorskip("nbgrader")
    from nbgrader.api import Gradebook

    chapter = ROOT / "book" / f"{GRADED}.ipynb"
    root = tmp_path / "course"
    course.build_course(ROOT / "book", root, [GRADED])
    submissions = {
        "instructor": root / "source" / GRADED / chapter.name,
        "untouched": root / "release" / GRADED / chapter.name,
    }
    for student, nb in submissions.items():
        where = root / "submitted" / student / GRADED
        where.mkdir(parents=True)
        shutil.copy(nb, where / chapter.name)
        (where / "timestamp.txt").write_text("2026-12-01 12:00:00.000000 UTC")
    nbgrader = [sys.executable, "-m", "nbgrader"]
    for student in submissions:
        subprocess.run(
            nbgrader
            + ["db", "student", "add", student, f"--CourseDirectory.root={root}"],
            check=True,
            capture_output=True,
            env=_plain_env(),
            cwd=root,
        )
    r = subprocess.run(
        nbgrader
        + [
            "autograde",
            GRADED,
            "--force",
            f"--CourseDirectory.root={root}",
            "--ExecutePreprocessor.timeout=600",
        ],
        capture_output=True,
        text=True,
        env=_plain_env(),
        cwd=root,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission(GRADED, s) for s in submissions}
        got = {
            s: (sub.code_score, sub.max_code_score, sub.score, sub.max_score)
            for s, sub in scores.items()
        }
    graded = {
        s: nbformat.read(root / "autograded" / s / GRADED / chapter.name, as_version=4)
        for s in submissions
    }
    assert not _errors(graded["instructor"]), [
        f"{out.ename} in\n{cell.source}" for cell, out in _errors(graded["instructor"])
    ]
    assert_only_stub_errors(graded["untouched"])
    inst, untouched = got["instructor"], got["untouched"]
    msg = f"(code score, max code score, score, max score): instructor {inst}, untouched release {untouched}"
    assert inst[1] > 0, msg
    assert inst[0] == inst[1], (
        "the instructor's solutions must get every autograded point " + msg
    )
    assert untouched[0] < inst[0] and untouched[2] < inst[2], msg
    print(msg)
