"""Benchmark: leave-one-out stability for every training sample, by the rank-one update vs refits.

``lb.stability(Phi, G, None, Q)`` gives :math:`S_{z_i}(z) = f(z,\\theta^*) - f(z,\\theta^*_{-i})` for all
``N`` samples ``i`` and a batch of queries from one Cholesky factorization of the ``N×N`` kernel.
The brute-force alternative refits the min-norm interpolator ``N`` times. ``N`` refits at full size
take hours, so this script **times a few refits and extrapolates linearly to N** (each refit costs
the same), with two refit solvers:

* NumPy/SciPy: ``θ₋ᵢ = Φ₋ᵢᵀ cho_solve(cho_factor(Φ₋ᵢΦ₋ᵢᵀ), G₋ᵢ)`` — the reference libraries, same algorithm;
* ``lb.min_norm_fit`` on ``Φ₋ᵢ`` (Cholesky of the ``(N−1)×(N−1)`` kernel).

(SciPy's min-norm ``lstsq`` with ``gelsy`` took about 30 s for *one* refit already at the quick size
on the 2-core test machine, so it is not used: it would make the brute force look even worse.)

It checks that the refits agree with the rank-one stabilities (max |difference| printed) and
measures the peak memory of one all-``i`` call and of one refit, each in a fresh subprocess (CPU:
peak resident set size growth; CUDA: ``torch.cuda.max_memory_allocated``).

    python benchmarks/bench_memorization.py [--device cpu|cuda] [--quick]

Full size: N = 2,000 samples, p = 20,000 Gaussian features (float64), 16 queries. ``--quick``:
N = 500, p = 5,000. Writes ``benchmarks/results/memorization[-cuda].md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    best_time,
    configure,
    parser,
    peak_rss_delta,
    time_interleaved,
    write_section,
)

import localbook as lb  # noqa: E402

SETUP = """
import numpy as np, torch, scipy.linalg, localbook as lb
def setup():
    g = torch.Generator().manual_seed(0)
    Phi = torch.randn({N}, {P}, generator=g, dtype=torch.float64).to("{dev}")
    G = torch.randn({N}, generator=g, dtype=torch.float64).to("{dev}")
    Q = torch.randn(16, {P}, generator=g, dtype=torch.float64).to("{dev}")
    return Phi, G, Q
"""
RUNS = {
    "all_i": "def run(a):\n    lb.stability(a[0], a[1], None, a[2])\n",
    "refit_lb": "def run(a):\n    lb.min_norm_fit(a[0][1:], a[1][1:])\n",
    "refit_scipy": (
        "def run(a):\n    P = a[0][1:].cpu().numpy(); g = a[1][1:].cpu().numpy()\n"
        "    P.T @ scipy.linalg.cho_solve(scipy.linalg.cho_factor(P @ P.T), g)\n"
    ),
}


def cpu_peak(code: str) -> float:
    """Peak resident memory (MiB) that ``run`` needs beyond what ``setup`` holds, in a fresh process.

    The kernel's high-water mark (VmHWM) is reset just before ``run`` (``/proc/self/clear_refs``),
    so import-time peaks do not hide it; falls back to :func:`_common.peak_rss_delta` elsewhere.
    """
    prog = (
        code
        + """
import os, json
def _rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
a = setup()
base = _rss()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
run(a)
print(json.dumps(_hwm() - base))
"""
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", prog], capture_output=True, text=True, check=True
        )
        return float(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.CalledProcessError, OSError):
        return peak_rss_delta(code)


def cuda_peak(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    import scipy.linalg

    args = parser(__doc__.splitlines()[0]).parse_args()
    configure(args)
    dev = args.device
    N, P = (500, 5000) if args.quick else (2000, 20000)
    gen = torch.Generator().manual_seed(0)
    Phi = torch.randn(N, P, generator=gen, dtype=torch.float64).to(dev)
    G = torch.randn(N, generator=gen, dtype=torch.float64).to(dev)
    Q = torch.randn(16, P, generator=gen, dtype=torch.float64).to(dev)

    t_all = best_time(
        lambda: lb.stability(Phi, G, None, Q), dev, repeat=3
    )  # every i at once
    S = lb.stability(Phi, G, None, Q)  # (16, N)
    theta = lb.min_norm_fit(Phi, G)

    idx = [0, N - 1]
    t_lb, t_sp, err = [], [], 0.0
    for i in idx:
        keep = torch.tensor([r for r in range(N) if r != i], device=Phi.device)
        Pk, gk = Phi[keep], G[keep]
        Pn, gn = Pk.cpu().numpy(), gk.cpu().numpy()

        def refit_scipy():
            return Pn.T @ scipy.linalg.cho_solve(scipy.linalg.cho_factor(Pn @ Pn.T), gn)

        # both refits timed the same way: interleaved, warm, best of 2
        a, b = time_interleaved(
            [lambda: lb.min_norm_fit(Pk, gk), refit_scipy], dev, repeat=2
        )
        t_lb.append(a)
        t_sp.append(b)
        th_i = lb.min_norm_fit(Pk, gk)
        err = max(err, float((Q @ (theta - th_i) - S[:, i]).abs().max()))
        ref = Q.cpu().numpy() @ (theta.cpu().numpy() - refit_scipy())
        err = max(err, float(np.abs(ref - S[:, i].cpu().numpy()).max()))
    scale = float(S.abs().max())
    assert err < 1e-8 * max(1.0, scale), (
        f"rank-one stabilities disagree with refits: {err:.2e}"
    )

    if dev == "cuda":
        mem_all = cuda_peak(lambda: lb.stability(Phi, G, None, Q))
        mem_lb = cuda_peak(lambda: lb.min_norm_fit(Phi[1:], G[1:]))
        mem_sp = cpu_peak(SETUP.format(N=N, P=P, dev="cpu") + RUNS["refit_scipy"])
        unit_gpu, unit_cpu = (
            "MiB (CUDA peak allocated)",
            "MiB (peak RSS above the data)",
        )
    else:
        mem_all, mem_lb, mem_sp = (
            cpu_peak(SETUP.format(N=N, P=P, dev="cpu") + RUNS[k])
            for k in ["all_i", "refit_lb", "refit_scipy"]
        )
        unit_gpu = unit_cpu = "MiB (peak RSS above the data)"

    per_lb, per_sp = min(t_lb), min(t_sp)
    est_lb, est_sp = N * per_lb, N * per_sp
    rows = [
        [
            f"localbook `stability(Phi, G, None, Q)`, all {N:,} i, 16 queries ({dev})",
            f"{t_all:.2f}",
            "measured",
            f"{mem_all:.1f} {unit_gpu}",
            "1×",
        ],
        [
            f"{N:,} refits with `lb.min_norm_fit` ({dev})",
            f"{est_lb:,.0f}",
            f"extrapolated: {N:,} × {per_lb:.2f} s (best of {len(t_lb)} timed refits)",
            f"{mem_lb:.1f} {unit_gpu} per refit",
            f"{est_lb / t_all:,.0f}×",
        ],
        [
            f"{N:,} refits with NumPy/SciPy (kernel + `cho_solve`, cpu)",
            f"{est_sp:,.0f}",
            f"extrapolated: {N:,} × {per_sp:.2f} s (best of {len(t_sp)} timed refits)",
            f"{mem_sp:.1f} {unit_cpu} per refit",
            f"{est_sp / t_all:,.0f}×",
        ],
    ]
    notes = (
        f"Φ: N = {N:,} × p = {P:,} standard Gaussian features, float64 ({N * P * 8 / 2**20:,.0f} MiB); "
        f"G: N Gaussian targets; θ₀ = 0. The brute-force rows are **extrapolated** from "
        f"{len(t_lb)} (localbook) and {len(t_sp)} (SciPy) timed refits at i ∈ {idx[: len(t_lb)]}; "
        f"N refits were not run. Agreement of the rank-one stabilities with those refits: "
        f"max |difference| = {err:.1e} (largest |S| = {scale:.2f}). The last column is the time of N refits "
        f"divided by the time of the all-i call."
        + (" Quick size (`--quick`)." if args.quick else "")
    )
    write_section(
        "memorization",
        dev,
        "Leave-one-out stability for all i (`stability`) vs N refits",
        ["method", "time (s)", "how", "peak memory", "ratio to localbook"],
        rows,
        notes,
    )


if __name__ == "__main__":
    main()
