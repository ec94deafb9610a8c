r"""Triplet embeddings: a hyperkernel on triplets, TriMap, and ordinal embedding.

A *hyperkernel* on triplets, :math:`\kappa(y_i; y_j, y_k) = s_{ij} / (s_{ij} + s_{ik})` with
:math:`s = (1 + \lVert y - y'\rVert^2)^{-1}`, is the weight a two-point local mean at ``y_i``
gives ``j`` against ``k``. TriMap (Amid & Warmuth 2019) minimizes
:math:`\sum \omega_{ijk} (1 - \kappa_{ijk})` over triplets sampled from the data's neighbours;
ordinal embedding fits points to "``i`` is closer to ``j`` than to ``k``" statements alone.

The two stochastic triplet embeddings of van der Maaten & Weinberger (2012) are the loss
:math:`-\sum \omega_{ijk} \log p_{ijk}`, :math:`p_{ijk} = s_{ij}/(s_{ij} + s_{ik})`, with two
similarities: **STE** (``kind="ste"``) the Gaussian :math:`s = e^{-\lVert y - y'\rVert^2}`, so
:math:`p_{ijk}` is the logistic function of :math:`d_{ik}^2 - d_{ij}^2`; **t-STE**
(``kind="tste"``) the Student-t kernel with :math:`\alpha` degrees of freedom,
:math:`s = (1 + \lVert y - y'\rVert^2/\alpha)^{-(\alpha + 1)/2}`, whose case
:math:`\alpha = 1` gives :math:`p_{ijk} = \kappa_{ijk}`. The gradient of every triplet loss is
in closed form (checked against autograd in the tests).
"""

from __future__ import annotations


import torch

from ._validate import as_tensor, check_choice, check_indices, check_points
from ._validate import check_positive_float, check_positive_int, compute_dtype
from ._validate import promote_floats
from .embedding import _knn_self, _row_sq_dist

KINDS = ["trimap", "ste", "tste", "hinge"]  # the losses of triplet_loss

__all__ = [
    "triplet_hyperkernel",
    "triplet_loss",
    "trimap_triplets",
    "triplet_embedding",
    "ordinal_embedding",
    "triplet_accuracy",
]


def _check_triplets(triplets, n: int, device, data: str = "y") -> torch.Tensor:
    """``(m, 3)`` integer indices into the ``n`` points of ``data`` (any integer dtype)."""
    t = check_indices(triplets, "triplets", device=device, ndim=(2,), what="indices")
    if t.shape[1] != 3:
        raise ValueError(f"triplets must have shape (m, 3), got {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError("triplets is empty; at least one (i, j, k) triplet is needed")
    lo, hi = torch.aminmax(t)
    if int(lo) < 0 or int(hi) >= n:
        raise ValueError(
            f"triplets holds indices outside [0, {n - 1}] (from {int(lo)} to {int(hi)}): "
            f"{data} has {n} points"
        )
    return t


def _softplus(z):
    """log(1 + e^z), exact at every z (torch's softplus turns linear above z = 20)."""
    return torch.logaddexp(z, torch.zeros_like(z))


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


def triplet_loss(
    y, triplets, weights=None, kind: str = "trimap", alpha: float = 1.0
) -> torch.Tensor:
    r"""A loss on triplets "``i`` is closer to ``j`` than to ``k``", summed over triplets (a scalar).

    With :math:`d_{ab}^2 = \lVert y_a - y_b\rVert^2`:

    * ``"trimap"``: :math:`\sum \omega_{ijk}\,(1 - \kappa_{ijk}) = \sum \omega_{ijk}\, s_{ik}/(s_{ij} + s_{ik})`
      (Amid & Warmuth 2019), bounded per triplet, so badly violated triplets cannot dominate;
    * ``"ste"``: STE (van der Maaten & Weinberger 2012), :math:`-\sum \omega_{ijk} \log p_{ijk}`
      with the Gaussian kernel, :math:`p_{ijk} = e^{-d_{ij}^2}/(e^{-d_{ij}^2} + e^{-d_{ik}^2})`,
      i.e. :math:`\sum \omega_{ijk} \log(1 + e^{d_{ij}^2 - d_{ik}^2})`;
    * ``"tste"``: t-STE (the same paper), :math:`-\sum \omega_{ijk} \log p_{ijk}` with the
      Student-t kernel of ``alpha`` degrees of freedom,
      :math:`p_{ijk} = s_{ij}/(s_{ij} + s_{ik})`, :math:`s = (1 + d^2/\alpha)^{-(\alpha+1)/2}`;
      at ``alpha = 1``, :math:`-\sum \omega_{ijk} \log \kappa_{ijk}`;
    * ``"hinge"``: :math:`\sum \omega_{ijk}\, (1 + d_{ij}^2 - d_{ik}^2)_+`
      (generalized non-metric MDS).

    These are the ordinal-embedding losses; ``kappa`` is :func:`triplet_hyperkernel`. ``y (n, p)``
    (differentiable), ``triplets (m, 3)``, ``weights (m,)`` or ``None`` (all one); ``alpha > 0``
    is used by ``"tste"`` only.
    """
    kind = check_choice(kind, "kind", KINDS)
    alpha = check_positive_float(alpha, "alpha")
    y, weights = promote_floats(y, weights)
    Y = check_points(y, "y")
    t = _check_triplets(triplets, Y.shape[0], Y.device)
    w = None
    if weights is not None:
        w = as_tensor(weights, "weights", like=Y, ndim=(1,))
        if w.shape[0] != t.shape[0]:
            raise ValueError(
                f"weights has {w.shape[0]} entries but there are {t.shape[0]} triplets"
            )
        if bool((w < 0).any()):
            raise ValueError("weights must be non-negative")
    i, j, k = t[:, 0], t[:, 1], t[:, 2]
    if kind == "trimap":
        sij, sik = _student_t(Y, i, j), _student_t(Y, i, k)
        per = sik / (sij + sik)
    else:
        dij = ((Y[i] - Y[j]) ** 2).sum(-1)
        dik = ((Y[i] - Y[k]) ** 2).sum(-1)
        if kind == "hinge":
            per = torch.relu(1.0 + dij - dik)
        elif kind == "ste":  # -log p = softplus(log s_ik - log s_ij), log s = -d²
            per = _softplus(dij - dik)
        else:  # log s = -(alpha + 1)/2 · log(1 + d²/alpha)
            c = (alpha + 1.0) / 2.0
            z = c * (torch.log1p(dij / alpha) - torch.log1p(dik / alpha))
            per = _softplus(z)
    return (per * w).sum() if w is not None else per.sum()


def trimap_triplets(
    x,
    n_inliers: int = 10,
    n_outliers: int = 5,
    n_random: int = 3,
    gamma: float = 500.0,
    seed: int = 0,
):
    r"""TriMap's triplets and weights from high-dimensional points ``x (n, d)``.

    For each ``i``: its ``n_inliers`` nearest neighbours ``j`` (Euclidean), each paired with
    ``n_outliers`` uniformly drawn ``k`` (kept only when farther than ``j`` in the scaled
    similarity), plus ``n_random`` random triplets ordered so that ``j`` is the closer one. With
    the scaled similarity :math:`p_{ij} = \exp(-\lVert x_i - x_j\rVert^2 / \sigma_i\sigma_j)`,
    :math:`\sigma_i` the mean distance from ``i`` to its 4th, 5th and 6th nearest neighbours (the
    point itself not counted; the ``trimap`` package takes columns 3–5 of a neighbour list whose
    column 0 is the point itself, i.e. the 3rd–5th neighbours), the weight is
    :math:`\omega = \log(1 + \gamma\,(\tilde\omega + 10^{-4}))` with
    :math:`\tilde\omega = (p_{ij}/p_{ik}) / \max(p_{ij}/p_{ik})` computed in log space, and a
    random triplet gets a tenth of that. The floor :math:`10^{-4}` and :math:`\gamma = 500` follow
    the ``trimap`` code v1.0.x (2019–2021, the code, not the paper); the one-tenth weight of random
    triplets comes from ``trimap`` v1.1+, which replaced the floor by a tempered logarithm; the
    combination, with the tenth applied after the logarithm, is this library's choice. The
    original also picks the inliers by scaled similarity among about ``n_inliers + 50``
    Euclidean neighbours; here they are the ``n_inliers`` Euclidean nearest. The floor keeps
    every triplet in play: the ratios span many orders of magnitude, and without it nearly all
    weights would vanish next to the largest. Returns ``triplets (m, 3)`` (long) and
    ``weights (m,)``.

    Cost: one chunked neighbour search (a fused matrix product per row chunk) and the distances
    of the sampled pairs, gathered row by row; no loop over points.
    """
    x = check_points(x, "x")
    n_inliers, n_outliers, n_random, gamma = _check_trimap_args(
        x, n_inliers, n_outliers, n_random, gamma
    )
    seed = check_positive_int(seed, "seed", minimum=0)
    return _trimap_sample(
        x, _trimap_knn(x, n_inliers), n_inliers, n_outliers, n_random, gamma, seed
    )


def _check_trimap_args(x, n_inliers, n_outliers, n_random, gamma):
    return (
        check_positive_int(n_inliers, "n_inliers", maximum=x.shape[0] - 2),
        check_positive_int(n_outliers, "n_outliers"),
        check_positive_int(n_random, "n_random", minimum=0),
        check_positive_float(gamma, "gamma"),
    )


def _trimap_knn(x, n_inliers):
    r"""The seed-independent part of :func:`trimap_triplets`: neighbours, their squared distances
    and the scales :math:`\sigma_i` (mean distance to the 4th–6th nearest neighbours: columns
    3–5 of ``nn``, which excludes the point itself)."""
    n = x.shape[0]
    K = min(max(n_inliers, 6), n - 1)
    nn = _knn_self(x, K)[1]  # (n, K), the point itself excluded
    d2_nn = _row_sq_dist(x, nn)
    sigma = (
        d2_nn[:, min(3, K - 1) : 6].sqrt().mean(1).clamp(min=torch.finfo(x.dtype).tiny)
    )
    return nn, d2_nn, sigma


def _trimap_sample(x, knn, n_inliers, n_outliers, n_random, gamma, seed):
    """The random part of :func:`trimap_triplets` for one ``seed``."""
    nn, d2_nn, sigma = knn
    n = x.shape[0]
    g = torch.Generator(device="cpu").manual_seed(seed)
    arange = torch.arange(n, device=x.device)

    def log_p(a, b, d2):
        return -d2 / (sigma[a] * sigma[b])

    L = n_inliers * n_outliers  # triplets per anchor, before the farther-than-j test
    i = arange.repeat_interleave(L)
    j = nn[:, :n_inliers].repeat_interleave(n_outliers, dim=1).reshape(-1)
    d2_ij = d2_nn[:, :n_inliers].repeat_interleave(n_outliers, dim=1).reshape(-1)
    k = torch.randint(0, n, (i.numel(),), generator=g).to(x.device)
    lr_in = log_p(i, j, d2_ij) - log_p(i, k, _row_sq_dist(x, k.view(n, L)).reshape(-1))
    keep = (lr_in > 0) & (k != i) & (k != j)
    i, j, k, lr_in = i[keep], j[keep], k[keep], lr_in[keep]
    trip = [torch.stack([i, j, k], 1)]
    logs = [lr_in]
    scale = [torch.ones_like(lr_in)]
    if n_random:
        ir = arange.repeat_interleave(n_random)
        a = torch.randint(0, n, (ir.numel(),), generator=g).to(x.device)
        b = torch.randint(0, n, (ir.numel(),), generator=g).to(x.device)
        d2_ab = _row_sq_dist(
            x, torch.cat([a.view(n, n_random), b.view(n, n_random)], 1)
        )
        d2_a, d2_b = d2_ab[:, :n_random].reshape(-1), d2_ab[:, n_random:].reshape(-1)
        ok = (a != ir) & (b != ir) & (a != b)
        ir, a, b = ir[ok], a[ok], b[ok]
        lr = log_p(ir, a, d2_a[ok]) - log_p(ir, b, d2_b[ok])
        jr, kr = torch.where(lr >= 0, a, b), torch.where(lr >= 0, b, a)
        trip.append(torch.stack([ir, jr, kr], 1))
        logs.append(lr.abs())
        scale.append(torch.full_like(lr, 0.1))
    trip, logr, scale = torch.cat(trip), torch.cat(logs), torch.cat(scale)
    w = scale * torch.log1p(gamma * (torch.exp(logr - logr.max()) + 1e-4))
    return trip, w


def _pca(x, p):
    xc = x - x.mean(0)
    U, S, V = torch.linalg.svd(xc, full_matrices=False)
    return xc @ V[:p].T


def triplet_embedding(
    x,
    n_components: int = 2,
    n_inliers: int = 10,
    n_outliers: int = 5,
    n_random: int = 3,
    n_iter: int = 400,
    lr: float = 0.1,
    kind: str = "trimap",
    seed=0,
    init=None,
    alpha: float = 1.0,
):
    r"""A TriMap-style embedding: minimize :func:`triplet_loss` over :func:`trimap_triplets`.

    Starts from PCA scaled to standard deviation 0.01 per axis (or ``init (n, n_components)``) and
    runs ``n_iter`` full-batch Adam steps (learning rate ``lr``) in torch. ``x (n, d)`` →
    ``(n, n_components)`` on ``x``'s device and dtype. ``seed`` (the triplet sampling) may be a
    list of seeds: then one embedding per seed is returned, in a list, and the seeds share the
    neighbour search and the PCA start. Not the ``trimap`` package: the same kind of triplets and
    the same loss, the weights of the original TriMap code (``trimap`` 1.2 uses a tempered
    logarithm instead of :math:`\log(1 + \gamma(\tilde\omega + 10^{-4}))`), and a different
    optimizer (``trimap`` uses delta-bar-delta gradient descent). ``kind`` and ``alpha``
    choose the loss of :func:`triplet_loss` (TriMap's by default).

    Each step evaluates the gradient in closed form (no autograd graph; the forces on all the
    triplets' points are summed by one ``scatter_add_``), so a step costs a few passes over the
    triplets, about :math:`53n` of them with the defaults.
    """
    x, init = promote_floats(x, init)
    x = check_points(x, "x")
    out_dtype, x = x.dtype, x.to(compute_dtype(x.dtype))  # half precision: in float32
    n_components = check_positive_int(n_components, "n_components", maximum=x.shape[1])
    n_iter = check_positive_int(n_iter, "n_iter", minimum=0)
    lr = check_positive_float(lr, "lr")
    kind = check_choice(kind, "kind", KINDS)
    alpha = check_positive_float(alpha, "alpha")
    args = _check_trimap_args(x, n_inliers, n_outliers, n_random, 500.0)
    single = not isinstance(seed, (list, tuple, range))
    seeds = [
        check_positive_int(s_, "seed", minimum=0) for s_ in ([seed] if single else seed)
    ]
    if not seeds:
        raise ValueError("seed is an empty list; give a seed or a list of seeds")
    if init is None:
        Y0 = _pca(x, n_components)
        Y0 = 0.01 * Y0 / Y0.std(0).clamp(min=torch.finfo(x.dtype).tiny)
    else:
        Y0 = check_points(init, "init", like=x)
        if Y0.shape != (x.shape[0], n_components):
            raise ValueError(
                f"init must have shape {(x.shape[0], n_components)}, got {tuple(Y0.shape)}"
            )
    knn = _trimap_knn(x, args[0])
    out = [
        _fit_triplets(Y0, *_trimap_sample(x, knn, *args, s_), n_iter, lr, kind, alpha)
        for s_ in seeds
    ]
    out = [Y.to(out_dtype) for Y in out]
    return out[0] if single else out


class _TripletGrad:
    r"""The loss :func:`triplet_loss` and its gradient in closed form (no autograd graph), for
    coordinates stored transposed, ``Yt (p, n)``: every operation then runs on contiguous rows of
    length ``m`` (the triplets) instead of reducing over a last dimension of size ``p``.

    With :math:`a_{ij} = 1 + \lVert y_i - y_j\rVert^2 = 1/s_{ij}` and :math:`S = a_{ij} + a_{ik}`,
    the derivatives in :math:`q_{ij} = \lVert y_i - y_j\rVert^2` and :math:`q_{ik}` are, per unit
    weight, :math:`\kappa(1-\kappa)s_{ij} = a_{ik}/S^2` and :math:`-\kappa(1-\kappa)s_{ik} =
    -a_{ij}/S^2` (TriMap), :math:`\pm(1-p)` (STE, :math:`1 - p = \sigma(q_{ij} - q_{ik})`),
    :math:`\pm(1-p)\,\tfrac{\alpha+1}{2}/(\alpha + q)` with :math:`q = q_{ij}` or :math:`q_{ik}`
    (t-STE; at :math:`\alpha = 1`, :math:`(1-\kappa)s_{ij} = 1/S`), :math:`\pm 1` on the
    active terms (hinge). With
    :math:`\partial q_{ij}/\partial y_i = 2(y_i - y_j) = -\partial q_{ij}/\partial y_j`, the forces
    on ``i``, ``j`` and ``k`` are gathered into one buffer and added by one ``scatter_add_``."""

    def __init__(self, trip, w, kind, p, alpha=1.0):
        self.i, self.j, self.k = (trip[:, c].contiguous() for c in range(3))
        self.w, self.kind, self.alpha, m = w, kind, alpha, trip.shape[0]
        self.ijk = torch.cat([self.i, self.j, self.k])
        self.index = self.ijk[None, :].expand(p, 3 * m)
        # buffers reused by every call: a step allocates no triplet-sized temporaries
        new = lambda *shape: torch.empty(*shape, dtype=w.dtype, device=w.device)  # noqa: E731
        self.Ys, self.vals = new(p, 3 * m), new(p, 3 * m)
        self.dij, self.dik, self.sq = new(p, m), new(p, m), new(p, m)
        self.aij, self.aik, self.gij, self.gik = new(m), new(m), new(m), new(m)

    def __call__(self, Yt, with_loss: bool = False):
        m, w = self.i.shape[0], self.w
        Ys, dij, dik, sq, aij, aik, gij, gik = (
            self.Ys,
            self.dij,
            self.dik,
            self.sq,
            self.aij,
            self.aik,
            self.gij,
            self.gik,
        )
        torch.index_select(
            Yt, 1, self.ijk, out=Ys
        )  # (p, 3m): y_i, y_j, y_k side by side
        torch.sub(Ys[:, :m], Ys[:, m : 2 * m], out=dij)
        torch.sub(Ys[:, :m], Ys[:, 2 * m :], out=dik)
        torch.sum(torch.mul(dij, dij, out=sq), 0, out=aij).add_(1.0)
        torch.sum(torch.mul(dik, dik, out=sq), 0, out=aik).add_(1.0)
        loss = None
        if self.kind == "hinge":
            margin = aij - aik + 1.0
            torch.mul(w, margin > 0, out=gij)
            gik.copy_(gij)  # minus the derivative in q_ik
            if with_loss:
                loss = (w * margin.clamp(min=0)).sum()
        elif self.kind == "trimap":
            S = torch.add(aij, aik, out=gik)  # a_ij + a_ik, in gik's buffer for now
            if with_loss:
                loss = (w * aij / S).sum()  # 1 - kappa = a_ij / S
            r = S.square_().reciprocal_().mul_(w)  # w / S²
            torch.mul(r, aik, out=gij)
            r.mul_(aij)  # gik = w a_ij / S²
        else:  # STE and t-STE: loss softplus(z), z = log s_ik − log s_ij, 1 − p = σ(z)
            if self.kind == "ste":
                z = aij - aik  # q_ij − q_ik
            else:
                al, c = self.alpha, (self.alpha + 1.0) / 2.0
                z = c * (torch.log1p((aij - 1.0) / al) - torch.log1p((aik - 1.0) / al))
            if with_loss:
                loss = (w * _softplus(z)).sum()
            r = torch.sigmoid(z).mul_(w)  # w (1 − p)
            if self.kind == "ste":
                gij.copy_(r)
                gik.copy_(r)
            else:  # d log s / d q = −c / (alpha − 1 + a), a = 1 + q
                torch.div(r, aij.add(al - 1.0), out=gij).mul_(c)
                torch.div(r, aik.add(al - 1.0), out=gik).mul_(c)
        fij, fik = dij.mul_(gij.mul_(2.0)), dik.mul_(gik.mul_(2.0))
        torch.sub(fij, fik, out=self.vals[:, :m])
        torch.neg(fij, out=self.vals[:, m : 2 * m])
        self.vals[:, 2 * m :] = fik
        grad = torch.zeros_like(Yt).scatter_add_(1, self.index, self.vals)
        return (grad, loss) if with_loss else grad


def _fit_triplets(Y0, trip, w, n_iter, lr, kind, alpha=1.0):
    """``n_iter`` full-batch Adam steps on ``triplet_loss(Y, trip, w / w.sum(), kind, alpha)``
    from ``Y0``."""
    Yt = Y0.T.clone().contiguous().requires_grad_(True)  # (p, n): see _TripletGrad
    opt = torch.optim.Adam([Yt], lr=lr)
    grad = _TripletGrad(trip, w / w.sum(), kind, Yt.shape[0], alpha)
    for _ in range(n_iter):
        Yt.grad = grad(Yt.detach())
        opt.step()
    return Yt.detach().T.contiguous()


def ordinal_embedding(
    triplets,
    n_points: int,
    n_components: int = 2,
    kind: str = "tste",
    n_iter: int = 500,
    lr: float = 0.1,
    seed: int = 0,
    dtype=None,
    device=None,
    alpha: float = 1.0,
) -> torch.Tensor:
    r"""Ordinal embedding: points that satisfy "``i`` is closer to ``j`` than to ``k``" statements.

    Only the comparisons are given, no coordinates. Minimizes :func:`triplet_loss` of ``kind``
    (t-STE with ``alpha`` degrees of freedom by default) from a small random start with ``n_iter`` Adam steps. ``triplets (m, 3)``
    integer indices into ``n_points`` objects; returns ``(n_points, n_components)``, determined up
    to a similarity transform (and only ordinally).
    """
    n_points = check_positive_int(n_points, "n_points", minimum=3)
    n_components = check_positive_int(n_components, "n_components")
    n_iter = check_positive_int(n_iter, "n_iter", minimum=0)
    lr = check_positive_float(lr, "lr")
    kind = check_choice(kind, "kind", KINDS)
    alpha = check_positive_float(alpha, "alpha")
    device = torch.device(device) if device is not None else torch.device("cpu")
    t = _check_triplets(triplets, n_points, device, "n_points")
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator(device="cpu").manual_seed(seed)
    Y0 = (1e-2 * torch.randn(n_points, n_components, generator=g, dtype=dtype)).to(
        device
    )
    return _fit_triplets(
        Y0,
        t,
        torch.ones(t.shape[0], dtype=dtype, device=device),
        n_iter,
        lr,
        kind,
        alpha,
    )


def triplet_accuracy(y, triplets) -> float:
    """Fraction of triplets ``(i, j, k)`` with ``|y_i − y_j| < |y_i − y_k|`` in the embedding ``y``."""
    Y = check_points(y, "y")
    t = _check_triplets(triplets, Y.shape[0], Y.device)
    dij = ((Y[t[:, 0]] - Y[t[:, 1]]) ** 2).sum(-1)
    dik = ((Y[t[:, 0]] - Y[t[:, 2]]) ** 2).sum(-1)
    return float((dij < dik).to(Y.dtype).mean())
