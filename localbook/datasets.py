"""Synthetic data sets for the chapters, and loaders of the small data shipped with the package.

Every generator is seeded (a ``seed``, or a ``torch.Generator`` for the spurious-feature data of
chapter 8) and returns tensors (default float dtype unless ``dtype`` given). The spurious-feature
generators are also exported at the top level (``lb.spurious_gaussian_data``, ...).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._validate import as_tensor, check_choice, check_positive_float, check_positive_int

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


# --- data with spurious features (chapter 8) ---------------------------------------------------
__all__ += ["spurious_gaussian_data", "add_noise_border", "spurious_split"]


def _spurious_dims(d: int, alpha: float) -> Tuple[int, int]:
    """``(d_x, d_y)`` with ``d_y = round(α d)`` clipped to ``[1, d − 1]`` (as in the data)."""
    dy = min(max(1, round(alpha * d)), d - 1)
    return d - dy, dy



def _sphere(n, d, generator, dtype, device):
    g = torch.randn(n, d, generator=generator, dtype=dtype, device=device)
    return g * (math.sqrt(d) / g.norm(dim=1, keepdim=True))


def spurious_gaussian_data(n: int, d: int, alpha: float, generator: Optional[torch.Generator] = None,
                           counterpart: str = "zero", dtype=None, device=None):
    r"""Samples :math:`z = [x, y]` with core :math:`x` (``d_x = d − d_y``) and spurious :math:`y` (``d_y = round(αd)``).

    :math:`x` and :math:`y` are independent and uniform on the spheres of radius :math:`\sqrt{d_x}`,
    :math:`\sqrt{d_y}` (so :math:`\|z\| = \sqrt d`); the label :math:`g = \mathrm{sign}(u^\top x)` with
    :math:`u = \mathbf 1/\sqrt{d_x}` depends on the core only. The spurious counterpart is
    :math:`z^s = [0, y]` (``counterpart="zero"``, as in the experiments) or :math:`[\tilde x, y]` with a
    fresh core :math:`\tilde x` (``"resample"``, same norm as :math:`z`). Returns ``Z (n, d)``,
    ``g (n,)`` in {−1, +1}, ``Z_spurious (n, d)``.
    """
    n = check_positive_int(n, "n")
    d = check_positive_int(d, "d", minimum=2)
    alpha = check_positive_float(alpha, "alpha")
    if alpha >= 1:
        raise ValueError(f"alpha is the spurious fraction d_y/d and must be in (0, 1), got {alpha}")
    counterpart = check_choice(counterpart, "counterpart", ["zero", "resample"])
    dx, dy = _spurious_dims(d, alpha)
    dtype = dtype or torch.get_default_dtype()
    x = _sphere(n, dx, generator, dtype, device)
    y = _sphere(n, dy, generator, dtype, device)
    g = torch.where(x.sum(1) >= 0, 1.0, -1.0).to(dtype)
    core = torch.zeros_like(x) if counterpart == "zero" else _sphere(n, dx, generator, dtype, device)
    return torch.cat([x, y], 1), g, torch.cat([core, y], 1)


def add_noise_border(images, width: int, scale: float = 1.0, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Surround each image with a border of i.i.d. :math:`N(0, \text{scale}^2)` noise ``width`` pixels wide.

    ``images (n, H, W)`` → ``(n, H + 2·width, W + 2·width)``: the border is the spurious feature
    :math:`y` (independent of the label), the original image the core :math:`x`.
    """
    img = as_tensor(images, "images", ndim=(3,))
    width = check_positive_int(width, "width")
    scale = check_positive_float(scale, "scale", allow_zero=True)
    n, H, W = img.shape
    out = scale * torch.randn(n, H + 2 * width, W + 2 * width, generator=generator, dtype=img.dtype, device=img.device)
    out[:, width:width + H, width:width + W] = img
    return out


def spurious_split(images, border: int):
    r"""Split bordered images into the core part (border zeroed) and the spurious part (centre zeroed).

    ``images (n, H, W)`` → ``(core, spurious)``, both ``(n, H, W)`` with ``core + spurious = images``;
    ``spurious`` is the spurious counterpart :math:`z^s` used to measure spurious accuracy.
    """
    img = as_tensor(images, "images", ndim=(3,))
    border = check_positive_int(border, "border")
    H, W = img.shape[1:]
    if 2 * border >= min(H, W):
        raise ValueError(f"border = {border} leaves no centre in {H}×{W} images; it must be < {min(H, W) / 2}")
    mask = torch.ones(H, W, dtype=torch.bool, device=img.device)
    mask[border:H - border, border:W - border] = False
    spurious = img * mask
    return img - spurious, spurious
