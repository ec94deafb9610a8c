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
Observed pixels are never changed. Without ``image_shape`` the imputer is a *tabular* local-mean
imputer: ``layers="image"`` on raw values, for any table of numbers with NaN holes.

**Data-driven defaults.** ``pixel_bandwidth="auto"`` and ``image_weight="auto"`` (the defaults)
choose ``h`` and ``β`` at ``fit`` time by the hold-out recipe: hide a random ``holdout`` fraction
(10 %) of the *observed* values of up to 200 reference rows (:func:`holdout_mask`), impute them with
the rest of the reference set (each row's own original and its exact copies left out) for every
pair on a grid (:data:`PIXEL_BANDWIDTH_GRID` × :data:`IMAGE_WEIGHT_GRID`), and keep the pair with
the smallest RMSE on the hidden values. The neighbours are found once; each ``h`` costs one pixel
pass over the hold-out rows and their neighbours (separable Gaussian convolution) and each ``β``
only a weighted average, so tuning costs about as much as one ``transform`` of 200 rows plus
:data:`PIXEL_BANDWIDTH_GRID`-many pixel passes over at most ``200 · n_neighbors`` rows. The hidden
values are missing completely at random among the observed ones, so the choice is tuned to the
missingness of the data passed to ``fit`` (fit on complete images, it is tuned for few holes).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

from ._validate import as_tensor, check_choice, check_positive_float, check_positive_int
from .kernels import chunk_rows, get_kernel, iter_chunks, scaled_sq_dist

__all__ = [
    "PIXEL_BANDWIDTH_GRID",
    "IMAGE_WEIGHT_GRID",
    "holdout_mask",
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


def holdout_mask(X, fraction: float = 0.1, seed: int = 0, max_rows: Optional[int] = None) -> np.ndarray:
    """Hide a random part of the *observed* values: ``(n, d)`` bool, ``True`` = hidden.

    Each observed entry (not NaN) of ``X (n, d)`` is hidden independently with probability
    ``fraction``, in ``max_rows`` rows drawn at random among those with at least two observed
    values (all of them when ``max_rows`` is None). Truly missing entries are never marked, so
    imputing ``X`` with the marked entries set to NaN and scoring them needs no ground truth.
    """
    fraction = check_positive_float(fraction, "fraction")
    if fraction >= 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    A = X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else np.asarray(X, dtype=float)
    if A.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {A.shape}")
    observed = ~np.isnan(A)
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(observed.sum(1) >= 2)
    if max_rows is not None and len(rows) > max_rows:
        rows = np.sort(rng.choice(rows, check_positive_int(max_rows, "max_rows"), replace=False))
    hide = np.zeros(A.shape, dtype=bool)
    hide[rows] = (rng.random((len(rows), A.shape[1])) < fraction) & observed[rows]
    return hide


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
    with the ``(P, P)`` kernel matrix (for the Gaussian, separable convolutions along rows and
    columns); images where a mass underflows are redone in log space, so a
    pixel deep inside a missing block gets its nearest observed pixels' mean. A pixel with no
    observed pixel in reach (nothing observed, or a compact kernel) stays NaN. Returns
    ``z (n, H·W)`` on X's device and dtype, and with ``return_mass`` also ``S (n, H·W)`` (the
    kernel mass of the observed pixels around each pixel, excluding the pixel itself).
    """
    X = _check_missing_data(X)
    H, W = _check_image_shape(image_shape, X.shape[1])
    h = check_positive_float(bandwidth, "bandwidth")
    out, mass = _pixel_layer(X, H, W, h, get_kernel(kernel))
    return (out, mass) if return_mass else out


def _pixel_layer(X, H, W, h, kern):
    """Layer 1 on validated input: ``(z, S)``. The Gaussian kernel on a grid is separable,
    ``K = K_rows ⊗ K_cols``, so its products cost ``n·P·(H + W)`` instead of ``n·P²``; the
    pixel's own term (``k(0) = 1``) is subtracted, and it is zero at a missing pixel anyway."""
    miss = torch.isnan(X)
    M = (~miss).to(X.dtype)
    Z = torch.nan_to_num(X, nan=0.0)
    n, P = X.shape
    if kern.name == "gaussian":
        def conv(A):
            kr, kc = (torch.exp(-0.5 * ((torch.arange(L, dtype=X.dtype, device=X.device)[:, None]
                                          - torch.arange(L, dtype=X.dtype, device=X.device)) / h) ** 2)
                      for L in (H, W))
            return (kr @ A.reshape(n, H, W) @ kc).reshape(n, P)
        num, mass = conv(Z) - Z, (conv(M) - M).clamp(min=0.0)
        log_k = None
    else:
        log_k = _log_pixel_kernel(H, W, h, kern, X)
        K = torch.exp(log_k)
        num, mass = Z @ K, M @ K  # K symmetric: (n, P)
    est = num / mass.clamp(min=torch.finfo(X.dtype).tiny)
    # masses that are zero or subnormal lose precision: redo those images in log space
    tiny = torch.finfo(X.dtype).tiny / torch.finfo(X.dtype).eps
    redo = torch.nonzero((miss & (mass < tiny)).any(1)).flatten()
    if redo.numel():
        log_k = _log_pixel_kernel(H, W, h, kern, X) if log_k is None else log_k
        rows = chunk_rows(redo.numel(), P, P, X.element_size(), None, X.device)
        for sl in iter_chunks(redo.numel(), rows):
            idx = redo[sl]
            log_m = torch.log(M[idx])  # log of the observed mask (−inf where missing)
            lw = log_k[None, :, :] + log_m[:, None, :]  # (r, P target, P source)
            lse = torch.logsumexp(lw, dim=2, keepdim=True)
            w = torch.exp(lw - lse)  # NaN rows where nothing is in reach (−inf − −inf)
            est[idx] = (w @ Z[idx][:, :, None])[..., 0]
    return torch.where(miss, est, X), mass


def _log_pixel_kernel(H, W, h, kern, X):
    """The ``(P, P)`` log-kernel matrix on pixel positions, −inf on the diagonal."""
    pos = pixel_positions((H, W), dtype=X.dtype, device=X.device)
    hh = torch.full((2,), h, dtype=X.dtype, device=X.device)
    log_k = kern.log_profile(scaled_sq_dist(pos, pos, hh, center=pos.mean(0)))  # symmetric
    return log_k.fill_diagonal_(-math.inf)  # a pixel never predicts itself


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
    return _average(w, idx, Z_ref, X_ref, lam)


def _average(w, idx, Z_ref, X_ref, lam):
    """``Σ_j w_ij c_jp Z_ref[j, p] / Σ_j w_ij c_jp`` over the neighbours ``idx``; ``(m, P)``."""
    w = torch.nan_to_num(w, nan=0.0)  # a query with no usable neighbour: all weights 0 → NaN below
    out = torch.empty(w.shape[0], Z_ref.shape[1], dtype=Z_ref.dtype, device=Z_ref.device)
    rows = chunk_rows(w.shape[0], Z_ref.shape[1], 3 * idx.shape[1], Z_ref.element_size(), None, Z_ref.device)
    for sl in iter_chunks(w.shape[0], rows):
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
from sklearn.base import BaseEstimator, TransformerMixin  # noqa: E402  (a dependency of localbook)
from sklearn.utils.validation import check_is_fitted  # noqa: E402

try:  # scikit-learn ≥ 1.6
    from sklearn.utils.validation import validate_data as _sk_validate

    def _validate_array(est, X, reset):
        return _sk_validate(est, X, reset=reset, dtype=[np.float64, np.float32], ensure_all_finite="allow-nan")
except ImportError:  # pragma: no cover - older scikit-learn
    def _validate_array(est, X, reset):
        return est._validate_data(X, reset=reset, dtype=[np.float64, np.float32], force_all_finite="allow-nan")

#: Candidate pixel bandwidths (in pixels) for ``pixel_bandwidth="auto"``.
PIXEL_BANDWIDTH_GRID = (0.3, 0.4, 0.5, 0.7, 1.0, 1.4, 2.0)
#: Candidate image weights β for ``image_weight="auto"``: 10^-2 … 10^3 in steps of 10^0.25.
IMAGE_WEIGHT_GRID = tuple(float(10 ** (e / 4)) for e in range(-8, 13))
_HOLDOUT_ROWS = 200
_FALLBACK = {"pixel_bandwidth": 0.7, "image_weight": 0.3}  # when nothing can be held out


class LocalMeanImputer(TransformerMixin, BaseEstimator):
    r"""Two-layer local-mean autoencoder for images with missing pixels (scikit-learn imputer API).

    ``fit(X)`` stores the reference rows ``X (n, P)`` (NaN = missing) and their layer-1
    completions; ``transform(X)`` imputes rows ``X (m, P)`` in two layers:

    1. *pixel level* (:func:`pixel_local_mean`): ``z_ip``, the local mean of the observed pixels
       of the same image around pixel ``p``, with kernel mass ``S_ip``;
    2. *image level* (:func:`image_local_mean`): ``ẑ_ip = Σ_j w_ij c_jp Z_ref[j, p] / Σ_j w_ij c_jp``,
       the local mean of the layer-1 images of the ``n_neighbors`` most similar reference images
       (similarity on the pixels both observe), where a neighbour's value counts fully if it
       observed the pixel (``c = 1``) and with weight ``c = λ = imputed_weight`` if it imputed it.

    The output for a missing pixel is one local mean over both sources,
    :math:`\hat x_{ip} = (S_{ip} z_{ip} + \beta\, \hat z_{ip}) / (S_{ip} + \beta)`, with
    ``β = image_weight``. Observed values are returned unchanged. Reference rows identical to a
    query (same values, same NaNs) are left out of its neighbourhood, so ``fit_transform(X)``
    equals ``fit(X).transform(X)``.

    Parameters
    ----------
    image_shape : ``(H, W)`` of the flattened images, or None for tabular data.
    layers : ``"auto"`` (default: ``"both"`` with ``image_shape``, ``"image"`` without),
        ``"both"``, ``"pixel"`` (layer 1 only) or ``"image"`` (layer 2 only, on the raw values: a
        kernel-weighted KNN imputer averaging the neighbours that observe the value).
    pixel_bandwidth : the layer-1 bandwidth in pixels, or ``"auto"`` (default): chosen on
        :data:`PIXEL_BANDWIDTH_GRID` by the hold-out recipe of the module docstring.
    pixel_kernel, image_kernel : kernel names of the two layers.
    n_neighbors : the layer-2 neighbourhood size.
    image_weight : ``β > 0``, the weight of the image level against the pixel level's kernel mass,
        or ``"auto"`` (default): chosen on :data:`IMAGE_WEIGHT_GRID` with the bandwidth.
    imputed_weight : ``λ ∈ (0, 1]``, how much a neighbour's layer-1 (imputed) value counts against
        an observed one in layer 2.
    holdout : fraction of the observed values of up to 200 rows hidden to tune the ``"auto"``
        parameters. random_state : seed of that draw (the fit is deterministic).

    Attributes: ``layers_``, ``pixel_bandwidth_``, ``image_weight_`` (the values used),
    ``holdout_scores_`` (the grids and the hold-out RMSE, ``None`` without tuning),
    ``n_features_in_``. Inputs: numpy arrays (dense only) give numpy arrays back; tensors give
    tensors on their device and dtype. A value neither layer can reach gets the mean of the
    observed reference values of that feature.
    """

    def __init__(self, image_shape=None, *, layers: str = "auto", pixel_bandwidth="auto",
                 pixel_kernel: str = "gaussian", n_neighbors: int = 10, image_kernel: str = "gaussian",
                 image_weight="auto", imputed_weight: float = 0.3, holdout: float = 0.1,
                 random_state: int = 0):
        self.image_shape = image_shape
        self.layers = layers
        self.pixel_bandwidth = pixel_bandwidth
        self.pixel_kernel = pixel_kernel
        self.n_neighbors = n_neighbors
        self.image_kernel = image_kernel
        self.image_weight = image_weight
        self.imputed_weight = imputed_weight
        self.holdout = holdout
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def _more_tags(self):  # scikit-learn < 1.6
        return {"allow_nan": True}

    # parameters are validated at fit time, as scikit-learn estimators do
    def _check_params(self, n_features: int) -> str:
        layers = check_choice(self.layers, "layers", ["auto", "both", "pixel", "image"])
        if layers == "auto":
            layers = "image" if self.image_shape is None else "both"
        if layers != "image" or self.image_shape is not None:
            _check_image_shape(self.image_shape, n_features)
        for name in ("pixel_bandwidth", "image_weight"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name) == "auto"):
                check_positive_float(getattr(self, name), name)
        get_kernel(self.pixel_kernel)
        check_positive_int(self.n_neighbors, "n_neighbors")
        get_kernel(self.image_kernel)
        _check_imputed_weight(self.imputed_weight)
        h = check_positive_float(self.holdout, "holdout")
        if h >= 1:
            raise ValueError(f"holdout must be in (0, 1), got {h}")
        return layers

    def _validate(self, X, reset: bool):
        """Tensors keep their device and dtype; anything else goes through scikit-learn's checks."""
        if isinstance(X, torch.Tensor):
            t = _check_missing_data(X, like=None if reset else self.X_ref_)
            if reset:
                self.n_features_in_ = t.shape[1]
            elif t.shape[1] != self.n_features_in_:
                raise ValueError(f"X has {t.shape[1]} features, but LocalMeanImputer is expecting "
                                 f"{self.n_features_in_} features as input")
            return t
        import scipy.sparse as sp

        if sp.issparse(X):
            raise TypeError("LocalMeanImputer does not accept sparse input: a stored zero is a value, "
                            "NaN marks a missing one; pass a dense array (X.toarray()) with NaN holes")
        A = _validate_array(self, X, reset)
        t = torch.from_numpy(np.array(A, copy=True))
        return t if reset else t.to(dtype=self.X_ref_.dtype, device=self.X_ref_.device)

    def fit(self, X, y=None):
        """Store the reference rows ``X (n, P)`` (NaN = missing), tune the ``"auto"`` parameters."""
        X = self._validate(X, reset=True)
        layers = self._check_params(X.shape[1])
        observed = ~torch.isnan(X)
        if not bool(observed.any()):
            raise ValueError("X has no observed value at all; nothing to impute from")
        counts = observed.sum(0)
        mean = torch.where(counts > 0, torch.nan_to_num(X, nan=0.0).sum(0) / counts.clamp(min=1),
                           torch.full_like(X[0], math.nan))
        # a never-observed feature falls back to the overall mean of the observed values
        self.feature_mean_ = torch.nan_to_num(mean, nan=float(X[observed].mean()))
        self.layers_ = layers
        self.pixel_bandwidth_, self.image_weight_, self.holdout_scores_ = self._tune(X)
        self.X_ref_ = X
        self.Z_ref_, self._mass_ref = (X, None) if layers == "image" else self._layer1(X)
        return self

    def _layer1(self, X, h=None):
        H, W = _check_image_shape(self.image_shape, X.shape[1])
        return _pixel_layer(X, H, W, self.pixel_bandwidth_ if h is None else h, get_kernel(self.pixel_kernel))

    def _tune(self, X):
        """The hold-out recipe: hide observed values, impute them on a grid, keep the best pair."""
        auto = {name: isinstance(getattr(self, name), str) for name in ("pixel_bandwidth", "image_weight")}
        fixed = {name: _FALLBACK[name] if a else float(getattr(self, name)) for name, a in auto.items()}
        if self.layers_ == "image" or not any(auto.values()) or (self.layers_ == "pixel" and not auto["pixel_bandwidth"]):
            return fixed["pixel_bandwidth"], fixed["image_weight"], None
        hide = torch.as_tensor(holdout_mask(X, self.holdout, self.random_state, _HOLDOUT_ROWS), device=X.device)
        rows = torch.nonzero(hide.any(1)).flatten()
        if rows.numel() == 0:
            return fixed["pixel_bandwidth"], fixed["image_weight"], None
        Xq = X[rows].masked_fill(hide[rows], math.nan)
        truth, hidden = X[rows][hide[rows]], hide[rows]
        hs = PIXEL_BANDWIDTH_GRID if auto["pixel_bandwidth"] else (fixed["pixel_bandwidth"],)
        betas = IMAGE_WEIGHT_GRID if auto["image_weight"] and self.layers_ == "both" else (fixed["image_weight"],)
        if self.layers_ == "both":  # neighbours once: each row's own original and its copies left out
            same = _identical_rows(X[rows], X)
            w, idx = _neighbour_weights(Xq, X, self.n_neighbors, get_kernel(self.image_kernel), same)
            uniq, inv = torch.unique(idx, return_inverse=True)
        rmse = torch.empty(len(hs), len(betas), dtype=torch.float64)
        B = torch.tensor(betas, dtype=X.dtype, device=X.device)[:, None]
        fallback = self.feature_mean_.expand_as(Xq)[hidden]
        for a, h in enumerate(hs):
            z, S = (v[hidden] for v in self._layer1(Xq, h))  # only the hidden values are scored
            if self.layers_ == "both":
                zhat = _average(w, inv, self._layer1(X[uniq], h)[0], X[uniq], float(self.imputed_weight))
                Z = _combine(z, S, zhat[hidden], B)  # (len(betas), n_hidden)
            else:
                Z = z[None]
            Z = torch.where(torch.isnan(Z), fallback, Z)
            rmse[a] = torch.sqrt(torch.mean((Z - truth) ** 2, dim=1)).cpu().double()
        a, b = divmod(int(torch.argmin(rmse)), len(betas))
        scores = {"pixel_bandwidth": np.array(hs), "image_weight": np.array(betas), "rmse": rmse.numpy(),
                  "n_hidden": int(hidden.sum())}
        return float(hs[a]), float(betas[b]), scores

    def fit_transform(self, X, y=None):
        """``fit(X).transform(X)``, reusing the layer-1 pass of ``fit``."""
        self.fit(X)
        return self._transform(X, same_as_fit=True)

    def transform(self, X):
        """Impute ``X (m, P)``: observed entries unchanged, missing ones from the two layers."""
        return self._transform(X)

    def _transform(self, X, same_as_fit: bool = False):
        check_is_fitted(self, "X_ref_")
        is_tensor = isinstance(X, torch.Tensor)
        X = self.X_ref_ if same_as_fit and not is_tensor else self._validate(X, reset=False)
        miss = torch.isnan(X)
        out = X.clone()
        rows = torch.nonzero(miss.any(1)).flatten()
        if rows.numel():
            Xm = X[rows]
            kern = get_kernel(self.image_kernel)
            if self.layers_ == "image":
                same = _identical_rows(Xm, self.X_ref_)
                Z = _observed_mean(Xm, self.X_ref_, self.n_neighbors, kern, same)
            else:
                z, mass = (self.Z_ref_[rows], self._mass_ref[rows]) if same_as_fit else self._layer1(Xm)
                if self.layers_ == "pixel":
                    Z = z
                else:
                    same = _identical_rows(Xm, self.X_ref_)
                    zhat = _image_local_mean(Xm, self.Z_ref_, self.X_ref_, self.n_neighbors, kern, same,
                                             float(self.imputed_weight))
                    Z = _combine(z, mass, zhat, self.image_weight_)
            Z = torch.where(torch.isnan(Z), self.feature_mean_.expand_as(Z), Z)
            out[rows] = torch.where(miss[rows], Z, Xm)
        return out if is_tensor else out.cpu().numpy()


def _combine(z, mass, zhat, beta):
    """``(S z + β ẑ) / (S + β)``, using whichever of the two is defined where the other is NaN.

    ``beta`` may be a tensor that broadcasts against ``z`` (several β at once)."""
    beta = torch.as_tensor(beta, dtype=mass.dtype, device=mass.device)
    a = torch.where(torch.isnan(z), torch.zeros_like(mass), mass)
    b = torch.where(torch.isnan(zhat), torch.zeros_like(beta), beta)
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
