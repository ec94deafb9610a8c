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


def _nbval(tmp_path: Path, name: str, cache=None):
    """nbval on one notebook in ``tmp_path``, storing into ``cache`` when one is given."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    if cache is not None:
        env["LOCALBOOK_NB_CACHE"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "pytest", name, "--nbval-lax", "--nbval-current-env", "-q",
         "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def book(tmp_path):
    shutil.copy(ROOT / "book" / "conftest.py", tmp_path / "conftest.py")
    return tmp_path


def test_passing_chapter_is_stored_with_its_outputs(book):
    jupyter_cache = pytest.importorskip("jupyter_cache")
    cache = book / "jc"
    cells = [
        "x = 6 * 7\nprint(x)",
        "x + 1",
        "from IPython.display import HTML\nHTML('<b>hi</b>')",
    ]
    _notebook(book / "good.ipynb", cells)
    run = _nbval(book, "good.ipynb", cache)
    assert run.returncode == 0, run.stdout + run.stderr
    nb = nbformat.read(book / "good.ipynb", as_version=4)
    _, merged = jupyter_cache.get_cache(str(cache)).merge_match_into_notebook(nb)
    outs = [c.outputs for c in merged.cells]
    assert outs[0][0]["text"] == "42\n"
    assert outs[1][0]["data"]["text/plain"] == "43"
    assert outs[2][0]["data"]["text/html"] == "<b>hi</b>"
    assert [c.execution_count for c in merged.cells] == [1, 2, 3]
    # a changed cell is a different notebook for the cache: the build would execute it
    nb.cells[1].source = "x + 2"
    with pytest.raises(KeyError):
        jupyter_cache.get_cache(str(cache)).match_cache_notebook(nb)


def test_failing_chapter_is_not_stored(book):
    jupyter_cache = pytest.importorskip("jupyter_cache")
    cache = book / "jc"
    _notebook(book / "bad.ipynb", ["y = 1", "assert y == 2", "print(y)"])
    run = _nbval(book, "bad.ipynb", cache)
    assert run.returncode != 0
    nb = nbformat.read(book / "bad.ipynb", as_version=4)
    with pytest.raises(KeyError):
        jupyter_cache.get_cache(str(cache)).match_cache_notebook(nb)


def test_without_the_variable_nothing_is_written(book):
    _notebook(book / "plain.ipynb", ["print(1)"])
    run = _nbval(book, "plain.ipynb")
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (book / "jc").exists()
