"""Self-checks for chapter 3 ("Local decisions beyond the mean"): the local quantile.

Call it on your own function inside an exercise cell::

    lb.check.ch03.local_quantile_1d(my_local_quantile)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_scalar, fmt, new_generator, run_check

__all__ = ["local_quantile_1d"]


def _pinball_objective(
    theta: float, w: torch.Tensor, y: torch.Tensor, q: float
) -> float:
    u = y - theta
    return float((w * u * (q - (u < 0).to(u.dtype))).sum())


def local_quantile_1d(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x_star, x, y, h, q) -> float``: the local ``q``-quantile at ``x_star``.

    Gaussian kernel :math:`K_i = e^{-(x_i - x^*)^2/(2h^2)}`; the answer must minimize
    :math:`\sum_i K_i\,\rho_q(y_i - \theta)` with :math:`\rho_q(u) = u\,(q - 1[u<0])` (any
    minimizer is accepted: the objective is compared with that of
    :func:`localbook.local_quantile`, up to rounding). Six random cases with heavy-tailed
    responses, ``q`` from 0.1 to 0.9; wrong answers are compared with the local mean, the
    unweighted quantile and the ``1 − q`` quantile to give a specific hint.
    """
    from ..local_decisions import local_quantile
    from ..local_mean import nadaraya_watson

    g = new_generator(seed)
    cases = []
    for n, h, q in [
        (7, 0.5, 0.5),
        (40, 0.1, 0.5),
        (60, 0.2, 0.1),
        (100, 0.05, 0.9),
        (25, 1.0, 0.75),
        (200, 0.3, 0.3),
    ]:
        x = torch.rand(n, generator=g, dtype=torch.float64)
        # Student t with 2 degrees of freedom: z / sqrt(χ²₂ / 2), with χ²₂ / 2 = −log U
        z = torch.randn(n, generator=g, dtype=torch.float64)
        u = torch.rand(n, generator=g, dtype=torch.float64).clamp(min=1e-300)
        noise = z / torch.sqrt(-torch.log(u))
        y = torch.sin(6 * x) + 0.5 * noise
        x_star = float(torch.rand(1, generator=g, dtype=torch.float64))
        want = float(local_quantile([[x_star]], x, y, h, q=q)[0])
        cases.append(
            Case((x_star, x, y, h, q), f"n = {n}, h = {h:g}, q = {q:g}", {"want": want})
        )

    def judge(case, got):
        x_star, x, y, h, q = case.args
        got = as_scalar(got)
        want = case.extra["want"]
        w = torch.exp(-0.5 * ((x - x_star) / h) ** 2)
        J_want = _pinball_objective(want, w, y, q)
        tol = 1e-9 * float(w.sum() * (y.abs().max() + 1))
        J_got = _pinball_objective(got, w, y, q) if got == got else float("inf")
        if J_got <= J_want + tol:
            return
        msg = (
            f"expected {fmt(want)} (weighted pinball loss {fmt(J_want)}), got {fmt(got)} "
            f"(loss {fmt(J_got)})"
        )
        nw = float(nadaraya_watson([[x_star]], x, y, h)[0])
        plain = float(torch.quantile(y, q, interpolation="lower"))
        flipped = float(local_quantile([[x_star]], x, y, h, q=1 - q)[0])
        if abs(got - nw) <= 1e-9 * (1 + abs(nw)):
            raise Mismatch(
                msg,
                "that is the local mean (squared loss); the pinball loss gives a "
                "weighted quantile of the y_i, not a weighted average",
            )
        if abs(got - plain) <= 1e-12 * (1 + abs(plain)) and abs(plain - want) > 0:
            raise Mismatch(
                msg, "that is the quantile of all y_i: weight each y_i by K(x*, x_i)"
            )
        if abs(got - flipped) <= 1e-12 * (1 + abs(flipped)) and abs(flipped - want) > 0:
            raise Mismatch(
                msg,
                "you computed the (1 − q)-quantile: sort the y_i increasingly and "
                "stop where the cumulative weight first reaches q · Σ K_i",
            )
        raise Mismatch(
            msg,
            "sort the y_i, accumulate their kernel weights in that order, and "
            "return the first y_(j) whose cumulative weight reaches q · Σ_i K_i",
        )

    return run_check(
        "local_quantile_1d", fn, cases, judge, "heavy-tailed data, q from 0.1 to 0.9"
    )
