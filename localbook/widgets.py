"""Interactive controls that degrade to a static figure on the website and in CI.

In Jupyter and Colab, :func:`interactive_figure` shows ipywidgets sliders/dropdowns driving a
plot. When the environment variable ``LOCALBOOK_STATIC`` is set (the book build and the test
suite set it), or ipywidgets is missing, it draws a static small-multiples figure for a few
representative settings instead, so the website never shows an empty widget box and nothing
waits for input.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Mapping, Sequence

__all__ = ["is_static", "interactive_figure"]


def is_static() -> bool:
    """True when figures must be static (book build, CI) or ipywidgets is not installed."""
    if os.environ.get("LOCALBOOK_STATIC", "").lower() in {"1", "true", "yes"}:
        return True
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return True
    return False


def interactive_figure(
    plot: Callable,
    controls: Mapping[str, Sequence],
    static: Sequence[Mapping],
    *,
    ncols: int = 3,
    panel_size=(4.0, 3.0),
    title: Callable[[Mapping], str] | None = None,
):
    """Drive ``plot(ax, **values)`` with widgets, or draw it once per entry of ``static``.

    ``controls`` maps each argument to its options: a list of values (a dropdown / selection
    slider) or a ``(min, max, step)`` tuple of numbers (a float slider). ``static`` lists the
    settings drawn as small multiples when :func:`is_static`. Returns the static figure (or the
    ipywidgets ``interactive`` object).
    """
    import matplotlib.pyplot as plt

    if not static:
        raise ValueError("static must list at least one setting to draw")
    if is_static():
        n = len(static)
        cols = min(ncols, n)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(
            rows,
            cols,
            figsize=(panel_size[0] * cols, panel_size[1] * rows),
            squeeze=False,
        )
        for ax, values in zip(axes.flat, static):
            plot(ax, **values)
            ax.set_title(
                title(values)
                if title
                else ", ".join(f"{k} = {v}" for k, v in values.items()),
                fontsize=10,
            )
        for ax in list(axes.flat)[n:]:
            ax.set_visible(False)
        fig.tight_layout()
        return fig

    import ipywidgets as w

    def _control(name, options):
        if (
            isinstance(options, tuple)
            and len(options) == 3
            and all(isinstance(o, (int, float)) for o in options)
        ):
            lo, hi, step = options
            return w.FloatSlider(
                value=static[0].get(name, lo),
                min=lo,
                max=hi,
                step=step,
                description=name,
                continuous_update=False,
            )
        return w.Dropdown(
            options=list(options),
            value=static[0].get(name, list(options)[0]),
            description=name,
        )

    def _draw(**values):
        fig, ax = plt.subplots(figsize=panel_size)
        plot(ax, **values)
        fig.tight_layout()
        plt.show()

    return w.interact(_draw, **{k: _control(k, v) for k, v in controls.items()})
