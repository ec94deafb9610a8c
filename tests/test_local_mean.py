"""localbook.local_mean against statsmodels' KernelReg, brute force, and properties."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import localbook as lb


def _data(n, d, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, d))
    y = np.sin(2 * x).sum(1) + 0.1 * rng.normal(size=n)
    q = rng.uniform(-1.2, 1.2, (40, d))
    return x, y, q


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("reg_type", ["lc", "ll"])
def test_matches_statsmodels_kernelreg(d, reg_type):
    # only this test needs statsmodels; the rest of the file runs without it
    statsmodels_kr = pytest.importorskip("statsmodels.nonparametric.kernel_regression")
    x, y, q = _data(150, d, seed=d)
    bw = [0.35, 0.5, 0.6][:d]
    ref = statsmodels_kr.KernelReg(y, x, "c" * d, reg_type=reg_type, bw=bw).fit(q)[0]
    f = lb.nadaraya_watson if reg_type == "lc" else lb.local_linear
    got = f(
        torch.tensor(q),
        torch.tensor(x),
        torch.tensor(y),
        torch.tensor(bw, dtype=torch.float64),
    ).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-8, atol=1e-10)


def test_outputs_follow_device_and_dtype(device):
    x, y, q = _data(80, 2)
    for dtype in (torch.float32, torch.float64):
        xt, yt, qt = (torch.tensor(a, dtype=dtype, device=device) for a in (x, y, q))
        for f in (lb.nadaraya_watson, lb.local_linear):
            out = f(qt, xt, yt, 0.4)
            assert (
                out.device.type == device.type
                and out.dtype == dtype
                and out.shape == (40,)
            )
    # integer inputs become the default float dtype
    out = lb.nadaraya_watson([0, 1], [0, 1, 2], [1, 2, 3], 1.0)
    assert out.dtype == torch.get_default_dtype()


def test_cuda_agrees_with_cpu(device):
    x, y, q = _data(300, 2)
    args = [torch.tensor(a) for a in (q, x, y)]
    for f in (lb.nadaraya_watson, lb.local_linear):
        ref = f(*args, 0.3)
        got = f(*[a.to(device) for a in args], 0.3).cpu()
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_multi_output_is_columnwise():
    x, y, q = _data(100, 2)
    Y = np.stack([y, -2 * y + 1], 1)
    for f in (lb.nadaraya_watson, lb.local_linear):
        both = f(q, x, Y, 0.4)
        assert both.shape == (40, 2)
        torch.testing.assert_close(both[:, 0], f(q, x, y, 0.4))
        torch.testing.assert_close(both[:, 1], f(q, x, -2 * y + 1, 0.4))


@pytest.mark.parametrize("kernel", list(lb.KERNELS))
def test_nw_equals_explicit_weighted_mean(kernel):
    x, y, q = _data(120, 2)
    K = lb.kernel_matrix(q, x, 0.7, kernel)
    ref = (K @ torch.tensor(y)) / K.sum(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = lb.nadaraya_watson(q, x, y, 0.7, kernel)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12, equal_nan=True)


def test_small_chunks_give_same_answer(monkeypatch):
    x, y, q = _data(200, 2)
    ref_nw, ref_ll = lb.nadaraya_watson(q, x, y, 0.3), lb.local_linear(q, x, y, 0.3)
    import localbook.chunks as kern

    monkeypatch.setattr(kern, "CPU_MEMORY_BUDGET", 4096)
    monkeypatch.setattr(kern, "MEMORY_BUDGET", 4096)
    torch.testing.assert_close(lb.nadaraya_watson(q, x, y, 0.3), ref_nw)
    torch.testing.assert_close(lb.local_linear(q, x, y, 0.3), ref_ll)


def test_far_query_gets_nearest_value_not_nan():
    x = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    y = torch.tensor([5.0, 6.0, 7.0], dtype=torch.float64)
    out = lb.nadaraya_watson([[1e4], [-1e4]], x, y, 0.01)
    torch.testing.assert_close(out, torch.tensor([7.0, 5.0], dtype=torch.float64))
    out = lb.local_linear([[50.0]], x, y, 0.01)
    assert torch.isfinite(out).all()


def test_empty_neighbourhood_warns_once_and_gives_nan():
    x = torch.linspace(0, 1, 11, dtype=torch.float64)
    y = x.clone()
    with pytest.warns(UserWarning, match="2 of 3 queries have no data point") as rec:
        out = lb.nadaraya_watson([0.5, 5.0, -5.0], x, y, 0.2, kernel="epanechnikov")
    assert len([w for w in rec if issubclass(w.category, UserWarning)]) == 1
    assert torch.isnan(out[1:]).all() and torch.isclose(
        out[0], torch.tensor(0.5, dtype=torch.float64)
    )
    with pytest.warns(UserWarning, match="1 of 1"):
        assert torch.isnan(lb.local_linear([9.0], x, y, 0.2, kernel="uniform")).all()


def test_equivalent_kernel_reproduces_local_linear_and_1d_formula():
    x, y, q = _data(90, 1)
    L = lb.equivalent_kernel(q, x, 0.3)
    torch.testing.assert_close(L @ torch.tensor(y), lb.local_linear(q, x, y, 0.3))
    torch.testing.assert_close(L.sum(1), torch.ones(40, dtype=L.dtype))
    # 1-D closed form ℓᵢ ∝ Kᵢ (S₂ − (xᵢ − x*) S₁)
    xs = torch.tensor(x[:, 0])
    for a in range(5):
        t = float(q[a, 0])
        K = torch.exp(-0.5 * ((xs - t) / 0.3) ** 2)
        S1, S2 = (K * (xs - t)).sum(), (K * (xs - t) ** 2).sum()
        w = K * (S2 - (xs - t) * S1)
        torch.testing.assert_close(L[a], w / w.sum())
    # linear functions are reproduced exactly (and weights go negative at the boundary)
    torch.testing.assert_close(
        lb.local_linear(q, x, 3 * x[:, 0] - 1, 0.3), torch.tensor(3 * q[:, 0] - 1)
    )
    assert (lb.equivalent_kernel([[-1.2]], x, 0.3) < 0).any()


@pytest.mark.parametrize("method", ["nw", "ll"])
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_loo_shortcut_equals_brute_force(method, kernel):
    x, y, _ = _data(50, 1, seed=3)
    x, y = torch.tensor(x[:, 0]), torch.tensor(y)
    f = lb.nadaraya_watson if method == "nw" else lb.local_linear
    h = 0.4
    resid = []
    for i in range(len(x)):
        keep = torch.arange(len(x)) != i
        resid.append(float(y[i] - f(x[i : i + 1], x[keep], y[keep], h, kernel)))
    brute = float(np.mean(np.square(resid)))
    assert math.isclose(lb.loo_cv_score(x, y, h, kernel, method), brute, rel_tol=1e-9)


def test_loo_is_inf_when_a_point_is_alone():
    assert (
        lb.loo_cv_score([0.0, 0.1, 5.0], [1.0, 2.0, 3.0], 0.5, "epanechnikov")
        == math.inf
    )


def test_select_bandwidth_picks_the_grid_minimum():
    x, y = lb.datasets.make_regression_1d(120, noise=0.3, seed=1, dtype=torch.float64)
    grid = [0.01, 0.03, 0.05, 0.1, 0.3]
    sel = lb.select_bandwidth(x, y, grid)
    scores = [lb.loo_cv_score(x, y, h) for h in grid]
    assert sel.bandwidth == grid[int(np.argmin(scores))]
    np.testing.assert_allclose(sel.scores.numpy(), scores)
    assert 0.01 < sel.bandwidth < 0.3
    default = lb.select_bandwidth(x, y)
    assert len(default.grid) == 30 and default.bandwidth in default.grid.tolist()


def test_knn_is_a_local_mean_and_matches_sklearn():
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

    x, y, q = _data(200, 2, seed=5)
    ref = KNeighborsRegressor(7).fit(x, y).predict(q)
    np.testing.assert_allclose(lb.knn_regress(q, x, y, 7).numpy(), ref, rtol=1e-12)
    labels = (y > 0).astype(int) + (x[:, 0] > 0.5)
    clf = KNeighborsClassifier(5).fit(x, labels)
    pred, proba, classes = lb.knn_classify(q, x, labels, 5, return_proba=True)
    np.testing.assert_allclose(proba.numpy(), clf.predict_proba(q), rtol=1e-12)
    # no ties possible with 5 neighbours and ≤ 3 classes unless two classes get 2 votes each
    agree = (pred.numpy() == clf.predict(q)).mean()
    assert agree > 0.95


def test_knn_classify_accepts_string_labels():
    x, y, q = _data(120, 2, seed=6)
    codes = (y > 0).astype(int) + (x[:, 0] > 0.5)
    names = np.array(["apple", "banana", "cherry"])[codes]
    pred, proba, classes = lb.knn_classify(q, x, names, 5, return_proba=True)
    pred_int, proba_int, classes_int = lb.knn_classify(
        q, x, codes, 5, return_proba=True
    )
    assert list(classes) == ["apple", "banana", "cherry"] and classes_int.tolist() == [
        0,
        1,
        2,
    ]
    torch.testing.assert_close(proba, proba_int, rtol=0, atol=0)
    np.testing.assert_array_equal(pred, classes[pred_int.numpy()])
    assert list(lb.knn_classify(q, x, list(names), 5)) == list(
        pred
    )  # a plain list works too


def _knn_loo_brute(x, y, k):
    """Leave-one-out residuals of k-NN regression by n explicit refits."""
    out = torch.empty(len(x), dtype=x.dtype)
    for i in range(len(x)):
        keep = torch.arange(len(x)) != i
        out[i] = y[i] - lb.knn_regress(x[i : i + 1], x[keep], y[keep], k)[0]
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(5, 40), st.integers(2, 6), st.integers(0, 2**16))
def test_knn_loo_formula_is_the_k_minus_1_nn_loo(n, k, seed):
    # the rank kernel changes when a point leaves: (y − ŷ)/(1 − 1/k) is (k−1)-NN's LOO
    # residual, and k-NN's own needs the (k+1)-th neighbour: ŷ₋ᵢ = ((k+1) ŷ⁽ᵏ⁺¹⁾ᵢ − yᵢ)/k
    k = min(k, n - 2)
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.uniform(0, 1, n))
    y = torch.tensor(rng.normal(size=n))
    fit_k, fit_k1 = lb.knn_regress(x, x, y, k), lb.knn_regress(x, x, y, k + 1)
    formula = (y - fit_k) / (1 - 1 / k)
    torch.testing.assert_close(formula, _knn_loo_brute(x, y, k - 1))
    torch.testing.assert_close(y - ((k + 1) * fit_k1 - y) / k, _knn_loo_brute(x, y, k))
    assert not torch.allclose(formula, _knn_loo_brute(x, y, k))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(3, 40),
    st.floats(0.05, 1.0),
    st.floats(-0.3, 1.3),
    st.integers(0, 2**16),
)
def test_equivalent_kernel_is_negative_exactly_beyond_x_star_plus_s2_over_s1(
    n, h, t, seed
):
    x = torch.tensor(np.random.default_rng(seed).uniform(0, 1, n))
    d = x - t
    K = torch.exp(-0.5 * (d / h) ** 2)
    S0, S1, S2 = K.sum(), (K * d).sum(), (K * d * d).sum()
    if float(S0 * S2 - S1**2) <= 1e-8 * float(S0 * S2):  # M nearly singular: skip
        return
    ell = lb.equivalent_kernel([t], x, h)[0]
    margin = d * S1 - S2
    clear = margin.abs() > 1e-6 * (d.abs() * S1.abs() + S2)
    assert torch.equal((ell < 0)[clear], (margin > 0)[clear])
    # the threshold x* + S2/S1 lies beyond the local centre of mass x* + S1/S0
    assert float((S2 / S1).abs()) >= float((S1 / S0).abs()) * (1 - 1e-12)


# ---------------------------------------------------------------- properties (hypothesis)
@st.composite
def _pts(draw):
    """Point clouds in general position (continuous draws), of varied size, scale and offset."""
    n = draw(st.integers(4, 25))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.floats(0.3, 3.0))
    return np.random.default_rng(seed).normal(size=(n, 2)) * scale


@settings(max_examples=40, deadline=None)
@given(
    _pts(),
    st.floats(0.2, 3.0),
    st.sampled_from(["gaussian", "laplacian", "biweight"]),
    st.randoms(),
)
def test_permutation_invariance(x, h, kernel, rnd):
    y = np.cos(x).sum(1)
    perm = list(range(len(x)))
    rnd.shuffle(perm)
    q = x[:3] + 0.1
    for f in (lb.nadaraya_watson, lb.local_linear):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            a, b = f(q, x, y, h, kernel), f(q, x[perm], y[perm], h, kernel)
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(_pts(), st.floats(0.2, 3.0), arrays(np.float64, 2, elements=st.floats(-50, 50)))
def test_translation_equivariance(x, h, shift):
    y = np.sin(x[:, 0])
    q = x[:4] * 0.9
    for f in (lb.nadaraya_watson, lb.local_linear):
        torch.testing.assert_close(
            f(q + shift, x + shift, y, h), f(q, x, y, h), rtol=1e-6, atol=1e-6
        )


@settings(max_examples=40, deadline=None)
@given(_pts(), st.floats(0.05, 3.0), st.sampled_from(list(lb.KERNELS)))
def test_nw_stays_within_range_of_y(x, h, kernel):
    y = np.arange(len(x), dtype=float) - 3.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = lb.nadaraya_watson(x + 0.05, x, y, h, kernel)
    fin = out[torch.isfinite(out)]
    assert bool((fin >= y.min() - 1e-9).all()) and bool((fin <= y.max() + 1e-9).all())


@settings(max_examples=40, deadline=None)
@given(_pts(), st.floats(0.3, 3.0))
def test_equivalent_kernel_rows_sum_to_one(x, h):
    L = lb.equivalent_kernel(x[:5] + 0.01, x, h)
    torch.testing.assert_close(
        L.sum(1), torch.ones(L.shape[0], dtype=L.dtype), rtol=1e-7, atol=1e-7
    )


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0], 1.0),
            ValueError,
            "y has 1 rows but x has 2",
        ),
        (
            lambda: lb.nadaraya_watson([[0.0, 1.0]], [0.0, 1.0], [1.0, 2.0], 1.0),
            ValueError,
            "x_query has 2 feature",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], np.zeros((2, 2, 2)), [1.0, 2.0], 1.0),
            ValueError,
            "x must have 1 or 2",
        ),
        (lambda: lb.nadaraya_watson([0.0], [], [], 1.0), ValueError, "x is empty"),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, np.nan], [1.0, 2.0], 1.0),
            ValueError,
            "x contains 1 NaN",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0, np.inf], 1.0),
            ValueError,
            "y contains 1 NaN",
        ),
        (
            lambda: lb.nadaraya_watson([np.nan], [0.0, 1.0], [1.0, 2.0], 1.0),
            ValueError,
            "x_query contains",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0, 2.0], 0.0),
            ValueError,
            "bandwidth must be positive",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0, 2.0], -1.0),
            ValueError,
            "bandwidth must be positive",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0, 2.0], float("nan")),
            ValueError,
            "bandwidth",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0, 2.0], [1.0, 2.0]),
            ValueError,
            "bandwidth must be a scalar",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [0.0, 1.0], [1.0, 2.0], "wide"),
            TypeError,
            "bandwidth",
        ),
        (
            lambda: lb.nadaraya_watson(
                [0.0], [0.0, 1.0], [1.0, 2.0], 1.0, kernel="cosine"
            ),
            ValueError,
            "unknown kernel 'cosine'",
        ),
        (
            lambda: lb.nadaraya_watson("abc", [0.0, 1.0], [1.0, 2.0], 1.0),
            TypeError,
            "x_query must be an array-like",
        ),
        (
            lambda: lb.local_linear([0.0], [0.0, 1.0], [1.0], 1.0),
            ValueError,
            "y has 1 rows",
        ),
        (
            lambda: lb.knn_regress([0.0], [0.0, 1.0], [1.0, 2.0], 3),
            ValueError,
            "n_neighbors must be between 1 and 2",
        ),
        (
            lambda: lb.knn_regress([0.0], [0.0, 1.0], [1.0, 2.0], 1.5),
            TypeError,
            "n_neighbors must be an integer",
        ),
        (
            lambda: lb.knn_classify([0.0], [0.0, 1.0], [0.5, 1.0], 1),
            TypeError,
            "labels must be integers",
        ),
        (
            lambda: lb.loo_cv_score([0.0, 1.0], [1.0, 2.0], 1.0, method="lasso"),
            ValueError,
            "unknown method",
        ),
        (
            lambda: lb.select_bandwidth([0.0, 1.0], [1.0, 2.0], [0.1, -1.0]),
            ValueError,
            "bandwidths must all be positive",
        ),
        (
            lambda: lb.nadaraya_watson([0.0], [1e308, 0.0], [1.0, 2.0], 1.0),
            ValueError,
            "x / bandwidth is too large",
        ),
        (
            lambda: lb.nadaraya_watson([1e300], [0.0, 1.0], [1.0, 2.0], 1e-10),
            ValueError,
            "x_query / bandwidth is too large",
        ),
    ],
)
def test_bad_input_is_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_knn_bandwidth_and_adaptive_nw_against_brute_force(device):
    x, y, q = _data(120, 2, seed=9)
    xt, yt, qt = (torch.tensor(a, device=device) for a in (x, y, q))
    d = torch.cdist(qt, xt)
    hk = lb.knn_bandwidth(qt, xt, 6)
    torch.testing.assert_close(hk, torch.sort(d, 1).values[:, 5])
    for kernel, scale in [("gaussian", 0.7), ("epanechnikov", 1.5)]:
        h = scale * hk
        K = lb.kernel_profile((d / h[:, None]).cpu(), kernel).to(device)
        ref = (K @ yt) / K.sum(1)
        torch.testing.assert_close(
            lb.adaptive_nadaraya_watson(qt, xt, yt, 6, kernel, scale), ref
        )
    # with the uniform kernel and a radius just past the k-th point it is exactly k-NN regression
    torch.testing.assert_close(
        lb.adaptive_nadaraya_watson(qt, xt, yt, 6, "uniform", 1 + 1e-9),
        lb.knn_regress(qt, xt, yt, 6),
    )
    with pytest.raises(ValueError, match="scale must be positive"):
        lb.adaptive_nadaraya_watson(q, x, y, 6, scale=0)
    with pytest.raises(ValueError, match="n_neighbors must be between 1 and 120"):
        lb.knn_bandwidth(q, x, 0)


def test_autograd_flows_through_the_local_mean():
    """Gradients w.r.t. queries, data and responses (the in-place fast path is skipped then)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 2, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(30, generator=g, dtype=torch.float64, requires_grad=True)
    q = torch.randn(4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, x, y: lb.nadaraya_watson(q, x, y, 0.7), (q, x, y)
    )
    assert torch.autograd.gradcheck(
        lambda q, y: lb.local_linear(q, x.detach(), y, 0.9), (q, y)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.faults
def test_local_linear_in_half_precision_works_in_float32(dtype):
    """Half inputs crashed in the eigensolver ('linalg_eigh_cpu not implemented for Half');
    the weights are now computed in float32 and the result comes back in the input dtype,
    equal to float64 on the same (rounded) inputs to one machine epsilon of the dtype."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(80, 2, generator=g).to(dtype)
    y = (2 * torch.rand(80, generator=g) - 1).to(dtype)
    q = torch.rand(12, 2, generator=g).to(dtype)
    out = lb.local_linear(q, x, y, 0.3)
    ref = lb.local_linear(q.double(), x.double(), y.double(), 0.3)
    assert out.dtype == dtype
    assert float((out.double() - ref).abs().max()) <= 2 * torch.finfo(dtype).eps
    ell = lb.equivalent_kernel(q, x, 0.3)
    assert ell.dtype == dtype
    ref_ell = lb.equivalent_kernel(q.double(), x.double(), 0.3)
    assert float((ell.double() - ref_ell).abs().max()) <= torch.finfo(dtype).eps


# ---------------------------------------------------- local linear = weighted least squares
def _ill_posed_cloud(rng, n, d, log_cond):
    """An anisotropic cloud (spreads 1 … 10^-log_cond, rotated) offset from the origin."""
    scales = np.logspace(0, -log_cond, d) if d > 1 else np.ones(1)
    rot, _ = np.linalg.qr(rng.normal(size=(d, d)))
    x = (rng.normal(size=(n, d)) * scales) @ rot.T + 3.0
    y = np.sin(x @ rng.normal(size=d)) + 0.1 * rng.normal(size=n)
    q = x[rng.integers(0, n, 4)] + 0.3 * (rng.normal(size=(4, d)) * scales) @ rot.T
    return x, y, q


def _lstsq_at(t, x, y, h, centre=None, rcond=None):
    """Per-query oracle: numpy.linalg.lstsq on the Gaussian-weighted design, evaluated at t.

    ``centre=None`` centres the design at the query (the textbook form); otherwise at the
    given point, with the prediction read off the fitted plane at ``t``. Returns the fit
    and the first-order rounding scale of the least-squares perturbation bound,
    κ(‖β‖ + ‖b‖/‖A‖) + κ²‖r‖/‖A‖ (times the machine epsilon and n in the caller)."""
    w = np.exp(-0.5 * (((x - t) / h) ** 2).sum(1))
    w = w / w.max()
    c = t if centre is None else centre
    sw = np.sqrt(w)
    A = np.c_[np.ones(len(x)), (x - c) / h] * sw[:, None]
    b = y * sw
    beta = np.linalg.lstsq(A, b, rcond=rcond)[0]
    sv = np.linalg.svd(A, compute_uv=False)
    kap, norm_a = sv[0] / sv[-1], sv[0]
    r = np.linalg.norm(b - A @ beta)
    scale = kap * (np.linalg.norm(beta) + np.linalg.norm(b) / norm_a)
    scale += kap**2 * r / norm_a
    return beta[0] + beta[1:] @ ((t - c) / h), scale, kap


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.floats(0.0, 7.0),
    st.sampled_from([np.float32, np.float64]),
    st.integers(0, 2**16),
)
def test_local_linear_equals_numpy_lstsq_per_query(d, log_cond, dtype, seed):
    """local_linear is the weighted least-squares fit, to the rounding error of the problem."""
    x, y, q = _ill_posed_cloud(np.random.default_rng(seed), 60, d, log_cond)
    # the oracle sees the same (rounded) numbers
    x, y, q = (a.astype(dtype).astype(np.float64) for a in (x, y, q))
    h = 0.7
    got = lb.local_linear(q.astype(dtype), x.astype(dtype), y.astype(dtype), h)
    assert got.dtype == torch.float32 if dtype == np.float32 else torch.float64
    u = np.finfo(dtype).eps
    for a, t in enumerate(q):
        ref, scale, kap = _lstsq_at(t, x, y, h)
        if kap * u > 1e-3:  # no digit is determined: nothing to compare
            continue
        tol = 4 * len(x) * u * scale
        assert abs(float(got[a]) - ref) <= tol, (float(got[a]), ref, tol, kap)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(0, 2**16))
def test_rank_deficient_local_linear_is_lstsq_minimum_norm(d, rank, seed):
    """Below the cutoff: numpy lstsq's minimum-norm solution on the design centred at the
    local mean, with the same rcond; slope directions without spread are dropped."""
    rng = np.random.default_rng(seed)
    rank = min(rank, d - 1)
    basis = np.linalg.qr(rng.normal(size=(d, d)))[0][:, :rank]  # data on a flat
    x = rng.normal(size=(40, rank)) @ basis.T + 2.0
    y = rng.normal(size=40)
    q = x[:3] + 0.2 * rng.normal(size=(3, d))  # queries off the flat
    h = 0.8
    got = lb.local_linear(q, x, y, h)
    rcond = np.finfo(np.float64).eps * max(len(x), d + 1)
    for a, t in enumerate(q):
        w = np.exp(-0.5 * (((x - t) / h) ** 2).sum(1))
        zbar = (w @ x) / w.sum()
        ref, _, _ = _lstsq_at(t, x, y, h, centre=zbar, rcond=rcond)
        assert abs(float(got[a]) - ref) <= 1e3 * len(x) * 2.2e-16 * np.abs(y).max()
    # the same as local linear on the flat's coordinates: for the Gaussian kernel the
    # distance to the flat only multiplies every weight by the same factor
    coords = (x - 2.0) @ basis
    torch.testing.assert_close(
        got, lb.local_linear((q - 2.0) @ basis, coords, y, h), rtol=1e-9, atol=1e-9
    )


def test_one_effective_neighbour_gives_the_local_mean():
    x = np.array([[0.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    y = np.array([2.0, 7.0])
    for kernel in ("epanechnikov", "uniform", "biweight"):
        out = lb.local_linear([[0.3, -0.2, 0.1]], x, y, 1.0, kernel=kernel)
        torch.testing.assert_close(out, torch.tensor([2.0], dtype=torch.float64))


@pytest.mark.faults
def test_empty_window_in_3d_is_nan_with_the_warning_not_a_linalg_error():
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 1, (50, 3)), rng.normal(size=50)
    q = np.array([[0.5, 0.5, 0.5], [9.0, 9.0, 9.0], [0.4, 0.6, 0.5]])
    with pytest.warns(UserWarning, match="1 of 3 queries have no data point"):
        out = lb.local_linear(q, x, y, 0.3, kernel="epanechnikov")
    assert torch.isnan(out[1]) and torch.isfinite(out[[0, 2]]).all()
    torch.testing.assert_close(
        out[[0, 2]], lb.local_linear(q[[0, 2]], x, y, 0.3, kernel="epanechnikov")
    )
    with pytest.warns(UserWarning, match="1 of 3 queries"):
        L = lb.equivalent_kernel(q, x, 0.3, kernel="epanechnikov")
    assert torch.isnan(L[1]).all() and torch.isfinite(L[[0, 2]]).all()


def test_rcond_is_numpys_and_validated():
    rng = np.random.default_rng(3)
    x = np.c_[rng.normal(size=30), 1e-6 * rng.normal(size=30)]  # spread 1e-6 bandwidths
    y = x[:, 0] + 1e5 * x[:, 1] + 0.01 * rng.normal(size=30)
    q = x[:2] + [0.1, 1e-6]
    for rcond in (1e-9, 1e-3):  # keeps, then drops, the thin direction
        got = lb.local_linear(q, x, y, 1.0, rcond=rcond)
        for a, t in enumerate(q):
            w = np.exp(-0.5 * ((x - t) ** 2).sum(1))
            ref, _, _ = _lstsq_at(t, x, y, 1.0, centre=(w @ x) / w.sum(), rcond=rcond)
            assert abs(float(got[a]) - ref) <= 1e-6
    thin_kept = lb.local_linear(q, x, y, 1.0, rcond=1e-9)
    thin_dropped = lb.local_linear(q, x, y, 1.0, rcond=1e-3)
    assert float((thin_kept - thin_dropped).abs().max()) > 0.01
    with pytest.raises(ValueError, match="rcond must be in"):
        lb.local_linear(q, x, y, 1.0, rcond=2.0)
    with pytest.raises(TypeError, match="rcond must be a number"):
        lb.equivalent_kernel(q, x, 1.0, rcond="tiny")


@pytest.mark.parametrize("n, d", [(2, 1), (3, 2), (4, 3)])
@pytest.mark.faults
def test_loo_bandwidth_with_n_at_most_d_plus_1_names_interpolation(n, d):
    x = np.random.default_rng(0).normal(size=(n, d))
    with pytest.raises(ValueError, match=r"interpolates them \(L_ii = 1\)"):
        lb.select_bandwidth(x, np.arange(n, dtype=float), method="ll")


# --- issue 27: select_bandwidth at the grid's edge, per-dimension grids, messages ------------
def _wiggle(n=40, d=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, d))
    return x, np.sin(3 * x[:, 0]) + 0.1 * rng.normal(size=n)


@pytest.mark.faults
def test_select_bandwidth_warns_once_when_the_best_is_an_edge_of_the_grid():
    x, y = _wiggle()
    full = lb.select_bandwidth(x, y, np.geomspace(0.05, 2.0, 25))
    best = full.bandwidth
    assert full.grid[0] < best < full.grid[-1]  # an interior optimum: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lb.select_bandwidth(x, y, np.geomspace(0.05, 2.0, 25))
    for grid, edge in (
        (np.geomspace(best * 1.5, 4.0, 5), "smallest"),
        (np.geomspace(0.02, best / 1.5, 5), "largest"),
    ):
        with pytest.warns(UserWarning) as rec:
            sel = lb.select_bandwidth(x, y, grid)
        msgs = [str(w.message) for w in rec if "select_bandwidth" in str(w.message)]
        assert len(msgs) == 1
        assert edge in msgs[0] and repr(sel.bandwidth) in msgs[0]
        assert sel.bandwidth == float(grid[0] if edge == "smallest" else grid[-1])


@pytest.mark.faults
def test_select_bandwidth_takes_per_dimension_candidates():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (60, 2)) * np.array(
        [1.0, 10.0]
    )  # dimension 2: ten times wider
    y = np.sin(3 * x[:, 0]) + np.sin(0.3 * x[:, 1]) + 0.05 * rng.normal(size=60)
    grid = np.array([[a, b] for a in (0.1, 0.2, 0.4) for b in (1.0, 2.0, 4.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sel = lb.select_bandwidth(x, y, grid)
    scores = [
        lb.loo_cv_score(x, y, row) for row in grid
    ]  # independent: one call per row
    np.testing.assert_allclose(sel.scores.numpy(), scores, rtol=1e-12)
    assert isinstance(sel.bandwidth, torch.Tensor) and sel.bandwidth.shape == (2,)
    np.testing.assert_array_equal(sel.bandwidth.numpy(), grid[int(np.argmin(scores))])
    # the default per-dimension grid scales with each dimension's spread: (30, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        auto = lb.select_bandwidth(x, y, per_dimension=True)
    assert auto.grid.shape == (30, 2)
    ratio = (auto.grid[:, 1] / auto.grid[:, 0]).numpy()
    np.testing.assert_allclose(ratio, x[:, 1].std(ddof=1) / x[:, 0].std(ddof=1))
    with pytest.raises(
        ValueError, match=r"bandwidths must be \(k,\) numbers or \(k, 2\)"
    ):
        lb.select_bandwidth(x, y, np.ones((3, 3)))


@pytest.mark.faults
def test_select_bandwidth_messages_name_the_cause():
    with pytest.raises(
        ValueError, match=r"x has 1 point; leaving one out needs at least 2"
    ):
        lb.select_bandwidth([[0.0, 1.0]], [1.0])
    with pytest.raises(ValueError, match=r"x has n = 3 points in d = 2 dimensions"):
        lb.select_bandwidth(
            np.random.default_rng(0).normal(size=(3, 2)), [1.0, 2, 3], method="ll"
        )
    with pytest.raises(ValueError, match=r"every bandwidth in bandwidths"):
        lb.select_bandwidth([0.0, 10.0, 20.0], [1.0, 2.0, 3.0], [1e-3, 1e-2])


# --- issue 27: PyTorch's type promotion across the array arguments ---------------------------
@pytest.mark.faults
def test_promote_floats_follows_torch_promotion():
    from localbook._validate import promote_floats, promoted_dtype

    f16, f32, f64 = (
        torch.zeros(2, dtype=t) for t in (torch.float16, torch.float32, torch.float64)
    )
    i64, b = torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.bool)
    bf16 = torch.zeros(2, dtype=torch.bfloat16)
    for values in [
        (f16, f32),
        (f32, f64),
        (f16, f64),
        (f16, bf16),
        (i64, f32),
        (b, f16),
        (f64, i64, f32),
    ]:
        expect = torch.result_type(*values[:2]) if len(values) == 2 else torch.float64
        assert promoted_dtype(*values) == expect
        assert all(t.dtype == expect for t in promote_floats(*values))
    # lists and integer arrays adopt the floating partners' dtype; alone they are left as is
    out = promote_floats([1, 2], np.arange(2), f32)
    assert [t.dtype for t in out] == [torch.float32] * 3
    assert promote_floats([1.0, 2.0], i64) == ([1.0, 2.0], i64)
    assert promote_floats(np.zeros(2, np.float32), None)[1] is None
    a64, t = promote_floats(
        np.zeros(2), f32
    )  # a numpy float64 array counts, kept as is
    assert a64.dtype == np.float64 and t.dtype == torch.float64


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, x, y: lb.nadaraya_watson(q, x, y, 0.7),
        lambda q, x, y: lb.local_linear(q, x, y, 1.5),
        lambda q, x, y: lb.knn_regress(q, x, y, 3),
        lambda q, x, y: lb.kde(q, x, 0.7),
        lambda q, x, y: lb.tweedie_denoise(q, x, 0.7),
        lambda q, x, y: lb.local_quantile(q, x, y, 0.7),
    ],
)
@pytest.mark.parametrize("first", ["int", "list", "float32", "bool"])
@pytest.mark.parametrize("which", ["x_query", "x"])
@pytest.mark.faults
def test_an_int_or_list_argument_never_downcasts_a_float64_partner(fn, first, which):
    rng = np.random.default_rng(3)
    q, x, y = (
        rng.normal(size=(4, 2)) * 3,
        rng.normal(size=(12, 2)) * 3,
        rng.normal(size=12),
    )
    q64, x64, y64 = (torch.as_tensor(a) for a in (q, x, y))
    cast = {
        "int": lambda a: torch.as_tensor(a).round().long(),
        "list": lambda a: torch.as_tensor(a).round().tolist(),
        "float32": lambda a: torch.as_tensor(a).float(),
        "bool": lambda a: torch.as_tensor(a) > 0,
    }[first]
    same = lambda a: torch.as_tensor(np.asarray(cast(a), dtype=np.float64))  # noqa: E731
    if which == "x_query":
        got, want = fn(cast(q), x64, y64), fn(same(q), x64, y64)
    else:
        got, want = fn(q64, cast(x), y64), fn(q64, same(x), y64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
