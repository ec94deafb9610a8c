"""Tests for localbook.density: KDE vs scikit-learn, the closed-form score and Hessian vs autograd,
mean shift vs scikit-learn's MeanShift, properties of the mode seekers, and bad inputs."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad
from sklearn.cluster import MeanShift
from sklearn.metrics import adjusted_rand_score
from sklearn.neighbors import KernelDensity

import localbook as lb
from localbook.density import _kde_kernel

SK_NAMES = {
    "gaussian": "gaussian",
    "epanechnikov": "epanechnikov",
    "uniform": "tophat",
    "linear": "linear",
    "laplacian": "exponential",
}


def _cdist(a, b):
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def _blobs(n=300, seed=0, std=0.5):
    x, y, _ = lb.datasets.make_blobs(
        n,
        centers=torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]]),
        std=std,
        seed=seed,
        dtype=torch.float64,
    )
    return x, y


@pytest.mark.parametrize("kernel", list(SK_NAMES))
@pytest.mark.parametrize("d", [1, 2, 3])
def test_kde_matches_sklearn(kernel, d):
    g = torch.Generator().manual_seed(d)
    x = torch.randn(150, d, generator=g, dtype=torch.float64)
    q = 1.3 * torch.randn(40, d, generator=g, dtype=torch.float64)
    ref = (
        KernelDensity(bandwidth=0.8, kernel=SK_NAMES[kernel], rtol=0, atol=0)
        .fit(x.numpy())
        .score_samples(q.numpy())
    )
    ours = lb.kde(q, x, 0.8, kernel=kernel, log=True).numpy()
    # scikit-learn reports an empty compact neighbourhood as a tiny positive density (log ≈ -36), we give -inf
    empty = np.isneginf(ours)
    assert np.all(ref[empty] < -30)
    np.testing.assert_allclose(ours[~empty], ref[~empty], rtol=1e-8, atol=0)
    np.testing.assert_allclose(
        lb.kde(q, x, 0.8, kernel=kernel).numpy(), np.exp(ours), rtol=1e-12
    )


@pytest.mark.parametrize(
    "kernel",
    [
        "gaussian",
        "laplacian",
        "epanechnikov",
        "biweight",
        "tricube",
        "uniform",
        "linear",
    ],
)
@pytest.mark.parametrize("d", [1, 2, 4])
def test_normalizing_constant_by_quadrature(kernel, d):
    kern = _kde_kernel(kernel)
    sphere = 2 * math.pi ** (d / 2) / math.gamma(d / 2)
    radial = quad(
        lambda r: float(kern(torch.tensor(r * r, dtype=torch.float64))) * r ** (d - 1),
        0,
        1.0 if kern.compact else 80.0,
        limit=200,
        epsabs=0,
        epsrel=1e-12,
    )[0]
    assert math.log(sphere * radial) == pytest.approx(
        lb.log_kernel_constant(kernel, d), abs=1e-9
    )


def test_kde_integrates_to_one_2d_vector_bandwidth():
    x = torch.tensor([[0.0, 0.0], [0.5, -0.3], [1.0, 0.2]], dtype=torch.float64)
    h = torch.tensor([0.4, 0.7], dtype=torch.float64)
    g = torch.linspace(-5, 6, 401, dtype=torch.float64)
    grid = torch.cartesian_prod(g, g)
    for kernel in ["gaussian", "biweight", "tricube", "laplacian"]:
        total = lb.kde(grid, x, h, kernel=kernel).sum() * (g[1] - g[0]) ** 2
        assert float(total) == pytest.approx(1.0, abs=2e-3), kernel


def test_kde_far_query_does_not_underflow():
    x = torch.zeros(5, 1, dtype=torch.float64)
    lp = lb.kde(torch.tensor([[100.0]], dtype=torch.float64), x, 1.0, log=True)
    assert float(lp) == pytest.approx(-0.5 * 100.0**2 - 0.5 * math.log(2 * math.pi))


def test_kde_score_and_hessian_vs_autograd(device):
    x, _ = _blobs(120)
    x = x.to(device)
    h = torch.tensor([0.7, 1.1], dtype=torch.float64, device=device)
    q = torch.randn(6, 2, dtype=torch.float64, device=device) * 2

    def brute_log_kde(
        z,
    ):  # written out term by term: an independent, differentiable reference
        u2 = (((z[:, None, :] - x[None, :, :]) / h) ** 2).sum(2)
        return (
            torch.logsumexp(-0.5 * u2, 1)
            - math.log(len(x))
            - torch.log(2 * math.pi * h**2).sum() / 2
        )

    torch.testing.assert_close(lb.kde(q, x, h, log=True), brute_log_kde(q))
    qq = q.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(brute_log_kde(qq).sum(), qq)
    score = lb.kde_score(q, x, h)
    assert score.device.type == device.type and score.shape == (6, 2)
    torch.testing.assert_close(score, grad, rtol=1e-9, atol=1e-11)
    hess = torch.stack(
        [
            torch.autograd.functional.hessian(lambda z: brute_log_kde(z[None])[0], q[i])
            for i in range(q.shape[0])
        ]
    )
    torch.testing.assert_close(lb.kde_log_hessian(q, x, h), hess, rtol=1e-8, atol=1e-10)


def test_kde_score_is_the_mean_shift_over_h2():
    x, _ = _blobs(100)
    q = torch.randn(10, 2, dtype=torch.float64)
    m = lb.nadaraya_watson(q, x, x, 0.9)
    torch.testing.assert_close(lb.kde_score(q, x, 0.9), (m - q) / 0.81)


@pytest.mark.parametrize("bin_seeding", [False, True])
@pytest.mark.parametrize("bandwidth", [0.9, 1.6])
def test_mean_shift_uniform_reproduces_sklearn(bin_seeding, bandwidth):
    x, _ = _blobs(240, seed=3, std=0.6)
    sk = MeanShift(bandwidth=bandwidth, bin_seeding=bin_seeding).fit(x.numpy())
    res = lb.mean_shift(x, bandwidth, kernel="uniform", bin_seeding=bin_seeding)
    assert res.modes.shape == sk.cluster_centers_.shape
    np.testing.assert_allclose(
        res.modes.numpy(), sk.cluster_centers_, atol=1e-3 * bandwidth, rtol=0
    )
    assert adjusted_rand_score(sk.labels_, res.labels.numpy()) == 1.0
    assert np.array_equal(res.labels.numpy(), sk.labels_)
    assert res.n_iter == sk.n_iter_
    assert res.path is None


def test_mean_shift_uniform_with_given_seeds_and_max_iter():
    x, _ = _blobs(150, seed=5)
    seeds = x[::10] + 0.3
    sk = MeanShift(bandwidth=1.2, seeds=seeds.numpy(), max_iter=3).fit(x.numpy())
    res = lb.mean_shift(x, 1.2, kernel="uniform", seeds=seeds, max_iter=3)
    np.testing.assert_allclose(res.modes.numpy(), sk.cluster_centers_, atol=1e-9)
    assert np.array_equal(res.labels.numpy(), sk.labels_)


def test_mean_shift_path_and_frozen_seeds(device):
    x, y = _blobs(150)
    x = x.to(device)
    res = lb.mean_shift(x, 1.0, return_path=True)
    assert res.modes.shape == (3, 2) and res.labels.device.type == device.type
    assert res.path.shape == (res.n_iter + 2, 150, 2)
    torch.testing.assert_close(res.path[0], x)
    steps = torch.linalg.vector_norm(res.path[1:] - res.path[:-1], dim=2)  # (T, s)
    # once a seed's step is ≤ tol·h it never moves again
    stopped = torch.cumsum((steps <= 1e-3).int(), 0) > 0
    assert bool((steps[1:][stopped[:-1]] == 0).all())
    assert adjusted_rand_score(y.numpy(), res.labels.cpu().numpy()) == 1.0


def test_mean_shift_density_never_decreases():
    """Gaussian mean shift ascends the Gaussian KDE; flat-kernel mean shift ascends the Epanechnikov KDE."""
    x, _ = _blobs(200, std=0.8)
    for kernel, shadow in [
        ("gaussian", "gaussian"),
        ("uniform", "epanechnikov"),
        ("epanechnikov", "biweight"),
    ]:
        path = lb.mean_shift(x, 1.3, kernel=kernel, seeds=x[::7], return_path=True).path
        dens = lb.kde(path.reshape(-1, 2), x, 1.3, kernel=shadow).reshape(
            path.shape[:2]
        )
        assert bool((dens[1:] >= dens[:-1] * (1 - 1e-12)).all()), kernel


def test_mean_shift_empty_seed_dropped_and_all_empty_raises():
    x, _ = _blobs(90)
    res = lb.mean_shift(
        x, 1.0, kernel="uniform", seeds=torch.cat([x[:3], torch.tensor([[50.0, 50.0]])])
    )
    assert bool((res.modes.abs() < 20).all())
    with pytest.raises(ValueError, match="bandwidth"):
        lb.mean_shift(x, 1.0, kernel="uniform", seeds=[[50.0, 50.0]])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(5, 60), h=st.floats(0.3, 3.0))
def test_mean_shift_properties(seed, n, h):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g, dtype=torch.float64) * 2
    res = lb.mean_shift(x, h, tol=1e-7, max_iter=2000)
    c = res.modes.shape[0]
    # modes are fixed points of the self-local mean
    m = lb.nadaraya_watson(res.modes, x, x, h)
    assert float(torch.linalg.vector_norm(m - res.modes, dim=1).max()) <= 1e-5 * h
    # labels cover every point, each label is used, and each point goes to its nearest mode
    assert res.labels.shape == (n,) and set(res.labels.tolist()) <= set(range(c))
    assert torch.equal(res.labels, _cdist(x, res.modes).argmin(1))
    # permutation invariance (same modes, same partition)
    perm = torch.randperm(n, generator=g)
    res_p = lb.mean_shift(x[perm], h, tol=1e-7, max_iter=2000)
    assert res_p.modes.shape == res.modes.shape
    assert float(_cdist(res_p.modes, res.modes).min(1).values.max()) <= 1e-4 * h
    assert adjusted_rand_score(
        res.labels[perm].numpy(), res_p.labels.numpy()
    ) == pytest.approx(1.0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 50), h=st.floats(0.3, 3.0))
def test_medoid_shift_properties(seed, n, h):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g, dtype=torch.float64)
    res = lb.medoid_shift(x, h)
    # modes are data points, labels cover all points, roots are their own label
    d = _cdist(res.modes, x)
    roots = d.argmin(1)
    assert float(d.min(1).values.max()) == 0.0
    assert torch.equal(res.labels[roots], torch.arange(res.modes.shape[0]))
    # the successor of each point minimizes the weighted spread Σ_k w_ik |x_k - x_j|² (brute force)
    w = torch.softmax(-0.5 * _cdist(x, x) ** 2 / h**2, dim=1)
    spread = w @ (_cdist(x, x) ** 2)  # (i, j)
    best = spread.min(1).values
    assert bool((spread[roots, roots] <= best[roots] + 1e-12).all())


def test_iterated_medoid_shift_merges_roots():
    x, y = _blobs(240, std=0.6)
    one = lb.medoid_shift(x, 0.6)
    it = lb.medoid_shift(x, 0.6, max_rounds=10)
    assert it.n_iter >= 2 and len(it.modes) < len(one.modes)
    assert adjusted_rand_score(y.numpy(), it.labels.numpy()) > 0.9
    # every iterated mode is a data point and the strongest first
    assert float(_cdist(it.modes, x).min(1).values.max()) == 0.0
    assert bool((it.intensity[:-1] >= it.intensity[1:]).all())
    # each first-pass cluster lands in exactly one iterated cluster
    pairs = torch.unique(torch.stack([one.labels, it.labels], 1), dim=0)
    assert pairs.shape[0] == len(one.modes)


def test_blurring_mean_shift_collapses():
    x, y = _blobs(150, std=0.4)
    res = lb.blurring_mean_shift(x, 0.8, return_path=True, max_iter=30)
    assert res.path.shape == (res.n_iter + 1, 150, 2)
    spread0 = torch.stack([x[y == k].std(0).sum() for k in range(3)]).max()
    final = res.path[-1]
    spread = torch.stack([final[y == k].std(0).sum() for k in range(3)]).max()
    assert float(spread) < 1e-3 * float(spread0)
    assert (
        res.modes.shape == (3, 2)
        and adjusted_rand_score(y.numpy(), res.labels.numpy()) == 1.0
    )


def _hull_gap(a, b):
    """Distance between the convex hulls of two planar point sets with disjoint hulls (closest
    pair: a vertex against an edge; every segment between two points of a set lies in its hull)."""

    def to_segments(p, s):
        s0, ds = s[:, None, :], s[None, :, :] - s[:, None, :]
        t = ((p[:, None, None, :] - s0) * ds).sum(-1) / (ds**2).sum(-1).clamp(
            min=1e-300
        )
        foot = s0 + t.clamp(0, 1)[..., None] * ds
        return float(torch.linalg.vector_norm(p[:, None, None, :] - foot, dim=-1).min())

    return min(to_segments(a, b), to_segments(b, a))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    shift=st.floats(1.05, 3.0),
    kernel=st.sampled_from(["uniform", "epanechnikov", "biweight"]),
)
def test_blurring_compact_kernel_hulls_never_approach(seed, shift, kernel):
    # two groups whose hulls are more than a bandwidth apart: the gap between the hulls never shrinks
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(12, 2, generator=g, dtype=torch.float64)
    b = torch.rand(12, 2, generator=g, dtype=torch.float64) + torch.tensor(
        [1.0 + shift, 0.0], dtype=torch.float64
    )
    x = torch.cat([a, b])
    res = lb.blurring_mean_shift(x, 1.0, kernel, max_iter=15, tol=0.0, return_path=True)
    gap0 = _hull_gap(a, b)
    assert gap0 > 1.0
    tol = 64 * torch.finfo(torch.float64).eps * 5.0
    for p in res.path:
        assert _hull_gap(p[:12], p[12:]) >= gap0 - tol


def test_blurring_compact_kernel_points_apart_can_still_merge():
    # every cross-group distance exceeds h, yet the pair's midpoint comes within reach of the third
    trio = torch.tensor([[-0.5, 0.0], [0.5, 0.0], [0.0, -1.05]], dtype=torch.float64)
    assert float(_cdist(trio[:2], trio[2:]).min()) > 1.1
    res = lb.blurring_mean_shift(
        trio, 1.1, "uniform", max_iter=5, tol=0.0, return_path=True
    )
    torch.testing.assert_close(
        res.path[2], torch.tensor([[0.0, -0.35]], dtype=torch.float64).expand(3, 2)
    )
    assert len(res.modes) == 1


def test_pc_shift_finds_circle_ridge(device):
    g = torch.Generator().manual_seed(0)
    t = torch.rand(300, generator=g, dtype=torch.float64) * 2 * math.pi
    x = torch.stack([t.cos(), t.sin()], 1) + 0.1 * torch.randn(
        300, 2, generator=g, dtype=torch.float64
    )
    x = x.to(device)
    res = lb.pc_shift(x, 0.25, max_iter=200, tol=1e-6)
    assert bool(res.converged.all()) and res.points.device.type == device.type
    # the ridge is one curve: the radii of the moved points spread far less than the data's
    r0 = torch.linalg.vector_norm(x, dim=1)
    r1 = torch.linalg.vector_norm(res.points, dim=1)
    assert float(r1.std()) < 0.25 * float(r0.std())
    assert abs(float(r1.mean()) - 1.0) < 0.05
    # fixed points: the score has no component across the ridge
    hess = lb.kde_log_hessian(res.points, x, 0.25)
    v = torch.linalg.eigh(hess)[1][:, :, :1]
    across = (
        (v.transpose(1, 2) @ lb.kde_score(res.points, x, 0.25)[:, :, None]).abs().max()
    )
    assert float(across) < 1e-4 / 0.25


def test_pc_shift_ridge_dim_zero_is_mean_shift():
    x, _ = _blobs(90)
    a = lb.pc_shift(x, 1.0, ridge_dim=0, seeds=x[:5], max_iter=5, tol=0.0).points
    b = lb.mean_shift(
        x, 1.0, seeds=x[:5], max_iter=4, tol=0.0, merge_radius=1e-9, return_path=True
    ).path[-1]
    torch.testing.assert_close(a, b)


def test_dtype_and_integer_inputs():
    x = torch.tensor([[0, 0], [1, 0], [5, 5], [6, 5]])
    assert lb.kde([[0, 0]], x, 1.0).dtype == torch.get_default_dtype()
    x32 = x.float()
    assert lb.kde_score(x32, x32, 1.0).dtype == torch.float32
    assert lb.mean_shift(x32, 2.0).modes.dtype == torch.float32


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (lambda x: lb.kde(x, x, 0.0), ValueError, "bandwidth"),
        (lambda x: lb.kde(x, x, 1.0, kernel="cosine"), ValueError, "kernel"),
        (lambda x: lb.kde(x[:, :1], x, 1.0), ValueError, "x_query"),
        (lambda x: lb.kde(x, x, 1.0, log="yes"), TypeError, "log"),
        (lambda x: lb.kde_score(x, torch.empty(0, 2), 1.0), ValueError, "x"),
        (lambda x: lb.kde_score(x, x, float("nan")), ValueError, "bandwidth"),
        (lambda x: lb.kde_score(x, x, [1.0, 2.0, 3.0]), ValueError, "bandwidth"),
        (
            lambda x: lb.mean_shift(torch.full((3, 2), float("nan")), 1.0),
            ValueError,
            "x",
        ),
        (lambda x: lb.mean_shift(x, 1.0, kernel="box"), ValueError, "kernel"),
        (lambda x: lb.mean_shift(x, 1.0, seeds=[[1.0, 2.0, 3.0]]), ValueError, "seeds"),
        (lambda x: lb.mean_shift(x, 1.0, max_iter=-1), ValueError, "max_iter"),
        (lambda x: lb.mean_shift(x, 1.0, max_iter=2.5), TypeError, "max_iter"),
        (lambda x: lb.mean_shift(x, 1.0, tol=-1.0), ValueError, "tol"),
        (lambda x: lb.mean_shift(x, 1.0, return_path=1), TypeError, "return_path"),
        (lambda x: lb.mean_shift(x, 1.0, min_bin_freq=0), ValueError, "min_bin_freq"),
        (lambda x: lb.mean_shift(x, 1.0, merge_radius=0.0), ValueError, "merge_radius"),
        (lambda x: lb.blurring_mean_shift(x, -1.0), ValueError, "bandwidth"),
        (lambda x: lb.medoid_shift("abc", 1.0), TypeError, "x"),
        (lambda x: lb.medoid_shift(x, 1.0, max_rounds=0), ValueError, "max_rounds"),
        (lambda x: lb.pc_shift(x, 1.0, ridge_dim=2), ValueError, "ridge_dim"),
        (lambda x: lb.log_kernel_constant("gaussian", 0), ValueError, "d"),
    ],
)
def test_bad_inputs(call, exc, name):
    x = torch.randn(10, 2, dtype=torch.float64)
    with pytest.raises(exc, match=name):
        call(x)


# --- medoid shift from a precomputed distance matrix


def _brute_medoid_roots(dist, h):
    """One round of Gaussian medoid shift from a distance matrix, written out in numpy: every
    point's successor (argmin of the weighted spread, itself on ties), followed to its root; and
    the smallest gap between a row's chosen spread and its runner-up (a near-tie guard)."""
    d = np.asarray(dist, dtype=np.float64)
    w = np.exp(-0.5 * (d / h) ** 2)
    spread = (w / w.sum(1, keepdims=True)) @ d**2
    own = np.arange(len(d))
    best = spread.argmin(1)
    nxt = np.where(spread[own, own] <= spread[own, best], own, best)
    srt = np.sort(spread, 1)
    gap = float(np.min(srt[:, 1] - srt[:, 0])) if len(d) > 1 else np.inf
    root = nxt.copy()
    for _ in range(len(d)):
        root = nxt[root]
    return root, gap / float(np.max(spread))


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "biweight"])
@pytest.mark.parametrize("rounds", [1, 10])
def test_medoid_shift_precomputed_equals_coordinates(kernel, rounds, device):
    x, _ = _blobs(240, std=0.6)
    x = x.to(device)
    dist = _cdist(x, x)
    a = lb.medoid_shift(x, 0.6, kernel, rounds)
    b = lb.medoid_shift(dist, 0.6, kernel, rounds, metric="precomputed")
    assert b.labels.device.type == device.type
    assert torch.equal(a.labels, b.labels) and torch.equal(a.mode_index, b.mode_index)
    assert a.n_iter == b.n_iter
    # the kernel masses are n-term sums of the same kernel values, rounded differently
    torch.testing.assert_close(
        a.intensity, b.intensity, rtol=240 * torch.finfo(torch.float64).eps, atol=0
    )
    assert torch.equal(a.modes, x[a.mode_index]) and torch.equal(
        b.modes, dist[b.mode_index]
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 50),
    h=st.floats(0.3, 3.0),
    d=st.integers(1, 4),
)
def test_medoid_shift_precomputed_properties(seed, n, h, d):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    euclid = _cdist(x, x)
    manhattan = torch.cdist(x, x, p=1)  # not a Euclidean distance matrix for d ≥ 2
    for dist in (euclid, manhattan):
        root, gap = _brute_medoid_roots(dist.numpy(), h)
        res = lb.medoid_shift(dist, h, metric="precomputed")
        if (
            gap > 1e-9
        ):  # no near-tie: the result is determined, compare with the oracle exactly
            assert sorted(res.mode_index.tolist()) == sorted(set(root.tolist()))
            assert torch.equal(res.mode_index[res.labels], torch.as_tensor(root))
    # on Euclidean data the matrix path and the coordinate path agree (same near-tie guard)
    root, gap = _brute_medoid_roots(euclid.numpy(), h)
    if gap > 1e-9:
        a, b = lb.medoid_shift(x, h), lb.medoid_shift(euclid, h, metric="precomputed")
        assert torch.equal(a.labels, b.labels) and torch.equal(
            a.mode_index, b.mode_index
        )
    # relabelling the points permutes the answer
    perm = torch.randperm(n, generator=g)
    res = lb.medoid_shift(manhattan, h, metric="precomputed")
    res_p = lb.medoid_shift(manhattan[perm][:, perm], h, metric="precomputed")
    if _brute_medoid_roots(manhattan.numpy(), h)[1] > 1e-9:
        assert sorted(perm[res_p.mode_index].tolist()) == sorted(
            res.mode_index.tolist()
        )
        assert torch.equal(
            perm[res_p.mode_index[res_p.labels]], res.mode_index[res.labels][perm]
        )


def test_medoid_shift_precomputed_never_lowers_the_density():
    """A successor never has a lower kernel sum Σ_l K(d(j, l)/h) (convexity of exp(-t/2h²) in t),
    for any symmetric dissimilarity: here the arc length on a circle."""
    g = torch.Generator().manual_seed(4)
    angle = torch.rand(200, generator=g, dtype=torch.float64) * 2 * math.pi
    diff = (angle[:, None] - angle[None, :]).abs()
    arc = torch.minimum(diff, 2 * math.pi - diff)
    res = lb.medoid_shift(arc, 0.3, metric="precomputed")
    dens = torch.exp(-0.5 * (arc / 0.3) ** 2).sum(1)
    root = res.mode_index[res.labels]
    assert bool((dens[root] >= dens * (1 - 1e-12)).all())
    assert len(res.modes) < 200


@pytest.mark.parametrize(
    "dist, bandwidth, match",
    [
        (torch.ones(3, 4), 1.0, "square"),
        (torch.tensor([[0.0, -1.0], [-1.0, 0.0]]), 1.0, "non-negative"),
        (torch.tensor([[0.0, 1.0], [2.0, 0.0]]), 1.0, "symmetric"),
        (torch.tensor([[1.0, 1.0], [1.0, 0.0]]), 1.0, "zero diagonal"),
        (torch.tensor([[0.0, float("nan")], [float("nan"), 0.0]]), 1.0, "NaN"),
        (torch.zeros(3), 1.0, "dimension"),
        (torch.zeros(2, 2), -1.0, "bandwidth"),
    ],
)
def test_medoid_shift_precomputed_bad_inputs(dist, bandwidth, match):
    with pytest.raises(ValueError, match=match) as info:
        lb.medoid_shift(dist, bandwidth, metric="precomputed")
    assert str(info.value).startswith(
        "bandwidth" if bandwidth < 0 else "x "
    )  # names the argument


def test_medoid_shift_precomputed_type_errors():
    with pytest.raises(TypeError, match="bandwidth"):
        lb.medoid_shift(torch.zeros(2, 2), [1.0, 2.0], metric="precomputed")
    with pytest.raises(ValueError, match="metric"):
        lb.medoid_shift(torch.zeros(2, 2), 1.0, metric="cosine")
    # rounding-level asymmetry (a float32 distance matrix from the Gram trick) is accepted
    x = torch.randn(30, 3)
    dist = torch.cdist(x, x).fill_diagonal_(0.0)
    dist = dist + 1e-6 * torch.triu(torch.rand(30, 30), 1)
    assert len(lb.medoid_shift(dist, 1.0, metric="precomputed").labels) == 30


@pytest.mark.parametrize("max_iter", [0, 1, 4])
def test_mean_shift_max_iter_allows_one_more_step(max_iter):
    """As scikit-learn's MeanShift: max_iter = k allows k + 1 steps and n_iter counts k of them."""
    x, _ = _blobs(90)
    res = lb.mean_shift(
        x, 1.0, seeds=x[:4], max_iter=max_iter, tol=0.0, return_path=True
    )
    assert res.n_iter == max_iter and res.path.shape[0] == max_iter + 2
    cur = x[:4]
    for _ in range(max_iter + 1):
        cur = lb.nadaraya_watson(cur, x, x, 1.0)
    torch.testing.assert_close(res.path[-1], cur)
    sk = MeanShift(
        bandwidth=1.2, seeds=x[:4].numpy(), max_iter=max_iter, cluster_all=True
    ).fit(x.numpy())
    ours = lb.mean_shift(x, 1.2, kernel="uniform", seeds=x[:4], max_iter=max_iter)
    np.testing.assert_allclose(ours.modes.numpy(), sk.cluster_centers_, atol=1e-12)


# --- fast row-wise unique and bin seeds (issue 18) ----------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 4), st.floats(0.2, 3.0))
def test_unique_rows_and_bin_seeds_equal_the_row_wise_unique(seed, d, h):
    from localbook.modes import _bin_seeds, _unique_rows

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, d, generator=g, dtype=torch.float64)
    x = torch.cat([x, x[:50], -0.0 * x[:3], 0.0 * x[:3]])  # repeated rows, −0 and 0
    uniq, inverse = _unique_rows(x)
    assert (
        torch.equal(uniq[inverse], x)
        and uniq.shape[0] == torch.unique(x, dim=0).shape[0]
    )
    hh = torch.full((d,), h, dtype=torch.float64)
    for freq in (1, 3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            got = _bin_seeds(x, hh, freq)
        # the reference: scikit-learn's dict of rounded points, in first-seen order
        counts = {}
        for row in torch.round(x / hh).tolist():
            key = tuple(v + 0.0 for v in row)
            counts[key] = counts.get(key, 0) + 1
        keep = [k for k, c in counts.items() if c >= freq]
        if len(keep) == x.shape[0]:
            assert torch.equal(got, x)
        else:
            ref = (
                torch.tensor(keep, dtype=torch.float32).reshape(-1, d) * hh.float()
            ).double()
            assert torch.equal(got, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.faults
def test_mean_shift_in_half_precision_works_in_float32(dtype):
    """Half data crashed with an IndexError; it now runs in float32 and returns the modes in
    the data's dtype, with the labels of the float32 run on the same (rounded) data."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(40, 2, generator=g) * 0.3,
            torch.randn(40, 2, generator=g) * 0.3 + 3,
        ]
    ).to(dtype)
    res = lb.mean_shift(x, 0.8)
    ref = lb.mean_shift(x.float(), 0.8)
    assert res.modes.dtype == dtype and res.intensity.dtype == dtype
    assert torch.equal(res.labels, ref.labels) and len(res.modes) == 2
    torch.testing.assert_close(res.modes, ref.modes.to(dtype), rtol=0, atol=0)


# --- mean shift stops at stationary points: the perturbation test rejects non-maxima


def _two_blobs_and_a_saddle_point(seed=0):
    """Two blobs mirrored exactly through x₁ = 0, plus one point at the origin: its path stays
    on the mirror line (equal weights for mirrored points) and ends at the saddle between them."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(100, 2, generator=g, dtype=torch.float64) * 0.5
    a = a + torch.tensor([-1.5, 0.0], dtype=torch.float64)
    b = a * torch.tensor([-1.0, 1.0], dtype=torch.float64)
    return torch.cat([a, b, torch.zeros(1, 2, dtype=torch.float64)])


@pytest.mark.parametrize(
    "kernel, h",
    [
        ("gaussian", 0.6),
        ("laplacian", 0.6),
        ("uniform", 1.0),
        ("epanechnikov", 1.0),
        ("biweight", 1.3),
        ("tricube", 1.3),
    ],
)
def test_mean_shift_rejects_the_saddle(kernel, h, device):
    x = _two_blobs_and_a_saddle_point().to(device)
    plain = lb.mean_shift(x, h, kernel=kernel, check_maxima=False)
    assert plain.rejected is None and len(plain.modes) == 3
    saddle = plain.modes[torch.argmin(plain.modes[:, 0].abs())]
    assert abs(float(saddle[0])) <= 1e-9  # on the mirror line
    res = lb.mean_shift(x, h, kernel=kernel)
    assert len(res.modes) == 2 and res.rejected.shape == (1, 2)
    torch.testing.assert_close(res.rejected[0], saddle)
    # the surviving modes are the mirrored pair, untouched by the test
    torch.testing.assert_close(res.modes, plain.modes[plain.modes[:, 0].abs() > 0.5])
    torch.testing.assert_close(
        res.modes[0] * torch.tensor([-1.0, 1.0]).to(x), res.modes[1]
    )
    # every point, the one at the origin too, goes to its nearest surviving mode
    assert torch.equal(res.labels, _cdist(x, res.modes).argmin(1))
    assert res.labels.device.type == device.type


def test_saddle_verdict_agrees_with_the_gaussian_hessian():
    """The oracle for the Gaussian: ∇² log p̂ (kde_log_hessian, itself checked by autograd)
    has a positive eigenvalue at the rejected end point and is negative definite at the
    modes."""
    x = _two_blobs_and_a_saddle_point()
    res = lb.mean_shift(x, 0.6, tol=1e-9)
    ev_modes = torch.linalg.eigvalsh(lb.kde_log_hessian(res.modes, x, 0.6))
    ev_saddle = torch.linalg.eigvalsh(lb.kde_log_hessian(res.rejected, x, 0.6))
    assert bool((ev_modes < 0).all())
    assert float(ev_saddle[0, 0]) < 0 < float(ev_saddle[0, 1])


def test_flat_saddle_as_scikit_learn_without_the_check():
    """scikit-learn's MeanShift keeps the saddle; check_maxima=False reproduces it exactly."""
    x = _two_blobs_and_a_saddle_point()
    sk = MeanShift(bandwidth=1.0).fit(x.numpy())
    plain = lb.mean_shift(x, 1.0, kernel="uniform", check_maxima=False)
    assert len(sk.cluster_centers_) == 3
    np.testing.assert_allclose(plain.modes.numpy(), sk.cluster_centers_, atol=1e-12)
    assert np.array_equal(plain.labels.numpy(), sk.labels_)
    assert len(lb.mean_shift(x, 1.0, kernel="uniform").modes) == 2


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(5, 60), h=st.floats(0.3, 3.0))
def test_check_maxima_keeps_every_hessian_maximum(seed, n, h):
    """Random data (no symmetry, so no seed sits on a saddle's stable manifold): the test keeps
    every mode, each has a negative definite log-Hessian, and the check changes nothing."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g, dtype=torch.float64) * 2
    res = lb.mean_shift(x, h, tol=1e-7, max_iter=500)
    plain = lb.mean_shift(x, h, tol=1e-7, max_iter=500, check_maxima=False)
    assert res.rejected.shape == (0, 2)
    assert torch.equal(res.modes, plain.modes) and torch.equal(res.labels, plain.labels)
    ev = torch.linalg.eigvalsh(lb.kde_log_hessian(res.modes, x, h))
    assert bool((ev < 0).all())


def test_saddle_of_a_saddle_in_three_dimensions():
    """Four blobs on the corners of a square in the plane x₃ = 0, mirrored in x₁ and x₂, and
    a point at the centre: it is a stationary point with two ascent directions; the check
    rejects it and every survivor is a Hessian maximum."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(60, 3, generator=g, dtype=torch.float64) * 0.4
    a = a + torch.tensor([1.5, 1.5, 0.0], dtype=torch.float64)
    flips = torch.tensor(
        [[1.0, 1.0, 1.0], [-1.0, 1.0, 1.0], [1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]],
        dtype=torch.float64,
    )
    x = torch.cat([a * f for f in flips] + [torch.zeros(1, 3, dtype=torch.float64)])
    plain = lb.mean_shift(x, 0.6, check_maxima=False)
    res = lb.mean_shift(x, 0.6)
    assert len(plain.modes) == 5 and len(res.modes) == 4 and len(res.rejected) == 1
    ev_saddle = torch.linalg.eigvalsh(lb.kde_log_hessian(res.rejected, x, 0.6))[0]
    assert int((ev_saddle > 0).sum()) == 2
    assert bool(
        (torch.linalg.eigvalsh(lb.kde_log_hessian(res.modes, x, 0.6)) < 0).all()
    )


def test_check_maxima_is_reproducible_and_validated():
    x = _two_blobs_and_a_saddle_point()
    a = lb.mean_shift(x, 0.6, random_state=3)
    b = lb.mean_shift(x, 0.6, random_state=3)
    assert torch.equal(a.modes, b.modes) and torch.equal(a.rejected, b.rejected)
    half = lb.mean_shift(x.float().half(), 0.6)
    assert half.rejected.dtype == torch.float16 and len(half.modes) == 2
    for kwargs, exc, name in [
        ({"check_maxima": 1}, TypeError, "check_maxima"),
        ({"perturbation": 0.0}, ValueError, "perturbation"),
        ({"perturbation": "a"}, TypeError, "perturbation"),
        ({"random_state": -1}, ValueError, "random_state"),
        ({"random_state": 1.5}, TypeError, "random_state"),
    ]:
        with pytest.raises(exc, match=name):
            lb.mean_shift(x, 0.6, **kwargs)
