"""localbook.kernels: conventions, log forms, the chunked engine, validation helpers."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb
from localbook import _validate as V
from localbook.kernels import scaled_sq_dist
from localbook.local_sums import local_average

U = torch.linspace(0, 2.5, 251, dtype=torch.float64)
PROFILES = {
    "gaussian": torch.exp(-(U**2) / 2),
    "laplacian": torch.exp(-U),
    "epanechnikov": torch.clamp(1 - U**2, min=0),
    "biweight": torch.clamp(1 - U**2, min=0) ** 2,
    "tricube": torch.clamp(1 - U**3, min=0) ** 3,
    "uniform": (U <= 1).double(),
}


@pytest.mark.parametrize("name", list(PROFILES))
def test_profiles_follow_the_design_conventions(name):
    torch.testing.assert_close(
        lb.kernel_profile(U, name), PROFILES[name], rtol=1e-12, atol=1e-14
    )
    k = lb.get_kernel(name)
    assert k.compact == (name not in ("gaussian", "laplacian"))
    assert float(k(torch.tensor(0.0, dtype=torch.float64))) == 1.0


def test_scaled_sq_dist_matches_cdist_with_per_dimension_bandwidth(device):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(30, 3, generator=g, dtype=torch.float64) + 1e3).to(device)
    b = (torch.randn(40, 3, generator=g, dtype=torch.float64) + 1e3).to(device)
    h = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, device=device)
    ref = (((a[:, None, :] - b[None, :, :]) / h) ** 2).sum(-1)
    torch.testing.assert_close(scaled_sq_dist(a, b, h), ref, rtol=1e-9, atol=1e-9)


def test_kernel_matrix_uses_per_dimension_bandwidth():
    x = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    K = lb.kernel_matrix(x, x, [1.0, 2.0])
    torch.testing.assert_close(
        K[0, 1], torch.tensor(math.exp(-0.5 * (1 + 1)), dtype=torch.float64)
    )


@settings(max_examples=30, deadline=None)
@given(st.floats(1e-3, 1e3), st.floats(-1e4, 1e4))
def test_log_space_average_never_nan_for_exponential_kernels(h, offset):
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    v = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    q = torch.tensor([[offset]], dtype=torch.float64)
    hh = torch.tensor([h], dtype=torch.float64)
    for name in ("gaussian", "laplacian"):
        mean, lse = local_average(q, x, v, hh, name)
        assert torch.isfinite(mean).all() and 1 - 1e-9 <= float(mean) <= 3 + 1e-9


def test_validation_helpers():
    x = V.check_points([1, 2, 3], "x")
    assert x.shape == (3, 1) and x.dtype == torch.get_default_dtype()
    f32 = V.check_points(np.ones((4, 2), np.float32), "x")
    assert f32.dtype == torch.float32
    assert V.check_bandwidth(2.0, 3, like=f32).tolist() == [2.0, 2.0, 2.0]
    assert V.check_index(-1, 5) == 4
    with pytest.raises(ValueError, match="i must be between -5 and 4"):
        V.check_index(5, 5)
    with pytest.raises(TypeError, match="kernel must be one of"):
        lb.get_kernel(3)
    with pytest.raises(ValueError, match="u must be non-negative"):
        lb.kernel_profile([-1.0])
    with pytest.raises(TypeError, match="flag must be an integer"):
        V.check_positive_int(True, "flag")
    with pytest.raises(ValueError, match="noise must be non-negative"):
        lb.datasets.make_regression_1d(10, noise=-1)
    with pytest.raises(TypeError, match="must be real-valued"):
        V.as_tensor(torch.ones(2, dtype=torch.complex64), "z")


def test_default_device_is_usable():
    dev = lb.default_device()
    assert torch.zeros(1, device=dev).device.type == dev.type


def test_datasets_are_seeded_and_shipped_data_verified():
    a = lb.datasets.make_regression_1d(50, seed=3)
    b = lb.datasets.make_regression_1d(50, seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, labels, centers = lb.datasets.make_blobs(90, centers=3, seed=1)
    assert (
        x.shape == (90, 2)
        and set(labels.tolist()) == {0, 1, 2}
        and centers.shape == (3, 2)
    )
    text = lb.datasets.load_oliver_twist()
    assert text.count("CHAPTER ") >= 53 and "Oliver Twist" in text[:200]
    imgs, labs = lb.datasets.load_fashion_mnist_subset()
    assert imgs.shape == (200, 28, 28) and labs[:10].tolist() == [
        9,
        2,
        1,
        1,
        6,
        1,
        4,
        6,
        5,
        7,
    ]


def test_widgets_static_mode_draws_small_multiples(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("LOCALBOOK_STATIC", "1")
    calls = []

    def plot(ax, h, kernel):
        calls.append((h, kernel))
        ax.plot([0, 1], [0, h])

    fig = lb.widgets.interactive_figure(
        plot,
        {"h": (0.1, 1.0, 0.1), "kernel": ["gaussian", "uniform"]},
        [{"h": 0.2, "kernel": "gaussian"}, {"h": 0.5, "kernel": "uniform"}],
    )
    assert calls == [(0.2, "gaussian"), (0.5, "uniform")]
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2
    with pytest.raises(ValueError, match="static must list"):
        lb.widgets.interactive_figure(plot, {}, [])


# --- one nearest-neighbour search, one budget, one finite check, one empty warning -----------
def test_knn_search_matches_sklearn_and_brute_force(device):
    from sklearn.neighbors import NearestNeighbors

    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 3, generator=g, dtype=torch.float64)
    q = torch.randn(40, 3, generator=g, dtype=torch.float64)
    dist, idx = lb.knn_search(q.to(device), x.to(device), 6)
    assert (
        dist.device.type == device.type
        and idx.dtype == torch.long
        and dist.shape == (40, 6)
    )
    ref_d, ref_i = NearestNeighbors(n_neighbors=6).fit(x.numpy()).kneighbors(q.numpy())
    np.testing.assert_array_equal(idx.cpu().numpy(), ref_i)
    # squared distances by a matrix product: rounding at the scale of |x|², then a square root
    np.testing.assert_allclose(dist.cpu().numpy(), ref_d, rtol=0, atol=1e-7)
    assert bool((dist[:, 1:] >= dist[:, :-1]).all())  # sorted rows
    d1, i1 = lb.knn_search(q, x, 1)
    np.testing.assert_array_equal(i1[:, 0].numpy(), torch.cdist(q, x).argmin(1).numpy())
    with pytest.raises(ValueError, match="n_neighbors"):
        lb.knn_search(q, x, 301)
    with pytest.raises(ValueError, match="x_query"):
        lb.knn_search(q[:, :2], x, 3)


def test_knn_search_chunks_give_the_same_answer(monkeypatch):
    import localbook.chunks as kern

    g = torch.Generator().manual_seed(4)
    x, q = (
        torch.randn(200, 2, generator=g, dtype=torch.float64),
        torch.randn(50, 2, generator=g, dtype=torch.float64),
    )
    full = lb.knn_search(q, x, 4)
    monkeypatch.setattr(
        kern, "CPU_MEMORY_BUDGET", 4 * 200 * 8 * 3
    )  # three query rows per chunk
    assert kern.chunk_rows(50, 200, 1, 8) == 3
    small = lb.knn_search(q, x, 4)
    assert torch.equal(small[1], full[1])
    # the matrix product's blocking depends on the chunk: distances agree to rounding
    torch.testing.assert_close(small[0], full[0], rtol=0, atol=1e-13)


def test_chunk_rows_picks_the_budget_by_device():
    from localbook.chunks import CPU_MEMORY_BUDGET, MEMORY_BUDGET, chunk_rows

    per_row = 4 * 1000 * 8
    assert chunk_rows(10**6, 1000, 1, 8, None, "cpu") == CPU_MEMORY_BUDGET // per_row
    assert (
        chunk_rows(10**6, 1000, 1, 8, None, "meta") == MEMORY_BUDGET // per_row
    )  # an accelerator
    assert (
        chunk_rows(10**6, 1000, 1, 8, per_row * 5, "cpu") == 5
    )  # an explicit budget wins
    assert chunk_rows(3, 1000, 1, 8, None, "cpu") == 3


def test_check_finite_counts_bad_entries_and_accepts_overflowing_sums():
    big = torch.full(
        (4, 3), torch.finfo(torch.float32).max
    )  # every entry finite, the sum is inf
    assert V.check_finite(big, "q") is big
    t = torch.zeros(5, 2, 3)
    t[1, 0, 2], t[4, 1, 1] = math.nan, -math.inf
    with pytest.raises(ValueError, match="t contains 2 NaN or infinite"):
        V.check_finite(t, "t")
    with pytest.raises(ValueError, match="v contains 1 NaN"):
        V.as_tensor([1.0, math.inf], "v")
    V.check_finite(torch.empty(0), "e")


def test_one_empty_neighbourhood_warning():
    with pytest.warns(
        UserWarning, match="3 of 7 queries have no neighbour; their estimates are NaN"
    ):
        V.warn_empty(3, 7, "have no neighbour")
    with pytest.warns(
        UserWarning, match="no data point within the bandwidth of the compact 'uniform'"
    ):
        lb.nadaraya_watson([5.0], [0.0, 1.0], [1.0, 2.0], 0.5, kernel="uniform")
    with pytest.warns(
        UserWarning, match="no data point within the bandwidth of the compact 'uniform'"
    ):
        lb.local_linear([5.0], [0.0, 1.0], [1.0, 2.0], 0.5, kernel="uniform")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        V.warn_empty(0, 7, "have no neighbour")  # nothing to say


# --- the tiled kernel sums (issue 18): column blocks, shift-free rows, cell lists ------------
def _dense_reference(q, x, v, h, name):
    """Σ K v / Σ K and log Σ K entry by entry in float64 (differences, logsumexp)."""
    u2 = (((q[:, None, :] - x[None, :, :]) / h) ** 2).sum(-1).double()
    lw = lb.get_kernel(name).log_profile(u2)
    lse = torch.logsumexp(lw, 1)
    w = torch.exp(lw - lse[:, None])
    return (w @ v.double()) if v is not None else None, lse


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10**6),
    st.sampled_from(list(PROFILES)),
    st.sampled_from([0, 1, 3, 20]),
    st.sampled_from([1, 2, 3, 20]),
    st.sampled_from([torch.float64, torch.float32]),
)
def test_tiled_sums_equal_the_dense_sum(seed, name, k, d, dtype):
    """Shift-free tiles (float64; float32 with d ≤ 14), online-shifted ones (float32, d = 20) and
    the rows redone online agree with the dense float64 sum; column blocks accumulate."""
    import localbook.chunks as chunks
    import localbook.local_sums as kern

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, d, generator=g, dtype=torch.float64)
    q = torch.cat([torch.randn(40, d, generator=g, dtype=torch.float64), x[:5] + 1e-3])
    h = (0.2 + torch.rand(d, generator=g, dtype=torch.float64)) * (1 if d < 20 else 3)
    v = torch.randn(300, k, generator=g, dtype=torch.float64) if k else None
    ref_mean, ref_lse = _dense_reference(q, x, v, h, name)
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.setattr(
            chunks, "CPU_TILE_BYTES", 8 * 7 * 64
        )  # 64 queries × 7 points: many column blocks
        mp.setattr(
            kern, "GRID_MIN_SPAN", 10**9
        )  # compact kernels on the dense tiles here
        warnings.simplefilter("ignore", UserWarning)
        vv = None if v is None else v.to(dtype)
        mean, lse = local_average(q.to(dtype), x.to(dtype), vv, h.to(dtype), name)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    ok = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), ok)  # the same empty neighbourhoods
    torch.testing.assert_close(lse[ok].double(), ref_lse[ok], rtol=tol, atol=tol)
    if v is not None:
        torch.testing.assert_close(
            mean[ok].double(),
            ref_mean[ok],
            rtol=tol,
            atol=tol * (1 + float(v.abs().max())),
        )


def test_shift_free_rows_far_from_the_data_are_redone_exactly():
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    v = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    # 0.5 (400/0.1)² far below the exp floor: shift-free sums would be floored garbage
    q = torch.tensor([[0.5], [400.0], [-400.0]], dtype=torch.float64)
    mean, lse = local_average(
        q, x, v, torch.tensor([0.1], dtype=torch.float64), "gaussian"
    )
    ref_mean, ref_lse = _dense_reference(
        q, x, v, torch.tensor([0.1], dtype=torch.float64), "gaussian"
    )
    torch.testing.assert_close(lse, ref_lse, rtol=1e-13, atol=0)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-13, atol=0)
    assert (
        float(mean[1, 0]) == 3.0 and float(mean[2, 0]) == 1.0
    )  # the nearest point's value


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10**6),
    st.sampled_from(["uniform", "epanechnikov", "biweight", "tricube"]),
    st.integers(1, 3),
    st.floats(0.05, 2.0),
)
def test_grid_sums_equal_the_brute_force_sums(seed, name, d, bw):
    from localbook.kernels import data_center, get_kernel
    from localbook.local_sums import _grid_sums

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(400, d, generator=g, dtype=torch.float64) * torch.tensor(
        [1.0, 3.0, 0.5][:d], dtype=torch.float64
    )
    q = torch.cat(
        [3 * torch.randn(60, d, generator=g, dtype=torch.float64), x[:10], x[:3] + 50.0]
    )
    v = torch.randn(400, 2, generator=g, dtype=torch.float64)
    h = torch.full((d,), bw, dtype=torch.float64)
    sums = _grid_sums(
        q, x, v, h, get_kernel(name), data_center(x), budget=8 * 600, force=True
    )  # many chunks
    w = torch.exp(
        get_kernel(name).log_profile((((q[:, None] - x[None]) / h) ** 2).sum(-1))
    )
    torch.testing.assert_close(
        sums, torch.cat([w @ v, w.sum(1, keepdim=True)], 1), rtol=1e-12, atol=1e-12
    )
    assert bool(
        (sums[-3:] == 0).all()
    )  # queries beyond the grid's border cells see nothing


def test_local_average_takes_the_grid_when_the_support_is_small(monkeypatch):
    import localbook.local_sums as kern

    g = torch.Generator().manual_seed(5)
    x = 10 * torch.rand(3000, 2, generator=g, dtype=torch.float64)
    q = 10 * torch.rand(200, 2, generator=g, dtype=torch.float64)
    h = torch.tensor([0.2, 0.3], dtype=torch.float64)
    used = []
    grid = kern._grid_query
    monkeypatch.setattr(
        kern, "_grid_query", lambda *a, **kw: used.append(grid(*a, **kw)) or used[-1]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mean, lse = local_average(q, x, x, h, "epanechnikov")
    assert used and used[0] is not None  # the cell list ran
    ref_mean, ref_lse = _dense_reference(q, x, x, h, "epanechnikov")
    ok = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), ok)
    torch.testing.assert_close(lse[ok], ref_lse[ok], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean[ok], ref_mean[ok], rtol=1e-12, atol=1e-12)


def test_tile_shape_rules():
    from localbook.chunks import CPU_TILE_BYTES, tile_shape

    elems = CPU_TILE_BYTES * torch.get_num_threads() // 8
    assert tile_shape(10**6, 100, 8) == (elems // 100, 100)  # whole data rows
    assert tile_shape(10**6, 10**6, 8) == (
        64,
        elems // 64,
    )  # 64 queries × a block of the data
    assert tile_shape(10**6, 10**6, 8, depth=786) == (
        256,
        elems // 256,
    )  # long products
    assert tile_shape(5, 10**6, 8) == (5, elems // 64)
    assert tile_shape(10**6, 1000, 8, budget=4 * 1000 * 8 * 3) == (
        3,
        1000,
    )  # an explicit budget: rows


@pytest.mark.faults
@pytest.mark.parametrize("engine", ["compiled", "torch"])
def test_float32_queries_far_from_the_data_match_float64(engine, monkeypatch):
    """A float32 query ~600 bandwidths from every point takes the far-query redo path: the
    compiled loop sums in float64 and the redo in float32 (this raised 'Index put requires
    the source and destination dtypes match'); every engine must equal float64 to the
    conditioning of such a query."""
    import localbook as lb
    import localbook.compiled as compiled

    if engine == "torch":  # as without a C compiler
        monkeypatch.setattr(compiled, "library", lambda: None)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(200, 2, generator=g), torch.rand(200, generator=g)
    q = torch.tensor([[0.5, 0.5], [60.0, 60.0], [-40.0, 3.0]])
    nw32 = lb.nadaraya_watson(q, x, y, 0.1)
    nw64 = lb.nadaraya_watson(q.double(), x.double(), y.double(), 0.1)
    assert nw32.dtype == torch.float32
    # 600 bandwidths out, float32 resolves squared distances (~7e7 in bandwidth units) to
    # ~4 units, so the weights among the nearest points carry ~1e-5 relative error
    torch.testing.assert_close(nw32.double(), nw64, rtol=1e-4, atol=0)
    assert bool(((nw32 >= y.min()) & (nw32 <= y.max())).all())  # a local mean
    den32 = lb.tweedie_denoise(q, x, 0.1)
    den64 = lb.tweedie_denoise(q.double(), x.double(), 0.1)
    torch.testing.assert_close(den32.double(), den64, rtol=1e-4, atol=1e-6)
    lk32 = lb.kde(q, x, 0.1, log=True)
    lk64 = lb.kde(q.double(), x.double(), 0.1, log=True)
    assert bool(torch.isfinite(lk32).all())
    torch.testing.assert_close(lk32.double(), lk64, rtol=1e-5, atol=0)


@pytest.mark.faults
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("engine", ["compiled", "torch"])
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(
    dtype, engine, monkeypatch
):
    """bfloat16 data spread over 1000 units gave NaN for about half of the queries, and
    float16 overflowed with the Epanechnikov kernel: half inputs now work in float32. The
    result is the float64 answer on the same (rounded) inputs, rounded once to the dtype."""
    import localbook as lb
    import localbook.compiled as compiled

    if engine == "torch":
        monkeypatch.setattr(compiled, "library", lambda: None)
    g = torch.Generator().manual_seed(0)
    x = (1000 * torch.rand(500, 2, generator=g)).to(dtype)
    y = (2 * torch.rand(500, generator=g) - 1).to(dtype)
    q = (1000 * torch.rand(300, 2, generator=g)).to(dtype)
    out = lb.nadaraya_watson(q, x, y, 30.0)
    ref = lb.nadaraya_watson(q.double(), x.double(), y.double(), 30.0)
    assert out.dtype == dtype and not bool(torch.isnan(out).any())
    # one rounding to the half dtype: within its unit roundoff relative to |y| <= 1
    assert float((out.double() - ref).abs().max()) <= torch.finfo(dtype).eps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # queries with no point in reach
        ep = lb.nadaraya_watson(q, x, y, 30.0, kernel="epanechnikov")
        ep_ref = lb.nadaraya_watson(
            q.double(), x.double(), y.double(), 30.0, kernel="epanechnikov"
        )
    both = ~torch.isnan(ep) & ~torch.isnan(ep_ref)
    # NaN exactly where float64 finds no point, but for queries on the support's edge
    assert int((torch.isnan(ep) != torch.isnan(ep_ref)).sum()) <= 2
    assert float((ep.double() - ep_ref)[both].abs().max()) <= torch.finfo(dtype).eps
    # densities here are ~1e-7, below float16's normal range: compare their logarithms
    dens = lb.kde(q, x, 30.0, log=True)
    dens_ref = lb.kde(q.double(), x.double(), 30.0, log=True)
    assert dens.dtype == dtype
    torch.testing.assert_close(
        dens.double(), dens_ref, rtol=torch.finfo(dtype).eps, atol=0
    )


@pytest.mark.parametrize("offset", [1e3, 1e6])
def test_scaled_sq_dist_keeps_its_precision_far_from_the_origin(offset):
    """float32 data at a large offset: both sets are centred on the data's midrange before
    |a|² + |b|² − 2a·b, so the error is rounding at the scale of the spread (here ≤ 2)."""
    g = torch.Generator().manual_seed(0)
    x = (offset + torch.rand(200, 3, generator=g, dtype=torch.float64)).float()
    q = (offset + torch.rand(30, 3, generator=g, dtype=torch.float64)).float()
    h = torch.ones(3)
    # the oracle: direct differences of the same float32 numbers, in float64
    direct = ((q.double()[:, None, :] - x.double()[None, :, :]) ** 2).sum(-1)
    spread2 = float(
        ((torch.cat([x, q]).double() - offset).abs().max(0).values ** 2).sum()
    )
    u = torch.finfo(torch.float32).eps
    tol = 8 * u * spread2  # a few roundings of terms of size ≤ the spread²
    got = scaled_sq_dist(q, x, h)
    assert float((got.double() - direct).abs().max()) <= tol
    # without the centring the same float32 expansion loses everything at this offset
    raw = (q * q).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2 * q @ x.T
    assert float((raw.double() - direct).abs().max()) > 100 * tol
