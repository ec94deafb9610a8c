"""Self-checks for chapter 1 (localization): the local constant fit and the KNN bandwidth.

Call them on your own function inside an exercise cell::

    lb.check.ch01.local_constant_fit(my_fit)
    lb.check.ch01.knn_bandwidth(my_bandwidth)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_scalar, fmt, isclose, new_generator, run_check

__all__ = ["local_constant_fit", "knn_bandwidth"]


def _points(g: torch.Generator, n: int, kind: str) -> torch.Tensor:
    if kind == "uniform":
        return torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2
    if kind == "normal":
        return torch.randn(n, generator=g, dtype=torch.float64)
    # clustered: two groups, so some queries sit between them
    return torch.cat(
        [
            torch.randn(n - n // 2, generator=g, dtype=torch.float64) * 0.3 - 1.5,
            torch.randn(n // 2, generator=g, dtype=torch.float64) * 0.3 + 1.5,
        ]
    )


def local_constant_fit(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x_star, x, y, h) -> float``: :math:`\arg\min_\theta \sum_i K((x^*-x_i)/h)(y_i-\theta)^2`.

    The Gaussian kernel :math:`K(u) = e^{-u^2/2}` is used; the answer is the kernel-weighted mean of
    ``y``. ``x`` and ``y`` are float64 tensors of shape ``(n,)``, ``x_star`` and ``h`` floats. Six
    random cases (sample sizes 3 to 200, bandwidths 0.15 to 2, queries inside the data's range);
    a wrong answer is compared with typical slips (unnormalized weights, the plain mean, a kernel
    missing its factor 1/2, ``h`` used as a variance) to give a specific hint.
    """
    from ..local_mean import nadaraya_watson

    g = new_generator(seed)
    cases = []
    for n, kind, h in [
        (3, "uniform", 2.0),
        (12, "normal", 0.5),
        (40, "uniform", 0.3),
        (60, "clustered", 0.4),
        (200, "normal", 0.15),
        (25, "uniform", 1.0),
    ]:
        x = _points(g, n, kind)
        y = (
            torch.sin(2 * x)
            + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
            + 5 * torch.rand(1, generator=g, dtype=torch.float64)
        )
        lo, hi = float(x.min()), float(x.max())
        x_star = lo + (hi - lo) * float(torch.rand(1, generator=g, dtype=torch.float64))
        want = float(
            nadaraya_watson(
                torch.tensor([[x_star]], dtype=torch.float64), x[:, None], y, h
            )[0]
        )
        cases.append(
            Case(
                (x_star, x, y, h),
                f"n = {n}, x* = {x_star:.3g}, h = {h:g}",
                {"want": want},
            )
        )

    def judge(case, got):
        x_star, x, y, h = case.args
        val = as_scalar(got)
        want = case.extra["want"]
        if isclose(val, want):
            return
        u = (x_star - x) / h
        w = torch.exp(-0.5 * u * u)
        slips = [
            (
                float((w * y).sum()),
                "the weights do not sum to 1: a weighted mean divides by the total weight",
            ),
            (
                float(y.mean()),
                "your answer is the plain mean of y: the kernel weights are missing",
            ),
            (
                float((torch.exp(-u * u) * y).sum() / torch.exp(-u * u).sum()),
                "the Gaussian kernel is exp(-u²/2) with u = (x* − x_i)/h: check the factor 1/2",
            ),
            (
                float(
                    (torch.exp(-0.5 * (x_star - x) ** 2 / h) * y).sum()
                    / torch.exp(-0.5 * (x_star - x) ** 2 / h).sum()
                ),
                "h is the kernel's standard deviation, not its variance: divide x* − x_i by h, then square",
            ),
        ]
        for value, hint in slips:
            if isclose(val, value):
                raise Mismatch(f"expected {fmt(want)}, got {fmt(val)}", hint)
        if not (float(y.min()) - 1e-9 <= val <= float(y.max()) + 1e-9):
            raise Mismatch(
                f"expected {fmt(want)}, got {fmt(val)}",
                "a weighted mean lies between min(y) and max(y): are your weights non-negative and normalized?",
            )
        raise Mismatch(
            f"expected {fmt(want)}, got {fmt(val)}",
            "weight each y_i by K((x* − x_i)/h) with the Gaussian K(u) = exp(−u²/2), then normalize",
        )

    return run_check(
        "local_constant_fit", fn, cases, judge, "Gaussian kernel, n from 3 to 200"
    )


def knn_bandwidth(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x_star, x, k) -> float``: the distance from ``x_star`` to its ``k``-th nearest point.

    :math:`h_k(x^*) = |x^* - x_{(k)}|`, the ``k``-th smallest of :math:`|x^* - x_i|` (a data point
    at ``x_star`` itself counts, at distance 0). Six random cases, ``k`` from 1 to ``n``, one with
    ``x_star`` equal to a data point; wrong answers are compared with the usual slips (off by one,
    squared distance, the neighbour's position instead of its distance).
    """
    g = new_generator(seed)
    cases = []
    for n, kind, k, on_point in [
        (10, "uniform", 3, False),
        (30, "normal", 1, False),
        (25, "uniform", 5, True),
        (50, "clustered", 10, False),
        (8, "normal", 8, False),
        (100, "uniform", 7, False),
    ]:
        x = _points(g, n, kind)
        if on_point:
            x_star = float(x[int(torch.randint(n, (1,), generator=g))])
        else:
            x_star = float(torch.randn(1, generator=g, dtype=torch.float64))
        d = (x - x_star).abs().sort().values
        what = f"n = {n}, k = {k}, x* = {x_star:.3g}" + (
            " (a data point)" if on_point else ""
        )
        cases.append(Case((x_star, x, k), what, {"d": d}))

    def judge(case, got):
        x_star, x, k = case.args
        d = case.extra["d"]
        val = as_scalar(got)
        want = float(d[k - 1])
        if isclose(val, want):
            return
        order = (x - x_star).abs().argsort()
        slips = []
        if k < len(d):
            slips.append(
                (
                    float(d[k]),
                    "a data point at x* itself counts as the nearest (distance 0): did you drop it?"
                    if "data point" in case.describe
                    else "off by one: the k-th nearest distance sits at index k − 1 of the sorted distances",
                )
            )
        if k >= 2:
            slips.append(
                (
                    float(d[k - 2]),
                    "off by one: with k = 1 the answer is the nearest distance itself",
                )
            )
        slips += [
            (want**2, "return the distance |x* − x_(k)|, not its square"),
            (
                float(x[order[k - 1]]),
                "you returned the neighbour's position; the bandwidth is its distance to x*",
            ),
            (
                float(x.sort().values[k - 1] - x_star),
                "sort the distances |x* − x_i|, not the points x_i",
            ),
            (
                abs(float(x.sort().values[k - 1] - x_star)),
                "sort the distances |x* − x_i|, not the points x_i",
            ),
        ]
        for value, hint in slips:
            if isclose(val, value):
                raise Mismatch(f"expected {fmt(want)}, got {fmt(val)}", hint)
        if val < 0:
            raise Mismatch(
                f"expected {fmt(want)}, got {fmt(val)}", "a distance is never negative"
            )
        hint = "the k-th smallest of |x* − x_i| over all points"
        if "data point" in case.describe:
            hint += "; a data point at x* itself counts as the nearest, at distance 0"
        raise Mismatch(f"expected {fmt(want)}, got {fmt(val)}", hint)

    return run_check(
        "knn_bandwidth", fn, cases, judge, "k from 1 to n, one query on a data point"
    )
