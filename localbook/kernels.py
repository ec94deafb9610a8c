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
from typing import Callable, Optional, Tuple

import torch

from . import compiled
from ._validate import (
    as_tensor,
    check_bandwidth,
    check_choice,
    check_points,
    check_positive_int,
    check_query,
    compute_dtype,
    promote_floats,
    warn_empty,
)
from .chunks import chunk_rows, iter_chunks

__all__ = [
    "Kernel",
    "KERNELS",
    "get_kernel",
    "kernel_profile",
    "kernel_matrix",
    "scaled_sq_dist",
    "knn_search",
]


@dataclass(frozen=True)
class Kernel:
    """A localization kernel as a function of the squared scaled distance ``u2``."""

    name: str
    log_profile: Callable[
        [torch.Tensor], torch.Tensor
    ]  #: ``log k`` at ``u2`` (``-inf`` outside support)
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
    "epanechnikov": Kernel(
        "epanechnikov", lambda u2: _outside(u2, _log1m(u2)), compact=True
    ),
    "biweight": Kernel(
        "biweight", lambda u2: _outside(u2, 2 * _log1m(u2)), compact=True
    ),
    "tricube": Kernel(
        "tricube",
        lambda u2: _outside(u2, 3 * _log1m(u2.clamp(min=0) ** 1.5)),
        compact=True,
    ),
    "uniform": Kernel(
        "uniform", lambda u2: _outside(u2, torch.zeros_like(u2)), compact=True
    ),
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
    # wide data keeps aminmax: a C walk down its columns would miss the cache
    if (
        x.device.type == "cpu"
        and x.dtype in (torch.float64, torch.float32)
        and x.ndim == 2
        and x.shape[0]
        and x.shape[1] <= compiled.MAX_DIM
        and not x.requires_grad
        and compiled.library() is not None
    ):
        # the same numbers in one C pass, without two reductions' overhead
        return compiled.midrange(x)
    lo, hi = torch.aminmax(x, dim=0)  # one pass: half the time of amax and amin
    return torch.add(hi * 0.5, lo, alpha=0.5)


def _augment_data(
    x: torch.Tensor, h: torch.Tensor, center: torch.Tensor
) -> torch.Tensor:
    """``[−2b, 1, |b|²]`` with ``b = (x − center)/h``: the data side of the fused distance product."""
    b = (x - center) / h
    bb = torch.cat(
        [-2.0 * b, torch.ones_like(b[:, :1]), (b * b).sum(1, keepdim=True)], 1
    )
    if not bool(torch.isfinite(bb[:, -1]).all()):
        _overflow("x")
    return bb


def _augment_query(
    xq: torch.Tensor, h: torch.Tensor, center: torch.Tensor
) -> torch.Tensor:
    """``[a, |a|², 1]`` with ``a = (xq − center)/h``: the query side of the fused distance product."""
    a = (xq - center) / h
    aa = torch.cat([a, (a * a).sum(1, keepdim=True), torch.ones_like(a[:, :1])], 1)
    if not bool(torch.isfinite(aa[:, -2]).all()):
        _overflow("x_query")
    return aa


def _sq_dist_augmented(
    xq: torch.Tensor, bb: torch.Tensor, h: torch.Tensor, center: torch.Tensor
) -> torch.Tensor:
    # |a|² + |b|² − 2a·b as one matrix product: [a, |a|², 1] · [−2b, 1, |b|²]ᵀ
    return (_augment_query(xq, h, center) @ bb.T).clamp_(min=0.0)


def _scaled_sq_dist(
    xq: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    center: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """:func:`scaled_sq_dist` on validated tensors of one dtype (the engine's inner call)."""
    if center is None:
        center = data_center(x)
    return _sq_dist_augmented(xq, _augment_data(x, h, center), h, center)


def scaled_sq_dist(xq, x, h, center=None) -> torch.Tensor:
    """``u2[a, i] = |(xq[a] - x[i]) / h|²`` via one matrix product, ``(m, n)``.

    Centering both sets on ``center`` before the expansion keeps the cancellation error of
    ``|a|² + |b|² − 2a·b`` at the scale of the spread of the data, not of its offset.
    Shapes: ``xq (m, d)``, ``x (n, d)`` (1-D means ``d = 1``), ``h`` a positive float or
    ``(d,)``, ``center (d,)`` (default: the data's midrange). Half precision is computed in
    float32 and returned in its dtype.
    """
    xq, x, h, center = promote_floats(xq, x, h, center)
    x = check_points(x, "x")
    xq = check_query(xq, x, "xq")
    h = check_bandwidth(h, x.shape[1], like=x, name="h")
    if center is not None:
        center = as_tensor(center, "center", like=x, ndim=(1,))
        if center.shape[0] != x.shape[1]:
            raise ValueError(
                f"center must have one value per dimension ({x.shape[1]}), got shape "
                f"{tuple(center.shape)}"
            )
    c = compute_dtype(x.dtype)
    return _scaled_sq_dist(
        xq.to(c), x.to(c), h.to(c), None if center is None else center.to(c)
    ).to(x.dtype)


def kernel_matrix(x_query, x, bandwidth, kernel: str = "gaussian") -> torch.Tensor:
    """The dense ``(m, n)`` matrix ``K(x_query[a], x[i])`` (unnormalized; for small problems)."""
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    return get_kernel(kernel)(scaled_sq_dist(xq, x, h))


def log_weights(
    xq: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    kern: Kernel,
    center: torch.Tensor,
) -> torch.Tensor:
    """``log K(xq[a], x[i])`` for one chunk of queries, ``(rows, n)``."""
    return kern.log_profile(_scaled_sq_dist(xq, x, h, center))


def _exp_floor(dtype: torch.dtype) -> float:
    """Arguments below this give subnormal ``exp`` values, which ``exp`` computes 10–70× slower."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


# --- distinct rows through a 1-D sort (mean shift's seeds and bins) ---------------------------
def _mix(b: torch.Tensor) -> torch.Tensor:
    """A 64-bit integer mixer (xor-shift, multiply; wraps around)."""
    b = b ^ (b >> 31)
    b = b * -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
    return b ^ (b >> 29)


def _row_keys(t: torch.Tensor) -> torch.Tensor:
    """One int64 hash per row of ``t`` from the bits of its entries (equal rows, equal keys)."""
    bits = (
        (t + 0.0)
        .contiguous()
        .view(torch.int64 if t.element_size() == 8 else torch.int32)
        .long()
    )
    key = _mix(bits[:, 0])  # + 0.0 above: −0 and 0 get one key
    for j in range(1, t.shape[1]):
        key = _mix(key * 1_000_003 + _mix(bits[:, j]))
    return key


def _unique_rows(t: torch.Tensor):
    """``torch.unique(t, dim=0, return_inverse=True)`` up to the order of the rows, through a
    1-D sort of a per-row key (the row-wise unique sorts rows lexicographically: 10× slower);
    falls back to it when two different rows share a key."""
    _, first_of, inverse = _first_seen(_row_keys(t))
    uniq = t[first_of]
    if not torch.equal(uniq[inverse], t):
        return torch.unique(t, dim=0, return_inverse=True)
    return uniq, inverse


def _first_seen(key: torch.Tensor):
    """Distinct keys ``(u,)``, the first row holding each, and each row's group ``(n,)``."""
    uniq, inverse = torch.unique(key, return_inverse=True)
    order = torch.arange(key.numel(), device=key.device)
    first = torch.full(
        (uniq.numel(),), key.numel(), dtype=order.dtype, device=key.device
    )
    return uniq, first.scatter_reduce(0, inverse, order, reduce="amin"), inverse


def warn_empty_kernel(
    n_empty: int, m: int, kernel_name: str, *, stacklevel: int = 2
) -> None:
    """The empty-neighbourhood warning of a compact kernel (through ``_validate.warn_empty``)."""
    warn_empty(
        n_empty,
        m,
        f"have no data point within the bandwidth of the compact {kernel_name!r} kernel",
        hint="use a larger bandwidth or a kernel with unbounded support",
        stacklevel=stacklevel + 1,
    )


def _knn(
    xq: torch.Tensor,
    x: torch.Tensor,
    n_neighbors: int,
    h: Optional[torch.Tensor] = None,
    center: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(u2, idx)``: squared scaled distances ``(m, k)`` (ascending) and indices of the ``k``
    nearest rows of ``x`` for each row of ``xq``, on validated tensors, in row chunks under the
    device's budget. ``h`` defaults to 1 (Euclidean); for ``k = 1`` ties go to the first point."""
    m, n = xq.shape[0], x.shape[0]
    out_dtype, c = (
        x.dtype,
        compute_dtype(x.dtype),
    )  # half precision: distances in float32
    xq, x = xq.to(c), x.to(c)
    h = torch.ones(x.shape[1], dtype=c, device=x.device) if h is None else h.to(c)
    center = data_center(x) if center is None else center.to(c)
    rows = chunk_rows(m, n, 1, x.element_size(), None, x.device)
    u2 = torch.empty(m, n_neighbors, dtype=out_dtype, device=x.device)
    idx = torch.empty(m, n_neighbors, dtype=torch.long, device=x.device)
    for sl in iter_chunks(m, rows):
        d2 = _scaled_sq_dist(xq[sl], x, h, center)
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
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=x.shape[0])
    u2, idx = _knn(xq, x, k)
    return torch.sqrt(u2), idx
