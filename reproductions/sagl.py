"""The SAGL study of chapter 9 at full protocol: every method, ablation and intervention of
:func:`localbook.sagl_study.compare_graphs` on three data sets and ten seeds, written to
``localbook/data/sagl_reproduction.csv`` (one row per data set, seed and method) and
``sagl_gate.csv`` (the gate's distribution per view) and ``sagl_curves.csv`` (training
curves), with the command, commit and date in
``sagl_reproduction.json``. Chapter 9 reads them with ``lb.datasets.load_stored_run``.

    python reproductions/sagl.py             # about 20 minutes on 2 CPU cores
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

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from localbook import sagl_study as study  # noqa: E402


def run_one(task):
    """Every method on one draw: ``(rows, gate rows, curve rows)``."""
    name, seed, long_training = task
    torch.set_num_threads(1)
    views, y = study.make_study_data(name, seed)
    t0 = time.perf_counter()
    rows, gate, curve, _ = study.compare_graphs(
        views,
        y,
        study.STUDY_DATASETS[name][1],
        seed,
        name=name,
        long_training=long_training,
        curve_every=10 if seed == 0 else None,
    )
    print(f"{name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return rows, gate, curve


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(study.STUDY_DATASETS))
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
    runs = pd.DataFrame([r for rows, _, _ in results for r in rows])
    gate = pd.DataFrame([r for _, g, _ in results for r in g])
    curves = pd.DataFrame([r for _, _, c in results for r in c])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "sagl_reproduction.csv", index=False, float_format="%.6g")
    gate.to_csv(out / "sagl_gate.csv", index=False, float_format="%.6g")
    curves.to_csv(out / "sagl_curves.csv", index=False, float_format="%.6g")

    def git(*a):
        done = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    provenance = {
        "command": " ".join(["python reproductions/sagl.py", *argv]).strip(),
        "commit": git("rev-parse", "HEAD"),
        "library_changed_since_commit": bool(
            git("status", "--porcelain", "--", "localbook/*.py", "localbook/_c")
        ),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": round((time.time() - start) / 60, 1),
        "machine": f"{platform.machine()}, {args.jobs} processes, one torch thread each",
        "torch": torch.__version__,
        "seeds": args.seeds,
        "long_training_seeds": args.long_seeds,
        "datasets": {n: study.STUDY_DATASETS[n][0] for n in names},
        "fit": study.STUDY_FIT,
    }
    (out / "sagl_reproduction.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(runs.groupby(["dataset", "method"])[["ACC", "NMI", "ARI"]].mean().round(3))


if __name__ == "__main__":
    main()
