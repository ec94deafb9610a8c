"""Local decisions beyond the mean: local quantile, Takagi–Sugeno rules, the bilateral filter.

Oracles: numpy's weighted ``inverted_cdf`` quantile, scikit-learn's ``QuantileRegressor`` (the
pinball objective by linear programming), ``LinearRegression`` with sample weights, and brute-force
double sums; hypothesis for the properties; bad inputs must name the argument.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb

EPS = np.finfo(np.float64).eps


def _data(n=80, d=2, seed=0):
    g = np.random.default_rng(seed)
    x = g.uniform(-1, 1, size=(n, d))
    y = np.sin(3 * x[:, 0]) + g.standard_t(2, size=n)
    return x, y


def _weights(xq, x, h):
    return np.exp(-0.5 * (((xq[:, None, :] - x[None]) / h) ** 2).sum(-1))


# --- local quantile ---------------------------------------------------------------------------
@pytest.mark.parametrize("q", [0.1, 0.5, 0.77])
def test_local_quantile_is_numpys_weighted_inverted_cdf_quantile(q):
    x, y = _data()
    xq = np.random.default_rng(1).uniform(-1, 1, size=(30, 2))
    got = lb.local_quantile(xq, x, y, 0.3, q=q).numpy()
    W = _weights(xq, x, 0.3)
    ref = np.array([np.quantile(y, q, weights=w, method="inverted_cdf") for w in W])
    np.testing.assert_array_equal(got, ref)


def test_local_quantile_minimizes_the_weighted_pinball_loss_like_the_lp_solver():
    from sklearn.linear_model import QuantileRegressor

    x, y = _data(n=60, d=1, seed=3)
    xq = np.array([[-0.5], [0.0], [0.7]])
    W = _weights(xq, x, 0.25)
    for q in (0.2, 0.5, 0.9):
        got = lb.local_quantile(xq, x, y, 0.25, q=q).numpy()
        for a in range(len(xq)):
            lp = QuantileRegressor(quantile=q, alpha=0.0, solver="highs")
            lp.fit(np.zeros((len(y), 1)), y, sample_weight=W[a])
            J = lambda t: float(
                (W[a] * lb.pinball_loss(torch.tensor(y - t), q).numpy()).sum()
            )
            scale = float(W[a].sum() * np.abs(y).max())
            assert (
                J(got[a]) <= J(lp.intercept_) + 1e-7 * scale
            )  # the LP's own tolerance


def test_local_quantile_with_many_levels_is_monotone_and_matches_single_calls():
    x, y = _data(n=200, seed=4)
    xq = np.random.default_rng(5).uniform(-1, 1, size=(40, 2))
    levels = [0.05, 0.25, 0.5, 0.75, 0.95]
    band = lb.local_quantile(xq, x, y, 0.2, q=levels)
    assert band.shape == (40, 5)
    assert bool((band.diff(dim=1) >= 0).all())  # shared weights: quantiles never cross
    for j, q in enumerate(levels):
        torch.testing.assert_close(
            band[:, j], lb.local_quantile(xq, x, y, 0.2, q=q), rtol=0, atol=0
        )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 25),
    q=st.floats(0.01, 0.99),
    h=st.floats(0.05, 3.0),
    seed=st.integers(0, 10_000),
    kernel=st.sampled_from(["gaussian", "laplacian", "epanechnikov"]),
)
def test_local_quantile_is_a_data_value_at_the_minimum_of_the_pinball_loss(
    n, q, h, seed, kernel
):
    g = np.random.default_rng(seed)
    x = g.uniform(-1, 1, size=(n, 1))
    y = np.round(g.normal(size=n), 1)  # ties allowed
    xq = x[:3] + 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lb.local_quantile(xq, x, y, h, q=q, kernel=kernel).numpy()
    K = lb.kernel_matrix(xq, x, h, kernel).numpy()
    for a in range(len(xq)):
        if K[a].sum() == 0:
            assert np.isnan(got[a])
            continue
        assert got[a] in y
        J = lambda t: float((K[a] * (y - t) * (q - (y - t < 0))).sum())
        best = min(
            J(t) for t in y
        )  # the pinball loss is piecewise linear: a data value is optimal
        assert J(got[a]) <= best + 8 * n * EPS * float(
            K[a].sum() * (np.abs(y).max() + 1)
        )


def test_local_median_shrugs_off_an_outlier_that_moves_the_local_mean():
    x = np.linspace(0, 1, 21)[:, None]
    y = np.zeros(21)
    y[10] = 1e6
    med = lb.local_quantile([[0.5]], x, y, 0.1)
    nw = lb.nadaraya_watson([[0.5]], x, y, 0.1)
    assert float(med[0]) == 0.0 and float(nw[0]) > 1e4


def test_local_quantile_empty_neighbourhood_is_nan_with_a_warning():
    with pytest.warns(UserWarning, match="1 of 2 queries"):
        out = lb.local_quantile(
            [[0.0], [5.0]], [[0.0], [0.1]], [1.0, 2.0], 0.5, kernel="uniform"
        )
    assert out[0] == 1.0 and torch.isnan(out[1])


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(q=0.0), ValueError, "q must lie strictly between 0 and 1"),
        (dict(q=1.5), ValueError, "q must lie"),
        (dict(q=True), TypeError, "q must be"),
        (dict(q="median"), TypeError, "q must be"),
        (dict(bandwidth=-1.0), ValueError, "bandwidth"),
        (dict(kernel="box"), ValueError, "kernel"),
        (dict(y=np.ones((10, 2))), ValueError, "y must be"),
        (dict(y=np.ones(9)), ValueError, "y has 9 rows"),
        (dict(x_query=np.ones((2, 3))), ValueError, "x_query"),
    ],
)
def test_local_quantile_rejects_bad_inputs(kwargs, err, match):
    args = dict(
        x_query=np.zeros((2, 1)),
        x=np.linspace(0, 1, 10),
        y=np.arange(10.0),
        bandwidth=0.3,
    )
    args.update(kwargs)
    with pytest.raises(err, match=match):
        lb.local_quantile(**args)


# --- Takagi–Sugeno ----------------------------------------------------------------------------
def test_takagi_sugeno_matches_a_brute_force_fuzzy_inference():
    g = np.random.default_rng(0)
    centers, coef = g.uniform(-1, 1, size=(6, 2)), g.normal(size=(6, 3))
    xq = g.uniform(-1.5, 1.5, size=(25, 2))
    mu = _weights(xq, centers, np.array([0.4, 0.7]))
    rules = (
        coef[:, 0][None] + xq @ coef[:, 1:].T
    )  # (m, R): each rule's linear consequent
    ref = (mu * rules).sum(1) / mu.sum(1)
    got = lb.takagi_sugeno(xq, centers, [0.4, 0.7], coef).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    wbar = lb.rule_memberships(xq, centers, [0.4, 0.7]).numpy()
    np.testing.assert_allclose(
        wbar, mu / mu.sum(1, keepdims=True), rtol=1e-12, atol=1e-15
    )


def test_zero_order_rules_at_the_data_are_nadaraya_watson():
    x, y = _data(n=50)
    xq = np.random.default_rng(2).uniform(-1, 1, size=(20, 2))
    with pytest.warns(UserWarning, match="no data point"):  # queries no rule fires: NaN
        ts = lb.takagi_sugeno(xq, x, 0.3, y[:, None], membership="epanechnikov")
    W = np.clip(1 - (((xq[:, None] - x[None]) / 0.3) ** 2).sum(-1), 0, None)
    ok = W.sum(1) > 0
    assert ok.any() and np.isnan(ts.numpy()[~ok]).all()
    np.testing.assert_allclose(
        ts.numpy()[ok], (W @ y)[ok] / W.sum(1)[ok], rtol=1e-12, atol=1e-12
    )


def test_local_consequents_are_weighted_least_squares_fits_at_the_centers():
    from sklearn.linear_model import LinearRegression

    x, y = _data(n=120)
    centers = np.array([[-0.5, -0.5], [0.0, 0.3], [0.6, -0.2]])
    theta = lb.fit_takagi_sugeno(x, y, centers, 0.4).numpy()
    W = _weights(centers, x, 0.4)
    for r in range(3):
        lr = LinearRegression().fit(x, y, sample_weight=W[r])
        np.testing.assert_allclose(
            theta[r], np.r_[lr.intercept_, lr.coef_], rtol=1e-8, atol=1e-10
        )
    # the rule's line at its own centre is local linear regression there
    at_c = theta[:, 0] + (theta[:, 1:] * centers).sum(1)
    np.testing.assert_allclose(
        at_c, lb.local_linear(centers, x, y, 0.4).numpy(), rtol=1e-9, atol=1e-12
    )
    theta0 = lb.fit_takagi_sugeno(x, y, centers, 0.4, order=0).numpy()
    np.testing.assert_allclose(
        theta0[:, 0], lb.nadaraya_watson(centers, x, y, 0.4).numpy(), rtol=1e-12
    )


def test_global_consequents_are_the_least_squares_fit_of_the_ts_output():
    x, y = _data(n=150, seed=7)
    centers = np.random.default_rng(8).uniform(-1, 1, size=(5, 2))
    theta = lb.fit_takagi_sugeno(x, y, centers, 0.5, method="global")
    resid = y - lb.takagi_sugeno(x, centers, 0.5, theta).numpy()
    # optimality: the residual is orthogonal to every column of the design
    wbar = lb.rule_memberships(x, centers, 0.5).numpy()
    A = np.c_[np.ones(len(x)), x]
    Phi = (wbar[:, :, None] * A[:, None, :]).reshape(len(x), -1)
    assert np.abs(Phi.T @ resid).max() <= 1e3 * len(x) * EPS * np.abs(
        y
    ).max() * np.linalg.cond(Phi)
    local = lb.fit_takagi_sugeno(x, y, centers, 0.5)
    sse = lambda t: float(
        ((y - lb.takagi_sugeno(x, centers, 0.5, t).numpy()) ** 2).sum()
    )
    assert sse(theta) <= sse(local)


@settings(max_examples=30, deadline=None)
@given(
    R=st.integers(1, 6),
    d=st.integers(1, 3),
    h=st.floats(0.1, 5.0),
    seed=st.integers(0, 9999),
)
def test_takagi_sugeno_is_a_convex_combination_of_the_rules(R, d, h, seed):
    g = np.random.default_rng(seed)
    centers, coef, xq = (
        g.normal(size=(R, d)),
        g.normal(size=(R, d + 1)),
        g.normal(size=(7, d)),
    )
    out = lb.takagi_sugeno(xq, centers, h, coef).numpy()
    rules = coef[:, 0][None] + xq @ coef[:, 1:].T
    slack = 64 * EPS * (np.abs(rules).max() + 1)
    assert np.all(out >= rules.min(1) - slack) and np.all(out <= rules.max(1) + slack)
    # identical rules: the output is that rule, whatever the memberships
    same = np.repeat(coef[:1], R, 0)
    np.testing.assert_allclose(
        lb.takagi_sugeno(xq, centers, h, same).numpy(), rules[:, 0], atol=slack
    )


def test_takagi_sugeno_rejects_bad_inputs():
    c = np.zeros((3, 2))
    with pytest.raises(ValueError, match="coefficients must be"):
        lb.takagi_sugeno(np.zeros((1, 2)), c, 1.0, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="coefficients must be"):
        lb.takagi_sugeno(np.zeros((1, 2)), c, 1.0, np.zeros((4, 1)))
    with pytest.raises(ValueError, match="x_query has 3"):
        lb.takagi_sugeno(np.zeros((1, 3)), c, 1.0, np.zeros((3, 1)))
    with pytest.raises(ValueError, match="membership"):
        lb.takagi_sugeno(
            np.zeros((1, 2)), c, 1.0, np.zeros((3, 1)), membership="triangle"
        )
    with pytest.raises(TypeError, match="coefficients"):
        lb.takagi_sugeno(np.zeros((1, 2)), c, 1.0, "abc")
    x = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match="order"):
        lb.fit_takagi_sugeno(x, x[:, 0], c, 1.0, order=2)
    with pytest.raises(ValueError, match="method"):
        lb.fit_takagi_sugeno(x, x[:, 0], c, 1.0, method="anfis")
    with pytest.raises(ValueError, match="ridge"):
        lb.fit_takagi_sugeno(x, x[:, 0], c, 1.0, ridge=-1.0)
    with pytest.raises(ValueError, match="rule 1"):  # nothing fires a far compact rule
        lb.fit_takagi_sugeno(
            x, x[:, 0], [[0.0, 0.0], [50.0, 50.0]], 1.0, membership="uniform"
        )


@pytest.mark.parametrize("method", ["local", "global"])
def test_collinear_design_error_names_x_not_the_bandwidth(method):
    t = np.linspace(0, 1, 50)
    centers = [[0.2, 0.4], [0.8, 1.6]]
    for x in (np.c_[t, 2 * t], np.c_[t, np.full(50, 0.3)], np.c_[t, 1 - t, 0 * t + 2]):
        c = np.asarray(centers)[:, :1].repeat(x.shape[1], 1)
        with pytest.raises(
            ValueError, match=r"^x: .* affine subspace of dimension 1 < d"
        ) as e:
            lb.fit_takagi_sugeno(x, np.sin(t), c, 10.0, method=method)
        assert "larger bandwidth" not in str(e.value)
    x = np.c_[t, 2 * t]
    # the remedies the message names do work
    th0 = lb.fit_takagi_sugeno(x, np.sin(t), centers, 0.2, order=0, method=method)
    thr = lb.fit_takagi_sugeno(x, np.sin(t), centers, 0.2, method=method, ridge=1e-6)
    assert th0.shape == (2, 1) and thr.shape == (2, 3)
    assert bool(torch.isfinite(thr).all())
    # a full-rank design still fits: the local rule equals weighted least squares
    x = np.c_[t, np.cos(3 * t)]
    theta = lb.fit_takagi_sugeno(x, np.sin(t), centers, 0.2, method=method)
    assert bool(torch.isfinite(theta).all())


def test_rule_whose_firing_points_are_collinear_names_the_rule():
    t = np.linspace(0, 1, 50)
    x = np.r_[np.c_[t, 2 * t], [[5.0, 0.0], [5.0, 1.0], [6.0, 0.0], [6.0, 1.0]]]
    y = np.r_[np.sin(t), np.zeros(4)]

    def fit(c, h=0.3):
        return lb.fit_takagi_sugeno(x, y, c, h, membership="epanechnikov")

    with pytest.raises(
        ValueError, match="rule 0: the 14 data points .* affine subspace"
    ):
        fit([[0.5, 1.0]])
    with pytest.raises(ValueError, match=r"rule 1: too few data points fire it \(0\)"):
        fit([[5.5, 0.5], [20.0, 20.0]], 1.0)
    # the rule at the four corners of the square is determined: an exact plane is recovered
    y_plane = 1.0 + 2.0 * x[:, 0] - 3.0 * x[:, 1]
    th = lb.fit_takagi_sugeno(x, y_plane, [[5.5, 0.5]], 1.0, membership="epanechnikov")
    np.testing.assert_allclose(th.numpy(), [[1.0, 2.0, -3.0]], atol=1e3 * EPS * 20)


# --- bilateral filter -------------------------------------------------------------------------
def _bilateral_brute(img, s, r):
    C, H, W = img.shape
    rr, cc = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    pos = np.c_[rr.ravel(), cc.ravel()]
    val = img.reshape(C, -1).T
    K = np.exp(-0.5 * ((pos[:, None] - pos[None]) ** 2).sum(-1) / s**2) * np.exp(
        -0.5 * ((val[:, None] - val[None]) ** 2).sum(-1) / r**2
    )
    return ((K @ val) / K.sum(1, keepdims=True)).T.reshape(C, H, W)


def test_bilateral_filter_is_the_double_sum_for_grey_and_colour_images():
    g = np.random.default_rng(0)
    grey, colour = g.uniform(size=(9, 11)), g.uniform(size=(3, 7, 8))
    np.testing.assert_allclose(
        lb.bilateral_filter(grey, 1.5, 0.2).numpy(),
        _bilateral_brute(grey[None], 1.5, 0.2)[0],
        rtol=1e-12,
        atol=1e-13,
    )
    np.testing.assert_allclose(
        lb.bilateral_filter(colour, 2.0, 0.3).numpy(),
        _bilateral_brute(colour, 2.0, 0.3),
        rtol=1e-12,
        atol=1e-13,
    )


def test_bilateral_window_is_exact_when_it_covers_the_image_and_close_when_large():
    img = np.random.default_rng(1).uniform(size=(2, 10, 12))
    exact = lb.bilateral_filter(img, 1.0, 0.5)
    np.testing.assert_allclose(
        lb.bilateral_filter(img, 1.0, 0.5, window=11).numpy(),
        exact.numpy(),
        rtol=1e-12,
        atol=1e-13,
    )
    w = 5  # every dropped weight is below exp(-w²/2) (the pixel's own weight is 1)
    approx = lb.bilateral_filter(img, 1.0, 0.5, window=w)
    bound = img.size / 2 * math.exp(-w * w / 2) * 2 * img.max()
    assert float((approx - exact).abs().max()) <= bound


def test_bilateral_filter_limits_gaussian_blur_and_identity():
    img = np.random.default_rng(2).uniform(size=(8, 8))
    # huge range bandwidth: a normalized Gaussian blur of the image
    rr, cc = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    pos = np.c_[rr.ravel(), cc.ravel()]
    G = np.exp(-0.5 * ((pos[:, None] - pos[None]) ** 2).sum(-1) / 1.5**2)
    blur = (G @ img.ravel() / G.sum(1)).reshape(8, 8)
    np.testing.assert_allclose(
        lb.bilateral_filter(img, 1.5, 1e8).numpy(), blur, rtol=1e-10, atol=1e-12
    )
    # tiny spatial bandwidth: the image itself
    np.testing.assert_allclose(
        lb.bilateral_filter(img, 1e-3, 0.1).numpy(), img, rtol=0, atol=1e-12
    )


@settings(max_examples=25, deadline=None)
@given(
    H=st.integers(1, 7),
    W=st.integers(1, 7),
    s=st.floats(0.3, 4),
    r=st.floats(0.05, 3),
    c=st.floats(-5, 5),
    a=st.floats(0.1, 3),
    seed=st.integers(0, 9999),
)
def test_bilateral_filter_stays_in_range_and_commutes_with_affine_maps(
    H, W, s, r, c, a, seed
):
    img = np.random.default_rng(seed).uniform(size=(H, W))
    out = lb.bilateral_filter(img, s, r).numpy()
    slack = 64 * EPS
    assert out.min() >= img.min() - slack and out.max() <= img.max() + slack
    # values scaled by a with the range bandwidth scaled by a, and shifted by c: same filter
    out2 = lb.bilateral_filter(a * img + c, s, a * r).numpy()
    np.testing.assert_allclose(out2, a * out + c, rtol=0, atol=1e3 * EPS * (abs(c) + a))
    win = lb.bilateral_filter(img, s, r, window=max(H, W)).numpy()
    np.testing.assert_allclose(win, out, rtol=0, atol=1e-12)


def test_bilateral_filter_rejects_bad_inputs():
    with pytest.raises(ValueError, match="image must"):
        lb.bilateral_filter(np.zeros((5, 5, 3)), 1.0, 1.0)
    with pytest.raises(ValueError, match="image must have"):
        lb.bilateral_filter(np.zeros(5), 1.0, 1.0)
    with pytest.raises(ValueError, match="image contains"):
        lb.bilateral_filter(np.full((3, 3), np.nan), 1.0, 1.0)
    with pytest.raises(ValueError, match="spatial_bandwidth"):
        lb.bilateral_filter(np.zeros((3, 3)), 0.0, 1.0)
    with pytest.raises(TypeError, match="range_bandwidth"):
        lb.bilateral_filter(np.zeros((3, 3)), 1.0, "wide")
    with pytest.raises(ValueError, match="window"):
        lb.bilateral_filter(np.zeros((3, 3)), 1.0, 1.0, window=0)
    with pytest.raises(TypeError, match="window"):
        lb.bilateral_filter(np.zeros((3, 3)), 1.0, 1.0, window=2.5)


def test_functions_are_exported():
    for name in (
        "local_mode_classify",
        "local_quantile",
        "pinball_loss",
        "takagi_sugeno",
        "rule_memberships",
        "fit_takagi_sugeno",
        "bilateral_filter",
    ):
        assert callable(getattr(lb, name))
