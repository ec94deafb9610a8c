"""Tests of localbook.impute (the two-layer local-mean imputer) and localbook.fashion_mnist (downloader)."""
import gzip
import hashlib
import io
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb
from localbook import fashion_mnist as fm
from localbook.impute import (
    LocalMeanImputer,
    block_mask,
    image_local_mean,
    missing_at_random_mask,
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
                assert out[i, p] == pytest.approx((w * X[i, obs]).sum() / w.sum(), rel=1e-10)
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
    np.testing.assert_allclose(np.sqrt(d2.numpy()), nan_euclidean_distances(A, B), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(common.numpy(), (~np.isnan(A)).astype(int) @ (~np.isnan(B)).astype(int).T)


def test_image_local_mean_prefers_observed_values():
    # two neighbours at equal distance: one observed the pixel (value 1), one imputed it (value 0)
    Xq = np.array([[0.5, 0.5, np.nan]])
    X_ref = np.array([[0.5, 0.5, 1.0], [0.5, 0.5, np.nan]])
    Z_ref = np.array([[0.5, 0.5, 1.0], [0.5, 0.5, 0.0]])
    for lam in [1.0, 0.3, 0.01]:
        out = image_local_mean(Xq, X_ref, Z_ref, n_neighbors=2, imputed_weight=lam).numpy()
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
    mask = missing_at_random_mask(X.shape, 0.5, seed=0) if mask_kind == "mar" else block_mask(60, (28, 28), 10, seed=0)
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
    scores = {lay: rmse_missing(LocalMeanImputer((28, 28), layers=lay).fit_transform(Xm), X, mask)
              for lay in ["pixel", "image", "both"]}
    assert scores["both"] < scores["pixel"] and scores["both"] < scores["image"]


def test_fit_transform_equals_fit_then_transform_and_tensor_io(device):
    X = _fashion(30)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.3, seed=3))
    a = LocalMeanImputer((28, 28)).fit_transform(Xm)
    b = LocalMeanImputer((28, 28)).fit(Xm).transform(Xm)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    t = torch.as_tensor(Xm, device=device)
    c = LocalMeanImputer((28, 28)).fit_transform(t)
    assert isinstance(c, torch.Tensor) and c.device.type == device.type and c.dtype == torch.float64
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
    Xm = np.array([[0.2, 0.4, np.nan, 0.8],
                   [0.2, 0.4, np.nan, 0.8],   # exact copy of row 0
                   [0.2, 0.4, 0.9, np.nan],   # distance 0 to row 0 on the shared pixels
                   [0.7, 0.1, 0.3, 0.5]])
    imp = LocalMeanImputer(layers="image", n_neighbors=1).fit(Xm)
    out = imp.transform(Xm[:1])
    assert out[0, 2] == pytest.approx(0.9)  # from row 2, not from row 0 or its copy
    assert imp.fit_transform(Xm)[0, 2] == pytest.approx(0.9)
    # with row 2 removed the nearest non-identical row is row 3
    assert LocalMeanImputer(layers="image", n_neighbors=1).fit(Xm[[0, 1, 3]]).transform(
        Xm[:1])[0, 2] == pytest.approx(0.3)


def test_large_image_weight_gives_the_image_level_without_the_image_itself():
    # β → ∞: the output tends to ẑ, the layer-2 mean over the other images (self excluded);
    # |x̂ − ẑ| = S |z − ẑ| / (S + β) ≤ S/β for pixels in [0, 1]
    X = _fashion(40)
    Xm = _masked(X, missing_at_random_mask(X.shape, 0.5, seed=7))
    beta = 1e8
    out = LocalMeanImputer((28, 28), image_weight=beta).fit_transform(Xm)
    z, S = pixel_local_mean(Xm, (28, 28), bandwidth=0.7, return_mass=True)
    zhat = image_local_mean(Xm, Xm, z, n_neighbors=10, imputed_weight=0.3,
                            exclude=np.eye(40, dtype=bool)).numpy()
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
        ({}, np.zeros((3, 25)), "image_shape"),
        ({"image_shape": (5, 5), "layers": "deep"}, np.zeros((3, 25)), "layers"),
        ({"image_shape": (5, 5), "n_neighbors": 0}, np.zeros((3, 25)), "n_neighbors"),
        ({"image_shape": (5, 5), "pixel_bandwidth": -1.0}, np.zeros((3, 25)), "pixel_bandwidth"),
        ({"image_shape": (5, 5), "image_weight": 0.0}, np.zeros((3, 25)), "image_weight"),
        ({"image_shape": (5, 5), "imputed_weight": 1.5}, np.zeros((3, 25)), "imputed_weight"),
        ({"image_shape": (5, 5), "pixel_kernel": "boxy"}, np.zeros((3, 25)), "kernel"),
        ({"image_shape": (5, 5)}, np.zeros(25), "X"),
        ({"image_shape": (5, 5)}, np.full((3, 25), np.inf), "X"),
        ({"image_shape": (5, 5)}, np.full((3, 25), np.nan), "X"),
        ({"image_shape": (5, 5)}, [["a"] * 25], "X"),
    ],
)
def test_bad_inputs(kwargs, X, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LocalMeanImputer(**kwargs).fit(X)


def test_transform_errors():
    imp = LocalMeanImputer((5, 5))
    with pytest.raises(RuntimeError, match="not fitted"):
        imp.transform(np.zeros((2, 25)))
    imp.fit(np.zeros((2, 25)))
    with pytest.raises(ValueError, match="features"):
        imp.transform(np.zeros((2, 24)))


def test_mask_helpers():
    m = block_mask(5, (8, 8), 3, seed=0)
    assert m.shape == (5, 64) and np.all(m.sum(1) == 9)
    assert missing_at_random_mask((100, 100), 0.3, seed=0).mean() == pytest.approx(0.3, abs=0.02)
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
