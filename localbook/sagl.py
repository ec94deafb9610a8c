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

Training and the read-out live in :mod:`localbook.sagl_fit`, the baselines and the views'
preparation in :mod:`localbook.sagl_graphs`, the chapter's data in :mod:`localbook.datasets`.
"""

from __future__ import annotations

import math
import warnings
from typing import List, Optional, Sequence

import torch
from torch import nn

from ._validate import (
    as_tensor,
    check_choice,
    check_positive_float,
    check_positive_int,
    check_positive_ints,
    check_views,
)
from .entmax import entmax15
from .sagl_graphs import _scatter_rows

__all__ = ["SparseAttentionGraph", "sagl_loss", "effective_neighbours"]

GRAPHS = ("entmax15", "softmax", "identity")
OBJECTIVES = ("codes", "inputs")


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
        views = check_views(views, like=next(self.parameters()))
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
    views = check_views(views, like=out["recon"][0])
    shapes = [tuple(x.shape) for x in out["recon"]]
    if [tuple(x.shape) for x in views] != shapes:
        raise ValueError(
            f"views must be the views the model ran on, of shapes {shapes}; got "
            f"{[tuple(x.shape) for x in views]}"
        )
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
