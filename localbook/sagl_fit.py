"""Training the sparse attention graph and clustering with it (chapter 9).

:func:`fit_sagl` minimizes the loss of :func:`localbook.sagl_loss` over the model
:class:`localbook.SparseAttentionGraph` with full-batch Adam until the loss plateaus (a stated
rule, not a step count) and returns a :class:`SAGLResult`; :func:`sagl_cluster` fits and reads
the clusters out by spectral clustering of the fused graph (or of the concatenated
representations, ``fusion="representations"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import torch

from ._validate import (
    check_choice,
    check_positive_float,
    check_positive_int,
    check_views,
    compute_dtype,
)
from .sagl import OBJECTIVES, SparseAttentionGraph, effective_neighbours, sagl_loss
from .sagl_graphs import (
    candidate_neighbours,
    knn_graph,
    spectral_readout,
    standardize_views,
)

__all__ = ["SAGLResult", "view_candidates", "fit_sagl", "sagl_cluster"]


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
    xs = check_views(xs, "xs")
    m = check_positive_int(m, "m")
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
    RNG state and default dtype are left untouched; the model then takes the views' dtype,
    float32 for half-precision views). **Stopping rule** (a loss plateau): stop at step ``t ≥ window`` once
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
    xs = [x.to(compute_dtype(x.dtype)) for x in xs]  # half precision trains in float32
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
