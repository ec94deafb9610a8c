r"""Kernel density estimation: the density, its score and its Hessian.

The kernel density estimate with profile :math:`k` and bandwidth :math:`h` (a float or one value
per dimension) is

.. math:: \hat p(x) = \frac{1}{n\, c_{k,d} \prod_j h_j} \sum_{i=1}^n k\big(|(x - x_i)/h|\big),
   \qquad c_{k,d} = \int_{\mathbb R^d} k(|u|)\, du .

The mode seekers that climb it are in :mod:`localbook.modes` (mean shift, blurring mean shift,
PC-shift) and :mod:`localbook.medoids` (MedoidShift). Everything here runs on the input's device
and dtype and does its pairwise work in row chunks through :mod:`localbook.kernels`.
"""

from __future__ import annotations

import math

import torch

from ._validate import (
    check_bandwidth,
    check_bool,
    check_choice,
    check_points,
    check_positive_int,
    check_query,
    promote_floats,
)
from .kernels import (
    KERNELS,
    Kernel,
)
from .local_sums import local_average

__all__ = [
    "log_kernel_constant",
    "kde",
    "kde_score",
    "kde_log_hessian",
]


def _log_linear(u2: torch.Tensor) -> torch.Tensor:
    r = torch.sqrt(u2.clamp(min=0.0, max=1.0))
    return torch.where(u2 <= 1, torch.log1p(-r), torch.full_like(u2, -math.inf))


#: scikit-learn's ``linear`` (triangular) kernel ``(1 - u)_+``; used by :func:`kde` only.
_LINEAR = Kernel("linear", _log_linear, compact=True)

# Compact profiles of the form (1 - u^a)^p on u <= 1: (a, p).
_POLY = {
    "uniform": (2.0, 0.0),
    "epanechnikov": (2.0, 1.0),
    "biweight": (2.0, 2.0),
    "tricube": (3.0, 3.0),
    "linear": (1.0, 1.0),
}
_KDE_KERNELS = list(KERNELS) + ["linear"]


def _kde_kernel(kernel) -> Kernel:
    if isinstance(kernel, Kernel):
        if kernel.name not in _KDE_KERNELS:
            raise ValueError(
                f"kernel {kernel.name!r} has no known normalizing constant; expected one of {_KDE_KERNELS}"
            )
        return kernel
    name = check_choice(kernel, "kernel", _KDE_KERNELS)
    return _LINEAR if name == "linear" else KERNELS[name]


def log_kernel_constant(kernel: str, d: int) -> float:
    r"""``log c`` with :math:`c = \int_{\mathbb R^d} k(|u|)\, du` for the profile ``kernel`` in ``d`` dimensions.

    In polar coordinates :math:`c = S_{d-1} \int_0^\infty k(r) r^{d-1} dr`, with the sphere's area
    :math:`S_{d-1} = 2\pi^{d/2}/\Gamma(d/2)`. Then: gaussian :math:`(2\pi)^{d/2}`; laplacian
    :math:`S_{d-1}\Gamma(d)`; a compact profile :math:`(1 - r^a)_+^p` gives
    :math:`S_{d-1} B(d/a, p + 1)/a` (uniform: ``a=2, p=0``, the unit ball's volume; epanechnikov
    ``2, 1``; biweight ``2, 2``; tricube ``3, 3``; linear ``1, 1``). Computed with ``lgamma``.
    """
    name = _kde_kernel(kernel).name
    d = check_positive_int(d, "d")
    log_sphere = math.log(2.0) + 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d)
    if name == "gaussian":
        return 0.5 * d * math.log(2.0 * math.pi)
    if name == "laplacian":
        return log_sphere + math.lgamma(d)
    a, p = _POLY[name]
    log_beta = math.lgamma(d / a) + math.lgamma(p + 1.0) - math.lgamma(d / a + p + 1.0)
    return log_sphere + log_beta - math.log(a)


def kde(
    x_query, x, bandwidth, kernel: str = "gaussian", log: bool = False
) -> torch.Tensor:
    r"""Normalized kernel density estimate :math:`\hat p(q) = \frac{1}{n c \prod_j h_j}\sum_i k(|(q - x_i)/h|)`.

    Shapes: ``x_query (m, d)``, ``x (n, d)`` (1-D means ``d = 1``), ``bandwidth`` a float or
    ``(d,)``. Returns ``(m,)``: the density, or its logarithm with ``log=True`` (computed with
    ``logsumexp``, so it does not underflow far from the data; ``-inf`` where a compact kernel
    covers no point). ``kernel``: any kernel of :mod:`localbook.kernels`, or ``"linear"``
    (:math:`(1-u)_+`, scikit-learn's triangular kernel); see :func:`log_kernel_constant`.
    Equal to scikit-learn's ``KernelDensity`` (``tophat`` = uniform, ``exponential`` = laplacian).
    """
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    kern = _kde_kernel(kernel)
    check_bool(log, "log")
    n, d = x.shape
    _, log_sum = local_average(xq, x, None, h, kern, warn_empty=False)
    log_p = log_sum - (
        math.log(n) + float(torch.log(h).sum()) + log_kernel_constant(kern.name, d)
    )
    return log_p if log else torch.exp(log_p)


def kde_score(x_query, x, bandwidth) -> torch.Tensor:
    r"""Score :math:`\nabla \log \hat p(q)` of the Gaussian KDE, in closed form.

    :math:`\nabla \log \hat p(q) = \sum_i w_i(q)\,(x_i - q)/h^2 = (m(q) - q)/h^2` with softmax weights
    :math:`w_i \propto \exp(-|(q - x_i)/h|^2/2)` and the local mean :math:`m(q)` (division by
    :math:`h^2` is per dimension for a vector bandwidth). Shapes: ``x_query (m, d)``, ``x (n, d)``;
    returns ``(m, d)``.
    """
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    mean, _ = local_average(xq, x, x, h, "gaussian")
    return (mean - xq) / (h * h)


def _gaussian_hessian(xq: torch.Tensor, x: torch.Tensor, h: torch.Tensor):
    """Local mean ``(m, d)`` and Hessian of ``log p̂`` ``(m, d, d)`` for validated tensors."""
    n, d = x.shape
    center = x.mean(0)
    xc = x - center
    values = torch.cat([xc, (xc[:, :, None] * xc[:, None, :]).reshape(n, d * d)], dim=1)
    moments, _ = local_average(xq, x, values, h, "gaussian")
    m1 = moments[:, :d]
    cov = moments[:, d:].reshape(-1, d, d) - m1[:, :, None] * m1[:, None, :]
    inv = 1.0 / (h * h)
    hess = inv[:, None] * cov * inv[None, :] - torch.diag(inv)
    return m1 + center, 0.5 * (hess + hess.transpose(1, 2))


def kde_log_hessian(x_query, x, bandwidth) -> torch.Tensor:
    r"""Hessian :math:`\nabla^2 \log \hat p(q)` of the Gaussian KDE, in closed form.

    With :math:`D = \mathrm{diag}(1/h^2)` and the local (softmax-weighted) covariance
    :math:`C(q) = \sum_i w_i(q) (x_i - m)(x_i - m)^\top`:
    :math:`\nabla^2 \log \hat p = D\, C(q)\, D - D`. Shapes: ``x_query (m, d)``, ``x (n, d)``;
    returns ``(m, d, d)``.
    """
    x_query, x = promote_floats(x_query, x)
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    return _gaussian_hessian(xq, x, h)[1]
