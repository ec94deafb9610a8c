r"""The two layers of :class:`localbook.impute.LocalMeanImputer`, and the score of an imputation.

Layer 1, *pixel level* (:func:`pixel_local_mean`): each missing pixel becomes the local mean of
the observed pixels of its own image, localized in pixel coordinates (a separable Gaussian
convolution, or the dense ``(P, P)`` kernel matrix; a log-space pass where the kernel mass
underflows). Layer 2, *image level* (:func:`image_local_mean`): the local mean of the layer-1
images of the most similar reference images, with similarity computed on commonly observed
pixels (:func:`nan_sq_distances`, scikit-learn's ``nan_euclidean``). The private helpers below
(neighbour weights, identical rows, the combination of the two layers) are what the estimator
in :mod:`localbook.impute` is built from; the mathematics is in that module's description.
Everything here needs only torch and numpy (the estimator adds scikit-learn); every public
name is also importable from :mod:`localbook.impute` and the top level.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

from ._validate import (
    as_tensor,
    check_fraction,
    check_image_shape,
    check_missing_data,
    check_positive_float,
    check_positive_int,
    promote_floats,
)
from .kernels import chunk_rows, get_kernel, iter_chunks, _scaled_sq_dist

__all__ = [
    "pixel_positions",
    "pixel_local_mean",
    "nan_sq_distances",
    "image_local_mean",
    "rmse_missing",
]


# --- layer 1: pixel level -------------------------------------------------------------------
def pixel_positions(image_shape, *, dtype=None, device=None) -> torch.Tensor:
    """The (row, column) coordinates of the pixels of an ``H × W`` image in row-major order, ``(H·W, 2)``."""
    H, W = check_image_shape(image_shape, None)
    r, c = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    return torch.stack([r.reshape(-1), c.reshape(-1)], 1).to(
        dtype=dtype or torch.get_default_dtype(), device=device
    )


def pixel_local_mean(
    X,
    image_shape,
    bandwidth: float = 1.0,
    kernel: str = "gaussian",
    return_mass: bool = False,
):
    r"""Layer 1: fill each missing pixel with the local mean of the observed pixels of its own image.

    :math:`z_{ip} = \sum_q K_h(r_p, r_q) m_{iq} x_{iq} / S_{ip}`, :math:`S_{ip} = \sum_q K_h(r_p, r_q) m_{iq}`
    for missing ``p``; observed pixels unchanged. ``X (n, H·W)`` with NaN = missing,
    ``image_shape = (H, W)``, ``bandwidth`` in pixels. Numerator and mass are two matrix products
    with the ``(P, P)`` kernel matrix (for the Gaussian, separable convolutions along rows and
    columns); pixels where a mass underflows are redone in log space, so a
    pixel deep inside a missing block gets its nearest observed pixels' mean. A pixel with no
    observed pixel in reach (nothing observed, or a compact kernel) stays NaN. Returns
    ``z (n, H·W)`` on X's device and dtype, and with ``return_mass`` also ``S (n, H·W)`` (the
    kernel mass of the observed pixels around each pixel, excluding the pixel itself).
    """
    X = check_missing_data(X)
    H, W = check_image_shape(image_shape, X.shape[1])
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
            kr, kc = (
                torch.exp(
                    -0.5
                    * (
                        (
                            torch.arange(L, dtype=X.dtype, device=X.device)[:, None]
                            - torch.arange(L, dtype=X.dtype, device=X.device)
                        )
                        / h
                    )
                    ** 2
                )
                for L in (H, W)
            )
            return (kr @ A.reshape(n, H, W) @ kc).reshape(n, P)

        num, mass = conv(Z) - Z, (conv(M) - M).clamp(min=0.0)
        log_k = None
    else:
        log_k = _log_pixel_kernel(H, W, h, kern, X)
        K = torch.exp(log_k)
        num, mass = Z @ K, M @ K  # K symmetric: (n, P)
    est = num / mass.clamp(min=torch.finfo(X.dtype).tiny)
    # masses that are zero or subnormal lose precision: redo those pixels in log space
    tiny = torch.finfo(X.dtype).tiny / torch.finfo(X.dtype).eps
    ii, pp = torch.nonzero(miss & (mass < tiny), as_tuple=True)
    if ii.numel():
        log_k = _log_pixel_kernel(H, W, h, kern, X) if log_k is None else log_k
        rows = chunk_rows(ii.numel(), P, 3, X.element_size(), None, X.device)
        for sl in iter_chunks(ii.numel(), rows):
            i, p = ii[sl], pp[sl]
            lw = log_k[p] + torch.log(M[i])  # (r, P source): −inf where missing
            lse = torch.logsumexp(lw, dim=1, keepdim=True)
            w = torch.exp(lw - lse)  # NaN rows where nothing is in reach (−inf − −inf)
            est[i, p] = (w * Z[i]).sum(1)
    return torch.where(miss, est, X), mass


def _log_pixel_kernel(H, W, h, kern, X):
    """The ``(P, P)`` log-kernel matrix on pixel positions, −inf on the diagonal."""
    pos = pixel_positions((H, W), dtype=X.dtype, device=X.device)
    hh = torch.full((2,), h, dtype=X.dtype, device=X.device)
    log_k = kern.log_profile(
        _scaled_sq_dist(pos, pos, hh, center=pos.mean(0))
    )  # symmetric
    return log_k.fill_diagonal_(-math.inf)  # a pixel never predicts itself


# --- layer 2: image level -------------------------------------------------------------------
def nan_sq_distances(Xq, X) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Squared distances on commonly observed features, scaled to all features (``nan_euclidean``).

    :math:`d^2_{ij} = \frac{P}{|O_i \cap O_j|} \sum_{p \in O_i \cap O_j} (x_{ip} - x_{jp})^2`, with
    ``+inf`` where two rows share no observed feature. ``Xq (m, P)``, ``X (n, P)`` with NaN =
    missing; returns ``(d2 (m, n), common (m, n))``, ``common`` the number of shared features.
    Computed in row chunks through three matrix products.
    """
    Xq, X = promote_floats(Xq, X)
    X = check_missing_data(X, "X")
    Xq = check_missing_data(Xq, "Xq", like=X)
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
        d2[sl] = torch.where(
            c > 0, s.clamp(min=0.0) * P / c.clamp(min=1.0), torch.full_like(s, math.inf)
        )
    return d2, common


def image_local_mean(
    Xq,
    X_ref,
    Z_ref,
    n_neighbors: int = 10,
    kernel: str = "gaussian",
    exclude: Optional[torch.Tensor] = None,
    imputed_weight: float = 1.0,
) -> torch.Tensor:
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
    Xq, X_ref, Z_ref = promote_floats(Xq, X_ref, Z_ref)
    X_ref = check_missing_data(X_ref, "X_ref")
    Xq = check_missing_data(Xq, "Xq", like=X_ref)
    Z_ref = as_tensor(Z_ref, "Z_ref", like=X_ref, ndim=(2,), finite=False)
    if Xq.shape[1] != X_ref.shape[1] or Z_ref.shape != X_ref.shape:
        raise ValueError(
            f"Xq {tuple(Xq.shape)}, X_ref {tuple(X_ref.shape)} and Z_ref {tuple(Z_ref.shape)} must "
            "have the same number of features, and Z_ref the shape of X_ref"
        )
    bad = torch.isinf(Z_ref) | (torch.isnan(Z_ref) & ~torch.isnan(X_ref))
    if bool(bad.any()):
        raise ValueError(
            f"Z_ref has {int(bad.sum())} infinite value(s) or NaN where X_ref observes the "
            "pixel; it must be finite (NaN only where X_ref is missing)"
        )
    n_neighbors = check_positive_int(n_neighbors, "n_neighbors")
    lam = _check_imputed_weight(imputed_weight)
    kern = get_kernel(kernel)
    if exclude is not None:
        exclude = torch.as_tensor(exclude, dtype=torch.bool, device=X_ref.device)
        if exclude.shape != (Xq.shape[0], X_ref.shape[0]):
            raise ValueError(
                f"exclude must have shape {(Xq.shape[0], X_ref.shape[0])}, got {tuple(exclude.shape)}"
            )
    return _image_local_mean(Xq, Z_ref, X_ref, n_neighbors, kern, exclude, lam)


def _check_imputed_weight(value) -> float:
    return check_fraction(
        value,
        "imputed_weight",
        allow_one=True,
        meaning=" (an imputed value counts at most as much as an observed one)",
    )


def _image_local_mean(Xq, Z_ref, X_ref, n_neighbors, kern, exclude, lam):
    w, idx = _neighbour_weights(Xq, X_ref, n_neighbors, kern, exclude)
    return _average(w, idx, Z_ref, X_ref, lam)


def _average(w, idx, Z_ref, X_ref, lam):
    """``Σ_j w_ij c_jp Z_ref[j, p] / Σ_j w_ij c_jp`` over the neighbours ``idx``; ``(m, P)``."""
    w = torch.nan_to_num(
        w, nan=0.0
    )  # a query with no usable neighbour: all weights 0 → NaN below
    out = torch.empty(
        w.shape[0], Z_ref.shape[1], dtype=Z_ref.dtype, device=Z_ref.device
    )
    rows = chunk_rows(
        w.shape[0],
        Z_ref.shape[1],
        3 * idx.shape[1],
        Z_ref.element_size(),
        None,
        Z_ref.device,
    )
    for sl in iter_chunks(w.shape[0], rows):
        observed = (~torch.isnan(X_ref[idx[sl]])).to(Z_ref.dtype)  # (r, k, P)
        c = w[sl][..., None] * (lam + (1.0 - lam) * observed)
        den = c.sum(1)
        num = (c * Z_ref[idx[sl]]).sum(1)
        out[sl] = torch.where(
            den > 0,
            num / den.clamp(min=torch.finfo(den.dtype).tiny),
            torch.full_like(den, math.nan),
        )
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
    lw = torch.where(
        finite, kern.log_profile(vals / h2[:, None]), torch.full_like(vals, -math.inf)
    )
    w = torch.exp(
        lw - torch.logsumexp(lw, 1, keepdim=True)
    )  # NaN rows: nothing in reach
    return w, idx


# --- shared by the estimator: combining the layers, identical rows, tabular mode ---------------
def _combine(z, mass, zhat, beta):
    """``(S z + β ẑ) / (S + β)``, using whichever of the two is defined where the other is NaN.

    ``beta`` may be a tensor that broadcasts against ``z`` (several β at once)."""
    beta = torch.as_tensor(beta, dtype=mass.dtype, device=mass.device)
    a = torch.where(torch.isnan(z), torch.zeros_like(mass), mass)
    b = torch.where(torch.isnan(zhat), torch.zeros_like(beta), beta)
    num = a * torch.nan_to_num(z, nan=0.0) + b * torch.nan_to_num(zhat, nan=0.0)
    den = a + b
    return torch.where(
        den > 0,
        num / den.clamp(min=torch.finfo(z.dtype).tiny),
        torch.full_like(num, math.nan),
    )


def _identical_rows(Xq, X):
    """``(m, n)`` bool: row ``i`` of ``Xq`` equals row ``j`` of ``X``, NaNs in the same places.

    Candidates come from a random projection of (values, mask); each candidate pair is then
    compared entry by entry, so the answer is exact.
    """
    g = torch.Generator(device="cpu").manual_seed(12345)
    proj = torch.randn(2, X.shape[1], generator=g, dtype=torch.float64).to(
        device=X.device, dtype=X.dtype
    )

    def code(A):
        return (
            torch.nan_to_num(A, nan=0.0) @ proj[0]
            + (~torch.isnan(A)).to(A.dtype) @ proj[1]
        )

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
    return torch.where(
        den > 0,
        num / den.clamp(min=torch.finfo(X_ref.dtype).tiny),
        torch.full_like(num, math.nan),
    )


# --- the score ----------------------------------------------------------------------------------
def _check_mask(mask, name: str) -> np.ndarray:
    """A boolean mask as a numpy array: bools, or numbers that are all 0 or 1."""
    if isinstance(mask, torch.Tensor):
        arr = mask.detach().cpu()
        arr = (arr.float() if arr.dtype == torch.bfloat16 else arr).numpy()
    elif isinstance(mask, (str, bytes)) or mask is None:
        raise TypeError(f"{name} must be a boolean array, got {type(mask).__name__}")
    else:
        try:
            arr = np.asarray(mask)
        except Exception as exc:
            raise TypeError(f"{name} must be a boolean array: {exc}") from None
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind not in "iuf" or not np.all((arr == 0) | (arr == 1)):
        raise TypeError(
            f"{name} must be a boolean array (True = marked), or 0/1 numbers; got dtype "
            f"{arr.dtype}" + (" with other values" if arr.dtype.kind in "iuf" else "")
        )
    return arr.astype(bool)


def rmse_missing(x_imputed, x_true, missing) -> float:
    r"""Root mean squared error on the missing entries only: :math:`\sqrt{\mathrm{mean}_{(i,p) \in \mathcal M} (\hat x_{ip} - x_{ip})^2}`.

    All three arguments are ``(n, d)`` array-likes (``missing`` boolean, ``True`` = missing;
    0/1 numbers are read as booleans); the values on the missing entries must be finite
    (elsewhere they are not read: NaN there is fine).
    """
    a, b = (
        as_tensor(v, name, ndim=(1, 2), finite=False).detach().cpu().double().numpy()
        for v, name in ((x_imputed, "x_imputed"), (x_true, "x_true"))
    )
    m = _check_mask(missing, "missing")
    if a.shape != b.shape or a.shape != m.shape:
        raise ValueError(
            f"x_imputed, x_true and missing must have the same shape, got {a.shape}, {b.shape}, {m.shape}"
        )
    if not m.any():
        raise ValueError(
            "missing marks no entry; the RMSE on missing entries is undefined"
        )
    for v, name in ((a, "x_imputed"), (b, "x_true")):
        bad = int((~np.isfinite(v[m])).sum())
        if bad:
            raise ValueError(
                f"{name} has {bad} NaN or infinite value(s) on the entries missing marks"
            )
    return float(np.sqrt(np.mean((a[m] - b[m]) ** 2)))
