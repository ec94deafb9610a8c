"""Synthetic data sets for the chapters, and loaders of the small data shipped with the package.

Every generator takes a ``seed`` and returns tensors (default float dtype unless ``dtype`` given).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._validate import check_positive_float, check_positive_int, check_choice

__all__ = ["regression_function", "make_regression_1d", "make_regression_2d", "make_blobs"]

_FUNCTIONS = {
    # a curvy function a global line cannot follow, with a steep region and a flat one
    "wiggle": lambda x: torch.sin(2 * math.pi * x) + 0.5 * x,
    "bump": lambda x: torch.exp(-((x - 0.5) ** 2) / 0.02) - 0.5 * x,
    "linear": lambda x: 2.0 * x - 1.0,
    "doppler": lambda x: torch.sqrt(x * (1 - x)) * torch.sin(2.1 * math.pi / (x + 0.05)),
}


def regression_function(x, name: str = "wiggle") -> torch.Tensor:
    """The noiseless regression function ``f(x)`` of :func:`make_regression_1d` on ``[0, 1]``."""
    f = _FUNCTIONS[check_choice(name, "name", list(_FUNCTIONS))]
    return f(torch.as_tensor(x, dtype=torch.get_default_dtype()) if not isinstance(x, torch.Tensor) else x)


def make_regression_1d(
    n: int = 200, noise: float = 0.3, function: str = "wiggle", seed: int = 0, design: str = "uniform",
    dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` points ``x ~ U[0, 1]`` (or ``design="clustered"``: denser on the left), ``y = f(x) + noise·ε``.

    Returns ``x (n,)`` sorted and ``y (n,)``.
    """
    n = check_positive_int(n, "n")
    noise = check_positive_float(noise, "noise", allow_zero=True)
    design = check_choice(design, "design", ["uniform", "clustered"])
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.get_default_dtype()
    u = torch.rand(n, generator=g, dtype=dtype)
    x = u if design == "uniform" else u**2
    x, _ = torch.sort(x)
    y = regression_function(x, function) + noise * torch.randn(n, generator=g, dtype=dtype)
    return x, y


def make_regression_2d(n: int = 500, noise: float = 0.1, seed: int = 0, dtype: Optional[torch.dtype] = None):
    """``x ~ U[-1, 1]²``, ``y = sin(πx₁)·cos(πx₂/2) + noise·ε``; returns ``x (n, 2)``, ``y (n,)``."""
    n = check_positive_int(n, "n")
    noise = check_positive_float(noise, "noise", allow_zero=True)
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.get_default_dtype()
    x = 2 * torch.rand(n, 2, generator=g, dtype=dtype) - 1
    y = torch.sin(math.pi * x[:, 0]) * torch.cos(math.pi * x[:, 1] / 2) + noise * torch.randn(n, generator=g, dtype=dtype)
    return x, y


def make_blobs(
    n: int = 300, centers=3, std: float = 0.5, d: int = 2, seed: int = 0, box: float = 5.0,
    dtype: Optional[torch.dtype] = None,
):
    """Isotropic Gaussian blobs. ``centers`` is a count (drawn in ``[-box, box]^d``) or a
    ``(c, d)`` array. Returns ``x (n, d)``, integer ``labels (n,)`` and ``centers (c, d)``."""
    n = check_positive_int(n, "n")
    std = check_positive_float(std, "std")
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.get_default_dtype()
    if isinstance(centers, int):
        c = check_positive_int(centers, "centers")
        ctr = (2 * torch.rand(c, d, generator=g, dtype=dtype) - 1) * box
    else:
        ctr = torch.as_tensor(centers, dtype=dtype)
        if ctr.ndim != 2:
            raise ValueError(f"centers must be a count or a (c, d) array, got shape {tuple(ctr.shape)}")
        c, d = ctr.shape
    labels = torch.arange(n) % c
    x = ctr[labels] + std * torch.randn(n, d, generator=g, dtype=dtype)
    return x, labels, ctr
