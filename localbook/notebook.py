"""Notebook helpers the chapters share: ``glue`` for run-dependent numbers in the prose, and the
progress-bar rule every training loop follows (``progress_enabled``)."""

import sys

__all__ = ["glue"]


def progress_enabled(progress=None) -> bool:
    """Whether a training loop shows a progress bar: ``progress`` when given, else only when
    interactive (Jupyter or a terminal) and never in static mode (``LOCALBOOK_STATIC``: the book
    build and the tests)."""
    if progress is not None:
        return bool(progress)
    from .widgets import is_static

    if is_static():  # the book build and the tests: keep outputs clean
        return False
    return "ipykernel" in sys.modules or bool(
        getattr(sys.stderr, "isatty", lambda: False)()
    )


def _plain(value):
    """numpy / torch scalars become Python numbers, so ``{glue:text}`key:.3f``` can format them.

    (numpy 2 writes ``np.float64(0.5)`` as the plain-text repr, which myst-nb cannot parse.)
    """
    if hasattr(value, "item") and type(value) not in (bool, int, float, str):
        try:
            return value.item()  # a numpy or torch scalar, or a one-element array
        except (ValueError, RuntimeError):
            return value  # a real array: glued as it is
    return value


def glue(name, value, display=False):
    """Store ``value`` under ``name`` for the prose (myst-nb ``{glue:text}`name:.3f```).

    Every run-dependent number a chapter's text quotes goes through here, so the text always shows
    what this run computed. Returns the (plain Python) value. Where myst-nb is not installed
    (Colab), the value is printed instead, so the reader still sees the number the text names.
    """
    value = _plain(value)
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:
        print(f"{name} = {value!r}")
        return value
    _myst_glue(name, value, display=display)
    return value
