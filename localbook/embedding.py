r"""Embeddings as local means: LLE, asymmetric MDS, and triplet (hyperkernel) embeddings.

* **LLE** (Roweis & Saul 2000). Each point is an *affine local mean* of its ``k`` nearest
  neighbours, :math:`x_i \approx \sum_j w_{ij} x_j` with :math:`\sum_j w_{ij} = 1`; the weights
  solve :math:`C w = \mathbf 1` (``C`` the regularized local Gram matrix) and are rescaled to sum to
  one. The embedding keeps the same weights: the bottom eigenvectors of
  :math:`M = (I - W)^\top (I - W)` after the constant one.
* **Asymmetric MDS** (radius model): :math:`\delta_{ij} \approx \lVert x_i - x_j\rVert + r_j - r_i`.
  The symmetric part of ``δ`` fixes the positions, the skew-symmetric part the radii, in closed form.
* **Triplet embeddings**: a *hyperkernel* on triplets,
  :math:`\kappa(y_i; y_j, y_k) = s_{ij} / (s_{ij} + s_{ik})`, :math:`s = (1 + \lVert y - y'\rVert^2)^{-1}`,
  is the weight a two-point local mean at ``y_i`` gives ``j`` against ``k``. TriMap (Amid & Warmuth
  2019) minimizes :math:`\sum \omega_{ijk} (1 - \kappa_{ijk})`; ordinal embedding fits points to
  "``i`` is closer to ``j`` than to ``k``" statements alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ._validate import as_tensor, check_choice, check_points, check_positive_float, check_positive_int
from .kernels import _knn, chunk_rows, iter_chunks

__all__ = [
    "lle_weights",
    "lle_weight_matrix",
    "locally_linear_embedding",
    "classical_mds",
    "AsymmetricMDS",
    "asymmetric_mds",
    "triplet_hyperkernel",
    "triplet_loss",
    "trimap_triplets",
    "triplet_embedding",
    "ordinal_embedding",
    "triplet_accuracy",
]


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
    n = x.shape[0]
    k = check_positive_int(n_neighbors, "n_neighbors", maximum=n - 1) if n > 1 else None
    if k is None:
        raise ValueError("x needs at least two points for LLE")
    reg = check_positive_float(reg, "reg", allow_zero=True)
    idx = _knn(x, x, k + 1)[1][:, 1:]  # the nearest point is the point itself
    w = torch.empty(n, k, dtype=x.dtype, device=x.device)
    rows = chunk_rows(n, k * (x.shape[1] + k), 1, x.element_size(), None, x.device)
    for sl in iter_chunks(n, rows):
        G = x[idx[sl]] - x[sl, None, :]  # (r, k, d)
        C = G @ G.transpose(1, 2)  # (r, k, k)
        tr = torch.diagonal(C, dim1=1, dim2=2).sum(1)
        eps = torch.where(tr > 0, reg * tr, torch.full_like(tr, reg))
        C = C + eps[:, None, None] * torch.eye(k, dtype=x.dtype, device=x.device)
        v = torch.linalg.solve(C, torch.ones(C.shape[0], k, 1, dtype=x.dtype, device=x.device))[..., 0]
        w[sl] = v / v.sum(1, keepdim=True)
    return w, idx


def lle_weight_matrix(weights, indices, n: Optional[int] = None) -> torch.Tensor:
    """The dense ``(n, n)`` matrix ``W`` with ``W[i, indices[i, a]] = weights[i, a]``."""
    weights = as_tensor(weights, "weights", ndim=(2,))
    indices = torch.as_tensor(indices, device=weights.device)
    if indices.shape != weights.shape:
        raise ValueError(f"indices must have the shape of weights {tuple(weights.shape)}, got {tuple(indices.shape)}")
    n = weights.shape[0] if n is None else n
    W = torch.zeros(weights.shape[0], n, dtype=weights.dtype, device=weights.device)
    return W.scatter_add_(1, indices.long(), weights)


def locally_linear_embedding(x, n_components: int = 2, n_neighbors: int = 10, reg: float = 1e-3,
                             return_error: bool = False):
    r"""Standard LLE: coordinates that the LLE weights of ``x`` reconstruct best.

    :math:`Y = \arg\min \sum_i \lVert y_i - \sum_j w_{ij} y_j \rVert^2` under :math:`Y^\top Y = I`
    and centring: the eigenvectors 2..``n_components``+1 (ascending eigenvalues) of
    :math:`M = (I - W)^\top (I - W)`, the first being the constant vector (the weights sum to one).
    ``x (n, d)`` → ``(n, n_components)``; with ``return_error`` also the sum of the used
    eigenvalues (scikit-learn's ``reconstruction_error_``). Dense eigen-solver: ``n`` up to a few
    thousand. Equal to scikit-learn's ``LocallyLinearEmbedding(method="standard",
    eigen_solver="dense")`` up to the sign of each column.
    """
    x = check_points(x, "x")
    n_components = check_positive_int(n_components, "n_components", maximum=max(1, x.shape[0] - 2))
    w, idx = lle_weights(x, n_neighbors, reg)
    IW = torch.eye(x.shape[0], dtype=x.dtype, device=x.device) - lle_weight_matrix(w, idx)
    M = IW.T @ IW
    evals, evecs = torch.linalg.eigh(M)
    Y = evecs[:, 1:n_components + 1]
    return (Y, float(evals[1:n_components + 1].sum())) if return_error else Y


# --- asymmetric MDS -----------------------------------------------------------------------------
def _check_square(d, name: str = "dissimilarity") -> torch.Tensor:
    D = as_tensor(d, name, ndim=(2,))
    if D.shape[0] != D.shape[1]:
        raise ValueError(f"{name} must be a square (n, n) matrix, got shape {tuple(D.shape)}")
    if D.shape[0] < 2:
        raise ValueError(f"{name} must compare at least two objects, got shape {tuple(D.shape)}")
    return D


def classical_mds(d, n_components: int = 2) -> torch.Tensor:
    r"""Torgerson's classical MDS of a symmetric dissimilarity ``d (n, n)``: ``(n, n_components)``.

    :math:`B = -\tfrac12 J D^{(2)} J` (``J`` the centring matrix), coordinates
    :math:`V_{:, 1..p} \Lambda^{1/2}_{1..p}` from the top eigenpairs (negative eigenvalues clipped).
    """
    D = _check_square(d)
    n = D.shape[0]
    n_components = check_positive_int(n_components, "n_components", maximum=n)
    J = torch.eye(n, dtype=D.dtype, device=D.device) - 1.0 / n
    B = -0.5 * J @ (D * D) @ J
    evals, evecs = torch.linalg.eigh((B + B.T) / 2)
    evals, evecs = evals.flip(0)[:n_components], evecs.flip(1)[:, :n_components]
    return evecs * evals.clamp(min=0).sqrt()


@dataclass
class AsymmetricMDS:
    """Result of :func:`asymmetric_mds`."""

    embedding: torch.Tensor  #: positions ``(n, p)``
    radius: torch.Tensor  #: radii ``(n,)``, mean zero
    stress: float  #: weighted squared error of the fit, over all ordered pairs ``i ≠ j``
    symmetric_stress: float  #: the part of ``stress`` from the symmetric part of ``δ``
    skew_stress: float  #: the part from the skew-symmetric part


def _pdist(Y):
    diff = Y[:, None, :] - Y[None, :, :]
    return torch.sqrt((diff * diff).sum(-1) + torch.eye(Y.shape[0], dtype=Y.dtype, device=Y.device)) \
        * (1 - torch.eye(Y.shape[0], dtype=Y.dtype, device=Y.device))


def asymmetric_mds(d, n_components: int = 2, bandwidth: Optional[float] = None, n_iter: int = 300,
                   seed: int = 0) -> AsymmetricMDS:
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
    r = torch.linalg.lstsq(L, b[:, None]).solution[:, 0] if n <= 2 else torch.linalg.pinv(L, hermitian=True) @ b
    r = r - r.mean()
    # positions: weighted metric MDS of S, started from classical MDS
    g = torch.Generator(device="cpu").manual_seed(seed)
    Y0 = classical_mds(S * off, n_components)
    Y0 = Y0 + 1e-6 * S.std() * torch.randn(Y0.shape, generator=g, dtype=D.dtype).to(D.device)
    Y = Y0.clone().contiguous().requires_grad_(True)
    if n_iter:
        opt = torch.optim.LBFGS([Y], max_iter=n_iter, tolerance_grad=1e-10, tolerance_change=1e-14,
                                line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = (Wt * (S - _pdist(Y)) ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
    Y = Y.detach()
    sym = float((Wt * (S - _pdist(Y)) ** 2).sum())
    skew = float((Wt * (A - (r[None, :] - r[:, None])) ** 2).sum())
    return AsymmetricMDS(Y, r, sym + skew, sym, skew)


# --- triplets and hyperkernels --------------------------------------------------------------------
def _check_triplets(triplets, n: int, device) -> torch.Tensor:
    t = torch.as_tensor(triplets, device=device)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"triplets must be an integer array of (i, j, k) indices, got dtype {t.dtype}")
    if t.ndim != 2 or t.shape[1] != 3:
        raise ValueError(f"triplets must have shape (m, 3), got {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError("triplets is empty; at least one (i, j, k) triplet is needed")
    if bool((t < 0).any()) or bool((t >= n).any()):
        raise ValueError(f"triplets holds indices outside [0, {n - 1}]")
    return t.long()


def _student_t(Y, a, b):
    # index_select: its backward is index_add_, far faster on CPU than advanced indexing's
    diff = Y.index_select(0, a) - Y.index_select(0, b)
    return 1.0 / (1.0 + (diff * diff).sum(-1))


def triplet_hyperkernel(y, triplets) -> torch.Tensor:
    r"""The triplet hyperkernel :math:`\kappa_{ijk} = s_{ij} / (s_{ij} + s_{ik})`, ``(m,)``.

    :math:`s_{ab} = (1 + \lVert y_a - y_b\rVert^2)^{-1}` (Student-t, one degree of freedom). It is
    the weight a local mean at :math:`y_i` over the two candidates :math:`\{y_j, y_k\}` gives ``j``:
    a kernel on the tuple ``(i, j, k)``, near 1 when ``j`` is much closer to ``i`` than ``k`` is.
    ``y (n, p)``, ``triplets (m, 3)`` integer indices.
    """
    Y = check_points(y, "y")
    t = _check_triplets(triplets, Y.shape[0], Y.device)
    sij, sik = _student_t(Y, t[:, 0], t[:, 1]), _student_t(Y, t[:, 0], t[:, 2])
    return sij / (sij + sik)


def triplet_loss(y, triplets, weights=None, kind: str = "trimap") -> torch.Tensor:
    r"""A loss on triplets "``i`` is closer to ``j`` than to ``k``", summed over triplets (a scalar).

    * ``"trimap"``: :math:`\sum \omega_{ijk}\,(1 - \kappa_{ijk}) = \sum \omega_{ijk}\, s_{ik}/(s_{ij} + s_{ik})`
      (Amid & Warmuth 2019), bounded per triplet, so badly violated triplets cannot dominate;
    * ``"ste"``: :math:`-\sum \omega_{ijk} \log \kappa_{ijk}` (t-STE, van der Maaten & Weinberger 2012);
    * ``"hinge"``: :math:`\sum \omega_{ijk}\, (1 + \lVert y_i - y_j\rVert^2 - \lVert y_i - y_k\rVert^2)_+`
      (generalized non-metric MDS).

    These are the ordinal-embedding losses; ``kappa`` is :func:`triplet_hyperkernel`. ``y (n, p)``
    (differentiable), ``triplets (m, 3)``, ``weights (m,)`` or ``None`` (all one).
    """
    kind = check_choice(kind, "kind", ["trimap", "ste", "hinge"])
    Y = check_points(y, "y")
    t = _check_triplets(triplets, Y.shape[0], Y.device)
    w = None
    if weights is not None:
        w = as_tensor(weights, "weights", like=Y, ndim=(1,))
        if w.shape[0] != t.shape[0]:
            raise ValueError(f"weights has {w.shape[0]} entries but there are {t.shape[0]} triplets")
        if bool((w < 0).any()):
            raise ValueError("weights must be non-negative")
    i, j, k = t[:, 0], t[:, 1], t[:, 2]
    if kind == "hinge":
        dij = ((Y[i] - Y[j]) ** 2).sum(-1)
        dik = ((Y[i] - Y[k]) ** 2).sum(-1)
        per = torch.relu(1.0 + dij - dik)
    else:
        sij, sik = _student_t(Y, i, j), _student_t(Y, i, k)
        per = sik / (sij + sik) if kind == "trimap" else -torch.log(sij / (sij + sik))
    return (per * w).sum() if w is not None else per.sum()


def trimap_triplets(x, n_inliers: int = 10, n_outliers: int = 5, n_random: int = 3, gamma: float = 500.0,
                    seed: int = 0):
    r"""TriMap's triplets and weights from high-dimensional points ``x (n, d)``.

    For each ``i``: its ``n_inliers`` nearest neighbours ``j``, each paired with ``n_outliers``
    uniformly drawn ``k`` (kept only when farther than ``j``), plus ``n_random`` random triplets
    ordered so that ``j`` is the closer one. With the scaled similarity
    :math:`p_{ij} = \exp(-\lVert x_i - x_j\rVert^2 / \sigma_i\sigma_j)`, :math:`\sigma_i` the mean
    distance to the 4th–6th neighbours, the weight is :math:`\omega = \log(1 + \gamma\,\tilde\omega)`
    with :math:`\tilde\omega = (p_{ij}/p_{ik}) / \max(p_{ij}/p_{ik})` computed in log space (random
    triplets get a tenth of that). Returns ``triplets (m, 3)`` (long) and ``weights (m,)``.
    """
    x = check_points(x, "x")
    n = x.shape[0]
    n_inliers = check_positive_int(n_inliers, "n_inliers", maximum=n - 2)
    n_outliers = check_positive_int(n_outliers, "n_outliers")
    n_random = check_positive_int(n_random, "n_random", minimum=0)
    gamma = check_positive_float(gamma, "gamma")
    g = torch.Generator(device="cpu").manual_seed(seed)
    nn = _knn(x, x, max(n_inliers, 6) + 1)[1][:, 1:]  # drop the point itself
    d_nn = torch.sqrt(((x[nn] - x[:, None, :]) ** 2).sum(-1))  # (n, K)
    sigma = d_nn[:, 3:6].mean(1).clamp(min=torch.finfo(x.dtype).tiny)

    def log_p(a, b):
        return -((x[a] - x[b]) ** 2).sum(-1) / (sigma[a] * sigma[b])

    i = torch.arange(n, device=x.device).repeat_interleave(n_inliers * n_outliers)
    j = nn[:, :n_inliers].repeat_interleave(n_outliers, dim=1).reshape(-1)
    k = torch.randint(0, n, (i.numel(),), generator=g).to(x.device)
    lr_in = log_p(i, j) - log_p(i, k)
    keep = (lr_in > 0) & (k != i) & (k != j)
    i, j, k, lr_in = i[keep], j[keep], k[keep], lr_in[keep]
    trip = [torch.stack([i, j, k], 1)]
    logs = [lr_in]
    scale = [torch.ones_like(lr_in)]
    if n_random:
        ir = torch.arange(n, device=x.device).repeat_interleave(n_random)
        a = torch.randint(0, n, (ir.numel(),), generator=g).to(x.device)
        b = torch.randint(0, n, (ir.numel(),), generator=g).to(x.device)
        ok = (a != ir) & (b != ir) & (a != b)
        ir, a, b = ir[ok], a[ok], b[ok]
        lr = log_p(ir, a) - log_p(ir, b)
        jr, kr = torch.where(lr >= 0, a, b), torch.where(lr >= 0, b, a)
        trip.append(torch.stack([ir, jr, kr], 1))
        logs.append(lr.abs())
        scale.append(torch.full_like(lr, 0.1))
    trip, logr, scale = torch.cat(trip), torch.cat(logs), torch.cat(scale)
    w = scale * torch.log1p(gamma * torch.exp(logr - logr.max()))
    return trip, w


def _pca(x, p):
    xc = x - x.mean(0)
    U, S, V = torch.linalg.svd(xc, full_matrices=False)
    return xc @ V[:p].T


def triplet_embedding(x, n_components: int = 2, n_inliers: int = 10, n_outliers: int = 5, n_random: int = 3,
                      n_iter: int = 400, lr: float = 0.1, kind: str = "trimap", seed: int = 0,
                      init=None) -> torch.Tensor:
    r"""A TriMap-style embedding: minimize :func:`triplet_loss` over :func:`trimap_triplets`.

    Starts from PCA scaled to standard deviation 0.01 per axis (or ``init (n, n_components)``) and
    runs ``n_iter`` full-batch Adam steps (learning rate ``lr``) in torch. ``x (n, d)`` →
    ``(n, n_components)`` on ``x``'s device and dtype. Not the ``trimap`` package: the same kind
    of triplets and the same loss, the weights of the TriMap paper (``trimap`` 1.2 uses a
    tempered logarithm instead of :math:`\log(1 + \gamma\tilde\omega)`), and a different
    optimizer (``trimap`` uses delta-bar-delta gradient descent).
    """
    x = check_points(x, "x")
    n_components = check_positive_int(n_components, "n_components", maximum=x.shape[1])
    n_iter = check_positive_int(n_iter, "n_iter", minimum=0)
    lr = check_positive_float(lr, "lr")
    kind = check_choice(kind, "kind", ["trimap", "ste", "hinge"])
    trip, w = trimap_triplets(x, n_inliers, n_outliers, n_random, seed=seed)
    if init is None:
        Y0 = _pca(x, n_components)
        Y0 = 0.01 * Y0 / Y0.std(0).clamp(min=torch.finfo(x.dtype).tiny)
    else:
        Y0 = check_points(init, "init", like=x)
        if Y0.shape != (x.shape[0], n_components):
            raise ValueError(f"init must have shape {(x.shape[0], n_components)}, got {tuple(Y0.shape)}")
    return _fit_triplets(Y0, trip, w, n_iter, lr, kind)


def _fit_triplets(Y0, trip, w, n_iter, lr, kind):
    Y = Y0.clone().contiguous().requires_grad_(True)
    opt = torch.optim.Adam([Y], lr=lr)
    i, j, k = trip[:, 0], trip[:, 1], trip[:, 2]
    wn = w / w.sum()
    for _ in range(n_iter):
        opt.zero_grad()
        if kind == "hinge":
            Yi = Y.index_select(0, i)
            per = torch.relu(1.0 + ((Yi - Y.index_select(0, j)) ** 2).sum(-1) - ((Yi - Y.index_select(0, k)) ** 2).sum(-1))
        else:
            sij, sik = _student_t(Y, i, j), _student_t(Y, i, k)
            per = sik / (sij + sik) if kind == "trimap" else -torch.log(sij / (sij + sik))
        loss = (wn * per).sum()
        loss.backward()
        opt.step()
    return Y.detach()


def ordinal_embedding(triplets, n_points: int, n_components: int = 2, kind: str = "ste", n_iter: int = 500,
                      lr: float = 0.1, seed: int = 0, dtype=None, device=None) -> torch.Tensor:
    r"""Ordinal embedding: points that satisfy "``i`` is closer to ``j`` than to ``k``" statements.

    Only the comparisons are given, no coordinates. Minimizes :func:`triplet_loss` of ``kind``
    (``"ste"`` by default) from a small random start with ``n_iter`` Adam steps. ``triplets (m, 3)``
    integer indices into ``n_points`` objects; returns ``(n_points, n_components)``, determined up
    to a similarity transform (and only ordinally).
    """
    n_points = check_positive_int(n_points, "n_points", minimum=3)
    n_components = check_positive_int(n_components, "n_components")
    n_iter = check_positive_int(n_iter, "n_iter", minimum=0)
    lr = check_positive_float(lr, "lr")
    kind = check_choice(kind, "kind", ["trimap", "ste", "hinge"])
    device = torch.device(device) if device is not None else torch.device("cpu")
    t = _check_triplets(triplets, n_points, device)
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator(device="cpu").manual_seed(seed)
    Y0 = (1e-2 * torch.randn(n_points, n_components, generator=g, dtype=dtype)).to(device)
    return _fit_triplets(Y0, t, torch.ones(t.shape[0], dtype=dtype, device=device), n_iter, lr, kind)


def triplet_accuracy(y, triplets) -> float:
    """Fraction of triplets ``(i, j, k)`` with ``|y_i − y_j| < |y_i − y_k|`` in the embedding ``y``."""
    Y = check_points(y, "y")
    t = _check_triplets(triplets, Y.shape[0], Y.device)
    dij = ((Y[t[:, 0]] - Y[t[:, 1]]) ** 2).sum(-1)
    dik = ((Y[t[:, 0]] - Y[t[:, 2]]) ** 2).sum(-1)
    return float((dij < dik).to(Y.dtype).mean())
