"""Tests of localbook.embedding: LLE vs scikit-learn, asymmetric MDS identities, triplet losses."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _swiss(n=300, seed=0):
    from sklearn.datasets import make_swiss_roll

    return make_swiss_roll(n, noise=0.0, random_state=seed)[0]


# --- LLE --------------------------------------------------------------------------------------------
def test_lle_weights_sum_to_one_and_reconstruct():
    X = _swiss(300)
    w, idx = lb.lle_weights(X, n_neighbors=10, reg=1e-3)
    assert w.shape == (300, 10) and idx.shape == (300, 10)
    torch.testing.assert_close(w.sum(1), torch.ones(300), rtol=0, atol=1e-12)
    x = torch.as_tensor(X)
    recon = (w[..., None] * x[idx]).sum(1)
    # the affine local mean reconstructs each point far better than the plain neighbour mean
    err_lle = ((recon - x) ** 2).sum(1).mean()
    err_mean = ((x[idx].mean(1) - x) ** 2).sum(1).mean()
    assert err_lle < 0.05 * err_mean
    assert not bool(
        (idx == torch.arange(300)[:, None]).any()
    )  # a point is not its own neighbour


def test_lle_weights_match_sklearn_barycenter():
    from sklearn.manifold._locally_linear import barycenter_kneighbors_graph

    X = _swiss(200, seed=1)
    w, idx = lb.lle_weights(X, n_neighbors=8, reg=1e-3)
    W = lb.lle_weight_matrix(w, idx).numpy()
    W_sk = barycenter_kneighbors_graph(X, n_neighbors=8, reg=1e-3).toarray()
    np.testing.assert_allclose(W, W_sk, atol=1e-8)


def test_lle_weights_are_constrained_least_squares():
    # KKT system of min |x_i - G^T w|^2 + eps |w|^2 s.t. 1^T w = 1, solved independently
    X = torch.as_tensor(_swiss(100, seed=2))
    k, reg = 6, 1e-3
    w, idx = lb.lle_weights(X, n_neighbors=k, reg=reg)
    i = 17
    G = X[idx[i]] - X[i]
    C = G @ G.T
    C = C + reg * torch.trace(C) * torch.eye(k)
    kkt = torch.zeros(k + 1, k + 1)
    kkt[:k, :k] = 2 * C
    kkt[:k, k] = 1
    kkt[k, :k] = 1
    rhs = torch.zeros(k + 1)
    rhs[k] = 1
    sol = torch.linalg.solve(kkt, rhs)
    torch.testing.assert_close(w[i], sol[:k], rtol=0, atol=1e-10)


def test_lle_embedding_matches_sklearn_up_to_sign():
    from scipy.linalg import subspace_angles
    from sklearn.manifold import LocallyLinearEmbedding

    X = _swiss(400, seed=3)
    Y, err = lb.locally_linear_embedding(
        X, n_components=2, n_neighbors=12, return_error=True
    )
    sk = LocallyLinearEmbedding(
        n_neighbors=12, n_components=2, eigen_solver="dense", random_state=0
    )
    Ys = sk.fit_transform(X)
    assert np.max(subspace_angles(Y.numpy(), Ys)) < 1e-6
    # column by column: equal up to sign
    for c in range(2):
        a, b = Y[:, c].numpy(), Ys[:, c]
        assert min(np.abs(a - b).max(), np.abs(a + b).max()) < 1e-6
    assert err == pytest.approx(sk.reconstruction_error_, rel=1e-6, abs=1e-12)


def test_lle_device_dtype(device):
    x = torch.as_tensor(_swiss(120), dtype=torch.float32, device=device)
    w, idx = lb.lle_weights(x, 6)
    assert w.device.type == device.type and w.dtype == torch.float32
    Y = lb.locally_linear_embedding(x.double(), 2, 8)
    assert Y.shape == (120, 2) and Y.device.type == device.type


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 8), st.integers(2, 5))
def test_property_lle_weights_affine_invariant(seed, k, d):
    # LLE weights are invariant to rotation, translation and scaling of the data
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(30, d, generator=g)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    w1, i1 = lb.lle_weights(X, k)
    w2, i2 = lb.lle_weights(3.0 * X @ Q + 5.0, k)
    assert torch.equal(i1, i2)
    torch.testing.assert_close(w1, w2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w1.sum(1), torch.ones(30), rtol=0, atol=1e-10)


# --- classical and asymmetric MDS -------------------------------------------------------------------
def test_classical_mds_recovers_configuration():
    from scipy.spatial import procrustes

    g = torch.Generator().manual_seed(0)
    X = torch.randn(25, 2, generator=g)
    D = torch.cdist(X, X)
    Y = lb.classical_mds(D, 2)
    torch.testing.assert_close(torch.cdist(Y, Y), D, rtol=0, atol=1e-8)
    assert procrustes(X.numpy(), Y.numpy())[2] < 1e-12


def test_asymmetric_mds_recovers_radius_model():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(20, 2, generator=g)
    r = torch.randn(20, generator=g)
    r = r - r.mean()
    delta = torch.cdist(X, X) + r[None, :] - r[:, None]
    res = lb.asymmetric_mds(delta, 2)
    torch.testing.assert_close(res.radius, r, rtol=0, atol=1e-10)
    torch.testing.assert_close(
        torch.cdist(res.embedding, res.embedding), torch.cdist(X, X), rtol=0, atol=1e-5
    )
    assert res.stress < 1e-8


def test_asymmetric_mds_radius_is_stationary_and_stress_splits():
    g = torch.Generator().manual_seed(2)
    delta = torch.rand(15, 15, generator=g) * 3
    for bw in [None, 1.0]:
        res = lb.asymmetric_mds(delta, 2, bandwidth=bw, n_iter=200)
        r = res.radius.clone().requires_grad_(True)
        Y = res.embedding
        off = 1 - torch.eye(15)
        S = (delta + delta.T) / 2
        W = off if bw is None else torch.exp(-0.5 * (S / bw) ** 2) * off
        dist = torch.cdist(Y, Y)
        loss = (W * (delta - dist - r[None, :] + r[:, None]) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, r)
        assert grad.abs().max() < 1e-8  # closed-form radii minimize the stress
        assert loss.item() == pytest.approx(res.stress, rel=1e-8)
        assert res.stress == pytest.approx(
            res.symmetric_stress + res.skew_stress, rel=1e-12
        )
    # unit weights: the radius is the column mean of the skew part
    res = lb.asymmetric_mds(delta, 2)
    A = (delta - delta.T) / 2
    torch.testing.assert_close(res.radius, A.mean(0) - A.mean(), rtol=0, atol=1e-12)


def test_asymmetric_mds_symmetric_input_has_zero_radii():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(12, 3, generator=g)
    res = lb.asymmetric_mds(torch.cdist(X, X), 2, n_iter=50)
    assert res.radius.abs().max() < 1e-12 and res.skew_stress < 1e-20


# --- triplets -------------------------------------------------------------------------------------
def test_triplet_hyperkernel_and_losses_by_hand():
    y = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    t = torch.tensor([[0, 1, 2]])
    sij, sik = 1 / (1 + 1.0), 1 / (1 + 4.0)
    kappa = sij / (sij + sik)
    assert lb.triplet_hyperkernel(y, t).item() == pytest.approx(kappa)
    assert lb.triplet_loss(y, t, kind="trimap").item() == pytest.approx(1 - kappa)
    assert lb.triplet_loss(y, t, kind="tste").item() == pytest.approx(-np.log(kappa))
    # STE: the Gaussian kernel, p = e^{-1} / (e^{-1} + e^{-4}) = logistic(4 - 1)
    p_ste = np.exp(-1.0) / (np.exp(-1.0) + np.exp(-4.0))
    assert lb.triplet_loss(y, t, kind="ste").item() == pytest.approx(-np.log(p_ste))
    # t-STE with alpha = 3 degrees of freedom: s = (1 + d²/3)^-2
    s3 = lambda d2: (1 + d2 / 3) ** -2.0  # noqa: E731
    p3 = s3(1.0) / (s3(1.0) + s3(4.0))
    got = lb.triplet_loss(y, t, kind="tste", alpha=3.0).item()
    assert got == pytest.approx(-np.log(p3))
    # STE stays finite and exact far out, where p underflows: -log p = d_ij² - d_ik²
    far = torch.tensor([[0.0, 0.0], [40.0, 0.0], [0.0, 1.0]])
    assert lb.triplet_loss(far, t, kind="ste").item() == pytest.approx(1600.0 - 1.0)
    assert lb.triplet_loss(y, t, kind="hinge").item() == pytest.approx(0.0)
    assert lb.triplet_loss(
        y, torch.tensor([[0, 2, 1]]), kind="hinge"
    ).item() == pytest.approx(4.0)
    assert lb.triplet_loss(y, t, weights=[2.0], kind="trimap").item() == pytest.approx(
        2 * (1 - kappa)
    )


def test_triplet_hyperkernel_is_two_point_local_mean_weight():
    # kappa is the weight of j in the Student-t local mean at y_i over the candidates {j, k}
    g = torch.Generator().manual_seed(4)
    y = torch.randn(10, 2, generator=g)
    t = torch.tensor([[0, 3, 7], [5, 1, 2]])
    for (i, j, k), kap in zip(t.tolist(), lb.triplet_hyperkernel(y, t)):
        s = 1 / (1 + torch.cdist(y[i : i + 1], y[[j, k]])[0] ** 2)
        assert kap.item() == pytest.approx((s / s.sum())[0].item())


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 50.0), st.floats(0.0, 50.0))
def test_triplet_loss_gradients_in_squared_distances(dij2, dik2):
    # TriMap: d(1 - kappa)/d dij2 = kappa (1 - kappa) s_ij; t-STE: d(-log kappa)/d dij2 =
    # (1 - kappa) s_ij > 0 (pulls j in); both push k away with the s_ik analogues. The
    # squared distances are realized by points, so lb.triplet_loss itself is differentiated.
    y = torch.tensor(
        [[0.0, 0.0], [dij2**0.5, 0.0], [0.0, dik2**0.5]], requires_grad=True
    )
    t = torch.tensor([[0, 1, 2]])
    sij, sik = 1 / (1 + dij2), 1 / (1 + dik2)
    kap = sij / (sij + sik)
    for kind, fac in [("trimap", kap * (1 - kap)), ("tste", 1 - kap)]:
        (g,) = torch.autograd.grad(lb.triplet_loss(y, t, kind=kind), y)
        # chain rule: dL/dy_j = 2 (y_j - y_i) dL/d dij2, dL/dy_k = 2 (y_k - y_i) dL/d dik2
        expect_j = 2 * (y[1] - y[0]).detach() * fac * sij
        expect_k = -2 * (y[2] - y[0]).detach() * fac * sik
        tol = 1e-12 * (1 + abs(dij2) ** 0.5 + abs(dik2) ** 0.5)
        assert torch.allclose(g[1], expect_j, rtol=1e-10, atol=tol)
        assert torch.allclose(g[2], expect_k, rtol=1e-10, atol=tol)


def test_tste_tends_to_ste_as_alpha_grows():
    # (1 + d²/alpha)^-(alpha+1)/2 -> exp(-d²/2): t-STE with many degrees of freedom is STE
    # of the map shrunk by sqrt(2); the error is of order d⁴/alpha
    g = torch.Generator().manual_seed(12)
    y = torch.randn(20, 2, generator=g)
    t = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]])
    alpha = 1e7
    got = lb.triplet_loss(y, t, kind="tste", alpha=alpha)
    want = lb.triplet_loss(y / 2**0.5, t, kind="ste")
    d2max = float(torch.cdist(y, y).max() ** 2)
    assert abs(float(got - want)) < len(t) * d2max**2 / alpha


def test_tste_pull_vanishes_more_slowly_than_trimap():
    # with c = 1 + dik2 fixed the pulls are exactly c/(c + 1 + D)^2 and 1/(c + 1 + D), D = dij2
    c = 2.0
    D = torch.tensor([1e2, 1e4, 1e6], requires_grad=True)
    kap = c / (c + 1 + D)
    (p_tm,) = torch.autograd.grad((1 - kap).sum(), D, retain_graph=True)
    (p_ste,) = torch.autograd.grad(-torch.log(kap).sum(), D)
    D = D.detach()
    torch.testing.assert_close(p_tm, c / (c + 1 + D) ** 2)
    torch.testing.assert_close(p_ste, 1 / (c + 1 + D))
    assert bool(
        (p_ste[1:] < p_ste[:-1]).all() and (p_tm[1:] < p_tm[:-1]).all()
    )  # both vanish
    ratio = p_ste / p_tm  # = 1/kappa
    assert bool((ratio[1:] > ratio[:-1]).all())  # t-STE's vanishes more slowly


def test_trimap_triplets_are_ordered_and_weighted():
    from sklearn.datasets import load_digits

    X = torch.as_tensor(load_digits().data[:200] / 16.0)
    trip, w = lb.trimap_triplets(X, n_inliers=5, n_outliers=3, n_random=2, seed=0)
    assert trip.shape[1] == 3 and w.shape == (trip.shape[0],) and bool((w >= 0).all())
    d = torch.cdist(X, X)
    assert bool(
        (d[trip[:, 0], trip[:, 1]] <= d[trip[:, 0], trip[:, 2]] + 1e-9).mean(
            dtype=torch.float64
        )
        > 0.9
    )
    assert not bool(
        (trip[:, 0] == trip[:, 1]).any() or (trip[:, 0] == trip[:, 2]).any()
    )


def test_triplet_embedding_is_trustworthy():
    # against PCA through sklearn's trustworthiness (the trimap package: the oracle test below)
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.manifold import trustworthiness

    X = load_digits().data[:300] / 16.0
    Y = lb.triplet_embedding(X, n_iter=150, seed=0)
    assert Y.shape == (300, 2) and torch.isfinite(Y).all()
    t_ours = trustworthiness(X, Y.numpy(), n_neighbors=10)
    t_pca = trustworthiness(X, PCA(2).fit_transform(X), n_neighbors=10)
    assert t_ours > t_pca + 0.05


def test_trimap_loss_and_gradient_match_the_trimap_package():
    tt = pytest.importorskip(
        "trimap.torch_trimap"
    )  # optional: pip install trimap==1.2.0
    g = torch.Generator().manual_seed(6)
    y = torch.randn(25, 2, generator=g)
    trip = torch.randint(0, 25, (200, 3), generator=g)
    trip = trip[
        (trip[:, 0] != trip[:, 1])
        & (trip[:, 0] != trip[:, 2])
        & (trip[:, 1] != trip[:, 2])
    ]
    w = torch.rand(len(trip), generator=g)
    yr = y.clone().requires_grad_(True)
    ours = lb.triplet_loss(yr, trip, weights=w, kind="trimap")
    (g_ours,) = torch.autograd.grad(ours, yr)
    theirs = tt.trimap_loss(y, trip, w, reduction="sum")
    g_theirs, loss_theirs, _ = tt.trimap_explicit_grad(y, trip, w, reduction="sum")
    torch.testing.assert_close(ours.detach(), theirs)
    torch.testing.assert_close(ours.detach(), loss_theirs)
    torch.testing.assert_close(g_ours, g_theirs)


def test_ordinal_embedding_recovers_points_from_comparisons():
    from scipy.spatial import procrustes

    g = torch.Generator().manual_seed(5)
    X = torch.rand(30, 2, generator=g)
    idx = torch.randint(0, 30, (4000, 3), generator=g)
    idx = idx[
        (idx[:, 0] != idx[:, 1]) & (idx[:, 0] != idx[:, 2]) & (idx[:, 1] != idx[:, 2])
    ]
    d = torch.cdist(X, X)
    closer = d[idx[:, 0], idx[:, 1]] < d[idx[:, 0], idx[:, 2]]
    trip = torch.where(closer[:, None], idx, idx[:, [0, 2, 1]])
    for kind in ["tste", "ste"]:
        Y = lb.ordinal_embedding(trip, 30, 2, kind=kind, n_iter=300, lr=0.05)
        assert lb.triplet_accuracy(Y, trip) > 0.95
        assert procrustes(X.numpy(), Y.numpy())[2] < 0.05


# --- bad inputs -------------------------------------------------------------------------------------
def test_bad_inputs():
    X = _swiss(50)
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.lle_weights(X, n_neighbors=50)
    with pytest.raises(TypeError, match="n_neighbors"):
        lb.lle_weights(X, n_neighbors=2.5)
    with pytest.raises(ValueError, match="reg"):
        lb.lle_weights(X, reg=-1.0)
    with pytest.raises(ValueError, match="x"):
        lb.lle_weights(np.full((10, 3), np.nan))
    with pytest.raises(ValueError, match="n_components"):
        lb.locally_linear_embedding(X, n_components=0)
    with pytest.raises(ValueError, match="square"):
        lb.asymmetric_mds(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="bandwidth"):
        lb.asymmetric_mds(np.ones((3, 3)), bandwidth=0.0)
    with pytest.raises(ValueError, match="dissimilarity"):
        lb.asymmetric_mds(np.full((3, 3), np.inf))
    y = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="triplets"):
        lb.triplet_loss(y, [[0, 1]])
    with pytest.raises(ValueError, match="triplets"):
        lb.triplet_loss(y, [[0, 1, 9]])
    with pytest.raises(TypeError, match="triplets"):
        lb.triplet_loss(y, [[0.0, 1.0, 2.0]])
    with pytest.raises(ValueError, match="kind"):
        lb.triplet_loss(y, [[0, 1, 2]], kind="svm")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            lb.triplet_loss(y, [[0, 1, 2]], kind="tste", alpha=bad)
        with pytest.raises(ValueError, match="alpha"):
            lb.ordinal_embedding([[0, 1, 2]], 3, alpha=bad)
    with pytest.raises(ValueError, match="weights"):
        lb.triplet_loss(y, [[0, 1, 2]], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="n_points"):
        lb.ordinal_embedding([[0, 1, 2]], n_points=2)


# --- fast paths: ARPACK LLE, closed-form triplet gradients, shared seeds ---------------------------
def test_lle_arpack_matches_dense():
    from scipy.linalg import subspace_angles

    X = _swiss(400, seed=4)
    Yd, err_d = lb.locally_linear_embedding(
        X, 2, n_neighbors=12, eigen_solver="dense", return_error=True
    )
    Ya, err_a = lb.locally_linear_embedding(
        X, 2, n_neighbors=12, eigen_solver="arpack", return_error=True
    )
    assert Ya.shape == (400, 2) and Ya.dtype == Yd.dtype
    # shift-invert ARPACK with tol=0 converges to working precision; the eigenvectors are
    # accurate to rounding divided by the gap to the next eigenvalue
    assert np.max(subspace_angles(Yd.numpy(), Ya.numpy())) < 1e-6
    assert err_a == pytest.approx(err_d, rel=1e-8, abs=1e-12)
    # "auto" is dense up to 2000 points
    torch.testing.assert_close(lb.locally_linear_embedding(X, 2, n_neighbors=12), Yd)


def test_lle_arpack_matches_sklearn_arpack():
    from scipy.linalg import subspace_angles
    from sklearn.manifold import LocallyLinearEmbedding

    X = _swiss(600, seed=5)
    Y = lb.locally_linear_embedding(X, 2, n_neighbors=10, eigen_solver="arpack")
    Ys = LocallyLinearEmbedding(
        n_neighbors=10, n_components=2, eigen_solver="arpack", random_state=0
    ).fit_transform(X)
    assert np.max(subspace_angles(Y.numpy(), Ys)) < 1e-5


def _autograd_grad(Y, trip, w, kind, alpha=1.0):
    Yr = Y.clone().requires_grad_(True)
    loss = lb.triplet_loss(Yr, trip, weights=w, kind=kind, alpha=alpha)
    (g,) = torch.autograd.grad(loss, Yr)
    return loss.detach(), g


@pytest.mark.parametrize(
    "kind, alpha",
    [("trimap", 1.0), ("ste", 1.0), ("tste", 1.0), ("tste", 0.5), ("tste", 4.0)]
    + [("hinge", 1.0)],
)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_closed_form_triplet_gradient_matches_autograd(kind, alpha, p):
    from localbook.triplets import _TripletGrad

    g = torch.Generator().manual_seed(7 + p)
    Y = torch.randn(40, p, generator=g)
    trip = torch.randint(0, 40, (600, 3), generator=g)
    trip = trip[
        (trip[:, 0] != trip[:, 1])
        & (trip[:, 0] != trip[:, 2])
        & (trip[:, 1] != trip[:, 2])
    ]
    w = torch.rand(len(trip), generator=g)
    loss, grad = _autograd_grad(Y, trip, w, kind, alpha)
    tg = _TripletGrad(trip, w, kind, p, alpha)
    for _ in range(2):  # the buffers are reused: a second call gives the same answer
        grad2, loss2 = tg(Y.T.contiguous(), with_loss=True)
        # sums of len(trip) terms of size up to max|w|·max|y|: rounding of that order
        tol = (
            10
            * len(trip)
            * torch.finfo(Y.dtype).eps
            * float(w.max() * (1 + Y.abs().max()))
        )
        torch.testing.assert_close(grad2.T, grad, rtol=0, atol=tol)
        torch.testing.assert_close(loss2, loss, rtol=0, atol=tol)
    torch.testing.assert_close(tg(Y.T.contiguous()).T, grad, rtol=0, atol=tol)


def test_fit_triplets_follows_adam_on_the_autograd_gradient():
    from localbook.triplets import _fit_triplets

    g = torch.Generator().manual_seed(11)
    Y0 = 0.1 * torch.randn(30, 2, generator=g)
    trip = torch.randint(0, 30, (300, 3), generator=g)
    trip = trip[
        (trip[:, 0] != trip[:, 1])
        & (trip[:, 0] != trip[:, 2])
        & (trip[:, 1] != trip[:, 2])
    ]
    w = torch.rand(len(trip), generator=g)
    Y = Y0.clone().requires_grad_(True)
    opt = torch.optim.Adam([Y], lr=0.05)
    for _ in range(20):
        opt.zero_grad()
        lb.triplet_loss(Y, trip, weights=w / w.sum(), kind="trimap").backward()
        opt.step()
    torch.testing.assert_close(
        _fit_triplets(Y0, trip, w, 20, 0.05, "trimap"), Y.detach(), rtol=0, atol=1e-10
    )


def test_triplet_embedding_seed_list_shares_the_neighbour_search():
    X = torch.as_tensor(_swiss(150, seed=6))
    Ys = lb.triplet_embedding(X, n_iter=30, seed=[0, 1])
    assert isinstance(Ys, list) and len(Ys) == 2
    torch.testing.assert_close(
        Ys[0], lb.triplet_embedding(X, n_iter=30, seed=0), rtol=0, atol=0
    )
    torch.testing.assert_close(
        Ys[1], lb.triplet_embedding(X, n_iter=30, seed=1), rtol=0, atol=0
    )
    assert not torch.equal(Ys[0], Ys[1])
    with pytest.raises(ValueError, match="seed"):
        lb.triplet_embedding(X, seed=[])
    with pytest.raises(ValueError, match="seed"):
        lb.triplet_embedding(X, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        lb.trimap_triplets(X, seed=0.5)


def test_trimap_weights_against_brute_force():
    # the chunked distances and the weights, recomputed from the full distance matrix
    g = torch.Generator().manual_seed(12)
    X = torch.randn(120, 7, generator=g)
    n_in, n_out, n_rand, gamma = 6, 4, 2, 500.0
    trip, w = lb.trimap_triplets(
        X, n_inliers=n_in, n_outliers=n_out, n_random=n_rand, gamma=gamma, seed=3
    )
    D2 = torch.cdist(X, X) ** 2
    D2.fill_diagonal_(float("inf"))
    sigma = (
        D2.sort(1).values[:, 3:6].sqrt().mean(1)
    )  # mean distance to the 4th-6th neighbours
    i, j, k = trip.T
    logr = -D2[i, j] / (sigma[i] * sigma[j]) + D2[i, k] / (sigma[i] * sigma[k])
    assert bool((logr >= 0).all())  # j is the closer one, in the scaled similarity
    # the neighbour triplets come first, anchors ascending; the random block starts again at 0
    drops = torch.nonzero(i[1:] < i[:-1]).flatten()
    assert len(drops) == 1 and len(trip) - int(drops[0]) - 1 <= X.shape[0] * n_rand
    is_rand = torch.arange(len(trip)) > drops[0]
    scale = torch.where(is_rand, 0.1, 1.0)
    expect = scale * torch.log1p(gamma * (torch.exp(logr - logr.max()) + 1e-4))
    torch.testing.assert_close(w, expect, rtol=1e-10, atol=1e-12)
    # the floor: every neighbour triplet weighs at least log(1 + gamma 1e-4)
    assert float(w[~is_rand].min()) >= np.log1p(gamma * 1e-4) * (1 - 1e-12)
    # the neighbour triplets pair each point with one of its n_inliers nearest neighbours
    nn = D2.topk(n_in, largest=False).indices
    assert bool((nn[i[~is_rand]] == j[~is_rand, None]).any(1).all())


def test_knn_self_excludes_the_point_even_with_duplicates():
    from localbook.embedding import _knn_self

    X = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.0, 0.0]])
    _, idx = _knn_self(X, 2)
    assert not bool((idx == torch.arange(5)[:, None]).any())
    assert set(idx[0].tolist()) == {1, 4}


# --- trustworthiness ---------------------------------------------------------------------------------
def _trust_brute(X, Y, k):
    """Trustworthiness with ties ranked in random order, in expectation: for an embedding
    neighbour j of i with L data distances below d(i, j) and T equal to it (j included), the
    penalty is the mean of max(0, r - k) over the ranks r = L + 1 .. L + T. Plain numpy, exact
    for integer data."""
    n = len(X)
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1).astype(float)
    np.fill_diagonal(D, np.inf)
    E = ((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(E, np.inf)
    total = 0.0
    for i in range(n):
        for j in np.argsort(E[i], kind="stable")[:k]:
            L, T = int((D[i] < D[i, j]).sum()), int((D[i] == D[i, j]).sum())
            total += np.mean([max(0, r - k) for r in range(L + 1, L + T + 1)])
    return 1 - 2 * total / (n * k * (2 * n - 3 * k - 1))


def test_trustworthiness_equals_sklearn_without_ties():
    from sklearn.decomposition import PCA
    from sklearn.manifold import trustworthiness

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 12)) @ rng.normal(size=(12, 12))
    Ys = [
        PCA(2).fit_transform(X),
        rng.normal(size=(300, 2)),
        X[:, :3],
        PCA(5).fit_transform(X),
    ]
    for k in [1, 5, 12, 40]:
        ours = lb.trustworthiness(X, Ys, n_neighbors=k)  # many maps: the sorting path
        single = [
            lb.trustworthiness(X, Y, n_neighbors=k) for Y in Ys
        ]  # the counting path
        sk = [trustworthiness(X, Y, n_neighbors=k) for Y in Ys]
        # the penalty is a sum of integers: the two agree up to the rounding of the scaling
        np.testing.assert_allclose(ours, sk, rtol=0, atol=1e-14)
        np.testing.assert_allclose(single, sk, rtol=0, atol=1e-14)
    assert lb.trustworthiness(X, X[:, :12], n_neighbors=5) == pytest.approx(
        1.0, abs=1e-15
    )
    # float32 data: the same up to the order of distances equal to about 7 digits
    t32 = lb.trustworthiness(
        torch.as_tensor(X, dtype=torch.float32), Ys[0], n_neighbors=5
    )
    assert t32 == pytest.approx(trustworthiness(X, Ys[0], n_neighbors=5), abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000), st.integers(12, 40), st.integers(1, 5), st.integers(1, 4)
)
def test_property_trustworthiness_ties_in_expectation(seed, n, k, levels):
    # integer data with few levels: many exact ties, against a brute-force oracle of the rule
    from sklearn.manifold import trustworthiness

    if not k < n / 2:
        return
    rng = np.random.default_rng(seed)
    X = rng.integers(0, levels + 1, size=(n, 3)).astype(float)
    Y = rng.normal(size=(n, 2))
    ours = lb.trustworthiness(X, Y, n_neighbors=k)
    assert ours == pytest.approx(_trust_brute(X, Y, k), abs=1e-12)
    assert lb.trustworthiness(X, [Y, Y], n_neighbors=k) == pytest.approx(
        [ours, ours], abs=1e-12
    )
    # scikit-learn's value is one order of the ties; the mean over orders lies within the range
    # of the extreme orders: every tie ranked first or every tie ranked last
    lo = 1 - 2 * _penalty_extreme(X, Y, k, last=True) / (n * k * (2 * n - 3 * k - 1))
    hi = 1 - 2 * _penalty_extreme(X, Y, k, last=False) / (n * k * (2 * n - 3 * k - 1))
    assert lo - 1e-12 <= ours <= hi + 1e-12
    assert lo - 1e-12 <= trustworthiness(X, Y, n_neighbors=k) <= hi + 1e-12


def _penalty_extreme(X, Y, k, last):
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    E = ((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(E, np.inf)
    total = 0
    for i in range(len(X)):
        for j in np.argsort(E[i], kind="stable")[:k]:
            r = (
                int((D[i] <= D[i, j]).sum())
                if last
                else int((D[i] < D[i, j]).sum()) + 1
            )
            total += max(0, r - k)
    return total


def test_trustworthiness_device_and_bad_inputs(device):
    X = torch.as_tensor(_swiss(60), device=device)
    Y = X[:, :2]
    assert 0 < lb.trustworthiness(X, Y, n_neighbors=5) <= 1
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.trustworthiness(X, Y, n_neighbors=30)
    with pytest.raises(TypeError, match="n_neighbors"):
        lb.trustworthiness(X, Y, n_neighbors=2.0)
    with pytest.raises(ValueError, match="y"):
        lb.trustworthiness(X, Y[:50])
    with pytest.raises(ValueError, match=r"y\[1\]"):
        lb.trustworthiness(X, [Y, Y[:50]])
    with pytest.raises(ValueError, match="y"):
        lb.trustworthiness(X, [])
    with pytest.raises(ValueError, match="x"):
        lb.trustworthiness(np.full((10, 2), np.nan), np.zeros((10, 2)))
    with pytest.raises(ValueError, match="eigen_solver"):
        lb.locally_linear_embedding(X.cpu(), eigen_solver="lobpcg")


def test_trustworthiness_ties_mean_over_all_tie_orders():
    # the oracle of the tie rule itself: for each point, every order of the other points that
    # is consistent with the data distances (each way of breaking the ties) is enumerated,
    # the penalty of scikit-learn's formula is computed for that order, and the mean over
    # the orders is taken; lb.trustworthiness must equal it (integer data: exact ties)
    import itertools

    X = np.array([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1], [1, 1], [2, 0]], float)
    Y = np.random.default_rng(3).normal(size=(len(X), 2))
    n, k = len(X), 2
    D = ((X[:, None] - X[None]) ** 2).sum(-1)
    E = ((Y[:, None] - Y[None]) ** 2).sum(-1)
    np.fill_diagonal(E, np.inf)
    total = 0.0
    for i in range(n):
        others = [j for j in range(n) if j != i]
        nbrs = np.argsort(E[i], kind="stable")[:k]
        pens = []
        for order in itertools.permutations(others):
            if all(D[i, a] <= D[i, b] for a, b in zip(order, order[1:])):
                rank = {j: r + 1 for r, j in enumerate(order)}
                pens.append(sum(max(0, rank[j] - k) for j in nbrs))
        assert len(pens) > 1 or i == 6  # ties in (almost) every row
        total += np.mean(pens)
    expected = 1 - 2 * total / (n * k * (2 * n - 3 * k - 1))
    assert lb.trustworthiness(X, Y, n_neighbors=k) == pytest.approx(expected, abs=1e-14)


# --- continuity and the curves over k ------------------------------------------------------------
def _cont_brute(X, Y, k):
    """Continuity with ties in random order, in expectation, by loops: j is among the k nearest
    of i in X with probability clip((k - L) / T, 0, 1) (L data distances below d(i, j), T equal
    to it, j included), and its penalty is the mean of max(0, r - k) over the embedding ranks
    r = L' + 1 .. L' + T'."""
    n = len(X)
    sq = lambda Z: ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1).astype(float)  # noqa: E731
    D, E = sq(X), sq(Y)
    np.fill_diagonal(D, np.inf)
    np.fill_diagonal(E, np.inf)
    total = 0.0
    for i in range(n):
        for j in range(n):
            if j == i:
                continue
            L, T = int((D[i] < D[i, j]).sum()), int((D[i] == D[i, j]).sum())
            p = min(1.0, max(0.0, (k - L) / T))
            if p:
                L2, T2 = int((E[i] < E[i, j]).sum()), int((E[i] == E[i, j]).sum())
                total += p * np.mean(
                    [max(0, r - k) for r in range(L2 + 1, L2 + T2 + 1)]
                )
    return 1 - 2 * total / (n * k * (2 * n - 3 * k - 1))


def test_trustworthiness_continuity_equal_sklearn_without_ties():
    from sklearn.decomposition import PCA
    from sklearn.manifold import trustworthiness

    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 10)) @ rng.normal(size=(10, 10))
    Ys = [PCA(2).fit_transform(X), rng.normal(size=(200, 2)), X[:, :3]]
    ks = [1, 5, 20, 60]
    res = lb.trustworthiness_continuity(X, Ys, n_neighbors=ks)
    assert res.trustworthiness.shape == res.continuity.shape == (3, 4)
    assert res.trustworthiness_per_point.shape == (3, 4, 200)
    for a, Y in enumerate(Ys):
        for b, k in enumerate(ks):
            # continuity is trustworthiness with the roles of data and map swapped
            sk_t = trustworthiness(X, Y, n_neighbors=k)
            sk_c = trustworthiness(Y, X, n_neighbors=k)
            assert float(res.trustworthiness[a, b]) == pytest.approx(sk_t, abs=1e-14)
            assert float(res.continuity[a, b]) == pytest.approx(sk_c, abs=1e-14)
        assert lb.continuity(X, Y, n_neighbors=5) == pytest.approx(
            float(res.continuity[a, 1]), abs=1e-14
        )
    assert lb.continuity(X, Ys, 20) == pytest.approx(res.continuity[:, 2].tolist())
    torch.testing.assert_close(
        res.trustworthiness, res.trustworthiness_per_point.mean(2)
    )
    torch.testing.assert_close(res.continuity, res.continuity_per_point.mean(2))
    # one embedding: (K,) and (K, n); anchors: the same per-point scores, at those points
    one = lb.trustworthiness_continuity(X, Ys[0], n_neighbors=ks)
    assert one.continuity.shape == (4,) and one.continuity_per_point.shape == (4, 200)
    torch.testing.assert_close(one.continuity, res.continuity[0])
    some = lb.trustworthiness_continuity(X, Ys, ks, anchors=[3, 50, 7])
    torch.testing.assert_close(some.anchors, torch.tensor([3, 50, 7]))
    torch.testing.assert_close(
        some.continuity_per_point, res.continuity_per_point[:, :, [3, 50, 7]]
    )
    torch.testing.assert_close(
        some.trustworthiness_per_point, res.trustworthiness_per_point[:, :, [3, 50, 7]]
    )
    # a map that keeps every distance is perfect at every k
    perfect = lb.trustworthiness_continuity(X, X, ks)
    assert float((perfect.continuity - 1).abs().max()) < 1e-15


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000), st.integers(12, 40), st.integers(1, 5), st.integers(1, 4)
)
def test_property_continuity_ties_in_expectation(seed, n, k, levels):
    # integer data and integer maps with few levels: ties in both, at the k-th distance too
    if not k < n / 2:
        return
    rng = np.random.default_rng(seed)
    X = rng.integers(0, levels + 1, size=(n, 3)).astype(float)
    Y = rng.integers(0, levels + 2, size=(n, 2)).astype(float)
    ours = lb.continuity(X, Y, n_neighbors=k)
    assert ours == pytest.approx(_cont_brute(X, Y, k), abs=1e-12)
    # the curve function: the same number at that k, and the trustworthiness of the same
    # rule: roles swapped, the tie rule is the same
    ks = [k, 2 * k] if 2 * k < n / 2 else [k]
    res = lb.trustworthiness_continuity(X, [Y, Y], n_neighbors=ks)
    assert res.continuity[:, 0].tolist() == pytest.approx([ours, ours], abs=1e-12)
    assert float(res.trustworthiness[0, 0]) == pytest.approx(
        lb.trustworthiness(X, Y, n_neighbors=k), abs=1e-12
    )
    assert lb.trustworthiness(Y, X, n_neighbors=k) == pytest.approx(ours, abs=1e-12)


def test_continuity_ties_mean_over_all_tie_orders():
    # the oracle of the tie rule: every order of the other points consistent with the data
    # distances, and independently every order consistent with the map's, is enumerated;
    # the penalty of the formula is computed for each pair of orders and averaged
    import itertools

    X = np.array([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1], [1, 1], [2, 0]], float)
    Y = np.array([[0, 0], [0, 1], [1, 0], [2, 0], [0, 2], [1, 1], [1, 2]], float)
    n, k = len(X), 2
    sq = lambda Z: ((Z[:, None] - Z[None]) ** 2).sum(-1)  # noqa: E731
    D, E = sq(X), sq(Y)

    def orders(M, i):
        others = [j for j in range(n) if j != i]
        return [
            o
            for o in itertools.permutations(others)
            if all(M[i, a] <= M[i, b] for a, b in zip(o, o[1:]))
        ]

    total, tied = 0.0, 0
    for i in range(n):
        ox, oy = orders(D, i), orders(E, i)
        tied += len(ox) > 1 and len(oy) > 1
        pens = []
        for a in ox:
            for b in oy:
                rank = {j: r + 1 for r, j in enumerate(b)}
                pens.append(sum(max(0, rank[j] - k) for j in a[:k]))
        total += np.mean(pens)
    assert tied >= 4  # ties in both spaces in most rows
    expected = 1 - 2 * total / (n * k * (2 * n - 3 * k - 1))
    assert lb.continuity(X, Y, n_neighbors=k) == pytest.approx(expected, abs=1e-14)


def test_trustworthiness_continuity_device_and_bad_inputs(device):
    X = torch.as_tensor(_swiss(60), device=device)
    Y = X[:, :2]
    res = lb.trustworthiness_continuity(X, Y, n_neighbors=[2, 5])
    assert bool(((res.continuity > 0) & (res.continuity <= 1)).all())
    assert res.continuity.device.type == "cpu"
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.trustworthiness_continuity(X, Y, n_neighbors=[5, 30])
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.trustworthiness_continuity(X, Y, n_neighbors=[])
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.continuity(X, Y, n_neighbors=0)
    with pytest.raises(TypeError, match="n_neighbors"):
        lb.continuity(X, Y, n_neighbors=2.5)
    with pytest.raises(TypeError, match="anchors"):
        lb.trustworthiness_continuity(X, Y, n_neighbors=5, anchors=[0.5, 1.0])
    with pytest.raises(ValueError, match="anchors"):
        lb.trustworthiness_continuity(X, Y, n_neighbors=5, anchors=[0, 60])
    with pytest.raises(ValueError, match="anchors"):
        lb.trustworthiness_continuity(X, Y, n_neighbors=5, anchors=[])
    with pytest.raises(ValueError, match="y"):
        lb.continuity(X, Y[:50])
