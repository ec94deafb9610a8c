"""Self-checks for chapter 2 (local means): the leave-one-out shortcut and the equivalent kernel.

Call them on your own function inside an exercise cell::

    lb.check.ch02.loo_shortcut(my_loo_residuals)
    lb.check.ch02.equivalent_kernel_1d(my_weights)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_vector, close, fmt, new_generator, run_check

__all__ = ["loo_shortcut", "equivalent_kernel_1d"]


def _data(g: torch.Generator, n: int, spread: float):
    x = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * spread
    y = torch.cos(3 * x / spread) + 0.2 * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    return x, y


def _first_bad(got: torch.Tensor, want: torch.Tensor, rtol=1e-6, atol=1e-8) -> str:
    bad = ~torch.isclose(got, want, rtol=rtol, atol=atol) | ~torch.isfinite(got)
    i = int(bad.nonzero()[0, 0])
    return f"entry {i}: expected {fmt(float(want[i]))}, got {fmt(float(got[i]))} ({int(bad.sum())} of {len(want)} entries differ)"


class _CountCalls:
    """Count calls of localbook's fitting functions while the student's function runs."""

    NAMES = ("nadaraya_watson", "local_linear")

    def __enter__(self):
        import localbook
        from localbook import local_mean

        self.count = 0
        self.saved = []
        for mod in (localbook, local_mean):
            for name in self.NAMES:
                f = getattr(mod, name)
                self.saved.append((mod, name, f))
                setattr(mod, name, self._wrap(f))
        return self

    def _wrap(self, f):
        def counted(*a, **k):
            self.count += 1
            return f(*a, **k)

        counted.__wrapped__ = f
        counted.__name__ = f.__name__
        counted.__doc__ = f.__doc__
        return counted

    def __exit__(self, *exc):
        for mod, name, f in self.saved:
            setattr(mod, name, f)
        return False


def loo_shortcut(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x, y, h) -> (n,)``: leave-one-out residuals of Gaussian Nadaraya–Watson, without refits.

    The answer must equal :math:`y_i - \hat y_{-i}(x_i)`, where :math:`\hat y_{-i}` is the
    Nadaraya–Watson fit (Gaussian kernel, bandwidth ``h``) on the data without point ``i``; the
    check computes it by brute force, ``n`` refits of :func:`localbook.nadaraya_watson`. Your
    function must *not* refit: it fails if it calls ``nadaraya_watson``/``local_linear`` ``n``
    times or more. Five random cases (``n`` from 4 to 300, small and large bandwidths); wrong
    answers are compared with the in-sample residuals, the leave-one-out predictions and the
    flipped sign to give a specific hint.
    """
    from ..local_mean import nadaraya_watson

    g = new_generator(seed)
    cases = []
    for n, spread, h in [
        (4, 1.0, 0.8),
        (20, 1.0, 0.2),
        (50, 2.0, 0.3),
        (120, 1.0, 0.05),
        (300, 3.0, 1.0),
    ]:
        x, y = _data(g, n, spread)
        keep = ~torch.eye(n, dtype=torch.bool)
        loo = torch.stack(
            [
                nadaraya_watson(x[i : i + 1, None], x[keep[i], None], y[keep[i]], h)[0]
                for i in range(n)
            ]
        )
        fitted = nadaraya_watson(x[:, None], x[:, None], y, h)
        cases.append(
            Case((x, y, h), f"n = {n}, h = {h:g}", {"loo": loo, "fitted": fitted})
        )

    def judge(case, got):
        x, y, h = case.args
        n = len(x)
        got = as_vector(got, n, like=x)
        want = y - case.extra["loo"]
        if close(got, want):
            return
        fitted = case.extra["fitted"]
        for value, hint in [
            (
                y - fitted,
                "these are the in-sample residuals y_i − ŷ_i: the leave-one-out residual divides each by 1 − L_ii",
            ),
            (
                case.extra["loo"],
                "you returned the leave-one-out predictions ŷ_{−i}(x_i); the check wants the residuals y_i − ŷ_{−i}(x_i)",
            ),
            (-want, "sign: the residual is y_i − ŷ_{−i}(x_i), not ŷ_{−i}(x_i) − y_i"),
            (
                (y - fitted)
                * (
                    1
                    - 1 / torch.exp(-0.5 * ((x[:, None] - x[None, :]) / h) ** 2).sum(1)
                ),
                "multiply → divide: y_i − ŷ_{−i}(x_i) = (y_i − ŷ_i) / (1 − L_ii)",
            ),
        ]:
            if close(got, value):
                raise Mismatch(_first_bad(got, want), hint)
        raise Mismatch(
            _first_bad(got, want),
            "L_ii is the weight of point i in its own fit: K(x_i, x_i) / Σ_j K(x_i, x_j), "
            "with K(x_i, x_i) = k(0) = 1",
        )

    def run(x, y, h):
        with _CountCalls() as c:
            out = fn(x, y, h)
        if c.count >= len(x):
            raise _Refit(c.count)
        return out

    class _Refit(Exception):
        def __init__(self, count):
            super().__init__(count)
            self.count = count

    def wrapped(x, y, h):
        try:
            return run(x, y, h)
        except _Refit as r:
            return _RefitMarker(r.count)

    class _RefitMarker:
        def __init__(self, count):
            self.count = count

    def judge_with_refit(case, got):
        if isinstance(got, _RefitMarker):
            raise Mismatch(
                f"your function fitted the smoother {got.count} times for n = {len(case.args[0])} points",
                "the point of the shortcut is one fit: use the diagonal of the smoother matrix instead of refitting",
            )
        judge(case, got)

    wrapped.__name__ = getattr(fn, "__name__", "your function")
    return run_check(
        "loo_shortcut",
        wrapped if callable(fn) else fn,
        cases,
        judge_with_refit,
        "n from 4 to 300, against n brute-force refits each",
    )


def equivalent_kernel_1d(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x_star, x, h) -> (n,)``: the local-linear equivalent-kernel weights :math:`\ell_i(x^*)`.

    Gaussian kernel, bandwidth ``h``: :math:`\hat m(x^*) = \sum_i \ell_i(x^*) y_i` is the intercept of
    the kernel-weighted least-squares line at ``x_star``. Compared with
    :func:`localbook.equivalent_kernel` on six random cases, including queries at and beyond the
    boundary of the data (where some weights are negative). A wrong answer is also tested for the
    two properties every such weight vector has, :math:`\sum_i \ell_i = 1` and
    :math:`\sum_i \ell_i (x_i - x^*) = 0`, and compared with the Nadaraya–Watson weights.
    """
    from ..local_mean import equivalent_kernel

    g = new_generator(seed)
    cases = []
    for n, spread, h, where in [
        (5, 1.0, 0.7, "inside"),
        (30, 1.0, 0.2, "inside"),
        (60, 2.0, 0.5, "boundary"),
        (100, 1.0, 0.1, "inside"),
        (40, 1.0, 0.3, "beyond"),
        (200, 3.0, 1.0, "boundary"),
    ]:
        x, _ = _data(g, n, spread)
        lo, hi = float(x.min()), float(x.max())
        if where == "inside":
            x_star = lo + (hi - lo) * (
                0.2 + 0.6 * float(torch.rand(1, generator=g, dtype=torch.float64))
            )
        elif where == "boundary":
            x_star = hi
        else:
            x_star = hi + 0.5 * h
        want = equivalent_kernel(
            torch.tensor([[x_star]], dtype=torch.float64), x[:, None], h
        )[0]
        cases.append(
            Case(
                (x_star, x, h),
                f"n = {n}, x* = {x_star:.3g} ({where} the data), h = {h:g}",
                {"want": want},
            )
        )

    def judge(case, got):
        x_star, x, h = case.args
        got = as_vector(got, len(x), like=x)
        want = case.extra["want"]
        if close(got, want):
            return
        K = torch.exp(-0.5 * ((x - x_star) / h) ** 2)
        if close(got, K / K.sum()):
            raise Mismatch(
                _first_bad(got, want),
                "these are the Nadaraya–Watson weights; the local-linear weights correct them with the local slope",
            )
        total = float(got.sum())
        if abs(total - 1) > 1e-6:
            raise Mismatch(
                f"weights do not sum to 1 (sum = {fmt(total)}); {_first_bad(got, want)}",
                "the fit reproduces constants, so Σ_i ℓ_i(x*) = 1: check the normalization",
            )
        moment = float((got * (x - x_star)).sum())
        if abs(moment) > 1e-6 * max(1.0, float((x - x_star).abs().max())):
            raise Mismatch(
                f"Σ ℓ_i (x_i − x*) = {fmt(moment)}, 0 expected; {_first_bad(got, want)}",
                "a local-linear fit reproduces straight lines exactly, so the first moment of its weights is 0",
            )
        if bool((got >= -1e-12).all()) and bool((want < -1e-12).any()):
            raise Mismatch(
                f"all your weights are ≥ 0, but some should be negative here; {_first_bad(got, want)}",
                "near the boundary the fitted line extrapolates: the equivalent kernel takes negative values",
            )
        raise Mismatch(
            _first_bad(got, want),
            "ℓ_i ∝ K_i (S_2 − (x_i − x*) S_1) with S_j = Σ_l K_l (x_l − x*)^j: check the moments",
        )

    return run_check(
        "equivalent_kernel_1d",
        fn,
        cases,
        judge,
        "queries inside, at and beyond the data's boundary",
    )
