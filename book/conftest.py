"""nbval: a chapter's kernel that dies while starting is started again.

With two xdist workers, two kernels start side by side; a kernel can die before it answers
``kernel_info`` for reasons outside the chapter (seen once in CI: every cell of one chapter
errored at setup, the other chapters passed). nbval sends the kernel's stderr to /dev/null, so
the cause was lost. Here each start keeps the kernel's stderr in a temporary file, a failed
start is retried (a warning shows it in the test summary with that stderr), and the last
failure raises with the stderr attached. A chapter that fails while *running* still fails.
"""

import tempfile
import warnings

import nbval.kernel

ATTEMPTS = 3
_start_new_kernel = nbval.kernel.start_new_kernel


def _tail(stream, limit=3000):
    stream.flush()
    stream.seek(0)
    return stream.read()[-limit:] or "(empty)"


def start_new_kernel_retrying(startup_timeout=60, kernel_name="python", **kwargs):
    for attempt in range(1, ATTEMPTS + 1):
        # the kernel process keeps its own descriptor; ours is closed (and the file
        # unlinked) when this attempt ends
        with tempfile.TemporaryFile(mode="w+") as stderr:
            kwargs["stderr"] = stderr
            try:
                return _start_new_kernel(
                    startup_timeout=startup_timeout, kernel_name=kernel_name, **kwargs
                )
            except RuntimeError as exc:
                message = f"{exc} (attempt {attempt} of {ATTEMPTS}); kernel stderr:\n"
                message += _tail(stderr)
                if attempt == ATTEMPTS:
                    raise RuntimeError(message) from exc
                warnings.warn(message, RuntimeWarning, stacklevel=2)


nbval.kernel.start_new_kernel = start_new_kernel_retrying


# --- one execution per chapter ------------------------------------------------------------
# With LOCALBOOK_NB_CACHE set (``make nbval`` sets it to the book build's jupyter-cache), a
# chapter whose cells all pass under nbval is stored in that cache with nbval's outputs, so
# ``jupyter-book build`` (execute_notebooks: cache) renders it without executing it again.
# The cache keys a notebook on its code and kernelspec (jupyter-cache), exactly what nbval ran;
# a chapter that failed, was skipped in part or changed since is executed by the build as before.

import fcntl  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

_CACHE = os.environ.get("LOCALBOOK_NB_CACHE")
_ran = {}  # notebook path -> {"items": [...], "failed": bool}


def _state(item):
    parent = getattr(item, "parent", None)
    if parent is None or not hasattr(item, "test_outputs") or not hasattr(parent, "nb"):
        return None
    return _ran.setdefault(
        str(parent.fspath), {"parent": parent, "cells": {}, "bad": False}
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _CACHE:
        return
    state = _state(item)
    if state is None:
        return
    report = outcome.get_result()
    if report.failed or report.skipped:
        state["bad"] = True
    elif call.when == "call":
        state["cells"][id(item.cell)] = (item.cell, item.test_outputs)


def _strip(text: str) -> str:
    """The site's own reading of a chapter (``_ext/localbook_sphinx.py``), where there is one."""
    ext = Path(__file__).resolve().parents[1] / "_ext" / "localbook_sphinx.py"
    if not ext.is_file():
        return text
    import importlib.util

    spec = importlib.util.spec_from_file_location("_localbook_sphinx_for_nbval", ext)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.strip_solution_markers(text)


def _store(path: str, state: dict) -> bool:
    """Put one fully passed chapter, with nbval's outputs, into the build's cache."""
    import copy

    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    originals = [c for c in state["parent"].nb.cells if c.cell_type == "code"]
    # the build reads the chapter without its nbgrader marker lines (comments: the code runs
    # the same), and the cache keys on the code it reads: store that text
    nb = nbformat.reads(_strip(Path(path).read_text(encoding="utf-8")), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    if state["bad"] or len(state["cells"]) != len(code) or len(code) != len(originals):
        return False
    for count, (cell, original) in enumerate(zip(code, originals), start=1):
        _, outputs = state["cells"][id(original)]
        cell.outputs = copy.deepcopy(outputs or [])
        cell.execution_count = count
        for out in cell.outputs:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = count
    Path(_CACHE).mkdir(parents=True, exist_ok=True)
    # two xdist workers may finish chapters together: jupyter-cache's sqlite wants one writer
    with open(Path(_CACHE) / ".localbook-nbval.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        get_cache(_CACHE).cache_notebook_bundle(
            CacheBundleIn(nb, str(Path(path).resolve()), data={"source": "nbval"}),
            check_validity=False,
            overwrite=True,
        )
    return True


def pytest_sessionfinish(session, exitstatus):
    if not _CACHE:
        return
    for path, state in _ran.items():
        try:
            stored = _store(path, state)
        except Exception as exc:  # the build executes the chapter itself: only slower
            warnings.warn(f"{path}: not stored in {_CACHE} ({exc!r})", stacklevel=1)
            continue
        if stored:
            print(f"\nnbval: {Path(path).name} stored in {_CACHE}")


# --- longest chapter first ------------------------------------------------------------------
# `make nbval` hands whole chapters to two workers (--dist loadfile --no-loadscope-reorder), each
# worker taking the next one in collection order when it runs dry. With the longest first the
# two finish close together (longest-processing-time scheduling); in file order chapter 9, the
# longest, started last. Seconds per chapter under nbval with one thread, measured 2026-12-03
# on a 2-core AMD EPYC; a chapter missing from the table (a new one) goes first.
SECONDS = {
    "09_sparse_graphs": 109,
    "11_embeddings": 63,
    "12_imputation": 61,
    "07_attention": 45,
    "05_denoising": 32,
    "10_memorization": 26,
    "08_entmax": 25,
    "03_local_decisions": 23,
    "02_local_means": 18,
    "06_learning_kernels": 18,
    "04_mean_shift": 14,
    "01_localization": 12,
}


def pytest_collection_modifyitems(config, items):
    def seconds(item):
        stem = Path(str(item.fspath)).stem
        return -SECONDS.get(stem, float("inf"))

    items.sort(key=seconds)  # stable: each chapter's cells keep their order
