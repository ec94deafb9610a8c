"""Self-checks for chapter 8 (entmax): sparsemax as a Euclidean projection onto the simplex.

lb.check.ch08.sparsemax(my_sparsemax)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, as_vector, close, fmt, new_generator, run_check

__all__ = ["sparsemax"]


def sparsemax(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(z) -> (n,)`` for a 1-D tensor ``z``: :math:`\mathrm{sparsemax}(z) = [z - \tau]_+`.

    :math:`\tau` makes the output sum to one (the Euclidean projection of ``z`` onto the
    probability simplex). Compared with :func:`localbook.sparsemax` on six random cases: small and
    long vectors, ties, a dominant entry (output one-hot) and nearly equal scores (full support).
    Wrong answers are tested for summing to one, negativity and a softmax mix-up for a hint.
    """
    from ..entmax import sparsemax as reference

    g = new_generator(seed)
    zs = [
        ("n = 3", torch.randn(3, generator=g, dtype=torch.float64)),
        ("n = 10", 2 * torch.randn(10, generator=g, dtype=torch.float64)),
        ("n = 200", torch.randn(200, generator=g, dtype=torch.float64)),
        ("ties", torch.tensor([1.0, 1.0, 0.2, -0.5, 1.0], dtype=torch.float64)),
        (
            "one dominant score",
            torch.tensor([5.0, 0.1, -0.3, 0.0], dtype=torch.float64),
        ),
        (
            "nearly equal scores",
            0.01 * torch.randn(8, generator=g, dtype=torch.float64),
        ),
    ]
    cases = [Case((z,), what, {"want": reference(z)}) for what, z in zs]

    def judge(case, got):
        (z,) = case.args
        got = as_vector(got, len(z), like=z)
        want = case.extra["want"]
        if close(got, want):
            return
        bad = ~torch.isclose(got, want, rtol=1e-6, atol=1e-8) | ~torch.isfinite(got)
        i = int(bad.nonzero()[0, 0])
        msg = f"entry {i}: expected {fmt(float(want[i]))}, got {fmt(float(got[i]))}"
        if close(got, torch.softmax(z, 0)):
            raise Mismatch(
                msg,
                "this is softmax; sparsemax thresholds instead: p_i = max(z_i − τ, 0)",
            )
        if bool((got < -1e-12).any()):
            raise Mismatch(
                msg + " (negative entries)", "clip at zero: p_i = max(z_i − τ, 0)"
            )
        if abs(float(got.sum()) - 1) > 1e-6:
            raise Mismatch(
                msg + f" (sum {fmt(float(got.sum()))})",
                "τ must make the output sum to one: τ = (Σ_{j ≤ k} z_(j) − 1)/k, with k the "
                "support size, the largest k with 1 + k·z_(k) > Σ_{j ≤ k} z_(j)",
            )
        raise Mismatch(
            msg,
            "the support is the largest k with 1 + k·z_(k) > Σ_{j ≤ k} z_(j) (scores sorted decreasingly)",
        )

    return run_check(
        "sparsemax", fn, cases, judge, "ties, one-hot and full-support cases"
    )
