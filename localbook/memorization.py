r"""Memorization as stability times feature alignment (Bombari & Mondelli, ICML 2024).

A generalized linear model :math:`f(z, \theta) = \phi(z)^\top\theta` trained to interpolation by
gradient descent from :math:`\theta_0` ends at the interpolator closest to :math:`\theta_0`,

.. math:: \theta^* = \theta_0 + \Phi^+ (G - \Phi\theta_0), \qquad \Phi = [\phi(z_1), \dots, \phi(z_N)]^\top .

Removing sample :math:`i` moves :math:`\theta^*` along one direction only (a rank-one update):
:math:`\theta^* - \theta^*_{-i} = S_{z_i}(z_i)\, P^\perp_{-i}\phi(z_i) / \|P^\perp_{-i}\phi(z_i)\|^2`, where
:math:`P^\perp_{-i}` projects onto the orthogonal complement of the span of the *other* samples'
features. Hence the **stability** :math:`S_{z_i}(z) = f(z, \theta^*) - f(z, \theta^*_{-i})` factorizes as

.. math:: S_{z_i}(z) = F_\phi(z, z_i)\, S_{z_i}(z_i), \qquad
          F_\phi(z, z_i) = \frac{\phi(z)^\top P^\perp_{-i}\phi(z_i)}{\|P^\perp_{-i}\phi(z_i)\|^2},

the **feature alignment**. With :math:`K = \Phi\Phi^\top`, :math:`A = K^{-1}` and :math:`r = G - \Phi\theta_0`
both have closed forms that need one :math:`N\times N` Cholesky
factorization for *all* :math:`i` at once:

.. math:: F_\phi(z, z_i) = [A\,\Phi\phi(z)]_i, \qquad S_{z_i}(z_i) = [A r]_i / A_{ii}.

The module also holds the random-feature and NTK feature maps, probabilists' Hermite polynomials

The feature maps and the alignment constants the chapter compares with live in
:mod:`localbook.features`; the data with spurious features in :mod:`localbook.datasets`. This
module fits, measures stability and alignment, and runs the experiment of chapter 10
(:func:`memorization_curve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ._validate import (
    as_tensor,
    check_choice,
    check_index,
    check_positive_float,
    check_positive_int,
    check_targets,
    compute_dtype,
    promote_floats,
)
from .datasets import _spurious_dims, spurious_gaussian_data
from .features import gaussian_weights, get_activation, ntk_kernel, random_features
from .kernels import chunk_rows, iter_chunks

__all__ = [
    "min_norm_fit",
    "stability",
    "feature_alignment",
    "MemorizationCurve",
    "memorization_curve",
]


def _check_features(Phi, compute: bool = False):
    """``Phi (N, p)``, ``N ≤ p``; with ``compute``, ``(Phi in its compute dtype, its dtype)``
    (half precision is factorized in float32 and returned in its own dtype)."""
    Phi = as_tensor(Phi, "Phi", ndim=(2,))  # finite check without a full-size temporary
    n, p = Phi.shape
    if n > p:
        raise ValueError(
            f"Phi has N = {n} samples but only p = {p} features: interpolation fails for N > p "
            "(the N×N kernel ΦΦᵀ has rank ≤ p < N, so no θ fits arbitrary targets exactly). "
            "Use more features (p ≥ N) or fewer samples."
        )
    return (Phi.to(compute_dtype(Phi.dtype)), Phi.dtype) if compute else Phi


def _cholesky(Phi: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of the kernel ``ΦΦᵀ`` with a clear error when it is singular."""
    K = Phi @ Phi.T
    L, info = torch.linalg.cholesky_ex(K)
    # a rank-deficient K can survive rounding with a tiny pivot: treat that as singular too
    tiny = 100 * K.shape[0] * torch.finfo(K.dtype).eps * float(torch.diagonal(K).max())
    if int(info) != 0 or float(torch.diagonal(L).min()) ** 2 < tiny:
        raise ValueError(
            "Phi's rows are linearly dependent (the kernel ΦΦᵀ is singular): interpolation fails, "
            "since no θ fits arbitrary targets and the leave-one-out update is undefined. Remove "
            "duplicate samples or use more / different features."
        )
    return L


def _check_theta0(theta0, p: int, like: torch.Tensor) -> Optional[torch.Tensor]:
    if theta0 is None:
        return None
    t = as_tensor(theta0, "theta0", like=like, ndim=(1, 2))
    if t.shape[0] != p:
        raise ValueError(
            f"theta0 has {t.shape[0]} entries but Phi has p = {p} features; they must match"
        )
    return t


def _residual(Phi, G, theta0):
    """Targets minus the initial model's outputs, ``r = G − Φθ₀``, as ``(N, c)``."""
    G2, squeeze = check_targets(G, Phi.shape[0], like=Phi, name="G", data_name="Phi")
    t0 = _check_theta0(theta0, Phi.shape[1], Phi)
    if t0 is not None:
        t2 = t0[:, None] if t0.ndim == 1 else t0
        if t2.shape[1] != G2.shape[1]:
            raise ValueError(
                f"theta0 has {t2.shape[1]} column(s) but G has {G2.shape[1]}; they must match"
            )
        G2 = G2 - Phi @ t2
    return G2, squeeze, t0


def min_norm_fit(Phi, G, theta0=None) -> torch.Tensor:
    r"""The interpolator closest to ``theta0``: :math:`\theta^* = \theta_0 + \Phi^\top (\Phi\Phi^\top)^{-1}(G - \Phi\theta_0)`.

    This equals :math:`\theta_0 + \Phi^+(G - \Phi\theta_0)` and is the limit of gradient descent on
    :math:`\|\Phi\theta - G\|^2` started at :math:`\theta_0`. Solved through a Cholesky factorization
    of the ``N×N`` kernel (no pseudo-inverse of ``Φ``). Shapes: ``Phi (N, p)`` with ``N ≤ p``,
    ``G (N,)`` or ``(N, c)``, ``theta0 (p,)`` or ``(p, c)`` (default 0). Returns ``(p,)`` or ``(p, c)``.
    """
    Phi, G, theta0 = promote_floats(Phi, G, theta0)
    Phi, out_dtype = _check_features(Phi, compute=True)
    r, squeeze, t0 = _residual(Phi, G, theta0)
    L = _cholesky(Phi)
    theta = Phi.T @ torch.cholesky_solve(r, L)
    if t0 is not None:
        theta = theta + (t0[:, None] if t0.ndim == 1 else t0)
    return (theta[:, 0] if squeeze else theta).to(out_dtype)


def _check_query_features(phi_z, Phi: torch.Tensor):
    q = as_tensor(phi_z, "phi_z", like=Phi, ndim=(1, 2))
    single = q.ndim == 1
    if single:
        q = q[None, :]
    if q.shape[1] != Phi.shape[1]:
        raise ValueError(
            f"phi_z has {q.shape[1]} features per row but Phi has p = {Phi.shape[1]}; they must match"
        )
    return q, single


def _alignment_columns(Phi, A, q, cols) -> torch.Tensor:
    """``F[a, j] = (k(q_a)ᵀ A)[cols_j]`` in row chunks of the queries, ``(m, len(cols))``."""
    m, n = q.shape[0], Phi.shape[0]
    Acols = A[:, cols]
    out = torch.empty(m, Acols.shape[1], dtype=Phi.dtype, device=Phi.device)
    rows = chunk_rows(
        m, max(n, Phi.shape[1] // 4 + 1), 1, Phi.element_size(), None, Phi.device
    )
    for sl in iter_chunks(m, rows):
        out[sl] = (q[sl] @ Phi.T) @ Acols
    return out


def _index_or_all(i, n: int):
    if i is None:
        return slice(None), False
    return [check_index(i, n, "i")], True


def feature_alignment(Phi, i, phi_z) -> torch.Tensor:
    r"""Feature alignment :math:`F_\phi(z, z_i) = \phi(z)^\top P^\perp_{-i}\phi(z_i) / \|P^\perp_{-i}\phi(z_i)\|^2`.

    :math:`P^\perp_{-i}` projects onto the orthogonal complement of the span of the other training
    features :math:`\{\phi(z_j)\}_{j\ne i}` — the part of :math:`\phi(z_i)` the rest of the data does
    not explain. Computed as :math:`[K^{-1}\Phi\phi(z)]_i` with one Cholesky factorization.
    Shapes: ``Phi (N, p)``, ``phi_z (p,)`` or ``(m, p)`` query feature rows, ``i`` an index or
    ``None`` for every ``i``. Returns ``()``/``(m,)`` for one ``i``, ``(N,)``/``(m, N)`` for all.
    ``F(z_i, z_i) = 1``.
    """
    Phi, phi_z = promote_floats(Phi, phi_z)
    Phi, out_dtype = _check_features(Phi, compute=True)
    cols, one = _index_or_all(i, Phi.shape[0])
    q, single = _check_query_features(phi_z, Phi)
    L = _cholesky(Phi)
    A = torch.cholesky_solve(
        torch.eye(L.shape[0], dtype=L.dtype, device=L.device), L
    )  # K⁻¹
    F = _alignment_columns(Phi, A, q, cols)
    F = F[:, 0] if one else F
    return (F[0] if single else F).to(out_dtype)


def stability(Phi, G, i, phi_z, theta0=None) -> torch.Tensor:
    r"""Leave-one-out stability :math:`S_{z_i}(z) = f(z, \theta^*) - f(z, \theta^*_{-i})` of the min-norm interpolator.

    By the rank-one update :math:`\theta^* - \theta^*_{-i} = S_{z_i}(z_i)\,\Phi^\top K^{-1}e_i` (no refit):
    :math:`S_{z_i}(z) = F_\phi(z, z_i)\,S_{z_i}(z_i)` with :math:`S_{z_i}(z_i) = [K^{-1}r]_i/[K^{-1}]_{ii}`,
    :math:`r = G - \Phi\theta_0`, :math:`K = \Phi\Phi^\top`. ``i=None`` gives every ``i`` at once for the
    cost of one ``N×N`` factorization. Shapes: ``Phi (N, p)``, ``G (N,)``, ``phi_z (p,)`` or
    ``(m, p)``, ``theta0 (p,)`` (default 0; the result does not depend on it when ``θ₀ = 0``).
    Returns ``()``/``(m,)`` for one ``i``, ``(N,)``/``(m, N)`` for all.
    """
    Phi, G, phi_z, theta0 = promote_floats(Phi, G, phi_z, theta0)
    Phi, out_dtype = _check_features(Phi, compute=True)
    n = Phi.shape[0]
    cols, one = _index_or_all(i, n)
    r, squeeze, _ = _residual(Phi, G, theta0)
    if not squeeze and r.shape[1] != 1:
        raise ValueError(
            f"G must be a vector of N = {n} targets, got shape {tuple(r.shape)}"
        )
    q, single = _check_query_features(phi_z, Phi)
    L = _cholesky(Phi)
    A = torch.cholesky_solve(
        torch.eye(L.shape[0], dtype=L.dtype, device=L.device), L
    )  # K⁻¹
    self_stab = (A @ r)[:, 0] / torch.diagonal(A)  # S_{z_j}(z_j) for every j, (N,)
    S = _alignment_columns(Phi, A, q, cols) * self_stab[cols]
    S = S[:, 0] if one else S
    return (S[0] if single else S).to(out_dtype)


# ----------------------------------------------------------------------------------------------
# experiment runner
# ----------------------------------------------------------------------------------------------


@dataclass
class MemorizationCurve:
    """Test and spurious accuracy of min-norm RF/NTK classifiers; arrays ``(n_alpha, n_N, n_seeds)``.

    ``spurious_accuracy`` is measured on the counterparts named by ``counterpart``;
    ``spurious_accuracy_zero`` on the zeroed counterparts :math:`[0, y_i]` of the same fit (the
    same tensor when ``counterpart="zero"``; ``None`` with a custom sampler)."""

    n_train: Tuple[int, ...]
    alpha: Tuple[float, ...]
    model: str
    activation: str
    test_accuracy: torch.Tensor
    spurious_accuracy: torch.Tensor
    counterpart: str = "resample"
    spurious_accuracy_zero: Optional[torch.Tensor] = None

    def summary(self, which: str = "spurious"):
        """Mean and standard deviation over seeds, each ``(n_alpha, n_N)``; ``which`` is
        ``"spurious"``, ``"spurious_zero"`` or ``"test"``."""
        which = check_choice(which, "which", ["spurious", "spurious_zero", "test"])
        a = {
            "spurious": self.spurious_accuracy,
            "spurious_zero": self.spurious_accuracy_zero,
            "test": self.test_accuracy,
        }[which]
        if a is None:
            raise ValueError(
                "which='spurious_zero' needs the built-in Gaussian sampler (sampler=None)"
            )
        return a.mean(-1), (
            a.std(-1) if a.shape[-1] > 1 else torch.zeros_like(a[..., 0])
        )


def _gram(model, act, W, Za, Zb, Fa=None):
    if model == "ntk":
        return ntk_kernel(Za, Zb, W, act)
    Fb = random_features(Zb, W, act)
    return (random_features(Za, W, act) if Fa is None else Fa) @ Fb.T


def memorization_curve(
    n_train,
    *,
    model: str = "rf",
    activation="h1+h2",
    alpha=0.5,
    d: int = 100,
    k: int = 2000,
    n_test: int = 500,
    seeds=(0, 1, 2),
    sampler=None,
    counterpart: str = "resample",
    dtype=torch.float64,
) -> MemorizationCurve:
    r"""Spurious and test accuracy of the min-norm interpolator against ``N`` (and ``α``).

    For each ``α`` and seed: draw ``max(n_train) + n_test`` samples with ``sampler(n, alpha,
    generator) → (Z, g, Z_spurious)`` (default :func:`~localbook.datasets.spurious_gaussian_data` in dimension ``d``),
    draw ``W`` (:func:`gaussian_weights`, ``k`` rows), and for each ``N`` fit :math:`f = k(\cdot)^\top K^{-1} g`
    on the first ``N`` samples (RF or NTK kernel; ``θ₀ = 0``). *Test accuracy*: sign agreement
    on the ``n_test`` held-out samples; *spurious accuracy*: agreement of
    :math:`\mathrm{sign} f(z_i^s)` with :math:`g_i` on the ``N`` training samples.
    ``counterpart`` (built-in sampler only): ``"resample"`` queries :math:`z_i^s = [\tilde x_i, y_i]`
    with a fresh core (the theorems' assumption), ``"zero"`` queries :math:`[0, y_i]`; either way
    ``spurious_accuracy_zero`` also holds the zeroed counterparts' accuracy from the same fit.
    """
    model = check_choice(model, "model", ["rf", "ntk"])
    counterpart = check_choice(counterpart, "counterpart", ["resample", "zero"])
    builtin = sampler is None
    act = get_activation(activation)
    ns = tuple(
        check_positive_int(v, "n_train")
        for v in (n_train if isinstance(n_train, (list, tuple, range)) else [n_train])
    )
    alphas = tuple(
        check_positive_float(a, "alpha")
        for a in (alpha if isinstance(alpha, (list, tuple)) else [alpha])
    )
    k = check_positive_int(k, "k")
    n_test = check_positive_int(n_test, "n_test")
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    if sampler is None:
        d = check_positive_int(d, "d", minimum=2)

        def sampler(n, a, gen):
            return spurious_gaussian_data(
                n, d, a, gen, counterpart=counterpart, dtype=dtype
            )

    n_max = max(ns)
    test = torch.empty(len(alphas), len(ns), len(seeds), dtype=dtype)
    spur = torch.empty_like(test)
    spur0 = torch.empty_like(test) if builtin else None
    for ai, a in enumerate(alphas):
        for si, seed in enumerate(seeds):
            gen = torch.Generator().manual_seed(seed)
            Z, g, Zs = sampler(n_max + n_test, a, gen)
            Z, g, Zs = (
                as_tensor(t, nm).to(dtype)
                for t, nm in ((Z, "Z"), (g, "g"), (Zs, "Z_spurious"))
            )
            if Z.shape[0] < n_max + n_test:
                raise ValueError(
                    f"sampler returned {Z.shape[0]} samples; {n_max + n_test} are needed"
                )
            W = gaussian_weights(k, Z.shape[1], gen, dtype=dtype)
            Ztr, gtr, Zsp = Z[:n_max], g[:n_max], Zs[:n_max]
            Zte, gte = Z[n_max : n_max + n_test], g[n_max : n_max + n_test]
            Ftr = random_features(Ztr, W, act) if model == "rf" else None
            K = _gram(model, act, W, Ztr, Ztr, Ftr)
            Kte = _gram(model, act, W, Ztr, Zte, Ftr).T
            Ksp = _gram(model, act, W, Ztr, Zsp, Ftr).T
            if builtin and counterpart == "resample":
                dx = _spurious_dims(Z.shape[1], a)[0]
                Z0 = torch.cat([torch.zeros_like(Zsp[:, :dx]), Zsp[:, dx:]], 1)
                K0 = _gram(model, act, W, Ztr, Z0, Ftr).T
            else:
                K0 = Ksp
            for ni, n in enumerate(ns):
                L, info = torch.linalg.cholesky_ex(K[:n, :n])
                if int(info) != 0:
                    raise ValueError(
                        f"the {model} kernel of N = {n} samples is singular: interpolation fails "
                        f"(N is too large for k = {k} features or samples repeat)"
                    )
                c = torch.cholesky_solve(gtr[:n, None], L)[:, 0]
                test[ai, ni, si] = ((Kte[:, :n] @ c).sign() == gte).to(dtype).mean()
                spur[ai, ni, si] = (
                    ((Ksp[:n, :n] @ c).sign() == gtr[:n]).to(dtype).mean()
                )
                if builtin:
                    spur0[ai, ni, si] = (
                        ((K0[:n, :n] @ c).sign() == gtr[:n]).to(dtype).mean()
                    )
    return MemorizationCurve(
        ns, alphas, model, act.name, test, spur, counterpart, spur0
    )
