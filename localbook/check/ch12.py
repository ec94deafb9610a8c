"""Self-checks for chapter 12 (imputation): KNNImputer as a rank-kernel local mean.

lb.check.ch12.knn_fill(my_knn_fill)
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from ._common import Case, Mismatch, fmt, new_generator, run_check

__all__ = ["knn_fill"]


def knn_fill(fn: Callable, *, seed: Optional[int] = None) -> bool:
    r"""Check ``fn(X, i, n_neighbors) -> (P,)``: image ``i`` of ``X`` completed as ``KNNImputer`` does.

    ``X (n, P)`` is a NumPy array with ``NaN`` for missing pixels. The answer keeps the observed
    pixels of row ``i`` and fills each missing pixel ``p`` with the mean of :math:`x_{jp}` over the
    ``n_neighbors`` rows nearest to row ``i`` in the ``nan_euclidean`` distance *among the rows
    that observe* ``p`` — scikit-learn's ``KNNImputer(n_neighbors, weights="uniform")``, whose
    output is the reference. Six random cases (20 to 80 rows, 10 to 64 pixels, 10 % to 60 %
    missing, 1 to 7 neighbours). Wrong answers are compared with the mean over the nearest rows
    whether or not they observe ``p``, distances with missing values read as 0, the column mean
    and the same rule with the wrong number of neighbours.
    """
    from sklearn.impute import KNNImputer
    from sklearn.metrics.pairwise import nan_euclidean_distances

    g = new_generator(seed)
    cases = []
    for n, P, frac, k in [
        (20, 10, 0.1, 1),
        (40, 16, 0.3, 5),
        (60, 25, 0.5, 3),
        (30, 64, 0.6, 5),
        (80, 20, 0.4, 7),
        (50, 12, 0.2, 5),
    ]:
        base = torch.rand(n, 1, generator=g, dtype=torch.float64)
        X = (base + 0.5 * torch.rand(n, P, generator=g, dtype=torch.float64)).numpy()
        miss = (torch.rand(n, P, generator=g) < frac).numpy()
        miss[:, miss.sum(0) > n - k - 2] = False  # every pixel keeps more than k donors
        i = int(torch.randint(n, (1,), generator=g))
        miss[i, :2] = True  # row i misses at least two pixels
        X[miss] = np.nan
        want = KNNImputer(n_neighbors=k).fit_transform(X)[i]
        cases.append(
            Case(
                (X, i, k),
                f"{n} rows, {P} pixels, {frac:.0%} missing, row {i}, {k} neighbours",
                {"want": want},
            )
        )

    def others(X, i, k, *, donors_only=True, zero=False, kk=None):
        kk = k if kk is None else kk
        if zero:
            Z = np.nan_to_num(X)
            D = np.sqrt(((Z - Z[i]) ** 2).sum(1))
        else:
            D = nan_euclidean_distances(X[i : i + 1], X)[0]
        D[i] = np.inf
        out = X[i].copy()
        for p in np.flatnonzero(np.isnan(X[i])):
            rows = (
                np.flatnonzero(~np.isnan(X[:, p])) if donors_only else np.arange(len(X))
            )
            rows = rows[rows != i]
            near = rows[np.argsort(D[rows], kind="stable")[:kk]]
            out[p] = (
                np.nanmean(X[near, p]) if not np.isnan(X[near, p]).all() else np.nan
            )
        return out

    def judge(case, got):
        X, i, k = case.args
        P = X.shape[1]
        if got is None:
            raise Mismatch(
                "your function returned None", "did you forget the `return` statement?"
            )
        if isinstance(got, torch.Tensor):
            got = got.detach().cpu().numpy()
        got = np.asarray(got, dtype=float)
        if got.shape != (P,):
            miss = int(np.isnan(X[i]).sum())
            hint = "return the whole row i (all P pixels), its missing ones filled"
            if got.size == miss:
                hint = (
                    "you returned only the filled values: return the whole row i, observed "
                    "pixels unchanged"
                )
            raise Mismatch(f"shape {got.shape} returned, ({P},) expected", hint)
        want = case.extra["want"]
        ok = np.isclose(got, want, rtol=1e-9, atol=1e-12)
        if ok.all():
            return
        p = int(np.flatnonzero(~ok)[0])
        msg = f"pixel {p}: expected {fmt(float(want[p]))}, got {fmt(float(got[p]))}"
        if not np.isnan(X[i, p]):
            raise Mismatch(
                msg + " (an observed pixel)",
                "keep the observed pixels of row i as they are",
            )
        if np.isnan(got).any():
            raise Mismatch(
                msg,
                "every missing pixel gets a value: take the nearest rows *among those that "
                "observe pixel p* (the donors); a NaN means a row you averaged does not observe p",
            )
        for value, hint in [
            (
                others(X, i, k, donors_only=False),
                "take the nearest rows *among those that observe pixel p* (the donors), a new set for "
                "every pixel, not the k nearest rows overall",
            ),
            (
                others(X, i, k, zero=True),
                "use the nan_euclidean distance (only the coordinates both rows observe, rescaled), "
                "not missing values read as 0",
            ),
            (
                np.where(np.isnan(X[i]), np.nanmean(X, 0), X[i]),
                "this is the column mean (SimpleImputer); average only the nearest donors",
            ),
            (
                others(X, i, k, kk=k + 1),
                f"one neighbour too many: average n_neighbors = {k} donors",
            ),
            (
                others(X, i, k, kk=max(k - 1, 1)) if k > 1 else None,
                f"one neighbour too few: average n_neighbors = {k} donors",
            ),
        ]:
            if value is not None and np.allclose(got, value, rtol=1e-9, atol=1e-12):
                raise Mismatch(msg, hint)
        raise Mismatch(
            msg,
            "for each missing p: the donors are the rows observing p; sort them by "
            "nan_euclidean distance to row i and average p over the first n_neighbors",
        )

    return run_check(
        "knn_fill",
        fn,
        cases,
        judge,
        "10 % to 60 % missing, 1 to 7 neighbours, against sklearn's KNNImputer",
    )
