"""Benchmark: SAGL training and read-out (chapter 9) vs plain formulations of the maths.

The model (``lb.SparseAttentionGraph``) builds one graph per view: per-view encoders,
bilinear scores ``β_l (ZU_l)(ZV_l)ᵀ/√C`` scaled per row by the gate ``γ^(2ω − 1)``,
1.5-entmax rows, residual aggregation ``H_l = Z_l + (A_l Z_l) W_l``, and decoders of
every view from ``[H_1, …, H_L]``. The loss (``lb.sagl_loss``, ``objective="inputs"``)
is each view's self-expression through its own graph plus the reconstruction of every
view.

* **Training step, candidates** (forward, loss, backward, Adam) on 2,000 Fashion-MNIST
  images in three views (``lb.make_fashion_views``, 50 principal components each,
  standardized), 20 candidates per view (``lb.view_candidates``: each view's 20 nearest
  points in that view): the model's gather path (``_GatherRows``, whose backward is one
  sparse product, and batched products for the weighted sums) against the same maths
  written the plain PyTorch way: neighbour rows by advanced indexing ``z[index]``
  (autograd's ``index_add_`` backward) and the contractions by ``torch.einsum``.
* **Training step, all pairs** on 1,000 images (every other point a candidate,
  ``lb.view_candidates(xs, n - 1)``): the model's dense path (matrix products, diagonal
  masked, and the ``(n, n − 1)`` weights and scores it returns) against a plain
  reference that forms the full ``(n, n)`` scores with ``torch.einsum``, masks the
  diagonal with ``-inf`` and aggregates and self-expresses with ``einsum`` over all
  points.

  In both cases the reference starts from a copy of the model's initial weights and
  uses the same ``lb.entmax15``; the loss and every parameter gradient are checked to
  agree before timing.
* **Spectral read-out** ``lb.spectral_readout`` of the trained fused graph (the mean of
  the per-view graphs, ``torch.stack(model.dense(out)).mean(0)``, from ``lb.fit_sagl``
  with the library's stopping rule) against scikit-learn's
  ``SpectralClustering(affinity="precomputed")`` on the same symmetrized graph
  ``W = (|A| + |A|ᵀ)/2``. The algorithms differ in a detail (scikit-learn divides the
  eigenvectors by the square roots of the degrees where Ng–Jordan–Weiss normalizes the
  rows), so agreement is reported as the ARI between the two labelings and the accuracy
  of each, not asserted equal.

    python benchmarks/bench_sagl.py [--device cpu|cuda] [--quick] [--threads T]

``--quick``: 50 images per class (candidates) and 30 (all pairs) instead of 200 and 100.
Writes ``benchmarks/results/sagl[-cuda].md`` and reassembles ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import configure, parser, time_interleaved, write_section  # noqa: E402

import localbook as lb  # noqa: E402

LATENT, HIDDEN, LR = 16, 32, 1e-2


def plain_parts(model, xs):
    """Codes, gate factors ``γ^(2ω − 1)`` and score scales ``β/√C`` per graph."""
    codes, sharpen = [], []
    for enc, x in zip(model.encoders, xs):
        z = enc(x)
        z = z - z.mean(0)
        codes.append(z / (z.pow(2).mean(0) + 1e-8).sqrt())
    for gate, z in zip(model.gates, codes):
        logit = gate(z).squeeze(1)
        omega = torch.sigmoid(logit - logit.mean())
        sharpen.append(model.gate_range ** (2 * omega - 1))
    scale = model.log_beta.exp() / math.sqrt(model.latent_dim)
    return codes, sharpen, scale


def plain_rec(model, xs, hidden):
    h = torch.cat(hidden, 1)
    return sum(
        (x - dec(h)).pow(2).sum() / x.pow(2).sum() for x, dec in zip(xs, model.decoders)
    )


def plain_loss_gather(model, xs, index, gathered):
    """Per-view graphs on candidates by ``z[index]`` and ``einsum``; loss (λ = 1)."""
    codes, sharpen, scale = plain_parts(model, xs)
    se, hidden = 0.0, []
    for g, (x, z, idx) in enumerate(zip(xs, codes, index)):
        zu, zv = z @ model.U[g], z @ model.V[g]
        s = torch.einsum("nc,nmc->nm", zu, zv[idx]) * (scale[g] * sharpen[g])[:, None]
        w = lb.entmax15(s, dim=1)
        hidden.append(z + model.W[g](torch.einsum("nm,nmc->nc", w, z[idx])))
        xa = torch.einsum("nm,nmd->nd", w, gathered[g][0])
        se = se + (x - xa).pow(2).sum() / x.pow(2).sum()
    return se + plain_rec(model, xs, hidden)


def plain_loss_dense(model, xs):
    """Per-view graphs, all pairs: ``(n, n)`` scores by ``einsum``, diagonal masked."""
    codes, sharpen, scale = plain_parts(model, xs)
    n = xs[0].shape[0]
    diag = torch.eye(n, dtype=torch.bool, device=xs[0].device)
    se, hidden = 0.0, []
    for g, (x, z) in enumerate(zip(xs, codes)):
        zu, zv = z @ model.U[g], z @ model.V[g]
        s = torch.einsum("ic,jc->ij", zu, zv) * (scale[g] * sharpen[g])[:, None]
        a = lb.entmax15(s.masked_fill(diag, -math.inf), dim=1)
        hidden.append(z + model.W[g](torch.einsum("ij,jc->ic", a, z)))
        se = se + (x - torch.einsum("ij,jd->id", a, x)).pow(2).sum() / x.pow(2).sum()
    return se + plain_rec(model, xs, hidden)


def fashion(per_class: int, dev: str):
    views, y = lb.make_fashion_views(n_per_class=per_class, seed=0, dtype=torch.float32)
    return [x.to(dev) for x in lb.standardize_views(lb.reduce_views(views, 50))], y


def compare_step(xs, index, gathered, plain, dev: str):
    """Check loss and gradients of model vs ``plain`` from the same weights, then time
    interleaved training steps. Returns ``(t_plain, t_model, loss_diff, grad_diff)``."""
    torch.manual_seed(0)
    ours = lb.SparseAttentionGraph(
        [x.shape[1] for x in xs], latent_dim=LATENT, hidden_dim=HIDDEN
    ).to(dev)
    ref = copy.deepcopy(ours)

    def loss_ours():
        out = ours(xs, index)
        return lb.sagl_loss(out, xs, 1.0, "inputs", gathered)[0]

    def loss_ref():
        return plain(ref)

    l1, l2 = loss_ours(), loss_ref()
    g1 = torch.autograd.grad(l1, list(ours.parameters()))
    g2 = torch.autograd.grad(l2, list(ref.parameters()))
    loss_diff = abs(float(l1.detach()) - float(l2.detach())) / abs(float(l2.detach()))
    # relative to the largest gradient entry: the encoders' output biases have
    # gradient ~0 (the codes are batch-standardized), where a per-tensor ratio would
    # compare noise
    scale = max(float(b.abs().max()) for b in g2)
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(g1, g2)) / scale
    assert loss_diff < 1e-5 and grad_diff < 1e-4, (loss_diff, grad_diff)

    def step(model, loss_fn):
        opt = torch.optim.Adam(model.parameters(), lr=LR)

        def run():
            loss = loss_fn()
            opt.zero_grad()
            loss.backward()
            opt.step()

        return run

    t_ours, t_ref = time_interleaved(
        [step(ours, loss_ours), step(ref, loss_ref)], dev, repeat=10, warmup=2
    )
    return t_ref, t_ours, loss_diff, grad_diff


def row(case, t_ref, t_ours, agreement):
    return [
        case,
        f"{t_ref * 1e3:.1f}",
        f"{t_ours * 1e3:.1f}",
        f"**{t_ref / t_ours:.2f}×**",
        agreement,
    ]


def main() -> int:
    args = parser(__doc__).parse_args()
    dev = args.device
    threads = configure(args)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from sklearn.cluster import SpectralClustering
    from sklearn.metrics import adjusted_rand_score

    rows = []
    # 1. candidates: each view's 20 nearest points in that view, the gather path
    xs, y = fashion(50 if args.quick else 200, dev)
    n, m = xs[0].shape[0], 20
    index = lb.view_candidates(xs, m)
    gathered = [[x[idx]] for x, idx in zip(xs, index)]  # per graph: its own view
    t_ref, t_ours, dl, dg = compare_step(
        xs, index, gathered, lambda r: plain_loss_gather(r, xs, index, gathered), dev
    )
    rows.append(
        row(
            f"training step, candidates: n = {n:,}, 3 views × 50, "
            f"{m} per view (gather path)",
            t_ref,
            t_ours,
            f"loss (rel.) {dl:.0e}, gradients (rel.) {dg:.0e}",
        )
    )

    # 2. all pairs: every other point a candidate, the dense path
    xd, _ = fashion(30 if args.quick else 100, dev)
    nd = xd[0].shape[0]
    index_d = lb.view_candidates(xd, nd - 1)
    t_ref, t_ours, dl, dg = compare_step(
        xd, index_d, None, lambda r: plain_loss_dense(r, xd), dev
    )
    rows.append(
        row(
            f"training step, all pairs: n = {nd:,}, 3 views × 50 (dense path)",
            t_ref,
            t_ours,
            f"loss (rel.) {dl:.0e}, gradients (rel.) {dg:.0e}",
        )
    )

    # 3. spectral read-out of the trained fused graph
    res = lb.fit_sagl(
        [x.cpu() for x in xs], n_candidates=m, latent_dim=LATENT, hidden_dim=HIDDEN
    )
    with torch.no_grad():
        out = res.model(res.views, res.index)
        graph = torch.stack(res.model.dense(out)).mean(0)
    assert torch.equal(graph, res.graph)
    W = ((graph.abs() + graph.abs().T) / 2).double().numpy()
    per_row = float((graph > 0).sum(1).double().mean())

    def readout_ours():
        return lb.spectral_readout(graph, 10, seed=0)

    def readout_ref():
        return SpectralClustering(
            10, affinity="precomputed", random_state=0, n_init=10
        ).fit_predict(W)

    t_ro, t_sk = time_interleaved([readout_ours, readout_ref], "cpu", repeat=3)
    lab, lab_sk = readout_ours().numpy(), readout_ref()
    ari = adjusted_rand_score(lab, lab_sk)
    acc, acc_sk = lb.clustering_accuracy(y, lab), lb.clustering_accuracy(y, lab_sk)
    rows.append(
        row(
            f"spectral read-out of the trained fused graph, n = {n:,}, 10 clusters",
            t_sk,
            t_ro,
            f"ARI between the two {ari:.3f}; accuracy {acc:.3f} vs {acc_sk:.3f}",
        )
    )
    write_section(
        "sagl",
        dev,
        "SAGL training step and spectral read-out vs plain formulations",
        ["case", "reference (ms)", "localbook (ms)", "speed-up", "agreement"],
        rows,
        f"float32, torch threads: {threads}. The model builds one graph per view "
        f"(three graphs; latent dimension {LATENT}, encoders' hidden width {HIDDEN}), "
        "objective `inputs`, λ = 1; one step is forward, `sagl_loss`, backward and an"
        f" Adam update (lr {LR:g}). Candidates: `lb.view_candidates(xs, {m})` (each "
        "view's nearest points in that view) and the model's gather path (gathers "
        "whose backward is one sparse product, batched products for the weighted "
        "sums; the views' gathered neighbour rows are computed once and given to both"
        " sides) vs the same maths with `z[index]` and `torch.einsum`. All pairs: the"
        " model's dense path (matrix products, diagonal masked, plus the `(n, n − 1)`"
        " weights and scores it returns) vs full `(n, n)` scores by `torch.einsum` "
        "with the diagonal masked and `einsum` aggregation; the plain reference "
        "computes only what the loss needs. Both sides use `lb.entmax15` and start "
        "from a copy of the same initial weights (loss, relative, and every parameter"
        " gradient, relative to the largest entry, checked); best of 10 interleaved "
        "steps after 2 warm-up steps (both models keep training, so later steps see "
        "different weights). Read-out: the fused graph (mean of the three per-view "
        f"graphs, {per_row:.1f} nonzeros per row) after `lb.fit_sagl` (n_candidates = "
        f"{m}, library defaults: lr 1e-2, stopping rule window 20, tol 0.002; "
        f"{res.n_steps} steps); `lb.spectral_readout` (sparse normalized affinity, "
        "Lanczos, k-means with 10 restarts) vs scikit-learn "
        "`SpectralClustering(affinity='precomputed', n_init=10)` on the same "
        "symmetrized graph; best of 3 interleaved runs. The two read-outs are "
        "different algorithms: their agreement is the ARI shown, not an identity.",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
