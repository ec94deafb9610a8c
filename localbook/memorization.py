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
and Hermite activations (ReLU's coefficients in closed form), the alignment constants (the
paper's limit :math:`\gamma`, its profile :math:`\gamma(\rho)` and its average at finite dimension),
data with spurious features, and the experiment runner of chapter 8.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ._validate import (
    as_tensor,
    check_choice,
    check_index,
    check_positive_float,
    check_positive_int,
    check_targets,
)
from .kernels import MEMORY_BUDGET, chunk_rows, iter_chunks

__all__ = [
    "min_norm_fit",
    "stability",
    "feature_alignment",
    "hermite",
    "hermite_coefficients",
    "relu_hermite_coefficients",
    "Activation",
    "get_activation",
    "hermite_activation",
    "gaussian_weights",
    "random_features",
    "ntk_features",
    "ntk_kernel",
    "alignment_limit",
    "alignment_profile",
    "finite_d_alignment",
    "spurious_gaussian_data",
    "add_noise_border",
    "spurious_split",
    "MemorizationCurve",
    "memorization_curve",
]


# ----------------------------------------------------------------------------------------------
# min-norm interpolation, stability, feature alignment
# ----------------------------------------------------------------------------------------------

def _finite_2d(value, name: str, like: Optional[torch.Tensor] = None, ndim=(2,)) -> torch.Tensor:
    """``as_tensor`` with the NaN/inf check done without a full-size temporary.

    A feature matrix can be most of the memory in use; ``torch.isfinite`` on all of it at once
    would briefly need more than its own size. One reduction (a non-finite entry makes the sum
    non-finite) settles the common case; otherwise the count goes row chunk by row chunk.
    """
    t = as_tensor(value, name, like=like, ndim=ndim, finite=False)
    if t.numel() and not bool(torch.isfinite(t.sum())):
        t2 = t.reshape(t.shape[0], -1) if t.ndim > 1 else t[:, None]
        rows = chunk_rows(t2.shape[0], t2.shape[1], 1, t2.element_size(), MEMORY_BUDGET)
        bad = sum(int((~torch.isfinite(t2[sl])).sum()) for sl in iter_chunks(t2.shape[0], rows))
        if bad:
            raise ValueError(f"{name} contains {bad} NaN or infinite value(s)")
    return t


def _check_features(Phi) -> torch.Tensor:
    Phi = _finite_2d(Phi, "Phi")
    n, p = Phi.shape
    if n > p:
        raise ValueError(
            f"Phi has N = {n} samples but only p = {p} features: interpolation fails for N > p "
            "(the N×N kernel ΦΦᵀ has rank ≤ p < N, so no θ fits arbitrary targets exactly). "
            "Use more features (p ≥ N) or fewer samples."
        )
    return Phi


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
        raise ValueError(f"theta0 has {t.shape[0]} entries but Phi has p = {p} features; they must match")
    return t


def _residual(Phi, G, theta0):
    """Targets minus the initial model's outputs, ``r = G − Φθ₀``, as ``(N, c)``."""
    G2, squeeze = check_targets(G, Phi.shape[0], like=Phi, name="G")
    t0 = _check_theta0(theta0, Phi.shape[1], Phi)
    if t0 is not None:
        t2 = t0[:, None] if t0.ndim == 1 else t0
        if t2.shape[1] != G2.shape[1]:
            raise ValueError(f"theta0 has {t2.shape[1]} column(s) but G has {G2.shape[1]}; they must match")
        G2 = G2 - Phi @ t2
    return G2, squeeze, t0


def min_norm_fit(Phi, G, theta0=None) -> torch.Tensor:
    r"""The interpolator closest to ``theta0``: :math:`\theta^* = \theta_0 + \Phi^\top (\Phi\Phi^\top)^{-1}(G - \Phi\theta_0)`.

    This equals :math:`\theta_0 + \Phi^+(G - \Phi\theta_0)` and is the limit of gradient descent on
    :math:`\|\Phi\theta - G\|^2` started at :math:`\theta_0`. Solved through a Cholesky factorization
    of the ``N×N`` kernel (no pseudo-inverse of ``Φ``). Shapes: ``Phi (N, p)`` with ``N ≤ p``,
    ``G (N,)`` or ``(N, c)``, ``theta0 (p,)`` or ``(p, c)`` (default 0). Returns ``(p,)`` or ``(p, c)``.
    """
    Phi = _check_features(Phi)
    r, squeeze, t0 = _residual(Phi, G, theta0)
    L = _cholesky(Phi)
    theta = Phi.T @ torch.cholesky_solve(r, L)
    if t0 is not None:
        theta = theta + (t0[:, None] if t0.ndim == 1 else t0)
    return theta[:, 0] if squeeze else theta


def _check_query_features(phi_z, Phi: torch.Tensor):
    q = _finite_2d(phi_z, "phi_z", like=Phi, ndim=(1, 2))
    single = q.ndim == 1
    if single:
        q = q[None, :]
    if q.shape[1] != Phi.shape[1]:
        raise ValueError(f"phi_z has {q.shape[1]} features per row but Phi has p = {Phi.shape[1]}; they must match")
    return q, single


def _alignment_columns(Phi, A, q, cols) -> torch.Tensor:
    """``F[a, j] = (k(q_a)ᵀ A)[cols_j]`` in row chunks of the queries, ``(m, len(cols))``."""
    m, n = q.shape[0], Phi.shape[0]
    Acols = A[:, cols]
    out = torch.empty(m, Acols.shape[1], dtype=Phi.dtype, device=Phi.device)
    rows = chunk_rows(m, max(n, Phi.shape[1] // 4 + 1), 1, Phi.element_size(), MEMORY_BUDGET)
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
    Phi = _check_features(Phi)
    cols, one = _index_or_all(i, Phi.shape[0])
    q, single = _check_query_features(phi_z, Phi)
    L = _cholesky(Phi)
    A = torch.cholesky_solve(torch.eye(L.shape[0], dtype=L.dtype, device=L.device), L)  # K⁻¹
    F = _alignment_columns(Phi, A, q, cols)
    F = F[:, 0] if one else F
    return F[0] if single else F


def stability(Phi, G, i, phi_z, theta0=None) -> torch.Tensor:
    r"""Leave-one-out stability :math:`S_{z_i}(z) = f(z, \theta^*) - f(z, \theta^*_{-i})` of the min-norm interpolator.

    By the rank-one update :math:`\theta^* - \theta^*_{-i} = S_{z_i}(z_i)\,\Phi^\top K^{-1}e_i` (no refit):
    :math:`S_{z_i}(z) = F_\phi(z, z_i)\,S_{z_i}(z_i)` with :math:`S_{z_i}(z_i) = [K^{-1}r]_i/[K^{-1}]_{ii}`,
    :math:`r = G - \Phi\theta_0`, :math:`K = \Phi\Phi^\top`. ``i=None`` gives every ``i`` at once for the
    cost of one ``N×N`` factorization. Shapes: ``Phi (N, p)``, ``G (N,)``, ``phi_z (p,)`` or
    ``(m, p)``, ``theta0 (p,)`` (default 0; the result does not depend on it when ``θ₀ = 0``).
    Returns ``()``/``(m,)`` for one ``i``, ``(N,)``/``(m, N)`` for all.
    """
    Phi = _check_features(Phi)
    n = Phi.shape[0]
    cols, one = _index_or_all(i, n)
    r, squeeze, _ = _residual(Phi, G, theta0)
    if not squeeze and r.shape[1] != 1:
        raise ValueError(f"G must be a vector of N = {n} targets, got shape {tuple(r.shape)}")
    q, single = _check_query_features(phi_z, Phi)
    L = _cholesky(Phi)
    A = torch.cholesky_solve(torch.eye(L.shape[0], dtype=L.dtype, device=L.device), L)  # K⁻¹
    self_stab = (A @ r)[:, 0] / torch.diagonal(A)  # S_{z_j}(z_j) for every j, (N,)
    S = _alignment_columns(Phi, A, q, cols) * self_stab[cols]
    S = S[:, 0] if one else S
    return S[0] if single else S


# ----------------------------------------------------------------------------------------------
# Hermite polynomials and activations
# ----------------------------------------------------------------------------------------------

def _hermite_table(x: torch.Tensor, degree: int) -> torch.Tensor:
    """Normalized ``h_0..h_degree`` at ``x`` in one pass of the recurrence, ``(degree + 1, *x.shape)``."""
    out = [torch.ones_like(x)]
    if degree >= 1:
        out.append(x.clone())
    for j in range(1, degree):
        # h_{j+1} = (x h_j − √j h_{j−1}) / √(j+1): the recurrence of He_k divided by √(k!)
        out.append((x * out[j] - math.sqrt(j) * out[j - 1]) / math.sqrt(j + 1))
    return torch.stack(out)


def hermite(k, x, normalized: bool = False) -> torch.Tensor:
    r"""Probabilists' Hermite polynomial :math:`He_k(x)` (or :math:`h_k = He_k/\sqrt{k!}` when ``normalized``).

    Recurrence :math:`He_0 = 1`, :math:`He_1 = x`, :math:`He_{k+1} = x He_k - k He_{k-1}`; they are
    orthogonal under the standard Gaussian: :math:`\mathbb E[He_j(g) He_k(g)] = k!\,\delta_{jk}`, so the
    :math:`h_k` are orthonormal. ``x`` any shape; returns the same shape.
    """
    k = check_positive_int(k, "k", minimum=0)
    x = as_tensor(x, "x", ndim=(0, 1, 2, 3), allow_empty=True, finite=False)
    prev, cur = torch.ones_like(x), x.clone()
    if k == 0:
        cur = prev
    for j in range(1, k):
        prev, cur = cur, x * cur - j * prev
    if normalized:
        cur = cur / math.sqrt(math.factorial(k))
    return cur


@dataclass(frozen=True)
class Activation:
    """An activation :math:`\\sigma` with its derivative (the NTK features use :math:`\\sigma'`).

    ``coefficients`` holds the normalized-Hermite expansion :math:`\\sigma = \\sum_l c_l h_l` when it
    is a finite sum (exact derivative :math:`h_l' = \\sqrt{l}\\, h_{l-1}`), else ``None``.
    """

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)
    grad: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)
    coefficients: Optional[Tuple[float, ...]] = None
    #: closed-form normalized Hermite coefficients ``degree → (degree + 1,)`` (ReLU, the step)
    exact_hermite: Optional[Callable[[int], torch.Tensor]] = field(default=None, repr=False, compare=False)
    #: closed-form dual kernel :math:`\rho \mapsto \sum_l \mu_l^2\rho^l = E[\sigma(u)\sigma(v)]`,
    #: ``corr(u, v) = ρ`` (arc-cosine kernels for ReLU and the step)
    dual: Optional[Callable[[torch.Tensor], torch.Tensor]] = field(default=None, repr=False, compare=False)
    known_derivative: Optional["Activation"] = field(default=None, repr=False, compare=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def derivative(self) -> "Activation":
        """The activation :math:`\\sigma'` (exact for Hermite sums; the step function for ReLU)."""
        if self.coefficients is not None:
            c = self.coefficients
            return hermite_activation([math.sqrt(l) * c[l] for l in range(1, len(c))] or [0.0], name=f"({self.name})'")
        if self.known_derivative is not None:
            return self.known_derivative
        return Activation(f"({self.name})'", self.grad, _no_grad(self.name))

    def antiderivative(self) -> "Activation":
        """The Hermite sum whose derivative is this one (constant 0): :math:`h_l \\mapsto h_{l+1}/\\sqrt{l+1}`.

        The paper labels NTK activations by :math:`\\sigma'`; ``get_activation("h0+h1").antiderivative()``
        is the activation whose NTK features use :math:`\\sigma' = h_0 + h_1`.
        """
        if self.coefficients is None:
            raise ValueError(f"antiderivative needs a Hermite-sum activation, got {self.name!r}")
        c = self.coefficients
        return hermite_activation([0.0] + [c[l] / math.sqrt(l + 1) for l in range(len(c))], name=f"∫({self.name})")


def _no_grad(name):
    def g(x):
        raise ValueError(f"the second derivative of {name!r} is not available")
    return g


def _hermite_sum(coeffs: Sequence[float]):
    coeffs = [float(c) for c in coeffs]

    def fn(x):
        H = _hermite_table(x, len(coeffs) - 1)
        out = torch.zeros_like(x)
        for l, c in enumerate(coeffs):
            if c != 0.0:
                out = out + c * H[l]
        return out

    return fn


def hermite_activation(coefficients: Sequence[float], name: Optional[str] = None) -> Activation:
    r"""The activation :math:`\sigma = \sum_l c_l h_l` from normalized-Hermite coefficients ``c``."""
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or not np.all(np.isfinite(c)):
        raise ValueError(f"coefficients must be a non-empty 1-D list of finite numbers, got {coefficients!r}")
    c = tuple(float(v) for v in c)
    if name is None:
        name = "+".join(f"{v:g}·h{l}" if v != 1 else f"h{l}" for l, v in enumerate(c) if v != 0) or "0"
    dc = [math.sqrt(l) * c[l] for l in range(1, len(c))] or [0.0]
    return Activation(name, _hermite_sum(c), _hermite_sum(dc), c)


_HERMITE_SPEC = re.compile(r"^\s*h\d+\s*(\+\s*h\d+\s*)*$")


def get_activation(spec) -> Activation:
    r"""An :class:`Activation` by name: ``"relu"``, ``"tanh"``, or a sum of normalized Hermite
    polynomials such as ``"h1+h2"``, ``"h1+h4"``, ``"h0+h1"``, ``"h0+h3"`` (an :class:`Activation`
    passes through)."""
    if isinstance(spec, Activation):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"activation must be a name such as 'relu' or 'h1+h2', got {type(spec).__name__}")
    s = spec.replace(" ", "")
    if s == "relu":
        step = Activation("(relu)'", lambda x: (x > 0).to(x.dtype), _no_grad("relu"),
                          exact_hermite=functools.partial(relu_hermite_coefficients, derivative=True),
                          dual=_arccos0)
        return Activation("relu", torch.relu, step.fn, exact_hermite=relu_hermite_coefficients,
                          dual=_arccos1, known_derivative=step)
    if s == "tanh":
        return Activation("tanh", torch.tanh, lambda x: 1 - torch.tanh(x) ** 2)
    if _HERMITE_SPEC.match(s):
        degrees = [int(t[1:]) for t in s.split("+")]
        c = [0.0] * (max(degrees) + 1)
        for l in degrees:
            c[l] += 1.0
        return hermite_activation(c, name=s)
    raise ValueError(f"unknown activation {spec!r}; expected 'relu', 'tanh' or a Hermite sum like 'h1+h2'")


@functools.lru_cache(maxsize=16)
def _gauss_hermite(n_nodes: int):
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_nodes)
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


def hermite_coefficients(act, degree: int = 8, n_nodes: int = 200) -> torch.Tensor:
    r"""Normalized Hermite coefficients :math:`\mu_l = \mathbb E_{\xi\sim N(0,1)}[\sigma(\xi)\, h_l(\xi)]`, ``l = 0..degree``.

    Gauss–Hermite quadrature for the weight :math:`e^{-x^2/2}` (``numpy.polynomial.hermite_e.hermegauss``)
    with ``n_nodes`` nodes: exact for polynomial activations of degree ``< 2·n_nodes − degree``;
    for a kink the error decays only like ``1/n_nodes`` (about 1e-3 at 200 nodes), so ReLU and
    its derivative (the step) use their closed forms instead (:func:`relu_hermite_coefficients`;
    ``n_nodes`` is then ignored). ``n_nodes ≤ 360`` (numpy's weights overflow beyond). ``act`` is
    a name, an :class:`Activation` or a callable on tensors. Returns a float64 tensor
    ``(degree + 1,)``.
    """
    degree = check_positive_int(degree, "degree", minimum=0)
    n_nodes = check_positive_int(n_nodes, "n_nodes", minimum=1, maximum=360)  # numpy overflows beyond
    fn = act if (callable(act) and not isinstance(act, str)) else get_activation(act)
    if isinstance(fn, Activation) and fn.exact_hermite is not None:
        return fn.exact_hermite(degree)
    nodes, weights = _gauss_hermite(n_nodes)
    x = torch.tensor(nodes, dtype=torch.float64)
    w = torch.tensor(weights / math.sqrt(2 * math.pi), dtype=torch.float64)
    fx = torch.as_tensor(fn(x), dtype=torch.float64)
    return _hermite_table(x, degree) @ (w * fx)


def _he_at_zero(m: int) -> Tuple[float, float]:
    """``(sign, log|He_m(0)|)`` with ``He_m(0) = 0`` for odd ``m`` (sign 0) and
    ``He_{2j}(0) = (−1)^j (2j − 1)!! = (−1)^j (2j)! / (2^j j!)``."""
    if m % 2:
        return 0.0, -math.inf
    j = m // 2
    return (-1.0) ** j, math.lgamma(2 * j + 1) - j * math.log(2.0) - math.lgamma(j + 1)


def relu_hermite_coefficients(degree: int = 8, derivative: bool = False) -> torch.Tensor:
    r"""Exact normalized Hermite coefficients of ReLU (or of its derivative, the step function).

    With :math:`h_n = He_n/\sqrt{n!}` and :math:`\phi` the standard normal density, integrating by
    parts with :math:`(He_{n-1}\phi)' = -He_n\phi` gives

    * ReLU: :math:`\mu_0 = 1/\sqrt{2\pi}`, :math:`\mu_1 = 1/2`,
      :math:`\mu_n = He_{n-2}(0)/\sqrt{2\pi\, n!}` for :math:`n \ge 2`;
    * step :math:`1[x > 0]`: :math:`\mu'_0 = 1/2`, :math:`\mu'_n = He_{n-1}(0)/\sqrt{2\pi\, n!}`
      for :math:`n \ge 1`,

    with :math:`He_m(0) = 0` for odd :math:`m` and :math:`He_{2j}(0) = (-1)^j(2j-1)!!`. So
    :math:`\mu_2 = 1/\sqrt{4\pi}`, odd :math:`\mu_n` (:math:`n\ge3`) vanish, even :math:`\mu'_n`
    (:math:`n\ge2`) vanish, and :math:`\mu'_{n-1} = \sqrt n\,\mu_n`. Returns float64 ``(degree + 1,)``.
    """
    degree = check_positive_int(degree, "degree", minimum=0)
    out = torch.zeros(degree + 1, dtype=torch.float64)
    log_s2pi = 0.5 * math.log(2 * math.pi)
    shift = 1 if derivative else 2
    for n in range(degree + 1):
        if n < shift:
            continue
        sign, log_he = _he_at_zero(n - shift)
        if sign:
            out[n] = sign * math.exp(log_he - log_s2pi - 0.5 * math.lgamma(n + 1))
    if derivative:
        out[0] = 0.5
    else:
        out[0] = 1 / math.sqrt(2 * math.pi)
        if degree >= 1:
            out[1] = 0.5
    return out


def _arccos1(rho: torch.Tensor) -> torch.Tensor:
    """ReLU's dual kernel :math:`E[\\mathrm{relu}(u)\\mathrm{relu}(v)] = (\\sqrt{1-\\rho^2} + (\\pi - \\arccos\\rho)\\rho)/2\\pi`."""
    r = rho.clamp(-1.0, 1.0)
    return (torch.sqrt((1 - r * r).clamp_min(0.0)) + (math.pi - torch.arccos(r)) * r) / (2 * math.pi)


def _arccos0(rho: torch.Tensor) -> torch.Tensor:
    """The step function's dual kernel :math:`P(u > 0, v > 0) = (\\pi - \\arccos\\rho)/2\\pi`."""
    return (math.pi - torch.arccos(rho.clamp(-1.0, 1.0))) / (2 * math.pi)


# ----------------------------------------------------------------------------------------------
# feature maps
# ----------------------------------------------------------------------------------------------

def gaussian_weights(k: int, d: int, generator: Optional[torch.Generator] = None, dtype=None, device=None) -> torch.Tensor:
    r"""First-layer weights :math:`W_{ij} \sim N(0, 1/d)`, ``(k, d)``: for :math:`\|z\| = \sqrt d` each
    pre-activation :math:`w_j^\top z` is approximately standard Gaussian."""
    k = check_positive_int(k, "k")
    d = check_positive_int(d, "d")
    dtype = dtype or torch.get_default_dtype()
    return torch.randn(k, d, generator=generator, dtype=dtype, device=device) / math.sqrt(d)


def _check_z_w(Z, W):
    Z = as_tensor(Z, "Z", ndim=(1, 2))
    if Z.ndim == 1:
        Z = Z[None, :]
    W = as_tensor(W, "W", like=Z, ndim=(2,))
    if W.shape[1] != Z.shape[1]:
        raise ValueError(f"W has {W.shape[1]} input dimension(s) but Z has d = {Z.shape[1]}; they must match")
    return Z, W


def random_features(Z, W, activation="relu") -> torch.Tensor:
    r"""Random features :math:`\phi_{RF}(z) = \sigma(Wz)/\sqrt k`, ``(N, k)`` for ``Z (N, d)``, ``W (k, d)``.

    With :math:`W_{ij}\sim N(0,1/d)` (:func:`gaussian_weights`) and :math:`\|z\|=\sqrt d`, the kernel
    :math:`\phi(z)^\top\phi(z')` tends to :math:`\sum_l \mu_l^2 (z^\top z'/d)^l` as ``k → ∞`` (Mehler).
    The ``1/√k`` only fixes the scale; min-norm predictions do not depend on it.
    """
    Z, W = _check_z_w(Z, W)
    act = get_activation(activation)
    return act(Z @ W.T) / math.sqrt(W.shape[0])


def ntk_features(Z, W, activation="relu") -> torch.Tensor:
    r"""NTK features of a two-layer network, :math:`\phi_{NTK}(z) = (z \otimes \sigma'(Wz))/\sqrt{dk}`, ``(N, d·k)``.

    The gradient of :math:`\sum_j v_j\sigma(w_j^\top z)` in the first-layer weights, normalized so
    that :math:`\phi(z)^\top\phi(z') = (z^\top z'/d)\,\sigma'(Wz)^\top\sigma'(Wz')/k`
    (:func:`ntk_kernel` computes this without forming the ``d·k`` features). Only the derivative
    :math:`\sigma'` enters. Shapes: ``Z (N, d)``, ``W (k, d)``.
    """
    Z, W = _check_z_w(Z, W)
    act = get_activation(activation)
    n, d = Z.shape
    k = W.shape[0]
    D = act.grad(Z @ W.T)
    return (Z[:, :, None] * D[:, None, :]).reshape(n, d * k) / math.sqrt(d * k)


def ntk_kernel(Z1, Z2, W, activation="relu") -> torch.Tensor:
    r"""The NTK Gram matrix :math:`(Z_1Z_2^\top/d)\odot(\sigma'(Z_1W^\top)\sigma'(Z_2W^\top)^\top/k)`, ``(N₁, N₂)``.

    Equals ``ntk_features(Z1, W) @ ntk_features(Z2, W).T`` at ``O(N₁N₂(d+k))`` cost.
    """
    Z1, W = _check_z_w(Z1, W)
    Z2, _ = _check_z_w(as_tensor(Z2, "Z2", like=Z1, ndim=(1, 2)), W)
    act = get_activation(activation)
    d, k = W.shape[1], W.shape[0]
    return (Z1 @ Z2.T / d) * (act.grad(Z1 @ W.T) @ act.grad(Z2 @ W.T).T / k)


def _profile_parts(act, model: str, degree: int, n_nodes: int):
    r"""``(num, den)`` with :math:`\gamma(\rho) = \mathrm{num}(\rho)/\mathrm{den}` (see :func:`alignment_profile`)."""
    model = check_choice(model, "model", ["rf", "ntk"])
    act = get_activation(act)
    base, l0, shift = (act, 2, 0) if model == "rf" else (act.derivative(), 1, 1)
    if base.dual is not None:
        # closed form: Σ_{l ≥ l0} μ_l² ρ^l = dual(ρ) − Σ_{l < l0} μ_l² ρ^l, no truncation
        mu = hermite_coefficients(base, l0 - 1)
        low = [float(m) ** 2 for m in mu]

        def num(r):
            rest = base.dual(r) - sum(c * r ** l for l, c in enumerate(low))
            return r ** shift * rest

        den = float(base.dual(torch.tensor(1.0, dtype=torch.float64))) - sum(low)
    else:
        if base.coefficients is not None:  # a Hermite sum: its coefficients, exactly
            mu = torch.tensor(base.coefficients, dtype=torch.float64)
        else:
            mu = hermite_coefficients(base, degree, n_nodes)
        m2 = mu[l0:] ** 2
        ls = torch.arange(l0, l0 + len(m2), dtype=torch.float64)

        def num(r):
            return (m2 * r[..., None] ** (ls + shift)).sum(-1)

        den = float(m2.sum())
    if not den > 0:
        raise ValueError(f"{base.name!r} has no Hermite energy at degree ≥ {l0}: the alignment is undefined")
    return num, den


def alignment_profile(act, rho, model: str = "rf", degree: int = 30, n_nodes: int = 300):
    r"""The alignment constant as a function of the correlation :math:`\rho = z^\top z^s/d`.

    * RF:  :math:`\gamma_{RF}(\rho) = \sum_{l\ge 2}\mu_l^2\rho^l \,/\, \sum_{l\ge 2}\mu_l^2`, with :math:`\mu_l` the
      Hermite coefficients of :math:`\sigma`;
    * NTK: :math:`\gamma_{NTK}(\rho) = \rho\sum_{l\ge 1}\mu_l'^2\rho^{l} \,/\, \sum_{l\ge 1}\mu_l'^2`, with
      :math:`\mu'_l` those of :math:`\sigma'`.

    The paper's :math:`\gamma` is this at :math:`\rho = \alpha` (:func:`alignment_limit`); a sample whose
    counterpart has correlation :math:`\rho_i` with it is predicted :math:`F \approx \gamma(\rho_i)`
    (chapter 8). Hermite sums use their coefficients exactly; ReLU (RF) and its step derivative
    (NTK) use the arc-cosine dual kernels :math:`\sum_l\mu_l^2\rho^l`, in closed form, so nothing is
    truncated; other activations are truncated at ``degree`` with quadrature coefficients.
    ``rho`` in [−1, 1], a number (returns a float) or a sequence (returns a float64 tensor).
    """
    many = isinstance(rho, (list, tuple, np.ndarray, torch.Tensor)) and np.ndim(rho) == 1
    vals = [float(r) for r in (rho if many else [rho])]
    if any(not (-1.0 <= r <= 1.0) for r in vals):
        raise ValueError(f"rho is a correlation and must be in [-1, 1], got {rho}")
    num, den = _profile_parts(act, model, degree, n_nodes)
    out = num(torch.tensor(vals, dtype=torch.float64)) / den
    return out if many else float(out[0])


def alignment_limit(act, alpha, model: str = "rf", degree: int = 30, n_nodes: int = 300):
    r"""The paper's claimed limit :math:`\gamma` of the feature alignment :math:`F(z^s, z)`.

    As stated by Bombari & Mondelli (2024), Theorems 5.4 and 6.3 (our reading), in the regime where
    each sample's low-degree features are explained by the other samples (``N ≫ d``):

    * RF:  :math:`\gamma_{RF} = \sum_{l\ge 2}\mu_l^2\alpha^l \,/\, \sum_{l\ge 2}\mu_l^2`, with :math:`\mu_l` the
      Hermite coefficients of :math:`\sigma`;
    * NTK: :math:`\gamma_{NTK} = \sum_{l\ge 1}\mu_l'^2\alpha^{l+1} \,/\, \sum_{l\ge 1}\mu_l'^2`, with :math:`\mu'_l`
      those of :math:`\sigma'`.

    :func:`alignment_profile` at :math:`\rho = \alpha`: exact for Hermite sums and for ReLU
    (closed forms :math:`\gamma_{RF} = (\kappa_1(\alpha) - \tfrac1{2\pi} - \tfrac\alpha4)/(\tfrac14 - \tfrac1{2\pi})`
    and :math:`\gamma_{NTK} = 4\alpha(\kappa_0(\alpha) - \tfrac14)` with the arc-cosine kernels
    :math:`\kappa_1(\rho) = (\sqrt{1-\rho^2} + (\pi - \arccos\rho)\rho)/2\pi`,
    :math:`\kappa_0(\rho) = (\pi - \arccos\rho)/2\pi`); other activations are truncated at ``degree``.
    ``alpha`` in (0, 1), a number (returns a float) or a sequence (returns a float64 tensor).
    """
    many = isinstance(alpha, (list, tuple, np.ndarray, torch.Tensor)) and np.ndim(alpha) == 1
    alphas = [check_positive_float(float(a), "alpha") for a in (alpha if many else [alpha])]
    if any(a >= 1 for a in alphas):
        raise ValueError(f"alpha is the spurious fraction d_y/d and must be in (0, 1), got {alpha}")
    return alignment_profile(act, alphas if many else alphas[0], model, degree, n_nodes)


def _spurious_dims(d: int, alpha: float) -> Tuple[int, int]:
    """``(d_x, d_y)`` with ``d_y = round(α d)`` clipped to ``[1, d − 1]`` (as in the data)."""
    dy = min(max(1, round(alpha * d)), d - 1)
    return d - dy, dy


def finite_d_alignment(act, d: int, alpha: float, model: str = "rf", n_nodes: int = 64,
                       degree: int = 30) -> float:
    r"""The alignment constant averaged over the correlation of a sample with its counterpart in dimension ``d``.

    For the ``"resample"`` counterpart of :func:`spurious_gaussian_data` (a fresh core of the same
    norm) the correlation is :math:`\rho = z^\top z^s/d = \alpha + (d_x/d)\,c`, with
    :math:`\alpha = d_y/d` and :math:`c` the cosine between two independent uniform points of the
    sphere in :math:`\mathbb R^{d_x}` (density :math:`\propto (1-c^2)^{(d_x-3)/2}`, :math:`E[c^2] = 1/d_x`,
    :math:`E[c^4] = 3/(d_x(d_x+2))`). Returns :math:`E[\gamma(\rho)]` with :math:`\gamma` from
    :func:`alignment_profile`: the paper's constant with :math:`\alpha` replaced by each sample's own
    :math:`\rho`, averaged. Since :math:`\gamma` is convex on :math:`[0, 1]`, it exceeds
    :math:`\gamma(\alpha)`; e.g. for :math:`\gamma(\rho) = \rho^4`,
    :math:`E[\rho^4] = \alpha^4 + 6\alpha^2 d_x/d^2 + 3d_x^3/((d_x+2)d^4)`. The average is a
    Gauss–Jacobi rule with ``n_nodes`` nodes: exact for Hermite sums of degree ``< 2·n_nodes``.
    """
    from scipy.special import roots_jacobi  # scipy is a dependency; imported here, once needed

    d = check_positive_int(d, "d", minimum=2)
    alpha = check_positive_float(alpha, "alpha")
    if alpha >= 1:
        raise ValueError(f"alpha is the spurious fraction d_y/d and must be in (0, 1), got {alpha}")
    n_nodes = check_positive_int(n_nodes, "n_nodes")
    dx, dy = _spurious_dims(d, alpha)
    if dx == 1:
        c, w = np.array([-1.0, 1.0]), np.array([0.5, 0.5])
    else:
        c, w = roots_jacobi(n_nodes, (dx - 3) / 2, (dx - 3) / 2)
        w = w / w.sum()
    num, den = _profile_parts(act, model, degree, 300)
    rho = torch.as_tensor(dy / d + (dx / d) * c, dtype=torch.float64).clamp(-1.0, 1.0)
    return float((torch.as_tensor(w, dtype=torch.float64) * num(rho)).sum() / den)


# ----------------------------------------------------------------------------------------------
# data with spurious features
# ----------------------------------------------------------------------------------------------

def _sphere(n, d, generator, dtype, device):
    g = torch.randn(n, d, generator=generator, dtype=dtype, device=device)
    return g * (math.sqrt(d) / g.norm(dim=1, keepdim=True))


def spurious_gaussian_data(n: int, d: int, alpha: float, generator: Optional[torch.Generator] = None,
                           counterpart: str = "zero", dtype=None, device=None):
    r"""Samples :math:`z = [x, y]` with core :math:`x` (``d_x = d − d_y``) and spurious :math:`y` (``d_y = round(αd)``).

    :math:`x` and :math:`y` are independent and uniform on the spheres of radius :math:`\sqrt{d_x}`,
    :math:`\sqrt{d_y}` (so :math:`\|z\| = \sqrt d`); the label :math:`g = \mathrm{sign}(u^\top x)` with
    :math:`u = \mathbf 1/\sqrt{d_x}` depends on the core only. The spurious counterpart is
    :math:`z^s = [0, y]` (``counterpart="zero"``, as in the experiments) or :math:`[\tilde x, y]` with a
    fresh core :math:`\tilde x` (``"resample"``, same norm as :math:`z`). Returns ``Z (n, d)``,
    ``g (n,)`` in {−1, +1}, ``Z_spurious (n, d)``.
    """
    n = check_positive_int(n, "n")
    d = check_positive_int(d, "d", minimum=2)
    alpha = check_positive_float(alpha, "alpha")
    if alpha >= 1:
        raise ValueError(f"alpha is the spurious fraction d_y/d and must be in (0, 1), got {alpha}")
    counterpart = check_choice(counterpart, "counterpart", ["zero", "resample"])
    dx, dy = _spurious_dims(d, alpha)
    dtype = dtype or torch.get_default_dtype()
    x = _sphere(n, dx, generator, dtype, device)
    y = _sphere(n, dy, generator, dtype, device)
    g = torch.where(x.sum(1) >= 0, 1.0, -1.0).to(dtype)
    core = torch.zeros_like(x) if counterpart == "zero" else _sphere(n, dx, generator, dtype, device)
    return torch.cat([x, y], 1), g, torch.cat([core, y], 1)


def add_noise_border(images, width: int, scale: float = 1.0, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Surround each image with a border of i.i.d. :math:`N(0, \text{scale}^2)` noise ``width`` pixels wide.

    ``images (n, H, W)`` → ``(n, H + 2·width, W + 2·width)``: the border is the spurious feature
    :math:`y` (independent of the label), the original image the core :math:`x`.
    """
    img = as_tensor(images, "images", ndim=(3,))
    width = check_positive_int(width, "width")
    scale = check_positive_float(scale, "scale", allow_zero=True)
    n, H, W = img.shape
    out = scale * torch.randn(n, H + 2 * width, W + 2 * width, generator=generator, dtype=img.dtype, device=img.device)
    out[:, width:width + H, width:width + W] = img
    return out


def spurious_split(images, border: int):
    r"""Split bordered images into the core part (border zeroed) and the spurious part (centre zeroed).

    ``images (n, H, W)`` → ``(core, spurious)``, both ``(n, H, W)`` with ``core + spurious = images``;
    ``spurious`` is the spurious counterpart :math:`z^s` used to measure spurious accuracy.
    """
    img = as_tensor(images, "images", ndim=(3,))
    border = check_positive_int(border, "border")
    H, W = img.shape[1:]
    if 2 * border >= min(H, W):
        raise ValueError(f"border = {border} leaves no centre in {H}×{W} images; it must be < {min(H, W) / 2}")
    mask = torch.ones(H, W, dtype=torch.bool, device=img.device)
    mask[border:H - border, border:W - border] = False
    spurious = img * mask
    return img - spurious, spurious


# ----------------------------------------------------------------------------------------------
# experiment runner
# ----------------------------------------------------------------------------------------------

@dataclass
class MemorizationCurve:
    """Test and spurious accuracy of min-norm RF/NTK classifiers; arrays ``(n_alpha, n_N, n_seeds)``."""

    n_train: Tuple[int, ...]
    alpha: Tuple[float, ...]
    model: str
    activation: str
    test_accuracy: torch.Tensor
    spurious_accuracy: torch.Tensor

    def summary(self, which: str = "spurious"):
        """Mean and standard deviation over seeds, each ``(n_alpha, n_N)``."""
        which = check_choice(which, "which", ["spurious", "test"])
        a = self.spurious_accuracy if which == "spurious" else self.test_accuracy
        return a.mean(-1), (a.std(-1) if a.shape[-1] > 1 else torch.zeros_like(a[..., 0]))


def _gram(model, act, W, Za, Zb, Fa=None):
    if model == "ntk":
        return ntk_kernel(Za, Zb, W, act)
    Fb = random_features(Zb, W, act)
    return (random_features(Za, W, act) if Fa is None else Fa) @ Fb.T


def memorization_curve(n_train, *, model: str = "rf", activation="h1+h2", alpha=0.5, d: int = 100,
                       k: int = 2000, n_test: int = 500, seeds=(0, 1, 2), sampler=None,
                       counterpart: str = "zero", dtype=torch.float64) -> MemorizationCurve:
    r"""Spurious and test accuracy of the min-norm interpolator against ``N`` (and ``α``).

    For each ``α`` and seed: draw ``max(n_train) + n_test`` samples with ``sampler(n, alpha,
    generator) → (Z, g, Z_spurious)`` (default :func:`spurious_gaussian_data` in dimension ``d``),
    draw ``W`` (:func:`gaussian_weights`, ``k`` rows), and for each ``N`` fit :math:`f = k(\cdot)^\top K^{-1} g`
    on the first ``N`` samples (RF or NTK kernel; ``θ₀ = 0``). *Test accuracy*: sign agreement
    on the ``n_test`` held-out samples; *spurious accuracy*: agreement of
    :math:`\mathrm{sign} f(z_i^s)` with :math:`g_i` on the ``N`` training samples.
    """
    model = check_choice(model, "model", ["rf", "ntk"])
    act = get_activation(activation)
    ns = tuple(check_positive_int(v, "n_train") for v in (n_train if isinstance(n_train, (list, tuple, range)) else [n_train]))
    alphas = tuple(check_positive_float(a, "alpha") for a in (alpha if isinstance(alpha, (list, tuple)) else [alpha]))
    k = check_positive_int(k, "k")
    n_test = check_positive_int(n_test, "n_test")
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    if sampler is None:
        d = check_positive_int(d, "d", minimum=2)

        def sampler(n, a, gen):
            return spurious_gaussian_data(n, d, a, gen, counterpart=counterpart, dtype=dtype)
    n_max = max(ns)
    test = torch.empty(len(alphas), len(ns), len(seeds), dtype=dtype)
    spur = torch.empty_like(test)
    for ai, a in enumerate(alphas):
        for si, seed in enumerate(seeds):
            gen = torch.Generator().manual_seed(seed)
            Z, g, Zs = sampler(n_max + n_test, a, gen)
            Z, g, Zs = (as_tensor(t, nm).to(dtype) for t, nm in ((Z, "Z"), (g, "g"), (Zs, "Z_spurious")))
            if Z.shape[0] < n_max + n_test:
                raise ValueError(f"sampler returned {Z.shape[0]} samples; {n_max + n_test} are needed")
            W = gaussian_weights(k, Z.shape[1], gen, dtype=dtype)
            Ztr, gtr, Zsp = Z[:n_max], g[:n_max], Zs[:n_max]
            Zte, gte = Z[n_max:n_max + n_test], g[n_max:n_max + n_test]
            Ftr = random_features(Ztr, W, act) if model == "rf" else None
            K = _gram(model, act, W, Ztr, Ztr, Ftr)
            Kte = _gram(model, act, W, Ztr, Zte, Ftr).T
            Ksp = _gram(model, act, W, Ztr, Zsp, Ftr).T
            for ni, n in enumerate(ns):
                L, info = torch.linalg.cholesky_ex(K[:n, :n])
                if int(info) != 0:
                    raise ValueError(f"the {model} kernel of N = {n} samples is singular: interpolation fails "
                                     f"(N is too large for k = {k} features or samples repeat)")
                c = torch.cholesky_solve(gtr[:n, None], L)[:, 0]
                test[ai, ni, si] = ((Kte[:, :n] @ c).sign() == gte).to(dtype).mean()
                spur[ai, ni, si] = ((Ksp[:n, :n] @ c).sign() == gtr[:n]).to(dtype).mean()
    return MemorizationCurve(ns, alphas, model, act.name, test, spur)
