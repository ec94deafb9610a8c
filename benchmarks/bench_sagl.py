"""Benchmark: SAGL training and read-out (chapter 9) against plain formulations of the same maths.

* **Training step** (forward, loss, backward, Adam) of ``lb.SparseAttentionGraph`` on 2,000
  Fashion-MNIST images in three views (``lb.make_fashion_views``, 50 principal components each),
  20 candidates, ``objective="inputs"``, against the same step written the plain PyTorch way:
  neighbour rows by advanced indexing ``z[index]`` (autograd's ``index_add_`` backward) and the
  contractions by ``torch.einsum``. Both start from the same weights; the loss and every
  parameter gradient are checked to agree.
* **Spectral read-out** ``lb.spectral_readout`` of the trained graph against scikit-learn's
  ``SpectralClustering(affinity="precomputed")`` on the same symmetrized graph
  ``W = (|A| + |A|ᵀ)/2``. The algorithms differ in a detail (scikit-learn divides the
  eigenvectors by the square roots of the degrees where Ng–Jordan–Weiss normalizes the rows),
  so agreement is reported as the ARI between the two labelings and the accuracy of each, not
  asserted equal.

    python benchmarks/bench_sagl.py [--device cpu|cuda] [--quick] [--threads T]

``--quick``: 50 images per class instead of 200. Writes ``benchmarks/results/sagl[-cuda].md``.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import configure, parser, time_interleaved, write_section  # noqa: E402

import localbook as lb  # noqa: E402
from localbook import sagl  # noqa: E402


def plain_loss(model, xs, index, gathered):
    """The model's forward and ``sagl_loss`` (inputs objective, λ = 1) with indexing + einsum."""
    C = model.latent_dim
    z = model.codes(xs)
    omega = torch.sigmoid(model.gate(z * math.sqrt(C))).squeeze(1)
    zu, zv = z @ model.U, z @ model.V
    s = torch.einsum("nc,nmc->nm", zu, zv[index]) * math.sqrt(C)
    w = lb.entmax15(s * (1.0 + model.gate_strength * omega)[:, None], dim=1)
    hidden = z + model.W(torch.einsum("nm,nmc->nc", w, z[index]))
    se = sum(
        (x - torch.einsum("nm,nmd->nd", w, xn)).pow(2).sum() / x.pow(2).sum()
        for x, xn in zip(xs, gathered)
    )
    rec = sum(
        (x - dec(hidden)).pow(2).sum() / x.pow(2).sum()
        for x, dec in zip(xs, model.decoders)
    )
    return se + rec


def main() -> int:
    args = parser(__doc__).parse_args()
    dev = args.device
    threads = configure(args)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from sklearn.cluster import SpectralClustering
    from sklearn.metrics import adjusted_rand_score

    per_class = 50 if args.quick else 200
    views, y = lb.make_fashion_views(n_per_class=per_class, seed=0, dtype=torch.float32)
    xs = [x.to(dev) for x in sagl.standardize_views(lb.reduce_views(views, 50))]
    n = xs[0].shape[0]
    _, index = sagl.candidate_neighbours(xs, 20)
    gathered = [x[index] for x in xs]

    def make(seed=0):
        torch.manual_seed(seed)
        model = sagl.SparseAttentionGraph(
            [x.shape[1] for x in xs], latent_dim=16, hidden_dim=32
        ).to(dev)
        return model, torch.optim.Adam(model.parameters(), lr=3e-2)

    ours, opt_ours = make()
    ref, opt_ref = make()

    def loss_ours():
        out = ours(xs, index)
        return sagl.sagl_loss(out, xs, 1.0, "inputs", gathered)[0]

    # the same loss and gradients from the same weights
    l1, l2 = loss_ours(), plain_loss(ref, xs, index, gathered)
    g1 = torch.autograd.grad(l1, list(ours.parameters()))
    g2 = torch.autograd.grad(l2, list(ref.parameters()))
    loss_diff = abs(float(l1.detach()) - float(l2.detach()))
    # relative to the largest gradient entry: the encoders' output biases have gradient ~0
    # (the codes are batch-standardized), where a per-tensor ratio would compare noise
    scale = max(float(b.abs().max()) for b in g2)
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(g1, g2)) / scale
    assert loss_diff < 1e-5 and grad_diff < 1e-4, (loss_diff, grad_diff)

    def step(model, opt, loss_fn):
        def run():
            loss = loss_fn()
            opt.zero_grad()
            loss.backward()
            opt.step()

        return run

    t_ours, t_ref = time_interleaved(
        [
            step(ours, opt_ours, loss_ours),
            step(ref, opt_ref, lambda: plain_loss(ref, xs, index, gathered)),
        ],
        dev,
        repeat=10,
        warmup=2,
    )
    rows = [
        [
            f"one training step, n = {n:,}, 3 views × 50, 20 candidates",
            f"{t_ref * 1e3:.1f}",
            f"{t_ours * 1e3:.1f}",
            f"**{t_ref / t_ours:.2f}×**",
            f"loss {loss_diff:.0e}, gradients (rel.) {grad_diff:.0e}",
        ]
    ]

    res = lb.fit_sagl(
        [x.cpu() for x in xs], n_candidates=20, max_steps=100, tol=0.05, seed=0
    )
    graph = res.graph
    W = ((graph.abs() + graph.abs().T) / 2).double().numpy()

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
        [
            f"spectral read-out of the trained graph, n = {n:,}, 10 clusters",
            f"{t_sk * 1e3:.1f}",
            f"{t_ro * 1e3:.1f}",
            f"**{t_sk / t_ro:.2f}×**",
            f"ARI between the two {ari:.3f}; accuracy {acc:.3f} vs {acc_sk:.3f}",
        ]
    )
    write_section(
        "sagl",
        dev,
        "SAGL training step and spectral read-out vs plain formulations",
        ["case", "reference (ms)", "localbook (ms)", "speed-up", "agreement"],
        rows,
        f"torch threads: {threads}. Training step: localbook's model and `sagl_loss` (neighbour "
        "gathers whose backward is one sparse product, batched products for the weighted sums) "
        "vs the same maths with `z[index]` and `torch.einsum`, from the same initial weights "
        "(loss and gradients checked); best of 10 interleaved steps after 2 warm-up steps "
        "(both models keep training, so later steps see different weights). Read-out: "
        "`lb.spectral_readout` (sparse normalized affinity, Lanczos, k-means with 10 restarts) "
        "vs scikit-learn `SpectralClustering(affinity='precomputed', n_init=10)` on the same "
        "symmetrized graph; best of 3 interleaved runs. The two read-outs are different "
        "algorithms: their agreement is the ARI shown, not an identity.",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
