"""Part of chapter 12's imputation protocol, at the scale of the full training set.

Every Fashion-MNIST training image (60,000) as a reference image (the seed summaries describe
no protocol; this one is the book's), a few thousand test images to impute, pixels missing
completely at random (50 %) and one 12 x 12 block per image, several seeds of the masks;
the two-layer local-mean imputer (``lb.LocalMeanImputer``, its parameters tuned by hold-out
on the references), scikit-learn's ``KNNImputer`` (its k tuned by the same hold-out) and
mean imputation. Writes ``localbook/data/imputation_reproduction.csv`` (one row per
pattern, seed and method), ``imputation_images.csv`` (per test image sums of squared
errors, for paired standard errors) and ``imputation_reproduction.json`` (command, commit,
date, machine, minutes, protocol). Chapter 12 reads them with
``lb.datasets.load_stored_run("imputation")``.

    nice -n 10 python reproductions/imputation.py        # about 25 minutes on 2 CPU cores shared with other jobs
    python reproductions/imputation.py --small --out /tmp/imp   # seconds: 2,000 references

KNNImputer's rule (the mean over the k nearest references *that observe the pixel*, in the
``nan_euclidean`` distance) is computed here exactly, from the 128 nearest references of
each query and the full distance row where fewer than k of them observe the pixel: the same
numbers as ``KNNImputer(n_neighbors=k).fit(R).transform(X)`` (checked against it by the
``--small`` run in ``tests/test_reproduction_imputation.py``), in bounded memory.
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

SHAPE, RATE, BLOCK = (28, 28), 0.5, 12
KS = (1, 2, 3, 5, 7, 10, 15, 20)  # KNNImputer's candidate neighbour counts
CANDIDATES = 128  # nearest references kept per query for KNNImputer's rule
CHUNK = 250  # queries per block of distances (bounded memory)
METHODS = ("mean", "knn", "local_mean", "local_mean_mcar_tuning")
PATTERNS = {"mcar50": f"MCAR {RATE:.0%}", "block12": f"block {BLOCK}x{BLOCK}"}


def make_mask(pattern, n, seed):
    if pattern == "mcar50":
        return lb.missing_at_random_mask((n, SHAPE[0] * SHAPE[1]), RATE, seed=seed)
    return lb.block_mask(n, SHAPE, BLOCK, seed=seed)


def knn_fill(Xq, R, ks):
    """KNNImputer's value at every entry of ``Xq (m, P)`` for each k in ``ks``:
    ``(len(ks), m, P)``, NaN where Xq is observed. ``R (n, P)`` float32 with NaN holes."""
    Rt, Qt = torch.from_numpy(R), torch.from_numpy(Xq)
    obs_R = ~torch.isnan(Rt)
    col_mean = torch.nanmean(Rt, 0)
    out = torch.full((len(ks),) + Xq.shape, float("nan"), dtype=torch.float32)
    n_full = 0
    for start in range(0, len(Xq), CHUNK):
        q = Qt[start : start + CHUNK]
        d2, _ = lb.nan_sq_distances(q, Rt)
        vals, idx = torch.topk(d2, min(CANDIDATES, len(R)), dim=1, largest=False)
        ok = torch.isfinite(vals)[..., None] & obs_R[idx]  # (r, C, P) donors
        vals_c = torch.where(ok, torch.nan_to_num(Rt[idx]), 0.0)
        c = torch.cumsum(ok, 1)  # donors among the first candidates, per pixel
        miss = torch.isnan(q)
        donors_all = obs_R.sum(0)
        for j, k in enumerate(ks):
            first = ok & (c <= k)  # the k nearest donors among the candidates
            ck = first.sum(1).to(torch.float32)
            vk = (vals_c * first).sum(1)
            # fewer than k donors among the candidates, more in the reference set:
            # that pixel takes its k nearest donors from the full distance row
            short = miss & (ck < torch.clamp(donors_all, max=k)[None])
            full = torch.nonzero(short)
            n_full += len(full)
            for i, p in full.tolist():  # rare
                dn = torch.nonzero(obs_R[:, p]).flatten()
                di = d2[i, dn]
                fin = torch.isfinite(di)
                nearest = torch.topk(di, min(k, len(dn)), largest=False).indices
                sel = nearest[fin[nearest]]
                ck[i, p] = len(sel)
                vk[i, p] = Rt[dn[sel], p].sum()
            est = torch.where(ck > 0, vk / ck.clamp(min=1), col_mean[None])
            out[j, start : start + len(q)] = torch.where(miss, est, float("nan"))
    return out, n_full


def knn_holdout_k(Rm, mask_kw, seed):
    """KNNImputer's k by the hold-out of the local-mean imputer, on the references only."""
    hide = lb.holdout_mask(Rm, 0.1, seed=seed, max_rows=200, **mask_kw)
    rows = np.flatnonzero(hide.any(1))
    Q = Rm[rows].copy()
    Q[hide[rows]] = np.nan
    pred, _ = knn_fill(Q, np.delete(Rm, rows, axis=0), KS)
    err = np.sqrt(((pred[:, hide[rows]].numpy() - Rm[rows][hide[rows]]) ** 2).mean(1))
    return KS[int(np.argmin(err))], err


def run_one(task):
    """Every method on one pattern and seed: ``(rows, image rows)``."""
    pattern, seed, n_ref, n_test = task
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    train, _ = lb.load_fashion_mnist("train")
    test, _ = lb.load_fashion_mnist("test")
    rng = np.random.default_rng(0)
    ref = rng.choice(len(train), n_ref, replace=False) if n_ref < len(train) else None
    R = (train if ref is None else train[ref]).reshape(n_ref, -1).astype(np.float32)
    X = test[rng.choice(len(test), n_test, replace=False)]
    X = X.reshape(n_test, -1).astype(np.float32) / 255.0
    R /= 255.0
    mask, mask_R = (
        make_mask(pattern, n_test, seed),
        make_mask(pattern, n_ref, 100 + seed),
    )
    Xm, Rm = X.copy(), R.copy()
    Xm[mask], Rm[mask_R] = np.nan, np.nan
    del R
    block_kw = (
        dict(block=BLOCK, image_shape=SHAPE) if pattern == "block12" else {}
    )  # hold-out shaped like the pattern
    k, _ = knn_holdout_k(Rm, block_kw, seed)
    outs, tuned = {}, {}
    outs["mean"] = np.where(mask, np.nanmean(Rm, 0)[None], X)
    pred, n_full = knn_fill(Xm, Rm, (k,))
    outs["knn"] = np.where(mask, pred[0].numpy(), X)
    tuned["knn"] = dict(k=k)
    variants = {"local_mean": block_kw.get("block")}
    if pattern == "block12":
        variants["local_mean_mcar_tuning"] = None
    Rt, Xt = torch.from_numpy(Rm), torch.from_numpy(Xm)
    for name, hb in variants.items():
        imp = lb.LocalMeanImputer(SHAPE, holdout_block=hb).fit(Rt)
        outs[name] = torch.cat(
            [imp.transform(Xt[s : s + CHUNK]) for s in range(0, n_test, CHUNK)]
        ).numpy()
        tuned[name] = dict(h=imp.pixel_bandwidth_, beta=imp.image_weight_)
        del imp
    sse = {m: np.where(mask, (o - X) ** 2, 0.0).sum(1) for m, o in outs.items()}
    count = mask.sum(1)
    rows = []
    for m in outs:
        d = sse[m] - sse["knn"]
        z = d.sum() / (np.sqrt(len(d)) * d.std(ddof=1)) if m != "knn" else 0.0
        rows.append(
            dict(
                pattern=pattern,
                seed=seed,
                method=m,
                rmse=float(np.sqrt(sse[m].sum() / count.sum())),
                z_vs_knn=float(z),
                n_ref=n_ref,
                n_test=n_test,
                n_missing=int(count.sum()),
                k=tuned.get(m, {}).get("k"),
                h=tuned.get(m, {}).get("h"),
                beta=tuned.get(m, {}).get("beta"),
                knn_full_rows=n_full if m == "knn" else None,
            )
        )
    images = pd.DataFrame({f"sse_{m}": sse[m] for m in outs})
    images.insert(0, "n_missing", count)
    images.insert(0, "image", np.arange(n_test))
    images.insert(0, "seed", seed)
    images.insert(0, "pattern", pattern)
    print(f"{pattern} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return rows, images


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ref", type=int, default=60000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--small", action="store_true", help="2,000 refs, 100 tests, 2 seeds"
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "localbook" / "data"))
    args = ap.parse_args(argv)
    if args.small:
        args.n_ref, args.n_test, args.seeds = 2000, 100, 2
    tasks = [
        (p, s, args.n_ref, args.n_test) for p in PATTERNS for s in range(args.seeds)
    ]
    start = time.time()
    if args.jobs > 1:
        with Pool(args.jobs) as pool:
            results = pool.map(run_one, tasks, chunksize=1)
    else:
        results = [run_one(t) for t in tasks]
    runs = pd.DataFrame([r for rows, _ in results for r in rows])
    images = pd.concat([im for _, im in results], ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "imputation_reproduction.csv", index=False, float_format="%.6g")
    images.to_csv(out / "imputation_images.csv", index=False, float_format="%.6g")

    def git(*a):
        done = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    provenance = {
        "command": " ".join(["python reproductions/imputation.py", *argv]).strip(),
        "commit": git("rev-parse", "HEAD"),
        "library_changed_since_commit": bool(
            git("status", "--porcelain", "--", "localbook/*.py", "localbook/_c")
        ),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": round((time.time() - start) / 60, 1),
        "machine": f"{platform.machine()}, {args.jobs} processes, one torch thread each",
        "torch": torch.__version__,
        "protocol": {
            "references": f"{args.n_ref} Fashion-MNIST training images, masked",
            "queries": f"{args.n_test} test images drawn with seed 0, masked",
            "patterns": PATTERNS,
            "seeds": args.seeds,
            "masks": "test masks seed s, reference masks seed 100 + s",
            "dtype": "float32",
            "knn": f"KNNImputer's rule, k in {list(KS)} by hold-out on the references",
            "local_mean": "LocalMeanImputer defaults; block pattern: holdout_block=12",
            "local_mean_mcar_tuning": "block pattern only: the default (MCAR) hold-out",
            "mean": "each pixel's mean over the references observing it",
            "score": "RMSE on the missing test pixels; z: paired, per test image",
        },
    }
    (out / "imputation_reproduction.json").write_text(
        json.dumps(provenance, indent=1) + "\n"
    )
    print(runs.groupby(["pattern", "method"])[["rmse", "z_vs_knn"]].mean().round(4))


if __name__ == "__main__":
    main()
