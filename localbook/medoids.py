r"""MedoidShift: mode seeking among the data points, from distances alone.

Each point moves to the data point that minimizes its neighbours' weighted spread
:math:`\sum_l K(x_i, x_l)\, d(x_j, x_l)^2` (Sheikh, Khan & Kanade 2007); following the successors
to their roots clusters the data. Works from the points or from a precomputed distance matrix.
"""

from __future__ import annotations

import math

import torch

from ._validate import as_tensor, check_bandwidth, check_choice, check_points
from ._validate import check_positive_float, check_positive_int
from .chunks import chunk_rows, iter_chunks
from .kernels import (
    Kernel,
    get_kernel,
    _scaled_sq_dist,
)
from .local_sums import local_average

from .modes import MeanShiftResult

__all__ = ["medoid_shift"]


def _medoid_successors(
    pts: torch.Tensor, weight: torch.Tensor, h: torch.Tensor, kern: Kernel
):
    """Weighted medoid of every point's neighbourhood (point masses ``weight``): the point nearest
    its local mean, itself on ties. Returns the successor indices ``(c,)`` and ``log Σ K·weight``."""
    c = pts.shape[0]
    values = torch.cat([pts * weight[:, None], weight[:, None]], dim=1)
    sums, log_sum = local_average(pts, pts, values, h, kern, warn_empty=False)
    mean = sums[:, :-1] / sums[:, -1:]
    log_mass = log_sum + torch.log(sums[:, -1])
    nxt = torch.empty(c, dtype=torch.long, device=pts.device)
    rows = chunk_rows(c, c, 1, pts.element_size(), None, pts.device)
    center = pts.mean(0)
    for sl in iter_chunks(c, rows):
        d2 = _scaled_sq_dist(mean[sl], pts, h, center)
        best = d2.argmin(1)
        own = torch.arange(sl.start, sl.stop, device=pts.device)
        stay = (
            d2[torch.arange(own.numel(), device=pts.device), own]
            <= d2.gather(1, best[:, None])[:, 0]
        )
        nxt[sl] = torch.where(stay, own, best)
    return nxt, log_mass


def _medoid_successors_precomputed(
    dist: torch.Tensor, weight: torch.Tensor, h: float, kern: Kernel
):
    """The same from a distance matrix ``(c, c)``: the successor of ``i`` minimizes the weighted
    spread ``Σ_l w_il d(l, j)²`` over ``j`` (itself on ties), ``w_il ∝ K(d(i, l)/h) weight_l``."""
    c = dist.shape[0]
    d2 = dist * dist
    log_weight = torch.log(weight)
    nxt = torch.empty(c, dtype=torch.long, device=dist.device)
    log_mass = torch.empty(c, dtype=dist.dtype, device=dist.device)
    rows = chunk_rows(c, c, 1, dist.element_size(), device=dist.device)
    for sl in iter_chunks(c, rows):
        log_w = (
            kern.log_profile(d2[sl] / (h * h)) + log_weight
        )  # the diagonal keeps every row non-empty
        log_mass[sl] = torch.logsumexp(log_w, 1)
        spread = torch.exp(log_w - log_mass[sl, None]) @ d2  # (rows, c)
        best = spread.argmin(1)
        r = torch.arange(sl.stop - sl.start, device=dist.device)
        own = r + sl.start
        nxt[sl] = torch.where(spread[r, own] <= spread[r, best], own, best)
    return nxt, log_mass


def _check_distances(dist, name: str = "x") -> torch.Tensor:
    """A square, finite, non-negative, symmetric matrix with a zero diagonal (rounding allowed:
    ``√eps`` of the largest entry, the error of a distance taken as the root of a cancelled
    difference of squares); returned symmetrized."""
    d = as_tensor(dist, name, ndim=(2,))
    if d.shape[0] != d.shape[1]:
        raise ValueError(
            f"{name} must be a square (n, n) distance matrix with metric='precomputed', "
            f"got shape {tuple(d.shape)}"
        )
    if bool((d < 0).any()):
        raise ValueError(
            f"{name} must hold non-negative distances, got {int((d < 0).sum())} negative "
            f"entries (smallest {float(d.min()):.3g})"
        )
    slack = math.sqrt(torch.finfo(d.dtype).eps) * float(d.max())
    asym = float((d - d.T).abs().max())
    if asym > slack:
        raise ValueError(
            f"{name} must be a symmetric distance matrix: max |{name} - {name}ᵀ| = {asym:.3g} "
            f"exceeds the rounding allowance {slack:.3g}"
        )
    diag = float(d.diagonal().abs().max())
    if diag > slack:
        raise ValueError(
            f"{name} must have a zero diagonal (each point at distance 0 from itself), "
            f"got an entry {diag:.3g}"
        )
    d = 0.5 * (d + d.T)
    d.fill_diagonal_(0.0)
    return d


def _follow(nxt: torch.Tensor) -> tuple:
    """Roots of the forest ``i → nxt[i]`` by pointer jumping; returns ``(root, rounds)``."""
    root = nxt
    for rounds in range(1, 2 * max(1, nxt.numel()).bit_length() + 2):
        jumped = root[root]
        if bool((jumped == root).all()):
            return root, rounds
        root = jumped
    raise RuntimeError(
        "medoid shift's successor map has a cycle (ties between distinct points)"
    )


def medoid_shift(
    x,
    bandwidth,
    kernel: str = "gaussian",
    max_rounds: int = 1,
    *,
    metric: str = "euclidean",
) -> MeanShiftResult:
    r"""Medoid shift (Sheikh, Khan & Kanade 2007): shifts restricted to the data points.

    Point :math:`i` moves to the data point :math:`j` minimizing the local weighted spread
    :math:`\sum_l w_{il}\, d(x_l, x_j)^2` (weights :math:`w_{il} \propto g(d(x_i, x_l)/h)` with
    :math:`g` the profile named by ``kernel``; the density climbed is that of its shadow, and for
    the Gaussian :math:`g = k`), or stays put when it is itself a minimizer. For Euclidean distances
    :math:`\sum_l w_{il}|x_l - x_j|^2 = \sum_l w_{il}|x_l - m_i|^2 + |m_i - x_j|^2` for the local
    mean :math:`m_i`, so the successor is the data point nearest :math:`m_i`; that is how
    coordinates are handled (chunked, no ``n × n`` spread matrix). With
    ``metric="precomputed"``, ``x`` is instead an ``(n, n)`` matrix of distances (or any
    symmetric dissimilarity with a zero diagonal: square, finite, non-negative, symmetric up to
    rounding, else ``ValueError``), ``bandwidth`` a positive float, and the spread is computed
    from the matrix directly — no coordinates are needed.

    The successor map is computed once; following it (pointer jumping, on the device) leads every
    point to a root. With ``max_rounds > 1`` the roots are treated as new data, each weighted by
    the number of points it holds, and the procedure repeats (iterated medoid shift) until a
    round merges nothing. Distances are in bandwidth units. Returns a :class:`MeanShiftResult`
    whose ``modes`` are data points, strongest first (for ``metric="precomputed"``: their rows
    of the distance matrix, ``(c, n)``), ``mode_index`` their indices into the data and
    ``n_iter`` the number of rounds used.
    """
    metric = check_choice(metric, "metric", ["euclidean", "precomputed"])
    kern = get_kernel(kernel)
    max_rounds = check_positive_int(max_rounds, "max_rounds")
    if metric == "precomputed":
        data = _check_distances(x, "x")
        hp = check_positive_float(bandwidth, "bandwidth")

        def successors(idx, weight):
            return _medoid_successors_precomputed(data[idx][:, idx], weight, hp, kern)
    else:
        data = check_points(x, "x")
        h = check_bandwidth(bandwidth, data.shape[1], like=data)

        def successors(idx, weight):
            return _medoid_successors(data[idx], weight, h, kern)

    n = data.shape[0]
    idx = torch.arange(n, device=data.device)  # data index of each current candidate
    weight = torch.ones(n, dtype=data.dtype, device=data.device)
    owner = torch.arange(n, device=data.device)  # each point's current candidate
    rounds = 0
    log_mass = None
    for rounds in range(1, max_rounds + 1):
        nxt, log_mass = successors(idx, weight)
        root, _ = _follow(nxt)
        roots, inverse = torch.unique(root, return_inverse=True)
        owner = inverse[owner]
        weight = torch.zeros(
            roots.numel(), dtype=data.dtype, device=data.device
        ).index_add_(0, inverse, weight)
        merged = roots.numel() < idx.numel()
        idx, log_mass = idx[roots], log_mass[roots]
        if not merged:
            break
    order = torch.argsort(log_mass, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=data.device)
    return MeanShiftResult(
        modes=data[idx[order]],
        labels=rank[owner],
        n_iter=rounds,
        intensity=torch.exp(log_mass[order]),
        path=None,
        mode_index=idx[order],
    )
