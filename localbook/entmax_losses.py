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

from ._validate import as_tensor, check_alpha, check_index, check_indices
from .entmax import entmax15, entmax_bisect, sparsemax

__all__ = ["sparsemax_loss", "entmax15_loss", "entmax_bisect_loss", "tsallis_entropy"]


def tsallis_entropy(p, alpha, dim: int = -1) -> torch.Tensor:
    r""":math:`H^T_\alpha(p) = (1 - \sum_i p_i^\alpha)/(\alpha(\alpha-1))` along ``dim``
    (Shannon entropy for α = 1). Zero entries contribute nothing (also to the α-gradient).

    ``p`` holds probability vectors along ``dim``: entries ``≥ 0`` summing to 1 within
    ``2·n·eps`` of its dtype (``n`` entries per vector; a ``ValueError`` otherwise). ``alpha``
    is a float ``> 0`` or a tensor of them broadcastable to ``p`` with size 1 along ``dim``.
    Returns ``p``'s shape without ``dim``.
    """
    p = as_tensor(p, "p")
    if p.ndim == 0:
        raise ValueError("p must have at least one dimension (the probabilities)")
    dim = check_index(dim, p.ndim, "dim")
    alpha = check_alpha(alpha)
    with torch.no_grad():
        n = p.shape[dim]
        gap = (p.detach().sum(dim) - 1).abs().max()
        neg, off = torch.stack([(p.detach() < 0).any(), gap]).tolist()
    if neg:
        raise ValueError("p must be probabilities: it has negative entries")
    tol = 2 * n * torch.finfo(p.dtype).eps
    if off > tol:
        raise ValueError(
            f"p must be probabilities along dim={dim}: its sums differ from 1 by up to "
            f"{off:.3g} (more than 2·n·eps = {tol:.3g})"
        )
    return _tsallis(p, alpha, dim)


def _tsallis(p: torch.Tensor, alpha, dim: int) -> torch.Tensor:
    """:func:`tsallis_entropy` of validated probabilities."""
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
    target = check_indices(
        target, "target", X.shape[1], device=X.device, what="class indices"
    )
    if target.shape != (X.shape[0],):
        raise ValueError(
            f"target must have shape ({X.shape[0]},) to match the rows of X, got "
            f"{tuple(target.shape)}"
        )
    return X, target


def _fy_loss(X, target, alpha, mapping):
    with (
        torch.no_grad()
    ):  # the envelope theorem: p's own dependence on X and α drops out
        p = mapping(X.detach())
    onehot = torch.nn.functional.one_hot(target, X.shape[1]).to(X.dtype)
    return ((p - onehot) * X).sum(-1) + _tsallis(p, alpha, -1)


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
    alpha = check_alpha(alpha)
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
