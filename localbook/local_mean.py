r"""Local means: Nadaraya–Watson, local linear regression, KNN, and leave-one-out bandwidth choice.

Every estimator here is a *linear smoother*: the prediction at a query ``x*`` is
:math:`\hat y(x^*) = \sum_i \ell_i(x^*)\, y_i` with weights that sum to one. For Nadaraya–Watson
:math:`\ell_i = K(x^*, x_i) / \sum_j K(x^*, x_j)`; local linear regression has an *equivalent
kernel* :math:`\ell_i` (the *empirical kernel* of Song's localization framework) that may be
negative; KNN uses the rank kernel :math:`1/k` on the ``k`` nearest points. Weights summing to
one are not what makes leave-one-out free: :func:`loo_cv_score` needs a kernel fixed in advance
(deleting a point zeroes its own weight and leaves the others), which the rank kernel is not.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from ._validate import (
    as_tensor,
    check_bandwidth,
    check_bool,
    check_choice,
    check_fraction,
    check_labels,
    check_points,
    check_positive_int,
    check_query,
    check_targets,
    compute_dtype,
    promote_floats,
)
from .chunks import chunk_rows, iter_chunks
from .kernels import (
    _knn,
    data_center,
    get_kernel,
    log_weights,
    _scaled_sq_dist,
    warn_empty_kernel,
)
from .local_sums import local_average

__all__ = [
    "nadaraya_watson",
    "local_linear",
    "equivalent_kernel",
    "knn_regress",
    "knn_classify",
    "knn_bandwidth",
    "adaptive_nadaraya_watson",
    "loo_cv_score",
    "select_bandwidth",
    "BandwidthSelection",
]


def _prepare(x_query, x, y, bandwidth):
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    y2, squeeze = check_targets(y, x.shape[0], like=x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    return xq, x, y2, squeeze, h


def nadaraya_watson(x_query, x, y, bandwidth, kernel: str = "gaussian") -> torch.Tensor:
    r"""Nadaraya–Watson local mean :math:`\hat y(q) = \sum_i K(q, x_i) y_i / \sum_i K(q, x_i)`.

    Shapes: ``x_query (m, d)``, ``x (n, d)`` (1-D means ``d = 1``), ``y (n,)`` or ``(n, k)``,
    ``bandwidth`` a float or ``(d,)``. Returns ``(m,)`` or ``(m, k)``. Weights are normalized in
    log space, so a query far from all data gets its nearest points' mean; under a compact kernel
    a query with no point within the bandwidth gets NaN (and a warning).
    """
    x_query, x, y = promote_floats(x_query, x, y)
    xq, x, y2, squeeze, h = _prepare(x_query, x, y, bandwidth)
    mean, _ = local_average(xq, x, y2, h, kernel)
    return mean[:, 0] if squeeze else mean


def _default_rcond(n: int, d: int, dtype: torch.dtype) -> float:
    """``numpy.linalg.lstsq``'s default cutoff: the machine epsilon times ``max(n, d + 1)``."""
    return torch.finfo(dtype).eps * max(n, d + 1)


def _ll_weights(xq, x, h, kern, center, rcond: float) -> torch.Tensor:
    r"""Local-linear equivalent kernel for one chunk of queries, ``(rows, n)``.

    With weights :math:`w_i = K(q, x_i)` (divided by the largest, so none underflows),
    :math:`S_0 = \sum_i w_i`, scaled coordinates :math:`z_i = (x_i - c)/h` and their weighted
    mean :math:`\bar z`, the fit is the minimum-norm solution of the weighted least-squares
    problem with design rows :math:`a_i = (1, z_i - \bar z)`, singular values of
    :math:`W^{1/2}A` at or below ``rcond`` times the largest treated as zero (the rule of
    ``numpy.linalg.lstsq``). Centring on :math:`\bar z` makes the intercept column
    :math:`W^{1/2}\mathbf 1` (singular value :math:`\sqrt{S_0}`) orthogonal to the slope block
    :math:`B = W^{1/2}(z - \bar z)`, so the intercept is the local mean and the slope is
    :math:`B^+ W^{1/2} y`. With :math:`B = QR` (Householder: the normal equations are never
    formed) and :math:`R = U\Sigma V^\top`, at :math:`v = (q - c)/h - \bar z`,
    :math:`\ell_i = w_i/S_0 + w_i\,(z_i - \bar z)^\top V\Sigma^{+2}V^\top v`.
    """
    lw = log_weights(xq, x, h, kern, center)
    top = lw.max(dim=1, keepdim=True).values
    empty = torch.isneginf(top[:, 0])  # compact kernel, no point in the window
    w = torch.exp(lw - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
    if bool(empty.any()):  # solved with unit weights (no NaN reaches the QR), then NaN
        w = torch.where(empty[:, None], torch.ones_like(w), w)
    s0 = w.sum(1, keepdim=True)  # (rows, 1), at least 1
    xs = (x - center) / h  # scaled coordinates: conditioning independent of units
    qs = (xq - center) / h
    zbar = (w @ xs) / s0  # (rows, d)
    diff = xs[None, :, :] - zbar[:, None, :]  # (rows, n, d)
    B = torch.sqrt(w)[..., None] * diff
    # mode "r" skips forming Q, but has no derivative
    mode = "reduced" if torch.is_grad_enabled() and B.requires_grad else "r"
    R = torch.linalg.qr(B, mode=mode).R  # (rows, min(n, d), d)
    _, sv, vh = torch.linalg.svd(R, full_matrices=False)  # sv descending
    cutoff = rcond * torch.maximum(torch.sqrt(s0), sv[:, :1])  # rcond · σ_max(W^½A)
    keep = sv > cutoff
    safe = torch.where(keep, sv, torch.ones_like(sv))
    inv2 = torch.where(keep, 1.0 / (safe * safe), torch.zeros_like(sv))
    proj = (vh @ (qs - zbar)[..., None])[..., 0] * inv2  # Σ⁺² Vᵀ v, (rows, k)
    c = (vh.transpose(1, 2) @ proj[..., None])[..., 0]  # (rows, d)
    ell = w / s0 + w * (diff @ c[..., None])[..., 0]
    if bool(empty.any()):
        ell = torch.where(empty[:, None], torch.full_like(ell, math.nan), ell)
    return ell


def _ll_chunks(xq, x, h, kernel, width: int, rcond):
    kern = get_kernel(kernel)
    if x.dtype in (torch.float16, torch.bfloat16):
        # no QR in half precision, nor room for the moments: weights in float32
        xq, x, h = xq.float(), x.float(), h.float()
    if rcond is None:
        rcond = _default_rcond(x.shape[0], x.shape[1], x.dtype)
    else:
        rcond = check_fraction(rcond, "rcond", allow_zero=True)
    center = data_center(x)
    rows = chunk_rows(
        xq.shape[0],
        x.shape[0],
        3 * x.shape[1] + 3 + width,
        x.element_size(),
        None,
        x.device,
    )
    for sl in iter_chunks(xq.shape[0], rows):
        yield sl, _ll_weights(xq[sl], x, h, kern, center, rcond)


def local_linear(
    x_query,
    x,
    y,
    bandwidth,
    kernel: str = "gaussian",
    rcond: Optional[float] = None,
) -> torch.Tensor:
    r"""Local linear regression: the intercept of a kernel-weighted least-squares line at each query.

    :math:`\hat\beta(q) = \arg\min_\beta \sum_i K(q, x_i)\,(y_i - \beta_0 - \beta_1^\top(x_i - q))^2`,
    :math:`\hat y(q) = \hat\beta_0(q)`, for all queries in batch (any ``d``), in chunks of
    queries under the device's memory budget. Shapes as :func:`nadaraya_watson`. It is a local
    mean with the weights of :func:`equivalent_kernel`.
    The weighted least-squares problem is solved by a Householder QR of the weighted design,
    centred on the neighbourhood's weighted mean (never by the normal equations), and equals
    ``numpy.linalg.lstsq`` on that problem to rounding. Singular values of the weighted design
    (coordinates in bandwidth units) at or below ``rcond`` times the largest are treated as
    zero, as in ``numpy.linalg.lstsq``; ``rcond=None`` is its default, the machine epsilon times
    ``max(n, d + 1)``. Below the cutoff the solution is the minimum-norm one in the kept
    subspace: slope directions in which the neighbourhood has no spread get slope zero, and
    with no direction kept (one effective neighbour) the fit is the local mean.

    Half-precision inputs are solved in float32 and returned in their own dtype. Under a compact
    kernel a query with no data point within the bandwidth gets NaN (and a warning).
    """
    x_query, x, y = promote_floats(x_query, x, y)
    xq, x, y2, squeeze, h = _prepare(x_query, x, y, bandwidth)
    out = torch.empty(xq.shape[0], y2.shape[1], dtype=x.dtype, device=x.device)
    for sl, ell in _ll_chunks(xq, x, h, kernel, y2.shape[1], rcond):
        out[sl] = (ell @ y2.to(ell.dtype)).to(out.dtype)
    warn_empty_kernel(int(torch.isnan(out[:, 0]).sum()), xq.shape[0], kernel)
    return out[:, 0] if squeeze else out


def equivalent_kernel(
    x_query, x, bandwidth, kernel: str = "gaussian", rcond: Optional[float] = None
) -> torch.Tensor:
    r"""The local-linear weights :math:`\ell_i(x^*)`, ``(m, n)``: ``local_linear = equivalent_kernel @ y``.

    Also called the empirical kernel: local linear regression is the local mean under it. Each
    row sums to one; entries can be negative (near a boundary, where the fitted line
    extrapolates). In 1-D, :math:`\ell_i \propto K_i (S_2 - (x_i - x^*) S_1)` with the local
    moments :math:`S_j = \sum_l K_l (x_l - x^*)^j`: for :math:`K_i > 0` the weight is negative
    exactly when :math:`(x_i - x^*) S_1 > S_2`, i.e. beyond :math:`x^* + S_2/S_1`, on the side
    where the kernel mass lies (none is negative when :math:`S_1 = 0`).
    The weights come from the same weighted least-squares solve as :func:`local_linear`
    (Householder QR, the ``rcond`` cutoff, the minimum-norm solution below it).
    """
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    out = torch.empty(xq.shape[0], x.shape[0], dtype=x.dtype, device=x.device)
    for sl, ell in _ll_chunks(xq, x, h, kernel, 1, rcond):
        out[sl] = ell.to(out.dtype)
    warn_empty_kernel(int(torch.isnan(out[:, 0]).sum()), xq.shape[0], kernel)
    return out


def knn_regress(x_query, x, y, n_neighbors: int = 5) -> torch.Tensor:
    r"""KNN regression as a local mean with the rank kernel :math:`K = 1[x_i \in N_k(q)]`.

    ``ŷ(q) = (1/k) Σ_{i ∈ N_k(q)} yᵢ``. Shapes as :func:`nadaraya_watson`. The rank kernel
    depends on the data, so the leave-one-out shortcut of :func:`loo_cv_score` does not carry
    over: at a data point :math:`(y_i - \hat y_i)/(1 - 1/k)` is the leave-one-out residual of
    ``(k-1)``-NN; the ``k``-NN one is :math:`y_i - ((k+1)\hat y^{(k+1)}_i - y_i)/k`.
    """
    x_query, x, y = promote_floats(x_query, x, y)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    y2, squeeze = check_targets(y, x.shape[0], like=x)
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=x.shape[0])
    out = y2[_knn(xq, x, k)[1]].mean(dim=1)
    return out[:, 0] if squeeze else out


def knn_classify(x_query, x, labels, n_neighbors: int = 5, return_proba: bool = False):
    r"""KNN classification: the local mean of one-hot labels, then its argmax.

    Returns predicted labels ``(m,)`` (ties go to the smallest label), and with
    ``return_proba=True`` also ``(proba (m, c), classes (c,))``. Labels are integers (a long
    tensor comes back) or strings and other objects (a numpy array comes back).
    """
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    classes, codes = check_labels(labels, x.shape[0], device=x.device)
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=x.shape[0])
    onehot = torch.nn.functional.one_hot(codes, len(classes)).to(x.dtype)
    proba = onehot[_knn(xq, x, k)[1]].mean(dim=1)
    best = proba.argmax(dim=1)
    pred = (
        classes[best]
        if isinstance(classes, torch.Tensor)
        else classes[best.cpu().numpy()]
    )
    return (pred, proba, classes) if return_proba else pred


def knn_bandwidth(x_query, x, n_neighbors: int = 10) -> torch.Tensor:
    r"""Adaptive bandwidth: the distance from each query to its ``k``-th nearest data point, ``(m,)``."""
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=x.shape[0])
    return torch.sqrt(_knn(xq, x, k)[0][:, -1])


def adaptive_nadaraya_watson(
    x_query, x, y, n_neighbors: int = 10, kernel: str = "gaussian", scale: float = 1.0
):
    r"""Nadaraya–Watson with a per-query bandwidth :math:`h(q) = \text{scale}\cdot d_k(q)`.

    :math:`d_k(q)` is the distance to the ``k``-th nearest data point (:func:`knn_bandwidth`),
    so the neighbourhood widens where data are sparse and narrows where they are dense. With a
    compact kernel use ``scale > 1`` so that the ``k`` nearest points all get positive weight.
    Shapes as :func:`nadaraya_watson`.
    """
    x_query, x, y = promote_floats(x_query, x, y)
    from ._validate import check_positive_float

    x = check_points(x, "x")
    xq = check_query(x_query, x)
    y2, squeeze = check_targets(y, x.shape[0], like=x)
    scale = check_positive_float(scale, "scale")
    kern = get_kernel(kernel)
    hq = scale * knn_bandwidth(xq, x, n_neighbors)
    # a query sitting on k coincident points has d_k = 0: give it the smallest positive width
    hq = torch.clamp(hq, min=torch.finfo(x.dtype).tiny ** 0.25)
    one = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    center = data_center(x)
    rows = chunk_rows(xq.shape[0], x.shape[0], 1, x.element_size(), None, x.device)
    out = torch.empty(xq.shape[0], y2.shape[1], dtype=x.dtype, device=x.device)
    for sl in iter_chunks(xq.shape[0], rows):
        lw = kern.log_profile(
            _scaled_sq_dist(xq[sl], x, one, center) / hq[sl, None] ** 2
        )
        out[sl] = torch.softmax(lw, dim=1) @ y2
    warn_empty_kernel(int(torch.isnan(out[:, 0]).sum()), xq.shape[0], kern.name)
    return out[:, 0] if squeeze else out


def _smoother_diagonal(x, h, kernel, method):
    """The diagonal ``L_ii`` of the smoother matrix at the data points, ``(n,)``."""
    if method == "nw":
        _, lse = local_average(x, x, None, h, kernel, warn_empty=False)
        # log K(xᵢ, xᵢ) = log k(0) = 0 for every profile, so Lᵢᵢ = 1 / Σⱼ K(xᵢ, xⱼ)
        return torch.exp(-lse)
    diag = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    for sl, ell in _ll_chunks(x, x, h, kernel, 1, None):
        diag[sl] = ell[
            torch.arange(ell.shape[0], device=x.device),
            torch.arange(sl.start, sl.stop, device=x.device),
        ]
    return diag


def loo_cv_score(
    x, y, bandwidth, kernel: str = "gaussian", method: str = "nw"
) -> float:
    r"""Leave-one-out mean squared error of a local mean, by the linear-smoother shortcut.

    For Nadaraya–Watson and local linear regression with a kernel fixed in advance,
    :math:`y_i - \hat y_{-i}(x_i) = (y_i - \hat y_i) / (1 - L_{ii})`, so no refit is needed.
    (This is not true of every linear smoother: for KNN, whose rank kernel changes when a point
    is removed, the same formula gives the leave-one-out residual of ``(k-1)``-NN.)
    ``method`` is ``"nw"`` (Nadaraya–Watson) or ``"ll"`` (local linear). Returns ``inf`` when
    some ``L_ii = 1`` (its leave-one-out fit is undefined): a point alone in its
    neighbourhood, or, for local linear regression, one with at most ``d + 1`` effective
    neighbours, which the fitted plane interpolates (always so when ``n ≤ d + 1``).
    """
    x, y = promote_floats(x, y)
    x = check_points(x, "x")
    y2, _ = check_targets(y, x.shape[0], like=x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    method = check_choice(method, "method", ["nw", "ll"])
    get_kernel(kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fitted = (nadaraya_watson if method == "nw" else local_linear)(
            x, x, y2, h, kernel
        )
    diag = _smoother_diagonal(x, h, kernel, method)
    denom = 1.0 - diag
    if bool((denom.abs() < 1e-12).any()) or not bool(torch.isfinite(fitted).all()):
        return math.inf
    resid = (y2 - fitted) / denom[:, None]
    return float((resid**2).mean())


@dataclass
class BandwidthSelection:
    """Result of :func:`select_bandwidth`: the chosen bandwidth and the LOO-CV curve.

    ``bandwidth`` is a float, or a ``(d,)`` tensor when the grid holds per-dimension
    candidates (``grid (k, d)``); ``scores (k,)`` are the leave-one-out errors."""

    bandwidth: Union[float, torch.Tensor]
    grid: torch.Tensor
    scores: torch.Tensor


def _bandwidth_grid(x, bandwidths, per_dimension: bool):
    """The candidates of :func:`select_bandwidth`, ``(k,)`` or ``(k, d)``."""
    n, d = x.shape
    if bandwidths is None:
        sd = x.std(dim=0) if n > 1 else torch.ones(d, dtype=x.dtype, device=x.device)
        if per_dimension:
            scale = torch.where(sd > 0, sd, torch.ones_like(sd)).cpu()
        else:
            m = float(sd.mean())
            scale = torch.tensor(m if m > 0 else 1.0, dtype=x.dtype)
        factors = torch.logspace(math.log10(0.05), math.log10(2.0), 30, dtype=x.dtype)
        return factors[:, None] * scale if per_dimension else factors * scale
    check_bool(per_dimension, "per_dimension")
    grid = as_tensor(bandwidths, "bandwidths", ndim=(1, 2), like=x).cpu()
    if grid.ndim == 2 and grid.shape[1] != d:
        raise ValueError(
            f"bandwidths must be (k,) numbers or (k, {d}) per-dimension candidates "
            f"(x has d = {d}), got shape {tuple(grid.shape)}"
        )
    if bool((grid <= 0).any()):
        raise ValueError(f"bandwidths must all be positive, got {grid.tolist()}")
    return grid


def select_bandwidth(
    x,
    y,
    bandwidths: Optional[Sequence[float]] = None,
    kernel: str = "gaussian",
    method: str = "nw",
    per_dimension: bool = False,
) -> BandwidthSelection:
    """Choose the bandwidth minimizing :func:`loo_cv_score` over a grid.

    ``bandwidths``: ``(k,)`` candidates, or ``(k, d)`` per-dimension candidates (row ``j`` is
    one bandwidth vector); the default grid has 30 values spaced geometrically between 0.05
    and 2 times the standard deviation of ``x`` averaged over dimensions, or, with
    ``per_dimension=True``, times each dimension's own standard deviation (a ``(30, d)``
    grid, as cheap as the scalar one). A full product grid over the dimensions would cost
    ``k^d`` evaluations; to fit one bandwidth per dimension freely use
    :func:`~localbook.fit_metric` with ``diagonal=True``. A ``UserWarning`` says when the
    minimum lies at an edge of the grid (the optimum may be beyond it: extend the grid).
    Half precision is computed in float32; ``grid`` and ``scores`` come back in ``x``'s dtype.
    """
    x, y, bandwidths = promote_floats(x, y, bandwidths)
    x = check_points(x, "x")
    out_dtype, x = x.dtype, x.to(compute_dtype(x.dtype))  # half precision: in float32
    n, d = x.shape
    if n < 2:
        raise ValueError(f"x has {n} point; leaving one out needs at least 2 points")
    method = check_choice(method, "method", ["nw", "ll"])
    if method == "ll" and n <= d + 1:
        raise ValueError(
            f"x has n = {n} points in d = {d} dimensions: local linear regression "
            "(method='ll') interpolates them (L_ii = 1), so its leave-one-out error is "
            f"undefined at every bandwidth; it needs n > d + 1 = {d + 1} points"
        )
    grid = _bandwidth_grid(x, bandwidths, per_dimension)
    scores = torch.tensor(
        [loo_cv_score(x, y, b if b.ndim else float(b), kernel, method) for b in grid],
        dtype=x.dtype,
    )
    if not bool(torch.isfinite(scores).any()):
        why = (
            "alone in its neighbourhood, or (local linear) with at most d + 1 "
            "effective neighbours, which the fitted plane interpolates"
            if method == "ll"
            else "alone in its neighbourhood"
        )
        where = "the default grid" if bandwidths is None else "bandwidths"
        raise ValueError(
            f"every bandwidth in {where} leaves some point {why} (L_ii = 1: its "
            "leave-one-out fit is undefined); use larger bandwidths"
        )
    best = int(torch.argmin(scores))
    chosen = grid[best].to(out_dtype) if grid.ndim == 2 else float(grid[best])
    if len(grid) > 1 and best in (0, len(grid) - 1):
        edge = "smallest" if best == 0 else "largest"
        value = chosen.tolist() if grid.ndim == 2 else chosen
        warnings.warn(
            f"select_bandwidth: the best bandwidth {value} is the {edge} of the grid "
            f"(from {grid[0].tolist()} to {grid[-1].tolist()}); the optimum may lie "
            "beyond it: extend the grid",
            UserWarning,
            stacklevel=2,
        )
    return BandwidthSelection(chosen, grid.to(out_dtype), scores.to(out_dtype))
