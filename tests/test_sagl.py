"""Tests of localbook.sagl: data, the per-view SAGL graphs, their objective, training,
baselines, read-out, and the stored reproduction run."""

import copy
import io
import json
import math
import re

import pytest
import torch
from entmax import entmax15 as ref_entmax15
from hypothesis import given, settings
from hypothesis import strategies as st

import localbook.datasets
from localbook.datasets import load_stored_run
from localbook.entmax import entmax15
from localbook.metrics import clustering_accuracy, subspace_preserving_rate
from localbook.datasets import (
    make_digits_views,
    make_fashion_views,
    make_multiview_subspaces,
)
from localbook.sagl import SparseAttentionGraph, effective_neighbours, sagl_loss
from localbook.sagl_fit import SAGLResult, fit_sagl, sagl_cluster, view_candidates
from localbook.sagl_graphs import (
    candidate_neighbours,
    dense_attention_graph,
    entmax_distance_graph,
    fused_knn_graph,
    knn_graph,
    lsr_coefficients,
    lsr_graph,
    reduce_views,
    self_expression_graph,
    spectral_readout,
    standardize_views,
)

F64 = torch.float64


def small_views(n=18, dims=(5, 7), seed=0, dtype=F64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=dtype).to(device) for d in dims]


def make_model(views, seed=1, perturb=True, latent_dim=8, **kw):
    """A small model in the views' dtype; ``perturb`` moves ``U``, ``V`` off the
    identity and gives the (zero-initialised) decoders weights, so that every term of
    the forward pass counts."""
    torch.manual_seed(seed)
    model = SparseAttentionGraph(
        [v.shape[1] for v in views], latent_dim=latent_dim, hidden_dim=16, **kw
    ).to(dtype=views[0].dtype, device=views[0].device)
    if perturb:
        with torch.no_grad():
            for p in (model.U, model.V):
                p.add_(0.3 * torch.randn_like(p))
            for dec in model.decoders:
                dec.weight.copy_(0.2 * torch.randn_like(dec.weight))
    return model


def all_others(n):
    """Row ``i``: every point but ``i``, ascending (the brute-force all-pairs index)."""
    return torch.tensor([[j for j in range(n) if j != i] for i in range(n)])


def scatter(w, idx):
    n = w.shape[0]
    a = torch.zeros(n, n, dtype=w.dtype)
    for i in range(n):
        for c in range(idx.shape[1]):
            a[i, idx[i, c]] += w[i, c]
    return a


def brute_force(model, views, index, omega=None, beta_scale=1.0):
    """The forward pass written out entry by entry, with the package ``entmax``'s
    ``entmax15`` as the reference rows: ``sᵢⱼ = β (zᵢU)·(zⱼV)/√C · γ^(2ωᵢ − 1)``."""
    n, C = views[0].shape[0], model.latent_dim
    raw = [enc(x) for enc, x in zip(model.encoders, views)]
    if model.shared:
        raw = [sum(raw) / len(raw)]
    codes = [(r - r.mean(0)) / (r.var(0, unbiased=False) + 1e-8).sqrt() for r in raw]
    if omega is not None:
        om = torch.full((len(codes), n), float(omega), dtype=codes[0].dtype)
    elif model.gates is None:
        om = torch.full((len(codes), n), 0.5, dtype=codes[0].dtype)
    else:
        om = []
        for gate, z in zip(model.gates, codes):
            logit = gate(z)[:, 0]
            om.append(torch.sigmoid(logit - logit.mean()))
        om = torch.stack(om)
    scores, weights, graphs, hidden = [], [], [], []
    for g, (z, idx) in enumerate(zip(codes, index)):
        beta = model.log_beta[g].exp() * beta_scale
        zu, zv = z @ model.U[g], z @ model.V[g]
        s = torch.stack(
            [
                torch.stack([zu[i] @ zv[j] for j in idx[i].tolist()])
                * (beta / math.sqrt(C) * model.gate_range ** (2 * om[g, i] - 1))
                for i in range(n)
            ]
        )
        if model.graph_kind == "identity":
            w, a = torch.zeros_like(s), torch.eye(n, dtype=s.dtype)
        else:
            w = (
                ref_entmax15(s, dim=1)
                if model.graph_kind == "entmax15"
                else s.softmax(1)
            )
            a = scatter(w, idx)
        scores.append(s)
        weights.append(w)
        graphs.append(a)
        hidden.append(z + a @ z @ model.W[g].weight.T)
    recon = [dec(torch.cat(hidden, 1)) for dec in model.decoders]
    return dict(
        codes=codes,
        omega=om,
        scores=scores,
        weights=weights,
        graphs=graphs,
        hidden=hidden,
        recon=recon,
    )


def support_within(a, b):
    """Every positive entry of ``a`` is positive in ``b``."""
    return not bool(((a > 0) & (b <= 0)).any())


# --- data -----------------------------------------------------------------------------
def test_multiview_subspaces_shapes_and_structure():
    kw = dict(
        n_per_class=10,
        n_classes=3,
        latent_dim=6,
        subspace_dim=2,
        view_dims=(4, 9, 5),
        seed=3,
        dtype=F64,
    )
    views, y, latent = make_multiview_subspaces(**kw)
    assert [v.shape for v in views] == [(30, 4), (30, 9), (30, 5)]
    assert latent.shape == (30, 6) and y.dtype == torch.int64
    assert torch.equal(y, torch.arange(3).repeat_interleave(10))
    for k in range(3):
        assert torch.linalg.matrix_rank(latent[y == k]) == 2
    again, _, _ = make_multiview_subspaces(**kw)
    for a, b in zip(views, again):
        assert torch.equal(a, b)
    other, _, _ = make_multiview_subspaces(**{**kw, "seed": 4})
    assert not torch.equal(views[0], other[0])


def test_multiview_subspaces_bad_inputs():
    with pytest.raises(ValueError, match="subspace_dim"):
        make_multiview_subspaces(latent_dim=3, subspace_dim=4)
    with pytest.raises(ValueError, match="view_dims"):
        make_multiview_subspaces(view_dims=())
    with pytest.raises(ValueError, match="noise"):
        make_multiview_subspaces(noise=-1.0)


def test_digits_views():
    views, y = make_digits_views(n_per_class=5, seed=0, dtype=F64)
    assert [v.shape for v in views] == [(50, 64), (50, 96)]
    assert torch.equal(torch.bincount(y), torch.full((10,), 5))
    assert float(views[0].min()) >= 0 and float(views[0].max()) <= 1
    cells = views[1].reshape(50, 16, 6).norm(dim=2)
    assert bool(((cells - 1).abs() < 1e-9).logical_or(cells == 0).all())


def test_fashion_views():
    try:
        views, y = make_fashion_views(n_per_class=3, seed=0, dtype=F64)
    except (FileNotFoundError, OSError, RuntimeError) as err:  # no local copy
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
    # fewer components: the leading principal directions, variance in decreasing order
    (r3,) = reduce_views(views[:1], dim=3)
    xc = views[0] - views[0].mean(0)
    sv = torch.linalg.svdvals(xc)
    torch.testing.assert_close(r3.norm(dim=0), sv[:3])


def test_standardize_views():
    for x in standardize_views(small_views(dims=(3, 4))):
        torch.testing.assert_close(x.mean(0), torch.zeros(x.shape[1], dtype=x.dtype))
        torch.testing.assert_close(x.pow(2).sum(1).mean(), torch.tensor(1.0, dtype=F64))


# --- candidates and baselines ---------------------------------------------------------
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


def test_view_candidates_per_view_shared_and_all_pairs():
    xs = standardize_views(small_views(n=12, dims=(3, 4, 2)))
    per_view = view_candidates(xs, 4)
    assert len(per_view) == 3
    for x, idx in zip(xs, per_view):
        assert idx.shape == (12, 4)
        d = torch.cdist(x, x).fill_diagonal_(math.inf)
        for i in range(12):
            assert set(idx[i].tolist()) == set(d[i].argsort()[:4].tolist())
    # views see different neighbours: the per-view indices are not all the same
    assert not all(torch.equal(per_view[0], idx) for idx in per_view[1:])
    (shared,) = view_candidates(xs, 4, shared=True)
    torch.testing.assert_close(shared, candidate_neighbours(xs, 4)[1])
    for m in (11, 12, 50):  # m ≥ n − 1: every other point, ascending
        full = view_candidates(xs, m)
        assert len(full) == 3 and len(view_candidates(xs, m, shared=True)) == 1
        for idx in full:
            assert torch.equal(idx, all_others(12))


def test_knn_and_entmax_graphs():
    views = small_views()
    a = knn_graph(views, 4)
    assert bool(((a > 0).sum(1) == 4).all()) and bool((torch.diagonal(a) == 0).all())
    torch.testing.assert_close(a.sum(1), torch.ones(18, dtype=a.dtype))
    e = entmax_distance_graph(views, k=3, m=8)
    assert bool((e >= 0).all()) and bool((torch.diagonal(e) == 0).all())
    torch.testing.assert_close(e.sum(1), torch.ones(18, dtype=e.dtype))
    assert bool(((e > 0).sum(1) <= 8).all())


def test_fused_knn_graph_is_the_mean_of_per_view_knn():
    views = small_views(n=15, dims=(3, 6))
    k = 4
    a = fused_knn_graph(views, k)
    ref = torch.zeros(15, 15, dtype=F64)
    for x in standardize_views(views):  # brute force: sort each row's distances
        d = torch.cdist(x, x).fill_diagonal_(math.inf)
        for i in range(15):
            for j in d[i].argsort()[:k].tolist():
                ref[i, j] += 1 / (k * len(views))
    torch.testing.assert_close(a, ref)
    torch.testing.assert_close(a.sum(1), torch.ones(15, dtype=F64))
    support = (a > 0).sum(1)
    assert bool((support >= k).all()) and bool((support <= 2 * k).all())
    # the concatenated-view k-NN graph is a different graph
    assert not torch.allclose(a, knn_graph(views, k))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_attention_graph_matches_formula(temperature):
    views = small_views(n=10, dims=(3, 6))
    a = dense_attention_graph(views, temperature)
    ref = torch.zeros(10, 10, dtype=F64)
    for x in standardize_views(views):
        d = x.shape[1]
        for i in range(10):
            s = torch.tensor(
                [float(x[i] @ x[j]) * math.sqrt(d) / temperature for j in range(10)]
            )
            e = torch.exp(s - s.max())
            e[i] = 0
            ref[i] += e / e.sum() / len(views)
    torch.testing.assert_close(a, ref)
    assert bool((torch.diagonal(a) == 0).all())
    off = ~torch.eye(10, dtype=torch.bool)
    assert bool((a[off] > 0).all())
    torch.testing.assert_close(a.sum(1), torch.ones(10, dtype=F64))


def test_attention_graph_flattens_with_temperature():
    views = small_views(n=10, dims=(3, 6))
    n1 = effective_neighbours(dense_attention_graph(views, 0.5))
    n2 = effective_neighbours(dense_attention_graph(views, 5.0))
    assert bool((n2 > n1).all())


def _qp_row(x, nb):
    """``min_{a ∈ Δ} ‖x − aᵀ nb‖²`` by SciPy's SLSQP (the reference)."""
    import numpy as np
    from scipy.optimize import minimize

    x, nb = x.numpy(), nb.numpy()
    m = nb.shape[0]
    res = minimize(
        lambda a: float(((x - a @ nb) ** 2).sum()),
        np.full(m, 1.0 / m),
        jac=lambda a: -2 * nb @ (x - a @ nb),
        bounds=[(0, 1)] * m,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}],
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    assert res.success, res.message
    return torch.as_tensor(res.x)


def test_self_expression_graph_matches_slsqp():
    views = small_views(n=12, dims=(3, 8), seed=4)
    m = 5
    graphs = [self_expression_graph([x], m=m, n_iter=2000) for x in views]
    torch.testing.assert_close(
        self_expression_graph(views, m=m, n_iter=2000), (graphs[0] + graphs[1]) / 2
    )
    for x, a in zip(standardize_views(views), graphs):
        idx = candidate_neighbours([x], m)[1]
        assert bool((a >= 0).all()) and bool((torch.diagonal(a) == 0).all())
        torch.testing.assert_close(a.sum(1), torch.ones(12, dtype=F64))
        outside = torch.ones(12, 12, dtype=torch.bool).scatter(1, idx, False)
        assert not bool(a[outside].any())  # support within the candidates
        for i in (0, 5, 11):
            ref = _qp_row(x[i], x[idx[i]])
            mine = a[i, idx[i]]
            f_ref = float((x[i] - ref @ x[idx[i]]).pow(2).sum())
            f_mine = float((x[i] - mine @ x[idx[i]]).pow(2).sum())
            assert f_mine <= f_ref + 1e-9
            assert abs(f_mine - f_ref) <= 1e-7 * max(1.0, f_ref)
            if x.shape[1] >= m:  # m points in general position in ≥ m dims: unique
                torch.testing.assert_close(mine, ref, atol=1e-5, rtol=0)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(4, 14), st.integers(1, 6), st.floats(0.01, 10.0), st.integers(0, 10**6)
)
def test_lsr_closed_form_matches_direct_solve(n, d, lam, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)
    c = lsr_coefficients(x, lam)
    assert bool((torch.diagonal(c) == 0).all())
    for i in range(n):  # row i: ridge regression of x_i on the other points
        others = torch.tensor([j for j in range(n) if j != i])
        xo = x[others]
        direct = torch.linalg.solve(
            xo @ xo.T + lam * torch.eye(n - 1, dtype=x.dtype), xo @ x[i]
        )
        torch.testing.assert_close(c[i, others], direct, rtol=1e-7, atol=1e-9)


def test_lsr_graph_is_nonnegative_with_zero_diagonal():
    a = lsr_graph(small_views(), lam=0.1)
    assert bool((a >= 0).all()) and bool((torch.diagonal(a) == 0).all())
    assert int((a > 0).sum()) > 18


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-5, 5, allow_subnormal=False), min_size=6, max_size=6),
        min_size=1,
        max_size=5,
    ),
    st.floats(0.01, 100.0),
)
def test_effective_neighbours_formula(rows, scale):
    a = torch.tensor(rows, dtype=F64)
    eff = effective_neighbours(a)
    for i, row in enumerate(rows):
        s1, s2 = sum(abs(v) for v in row), sum(v * v for v in row)
        ref = s1 * s1 / s2 if s2 > 0 else 0.0
        assert math.isclose(float(eff[i]), ref, rel_tol=1e-9, abs_tol=1e-12)
        nnz = sum(v != 0 for v in row)
        assert float(eff[i]) <= nnz + 1e-9
        assert nnz == 0 or float(eff[i]) >= 1 - 1e-9
    torch.testing.assert_close(effective_neighbours(-scale * a), eff)


def test_effective_neighbours_counts_equal_weights():
    a = torch.zeros(5, 8, dtype=F64)
    for k in range(1, 5):
        a[k, :k] = 1.0 / k
    eff = effective_neighbours(a)
    torch.testing.assert_close(eff, torch.arange(5, dtype=F64))  # row 0 is empty: 0
    assert not effective_neighbours(a.requires_grad_()).requires_grad


# --- the model: construction, codes, gate ---------------------------------------------
@pytest.mark.parametrize("shared", [False, True])
def test_model_parameters_at_initialisation(shared):
    model = SparseAttentionGraph(
        [5, 7, 3], latent_dim=6, temperature=0.25, shared=shared
    )
    G = 1 if shared else 3
    assert model.n_graphs == G
    eye = torch.eye(6).repeat(G, 1, 1)
    assert torch.equal(model.U.detach(), eye) and torch.equal(model.V.detach(), eye)
    torch.testing.assert_close(model.log_beta.detach(), torch.full((G,), math.log(4)))
    names = dict(model.named_parameters())
    assert "log_beta" in names and "U" in names and "V" in names
    assert len(model.gates) == G and len(model.W) == G
    assert [d.in_features for d in model.decoders] == [G * 6] * 3
    assert [d.out_features for d in model.decoders] == [5, 7, 3]
    for dec in model.decoders:  # reconstruction starts at the views' mean
        assert not dec.weight.any() and not dec.bias.any()
    frozen = SparseAttentionGraph([5, 7], learn_temperature=False, gate=False)
    assert "log_beta" not in dict(frozen.named_parameters())
    assert "log_beta" in dict(frozen.named_buffers())
    assert frozen.gates is None


@pytest.mark.parametrize("shared", [False, True])
def test_codes_are_standardized_per_graph(shared):
    views = small_views(dims=(5, 7, 4))
    model = make_model(views, shared=shared)
    with torch.no_grad():
        codes = model.codes(views)
        raw = [enc(x) for enc, x in zip(model.encoders, views)]
    assert len(codes) == (1 if shared else 3)
    if shared:
        raw = [torch.stack(raw).mean(0)]
    for z, r in zip(codes, raw):
        assert z.shape == (18, 8)
        # unit variance up to the 1e-8 added to each coordinate's variance
        tol = 1e-8 / float(r.var(0, unbiased=False).min())
        torch.testing.assert_close(z.mean(0), torch.zeros(8, dtype=F64))
        torch.testing.assert_close(
            z.var(0, unbiased=False), torch.ones(8, dtype=F64), rtol=0, atol=2 * tol
        )
        zr = (r - r.mean(0)) / r.std(0, unbiased=False)  # an affine map of the raw
        torch.testing.assert_close(z, zr, rtol=tol, atol=tol)
    if not shared:  # one code per view, not the same one
        assert not torch.allclose(codes[0], codes[1])


def test_codes_invariant_to_encoder_output_scale():
    views = small_views()
    model = make_model(views)
    idx = view_candidates(standardize_views(views), 6)
    with torch.no_grad():
        before = model(views, idx)["codes"]
        raw = [enc(x) for enc, x in zip(model.encoders, views)]
        # the only break of invariance is the 1e-8 added to each coordinate's variance
        tol = 1e-8 / min(float(r.var(0, unbiased=False).min()) for r in raw)
        for enc in model.encoders:
            enc[-1].weight.mul_(5.0)
            enc[-1].bias.mul_(5.0)
        after = model(views, idx)["codes"]
    for a, b in zip(after, before):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("shared", [False, True])
def test_gate_values_are_centred_sigmoids(shared):
    views = small_views(dims=(5, 7, 4))
    model = make_model(views, shared=shared)
    with torch.no_grad():
        codes = model.codes(views)
        om = model.gate_values(codes)
        assert om.shape == ((1 if shared else 3), 18)
        assert bool(((om > 0) & (om < 1)).all())
        for g, (gate, z) in enumerate(zip(model.gates, codes)):
            logit = gate(z)[:, 0]
            torch.testing.assert_close(om[g], torch.sigmoid(logit - logit.mean()))
            # centred logits: their mean is 0, and the median point sits near ½
            assert abs(float(torch.logit(om[g]).mean())) < 1e-12
            assert abs(float(om[g].median()) - 0.5) < 0.25
            # a constant added to the gate's output changes nothing (β keeps the scale)
            gate[-1].bias.add_(3.0)
        torch.testing.assert_close(model.gate_values(codes), om)
    off = make_model(views, shared=shared, gate=False)
    with torch.no_grad():
        assert torch.equal(off.gate_values(off.codes(views)), torch.full_like(om, 0.5))


# --- the model: forward pass ----------------------------------------------------------
@pytest.mark.parametrize("graph", ["entmax15", "softmax", "identity"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("m", [6, 17])  # the gather path and the dense path
def test_forward_matches_brute_force(graph, shared, m):
    views = small_views(dims=(5, 7, 4))
    model = make_model(views, graph=graph, shared=shared, temperature=0.5)
    xs = standardize_views(views)
    idx = view_candidates(xs, m, shared=shared)
    with torch.no_grad():
        out = model(views, idx)
        ref = brute_force(model, views, idx)
    G = 1 if shared else 3
    for key in ("weights", "index", "scores", "codes", "hidden", "aggregate", "full"):
        assert len(out[key]) == G, key
    assert out["omega"].shape == (G, 18) and out["beta"].shape == (G,)
    assert out["kind"] == graph and out["shared"] is shared
    torch.testing.assert_close(out["omega"], ref["omega"])
    torch.testing.assert_close(out["beta"], model.log_beta.exp())
    dense = SparseAttentionGraph.dense(out)
    for g in range(G):
        assert out["weights"][g].shape == (18, m) and out["scores"][g].shape == (18, m)
        assert torch.equal(out["index"][g], idx[g])
        torch.testing.assert_close(out["codes"][g], ref["codes"][g])
        torch.testing.assert_close(out["scores"][g], ref["scores"][g])
        torch.testing.assert_close(out["weights"][g], ref["weights"][g])
        torch.testing.assert_close(dense[g], ref["graphs"][g])
        torch.testing.assert_close(
            out["aggregate"][g], ref["graphs"][g] @ ref["codes"][g]
        )
        torch.testing.assert_close(out["hidden"][g], ref["hidden"][g])
        if m == 17 and graph != "identity":
            torch.testing.assert_close(out["full"][g], ref["graphs"][g])
        elif m < 17:
            assert out["full"][g] is None
    assert [r.shape for r in out["recon"]] == [(18, 5), (18, 7), (18, 4)]
    for r, rr in zip(out["recon"], ref["recon"]):
        torch.testing.assert_close(r, rr)


def test_forward_accepts_one_tensor_for_one_graph():
    views = small_views()
    model = make_model(views, shared=True)
    (idx,) = view_candidates(standardize_views(views), 6, shared=True)
    with torch.no_grad():
        a, b = model(views, idx), model(views, [idx])
    torch.testing.assert_close(a["weights"][0], b["weights"][0])
    one = make_model(views[:1])
    with torch.no_grad():
        torch.testing.assert_close(
            one(views[:1], idx)["scores"][0], one(views[:1], [idx])["scores"][0]
        )


def test_graph_properties(device):
    views = small_views(device=device)
    model = make_model(views, temperature=0.1)
    xs = standardize_views(views)
    for m in (8, 17):
        with torch.no_grad():
            out = model(views, view_candidates(xs, m))
        for w, a in zip(out["weights"], SparseAttentionGraph.dense(out)):
            assert a.shape == (18, 18) and a.device.type == device.type
            assert bool((w >= 0).all()) and int((w == 0).sum()) > 18  # exact zeros
            ones = torch.ones(18, dtype=F64, device=device)
            torch.testing.assert_close(w.sum(1), ones)
            torch.testing.assert_close(a.sum(1), ones)
            assert bool((torch.diagonal(a) == 0).all())
        z = out["codes"][0]
        torch.testing.assert_close(z.mean(0), torch.zeros(8, dtype=F64, device=device))


def test_dense_and_gather_paths_agree():
    """The same candidate set through both paths: (a) the gather scores of
    ``similarity`` over every other point, with columns shuffled per row, are the dense
    path's scores shuffled alike; (b) a forward pass with one candidate fewer (the
    gather path) is the dense path's rows renormalised without that candidate."""
    n = 14
    views = small_views(n=n, dims=(4, 6))
    model = make_model(views, temperature=0.3)
    xs = standardize_views(views)
    full_idx = view_candidates(xs, n - 1)
    g = torch.Generator().manual_seed(7)
    perm = torch.stack([torch.randperm(n - 1, generator=g) for _ in range(n)])
    with torch.no_grad():
        dense = model(views, full_idx)
        assert all(a is not None for a in dense["full"])
        sharpen = model.gate_range ** (2 * dense["omega"] - 1)
        for k, z in enumerate(dense["codes"]):
            idx = full_idx[k].gather(1, perm)
            s = model.similarity(z, idx, k) * sharpen[k][:, None]
            torch.testing.assert_close(s, dense["scores"][k].gather(1, perm))
            w = entmax15(s, dim=1)
            torch.testing.assert_close(w, dense["weights"][k].gather(1, perm))
            agg = (w[:, :, None] * z[idx]).sum(1)
            torch.testing.assert_close(agg, dense["aggregate"][k])
        # (b) drop the last shuffled column: the gather path on n − 2 candidates
        fewer = [idx.gather(1, perm[:, :-1]) for idx in full_idx]
        gath = model(views, fewer)
        assert all(a is None for a in gath["full"])
        for k in range(2):
            torch.testing.assert_close(
                gath["scores"][k], dense["scores"][k].gather(1, perm[:, :-1])
            )
            torch.testing.assert_close(
                gath["weights"][k], ref_entmax15(gath["scores"][k], dim=1)
            )
        torch.testing.assert_close(gath["omega"], dense["omega"])
    # the same candidate set, both paths, same loss (one candidate fewer: a different
    # graph, so a different loss)
    d_loss = sagl_loss(dense, xs)
    with torch.no_grad():
        d_again = sagl_loss(model(views, [i.flip(1) for i in full_idx]), xs)
        g_loss = sagl_loss(gath, xs)
    for a, b in zip(d_loss, d_again):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(d_loss[1], g_loss[1])


def test_scores_asymmetric_once_u_differs_from_v():
    views = small_views()
    model = make_model(views, perturb=False, gate=False)
    idx = view_candidates(standardize_views(views), 17)
    off = ~torch.eye(18, dtype=torch.bool)

    def dense_scores():
        out = model(views, idx)
        return torch.zeros(18, 18, dtype=F64).scatter(1, idx[0], out["scores"][0])

    with torch.no_grad():
        s0 = dense_scores()  # U = V = I, no gate: z_i·z_j/√C, symmetric
        torch.testing.assert_close(s0, s0.T)
        model.U[0].add_(0.3 * torch.randn(8, 8, dtype=F64))
        s = dense_scores()
        assert not torch.allclose(s[off], s.T[off])  # directed
        model.U.mul_(3.0)
        model.V.div_(3.0)
        torch.testing.assert_close(dense_scores(), s)  # (cU, V/c): same scores
        model.V.mul_(9.0)  # (cU, cV): scores × c²
        torch.testing.assert_close(dense_scores(), 9.0 * s)
        model.log_beta.add_(math.log(2.0))  # β × 2: scores × 2
        torch.testing.assert_close(dense_scores(), 18.0 * s)


def test_permutation_equivariance():
    views = small_views()
    model = make_model(views)
    perm = torch.randperm(18, generator=torch.Generator().manual_seed(3))
    inv = torch.argsort(perm)
    pv = [x[perm] for x in views]
    for m in (6, 17):
        idx = view_candidates(standardize_views(views), m)
        pidx = [inv[i[perm]] for i in idx]
        with torch.no_grad():
            a = SparseAttentionGraph.dense(model(views, idx))
            pa = SparseAttentionGraph.dense(model(pv, pidx))
        for x, y in zip(a, pa):
            torch.testing.assert_close(y, x[perm][:, perm])


def test_omega_half_is_the_gateless_model():
    views = small_views()
    model = make_model(views)
    twin = make_model(views, gate=False, seed=9)
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.startswith("gates.") for k in unexpected)
    xs = standardize_views(views)
    for m in (6, 17):
        idx = view_candidates(xs, m)
        with torch.no_grad():
            half, plain, free = (
                model(views, idx, omega=0.5),
                twin(views, idx),
                model(views, idx),
            )
        assert torch.equal(half["omega"], torch.full((2, 18), 0.5, dtype=F64))
        for key in ("scores", "weights", "hidden"):
            for a, b in zip(half[key], plain[key]):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        # the learned gate is not neutral: it changes the scores
        assert not torch.allclose(free["scores"][0], half["scores"][0])


@pytest.mark.parametrize("m", [7, 17])
def test_interventions_rescale_rows_and_nest_supports(m):
    views = small_views()
    model = make_model(views, temperature=0.2)
    idx = view_candidates(standardize_views(views), m)
    gamma = model.gate_range
    with torch.no_grad():
        wide, narrow = model(views, idx, omega=0.0), model(views, idx, omega=1.0)
        base, sharp = model(views, idx), model(views, idx, beta_scale=2.0)
    for g in range(2):
        torch.testing.assert_close(narrow["scores"][g], gamma**2 * wide["scores"][g])
        torch.testing.assert_close(sharp["scores"][g], 2.0 * base["scores"][g])
        assert support_within(narrow["weights"][g], wide["weights"][g])
        assert support_within(sharp["weights"][g], base["weights"][g])
    # the supports differ: the interventions do something
    assert int((narrow["weights"][0] > 0).sum()) < int((wide["weights"][0] > 0).sum())
    assert int((sharp["weights"][0] > 0).sum()) < int((base["weights"][0] > 0).sum())


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 10**6),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.2, 5.0),
    st.floats(1.0, 8.0),
)
def test_support_never_grows_as_rows_sharpen(seed, w1, w2, scale, ratio):
    views = small_views(n=10, dims=(3, 4), seed=seed)
    model = make_model(views, seed=seed % 97, temperature=0.3)
    idx = view_candidates(standardize_views(views), 6)
    lo, hi = sorted((w1, w2))
    with torch.no_grad():
        a = model(views, idx, omega=lo, beta_scale=scale)["weights"]
        b = model(views, idx, omega=hi, beta_scale=scale)["weights"]
        c = model(views, idx, omega=hi, beta_scale=scale * ratio)["weights"]
    for wa, wb, wc in zip(a, b, c):
        assert support_within(wb, wa) and support_within(wc, wb)


def test_ablations():
    views = standardize_views(small_views())
    idx = view_candidates(views, 8)
    model = make_model(views, graph="softmax")
    with torch.no_grad():
        soft = model(views, idx)
    assert all(bool((w > 0).all()) for w in soft["weights"])
    model = make_model(views, graph="identity")
    with torch.no_grad():
        ident = model(views, idx)
    for a in SparseAttentionGraph.dense(ident):
        assert torch.equal(a, torch.eye(18, dtype=F64))
    for z, h, W in zip(ident["codes"], ident["hidden"], model.W):
        torch.testing.assert_close(h, z + W(z))
    _, se, _ = sagl_loss(ident, views)
    assert float(se) == 0.0
    model = make_model(views, gate=False)
    with torch.no_grad():
        nogate = model(views, idx)
    assert bool((nogate["omega"] == 0.5).all())


@settings(max_examples=20, deadline=None)
@given(
    st.integers(3, 12),
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(0, 10**6),
    st.floats(0.01, 5.0),
    st.booleans(),
    st.integers(1, 11),
)
def test_rows_on_simplex_property(n, dims, seed, temperature, shared, m):
    views = small_views(n=n, dims=dims, seed=seed)
    model = make_model(views, temperature=temperature, shared=shared)
    idx = view_candidates(standardize_views(views), min(m, n - 1), shared=shared)
    with torch.no_grad():
        out = model(views, idx)
    for w, a in zip(out["weights"], SparseAttentionGraph.dense(out)):
        assert bool((w >= 0).all()) and bool(torch.isfinite(w).all())
        torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=F64))
        assert bool((torch.diagonal(a) == 0).all())


# --- the objective --------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["inputs", "codes"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("m", [6, 17])
def test_loss_matches_formula(objective, shared, m):
    views = standardize_views(small_views(dims=(5, 7, 4)))
    model = make_model(views, shared=shared)
    idx = view_candidates(views, m, shared=shared)
    with torch.no_grad():
        out = model(views, idx)
        total, se, rec = sagl_loss(out, views, 0.3, objective)
    graphs = SparseAttentionGraph.dense(out)
    se_ref = 0.0
    for g, a in enumerate(graphs):
        if objective == "codes":
            z = out["codes"][g]
            se_ref += ((z - a @ z) ** 2).sum() / (z**2).sum()
        else:  # each view by its own graph; the shared graph expresses every view
            for x in views if shared else [views[g]]:
                se_ref += ((x - a @ x) ** 2).sum() / (x**2).sum()
    rec_ref = sum(
        ((x - r) ** 2).sum() / (x**2).sum() for x, r in zip(views, out["recon"])
    )
    torch.testing.assert_close(se, se_ref)
    torch.testing.assert_close(rec, rec_ref)
    torch.testing.assert_close(total, se_ref + 0.3 * rec_ref)
    assert float(se) > 0 and float(rec) > 0
    if objective == "inputs":  # gathered neighbours given in advance: the same loss
        gathered = [
            [x[i] for x in (views if shared else [views[g]])]
            for g, i in enumerate(out["index"])
        ]
        cached = sagl_loss(out, views, 0.3, objective, gathered)
        for a, b in zip(cached, (total, se, rec)):
            torch.testing.assert_close(a, b)
    # reconstruction_weight 0: the self-expression alone
    torch.testing.assert_close(sagl_loss(out, views, 0.0, objective)[0], se)


def test_entmax_rows_pass_gradcheck():
    g = torch.Generator().manual_seed(0)
    s = (torch.randn(5, 7, dtype=F64, generator=g) * 3).requires_grad_(True)
    torch.testing.assert_close(entmax15(s, dim=1), ref_entmax15(s, dim=1))
    assert torch.autograd.gradcheck(
        lambda t: entmax15(t, dim=1), (s,), eps=1e-6, atol=1e-5
    )


@pytest.mark.parametrize("objective", ["inputs", "codes"])
@pytest.mark.parametrize("m", [4, 7])  # the gather path and the dense path
def test_loss_gradient_passes_gradcheck(objective, m):
    views = standardize_views(small_views(n=8, dims=(3, 4)))
    model = make_model(views, latent_dim=4, temperature=0.5)
    idx = view_candidates(views, m)
    names = ["U", "V", "log_beta", "gates.1.2.weight", "W.0.weight"]
    params = dict(model.named_parameters())
    inputs = tuple(params[k].detach().clone().requires_grad_(True) for k in names)

    def f(*ps):
        out = torch.func.functional_call(model, dict(zip(names, ps)), (views, idx))
        return sagl_loss(out, views, 0.5, objective)[0]

    with torch.no_grad():
        out = model(views, idx)
        assert int((torch.cat(out["weights"]) == 0).sum()) > 0  # sparse rows
        torch.testing.assert_close(f(*inputs), sagl_loss(out, views, 0.5, objective)[0])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)


def test_gradients_reach_every_parameter():
    views = standardize_views(small_views())
    for m in (6, 17):
        model = make_model(views)
        total, _, _ = sagl_loss(model(views, view_candidates(views, m)), views)
        total.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
            if re.fullmatch(r"gates\.\d\.2\.bias", name):
                # the gate's output bias cancels in the centred logits: no gradient
                assert float(p.grad.abs().max()) < 1e-12, name
            else:
                assert float(p.grad.abs().sum()) > 0, name


def test_neighbour_rows_gather_and_its_sparse_backward():
    from localbook.sagl import _GatherRows, _selection_t

    g = torch.Generator().manual_seed(3)
    z = torch.randn(9, 4, generator=g, dtype=F64, requires_grad=True)
    idx = torch.randint(0, 9, (9, 5), generator=g)
    flat = idx.reshape(-1)
    sel = _selection_t(flat, 9, F64)
    out = _GatherRows.apply(z, flat, sel)
    torch.testing.assert_close(out, z[flat], rtol=0, atol=0)
    weights = torch.randn(45, 4, generator=g, dtype=F64)
    (out * weights).sum().backward()
    ref = torch.zeros(9, 4, dtype=F64).index_add_(0, flat, weights)
    torch.testing.assert_close(z.grad, ref)
    assert torch.autograd.gradcheck(lambda t: _GatherRows.apply(t, flat, sel), (z,))
    # the model keeps one selection matrix per graph, for the index it was given
    views = standardize_views(small_views(n=9))
    model = make_model(views)
    cand = view_candidates(views, 4)
    torch.testing.assert_close(model._neighbour_rows(z, cand[0], 0), z[cand[0]])
    torch.testing.assert_close(model._neighbour_rows(z, cand[1], 1), z[cand[1]])
    kept = model._selection[0]
    model._neighbour_rows(z, cand[0], 0)
    assert model._selection[0] is kept and set(model._selection) == {0, 1}
    cand2 = cand[0].flip(1)
    torch.testing.assert_close(model._neighbour_rows(z, cand2, 0), z[cand2])
    cand2[0, 0] = (cand2[0, 0] + 1) % 9  # changed in place: the matrix is rebuilt
    torch.testing.assert_close(model._neighbour_rows(z, cand2, 0), z[cand2])
    zh = z.detach().half()  # half precision: a plain gather
    torch.testing.assert_close(model._neighbour_rows(zh, cand[0], 0), zh[cand[0]])
    # a model with its cache can be copied and pickled (the cache is left behind)
    twin = copy.deepcopy(model)
    assert twin._selection == {} and model._selection
    torch.testing.assert_close(twin._neighbour_rows(z, cand[0], 0), z[cand[0]])
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=False)._selection == {}


def test_weighted_rows_matches_einsum_and_passes_gradcheck():
    from localbook.sagl import _weighted_rows

    g = torch.Generator().manual_seed(4)
    w = torch.rand(6, 5, generator=g, dtype=F64, requires_grad=True)
    rows = torch.randn(6, 5, 3, generator=g, dtype=F64, requires_grad=True)
    torch.testing.assert_close(
        _weighted_rows(w, rows), torch.einsum("nm,nmc->nc", w, rows)
    )
    assert torch.autograd.gradcheck(_weighted_rows, (w, rows))
    assert torch.autograd.gradcheck(lambda t: _weighted_rows(t, rows.detach()), (w,))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_normalized_affinity_sparse_equals_dense(dtype):
    from localbook.sagl_graphs import _normalized_affinity

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
    w = (a.abs() + a.abs().T).double() / 2  # brute force
    deg = w.sum(1)
    inv = torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))
    torch.testing.assert_close(dense, inv[:, None] * w * inv[None, :])


def test_spectral_readout_takes_half_precision_graphs():
    y = torch.arange(3).repeat_interleave(110)
    a = (y[:, None] == y[None, :]).double()
    a.fill_diagonal_(0)
    for dtype in (torch.bfloat16, torch.float16):  # the sparse path (n > 300)
        labels = spectral_readout((a / 109).to(dtype), 3, seed=0)
        assert clustering_accuracy(y, labels) == 1.0


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


# --- training and read-out ------------------------------------------------------------
def test_fit_is_seeded_stops_by_rule_and_leaves_global_rng_alone():
    views = small_views(n=20)
    state = torch.get_rng_state()
    kw = dict(seed=5, n_candidates=6, latent_dim=8, hidden_dim=16)
    r1 = fit_sagl(
        views, max_steps=30, tol=0.0, callback=lambda s, o: s, callback_every=10, **kw
    )
    assert torch.equal(state, torch.get_rng_state())
    assert r1.n_steps == 30 and r1.history == [0, 10, 20, 30]
    r2 = fit_sagl(views, max_steps=30, tol=0.0, **kw)
    assert torch.equal(r1.graph, r2.graph) and r1.losses == r2.losses
    r3 = fit_sagl(views, max_steps=30, tol=0.0, **{**kw, "seed": 6})
    assert not torch.equal(r1.graph, r3.graph)
    assert r1.losses[-1] < r1.losses[0]
    w, tol = 5, 0.2
    r4 = fit_sagl(views, max_steps=400, tol=tol, window=w, **kw)
    assert r4.n_steps < 400  # the rule fires: the loss stalls long before 400 steps
    L = r4.losses
    t = len(L) - 1  # the rule fired at t, and not at any step before
    assert t >= w and L[t - w] - L[t] < tol * abs(L[t - w])
    assert all(L[s - w] - L[s] >= tol * abs(L[s - w]) for s in range(w, t))


@pytest.mark.parametrize("shared", [False, True])
def test_fit_result_fields_and_regraph(shared):
    views = small_views(n=16, dims=(4, 5, 3))
    res = fit_sagl(
        views,
        shared=shared,
        max_steps=15,
        tol=0.0,
        latent_dim=6,
        hidden_dim=8,
        temperature=0.3,
        seed=2,
        callback=lambda step, out: out["omega"].detach().clone(),
        callback_every=100,
    )
    G = 1 if shared else 3
    assert len(res.history) == 2  # step 0 (the initial model) and the end
    torch.testing.assert_close(res.omega_init, res.history[0])
    torch.testing.assert_close(res.omega, res.history[-1])
    assert isinstance(res, SAGLResult) and res.labels is None
    assert len(res.graphs) == G and len(res.index) == G
    torch.testing.assert_close(res.graph, torch.stack(res.graphs).mean(0))
    assert res.graph.shape == (16, 16) and not res.graph.requires_grad
    assert res.omega.shape == (G, 16) and res.omega_init.shape == (G, 16)
    assert not torch.allclose(res.omega, res.omega_init)  # the gate trained
    assert res.beta.shape == (G,) and res.hidden.shape == (16, G * 6)
    for x, xs in zip(res.views, standardize_views(views)):
        torch.testing.assert_close(x, xs)
    for idx in res.index:  # n_candidates=None: every other point
        assert torch.equal(idx, all_others(16))
    torch.testing.assert_close(res.neighbours, effective_neighbours(res.graph))
    with torch.no_grad():  # the result is the model's last forward pass
        out = res.model(res.views, res.index)
    torch.testing.assert_close(res.hidden, torch.cat(out["hidden"], 1))
    torch.testing.assert_close(res.beta, out["beta"])
    torch.testing.assert_close(res.regraph(), res.graph)
    torch.testing.assert_close(res.regraph(omega=None, beta_scale=1.0), res.graph)
    narrow, wide = res.regraph(beta_scale=2.0), res.regraph(beta_scale=0.5)
    assert support_within(narrow, res.graph) and support_within(res.graph, wide)
    assert int((narrow > 0).sum()) < int((wide > 0).sum())
    assert support_within(res.regraph(omega=1.0), res.regraph(omega=0.0))
    for a in (narrow, wide):
        torch.testing.assert_close(a.sum(1), torch.ones(16, dtype=F64))


def test_fit_gather_path_and_fixed_temperature():
    views = small_views(n=16)
    res = fit_sagl(
        views,
        n_candidates=5,
        max_steps=10,
        tol=0.0,
        latent_dim=6,
        hidden_dim=8,
        temperature=0.5,
        learn_temperature=False,
        gate_range=2.0,
    )
    assert res.model.gate_range == 2.0
    torch.testing.assert_close(res.beta, torch.full((2,), 2.0, dtype=F64))
    xs = standardize_views(views)
    for idx, expected in zip(res.index, view_candidates(xs, 5)):
        assert torch.equal(idx, expected)
    for a, idx in zip(res.graphs, res.index):  # support within the candidates
        outside = torch.ones(16, 16, dtype=torch.bool).scatter(1, idx, False)
        assert not bool(a[outside].any())
    assert res.n_steps == 10


@pytest.mark.parametrize(
    "shared, n_candidates, objective",
    [
        (False, 5, "inputs"),
        (True, 5, "inputs"),
        (False, None, "codes"),
        (True, None, "inputs"),
    ],
)
def test_fit_minimizes_sagl_loss(shared, n_candidates, objective):
    """The loss recorded at each step is :func:`sagl_loss` of that step's forward pass
    (the gathered neighbours ``fit_sagl`` prepares change nothing)."""
    views = small_views(n=14, dims=(3, 4, 5))
    xs = standardize_views(views)
    res = fit_sagl(
        views,
        shared=shared,
        n_candidates=n_candidates,
        objective=objective,
        reconstruction_weight=0.7,
        max_steps=4,
        tol=0.0,
        latent_dim=6,
        hidden_dim=8,
        callback=lambda step, out: float(
            sagl_loss(out, xs, 0.7, objective)[0].detach()
        ),
        callback_every=1,
    )
    expected = view_candidates(xs, n_candidates or 13, shared=shared)
    assert len(res.index) == len(expected) == (1 if shared else 3)
    for idx, ref in zip(res.index, expected):
        assert torch.equal(idx, ref)
    assert len(res.history) == 5
    for a, b in zip(res.history[:4], res.losses):
        assert math.isclose(a, b, rel_tol=1e-12)


def test_fit_draws_one_model_whatever_the_default_dtype():
    views = small_views(n=12)
    kw = dict(max_steps=2, tol=0.0, latent_dim=6, hidden_dim=8, seed=3)
    default = torch.get_default_dtype()
    try:
        results = []
        for dtype in (torch.float32, F64):
            torch.set_default_dtype(dtype)
            results.append(fit_sagl(views, **kw))
            assert torch.get_default_dtype() == dtype  # left as it was
            with pytest.raises(ValueError, match="graph"):
                fit_sagl(views, graph="dense")  # a failed build restores it too
            assert torch.get_default_dtype() == dtype
    finally:
        torch.set_default_dtype(default)
    a, b = results
    assert a.graph.dtype == b.graph.dtype == F64  # the model takes the views' dtype
    torch.testing.assert_close(a.omega_init, b.omega_init, rtol=0, atol=0)
    torch.testing.assert_close(a.graph, b.graph, rtol=0, atol=0)


def test_identity_graph_trains_its_encoders_and_decoders():
    views = small_views(n=16)
    res = fit_sagl(
        views, graph="identity", max_steps=20, tol=0.0, latent_dim=6, hidden_dim=8
    )
    assert res.n_steps == 20 and res.losses[-1] < res.losses[0]
    for a in res.graphs:
        assert torch.equal(a, torch.eye(16, dtype=F64))
    assert torch.equal(res.graph, torch.eye(16, dtype=F64))
    assert any(bool(dec.weight.any()) for dec in res.model.decoders)


def test_fit_objective_codes_and_reconstruction_weight():
    views = small_views(n=16)
    kw = dict(max_steps=5, tol=0.0, latent_dim=6, hidden_dim=8, seed=3)
    a = fit_sagl(views, objective="codes", **kw)
    b = fit_sagl(views, objective="inputs", **kw)
    assert a.losses[0] != b.losses[0]
    # with a reconstruction weight of 0, the first loss is the self-expression alone
    # (the decoders start at zero: each of the two views' reconstruction losses is 1)
    c = fit_sagl(views, reconstruction_weight=0.0, **kw)
    assert math.isclose(b.losses[0] - c.losses[0], 2.0, rel_tol=1e-12)


def easy_blobs(n_per_class=10, seed=0):
    """Three tight, far-apart clusters seen through two random nonlinear maps."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(3).repeat_interleave(n_per_class)
    latent = 4 * torch.randn(3, 4, generator=g)[y]
    latent = latent + 0.3 * torch.randn(latent.shape, generator=g)
    views = [torch.tanh(latent @ torch.randn(4, d, generator=g) / 2) for d in (6, 9)]
    return views, y


@pytest.mark.parametrize("fusion", ["graphs", "representations"])
@pytest.mark.parametrize("data_seed", [0, 1])
def test_sagl_cluster_separates_easy_clusters(fusion, data_seed):
    views, y = easy_blobs(seed=data_seed)
    res = sagl_cluster(
        views, 3, seed=0, fusion=fusion, k=5, max_steps=40, latent_dim=8, hidden_dim=16
    )
    assert res.labels.shape == (30,) and res.labels.dtype == torch.int64
    assert clustering_accuracy(y, res.labels) == 1.0
    ref = res.graph if fusion == "graphs" else knn_graph([res.hidden], 5)
    assert torch.equal(res.labels, spectral_readout(ref, 3, seed=0))


@pytest.mark.parametrize("fusion", ["graphs", "representations"])
def test_sagl_cluster_reads_out_the_fused_graph(fusion):
    views = small_views(n=24, dims=(4, 6))  # no structure: any wrong graph shows
    kw = dict(max_steps=5, latent_dim=6, hidden_dim=8, seed=4)
    res = sagl_cluster(views, 4, fusion=fusion, k=6, **kw)
    fit = fit_sagl(views, **kw)
    torch.testing.assert_close(res.graph, fit.graph)
    torch.testing.assert_close(res.hidden, fit.hidden)
    graph = res.graph if fusion == "graphs" else knn_graph([res.hidden], 6)
    assert torch.equal(res.labels, spectral_readout(graph, 4, seed=4))
    other = knn_graph([res.hidden], 6) if fusion == "graphs" else res.graph
    assert not torch.equal(res.labels, spectral_readout(other, 4, seed=4))


def test_sagl_keeps_easy_subspaces_apart():
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
    assert subspace_preserving_rate(res.graph, y) >= 0.97
    untrained = subspace_preserving_rate(
        fit_sagl(views, max_steps=1, n_candidates=10).graph, y
    )
    assert subspace_preserving_rate(res.graph, y) > untrained


# --- bad inputs -----------------------------------------------------------------------
def test_bad_inputs():
    views = small_views()
    xs = standardize_views(views)
    with pytest.raises(ValueError, match="graph"):
        SparseAttentionGraph([5, 7], graph="dense")
    for name in ("gate", "shared", "learn_temperature"):
        with pytest.raises(TypeError, match=name):
            SparseAttentionGraph([5, 7], **{name: 1})
    with pytest.raises(ValueError, match="gate_range"):
        SparseAttentionGraph([5, 7], gate_range=0.5)
    with pytest.raises(ValueError, match="gate_range"):
        SparseAttentionGraph([5, 7], gate_range=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SparseAttentionGraph([5, 7], temperature=0.0)
    with pytest.raises(ValueError, match="latent_dim"):
        SparseAttentionGraph([5, 7], latent_dim=0)
    with pytest.raises(ValueError, match="view_dims"):
        SparseAttentionGraph([])
    model = make_model(views)
    idx = view_candidates(xs, 6)
    with pytest.raises(ValueError, match="index must be a list of 2"):
        model(views, idx[:1])
    with pytest.raises(ValueError, match="index is one tensor but the model has 2"):
        model(views, idx[0])  # one tensor for two graphs
    for bad in (-1, 18):  # point numbers outside [0, n - 1]
        wrong = idx[0].clone()
        wrong[3, 2] = bad
        with pytest.raises(ValueError, match=r"index\[0\] must hold point numbers"):
            model(views, [wrong, idx[1]])
    twice = idx[1].clone()
    twice[4, 1] = twice[4, 0]  # a candidate listed twice in one row
    with pytest.raises(ValueError, match=r"index\[1\] lists a candidate twice"):
        model(views, [idx[0], twice])
    everyone = view_candidates(xs, 17)  # the all-pairs path relies on distinct rows
    twice = everyone[0].clone()
    twice[0, 1] = twice[0, 0]
    with pytest.raises(ValueError, match="twice"):
        model(views, [twice, everyone[1]])
    with pytest.raises(ValueError, match="index must be a list of 2"):
        model(views, idx + idx[:1])
    with pytest.raises(ValueError, match=r"index\[1\].*own candidate"):
        model(views, [idx[0], torch.arange(18)[:, None]])
    with pytest.raises(ValueError, match=r"index\[0\] must have shape"):
        model(views, [idx[0][:5], idx[1]])
    with pytest.raises(ValueError, match=r"index\[1\] must have shape"):
        model(views, [idx[0], idx[1][0]])
    with pytest.raises(ValueError, match="views.*features but the model expects"):
        model(small_views(dims=(5, 6)), idx)
    with pytest.raises(ValueError, match="views.*features but the model expects"):
        model(small_views(dims=(5, 7, 3)), idx)
    with pytest.raises(ValueError, match=r"views\[1\]"):
        model([views[0], views[1][:10]], idx)
    with pytest.raises(TypeError, match="views"):
        model(views[0], idx)
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="omega"):
            model(views, idx, omega=bad)
    with pytest.raises(TypeError, match="omega"):
        model(views, idx, omega="high")
    with pytest.raises(ValueError, match="beta_scale"):
        model(views, idx, beta_scale=0.0)
    with torch.no_grad():
        out = model(views, idx)
    with pytest.raises(ValueError, match="objective"):
        sagl_loss(out, xs, objective="pixels")
    with pytest.raises(ValueError, match="objective"):
        fit_sagl(views, objective="pixels")
    with pytest.raises(ValueError, match="graph"):
        fit_sagl(views, graph="dense")
    with pytest.raises(TypeError, match="shared"):
        fit_sagl(views, shared="yes")
    with pytest.raises(TypeError, match="views"):
        fit_sagl(torch.ones(4, 3))
    for name, bad in [
        ("max_steps", 0),
        ("window", 0),
        ("tol", -0.1),
        ("lr", 0.0),
        ("callback_every", 0),
        ("n_candidates", 0),
        ("reconstruction_weight", -1.0),
    ]:
        with pytest.raises(ValueError, match=name):
            fit_sagl(views, **{name: bad})
    with pytest.raises(ValueError, match="fusion"):
        sagl_cluster(views, 3, fusion="votes")
    with pytest.raises(ValueError, match="n_clusters"):
        sagl_cluster(views, 0)
    with pytest.raises(ValueError, match="lam"):
        lsr_coefficients(torch.ones(3, 2), 0.0)
    with pytest.raises(ValueError, match="m"):
        candidate_neighbours(views, 18)
    with pytest.raises(ValueError, match="m"):
        self_expression_graph(views, m=18)
    with pytest.raises(ValueError, match="n_iter"):
        self_expression_graph(views, n_iter=0)
    for k in (0, 18):
        with pytest.raises(ValueError, match="k"):
            knn_graph(views, k)
        with pytest.raises(ValueError, match="k"):
            fused_knn_graph(views, k)
    with pytest.raises(ValueError, match="temperature"):
        dense_attention_graph(views, temperature=0.0)
    with pytest.raises(ValueError, match="graph"):
        effective_neighbours(torch.ones(4))
    with pytest.raises(ValueError, match="n_clusters"):
        spectral_readout(torch.eye(3), 4)
    with pytest.raises(ValueError, match="graph.*square"):
        spectral_readout(torch.ones(3, 2), 2)


# --- the stored reproduction run ------------------------------------------------------
DATASETS = ("syn", "dig", "fm")
METHODS = (
    "SAGL",
    "k-NN graph (k = 10)",
    "no gate (ω ≡ ½)",
    "dense softmax",
    "one shared graph",
    "identity graph (ablation)",
)
QUANTILES = ("q05", "q25", "q50", "q75", "q95")


def check_stored_sagl_run(run):
    """What chapter 9 relies on in the stored run (see reproductions/sagl.py)."""
    runs, gate, prov = run["runs"], run["gate"], run["provenance"]
    assert set(DATASETS) <= set(runs["dataset"])
    for ds in DATASETS:
        for method in METHODS:
            rows = runs[(runs["dataset"] == ds) & (runs["method"] == method)]
            assert rows["seed"].nunique() >= 5, (ds, method)
    for col in ("ACC", "NMI", "ARI"):
        v = runs[col]
        assert bool(v.notna().all()) and bool(v.between(-1, 1).all()), col
    assert bool(runs["ACC"].between(0, 1).all())
    assert set(gate["stage"]) == {"init", "trained"}
    assert set(DATASETS) <= set(gate["dataset"])
    q = gate[list(QUANTILES)].to_numpy()
    assert ((q >= 0) & (q <= 1)).all() and (q[:, 1:] >= q[:, :-1]).all()
    curves = run["curves"]
    losses = curves[curves["loss"].notna()]
    for ds in DATASETS:
        assert losses.loc[losses["dataset"] == ds, "seed"].nunique() >= 5, ds
    assert bool((losses["step"] >= 1).all()) and bool((losses["loss"] > 0).all())
    if "ACC" in curves:  # the scores every few steps, where recorded
        assert bool(curves["ACC"].dropna().between(0, 1).all())
    for key in ("command", "commit", "date"):
        assert isinstance(prov.get(key), str) and prov[key].strip(), key
    assert "reproductions/sagl.py" in prov["command"]
    assert re.fullmatch(r"[0-9a-f]{40}", prov["commit"]), prov["commit"]


def write_fake_run(folder, seeds=5, methods=METHODS, acc=0.9):
    import pandas as pd

    runs = [
        dict(dataset=d, seed=s, method=m, ACC=acc, NMI=0.8, ARI=-0.05)
        for d in DATASETS
        for s in range(seeds)
        for m in methods
    ]
    pd.DataFrame(runs).to_csv(folder / "sagl_reproduction.csv", index=False)
    gate = [
        dict(
            dataset=d,
            seed=s,
            view=0,
            stage=st_,
            q05=0.1,
            q25=0.3,
            q50=0.5,
            q75=0.7,
            q95=0.9,
        )
        for d in DATASETS
        for s in range(seeds)
        for st_ in ("init", "trained")
    ]
    pd.DataFrame(gate).to_csv(folder / "sagl_gate.csv", index=False)
    prov = {
        "command": "python reproductions/sagl.py ",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "date": "2025-01-01 00:00 UTC",
    }
    (folder / "sagl_reproduction.json").write_text(json.dumps(prov))
    curves = [
        dict(dataset=d, seed=s, step=t, loss=2.0 - t / 10)
        for d in DATASETS
        for s in range(seeds)
        for t in (1, 2, 3)
    ]
    curves.append(dict(dataset="syn", seed=0, step=0, ACC=acc))
    pd.DataFrame(curves).to_csv(folder / "sagl_curves.csv", index=False)


def test_stored_sagl_run():
    """The stored run of the full protocol (written by reproductions/sagl.py; a missing
    file fails here on purpose: the chapter reads it)."""
    check_stored_sagl_run(load_stored_run("sagl"))


def test_stored_run_checks_on_fake_files(tmp_path, monkeypatch):
    monkeypatch.setattr(localbook.datasets, "_DATA", tmp_path)
    write_fake_run(tmp_path)
    run = load_stored_run("sagl")
    assert set(run) == {"runs", "gate", "curves", "provenance"}
    assert len(run["runs"]) == 3 * 5 * len(METHODS)
    check_stored_sagl_run(run)
    # the checker itself fails on runs that fall short
    for kw in (dict(seeds=4), dict(methods=METHODS[:-1]), dict(acc=1.5)):
        write_fake_run(tmp_path, **kw)
        with pytest.raises(AssertionError):
            check_stored_sagl_run(load_stored_run("sagl"))
    with pytest.raises(ValueError, match="name"):
        load_stored_run("other")


@pytest.mark.parametrize(
    "name, text",
    [
        ("sagl_reproduction.csv", ""),  # empty
        ("sagl_reproduction.csv", "dataset,seed,method,ACC\n"),  # no rows
        ("sagl_gate.csv", "dataset,view\nsyn,0\n"),  # no seeds
        ("sagl_reproduction.csv", b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage"),
        ("sagl_reproduction.json", "{not json"),
        ("sagl_gate.csv", None),  # missing
        ("sagl_curves.csv", None),
        ("sagl_curves.csv", "dataset,step,loss\nsyn,1,0.5\n"),  # no seeds
    ],
)
def test_stored_run_damaged_files_raise(tmp_path, monkeypatch, name, text):
    monkeypatch.setattr(localbook.datasets, "_DATA", tmp_path)
    write_fake_run(tmp_path)
    path = tmp_path / name
    if text is None:
        path.unlink()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(RuntimeError, match=re.escape(name)):
        load_stored_run("sagl")
