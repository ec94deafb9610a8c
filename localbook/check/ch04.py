"""Self-checks for chapter 4 (MeanShift): one mean-shift step.

lb.check.ch04.mean_shift_step(my_step)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_answer, close, fmt, new_generator, run_check

__all__ = ["mean_shift_step"]


def _as_points(got, shape, like) -> torch.Tensor:
    return as_answer(
        got,
        shape,
        like,
        shape_hint="return one row per query point, with the same number of columns as "
        "the data",
        reshape_hint=f"you have the right number of entries: reshape to {tuple(shape)}",
    )


def mean_shift_step(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x_query, x, h) -> (m, d)``: one Gaussian mean-shift step :math:`m(x)` per query.

    :math:`m(x) = \sum_i K(x, x_i)\, x_i / \sum_i K(x, x_i)` with
    :math:`K = e^{-\lVert x - x_i\rVert^2/(2h^2)}` — the self-local mean, compared with
    :func:`localbook.nadaraya_watson` of the positions on six random cases (1-D to 5-D, including a
    query far from all data, where a naive ratio of exponentials gives ``0/0``). Wrong answers are
    compared with the shift :math:`m(x) - x`, the score and an unnormalized sum for a hint.
    """
    from ..local_mean import nadaraya_watson

    g = new_generator(seed)
    cases = []
    for n, m, d, h, far in [
        (5, 3, 1, 0.8, False),
        (40, 6, 2, 0.5, False),
        (100, 4, 3, 1.2, False),
        (200, 5, 2, 0.2, False),
        (60, 3, 5, 1.0, False),
        (50, 2, 2, 0.3, True),
    ]:
        x = torch.randn(n, d, generator=g, dtype=torch.float64)
        q = x[:m] + 0.3 * torch.randn(m, d, generator=g, dtype=torch.float64)
        if far:
            q[-1] = (
                40.0  # every kernel value underflows: only a log-space (or shifted) ratio survives
            )
        want = nadaraya_watson(q, x, x, h)
        what = f"n = {n}, d = {d}, h = {h:g}" + (
            ", one query far from all data" if far else ""
        )
        cases.append(Case((q, x, h), what, {"want": want}))

    def judge(case, got):
        q, x, h = case.args
        got = _as_points(got, q.shape, x)
        want = case.extra["want"]
        if close(got, want):
            return
        bad = (
            ~torch.isclose(got, want, rtol=1e-6, atol=1e-8) | ~torch.isfinite(got)
        ).any(1)
        i = int(bad.nonzero()[0, 0])
        msg = f"query {i}: expected {[fmt(float(v)) for v in want[i]]}, got {[fmt(float(v)) for v in got[i]]}"
        if close(got, want - q):
            raise Mismatch(
                msg,
                "you returned the shift m(x) − x; the step moves the point to m(x) itself",
            )
        if close(got, (want - q) / h**2):
            raise Mismatch(
                msg,
                "you returned the score ∇log p̂(x) = (m(x) − x)/h²; the check wants m(x)",
            )
        if not bool(torch.isfinite(got).all()):
            raise Mismatch(
                msg,
                "NaN or inf: for a query far from all data every exp(−u²/2) underflows to 0 — "
                "subtract the largest exponent before exponentiating (or use logsumexp / softmax)",
            )
        raise Mismatch(
            msg,
            "m(x) is a weighted mean: divide Σ K_i x_i by Σ K_i, with K_i = exp(−|x − x_i|²/(2h²))",
        )

    return run_check(
        "mean_shift_step", fn, cases, judge, "1-D to 5-D, one query far from all data"
    )
