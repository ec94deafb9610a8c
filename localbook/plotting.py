"""Figures the chapters share: one consistent style, labelled axes, no chapter prose."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

import torch

from .kernels import KERNELS, kernel_profile

if TYPE_CHECKING:  # pragma: no cover
    from .token_graph import AttentionGraph

__all__ = ["book_style", "plot_kernel_gallery", "plot_fits", "draw_attention_graph"]


def book_style():
    """Matplotlib settings used by every chapter (readable on the web and in Colab)."""
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 120,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "font.size": 11,
            "legend.frameon": False,
            "figure.figsize": (6.4, 4.0),
        }
    )


def plot_kernel_gallery(ax=None, kernels=None, u_max: float = 3.0):
    """Every localization kernel's profile ``k(u)`` against the scaled distance ``u = |x - x'|/h``."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    u = torch.linspace(0, u_max, 601, dtype=torch.float64)
    for name in kernels or KERNELS:
        ax.plot(u, kernel_profile(u, name), label=name)
    ax.set_xlabel("scaled distance $u = |x - x'|/h$ (dimensionless)")
    ax.set_ylabel("kernel weight $k(u)$")
    ax.legend()
    return ax


def plot_fits(
    ax,
    x,
    y,
    x_grid,
    curves: Mapping[str, torch.Tensor],
    truth: Optional[torch.Tensor] = None,
    xlabel: str = "x",
    ylabel: str = "y",
):
    """Data as dots, fitted curves as lines (and the true function dashed)."""
    ax.scatter(
        torch.as_tensor(x).cpu(),
        torch.as_tensor(y).cpu(),
        s=8,
        color="0.6",
        label="data",
    )
    if truth is not None:
        ax.plot(
            torch.as_tensor(x_grid).cpu(),
            torch.as_tensor(truth).cpu(),
            "k--",
            lw=1,
            label="true f",
        )
    for label, c in curves.items():
        ax.plot(
            torch.as_tensor(x_grid).cpu(),
            torch.as_tensor(c).detach().cpu(),
            lw=2,
            label=label,
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    return ax


def draw_attention_graph(
    graph: AttentionGraph, ax=None, max_width: float = 4.0, color="C0"
):
    """Draw an :class:`~localbook.AttentionGraph` as an arc diagram: tokens in reading order, arcs ``t → s``.

    Arc width and opacity grow with the weight; uses matplotlib only.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    ax = ax or plt.gca()
    N = len(graph.labels)
    wmax = float(graph.edge_weights.max()) if graph.edge_weights.numel() else 1.0
    top = 0.5
    for (a, b), wt in zip(graph.edges.tolist(), graph.edge_weights.tolist()):
        f = wt / wmax
        # arc3 bends to the left of the direction of travel: flip the sign so every arc is above the line
        rad = 0.4 if a > b else -0.4
        top = max(top, 0.2 * abs(a - b) + 0.3)
        ax.add_patch(
            FancyArrowPatch(
                (float(a), 0.0),
                (float(b), 0.0),
                connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>",
                mutation_scale=6 + 6 * f,
                lw=0.3 + max_width * f,
                color=color,
                alpha=0.25 + 0.7 * f,
                shrinkA=3,
                shrinkB=3,
            )
        )
    ax.scatter(range(N), [0.0] * N, s=18, color="k", zorder=3)
    for x, lab in enumerate(graph.labels):
        ax.annotate(
            lab,
            (x, 0.0),
            xytext=(0, -6),
            textcoords="offset points",
            rotation=90,
            ha="center",
            va="top",
            fontsize=9,
        )
    ax.set_xlim(-0.7, N - 0.3)
    ax.set_ylim(-0.3 * top, top)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.grid(False)
    for sp in ax.spines.values():
        sp.set_visible(False)
    return ax
