"""Self-checks for chapter 10 (memorization): leave-one-out residuals of interpolation.

lb.check.ch10.loo_residuals(my_loo_residuals)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_vector, close, fmt, new_generator, run_check

__all__ = ["loo_residuals"]


def loo_residuals(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(Phi, g) -> (N,)``: all leave-one-out residuals of min-norm interpolation.

    ``Phi (N, p)`` holds the features of ``N ≤ p`` samples, ``g (N,)`` their labels; entry ``i``
    must be :math:`g_i - f(z_i, \theta^*_{-i})`, where :math:`\theta^*_{-i}` interpolates all
    samples but ``i`` with minimal norm. The check computes it by brute force, ``N`` refits with
    :func:`localbook.min_norm_fit` (six cases, ``N`` from 3 to 40, ``p`` from ``N + 3`` to
    ``4N``, Gaussian and ReLU features). Wrong answers are compared with the in-sample residuals
    (all zero: the model interpolates), :math:`[K^{-1}G]_i` without its division by
    :math:`[K^{-1}]_{ii}`, a division by :math:`K_{ii}`, the flipped sign and the leave-one-out
    predictions.
    """
    from ..memorization import min_norm_fit

    g = new_generator(seed)
    cases = []
    for N, p, relu in [
        (3, 12, False),
        (10, 30, True),
        (20, 23, False),
        (25, 100, True),
        (40, 160, False),
        (15, 60, True),
    ]:
        Phi = torch.randn(N, p, generator=g, dtype=torch.float64)
        if relu:  # random ReLU features of Gaussian inputs, as in the chapter
            Z = torch.randn(N, 8, generator=g, dtype=torch.float64)
            W = torch.randn(p, 8, generator=g, dtype=torch.float64) / 8**0.5
            Phi = torch.relu(Z @ W.T) / p**0.5
        y = torch.sign(torch.randn(N, generator=g, dtype=torch.float64))
        keep = ~torch.eye(N, dtype=torch.bool)
        pred = torch.stack(
            [Phi[i] @ min_norm_fit(Phi[keep[i]], y[keep[i]]) for i in range(N)]
        )
        K = Phi @ Phi.T
        tol = (
            1e3
            * torch.finfo(K.dtype).eps
            * float(torch.linalg.cond(K))
            * (1 + float(pred.abs().max()))
        )
        kind = "ReLU" if relu else "Gaussian"
        cases.append(
            Case(
                (Phi, y),
                f"N = {N}, p = {p}, {kind} features",
                {"pred": pred, "tol": tol, "K": K},
            )
        )

    def judge(case, got):
        Phi, y = case.args
        N = len(y)
        got = as_vector(got, N, like=y)
        pred, tol, K = case.extra["pred"], case.extra["tol"], case.extra["K"]
        want = y - pred
        if close(got, want, rtol=0, atol=tol):
            return
        bad = ~(torch.abs(got - want) <= tol)
        i = int(bad.nonzero()[0, 0])
        msg = (
            f"entry {i}: expected {fmt(float(want[i]))}, got {fmt(float(got[i]))} "
            f"({int(bad.sum())} of {N} entries differ)"
        )
        Kinv = torch.linalg.inv(K)
        a = Kinv @ y
        for value, hint in [
            (
                torch.zeros_like(y),
                "these are the in-sample residuals, all 0 because the model "
                "interpolates; leave sample i out: S_{z_i}(z_i) = [K⁻¹G]_i / [K⁻¹]_ii",
            ),
            (a, "divide [K⁻¹G]_i by the diagonal entry [K⁻¹]_ii"),
            (
                a / K.diagonal(),
                "divide by [K⁻¹]_ii, the diagonal of the inverse, not by K_ii",
            ),
            (-want, "sign: the residual is g_i − f(z_i, θ*₋ᵢ), not f(z_i, θ*₋ᵢ) − g_i"),
            (
                pred,
                "these are the leave-one-out predictions f(z_i, θ*₋ᵢ); the check wants "
                "the residuals g_i − f(z_i, θ*₋ᵢ)",
            ),
        ]:
            if close(got, value, rtol=0, atol=tol * (1 + float(value.abs().max()))):
                raise Mismatch(msg, hint)
        raise Mismatch(
            msg,
            "with K = Φ Φᵀ: S_{z_i}(z_i) = [K⁻¹G]_i / [K⁻¹]_ii, or the diagonal "
            "of lb.stability(Phi, g, None, Phi)",
        )

    return run_check(
        "loo_residuals",
        fn,
        cases,
        judge,
        "N from 3 to 40, against N brute-force refits each",
    )
