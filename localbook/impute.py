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
choose ``h`` and ``β`` at ``fit`` time by the hold-out recipe: hide part of the *observed*
values of up to 200 reference rows (:func:`~localbook.datasets.holdout_mask`), impute them with
the rest of the reference set (each row's own original and its exact copies left out) for every
pair on a grid (:data:`PIXEL_BANDWIDTH_GRID` × :data:`IMAGE_WEIGHT_GRID`), and score each pair by
the RMSE on the hidden values. Only *usable* rows take part: rows with fewer than two observed
values (an all-missing row, say) are never drawn for the hold-out and never serve as neighbours
while tuning, so adding such rows to ``X`` does not change the choice. The hidden values are,
by default, a random ``holdout`` fraction (10 %) of each drawn row's observed values (tuned for
scattered holes); with ``holdout_block=b`` each drawn row instead hides the observed pixels of
one ``b × b`` square, so the parameters are tuned for holes shaped like
:func:`~localbook.datasets.block_mask`'s.

The hold-out RMSE is nearly flat over a range of ``β`` (wherever the image level dominates), so
its minimizer alone would jump across that range with the draw. The recipe therefore applies
the *one-standard-error rule*: among the pairs whose hold-out mean squared error exceeds the
best pair's by at most one standard error of the difference (from the per-row differences), it
keeps the smallest ``β``, and at that ``β`` the ``h`` with the smallest error. The neighbours
are found once; each ``h`` costs one pixel pass over the hold-out rows and their neighbours
(separable Gaussian convolution) and each ``β`` only a weighted average.

**A feature never observed** in the reference set has no mean of its own. For images its
fallback value is the Gaussian local mean (bandwidth one pixel, in log space so the nearest
observed pixels always count) of the observed features' means around it; for tabular data, the
mean of all observed values. ``fit`` warns and names such features.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from sklearn.base import (  # a dependency; this module loads lazily
    BaseEstimator,
    OneToOneFeatureMixin,
    TransformerMixin,
)
from sklearn.utils.validation import check_is_fitted, validate_data

from ._validate import check_choice, check_fraction, check_image_shape
from ._validate import check_missing_data, check_positive_float, check_positive_int
from .datasets import holdout_mask
from .impute_layers import (  # the layers; their public names are re-exported here
    _average,
    _check_imputed_weight,
    _combine,
    _identical_rows,
    _image_local_mean,
    _neighbour_weights,
    _observed_mean,
    _pixel_layer,
    image_local_mean,
    nan_sq_distances,
    pixel_local_mean,
    pixel_positions,
    rmse_missing,
)
from .kernels import get_kernel

__all__ = [
    "PIXEL_BANDWIDTH_GRID",
    "IMAGE_WEIGHT_GRID",
    "pixel_positions",
    "pixel_local_mean",
    "nan_sq_distances",
    "image_local_mean",
    "LocalMeanImputer",
    "rmse_missing",
]

#: Candidate pixel bandwidths (in pixels) for ``pixel_bandwidth="auto"``.
PIXEL_BANDWIDTH_GRID = (0.3, 0.4, 0.5, 0.7, 1.0, 1.4, 2.0)
#: Candidate image weights β for ``image_weight="auto"``: 10^-2 … 10^3 in steps of 10^0.25.
IMAGE_WEIGHT_GRID = tuple(float(10 ** (e / 4)) for e in range(-8, 13))
_HOLDOUT_ROWS = 200
_FALLBACK = {
    "pixel_bandwidth": 0.7,
    "image_weight": 0.3,
}  # when nothing can be held out


def _one_se_margin(sse, n_hidden):
    """Standard error of ``MSE(pair) − MSE(best pair)`` from per-row differences, per pair.

    ``sse (..., rows)`` holds each pair's per-row sums of squared errors."""
    flat = sse.reshape(-1, sse.shape[-1])
    best = int(torch.argmin(flat.sum(1)))
    d = flat - flat[best]
    rows = d.shape[1]
    se = (
        d.std(1, unbiased=True) * math.sqrt(rows) / n_hidden
        if rows > 1
        else 0 * d[:, 0]
    )
    return se.reshape(sse.shape[:-1]).numpy()


def _one_se_choice(sse, n_hidden):
    """The one-standard-error rule on an ``(h, β)`` grid: ``(a, b)`` grid indices.

    Eligible pairs have a hold-out MSE within one standard error (of the paired difference) of
    the best; among them the smallest ``β`` (index ``b``), then the ``h`` with the smallest MSE.
    """
    mse = sse.sum(-1) / n_hidden
    eligible = mse - mse.min() <= torch.as_tensor(_one_se_margin(sse, n_hidden))
    b = int(torch.nonzero(eligible.any(0)).flatten()[0])
    a = int(torch.argmin(torch.where(eligible[:, b], mse[:, b], math.inf)))
    return a, b


class LocalMeanImputer(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
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
        parameters. holdout_block : None (default), or ``b``: hide one ``b × b`` square of
        observed pixels per tuning row instead (tune for block-shaped holes; needs
        ``image_shape``). random_state : seed of that draw (the fit is deterministic).

    Attributes: ``layers_``, ``pixel_bandwidth_``, ``image_weight_`` (the values used),
    ``holdout_scores_`` (the grids, the hold-out RMSE, its one-standard-error margin ``"se"``
    and the number of hidden values; ``None`` without tuning),
    ``n_features_in_`` (and ``feature_names_in_`` after a DataFrame). Inputs: numpy arrays
    and DataFrames (dense only) give numpy arrays back, or DataFrames after
    ``set_output(transform="pandas")`` (the output features are the input features,
    ``get_feature_names_out``); tensors give tensors on their device and dtype (a DataFrame
    too after ``set_output(transform="pandas")``). A value neither layer can reach gets the mean of the
    observed reference values of that feature (for a feature never observed, the fallback of
    the module description, with a warning at ``fit``).
    """

    def __init__(
        self,
        image_shape=None,
        *,
        layers: str = "auto",
        pixel_bandwidth="auto",
        pixel_kernel: str = "gaussian",
        n_neighbors: int = 10,
        image_kernel: str = "gaussian",
        image_weight="auto",
        imputed_weight: float = 0.3,
        holdout: float = 0.1,
        holdout_block=None,
        random_state: int = 0,
    ):
        self.image_shape = image_shape
        self.layers = layers
        self.pixel_bandwidth = pixel_bandwidth
        self.pixel_kernel = pixel_kernel
        self.n_neighbors = n_neighbors
        self.image_kernel = image_kernel
        self.image_weight = image_weight
        self.imputed_weight = imputed_weight
        self.holdout = holdout
        self.holdout_block = holdout_block
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    # parameters are validated at fit time, as scikit-learn estimators do
    def _check_params(self, n_features: int) -> str:
        layers = check_choice(self.layers, "layers", ["auto", "both", "pixel", "image"])
        if layers == "auto":
            layers = "image" if self.image_shape is None else "both"
        if layers != "image" or self.image_shape is not None:
            check_image_shape(self.image_shape, n_features)
        for name in ("pixel_bandwidth", "image_weight"):
            if not (
                isinstance(getattr(self, name), str) and getattr(self, name) == "auto"
            ):
                check_positive_float(getattr(self, name), name)
        get_kernel(self.pixel_kernel)
        check_positive_int(self.n_neighbors, "n_neighbors")
        get_kernel(self.image_kernel)
        _check_imputed_weight(self.imputed_weight)
        check_fraction(self.holdout, "holdout")
        if self.holdout_block is not None:
            H, W = check_image_shape(self.image_shape, n_features)
            check_positive_int(self.holdout_block, "holdout_block", maximum=min(H, W))
        return layers

    def _validate(self, X, reset: bool):
        """Tensors keep their device and dtype; anything else goes through scikit-learn's checks."""
        if isinstance(X, torch.Tensor):
            t = check_missing_data(X, like=None if reset else self.X_ref_)
            if reset:
                self.n_features_in_ = t.shape[1]
            elif t.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {t.shape[1]} features, but LocalMeanImputer is expecting "
                    f"{self.n_features_in_} features as input"
                )
            return t
        import scipy.sparse as sp

        if sp.issparse(X):
            raise TypeError(
                "LocalMeanImputer does not accept sparse input: a stored zero is a value, "
                "NaN marks a missing one; pass a dense array (X.toarray()) with NaN holes"
            )
        A = validate_data(
            self,
            X,
            reset=reset,
            dtype=[np.float64, np.float32],
            ensure_all_finite="allow-nan",
        )
        t = torch.from_numpy(np.array(A, copy=True))
        return t if reset else t.to(dtype=self.X_ref_.dtype, device=self.X_ref_.device)

    def fit(self, X, y=None):
        """Store the reference rows ``X (n, P)`` (NaN = missing), tune the ``"auto"`` parameters."""
        X = self._validate(X, reset=True)
        layers = self._check_params(X.shape[1])
        observed = ~torch.isnan(X)
        if not bool(observed.any()):
            raise ValueError("X has no observed value at all; nothing to impute from")
        self.feature_mean_ = self._feature_means(X, observed)
        self.layers_ = layers
        self.pixel_bandwidth_, self.image_weight_, self.holdout_scores_ = self._tune(X)
        self.X_ref_ = X
        self.Z_ref_, self._mass_ref = (
            (X, None) if layers == "image" else self._layer1(X)
        )
        return self

    def _feature_means(self, X, observed):
        """Each feature's observed mean; a never-observed one gets the fallback (warned)."""
        counts = observed.sum(0)
        mean = torch.where(
            counts > 0,
            torch.nan_to_num(X, nan=0.0).sum(0) / counts.clamp(min=1),
            torch.full_like(X[0], math.nan),
        )
        never = torch.nonzero(counts == 0).flatten().tolist()
        if not never:
            return mean
        if (
            self.image_shape is not None
        ):  # the local mean of the feature means around it
            H, W = check_image_shape(self.image_shape, X.shape[1])
            fill = _pixel_layer(mean[None], H, W, 1.0, get_kernel("gaussian"))[0][0]
            how = (
                "the Gaussian local mean (h = 1 pixel) of the observed features' means"
            )
        else:
            fill = torch.full_like(mean, float(X[observed].mean()))
            how = "the mean of all observed values"
        shown = ", ".join(map(str, never[:10])) + (", ..." if len(never) > 10 else "")
        warnings.warn(
            f"{len(never)} feature(s) never observed in X (index {shown}); where no layer "
            f"reaches them they are imputed by {how}",
            UserWarning,
            stacklevel=3,
        )
        return torch.where(counts > 0, mean, fill)

    def _layer1(self, X, h=None):
        H, W = check_image_shape(self.image_shape, X.shape[1])
        return _pixel_layer(
            X,
            H,
            W,
            self.pixel_bandwidth_ if h is None else h,
            get_kernel(self.pixel_kernel),
        )

    def _tune(self, X):
        """The hold-out recipe: hide observed values, impute them on a grid, keep the best pair."""
        auto = {
            name: isinstance(getattr(self, name), str)
            for name in ("pixel_bandwidth", "image_weight")
        }
        fixed = {
            name: _FALLBACK[name] if a else float(getattr(self, name))
            for name, a in auto.items()
        }
        if (
            self.layers_ == "image"
            or not any(auto.values())
            or (self.layers_ == "pixel" and not auto["pixel_bandwidth"])
        ):
            return fixed["pixel_bandwidth"], fixed["image_weight"], None
        usable = torch.nonzero((~torch.isnan(X)).sum(1) >= 2).flatten()
        pool = X[usable]  # rows with fewer than two observed values take no part
        shape = {}
        if self.holdout_block is not None:
            shape = dict(block=self.holdout_block, image_shape=self.image_shape)
        hide = torch.as_tensor(
            holdout_mask(pool, self.holdout, self.random_state, _HOLDOUT_ROWS, **shape),
            device=X.device,
        )
        rows = torch.nonzero(hide.any(1)).flatten()
        if rows.numel() == 0:
            return fixed["pixel_bandwidth"], fixed["image_weight"], None
        Xq = pool[rows].masked_fill(hide[rows], math.nan)
        truth, hidden = pool[rows][hide[rows]], hide[rows]
        row_of = torch.nonzero(hidden)[:, 0]  # the tuning row of each hidden value
        hs = (
            PIXEL_BANDWIDTH_GRID
            if auto["pixel_bandwidth"]
            else (fixed["pixel_bandwidth"],)
        )
        betas = (
            IMAGE_WEIGHT_GRID
            if auto["image_weight"] and self.layers_ == "both"
            else (fixed["image_weight"],)
        )
        if self.layers_ == "both":  # neighbours once, own original and copies left out
            same = _identical_rows(pool[rows], pool)
            w, idx = _neighbour_weights(
                Xq, pool, self.n_neighbors, get_kernel(self.image_kernel), same
            )
            uniq, inv = torch.unique(idx, return_inverse=True)
        # per-row sums of squared errors, (len(hs), len(betas), rows)
        sse = torch.zeros(len(hs), len(betas), len(rows), dtype=torch.float64)
        B = torch.tensor(betas, dtype=X.dtype, device=X.device)[:, None]
        fallback = self.feature_mean_.expand_as(Xq)[hidden]
        for a, h in enumerate(hs):
            z, S = (v[hidden] for v in self._layer1(Xq, h))  # hidden values only
            if self.layers_ == "both":
                zhat = _average(
                    w,
                    inv,
                    self._layer1(pool[uniq], h)[0],
                    pool[uniq],
                    float(self.imputed_weight),
                )
                Z = _combine(z, S, zhat[hidden], B)  # (len(betas), n_hidden)
            else:
                Z = z[None]
            Z = torch.where(torch.isnan(Z), fallback, Z)
            err2 = ((Z - truth) ** 2).double().cpu()
            sse[a] = torch.zeros(len(betas), len(rows), dtype=torch.float64).index_add_(
                1, row_of.cpu(), err2
            )
        n_hidden = int(hidden.sum())
        rmse = torch.sqrt(sse.sum(2) / n_hidden)
        a, b = _one_se_choice(sse, n_hidden)
        scores = {
            "pixel_bandwidth": np.array(hs),
            "image_weight": np.array(betas),
            "rmse": rmse.numpy(),
            "best_rmse": float(rmse.min()),
            "se": _one_se_margin(sse, n_hidden),
            "n_hidden": n_hidden,
            "n_rows": len(rows),
        }
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
        X = (
            self.X_ref_
            if same_as_fit and not is_tensor
            else self._validate(X, reset=False)
        )
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
                z, mass = (
                    (self.Z_ref_[rows], self._mass_ref[rows])
                    if same_as_fit
                    else self._layer1(Xm)
                )
                if self.layers_ == "pixel":
                    Z = z
                else:
                    same = _identical_rows(Xm, self.X_ref_)
                    zhat = _image_local_mean(
                        Xm,
                        self.Z_ref_,
                        self.X_ref_,
                        self.n_neighbors,
                        kern,
                        same,
                        float(self.imputed_weight),
                    )
                    Z = _combine(z, mass, zhat, self.image_weight_)
            Z = torch.where(torch.isnan(Z), self.feature_mean_.expand_as(Z), Z)
            out[rows] = torch.where(miss[rows], Z, Xm)
        return out if is_tensor else out.cpu().numpy()
