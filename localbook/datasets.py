"""Every data generator of the book, and loaders of the small data shipped with the package.

Every generator is seeded (a ``seed``, or a ``torch.Generator`` for the spurious-feature data of
chapter 10) and returns tensors (default float dtype unless ``dtype`` given), except the
missing-value masks of chapter 12, which are numpy ``bool`` arrays (``True`` = missing or
hidden). Sections: regression and clustering data (chapters 1-4), shipped data, data with
spurious features (chapter 10), multi-view data (chapter 9: a union of subspaces seen through
nonlinear maps, two views of scikit-learn's digits, three of Fashion-MNIST) and missing-value
masks (chapter 12). The generators of the later chapters are also exported at the top level
(``lb.spurious_gaussian_data``, ``lb.make_multiview_subspaces``, ``lb.block_mask``, ...).
Heavy optional
dependencies (scikit-learn's digits, the Fashion-MNIST reader) are imported inside the
function that needs them, so importing this module costs only torch and numpy.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ._validate import as_tensor, check_choice, check_fraction, check_image_shape
from ._validate import check_missing_data, check_positive_float, check_positive_int
from ._validate import check_positive_ints

__all__ = [
    "regression_function",
    "make_regression_1d",
    "make_regression_2d",
    "make_blobs",
]

_FUNCTIONS = {
    # a curvy function a global line cannot follow, with a steep region and a flat one
    "wiggle": lambda x: torch.sin(2 * math.pi * x) + 0.5 * x,
    "bump": lambda x: torch.exp(-((x - 0.5) ** 2) / 0.02) - 0.5 * x,
    "linear": lambda x: 2.0 * x - 1.0,
    "doppler": lambda x: (
        torch.sqrt(x * (1 - x)) * torch.sin(2.1 * math.pi / (x + 0.05))
    ),
}


def regression_function(x, name: str = "wiggle") -> torch.Tensor:
    """The noiseless regression function ``f(x)`` of :func:`make_regression_1d` on ``[0, 1]``."""
    f = _FUNCTIONS[check_choice(name, "name", list(_FUNCTIONS))]
    return f(
        torch.as_tensor(x, dtype=torch.get_default_dtype())
        if not isinstance(x, torch.Tensor)
        else x
    )


def make_regression_1d(
    n: int = 200,
    noise: float = 0.3,
    function: str = "wiggle",
    seed: int = 0,
    design: str = "uniform",
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
    y = regression_function(x, function) + noise * torch.randn(
        n, generator=g, dtype=dtype
    )
    return x, y


def make_regression_2d(
    n: int = 500, noise: float = 0.1, seed: int = 0, dtype: Optional[torch.dtype] = None
):
    """``x ~ U[-1, 1]²``, ``y = sin(πx₁)·cos(πx₂/2) + noise·ε``; returns ``x (n, 2)``, ``y (n,)``."""
    n = check_positive_int(n, "n")
    noise = check_positive_float(noise, "noise", allow_zero=True)
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.get_default_dtype()
    x = 2 * torch.rand(n, 2, generator=g, dtype=dtype) - 1
    y = torch.sin(math.pi * x[:, 0]) * torch.cos(
        math.pi * x[:, 1] / 2
    ) + noise * torch.randn(n, generator=g, dtype=dtype)
    return x, y


def make_blobs(
    n: int = 300,
    centers=3,
    std: float = 0.5,
    d: int = 2,
    seed: int = 0,
    box: float = 5.0,
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
            raise ValueError(
                f"centers must be a count or a (c, d) array, got shape {tuple(ctr.shape)}"
            )
        c, d = ctr.shape
    labels = torch.arange(n) % c
    x = ctr[labels] + std * torch.randn(n, d, generator=g, dtype=dtype)
    return x, labels, ctr


# --- shipped data ------------------------------------------------------------------------
_DATA = __import__("pathlib").Path(__file__).with_name("data")
_OLIVER_SHA256 = "ed6843e69f29aee6606a1fcdeae401d9c6131b2a7f308b912ffa789dbdcc30f5"
_FASHION_SHA256 = "c7124de626452594435fbc8c4b3f4ee7673c4d674830a0963eaad10fec978ba6"
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
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
        raise RuntimeError(
            "oliver_twist.txt.gz is corrupt: its sha256 does not match the recorded one"
        )
    return raw.decode("utf-8")


def load_fashion_mnist_subset():
    """The first 200 Fashion-MNIST test images and their official labels (MIT, © Zalando SE).

    Returns ``images`` uint8 numpy array ``(200, 28, 28)`` and ``labels`` ``(200,)``.
    """
    path = _DATA / "fashion-mnist-t10k-first200.npz"
    if _sha256(path.read_bytes()) != _FASHION_SHA256:
        raise RuntimeError(
            f"{path.name} is corrupt: its sha256 does not match the recorded one"
        )
    with np.load(path) as d:
        return d["images"].copy(), d["labels"].copy()


# Each stored run: its tables (key -> file stem suffix). A reproduction script registers here.
STORED_RUNS = {
    "sagl": {"runs": "reproduction", "gate": "gate", "curves": "curves"},
    "imputation": {"runs": "reproduction", "images": "images"},
    "memorization": {"curves": "curves"},
}


def load_stored_run(name: str = "sagl") -> dict:
    """A stored run at full protocol, written by ``reproductions/<name>.py`` into the package
    data: one pandas DataFrame per table of ``localbook.datasets.STORED_RUNS[name]`` plus
    ``"provenance"`` (a dict: command, commit, date, machine and protocol, from
    ``<name>_reproduction.json``). For ``"sagl"``: ``runs`` (one row per data set, seed and
    method), ``gate`` (the SAGL gate's quantiles per view) and ``curves`` (the training loss
    per step). Every table must have rows and a ``seed`` column. A missing or damaged file
    raises ``RuntimeError`` naming it."""
    import json

    import pandas as pd

    name = check_choice(name, "name", sorted(STORED_RUNS))
    paths = {
        key: _DATA / f"{name}_{stem}.csv" for key, stem in STORED_RUNS[name].items()
    }
    paths["provenance"] = _DATA / f"{name}_reproduction.json"
    out = {}
    for key, path in paths.items():
        try:
            if key == "provenance":
                out[key] = json.loads(path.read_text())
            else:
                out[key] = pd.read_csv(path)
        except (OSError, ValueError) as err:  # missing, unreadable or not CSV/JSON
            raise RuntimeError(
                f"the stored run {path.name} cannot be read ({err}); rerun "
                f"reproductions/{name}.py"
            ) from err
    for key in STORED_RUNS[name]:
        if out[key].empty or "seed" not in out[key]:
            raise RuntimeError(
                f"the stored run {paths[key].name} has no rows or no seeds"
            )
    return out


__all__ += ["load_stored_run"]


# --- data with spurious features (chapter 10) ---------------------------------------------------
__all__ += ["spurious_gaussian_data", "add_noise_border", "spurious_split"]


def _spurious_dims(d: int, alpha: float) -> Tuple[int, int]:
    """``(d_x, d_y)`` with ``d_y = round(α d)`` clipped to ``[1, d − 1]`` (as in the data)."""
    dy = min(max(1, round(alpha * d)), d - 1)
    return d - dy, dy


def _sphere(n, d, generator, dtype, device):
    g = torch.randn(n, d, generator=generator, dtype=dtype, device=device)
    return g * (math.sqrt(d) / g.norm(dim=1, keepdim=True))


def spurious_gaussian_data(
    n: int,
    d: int,
    alpha: float,
    generator: Optional[torch.Generator] = None,
    counterpart: str = "resample",
    dtype=None,
    device=None,
):
    r"""Samples :math:`z = [x, y]` with core :math:`x` (``d_x = d − d_y``) and spurious :math:`y` (``d_y = round(αd)``).

    :math:`x` and :math:`y` are independent and uniform on the spheres of radius :math:`\sqrt{d_x}`,
    :math:`\sqrt{d_y}` (so :math:`\|z\| = \sqrt d`); the label :math:`g = \mathrm{sign}(u^\top x)` with
    :math:`u = \mathbf 1/\sqrt{d_x}` depends on the core only. The spurious counterpart is
    :math:`z^s = [\tilde x, y]` with a fresh core :math:`\tilde x` drawn like :math:`x`
    (``counterpart="resample"``, the default: the theorems' assumption, :math:`\|z^s\| = \sqrt d`)
    or :math:`z^s = [0, y]` (``"zero"``, the protocol of the paper's images, where the core pixels
    are erased; :math:`\|z^s\| = \sqrt{d_y}`). ``Z``, ``g`` and the generator's state after the
    call do not depend on ``counterpart``.
    Returns ``Z (n, d)``, ``g (n,)`` in {−1, +1}, ``Z_spurious (n, d)``.
    """
    n = check_positive_int(n, "n")
    d = check_positive_int(d, "d", minimum=2)
    alpha = check_fraction(alpha, "alpha", meaning=" (the spurious fraction d_y/d)")
    counterpart = check_choice(counterpart, "counterpart", ["zero", "resample"])
    dx, dy = _spurious_dims(d, alpha)
    dtype = dtype or torch.get_default_dtype()
    x = _sphere(n, dx, generator, dtype, device)
    y = _sphere(n, dy, generator, dtype, device)
    g = torch.where(x.sum(1) >= 0, 1.0, -1.0).to(dtype)
    core = _sphere(n, dx, generator, dtype, device)  # drawn either way: same stream
    if counterpart == "zero":
        core = torch.zeros_like(x)
    return torch.cat([x, y], 1), g, torch.cat([core, y], 1)


def add_noise_border(
    images, width: int, scale: float = 1.0, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    r"""Surround each image with a border of i.i.d. :math:`N(0, \text{scale}^2)` noise ``width`` pixels wide.

    ``images (n, H, W)`` → ``(n, H + 2·width, W + 2·width)``: the border is the spurious feature
    :math:`y` (independent of the label), the original image the core :math:`x`.
    """
    img = as_tensor(images, "images", ndim=(3,))
    width = check_positive_int(width, "width")
    scale = check_positive_float(scale, "scale", allow_zero=True)
    n, H, W = img.shape
    out = scale * torch.randn(
        n,
        H + 2 * width,
        W + 2 * width,
        generator=generator,
        dtype=img.dtype,
        device=img.device,
    )
    out[:, width : width + H, width : width + W] = img
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
        raise ValueError(
            f"border = {border} leaves no centre in {H}×{W} images; it must be < {min(H, W) / 2}"
        )
    mask = torch.ones(H, W, dtype=torch.bool, device=img.device)
    mask[border : H - border, border : W - border] = False
    spurious = img * mask
    return img - spurious, spurious


# --- multi-view data (chapter 9) ---------------------------------------------------------------
__all__ += ["make_multiview_subspaces", "make_digits_views", "make_fashion_views"]


def _orthonormal(rows: int, cols: int, g: torch.Generator, dtype) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(rows, cols, generator=g, dtype=dtype))
    return q


_ACTIVATIONS = (
    torch.tanh,
    lambda t: torch.nn.functional.softplus(t) - math.log(2.0),
    torch.sin,
)


def make_multiview_subspaces(
    n_per_class: int = 60,
    n_classes: int = 4,
    latent_dim: int = 12,
    subspace_dim: int = 3,
    view_dims: Sequence[int] = (30, 50),
    nonlinearity: float = 1.0,
    noise: float = 0.05,
    seed: int = 0,
    dtype: Optional[torch.dtype] = None,
):
    r"""A union of ``n_classes`` linear subspaces seen through several random nonlinear maps.

    Latent points ``xᵢ = B_{yᵢ} cᵢ`` with ``B_k (latent_dim, subspace_dim)`` a random orthonormal
    basis and ``cᵢ`` uniform on the unit sphere of ``ℝ^{subspace_dim}``. View ``v`` is a random
    one-hidden-layer map with its own activation (tanh, centred softplus, sine in turn):
    ``X⁽ᵛ⁾ = σ_v(γ xᵢ G_v) M_v / γ + noise·sd·ε`` (``sd`` the view's standard deviation, ``ε``
    standard normal) with Gaussian ``G_v (latent_dim, 2·d_v)``,
    ``M_v (2·d_v, d_v)`` (scaled by fan-in) and ``γ = nonlinearity`` (small ``γ`` ≈ linear).
    Returns ``views`` (a list of ``(n, d_v)`` tensors), ``labels (n,)`` (int64) and
    ``latent (n, latent_dim)``, with ``n = n_per_class · n_classes`` and rows grouped by class.
    """
    n_per_class = check_positive_int(n_per_class, "n_per_class", minimum=2)
    n_classes = check_positive_int(n_classes, "n_classes")
    latent_dim = check_positive_int(latent_dim, "latent_dim")
    subspace_dim = check_positive_int(subspace_dim, "subspace_dim", maximum=latent_dim)
    noise = check_positive_float(noise, "noise", allow_zero=True)
    gamma = check_positive_float(nonlinearity, "nonlinearity")
    view_dims = check_positive_ints(view_dims, "view_dims")
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(int(seed))
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    bases = torch.stack(
        [_orthonormal(latent_dim, subspace_dim, g, dtype) for _ in range(n_classes)]
    )
    c = torch.randn(labels.shape[0], subspace_dim, generator=g, dtype=dtype)
    c = c / c.norm(dim=1, keepdim=True)
    latent = torch.einsum("nab,nb->na", bases[labels], c)
    views = []
    for v, d in enumerate(view_dims):
        act = _ACTIVATIONS[v % len(_ACTIVATIONS)]
        G = torch.randn(latent_dim, 2 * d, generator=g, dtype=dtype)
        M = torch.randn(2 * d, d, generator=g, dtype=dtype) / math.sqrt(2 * d)
        xv = act(gamma * latent @ G) @ M / gamma
        xv = xv + noise * xv.std() * torch.randn(xv.shape, generator=g, dtype=dtype)
        views.append(xv)
    return views, labels, latent


def _orientation_histograms(
    images: torch.Tensor, n_bins: int = 9, cell: int = 4
) -> torch.Tensor:
    """HOG-like features: per ``cell × cell`` block, a histogram of unsigned gradient orientations
    weighted by gradient magnitude, each cell's histogram L2-normalized. ``(n, h, w)`` → ``(n, cells·n_bins)``."""
    gy, gx = torch.gradient(images, dim=(1, 2))
    mag = torch.sqrt(gx**2 + gy**2)
    ang = torch.remainder(torch.atan2(gy, gx), math.pi)  # unsigned, [0, π)
    bins = torch.clamp((ang / math.pi * n_bins).long(), max=n_bins - 1)
    n, h, w = images.shape
    cy = torch.arange(h) // cell
    cx = torch.arange(w) // cell
    ncx = (w + cell - 1) // cell
    cell_id = (cy[:, None] * ncx + cx[None, :]).expand(n, h, w)
    n_cells = ((h + cell - 1) // cell) * ncx
    idx = (cell_id * n_bins + bins).reshape(n, -1)
    hist = torch.zeros(n, n_cells * n_bins, dtype=images.dtype).scatter_add_(
        1, idx, mag.reshape(n, -1)
    )
    hist = hist.reshape(n, n_cells, n_bins)
    hist = hist / hist.norm(dim=2, keepdim=True).clamp(min=1e-12)
    return hist.reshape(n, -1)


def _balanced_subset(target: torch.Tensor, n_per_class: int, seed: int) -> torch.Tensor:
    """Indices of ``n_per_class`` random members of each of the ten classes (seeded)."""
    g = torch.Generator().manual_seed(int(seed))
    keep = []
    for k in range(10):  # ten classes, not data points
        members = torch.nonzero(target == k).flatten()
        keep.append(members[torch.randperm(members.numel(), generator=g)[:n_per_class]])
    return torch.cat(keep)


def make_digits_views(
    n_per_class: int = 40, seed: int = 0, dtype: Optional[torch.dtype] = None
):
    """Two views of scikit-learn's handwritten digits (offline): raw pixels and gradient histograms.

    Draws ``n_per_class`` images of each digit (``n = 10·n_per_class``, rows grouped by class).
    View 0: the 64 pixel intensities scaled to [0, 1]; view 1: 16 cells (2 × 2 pixels) × 6
    unsigned orientation bins of the image gradient, each cell L2-normalized (HOG-like, 96 features). Returns
    ``views`` (list of two ``(n, d_v)`` tensors) and ``labels (n,)``.
    """
    from sklearn.datasets import (
        load_digits,
    )  # scikit-learn is imported only when needed

    n_per_class = check_positive_int(n_per_class, "n_per_class", minimum=2, maximum=174)
    dtype = dtype or torch.get_default_dtype()
    data = load_digits()
    images = torch.as_tensor(data.images, dtype=dtype) / 16.0
    target = torch.as_tensor(data.target)
    keep = _balanced_subset(target, n_per_class, seed)
    images = images[keep]
    views = [
        images.reshape(len(keep), -1),
        _orientation_histograms(images, n_bins=6, cell=2),
    ]
    return views, target[keep].long()


def make_fashion_views(
    n_per_class: int = 200,
    seed: int = 0,
    split: str = "test",
    dtype: Optional[torch.dtype] = None,
    download: bool = True,
):
    """Three heterogeneous views of Fashion-MNIST images (a verified copy on disk first).

    Draws ``n_per_class`` images of each of the ten classes from ``split`` (rows grouped by
    class; the draw depends on ``seed``). View 0: the 784 pixels scaled to [0, 1]; view 1:
    HOG-like histograms (7 × 7 cells of 4 × 4 pixels, 9 unsigned orientation bins, 441
    features); view 2: 256 random ReLU features of the 2 × 2-average-pooled image (a fixed
    Gaussian map, seed 1234, the same for every draw). Returns ``views`` and ``labels (n,)``.
    The images come from :func:`~localbook.load_fashion_mnist`: a verified copy
    on disk, else (only when ``download`` is true) the official files, downloaded and checked.
    """
    from .fashion_mnist import load_fashion_mnist

    n_per_class = check_positive_int(
        n_per_class, "n_per_class", minimum=2, maximum=1000
    )
    dtype = dtype or torch.get_default_dtype()
    images, target = load_fashion_mnist(split, download=download)
    images = torch.as_tensor(images).to(dtype) / 255.0
    target = torch.as_tensor(target).long()
    keep = _balanced_subset(target, n_per_class, seed)
    im = images[keep]
    n = len(keep)
    pooled = torch.nn.functional.avg_pool2d(im[:, None], 2).reshape(n, -1)
    proj = torch.randn(
        196, 256, generator=torch.Generator().manual_seed(1234), dtype=dtype
    )
    views = [
        im.reshape(n, -1),
        _orientation_histograms(im, n_bins=9, cell=4),
        torch.relu(pooled @ proj / 14.0),
    ]
    return views, target[keep]


# --- missing-value masks (chapter 12) ----------------------------------------------------------
__all__ += ["missing_at_random_mask", "block_mask", "holdout_mask"]


def missing_at_random_mask(shape, rate: float, seed: int = 0) -> np.ndarray:
    """A boolean mask, ``True`` = missing, each entry missing independently with probability ``rate``.

    The mask depends on no data value, so in Rubin's (1976) terms the values are *missing
    completely at random* (MCAR); the function keeps the everyday name. ``shape`` is
    ``(n_samples, n_features)``; returns a numpy ``bool`` array of that shape.
    """
    rate = check_fraction(rate, "rate", allow_zero=True)
    rng = np.random.default_rng(seed)
    return rng.random(tuple(shape)) < rate


def _squares(rng, n: int, H: int, W: int, block: int) -> np.ndarray:
    """``n`` random ``block × block`` squares inside an ``H × W`` image, ``(n, H·W)`` bool."""
    top = rng.integers(0, H - block + 1, n)
    left = rng.integers(0, W - block + 1, n)
    rows = np.arange(H)[None, :, None]
    cols = np.arange(W)[None, None, :]
    m = (
        (rows >= top[:, None, None])
        & (rows < top[:, None, None] + block)
        & (cols >= left[:, None, None])
        & (cols < left[:, None, None] + block)
    )
    return m.reshape(n, H * W)


def block_mask(n_samples: int, image_shape, block: int, seed: int = 0) -> np.ndarray:
    """One missing ``block × block`` square per image at a random position, ``(n, H·W)`` bool.

    ``True`` marks a missing pixel; the square lies fully inside the ``H × W`` image.
    """
    n_samples = check_positive_int(n_samples, "n_samples")
    H, W = check_image_shape(image_shape)
    block = check_positive_int(block, "block", maximum=min(H, W))
    return _squares(np.random.default_rng(seed), n_samples, H, W, block)


def holdout_mask(
    X,
    fraction: float = 0.1,
    seed: int = 0,
    max_rows: Optional[int] = None,
    *,
    block: Optional[int] = None,
    image_shape=None,
) -> np.ndarray:
    """Hide a random part of the *observed* values: ``(n, d)`` bool, ``True`` = hidden.

    The hold-out is drawn in ``max_rows`` rows chosen at random among the *usable* rows, those
    with at least two observed values (all usable rows when ``max_rows`` is None); rows with
    fewer (an all-missing row, say) are never drawn and do not change which rows are. Two shapes:

    * ``block=None``: each observed entry (not NaN) of a drawn row is hidden independently with
      probability ``fraction`` (missing completely at random among the observed values);
    * ``block=b`` with ``image_shape=(H, W)``: each drawn row hides the observed pixels of one
      ``b × b`` square at a uniform random position, the shape of :func:`block_mask`
      (``fraction`` is not used). A row keeps its square only if at least one observed pixel
      lies inside it and one outside.

    Truly missing entries are never marked, so imputing ``X (n, d)`` with the marked entries
    set to NaN and scoring them needs no ground truth.
    """
    fraction = check_fraction(fraction, "fraction")
    X = as_tensor(X, "X", finite=False, allow_empty=True)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {tuple(X.shape)}")
    A = check_missing_data(X, "X").detach().cpu().double().numpy()
    if block is not None:
        H, W = check_image_shape(image_shape, A.shape[1])
        block = check_positive_int(block, "block", maximum=min(H, W))
    observed = ~np.isnan(A)
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(observed.sum(1) >= 2)
    if max_rows is not None and len(rows) > max_rows:
        rows = np.sort(
            rng.choice(rows, check_positive_int(max_rows, "max_rows"), replace=False)
        )
    hide = np.zeros(A.shape, dtype=bool)
    if block is None:
        hide[rows] = (rng.random((len(rows), A.shape[1])) < fraction) & observed[rows]
    else:
        # a stream of its own: block_mask(seed=s) and holdout_mask(seed=s) never coincide
        sq = _squares(np.random.default_rng([seed, 1]), len(rows), H, W, block)
        sq &= observed[rows]
        keep = sq.any(1) & (observed[rows] & ~sq).any(1)
        hide[rows[keep]] = sq[keep]
    return hide
