"""Tests of localbook.sagl: data generators, the SAGL graph's properties, training, read-out."""
import math

import numpy as np
import pytest
import torch
from entmax import entmax15 as ref_entmax15
from hypothesis import given, settings
from hypothesis import strategies as st

from localbook.metrics import clustering_accuracy
from localbook.sagl import (
    SparseAttentionGraph, fit_sagl, make_digits_views, make_multiview_subspaces, sagl_cluster, sagl_loss,
    spectral_readout, standardize_views,
)


def small_views(n=18, dims=(5, 7), seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=dtype).to(device) for d in dims]


def model_for(views, **kw):
    torch.manual_seed(1)
    return SparseAttentionGraph([v.shape[1] for v in views], latent_dim=8, hidden_dim=16, **kw).to(
        dtype=views[0].dtype, device=views[0].device)


# --- data --------------------------------------------------------------------------------------
def test_multiview_subspaces_shapes_and_structure():
    views, y, latent = make_multiview_subspaces(n_per_class=10, n_classes=3, latent_dim=6, subspace_dim=2,
                                                view_dims=(4, 9, 5), seed=3, dtype=torch.float64)
    assert [v.shape for v in views] == [(30, 4), (30, 9), (30, 5)]
    assert latent.shape == (30, 6) and y.dtype == torch.int64
    assert torch.equal(y, torch.arange(3).repeat_interleave(10))
    for k in range(3):  # each class spans exactly a subspace_dim-dimensional subspace of the latent space
        assert torch.linalg.matrix_rank(latent[y == k]) == 2
    torch.testing.assert_close(latent.norm(dim=1), torch.ones(30, dtype=torch.float64))
    again, _, _ = make_multiview_subspaces(n_per_class=10, n_classes=3, latent_dim=6, subspace_dim=2,
                                           view_dims=(4, 9, 5), seed=3, dtype=torch.float64)
    for a, b in zip(views, again):
        assert torch.equal(a, b)
    other, _, _ = make_multiview_subspaces(n_per_class=10, n_classes=3, latent_dim=6, subspace_dim=2,
                                           view_dims=(4, 9, 5), seed=4, dtype=torch.float64)
    assert not torch.equal(views[0], other[0])


def test_multiview_subspaces_bad_inputs():
    with pytest.raises(ValueError, match="subspace_dim"):
        make_multiview_subspaces(latent_dim=3, subspace_dim=4)
    with pytest.raises(ValueError, match="view_dims"):
        make_multiview_subspaces(view_dims=())
    with pytest.raises(ValueError, match="view_dims"):
        make_multiview_subspaces(view_dims=(3, 0))
    with pytest.raises(ValueError, match="noise"):
        make_multiview_subspaces(noise=-1.0)
    with pytest.raises(ValueError, match="nonlinearity"):
        make_multiview_subspaces(nonlinearity=0.0)
    with pytest.raises(ValueError, match="n_per_class"):
        make_multiview_subspaces(n_per_class=1)


def test_digits_views():
    views, y = make_digits_views(n_per_class=5, seed=0, dtype=torch.float64)
    assert [v.shape for v in views] == [(50, 64), (50, 96)]
    assert torch.equal(torch.bincount(y), torch.full((10,), 5))
    assert float(views[0].min()) >= 0 and float(views[0].max()) <= 1
    cells = views[1].reshape(50, 16, 6).norm(dim=2)  # every cell histogram has norm 1 (or 0: a flat cell)
    assert bool(((cells - 1).abs() < 1e-9).logical_or(cells == 0).all())
    with pytest.raises(ValueError, match="n_per_class"):
        make_digits_views(n_per_class=500)


def test_standardize_views():
    views = standardize_views(small_views(dims=(3, 4)))
    for x in views:
        torch.testing.assert_close(x.mean(0), torch.zeros(x.shape[1], dtype=x.dtype))
        torch.testing.assert_close(x.pow(2).sum(1).mean(), torch.tensor(1.0, dtype=x.dtype))


# --- the graph ---------------------------------------------------------------------------------
def test_forward_shapes_and_graph_properties(device):
    views = small_views(device=device)
    out = model_for(views, init_scale=30.0)(views)
    n = 18
    a = out["graph"]
    assert a.shape == (n, n) and a.device.type == device.type
    assert out["omega"].shape == (n,) and out["hidden"].shape == (n, 8)
    assert [c.shape for c in out["codes"]] == [(n, 8), (n, 8)]
    assert [r.shape for r in out["recon"]] == [(n, 5), (n, 7)]
    assert bool((a >= 0).all())
    torch.testing.assert_close(a.sum(1), torch.ones(n, dtype=a.dtype, device=device))
    assert bool((torch.diagonal(a) == 0).all())                       # zero diagonal, exactly
    assert int((a == 0).sum()) > 2 * n                                # exact zeros off the diagonal
    assert bool(((out["omega"] >= 0) & (out["omega"] <= 1)).all())
    for z in out["codes"]:
        torch.testing.assert_close(z.norm(dim=1), torch.ones(n, dtype=z.dtype, device=device))


def test_graph_equals_reference_entmax_of_scores():
    views = small_views()
    model = model_for(views)
    out = model(views)
    s = out["scores"]
    assert bool(torch.isinf(torch.diagonal(s)).all()) and not bool(torch.isinf(s).sum() > 18)
    finite = s.masked_fill(torch.eye(18, dtype=torch.bool), -1e6)  # the reference package needs finite input
    torch.testing.assert_close(out["graph"], ref_entmax15(finite, dim=1))


def test_scores_are_bilinear_asymmetric_and_gated():
    views = small_views()
    model = model_for(views)
    out = model(views)
    z = [torch.nn.functional.normalize(enc(x), dim=1) for enc, x in zip(model.encoders, views)]
    raw = sum((zv @ u) @ (zv @ v).T for zv, u, v in zip(z, model.U, model.V)) / (2 * math.sqrt(8))
    gated = raw * (1 + model.gate_strength * out["omega"])[:, None]
    off = ~torch.eye(18, dtype=torch.bool)
    torch.testing.assert_close(out["scores"][off], gated[off])
    with torch.no_grad():
        model.U[0].add_(0.1 * torch.randn(8, 8, dtype=torch.float64))
    s = model(views)["scores"]
    assert not torch.allclose(s[off], s.T[off])                      # directed: S_ij != S_ji


def test_residual_aggregation():
    views = small_views()
    model = model_for(views)
    out = model(views)
    zbar = torch.stack(out["codes"]).mean(0)
    torch.testing.assert_close(out["hidden"], zbar + out["graph"] @ (zbar @ model.W.weight.T))


def test_ablations():
    views = small_views()
    dense = model_for(views, graph="softmax")(views)["graph"]
    off = ~torch.eye(18, dtype=torch.bool)
    assert bool((dense[off] > 0).all()) and bool((torch.diagonal(dense) == 0).all())
    torch.testing.assert_close(dense.sum(1), torch.ones(18, dtype=torch.float64))
    ident = model_for(views, graph="identity")(views)
    assert torch.equal(ident["graph"], torch.eye(18, dtype=torch.float64))
    _, se, _ = sagl_loss(ident, standardize_views(views))
    assert float(se) == 0.0
    nogate = model_for(views, gate=False)(views)
    assert bool((nogate["omega"] == 0).all())


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 12), st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(0, 10**6),
       st.floats(0.5, 200.0))
def test_rows_on_simplex_property(n, dims, seed, scale):
    views = small_views(n=n, dims=dims, seed=seed)
    a = model_for(views, init_scale=scale)(views)["graph"]
    assert bool((a >= 0).all()) and bool((torch.diagonal(a) == 0).all())
    torch.testing.assert_close(a.sum(1), torch.ones(n, dtype=torch.float64))


def test_gradients_are_finite_everywhere():
    views = standardize_views(small_views())
    model = model_for(views)
    total, _, _ = sagl_loss(model(views), views)
    total.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
    assert float(model.gate[0].weight.grad.abs().sum()) > 0          # the gate learns


def test_loss_matches_formula():
    views = standardize_views(small_views())
    out = model_for(views)(views)
    total, se, rec = sagl_loss(out, views, reconstruction_weight=0.3)
    a = out["graph"]
    se_ref = sum(((x - a @ x) ** 2).sum() / (x ** 2).sum() for x in views)
    rec_ref = sum(((x - r) ** 2).sum() / (x ** 2).sum() for x, r in zip(views, out["recon"]))
    torch.testing.assert_close(se, se_ref)
    torch.testing.assert_close(total, se_ref + 0.3 * rec_ref)


# --- training and read-out ---------------------------------------------------------------------
def test_fit_is_seeded_learns_and_leaves_global_rng_alone():
    views = small_views(n=20)
    state = torch.get_rng_state()
    r1 = fit_sagl(views, n_steps=15, seed=5, latent_dim=8, hidden_dim=16)
    assert torch.equal(state, torch.get_rng_state())
    r2 = fit_sagl(views, n_steps=15, seed=5, latent_dim=8, hidden_dim=16)
    assert torch.equal(r1.graph, r2.graph)
    assert len(r1.losses) == 15 and r1.losses[-1] < r1.losses[0]
    assert r1.graph.dtype == torch.float64 and not r1.graph.requires_grad


def test_spectral_readout_recovers_blocks(device):
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    a = (y[:, None] == y[None, :]).double().to(device)
    a.fill_diagonal_(0)
    a = a / a.sum(1, keepdim=True)
    a[0, 3] = 0.05  # a little cross-block leak
    labels = spectral_readout(a, 3, seed=0)
    assert labels.device.type == device.type and labels.dtype == torch.int64
    assert clustering_accuracy(y, labels.cpu()) == 1.0


def test_sagl_cluster_separates_easy_subspaces():
    views, y, _ = make_multiview_subspaces(n_per_class=15, n_classes=3, latent_dim=9, subspace_dim=2,
                                           view_dims=(8, 10), noise=0.01, nonlinearity=0.5, seed=0)
    res = sagl_cluster(views, 3, seed=0, n_steps=40, latent_dim=16, hidden_dim=32)
    assert res.labels.shape == (45,)
    assert clustering_accuracy(y, res.labels) >= 0.9
    ident = sagl_cluster(views, 3, seed=0, n_steps=5, graph="identity", latent_dim=8, hidden_dim=16)
    assert ident.labels.shape == (45,)


# --- bad inputs --------------------------------------------------------------------------------
def test_bad_inputs():
    views = small_views()
    with pytest.raises(ValueError, match="graph"):
        SparseAttentionGraph([5, 7], graph="dense")
    with pytest.raises(TypeError, match="gate"):
        SparseAttentionGraph([5, 7], gate="yes")
    with pytest.raises(ValueError, match="view_dims"):
        SparseAttentionGraph([])
    with pytest.raises(ValueError, match="latent_dim"):
        SparseAttentionGraph([5], latent_dim=0)
    model = model_for(views)
    with pytest.raises(ValueError, match="features but the model expects"):
        model(small_views(dims=(5, 6)))
    with pytest.raises(ValueError, match=r"views\[1\] has 10 rows"):
        model([views[0], views[1][:10]])
    with pytest.raises(TypeError, match="views"):
        fit_sagl(torch.ones(4, 3))
    bad = [views[0].clone(), views[1]]
    bad[0][0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"views\[0\] contains"):
        fit_sagl(bad)
    with pytest.raises(ValueError, match="at least 2 samples"):
        fit_sagl([torch.ones(1, 3)])
    with pytest.raises(ValueError, match="n_steps"):
        fit_sagl(views, n_steps=0)
    with pytest.raises(ValueError, match="n_clusters"):
        spectral_readout(torch.eye(3), 4)
    with pytest.raises(ValueError, match="graph.*square"):
        spectral_readout(torch.ones(3, 2), 2)
    with pytest.raises(ValueError, match="n_clusters"):
        sagl_cluster(views, 0)
