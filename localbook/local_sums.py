r"""The chunked reduction engine: kernel-weighted sums and local means of many queries.

:func:`local_average` computes, for each query, the kernel-weighted mean of value rows and the
log of the total weight, in bounded memory: dense tiles of the fused distance product
(:func:`localbook.chunks.tile_shape`), cell lists for compact kernels in low dimension, the
compiled C loop (:mod:`localbook.compiled`) for CPU sums in low dimension, and, for the Gaussian
far from every data point, a redo in log space (the nearest points' values instead of ``0/0``).
Kernel profiles and distances come from :mod:`localbook.kernels`.
"""

from __future__ import annotations

import bisect
import math
from typing import Optional, Tuple

import torch

from . import compiled
from .chunks import default_budget, iter_chunks, tile_shape
from .local_grad import _LocalAverage
from .kernels import (
    KERNELS,
    Kernel,
    _augment_data,
    _augment_query,
    _exp_floor,
    _overflow,
    data_center,
    get_kernel,
    warn_empty_kernel,
)

__all__ = ["local_average"]


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
    recomputed by the backward pass (:class:`_LocalAverage`: memory bounded by the chunk budget
    at any size). Half-precision inputs
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
        # the backward pass recomputes the weights chunk by chunk: memory stays bounded by
        # the chunk budget at any size (a graph of the pairwise weights would hold all m·n)
        none = values is None
        v = xq.new_zeros(x.shape[0], 0) if none else values
        mean, log_sum = _LocalAverage.apply(
            xq, x, v, h, kern, budget, center.detach(), _DataSide
        )
        mean = None if none else mean
    empty = torch.isneginf(log_sum)
    n_empty = int(empty.sum())
    if n_empty:
        if mean is not None and not mean.requires_grad:
            mean[empty] = math.nan
        if warn_empty:
            warn_empty_kernel(n_empty, m, kern.name, stacklevel=3)
    return mean, log_sum
