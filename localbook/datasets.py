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


# --- shipped data ------------------------------------------------------------------------
_DATA = __import__("pathlib").Path(__file__).with_name("data")
_OLIVER_SHA256 = "ed6843e69f29aee6606a1fcdeae401d9c6131b2a7f308b912ffa789dbdcc30f5"
_FASHION_SHA256 = "c7124de626452594435fbc8c4b3f4ee7673c4d674830a0963eaad10fec978ba6"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
__all__ += ["load_oliver_twist", "load_fashion_mnist_subset", "FASHION_MNIST_CLASSES"]


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def load_oliver_twist() -> str:
    """The full text of *Oliver Twist* (Dickens; Project Gutenberg #730, public domain).

    Shipped compressed with the package (see ``localbook/data/PROVENANCE.md``); the checksum of
    the decompressed text is verified on every load.
    """
    import gzip

    raw = gzip.decompress((_DATA / "oliver_twist.txt.gz").read_bytes())
    if _sha256(raw) != _OLIVER_SHA256:
        raise RuntimeError("oliver_twist.txt.gz is corrupt: its sha256 does not match the recorded one")
    return raw.decode("utf-8")


def load_fashion_mnist_subset():
    """The first 200 Fashion-MNIST test images and their official labels (MIT, © Zalando SE).

    Returns ``images`` uint8 numpy array ``(200, 28, 28)`` and ``labels`` ``(200,)``.
    """
    import numpy as np

    path = _DATA / "fashion-mnist-t10k-first200.npz"
    if _sha256(path.read_bytes()) != _FASHION_SHA256:
        raise RuntimeError(f"{path.name} is corrupt: its sha256 does not match the recorded one")
    with np.load(path) as d:
        return d["images"].copy(), d["labels"].copy()
