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

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

import torch

from . import compiled
from ._validate import (
    check_bandwidth,
    check_choice,
    check_points,
    check_positive_int,
    check_query,
    warn_empty,
)

__all__ = [
    "Kernel",
    "KERNELS",
    "get_kernel",
    "kernel_profile",
    "kernel_matrix",
    "scaled_sq_dist",
    "knn_search",
]

#: Default memory budget (bytes) for one chunk of pairwise work on a GPU.
MEMORY_BUDGET = 256 * 2**20
#: On the CPU smaller chunks stay in cache: 16 MiB ran 4× faster than 256 MiB (n = 20,000).
CPU_MEMORY_BUDGET = 16 * 2**20
#: One tile of the fused kernel sum per CPU thread: L2-sized, so that the four passes over it
#: (distance product, clamp, exp, weighted sum) stay in cache (1 MiB tiles ran about 1.5× faster
#: than the 4 MiB chunks of the 16 MiB budget at n = m = 20,000).
CPU_TILE_BYTES = 2**20


def default_budget(device) -> int:
    """Bytes of temporaries per chunk: cache-sized on the CPU, larger on accelerators."""
    return CPU_MEMORY_BUDGET if torch.device(device).type == "cpu" else MEMORY_BUDGET


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


def scaled_sq_dist(
    xq: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    center: Optional[torch.Tensor] = None,
) -> torch.Tensor:
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


def chunk_rows(
    m: int,
    n: int,
    width: int = 1,
    itemsize: int = 8,
    budget: Optional[int] = None,
    device="cpu",
) -> int:
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


def tile_shape(
    m: int,
    n: int,
    itemsize: int = 8,
    budget: Optional[int] = None,
    device="cpu",
    depth: int = 4,
) -> Tuple[int, int]:
    """``(rows, cols)`` of one tile of the fused kernel sum (:func:`local_average`).

    The one place the tile is chosen. On the CPU with the default budget a tile holds
    :data:`CPU_TILE_BYTES` per torch thread. For a short distance product (``depth = d + 2 ≤
    16``: the passes over the tile dominate) whole data rows when at least 64 of them fit, else
    64 query rows × a block of the data (the sums then run over column blocks); for a long one
    (matrix products dominate) 256 query rows × a block, so each block of the data is read
    from memory once for many queries. Elsewhere, or with an explicit ``budget``, a tile is
    :func:`chunk_rows` whole rows.
    """
    if budget is None and torch.device(device).type == "cpu":
        elems = max(1, CPU_TILE_BYTES * max(1, torch.get_num_threads()) // itemsize)
        if depth > 16:
            rows = min(m, 256)
            return rows, max(1, min(n, elems // rows))
        if 64 * n <= elems:
            return max(1, min(m, elems // n)), n
        return min(m, 64), max(1, min(n, elems // 64))
    return chunk_rows(m, n, 1, itemsize, budget, device), n


def log_weights(
    xq: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    kern: Kernel,
    center: torch.Tensor,
) -> torch.Tensor:
    """``log K(xq[a], x[i])`` for one chunk of queries, ``(rows, n)``."""
    return kern.log_profile(scaled_sq_dist(xq, x, h, center))


def _exp_floor(dtype: torch.dtype) -> float:
    """Arguments below this give subnormal ``exp`` values, which ``exp`` computes 10–70× slower."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


def _block_max(t: torch.Tensor, size: int) -> list:
    """The maximum of each consecutive block of ``size`` entries of the 1-D ``t`` (Python floats)."""
    pad = (-t.numel()) % size
    return (
        torch.nn.functional.pad(t, (0, pad), value=-math.inf)
        .view(-1, size)
        .amax(1)
        .tolist()
    )


#: Compact profiles evaluated in place from ``u²`` (values in ``[0, 1]``: no shift, no exp).
_DIRECT = {
    "uniform": lambda u2: u2.le_(1.0),
    "epanechnikov": lambda u2: u2.neg_().add_(1.0).clamp_(min=0.0),
    "biweight": lambda u2: u2.neg_().add_(1.0).clamp_(min=0.0).square_(),
}


def _accumulate(acc, e, v1, vT, values, c: slice, k: int) -> None:
    """``acc += e @ [v, 1]`` for one tile of weights ``e`` and the data block ``c``."""
    if v1 is not None:
        acc += torch.mm(e, v1[c])
        return
    if k == 1:
        acc[:, 0] += torch.mv(e, vT[0, c])
    elif k:
        acc[:, :k] += torch.mm(e, values[c])
    acc[:, k] += e.sum(1)


def _tiled_sums(
    aq: torch.Tensor,
    bb: torch.Tensor,
    values: Optional[torch.Tensor],
    kern: Kernel,
    tile: Tuple[int, int],
    online: bool,
    norms: Tuple[torch.Tensor, torch.Tensor],
):
    r"""``S[a] = Σᵢ exp(log K(a, i) − s_a) [vᵢ, 1]`` over cache-sized tiles, and the shifts ``s``.

    ``aq (m, d+2)`` and ``bb (n, d+2)`` are the augmented sides of the distance product (for the
    Gaussian ``bb`` is pre-multiplied by −1/2, so the product *is* ``log K``). Each tile is one
    ``mm`` into a reused buffer, an in-place ``exp_`` and the weighted sums (matrix-vector
    products for one value column, a matrix product with ``[v, 1]`` for a few, a product and a
    row sum for many), accumulated over column blocks (in float64 for lower precisions).
    Shift-free (``online=False``): every profile has ``log K ≤ 0``, so ``s = 0`` cannot overflow;
    arguments are floored where ``exp`` turns subnormal, which overestimates a row's sum by at
    most ``n·exp(floor)`` (the caller redoes rows whose sum is not far above that); a tile in
    which ``|a| + |b|`` (``norms``) cannot reach the floor skips that clamp. ``online=True``: the
    running row maximum is the shift and partial sums are rescaled when it grows (online
    softmax), exact for any row.
    """
    m, n = aq.shape[0], bb.shape[0]
    rows, cols = tile
    dt, dev = aq.dtype, aq.device
    k = 0 if values is None else values.shape[1]
    wide = dt != torch.float64 and cols < n and dev.type in ("cpu", "cuda")
    sums = torch.zeros(m, k + 1, dtype=torch.float64 if wide else dt, device=dev)
    # a few value columns: [v, 1] in one product; one: matrix-vector products (faster than a
    # product with two columns); many: no (n, k + 1) copy, the weight sum apart
    v1 = torch.cat([values, torch.ones_like(values[:, :1])], 1) if 2 <= k < 16 else None
    vT = values.T.contiguous() if k == 1 else None
    bT = (
        bb.T.contiguous() if bb.shape[1] <= 16 else bb.T
    )  # a contiguous small side: faster mm
    gauss, lap = kern.name == "gaussian", kern.name == "laplacian"
    direct = _DIRECT.get(kern.name) if kern is KERNELS.get(kern.name) else None
    floor = _exp_floor(dt)

    def lowest(u):  # the smallest log K at |a − b| ≤ u
        return -0.5 * u * u if gauss else (-u if lap else -math.inf)

    if lowest(float(norms[0].max()) + float(norms[1].max())) >= floor:
        reach = [[0.0] * len(range(0, n, cols))] * len(range(0, m, rows))
    else:
        reach = [
            [lowest(qa + xb) for xb in _block_max(norms[1], cols)]
            for qa in _block_max(norms[0], rows)
        ]
    run_max = torch.full((m,), -math.inf, dtype=dt, device=dev)
    buf = torch.empty(min(rows, m) * min(cols, n), dtype=dt, device=dev)
    for i, r in enumerate(iter_chunks(m, rows)):
        R = r.stop - r.start
        acc = sums[r]
        for j, c in enumerate(iter_chunks(n, cols)):
            lw = buf[: R * (c.stop - c.start)].view(R, -1)
            torch.mm(aq[r], bT[:, c], out=lw)
            if (
                direct is not None
            ):  # weights in [0, 1] straight from u²: no shift, no exp
                _accumulate(acc, direct(lw), v1, vT, values, c, k)
                continue
            if lap:
                lw.clamp_(min=0.0).sqrt_().neg_()
            elif not gauss:
                lw = kern.log_profile(lw.clamp_(min=0.0))
            if online:
                old = run_max[r].clone()
                new = torch.maximum(old, lw.amax(1))
                shift = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
                grow = torch.where(
                    torch.isfinite(old), old - shift, torch.full_like(old, -math.inf)
                )
                acc.mul_(torch.exp(grow)[:, None])
                run_max[r] = new
                lw.sub_(shift[:, None])
            if not kern.compact and reach[i][j] < floor:
                lw.clamp_(min=floor)  # no subnormal exp (10–70× slower)
            _accumulate(acc, lw.exp_(), v1, vT, values, c, k)
    shift = (
        torch.where(torch.isfinite(run_max), run_max, torch.zeros_like(run_max))
        if online
        else torch.zeros_like(run_max)
    )
    return sums, shift


#: Cell lists for compact kernels are used up to this dimension (3^d neighbouring cells) ...
GRID_MAX_DIM = 3
#: ... when the candidate pairs are at most 1/32 of all pairs: a gathered pair costs about 30
#: times a pair of the dense tiles (measured: 103 seeds × 10,000 points, 2-D, 1 thread).
GRID_MIN_SPAN = 32


class _Grid:
    r"""A cell list of the data for a compact kernel: cubes of side one bandwidth.

    Every point within the support ``u ≤ 1`` of a query lies in the ``3^d`` cells around the
    query's cell; with the cells numbered row-major and the points sorted by cell, those cells
    form ``3^(d−1)`` contiguous runs (three cells along the last axis), found by
    ``searchsorted``. Built once per data set (mean shift reuses it at every step); ``None``
    from :meth:`build` when the dimension is above :data:`GRID_MAX_DIM`, the cells would
    overflow int64, or (unless ``force``) there are too few cells to pay.
    """

    @classmethod
    def build(cls, x, values, h, center, force: bool = False):
        d = x.shape[1]
        if d > GRID_MAX_DIM:
            return None
        xs = (x - center) / h
        cx = torch.floor(xs).long()
        lo, hi = cx.amin(0) - 1, cx.amax(0) + 1  # one empty border cell on each side
        ext = (hi - lo + 1).tolist()
        cells = math.prod(float(e) for e in ext)
        if cells > 2.0**62 or (not force and cells < GRID_MIN_SPAN * 3**d):
            return None  # int64 cell numbers overflow / neighbouring cells hold much of the data
        self = cls()
        stride = [1] * d
        for j in range(d - 2, -1, -1):
            stride[j] = stride[j + 1] * ext[j + 1]
        self.st = torch.tensor(stride, device=x.device)
        self.lo, self.hi = lo, hi
        self.ks, order = torch.sort(((cx - lo) * self.st).sum(1))
        n = x.shape[0]
        v1 = (
            torch.ones(n, 1, dtype=x.dtype, device=x.device)
            if values is None
            else torch.cat([values, torch.ones_like(values[:, :1])], 1)
        )
        self.xs_o, self.v1_o = xs[order], v1[order]
        self.offsets = (
            torch.cartesian_prod(*[torch.tensor([-1, 0, 1], device=x.device)] * (d - 1))
            if d > 1
            else None
        )
        return self

    def candidates(self, qs):
        """``(start, count)`` of the runs of candidate points for the scaled queries ``qs``."""
        m, d = qs.shape
        lo, hi, st = self.lo, self.hi, self.st
        cq = torch.floor(qs.clamp(min=-(2.0**62), max=2.0**62)).long()
        valid = ((cq >= lo) & (cq <= hi)).all(1)  # farther out: no point within reach
        cq = torch.minimum(torch.maximum(cq, lo), hi)
        last_lo = torch.clamp(cq[:, -1] - 1, min=int(lo[-1])) - lo[-1]
        last_hi = torch.clamp(cq[:, -1] + 1, max=int(hi[-1])) - lo[-1]
        if d > 1:
            base = torch.minimum(
                torch.maximum(
                    cq[:, None, :-1] + self.offsets.reshape(-1, d - 1)[None], lo[:-1]
                ),
                hi[:-1],
            )
            row_key = ((base - lo[:-1]) * st[:-1]).sum(2)  # (m, 3^(d-1))
        else:
            row_key = torch.zeros(m, 1, dtype=torch.long, device=qs.device)
        start = torch.searchsorted(self.ks, row_key + last_lo[:, None], right=False)
        count = (
            torch.searchsorted(self.ks, row_key + last_hi[:, None], right=True) - start
        )
        count[~valid] = 0
        return start, count

    def sums(self, qs, start, count, kern: Kernel, budget: Optional[int] = None):
        """``[Σᵢ K vᵢ, Σᵢ K]`` over the candidate pairs, in query chunks within ``budget``."""
        m, d = qs.shape
        xs_o, v1_o = self.xs_o, self.v1_o
        dev = qs.device
        sums = torch.zeros(m, v1_o.shape[1], dtype=xs_o.dtype, device=dev)
        cap = max(1, default_budget(dev) if budget is None else budget) // (
            8 * (2 * d + v1_o.shape[1] + 7)
        )
        bounds = torch.cumsum(count.sum(1), 0).tolist()
        first, done = 0, 0
        while first < m:  # chunks of at most `cap` candidate pairs (at least one query)
            last = max(first + 1, bisect.bisect_right(bounds, done + cap, lo=first))
            cnt = count[first:last].reshape(-1)
            seg = torch.repeat_interleave(torch.arange(cnt.numel(), device=dev), cnt)
            ofs = (
                torch.arange(seg.numel(), device=dev)
                - (torch.cumsum(cnt, 0) - cnt)[seg]
            )
            pidx = start[first:last].reshape(-1)[seg] + ofs
            qid = seg // count.shape[1]
            diff = xs_o[pidx] - qs[first:last][qid]
            w = kern((diff * diff).sum(1))
            sums[first:last].index_add_(0, qid, v1_o[pidx] * w[:, None])
            done = bounds[last - 1]
            first = last
        return sums


def _grid_sums(
    xq: torch.Tensor,
    x: torch.Tensor,
    values: Optional[torch.Tensor],
    h: torch.Tensor,
    kern: Kernel,
    center: torch.Tensor,
    budget: Optional[int] = None,
    force: bool = False,
    span: int = GRID_MIN_SPAN,
):
    r"""``[Σᵢ K vᵢ, Σᵢ K]`` for a compact kernel from a cell list (:class:`_Grid`), or ``None``
    when brute force is cheaper: the candidate pairs exceed ``m·n / span`` (unless ``force``)."""
    grid = _Grid.build(x, values, h, center, force)
    return (
        None
        if grid is None
        else _grid_query(grid, xq, h, center, kern, budget, force, span)
    )


def _grid_query(
    grid, xq, h, center, kern, budget, force=False, span=GRID_MIN_SPAN, runs=False
):
    """The cell list's sums for the queries ``xq``, or ``None`` when the candidate pairs exceed
    ``m·n / span`` (unless ``force``). ``runs``: the compiled loop over the runs of
    neighbouring cells (:func:`localbook.compiled.run_sums`) instead of gathered pairs."""
    qs = (xq - center) / h
    start, count = grid.candidates(qs)
    m, n = xq.shape[0], grid.xs_o.shape[0]
    if not force and int(count.sum()) * span > m * n:
        return None
    if runs:
        v = grid.v1_o[:, :-1] if grid.v1_o.shape[1] > 1 else None
        return compiled.run_sums(qs, grid.xs_o, v, kern.name, 0.0, start, count)
    return grid.sums(qs, start, count, kern, budget)


#: The compiled engine (:mod:`localbook.compiled`) computes distances as differences, ``d``
#: operations per pair: above this dimension the matrix-product tiles are faster.
COMPILED_MAX_DIM = compiled.MAX_DIM
#: ... and one pass per value column: above this many columns, a matrix product.
COMPILED_MAX_VALUES = 8
#: With the compiled loop the cell list's runs of neighbouring cells are summed in C too
#: (:func:`localbook.compiled.run_sums`): a candidate pair then costs 1.5-5 compiled dense pairs
#: (short runs cost more), against 300-430 when gathered in PyTorch (measured: flat kernel, 2-D,
#: 2,000 × 20,000 points, 1 thread; at 4× fewer candidates than pairs the runs took 0.8× the
#: dense time, at 13× fewer 0.15×), so the cell list pays from a 4-fold cut.
GRID_MIN_SPAN_RUNS = 4


class _DataSide:
    """The data side of the non-differentiable local average, prepared once and reused for
    many query sets (mean shift calls it at every step): the centre, the cell list of a compact
    kernel, the augmented side of the distance product, the scaled data of the compiled loop.

    Calling it with queries ``xq (m, d)`` returns ``(mean (m, k) or None, log_sum (m,))``:
    a cell list for compact kernels where it pays, else the compiled loop
    (:mod:`localbook.compiled`: CPU, float32 or float64 data summed in float64, ``d ≤``
    :data:`COMPILED_MAX_DIM`) or the PyTorch
    tiles (:func:`_tiled_sums`), shift-free (rows whose sum is not safely above the floor are
    redone with the online shift) except for float32 and lower with ``d > 14``, which go online.
    """

    def __init__(self, x, values, h, kern: Kernel, budget=None, center=None):
        self.x, self.values, self.h, self.kern, self.budget = x, values, h, kern, budget
        self.center = data_center(x) if center is None else center
        self.compiled = (
            x.device.type == "cpu"
            and x.dtype in (torch.float64, torch.float32)
            and x.shape[1] <= COMPILED_MAX_DIM
            and (values is None or values.shape[1] <= COMPILED_MAX_VALUES)
            and kern is KERNELS.get(kern.name)
            and kern.name in compiled.PROFILES
            and compiled.library() is not None
        )
        self._grid = _Grid.build(x, values, h, self.center) if kern.compact else None
        self._loop = self._aug = None

    def loop_operands(self):
        """``(scale, bt (d, n), vt (k, n) or None)``: the data in the compiled loop's layout
        and units (:func:`localbook.compiled.scale_points`), made once."""
        if self._loop is None:
            scale = compiled.GAUSS_SCALE if self.kern.name == "gaussian" else 1.0
            bt, bad = compiled.scale_points(self.x, self.center, self.h, scale, True)
            if bad:
                _overflow("x")
            v = self.values
            vt = None if v is None else v.to(torch.float64).T.contiguous()
            self._loop = scale, bt, vt
        return self._loop

    def augmented(self):
        if self._aug is None:
            bb = _augment_data(self.x, self.h, self.center)
            norms = bb[:, -1].sqrt()
            if self.kern.name == "gaussian":
                bb = bb.mul_(-0.5)
            self._aug = bb, norms
        return self._aug

    def __call__(self, xq):
        x, values, h, kern, center = self.x, self.values, self.h, self.kern, self.center
        m, n = xq.shape[0], x.shape[0]
        if self._grid is not None:
            span = GRID_MIN_SPAN_RUNS if self.compiled else GRID_MIN_SPAN
            sums = _grid_query(
                self._grid,
                xq,
                h,
                center,
                kern,
                self.budget,
                span=span,
                runs=self.compiled,
            )
            if sums is not None:
                s = sums[:, -1]
                mean = (
                    None if values is None else (sums[:, :-1] / s[:, None]).to(x.dtype)
                )
                return mean, torch.log(s).to(x.dtype)
        work = torch.float64 if self.compiled else x.dtype  # the compiled loop: float64
        floor = _exp_floor(work)
        online = False
        if self.compiled:
            # operands, loop and results in C: no PyTorch operation on the common path
            scale, bt, vt = self.loop_operands()  # the data's overflow check first
            eps = torch.finfo(torch.float64).eps
            redo_below = 0.0 if kern.compact else n * math.exp(floor) * 2.0 / eps
            sums, mean, log_sum, bad, n_redo = compiled.local_means(
                xq, center, h, scale, bt, vt, kern.name, floor, redo_below
            )
            if bad:
                _overflow("x_query")
            if not n_redo:
                if x.dtype != torch.float64:
                    log_sum = log_sum.to(x.dtype)
                    mean = mean.to(x.dtype)
                return (None if values is None else mean), log_sum
            shift = torch.zeros(m, dtype=sums.dtype, device=x.device)
            aq = None
        else:
            bb, nb = self.augmented()
            aq = _augment_query(xq, h, center)
            tile = tile_shape(
                m, n, x.element_size(), self.budget, x.device, aq.shape[1]
            )
            # shift-free unless the floor is near (float32: 12 bandwidths) and the tiles'
            # extra passes of the online shift are cheap next to long distance products
            online = x.dtype != torch.float64 and aq.shape[1] > 16
            norms = (aq[:, -2].sqrt(), nb)
            sums, shift = _tiled_sums(aq, bb, values, kern, tile, online, norms)
        if not online and not kern.compact:  # compact kernels are never floored: exact
            # floored terms add at most n·exp(floor) each row: keep rows 2/eps times above that
            redo = sums[:, -1] < n * math.exp(floor) * 2.0 / torch.finfo(work).eps
            idx = torch.nonzero(redo)[:, 0]
            if idx.numel():
                bb, nb = self.augmented()
                aq = _augment_query(xq, h, center) if aq is None else aq
                tile = tile_shape(
                    m, n, x.element_size(), self.budget, x.device, aq.shape[1]
                )
                redone, redone_shift = _tiled_sums(
                    aq[idx], bb, values, kern, tile, True, (aq[idx, -2].sqrt(), nb)
                )
                # the compiled loop sums in float64, the redo in the data's dtype
                sums[idx] = redone.to(sums.dtype)
                shift[idx] = redone_shift.to(shift.dtype)
        s = sums[:, -1]
        log_sum = (shift + torch.log(s)).to(x.dtype)
        mean = None if values is None else (sums[:, :-1] / s[:, None]).to(x.dtype)
        return mean, log_sum


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
    ``log_sum = -inf``, with one ``UserWarning`` giving their number. Without autograd the work
    runs in cache-sized tiles (:func:`tile_shape`, :func:`_tiled_sums`); with it, in row chunks
    of the autograd graph (weights relative to each row's largest). Half-precision inputs
    (float16, bfloat16) are computed in float32 and returned in their own dtype.
    """
    kern = get_kernel(kernel)
    if x.dtype in (torch.float16, torch.bfloat16):
        # half precision cannot hold squared distances or sums of many weights (bfloat16
        # gave NaN, float16 overflowed): work in float32, as PyTorch's attention does, and
        # return the input's dtype
        half = x.dtype
        mean, log_sum = local_average(
            xq.float(),
            x.float(),
            None if values is None else values.float(),
            h.float(),
            kern,
            budget=budget,
            warn_empty=warn_empty,
        )
        return (None if mean is None else mean.to(half)), log_sum.to(half)
    m = xq.shape[0]
    center = data_center(x)
    tensors = (xq, x, h) if values is None else (xq, x, h, values)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        mean, log_sum = _DataSide(x, values, h, kern, budget, center)(xq)
    else:
        mean, log_sum = _graph_average(xq, x, values, h, kern, center, budget)
    empty = torch.isneginf(log_sum)
    n_empty = int(empty.sum())
    if n_empty:
        if mean is not None:
            mean[empty] = math.nan
        if warn_empty:
            warn_empty_kernel(n_empty, m, kern.name, stacklevel=3)
    return mean, log_sum


def _graph_average(xq, x, values, h, kern: Kernel, center, budget):
    """The differentiable local average: out-of-place row chunks, shifted by each row's maximum."""
    m, n = xq.shape[0], x.shape[0]
    rows = chunk_rows(m, n, 1, x.element_size(), budget, x.device)
    floor = _exp_floor(x.dtype)
    bb = _augment_data(x, h, center)
    log_sum, means = [], []
    for sl in iter_chunks(m, rows):
        lw = kern.log_profile(_sq_dist_augmented(xq[sl], bb, h, center))
        top = lw.amax(dim=1, keepdim=True).detach()
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        lw = lw - top
        e = torch.exp(lw if kern.compact else lw.clamp(min=floor))
        s = e.sum(dim=1)
        log_sum.append(
            top[:, 0] + torch.log(s)
        )  # an empty row has s = 0, log_sum = -inf
        if values is not None:
            means.append((e @ values) / s[:, None])
    return (torch.cat(means) if values is not None else None), torch.cat(log_sum)


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
