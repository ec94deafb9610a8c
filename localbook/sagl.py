r"""Sparse attention graph learning (SAGL): a graph whose rows are sparse local means.

Data: ``V`` views ``X⁽ᵛ⁾ (n, d_v)`` of the same ``n`` samples. The model (:class:`SparseAttentionGraph`)

1. encodes each view, ``Z⁽ᵛ⁾ = normalize(f_v(X⁽ᵛ⁾))`` (``(n, C)``, unit rows);
2. scores pairs with a **bilinear, asymmetric** similarity, averaged over views,
   ``S = (1/V) Σ_v (Z⁽ᵛ⁾U_v)(Z⁽ᵛ⁾V_v)ᵀ / √C`` (``(n, n)``, ``Sᵢⱼ ≠ Sⱼᵢ``), with the diagonal
   excluded (``Sᵢᵢ = −∞``: no point explains itself);
3. sharpens row ``i`` by a **dynamic sparse gate** ``ωᵢ = σ(g(z̄ᵢ)) ∈ [0, 1]`` (a small MLP on
   the mean code ``z̄ᵢ``): ``S̃ᵢⱼ = (1 + κ ωᵢ) Sᵢⱼ`` — a larger ``ωᵢ`` is a lower temperature, so
   fewer, surer neighbours survive;
4. projects every row onto the simplex with **1.5-entmax**, ``Aᵢ = entmax₁.₅(S̃ᵢ)``: rows sum to
   one, ``Aᵢᵢ = 0``, and low scores get *exact* zeros — a sparse directed graph;
5. aggregates with a residual, ``H = Z̄ + A Z̄ W`` (``(n, C)``).

Training (:func:`fit_sagl`) minimizes, for standardized views ``X̃⁽ᵛ⁾``,

.. math::
    L = \sum_v \frac{\|\tilde X^{(v)} - A \tilde X^{(v)}\|_F^2}{\|\tilde X^{(v)}\|_F^2}
      + \lambda \sum_v \frac{\|\tilde X^{(v)} - D_v(H)\|_F^2}{\|\tilde X^{(v)}\|_F^2},

self-expression of every view through one shared graph, plus reconstruction of every view from
the aggregated code by linear decoders ``D_v``. What keeps this away from trivial solutions:
``A = I`` (perfect self-expression) is removed by the excluded diagonal; ``A = 0`` and shrinking
the weights are removed by the simplex (rows sum to one); self-expression is measured on the
*fixed* inputs, not on the learned codes, so collapsing the encoders to a constant cannot zero it
(a constant ``Z`` gives uniform rows, i.e. every point replaced by the global mean, the worst
local mean); the unit-norm codes stop the encoders from shrinking the logits; and the
reconstruction term keeps ``H`` informative about every view, which is the only signal the
encoders get in the identity-graph ablation.

The clustering read-out (:func:`spectral_readout`) is normalized spectral clustering of the
symmetrized graph ``W = (A + Aᵀ)/2``. The graph is stored as a dense ``(n, n)`` tensor (sparse in
its values, not its storage): the module is meant for ``n`` up to a few thousand points, trained
full-batch. :func:`make_multiview_subspaces` draws a union of
subspaces seen through several random nonlinear maps; :func:`make_digits_views` builds a real
two-view set offline (scikit-learn digits as pixels and as gradient-orientation histograms).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
from torch import nn

from ._validate import as_tensor, check_choice, check_positive_float, check_positive_int
from .entmax import entmax15

__all__ = [
    "make_multiview_subspaces", "make_digits_views", "standardize_views", "SparseAttentionGraph",
    "sagl_loss", "SAGLResult", "fit_sagl", "spectral_readout", "sagl_cluster",
]

GRAPHS = ("entmax15", "softmax", "identity")


# --- data ---------------------------------------------------------------------------------
def _orthonormal(rows: int, cols: int, g: torch.Generator, dtype) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(rows, cols, generator=g, dtype=dtype))
    return q


_ACTIVATIONS = (torch.tanh, lambda t: torch.nn.functional.softplus(t) - math.log(2.0), torch.sin)


def make_multiview_subspaces(
    n_per_class: int = 60, n_classes: int = 4, latent_dim: int = 12, subspace_dim: int = 3,
    view_dims: Sequence[int] = (30, 50), nonlinearity: float = 1.0, noise: float = 0.05,
    seed: int = 0, dtype: Optional[torch.dtype] = None,
):
    r"""A union of ``n_classes`` linear subspaces seen through several random nonlinear maps.

    Latent points ``xᵢ = B_{yᵢ} cᵢ`` with ``B_k (latent_dim, subspace_dim)`` a random orthonormal
    basis and ``cᵢ`` uniform on the unit sphere of ``ℝ^{subspace_dim}``. View ``v`` is a random
    one-hidden-layer map with its own activation (tanh, centred softplus, sine in turn):
    ``X⁽ᵛ⁾ = σ_v(γ xᵢ G_v) M_v / γ + noise·sd·ε`` (``sd`` the view's standard deviation, ``ε``
    standard normal) with Gaussian ``G_v (latent_dim, 2·d_v)``,
    ``M_v (2·d_v, d_v)`` (scaled by fan-in) and ``γ = nonlinearity`` (small ``γ`` ≈ linear).
    Returns ``views`` (a list of ``(n, d_v)`` tensors), ``labels (n,)`` (int64) and
    ``latent (n, latent_dim)``, with ``n = n_per_class · n_classes`` and rows grouped by class.
    """
    n_per_class = check_positive_int(n_per_class, "n_per_class", minimum=2)
    n_classes = check_positive_int(n_classes, "n_classes")
    latent_dim = check_positive_int(latent_dim, "latent_dim")
    subspace_dim = check_positive_int(subspace_dim, "subspace_dim", maximum=latent_dim)
    noise = check_positive_float(noise, "noise", allow_zero=True)
    gamma = check_positive_float(nonlinearity, "nonlinearity")
    if isinstance(view_dims, (int, str)) or len(view_dims) == 0:
        raise ValueError("view_dims must be a non-empty sequence of view dimensions")
    view_dims = [check_positive_int(d, "view_dims") for d in view_dims]
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(int(seed))
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    bases = torch.stack([_orthonormal(latent_dim, subspace_dim, g, dtype) for _ in range(n_classes)])
    c = torch.randn(labels.shape[0], subspace_dim, generator=g, dtype=dtype)
    c = c / c.norm(dim=1, keepdim=True)
    latent = torch.einsum("nab,nb->na", bases[labels], c)
    views = []
    for v, d in enumerate(view_dims):
        act = _ACTIVATIONS[v % len(_ACTIVATIONS)]
        G = torch.randn(latent_dim, 2 * d, generator=g, dtype=dtype)
        M = torch.randn(2 * d, d, generator=g, dtype=dtype) / math.sqrt(2 * d)
        xv = act(gamma * latent @ G) @ M / gamma
        xv = xv + noise * xv.std() * torch.randn(xv.shape, generator=g, dtype=dtype)
        views.append(xv)
    return views, labels, latent


def _orientation_histograms(images: torch.Tensor, n_bins: int = 9, cell: int = 4) -> torch.Tensor:
    """HOG-like features: per ``cell × cell`` block, a histogram of unsigned gradient orientations
    weighted by gradient magnitude, each cell's histogram L2-normalized. ``(n, h, w)`` → ``(n, cells·n_bins)``."""
    gy, gx = torch.gradient(images, dim=(1, 2))
    mag = torch.sqrt(gx**2 + gy**2)
    ang = torch.remainder(torch.atan2(gy, gx), math.pi)  # unsigned, [0, π)
    bins = torch.clamp((ang / math.pi * n_bins).long(), max=n_bins - 1)
    n, h, w = images.shape
    cy = torch.arange(h) // cell
    cx = torch.arange(w) // cell
    ncx = (w + cell - 1) // cell
    cell_id = (cy[:, None] * ncx + cx[None, :]).expand(n, h, w)
    n_cells = ((h + cell - 1) // cell) * ncx
    idx = (cell_id * n_bins + bins).reshape(n, -1)
    hist = torch.zeros(n, n_cells * n_bins, dtype=images.dtype).scatter_add_(1, idx, mag.reshape(n, -1))
    hist = hist.reshape(n, n_cells, n_bins)
    hist = hist / hist.norm(dim=2, keepdim=True).clamp(min=1e-12)
    return hist.reshape(n, -1)


def make_digits_views(n_per_class: int = 40, seed: int = 0, dtype: Optional[torch.dtype] = None):
    """Two views of scikit-learn's handwritten digits (offline): raw pixels and gradient histograms.

    Draws ``n_per_class`` images of each digit (``n = 10·n_per_class``, rows grouped by class).
    View 0: the 64 pixel intensities scaled to [0, 1]; view 1: 16 cells (2 × 2 pixels) × 6
    unsigned orientation bins of the image gradient, each cell L2-normalized (HOG-like, 96 features). Returns
    ``views`` (list of two ``(n, d_v)`` tensors) and ``labels (n,)``.
    """
    from sklearn.datasets import load_digits

    n_per_class = check_positive_int(n_per_class, "n_per_class", minimum=2, maximum=174)
    dtype = dtype or torch.get_default_dtype()
    data = load_digits()
    images = torch.as_tensor(data.images, dtype=dtype) / 16.0
    target = torch.as_tensor(data.target)
    g = torch.Generator().manual_seed(int(seed))
    keep = []
    for k in range(10):  # ten classes, not data points
        members = torch.nonzero(target == k).flatten()
        keep.append(members[torch.randperm(members.numel(), generator=g)[:n_per_class]])
    keep = torch.cat(keep)
    images = images[keep]
    views = [images.reshape(len(keep), -1), _orientation_histograms(images, n_bins=6, cell=2)]
    return views, target[keep].long()


def _check_views(views, name: str = "views", like: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    if isinstance(views, torch.Tensor) or not isinstance(views, (list, tuple)):
        raise TypeError(f"{name} must be a list of (n, d_v) arrays, one per view, got {type(views).__name__}")
    if len(views) == 0:
        raise ValueError(f"{name} is empty; at least one view is needed")
    out = []
    for v, x in enumerate(views):
        t = as_tensor(x, f"{name}[{v}]", like=like if like is not None else (out[0] if out else None), ndim=(2,))
        if out and t.shape[0] != out[0].shape[0]:
            raise ValueError(f"{name}[{v}] has {t.shape[0]} rows but {name}[0] has {out[0].shape[0]}; "
                             "every view must describe the same samples")
        out.append(t)
    if out[0].shape[0] < 2:
        raise ValueError(f"{name} must hold at least 2 samples to build a graph, got {out[0].shape[0]}")
    return out


def standardize_views(views) -> List[torch.Tensor]:
    """Centre each feature and scale each view to unit mean squared row norm (``(n, d_v)`` each)."""
    views = _check_views(views)
    out = []
    for x in views:
        x = x - x.mean(0)
        out.append(x / x.pow(2).sum(1).mean().sqrt().clamp(min=torch.finfo(x.dtype).tiny))
    return out


def _mask_diagonal(s: torch.Tensor) -> torch.Tensor:
    """``s`` with ``−∞`` on the diagonal (a point may not choose itself as a neighbour)."""
    eye = torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    return s.masked_fill(eye, -math.inf)


# --- model --------------------------------------------------------------------------------
class SparseAttentionGraph(nn.Module):
    r"""SAGL: per-view encoders → bilinear asymmetric scores → gate → 1.5-entmax graph → residual aggregation.

    ``view_dims``: feature count ``d_v`` of each view. ``latent_dim`` ``C``: code size.
    ``graph``: ``"entmax15"`` (SAGL), ``"softmax"`` (dense attention ablation) or
    ``"identity"`` (``A = I``: no graph, ablation). ``gate``: use the dynamic sparse gate
    (``False``: ``ω ≡ 0``, ablation). ``gate_strength`` ``κ``: the sharpest row is scaled by
    ``1 + κ``. ``init_scale``: ``U = V = √(init_scale·√C)·I`` at start, so the first scores are
    ``init_scale × cosine similarity``.

    ``forward(views)`` takes a list of ``(n, d_v)`` tensors and returns a dict with
    ``graph`` ``A (n, n)``, ``scores`` ``S̃ (n, n)`` (``−∞`` on the diagonal), ``omega (n,)``,
    ``codes`` (list of ``Z⁽ᵛ⁾ (n, C)``), ``hidden`` ``H (n, C)`` and ``recon`` (list of
    ``D_v(H) (n, d_v)``).
    """

    def __init__(self, view_dims: Sequence[int], latent_dim: int = 32, hidden_dim: int = 64,
                 graph: str = "entmax15", gate: bool = True, gate_strength: float = 4.0,
                 gate_hidden: int = 16, init_scale: float = 10.0):
        super().__init__()
        if isinstance(view_dims, (int, str)) or len(view_dims) == 0:
            raise ValueError("view_dims must be a non-empty sequence of view dimensions")
        self.view_dims = [check_positive_int(d, "view_dims") for d in view_dims]
        C = self.latent_dim = check_positive_int(latent_dim, "latent_dim")
        hidden_dim = check_positive_int(hidden_dim, "hidden_dim")
        self.graph_kind = check_choice(graph, "graph", GRAPHS)
        if not isinstance(gate, bool):
            raise TypeError(f"gate must be True or False, got {type(gate).__name__}")
        self.use_gate = gate
        self.gate_strength = check_positive_float(gate_strength, "gate_strength", allow_zero=True)
        init_scale = check_positive_float(init_scale, "init_scale")
        self.encoders = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, C)) for d in self.view_dims)
        root = math.sqrt(init_scale * math.sqrt(C))
        self.U = nn.ParameterList(nn.Parameter(root * torch.eye(C)) for _ in self.view_dims)
        self.V = nn.ParameterList(nn.Parameter(root * torch.eye(C)) for _ in self.view_dims)
        self.gate = nn.Sequential(nn.Linear(C, gate_hidden), nn.GELU(), nn.Linear(gate_hidden, 1)) if gate else None
        self.W = nn.Linear(C, C, bias=False)
        self.decoders = nn.ModuleList(nn.Linear(C, d) for d in self.view_dims)

    def codes(self, views: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Unit-norm codes ``Z⁽ᵛ⁾ = f_v(X⁽ᵛ⁾)/|f_v(X⁽ᵛ⁾)|`` (list of ``(n, C)``)."""
        return [nn.functional.normalize(enc(x), dim=1) for enc, x in zip(self.encoders, views)]

    def similarity(self, codes: Sequence[torch.Tensor]) -> torch.Tensor:
        """Bilinear asymmetric similarity ``S = (1/V) Σ_v (Z⁽ᵛ⁾U_v)(Z⁽ᵛ⁾V_v)ᵀ/√C``, ``(n, n)`` (diagonal kept)."""
        C = self.latent_dim
        return sum((z @ u) @ (z @ v).T for z, u, v in zip(codes, self.U, self.V)) / (len(codes) * math.sqrt(C))

    def forward(self, views: Sequence[torch.Tensor]) -> dict:
        views = _check_views(views, like=next(self.parameters()))
        if [x.shape[1] for x in views] != self.view_dims:
            raise ValueError(f"views have {[x.shape[1] for x in views]} features but the model expects {self.view_dims}")
        z = self.codes(views)
        zbar = torch.stack(z).mean(0)
        n = zbar.shape[0]
        if self.use_gate:
            omega = torch.sigmoid(self.gate(zbar)).squeeze(1)
        else:
            omega = torch.zeros(n, dtype=zbar.dtype, device=zbar.device)
        # scale first, then mask: (-inf) * (gate) would give NaN gradients to the gate
        s = _mask_diagonal(self.similarity(z) * (1.0 + self.gate_strength * omega)[:, None])
        if self.graph_kind == "entmax15":
            a = entmax15(s, dim=1)
        elif self.graph_kind == "softmax":
            a = torch.softmax(s, dim=1)
        else:
            a = torch.eye(n, dtype=zbar.dtype, device=zbar.device)
        hidden = zbar + a @ self.W(zbar)
        recon = [dec(hidden) for dec in self.decoders]
        return {"kind": self.graph_kind, "graph": a, "scores": s, "omega": omega, "codes": z, "hidden": hidden, "recon": recon}


def sagl_loss(out: dict, views: Sequence[torch.Tensor], reconstruction_weight: float = 0.1):
    r"""``L = Σ_v |X⁽ᵛ⁾ − A X⁽ᵛ⁾|²/|X⁽ᵛ⁾|² + λ Σ_v |X⁽ᵛ⁾ − D_v(H)|²/|X⁽ᵛ⁾|²`` (Frobenius norms).

    The self-expression term is left out for the identity graph (``A = I`` explains every point
    by itself; nothing to learn). Returns ``(total, self_expression, reconstruction)`` scalars.
    """
    a = out["graph"]
    identity = out["kind"] == "identity"
    se = a.new_zeros(())
    rec = a.new_zeros(())
    for x, xr in zip(views, out["recon"]):
        norm = x.pow(2).sum()
        if not identity:
            se = se + (x - a @ x).pow(2).sum() / norm
        rec = rec + (x - xr).pow(2).sum() / norm
    return se + reconstruction_weight * rec, se, rec


# --- training and read-out ---------------------------------------------------------------
@dataclass
class SAGLResult:
    """What :func:`fit_sagl` / :func:`sagl_cluster` return."""

    model: SparseAttentionGraph
    graph: torch.Tensor  #: ``A (n, n)``, detached
    omega: torch.Tensor  #: gate values ``(n,)``
    hidden: torch.Tensor  #: aggregated codes ``H (n, C)``
    losses: List[float] = field(default_factory=list)  #: training loss per step
    labels: Optional[torch.Tensor] = None  #: cluster labels ``(n,)`` (``sagl_cluster`` only)


def fit_sagl(views, *, graph: str = "entmax15", gate: bool = True, latent_dim: int = 32,
             hidden_dim: int = 64, n_steps: int = 200, lr: float = 1e-2,
             reconstruction_weight: float = 0.1, seed: int = 0, **model_kwargs) -> SAGLResult:
    """Train a :class:`SparseAttentionGraph` on ``views`` (list of ``(n, d_v)``) with full-batch Adam.

    Views are standardized (:func:`standardize_views`), the model's weights are drawn with
    ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the caller's RNG state is left
    untouched), moved to the views' dtype and device, and :func:`sagl_loss` is minimized for
    ``n_steps`` steps. ``model_kwargs`` go to :class:`SparseAttentionGraph`.
    Returns a :class:`SAGLResult` holding the model and the final graph ``A (n, n)``.
    """
    xs = standardize_views(views)
    n_steps = check_positive_int(n_steps, "n_steps")
    lr = check_positive_float(lr, "lr")
    reconstruction_weight = check_positive_float(reconstruction_weight, "reconstruction_weight", allow_zero=True)
    with torch.random.fork_rng(devices=[]):  # weights are drawn on the CPU
        torch.manual_seed(int(seed))
        model = SparseAttentionGraph([x.shape[1] for x in xs], latent_dim=latent_dim, hidden_dim=hidden_dim,
                                     graph=graph, gate=gate, **model_kwargs)
    model = model.to(device=xs[0].device, dtype=xs[0].dtype)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(n_steps):  # optimisation steps, not data points
        opt.zero_grad()
        total, _, _ = sagl_loss(model(xs), xs, reconstruction_weight)
        total.backward()
        opt.step()
        losses.append(float(total.detach()))
    with torch.no_grad():
        out = model(xs)
    return SAGLResult(model, out["graph"].detach(), out["omega"].detach(), out["hidden"].detach(), losses)


def spectral_readout(graph, n_clusters: int, seed: int = 0) -> torch.Tensor:
    r"""Normalized spectral clustering of the symmetrized graph ``W = (|A| + |A|ᵀ)/2``.

    Embeds each node by the ``n_clusters`` leading eigenvectors of ``D^{-1/2} W D^{-1/2}``
    (``D`` = degrees; isolated nodes keep a zero row), normalizes the rows
    (Ng–Jordan–Weiss) and runs k-means (scikit-learn, 10 restarts, ``random_state=seed``).
    ``graph (n, n)`` → labels ``(n,)`` (int64, on the graph's device).
    """
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    a = as_tensor(graph, "graph", ndim=(2,)).detach()
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"graph must be a square (n, n) matrix, got shape {tuple(a.shape)}")
    n = a.shape[0]
    k = check_positive_int(n_clusters, "n_clusters", maximum=n)
    w = (a.abs() + a.abs().T) / 2
    deg = w.sum(1)
    inv = torch.where(deg > 0, deg.clamp(min=torch.finfo(w.dtype).tiny).rsqrt(), torch.zeros_like(deg))
    m = inv[:, None] * w * inv[None, :]
    _, vecs = torch.linalg.eigh(m.double())
    emb = vecs[:, -k:]
    emb = emb / emb.norm(dim=1, keepdim=True).clamp(min=1e-12)
    with threadpool_limits(1):  # tiny problem: threads only add contention
        km = KMeans(n_clusters=k, n_init=10, random_state=int(seed)).fit(emb.cpu().numpy())
    return torch.as_tensor(km.labels_, dtype=torch.int64, device=a.device)


def sagl_cluster(views, n_clusters: int, *, seed: int = 0, **fit_kwargs) -> SAGLResult:
    """Fit SAGL (:func:`fit_sagl`) and cluster: spectral read-out of ``(A + Aᵀ)/2``.

    For the identity graph (``graph="identity"``) there is no graph to cut, so the read-out is
    k-means on the aggregated codes ``H``. Returns the :class:`SAGLResult` with ``labels (n,)``.
    """
    n_clusters = check_positive_int(n_clusters, "n_clusters")
    res = fit_sagl(views, seed=seed, **fit_kwargs)
    if res.model.graph_kind == "identity":
        from sklearn.cluster import KMeans
        from threadpoolctl import threadpool_limits

        h = nn.functional.normalize(res.hidden, dim=1).double().cpu().numpy()
        with threadpool_limits(1):
            km = KMeans(n_clusters=n_clusters, n_init=10, random_state=int(seed)).fit(h)
        res.labels = torch.as_tensor(km.labels_, dtype=torch.int64, device=res.graph.device)
    else:
        res.labels = spectral_readout(res.graph, n_clusters, seed=seed)
    return res
