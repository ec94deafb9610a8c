"""Self-checks for chapter 6 ("Learning the kernel"): the MLKR loss and Abramson's bandwidths.

Call them on your own function inside an exercise cell::

    from localbook.check import ch06 as check_ch06
    check_ch06.loo_loss(my_loss)
    check_ch06.abramson(my_bandwidths)
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from ._common import (
    Case,
    Mismatch,
    as_scalar,
    as_vector,
    close,
    fmt,
    fmt_vec,
    new_generator,
    run_check,
)

__all__ = ["loo_loss", "abramson"]


def _loss_variants(A, x, y):
    """The right loss and typical slips: self included, no ½, the mean instead of the sum."""
    z = x @ A.T
    d2 = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    eye = torch.eye(len(x), dtype=torch.bool)
    out = {}
    for name, scale, self_in in [
        ("right", 0.5, False),
        ("self", 0.5, True),
        ("half", 1.0, False),
    ]:
        logw = -scale * d2
        if not self_in:
            logw = logw.masked_fill(eye, -math.inf)
        out[name] = float(((y - torch.softmax(logw, 1) @ y) ** 2).sum())
    out["mean"] = out["right"] / len(x)
    return out


def loo_loss(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(A, x, y)``: the MLKR loss :math:`\sum_i (y_i - \hat y_{-i}(x_i))^2`.

    ``fn`` returns a float or a 0-d tensor (a tensor keeps the loss differentiable in ``A``).

    ``A (k, d)``, ``x (n, d)``, ``y (n,)``; the kernel is :math:`\exp(-\lVert A(x_i - x_j)\rVert^2/2)`
    and :math:`\hat y_{-i}` the Nadaraya–Watson prediction at :math:`x_i` from the other points.
    Five random cases; a wrong answer is compared with the usual slips (the point itself left in,
    the kernel without the ½, the mean instead of the sum) to give a specific hint.
    """
    g = new_generator(seed)
    cases = []
    for n, d, k, s in [
        (5, 1, 1, 1.0),
        (12, 2, 2, 0.7),
        (30, 3, 2, 1.5),
        (40, 4, 4, 0.5),
        (60, 2, 1, 2.0),
    ]:
        x = torch.randn(n, d, generator=g, dtype=torch.float64)
        y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(
            n, generator=g, dtype=torch.float64
        )
        A = s * torch.randn(k, d, generator=g, dtype=torch.float64)
        cases.append(
            Case(
                (A, x, y),
                f"n = {n}, d = {d}, A of shape ({k}, {d})",
                {"want": _loss_variants(A, x, y)},
            )
        )

    def judge(case, got):
        v = as_scalar(got)
        want = case.extra["want"]
        if math.isclose(v, want["right"], rel_tol=1e-8, abs_tol=1e-12):
            return
        hint = "predict each y_i from the other points only, with weights exp(-|A(x_i - x_j)|^2 / 2)"
        for name, text in [
            (
                "self",
                "the point itself is still among its neighbours: give it weight 0",
            ),
            ("half", "the book's Gaussian has a ½ in the exponent: exp(-|A d|^2 / 2)"),
            ("mean", "sum the squared residuals over i; do not average them"),
        ]:
            if math.isclose(v, want[name], rel_tol=1e-8):
                hint = text
        raise Mismatch(f"expected {fmt(want['right'])}, got {fmt(v)}", hint)

    return run_check(
        "MLKR leave-one-out loss", fn, cases, judge, "against the dense formula"
    )


def abramson(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(x, h) -> (n,)``: Abramson's bandwidths :math:`h_i = h\,(\tilde p(x_i)/g)^{-1/2}`.

    ``x`` a 1-D tensor of ``n`` points, ``h`` a float; the pilot :math:`\tilde p` is the Gaussian
    KDE of ``x`` with bandwidth ``h`` (:func:`localbook.kde`) and :math:`g` the geometric mean of
    :math:`\tilde p(x_1), \dots, \tilde p(x_n)`. Four random cases against
    :func:`localbook.abramson_bandwidths`.
    """
    from ..metric import abramson_bandwidths

    g = new_generator(seed)
    cases = []
    for n, h in [(10, 0.5), (40, 0.2), (100, 0.1), (200, 0.3)]:
        c = torch.rand(n, generator=g) < 0.4
        x = torch.where(
            c,
            3 + 0.2 * torch.randn(n, generator=g, dtype=torch.float64),
            torch.randn(n, generator=g, dtype=torch.float64),
        )
        cases.append(
            Case((x, h), f"n = {n}, h = {h}", {"want": abramson_bandwidths(x, h)})
        )

    def judge(case, got):
        want = case.extra["want"]
        v = as_vector(got, len(want), want)
        if close(v, want, rtol=1e-8, atol=0):
            return
        pilot = (case.extra["want"] / case.args[1]) ** -2  # p̃ / g
        hint = "h_i = h * (p̃(x_i) / g) ** (-1/2), with g = exp(mean(log p̃(x_i)))"
        if close(v, case.args[1] * pilot**0.5, rtol=1e-8, atol=0):
            hint = "the exponent is −1/2: dense regions get *narrower* kernels"
        elif close(v, case.args[1] * pilot**-1.0, rtol=1e-8, atol=0):
            hint = "Abramson's law takes the square root: exponent −1/2, not −1"
        elif close(v / want, (v / want).mean().expand(len(want)), rtol=1e-8, atol=0):
            hint = (
                "right shape, wrong scale: divide p̃ by its geometric mean g, so the h_i "
                "have geometric mean h"
            )
        raise Mismatch(f"expected {fmt_vec(want)}, got {fmt_vec(v)}", hint)

    return run_check(
        "Abramson bandwidths", fn, cases, judge, "against localbook.abramson_bandwidths"
    )
