"""The SAGL reproduction at full protocol: every method, ablation and intervention of chapter 9,
ten seeds per data set, written to ``localbook/data/sagl_reproduction.csv`` (one row per data
set, seed and method) and ``sagl_gate.csv`` (the gate's distribution per view), with the
command, commit and date in ``sagl_reproduction.json``. Chapter 9 reads and plots them.

    python reproductions/sagl.py             # ~20 min on 2 CPU cores
    python reproductions/sagl.py --seeds 2 --datasets syn --out /tmp/sagl   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import localbook as lb  # noqa: E402

#: the data sets: (maker, number of clusters); the chapter runs "syn" and "dig" live
DATASETS = {
    "syn": "union of 4 subspaces, 2 nonlinear views (30, 50), 240 points",
    "dig": "digits, pixels + gradient histograms, 300 points",
    "fm": "Fashion-MNIST test images, 3 views reduced to 50 components, 1,000 points",
}
N_CLUSTERS = {"syn": 4, "dig": 10, "fm": 10}
#: the training protocol shared by every SAGL variant (the library's defaults, stated)
FIT = dict(latent_dim=16, hidden_dim=32, lr=1e-2, max_steps=400, window=20, tol=0.002)
ABLATIONS = {
    "dense softmax": dict(graph="softmax"),
    "no gate (ω ≡ ½)": dict(gate=False),
    "one shared graph": dict(shared=True),
}


def make(name: str, seed: int):
    """The views and labels of data set ``name`` drawn with ``seed`` (float32)."""
    if name == "syn":
        views, y, _ = lb.make_multiview_subspaces(
            n_per_class=60,
            n_classes=4,
            view_dims=(30, 50),
            noise=0.2,
            seed=seed,
            dtype=torch.float32,
        )
        return views, y
    if name == "dig":
        return lb.make_digits_views(n_per_class=30, seed=seed, dtype=torch.float32)
    views, y = lb.make_fashion_views(n_per_class=100, seed=seed, dtype=torch.float32)
    return lb.reduce_views(views, 50), y


def scores(y, labels, graph=None) -> dict:
    """ACC, NMI, ARI of ``labels``; with a graph its purity ρ and effective neighbours."""
    out = {
        "ACC": lb.clustering_accuracy(y, labels),
        "NMI": lb.nmi(y, labels),
        "ARI": lb.ari(y, labels),
    }
    if graph is not None:
        out["rho"] = lb.subspace_preserving_rate(graph, y)
        out["neighbours"] = float(lb.effective_neighbours(graph).mean())
        out["support"] = float((graph > 0).sum(1).double().mean())
    return out


def run_one(task):
    """Every method on one draw; returns (rows, gate rows)."""
    name, seed, long_training = task
    torch.set_num_threads(1)
    K = N_CLUSTERS[name]
    views, y = make(name, seed)
    rows, gate_rows = [], []

    def add(method, labels, graph=None, **extra):
        rows.append(
            {
                "dataset": name,
                "seed": seed,
                "method": method,
                **scores(y, labels, graph),
                **extra,
            }
        )

    def read(graph):
        return lb.spectral_readout(graph, K, seed=seed)

    from sklearn.cluster import KMeans

    X = torch.cat(lb.standardize_views(views), 1).numpy()
    add(
        "k-means (floor)",
        torch.as_tensor(KMeans(K, n_init=10, random_state=seed).fit(X).labels_),
    )
    graphs = {f"k-NN graph (k = {k})": lb.knn_graph(views, k) for k in (5, 10, 20)}
    graphs["k-NN per view, fused (k = 10)"] = lb.fused_knn_graph(views, 10)
    graphs["untrained entmax (distances)"] = lb.entmax_distance_graph(views, 10, 30)
    graphs["untrained dense attention"] = lb.attention_graph(views)
    graphs["LSR"] = lb.lsr_graph(views, 0.1)
    graphs["self-expression optimum"] = lb.self_expression_graph(views, 60)
    for method, A in graphs.items():
        add(method, read(A), A)

    def step0(step, out):  # the untrained SAGL graph (step 0)
        return torch.stack(lb.SparseAttentionGraph.dense(out)).mean(0).detach()

    t0 = time.perf_counter()
    res = lb.sagl_cluster(
        views, K, seed=seed, callback=step0, callback_every=10**9, **FIT
    )
    secs = time.perf_counter() - t0
    se = float(lb.sagl_loss(res.model(res.views, res.index), res.views)[1])
    add("untrained SAGL (step 0)", read(res.history[0]), res.history[0])
    add(
        "SAGL",
        res.labels,
        res.graph,
        steps=res.n_steps,
        seconds=secs,
        self_expression=se,
        beta=float(res.beta.mean()),
    )
    add(
        "SAGL, representations fused",
        read(lb.knn_graph([res.hidden], 10)),
        steps=res.n_steps,
    )
    for label, kw in [
        ("SAGL, β × 0.5 (wider)", dict(beta_scale=0.5)),
        ("SAGL, β × 2 (narrower)", dict(beta_scale=2.0)),
        ("SAGL, every ω = 0", dict(omega=0.0)),
        ("SAGL, every ω = 1", dict(omega=1.0)),
    ]:
        A = res.regraph(**kw)
        add(label, read(A), A)
    for l, x in enumerate(res.views):
        r10 = lb.candidate_neighbours([x], 10)[0][:, -1]
        for stage, om in [("init", res.omega_init[l]), ("trained", res.omega[l])]:
            q = np.quantile(om.numpy(), [0.05, 0.25, 0.5, 0.75, 0.95])
            rank = lambda t: t.argsort().argsort().double()  # noqa: E731
            spear = float(torch.corrcoef(torch.stack([rank(om), rank(r10)]))[0, 1])
            gate_rows.append(
                {
                    "dataset": name,
                    "seed": seed,
                    "view": l,
                    "stage": stage,
                    **{
                        f"q{int(p * 100):02d}": v
                        for p, v in zip([0.05, 0.25, 0.5, 0.75, 0.95], q)
                    },
                    "below_0.05": float((om < 0.05).double().mean()),
                    "above_0.95": float((om > 0.95).double().mean()),
                    "spearman_density": spear,
                }
            )
    ident = lb.sagl_cluster(
        views, K, seed=seed, graph="identity", fusion="representations", **FIT
    )
    add("identity graph (ablation)", ident.labels, steps=ident.n_steps)
    for method, kw in ABLATIONS.items():
        r = lb.sagl_cluster(views, K, seed=seed, **FIT, **kw)
        add(method, r.labels, r.graph, steps=r.n_steps)
    if long_training:
        r = lb.sagl_cluster(
            views, K, seed=seed, **{**FIT, "max_steps": 1000, "tol": 0.0}
        )
        add("SAGL, 1,000 steps", r.labels, r.graph, steps=r.n_steps)
    print(
        f"{name} seed {seed}: SAGL ACC {rows[-1]['ACC']:.3f} "
        f"({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return rows, gate_rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="syn,dig,fm")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument(
        "--long-seeds",
        type=int,
        default=5,
        help="seeds that also train 1,000 steps without the stopping rule",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "localbook" / "data"))
    args = ap.parse_args(argv)
    names = args.datasets.split(",")
    tasks = [(n, s, s < args.long_seeds) for n in names for s in range(args.seeds)]
    tasks.sort(key=lambda t: t[0] != "fm")  # the longest first
    start = time.time()
    with Pool(args.jobs) as pool:
        results = pool.map(run_one, tasks, chunksize=1)
    runs = pd.DataFrame([r for rows, _ in results for r in rows])
    gate = pd.DataFrame([r for _, g in results for r in g])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "sagl_reproduction.csv", index=False, float_format="%.6g")
    gate.to_csv(out / "sagl_gate.csv", index=False, float_format="%.6g")

    def git(*a):
        return subprocess.run(
            ["git", *a], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    provenance = {
        "command": "python reproductions/sagl.py " + " ".join(argv or sys.argv[1:]),
        "commit": git("rev-parse", "HEAD"),
        "library_changed_since_commit": bool(
            git("status", "--porcelain", "localbook/*.py")
        ),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": round((time.time() - start) / 60, 1),
        "machine": f"{platform.processor() or platform.machine()}, {args.jobs} processes "
        "with one torch thread each",
        "torch": torch.__version__,
        "seeds": args.seeds,
        "long_training_seeds": args.long_seeds,
        "datasets": {n: DATASETS[n] for n in names},
        "fit": FIT,
    }
    (out / "sagl_reproduction.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(runs.groupby(["dataset", "method"])[["ACC", "NMI", "ARI"]].mean().round(3))


if __name__ == "__main__":
    main()
