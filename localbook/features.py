r"""Feature maps of two-layer networks and the constants of feature alignment (chapter 10).

Random features :math:`\phi_{RF}(z) = \sigma(Wz)/\sqrt k` and the NTK features
:math:`\phi_{NTK}(z) = (z \otimes \sigma'(Wz))/\sqrt{dk}` of a two-layer network with Gaussian
first-layer weights (:func:`gaussian_weights`). Their kernels are governed by the normalized
Hermite coefficients :math:`\mu_l = \mathbb E[\sigma(\xi) h_l(\xi)]` of the activation
(:func:`hermite`, :func:`hermite_coefficients`, ReLU's in closed form by
:func:`relu_hermite_coefficients`; :class:`Activation` and :func:`get_activation` name them), and
so are the alignment constants of Bombari & Mondelli (2024): the paper's limit
:math:`\gamma` (:func:`alignment_limit`), its profile :math:`\gamma(\rho)`
(:func:`alignment_profile`) and its average at finite dimension (:func:`finite_d_alignment`).
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
    check_fraction,
    check_positive_int,
    promote_floats,
)
from .datasets import _spurious_dims

__all__ = [
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
]


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
    x = as_tensor(x, "x", ndim=(0, 1, 2, 3), allow_empty=True)
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
    exact_hermite: Optional[Callable[[int], torch.Tensor]] = field(
        default=None, repr=False, compare=False
    )
    #: closed-form dual kernel :math:`\rho \mapsto \sum_l \mu_l^2\rho^l = E[\sigma(u)\sigma(v)]`,
    #: ``corr(u, v) = ρ`` (arc-cosine kernels for ReLU and the step)
    dual: Optional[Callable[[torch.Tensor], torch.Tensor]] = field(
        default=None, repr=False, compare=False
    )
    known_derivative: Optional["Activation"] = field(
        default=None, repr=False, compare=False
    )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def derivative(self) -> "Activation":
        """The activation :math:`\\sigma'` (exact for Hermite sums; the step function for ReLU)."""
        if self.coefficients is not None:
            c = self.coefficients
            return hermite_activation(
                [math.sqrt(l) * c[l] for l in range(1, len(c))] or [0.0],
                name=f"({self.name})'",
            )
        if self.known_derivative is not None:
            return self.known_derivative
        return Activation(f"({self.name})'", self.grad, _no_grad(self.name))

    def antiderivative(self) -> "Activation":
        """The Hermite sum whose derivative is this one (constant 0): :math:`h_l \\mapsto h_{l+1}/\\sqrt{l+1}`.

        The paper labels NTK activations by :math:`\\sigma'`; ``get_activation("h0+h1").antiderivative()``
        is the activation whose NTK features use :math:`\\sigma' = h_0 + h_1`.
        """
        if self.coefficients is None:
            raise ValueError(
                f"antiderivative needs a Hermite-sum activation, got {self.name!r}"
            )
        c = self.coefficients
        return hermite_activation(
            [0.0] + [c[l] / math.sqrt(l + 1) for l in range(len(c))],
            name=f"∫({self.name})",
        )


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


def hermite_activation(
    coefficients: Sequence[float], name: Optional[str] = None
) -> Activation:
    r"""The activation :math:`\sigma = \sum_l c_l h_l` from normalized-Hermite coefficients ``c``."""
    c = tuple(as_tensor(coefficients, "coefficients", ndim=(1,)).double().tolist())
    if name is None:
        name = (
            "+".join(
                f"{v:g}·h{l}" if v != 1 else f"h{l}" for l, v in enumerate(c) if v != 0
            )
            or "0"
        )
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
        raise TypeError(
            f"activation must be a name such as 'relu' or 'h1+h2', got {type(spec).__name__}"
        )
    s = spec.replace(" ", "")
    if s == "relu":
        step = Activation(
            "(relu)'",
            lambda x: (x > 0).to(x.dtype),
            _no_grad("relu"),
            exact_hermite=functools.partial(relu_hermite_coefficients, derivative=True),
            dual=_arccos0,
        )
        return Activation(
            "relu",
            torch.relu,
            step.fn,
            exact_hermite=relu_hermite_coefficients,
            dual=_arccos1,
            known_derivative=step,
        )
    if s == "tanh":
        return Activation("tanh", torch.tanh, lambda x: 1 - torch.tanh(x) ** 2)
    if _HERMITE_SPEC.match(s):
        degrees = [int(t[1:]) for t in s.split("+")]
        c = [0.0] * (max(degrees) + 1)
        for l in degrees:
            c[l] += 1.0
        return hermite_activation(c, name=s)
    raise ValueError(
        f"unknown activation {spec!r}; expected 'relu', 'tanh' or a Hermite sum like 'h1+h2'"
    )


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
    n_nodes = check_positive_int(
        n_nodes, "n_nodes", minimum=1, maximum=360
    )  # numpy overflows beyond
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


def relu_hermite_coefficients(
    degree: int = 8, derivative: bool = False
) -> torch.Tensor:
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
    return (
        torch.sqrt((1 - r * r).clamp_min(0.0)) + (math.pi - torch.arccos(r)) * r
    ) / (2 * math.pi)


def _arccos0(rho: torch.Tensor) -> torch.Tensor:
    """The step function's dual kernel :math:`P(u > 0, v > 0) = (\\pi - \\arccos\\rho)/2\\pi`."""
    return (math.pi - torch.arccos(rho.clamp(-1.0, 1.0))) / (2 * math.pi)


# ----------------------------------------------------------------------------------------------
# feature maps
# ----------------------------------------------------------------------------------------------


def gaussian_weights(
    k: int, d: int, generator: Optional[torch.Generator] = None, dtype=None, device=None
) -> torch.Tensor:
    r"""First-layer weights :math:`W_{ij} \sim N(0, 1/d)`, ``(k, d)``: for :math:`\|z\| = \sqrt d` each
    pre-activation :math:`w_j^\top z` is approximately standard Gaussian."""
    k = check_positive_int(k, "k")
    d = check_positive_int(d, "d")
    dtype = dtype or torch.get_default_dtype()
    return torch.randn(
        k, d, generator=generator, dtype=dtype, device=device
    ) / math.sqrt(d)


def _check_z_w(Z, W, name: str = "Z"):
    Z, W = promote_floats(Z, W)
    Z = as_tensor(Z, name, ndim=(1, 2))
    if Z.ndim == 1:
        Z = Z[None, :]
    W = as_tensor(W, "W", like=Z, ndim=(2,))
    if W.shape[1] != Z.shape[1]:
        raise ValueError(
            f"W has {W.shape[1]} input dimension(s) but {name} has d = {Z.shape[1]}; "
            "they must match"
        )
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
    Z1, Z2, W = promote_floats(Z1, Z2, W)
    Z1, W = _check_z_w(Z1, W, "Z1")
    Z2, _ = _check_z_w(Z2, W, "Z2")
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
            rest = base.dual(r) - sum(c * r**l for l, c in enumerate(low))
            return r**shift * rest

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
        raise ValueError(
            f"{base.name!r} has no Hermite energy at degree ≥ {l0}: the alignment is undefined"
        )
    return num, den


def alignment_profile(
    act, rho, model: str = "rf", degree: int = 30, n_nodes: int = 300
):
    r"""The alignment constant as a function of the correlation :math:`\rho = z^\top z^s/d`.

    * RF:  :math:`\gamma_{RF}(\rho) = \sum_{l\ge 2}\mu_l^2\rho^l \,/\, \sum_{l\ge 2}\mu_l^2`, with :math:`\mu_l` the
      Hermite coefficients of :math:`\sigma`;
    * NTK: :math:`\gamma_{NTK}(\rho) = \rho\sum_{l\ge 1}\mu_l'^2\rho^{l} \,/\, \sum_{l\ge 1}\mu_l'^2`, with
      :math:`\mu'_l` those of :math:`\sigma'`.

    The paper's :math:`\gamma` is this at :math:`\rho = \alpha` (:func:`alignment_limit`); a sample whose
    counterpart has correlation :math:`\rho_i` with it is predicted :math:`F \approx \gamma(\rho_i)`
    (chapter 10). Hermite sums use their coefficients exactly; ReLU (RF) and its step derivative
    (NTK) use the arc-cosine dual kernels :math:`\sum_l\mu_l^2\rho^l`, in closed form, so nothing is
    truncated; other activations are truncated at ``degree`` with quadrature coefficients.
    ``rho`` in [−1, 1], a number (returns a float) or a sequence (returns a float64 tensor).
    """
    r = _numbers(rho, "rho")
    if bool(((r < -1.0) | (r > 1.0)).any()):
        raise ValueError(
            f"rho is a correlation and must be in [-1, 1], got {r.tolist()}"
        )
    num, den = _profile_parts(act, model, degree, n_nodes)
    out = num(r.reshape(-1)) / den
    return out if r.ndim else float(out[0])


def _numbers(value, name: str) -> torch.Tensor:
    """A number (a 0-d float64 tensor back) or a 1-D array of numbers, finite."""
    if isinstance(value, bool):
        raise TypeError(
            f"{name} must be a number or a 1-D array of numbers, got a bool"
        )
    return as_tensor(value, name, ndim=(0, 1)).to(torch.float64)


def alignment_limit(
    act, alpha, model: str = "rf", degree: int = 30, n_nodes: int = 300
):
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
    a = _numbers(alpha, "alpha")
    for v in a.reshape(-1).tolist():
        check_fraction(v, "alpha", meaning=" (the spurious fraction d_y/d)")
    return alignment_profile(act, a if a.ndim else float(a), model, degree, n_nodes)


def finite_d_alignment(
    act, d: int, alpha: float, model: str = "rf", n_nodes: int = 64, degree: int = 30
) -> float:
    r"""The alignment constant averaged over the correlation of a sample with its counterpart in dimension ``d``.

    For the ``"resample"`` counterpart of :func:`~localbook.datasets.spurious_gaussian_data` (a fresh core of the same
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
    from scipy.special import (
        roots_jacobi,
    )  # scipy is a dependency; imported here, once needed

    d = check_positive_int(d, "d", minimum=2)
    alpha = check_fraction(alpha, "alpha", meaning=" (the spurious fraction d_y/d)")
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
