"""Tests for localbook.metric: MLKR loss and fitting, Abramson / sample-point and balloon KDEs."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import localbook as lb

F64 = torch.float64


def direct_loss(A, x, y):
    """Σ_i (y_i − ŷ_{-i})², with explicit loops over i and j."""
    n = x.shape[0]
    y = y.reshape(n, -1)
    total = 0.0
    for i in range(n):
        num, den = torch.zeros(y.shape[1], dtype=F64), 0.0
        for j in range(n):
            if j == i:
                continue
            k = math.exp(-0.5 * float(((A @ (x[i] - x[j])) ** 2).sum()))
            num += k * y[j]
            den += k
        total += float(((y[i] - num / den) ** 2).sum())
    return total


def data(n=30, d=3, seed=0, p=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=F64)
    if p is not None:
        y = torch.stack([y * (c + 1) for c in range(p)], 1)
    return x, y


@pytest.mark.parametrize("k,p", [(3, None), (2, None), (1, 2), (4, None)])
def test_mlkr_loss_matches_direct_formula(k, p):
    x, y = data(p=p)
    A = torch.randn(k, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    got = float(lb.mlkr_loss(A, x, y))
    assert got == pytest.approx(direct_loss(A, x, y), rel=1e-10)


def test_mlkr_loss_chunked_equals_unchunked_and_gradients_agree():
    x, y = data(n=50)
    A = torch.randn(2, 3, dtype=F64, requires_grad=True)
    big = lb.mlkr_loss(A, x, y)
    (g_big,) = torch.autograd.grad(big, A)
    small = lb.mlkr_loss(
        A, x, y, budget=4 * 50 * 16 * 3
    )  # several chunks: checkpointed
    (g_small,) = torch.autograd.grad(small, A)
    torch.testing.assert_close(small, big, rtol=1e-12, atol=0)
    torch.testing.assert_close(g_small, g_big, rtol=1e-10, atol=1e-12)


def test_mlkr_gradcheck_and_closed_form():
    x, y = data(n=12)
    A = torch.randn(2, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: lb.mlkr_loss(a, x, y), (A,))
    assert torch.autograd.gradcheck(lambda a: lb.mlkr_loss(a, x, y, budget=200), (A,))
    # the derived gradient 2A Σ_ij w_ij r_i (y_j − ŷ_i) d_ij d_ijᵀ
    with torch.no_grad():
        D = x[:, None, :] - x[None, :, :]
        logw = -0.5 * ((D @ A.T) ** 2).sum(-1)
        logw.fill_diagonal_(-math.inf)
        W = torch.softmax(logw, 1)
        yhat = W @ y
        r = y - yhat
        C = W * r[:, None] * (y[None, :] - yhat[:, None])
        G = 2 * A @ torch.einsum("ij,ija,ijb->ab", C, D, D)
    (auto,) = torch.autograd.grad(lb.mlkr_loss(A, x, y), A)
    torch.testing.assert_close(auto, G, rtol=1e-9, atol=1e-11)


def test_rotation_invariance_and_isotropic_case_is_loo_cv():
    x, y = data(n=40)
    A = torch.randn(3, 3, dtype=F64)
    Q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=F64))
    torch.testing.assert_close(
        lb.mlkr_loss(Q @ A, x, y), lb.mlkr_loss(A, x, y), rtol=1e-11, atol=0
    )
    for h in (0.3, 1.0):
        want = 40 * lb.loo_cv_score(x, y, h)
        # the shortcut divides by 1 − L_ii: rounding grows by 1 / min(1 − L_ii)
        L_ii = 1 / lb.kernel_matrix(x, x, h).sum(1)
        rel = 100 * 40 * torch.finfo(F64).eps / float((1 - L_ii).min())
        got = float(lb.mlkr_loss(torch.eye(3, dtype=F64) / h, x, y))
        assert got == pytest.approx(want, rel=rel)
        assert got == pytest.approx(
            direct_loss(torch.eye(3, dtype=F64) / h, x, y), rel=1e-11
        )


@given(st.integers(0, 10_000))
def test_mlkr_loss_property_direct(seed):
    x, y = data(n=8, d=2, seed=seed)
    A = torch.randn(2, 2, generator=torch.Generator().manual_seed(seed), dtype=F64)
    assert float(lb.mlkr_loss(A, x, y)) == pytest.approx(
        direct_loss(A, x, y), rel=1e-9, abs=1e-12
    )


def test_far_point_gets_nearest_neighbour_value():
    x = torch.tensor([[0.0], [1.0], [1e3]], dtype=F64)
    y = torch.tensor([1.0, 2.0, 5.0], dtype=F64)
    loss = lb.mlkr_loss(torch.eye(1, dtype=F64) * 10, x, y)
    assert torch.isfinite(loss)
    assert float(loss) == pytest.approx((1 - 2) ** 2 + (2 - 1) ** 2 + (5 - 2) ** 2)


def _make(n, d, seed, case):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64)
    f = (
        torch.sin(2 * x[:, 0]) + x[:, 1] ** 2 / 2
        if case == "few"
        else torch.sin(x).sum(1)
    )
    return x, f + 0.3 * torch.randn(n, generator=g, dtype=F64)


def _ratio(case, d, seed, n=300, **kw):
    x, y = _make(n + 1500, d, seed, case)
    xtr, ytr, xte, yte = x[:n], y[:n], x[n:], y[n:]
    h = lb.select_bandwidth(xtr, ytr).bandwidth
    err = lambda A: float(
        ((lb.nadaraya_watson(xte @ A.T, xtr @ A.T, ytr, 1.0) - yte) ** 2).mean()
    )
    A = lb.fit_metric(xtr, ytr, **kw)
    return err(A) / err(torch.eye(d, dtype=F64) / h), A


def test_fit_metric_far_better_when_few_features_matter():
    ratios = [_ratio("few", 10, s)[0] for s in range(3)]
    assert max(ratios) < 0.6


def test_fit_metric_no_worse_when_every_feature_matters():
    ratios = [_ratio("iso", 4, s)[0] for s in range(4)]
    # measured spread of single ratios about 0.03: allow a 5 % loss on any one, none on average
    assert max(ratios) < 1.05 and np.mean(ratios) < 1.0


def test_fit_metric_shapes_low_rank_and_determinism():
    r, A = _ratio("few", 6, 0, n=200, n_components=2)
    assert A.shape == (2, 6) and r < 0.7
    x, y = _make(100, 4, 1, "few")
    torch.testing.assert_close(lb.fit_metric(x, y, seed=3), lb.fit_metric(x, y, seed=3))
    A2 = lb.fit_metric(x, y, early_stopping=False, max_iter=5)
    assert A2.shape == (4, 4) and torch.isfinite(A2).all()


def _recording_lbfgs(monkeypatch):
    """Replace torch.optim.LBFGS by a subclass that records its instances."""
    made = []

    class Recording(torch.optim.LBFGS):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.optim, "LBFGS", Recording)
    return made


def test_fit_metric_without_early_stopping_runs_max_iter_lbfgs_iterations(monkeypatch):
    # regression: torch's default max_eval (max_iter * 5 // 4 = 1 when the optimizer is built
    # for one iteration) stopped the no-early-stopping run after a single iteration
    made = _recording_lbfgs(monkeypatch)
    x, y = _make(60, 5, 0, "few")
    A0 = lb.metric._initial_metric(x, y)
    A = lb.fit_metric(x, y, early_stopping=False, max_iter=30)
    state = made[-1].state[made[-1].param_groups[0]["params"][0]]
    assert state["n_iter"] == 30 and state["func_evals"] >= 30
    # 30 iterations lower the LOO loss far more than one does (measured 0.65 -> 0.28;
    # one iteration, the bug, reached 0.55)
    start, end = float(lb.mlkr_loss(A0, x, y)), float(lb.mlkr_loss(A, x, y))
    assert end < 0.6 * start


def test_fit_metric_early_stopping_follows_the_plain_lbfgs_path(monkeypatch):
    # with check_every = 1 and a patience that never triggers, the iterates that early
    # stopping inspects are those of one uninterrupted L-BFGS run on the fitting points
    # (regression: with max_eval = 1 the strong-Wolfe line search had no evaluations)
    seen = []
    validation_error = lb.metric._validation_error

    def record(A, *args):
        seen.append(A.clone())
        return validation_error(A, *args)

    monkeypatch.setattr(lb.metric, "_validation_error", record)
    x, y = _make(60, 5, 0, "few")
    lb.fit_metric(x, y, max_iter=15, patience=100, seed=0)
    perm = torch.randperm(60, generator=torch.Generator().manual_seed(0))
    fit = perm[15:]  # validation_fraction 0.25 of 60 points
    A0 = lb.metric._initial_metric(x[fit], y[fit])
    plain = lb.metric._optimize(
        A0, x[fit], y[fit], None, max_iter=15, check_every=1, patience=1, budget=None
    )
    assert len(seen) == 16  # the start and 15 iterates
    torch.testing.assert_close(
        seen[-1], plain, rtol=0, atol=1e-12 * float(plain.abs().max())
    )


def test_fit_metric_float32_and_numpy_input():
    x, y = _make(80, 3, 0, "few")
    A = lb.fit_metric(
        x.numpy().astype(np.float32), y.numpy().astype(np.float32), max_iter=10
    )
    assert A.dtype == torch.float32 and A.shape == (3, 3)


# --- adaptive bandwidths -------------------------------------------------------------------
def test_sample_point_kde_integrates_to_one_1d():
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(60, generator=g, dtype=F64),
            3 + 0.1 * torch.randn(40, generator=g, dtype=F64),
        ]
    )
    grid = torch.linspace(-12, 15, 20001, dtype=F64)
    for h in (0.1, 0.4):
        p = lb.sample_point_kde(grid, x, h)
        integral = float(torch.trapezoid(p, grid))
        assert integral == pytest.approx(1.0, abs=1e-6)


def test_sample_point_kde_flat_pilot_is_kde_and_matches_direct_sum():
    x, _ = data(n=25, d=2)
    q = torch.randn(7, 2, dtype=F64)
    torch.testing.assert_close(
        lb.sample_point_kde(q, x, 0.5, pilot=torch.full((25,), 3.0)),
        lb.kde(q, x, 0.5),
        rtol=1e-12,
        atol=0,
    )
    torch.testing.assert_close(
        lb.sample_point_kde(q, x, 0.5, alpha=0.0), lb.kde(q, x, 0.5), rtol=1e-12, atol=0
    )
    # direct: pilot p̃ = kde(x, x, h), g its geometric mean, h_i = h (p̃_i / g)^(-1/2)
    pil = lb.kde(x, x, 0.5)
    hi = 0.5 * (pil / torch.exp(torch.log(pil).mean())) ** -0.5
    direct = torch.tensor(
        [
            sum(
                math.exp(-0.5 * float(((qq - x[i]) ** 2).sum()) / float(hi[i]) ** 2)
                / (2 * math.pi * float(hi[i]) ** 2)
                for i in range(25)
            )
            / 25
            for qq in q
        ],
        dtype=F64,
    )
    torch.testing.assert_close(
        lb.sample_point_kde(q, x, 0.5), direct, rtol=1e-12, atol=0
    )
    torch.testing.assert_close(lb.abramson_bandwidths(x, 0.5), hi, rtol=1e-12, atol=0)
    assert float(torch.log(hi).mean()) == pytest.approx(math.log(0.5))
    chunked = lb.sample_point_kde(q, x, 0.5, budget=64, log=True)
    torch.testing.assert_close(chunked, torch.log(direct), rtol=1e-12, atol=1e-12)


def test_balloon_kde_matches_direct_and_uses_knn_bandwidth():
    x, _ = data(n=20, d=2)
    q = torch.randn(5, 2, dtype=F64)
    hq = lb.knn_bandwidth(q, x, 4)
    direct = torch.tensor(
        [
            torch.exp(-0.5 * ((qq - x) ** 2).sum(1) / hq[a] ** 2).sum()
            / (20 * 2 * math.pi * hq[a] ** 2)
            for a, qq in enumerate(q)
        ]
    )
    torch.testing.assert_close(lb.balloon_kde(q, x, 4), direct, rtol=1e-12, atol=0)
    # a sample-point KDE integrates to one, a 1-D balloon does not (its tails go like 1/|q|)
    x1 = torch.randn(50, dtype=F64)
    grid = torch.linspace(-200, 200, 200001, dtype=F64)
    assert float(torch.trapezoid(lb.balloon_kde(grid, x1, 10), grid)) > 1.5


def test_bad_inputs():
    x, y = data(n=10)
    A = torch.eye(3, dtype=F64)
    with pytest.raises(ValueError, match="A"):
        lb.mlkr_loss(torch.eye(2, dtype=F64), x, y)
    with pytest.raises(ValueError, match="A"):
        lb.mlkr_loss(torch.ones(3, dtype=F64), x, y)
    with pytest.raises(TypeError, match="A"):
        lb.mlkr_loss("eye", x, y)
    with pytest.raises(ValueError, match="y"):
        lb.mlkr_loss(A, x, y[:5])
    with pytest.raises(ValueError, match="x"):
        lb.mlkr_loss(A, x[:1], y[:1])
    with pytest.raises(ValueError, match="NaN"):
        lb.mlkr_loss(A, x, y.clone().fill_(float("nan")))
    with pytest.raises(ValueError, match="n_components"):
        lb.fit_metric(x, y, n_components=4)
    with pytest.raises(TypeError, match="n_components"):
        lb.fit_metric(x, y, n_components=1.5)
    with pytest.raises(ValueError, match="validation_fraction"):
        lb.fit_metric(x, y, validation_fraction=1.5)
    with pytest.raises(TypeError, match="seed"):
        lb.fit_metric(x, y, seed="a")
    with pytest.raises(ValueError, match="init"):
        lb.fit_metric(x, y, n_components=2, init=torch.eye(3, dtype=F64))
    with pytest.raises(ValueError, match="x"):
        lb.fit_metric(x[:3], y[:3])
    with pytest.raises(ValueError, match="bandwidth"):
        lb.sample_point_kde(x, x, -1.0)
    with pytest.raises(ValueError, match="pilot"):
        lb.sample_point_kde(x, x, 1.0, pilot=torch.ones(4))
    with pytest.raises(ValueError, match="pilot"):
        lb.sample_point_kde(x, x, 1.0, pilot=-torch.ones(10))
    with pytest.raises(ValueError, match="kernel"):
        lb.sample_point_kde(x, x, 1.0, kernel="nope")
    with pytest.raises(ValueError, match="x_query"):
        lb.sample_point_kde(torch.ones(2, 2), x, 1.0)
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.balloon_kde(x, x, 11)
    with pytest.raises(ValueError, match="scale"):
        lb.balloon_kde(x, x, 3, scale=0.0)


# --- diagonal metric and fit information ----------------------------------------------------
def test_diagonal_gradient_is_the_full_gradient_restricted():
    # for A = diag(a), dL/da_j = (dL/dA)_jj (chain rule); and gradcheck against differences
    x, y = data(n=20, d=3, seed=4)
    a = torch.tensor([0.7, 1.3, 0.4], dtype=F64, requires_grad=True)
    (g_diag,) = torch.autograd.grad(lb.mlkr_loss(torch.diag(a), x, y), a)
    A = torch.diag(a.detach()).requires_grad_(True)
    (g_full,) = torch.autograd.grad(lb.mlkr_loss(A, x, y), A)
    torch.testing.assert_close(g_diag, torch.diagonal(g_full), rtol=1e-12, atol=1e-12)
    assert float(g_full.abs().max()) > 1e-6  # a non-trivial gradient
    assert torch.autograd.gradcheck(
        lambda v: lb.mlkr_loss(torch.diag(v), x, y), (a,), eps=1e-6, atol=1e-6
    )


def test_fit_metric_diagonal_converges_to_a_restricted_stationary_point():
    x, y = _make(60, 4, 0, "few")
    A, info = lb.fit_metric(
        x, y, diagonal=True, early_stopping=False, max_iter=200, return_info=True
    )
    assert A.shape == (4, 4)
    assert torch.equal(A, torch.diag(torch.diagonal(A)))  # exactly diagonal
    A0 = info["init"]
    torch.testing.assert_close(A0, lb.metric._initial_metric(x, y))
    assert float(lb.mlkr_loss(A, x, y)) < 0.9 * float(lb.mlkr_loss(A0, x, y))

    # the diagonal of the full gradient vanishes (stationary in the d diagonal parameters)
    # while the off-diagonal part need not: the full fit, restricted to diagonal A
    def grad_at(B):
        B = B.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(lb.mlkr_loss(B, x, y) / len(x), B)
        return g

    g0, g = grad_at(A0), grad_at(A)
    assert float(torch.diagonal(g).abs().max()) < 1e-5 * float(g0.abs().max())
    assert float((g - torch.diag(torch.diagonal(g))).abs().max()) > 1e-3 * float(
        g0.abs().max()
    )


def test_fit_metric_diagonal_matches_scipy_minimizer():
    scipy_optimize = pytest.importorskip("scipy.optimize")
    x, y = _make(40, 2, 3, "few")
    A0 = lb.metric._initial_metric(x, y)

    def f(a):
        return float(lb.mlkr_loss(torch.diag(torch.as_tensor(a)), x, y)) / len(x)

    ref = scipy_optimize.minimize(
        f,
        torch.diagonal(A0).numpy(),
        method="Nelder-Mead",
        options=dict(xatol=1e-10, fatol=1e-14, maxiter=4000),
    )
    A = lb.fit_metric(x, y, diagonal=True, early_stopping=False, max_iter=200)
    assert abs(f(torch.diagonal(A).numpy()) - ref.fun) <= 1e-8 * ref.fun
    np.testing.assert_allclose(
        np.abs(torch.diagonal(A).numpy()), np.abs(ref.x), rtol=1e-3
    )


def test_fit_metric_info_reports_the_early_stopping_choice():
    x, y = _make(80, 5, 2, "few")
    A, info = lb.fit_metric(x, y, seed=1, return_info=True)
    errs = info["val_errors"]
    assert len(errs) == info["n_iter"] + 1  # the start and one check per iteration
    assert errs[info["best_iter"]] == min(errs)
    rel = float((A - info["init"]).norm() / info["init"].norm())
    assert (rel == 0.0) == (info["best_iter"] == 0)
    Ad, infod = lb.fit_metric(x, y, seed=1, diagonal=True, return_info=True)
    assert torch.equal(Ad, torch.diag(torch.diagonal(Ad)))
    assert infod["val_errors"][infod["best_iter"]] == min(infod["val_errors"])
    torch.testing.assert_close(lb.fit_metric(x, y, seed=1), A)  # same A without info


def test_fit_metric_diagonal_far_better_when_few_axis_features_matter():
    ratios = [_ratio("few", 10, s, diagonal=True)[0] for s in range(2)]
    assert max(ratios) < 0.6


def test_fit_metric_diagonal_bad_inputs():
    x, y = data(n=10)
    with pytest.raises(ValueError, match="n_components"):
        lb.fit_metric(x, y, n_components=2, diagonal=True)
    with pytest.raises(ValueError, match="init"):
        lb.fit_metric(x, y, diagonal=True, init=torch.ones(3, 3, dtype=F64))
    with pytest.raises(TypeError, match="diagonal"):
        lb.fit_metric(x, y, diagonal="yes")
    with pytest.raises(TypeError, match="return_info"):
        lb.fit_metric(x, y, return_info=1)


def test_loo_loss_check_accepts_a_differentiable_tensor(monkeypatch):
    """The chapter's exercise returns a 0-d tensor (differentiable in A): the self-check
    accepts it, and a float of the same value, and rejects a wrong loss."""
    from localbook.check import ch06 as check_ch06

    def loss_tensor(A, x, y):
        return lb.mlkr_loss(A, x, y)

    assert check_ch06.loo_loss(loss_tensor, seed=0)
    assert check_ch06.loo_loss(lambda A, x, y: float(loss_tensor(A, x, y)), seed=0)
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "1")
    with pytest.raises(AssertionError):
        check_ch06.loo_loss(lambda A, x, y: 2 * loss_tensor(A, x, y), seed=0)
