r"""Fenchel–Young losses of the entmax family (Blondel, Martins & Niculae 2020).

For the regularizer :math:`\Omega_\alpha(p) = -H^T_\alpha(p)` (Tsallis entropy
:math:`H^T_\alpha(p) = (1 - \sum_i p_i^\alpha)/(\alpha(\alpha-1))`), the Fenchel–Young loss of
scores ``z`` and a gold class ``y`` is

.. math::
    L_\alpha(z; y) = (p - e_y)^\top z + H^T_\alpha(p), \qquad p = \alpha\text{-entmax}(z),

non-negative, zero exactly when :math:`p = e_y`, with gradient :math:`\nabla_z L = p - e_y` and
(envelope theorem) :math:`\partial L/\partial\alpha = \partial H^T_\alpha(p)/\partial\alpha` at
fixed ``p``. α = 2 is the sparsemax loss, α = 1.5 the 1.5-entmax loss; α → 1 is the
cross-entropy. Same signatures and values as the ``entmax`` package's losses (``reduction`` is
left to the caller: the functions return one loss per row).
"""

from __future__ import annotations

import torch

from ._validate import as_tensor
from .entmax import entmax15, entmax_bisect, sparsemax

__all__ = ["sparsemax_loss", "entmax15_loss", "entmax_bisect_loss", "tsallis_entropy"]


def tsallis_entropy(p: torch.Tensor, alpha, dim: int = -1) -> torch.Tensor:
    r""":math:`H^T_\alpha(p) = (1 - \sum_i p_i^\alpha)/(\alpha(\alpha-1))` along ``dim``
    (Shannon entropy for α = 1). Zero entries contribute nothing (also to the α-gradient)."""
    pos = p > 0
    safe = torch.where(pos, p, torch.ones_like(p))
    if not isinstance(alpha, torch.Tensor) and float(alpha) == 1.0:
        return -(torch.where(pos, p * torch.log(safe), torch.zeros_like(p))).sum(dim)
    powered = torch.where(pos, safe**alpha, torch.zeros_like(p)).sum(dim)
    a = (
        alpha.squeeze(dim)
        if isinstance(alpha, torch.Tensor) and alpha.ndim == p.ndim
        else alpha
    )
    return (1.0 - powered) / (a * (a - 1.0))


def _check(X, target):
    X = as_tensor(X, "X", ndim=(2,))
    if not isinstance(target, torch.Tensor):
        target = torch.as_tensor(target)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            f"target must hold integer class indices, got dtype {target.dtype}"
        )
    if target.shape != (X.shape[0],):
        raise ValueError(
            f"target must have shape ({X.shape[0]},) to match X, got {tuple(target.shape)}"
        )
    target = target.to(X.device)
    if bool(((target < 0) | (target >= X.shape[1])).any()):
        raise ValueError(f"target holds a class index outside [0, {X.shape[1]})")
    return X, target


def _fy_loss(X, target, alpha, mapping):
    with (
        torch.no_grad()
    ):  # the envelope theorem: p's own dependence on X and α drops out
        p = mapping(X.detach())
    onehot = torch.nn.functional.one_hot(target, X.shape[1]).to(X.dtype)
    return ((p - onehot) * X).sum(-1) + tsallis_entropy(p, alpha)


def sparsemax_loss(X, target) -> torch.Tensor:
    """The sparsemax loss, ``X (n, c)`` scores, ``target (n,)`` class indices → ``(n,)``."""
    X, target = _check(X, target)
    return _fy_loss(X, target, 2.0, lambda z: sparsemax(z, dim=-1))


def entmax15_loss(X, target) -> torch.Tensor:
    """The 1.5-entmax loss, ``X (n, c)`` scores, ``target (n,)`` class indices → ``(n,)``."""
    X, target = _check(X, target)
    return _fy_loss(X, target, 1.5, lambda z: entmax15(z, dim=-1))


def entmax_bisect_loss(X, target, alpha=1.5, n_iter: int = 50) -> torch.Tensor:
    """The α-entmax loss for a float or tensor ``alpha`` (``(n, 1)``, or scalar; it may require a
    gradient) → ``(n,)``. α = 1 is the cross-entropy."""
    X, target = _check(X, target)
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.to(device=X.device, dtype=X.dtype)
        if alpha.ndim == 1 and alpha.numel() == X.shape[0]:
            alpha = alpha[:, None]
    return _fy_loss(
        X,
        target,
        alpha,
        lambda z: entmax_bisect(
            z,
            alpha.detach() if isinstance(alpha, torch.Tensor) else alpha,
            dim=-1,
            n_iter=n_iter,
        ),
    )
