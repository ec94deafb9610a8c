"""Self-checks for chapter 7 (attention): the kernel-smoothed bigram model.

lb.check.ch07.kernel_bigram(my_kernel_bigram)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import Case, Mismatch, close, fmt, new_generator, run_check

__all__ = ["kernel_bigram"]


def kernel_bigram(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(K, C) -> (V, V)``: the local mean over positions with a kernel between tokens.

    ``K`` is a positive ``(V, V)`` kernel between current tokens, ``C`` the bigram counts
    :math:`C_{ab} = \#\{s : x_s = a, x_{s+1} = b\}` of a token sequence (as
    :func:`localbook.bigram_counts`). Row ``a`` of the answer must be
    :math:`\sum_s K(a, x_s)\, e_{x_{s+1}} / \sum_s K(a, x_s)`, which the check computes by brute
    force over the positions of a random sequence (six cases, :math:`V` from 2 to 40, asymmetric
    kernels, tokens that never occur). Wrong answers are compared with :math:`K^\top C`,
    :math:`CK`, the plain bigram model, the unnormalized :math:`KC` and a normalization by the
    row sums of ``K`` to give a hint.
    """
    from ..language import bigram_counts

    g = new_generator(seed)
    cases = []
    for V, T in [(2, 30), (5, 200), (12, 500), (26, 3000), (40, 800), (8, 60)]:
        probs = torch.rand(V, generator=g, dtype=torch.float64) ** 2
        probs[-1] = 0.0  # one token never occurs
        ids = torch.multinomial(probs, T, replacement=True, generator=g)
        K = torch.rand(V, V, generator=g, dtype=torch.float64) + 0.01
        C = bigram_counts(ids, V).to(torch.float64)
        Kp = K[:, ids[:-1]]  # (V, T - 1): K(a, x_s)
        onehot = torch.nn.functional.one_hot(ids[1:], V).to(torch.float64)
        want = (Kp @ onehot) / Kp.sum(1, keepdim=True)
        cases.append(Case((K, C), f"V = {V}, {T} tokens", {"want": want}))

    def judge(case, got):
        K, C = case.args
        V = K.shape[0]
        if got is None:
            raise Mismatch(
                "your function returned None", "did you forget the `return` statement?"
            )
        got = torch.as_tensor(got).detach().to(torch.float64)
        if tuple(got.shape) != (V, V):
            raise Mismatch(
                f"shape {tuple(got.shape)} returned, ({V}, {V}) expected",
                "one row of next-token probabilities per current token a",
            )
        want = case.extra["want"]
        if close(got, want, rtol=1e-9, atol=1e-12):
            return
        bad = ~torch.isclose(got, want, rtol=1e-9, atol=1e-12) | ~torch.isfinite(got)
        a, b = (int(v) for v in bad.nonzero()[0])
        msg = f"entry [{a}, {b}]: expected {fmt(float(want[a, b]))}, got {fmt(float(got[a, b]))}"
        n = C.sum(1)

        def rows(M):
            return M / M.sum(1, keepdim=True)

        for value, hint in [
            (
                rows(K.T @ C),
                "K(a, a') weighs the count row of a' for the current token a: (K C), "
                "not Kᵀ C",
            ),
            (
                rows(C @ K),
                "the kernel acts on the current token (the rows of C): K C, not C K",
            ),
            (
                C / n[:, None],
                "this is the plain bigram model (the delta kernel); "
                "smooth the count rows with K first",
            ),
            (
                K @ C,
                "normalize: divide row a by Σ_s K(a, x_s) = (K n)_a with n_a' = Σ_b C_a'b",
            ),
            (
                (K @ C) / K.sum(1, keepdim=True),
                "the denominator weights each token by how often it "
                "occurs: (K n)_a with n the row sums of C, "
                "not the row sums of K",
            ),
        ]:
            if torch.allclose(got, value, rtol=1e-9, atol=1e-12, equal_nan=True):
                raise Mismatch(msg, hint)
        if not bool(torch.isfinite(got).all()):
            raise Mismatch(
                msg,
                "a token that never occurs still gets a prediction: (K n)_a > 0 "
                "since K is positive — divide by it, not by n_a",
            )
        raise Mismatch(
            msg,
            "group the positions by their token: Σ_s K(a, x_s) e_{x_{s+1}} = (K C)_a·",
        )

    return run_check(
        "kernel_bigram",
        fn,
        cases,
        judge,
        "V from 2 to 40, asymmetric kernels, against sums over positions",
    )
