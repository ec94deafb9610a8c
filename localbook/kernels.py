r"""Localization kernels and the chunked pairwise engine every local mean uses.

A localization kernel is a profile :math:`k(u)` of the scaled distance
:math:`u = \big(\sum_j (x_j - x'_j)^2 / h_j^2\big)^{1/2}`, with ``h`` the bandwidth (the book's
one notation). Internally the engine computes :math:`u^2` by a matrix product and each kernel's
``log_profile`` takes :math:`u^2`, which avoids a square root for all but the Laplacian:

============  ==========================  ===========
name          profile :math:`k(u)`        support
============  ==========================  ===========
gaussian      :math:`e^{-u^2/2}`          everywhere
laplacian     :math:`e^{-u}`              everywhere
epanechnikov  :math:`(1-u^2)_+`           :math:`u\le 1`
biweight      :math:`(1-u^2)_+^2`         :math:`u\le 1`
tricube       :math:`(1-u^3)_+^3`         :math:`u\le 1`
uniform       :math:`1[u\le 1]`           :math:`u\le 1`
============  ==========================  ===========

Kernels are evaluated in log form (``-inf`` outside the support), which is exact for every
profile above, so weights are normalized with ``logsumexp``: a query far from all the data gets
its nearest neighbours' values instead of ``0/0``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

import torch

from ._validate import check_bandwidth, check_choice, check_points, check_positive_int, check_query, warn_empty

__all__ = ["Kernel", "KERNELS", "get_kernel", "kernel_profile", "kernel_matrix", "scaled_sq_dist", "knn_search"]

#: Default memory budget (bytes) for one chunk of pairwise work on a GPU.
MEMORY_BUDGET = 256 * 2**20
#: On the CPU smaller chunks stay in cache: 16 MiB ran 4× faster than 256 MiB (n = 20,000).
CPU_MEMORY_BUDGET = 16 * 2**20


def default_budget(device) -> int:
    """Bytes of temporaries per chunk: cache-sized on the CPU, larger on accelerators."""
    return CPU_MEMORY_BUDGET if torch.device(device).type == "cpu" else MEMORY_BUDGET


@dataclass(frozen=True)
class Kernel:
    """A localization kernel as a function of the squared scaled distance ``u2``."""

    name: str
    log_profile: Callable[[torch.Tensor], torch.Tensor]  #: ``log k`` at ``u2`` (``-inf`` outside support)
    compact: bool  #: True when the support is ``u ≤ 1``

    def __call__(self, u2: torch.Tensor) -> torch.Tensor:
        """The kernel value ``k(u)`` at squared scaled distance ``u2``."""
        return torch.exp(self.log_profile(u2))


def _outside(u2: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    # -inf outside the unit ball keeps compact supports exact in log space
    return torch.where(u2 <= 1, value, torch.full_like(value, -math.inf))


def _log1m(x: torch.Tensor) -> torch.Tensor:
    return torch.log1p(-torch.clamp(x, max=1.0))


KERNELS = {
    "gaussian": Kernel("gaussian", lambda u2: -0.5 * u2, compact=False),
    "laplacian": Kernel("laplacian", lambda u2: -torch.sqrt(u2), compact=False),
    "epanechnikov": Kernel("epanechnikov", lambda u2: _outside(u2, _log1m(u2)), compact=True),
    "biweight": Kernel("biweight", lambda u2: _outside(u2, 2 * _log1m(u2)), compact=True),
    "tricube": Kernel("tricube", lambda u2: _outside(u2, 3 * _log1m(u2.clamp(min=0) ** 1.5)), compact=True),
    "uniform": Kernel("uniform", lambda u2: _outside(u2, torch.zeros_like(u2)), compact=True),
}


def get_kernel(kernel) -> Kernel:
    """Look a kernel up by name (or pass a :class:`Kernel` through)."""
    if isinstance(kernel, Kernel):
        return kernel
    return KERNELS[check_choice(kernel, "kernel", list(KERNELS))]


def kernel_profile(u, kernel: str = "gaussian") -> torch.Tensor:
    """The profile ``k(u)`` at scaled distances ``u ≥ 0`` (for plots and checks)."""
    from ._validate import as_tensor

    u = as_tensor(u, "u", ndim=(0, 1, 2), allow_empty=True)
    if bool((u < 0).any()):
        raise ValueError("u must be non-negative scaled distances")
    return get_kernel(kernel)(u * u)


def _overflow(name: str):
    raise ValueError(
        f"{name} / bandwidth is too large: squared scaled distances overflow the dtype "
        "(rescale the data or use a larger bandwidth)"
    )


def data_center(x: torch.Tensor) -> torch.Tensor:
    """Midrange of the data per dimension (cannot overflow, unlike a sum)."""
    return 0.5 * x.amax(0) + 0.5 * x.amin(0)


def _augment_data(x: torch.Tensor, h: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    """``[−2b, 1, |b|²]`` with ``b = (x − center)/h``: the data side of the fused distance product."""
    b = (x - center) / h
    bb = torch.cat([-2.0 * b, torch.ones_like(b[:, :1]), (b * b).sum(1, keepdim=True)], 1)
    if not bool(torch.isfinite(bb[:, -1]).all()):
        _overflow("x")
    return bb


def _augment_query(xq: torch.Tensor, h: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    """``[a, |a|², 1]`` with ``a = (xq − center)/h``: the query side of the fused distance product."""
    a = (xq - center) / h
    aa = torch.cat([a, (a * a).sum(1, keepdim=True), torch.ones_like(a[:, :1])], 1)
    if not bool(torch.isfinite(aa[:, -2]).all()):
        _overflow("x_query")
    return aa


def _sq_dist_augmented(xq: torch.Tensor, bb: torch.Tensor, h: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    # |a|² + |b|² − 2a·b as one matrix product: [a, |a|², 1] · [−2b, 1, |b|²]ᵀ
    return (_augment_query(xq, h, center) @ bb.T).clamp_(min=0.0)


def scaled_sq_dist(xq: torch.Tensor, x: torch.Tensor, h: torch.Tensor, center: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``u2[a, i] = |(xq[a] - x[i]) / h|²`` via one matrix product, ``(m, n)``.

    Centering both sets on ``center`` before the expansion keeps the cancellation error of
    ``|a|² + |b|² − 2a·b`` at the scale of the spread of the data, not of its offset.
    """
    if center is None:
        center = data_center(x)
    return _sq_dist_augmented(xq, _augment_data(x, h, center), h, center)


def kernel_matrix(x_query, x, bandwidth, kernel: str = "gaussian") -> torch.Tensor:
    """The dense ``(m, n)`` matrix ``K(x_query[a], x[i])`` (unnormalized; for small problems)."""
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    return get_kernel(kernel)(scaled_sq_dist(xq, x, h))


def chunk_rows(m: int, n: int, width: int = 1, itemsize: int = 8, budget: Optional[int] = None, device="cpu") -> int:
    """Rows per chunk so that about four ``(rows, n, width)`` temporaries fit in ``budget``.

    The one place the memory budget is chosen: ``budget=None`` picks it by ``device``
    (:func:`default_budget`: 16 MiB on the CPU, 256 MiB on an accelerator). Every chunked loop of
    the package calls this with its tensors' device.
    """
    budget = default_budget(device) if budget is None else budget
    per_row = max(1, 4 * n * width * itemsize)
    return max(1, min(m, budget // per_row))


def iter_chunks(m: int, rows: int) -> Iterator[slice]:
    for start in range(0, m, rows):
        yield slice(start, min(start + rows, m))


def log_weights(xq: torch.Tensor, x: torch.Tensor, h: torch.Tensor, kern: Kernel, center: torch.Tensor) -> torch.Tensor:
    """``log K(xq[a], x[i])`` for one chunk of queries, ``(rows, n)``."""
    return kern.log_profile(scaled_sq_dist(xq, x, h, center))


def local_average(
    xq: torch.Tensor,
    x: torch.Tensor,
    values: Optional[torch.Tensor],
    h: torch.Tensor,
    kernel,
    *,
    budget: Optional[int] = None,
    warn_empty: bool = True,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """The chunked local mean ``Σᵢ K(q, xᵢ) vᵢ / Σᵢ K(q, xᵢ)`` and ``log Σᵢ K(q, xᵢ)``.

    Inputs are validated tensors (``xq (m, d)``, ``x (n, d)``, ``values (n, k)`` or ``None``,
    ``h (d,)``). Returns ``(mean (m, k) or None, log_sum (m,))``. Queries with an empty
    neighbourhood (compact kernel, no point within the bandwidth) get NaN means and
    ``log_sum = -inf``, with one ``UserWarning`` giving their number.
    """
    kern = get_kernel(kernel)
    m, n = xq.shape[0], x.shape[0]
    k = 0 if values is None else values.shape[1]
    center = data_center(x)
    rows = chunk_rows(m, n, 1, x.element_size(), budget, x.device)
    floor = math.log(torch.finfo(x.dtype).tiny) + 1.0
    log_sum = torch.empty(m, dtype=x.dtype, device=x.device)
    mean = None if values is None else torch.empty(m, k, dtype=x.dtype, device=x.device)
    tensors = (xq, x, h) if values is None else (xq, x, h, values)
    # in-place exp saves a pass over memory, but autograd needs the out-of-place graph
    differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    bb = _augment_data(x, h, center)  # once, not per chunk: (n, d + 2)
    if not differentiable:
        # one reused (rows, n) buffer: a fresh large tensor per chunk costs page faults; for the
        # Gaussian the factor −1/2 is folded into the product, which then yields log K directly
        gauss = kern.name == "gaussian"
        bbT = ((-0.5 if gauss else 1.0) * bb).T.contiguous()
        buf = torch.empty(min(rows, m), n, dtype=x.dtype, device=x.device)
    for sl in iter_chunks(m, rows):
        if differentiable:
            lw = kern.log_profile(_sq_dist_augmented(xq[sl], bb, h, center))
        else:
            lw = buf[: sl.stop - sl.start]
            torch.mm(_augment_query(xq[sl], h, center), bbT, out=lw)
            if gauss:
                lw.clamp_(max=0.0)
            elif kern.name == "laplacian":
                lw.clamp_(min=0.0).sqrt_().neg_()
            else:
                lw = kern.log_profile(lw.clamp_(min=0.0))
        top = lw.amax(dim=1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        if differentiable:
            lw = lw - top
            e = torch.exp(lw if kern.compact else lw.clamp(min=floor))
        else:
            lw.sub_(top)
            if not kern.compact:
                # relative weights below the smallest normal float are < 1e-37 of the largest and
                # do not change any sum; flooring them avoids exp's slow denormal path (10×)
                lw.clamp_(min=floor)
            # weights relative to the row's largest: exp in place, one pass (no separate logsumexp)
            e = lw.exp_()
        s = e.sum(dim=1)
        log_sum[sl] = top[:, 0] + torch.log(s)  # an empty row has s = 0, log_sum = -inf
        if values is not None:
            mean[sl] = (e @ values) / s[:, None]
    empty = torch.isneginf(log_sum)
    n_empty = int(empty.sum())
    if n_empty:
        if mean is not None:
            mean[empty] = math.nan
        if warn_empty:
            warn_empty_kernel(n_empty, m, kern.name, stacklevel=3)
    return mean, log_sum


def warn_empty_kernel(n_empty: int, m: int, kernel_name: str, *, stacklevel: int = 2) -> None:
    """The empty-neighbourhood warning of a compact kernel (through ``_validate.warn_empty``)."""
    warn_empty(n_empty, m, f"have no data point within the bandwidth of the compact {kernel_name!r} kernel",
               hint="use a larger bandwidth or a kernel with unbounded support", stacklevel=stacklevel + 1)


def _knn(xq: torch.Tensor, x: torch.Tensor, n_neighbors: int, h: Optional[torch.Tensor] = None,
         center: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(u2, idx)``: squared scaled distances ``(m, k)`` (ascending) and indices of the ``k``
    nearest rows of ``x`` for each row of ``xq``, on validated tensors, in row chunks under the
    device's budget. ``h`` defaults to 1 (Euclidean); for ``k = 1`` ties go to the first point."""
    m, n = xq.shape[0], x.shape[0]
    if h is None:
        h = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    if center is None:
        center = data_center(x)
    rows = chunk_rows(m, n, 1, x.element_size(), None, x.device)
    u2 = torch.empty(m, n_neighbors, dtype=x.dtype, device=x.device)
    idx = torch.empty(m, n_neighbors, dtype=torch.long, device=x.device)
    for sl in iter_chunks(m, rows):
        d2 = scaled_sq_dist(xq[sl], x, h, center)
        if n_neighbors == 1:
            i = d2.argmin(1, keepdim=True)
            idx[sl], u2[sl] = i, d2.gather(1, i)
        else:
            u2[sl], idx[sl] = torch.topk(d2, n_neighbors, dim=1, largest=False)
    return u2, idx


def knn_search(x_query, x, n_neighbors: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``k = n_neighbors`` nearest points of ``x`` to each query (Euclidean distance).

    Returns ``(distances (m, k), indices (m, k))``, each row sorted by distance (ties: an
    unspecified order among the tied points, the first point for ``k = 1``). Chunked under the
    device's memory budget (``chunk_rows``), on ``x``'s device. Shapes: ``x_query (m, d)``,
    ``x (n, d)`` (1-D means ``d = 1``), ``1 ≤ n_neighbors ≤ n``. Used by :func:`knn_regress`,
    :func:`knn_classify`, :func:`knn_bandwidth` and the mean-shift labels.
    """
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=x.shape[0])
    u2, idx = _knn(xq, x, k)
    return torch.sqrt(u2), idx
