r"""Sparse normalizing maps: sparsemax, 1.5-entmax (exact) and :math:`\alpha`-entmax.

:math:`\alpha`-entmax (Peters, Niculae & Martins, 2019) maps scores :math:`z\in\mathbb R^n` to the
probability simplex by maximizing a Tsallis-regularized score,

.. math::

    \alpha\text{-entmax}(z) = \arg\max_{p\in\Delta^n}\; p^\top z + H^T_\alpha(p),
    \qquad p_i = \big[(\alpha-1)z_i - \tau\big]_+^{1/(\alpha-1)},

with the threshold :math:`\tau` chosen so that :math:`\sum_i p_i = 1`. :math:`\alpha\to1` is
softmax, :math:`\alpha=2` is sparsemax (the Euclidean projection onto the simplex, Martins &
Astudillo 2016), :math:`\alpha=1.5` has a closed form on the sorted scores. Entries below the
threshold get *exact* zeros.

How the threshold is found (and why this is faster than sorting every row in full)
----------------------------------------------------------------------------------
Write :math:`X = (\alpha-1)(z - \max z)` (so :math:`\max X = 0` and :math:`\tau\in[-1, 0)`) and
:math:`r = 1/(\alpha-1)`. Only the entries above the threshold matter, and there are usually few.

*Certified partial sort.* Solve the problem restricted to the :math:`k` largest scores
(``torch.topk``), giving :math:`\tau_k`. Dropping non-negative terms can only lower the root, so
:math:`\tau_k\le\tau^*`, with equality iff :math:`\tau_k\ge X_{(k+1)}` (the largest score left
out gets zero weight). The top :math:`k` alone can test the slightly stronger
:math:`\tau_k\ge X_{(k)}` (support size :math:`<k`): then :math:`\tau_k=\tau^*` exactly. Rows that fail the test have :math:`\mathrm{supp}(p)\subseteq
\{i: X_i>\tau_k\}`; counting those entries gives a :math:`k` that is certainly large enough (rows
are grouped by powers of two, so there are at most :math:`\log_2 n` partial sorts). The first
:math:`k` comes from a few rows solved in full (a speed heuristic only: every row is certified).
Sparsemax and 1.5-entmax finish with their exact sort-based formulas on the top :math:`k`.

*General α.* On the top entries, Newton's method on

.. math::  g(\tau) = \Big(\sum_i (X_i - \tau)_+^r\Big)^{1/r} - 1 = \|(X - \tau)_+\|_r - 1 ,

which for :math:`\alpha\le2` (:math:`r\ge1`) is convex and decreasing (a norm of non-negative
convex functions): started at :math:`\tau_0=-1` (where :math:`g\ge0`) it increases monotonically
and never passes the root — for sparsemax it is Michelot's iteration
:math:`\tau\leftarrow(\sum_{X_i>\tau}X_i - 1)/|\{X_i>\tau\}|`. For :math:`\alpha>2`, where
:math:`g` is not convex, the step is kept inside a bracket with bisection as the fallback.

On a GPU, where a segmented full sort is cheap and host synchronisations are not, sparsemax and
1.5-entmax sort the rows in full.

Backward pass (all three): with :math:`s_i = p_i^{2-\alpha}` on the support and 0 elsewhere,
:math:`\partial L/\partial z = s\odot\big(g - (s^\top g)/\textstyle\sum_i s_i\big)`.

Masked entries may be ``-inf`` (they get exactly 0). A row whose entries are all ``-inf`` has no
distribution on it: its output is NaN, as with ``torch.softmax`` (attention reports such empty
neighbourhoods itself), and it passes a zero gradient back. NaN and ``+inf`` entries raise
``ValueError``.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ._validate import check_alpha, check_positive_int, check_scores
from .entmax_alpha import entmax_alpha

__all__ = ["sparsemax", "entmax15", "entmax_bisect"]

# rows sampled (sorted in full) to choose the first partial-sort size, and the smallest size
_SAMPLE_ROWS = 8
_K_MIN = 16
# rows this short are sorted in full at once (sparsemax, 1.5-entmax on the CPU): one sort of a
# short row costs less than sampling a first size and a partial sort (half, at 30 × 29)
_SORT_IN_FULL = 2 * _K_MIN


# ----------------------------------------------------------------------------------------------
# validation and layout
# ----------------------------------------------------------------------------------------------
def _rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with ``dim`` moved last, as a 2-D ``(rows, n)`` tensor."""
    return x.movedim(dim, -1).reshape(-1, x.shape[dim])


def _unrows(t: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-row values ``(rows,)`` back to ``like``'s shape with ``dim`` kept as size 1."""
    shape = list(like.movedim(dim, -1).shape[:-1]) + [1]
    return t.reshape(shape).movedim(-1, dim)


# ----------------------------------------------------------------------------------------------
# the threshold: Newton on g(τ) = ||(X - τ)_+||_r - 1, then a certified partial sort
# ----------------------------------------------------------------------------------------------
def _powers(d: torch.Tensor, r: float):
    """``(d^r, d^(r-1) on d > 0)`` without pow for sparsemax and 1.5-entmax."""
    if r == 1.0:
        return d, (d > 0).to(d.dtype)
    if r == 2.0:
        return d * d, d
    dr1 = torch.where(d > 0, d.pow(r - 1.0), torch.zeros_like(d))
    return dr1 * d, dr1


def _newton_step(X, tau, lo, hi, r):
    """One (safeguarded) Newton step on ``g(τ) = ||(X-τ)_+||_r - 1`` for every row.

    Returns ``(tau_new, lo, hi, g)``; ``lo``/``hi`` bracket the root (``g(lo) ≥ 0 ≥ g(hi)``).
    """
    d = (X - tau[:, None]).clamp(min=0)
    dr, dr1 = _powers(d, r)
    F = dr.sum(-1)
    D = dr1.sum(-1)
    norm = F if r == 1.0 else (F.sqrt() if r == 2.0 else F.pow(1.0 / r))
    g = norm - 1
    lo = torch.where(g >= 0, tau, lo)
    hi = torch.where(g < 0, tau, hi)
    # g'(τ) = -||d||_r^{1-r} Σ d^{r-1}; the Newton step τ - g/g'
    slope = D * (norm / F).nan_to_num(0.0) if r != 1.0 else D
    step = tau + g / slope
    ok = torch.isfinite(step) & (step > lo) & (step < hi) & (slope > 0)
    if r < 1.0:  # α > 2: g is not convex, keep the bracket (bisection fallback)
        new = torch.where(ok, step, 0.5 * (lo + hi))
    else:  # α ≤ 2: convex, Newton from the left is monotone and stays ≤ τ*
        new = torch.where(ok, step, tau)
    return new, lo, hi, g


def _newton_solve(X, r, n_iter):
    """Root of ``g(τ) = ||(X-τ)_+||_r - 1`` per row of ``X`` (``max X = 0``), from ``τ₀ = -1``.

    Newton from the left for α ≤ 2 (monotone, never passes the root), bracketed Newton with a
    bisection fallback for α > 2; stops once τ is stable to a few ulps or after ``n_iter`` steps.
    """
    R, n = X.shape
    eps = torch.finfo(X.dtype).eps
    tau = X.new_full((R,), -1.0)
    lo = tau.clone()
    hi = X.new_full((R,), -((1.0 / n) ** (1.0 / r)))
    for _ in range(n_iter):
        new, lo, hi, _ = _newton_step(X, tau, lo, hi, r)
        moved = (new - tau).abs()
        tau = new
        if bool((moved <= 4 * eps * (1 + tau.abs())).all()):
            break
    return tau


def _sorted_threshold(top: torch.Tensor, r: float):
    """Exact threshold from the ``k`` largest scores sorted descending (sparsemax, 1.5-entmax).

    Returns ``(tau, support_size)``. When ``support_size = k`` (all ``k`` scores are in the
    support of the top-``k`` problem), ``tau`` is the threshold ``τ_k`` of the top ``k`` scores
    alone, a lower bound of the true threshold.
    """
    k = top.shape[-1]
    rho = torch.arange(1, k + 1, device=top.device, dtype=top.dtype)
    if r == 1.0:  # sparsemax: j in support iff 1 + j X_(j) > Σ_{i≤j} X_(i)
        cs = top.cumsum(-1) - 1
        support = rho * top > cs
        size = support.sum(-1, keepdim=True).clamp(min=1)
        tau = cs.gather(-1, size - 1) / size.to(top.dtype)
    else:  # 1.5-entmax: τ_j = mean_j - sqrt((1 - ss_j)/j), j in support iff τ_j ≤ X_(j)
        mean = top.cumsum(-1) / rho
        mean_sq = (top * top).cumsum(-1) / rho
        ss = rho * (mean_sq - mean * mean)
        delta = ((1 - ss) / rho).clamp(min=0)
        taus = mean - delta.sqrt()
        size = (taus <= top).sum(-1, keepdim=True).clamp(min=1)
        tau = taus.gather(-1, size - 1)
    return tau.squeeze(-1), size.squeeze(-1)


def _next_pow2(k: torch.Tensor) -> torch.Tensor:
    return 2 ** torch.ceil(torch.log2(k.to(torch.float64).clamp(min=1))).long()


def _first_k(Z: torch.Tensor, zmax: torch.Tensor, alpha: float, n_iter: int) -> int:
    """A first partial-sort size: the support sizes of a few evenly spaced rows (solved in full),
    with a margin, rounded up to a power of two. Only a speed heuristic: every row is certified."""
    R, n = Z.shape
    r = 1.0 / (alpha - 1.0)
    if r in (1.0, 2.0) and (Z.device.type != "cpu" or n <= _SORT_IN_FULL):
        # on a GPU a segmented full sort costs about a millisecond for 1024×4096, while every host
        # synchronisation of the certified partial sort costs tens of microseconds: sort in full
        return n
    idx = torch.linspace(0, R - 1, min(R, _SAMPLE_ROWS), device=Z.device).round().long()
    X = (alpha - 1.0) * (Z.index_select(0, idx) - zmax.index_select(0, idx)[:, None])
    if r in (1.0, 2.0):
        _, size = _sorted_threshold(torch.sort(X, dim=-1, descending=True).values, r)
    else:
        size = (X > _newton_solve(X, r, n_iter)[:, None]).sum(-1)
    k = int(_next_pow2(size.max() * 3 // 2 + 1))
    return max(min(n, _K_MIN), min(n, k))


def _threshold(
    Z: torch.Tensor, zmax: torch.Tensor, alpha: float, n_iter: int
) -> torch.Tensor:
    """Per-row threshold ``τ`` (in units of ``X = (α-1)(z - max z)``) of ``(rows, n)`` scores ``Z``.

    Certified partial sorts: solve the problem restricted to the ``k`` largest scores. If the
    ``k``-th of them gets zero weight (``τ_k ≥ X_(k)``, i.e. support size ``< k``) then ``τ_k = τ*``.
    Otherwise all ``k`` are in the support of the restricted problem and ``τ_k ≤ τ*`` (dropping
    non-negative terms can only lower the root), so ``supp(p) ⊆ {X > τ_k}``: counting those entries
    gives a ``k`` that is certainly large enough (plus one, to make the test decisive).
    """
    R, n = Z.shape
    r = 1.0 / (alpha - 1.0)
    exact = r in (1.0, 2.0)
    out = Z.new_empty((R,))
    queue = [(torch.arange(R, device=Z.device), _first_k(Z, zmax, alpha, n_iter))]
    while queue:
        rows, k = queue.pop()
        full = rows.numel() == R
        Zs = Z if full else Z.index_select(0, rows)
        ms = zmax if full else zmax.index_select(0, rows)
        if k < n:
            top = torch.topk(Zs, k, dim=-1, sorted=exact).values
        else:
            top = torch.sort(Zs, dim=-1, descending=True).values if exact else Zs
        top = (alpha - 1.0) * (top - ms[:, None])
        if exact:
            t, size = _sorted_threshold(top, r)
            done = size < k
        else:
            t = _newton_solve(top, r, n_iter)
            done = t >= top.amin(-1)
        if k == n or bool(done.all()):
            out[rows] = t
            continue
        out[rows[done]] = t[done]
        fail = ~done
        frows, flow = rows[fail], t[fail]
        # entries above the lower bound τ_k (z - max > τ_k/(α-1)) bound the support
        Zf = Z.index_select(0, frows) - ms[fail][:, None]
        need = ((Zf > (flow / (alpha - 1.0))[:, None]).sum(-1) + 1).clamp(max=n)
        kb = torch.minimum(
            torch.maximum(_next_pow2(need), torch.full_like(need, 2 * k)),
            torch.full_like(need, n),
        )
        for kval in torch.unique(kb).tolist():
            queue.append((frows[kb == kval], int(kval)))
    return out


# ----------------------------------------------------------------------------------------------
# autograd functions
# ----------------------------------------------------------------------------------------------
def _backward(
    p: torch.Tensor, grad: torch.Tensor, dim: int, alpha: float
) -> torch.Tensor:
    """``s ⊙ (g - sᵀg/Σs)`` with ``s = p^{2-α}`` on the support."""
    if alpha == 2.0:  # s = 1 on the support
        support = p > 0
        q = torch.where(support, grad, 0).sum(dim, keepdim=True) / support.sum(
            dim, keepdim=True
        )
        return torch.where(support, grad - q, 0)
    if alpha == 1.5:
        s = p.sqrt()
    else:
        s = torch.where(p > 0, p.pow(2.0 - alpha), torch.zeros_like(p))
    sg = s * grad
    q = sg.sum(dim, keepdim=True) / s.sum(dim, keepdim=True)
    return sg - q * s


class _EntmaxFunction(torch.autograd.Function):
    """α-entmax along ``dim`` with the closed-form backward pass."""

    @staticmethod
    def forward(ctx, z, zmax, dim, alpha, n_iter):
        tau = _threshold(_rows(z, dim), _rows(zmax, dim).squeeze(-1), alpha, n_iter)
        # p = [(α-1)(z - max) - τ]_+^{1/(α-1)} = [(α-1)((z - max) - τ/(α-1))]_+^{1/(α-1)};
        # subtracting the max first keeps huge logits exact
        d = (z - zmax).sub_(_unrows(tau, zmax, dim) / (alpha - 1.0)).clamp_(min=0)
        if alpha == 2.0:
            p = d
        elif alpha == 1.5:
            d = d.mul_(0.5)
            p = d.mul_(d)
        else:
            p = d.mul_(alpha - 1.0).pow_(1.0 / (alpha - 1.0))
            p = p.div_(
                p.sum(dim, keepdim=True)
            )  # Newton leaves a few ulps: renormalize
        ctx.save_for_backward(p)
        ctx.dim, ctx.alpha = dim, alpha
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _backward(p, grad, ctx.dim, ctx.alpha), None, None, None, None


def _entmax(z, dim, alpha, n_iter):
    z, dim, zmax, dead = check_scores(z, dim)
    if dead is None:
        return _EntmaxFunction.apply(z, zmax, dim, alpha, n_iter)
    # rows with every entry masked: NaN out (like torch.softmax), zero gradient in
    p = _EntmaxFunction.apply(z.masked_fill(dead, 0.0), zmax, dim, alpha, n_iter)
    return p.masked_fill(dead, math.nan)


# ----------------------------------------------------------------------------------------------
# public functions
# ----------------------------------------------------------------------------------------------
def sparsemax(z, dim: int = -1) -> torch.Tensor:
    r"""Sparsemax: the Euclidean projection of ``z`` onto the probability simplex along ``dim``.

    :math:`\mathrm{sparsemax}(z) = \arg\min_{p\in\Delta}\|p - z\|^2 = [z - \tau]_+` with
    :math:`\sum_i [z_i-\tau]_+ = 1` (α-entmax with α = 2). Exact: τ in closed form from a partial
    sort (``topk``) whose size is certified to contain the support (see the module notes).

    Shapes: ``z`` any shape ``(..., n, ...)``; the output has the same shape and sums to 1 along
    ``dim``. ``-inf`` entries (masks) get 0; rows of all ``-inf`` give NaN (zero gradient); NaN and
    ``+inf`` entries raise ``ValueError``.
    """
    return _entmax(z, dim, 2.0, 50)


def entmax15(z, dim: int = -1) -> torch.Tensor:
    r"""1.5-entmax, exactly: :math:`p_i = [z_i/2 - \tau]_+^2` with :math:`\sum_i p_i = 1`.

    The maximizer of :math:`p^\top z + H^T_{1.5}(p)` over the simplex. On the ``k`` largest
    scores the threshold is :math:`\tau_k = \bar x_k - \sqrt{(1 - k\,\sigma_k^2)/k}` (mean and
    variance of the top ``k`` of :math:`x = z/2`), the support size is the largest ``k`` with
    :math:`\tau_k \le x_{(k)}`; a partial sort of certified size replaces the full sort.

    Shapes: as :func:`sparsemax`.
    """
    return _entmax(z, dim, 1.5, 50)


def entmax_bisect(z, alpha=1.5, dim: int = -1, n_iter: int = 50) -> torch.Tensor:
    r"""α-entmax: :math:`p_i = [(\alpha-1)z_i - \tau]_+^{1/(\alpha-1)}`, :math:`\sum p = 1`.

    τ is found by Newton's method on :math:`g(\tau) = \|((\alpha-1)z-\tau)_+\|_{1/(\alpha-1)} - 1`
    (monotone from the left for α ≤ 2; bracketed, with bisection as the fallback, for α > 2),
    over the top entries of each row only (a certified partial sort). ``n_iter`` caps
    the number of iterations (they stop earlier once τ is stable to a few ulps); the output is
    renormalized to sum to 1, as in the ``entmax`` package.

    A float α of 2 or 1.5 takes the exact sort-based formulas of :func:`sparsemax` and
    :func:`entmax15`. ``alpha`` may also be a **tensor**: a tensor α broadcastable to ``z`` with
    size 1 along ``dim`` (one α per row or per head) may require a gradient, which
    ``localbook/entmax_alpha.py`` computes (a learnable α, as in adaptively sparse transformers).
    A tensor α works on whole rows: Newton's method on
    :math:`f(\tau) = \sum_i ((\alpha-1)z_i-\tau)_+^{1/(\alpha-1)} - 1`, bracketed, when every α is
    in (1, 2], ``n_iter`` bisection steps otherwise. Every α the ``entmax`` package accepts works:
    α = 1 (a float) is softmax, α < 1 gives a dense map (by bisection); α = 0, where the
    Tsallis entropy is undefined, and non-finite α raise a ``ValueError``.

    Shapes: as :func:`sparsemax`.
    """
    alpha = check_alpha(alpha, negative=True)  # α < 0: a dense map, as α in (0, 1)
    n_iter = check_positive_int(n_iter, "n_iter")
    if isinstance(alpha, float) and alpha > 1:
        return _entmax(z, dim, alpha, n_iter)
    if isinstance(alpha, float) and alpha == 1.0:
        z, dim, _, dead = check_scores(z, dim)
        p = torch.softmax(z.masked_fill(dead, 0.0) if dead is not None else z, dim=dim)
        return p if dead is None else p.masked_fill(dead, math.nan)
    z, dim, zmax, dead = check_scores(z, dim)
    if isinstance(alpha, float):
        alpha = torch.tensor(alpha, dtype=z.dtype, device=z.device)
    zz = z if dead is None else z.masked_fill(dead, 0.0)
    p = entmax_alpha(zz, zmax, alpha, dim, n_iter)
    return p if dead is None else p.masked_fill(dead, math.nan)
