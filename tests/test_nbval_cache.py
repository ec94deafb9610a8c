"""``make nbval`` stores each passing chapter in the build's execution cache (book/conftest.py).

The book build then reads the chapter from the cache instead of executing it again; a chapter
with a failing cell is left out, so the build executes it and reports the failure itself.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, cells) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, path)


def _nbval(tmp_path: Path, names, cache=None, *options):
    """nbval on the notebooks ``names`` in ``tmp_path``, storing into ``cache`` when one is
    given."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    if cache is not None:
        env["LOCALBOOK_NB_CACHE"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *names, *options, "--nbval-lax",
         "--nbval-current-env", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _book(d: Path) -> Path:
    """``d`` as a book folder: the book's conftest.py, which stores passing chapters."""
    shutil.copy(ROOT / "book" / "conftest.py", d / "conftest.py")
    return d


@pytest.fixture
def book(tmp_path):
    return _book(tmp_path)


GOOD = [
    "x = 6 * 7\nprint(x)",
    "x + 1",
    "from IPython.display import HTML\nHTML('<b>hi</b>')",
]
BAD = ["y = 1", "assert y == 2", "print(y)"]


@pytest.fixture(scope="module")
def cached_run(tmp_path_factory):
    """One nbval run over a passing and a failing notebook, storing into a cache (one pytest
    and its kernels for both tests: each costs seconds of start-up)."""
    pytest.importorskip("jupyter_cache")
    d = _book(tmp_path_factory.mktemp("book"))
    _notebook(d / "good.ipynb", GOOD)
    _notebook(d / "bad.ipynb", BAD)
    run = _nbval(d, ["good.ipynb", "bad.ipynb"], d / "jc", "-rfE")
    failed = [
        ln for ln in run.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))
    ]
    return d, run, failed


def test_passing_chapter_is_stored_with_its_outputs(cached_run):
    import jupyter_cache

    book, run, failed = cached_run
    assert not [f for f in failed if "good.ipynb" in f], run.stdout + run.stderr
    nb = nbformat.read(book / "good.ipynb", as_version=4)
    _, merged = jupyter_cache.get_cache(str(book / "jc")).merge_match_into_notebook(nb)
    outs = [c.outputs for c in merged.cells]
    assert outs[0][0]["text"] == "42\n"
    assert outs[1][0]["data"]["text/plain"] == "43"
    assert outs[2][0]["data"]["text/html"] == "<b>hi</b>"
    assert [c.execution_count for c in merged.cells] == [1, 2, 3]
    # a changed cell is a different notebook for the cache: the build would execute it
    nb.cells[1].source = "x + 2"
    with pytest.raises(KeyError):
        jupyter_cache.get_cache(str(book / "jc")).match_cache_notebook(nb)


def test_failing_chapter_is_not_stored(cached_run):
    import jupyter_cache

    book, run, failed = cached_run
    assert run.returncode != 0
    assert [f for f in failed if "bad.ipynb" in f], run.stdout
    nb = nbformat.read(book / "bad.ipynb", as_version=4)
    with pytest.raises(KeyError):
        jupyter_cache.get_cache(str(book / "jc")).match_cache_notebook(nb)


def test_without_the_variable_nothing_is_written(book):
    _notebook(book / "plain.ipynb", ["print(1)"])
    run = _nbval(book, ["plain.ipynb"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (book / "jc").exists()
