r"""Sparse attention graph learning (SAGL): one graph of sparse local means per view, fused.

Data: ``L`` views ``X⁽ˡ⁾ (n, d_l)`` of the same ``n`` samples, standardized
(:func:`standardize_views`). The model (:class:`SparseAttentionGraph`) follows the paper's
components, view by view:

1. **encoder** ``f_l`` (two layers) and batch standardization, ``Z⁽ˡ⁾ (n, C)`` with zero mean and
   unit variance per coordinate;
2. **bilinear, asymmetric scores** ``S⁽ˡ⁾ = β_l (Z⁽ˡ⁾U⁽ˡ⁾)(Z⁽ˡ⁾V⁽ˡ⁾)ᵀ/√C`` (the paper's
   ``1/√C``; ``U = V = I`` and ``β_l = 1`` at the start; ``β_l``, a learned inverse temperature,
   is reported);
3. **dynamic sparse gate** ``ωᵢ⁽ˡ⁾ = σ(gᵢ − mean g) ∈ [0, 1]`` from a small MLP ``g_l``; row
   ``i``'s scores are multiplied by ``γ^(2ωᵢ − 1)`` (``γ = gate_range``): ``ω = ½`` is neutral,
   ``ω → 1`` narrows the row (fewer neighbours), ``ω → 0`` widens it;
4. **1.5-entmax** over every other point (or over ``m`` candidates, for cost): a sparse,
   directed, row-stochastic graph ``A⁽ˡ⁾`` without self-loops;
5. **sparse aggregation with a residual**, ``H⁽ˡ⁾ = Z⁽ˡ⁾ + (A⁽ˡ⁾Z⁽ˡ⁾)W⁽ˡ⁾``;
6. **fusion** across views: the mean graph ``Ā = (1/L) Σ_l A⁽ˡ⁾`` (default), or the
   concatenated representations ``[H⁽¹⁾, …, H⁽ᴸ⁾]``.

Training (:func:`fit_sagl`) minimizes self-expression of each view through its own graph plus
the reconstruction of every view from all the representations (linear decoders ``D_v``),

.. math::
    L = \sum_l \frac{\|X^{(l)} - A^{(l)} X^{(l)}\|_F^2}{\|X^{(l)}\|_F^2}
      + \lambda \sum_v \frac{\|X^{(v)} - D_v([H^{(1)}, \dots, H^{(L)}])\|_F^2}
      {\|X^{(v)}\|_F^2},

full-batch Adam until the loss plateaus (a stated rule, not a step count). Ablations:
``graph="identity"`` (no aggregation), ``graph="softmax"`` (dense attention), ``gate=False``
(``ω ≡ ½``), ``shared=True`` (one graph on the views' averaged codes).

Baselines with the same read-out: :func:`knn_graph` (concatenated views),
:func:`fused_knn_graph` (one per view, averaged), :func:`entmax_distance_graph` (untrained
1.5-entmax over squared distances), :func:`dense_attention_graph` (untrained dense
attention) and :func:`lsr_graph` (least-squares self-expression, Lu et al. 2012).
:func:`self_expression_graph` is the self-expression term's exact optimum without a network
(a diagnostic). The read-out
(:func:`spectral_readout`) is normalized spectral clustering of ``W = (|A| + |A|ᵀ)/2``; graphs
are dense ``(n, n)`` tensors (sparse in their values), for ``n`` up to a few thousand points.
The chapter's data live in :mod:`localbook.datasets`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import torch
from torch import nn

from ._validate import (
    as_tensor,
    check_choice,
    check_positive_float,
    check_positive_int,
    check_positive_ints,
)
from .datasets import (  # noqa: F401  (their old home: `from localbook.sagl import make_...`)
    make_digits_views,
    make_fashion_views,
    make_multiview_subspaces,
)
from .entmax import entmax15

__all__ = [
    "standardize_views",
    "candidate_neighbours",
    "SparseAttentionGraph",
    "sagl_loss",
    "SAGLResult",
    "fit_sagl",
    "spectral_readout",
    "sagl_cluster",
    "knn_graph",
    "fused_knn_graph",
    "dense_attention_graph",
    "effective_neighbours",
    "self_expression_graph",
    "view_candidates",
    "entmax_distance_graph",
    "lsr_graph",
    "lsr_coefficients",
    "reduce_views",
]

GRAPHS = ("entmax15", "softmax", "identity")
OBJECTIVES = ("codes", "inputs")


def _check_views(
    views, name: str = "views", like: Optional[torch.Tensor] = None
) -> List[torch.Tensor]:
    if isinstance(views, torch.Tensor) or not isinstance(views, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of (n, d_v) arrays, one per view, got {type(views).__name__}"
        )
    if len(views) == 0:
        raise ValueError(f"{name} is empty; at least one view is needed")
    out = []
    for v, x in enumerate(views):
        t = as_tensor(
            x,
            f"{name}[{v}]",
            like=like if like is not None else (out[0] if out else None),
            ndim=(2,),
        )
        if out and t.shape[0] != out[0].shape[0]:
            raise ValueError(
                f"{name}[{v}] has {t.shape[0]} rows but {name}[0] has {out[0].shape[0]}; "
                "every view must describe the same samples"
            )
        out.append(t)
    if out[0].shape[0] < 2:
        raise ValueError(
            f"{name} must hold at least 2 samples to build a graph, got {out[0].shape[0]}"
        )
    return out


def standardize_views(views) -> List[torch.Tensor]:
    """Centre each feature and scale each view to unit mean squared row norm (``(n, d_v)`` each)."""
    views = _check_views(views)
    out = []
    for x in views:
        x = x - x.mean(0)
        out.append(
            x / x.pow(2).sum(1).mean().sqrt().clamp(min=torch.finfo(x.dtype).tiny)
        )
    return out


def reduce_views(views, dim: int = 50) -> List[torch.Tensor]:
    """Project each view onto its ``dim`` leading principal components (views with at most
    ``dim`` features are only centred). A cost saver for wide views: distances within a view
    change only by the discarded variance. Returns a list of ``(n, min(d_v, dim))`` tensors."""
    views = _check_views(views)
    dim = check_positive_int(dim, "dim")
    out = []
    for x in views:
        xc = x - x.mean(0)
        if x.shape[1] <= dim:
            out.append(xc)
            continue
        _, _, vt = torch.linalg.svd(xc, full_matrices=False)
        out.append(xc @ vt[:dim].T)
    return out


def _concat(views) -> torch.Tensor:
    return torch.cat(standardize_views(views), dim=1)


def candidate_neighbours(views, m: int):
    """The ``m`` nearest other points of each point in the concatenated standardized views.

    Returns ``(dist (n, m), index (n, m))``, nearest first; a point is never its own candidate.
    """
    x = _concat(views)
    n = x.shape[0]
    m = check_positive_int(m, "m", maximum=n - 1)
    d = torch.cdist(x, x)
    d.fill_diagonal_(math.inf)
    return d.topk(m, dim=1, largest=False)


class _GatherRows(torch.autograd.Function):
    """``z[flat]`` whose backward is one sparse product with the transposed selection matrix
    ``P (n, len(flat))`` (``P[j, p] = 1`` where ``flat[p] = j``), built once per index: the
    default backward, an ``index_add_`` of scattered rows, took 1.0 ms against 0.12 ms at
    n = 2,000, m = 20, C = 16 (one CPU thread's worth of adds, measured)."""

    @staticmethod
    def forward(ctx, z, flat, selection_t):
        ctx.selection_t = selection_t
        return z.index_select(0, flat)

    @staticmethod
    def backward(ctx, grad):
        return ctx.selection_t @ grad.contiguous(), None, None


def _selection_t(flat: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``(n, len(flat))`` CSR matrix with ``P[j, p] = 1`` where ``flat[p] = j``."""
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n)
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    ones = torch.ones(flat.shape[0], dtype=dtype, device=flat.device)
    with warnings.catch_warnings():  # PyTorch calls its sparse CSR support "beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            crow, order, ones, (n, flat.shape[0]), check_invariants=False
        )


class _WeightedRows(torch.autograd.Function):
    """``Σⱼ w[i, j] rows[i, j]`` as batched products, with the rows' gradient
    ``w[i, j] g[i]`` by broadcasting: ``einsum`` took 11 ms for forward and backward at
    n = 2,000, m = 20, d = 50, and autograd's batched outer product (inner size 1) 2.5 ms
    for the rows' gradient alone at d = 16 (measured, 2 threads)."""

    @staticmethod
    def forward(ctx, w, rows):
        ctx.save_for_backward(w, rows)
        return torch.bmm(w[:, None, :], rows)[:, 0]

    @staticmethod
    def backward(ctx, grad):
        w, rows = ctx.saved_tensors
        grad_w = grad_rows = None
        if ctx.needs_input_grad[0]:
            grad_w = torch.bmm(rows, grad[:, :, None])[:, :, 0]
        if ctx.needs_input_grad[1]:
            grad_rows = w[:, :, None] * grad[:, None, :]
        return grad_w, grad_rows


def _weighted_rows(w: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``Σⱼ w[i, j] rows[i, j]``: ``w (n, m)``, ``rows (n, m, d)`` → ``(n, d)``."""
    return _WeightedRows.apply(w, rows)


def _scatter_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Dense ``(n, n)`` graph with ``A[i, index[i, j]] = values[i, j]``."""
    n = values.shape[0]
    return values.new_zeros(n, n).scatter(1, index, values)


def knn_graph(views, k: int = 10) -> torch.Tensor:
    """Row ``i`` puts weight ``1/k`` on its ``k`` nearest points (concatenated standardized
    views). Returns a dense ``(n, n)`` graph."""
    x = _concat(views)
    k = check_positive_int(k, "k", maximum=x.shape[0] - 1)
    _, idx = candidate_neighbours(views, k)
    return _scatter_rows(torch.full(idx.shape, 1.0 / k, dtype=x.dtype), idx)


def fused_knn_graph(views, k: int = 10) -> torch.Tensor:
    """The mean over views of each view's own ``k``-NN graph (:func:`knn_graph` of one
    standardized view): row ``i`` puts ``1/(kL)`` on each of its ``k`` nearest points in
    each of the ``L`` views. Returns a dense ``(n, n)`` graph."""
    return torch.stack([knn_graph([x], k) for x in _check_views(views)]).mean(0)


def dense_attention_graph(views, temperature: float = 1.0) -> torch.Tensor:
    r"""Untrained dense attention, one graph per view and averaged:
    ``A⁽ˡ⁾ = softmax(X⁽ˡ⁾X⁽ˡ⁾ᵀ·√d_l/τ)`` over every other point (no self-loops), on the
    standardized views (mean squared row norm 1, so the scores are multiplied by ``√d_l``
    back to the unit-variance scale of scaled dot-product attention). Returns ``(n, n)``."""
    temperature = check_positive_float(temperature, "temperature")
    out = []
    for x in standardize_views(views):
        d = x.shape[1]
        s = (x @ x.T) * (d / math.sqrt(d) / temperature)
        out.append(s.fill_diagonal_(-math.inf).softmax(1))
    return torch.stack(out).mean(0)


def entmax_distance_graph(views, k: int = 10, m: int = 30) -> torch.Tensor:
    r"""Untrained 1.5-entmax over squared distances: ``Aᵢ = entmax₁.₅(−|xᵢ − xⱼ|²/h²ᵢ)``.

    Rows range over the ``m`` nearest candidates; ``hᵢ`` is the distance to the ``k``-th
    nearest point (a per-point bandwidth, no training). In the Gaussian convention
    ``−d²/(2h²)`` of chapter 6 the bandwidth is ``hᵢ/√2``. Returns a dense ``(n, n)`` graph.
    """
    d, idx = candidate_neighbours(views, m)
    k = check_positive_int(k, "k", maximum=d.shape[1])
    h2 = d[:, k - 1 : k].pow(2).clamp(min=torch.finfo(d.dtype).tiny)
    return _scatter_rows(entmax15(-d.pow(2) / h2, dim=1), idx)


def lsr_coefficients(x, lam: float) -> torch.Tensor:
    r"""Least-squares-regression self-expression with zero diagonal (Lu et al. 2012, LSR1).

    Solves ``min_C ‖X − CX‖²_F + λ‖C‖²_F`` s.t. ``diag(C) = 0`` for ``x (n, d)`` (rows are
    points): with ``D = (XXᵀ + λI)⁻¹``, ``C = I − D diag(D)⁻¹`` transposed to rows,
    ``Cᵢⱼ = −Dᵢⱼ/Dᵢᵢ`` (``i ≠ j``). ``D`` is formed with the Woodbury identity,
    ``D = (I − X(λI + XᵀX)⁻¹Xᵀ)/λ``, so the cost is ``O(n²d)``. Returns ``C (n, n)``.
    """
    x = as_tensor(x, "x", ndim=(2,)).double()
    lam = check_positive_float(lam, "lam")
    n, d = x.shape
    inner = torch.linalg.solve(lam * torch.eye(d, dtype=x.dtype) + x.T @ x, x.T)
    dmat = (torch.eye(n, dtype=x.dtype) - x @ inner) / lam
    c = -dmat / torch.diagonal(dmat)[:, None]
    return c.fill_diagonal_(0.0)


def lsr_graph(views, lam: float = 0.1) -> torch.Tensor:
    """LSR graph ``|C|`` on the concatenated standardized views; ``lam`` is relative to the
    mean squared row norm (``λ = lam · mean|xᵢ|²``). Returns a dense ``(n, n)`` graph."""
    x = _concat(views)
    lam = check_positive_float(lam, "lam") * float(x.pow(2).sum(1).mean())
    return lsr_coefficients(x, lam).abs().to(x.dtype)


def self_expression_graph(
    views, m: int = 60, n_iter: int = 20000, tol: float = 1e-7
) -> torch.Tensor:
    r"""The minimizer of SAGL's self-expression term without a network: per view and row,
    ``min_{aᵢ ∈ Δ} ½‖xᵢ − Σⱼ aᵢⱼ xⱼ‖²`` over the ``m`` nearest other points of the view (a
    convex quadratic program), then the mean over views. ``(n, n)``.

    Solved by accelerated projected gradient (FISTA with gradient restarts; step ``1/λ_max``
    of each row's Gram matrix, :func:`~localbook.sparsemax` as the Euclidean projection onto
    the simplex) until every row's Frank–Wolfe gap ``gᵀa − minⱼ gⱼ`` (``g`` the gradient), an
    upper bound on its distance to the optimal value, is below ``tol·|xᵢ|²`` (checked every
    10 steps); a ``RuntimeWarning`` if ``n_iter`` steps do not get there."""
    from .entmax import sparsemax

    xs = standardize_views(views)
    n_iter = check_positive_int(n_iter, "n_iter")
    tol = check_positive_float(tol, "tol")
    graphs = []
    for x in xs:
        x = x.double()
        m_v = check_positive_int(m, "m", maximum=x.shape[0] - 1)
        idx = candidate_neighbours([x], m_v)[1]
        nb = x[idx]  # (n, m, d)
        gram = nb @ nb.transpose(1, 2)
        b = (nb @ x[:, :, None])[:, :, 0]
        scale = x.pow(2).sum(1).clamp(min=torch.finfo(x.dtype).tiny)
        step = 1 / torch.linalg.eigvalsh(gram)[:, -1:].clamp(min=1e-12)

        def grad(a):
            return (gram @ a[:, :, None])[:, :, 0] - b

        a = torch.full(idx.shape, 1.0 / m_v, dtype=x.dtype)
        y, t = a, torch.ones(a.shape[0], 1, dtype=x.dtype)
        for it in range(n_iter):  # iterations of a solver, not a loop over points
            new = sparsemax(y - step * grad(y), dim=1)
            # restart the momentum of rows whose step went uphill (O'Donoghue & Candès)
            up = ((y - new) * (new - a)).sum(1, keepdim=True) > 0
            t_new = (1 + torch.sqrt(1 + 4 * t * t)) / 2
            y = torch.where(up, new, new + ((t - 1) / t_new) * (new - a))
            t = torch.where(up, torch.ones_like(t), t_new)
            a = new
            if it % 10 == 9:
                g = grad(a)
                if bool(((g * a).sum(1) - g.min(1).values <= tol * scale).all()):
                    break
        else:
            warnings.warn(
                f"self_expression_graph: {n_iter} steps left some rows above the gap "
                f"tolerance {tol}; raise n_iter",
                RuntimeWarning,
                stacklevel=2,
            )
        graphs.append(_scatter_rows(a, idx))
    return torch.stack(graphs).mean(0).to(xs[0].dtype)


# --- model --------------------------------------------------------------------------------
class SparseAttentionGraph(nn.Module):
    r"""SAGL with one graph per view: encoder → standardized codes ``Z⁽ˡ⁾`` → bilinear scores
    ``S⁽ˡ⁾ = β_l (Z⁽ˡ⁾U⁽ˡ⁾)(Z⁽ˡ⁾V⁽ˡ⁾)ᵀ/√C`` on candidates → gate ``ω⁽ˡ⁾`` → 1.5-entmax rows
    ``A⁽ˡ⁾`` → residual aggregation ``H⁽ˡ⁾ = Z⁽ˡ⁾ + (A⁽ˡ⁾Z⁽ˡ⁾)W⁽ˡ⁾``.

    ``view_dims``: feature count ``d_l`` of each view. ``latent_dim`` ``C``. ``graph``:
    ``"entmax15"`` (SAGL), ``"softmax"`` (dense attention ablation: every candidate keeps a
    positive weight) or ``"identity"`` (``A = I``: no aggregation). ``gate``: the dynamic sparse
    gate (``False``: ``ω ≡ ½``, the gate's neutral value). ``gate_range`` ``γ``: the gate
    multiplies row ``i``'s scores by ``γ^(2ωᵢ − 1)`` ∈ ``[1/γ, γ]`` (``ω = 0`` widens the row,
    ``ω = 1`` narrows it, ``ω = ½`` leaves it). ``shared``: one graph on the views' averaged
    codes instead of one per view (ablation). ``temperature``: the starting ``1/β_l``;
    ``learn_temperature``: learn ``log β_l``.

    ``forward(views, index)`` takes the list of ``(n, d_l)`` views and a list of candidate
    indices, one ``(n, m)`` per graph (:func:`candidate_neighbours` of each view; one index for
    a shared graph), and returns a dict of lists, one entry per graph: ``weights`` ``(n, m)``
    (row ``i``'s weights on ``index[i]``), ``index``, ``scores`` ``S̃ (n, m)``, ``codes``
    ``Z (n, C)``, ``hidden`` ``H (n, C)``; ``omega`` ``(G, n)``, ``beta`` ``(G,)``, and
    ``recon`` (one ``D_l([H⁽¹⁾, …, H⁽ᴳ⁾])`` per view). :meth:`dense` returns the ``(n, n)`` graphs.
    """

    def __init__(
        self,
        view_dims: Sequence[int],
        latent_dim: int = 16,
        hidden_dim: int = 32,
        graph: str = "entmax15",
        gate: bool = True,
        gate_range: float = 4.0,
        gate_hidden: int = 16,
        shared: bool = False,
        temperature: float = 1.0,
        learn_temperature: bool = True,
    ):
        super().__init__()
        self.view_dims = check_positive_ints(view_dims, "view_dims")
        C = self.latent_dim = check_positive_int(latent_dim, "latent_dim")
        hidden_dim = check_positive_int(hidden_dim, "hidden_dim")
        self.graph_kind = check_choice(graph, "graph", GRAPHS)
        for name, flag in [("gate", gate), ("shared", shared)]:
            if not isinstance(flag, bool):
                raise TypeError(
                    f"{name} must be True or False, got {type(flag).__name__}"
                )
        if not isinstance(learn_temperature, bool):
            raise TypeError(
                "learn_temperature must be True or False, got "
                f"{type(learn_temperature).__name__}"
            )
        self.use_gate, self.shared = gate, shared
        self.gate_range = check_positive_float(gate_range, "gate_range")
        if self.gate_range < 1:
            raise ValueError(f"gate_range must be >= 1, got {gate_range}")
        temperature = check_positive_float(temperature, "temperature")
        G = self.n_graphs = 1 if shared else len(self.view_dims)
        self.encoders = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, C))
            for d in self.view_dims
        )
        # U = V = I at the start: the first scores are the scaled dot products z·z'/√C
        self.U = nn.Parameter(torch.eye(C).repeat(G, 1, 1))
        self.V = nn.Parameter(torch.eye(C).repeat(G, 1, 1))
        log_beta = torch.full((G,), -math.log(temperature))
        if learn_temperature:
            self.log_beta = nn.Parameter(log_beta)
        else:
            self.register_buffer("log_beta", log_beta)
        self.gates = (
            nn.ModuleList(
                nn.Sequential(
                    nn.Linear(C, gate_hidden), nn.GELU(), nn.Linear(gate_hidden, 1)
                )
                for _ in range(G)
            )
            if gate
            else None
        )
        self.W = nn.ModuleList(nn.Linear(C, C, bias=False) for _ in range(G))
        self.decoders = nn.ModuleList(nn.Linear(G * C, d) for d in self.view_dims)
        for (
            dec
        ) in self.decoders:  # start at the views' mean: a reconstruction loss of 1
            nn.init.zeros_(dec.weight)
            nn.init.zeros_(dec.bias)
        self._selection = {}  # graph -> (index, its version, flat index, selection matrix)
        self._checked = {}  # graph -> (index, its version) of the last index validated

    def codes(self, views: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """One batch-standardized code ``Z (n, C)`` per graph: zero mean and unit variance per
        coordinate (so ``|zᵢ|² ≈ C``, the scale the ``1/√C`` of the scores assumes); the
        shared graph standardizes the views' averaged encoder outputs."""
        raw = [enc(x) for enc, x in zip(self.encoders, views)]
        if self.shared:
            raw = [torch.stack(raw).mean(0)]
        out = []
        for z in raw:
            zc = z - z.mean(0)
            out.append(zc / zc.pow(2).mean(0).add(1e-8).sqrt())
        return out

    def gate_values(self, codes: Sequence[torch.Tensor]) -> torch.Tensor:
        """``ω (G, n)``: ``ωᵢ = σ(gᵢ − mean_j gⱼ)`` with ``g`` the gate MLP of the graph's codes.
        Centring the logits over the batch keeps the global scale in ``β`` and leaves the gate
        the per-point part: the average logit maps to ``ω = ½``. ``ω ≡ ½``
        without a gate."""
        if self.gates is None:
            return codes[0].new_full((len(codes), codes[0].shape[0]), 0.5)
        out = []
        for gate, z in zip(self.gates, codes):
            logit = gate(z).squeeze(1)
            out.append(torch.sigmoid(logit - logit.mean()))
        return torch.stack(out)

    def __getstate__(self):
        # copies and pickles leave the gather cache behind (a sparse CSR matrix cannot be
        # deep-copied; it is rebuilt on the next forward)
        state = dict(super().__getstate__())
        state["_selection"] = {}
        state["_checked"] = {}
        return state

    def _neighbour_rows(
        self, t: torch.Tensor, index: torch.Tensor, key: int = 0
    ) -> torch.Tensor:
        """``t[index]`` ``(n, m, C)`` for rows ``t (n, C)`` (a gather whose backward is one
        sparse product, ``_GatherRows``; the selection matrix is kept per graph ``key``)."""
        n, m = index.shape
        if t.dtype not in (torch.float32, torch.float64):  # sparse products: these two
            return t[index]
        cached = self._selection.get(key)
        if not (
            cached
            and cached[0] is index
            and cached[1] == index._version
            and cached[3].dtype == t.dtype
            and cached[3].device == t.device
        ):
            flat = index.reshape(-1)
            # the index itself is kept: its memory cannot be reused by another index
            cached = (
                index,
                index._version,
                flat,
                _selection_t(flat, t.shape[0], t.dtype),
            )
            self._selection[key] = cached
        return _GatherRows.apply(t, cached[2], cached[3]).view(n, m, t.shape[1])

    def similarity(
        self, z: torch.Tensor, index: torch.Tensor, g: int = 0
    ) -> torch.Tensor:
        """Scores ``sᵢⱼ = β (zᵢᵀU)(zⱼᵀV)ᵀ/√C`` of graph ``g`` for ``j = index[i, ·]``,
        ``(n, m)``."""
        zu, zv = z @ self.U[g], z @ self.V[g]
        # bmm, not einsum (see _weighted_rows)
        s = torch.bmm(self._neighbour_rows(zv, index, g), zu[:, :, None])[:, :, 0]
        return s * (self.log_beta[g].exp() / math.sqrt(self.latent_dim))

    def _indices(self, index, n: int, device) -> List[torch.Tensor]:
        if isinstance(index, torch.Tensor):
            if self.n_graphs != 1:
                raise ValueError(
                    f"index is one tensor but the model has {self.n_graphs} graphs; pass "
                    "a list with one (n, m) candidate index per graph (view_candidates)"
                )
            index = [index]
        if not isinstance(index, (list, tuple)) or len(index) != self.n_graphs:
            raise ValueError(
                f"index must be a list of {self.n_graphs} candidate indices (one per "
                f"graph), got {type(index).__name__}"
                + (
                    f" of length {len(index)}"
                    if isinstance(index, (list, tuple))
                    else ""
                )
            )
        out = []
        for g, idx in enumerate(index):
            idx = torch.as_tensor(idx, device=device)
            if idx.dtype != torch.int64:
                idx = idx.long()
            if idx.ndim != 2 or idx.shape[0] != n:
                raise ValueError(
                    f"index[{g}] must have shape (n, m) with n = {n}, got {tuple(idx.shape)}"
                )
            checked = self._checked.get(g)
            if not (checked and checked[0] is idx and checked[1] == idx._version):
                self._check_index(idx, n, g)
                # an index is checked once (training passes the same tensor every step)
                self._checked[g] = (idx, idx._version)
            out.append(idx)
        return out

    @staticmethod
    def _check_index(idx: torch.Tensor, n: int, g: int) -> None:
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(
                f"index[{g}] must hold point numbers in [0, {n - 1}], got values in "
                f"[{int(idx.min())}, {int(idx.max())}]"
            )
        if bool((idx == torch.arange(n, device=idx.device)[:, None]).any()):
            raise ValueError(f"index[{g}] must not list a point as its own candidate")
        ordered = idx.sort(1).values
        if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
            raise ValueError(f"index[{g}] lists a candidate twice in one row")

    def forward(
        self,
        views: Sequence[torch.Tensor],
        index,
        *,
        omega: Optional[float] = None,
        beta_scale: float = 1.0,
    ) -> dict:
        """One pass (see the class docstring). ``omega``: hold every gate at this value in
        ``[0, 1]`` instead of the MLP's output; ``beta_scale``: multiply the inverse
        temperatures ``β`` (both are interventions for diagnostics, not for training)."""
        views = _check_views(views, like=next(self.parameters()))
        beta_scale = check_positive_float(beta_scale, "beta_scale")
        if omega is not None:
            omega = check_positive_float(omega, "omega", allow_zero=True)
            if omega > 1:
                raise ValueError(f"omega must lie in [0, 1], got {omega}")
        if [x.shape[1] for x in views] != self.view_dims:
            raise ValueError(
                f"views have {[x.shape[1] for x in views]} features but the model "
                f"expects {self.view_dims}"
            )
        n = views[0].shape[0]
        indices = self._indices(index, n, views[0].device)
        codes = self.codes(views)
        if omega is None:
            omega = self.gate_values(codes)
        else:
            omega = codes[0].new_full((len(codes), n), omega)
        weights, scores, hidden, aggs, full = [], [], [], [], []
        project = entmax15 if self.graph_kind == "entmax15" else torch.softmax
        for g, (z, idx) in enumerate(zip(codes, indices)):
            # the gate as a per-row temperature: γ^(2ω − 1) ∈ [1/γ, γ], 1 at ω = ½
            sharpen = torch.exp((2 * omega[g] - 1) * math.log(self.gate_range))
            if idx.shape[1] == n - 1:
                # every other point is a candidate: dense products, no gathers
                scale = beta_scale * self.log_beta[g].exp() / math.sqrt(self.latent_dim)
                zu, zv = z @ self.U[g], z @ self.V[g]
                s = zu @ zv.T
                s = s * (scale * sharpen[:, None])
                s = s.masked_fill(
                    torch.eye(n, dtype=torch.bool, device=s.device), -math.inf
                )
                if self.graph_kind == "identity":
                    a, agg = torch.zeros_like(s), z
                else:
                    a = project(s, dim=1)
                    agg = a @ z
                w = a.gather(1, idx)
                s = s.gather(1, idx)
            else:
                a = None
                s = self.similarity(z, idx, g) * (beta_scale * sharpen)[:, None]
                if self.graph_kind == "identity":
                    w, agg = torch.zeros_like(s), z
                else:
                    w = project(s, dim=1)
                    agg = _weighted_rows(w, self._neighbour_rows(z, idx, g))
            weights.append(w)
            full.append(a)
            scores.append(s)
            aggs.append(agg)
            hidden.append(z + self.W[g](agg))
        h = torch.cat(hidden, 1)
        return {
            "kind": self.graph_kind,
            "shared": self.shared,
            "weights": weights,
            "index": indices,
            "scores": scores,
            "omega": omega,
            "beta": self.log_beta.exp(),
            "codes": codes,
            "hidden": hidden,
            "aggregate": aggs,
            "recon": [dec(h) for dec in self.decoders],
            "full": full,
        }

    @staticmethod
    def dense(out: dict) -> List[torch.Tensor]:
        """The ``(n, n)`` graphs of a forward pass, one per graph (``I`` for the identity)."""
        w0 = out["weights"][0]
        if out["kind"] == "identity":
            eye = torch.eye(w0.shape[0], dtype=w0.dtype, device=w0.device)
            return [eye for _ in out["weights"]]
        return [_scatter_rows(w, idx) for w, idx in zip(out["weights"], out["index"])]


def effective_neighbours(graph) -> torch.Tensor:
    r"""Effective number of neighbours per row, ``(Σⱼ|Aᵢⱼ|)² / Σⱼ Aᵢⱼ²`` ``(n,)``: ``k`` for a
    row with ``k`` equal weights, less when the weight is concentrated (the inverse
    participation ratio). Rows without weight give 0."""
    a = as_tensor(graph, "graph", ndim=(2,)).detach().abs()
    s1, s2 = a.sum(1), a.pow(2).sum(1)
    return torch.where(
        s2 > 0, s1.pow(2) / s2.clamp(min=torch.finfo(a.dtype).tiny), 0 * s1
    )


def sagl_loss(
    out: dict,
    views: Sequence[torch.Tensor],
    reconstruction_weight: float = 1.0,
    objective: str = "inputs",
    neighbours: Optional[Sequence[Sequence[torch.Tensor]]] = None,
):
    r"""The training loss; returns ``(total, self_expression, reconstruction)`` scalars.

    ``objective="inputs"``: every graph expresses the standardized views it is built from,
    ``Σ_l ‖X⁽ˡ⁾ − A⁽ˡ⁾X⁽ˡ⁾‖²/‖X⁽ˡ⁾‖²`` (a shared graph: ``Σ_v ‖X⁽ᵛ⁾ − AX⁽ᵛ⁾‖²/‖X⁽ᵛ⁾‖²``);
    ``"codes"``: ``Σ_l ‖Z⁽ˡ⁾ − A⁽ˡ⁾Z⁽ˡ⁾‖²/‖Z⁽ˡ⁾‖²``. Plus ``λ Σ_v ‖X⁽ᵛ⁾ − D_v(H)‖²/‖X⁽ᵛ⁾‖²``,
    every view decoded from all graphs' aggregated codes ``H = [H⁽¹⁾, …]`` (what couples
    the views). The identity graph has no self-expression term (``A = I`` explains every
    point by itself). ``neighbours``: optionally, per graph, the gathered ``X⁽ᵛ⁾[index]``
    (``(n, m, d_v)`` each) of the views it expresses; they do not change during training.
    """
    objective = check_choice(objective, "objective", OBJECTIVES)
    se = out["weights"][0].new_zeros(())
    if out["kind"] != "identity":
        for g, (w, index) in enumerate(zip(out["weights"], out["index"])):
            if objective == "codes":
                z = out["codes"][g]
                se = se + (z - out["aggregate"][g]).pow(2).sum() / z.pow(2).sum()
                continue
            expressed = views if out["shared"] else [views[g]]
            a = out["full"][g]
            if a is not None:  # all pairs: one dense product
                for x in expressed:
                    se = se + (x - a @ x).pow(2).sum() / x.pow(2).sum()
                continue
            gathered = (
                neighbours[g]
                if neighbours is not None
                else [x[index] for x in expressed]
            )
            for x, xn in zip(expressed, gathered):
                se = se + (x - _weighted_rows(w, xn)).pow(2).sum() / x.pow(2).sum()
    rec = se.new_zeros(())
    for x, xr in zip(views, out["recon"]):
        rec = rec + (x - xr).pow(2).sum() / x.pow(2).sum()
    return se + reconstruction_weight * rec, se, rec


# --- training and read-out ---------------------------------------------------------------
@dataclass
class SAGLResult:
    """What :func:`fit_sagl` / :func:`sagl_cluster` return."""

    model: SparseAttentionGraph
    graph: (
        torch.Tensor
    )  #: the fused graph ``A (n, n)``, the mean of ``graphs``, detached
    graphs: List[torch.Tensor]  #: one ``(n, n)`` graph per view (one if shared)
    omega: torch.Tensor  #: gate values ``(G, n)`` after training
    omega_init: torch.Tensor  #: gate values ``(G, n)`` at initialization
    beta: torch.Tensor  #: inverse temperatures ``(G,)`` after training
    hidden: torch.Tensor  #: aggregated codes ``[H⁽¹⁾, …] (n, G·C)``
    losses: List[float] = field(default_factory=list)  #: training loss per step
    history: list = field(default_factory=list)  #: what ``callback`` returned, per call
    labels: Optional[torch.Tensor] = None  #: cluster labels ``(n,)`` (``sagl_cluster``)
    views: List[torch.Tensor] = field(default_factory=list)  #: the standardized views
    index: List[torch.Tensor] = field(
        default_factory=list
    )  #: candidates, one per graph

    def regraph(self, *, omega: Optional[float] = None, beta_scale: float = 1.0):
        """The fused graph ``(n, n)`` of the trained model under an intervention: every gate
        held at ``omega``, and/or the inverse temperatures multiplied by ``beta_scale``."""
        with torch.no_grad():
            out = self.model(self.views, self.index, omega=omega, beta_scale=beta_scale)
            return torch.stack(self.model.dense(out)).mean(0)

    @property
    def n_steps(self) -> int:
        """Number of optimisation steps taken before the stopping rule fired."""
        return len(self.losses)

    @property
    def neighbours(self) -> torch.Tensor:
        """Effective neighbours per row of the fused graph (:func:`effective_neighbours`)."""
        return effective_neighbours(self.graph)


def view_candidates(xs: Sequence[torch.Tensor], m: int, shared: bool = False):
    """Candidate indices, one ``(n, m)`` per graph: each view's ``m`` nearest other points in
    that view (``shared``: one index, in the concatenated views). ``m = n − 1`` is every
    other point, the all-pairs graph."""
    n = xs[0].shape[0]
    if m >= n - 1:  # every other point, in ascending order
        others = torch.arange(n - 1, device=xs[0].device).repeat(n, 1)
        others += (others >= torch.arange(n, device=xs[0].device)[:, None]).long()
        return [others] * (1 if shared else len(xs))
    if shared:
        return [candidate_neighbours(xs, m)[1]]
    return [candidate_neighbours([x], m)[1] for x in xs]


def fit_sagl(
    views,
    *,
    graph: str = "entmax15",
    gate: bool = True,
    shared: bool = False,
    objective: str = "inputs",
    n_candidates: Optional[int] = None,
    latent_dim: int = 16,
    hidden_dim: int = 32,
    max_steps: int = 400,
    window: int = 20,
    tol: float = 0.002,
    lr: float = 1e-2,
    reconstruction_weight: float = 1.0,
    seed: int = 0,
    callback: Optional[Callable] = None,
    callback_every: int = 10,
    **model_kwargs,
) -> SAGLResult:
    """Train a :class:`SparseAttentionGraph` on ``views`` (list of ``(n, d_v)``), full-batch Adam.

    Views are standardized; each graph's candidates are the ``n_candidates`` nearest points in
    its own view (:func:`view_candidates`; ``None``: every other point). Weights are drawn
    in float32 with ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the caller's
    RNG state and default dtype are left untouched; the model then takes the views' dtype). **Stopping rule** (a loss plateau): stop at step ``t ≥ window`` once
    ``L_{t−window} − L_t < tol·|L_{t−window}|``, or at ``max_steps``. The identity graph
    trains its encoders and decoders on the reconstruction term alone. ``callback(step, model_output)`` is called every
    ``callback_every`` steps and at the end; its results are kept in ``history``.
    """
    xs = standardize_views(views)
    n = xs[0].shape[0]
    objective = check_choice(objective, "objective", OBJECTIVES)
    max_steps = check_positive_int(max_steps, "max_steps")
    window = check_positive_int(window, "window")
    tol = check_positive_float(tol, "tol", allow_zero=True)
    lr = check_positive_float(lr, "lr")
    callback_every = check_positive_int(callback_every, "callback_every")
    lam = check_positive_float(
        reconstruction_weight, "reconstruction_weight", allow_zero=True
    )
    m = (
        n - 1
        if n_candidates is None
        else check_positive_int(n_candidates, "n_candidates")
    )
    default_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):  # weights are drawn on the CPU
        torch.manual_seed(int(seed))
        # ... in float32 whatever the default dtype, so that a seed gives one model
        torch.set_default_dtype(torch.float32)
        try:
            model = SparseAttentionGraph(
                [x.shape[1] for x in xs],
                latent_dim=latent_dim,
                hidden_dim=hidden_dim,
                graph=graph,
                gate=gate,
                shared=shared,
                **model_kwargs,
            )
        finally:
            torch.set_default_dtype(default_dtype)
    model = model.to(device=xs[0].device, dtype=xs[0].dtype)
    index = view_candidates(xs, min(m, n - 1), shared=model.shared)
    losses, history = [], []
    gathered = None
    if objective == "inputs" and index[0].shape[1] < n - 1:
        gathered = [
            [x[idx] for x in (xs if model.shared else [xs[g]])]
            for g, idx in enumerate(index)
        ]
    with torch.no_grad():
        omega_init = model(xs, index)["omega"].detach()
    # the identity graph trains too: its encoders and decoders, on reconstruction alone
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(max_steps):  # optimisation steps, not data points
        out = model(xs, index)
        if callback is not None and step % callback_every == 0:
            history.append(callback(step, out))
        total, _, _ = sagl_loss(out, xs, lam, objective, gathered)
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(float(total.detach()))
        if step >= window and losses[-1 - window] - losses[-1] < tol * abs(
            losses[-1 - window]
        ):
            break
    with torch.no_grad():
        out = model(xs, index)
    if callback is not None:
        history.append(callback(len(losses), out))
    graphs = [a.detach() for a in model.dense(out)]
    return SAGLResult(
        model,
        torch.stack(graphs).mean(0),
        graphs,
        out["omega"].detach(),
        omega_init,
        out["beta"].detach(),
        torch.cat(out["hidden"], 1).detach(),
        losses,
        history,
        views=xs,
        index=index,
    )


def _normalized_affinity(a: torch.Tensor, dense: bool):
    """``D^{-1/2} W D^{-1/2}`` with ``W = (|A| + |A|ᵀ)/2`` in float64 (``|A_ij| + |A_ji|`` in
    ``A``'s dtype, as a dense sum rounds it; isolated nodes keep zero rows): a dense CPU tensor,
    or with ``dense=False`` a SciPy CSR matrix built from ``A``'s nonzero entries only (the
    same numbers; 10-20 ms instead of 60-130 at n = 2,000 with 20 neighbours per row)."""
    import numpy as np
    import scipy.sparse as sp

    if dense:
        w = ((a.abs() + a.abs().T) / 2).double().cpu()
        deg = w.sum(1)
        inv = torch.where(deg > 0, deg.clamp(min=1e-300).rsqrt(), torch.zeros_like(deg))
        return inv[:, None] * w * inv[None, :]
    n = a.shape[0]
    if a.dtype not in (torch.float32, torch.float64):  # NumPy and SciPy lack these
        a = a.double()
    nz = a.nonzero()
    r, c = nz[:, 0].cpu().numpy(), nz[:, 1].cpu().numpy()
    v = a[nz[:, 0], nz[:, 1]].abs().cpu().numpy()
    w = sp.coo_matrix(
        (np.concatenate([v, v]), (np.concatenate([r, c]), np.concatenate([c, r]))),
        shape=(n, n),
    ).tocsr()  # duplicates (i, j) summed: |A_ij| + |A_ji|
    w = (w / 2).astype(np.float64)
    deg = np.asarray(w.sum(1)).ravel()
    inv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-300)), 0.0)
    return (sp.diags(inv) @ w @ sp.diags(inv)).tocsr()


def spectral_readout(graph, n_clusters: int, seed: int = 0) -> torch.Tensor:
    r"""Normalized spectral clustering of the symmetrized graph ``W = (|A| + |A|ᵀ)/2``.

    Embeds each node by the ``n_clusters`` leading eigenvectors of ``D^{-1/2} W D^{-1/2}``
    (``D`` = degrees; isolated nodes keep a zero row), normalizes the rows
    (Ng–Jordan–Weiss) and runs k-means (scikit-learn, 10 restarts, ``random_state=seed``).
    Up to 300 nodes the eigenvectors come from a dense solver, beyond from Lanczos
    (``scipy.sparse.linalg.eigsh``, start vector drawn from ``seed``). ``graph (n, n)`` →
    labels ``(n,)`` (int64, on the graph's device).
    """
    import numpy as np
    from scipy.sparse.linalg import eigsh
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    a = as_tensor(graph, "graph", ndim=(2,)).detach()
    if a.shape[0] != a.shape[1]:
        raise ValueError(
            f"graph must be a square (n, n) matrix, got shape {tuple(a.shape)}"
        )
    n = a.shape[0]
    k = check_positive_int(n_clusters, "n_clusters", maximum=n)
    dense = n <= 300 or k >= n - 1
    m = _normalized_affinity(a, dense)
    with threadpool_limits(1):  # small problems: threads only add contention
        if dense:
            emb = torch.linalg.eigh(m)[1][:, -k:].numpy()
        else:
            v0 = np.random.default_rng(int(seed)).standard_normal(n)
            emb = eigsh(m, k=k, which="LA", v0=v0, tol=1e-8)[1]
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        km = KMeans(n_clusters=k, n_init=10, random_state=int(seed)).fit(emb)
    return torch.as_tensor(km.labels_, dtype=torch.int64, device=a.device)


FUSIONS = ("graphs", "representations")


def sagl_cluster(
    views,
    n_clusters: int,
    *,
    seed: int = 0,
    fusion: str = "graphs",
    k: int = 10,
    **fit_kwargs,
) -> SAGLResult:
    """Fit SAGL (:func:`fit_sagl`) and cluster by one spectral read-out.

    ``fusion="graphs"``: read out the mean of the per-view graphs (``SAGLResult.graph``);
    ``"representations"``: read out the ``k``-NN graph of the concatenated aggregated codes
    ``[H⁽¹⁾, …]`` (:func:`knn_graph`, the same read-out as the ``k``-NN baseline on the
    inputs). Returns the :class:`SAGLResult` with ``labels (n,)``.
    """
    n_clusters = check_positive_int(n_clusters, "n_clusters")
    fusion = check_choice(fusion, "fusion", FUSIONS)
    res = fit_sagl(views, seed=seed, **fit_kwargs)
    if fusion == "graphs":
        graph = res.graph
    else:
        graph = knn_graph([res.hidden], k)
    res.labels = spectral_readout(graph, n_clusters, seed=seed)
    return res
