r"""Mode seeking on a kernel density estimate: mean shift is score ascent.

The self-local mean :math:`m(x) = \sum_i K(x, x_i) x_i / \sum_i K(x, x_i)` moves a point
uphill: for the Gaussian kernel :math:`m(x) - x = h^2 \nabla \log \hat p(x)` exactly, and for a
general profile the shift follows the gradient of the KDE built with the *shadow* kernel
(Cheng 1995; Comaniciu & Meer 2002). :func:`mean_shift` clusters by the modes (scikit-learn's
``MeanShift``), :func:`blurring_mean_shift` moves the data themselves, and :func:`pc_shift`
climbs to ridges (the subspace-constrained mean shift). The densities are those of
:mod:`localbook.density`; MedoidShift is in :mod:`localbook.medoids`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from ._validate import (
    HALF,
    check_bandwidth,
    check_bool,
    check_points,
    check_positive_float,
    check_positive_int,
    check_query,
    compute_dtype,
    promote_floats,
)
from .kernels import (
    Kernel,
    _first_seen,
    _knn,
    _row_keys,
    _unique_rows,
    get_kernel,
)
from .local_sums import _DataSide, local_average

from .density import _gaussian_hessian

__all__ = [
    "MeanShiftResult",
    "mean_shift",
    "blurring_mean_shift",
    "PCShiftResult",
    "pc_shift",
]


# --------------------------------------------------------------------------------------------
# mean shift


@dataclass
class MeanShiftResult:
    """The modes ``(c, d)`` (strongest first), ``labels (n,)`` in ``0..c-1``, the iteration count
    ``n_iter``, each mode's ``intensity (c,)`` (the kernel mass ``Σᵢ K(mode, xᵢ)`` where it was
    last updated: a point count for the uniform kernel), ``path`` (the seeds' positions before the
    first step and after every step) when asked for, else ``None``, ``mode_index (c,)`` — which
    data points the modes are — for :func:`medoid_shift`, else ``None``, and ``rejected (k, d)``:
    for :func:`mean_shift` with ``check_maxima=True``, the merged end points that the perturbation
    test found not to be local maxima (saddles and other stationary points), else ``None``.

    What ``n_iter`` counts depends on the function: :func:`mean_shift` follows scikit-learn's
    ``n_iter_`` (the steps *before* the last one, whose length was found to be at most ``tol``),
    so its ``path`` has ``n_iter + 2`` rows; :func:`blurring_mean_shift` counts every step, so its
    ``path`` has ``n_iter + 1`` rows; :func:`medoid_shift` counts rounds."""

    modes: torch.Tensor
    labels: torch.Tensor
    n_iter: int
    intensity: torch.Tensor
    path: Optional[torch.Tensor] = None
    mode_index: Optional[torch.Tensor] = None
    rejected: Optional[torch.Tensor] = None


def _local_step(x: torch.Tensor, h: torch.Tensor, kern: Kernel):
    """The self-local mean as a function of the seeds: ``q (s, d) -> (mean (s, d), log Σ K (s,))``
    (empty ball: NaN-free ``mean`` rows to ignore, ``log Σ K = -inf``).

    The data side (centre, cell list, scaled data) is prepared once for all the steps. Compact
    kernels (the flat one of scikit-learn's ``MeanShift`` among them) go through the cell list
    in low dimension where it pays: each seed sees only the points in the cells next to its own.
    """
    return _DataSide(x.detach(), x.detach(), h, kern)


def _bin_seeds(x: torch.Tensor, h: torch.Tensor, min_bin_freq: int) -> torch.Tensor:
    """scikit-learn's ``get_bin_seeds``: grid cells of side ``h`` holding ≥ ``min_bin_freq`` points."""
    bins = torch.round(x / h)
    _, first, inverse = _first_seen(_row_keys(bins))
    if not torch.equal(
        bins[first][inverse], bins
    ):  # a hash collision: the exact row-wise unique
        uniq, inverse = torch.unique(bins, dim=0, return_inverse=True)
        order = torch.arange(x.shape[0], device=x.device)
        first = torch.full(
            (uniq.shape[0],), x.shape[0], dtype=order.dtype, device=x.device
        )
        first = first.scatter_reduce(0, inverse, order, reduce="amin")
    counts = torch.bincount(inverse, minlength=first.numel())
    first = first[counts >= min_bin_freq]
    uniq = bins[torch.sort(first).values]  # first-seen order, as a Python dict keeps it
    if uniq.shape[0] == x.shape[0]:
        warnings.warn(
            f"Binning data failed with bin size {h.tolist()}; using the data points as seeds",
            UserWarning,
            stacklevel=3,
        )
        return x
    # scikit-learn stores the bin indices in float32 and scales them there
    return (uniq.to(torch.float32) * h.to(torch.float32)).to(x.dtype)


def _merge_modes(
    points: torch.Tensor, log_mass: torch.Tensor, h: torch.Tensor, radius: float
):
    """Greedy merge: strongest first (ties: larger coordinates first); drop points within ``radius``
    bandwidths of a kept one. Returns the kept indices into ``points``, strongest first."""
    k, d = points.shape
    # exact duplicates count once, keeping the last one's mass (a dict keyed by the centre)
    uniq, inverse = torch.unique(points, dim=0, return_inverse=True)
    last = torch.full((uniq.shape[0],), -1, dtype=torch.long, device=points.device)
    last = last.scatter_reduce(
        0, inverse, torch.arange(k, device=points.device), reduce="amax"
    )
    order = last
    for j in reversed(range(d)):
        order = order[torch.argsort(points[order, j], descending=True, stable=True)]
    order = order[torch.argsort(log_mass[order], descending=True, stable=True)]
    cand = points[order]
    undecided = torch.ones(cand.shape[0], dtype=torch.bool, device=points.device)
    kept = []
    r2 = radius * radius
    while True:
        rest = torch.nonzero(undecided)[:, 0]
        if rest.numel() == 0:
            break
        i = int(rest[0])
        kept.append(i)
        near = (((cand[rest] - cand[i]) / h) ** 2).sum(1) <= r2
        undecided[rest[near]] = False
        undecided[i] = False
    return order[torch.tensor(kept, dtype=torch.long, device=points.device)]


def _nearest(q: torch.Tensor, centers: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centre (scaled distance; ties: the first) for every row of ``q``."""
    return _knn(q, centers, 1, h, centers.mean(0))[1][:, 0]


def _ascend(pos, local_step, h, max_iter: int, tol: float, record: bool):
    """Move the seeds ``pos (s, d)`` (in place) by self-local means, freezing each one once its
    step is at most ``tol`` bandwidths or after ``max_iter + 1`` steps. Returns ``(pos, log Σ K
    (s,), alive (s,), n_iter, path list or None)``; ``alive`` is false where a ball was empty."""
    s = pos.shape[0]
    active = torch.ones(s, dtype=torch.bool, device=pos.device)
    alive = torch.ones(s, dtype=torch.bool, device=pos.device)
    log_mass = torch.full((s,), -math.inf, dtype=pos.dtype, device=pos.device)
    n_iter = 0
    path = [pos.clone()] if record else None
    for t in range(max_iter + 1):
        idx = torch.nonzero(active)[:, 0]
        if idx.numel() == 0:
            break
        n_iter = t
        # seeds at the same position share their whole future path: compute it once
        uniq, inverse = _unique_rows(pos[idx])
        mean, ls = local_step(uniq)
        mean, ls = mean[inverse], ls[inverse]
        empty = torch.isneginf(ls)
        step = torch.linalg.vector_norm((mean - pos[idx]) / h, dim=1)
        done = empty | (step <= tol) | (t == max_iter)
        pos[idx] = torch.where(empty[:, None], pos[idx], mean)
        log_mass[idx] = ls
        alive[idx[empty]] = False
        active[idx[done]] = False
        if path is not None:
            path.append(pos.clone())
    return pos, log_mass, alive, n_iter, path


def _reject_non_maxima(
    modes, mass, local_step, h, max_iter, tol, merge_radius, perturbation, random_state
):
    """The perturbation test of :func:`mean_shift`: returns the surviving ``modes``, their
    ``mass`` (strongest first) and the rejected end points ``(k, d)``."""
    c, d = modes.shape
    gen = torch.Generator(device="cpu").manual_seed(random_state)
    verified = torch.zeros(c, dtype=torch.bool, device=modes.device)
    rejected = [modes[:0]]
    for _ in range(_MAX_CHECK_ROUNDS):
        todo = torch.nonzero(~verified)[:, 0]
        if todo.numel() == 0:
            break
        cand = modes[todo]
        k = cand.shape[0]
        u = torch.randn(cand.shape, generator=gen, dtype=torch.float64)
        u = (u / torch.linalg.vector_norm(u, dim=1, keepdim=True)).to(cand)
        probes = torch.cat([cand + perturbation * h * u, cand - perturbation * h * u])
        end, end_mass, alive, _, _ = _ascend(
            probes, local_step, h, max_iter, tol * _PROBE_TOL, False
        )
        moved = torch.linalg.vector_norm((end - cand.repeat(2, 1)) / h, dim=1)
        left = (alive & (moved > merge_radius)).reshape(2, k)
        away = left.all(0)  # neither probe came back: not a local maximum
        verified[todo[~away]] = True
        if not bool(away.any()):
            break
        bad = todo[away]
        rejected.append(modes[bad])
        both = away.repeat(2)  # the probes of the rejected: where the flow leads
        new, new_mass = end[both], end_mass[both]
        keep = torch.ones(modes.shape[0], dtype=torch.bool, device=modes.device)
        keep[bad] = False
        modes, mass, verified = modes[keep], mass[keep], verified[keep]
        # a new end point within merge_radius of a surviving mode is that mode
        if modes.shape[0] > 0:
            d2 = (((new[:, None, :] - modes[None, :, :]) / h) ** 2).sum(2)
            fresh = d2.min(1).values > merge_radius**2
            new, new_mass = new[fresh], new_mass[fresh]
        if new.shape[0] > 0:
            k = _merge_modes(new, new_mass, h, merge_radius)
            modes = torch.cat([modes, new[k]])
            mass = torch.cat([mass, new_mass[k]])
            verified = torch.cat(
                [
                    verified,
                    torch.zeros(k.numel(), dtype=torch.bool, device=modes.device),
                ]
            )
        order = torch.argsort(mass, descending=True, stable=True)
        modes, mass, verified = modes[order], mass[order], verified[order]
    return modes, mass, torch.cat(rejected)


#: rounds of the perturbation test (each rejection climbs to a higher density, so few are used)
_MAX_CHECK_ROUNDS = 10
#: a probe stops when its step is at most ``tol * _PROBE_TOL`` bandwidths: from a saddle it
#: stalls only if its ascent component is below ~``10 tol _PROBE_TOL / (h² λ₊)`` bandwidths
_PROBE_TOL = 1e-3


def mean_shift(
    x,
    bandwidth,
    kernel: str = "gaussian",
    seeds=None,
    max_iter: int = 300,
    tol: float = 1e-3,
    return_path: bool = False,
    *,
    bin_seeding: bool = False,
    min_bin_freq: int = 1,
    merge_radius: float = 1.0,
    check_maxima: bool = True,
    perturbation: float = 0.1,
    random_state: int = 0,
) -> MeanShiftResult:
    r"""Mean shift clustering: move every seed to its self-local mean until it stops, merge, label.

    Each seed iterates :math:`s \leftarrow m(s) = \sum_i K(s, x_i) x_i / \sum_i K(s, x_i)` — for the
    Gaussian kernel a gradient step :math:`s + h^2 \nabla\log\hat p(s)`. ``kernel`` names the
    weight profile :math:`g` of this average; the density climbed is the KDE of its shadow
    :math:`k` (:math:`g = -k'(u)/u`): ``"uniform"`` climbs :func:`kde` with ``"epanechnikov"``,
    the Gaussian its own KDE. All seeds move together;
    a seed whose step is at most ``tol`` bandwidths is frozen (never recomputed), and so is every
    seed after ``max_iter + 1`` steps: as in scikit-learn, ``max_iter`` bounds the steps *before*
    the last one (``max_iter=0`` takes exactly one step), and ``n_iter`` counts them the same way
    (the ``path`` has ``n_iter + 2`` rows). A seed whose ball holds no point (compact kernel) is
    dropped.
    Endpoints are merged greedily, strongest (largest kernel mass) first, dropping those within
    ``merge_radius`` bandwidths of a kept one; every point is labelled by its nearest mode.

    The fixed points :math:`m(s) = s` are the *stationary* points of the shadow KDE
    (:math:`\nabla\hat p_k = 0`): saddles too, which a seed on their stable manifold (e.g. on an
    axis of symmetry) reaches. With ``check_maxima`` (default) every merged end point :math:`e`
    is tested with two probes :math:`e \pm \varepsilon\, h \odot u`, :math:`u` uniform on the
    unit sphere (from a generator seeded with ``random_state``), :math:`\varepsilon` =
    ``perturbation``, each iterated again (at most ``max_iter + 1`` steps, stopping at a step
    of at most ``tol / 1000`` bandwidths, so that a probe from a saddle does not stall). If
    *both* end more than ``merge_radius`` bandwidths from :math:`e`, it is not a local maximum
    (from a saddle both leave: a generic :math:`u` has a component along an ascent direction,
    which the iteration amplifies; from a maximum whose basin holds either probe, that one
    returns): :math:`e` is rejected, the points its probes flowed to replace it (each merged
    into a mode within ``merge_radius``, else tested in turn), and points are labelled by the
    surviving modes. This works for every kernel (a Hessian test, :func:`kde_log_hessian`,
    needs the Gaussian). A saddle passes when its probes cannot escape in ``max_iter + 1``
    steps (flat ascent directions) or when :math:`u` is almost orthogonal to all of them.

    With ``kernel="uniform"`` this is scikit-learn's ``MeanShift`` (flat kernel of radius
    ``bandwidth``, same seeding with ``bin_seeding``/``min_bin_freq``, same stopping rule, same
    merge and labels), except that scikit-learn keeps non-maxima: ``check_maxima=False`` to
    reproduce it there too. Shapes: ``x (n, d)``, ``seeds (s, d)`` (default: the data, or the
    grid bins with ``bin_seeding``). Returns a :class:`MeanShiftResult` whose ``rejected (k, d)``
    holds the end points found not to be maxima (``None`` without ``check_maxima``).
    Half-precision data are processed in float32; the modes, intensities, path and rejected
    points come back in the data's dtype.
    """
    x, seeds = promote_floats(x, seeds)
    x = check_points(x, "x")
    # half precision cannot hold the steps' sums: work in float32, return x's dtype
    out_dtype = x.dtype
    if out_dtype in HALF:
        if seeds is not None:
            seeds = check_query(seeds, x, "seeds").float()
        x = x.float()
        if isinstance(bandwidth, torch.Tensor):
            bandwidth = bandwidth.float()
    n, d = x.shape
    h = check_bandwidth(bandwidth, d, like=x)
    kern = get_kernel(kernel)
    max_iter = check_positive_int(max_iter, "max_iter", minimum=0)
    tol = check_positive_float(tol, "tol", allow_zero=True)
    return_path = check_bool(return_path, "return_path")
    bin_seeding = check_bool(bin_seeding, "bin_seeding")
    min_bin_freq = check_positive_int(min_bin_freq, "min_bin_freq")
    merge_radius = check_positive_float(merge_radius, "merge_radius")
    check_maxima = check_bool(check_maxima, "check_maxima")
    perturbation = check_positive_float(perturbation, "perturbation")
    random_state = check_positive_int(random_state, "random_state", minimum=0)
    if seeds is not None:
        pos = check_query(seeds, x, "seeds").clone()
    elif bin_seeding:
        pos = _bin_seeds(x, h, min_bin_freq).clone()
    else:
        pos = x.clone()
    local_step = _local_step(x, h, kern)
    pos, log_mass, alive, n_iter, path = _ascend(
        pos, local_step, h, max_iter, tol, return_path
    )
    if not bool(alive.any()):
        raise ValueError(
            f"no data point lies within bandwidth={h.tolist()} of any seed; use other seeds or a "
            "larger bandwidth"
        )
    ends, mass = pos[alive], log_mass[alive]
    kept = _merge_modes(ends, mass, h, merge_radius)
    modes, mass = ends[kept], mass[kept]
    rejected = None
    if check_maxima:
        modes, mass, rejected = _reject_non_maxima(
            modes,
            mass,
            local_step,
            h,
            max_iter,
            tol,
            merge_radius,
            perturbation,
            random_state,
        )
    labels = _nearest(x, modes, h)

    def back(t):  # the float32 results of half-precision data, in the data's dtype
        return None if t is None else t.to(out_dtype)

    return MeanShiftResult(
        modes=back(modes),
        labels=labels,
        n_iter=n_iter,
        intensity=back(torch.exp(mass)),
        path=back(torch.stack(path) if path is not None else None),
        rejected=back(rejected),
    )


def blurring_mean_shift(
    x,
    bandwidth,
    kernel: str = "gaussian",
    max_iter: int = 100,
    tol: float = 1e-3,
    return_path: bool = False,
    *,
    merge_radius: float = 1.0,
) -> MeanShiftResult:
    r"""Blurring mean shift (Cheng 1995): the data themselves move, :math:`X \leftarrow m_X(X)`.

    Every iteration replaces all points by their self-local means over the *current* points, so the
    density being climbed changes as it is climbed: clusters contract to points (fast), then the
    points drift towards each other; with the Gaussian kernel and enough iterations everything
    collapses to one point, while with a compact kernel groups whose *convex hulls* are more than
    a bandwidth apart never interact (each point moves to a mean of its own group, so the hulls
    only shrink; points that are merely more than a bandwidth from the other group can merge). Stops when no point moves more than ``tol`` bandwidths (or after ``max_iter``
    steps; ``n_iter`` counts the steps taken); the final points are merged as in
    :func:`mean_shift` and each point is labelled by the mode nearest to where it ended.
    Shapes: ``x (n, d)``; ``path`` is ``(n_iter + 1, n, d)``.
    """
    x = check_points(x, "x")
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    kern = get_kernel(kernel)
    max_iter = check_positive_int(max_iter, "max_iter", minimum=0)
    tol = check_positive_float(tol, "tol", allow_zero=True)
    return_path = check_bool(return_path, "return_path")
    merge_radius = check_positive_float(merge_radius, "merge_radius")
    y = x.clone()
    path = [y.clone()] if return_path else None
    n_iter = 0
    for t in range(max_iter):
        mean, _ = _local_step(y, h, kern)(
            y
        )  # every point is in its own ball: no empties
        step = float(torch.linalg.vector_norm((mean - y) / h, dim=1).max())
        y = mean
        n_iter = t + 1
        if path is not None:
            path.append(y.clone())
        if step <= tol:
            break
    _, log_mass = local_average(y, y, None, h, kern, warn_empty=False)
    kept = _merge_modes(y, log_mass, h, merge_radius)
    modes = y[kept]
    return MeanShiftResult(
        modes=modes,
        labels=_nearest(y, modes, h),
        n_iter=n_iter,
        intensity=torch.exp(log_mass[kept]),
        path=torch.stack(path) if path is not None else None,
    )


# --------------------------------------------------------------------------------------------
# principal-component (subspace-constrained) shift


@dataclass
class PCShiftResult:
    """Points moved onto the density ridge ``(s, d)``, the iterations used ``n_iter``, which seeds
    converged ``(s,)``, and the seeds' ``path (n_iter + 1, s, d)`` when asked for."""

    points: torch.Tensor
    n_iter: int
    converged: torch.Tensor
    path: Optional[torch.Tensor] = None


def pc_shift(
    x,
    bandwidth,
    ridge_dim: int = 1,
    seeds=None,
    max_iter: int = 300,
    tol: float = 1e-3,
    return_path: bool = False,
) -> PCShiftResult:
    r"""Principal-component (subspace-constrained) mean shift onto ``ridge_dim``-dimensional ridges.

    At each point the Gaussian KDE's log-Hessian :math:`\nabla^2\log\hat p` (see
    :func:`kde_log_hessian`) is diagonalized; its ``d - ridge_dim`` most negative eigenvectors
    :math:`V` span the directions *across* the ridge, and the point takes the mean-shift step
    projected onto them, :math:`s \leftarrow s + V V^\top (m(s) - s)` (Ozertem & Erdogmus 2011).
    Fixed points satisfy :math:`V^\top \nabla \log \hat p = 0`: the density is maximal across the
    ridge. A seed stops (frozen) when its projected step is at most ``tol`` bandwidths.
    Shapes: ``x (n, d)``, ``seeds (s, d)`` (default: the data). Returns a :class:`PCShiftResult`.
    Half precision is computed in float32 and returned in its dtype.
    """
    x, seeds = promote_floats(x, seeds)
    x = check_points(x, "x")
    out_dtype, x = x.dtype, x.to(compute_dtype(x.dtype))  # no eigh in half precision
    n, d = x.shape
    h = check_bandwidth(bandwidth, d, like=x)
    if (
        isinstance(ridge_dim, int)
        and not isinstance(ridge_dim, bool)
        and ridge_dim >= d
    ):
        raise ValueError(
            f"ridge_dim must be below the dimension of x (d = {d}), got {ridge_dim}"
        )
    ridge_dim = check_positive_int(ridge_dim, "ridge_dim", minimum=0, maximum=d - 1)
    max_iter = check_positive_int(max_iter, "max_iter", minimum=0)
    tol = check_positive_float(tol, "tol", allow_zero=True)
    return_path = check_bool(return_path, "return_path")
    pos = (check_query(seeds, x, "seeds") if seeds is not None else x).clone()
    active = torch.ones(pos.shape[0], dtype=torch.bool, device=x.device)
    path = [pos.clone()] if return_path else None
    n_iter = 0
    for t in range(max_iter):
        idx = torch.nonzero(active)[:, 0]
        if idx.numel() == 0:
            break
        n_iter = t + 1
        q = pos[idx]
        mean, hess = _gaussian_hessian(q, x, h)
        _, vecs = torch.linalg.eigh(hess)
        v = vecs[:, :, : d - ridge_dim]
        step = (v @ (v.transpose(1, 2) @ (mean - q)[:, :, None]))[:, :, 0]
        pos[idx] = q + step
        active[idx[torch.linalg.vector_norm(step / h, dim=1) <= tol]] = False
        if path is not None:
            path.append(pos.clone())
    return PCShiftResult(
        points=pos.to(out_dtype),
        n_iter=n_iter,
        converged=~active,
        path=torch.stack(path).to(out_dtype) if path is not None else None,
    )
