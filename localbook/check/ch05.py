"""Self-checks for chapter 5 (denoising): the modern Hopfield energy.

lb.check.ch05.hopfield_energy(my_hopfield_energy)
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, close, fmt, new_generator, run_check

__all__ = ["hopfield_energy"]


def _energy(xi, X, beta, *, lse=True, inv_beta=True, quad=True, sign=-1.0):
    s = beta * xi @ X.T
    t = torch.logsumexp(s, 1) if lse else torch.log(torch.exp(s).mean(1))
    return sign * t / (beta if inv_beta else 1.0) + (
        0.5 * (xi**2).sum(1) if quad else 0.0
    )


def hopfield_energy(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(xi, X, beta) -> (m,)``: the energy of each state (row of ``xi``).

    :math:`E(\xi) = -\beta^{-1}\log\sum_i e^{\beta\langle x_i,\xi\rangle} + \tfrac12\lVert\xi\rVert^2`
    with the stored patterns :math:`x_i` the rows of ``X``. Compared with the formula evaluated by
    ``torch.logsumexp`` on six random cases (float64, up to 784 dimensions, :math:`\beta` from 0.5
    to 50, one case whose scores :math:`\beta\langle x_i, \xi\rangle` exceed 2000, where a naive
    ``exp`` overflows). Wrong answers are compared with the energy without :math:`1/\beta`, without
    :math:`\tfrac12\lVert\xi\rVert^2`, with the wrong sign and with a mean instead of a sum.
    """
    g = new_generator(seed)
    cases = []
    for m, n, d, beta in [
        (1, 3, 2, 1.0),
        (5, 10, 4, 8.0),
        (7, 20, 16, 0.5),
        (3, 200, 784, 8.0),
        (6, 40, 8, 2.0),
        (4, 30, 50, 50.0),
    ]:
        X = torch.randn(n, d, generator=g, dtype=torch.float64)
        if d == 784:  # images: pixels in [0, 1], scaled like the chapter's patterns
            X = torch.rand(n, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        xi = X[torch.randint(n, (m,), generator=g)] + 0.3 * torch.randn(
            m, d, generator=g, dtype=torch.float64
        )
        cases.append(
            Case(
                (xi, X, beta),
                f"{m} states, {n} patterns in {d}-D, β = {beta:g}",
                {"want": _energy(xi, X, beta)},
            )
        )

    def judge(case, got):
        xi, X, beta = case.args
        m, n = xi.shape[0], X.shape[0]
        if got is None:
            raise Mismatch(
                "your function returned None", "did you forget the `return` statement?"
            )
        got = torch.as_tensor(got).detach().to(torch.float64)
        if tuple(got.shape) != (m,):
            hint = "return one energy per state (row of xi), a tensor of shape (m,)"
            if tuple(got.shape) == (n,) and n != m:
                hint = "you reduced over the states: the logsumexp runs over the patterns, dim=1 of xi @ X.T"
            elif got.numel() == m:
                hint = f"right number of entries: flatten it (e.g. `.reshape({m})`)"
            raise Mismatch(f"shape {tuple(got.shape)} returned, ({m},) expected", hint)
        want = case.extra["want"]
        scale = float(want.abs().max()) + 1.0
        if close(got, want, rtol=1e-9, atol=1e-9 * scale):
            return
        i = int(
            (~torch.isclose(got, want, rtol=1e-9, atol=1e-9 * scale)).nonzero()[0, 0]
        )
        msg = f"state {i}: expected {fmt(float(want[i]))}, got {fmt(float(got[i]))}"
        if not bool(torch.isfinite(got).all()):
            raise Mismatch(
                msg,
                "exp(β⟨x_i, ξ⟩) overflows for large scores: use torch.logsumexp, "
                "which subtracts the largest score first",
            )
        for kw, hint in [
            (
                {"inv_beta": False},
                "the log-sum-exp term is divided by β: −β⁻¹ log Σ_i e^{β⟨x_i, ξ⟩}",
            ),
            (
                {"quad": False},
                "the energy also has the convex part ½‖ξ‖² (half the squared norm of each state)",
            ),
            (
                {"sign": 1.0},
                "sign: the log-sum-exp term enters with a minus, E = −β⁻¹ lse + ½‖ξ‖²",
            ),
            (
                {"lse": False},
                "a sum over the patterns, not a mean: log Σ_i, which differs from log of "
                "the mean by log n",
            ),
        ]:
            if close(got, _energy(xi, X, beta, **kw), rtol=1e-9, atol=1e-9 * scale):
                raise Mismatch(msg, hint)
        raise Mismatch(
            msg,
            "E(ξ) = −β⁻¹ log Σ_i exp(β⟨x_i, ξ⟩) + ½‖ξ‖², the inner products are xi @ X.T",
        )

    return run_check(
        "hopfield_energy",
        fn,
        cases,
        judge,
        "up to 784-D, β from 0.5 to 50, scores large enough to overflow exp",
    )
