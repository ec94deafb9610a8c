"""Figures the chapters share: one consistent style, labelled axes, no chapter prose."""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from .kernels import KERNELS, kernel_profile

__all__ = ["book_style", "plot_kernel_gallery", "plot_fits"]


def book_style():
    """Matplotlib settings used by every chapter (readable on the web and in Colab)."""
    import matplotlib as mpl

    mpl.rcParams.update({
        "figure.dpi": 100, "savefig.dpi": 120, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False, "font.size": 11,
        "legend.frameon": False, "figure.figsize": (6.4, 4.0),
    })


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


def plot_fits(ax, x, y, x_grid, curves: Mapping[str, torch.Tensor], truth: Optional[torch.Tensor] = None,
              xlabel: str = "x", ylabel: str = "y"):
    """Data as dots, fitted curves as lines (and the true function dashed)."""
    ax.scatter(torch.as_tensor(x).cpu(), torch.as_tensor(y).cpu(), s=8, color="0.6", label="data")
    if truth is not None:
        ax.plot(torch.as_tensor(x_grid).cpu(), torch.as_tensor(truth).cpu(), "k--", lw=1, label="true f")
    for label, c in curves.items():
        ax.plot(torch.as_tensor(x_grid).cpu(), torch.as_tensor(c).detach().cpu(), lw=2, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    return ax
