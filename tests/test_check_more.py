"""Self-checks of the chapters on denoising, attention, memorization, embeddings and imputation
(localbook.check.ch05, ch05, ch08, ch09, ch10): a right answer passes, typical wrong answers fail
with a specific hint, a stub says "not implemented yet", and strict mode raises."""

import numpy as np
import pytest
import torch
from sklearn.metrics.pairwise import nan_euclidean_distances

import localbook as lb


@pytest.fixture(autouse=True)
def friendly(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "0")


def stub(*args, **kwargs):
    raise NotImplementedError


# --- ch04: Hopfield energy -------------------------------------------------------------------
def he_right(xi, X, beta):
    return -torch.logsumexp(beta * xi @ X.T, dim=1) / beta + 0.5 * (xi**2).sum(1)


def he_naive(xi, X, beta):  # overflows for large scores
    return -torch.log(torch.exp(beta * xi @ X.T).sum(1)) / beta + 0.5 * (xi**2).sum(1)


def he_no_inv_beta(xi, X, beta):
    return -torch.logsumexp(beta * xi @ X.T, dim=1) + 0.5 * (xi**2).sum(1)


def he_no_quad(xi, X, beta):
    return -torch.logsumexp(beta * xi @ X.T, dim=1) / beta


def he_wrong_dim(xi, X, beta):
    return -torch.logsumexp(beta * xi @ X.T, dim=0) / beta


# --- ch05: kernel-smoothed bigram ------------------------------------------------------------
def kb_right(K, C):
    return (K @ C) / (K @ C.sum(1))[:, None]


def kb_row_normalized(K, C):  # the same thing: the rows of K C sum to (K n)_a
    M = K @ C
    return M / M.sum(1, keepdim=True)


def kb_transposed(K, C):
    return (K.T @ C) / (K.T @ C.sum(1))[:, None]


def kb_kernel_rowsum(K, C):
    return (K @ C) / K.sum(1, keepdim=True)


def kb_unnormalized(K, C):
    return K @ C


# --- ch08: leave-one-out residuals of interpolation -----------------------------------------
def loo_right(Phi, g):
    return torch.diagonal(lb.stability(Phi, g, None, Phi))


def loo_closed_form(Phi, g):
    Kinv = torch.linalg.inv(Phi @ Phi.T)
    return (Kinv @ g) / Kinv.diagonal()


def loo_no_division(Phi, g):
    return torch.linalg.solve(Phi @ Phi.T, g)


def loo_in_sample(Phi, g):
    return g - Phi @ lb.min_norm_fit(Phi, g)


def loo_predictions(Phi, g):
    return g - loo_right(Phi, g)


# --- ch09: LLE weights of one point ----------------------------------------------------------
def lle_right(G, reg):
    C = G @ G.T
    C = C + reg * torch.trace(C) * torch.eye(len(G), dtype=G.dtype)
    v = torch.linalg.solve(C, torch.ones(len(G), dtype=G.dtype))
    return v / v.sum()


def lle_unnormalized(G, reg):
    C = G @ G.T
    C = C + reg * torch.trace(C) * torch.eye(len(G), dtype=G.dtype)
    return torch.linalg.solve(C, torch.ones(len(G), dtype=G.dtype))


def lle_unscaled_eps(G, reg):
    C = G @ G.T + reg * torch.eye(len(G), dtype=G.dtype)
    v = torch.linalg.solve(C, torch.ones(len(G), dtype=G.dtype))
    return v / v.sum()


def lle_gram_dxd(G, reg):
    C = G.T @ G
    C = C + reg * torch.trace(C) * torch.eye(G.shape[1], dtype=G.dtype)
    v = torch.linalg.solve(C, torch.ones(G.shape[1], dtype=G.dtype))
    return v / v.sum()


# --- ch10: KNNImputer by hand ----------------------------------------------------------------
def _knn(X, i, k, donors_only=True):
    D = nan_euclidean_distances(X[i : i + 1], X)[0]
    D[i] = np.inf
    out = X[i].copy()
    for p in np.flatnonzero(np.isnan(X[i])):
        rows = np.flatnonzero(~np.isnan(X[:, p])) if donors_only else np.arange(len(X))
        near = rows[np.argsort(D[rows], kind="stable")[:k]]
        out[p] = np.nanmean(X[near, p])
    return out


def knn_right(X, i, n_neighbors=5):
    return _knn(X, i, n_neighbors)


def knn_any_rows(X, i, n_neighbors=5):
    return _knn(X, i, n_neighbors, donors_only=False)


def knn_column_mean(X, i, n_neighbors=5):
    return np.where(np.isnan(X[i]), np.nanmean(X, 0), X[i])


def knn_too_many(X, i, n_neighbors=5):
    return _knn(X, i, n_neighbors + 1)


def knn_only_missing(X, i, n_neighbors=5):
    return _knn(X, i, n_neighbors)[np.isnan(X[i])]


def knn_torch(X, i, n_neighbors=5):  # a tensor is accepted
    return torch.as_tensor(_knn(X, i, n_neighbors))


CHECKS = {
    "hopfield_energy": (lb.check.ch05.hopfield_energy, [he_right]),
    "kernel_bigram": (lb.check.ch07.kernel_bigram, [kb_right, kb_row_normalized]),
    "loo_residuals": (lb.check.ch10.loo_residuals, [loo_right, loo_closed_form]),
    "lle_point_weights": (lb.check.ch11.lle_point_weights, [lle_right]),
    "knn_fill": (lb.check.ch12.knn_fill, [knn_right, knn_torch]),
}

SLIPS = [
    ("hopfield_energy", he_naive, "logsumexp"),
    ("hopfield_energy", he_no_inv_beta, "divided by β"),
    ("hopfield_energy", he_no_quad, "½‖ξ‖²"),
    ("hopfield_energy", he_wrong_dim, "reduced over the states"),
    ("kernel_bigram", kb_transposed, "not Kᵀ C"),
    ("kernel_bigram", kb_kernel_rowsum, "not the row sums of K"),
    ("kernel_bigram", kb_unnormalized, "normalize"),
    ("kernel_bigram", lambda K, C: C / C.sum(1, keepdim=True), "plain bigram model"),
    ("loo_residuals", loo_no_division, "divide [K⁻¹G]_i by the diagonal"),
    ("loo_residuals", loo_in_sample, "in-sample residuals"),
    ("loo_residuals", loo_predictions, "leave-one-out predictions"),
    ("lle_point_weights", lle_unnormalized, "sum to one"),
    ("lle_point_weights", lle_unscaled_eps, "not reg itself"),
    ("lle_point_weights", lle_gram_dxd, "not the d × d matrix"),
    ("knn_fill", knn_any_rows, "among those that observe pixel p"),
    ("knn_fill", knn_column_mean, "column mean"),
    ("knn_fill", knn_too_many, "one neighbour too many"),
    ("knn_fill", knn_only_missing, "only the filled values"),
]


@pytest.mark.parametrize(
    "name, fn",
    [(n, f) for n, (_, fs) in CHECKS.items() for f in fs],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_right_answer_passes(name, fn, capsys):
    assert CHECKS[name][0](fn) is True
    assert f"✓ {name}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, fn, hint",
    SLIPS,
    ids=[f"{n}-{getattr(f, '__name__', 'lambda')}" for n, f, _ in SLIPS],
)
def test_typical_slips_fail_with_a_hint(name, fn, hint, capsys):
    assert CHECKS[name][0](fn) is False
    out = capsys.readouterr().out
    assert f"✗ {name}" in out and hint in out, out


@pytest.mark.parametrize("name", CHECKS)
def test_stub_says_not_implemented(name, capsys):
    assert CHECKS[name][0](stub) is False
    assert "not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize("name", CHECKS)
def test_strict_mode_raises(name, monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "1")
    wrong = {n: f for n, f, _ in reversed(SLIPS)}[name]
    with pytest.raises(AssertionError, match=f"✗ {name}"):
        CHECKS[name][0](wrong)
    with pytest.raises(NotImplementedError):
        CHECKS[name][0](stub)


@pytest.mark.parametrize("name", CHECKS)
def test_seeded_checks_are_reproducible(name, capsys):
    check, (right, *_) = CHECKS[name]
    assert check(right, seed=3) and check(right, seed=3)


def test_registered():
    for mod in ("ch05", "ch07", "ch10", "ch11", "ch12"):
        assert mod in lb.check.__all__ and hasattr(lb.check, mod)
