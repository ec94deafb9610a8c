"""The SAGL study of chapter 9 as code: its data sets, its training protocol, and every method,
ablation and intervention scored on one draw (:func:`compare_graphs`). The chapter runs it live
on small data; ``reproductions/sagl.py`` runs it on every data set and ten seeds and stores
the results (:func:`localbook.datasets.load_stored_run`), so both follow one protocol."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from ._validate import check_choice
from .datasets import make_digits_views, make_fashion_views, make_multiview_subspaces
from .metrics import ari, clustering_accuracy, nmi, subspace_preserving_rate
from .sagl import SparseAttentionGraph, effective_neighbours, sagl_loss
from .sagl_fit import sagl_cluster
from .sagl_graphs import (
    candidate_neighbours,
    dense_attention_graph,
    entmax_distance_graph,
    fused_knn_graph,
    knn_graph,
    lsr_graph,
    reduce_views,
    self_expression_graph,
    spectral_readout,
    standardize_views,
)

__all__ = [
    "STUDY_DATASETS",
    "STUDY_FIT",
    "STUDY_ABLATIONS",
    "make_study_data",
    "score_labels",
    "compare_graphs",
]

#: the data sets: a description and the number of clusters
STUDY_DATASETS = {
    "syn": ("union of 4 subspaces, 2 nonlinear views (30, 50 features), 240 points", 4),
    "dig": ("digits: pixels + gradient histograms (64, 96 features), 300 points", 10),
    "fm": (
        "Fashion-MNIST test images: 3 views reduced to 50 components, 1,000 points",
        10,
    ),
}
#: the training protocol of every SAGL variant (the library's defaults, stated)
STUDY_FIT = dict(
    latent_dim=16, hidden_dim=32, lr=1e-2, max_steps=400, window=20, tol=0.002
)
#: the paper's ablations and the one-shared-graph reading, each a change to the full model
STUDY_ABLATIONS = {
    "dense softmax": dict(graph="softmax"),
    "no gate (ω ≡ ½)": dict(gate=False),
    "one shared graph": dict(shared=True),
}


def make_study_data(name: str, seed: int):
    """The views (float32) and labels of data set ``name`` drawn with ``seed``."""
    name = check_choice(name, "name", list(STUDY_DATASETS))
    if name == "syn":
        views, y, _ = make_multiview_subspaces(
            n_per_class=60,
            n_classes=4,
            view_dims=(30, 50),
            noise=0.2,
            seed=seed,
            dtype=torch.float32,
        )
        return views, y
    if name == "dig":
        return make_digits_views(n_per_class=30, seed=seed, dtype=torch.float32)
    views, y = make_fashion_views(n_per_class=100, seed=seed, dtype=torch.float32)
    return reduce_views(views, 50), y


def score_labels(y, labels, graph=None) -> dict:
    """ACC, NMI and ARI of ``labels``; with a graph, its subspace-preserving rate ``rho``,
    effective neighbours and support size per row (means over rows)."""
    out = {
        "ACC": clustering_accuracy(y, labels),
        "NMI": nmi(y, labels),
        "ARI": ari(y, labels),
    }
    if graph is not None:
        out["rho"] = subspace_preserving_rate(graph, y)
        out["neighbours"] = float(effective_neighbours(graph).mean())
        out["support"] = float((graph > 0).sum(1).double().mean())
    return out


def _gate_rows(res, name: str, seed: int) -> list:
    """Quantiles of ω per view at initialization and after training, the shares at the ends,
    and the Spearman correlation of ω with the distance to the 10th nearest point."""
    rows = []
    qs = [0.05, 0.25, 0.5, 0.75, 0.95]
    for v, x in enumerate(res.views):
        r10 = candidate_neighbours([x], 10)[0][:, -1]
        for stage, om in [("init", res.omega_init[v]), ("trained", res.omega[v])]:
            ranks = torch.stack([om.argsort().argsort(), r10.argsort().argsort()])
            rows.append(
                {
                    "dataset": name,
                    "seed": seed,
                    "view": v,
                    "stage": stage,
                    **{
                        f"q{int(100 * p):02d}": float(q)
                        for p, q in zip(qs, np.quantile(om.numpy(), qs))
                    },
                    "below_0.05": float((om < 0.05).double().mean()),
                    "above_0.95": float((om > 0.95).double().mean()),
                    "spearman_density": float(torch.corrcoef(ranks.double())[0, 1]),
                }
            )
    return rows


def compare_graphs(
    views,
    y,
    n_clusters: int,
    seed: int,
    *,
    name: str = "data",
    ablations: bool = True,
    long_training: bool = False,
    curve_every: Optional[int] = None,
):
    """Every method of the study on one draw, each read out by :func:`~localbook.spectral_readout`.

    Baselines: k-means on the concatenated views (the floor), the ``k``-NN graph (``k`` = 5,
    10, 20), the fused per-view 10-NN graph, untrained entmax over distances, untrained dense
    attention, untrained SAGL (step 0), LSR, and the self-expression optimum. SAGL (fused
    graph; fused representations from the same fit), its interventions (``β`` × ½ and × 2,
    every ``ω`` held at 0 and at 1) and, with ``ablations``, the identity graph, dense
    softmax, no gate and one shared graph; with ``long_training``, SAGL trained 1,000 steps
    without the stopping rule. ``curve_every``: score the SAGL graph every so many steps.
    Returns ``(rows, gate_rows, curve, sagl)``: lists of dicts (one row per method; the
    gate's quantiles per view; the training loss per step, and with ``curve_every`` the
    scores every so many steps) and the :class:`~localbook.SAGLResult` of SAGL.
    """
    from sklearn.cluster import KMeans

    K = n_clusters
    rows = []

    def add(method, labels, graph=None, **extra):
        rows.append(
            {
                "dataset": name,
                "seed": seed,
                "method": method,
                **score_labels(y, labels, graph),
                **extra,
            }
        )

    def read(graph):
        return spectral_readout(graph, K, seed=seed)

    x = torch.cat(standardize_views(views), 1).numpy()
    km = KMeans(K, n_init=10, random_state=seed).fit(x).labels_
    add("k-means (floor)", torch.as_tensor(km))
    graphs = {f"k-NN graph (k = {k})": knn_graph(views, k) for k in (5, 10, 20)}
    graphs["k-NN per view, fused (k = 10)"] = fused_knn_graph(views, 10)
    graphs["untrained entmax (distances)"] = entmax_distance_graph(views, 10, 30)
    graphs["untrained dense attention"] = dense_attention_graph(views)
    graphs["LSR"] = lsr_graph(views, 0.1)
    graphs["self-expression optimum"] = self_expression_graph(views, 60)
    for method, a in graphs.items():
        add(method, read(a), a)

    every = curve_every or 10**9

    def track(step, out):
        a = torch.stack(SparseAttentionGraph.dense(out)).mean(0).detach()
        point = {"step": step, "graph": a if step == 0 else None}
        if curve_every:
            point.update(score_labels(y, read(a), a))
        return point

    t0 = time.perf_counter()
    res = sagl_cluster(
        views, K, seed=seed, callback=track, callback_every=every, **STUDY_FIT
    )
    secs = time.perf_counter() - t0
    with torch.no_grad():
        se = float(sagl_loss(res.model(res.views, res.index), res.views)[1])
    untrained = res.history[0]["graph"]
    add("untrained SAGL (step 0)", read(untrained), untrained)
    add(
        "SAGL",
        res.labels,
        res.graph,
        steps=res.n_steps,
        seconds=secs,
        self_expression=se,
        beta=float(res.beta.mean()),
    )
    add(
        "SAGL, representations fused",
        read(knn_graph([res.hidden], 10)),
        steps=res.n_steps,
    )
    for method, kw in [
        ("SAGL, β × ½ (wider)", dict(beta_scale=0.5)),
        ("SAGL, β × 2 (narrower)", dict(beta_scale=2.0)),
        ("SAGL, every ω = 0", dict(omega=0.0)),
        ("SAGL, every ω = 1", dict(omega=1.0)),
    ]:
        a = res.regraph(**kw)
        add(method, read(a), a)
    if ablations:
        ident = sagl_cluster(
            views, K, seed=seed, graph="identity", fusion="representations", **STUDY_FIT
        )
        add("identity graph (ablation)", ident.labels, steps=ident.n_steps)
        for method, kw in STUDY_ABLATIONS.items():
            r = sagl_cluster(views, K, seed=seed, **STUDY_FIT, **kw)
            add(method, r.labels, r.graph, steps=r.n_steps)
    if long_training:
        # the stopping rule off: its window as long as the run
        fit = {**STUDY_FIT, "max_steps": 1000, "window": 1000}
        r = sagl_cluster(views, K, seed=seed, **fit)
        add("SAGL, 1,000 steps", r.labels, r.graph, steps=r.n_steps)
    curve = [
        {"dataset": name, "seed": seed, "step": t + 1, "loss": loss}
        for t, loss in enumerate(res.losses)
    ]
    for h in res.history if curve_every else []:
        curve.append(
            {
                "dataset": name,
                "seed": seed,
                **{k: v for k, v in h.items() if k != "graph"},
            }
        )
    return rows, _gate_rows(res, name, seed), curve, res
