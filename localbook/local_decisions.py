r"""Local decisions beyond the mean: the local mode, the local quantile, fuzzy rules, the bilateral filter.

The localization method's decision at a query ``x*`` is
:math:`\hat\theta(x^*) = \arg\min_\theta \sum_i K(x^*, x_i)\,\ell(y_i, \theta)`. Squared loss gives
the local mean (Nadaraya–Watson); the 0–1 loss on class labels gives the *local mode*: the class
with the largest kernel mass, :math:`\hat y(x^*) = \arg\max_c \sum_{i: y_i = c} K(x^*, x_i)`.
It is the plug-in Bayes classifier whose class-conditional densities are kernel density
estimates with the same kernel and bandwidth (the class priors are the class frequencies).
The pinball loss gives the local quantile (:func:`local_quantile`); Takagi–Sugeno fuzzy rules
are a local mean of local linear models (:func:`takagi_sugeno`, :func:`fit_takagi_sugeno`); a
kernel on position *and* value gives the bilateral filter (:func:`bilateral_filter`).
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch

from ._validate import (
    as_tensor,
    check_bandwidth,
    check_choice,
    check_labels,
    check_points,
    check_positive_float,
    check_positive_int,
    check_query,
    compute_dtype,
    check_targets,
    promote_floats,
)
from .chunks import chunk_rows, iter_chunks
from .kernels import KERNELS, Kernel, data_center, get_kernel, log_weights
from .local_sums import local_average

__all__ = [
    "local_mode_classify",
    "local_quantile",
    "pinball_loss",
    "takagi_sugeno",
    "rule_memberships",
    "fit_takagi_sugeno",
    "bilateral_filter",
]


def local_mode_classify(
    x_query, x, labels, bandwidth, kernel: str = "gaussian", return_proba: bool = False
):
    r"""The local mode: the class with the largest kernel mass around each query.

    ``x_query (m, d)``, ``x (n, d)``, ``labels (n,)`` (integers or strings), ``bandwidth`` a
    float or ``(d,)``. The class probabilities are the local mean of one-hot labels,
    :math:`p_c(x^*) = \sum_{i: y_i=c} K(x^*, x_i) / \sum_i K(x^*, x_i)`; the prediction is their
    argmax (ties go to the first class in sorted order). Returns the predicted labels ``(m,)``
    and, with ``return_proba=True``, ``(labels, proba (m, c), classes (c,))``. Under a compact
    kernel a query with no point within the bandwidth has NaN probabilities (one warning) and
    gets the first class; check ``proba`` when that matters.
    """
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    classes, codes = check_labels(labels, x.shape[0], device=x.device)
    onehot = torch.nn.functional.one_hot(codes, len(classes)).to(x.dtype)
    proba, _ = local_average(xq, x, onehot, h, kernel)
    best = torch.nan_to_num(proba, nan=-1.0).argmax(dim=1)
    pred = (
        classes[best]
        if isinstance(classes, torch.Tensor)
        else classes[best.cpu().numpy()]
    )
    return (pred, proba, classes) if return_proba else pred


# --- the pinball loss: the local quantile -------------------------------------------------
def _check_levels(q):
    """Quantile levels in the open interval (0, 1): a float or a 1-D array."""
    if isinstance(q, bool):
        raise TypeError(
            "q must be a number in (0, 1) or a 1-D array of them, got a bool"
        )
    scalar = isinstance(q, numbers.Real)
    levels = as_tensor(
        [q] if scalar else q, "q", ndim=(1,), like=torch.zeros(1, dtype=torch.float64)
    )
    if bool(((levels <= 0) | (levels >= 1)).any()):
        raise ValueError(f"q must lie strictly between 0 and 1, got {levels.tolist()}")
    return levels, scalar


def local_quantile(
    x_query, x, y, bandwidth, q=0.5, kernel: str = "gaussian"
) -> torch.Tensor:
    r"""The local ``q``-quantile: a minimizer of the kernel-weighted pinball loss.

    :math:`\hat\theta_q(x^*) \in \arg\min_\theta \sum_i K(x^*, x_i)\,\rho_q(y_i - \theta)` with
    :math:`\rho_q(u) = u\,(q - 1[u < 0])`. The minimizer returned is the smallest data value
    :math:`y_{(j)}` whose cumulative kernel weight (in the order of ``y``) reaches ``q`` times the
    total: the exact weighted quantile (numpy's ``inverted_cdf`` with weights). ``q = 0.5`` is
    the local median. ``y`` is ``(n,)``; ``q`` a float in (0, 1) (result ``(m,)``) or a 1-D
    array of levels (result ``(m, len(q))``, non-decreasing along a row). Work is chunked over
    the queries; no Python loop over points. Queries with no point within the support of a
    compact kernel get NaN (one warning).
    """
    x_query, x, y = promote_floats(x_query, x, y)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    y2, _ = check_targets(y, x.shape[0], like=x)
    if y2.shape[1] != 1:
        raise ValueError(
            f"y must be (n,) for local_quantile (one response), got shape {tuple(y2.shape)}"
        )
    levels, scalar = _check_levels(q)
    levels = levels.to(dtype=x.dtype, device=x.device)
    kern = get_kernel(kernel)
    ys, order = torch.sort(y2[:, 0])
    xs = x[order]  # data in the order of y: cumulative weights run along rows
    center = data_center(xs)
    m, n = xq.shape[0], xs.shape[0]
    out = torch.empty(m, len(levels), dtype=x.dtype, device=x.device)
    for sl in iter_chunks(m, chunk_rows(m, n, 1, x.element_size(), None, x.device)):
        lw = log_weights(xq[sl], xs, h, kern, center)
        top = lw.amax(dim=1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        cum = torch.exp(lw - top).cumsum(
            dim=1
        )  # weights relative to the largest: no underflow
        target = levels[None, :] * cum[:, -1:]
        j = torch.searchsorted(cum, target.contiguous()).clamp_(max=n - 1)
        res = ys[j]
        res[cum[:, -1] == 0] = math.nan  # empty neighbourhood (compact kernel)
        out[sl] = res
    n_empty = int(torch.isnan(out[:, 0]).sum())
    if n_empty:
        warnings.warn(
            f"{n_empty} of {m} queries have no data point within the bandwidth of the "
            f"compact {kern.name!r} kernel; their quantiles are NaN",
            UserWarning,
            stacklevel=2,
        )
    return out[:, 0] if scalar else out


def pinball_loss(u, q=0.5) -> torch.Tensor:
    r"""The pinball (check) loss :math:`\rho_q(u) = u\,(q - 1[u < 0])`, elementwise."""
    levels, scalar = _check_levels(q)
    if not scalar:
        raise TypeError("pinball_loss takes one level q (a float)")
    u = as_tensor(u, "u", ndim=(0, 1, 2), allow_empty=True)
    return u * (float(levels[0]) - (u < 0).to(u.dtype))


# --- fuzzy inference: Takagi–Sugeno rules ----------------------------------------------------
def _membership(membership):
    """A membership function is a localization kernel profile: name it as a kernel."""
    return (
        membership
        if isinstance(membership, Kernel)
        else get_kernel(check_choice(membership, "membership", list(KERNELS)))
    )


def _check_coefficients(coefficients, R: int, d: int, like):
    a = as_tensor(coefficients, "coefficients", like=like, ndim=(1, 2))
    if a.ndim == 1:
        a = a[:, None]
    if a.shape[0] != R or a.shape[1] not in (1, d + 1):
        raise ValueError(
            f"coefficients must be ({R}, 1) (zero-order rules) or ({R}, {d + 1}) "
            f"(intercept and {d} slopes) for the {R} rows of centers, got shape "
            f"{tuple(a.shape)}"
        )
    return a


def takagi_sugeno(
    x_query, centers, bandwidth, coefficients, membership: str = "gaussian"
) -> torch.Tensor:
    r"""Takagi–Sugeno fuzzy inference: a local mean of the rules' linear models.

    Rule ``r`` reads "if :math:`x` is near :math:`c_r` then :math:`y = a_r + b_r^\top x`"; its
    firing strength is the membership :math:`\mu_r(x) = k(\lvert x - c_r\rvert/h)`, a localization
    kernel (``membership`` names the profile, see :mod:`localbook.kernels`). The output is
    :math:`\sum_r \mu_r(x)(a_r + b_r^\top x) / \sum_r \mu_r(x)`. ``centers (R, d)``,
    ``coefficients (R, 1)`` (zero-order: constants :math:`a_r`) or ``(R, d + 1)``
    (:math:`[a_r, b_r]`, slopes in the data's coordinates). Returns ``(m,)``. Zero-order rules
    centred at the data with :math:`a_i = y_i` are Nadaraya–Watson.
    """
    x_query, centers, coefficients = promote_floats(x_query, centers, coefficients)
    c = check_points(centers, "centers")
    xq = check_query(x_query, c, "x_query", "centers")
    h = check_bandwidth(bandwidth, c.shape[1], like=c)
    a = _check_coefficients(coefficients, c.shape[0], c.shape[1], c)
    mean, _ = local_average(
        xq, c, a, h, _membership(membership)
    )  # normalized firing strengths times [a, b]
    if a.shape[1] == 1:
        return mean[:, 0]
    return mean[:, 0] + (mean[:, 1:] * xq).sum(dim=1)


def rule_memberships(
    x_query, centers, bandwidth, membership: str = "gaussian"
) -> torch.Tensor:
    r"""Normalized firing strengths :math:`\bar\mu_r(x) = \mu_r(x)/\sum_s \mu_s(x)`, ``(m, R)``."""
    x_query, centers = promote_floats(x_query, centers)
    c = check_points(centers, "centers")
    xq = check_query(x_query, c, "x_query", "centers")
    h = check_bandwidth(bandwidth, c.shape[1], like=c)
    eye = torch.eye(c.shape[0], dtype=c.dtype, device=c.device)
    mean, _ = local_average(xq, c, eye, h, _membership(membership))
    return mean


def _affinely_deficient(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    r"""Whether the points weighted by each row of ``W (r, n)`` miss an affine direction.

    The weighted covariance :math:`\Sigma_r = \sum_i W_{ri}(x_i - \bar x_r)(x_i - \bar x_r)^\top
    / \sum_i W_{ri}`, scaled to a correlation matrix, is singular to rounding (smallest
    eigenvalue at most :math:`10\,n\,\varepsilon`, or a coordinate without spread). ``(r,)``.
    """
    wsum = W.sum(1, keepdim=True)
    xbar = (W @ x) / wsum
    xc = x[None, :, :] - xbar[:, None, :]  # (r, n, d)
    cov = torch.einsum("rn,rnj,rnk->rjk", W, xc, xc) / wsum[:, :, None]
    var = torch.diagonal(cov, dim1=1, dim2=2)
    tol = 10 * x.shape[0] * torch.finfo(x.dtype).eps
    spread = var > tol * var.amax(1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    s = torch.where(spread, var, torch.ones_like(var)).sqrt()
    corr = cov / (s[:, :, None] * s[:, None, :])
    return ~spread.all(1) | (torch.linalg.eigvalsh(corr)[:, 0] <= tol)


def _check_x_spans(x: torch.Tensor) -> None:
    """A first-order rule has ``d + 1`` coefficients: ``x`` must span its space affinely."""
    if bool(_affinely_deficient(torch.ones_like(x[None, :, 0]), x)[0]):
        centred = x - x.mean(0)
        rank = int(
            torch.linalg.matrix_rank(
                centred, rtol=10 * x.shape[0] * torch.finfo(x.dtype).eps
            )
        )
        raise ValueError(
            f"x: the {x.shape[0]} data points lie in an affine subspace of dimension "
            f"{rank} < d = {x.shape[1]} (e.g. collinear points in the plane), so the "
            f"{x.shape[1] + 1} coefficients of a first-order rule are not determined at "
            "any bandwidth; use order=0, ridge > 0, or drop the redundant coordinates"
        )


def fit_takagi_sugeno(
    x,
    y,
    centers,
    bandwidth,
    order: int = 1,
    membership: str = "gaussian",
    method: str = "local",
    ridge: float = 0.0,
) -> torch.Tensor:
    r"""Consequents of Takagi–Sugeno rules by (weighted) least squares; returns ``(R, order·d + 1)``.

    ``method="local"``: each rule separately, by least squares weighted with its own memberships,
    :math:`\min_{a_r, b_r} \sum_i \mu_r(x_i)\,(y_i - a_r - b_r^\top x_i)^2` — the local linear
    (``order=1``) or local constant (``order=0``) fit at :math:`c_r`, so every rule is
    interpretable on its own. ``method="global"``: all rules at once, ordinary least squares of
    the TS output on the data (best in-sample fit, rules no longer local fits). ``ridge ≥ 0``
    adds :math:`\lambda\lVert\theta\rVert^2` (slopes and intercepts) for ill-posed rules.
    With ``ridge=0`` a first-order rule is determined exactly when the points that fire it
    (:math:`\mu_r(x_i) > 0`) span :math:`\mathbb{R}^d` affinely; otherwise a ``ValueError``
    names the cause: ``x`` itself in a lower-dimensional affine subspace (collinear points in
    the plane), too few points firing the rule, or its firing points in such a subspace.
    """
    x, y, centers = promote_floats(x, y, centers)
    x = check_points(x, "x")
    out_dtype, x = x.dtype, x.to(compute_dtype(x.dtype))  # no solvers in half precision
    y2, _ = check_targets(y, x.shape[0], like=x)
    if y2.shape[1] != 1:
        raise ValueError(f"y must be (n,), got shape {tuple(y2.shape)}")
    c = check_query(centers, x, "centers")
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    order = check_positive_int(order, "order", minimum=0, maximum=1)
    method = check_choice(method, "method", ["local", "global"])
    ridge = check_positive_float(ridge, "ridge", allow_zero=True)
    kern = _membership(membership)
    if order == 1 and ridge == 0:
        _check_x_spans(x)
    A = (
        torch.cat([torch.ones_like(x[:, :1]), x], 1)
        if order == 1
        else torch.ones_like(x[:, :1])
    )
    p, R = A.shape[1], c.shape[0]
    eye = ridge * torch.eye(p, dtype=x.dtype, device=x.device)
    if method == "local":
        theta = torch.empty(R, p, dtype=x.dtype, device=x.device)
        center = data_center(x)
        for sl in iter_chunks(
            R, chunk_rows(R, x.shape[0], p + 1, x.element_size(), None, x.device)
        ):
            W = torch.exp(
                log_weights(c[sl], x, h, kern, center)
            )  # memberships (rows, n)
            M = torch.einsum("rn,nj,nk->rjk", W, A, A) + eye
            b = (W * y2[:, 0]) @ A
            sol, info = torch.linalg.solve_ex(M, b)
            if ridge == 0:
                few = (W > 0).sum(1) < p
                flat = torch.zeros_like(few)
                if order == 1 and not bool(few.all()):
                    flat[~few] = _affinely_deficient(W[~few], x)
                for bad, why in ((few, "few"), (flat, "flat")):
                    if bool(bad.any()):
                        r = sl.start + int(bad.nonzero()[0, 0])
                        n_fire = int((W[r - sl.start] > 0).sum())
                        raise ValueError(
                            f"rule {r}: too few data points fire it ({n_fire}) to fit "
                            f"{p} coefficient(s); use a larger bandwidth, fewer centers, "
                            "order=0 or ridge > 0"
                            if why == "few"
                            else f"rule {r}: the {n_fire} data points that fire it lie in "
                            "a lower-dimensional affine subspace (collinear in the plane), "
                            f"so its {p} coefficients are not determined; use a larger "
                            "bandwidth, order=0 or ridge > 0"
                        )
            if bool((info != 0).any()) or not bool(torch.isfinite(sol).all()):
                bad = sl.start + int(
                    ((info != 0) | ~torch.isfinite(sol).all(1)).nonzero()[0, 0]
                )
                raise ValueError(
                    f"rule {bad}: its weighted least-squares system is singular in "
                    f"{x.dtype}; rescale x, use order=0 or ridge > 0"
                )
            theta[sl] = sol
        return theta.to(out_dtype)
    wbar = rule_memberships(x, c, h, kern)  # (n, R)
    if bool(torch.isnan(wbar).any()):
        raise ValueError(
            "some data points fire no rule (compact membership); use a larger bandwidth"
        )
    Phi = (wbar[:, :, None] * A[:, None, :]).reshape(x.shape[0], R * p)
    G = Phi.T @ Phi + ridge * torch.eye(R * p, dtype=x.dtype, device=x.device)
    if ridge == 0:
        sol = torch.linalg.lstsq(
            Phi, y2, driver="gelsd" if Phi.device.type == "cpu" else None
        ).solution
    else:
        sol = torch.linalg.solve(G, Phi.T @ y2)
    return sol.reshape(R, p).to(out_dtype)


# --- self-localization: the bilateral filter --------------------------------------------------
def _check_image(image):
    img = as_tensor(image, "image", ndim=(2, 3))
    if img.ndim == 2:
        return img[None], True
    if img.shape[0] > 4 and img.shape[-1] <= 4:
        raise ValueError(
            f"image must be (H, W) or channel-first (C, H, W), got shape {tuple(img.shape)}; "
            "move the channel axis first (e.g. image.permute(2, 0, 1))"
        )
    return img, False


def bilateral_filter(
    image, spatial_bandwidth, range_bandwidth, window=None
) -> torch.Tensor:
    r"""The bilateral filter: a self-local mean over position *and* value (Tomasi & Manduchi).

    :math:`BF[I]_p = \sum_q k(\lVert p - q\rVert/\sigma_s)\,k(\lVert I_p - I_q\rVert/\sigma_r)\,I_q
    \,/\, \sum_q k(\cdot)k(\cdot)` with the Gaussian profile :math:`k(u) = e^{-u^2/2}`; positions
    in pixels, values in the image's units, the range distance the Euclidean norm over channels.
    It is the Nadaraya–Watson local mean of the values under a self-localization kernel on the
    joint points :math:`(p/\sigma_s, I_p/\sigma_r)`. ``image`` is ``(H, W)`` or channel-first
    ``(C, H, W)``; returns the same shape. ``window=None`` sums over the whole image, exactly
    (chunked, :math:`O((HW)^2)`); ``window=w`` (an int ≥ 1) only over the
    :math:`(2w+1)^2` pixels with :math:`\lvert\Delta \text{row}\rvert, \lvert\Delta \text{col}\rvert \le w`
    — :math:`O(HW w^2)`, and equal to the exact filter up to weights below
    :math:`e^{-w^2/(2\sigma_s^2)}` (exactly equal once :math:`w \ge \max(H, W) - 1`).
    """
    img, flat = _check_image(image)
    s = check_positive_float(spatial_bandwidth, "spatial_bandwidth")
    r = check_positive_float(range_bandwidth, "range_bandwidth")
    C, H, W = img.shape
    if window is None:
        rows, cols = torch.meshgrid(
            torch.arange(H, dtype=img.dtype, device=img.device),
            torch.arange(W, dtype=img.dtype, device=img.device),
            indexing="ij",
        )
        vals = img.reshape(C, H * W).T  # (HW, C)
        z = torch.cat([rows.reshape(-1, 1), cols.reshape(-1, 1), vals], 1)
        h = torch.tensor([s, s] + [r] * C, dtype=img.dtype, device=img.device)
        out, _ = local_average(z, z, vals, h, "gaussian")
        out = out.T.reshape(C, H, W)
    else:
        w = check_positive_int(window, "window")
        pad = torch.nn.functional.pad(img, (w, w, w, w))
        inside = torch.nn.functional.pad(
            torch.ones(1, H, W, dtype=img.dtype, device=img.device), (w, w, w, w)
        )
        num = torch.zeros_like(img)
        den = torch.zeros(1, H, W, dtype=img.dtype, device=img.device)
        for di in range(
            -w, w + 1
        ):  # a loop over the window's offsets, vectorized over pixels
            for dj in range(-w, w + 1):
                nb = pad[:, w + di : w + di + H, w + dj : w + dj + W]
                ok = inside[:, w + di : w + di + H, w + dj : w + dj + W]
                u2 = (di * di + dj * dj) / s**2 + ((nb - img) ** 2).sum(
                    0, keepdim=True
                ) / r**2
                k = torch.exp(-0.5 * u2) * ok
                num += k * nb
                den += k
        out = num / den  # den ≥ 1: the pixel itself has weight k(0) = 1
    return out[0] if flat else out
