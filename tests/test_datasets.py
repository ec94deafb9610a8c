"""Tests of localbook.datasets as the one home of the data generators, and of its import cost.

The generators themselves are tested where their chapter is (test_sagl: the multi-view data;
test_impute: the missing-value masks); here: that every old import path still gives the same
object, that the masks are what they claim to be, that the shared argument checks of
``_validate`` say what is wrong, and that ``import localbook`` loads no scikit-learn.
"""

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import localbook as lb
from localbook import _validate, datasets

MASKS = ["missing_at_random_mask", "block_mask", "holdout_mask"]


def test_masks_are_documented_once_in_datasets():
    # the imputer uses the masks; no old import path is kept (the project is unreleased)
    import localbook.impute

    for name in MASKS:
        f = getattr(datasets, name)
        assert name in datasets.__all__ and getattr(lb, name) is f
        assert name not in localbook.impute.__all__


def test_lazy_names_match_each_modules_all():
    # __init__ reads the lazy modules' __all__ from their source with a regular expression
    import localbook.estimators
    import localbook.impute

    for module in (localbook.estimators, localbook.impute):
        short = module.__name__.rsplit(".", 1)[1]
        assert sorted(lb._public_names(short)) == sorted(module.__all__)
        for name in module.__all__:
            assert getattr(lb, name) is getattr(module, name)


def test_import_loads_no_scikit_learn():
    code = (
        "import sys, localbook as lb; lb.datasets.block_mask(2, (4, 4), 2); "
        "lb.missing_at_random_mask((3, 3), 0.5); lb.make_multiview_subspaces(n_per_class=2); "
        "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(0, 10_000),
    st.data(),
)
def test_block_mask_is_one_square_per_image(n, H, W, seed, data):
    block = data.draw(st.integers(1, min(H, W)))
    m = datasets.block_mask(n, (H, W), block, seed=seed)
    assert m.shape == (n, H * W) and m.dtype == bool
    for row in m.reshape(n, H, W):
        r, c = np.nonzero(row)
        assert len(r) == block * block
        assert r.max() - r.min() == block - 1 and c.max() - c.min() == block - 1


def test_missing_at_random_mask_rates_and_errors():
    assert not datasets.missing_at_random_mask((5, 4), 0.0).any()
    m = datasets.missing_at_random_mask((200, 100), 0.25, seed=3)
    # 20,000 Bernoulli(0.25) draws: standard error sqrt(0.25·0.75/20000) ≈ 0.0031; 5 of them
    assert abs(m.mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / m.size)
    np.testing.assert_array_equal(
        m, datasets.missing_at_random_mask((200, 100), 0.25, seed=3)
    )
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
        datasets.missing_at_random_mask((2, 2), 1.0)
    with pytest.raises(ValueError, match="rate"):
        datasets.missing_at_random_mask((2, 2), -0.1)


def test_holdout_mask_takes_tensors_like_arrays():
    X = np.random.default_rng(0).random((30, 12))
    X[datasets.missing_at_random_mask(X.shape, 0.3, seed=1)] = np.nan
    np.testing.assert_array_equal(
        datasets.holdout_mask(X, 0.2, seed=4),
        datasets.holdout_mask(torch.as_tensor(X), 0.2, seed=4),
    )
    with pytest.raises(ValueError, match="2-D"):
        datasets.holdout_mask(X[0], 0.2)


def test_view_dims_checks():
    with pytest.raises(TypeError, match="view_dims"):
        datasets.make_multiview_subspaces(view_dims=5)
    with pytest.raises(ValueError, match="view_dims"):
        datasets.make_multiview_subspaces(view_dims=[4, 0])


@pytest.mark.parametrize(
    "kwargs, value, ok",
    [
        ({}, 0.5, True),
        ({}, 0.0, False),
        ({}, 1.0, False),
        ({"allow_zero": True}, 0.0, True),
        ({"allow_one": True}, 1.0, True),
        ({"allow_one": True}, 1.5, False),
        ({}, float("nan"), False),
    ],
)
def test_check_fraction(kwargs, value, ok):
    if ok:
        assert _validate.check_fraction(value, "p", **kwargs) == value
    else:
        with pytest.raises(ValueError, match="p must be"):
            _validate.check_fraction(value, "p", **kwargs)
    with pytest.raises(TypeError, match="p must be a number"):
        _validate.check_fraction("0.5", "p", **kwargs)


def test_check_image_shape():
    assert _validate.check_image_shape((3, 4), 12) == (3, 4)
    with pytest.raises(ValueError, match="does not match"):
        _validate.check_image_shape((3, 4), 13)
    with pytest.raises(ValueError, match="pair"):
        _validate.check_image_shape((3, 4, 5))
    with pytest.raises(TypeError, match="pair"):
        _validate.check_image_shape(7)
    with pytest.raises(ValueError, match="needed"):
        _validate.check_image_shape(None)
