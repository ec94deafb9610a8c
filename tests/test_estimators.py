"""The scikit-learn estimators: every estimator check, pipelines, grid search, and oracles."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from sklearn.datasets import make_blobs
from sklearn.model_selection import GridSearchCV
from sklearn.neighbors import RadiusNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import localbook as lb
from localbook.estimators import (
    LocalLinearRegressor,
    LocalModeClassifier,
    NadarayaWatsonRegressor,
)

EPS = np.finfo(np.float64).eps


@parametrize_with_checks(
    [
        NadarayaWatsonRegressor(),
        LocalLinearRegressor(),
        LocalModeClassifier(),
        NadarayaWatsonRegressor(kernel="epanechnikov", bandwidth=3.0),
    ]
)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_estimators_are_exported_lazily():
    assert lb.NadarayaWatsonRegressor is NadarayaWatsonRegressor
    assert "LocalModeClassifier" in dir(lb)


def _data(n=120, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize(
    "cls,fn",
    [
        (NadarayaWatsonRegressor, lb.nadaraya_watson),
        (LocalLinearRegressor, lb.local_linear),
    ],
)
def test_regressors_return_numpy_equal_to_the_torch_functions(cls, fn):
    X, y = _data()
    Xq = X[:7] + 0.05
    pred = cls(bandwidth=0.4).fit(X, y).predict(Xq)
    assert isinstance(pred, np.ndarray) and pred.shape == (7,)
    np.testing.assert_array_equal(pred, fn(Xq, X, y, 0.4).numpy())


def test_nadaraya_watson_regressor_against_a_direct_numpy_sum():
    X, y = _data(n=60)
    Xq = np.random.default_rng(1).normal(size=(9, 2))
    w = np.exp(-((Xq[:, None, :] - X[None]) ** 2).sum(-1) / (2 * 0.5**2))
    direct = (w @ y) / w.sum(1)
    pred = NadarayaWatsonRegressor(bandwidth=0.5).fit(X, y).predict(Xq)
    np.testing.assert_allclose(
        pred, direct, rtol=0, atol=60 * EPS * np.abs(y).max() * 10
    )


def test_local_linear_regressor_is_weighted_least_squares_when_ill_conditioned():
    """A thin cloud (spread 1e-4 across): the prediction is numpy lstsq's per query, to the
    first-order rounding estimate n·u·(κ(‖β‖ + ‖b‖/‖A‖) + κ²‖r‖/‖A‖)."""
    rng = np.random.default_rng(2)
    X = np.c_[rng.normal(size=80), 1e-4 * rng.normal(size=80)] + 50.0
    y = X[:, 0] + 3e3 * (X[:, 1] - 50.0) + 0.1 * rng.normal(size=80)
    Xq = X[:6] + [0.2, 5e-5]
    pred = LocalLinearRegressor(bandwidth=0.5).fit(X, y).predict(Xq)
    for p, t in zip(pred, Xq):
        sw = np.exp(-0.25 * (((X - t) / 0.5) ** 2).sum(1))
        A = np.c_[np.ones(len(X)), (X - t) / 0.5] * sw[:, None]
        b = y * sw
        beta = np.linalg.lstsq(A, b, rcond=None)[0]
        sv = np.linalg.svd(A, compute_uv=False)
        kap, r = sv[0] / sv[-1], np.linalg.norm(b - A @ beta)
        size = kap * (np.linalg.norm(beta) + np.linalg.norm(b) / sv[0])
        tol = len(X) * EPS * (size + kap**2 * r / sv[0])
        assert kap > 1e3 and abs(p - beta[0]) <= tol


def test_multi_output_regression_keeps_the_columns():
    X, y = _data()
    Y = np.stack([y, -2 * y], axis=1)
    pred = NadarayaWatsonRegressor(bandwidth=0.3).fit(X, Y).predict(X[:5])
    assert pred.shape == (5, 2)
    np.testing.assert_allclose(pred[:, 1], -2 * pred[:, 0], rtol=1e-12)


def test_pipeline_with_scaler_and_grid_search_over_bandwidth():
    X, y = _data(n=150)
    X = X * np.array([100.0, 0.01])  # very different scales: the scaler matters
    pipe = make_pipeline(StandardScaler(), NadarayaWatsonRegressor())
    grid = GridSearchCV(
        pipe, {"nadarayawatsonregressor__bandwidth": [0.05, 0.2, 0.5, 2.0]}, cv=3
    )
    grid.fit(X, y)
    assert grid.best_params_["nadarayawatsonregressor__bandwidth"] in (0.2, 0.5)
    assert (
        grid.best_score_ > 0.8
    )  # R² of a smooth sine with noise sd 0.1 (noise share ~2 %)
    Xb, yb = make_blobs(n_samples=200, centers=3, random_state=0)
    clf = GridSearchCV(
        make_pipeline(StandardScaler(), LocalModeClassifier()),
        {"localmodeclassifier__bandwidth": [0.1, 0.3, 1.0]},
        cv=3,
    ).fit(Xb, yb)
    assert clf.best_score_ > 0.9


def test_loo_bandwidth_is_the_closed_form_choice_and_matches_refits():
    X, y = _data(n=80, d=1)
    est = NadarayaWatsonRegressor(bandwidth="loo").fit(X, y)
    sel = lb.select_bandwidth(X, y)
    assert est.bandwidth_ == sel.bandwidth
    assert est.bandwidth == "loo"  # the parameter is left as given
    # the leave-one-out error at the chosen bandwidth, by explicit refits
    h, resid = est.bandwidth_, []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        fit = NadarayaWatsonRegressor(bandwidth=h).fit(X[keep], y[keep])
        resid.append(y[i] - fit.predict(X[i : i + 1])[0])
    best = float(sel.scores.min())
    np.testing.assert_allclose(np.mean(np.square(resid)), best, rtol=1e3 * len(y) * EPS)


@settings(max_examples=25)
@given(st.integers(0, 10_000), st.floats(0.3, 2.0))
def test_uniform_kernel_mode_classifier_is_radius_neighbours_voting(seed, radius):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(40, 2))
    y = rng.integers(0, 3, size=40)
    Xq = rng.uniform(-2, 2, size=(15, 2))
    ours = LocalModeClassifier(bandwidth=radius, kernel="uniform").fit(X, y)
    ref = RadiusNeighborsClassifier(radius=radius, outlier_label="most_frequent").fit(
        X, y
    )
    d = np.sqrt(((Xq[:, None] - X[None]) ** 2).sum(-1))
    inside = (d <= radius).any(1)
    # stay clear of points exactly on the boundary (float rounding decides them differently)
    clear = np.abs(d - radius).min(1) > 1e-9
    q = Xq[inside & clear]
    if len(q):
        np.testing.assert_allclose(
            ours.predict_proba(q), ref.predict_proba(q), atol=10 * EPS
        )
        # ties: both take the first class in sorted order
        np.testing.assert_array_equal(ours.predict(q), ref.predict(q))


def test_mode_classifier_string_labels_and_empty_neighbourhoods():
    X = np.array([[0.0], [0.1], [5.0]])
    y = np.array(["cat", "cat", "dog"])
    clf = LocalModeClassifier(bandwidth=0.5, kernel="epanechnikov").fit(X, y)
    assert clf.predict([[0.05], [5.1]]).tolist() == ["cat", "dog"]
    with pytest.warns(UserWarning, match="no data point"):
        with pytest.raises(ValueError, match="1 of 1 queries have no training point"):
            clf.predict([[2.5]])


def test_mode_classifier_is_the_plug_in_bayes_rule_with_class_kdes():
    X, y = make_blobs(n_samples=90, centers=3, random_state=1)
    Xq = np.random.default_rng(2).normal(size=(20, 2)) * 3
    h = 0.8
    post = np.stack(
        [(y == c).mean() * lb.kde(Xq, X[y == c], h).numpy() for c in range(3)], 1
    )
    post /= post.sum(1, keepdims=True)
    proba = LocalModeClassifier(bandwidth=h).fit(X, y).predict_proba(Xq)
    np.testing.assert_allclose(proba, post, rtol=1e-9, atol=1e-12)


def test_bad_parameters_are_named():
    X, y = _data(n=10)
    with pytest.raises(ValueError, match="bandwidth"):
        NadarayaWatsonRegressor(bandwidth="silverman").fit(X, y)
    with pytest.raises(ValueError, match="kernel"):
        LocalLinearRegressor(kernel="cosine").fit(X, y)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        NadarayaWatsonRegressor(bandwidth=-1.0).fit(X, y).predict(X)
    with pytest.raises(ValueError, match="loo"):
        LocalModeClassifier(bandwidth="loo").fit(X, (y > 0).astype(int))


def test_local_mode_classify_function_matches_one_hot_nadaraya_watson():
    X, y = _data(n=50)
    labels = (y > 0).astype(int) + (X[:, 1] > 0)
    pred, proba, classes = lb.local_mode_classify(
        X[:6], X, labels, 0.5, return_proba=True
    )
    onehot = np.eye(3)[labels]
    np.testing.assert_allclose(
        proba.numpy(), lb.nadaraya_watson(X[:6], X, onehot, 0.5).numpy()
    )
    assert torch.equal(pred, classes[proba.argmax(1)])


# --- issue 27: bandwidth="loo" errors name X and the cause ----------------------------------
@pytest.mark.faults
def test_loo_bandwidth_errors_name_the_samples_of_X():
    with pytest.raises(
        ValueError, match=r"bandwidth='loo'.*X needs at least 2 samples; got 1"
    ):
        NadarayaWatsonRegressor(bandwidth="loo").fit(np.ones((1, 2)), np.ones(1))
    X = np.random.default_rng(0).normal(size=(3, 2))
    with pytest.raises(
        ValueError,
        match=r"bandwidth='loo' with local linear.*n_features \+ 1 = 3 samples",
    ):
        LocalLinearRegressor(bandwidth="loo").fit(X, np.arange(3.0))
    # three samples are enough for Nadaraya-Watson, four for local linear in the plane
    NadarayaWatsonRegressor(bandwidth="loo").fit(X, np.arange(3.0))
    X4 = np.random.default_rng(1).normal(size=(4, 2))
    LocalLinearRegressor(bandwidth="loo").fit(X4, np.arange(4.0))


@pytest.mark.faults
def test_local_linear_regressor_empty_compact_window_in_3d_is_nan_with_the_warning():
    """A compact kernel, d = 3, a query with no training point in its window: this raised
    'linalg.eigh ... failed to converge'; it is NaN with the library's one warning, and the
    other queries are the fit without it."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(0, 1, (50, 3)), rng.normal(size=50)
    Q = np.array([[0.5, 0.5, 0.5], [9.0, 9.0, 9.0], [0.4, 0.6, 0.5]])
    est = LocalLinearRegressor(bandwidth=0.3, kernel="epanechnikov").fit(X, y)
    with pytest.warns(UserWarning, match="1 of 3 queries have no data point") as rec:
        pred = est.predict(Q)
    assert len(rec) == 1
    assert isinstance(pred, np.ndarray) and np.isnan(pred[1])
    assert np.isfinite(pred[[0, 2]]).all()
    # the other queries: the same solves (a batch of another size may sum in another
    # order: rounding, a few eps of |y| here, 100 eps allowed)
    np.testing.assert_allclose(
        pred[[0, 2]], est.predict(Q[[0, 2]]), rtol=0, atol=100 * EPS * np.abs(y).max()
    )
