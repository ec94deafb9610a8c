"""Self-checks for chapter 11 (embeddings): the regularized LLE weights of one point.

lb.check.ch11.lle_point_weights(my_lle_point_weights)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_vector, close, fmt, new_generator, run_check

__all__ = ["lle_point_weights"]


def _weights(G, eps):
    C = G @ G.T + eps * torch.eye(G.shape[0], dtype=G.dtype)
    v = torch.linalg.solve(C, torch.ones(G.shape[0], dtype=G.dtype))
    return v / v.sum()


def lle_point_weights(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(G, reg) -> (m,)``: the LLE weights of one point from its neighbour differences.

    ``G (m, d)`` has rows :math:`x_j - x_i` for the ``m`` neighbours of point :math:`x_i`; the
    answer must be :math:`w = C^{-1}\mathbf 1 / (\mathbf 1^\top C^{-1}\mathbf 1)` with
    :math:`C = GG^\top + \varepsilon I`, :math:`\varepsilon = \text{reg}\cdot\operatorname{tr}(GG^\top)`
    — the row of :func:`localbook.lle_weights` for that point, which the check uses as the
    reference. Six random point clouds with :math:`m > d + 1` (where :math:`GG^\top` is singular),
    :math:`m = d + 1` and :math:`m < d`, ``reg`` from :math:`10^{-3}` to :math:`10^{-1}`. Wrong
    answers are tested for summing to one, for an :math:`\varepsilon` not scaled by the trace and
    for a missing regularizer.
    """
    from ..embedding import lle_weights

    g = new_generator(seed)
    cases = []
    for n, d, m, reg, scale in [
        (50, 2, 6, 1e-3, 1.0),
        (30, 3, 4, 1e-3, 10.0),
        (40, 5, 10, 1e-2, 0.1),
        (25, 10, 5, 1e-3, 1.0),
        (60, 2, 12, 1e-1, 3.0),
        (35, 4, 8, 1e-3, 0.01),
    ]:
        x = scale * torch.randn(n, d, generator=g, dtype=torch.float64)
        w, idx = lle_weights(x, n_neighbors=m, reg=reg)
        i = int(torch.randint(n, (1,), generator=g))
        G = x[idx[i]] - x[i]
        cases.append(
            Case(
                (G, reg),
                f"m = {m} neighbours in {d}-D, reg = {reg:g}, scale {scale:g}",
                {"want": w[i]},
            )
        )

    def judge(case, got):
        G, reg = case.args
        m = G.shape[0]
        if (
            got is not None
            and torch.as_tensor(got).ndim == 1
            and len(got) == G.shape[1] != m
        ):
            raise Mismatch(
                f"{len(got)} entries returned, {m} expected (one per neighbour)",
                "C = G Gᵀ is m × m (neighbours × neighbours), not the d × d matrix Gᵀ G",
            )
        got = as_vector(got, m, like=G)
        want = case.extra["want"]
        if close(got, want, rtol=1e-7, atol=1e-9):
            return
        bad = ~torch.isclose(got, want, rtol=1e-7, atol=1e-9) | ~torch.isfinite(got)
        j = int(bad.nonzero()[0, 0])
        msg = f"weight {j}: expected {fmt(float(want[j]))}, got {fmt(float(got[j]))}"
        if not bool(torch.isfinite(got).all()) or got.abs().max() > 1e6:
            raise Mismatch(
                msg,
                "G Gᵀ is singular when m > d: add ε I with ε = reg · tr(G Gᵀ) "
                "before solving",
            )
        if abs(float(got.sum()) - 1) > 1e-6:
            raise Mismatch(
                msg + f" (sum {fmt(float(got.sum()))})",
                "normalize: w = C⁻¹1 / (1ᵀ C⁻¹ 1), so the weights sum to one",
            )
        tr = float(torch.trace(G @ G.T))
        if close(got, _weights(G, reg), rtol=1e-7, atol=1e-9):
            raise Mismatch(
                msg,
                "scale the regularizer with the neighbourhood: ε = reg · tr(G Gᵀ), "
                "not reg itself",
            )
        if close(got, _weights(G, reg * tr / m), rtol=1e-7, atol=1e-9):
            raise Mismatch(
                msg, "ε = reg · tr(G Gᵀ), the trace itself, not the trace divided by m"
            )
        raise Mismatch(
            msg, "solve (G Gᵀ + ε I) v = 1 with ε = reg · tr(G Gᵀ), then w = v / Σ v"
        )

    return run_check(
        "lle_point_weights",
        fn,
        cases,
        judge,
        "singular G Gᵀ (m > d + 1), m = d + 1 and m < d, against lb.lle_weights",
    )
