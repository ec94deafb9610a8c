"""Tests of localbook.sagl: data, the SAGL graph, its objective, training, baselines, read-out."""

import math

import pytest
import torch
from entmax import entmax15 as ref_entmax15
from hypothesis import given, settings
from hypothesis import strategies as st

from localbook.entmax import entmax15
from localbook.metrics import clustering_accuracy, subspace_preserving_rate
from localbook.sagl import (
    SparseAttentionGraph,
    candidate_neighbours,
    entmax_distance_graph,
    fit_sagl,
    knn_graph,
    lsr_coefficients,
    lsr_graph,
    make_digits_views,
    make_fashion_views,
    make_multiview_subspaces,
    reduce_views,
    sagl_cluster,
    sagl_loss,
    spectral_readout,
    standardize_views,
)


def small_views(n=18, dims=(5, 7), seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=dtype).to(device) for d in dims]


def model_for(views, **kw):
    torch.manual_seed(1)
    return SparseAttentionGraph(
        [v.shape[1] for v in views], latent_dim=8, hidden_dim=16, **kw
    ).to(dtype=views[0].dtype, device=views[0].device)


def forward(views, m=6, **kw):
    model = model_for(views, **kw)
    _, idx = candidate_neighbours(views, m)
    return model, idx, model(views, idx)


# --- data --------------------------------------------------------------------------------------
def test_multiview_subspaces_shapes_and_structure():
    views, y, latent = make_multiview_subspaces(
        n_per_class=10,
        n_classes=3,
        latent_dim=6,
        subspace_dim=2,
        view_dims=(4, 9, 5),
        seed=3,
        dtype=torch.float64,
    )
    assert [v.shape for v in views] == [(30, 4), (30, 9), (30, 5)]
    assert latent.shape == (30, 6) and y.dtype == torch.int64
    assert torch.equal(y, torch.arange(3).repeat_interleave(10))
    for k in range(3):
        assert torch.linalg.matrix_rank(latent[y == k]) == 2
    again, _, _ = make_multiview_subspaces(
        n_per_class=10,
        n_classes=3,
        latent_dim=6,
        subspace_dim=2,
        view_dims=(4, 9, 5),
        seed=3,
        dtype=torch.float64,
    )
    for a, b in zip(views, again):
        assert torch.equal(a, b)


def test_multiview_subspaces_bad_inputs():
    with pytest.raises(ValueError, match="subspace_dim"):
        make_multiview_subspaces(latent_dim=3, subspace_dim=4)
    with pytest.raises(ValueError, match="view_dims"):
        make_multiview_subspaces(view_dims=())
    with pytest.raises(ValueError, match="noise"):
        make_multiview_subspaces(noise=-1.0)


def test_digits_views():
    views, y = make_digits_views(n_per_class=5, seed=0, dtype=torch.float64)
    assert [v.shape for v in views] == [(50, 64), (50, 96)]
    assert torch.equal(torch.bincount(y), torch.full((10,), 5))
    cells = views[1].reshape(50, 16, 6).norm(dim=2)
    assert bool(((cells - 1).abs() < 1e-9).logical_or(cells == 0).all())


def test_fashion_views():
    try:
        views, y = make_fashion_views(n_per_class=3, seed=0, dtype=torch.float64)
    except (
        FileNotFoundError,
        OSError,
        RuntimeError,
    ) as err:  # no local copy of the data
        pytest.skip(f"Fashion-MNIST not available offline: {err}")
    assert [v.shape for v in views] == [(30, 784), (30, 441), (30, 256)]
    assert torch.equal(torch.bincount(y), torch.full((10,), 3))
    assert float(views[0].min()) >= 0 and float(views[0].max()) <= 1
    assert float(views[2].min()) >= 0  # ReLU features


def test_reduce_views_keeps_distances_when_rank_allows():
    views = small_views(n=12, dims=(30, 4))
    red = reduce_views(views, dim=12)
    assert [r.shape for r in red] == [(12, 12), (12, 4)]
    for x, r in zip(views, red):  # 12 centred points span ≤ 11 dims: nothing is lost
        torch.testing.assert_close(torch.cdist(r, r), torch.cdist(x, x))


def test_standardize_views():
    for x in standardize_views(small_views(dims=(3, 4))):
        torch.testing.assert_close(x.mean(0), torch.zeros(x.shape[1], dtype=x.dtype))
        torch.testing.assert_close(
            x.pow(2).sum(1).mean(), torch.tensor(1.0, dtype=x.dtype)
        )


# --- candidates and baselines ------------------------------------------------------------------
def test_candidates_are_the_nearest_other_points():
    views = small_views()
    d, idx = candidate_neighbours(views, 5)
    x = torch.cat(standardize_views(views), 1)
    full = torch.cdist(x, x)
    assert not bool((idx == torch.arange(18)[:, None]).any())
    for i in range(18):
        others = torch.tensor([j for j in range(18) if j != i])
        best = others[full[i, others].argsort()[:5]]
        assert set(idx[i].tolist()) == set(best.tolist())
    assert bool((d[:, 1:] >= d[:, :-1]).all())


def test_knn_and_entmax_graphs():
    views = small_views()
    a = knn_graph(views, 4)
    assert bool(((a > 0).sum(1) == 4).all()) and bool((torch.diagonal(a) == 0).all())
    torch.testing.assert_close(a.sum(1), torch.ones(18, dtype=a.dtype))
    e = entmax_distance_graph(views, k=3, m=8)
    assert bool((e >= 0).all()) and bool((torch.diagonal(e) == 0).all())
    torch.testing.assert_close(e.sum(1), torch.ones(18, dtype=e.dtype))
    assert bool(((e > 0).sum(1) <= 8).all())


@settings(max_examples=15, deadline=None)
@given(
    st.integers(4, 14), st.integers(1, 6), st.floats(0.01, 10.0), st.integers(0, 10**6)
)
def test_lsr_closed_form_matches_direct_solve(n, d, lam, seed):
    x = torch.randn(
        n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    c = lsr_coefficients(x, lam)
    assert bool((torch.diagonal(c) == 0).all())
    for i in range(n):  # row i: ridge regression of x_i on the other points
        others = torch.tensor([j for j in range(n) if j != i])
        xo = x[others]
        direct = torch.linalg.solve(
            xo @ xo.T + lam * torch.eye(n - 1, dtype=x.dtype), xo @ x[i]
        )
        torch.testing.assert_close(c[i, others], direct, rtol=1e-7, atol=1e-9)


def test_lsr_graph_is_nonnegative_and_symmetric_in_structure():
    a = lsr_graph(small_views(), lam=0.1)
    assert bool((a >= 0).all()) and bool((torch.diagonal(a) == 0).all())


# --- the model ---------------------------------------------------------------------------------
def test_forward_shapes_and_graph_properties(device):
    views = small_views(device=device)
    model, idx, out = forward(views, m=8, init_scale=30.0)
    w = out["weights"]
    assert w.shape == (18, 8) and out["codes"].shape == (18, 8)
    assert out["omega"].shape == (18,) and out["hidden"].shape == (18, 8)
    assert [r.shape for r in out["recon"]] == [(18, 5), (18, 7)]
    assert bool((w >= 0).all()) and int((w == 0).sum()) > 18  # exact zeros
    torch.testing.assert_close(w.sum(1), torch.ones(18, dtype=w.dtype, device=device))
    a = model.dense(out)
    assert a.shape == (18, 18) and bool((torch.diagonal(a) == 0).all())
    assert bool(((out["omega"] >= 0) & (out["omega"] <= 1)).all())
    z = out["codes"]  # batch-standardized: zero mean, mean squared row norm 1
    torch.testing.assert_close(z.mean(0), torch.zeros(8, dtype=z.dtype, device=device))
    torch.testing.assert_close(
        z.pow(2).sum(1).mean(),
        torch.tensor(1.0, dtype=z.dtype, device=device),
        rtol=1e-6,
        atol=1e-6,
    )


def test_graph_is_entmax_of_gated_bilinear_scores():
    views = small_views()
    model, idx, out = forward(views)
    z = out["codes"]
    raw = ((z @ model.U)[:, None, :] * (z @ model.V)[idx]).sum(-1) * math.sqrt(8)
    gated = raw * (1 + model.gate_strength * out["omega"])[:, None]
    torch.testing.assert_close(out["scores"], gated)
    torch.testing.assert_close(out["weights"], ref_entmax15(gated, dim=1))


def test_scores_asymmetric_and_uv_rescale_freely():
    views = small_views()
    model, idx, _ = forward(views, m=17, gate=False)
    with torch.no_grad():
        model.U.add_(0.3 * torch.randn(8, 8, dtype=torch.float64))
        s = model(views, idx)["scores"]
        dense = model.dense({"kind": "x", "weights": s, "index": idx})
        off = ~torch.eye(18, dtype=torch.bool)
        assert not torch.allclose(dense[off], dense.T[off])  # directed
        model.U.mul_(3.0)
        model.V.div_(3.0)
        torch.testing.assert_close(
            model(views, idx)["scores"], s
        )  # (cU, V/c): same scores
        model.V.mul_(9.0)  # (cU, cV): scores × c²
        torch.testing.assert_close(model(views, idx)["scores"], 9.0 * s)


def test_codes_invariant_to_encoder_output_scale():
    views = small_views()
    model, idx, out = forward(views)
    with torch.no_grad():
        zbar = torch.stack([enc(x) for enc, x in zip(model.encoders, views)]).mean(0)
        # the only break of invariance is the 1e-8 added to each coordinate's variance
        tol = 1e-8 / float(zbar.var(0, unbiased=False).min())
        for enc in model.encoders:
            enc[-1].weight.mul_(5.0)
            enc[-1].bias.mul_(5.0)
        torch.testing.assert_close(
            model(views, idx)["codes"], out["codes"], rtol=tol, atol=tol
        )


def test_permutation_equivariance():
    views = small_views()
    model, idx, out = forward(views)
    perm = torch.randperm(18, generator=torch.Generator().manual_seed(3))
    inv = torch.argsort(perm)
    pv = [x[perm] for x in views]
    pidx = inv[idx[perm]]
    pout = model(pv, pidx)
    a, pa = model.dense(out), model.dense(pout)
    torch.testing.assert_close(pa, a[perm][:, perm])


def test_ablations():
    views = small_views()
    _, _, dense = forward(views, graph="softmax")
    assert bool((dense["weights"] > 0).all())
    model, _, ident = forward(views, graph="identity")
    assert torch.equal(model.dense(ident), torch.eye(18, dtype=torch.float64))
    _, se, _ = sagl_loss(ident, standardize_views(views))
    assert float(se) == 0.0
    _, _, nogate = forward(views, gate=False)
    assert bool((nogate["omega"] == 0).all())


@settings(max_examples=20, deadline=None)
@given(
    st.integers(3, 12),
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(0, 10**6),
    st.floats(0.5, 200.0),
)
def test_rows_on_simplex_property(n, dims, seed, scale):
    views = small_views(n=n, dims=dims, seed=seed)
    _, _, out = forward(views, m=n - 1, init_scale=scale)
    w = out["weights"]
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=torch.float64))


# --- the objective -----------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["inputs", "codes"])
def test_loss_matches_formula(objective):
    views = standardize_views(small_views())
    model, idx, out = forward(views)
    total, se, rec = sagl_loss(out, views, 0.3, objective)
    a = model.dense(out)
    if objective == "inputs":
        se_ref = sum(((x - a @ x) ** 2).sum() / (x**2).sum() for x in views)
        cached, _, _ = sagl_loss(out, views, 0.3, objective, [x[idx] for x in views])
        torch.testing.assert_close(cached, total)
    else:
        z = out["codes"]
        se_ref = ((z - a @ z) ** 2).sum() / (z**2).sum()
    rec_ref = sum(
        ((x - r) ** 2).sum() / (x**2).sum() for x, r in zip(views, out["recon"])
    )
    torch.testing.assert_close(se, se_ref)
    torch.testing.assert_close(total, se_ref + 0.3 * rec_ref)


def test_entmax_rows_pass_gradcheck():
    s = (
        torch.randn(
            5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
        )
        * 3
    )
    s.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda t: entmax15(t, dim=1), (s,), eps=1e-6, atol=1e-5
    )


@pytest.mark.parametrize("objective", ["inputs", "codes"])
def test_loss_gradient_passes_gradcheck(objective):
    views = standardize_views(small_views(n=10, dims=(3, 4)))
    model = model_for(views)
    _, idx = candidate_neighbours(views, 5)
    u0 = model.U.detach().clone()

    def f(u):
        z = model.codes(views)
        omega = torch.sigmoid(model.gate(z * math.sqrt(8))).squeeze(1)
        s = ((z @ u)[:, None, :] * (z @ model.V)[idx]).sum(-1) * math.sqrt(8)
        w = entmax15(s * (1 + model.gate_strength * omega)[:, None], dim=1)
        agg = torch.einsum("nm,nmc->nc", w, z[idx])
        out = {
            "kind": "entmax15",
            "weights": w,
            "index": idx,
            "codes": z,
            "aggregate": agg,
            "recon": [dec(z + model.W(agg)) for dec in model.decoders],
        }
        return sagl_loss(out, views, 0.5, objective)[0]

    with torch.no_grad():  # the hand-written f is the model's forward
        out = model(views, idx)
        ref = sagl_loss(out, views, 0.5, objective)[0]
    torch.testing.assert_close(f(u0), ref)
    u = u0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (u,), eps=1e-6, atol=1e-5)


def test_neighbour_rows_gather_and_its_sparse_backward():
    from localbook.sagl import _GatherRows, _selection_t

    g = torch.Generator().manual_seed(3)
    z = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 9, (9, 5), generator=g)
    flat = idx.reshape(-1)
    sel = _selection_t(flat, 9, torch.float64)
    out = _GatherRows.apply(z, flat, sel)
    torch.testing.assert_close(out, z[flat], rtol=0, atol=0)
    weights = torch.randn(45, 4, generator=g, dtype=torch.float64)
    (out * weights).sum().backward()
    ref = torch.zeros(9, 4, dtype=torch.float64).index_add_(0, flat, weights)
    torch.testing.assert_close(z.grad, ref)
    assert torch.autograd.gradcheck(lambda t: _GatherRows.apply(t, flat, sel), (z,))
    # the model keeps the selection matrix for the index it was given, and only for it
    views = standardize_views(small_views(n=9))
    model = model_for(views)
    _, cand = candidate_neighbours(views, 4)
    torch.testing.assert_close(model._neighbour_rows(z, cand), z[cand])
    kept = model._selection[3]
    model._neighbour_rows(z, cand)
    assert model._selection[3] is kept
    cand2 = cand.flip(1)
    torch.testing.assert_close(model._neighbour_rows(z, cand2), z[cand2])
    cand2[0, 0] = (cand2[0, 0] + 1) % 9  # changed in place: the matrix is rebuilt
    torch.testing.assert_close(model._neighbour_rows(z, cand2), z[cand2])
    # a model with its cache can be copied and pickled (the cache is left behind)
    import copy
    import io

    twin = copy.deepcopy(model)
    assert twin._selection is None and model._selection is not None
    torch.testing.assert_close(twin._neighbour_rows(z, cand), z[cand])
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=False)._selection is None


def test_weighted_rows_matches_einsum_and_passes_gradcheck():
    from localbook.sagl import _weighted_rows

    g = torch.Generator().manual_seed(4)
    w = torch.rand(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    rows = torch.randn(6, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(
        _weighted_rows(w, rows), torch.einsum("nm,nmc->nc", w, rows)
    )
    assert torch.autograd.gradcheck(_weighted_rows, (w, rows))
    assert torch.autograd.gradcheck(lambda t: _weighted_rows(t, rows.detach()), (w,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normalized_affinity_sparse_equals_dense(dtype):
    from localbook.sagl import _normalized_affinity

    g = torch.Generator().manual_seed(5)
    a = torch.rand(40, 40, generator=g, dtype=dtype)
    a[a < 0.8] = 0  # sparse rows, some asymmetric pairs
    a[7] = 0  # a node with no out-edges...
    a[:, 7] = 0  # ... and none in: isolated, a zero row
    a[3, 9] = -0.5  # |A| is used
    dense = _normalized_affinity(a, True)
    sparse = _normalized_affinity(a, False)
    torch.testing.assert_close(
        torch.as_tensor(sparse.toarray()), dense, rtol=1e-15, atol=0
    )
    assert not dense[7].any()


def test_spectral_readout_takes_half_precision_graphs():
    y = torch.arange(3).repeat_interleave(110)
    a = (y[:, None] == y[None, :]).double()
    a.fill_diagonal_(0)
    for dtype in (torch.bfloat16, torch.float16):  # the sparse path (n > 300)
        labels = spectral_readout((a / 109).to(dtype), 3, seed=0)
        assert clustering_accuracy(y, labels) == 1.0


def test_gradients_reach_every_parameter():
    views = standardize_views(small_views())
    model, idx, out = forward(views)
    total, _, _ = sagl_loss(out, views)
    total.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
    assert float(model.gate[0].weight.grad.abs().sum()) > 0


# --- training and read-out ---------------------------------------------------------------------
def test_fit_is_seeded_stops_by_rule_and_leaves_global_rng_alone():
    views = small_views(n=20)
    state = torch.get_rng_state()
    r1 = fit_sagl(
        views,
        max_steps=40,
        tol=0.0,
        seed=5,
        n_candidates=6,
        callback=lambda step, out: step,
        callback_every=10,
    )
    assert torch.equal(state, torch.get_rng_state())
    assert r1.n_steps == 40 and r1.history == [0, 10, 20, 30, 40]
    r2 = fit_sagl(views, max_steps=40, tol=0.0, seed=5, n_candidates=6)
    assert torch.equal(r1.graph, r2.graph)
    assert r1.losses[-1] < r1.losses[0]
    r3 = fit_sagl(views, max_steps=400, tol=0.5, window=5, seed=5, n_candidates=6)
    assert r3.n_steps < 400  # the rule fires: the loss stalls long before 400 steps
    w = r3.losses
    assert w[-6] - w[-1] < 0.5 * abs(w[-6])
    assert r1.graph.shape == (20, 20) and not r1.graph.requires_grad


def test_spectral_readout_recovers_blocks(device):
    for sizes in ([3, 4, 3], [120, 130, 110]):  # dense and Lanczos paths
        y = torch.arange(3).repeat_interleave(torch.tensor(sizes))
        a = (y[:, None] == y[None, :]).double().to(device)
        a.fill_diagonal_(0)
        a = a / a.sum(1, keepdim=True)
        a[0, sizes[0]] = 0.05
        labels = spectral_readout(a, 3, seed=0)
        assert labels.device.type == device.type and labels.dtype == torch.int64
        assert clustering_accuracy(y, labels.cpu()) == 1.0


def test_sagl_cluster_keeps_easy_subspaces_apart():
    views, y, _ = make_multiview_subspaces(
        n_per_class=20,
        n_classes=3,
        latent_dim=16,
        subspace_dim=2,
        view_dims=(8, 10),
        noise=0.01,
        nonlinearity=0.5,
        seed=0,
    )
    res = sagl_cluster(views, 3, seed=0, max_steps=40, n_candidates=10)
    assert res.labels.shape == (60,)
    # nearly independent subspaces: the learned graph keeps almost all weight in-class
    # (accuracy is not asserted: a subspace-preserving graph may still split a class)
    assert subspace_preserving_rate(res.graph, y) >= 0.98
    ident = sagl_cluster(views, 3, seed=0, graph="identity")
    assert ident.n_steps == 0 and torch.equal(ident.graph, torch.eye(60))


# --- bad inputs --------------------------------------------------------------------------------
def test_bad_inputs():
    views = small_views()
    with pytest.raises(ValueError, match="graph"):
        SparseAttentionGraph([5, 7], graph="dense")
    with pytest.raises(TypeError, match="gate"):
        SparseAttentionGraph([5, 7], gate="yes")
    with pytest.raises(ValueError, match="view_dims"):
        SparseAttentionGraph([])
    model, idx, _ = forward(views)
    with pytest.raises(ValueError, match="features but the model expects"):
        model(small_views(dims=(5, 6)), idx)
    with pytest.raises(ValueError, match="own candidate"):
        model(views, torch.arange(18)[:, None])
    with pytest.raises(ValueError, match="index must have shape"):
        model(views, idx[:5])
    with pytest.raises(ValueError, match="objective"):
        fit_sagl(views, objective="pixels")
    with pytest.raises(TypeError, match="views"):
        fit_sagl(torch.ones(4, 3))
    with pytest.raises(ValueError, match="max_steps"):
        fit_sagl(views, max_steps=0)
    with pytest.raises(ValueError, match="lam"):
        lsr_coefficients(torch.ones(3, 2), 0.0)
    with pytest.raises(ValueError, match="m"):
        candidate_neighbours(views, 18)
    with pytest.raises(ValueError, match="n_clusters"):
        spectral_readout(torch.eye(3), 4)
    with pytest.raises(ValueError, match="graph.*square"):
        spectral_readout(torch.ones(3, 2), 2)
