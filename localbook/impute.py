r"""Imputing missing pixels with a two-layer local-mean autoencoder.

Song (2026) proposes a two-layer local-mean "autoencoder" (pixel level and image level) for
imputing Fashion-MNIST; the construction below is this package's reading of it. "Autoencoder" in
the loose sense: an incomplete image is mapped to a complete reconstruction, with no learned code —
the stored reference images play the role of the parameters.

Missing values are NaN; ``m_ip = 1`` where pixel ``p`` of image ``i`` is observed, ``r_p`` is
the (row, column) position of pixel ``p`` and ``P`` the number of pixels.

Layer 1 (*pixel level*, :func:`pixel_local_mean`) fills each missing pixel with the local mean of
the *observed* pixels of the same image, localized in pixel coordinates:

.. math::  z_{ip} = \frac{\sum_{q \ne p} K_h(r_p, r_q)\, m_{iq}\, x_{iq}}{S_{ip}}, \qquad
           S_{ip} = \sum_{q \ne p} K_h(r_p, r_q)\, m_{iq} \qquad (m_{ip} = 0),

and ``z_ip = x_ip`` where ``m_ip = 1``; ``S_ip`` is the kernel mass of the observed pixels
around ``p``.

Layer 2 (*image level*, :func:`image_local_mean`) averages the layer-1 images of similar
reference images:

.. math::  \hat z_{ip} = \frac{\sum_{j \in N_i} w_{ij}\, c_{jp}\, z_{jp}}
                              {\sum_{j \in N_i} w_{ij}\, c_{jp}}, \qquad
           w_{ij} \propto k(d_{ij}/h_i), \qquad
           d_{ij}^2 = \frac{P}{|O_i \cap O_j|}\sum_{p \in O_i \cap O_j} (x_{ip} - x_{jp})^2,

where ``O_i`` is the set of pixels image ``i`` observes (the distance is scikit-learn's
``nan_euclidean``: similarity is computed only on the pixels both images observe; ``+inf``, and
weight 0, for two images sharing no observed pixel), ``c_jp = 1`` where reference image ``j``
observed pixel ``p`` and ``c_jp = λ`` (``imputed_weight``) where its value is a layer-1
imputation, ``N_i`` holds the ``n_neighbors`` nearest reference images and ``h_i`` is the largest
finite distance among them (the distance to the ``n_neighbors``-th neighbour).

The image itself is **not** among its neighbours: :class:`LocalMeanImputer` leaves out of
``N_i`` every reference row identical to the query (same values, NaNs in the same places). In
``fit_transform(X)`` that removes image ``i`` itself (and any exact duplicate of it in ``X``),
which is why ``fit_transform(X)`` equals ``fit(X).transform(X)``. The image's own pixels enter
only through layer 1, in the final local mean over both sources,

.. math::  \hat x_{ip} = \frac{S_{ip}\, z_{ip} + \beta\, \hat z_{ip}}{S_{ip} + \beta}
           \qquad (\beta = \texttt{image\_weight}).

With ``layers="pixel"`` the output is ``z``; with ``layers="image"`` layer 2 runs on the raw
values instead, averaging only the neighbours that observed the pixel (``c_jp = 0`` otherwise).
A pixel that no layer reaches gets the mean of the observed reference values of its feature.
Observed pixels are never changed.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple

import numpy as np
import torch

from ._validate import as_tensor, check_choice, check_positive_float, check_positive_int
from .kernels import chunk_rows, get_kernel, iter_chunks, scaled_sq_dist

__all__ = [
    "pixel_positions",
    "pixel_local_mean",
    "nan_sq_distances",
    "image_local_mean",
    "LocalMeanImputer",
    "missing_at_random_mask",
    "block_mask",
    "rmse_missing",
]


# --- masks and scores ----------------------------------------------------------------------
def missing_at_random_mask(shape, rate: float, seed: int = 0) -> np.ndarray:
    """A boolean mask, ``True`` = missing, each entry missing independently with probability ``rate``.

    The mask depends on no data value, so in Rubin's (1976) terms the values are *missing
    completely at random* (MCAR); the function keeps the everyday name. ``shape`` is
    ``(n_samples, n_features)``; returns a numpy ``bool`` array of that shape.
    """
    rate = check_positive_float(rate, "rate", allow_zero=True)
    if rate >= 1:
        raise ValueError(f"rate must be in [0, 1), got {rate}")
    rng = np.random.default_rng(seed)
    return rng.random(tuple(shape)) < rate


def block_mask(n_samples: int, image_shape, block: int, seed: int = 0) -> np.ndarray:
    """One missing ``block × block`` square per image at a random position, ``(n, H·W)`` bool.

    ``True`` marks a missing pixel; the square lies fully inside the ``H × W`` image.
    """
    n_samples = check_positive_int(n_samples, "n_samples")
    H, W = _check_image_shape(image_shape, None)
    block = check_positive_int(block, "block", maximum=min(H, W))
    rng = np.random.default_rng(seed)
    top = rng.integers(0, H - block + 1, n_samples)
    left = rng.integers(0, W - block + 1, n_samples)
    rows = np.arange(H)[None, :, None]
    cols = np.arange(W)[None, None, :]
    m = ((rows >= top[:, None, None]) & (rows < top[:, None, None] + block)
         & (cols >= left[:, None, None]) & (cols < left[:, None, None] + block))
    return m.reshape(n_samples, H * W)


def rmse_missing(x_imputed, x_true, missing) -> float:
    r"""Root mean squared error on the missing entries only: :math:`\sqrt{\mathrm{mean}_{(i,p) \in \mathcal M} (\hat x_{ip} - x_{ip})^2}`.

    All three arguments are ``(n, d)`` array-likes (``missing`` boolean, ``True`` = missing).
    """
    a = np.asarray(x_imputed.detach().cpu() if isinstance(x_imputed, torch.Tensor) else x_imputed, dtype=float)
    b = np.asarray(x_true.detach().cpu() if isinstance(x_true, torch.Tensor) else x_true, dtype=float)
    m = np.asarray(missing.detach().cpu() if isinstance(missing, torch.Tensor) else missing, dtype=bool)
    if a.shape != b.shape or a.shape != m.shape:
        raise ValueError(f"x_imputed, x_true and missing must have the same shape, got {a.shape}, {b.shape}, {m.shape}")
    if not m.any():
        raise ValueError("missing marks no entry; the RMSE on missing entries is undefined")
    return float(np.sqrt(np.mean((a[m] - b[m]) ** 2)))


# --- validation helpers --------------------------------------------------------------------
def _check_image_shape(image_shape, n_features: Optional[int]) -> Tuple[int, int]:
    if image_shape is None:
        raise ValueError("image_shape is needed for the pixel layer: pass (height, width) of the flattened images")
    try:
        hw = tuple(image_shape)
    except TypeError:
        raise TypeError(f"image_shape must be a (height, width) pair, got {type(image_shape).__name__}") from None
    if len(hw) != 2:
        raise ValueError(f"image_shape must be a (height, width) pair, got {image_shape!r}")
    H = check_positive_int(hw[0], "image_shape[0]")
    W = check_positive_int(hw[1], "image_shape[1]")
    if n_features is not None and H * W != n_features:
        raise ValueError(f"image_shape {H}×{W} = {H * W} pixels does not match X's {n_features} features")
    return H, W


def _check_missing_data(X, name: str = "X", like: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(n, d)`` float tensor where NaN marks a missing value; infinities are rejected."""
    t = as_tensor(X, name, like=like, ndim=(2,), finite=False)
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); at least one sample and one feature are needed")
    if bool(torch.isinf(t).any()):
        raise ValueError(f"{name} contains {int(torch.isinf(t).sum())} infinite value(s); only NaN may mark a missing value")
    return t


# --- layer 1: pixel level -------------------------------------------------------------------
def pixel_positions(image_shape, *, dtype=None, device=None) -> torch.Tensor:
    """The (row, column) coordinates of the pixels of an ``H × W`` image in row-major order, ``(H·W, 2)``."""
    H, W = _check_image_shape(image_shape, None)
    r, c = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    return torch.stack([r.reshape(-1), c.reshape(-1)], 1).to(dtype=dtype or torch.get_default_dtype(), device=device)


def pixel_local_mean(X, image_shape, bandwidth: float = 1.0, kernel: str = "gaussian",
                     return_mass: bool = False):
    r"""Layer 1: fill each missing pixel with the local mean of the observed pixels of its own image.

    :math:`z_{ip} = \sum_q K_h(r_p, r_q) m_{iq} x_{iq} / S_{ip}`, :math:`S_{ip} = \sum_q K_h(r_p, r_q) m_{iq}`
    for missing ``p``; observed pixels unchanged. ``X (n, H·W)`` with NaN = missing,
    ``image_shape = (H, W)``, ``bandwidth`` in pixels. Numerator and mass are two matrix products
    with the ``(P, P)`` kernel matrix; images where a mass underflows are redone in log space, so a
    pixel deep inside a missing block gets its nearest observed pixels' mean. A pixel with no
    observed pixel in reach (nothing observed, or a compact kernel) stays NaN. Returns
    ``z (n, H·W)`` on X's device and dtype, and with ``return_mass`` also ``S (n, H·W)`` (the
    kernel mass of the observed pixels around each pixel, excluding the pixel itself).
    """
    X = _check_missing_data(X)
    H, W = _check_image_shape(image_shape, X.shape[1])
    h = check_positive_float(bandwidth, "bandwidth")
    kern = get_kernel(kernel)
    pos = pixel_positions((H, W), dtype=X.dtype, device=X.device)
    hh = torch.full((2,), h, dtype=X.dtype, device=X.device)
    log_k = kern.log_profile(scaled_sq_dist(pos, pos, hh, center=pos.mean(0)))  # (P, P), symmetric
    log_k.fill_diagonal_(-math.inf)  # a pixel never predicts itself
    K = torch.exp(log_k)
    miss = torch.isnan(X)
    M = (~miss).to(X.dtype)
    Z = torch.nan_to_num(X, nan=0.0)
    num, mass = Z @ K, M @ K  # K symmetric: (n, P)
    est = num / mass.clamp(min=torch.finfo(X.dtype).tiny)
    # masses that are zero or subnormal lose precision: redo those images in log space
    tiny = torch.finfo(X.dtype).tiny / torch.finfo(X.dtype).eps
    redo = torch.nonzero((miss & (mass < tiny)).any(1)).flatten()
    P = X.shape[1]
    rows = chunk_rows(redo.numel(), P, P, X.element_size(), None, X.device)
    for sl in iter_chunks(redo.numel(), rows):
        idx = redo[sl]
        log_m = torch.log(M[idx])  # log of the observed mask (−inf where missing)
        lw = log_k[None, :, :] + log_m[:, None, :]  # (r, P target, P source)
        lse = torch.logsumexp(lw, dim=2, keepdim=True)
        w = torch.exp(lw - lse)  # NaN rows where nothing is in reach (−inf − −inf)
        est[idx] = (w @ Z[idx][:, :, None])[..., 0]
    out = torch.where(miss, est, X)
    return (out, mass) if return_mass else out


# --- layer 2: image level -------------------------------------------------------------------
def nan_sq_distances(Xq, X) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Squared distances on commonly observed features, scaled to all features (``nan_euclidean``).

    :math:`d^2_{ij} = \frac{P}{|O_i \cap O_j|} \sum_{p \in O_i \cap O_j} (x_{ip} - x_{jp})^2`, with
    ``+inf`` where two rows share no observed feature. ``Xq (m, P)``, ``X (n, P)`` with NaN =
    missing; returns ``(d2 (m, n), common (m, n))``, ``common`` the number of shared features.
    Computed in row chunks through three matrix products.
    """
    X = _check_missing_data(X, "X")
    Xq = _check_missing_data(Xq, "Xq", like=X)
    if Xq.shape[1] != X.shape[1]:
        raise ValueError(f"Xq has {Xq.shape[1]} features but X has {X.shape[1]}")
    return _nan_sq_dist(Xq, X)


def _nan_sq_dist(Xq, X):
    Mq, M = (~torch.isnan(Xq)).to(X.dtype), (~torch.isnan(X)).to(X.dtype)
    Zq, Z = torch.nan_to_num(Xq, nan=0.0), torch.nan_to_num(X, nan=0.0)
    P = X.shape[1]
    d2 = torch.empty(Xq.shape[0], X.shape[0], dtype=X.dtype, device=X.device)
    common = torch.empty_like(d2)
    rows = chunk_rows(Xq.shape[0], X.shape[0], 1, X.element_size(), None, X.device)
    Z2T = (Z * Z).T
    for sl in iter_chunks(Xq.shape[0], rows):
        zq = Zq[sl]
        s = (zq * zq) @ M.T + Mq[sl] @ Z2T - 2.0 * (zq @ Z.T)
        c = Mq[sl] @ M.T
        common[sl] = c
        d2[sl] = torch.where(c > 0, s.clamp(min=0.0) * P / c.clamp(min=1.0), torch.full_like(s, math.inf))
    return d2, common


def image_local_mean(Xq, X_ref, Z_ref, n_neighbors: int = 10, kernel: str = "gaussian",
                     exclude: Optional[torch.Tensor] = None, imputed_weight: float = 1.0) -> torch.Tensor:
    r"""Layer 2: the local mean over similar images, ``(m, P)``.

    :math:`\hat z_{ip} = \sum_j w_{ij} c_{jp} z_{jp} / \sum_j w_{ij} c_{jp}` with
    :math:`c_{jp} = 1` where reference image ``j`` observes pixel ``p`` and
    :math:`c_{jp} = \lambda` (``imputed_weight``, in ``(0, 1]``) where its value ``z_jp`` was
    itself imputed. ``Xq (m, P)`` / ``X_ref (n, P)`` are the masked images (NaN = missing) that
    define the distances :math:`d_{ij}` on commonly observed pixels (:func:`nan_sq_distances`);
    ``Z_ref (n, P)`` holds the values averaged (the reference images' layer-1 outputs). The
    neighbourhood of query ``i`` is its ``n_neighbors`` nearest reference images
    (``exclude[i, j] = True`` removes a pair), weighted by :math:`w_{ij} = K(d_{ij}/h_i)` with
    ``h_i`` the distance to the ``n_neighbors``-th neighbour. A query sharing no observed pixel with
    any reference image gets NaN.
    """
    X_ref = _check_missing_data(X_ref, "X_ref")
    Xq = _check_missing_data(Xq, "Xq", like=X_ref)
    Z_ref = as_tensor(Z_ref, "Z_ref", like=X_ref, ndim=(2,), finite=False)
    if Xq.shape[1] != X_ref.shape[1] or Z_ref.shape != X_ref.shape:
        raise ValueError(f"Xq {tuple(Xq.shape)}, X_ref {tuple(X_ref.shape)} and Z_ref {tuple(Z_ref.shape)} must "
                         "have the same number of features, and Z_ref the shape of X_ref")
    n_neighbors = check_positive_int(n_neighbors, "n_neighbors")
    lam = _check_imputed_weight(imputed_weight)
    kern = get_kernel(kernel)
    if exclude is not None:
        exclude = torch.as_tensor(exclude, dtype=torch.bool, device=X_ref.device)
        if exclude.shape != (Xq.shape[0], X_ref.shape[0]):
            raise ValueError(f"exclude must have shape {(Xq.shape[0], X_ref.shape[0])}, got {tuple(exclude.shape)}")
    return _image_local_mean(Xq, Z_ref, X_ref, n_neighbors, kern, exclude, lam)


def _check_imputed_weight(value) -> float:
    lam = check_positive_float(value, "imputed_weight")
    if lam > 1:
        raise ValueError(f"imputed_weight must be in (0, 1] (an imputed value counts at most as much as an observed one), got {lam}")
    return lam


def _image_local_mean(Xq, Z_ref, X_ref, n_neighbors, kern, exclude, lam):
    w, idx = _neighbour_weights(Xq, X_ref, n_neighbors, kern, exclude)
    w = torch.nan_to_num(w, nan=0.0)  # a query with no usable neighbour: all weights 0 → NaN below
    out = torch.empty(Xq.shape[0], Z_ref.shape[1], dtype=Z_ref.dtype, device=Z_ref.device)
    rows = chunk_rows(Xq.shape[0], Z_ref.shape[1], 3 * idx.shape[1], Z_ref.element_size(), None, Z_ref.device)
    for sl in iter_chunks(Xq.shape[0], rows):
        observed = (~torch.isnan(X_ref[idx[sl]])).to(Z_ref.dtype)  # (r, k, P)
        c = w[sl][..., None] * (lam + (1.0 - lam) * observed)
        den = c.sum(1)
        num = (c * Z_ref[idx[sl]]).sum(1)
        out[sl] = torch.where(den > 0, num / den.clamp(min=torch.finfo(den.dtype).tiny), torch.full_like(den, math.nan))
    return out


def _neighbour_weights(Xq, X_ref, n_neighbors, kern, exclude):
    """Normalized weights ``(m, k)`` and indices ``(m, k)`` of the nearest reference images."""
    d2, _ = _nan_sq_dist(Xq, X_ref)
    if exclude is not None:
        d2 = d2.masked_fill(exclude, math.inf)
    k = min(n_neighbors, X_ref.shape[0])
    vals, idx = torch.topk(d2, k, dim=1, largest=False)  # (m, k)
    finite = torch.isfinite(vals)
    h2 = torch.where(finite, vals, torch.zeros_like(vals)).max(1).values
    h2 = torch.where(h2 > 0, h2, torch.ones_like(h2))
    # u² = d²/h²: the k-th neighbour sits at u = 1 (weight e^{-1/2} for the Gaussian)
    lw = torch.where(finite, kern.log_profile(vals / h2[:, None]), torch.full_like(vals, -math.inf))
    w = torch.exp(lw - torch.logsumexp(lw, 1, keepdim=True))  # NaN rows: nothing in reach
    return w, idx


# --- the estimator ----------------------------------------------------------------------------
try:  # scikit-learn's estimator API (get_params/set_params/clone, fit_transform)
    from sklearn.base import BaseEstimator, TransformerMixin
except ImportError:  # pragma: no cover - scikit-learn is a dependency of localbook
    BaseEstimator, TransformerMixin = object, object


class LocalMeanImputer(TransformerMixin, BaseEstimator):
    r"""Two-layer local-mean autoencoder for images with missing pixels (scikit-learn imputer API).

    ``fit(X)`` stores the reference images ``X (n, H·W)`` (NaN = missing) and their layer-1
    completions ``Z_ref``; ``transform(X)`` imputes images ``X (m, H·W)`` in two layers:

    1. *pixel level* (:func:`pixel_local_mean`): ``z_ip``, the local mean of the observed pixels
       of the same image around pixel ``p``, with kernel mass ``S_ip``;
    2. *image level* (:func:`image_local_mean`): ``ẑ_ip = Σ_j w_ij c_jp Z_ref[j, p] / Σ_j w_ij c_jp``,
       the local mean of the layer-1 images of the ``n_neighbors`` most similar reference images
       (similarity on the pixels both observe), where a neighbour's value counts fully if it
       observed the pixel (``c = 1``) and with weight ``c = λ = imputed_weight`` if it imputed it.

    The output for a missing pixel is one local mean over both sources,
    :math:`\hat x_{ip} = (S_{ip} z_{ip} + \beta\, \hat z_{ip}) / (S_{ip} + \beta)`, with
    ``β = image_weight``: where many pixels nearby are observed (small holes) the pixel level
    dominates; deep inside a missing block (``S ≈ 0``) the image level takes over. Observed values
    are returned unchanged. Reference rows identical to a query (same values, same NaNs) are left
    out of its neighbourhood, so ``fit_transform(X)`` equals ``fit(X).transform(X)``.

    Parameters
    ----------
    image_shape : ``(H, W)`` of the flattened images; required unless ``layers="image"``.
    layers : ``"both"`` (default), ``"pixel"`` (layer 1 only) or ``"image"`` (layer 2 only, on the
        raw values: a kernel-weighted KNN imputer averaging the neighbours that observe the pixel).
    pixel_bandwidth, pixel_kernel : the layer-1 kernel on pixel coordinates (bandwidth in pixels).
    n_neighbors, image_kernel : the layer-2 neighbourhood size and kernel.
    image_weight : ``β > 0``, the weight of the image level against the pixel level's kernel mass.
    imputed_weight : ``λ ∈ (0, 1]``, how much a neighbour's layer-1 (imputed) value counts against
        an observed one in layer 2.

    Inputs: numpy arrays give numpy arrays back; tensors give tensors on their device and dtype.
    A pixel neither layer can reach gets the mean of the observed reference values of that feature.
    """

    def __init__(self, image_shape=None, *, layers: str = "both", pixel_bandwidth: float = 0.7,
                 pixel_kernel: str = "gaussian", n_neighbors: int = 10, image_kernel: str = "gaussian",
                 image_weight: float = 0.3, imputed_weight: float = 0.3):
        self.image_shape = image_shape
        self.layers = layers
        self.pixel_bandwidth = pixel_bandwidth
        self.pixel_kernel = pixel_kernel
        self.n_neighbors = n_neighbors
        self.image_kernel = image_kernel
        self.image_weight = image_weight
        self.imputed_weight = imputed_weight

    # parameters are validated at fit time, as scikit-learn estimators do
    def _check_params(self, n_features: int):
        check_choice(self.layers, "layers", ["both", "pixel", "image"])
        if self.layers != "image" or self.image_shape is not None:
            _check_image_shape(self.image_shape, n_features)
        check_positive_float(self.pixel_bandwidth, "pixel_bandwidth")
        get_kernel(self.pixel_kernel)
        check_positive_int(self.n_neighbors, "n_neighbors")
        get_kernel(self.image_kernel)
        check_positive_float(self.image_weight, "image_weight")
        _check_imputed_weight(self.imputed_weight)

    def _layer1(self, X):
        return pixel_local_mean(X, self.image_shape, self.pixel_bandwidth, self.pixel_kernel, return_mass=True)

    def fit(self, X, y=None):
        """Store the reference images ``X (n, P)`` (NaN = missing) and their layer-1 completion."""
        X = _check_missing_data(X)
        self._check_params(X.shape[1])
        observed = ~torch.isnan(X)
        if not bool(observed.any()):
            raise ValueError("X has no observed value at all; nothing to impute from")
        counts = observed.sum(0)
        self.X_ref_ = X
        self.Z_ref_, self._mass_ref = (X, None) if self.layers == "image" else self._layer1(X)
        self.feature_mean_ = torch.where(counts > 0, torch.nan_to_num(X, nan=0.0).sum(0) / counts.clamp(min=1),
                                         torch.full_like(X[0], math.nan))
        if bool((counts == 0).all()) or bool(torch.isnan(self.feature_mean_).all()):
            raise ValueError("X has no observed value at all; nothing to impute from")
        # a never-observed feature falls back to the overall mean of the observed values
        self.feature_mean_ = torch.nan_to_num(self.feature_mean_, nan=float(X[observed].mean()))
        self.n_features_in_ = X.shape[1]
        return self

    def fit_transform(self, X, y=None):
        """``fit(X).transform(X)``, reusing the layer-1 pass of ``fit``."""
        self.fit(X)
        return self._transform(X, same_as_fit=True)

    def transform(self, X):
        """Impute ``X (m, P)``: observed entries unchanged, missing ones from the two layers."""
        return self._transform(X)

    def _transform(self, X, same_as_fit: bool = False):
        if not hasattr(self, "X_ref_"):
            raise RuntimeError("this LocalMeanImputer is not fitted yet; call fit(X) first")
        is_numpy = not isinstance(X, torch.Tensor)
        X = _check_missing_data(X, like=self.X_ref_)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but LocalMeanImputer was fitted with {self.n_features_in_}")
        miss = torch.isnan(X)
        out = X.clone()
        rows = torch.nonzero(miss.any(1)).flatten()
        if rows.numel():
            Xm = X[rows]
            kern = get_kernel(self.image_kernel)
            if self.layers == "image":
                same = _identical_rows(Xm, self.X_ref_)
                Z = _observed_mean(Xm, self.X_ref_, self.n_neighbors, kern, same)
            else:
                z, mass = (self.Z_ref_[rows], self._mass_ref[rows]) if same_as_fit else self._layer1(Xm)
                if self.layers == "pixel":
                    Z = z
                else:
                    same = _identical_rows(Xm, self.X_ref_)
                    zhat = _image_local_mean(Xm, self.Z_ref_, self.X_ref_, self.n_neighbors, kern, same,
                                             float(self.imputed_weight))
                    Z = _combine(z, mass, zhat, self.image_weight)
            Z = torch.where(torch.isnan(Z), self.feature_mean_.expand_as(Z), Z)
            out[rows] = torch.where(miss[rows], Z, Xm)
        return out.cpu().numpy() if is_numpy else out


def _combine(z, mass, zhat, beta):
    """``(S z + β ẑ) / (S + β)``, using whichever of the two is defined where the other is NaN."""
    a = torch.where(torch.isnan(z), torch.zeros_like(mass), mass)
    b = torch.where(torch.isnan(zhat), torch.zeros_like(mass), torch.full_like(mass, beta))
    num = a * torch.nan_to_num(z, nan=0.0) + b * torch.nan_to_num(zhat, nan=0.0)
    den = a + b
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(z.dtype).tiny), torch.full_like(num, math.nan))


def _identical_rows(Xq, X):
    """``(m, n)`` bool: row ``i`` of ``Xq`` equals row ``j`` of ``X``, NaNs in the same places.

    Candidates come from a random projection of (values, mask); each candidate pair is then
    compared entry by entry, so the answer is exact.
    """
    g = torch.Generator(device="cpu").manual_seed(12345)
    proj = torch.randn(2, X.shape[1], generator=g, dtype=torch.float64).to(device=X.device, dtype=X.dtype)

    def code(A):
        return torch.nan_to_num(A, nan=0.0) @ proj[0] + (~torch.isnan(A)).to(A.dtype) @ proj[1]

    cq, cr = code(Xq), code(X)
    tol = 1e-6 * (1.0 + cr.abs().max())
    same = torch.zeros(Xq.shape[0], X.shape[0], dtype=torch.bool, device=X.device)
    rows = chunk_rows(Xq.shape[0], X.shape[0], 1, X.element_size(), None, X.device)
    for sl in iter_chunks(Xq.shape[0], rows):
        a, b = torch.nonzero((cq[sl, None] - cr[None, :]).abs() <= tol, as_tuple=True)
        if a.numel():
            A, B = Xq[sl][a], X[b]
            eq = ((A == B) | (torch.isnan(A) & torch.isnan(B))).all(1)
            same[sl][a[eq], b[eq]] = True
    return same


def _observed_mean(Xq, X_ref, n_neighbors, kern, exclude):
    """Layer 2 alone on raw values: for each pixel, average only the neighbours that observe it."""
    w, idx = _neighbour_weights(Xq, X_ref, n_neighbors, kern, exclude)
    w = torch.nan_to_num(w, nan=0.0)
    nb = X_ref[idx]  # (m, k, P)
    obs = (~torch.isnan(nb)).to(X_ref.dtype)
    num = (w[..., None] * obs * torch.nan_to_num(nb, nan=0.0)).sum(1)
    den = (w[..., None] * obs).sum(1)
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(X_ref.dtype).tiny), torch.full_like(num, math.nan))
