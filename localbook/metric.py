r"""Learned kernels: the metric of a localization kernel, and bandwidths that adapt to the data.

*Metric learning for kernel regression* (MLKR, Weinberger & Tesauro 2007) learns a linear map
``A (k, d)`` for the Gaussian kernel :math:`K(x, x') = \exp(-\lVert A(x - x')\rVert^2/2)` (the
book's convention: ``A = I/h`` is the isotropic kernel with bandwidth ``h``) by minimizing the
leave-one-out error of Nadaraya–Watson,

.. math:: L(A) = \sum_i \big\lVert y_i - \hat y_{-i}(x_i)\big\rVert^2, \qquad
   \hat y_{-i}(x_i) = \frac{\sum_{j \ne i} K(x_i, x_j)\, y_j}{\sum_{j \ne i} K(x_i, x_j)} .

:func:`mlkr_loss` computes it in row chunks (log-space softmax with the point itself excluded),
differentiable in ``A``; :func:`fit_metric` minimizes it with L-BFGS and, by default, stops early on
an internal held-out split, because a full-rank ``A`` can overfit the leave-one-out objective.

Adaptive bandwidths for density estimation (the names *balloon* and *sample-point* are Terrell &
Scott's, 1992): the *balloon* estimator (:func:`balloon_kde`) widens the kernel at the query
(``h(q)`` = distance to the ``k``-th nearest point, via :func:`localbook.knn_bandwidth`, as in the
nearest-neighbour estimator of Loftsgaarden & Quesenberry, 1965); the *sample-point* estimator
(:func:`sample_point_kde`), the variable kernel of Breiman, Meisel & Purcell (1977), gives each
data point its own width. Here the widths follow the adaptive kernel estimator of Silverman
(1986, §5.3), :func:`abramson_bandwidths`: :math:`h_i = h\,(\tilde p(x_i)/g)^{-\alpha}` with a
pilot density :math:`\tilde p` and :math:`g` the geometric mean of the :math:`\tilde p(x_i)`;
``α = 1/2`` is Abramson's (1982) square-root law :math:`h_i \propto p(x_i)^{-1/2}`. A
sample-point estimate is a mixture of normalized kernels, so it integrates to one; a balloon
estimate in general does not.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from ._validate import (
    as_tensor,
    check_fraction,
    check_points,
    check_positive_float,
    check_positive_int,
    check_query,
    check_targets,
    promote_floats,
)
from .kernels import chunk_rows, iter_chunks, _scaled_sq_dist

__all__ = [
    "mlkr_loss",
    "fit_metric",
    "abramson_bandwidths",
    "sample_point_kde",
    "balloon_kde",
]


# --- MLKR ---------------------------------------------------------------------------------------
def _check_matrix(A, d: int, name: str = "A") -> torch.Tensor:
    t = as_tensor(A, name, ndim=(2,))
    if t.shape[1] != d:
        raise ValueError(
            f"{name} must have shape (k, {d}) to act on the {d} feature(s) of x, got "
            f"{tuple(t.shape)}"
        )
    return t


def _loo_chunk(
    z_rows: torch.Tensor, z: torch.Tensor, y: torch.Tensor, start: torch.Tensor
) -> torch.Tensor:
    """Σ over the chunk's rows of ‖y_i − ŷ_{-i}‖²; ``start`` (0-d long tensor) is the first row's index."""
    r = z_rows.shape[0]
    d2 = (
        (z_rows * z_rows).sum(1, keepdim=True)
        + (z * z).sum(1)[None, :]
        - 2.0 * z_rows @ z.T
    ).clamp(min=0.0)
    rows = torch.arange(r, device=z.device)
    self_mask = torch.zeros(r, z.shape[0], dtype=torch.bool, device=z.device)
    self_mask[rows, rows + start] = True
    logw = (-0.5 * d2).masked_fill(self_mask, -math.inf)  # the point itself is left out
    pred = torch.softmax(logw, dim=1) @ y
    return ((y[start + rows] - pred) ** 2).sum()


def mlkr_loss(A, x, y, *, budget: Optional[int] = None) -> torch.Tensor:
    r"""MLKR objective: :math:`\sum_i \lVert y_i - \hat y_{-i}(x_i)\rVert^2` under the kernel of ``A``.

    ``A (k, d)`` defines :math:`K(x, x') = \exp(-\lVert A(x - x')\rVert^2/2)`; ``x (n, d)``
    (1-D means ``d = 1``), ``y (n,)`` or ``(n, p)`` (squared norms summed over outputs),
    ``n ≥ 2``. Each point is predicted by Nadaraya–Watson from the *other* points (weights
    normalized in log space, so a point far from all others gets its nearest neighbour's value).
    Returns a 0-d tensor, differentiable in ``A`` (and in ``x``, ``y``). Work is done in row chunks
    of about ``budget`` bytes; when gradients are needed and there is more than one chunk, each
    chunk is recomputed in the backward pass (activation checkpointing), so memory stays bounded.
    ``A = I/h`` gives ``n`` times :func:`localbook.loo_cv_score` for a 1-D ``y``.
    """
    A, x, y = promote_floats(A, x, y)
    A = as_tensor(A, "A", ndim=(2,))
    x = check_points(x, "x", like=A)
    A = _check_matrix(A, x.shape[1])
    y2, _ = check_targets(y, x.shape[0], like=A)
    n = x.shape[0]
    if n < 2:
        raise ValueError(
            f"x must have at least 2 points for a leave-one-out loss, got {n}"
        )
    if budget is not None:
        budget = check_positive_int(budget, "budget")
    # centring leaves distances unchanged and keeps the expansion ‖a‖² + ‖b‖² − 2a·b accurate
    z = (x - x.mean(0, keepdim=True)) @ A.T
    rows = chunk_rows(n, n, 2, z.element_size(), budget, z.device)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (A, x, y2))
    total = z.new_zeros(())
    for sl in iter_chunks(n, rows):
        start = torch.tensor(sl.start, device=z.device)
        if grad and rows < n:
            total = total + checkpoint(
                _loo_chunk, z[sl], z, y2, start, use_reentrant=False
            )
        else:
            total = total + _loo_chunk(z[sl], z, y2, start)
    return total


def _validation_error(A, x_fit, y_fit, x_val, y_val) -> float:
    from .local_mean import nadaraya_watson

    with torch.no_grad():
        pred = nadaraya_watson(x_val @ A.T, x_fit @ A.T, y_fit, 1.0)
        return float(((pred - y_val) ** 2).sum() / y_val.shape[0])


def _initial_metric(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Standardize each feature and take the leave-one-out-best isotropic bandwidth ``h0``:
    ``diag(1/s)/h0``, the Euclidean kernel on standardized features."""
    from .local_mean import select_bandwidth

    s = x.std(0)
    s = torch.where(s > 0, s, torch.ones_like(s))
    with warnings.catch_warnings():  # a start at the grid's edge is still a start
        warnings.filterwarnings("ignore", "select_bandwidth: the best", UserWarning)
        h0 = select_bandwidth(x / s, y).bandwidth
    return torch.diag(1.0 / s) / h0


def _optimize(
    A0,
    x_fit,
    y_fit,
    val,
    *,
    max_iter,
    check_every,
    patience,
    budget,
    diagonal=False,
    info=None,
):
    """L-BFGS on the MLKR loss from ``A0``; with ``val = (x_val, y_val)`` early stopping.

    ``diagonal=True`` optimizes the diagonal of ``A0`` only (the matrix ``diag(a)``). ``info``,
    a dict, receives ``n_iter`` (iterations run), ``best_iter`` (the returned iterate's) and,
    with early stopping, ``val_errors`` (the held-out errors checked, the start's first).
    """
    to_A = torch.diag if diagonal else (lambda p: p)
    start = torch.diagonal(A0) if diagonal else A0
    p = start.detach().clone(memory_format=torch.contiguous_format).requires_grad_(True)
    m = x_fit.shape[0]
    # max_eval must be set with max_iter: torch's default, max_iter * 5 // 4, is 1 for one
    # iteration per step, which leaves the strong-Wolfe line search no evaluations at all
    # (and, when max_iter is raised afterwards, stops L-BFGS after a single iteration)
    opt = torch.optim.LBFGS(
        [p],
        lr=1.0,
        max_iter=check_every,
        max_eval=25 * check_every,
        history_size=20,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-10,
        tolerance_change=1e-12,
    )

    def closure():
        opt.zero_grad()
        loss = mlkr_loss(to_A(p), x_fit, y_fit, budget=budget) / m
        loss.backward()
        return loss

    info = {} if info is None else info
    if val is None:
        opt.param_groups[0]["max_iter"] = max_iter
        opt.param_groups[0]["max_eval"] = 25 * max_iter
        opt.step(closure)
        info["n_iter"] = info["best_iter"] = int(opt.state[p].get("n_iter", 0))
        return to_A(p.detach())
    best = to_A(p.detach().clone())
    best_err = _validation_error(best, x_fit, y_fit, *val)
    errors, best_iter = [best_err], 0
    stale, used = 0, 0
    while used < max_iter and stale < patience:
        before = p.detach().clone()
        opt.step(closure)
        used += check_every
        if not bool(torch.isfinite(p).all()):
            break
        A = to_A(p.detach())
        err = _validation_error(A, x_fit, y_fit, *val)
        errors.append(err)
        if err < best_err:
            best, best_err, best_iter, stale = A.clone(), err, used, 0
        else:
            stale += 1
        if torch.equal(before, p.detach()):  # L-BFGS has converged
            break
    info.update(n_iter=used, best_iter=best_iter, val_errors=errors)
    return best


def fit_metric(
    x,
    y,
    n_components: Optional[int] = None,
    *,
    seed: int = 0,
    early_stopping: bool = True,
    validation_fraction: float = 0.25,
    max_iter: int = 200,
    check_every: int = 1,
    patience: int = 10,
    init=None,
    diagonal: bool = False,
    return_info: bool = False,
    budget: Optional[int] = None,
):
    r"""Learn ``A (k, d)`` for :math:`K(x, x') = \exp(-\lVert A(x - x')\rVert^2/2)` by MLKR.

    Minimizes :func:`mlkr_loss` (divided by the number of points) with L-BFGS (strong-Wolfe line
    search), starting from ``init`` or, by default, from the Euclidean kernel on standardized
    features at the leave-one-out-best bandwidth, ``diag(1/s)/h0``. For ``n_components = k < d``
    the default start is the rank-``k`` truncation (SVD) of the full-rank metric fitted first.
    With ``diagonal=True`` only a diagonal ``A = diag(a)`` is learned, one bandwidth
    :math:`1/a_j` per feature (``d`` parameters; ``init``, if given, must be diagonal).

    With ``early_stopping=True`` (the default) a random ``validation_fraction`` of the points
    (chosen with ``seed``) is held out: L-BFGS runs on the rest, after every ``check_every``
    iterations the held-out squared error of Nadaraya–Watson (fitted on the rest) is measured,
    and the ``A`` with the smallest held-out error — the starting point included — is returned;
    optimization stops after ``patience`` checks without improvement or ``max_iter`` iterations.
    This guards against the overfitting of a full-rank ``A`` to the leave-one-out objective.
    With ``early_stopping=False`` all points are used for ``max_iter`` iterations. Predict with
    ``nadaraya_watson(x_query @ A.T, x @ A.T, y, 1.0)``.

    With ``return_info=True`` returns ``(A, info)``, ``info`` a dict: ``init`` (the start of
    the last optimization), ``n_iter`` (its L-BFGS iterations), ``best_iter`` (the iteration
    of the returned ``A``, 0 for the start) and, with early stopping, ``val_errors`` (the
    held-out mean squared errors checked, the start's first).
    """
    x, y, init = promote_floats(x, y, init)
    x = check_points(x, "x")
    y2, _ = check_targets(y, x.shape[0], like=x)
    n, d = x.shape
    k = (
        d
        if n_components is None
        else check_positive_int(n_components, "n_components", maximum=d)
    )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    for flag, name in (
        (early_stopping, "early_stopping"),
        (diagonal, "diagonal"),
        (return_info, "return_info"),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if diagonal and k < d:
        raise ValueError(
            f"n_components must be None or {d} with diagonal=True, got {n_components}"
        )
    frac = check_fraction(validation_fraction, "validation_fraction")
    opts = dict(
        max_iter=check_positive_int(max_iter, "max_iter"),
        check_every=check_positive_int(check_every, "check_every"),
        patience=check_positive_int(patience, "patience"),
        budget=budget,
    )
    if budget is not None:
        check_positive_int(budget, "budget")
    min_n = 5 if early_stopping else 2
    if n < min_n:
        raise ValueError(
            f"x must have at least {min_n} points to fit a metric, got {n}"
        )
    if init is not None:
        A0 = _check_matrix(as_tensor(init, "init", like=x, ndim=(2,)), d, "init")
        if A0.shape[0] != k:
            raise ValueError(f"init has {A0.shape[0]} row(s) but n_components is {k}")
        if diagonal and not torch.equal(A0, torch.diag(torch.diagonal(A0))):
            raise ValueError("init must be a diagonal matrix with diagonal=True")

    if early_stopping:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(n, generator=g).to(x.device)
        n_val = min(n - 3, max(2, round(frac * n)))
        val_idx, fit = perm[:n_val], perm[n_val:]
        x_fit, y_fit, val = x[fit], y2[fit], (x[val_idx], y2[val_idx])
    else:
        x_fit, y_fit, val = x, y2, None
    if init is None:
        A0 = _initial_metric(x_fit, y_fit)
        if k < d:  # truncate the learned full-rank metric, then refine at rank k
            full = _optimize(A0, x_fit, y_fit, val, **opts)
            _, sv, vh = torch.linalg.svd(full, full_matrices=False)
            A0 = sv[:k, None] * vh[:k]
    info = {"init": A0.detach().clone()}
    A = _optimize(A0, x_fit, y_fit, val, diagonal=diagonal, info=info, **opts)
    return (A, info) if return_info else A


# --- adaptive bandwidths ------------------------------------------------------------------------
def _log_const(kernel: str, d: int) -> float:
    from .density import log_kernel_constant

    return log_kernel_constant(kernel, d)


def _kernel(kernel: str):
    from .density import _kde_kernel

    return _kde_kernel(kernel)


def abramson_bandwidths(
    x,
    bandwidth,
    *,
    pilot=None,
    alpha: float = 0.5,
    pilot_bandwidth=None,
    kernel: str = "gaussian",
) -> torch.Tensor:
    r"""Adaptive bandwidths :math:`h_i = h\,(\tilde p(x_i)/g)^{-\alpha}`, ``(n,)``.

    Silverman's (1986, §5.3) adaptive kernel estimator: a pilot estimate :math:`\tilde p`,
    sensitivity ``alpha``; ``alpha = 1/2`` (the default) is Abramson's (1982) square-root law
    :math:`h_i \propto p(x_i)^{-1/2}`, stated there for the true density :math:`p`.

    ``pilot`` is either ``None`` — the pilot is the fixed-bandwidth :func:`localbook.kde` with
    ``pilot_bandwidth`` (default ``bandwidth``), evaluated at the data — or an ``(n,)`` array of
    positive pilot density values at the data points. :math:`g = \exp(\frac1n\sum_i\log\tilde
    p(x_i))` is their geometric mean, so the :math:`h_i` have geometric mean ``h``: where the data
    are dense the kernel narrows, in the tails it widens. ``bandwidth`` is a positive float.
    """
    x, pilot = promote_floats(x, pilot)
    from .density import kde

    x = check_points(x, "x")
    h = check_positive_float(bandwidth, "bandwidth")
    alpha = check_positive_float(alpha, "alpha", allow_zero=True)
    if pilot is None:
        hp = (
            h
            if pilot_bandwidth is None
            else check_positive_float(pilot_bandwidth, "pilot_bandwidth")
        )
        log_p = kde(x, x, hp, kernel=kernel, log=True)
    else:
        p = as_tensor(pilot, "pilot", like=x, ndim=(1,))
        if p.shape[0] != x.shape[0]:
            raise ValueError(
                f"pilot has {p.shape[0]} values but x has {x.shape[0]} points; they must match"
            )
        if bool((p <= 0).any()):
            raise ValueError("pilot must hold positive density values")
        log_p = torch.log(p)
    if not bool(torch.isfinite(log_p).all()):
        raise ValueError(
            "the pilot density is zero at some data point; use a larger pilot_bandwidth"
        )
    return h * torch.exp(-alpha * (log_p - log_p.mean()))


def sample_point_kde(
    x_query,
    x,
    bandwidth,
    *,
    pilot=None,
    alpha: float = 0.5,
    pilot_bandwidth=None,
    kernel: str = "gaussian",
    log: bool = False,
    budget: Optional[int] = None,
) -> torch.Tensor:
    r"""Sample-point (variable) KDE :math:`\hat p(q) = \frac1n\sum_i \frac{1}{c\,h_i^d}\,k(\lVert q - x_i\rVert/h_i)`.

    The variable kernel estimator of Breiman, Meisel & Purcell (1977), who took :math:`h_i`
    proportional to the distance from :math:`x_i` to its ``k``-th nearest neighbour; here
    the :math:`h_i` come from :func:`abramson_bandwidths` (arguments ``pilot``, ``alpha``,
    ``pilot_bandwidth`` as there); a flat pilot (equal values) or ``alpha = 0`` gives
    :func:`localbook.kde` with bandwidth ``h``. Each term is a normalized density, so
    :math:`\hat p` integrates to one. Shapes: ``x_query (m, d)``, ``x (n, d)``; returns ``(m,)``
    (the log-density with ``log=True``, by ``logsumexp``). Chunked over queries.
    """
    x_query, x, pilot = promote_floats(x_query, x, pilot)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    kern = _kernel(kernel)
    if not isinstance(log, bool):
        raise TypeError(f"log must be a bool, got {type(log).__name__}")
    hi = abramson_bandwidths(
        x,
        bandwidth,
        pilot=pilot,
        alpha=alpha,
        pilot_bandwidth=pilot_bandwidth,
        kernel=kern.name,
    )
    n, d = x.shape
    one = torch.ones(d, dtype=x.dtype, device=x.device)
    col = -d * torch.log(hi) - (math.log(n) + _log_const(kern.name, d))
    rows = chunk_rows(xq.shape[0], n, 1, x.element_size(), budget, x.device)
    out = torch.empty(xq.shape[0], dtype=x.dtype, device=x.device)
    for sl in iter_chunks(xq.shape[0], rows):
        u2 = _scaled_sq_dist(xq[sl], x, one).clamp(min=0.0) / (hi * hi)[None, :]
        out[sl] = torch.logsumexp(kern.log_profile(u2) + col[None, :], dim=1)
    return out if log else torch.exp(out)


def balloon_kde(
    x_query,
    x,
    n_neighbors: int = 10,
    *,
    scale: float = 1.0,
    kernel: str = "gaussian",
    log: bool = False,
) -> torch.Tensor:
    r"""Balloon KDE :math:`\hat p(q) = \frac{1}{n\,c\,h(q)^d}\sum_i k(\lVert q - x_i\rVert/h(q))`.

    Terrell & Scott's (1992) name for a bandwidth attached to the query; with the uniform
    kernel it is the nearest-neighbour density estimator of Loftsgaarden & Quesenberry (1965).
    The bandwidth belongs to the query: :math:`h(q) = \text{scale}\cdot d_k(q)`, the distance to
    the ``n_neighbors``-th nearest data point (:func:`localbook.knn_bandwidth`, the same width
    :func:`localbook.adaptive_nadaraya_watson` uses). At each query it is a proper KDE, but as a
    function of ``q`` it need not integrate to one (in 1-D its tails decay like ``1/|q|``, so the
    integral diverges). Returns ``(m,)`` (log-density with ``log=True``).
    """
    x_query, x = promote_floats(x_query, x)
    from .local_mean import knn_bandwidth

    x = check_points(x, "x")
    xq = check_query(x_query, x)
    kern = _kernel(kernel)
    scale = check_positive_float(scale, "scale")
    if not isinstance(log, bool):
        raise TypeError(f"log must be a bool, got {type(log).__name__}")
    n, d = x.shape
    hq = scale * knn_bandwidth(xq, x, n_neighbors)
    hq = torch.clamp(hq, min=torch.finfo(x.dtype).tiny ** 0.25)
    one = torch.ones(d, dtype=x.dtype, device=x.device)
    rows = chunk_rows(xq.shape[0], n, 1, x.element_size(), None, x.device)
    out = torch.empty(xq.shape[0], dtype=x.dtype, device=x.device)
    const = math.log(n) + _log_const(kern.name, d)
    for sl in iter_chunks(xq.shape[0], rows):
        u2 = _scaled_sq_dist(xq[sl], x, one).clamp(min=0.0) / (hq[sl, None] ** 2)
        out[sl] = (
            torch.logsumexp(kern.log_profile(u2), dim=1) - d * torch.log(hq[sl]) - const
        )
    return out if log else torch.exp(out)
