r"""Multi-view data and graphs built without training: the baselines and the read-out of
chapter 9.

Views ``X⁽ˡ⁾ (n, d_l)`` of the same ``n`` samples are standardized (:func:`standardize_views`)
or reduced to principal components (:func:`reduce_views`); :func:`candidate_neighbours` gives
each point its ``m`` nearest neighbours in the concatenated views. Baselines with the same
read-out as the learned graph (:mod:`localbook.sagl`): :func:`knn_graph` (concatenated views),
:func:`fused_knn_graph` (one per view, averaged), :func:`entmax_distance_graph` (untrained
1.5-entmax over squared distances), :func:`dense_attention_graph` (untrained dense attention)
and :func:`lsr_graph` (least-squares self-expression, Lu et al. 2012).
:func:`self_expression_graph` is the self-expression term's exact optimum without a network
(a diagnostic). The read-out (:func:`spectral_readout`) is normalized spectral clustering of
``W = (|A| + |A|ᵀ)/2``; graphs are dense ``(n, n)`` tensors (sparse in their values), for ``n``
up to a few thousand points.
"""

from __future__ import annotations

import math
import warnings
from typing import List

import torch

from ._validate import (
    as_tensor,
    check_positive_float,
    check_positive_int,
    check_views,
    compute_dtype,
)
from .entmax import entmax15

__all__ = [
    "standardize_views",
    "reduce_views",
    "candidate_neighbours",
    "knn_graph",
    "fused_knn_graph",
    "dense_attention_graph",
    "entmax_distance_graph",
    "lsr_coefficients",
    "lsr_graph",
    "self_expression_graph",
    "spectral_readout",
]


def standardize_views(views) -> List[torch.Tensor]:
    """Centre each feature and scale each view to unit mean squared row norm (``(n, d_v)`` each)."""
    views = check_views(views)
    out = []
    for x in views:
        x = x - x.mean(0)
        out.append(
            x / x.pow(2).sum(1).mean().sqrt().clamp(min=torch.finfo(x.dtype).tiny)
        )
    return out


def reduce_views(views, dim: int = 50) -> List[torch.Tensor]:
    """Project each view onto its ``dim`` leading principal components (views with at most
    ``dim`` features are only centred). A cost saver for wide views: distances within a view
    change only by the discarded variance. Returns a list of ``(n, min(d_v, dim))`` tensors."""
    views = check_views(views)
    dim = check_positive_int(dim, "dim")
    out = []
    for x in views:
        xc = x - x.mean(0)
        if x.shape[1] <= dim:
            out.append(xc)
            continue
        c = compute_dtype(x.dtype)  # no SVD in half precision
        _, _, vt = torch.linalg.svd(xc.to(c), full_matrices=False)
        out.append((xc.to(c) @ vt[:dim].T).to(x.dtype))
    return out


def _concat(views) -> torch.Tensor:
    return torch.cat(standardize_views(views), dim=1)


def candidate_neighbours(views, m: int):
    """The ``m`` nearest other points of each point in the concatenated standardized views.

    Returns ``(dist (n, m), index (n, m))``, nearest first; a point is never its own candidate.
    """
    x = _concat(views)
    n = x.shape[0]
    m = check_positive_int(m, "m", maximum=n - 1)
    xc = x.to(compute_dtype(x.dtype))  # no cdist in half precision
    d = torch.cdist(xc, xc)
    d.fill_diagonal_(math.inf)
    dist, index = d.topk(m, dim=1, largest=False)
    return dist.to(x.dtype), index


def _scatter_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Dense ``(n, n)`` graph with ``A[i, index[i, j]] = values[i, j]``."""
    n = values.shape[0]
    return values.new_zeros(n, n).scatter(1, index, values)


def knn_graph(views, k: int = 10) -> torch.Tensor:
    """Row ``i`` puts weight ``1/k`` on its ``k`` nearest points (concatenated standardized
    views). Returns a dense ``(n, n)`` graph."""
    x = _concat(views)
    k = check_positive_int(k, "k", maximum=x.shape[0] - 1)
    _, idx = candidate_neighbours(views, k)
    return _scatter_rows(torch.full(idx.shape, 1.0 / k, dtype=x.dtype), idx)


def fused_knn_graph(views, k: int = 10) -> torch.Tensor:
    """The mean over views of each view's own ``k``-NN graph (:func:`knn_graph` of one
    standardized view): row ``i`` puts ``1/(kL)`` on each of its ``k`` nearest points in
    each of the ``L`` views. Returns a dense ``(n, n)`` graph."""
    return torch.stack([knn_graph([x], k) for x in check_views(views)]).mean(0)


def dense_attention_graph(views, temperature: float = 1.0) -> torch.Tensor:
    r"""Untrained dense attention, one graph per view and averaged:
    ``A⁽ˡ⁾ = softmax(X⁽ˡ⁾X⁽ˡ⁾ᵀ·√d_l/τ)`` over every other point (no self-loops), on the
    standardized views (mean squared row norm 1, so the scores are multiplied by ``√d_l``
    back to the unit-variance scale of scaled dot-product attention). Returns ``(n, n)``."""
    temperature = check_positive_float(temperature, "temperature")
    out = []
    for x in standardize_views(views):
        d = x.shape[1]
        s = (x @ x.T) * (d / math.sqrt(d) / temperature)
        out.append(s.fill_diagonal_(-math.inf).softmax(1))
    return torch.stack(out).mean(0)


def entmax_distance_graph(views, k: int = 10, m: int = 30) -> torch.Tensor:
    r"""Untrained 1.5-entmax over squared distances: ``Aᵢ = entmax₁.₅(−|xᵢ − xⱼ|²/h²ᵢ)``.

    Rows range over the ``m`` nearest candidates; ``hᵢ`` is the distance to the ``k``-th
    nearest point (a per-point bandwidth, no training). In the Gaussian convention
    ``−d²/(2h²)`` of chapter 8 the bandwidth is ``hᵢ/√2``. Returns a dense ``(n, n)`` graph.
    """
    d, idx = candidate_neighbours(views, m)
    k = check_positive_int(k, "k", maximum=d.shape[1])
    h2 = d[:, k - 1 : k].pow(2).clamp(min=torch.finfo(d.dtype).tiny)
    return _scatter_rows(entmax15(-d.pow(2) / h2, dim=1), idx)


def lsr_coefficients(x, lam: float) -> torch.Tensor:
    r"""Least-squares-regression self-expression with zero diagonal (Lu et al. 2012, LSR1).

    Solves ``min_C ‖X − CX‖²_F + λ‖C‖²_F`` s.t. ``diag(C) = 0`` for ``x (n, d)`` (rows are
    points): with ``D = (XXᵀ + λI)⁻¹``, ``C = I − D diag(D)⁻¹`` transposed to rows,
    ``Cᵢⱼ = −Dᵢⱼ/Dᵢᵢ`` (``i ≠ j``). ``D`` is formed with the Woodbury identity,
    ``D = (I − X(λI + XᵀX)⁻¹Xᵀ)/λ``, so the cost is ``O(n²d)``. Returns ``C (n, n)``.
    """
    x = as_tensor(x, "x", ndim=(2,)).double()
    lam = check_positive_float(lam, "lam")
    n, d = x.shape
    inner = torch.linalg.solve(lam * torch.eye(d, dtype=x.dtype) + x.T @ x, x.T)
    dmat = (torch.eye(n, dtype=x.dtype) - x @ inner) / lam
    c = -dmat / torch.diagonal(dmat)[:, None]
    return c.fill_diagonal_(0.0)


def lsr_graph(views, lam: float = 0.1) -> torch.Tensor:
    """LSR graph ``|C|`` on the concatenated standardized views; ``lam`` is relative to the
    mean squared row norm (``λ = lam · mean|xᵢ|²``). Returns a dense ``(n, n)`` graph."""
    x = _concat(views)
    lam = check_positive_float(lam, "lam") * float(x.pow(2).sum(1).mean())
    return lsr_coefficients(x, lam).abs().to(x.dtype)


def self_expression_graph(
    views, m: int = 60, n_iter: int = 20000, tol: float = 1e-7
) -> torch.Tensor:
    r"""The minimizer of SAGL's self-expression term without a network: per view and row,
    ``min_{aᵢ ∈ Δ} ½‖xᵢ − Σⱼ aᵢⱼ xⱼ‖²`` over the ``m`` nearest other points of the view (a
    convex quadratic program), then the mean over views. ``(n, n)``.

    Solved by accelerated projected gradient (FISTA with gradient restarts; step ``1/λ_max``
    of each row's Gram matrix, :func:`~localbook.sparsemax` as the Euclidean projection onto
    the simplex) until every row's Frank–Wolfe gap ``gᵀa − minⱼ gⱼ`` (``g`` the gradient), an
    upper bound on its distance to the optimal value, is below ``tol·|xᵢ|²`` (checked every
    10 steps); a ``RuntimeWarning`` if ``n_iter`` steps do not get there."""
    from .entmax import sparsemax

    xs = standardize_views(views)
    n_iter = check_positive_int(n_iter, "n_iter")
    tol = check_positive_float(tol, "tol")
    graphs = []
    for x in xs:
        x = x.double()
        m_v = check_positive_int(m, "m", maximum=x.shape[0] - 1)
        idx = candidate_neighbours([x], m_v)[1]
        nb = x[idx]  # (n, m, d)
        gram = nb @ nb.transpose(1, 2)
        b = (nb @ x[:, :, None])[:, :, 0]
        scale = x.pow(2).sum(1).clamp(min=torch.finfo(x.dtype).tiny)
        step = 1 / torch.linalg.eigvalsh(gram)[:, -1:].clamp(min=1e-12)

        def grad(a):
            # aᵀG for Ga (G is symmetric): a row-times-matrix product per row, 4-5 times
            # faster than the batched matrix-times-vector alone, 1.3 times inside this loop
            # (reading G from memory dominates there; measured at 300 × 60 × 60)
            return (a[:, None, :] @ gram)[:, 0, :] - b

        a = torch.full(idx.shape, 1.0 / m_v, dtype=x.dtype)
        y, t = a, torch.ones(a.shape[0], 1, dtype=x.dtype)
        for it in range(n_iter):  # iterations of a solver, not a loop over points
            new = sparsemax(y - step * grad(y), dim=1)
            # restart the momentum of rows whose step went uphill (O'Donoghue & Candès)
            up = ((y - new) * (new - a)).sum(1, keepdim=True) > 0
            t_new = (1 + torch.sqrt(1 + 4 * t * t)) / 2
            y = torch.where(up, new, new + ((t - 1) / t_new) * (new - a))
            t = torch.where(up, torch.ones_like(t), t_new)
            a = new
            if it % 10 == 9:
                g = grad(a)
                if bool(((g * a).sum(1) - g.min(1).values <= tol * scale).all()):
                    break
        else:
            warnings.warn(
                f"self_expression_graph: {n_iter} steps left some rows above the gap "
                f"tolerance {tol}; raise n_iter",
                RuntimeWarning,
                stacklevel=2,
            )
        graphs.append(_scatter_rows(a, idx))
    return torch.stack(graphs).mean(0).to(xs[0].dtype)


def _normalized_affinity(a: torch.Tensor, dense: bool):
    """``D^{-1/2} W D^{-1/2}`` with ``W = (|A| + |A|ᵀ)/2`` in float64 (``|A_ij| + |A_ji|`` in
    ``A``'s dtype, as a dense sum rounds it; isolated nodes keep zero rows): a dense CPU tensor,
    or with ``dense=False`` a SciPy CSR matrix built from ``A``'s nonzero entries only (the
    same numbers; 10-20 ms instead of 60-130 at n = 2,000 with 20 neighbours per row)."""
    import numpy as np
    import scipy.sparse as sp

    if dense:
        w = ((a.abs() + a.abs().T) / 2).double().cpu()
        deg = w.sum(1)
        inv = torch.where(deg > 0, deg.clamp(min=1e-300).rsqrt(), torch.zeros_like(deg))
        return inv[:, None] * w * inv[None, :]
    n = a.shape[0]
    if a.dtype not in (torch.float32, torch.float64):  # NumPy and SciPy lack these
        a = a.double()
    nz = a.nonzero()
    r, c = nz[:, 0].cpu().numpy(), nz[:, 1].cpu().numpy()
    v = a[nz[:, 0], nz[:, 1]].abs().cpu().numpy()
    w = sp.coo_matrix(
        (np.concatenate([v, v]), (np.concatenate([r, c]), np.concatenate([c, r]))),
        shape=(n, n),
    ).tocsr()  # duplicates (i, j) summed: |A_ij| + |A_ji|
    w = (w / 2).astype(np.float64)
    deg = np.asarray(w.sum(1)).ravel()
    inv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-300)), 0.0)
    return (sp.diags(inv) @ w @ sp.diags(inv)).tocsr()


def spectral_readout(graph, n_clusters: int, seed: int = 0) -> torch.Tensor:
    r"""Normalized spectral clustering of the symmetrized graph ``W = (|A| + |A|ᵀ)/2``.

    Embeds each node by the ``n_clusters`` leading eigenvectors of ``D^{-1/2} W D^{-1/2}``
    (``D`` = degrees; isolated nodes keep a zero row), normalizes the rows
    (Ng–Jordan–Weiss) and runs k-means (scikit-learn, 10 restarts, ``random_state=seed``).
    Up to 300 nodes the eigenvectors come from a dense solver, beyond from Lanczos
    (``scipy.sparse.linalg.eigsh``, start vector drawn from ``seed``). ``graph (n, n)`` →
    labels ``(n,)`` (int64, on the graph's device).
    """
    import numpy as np
    from scipy.sparse.linalg import eigsh
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    a = as_tensor(graph, "graph", ndim=(2,)).detach()
    if a.shape[0] != a.shape[1]:
        raise ValueError(
            f"graph must be a square (n, n) matrix, got shape {tuple(a.shape)}"
        )
    n = a.shape[0]
    k = check_positive_int(n_clusters, "n_clusters", maximum=n)
    dense = n <= 300 or k >= n - 1
    m = _normalized_affinity(a, dense)
    with threadpool_limits(1):  # small problems: threads only add contention
        if dense:
            emb = torch.linalg.eigh(m)[1][:, -k:].numpy()
        else:
            v0 = np.random.default_rng(int(seed)).standard_normal(n)
            emb = eigsh(m, k=k, which="LA", v0=v0, tol=1e-8)[1]
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        km = KMeans(n_clusters=k, n_init=10, random_state=int(seed)).fit(emb)
    return torch.as_tensor(km.labels_, dtype=torch.int64, device=a.device)
