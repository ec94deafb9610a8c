r"""Embeddings as local means: LLE, asymmetric MDS, and triplet (hyperkernel) embeddings.

* **LLE** (Roweis & Saul 2000). Each point is an *affine local mean* of its ``k`` nearest
  neighbours, :math:`x_i \approx \sum_j w_{ij} x_j` with :math:`\sum_j w_{ij} = 1`; the weights
  solve :math:`C w = \mathbf 1` (``C`` the regularized local Gram matrix) and are rescaled to sum to
  one. The embedding keeps the same weights: the bottom eigenvectors of
  :math:`M = (I - W)^\top (I - W)` after the constant one.
* **Asymmetric MDS** (radius model): :math:`\delta_{ij} \approx \lVert x_i - x_j\rVert + r_j - r_i`.
  The symmetric part of ``δ`` fixes the positions, the skew-symmetric part the radii, in closed form.
* **Triplet embeddings** (TriMap, ordinal embedding) are in :mod:`localbook.triplets`, re-exported
  here.
* **Trustworthiness** and **continuity** (Venna & Kaski 2001) score any map by how many of each
  point's map neighbours are far in the data, and how many of its data neighbours are far in the
  map, at one or several neighbourhood sizes, with the distances formed in row chunks.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from ._validate import as_tensor, check_choice, check_indices, check_points
from ._validate import check_positive_float, check_positive_int, check_positive_ints
from ._validate import compute_dtype
from .kernels import (
    _augment_data,
    _sq_dist_augmented,
    chunk_rows,
    data_center,
    iter_chunks,
)

__all__ = [
    "lle_weights",
    "lle_weight_matrix",
    "locally_linear_embedding",
    "classical_mds",
    "AsymmetricMDS",
    "asymmetric_mds",
    "trustworthiness",
    "continuity",
    "trustworthiness_continuity",
    "NeighborhoodScores",
]


class _Distances:
    """Squared distances from chosen rows of ``x`` to all of ``x``, one fused matrix product
    per call (the data side is built once), each row's distance to its own point set to
    ``inf``."""

    def __init__(self, x: torch.Tensor):
        self.x = x
        self.h = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
        self.center = data_center(x)
        self.bb = _augment_data(x, self.h, self.center)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        d2 = _sq_dist_augmented(self.x[ids], self.bb, self.h, self.center)
        d2[torch.arange(len(ids), device=d2.device), ids] = float("inf")
        return d2


def _sq_dist_rows(x: torch.Tensor, rows: Optional[torch.Tensor] = None, width: int = 1):
    """Yield ``(sl, d2)``: squared distances ``d2 (r, n)`` from the points ``rows[sl]`` (all
    points when ``rows`` is None) to all of ``x``, in row chunks under the memory budget
    (``width`` such matrices alive at once), each point's distance to itself ``inf``."""
    n = x.shape[0]
    rows = torch.arange(n, device=x.device) if rows is None else rows
    dist = _Distances(x)
    step = chunk_rows(len(rows), n, width, x.element_size(), None, x.device)
    for sl in iter_chunks(len(rows), step):
        yield sl, dist.rows(rows[sl])


def _knn_self(x: torch.Tensor, k: int):
    """``(d2, idx)``: squared distances and indices ``(n, k)`` of each point's ``k`` nearest other
    points (the point itself excluded, also when it has duplicates), ascending."""
    n = x.shape[0]
    d2_out = torch.empty(n, k, dtype=x.dtype, device=x.device)
    idx = torch.empty(n, k, dtype=torch.long, device=x.device)
    for sl, d2 in _sq_dist_rows(x):
        d2_out[sl], idx[sl] = torch.topk(d2, k, dim=1, largest=False)
    return d2_out, idx


def _row_sq_dist(x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``|x[r] − x[cols[r, c]]|² (n, L)`` for ``cols (n, L)``: each row's distances to ``L`` other
    points, from the differences, in row chunks under the memory budget (one gather per chunk)."""
    n, L = cols.shape
    out = torch.empty(n, L, dtype=x.dtype, device=x.device)
    rows = chunk_rows(n, L * x.shape[1], 1, x.element_size(), None, x.device)
    for sl in iter_chunks(n, rows):
        diff = (
            x.index_select(0, cols[sl].reshape(-1)).view(-1, L, x.shape[1])
            - x[sl, None, :]
        )
        out[sl] = (diff * diff).sum(2)
    return out


# --- LLE ---------------------------------------------------------------------------------------
def lle_weights(x, n_neighbors: int = 10, reg: float = 1e-3):
    r"""LLE reconstruction weights: each point as an affine local mean of its nearest neighbours.

    For point ``i`` with neighbours :math:`N_k(i)` (itself excluded), :math:`G = (x_j - x_i)_{j}`
    ``(k, d)``, :math:`C = G G^\top + \varepsilon I` with :math:`\varepsilon = \text{reg}\cdot
    \operatorname{tr}(G G^\top)` (``reg`` when the trace is 0), the weights are
    :math:`w = C^{-1}\mathbf 1 / (\mathbf 1^\top C^{-1}\mathbf 1)`: the minimizer of
    :math:`\lVert x_i - \sum_j w_j x_j\rVert^2 + \varepsilon\lVert w\rVert^2` subject to
    :math:`\sum_j w_j = 1` (scikit-learn's ``barycenter_weights``). ``x (n, d)``; returns
    ``weights (n, k)`` (rows sum to one; entries may be negative) and ``indices (n, k)``.
    """
    x = check_points(x, "x")
    out_dtype, x = x.dtype, x.to(compute_dtype(x.dtype))  # no solve in half precision
    n = x.shape[0]
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=n - 1) if n > 1 else None
    if k is None:
        raise ValueError("x needs at least two points for LLE")
    reg = check_positive_float(reg, "reg", allow_zero=True)
    idx = _knn_self(x, k)[1]  # the point itself excluded
    w = torch.empty(n, k, dtype=x.dtype, device=x.device)
    rows = chunk_rows(n, k * (x.shape[1] + k), 1, x.element_size(), None, x.device)
    for sl in iter_chunks(n, rows):
        G = x[idx[sl]] - x[sl, None, :]  # (r, k, d)
        C = G @ G.transpose(1, 2)  # (r, k, k)
        tr = torch.diagonal(C, dim1=1, dim2=2).sum(1)
        eps = torch.where(tr > 0, reg * tr, torch.full_like(tr, reg))
        C = C + eps[:, None, None] * torch.eye(k, dtype=x.dtype, device=x.device)
        v = torch.linalg.solve(
            C, torch.ones(C.shape[0], k, 1, dtype=x.dtype, device=x.device)
        )[..., 0]
        w[sl] = v / v.sum(1, keepdim=True)
    return w.to(out_dtype), idx


def lle_weight_matrix(weights, indices, n: Optional[int] = None) -> torch.Tensor:
    """The dense ``(n, n)`` matrix ``W`` with ``W[i, indices[i, a]] = weights[i, a]``."""
    weights = as_tensor(weights, "weights", ndim=(2,))
    n = weights.shape[0] if n is None else check_positive_int(n, "n")
    indices = check_indices(indices, "indices", device=weights.device, ndim=(2,))
    if indices.shape != weights.shape:
        raise ValueError(
            f"indices must have the shape of weights {tuple(weights.shape)}, got "
            f"{tuple(indices.shape)}"
        )
    indices = check_indices(indices, "indices", n)
    W = torch.zeros(weights.shape[0], n, dtype=weights.dtype, device=weights.device)
    return W.scatter_add_(1, indices.long(), weights)


def locally_linear_embedding(
    x,
    n_components: int = 2,
    n_neighbors: int = 10,
    reg: float = 1e-3,
    return_error: bool = False,
    eigen_solver: str = "auto",
    seed: int = 0,
):
    r"""Standard LLE: coordinates that the LLE weights of ``x`` reconstruct best.

    :math:`Y = \arg\min \sum_i \lVert y_i - \sum_j w_{ij} y_j \rVert^2` under :math:`Y^\top Y = I`
    and centring: the eigenvectors 2..``n_components``+1 (ascending eigenvalues) of
    :math:`M = (I - W)^\top (I - W)`, the first being the constant vector (the weights sum to one).
    ``x (n, d)`` → ``(n, n_components)``; with ``return_error`` also the sum of the used
    eigenvalues (scikit-learn's ``reconstruction_error_``).

    ``eigen_solver``: ``"dense"`` (``torch.linalg.eigh`` of the dense ``M``: time
    :math:`O(n^3)`, memory :math:`O(n^2)`; equal to scikit-learn's
    ``LocallyLinearEmbedding(method="standard", eigen_solver="dense")`` up to the sign of each
    column), ``"arpack"`` (``M`` sparse, with about :math:`n k^2` entries, and SciPy's ``eigsh``
    in shift-invert mode around a small negative shift, as scikit-learn's ``"arpack"``: seconds
    at ``n = 5000``, on the CPU in float64, the result moved back to ``x``'s device and dtype;
    ``seed`` fixes its start vector), or ``"auto"`` (dense up to ``n = 2000``, ARPACK above).
    """
    x = check_points(x, "x")
    n = x.shape[0]
    n_components = check_positive_int(
        n_components, "n_components", maximum=max(1, n - 2)
    )
    eigen_solver = check_choice(
        eigen_solver, "eigen_solver", ["auto", "dense", "arpack"]
    )
    seed = check_positive_int(seed, "seed", minimum=0)
    out_dtype, x = x.dtype, x.to(compute_dtype(x.dtype))  # no eigh in half precision
    w, idx = lle_weights(x, n_neighbors, reg)
    if eigen_solver == "dense" or (eigen_solver == "auto" and n <= 2000):
        IW = torch.eye(n, dtype=x.dtype, device=x.device) - lle_weight_matrix(w, idx)
        M = IW.T @ IW
        evals, evecs = torch.linalg.eigh(M)
        Y = evecs[:, 1 : n_components + 1].to(out_dtype)
        return (Y, float(evals[1 : n_components + 1].sum())) if return_error else Y
    evals, evecs = _lle_arpack(w, idx, n_components + 1, seed)
    Y = torch.as_tensor(evecs[:, 1:], dtype=out_dtype, device=x.device)
    return (Y, float(evals[1:].sum())) if return_error else Y


def _lle_arpack(w: torch.Tensor, idx: torch.Tensor, k: int, seed: int):
    """The ``k`` smallest eigenpairs of the sparse ``M = (I − W)ᵀ(I − W)`` (ascending), by ARPACK in
    shift-invert mode. ``M`` is singular (the constant vector), so the shift is a small negative
    number, ``−10⁻⁹·tr(M)/n``: ``M − σI`` is then positive definite and its factorization exact."""
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.linalg import eigsh

    n, m = w.shape
    rows = np.repeat(np.arange(n), m)
    W = sp.csr_matrix(
        (w.detach().cpu().double().numpy().ravel(), (rows, idx.cpu().numpy().ravel())),
        shape=(n, n),
    )
    IW = (sp.identity(n, format="csr") - W).tocsc()
    M = (IW.T @ IW).tocsc()
    sigma = -1e-9 * float(M.diagonal().sum()) / n
    v0 = np.random.default_rng(seed).uniform(-1.0, 1.0, n)
    evals, evecs = eigsh(M, k=k, sigma=sigma, which="LM", tol=0.0, v0=v0)
    order = np.argsort(evals)
    return evals[order], evecs[:, order]


# --- asymmetric MDS -----------------------------------------------------------------------------
def _check_square(d, name: str = "d (the dissimilarity)") -> torch.Tensor:
    D = as_tensor(d, name, ndim=(2,))
    if D.shape[0] != D.shape[1]:
        raise ValueError(
            f"{name} must be a square (n, n) matrix, got shape {tuple(D.shape)}"
        )
    if D.shape[0] < 2:
        raise ValueError(
            f"{name} must compare at least two objects, got shape {tuple(D.shape)}"
        )
    return D


def classical_mds(d, n_components: int = 2) -> torch.Tensor:
    r"""Torgerson's classical MDS of a symmetric dissimilarity ``d (n, n)``: ``(n, n_components)``.

    :math:`B = -\tfrac12 J D^{(2)} J` (``J`` the centring matrix), coordinates
    :math:`V_{:, 1..p} \Lambda^{1/2}_{1..p}` from the top eigenpairs (negative eigenvalues clipped).
    """
    D = _check_square(d)
    out_dtype, D = D.dtype, D.to(compute_dtype(D.dtype))  # no eigh in half precision
    n = D.shape[0]
    n_components = check_positive_int(n_components, "n_components", maximum=n)
    J = torch.eye(n, dtype=D.dtype, device=D.device) - 1.0 / n
    B = -0.5 * J @ (D * D) @ J
    evals, evecs = torch.linalg.eigh((B + B.T) / 2)
    evals, evecs = evals.flip(0)[:n_components], evecs.flip(1)[:, :n_components]
    return (evecs * evals.clamp(min=0).sqrt()).to(out_dtype)


@dataclass
class AsymmetricMDS:
    """Result of :func:`asymmetric_mds`."""

    embedding: torch.Tensor  #: positions ``(n, p)``
    radius: torch.Tensor  #: radii ``(n,)``, mean zero
    stress: (
        float  #: weighted squared error of the fit, over all ordered pairs ``i ≠ j``
    )
    symmetric_stress: float  #: the part of ``stress`` from the symmetric part of ``δ``
    skew_stress: float  #: the part from the skew-symmetric part


def _pdist(Y):
    diff = Y[:, None, :] - Y[None, :, :]
    return torch.sqrt(
        (diff * diff).sum(-1) + torch.eye(Y.shape[0], dtype=Y.dtype, device=Y.device)
    ) * (1 - torch.eye(Y.shape[0], dtype=Y.dtype, device=Y.device))


def asymmetric_mds(
    d,
    n_components: int = 2,
    bandwidth: Optional[float] = None,
    n_iter: int = 300,
    seed: int = 0,
) -> AsymmetricMDS:
    r"""Asymmetric MDS with the radius model :math:`\delta_{ij} \approx \lVert x_i - x_j\rVert + r_j - r_i`.

    Minimizes the weighted stress :math:`\sum_{i \ne j} w_{ij}(\delta_{ij} - \lVert x_i - x_j\rVert - r_j + r_i)^2`
    with symmetric weights (all 1, or the localization kernel :math:`w_{ij} = e^{-s_{ij}^2 / 2h^2}` of
    the symmetric part when ``bandwidth = h`` is given, which makes the map faithful to the small
    dissimilarities first). Because the model's symmetric part is the distance and its skew part
    is :math:`r_j - r_i`, the stress splits into a symmetric and a skew stress:

    * positions: weighted metric MDS of :math:`S = (\delta + \delta^\top)/2`, from classical MDS
      followed by ``n_iter`` L-BFGS steps (torch autograd);
    * radii, in closed form: :math:`L r = b` with :math:`L` the Laplacian of ``w`` and
      :math:`b_k = \sum_i w_{ik} A_{ik}`, :math:`A = (\delta - \delta^\top)/2`; with unit weights
      :math:`r_k = \frac1n \sum_i A_{ik}` (the mean-zero solution).

    ``d (n, n)`` (the diagonal is ignored). Returns :class:`AsymmetricMDS`.
    """
    D = _check_square(d)
    out_dtype, D = D.dtype, D.to(compute_dtype(D.dtype))  # no pinv in half precision
    n = D.shape[0]
    n_components = check_positive_int(n_components, "n_components", maximum=n)
    n_iter = check_positive_int(n_iter, "n_iter", minimum=0)
    off = 1 - torch.eye(n, dtype=D.dtype, device=D.device)
    S, A = (D + D.T) / 2, (D - D.T) / 2
    if bandwidth is None:
        Wt = off.clone()
    else:
        h = check_positive_float(bandwidth, "bandwidth")
        Wt = torch.exp(-0.5 * (S / h) ** 2) * off
    # radii: the Laplacian system (its null space, the constants, is removed by mean zero)
    L = torch.diag(Wt.sum(1)) - Wt
    b = (Wt * A).sum(0)
    r = (
        torch.linalg.lstsq(L, b[:, None]).solution[:, 0]
        if n <= 2
        else torch.linalg.pinv(L, hermitian=True) @ b
    )
    r = r - r.mean()
    # positions: weighted metric MDS of S, started from classical MDS
    g = torch.Generator(device="cpu").manual_seed(seed)
    Y0 = classical_mds(S * off, n_components)
    Y0 = Y0 + 1e-6 * S.std() * torch.randn(Y0.shape, generator=g, dtype=D.dtype).to(
        D.device
    )
    Y = Y0.clone().contiguous().requires_grad_(True)
    if n_iter:
        opt = torch.optim.LBFGS(
            [Y],
            max_iter=n_iter,
            tolerance_grad=1e-10,
            tolerance_change=1e-14,
            line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            loss = (Wt * (S - _pdist(Y)) ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
    Y = Y.detach()
    sym = float((Wt * (S - _pdist(Y)) ** 2).sum())
    skew = float((Wt * (A - (r[None, :] - r[:, None])) ** 2).sum())
    return AsymmetricMDS(Y.to(out_dtype), r.to(out_dtype), sym + skew, sym, skew)


# --- neighbourhood scores: trustworthiness and continuity -----------------------------------------
def _rank_counts(d2: torch.Tensor, t: torch.Tensor):
    """``below = #(d2 < t)`` and ``upto = #(d2 <= t)`` per row, ``(r, c)``, for ``d2 (r, n)``
    and thresholds ``t (r, c)``: counting passes for few thresholds, one sort per row for many
    (fewer than ``2 log2 n`` thresholds: counting is cheaper)."""
    t = t.contiguous()
    if t.shape[1] > 2 * max(1, d2.shape[1].bit_length()):
        srt = d2.sort(1).values
        return torch.searchsorted(srt, t), torch.searchsorted(srt, t, right=True)
    cols = range(t.shape[1])
    below = torch.stack([(d2 < t[:, c : c + 1]).sum(1) for c in cols], 1)
    upto = torch.stack([(d2 <= t[:, c : c + 1]).sum(1) for c in cols], 1)
    return below, upto


def _tie_penalty(below, upto, k):
    r"""The expected :math:`\max(0, r - k)` for a rank :math:`r` drawn uniformly from
    ``below + 1 .. upto`` (a point tied with ``upto − below − 1`` others), in float64:
    :math:`(S(\text{upto}) - S(\text{below}))/(\text{upto} - \text{below})` with
    :math:`S(m) = \sum_{r \le m} \max(0, r - k) = (m - k)_+ (m - k + 1)_+ / 2`."""

    def s_of(m):
        m = m.double()
        return (m - k).clamp(min=0) * (m - k + 1).clamp(min=0) / 2

    return (s_of(upto) - s_of(below)) / (upto - below).double()


def _first_neighbours(d2: torch.Tensor, ks: torch.Tensor):
    r"""Each row's nearest points ``idx (r, J)`` with the probability ``p (K, r, J)`` that each
    is among the ``k`` nearest, for each ``k`` of ``ks``, when exactly tied distances are
    ordered at random: 1 below the ``k``-th smallest distance :math:`v_k`, and
    :math:`(k - \#\{d < v_k\})/\#\{d = v_k\}` at it. ``J`` grows until every tie at the largest
    ``k`` is inside."""
    kmax, n_fin = int(ks.max()), d2.shape[1] - 1  # the point itself is at inf
    J = min(n_fin, kmax + 1)
    while True:
        vals, idx = torch.topk(d2, J, dim=1, largest=False)
        if J == n_fin or bool((vals[:, -1] > vals[:, kmax - 1]).all()):
            break
        J = min(n_fin, 2 * J)
    vk = vals[:, ks - 1].T[:, :, None]  # (K, r, 1)
    lower = (vals < vk).sum(2, keepdim=True)
    equal = (vals == vk).sum(2, keepdim=True)
    share = (ks[:, None, None] - lower).double() / equal.double()
    p = torch.where(vals < vk, 1.0, torch.where(vals == vk, share, 0.0))
    return idx, p


@dataclass
class NeighborhoodScores:
    r"""Result of :func:`trustworthiness_continuity`: scores at each neighbourhood size ``k``.

    The per-point scores average to the scores: ``trustworthiness = per_point.mean(-1)``.
    """

    n_neighbors: torch.Tensor  #: the sizes ``k``, ``(K,)``
    trustworthiness: torch.Tensor  #: ``(K,)``, or ``(E, K)`` for ``E`` embeddings
    continuity: torch.Tensor  #: same shape
    trustworthiness_per_point: (
        torch.Tensor
    )  #: ``(K, m)`` or ``(E, K, m)``, one per anchor
    continuity_per_point: torch.Tensor  #: same shape
    anchors: torch.Tensor  #: the ``m`` points ``i`` scored, ``(m,)``


def _check_embeddings(y, x):
    single = not isinstance(y, (list, tuple))
    ys = [y] if single else list(y)
    if not ys:
        raise ValueError(
            "y is an empty list; give an embedding (n, p) or a list of them"
        )
    out = []
    for a, ya in enumerate(ys):
        name = "y" if single else f"y[{a}]"
        Y = check_points(ya, name).to(x.device)
        Y = Y.to(compute_dtype(Y.dtype))  # half precision: distances in float32
        if Y.shape[0] != x.shape[0]:
            raise ValueError(
                f"{name} has {Y.shape[0]} points but x has {x.shape[0]}; they must match"
            )
        out.append(Y)
    return out, single


def _neighborhood_scores(x, y, n_neighbors, anchors, trust: bool, cont: bool):
    """Per-point trustworthiness and continuity ``(E, K, m)`` (float64, CPU), in one pass over
    the distances of ``x`` from the anchors (the expensive part), shared by every embedding."""
    x = check_points(x, "x")
    x = x.to(compute_dtype(x.dtype))  # half precision: distances in float32
    n = x.shape[0]
    many = not isinstance(n_neighbors, numbers.Integral)
    ks = check_positive_ints(n_neighbors, "n_neighbors") if many else [n_neighbors]
    ks = [check_positive_int(k, "n_neighbors") for k in ks]
    if not max(ks) < n / 2:
        raise ValueError(
            f"n_neighbors must be less than n / 2 = {n / 2} (n = {n} points), "
            f"got {max(ks)}"
        )
    ys, single = _check_embeddings(y, x)
    if anchors is None:
        rows = torch.arange(n, device=x.device)
    else:
        rows = torch.as_tensor(anchors, device=x.device)
        if rows.numel() == 0:
            raise ValueError("anchors is empty; give at least one point index")
        if rows.is_floating_point() or rows.dtype == torch.bool or rows.ndim != 1:
            raise TypeError("anchors must be a 1-D array of integer point indices")
        if bool((rows < 0).any() | (rows >= n).any()):
            raise ValueError(
                f"anchors must be a non-empty set of indices in [0, {n - 1}]"
            )
        rows = rows.long()
    K = torch.tensor(ks, device=x.device)
    E, m = len(ys), len(rows)
    pen = torch.zeros(2, E, len(ks), m, dtype=torch.float64)
    dist_y = [_Distances(Y) for Y in ys]
    for sl, d2 in _sq_dist_rows(x, rows, width=2):
        if cont:
            idx, p = _first_neighbours(d2, K)
        nb = []
        for a, dy in enumerate(dist_y):
            d2y = dy.rows(rows[sl])
            if trust:
                nb.append(_first_neighbours(d2y, K))
            if cont:  # the ranks in y of the points nearest in x
                below, upto = _rank_counts(d2y, d2y.gather(1, idx))
                exc = _tie_penalty(below, upto, K[:, None, None])  # (K, r, J)
                pen[1, a, :, sl] = (p * exc).sum(2).cpu()
        if trust:  # the ranks in x of the points nearest in each y, in one count
            cols = torch.cat([i_ for i_, _ in nb], 1)
            below, upto = _rank_counts(d2, d2.gather(1, cols))
            exc = _tie_penalty(below, upto, K[:, None, None])  # (K, r, sum J)
            parts = torch.split(exc, [i_.shape[1] for i_, _ in nb], dim=2)
            for a, ((_, p_a), e_a) in enumerate(zip(nb, parts)):
                pen[0, a, :, sl] = (p_a * e_a).sum(2).cpu()
    Kd = K.double().cpu()
    score = 1.0 - pen * (2.0 / (Kd * (2.0 * n - 3.0 * Kd - 1.0)))[:, None]
    return score, rows, ks, single


def trustworthiness(x, y, n_neighbors: int = 5):
    r"""Trustworthiness of an embedding ``y`` of the points ``x`` (Venna & Kaski 2001).

    .. math::

        T(k) = 1 - \frac{2}{n k (2n - 3k - 1)} \sum_{i=1}^n \sum_{j \in N^y_k(i)} \max(0, r(i, j) - k),

    where :math:`N^y_k(i)` are the ``k = n_neighbors`` nearest neighbours of ``i`` in the embedding
    and :math:`r(i, j)` is the rank of ``j`` among the Euclidean distances from ``i`` in ``x``
    (1 for the nearest, the point itself excluded). 1 when every embedding neighbour is a data
    neighbour. Exactly tied distances (as computed) are ordered at random, in expectation: a
    ``j`` that shares its data distance with ``T − 1`` other points gets the mean penalty over
    the ``T`` ranks they occupy, and a point tied with others at the ``k``-th embedding
    distance belongs to :math:`N^y_k(i)` with the probability that a random order puts it in
    (this library's convention: Venna & Kaski assume distinct distances, and scikit-learn
    ranks ties as its sort happens to leave them). Without ties, the
    number of scikit-learn's ``sklearn.manifold.trustworthiness`` (Euclidean metric), without
    its dense ``(n, n)`` distance and rank matrices: the distances of ``x`` are formed in row
    chunks under the memory budget (one fused matrix product per chunk, in ``x``'s dtype, or
    float32 for half precision — in float32 distances that agree to about 7 digits may swap), and each rank is a count of the
    smaller distances in the chunk's rows (one sort per row when many embeddings are scored).

    ``x (n, d)``; ``y (n, p)`` → a float, or a list or tuple of embeddings ``(n, p_a)`` → a list of
    floats, all scored in one pass over the distances of ``x`` (the expensive part). Needs
    ``n_neighbors < n / 2``. The embedding neighbours are found in each ``y``'s own dtype
    (float32 for half precision), on ``x``'s device. :func:`trustworthiness_continuity` gives several ``k`` at once, with
    :func:`continuity`.
    """
    if not isinstance(n_neighbors, numbers.Integral) or isinstance(n_neighbors, bool):
        check_positive_int(n_neighbors, "n_neighbors")  # raises the TypeError
    score, _, _, single = _neighborhood_scores(x, y, n_neighbors, None, True, False)
    t = score[0, :, 0].mean(1)
    return float(t[0]) if single else [float(v) for v in t]


def continuity(x, y, n_neighbors: int = 5):
    r"""Continuity of an embedding ``y`` of the points ``x`` (Venna & Kaski 2001).

    .. math::

        C(k) = 1 - \frac{2}{n k (2n - 3k - 1)} \sum_{i=1}^n \sum_{j \in N^x_k(i)} \max(0, \hat r(i, j) - k),

    the trustworthiness with the roles swapped: :math:`N^x_k(i)` are the ``k`` nearest
    neighbours of ``i`` in the data and :math:`\hat r(i, j)` the rank of ``j`` among the
    distances from ``i`` in the embedding. 1 when every data neighbour stays an embedding
    neighbour; it penalizes what a map tears apart, trustworthiness what it glues together.
    Ties are averaged over their random orders, as in :func:`trustworthiness`: in the ranks
    and in the neighbour sets :math:`N^x_k(i)`. Without ties, equal to
    ``sklearn.manifold.trustworthiness(y, x)``. ``x (n, d)``, ``y (n, p)`` or a list of
    embeddings → a float or a list; ``n_neighbors < n / 2``.
    """
    if not isinstance(n_neighbors, numbers.Integral) or isinstance(n_neighbors, bool):
        check_positive_int(n_neighbors, "n_neighbors")
    score, _, _, single = _neighborhood_scores(x, y, n_neighbors, None, False, True)
    c = score[1, :, 0].mean(1)
    return float(c[0]) if single else [float(v) for v in c]


def trustworthiness_continuity(
    x, y, n_neighbors=(5, 10, 20, 50, 100), anchors=None
) -> NeighborhoodScores:
    r"""Trustworthiness and continuity of embeddings at several neighbourhood sizes at once.

    :func:`trustworthiness` and :func:`continuity` at every ``k`` of ``n_neighbors``, for one
    embedding ``y (n, p)`` or a list of them, from one pass over the distances of ``x (n, d)``:
    per chunk of anchor points the ranks in ``x`` and in each ``y`` are counted once (one sort
    per row when there are many) and serve every ``k``. Per point ``i`` the scores are
    :math:`t_i(k) = 1 - \frac{2}{k(2n - 3k - 1)} \sum_{j \in N^y_k(i)} \max(0, r(i, j) - k)`
    and the same with the roles swapped for :math:`c_i(k)`; :math:`T(k)` and :math:`C(k)` are
    their means over the anchors. ``anchors (m,)`` (indices; all ``n`` points by default)
    scores only those points: then the means are unbiased estimates of :math:`T` and
    :math:`C` from a random set of anchors, at about ``m / n`` of the cost, and the
    per-point scores give their standard errors. Returns :class:`NeighborhoodScores`
    (float64, on the CPU).
    """
    score, rows, ks, single = _neighborhood_scores(
        x, y, n_neighbors, anchors, True, True
    )
    per = (score[0, 0], score[1, 0]) if single else (score[0], score[1])
    return NeighborhoodScores(
        torch.tensor(ks),
        per[0].mean(-1),
        per[1].mean(-1),
        per[0],
        per[1],
        rows.cpu(),
    )
