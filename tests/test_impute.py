"""Tests of localbook.impute: the two-layer local-mean imputer (images and tabular data)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

from localbook.datasets import block_mask, holdout_mask, missing_at_random_mask
from localbook.impute import (
    IMAGE_WEIGHT_GRID,
    PIXEL_BANDWIDTH_GRID,
    LocalMeanImputer,
    image_local_mean,
    nan_sq_distances,
    pixel_local_mean,
    rmse_missing,
)


def _fashion(n=60):
    imgs, _ = lb.datasets.load_fashion_mnist_subset()
    return imgs[:n].reshape(n, -1).astype(np.float64) / 255.0


def _masked(X, mask):
    Xm = X.copy()
    Xm[mask] = np.nan
    return Xm


# --- layer 1 -----------------------------------------------------------------------------------
def test_pixel_local_mean_matches_brute_force():
    rng = np.random.default_rng(0)
    X = rng.random((3, 5 * 4))
    X[rng.random(X.shape) < 0.4] = np.nan
    h = 1.3
    out = pixel_local_mean(X, (5, 4), bandwidth=h).numpy()
    pos = np.array([(r, c) for r in range(5) for c in range(4)], float)
    for i in range(3):
        for p in range(20):
            if np.isnan(X[i, p]):
                obs = ~np.isnan(X[i])
                w = np.exp(-((pos[obs] - pos[p]) ** 2).sum(1) / (2 * h * h))
                assert out[i, p] == pytest.approx(
                    (w * X[i, obs]).sum() / w.sum(), rel=1e-10
                )
            else:
                assert out[i, p] == X[i, p]


def test_pixel_local_mean_deep_block_uses_log_space():
    # a 20×20 hole in a 24×24 image with a tiny bandwidth: the kernel mass underflows in the
    # matrix-product path, the log-space path must return the nearest observed pixels' mean
    X = np.ones((1, 24 * 24))
    X[0].reshape(24, 24)[2:22, 2:22] = np.nan
    out = pixel_local_mean(X, (24, 24), bandwidth=0.2).numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, 1.0)


def test_pixel_local_mean_device_and_dtype(device):
    X = torch.rand(4, 36, dtype=torch.float32, device=device)
    X[X < 0.3] = math.nan
    out = pixel_local_mean(X, (6, 6))
    assert out.device.type == device.type and out.dtype == torch.float32
    assert not torch.isnan(out).any()


# --- distances on commonly observed pixels --------------------------------------------------------
def test_nan_sq_distances_matches_sklearn():
    from sklearn.metrics.pairwise import nan_euclidean_distances

    rng = np.random.default_rng(1)
    A, B = rng.random((7, 12)), rng.random((9, 12))
    A[rng.random(A.shape) < 0.3] = np.nan
    B[rng.random(B.shape) < 0.3] = np.nan
    d2, common = nan_sq_distances(A, B)
    np.testing.assert_allclose(
        np.sqrt(d2.numpy()), nan_euclidean_distances(A, B), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_array_equal(
        common.numpy(), (~np.isnan(A)).astype(int) @ (~np.isnan(B)).astype(int).T
    )


def test_image_local_mean_prefers_observed_values():
    # two neighbours at equal distance: one observed the pixel (value 1), one imputed it (value 0)
    Xq = np.array([[0.5, 0.5, np.nan]])
    X_ref = np.array([[0.5, 0.5, 1.0], [0.5, 0.5, np.nan]])
    Z_ref = np.array([[0.5, 0.5, 1.0], [0.5, 0.5, 0.0]])
    for lam in [1.0, 0.3, 0.01]:
        out = image_local_mean(
            Xq, X_ref, Z_ref, n_neighbors=2, imputed_weight=lam
        ).numpy()
        assert out[0, 2] == pytest.approx(1.0 / (1.0 + lam))


def test_image_local_mean_weights_sum_to_one():
    rng = np.random.default_rng(2)
    X = torch.as_tensor(rng.random((10, 16)))
    Xm = X.clone()
    Xm[torch.rand(10, 16) < 0.2] = math.nan
    ones = torch.ones_like(X)
    out = image_local_mean(Xm, Xm, ones, n_neighbors=4)
    torch.testing.assert_close(out, ones)  # a local mean of constants is that constant


# --- the estimator --------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_kind", ["mar", "block"])
def test_observed_untouched_and_beats_mean_imputation(mask_kind):
    from sklearn.impute import SimpleImputer

    X = _fashion(60)
    mask = (
        missing_at_random_mask(X.shape, 0.5, seed=0)
        if mask_kind == "mar"
        else block_mask(60, (28, 28), 10, seed=0)
    )
    Xm = _masked(X, mask)
    out = LocalMeanImputer((28, 28)).fit_transform(Xm)
    assert isinstance(out, np.ndarray) and out.shape == X.shape
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[~mask], X[~mask])  # observed pixels bit for bit
    ours = rmse_missing(out, X, mask)
    mean = rmse_missing(SimpleImputer().fit_transform(Xm), X, mask)
    assert ours < 0.75 * mean


def test_two_layers_beat_each_layer_alone_on_blocks():
    X = _fashion(80)
    mask = block_mask(80, (28, 28), 10, seed=1)
    Xm = _masked(X, mask)
    scores = {
        lay: rmse_missing(
            LocalMeanImputer((28, 28), layers=lay).fit_transform(Xm), X, mask
        )
        for lay in ["pixel", "image", "both"]
    }
    assert scores["both"] < scores["pixel"] and scores["both"] < scores["image"]


def test_fit_transform_equals_fit_then_transform_and_tensor_io(device):
    X = _fashion(30)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.3, seed=3))
    a = LocalMeanImputer((28, 28)).fit_transform(Xm)
    b = LocalMeanImputer((28, 28)).fit(Xm).transform(Xm)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    t = torch.as_tensor(Xm, device=device)
    c = LocalMeanImputer((28, 28)).fit_transform(t)
    assert (
        isinstance(c, torch.Tensor)
        and c.device.type == device.type
        and c.dtype == torch.float64
    )
    np.testing.assert_allclose(c.cpu().numpy(), a, atol=1e-9)


def test_transform_new_images_and_all_missing_row():
    X = _fashion(40)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.3, seed=4))
    imp = LocalMeanImputer((28, 28), n_neighbors=5).fit(Xm[:30])
    new = Xm[30:].copy()
    new[0] = np.nan  # nothing observed: falls back to the fitted feature means
    out = imp.transform(new)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out[0], np.nanmean(Xm[:30], axis=0))


def test_image_layer_alone_is_kernel_knn_on_observed_values():
    # with one neighbour, layer 2 on raw values copies the nearest image's observed pixel
    X = np.array([[0.0, 1.0, 2.0, 3.0], [0.1, 1.1, 2.1, 3.1], [9.0, 9.0, 9.0, 9.0]])
    Xm = X.copy()
    Xm[0, 3] = np.nan
    out = LocalMeanImputer(layers="image", n_neighbors=1).fit(X[1:]).transform(Xm[:1])
    assert out[0, 3] == pytest.approx(3.1)


def test_identical_rows_are_not_neighbours_but_equal_looking_rows_are():
    # the module docstring: the query itself and exact copies of it (same values, same NaNs)
    # are left out of its neighbourhood; a different row at distance 0 is not
    Xm = np.array(
        [
            [0.2, 0.4, np.nan, 0.8],
            [0.2, 0.4, np.nan, 0.8],  # exact copy of row 0
            [0.2, 0.4, 0.9, np.nan],  # distance 0 to row 0 on the shared pixels
            [0.7, 0.1, 0.3, 0.5],
        ]
    )
    imp = LocalMeanImputer(layers="image", n_neighbors=1).fit(Xm)
    out = imp.transform(Xm[:1])
    assert out[0, 2] == pytest.approx(0.9)  # from row 2, not from row 0 or its copy
    assert imp.fit_transform(Xm)[0, 2] == pytest.approx(0.9)
    # with row 2 removed the nearest non-identical row is row 3
    assert LocalMeanImputer(layers="image", n_neighbors=1).fit(Xm[[0, 1, 3]]).transform(
        Xm[:1]
    )[0, 2] == pytest.approx(0.3)


def test_large_image_weight_gives_the_image_level_without_the_image_itself():
    # β → ∞: the output tends to ẑ, the layer-2 mean over the other images (self excluded);
    # |x̂ − ẑ| = S |z − ẑ| / (S + β) ≤ S/β for pixels in [0, 1]
    X = _fashion(40)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.5, seed=7))
    beta = 1e8
    out = LocalMeanImputer(
        (28, 28), image_weight=beta, pixel_bandwidth=0.7
    ).fit_transform(Xm)
    z, S = pixel_local_mean(Xm, (28, 28), bandwidth=0.7, return_mass=True)
    zhat = image_local_mean(
        Xm, Xm, z, n_neighbors=10, imputed_weight=0.3, exclude=np.eye(40, dtype=bool)
    ).numpy()
    miss = np.isnan(Xm)
    bound = S.numpy() / beta + 784 * np.finfo(float).eps
    assert np.all(np.abs(out - zhat)[miss] <= bound[miss])
    # and the image itself would be a different neighbourhood: including it changes ẑ
    zhat_self = image_local_mean(Xm, Xm, z, n_neighbors=10, imputed_weight=0.3).numpy()
    assert np.abs(zhat_self - zhat)[miss].max() > 100 * bound[miss].max()


def test_sklearn_api():
    from sklearn.base import clone

    imp = LocalMeanImputer((28, 28), n_neighbors=7)
    assert clone(imp).get_params()["n_neighbors"] == 7
    imp.set_params(image_weight=0.2)
    assert imp.image_weight == 0.2


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.05, 0.8))
def test_property_observed_kept_and_output_within_observed_range(seed, rate):
    rng = np.random.default_rng(seed)
    X = rng.random((8, 25))
    mask = missing_at_random_mask(X.shape, rate, seed=seed)
    Xm = _masked(X, mask)
    out = LocalMeanImputer((5, 5), n_neighbors=3).fit_transform(Xm)
    np.testing.assert_array_equal(out[~mask], X[~mask])
    # local means are convex combinations of observed values
    lo, hi = np.nanmin(Xm), np.nanmax(Xm)
    assert np.all(out >= lo - 1e-12) and np.all(out <= hi + 1e-12)


# --- bad inputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, X, match",
    [
        ({"image_shape": (5, 5)}, np.zeros((3, 24)), "image_shape"),
        ({"layers": "both"}, np.zeros((3, 25)), "image_shape"),
        ({"layers": "pixel"}, np.zeros((3, 25)), "image_shape"),
        (
            {"image_shape": (5, 5), "image_weight": "automatic"},
            np.zeros((3, 25)),
            "image_weight",
        ),
        ({"image_shape": (5, 5), "holdout": 1.0}, np.zeros((3, 25)), "holdout"),
        ({"image_shape": (5, 5), "layers": "deep"}, np.zeros((3, 25)), "layers"),
        ({"image_shape": (5, 5), "n_neighbors": 0}, np.zeros((3, 25)), "n_neighbors"),
        (
            {"image_shape": (5, 5), "pixel_bandwidth": -1.0},
            np.zeros((3, 25)),
            "pixel_bandwidth",
        ),
        (
            {"image_shape": (5, 5), "image_weight": 0.0},
            np.zeros((3, 25)),
            "image_weight",
        ),
        (
            {"image_shape": (5, 5), "imputed_weight": 1.5},
            np.zeros((3, 25)),
            "imputed_weight",
        ),
        ({"image_shape": (5, 5), "pixel_kernel": "boxy"}, np.zeros((3, 25)), "kernel"),
        ({"image_shape": (5, 5)}, np.zeros(25), "2D"),
        ({"image_shape": (5, 5)}, np.full((3, 25), np.inf), "infinity"),
        ({"image_shape": (5, 5)}, torch.full((3, 25), math.inf), "infinite"),
        ({"image_shape": (5, 5)}, np.full((3, 25), np.nan), "X"),
        ({"image_shape": (5, 5)}, [["a"] * 25], "string"),
    ],
)
def test_bad_inputs(kwargs, X, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LocalMeanImputer(**kwargs).fit(X)


def test_transform_errors():
    imp = LocalMeanImputer((5, 5))
    with pytest.raises(NotFittedError, match="not fitted"):
        imp.transform(np.zeros((2, 25)))
    imp.fit(np.zeros((2, 25)))
    with pytest.raises(ValueError, match="features"):
        imp.transform(np.zeros((2, 24)))
    with pytest.raises(ValueError, match="features"):
        imp.transform(torch.zeros(2, 24))


def test_mask_helpers():
    m = block_mask(5, (8, 8), 3, seed=0)
    assert m.shape == (5, 64) and np.all(m.sum(1) == 9)
    assert missing_at_random_mask((100, 100), 0.3, seed=0).mean() == pytest.approx(
        0.3, abs=0.02
    )
    with pytest.raises(ValueError, match="rate"):
        missing_at_random_mask((2, 2), 1.0)
    with pytest.raises(ValueError, match="block"):
        block_mask(2, (8, 8), 9)
    with pytest.raises(ValueError, match="missing"):
        rmse_missing(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2), bool))


def test_image_local_mean_bad_inputs():
    X = np.random.default_rng(0).random((5, 9))
    with pytest.raises(ValueError, match="Z_ref"):
        image_local_mean(X, X, X[:, :4])
    with pytest.raises(ValueError, match="exclude"):
        image_local_mean(X, X, X, exclude=np.zeros((5, 4), bool))
    with pytest.raises(ValueError, match="n_neighbors"):
        image_local_mean(X, X, X, n_neighbors=0)
    with pytest.raises(ValueError, match="Xq"):
        nan_sq_distances(X[:, :3], X)


# --- scikit-learn's estimator checks, tabular mode and the hold-out tuning ------------------------
@parametrize_with_checks(
    [LocalMeanImputer(), LocalMeanImputer(n_neighbors=3, image_kernel="epanechnikov")]
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_sparse_input_is_refused_with_a_clear_message():
    import scipy.sparse as sp

    with pytest.raises(TypeError, match="sparse input.*toarray"):
        LocalMeanImputer().fit(sp.csr_matrix(np.eye(4)))
    imp = LocalMeanImputer().fit(np.eye(4))
    with pytest.raises(TypeError, match="sparse"):
        imp.transform(sp.csr_matrix(np.eye(4)))


def test_tabular_mode_is_the_image_layer_on_raw_values():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 6)) @ rng.normal(
        size=(6, 6)
    )  # correlated columns, any scale
    mask = missing_at_random_mask(X.shape, 0.2, seed=1)
    Xm = _masked(X, mask)
    imp = LocalMeanImputer(n_neighbors=4)
    out = imp.fit_transform(Xm)
    assert imp.layers_ == "image" and imp.holdout_scores_ is None
    np.testing.assert_array_equal(
        out, LocalMeanImputer(layers="image", n_neighbors=4).fit_transform(Xm)
    )
    np.testing.assert_array_equal(out[~mask], X[~mask])
    # each imputed value is a convex combination of its column's observed values
    lo, hi = np.nanmin(Xm, axis=0), np.nanmax(Xm, axis=0)
    assert np.all((out >= lo - 1e-12) & (out <= hi + 1e-12))


def test_holdout_mask_hides_only_observed_values():
    X = _masked(np.ones((50, 30)), missing_at_random_mask((50, 30), 0.4, seed=0))
    hide = holdout_mask(X, 0.25, seed=1)
    assert not np.any(hide & np.isnan(X))
    assert hide.sum() / (~np.isnan(X)).sum() == pytest.approx(0.25, abs=0.03)
    np.testing.assert_array_equal(hide, holdout_mask(X, 0.25, seed=1))  # seeded
    few = holdout_mask(X, 0.25, seed=1, max_rows=7)
    assert few.any(1).sum() <= 7 and not np.any(few & np.isnan(X))
    with pytest.raises(ValueError, match="fraction"):
        holdout_mask(X, 1.0)


def _holdout_rmse_by_hand(Xm, X, imp, hide):
    """The two-layer RMSE on the hidden values at the imputer's chosen (h, β)."""
    Xh = Xm.copy()
    Xh[hide] = np.nan
    filled = np.nan_to_num(Xm, nan=-1)
    same = (filled[:, None] == filled[None]).all(-1)
    z, S = pixel_local_mean(Xh, (28, 28), imp.pixel_bandwidth_, return_mass=True)
    zr = pixel_local_mean(Xm, (28, 28), imp.pixel_bandwidth_)
    zhat = image_local_mean(
        Xh, Xm, zr, n_neighbors=10, imputed_weight=0.3, exclude=same
    ).numpy()
    z, S = z.numpy(), S.numpy()
    est = (S * z + imp.image_weight_ * zhat) / (S + imp.image_weight_)
    return np.sqrt(np.mean((est[hide] - X[hide]) ** 2))


def test_auto_picks_by_the_one_standard_error_rule():
    X = _fashion(60)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.5, seed=2))
    imp = LocalMeanImputer((28, 28)).fit(Xm)
    sc = imp.holdout_scores_
    assert sc["rmse"].shape == (len(PIXEL_BANDWIDTH_GRID), len(IMAGE_WEIGHT_GRID))
    a = PIXEL_BANDWIDTH_GRID.index(imp.pixel_bandwidth_)
    b = IMAGE_WEIGHT_GRID.index(imp.image_weight_)
    # eligible: MSE within one standard error of the best; the smallest such β is chosen
    mse = sc["rmse"] ** 2
    eligible = mse - mse.min() <= sc["se"]
    assert eligible[a, b] and not eligible[:, :b].any()
    assert mse[a, b] == mse[:, b][eligible[:, b]].min()
    assert sc["se"].min() == 0.0 and sc["se"].max() > 0  # zero at the best pair only
    assert sc["best_rmse"] == pytest.approx(sc["rmse"].min())
    # the score at the chosen pair is the RMSE of imputing the hidden values by hand
    hide = holdout_mask(Xm, imp.holdout, imp.random_state, 200)
    assert _holdout_rmse_by_hand(Xm, X, imp, hide) == pytest.approx(
        sc["rmse"][a, b], rel=1e-9
    )
    # fixed values are used as given, with no tuning
    fixed = LocalMeanImputer((28, 28), pixel_bandwidth=0.9, image_weight=2.0).fit(Xm)
    assert (fixed.pixel_bandwidth_, fixed.image_weight_, fixed.holdout_scores_) == (
        0.9,
        2.0,
        None,
    )
    only_beta = LocalMeanImputer((28, 28), pixel_bandwidth=0.9).fit(Xm)
    assert only_beta.pixel_bandwidth_ == 0.9 and only_beta.holdout_scores_[
        "rmse"
    ].shape == (1, len(IMAGE_WEIGHT_GRID))


def test_holdout_never_sees_the_hidden_values_through_a_copy():
    # every row twice: were a row's own copy among its neighbours, the image level would copy
    # the hidden values back and the hold-out RMSE at the largest β would be ~0
    X = _fashion(30)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.3, seed=5))
    imp = LocalMeanImputer((28, 28)).fit(np.vstack([Xm, Xm]))
    assert imp.holdout_scores_["rmse"][:, -1].min() > 0.05


def test_auto_adapts_beta_to_the_resolution():
    # on 8×8 digits the image level must dominate (issue 15: the fixed β = 0.3 lost to KNNImputer)
    from sklearn.datasets import load_digits
    from sklearn.impute import KNNImputer

    D = load_digits().data[:500] / 16.0
    mask = missing_at_random_mask(D.shape, 0.3, seed=0)
    Dm = _masked(D, mask)
    imp = LocalMeanImputer((8, 8))
    ours = rmse_missing(imp.fit_transform(Dm), D, mask)
    fixed = rmse_missing(
        LocalMeanImputer((8, 8), pixel_bandwidth=0.7, image_weight=0.3).fit_transform(
            Dm
        ),
        D,
        mask,
    )
    knn = rmse_missing(KNNImputer(n_neighbors=5).fit_transform(Dm), D, mask)
    assert ours < 0.85 * fixed and ours < 1.05 * knn


def test_separable_and_dense_pixel_paths_agree():
    # the Gaussian path is a separable convolution; other kernels use the dense (P, P) matrix.
    # A Gaussian written as a custom kernel goes through the dense path: both must agree.
    from localbook.kernels import Kernel
    from localbook.impute import _pixel_layer

    rng = np.random.default_rng(4)
    X = torch.as_tensor(rng.random((5, 6 * 7)))
    X[torch.as_tensor(rng.random((5, 42)) < 0.5)] = math.nan
    dense = Kernel("gaussian-dense", lambda u2: -0.5 * u2, compact=False)
    for h in (0.3, 1.0, 2.5):
        a = _pixel_layer(X, 6, 7, h, lb.kernels.get_kernel("gaussian"))
        b = _pixel_layer(X, 6, 7, h, dense)
        miss = torch.isnan(X)
        torch.testing.assert_close(a[0], b[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a[1][miss], b[1][miss], rtol=1e-12, atol=1e-300)


def test_one_se_choice_by_hand():
    from localbook.impute import _one_se_choice

    # rows 0..3; pair (0, 2) best; (1, 0) ties it within noise, (0, 0) is far worse
    sse = torch.zeros(2, 3, 4, dtype=torch.float64)
    sse[0, 0] = torch.tensor([5.0, 5.0, 5.0, 5.0])
    sse[0, 1] = torch.tensor([2.0, 2.0, 2.0, 2.0])
    sse[0, 2] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    sse[1, 0] = torch.tensor([1.0, 1.3, 0.8, 1.1])  # differences 0, .3, -.2, .1
    sse[1, 1] = sse[0, 1]
    sse[1, 2] = sse[0, 2] + 0.5
    d = torch.tensor([0.0, 0.3, -0.2, 0.1])
    se = float(d.std() * 2 / 40)  # sqrt(rows) · sd / n_hidden
    assert float(d.sum() / 40) <= se  # (1, 0) is within one standard error
    assert _one_se_choice(sse, 40) == (1, 0)


def test_tuning_ignores_rows_the_holdout_cannot_use():
    # an all-missing row and a one-value row, anywhere in X, change nothing
    from sklearn.datasets import load_digits

    D = load_digits().data[:400] / 16.0
    Dm = _masked(D, missing_at_random_mask(D.shape, 0.3, seed=0))
    base = LocalMeanImputer((8, 8)).fit(Dm)
    one = np.full((1, 64), np.nan)
    one[0, 5] = 0.5
    for extra in (
        np.vstack([np.full((1, 64), np.nan), Dm]),
        np.vstack([Dm, np.full((2, 64), np.nan), one]),
        np.vstack([one, Dm[:200], np.full((1, 64), np.nan), Dm[200:]]),
    ):
        imp = LocalMeanImputer((8, 8)).fit(extra)
        assert (imp.pixel_bandwidth_, imp.image_weight_) == (
            base.pixel_bandwidth_,
            base.image_weight_,
        )
        np.testing.assert_array_equal(
            imp.holdout_scores_["rmse"], base.holdout_scores_["rmse"]
        )
    # holdout_mask draws the same rows whatever unusable rows are added
    h0 = holdout_mask(Dm, 0.1, seed=3, max_rows=50)
    h1 = holdout_mask(
        np.vstack([Dm, np.full((3, 64), np.nan)]), 0.1, seed=3, max_rows=50
    )
    np.testing.assert_array_equal(h0, h1[:400])
    assert not h1[400:].any()


def test_the_choice_is_stable_across_holdout_draws():
    # the hold-out curve is flat over large β; the rule keeps the choice near its edge
    from sklearn.datasets import load_digits

    D = load_digits().data / 16.0
    Dm = _masked(D, missing_at_random_mask(D.shape, 0.3, seed=0))
    betas = {
        LocalMeanImputer((8, 8), random_state=r).fit(Dm).image_weight_ for r in range(4)
    }
    assert max(betas) / min(betas) <= 10**0.5 + 1e-9  # at most two grid steps apart


@pytest.mark.parametrize("image_shape", [(5, 5), None])
def test_never_observed_feature_warns_and_gets_the_documented_fallback(image_shape):
    rng = np.random.default_rng(0)
    X = rng.random((12, 25))
    X[:, [0, 7]] = np.nan
    X[rng.random(X.shape) < 0.2] = np.nan
    with pytest.warns(UserWarning, match=r"2 feature\(s\) never observed .*index 0, 7"):
        imp = LocalMeanImputer(image_shape, image_weight=0.3, pixel_bandwidth=0.7).fit(
            X
        )
    mean = np.nanmean(np.where(np.isnan(X), np.nan, X), axis=0)
    fb = imp.feature_mean_.numpy()
    if image_shape is None:
        want = np.full(2, np.nanmean(X))
    else:  # the Gaussian local mean (h = 1 pixel) of the observed features' means
        pos = np.array([(r, c) for r in range(5) for c in range(5)], float)
        ok = ~np.isnan(mean)
        want = []
        for p in (0, 7):
            w = np.exp(-((pos[ok] - pos[p]) ** 2).sum(1) / 2)
            want.append((w * mean[ok]).sum() / w.sum())
    np.testing.assert_allclose(fb[[0, 7]], want, rtol=1e-12)
    np.testing.assert_allclose(fb[~np.isnan(mean)], mean[~np.isnan(mean)], rtol=1e-12)
    out = imp.transform(np.full((1, 25), np.nan))  # nothing reaches: the fallback
    np.testing.assert_allclose(out[0], fb, rtol=1e-12)


def test_holdout_mask_blocks():
    X = _masked(np.ones((40, 64)), block_mask(40, (8, 8), 3, seed=0))
    hide = holdout_mask(X, seed=1, block=3, image_shape=(8, 8))
    assert not np.any(hide & np.isnan(X))
    rows = hide.any(1)
    assert rows.sum() >= 30 and hide[rows].sum(1).max() <= 9
    for r in np.flatnonzero(rows):  # inside one 3 × 3 square
        rr, cc = np.divmod(np.flatnonzero(hide[r]), 8)
        assert rr.max() - rr.min() <= 2 and cc.max() - cc.min() <= 2
    full = holdout_mask(np.ones((10, 64)), seed=2, block=3, image_shape=(8, 8))
    assert np.all(full.sum(1) == 9)  # complete rows lose a whole square
    with pytest.raises(ValueError, match="image_shape"):
        holdout_mask(X, block=3, image_shape=(8, 7))
    with pytest.raises(ValueError, match="block"):
        holdout_mask(X, block=9, image_shape=(8, 8))


def test_holdout_block_tunes_on_block_shaped_holes():
    X = _fashion(80)
    mask = block_mask(len(X), (28, 28), 10, seed=0)
    Xm = _masked(X, mask)
    imp = LocalMeanImputer((28, 28), holdout_block=10).fit(Xm)
    hide = holdout_mask(
        Xm, imp.holdout, imp.random_state, 200, block=10, image_shape=(28, 28)
    )
    sc = imp.holdout_scores_
    assert sc["n_hidden"] == hide.sum() > 60 * 50
    a = PIXEL_BANDWIDTH_GRID.index(imp.pixel_bandwidth_)
    b = IMAGE_WEIGHT_GRID.index(imp.image_weight_)
    assert _holdout_rmse_by_hand(Xm, X, imp, hide) == pytest.approx(
        sc["rmse"][a, b], rel=1e-9
    )
    with pytest.raises(ValueError, match="holdout_block"):
        LocalMeanImputer((28, 28), holdout_block=29).fit(Xm)
    with pytest.raises(ValueError, match="image_shape"):
        LocalMeanImputer(holdout_block=3).fit(Xm)


# --- issue 27: feature names and set_output ---------------------------------------------------
@pytest.mark.faults
def test_imputer_feature_names_and_pandas_output():
    pd = pytest.importorskip("pandas")
    X = np.random.default_rng(0).normal(size=(15, 4))
    X[1, 2] = X[5, 0] = X[9, 3] = np.nan
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"], index=np.arange(100, 115))
    plain = LocalMeanImputer(n_neighbors=3).fit(X)
    np.testing.assert_array_equal(
        plain.get_feature_names_out(), ["x0", "x1", "x2", "x3"]
    )
    np.testing.assert_array_equal(
        plain.get_feature_names_out(["p", "q", "r", "s"]), ["p", "q", "r", "s"]
    )
    imp = LocalMeanImputer(n_neighbors=3).set_output(transform="pandas")
    out = imp.fit_transform(df)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == ["a", "b", "c", "d"] and list(out.index) == list(
        df.index
    )
    np.testing.assert_array_equal(imp.get_feature_names_out(), ["a", "b", "c", "d"])
    np.testing.assert_allclose(  # a DataFrame's memory order may change a last bit
        out.to_numpy(), LocalMeanImputer(n_neighbors=3).fit_transform(X), rtol=1e-13
    )
    again = imp.transform(df.iloc[:4])
    assert isinstance(again, pd.DataFrame) and list(again.index) == list(df.index[:4])
    with pytest.raises(ValueError, match="input_features"):
        imp.get_feature_names_out(["a", "b", "c", "e"])
