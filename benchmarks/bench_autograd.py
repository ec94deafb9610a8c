"""Forward + backward in bounded memory: localbook vs dense PyTorch autograd vs KeOps.

* Nadaraya–Watson with the Gaussian kernel, float32, m = 2,000 queries, n = 20,000 and
  200,000 data points in d = 2 (and n = 20,000 in d = 16): the mean, then the gradient of
  ``(mean · u).sum()`` (``u`` a fixed random vector) with respect to ``y`` and the queries.
  (a) ``lb.nadaraya_watson`` (``local_sums._LocalAverage``: the backward recomputes the
  weights chunk by chunk); (b) the same maths densely in PyTorch (``softmax(-‖q − x‖²/2h²) @ y``
  on the full ``m × n`` matrix, autograd keeps it), skipped where its memory, extrapolated
  from the smaller size, would exceed 8 GiB; (c) KeOps ``LazyTensor`` (``sumsoftmaxweight``
  reduction, its own symbolic backward). KeOps is optional (``benchmarks/requirements.txt``):
  without it, its column says so.
* Causal sparsemax attention, forward + backward, ``q, k, v (1, T, 16)`` at T = 4,000 and
  16,000: ``lb.local_mean_attention`` (``attention._RecomputedAttention``: chunks recomputed
  in the backward) vs the same call with ``return_weights=True`` (the T × T weights kept in the
  autograd graph, as plain autograd does).

Each method and size runs in its own fresh process (``--worker``): a small warm-up of the same
formula (library initialisation, KeOps compilation or its cached module), then the resident-set
high-water mark is reset (``/proc/self/clear_refs``) and one full forward + backward gives the
peak memory over the resident set before it; then the median of several timed runs. The
gradients of every method are compared with localbook's (max |difference| / max |reference|).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import configure, engine_line, parser, write_section  # noqa: E402

M = 2_000
BUDGET_GIB = 8.0  # the dense side is not tried where it would need more than this


def _status(key: str) -> float:
    """A ``/proc/self/status`` field in MiB."""
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


# --------------------------------------------------------------------------- workers


def _nw_data(n: int, d: int, m: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g)
    y = torch.sin(6.0 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)
    q = torch.rand(m, d, generator=g)
    u = torch.randn(m, generator=g)
    return x, y, q, u


def _nw_method(method: str, h: float):
    """``f(q, x, y) -> mean (m,)`` for one method."""
    if method == "localbook":
        import localbook as lb

        return lambda q, x, y: lb.nadaraya_watson(q, x, y, h)
    if method == "dense":

        def dense(q, x, y):
            sq = (q * q).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2.0 * q @ x.T
            return torch.softmax(sq * (-0.5 / h**2), dim=1) @ y

        return dense
    if method == "keops":
        import pykeops
        from pykeops.torch import LazyTensor

        pykeops.set_verbose(False)

        def keops(q, x, y):
            sq = ((LazyTensor(q[:, None, :]) - LazyTensor(x[None, :, :])) ** 2).sum(-1)
            w = LazyTensor(y[None, :, None])
            return (sq * (-0.5 / h**2)).sumsoftmaxweight(w, axis=1)[:, 0]

        return keops
    raise ValueError(method)


def _attn_method(method: str):
    import localbook as lb

    keep = method == "dense"

    def f(q, k, v):
        out = lb.local_mean_attention(
            q, k, v, causal=True, weights="sparsemax", return_weights=keep
        )
        return out[0] if keep else out

    return f


def worker(spec: dict) -> dict:
    """One method at one size in this (fresh) process: memory, gradients, times."""
    if spec["kind"] == "nw":
        n, d, m, h = spec["n"], spec["d"], spec["m"], spec["h"]
        f = _nw_method(spec["method"], h)
        x, y, q, u = _nw_data(n, d, m)

        def run(m_rows=m):
            yy, qq = y.clone().requires_grad_(), q[:m_rows].clone().requires_grad_()
            mean = f(qq, x, yy)
            (mean * u[:m_rows]).sum().backward()
            return {"mean": mean.detach(), "dy": yy.grad, "dq": qq.grad}

        warm = lambda: run(16)  # noqa: E731 - the same formula on 16 queries
    else:
        T, dh = spec["T"], 16
        f = _attn_method(spec["method"])
        g = torch.Generator().manual_seed(0)
        q, k, v, u = (torch.randn(1, T, dh, generator=g) for _ in range(4))

        def run(t=T):
            a, b, c = (z[:, :t].clone().requires_grad_() for z in (q, k, v))
            out = f(a, b, c)
            (out * u[:, :t]).sum().backward()
            return {"out": out.detach(), "dq": a.grad, "dk": b.grad, "dv": c.grad}

        warm = lambda: run(256)  # noqa: E731
    t0 = time.perf_counter()
    warm()
    t_warm = time.perf_counter() - t0
    open("/proc/self/clear_refs", "w").write("5")
    before = _status("VmRSS:")
    t0, c0 = time.perf_counter(), time.process_time()
    res = run()
    times, cpu = [time.perf_counter() - t0], [time.process_time() - c0]
    peak = _status("VmHWM:") - before
    torch.save(res, spec["out"])
    del res
    for _ in range(spec["repeat"] - 1):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"peak_mib": peak, "times": times, "cpu": cpu, "warmup_s": t_warm}


# --------------------------------------------------------------------------- driver


def spawn(spec: dict, threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--threads", str(threads), "--worker"]
    p = subprocess.run(
        cmd + [json.dumps(spec)], capture_output=True, text=True, env=env
    )
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": " / ".join(tail)[-300:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def rel_diff(a: dict, b: dict, keys) -> dict:
    return {
        k: float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30))
        for k in keys
    }


def mem_available_gib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def load_avg() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def keops_status() -> str:
    try:
        import pykeops

        return f"pykeops {pykeops.__version__}"
    except Exception as e:  # ImportError, or a failing build set-up
        return f"unavailable ({type(e).__name__}: {e})"


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=HERE,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "localbook"],
            capture_output=True,
            text=True,
            cwd=HERE.parent,
        ).stdout
        changed = ", ".join(line[3:] for line in dirty.splitlines() if line.strip())
        return head + (
            f" (uncommitted changes in {changed})" if dirty else " (localbook/ clean)"
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt_t(r, key="times") -> str:
    t = r[key]
    return f"{statistics.median(t):.2f}" + (f" ({min(t):.2f})" if len(t) > 1 else "")


def ratio(r, base, key) -> str:
    return f"{statistics.median(r[key]) / statistics.median(base[key]):.2f}"


def main():
    p = parser(__doc__)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # one method, one size
    args = p.parse_args()
    threads = configure(args)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.device != "cpu":
        sys.exit(
            "bench_autograd measures CPU resident memory: run it with --device cpu"
        )
    start, load0 = time.time(), load_avg()
    keops = keops_status()
    have_keops = keops.startswith("pykeops")
    quick = args.quick
    sizes = [2_000, 20_000] if quick else [20_000, 200_000]
    m = 500 if quick else M
    nw_cases = [(n, 2, 0.05) for n in sizes] + [(sizes[0], 16, 0.3)]
    T_list = [1_000, 2_000] if quick else [4_000, 16_000]
    tmp = Path(tempfile.mkdtemp(prefix="bench_autograd_"))

    def measure(case, method, spec, results, grads):
        """One method at one size in a fresh process: its timings into ``results``, its
        gradients into ``grads``; None (and a skip) when it failed."""
        r = spawn(spec, threads)
        print(case, method, r, flush=True)
        if "error" in r:
            results[method] = {"skip": f"failed: {r['error']}"}
            return None
        results[method] = r
        grads[method] = torch.load(spec["out"])
        return r

    rows, notes_extra = [], []
    dense_bytes_per_pair = {}
    worst = 0.0
    for n, d, h in nw_cases:
        case = f"NW fwd+bwd, n = {n:,}, m = {m:,}, d = {d}"
        repeat = 3 if n <= sizes[0] else 1
        results, grads = {}, {}
        for method in ["localbook", "dense", "keops"]:
            if method == "keops" and not have_keops:
                results[method] = {"skip": f"KeOps {keops}"}
                continue
            if method == "dense":
                est = dense_bytes_per_pair.get(d)
                need = None if est is None else est * n * m / 2**30
                avail = mem_available_gib()
                if need is not None and (need > BUDGET_GIB or need > 0.7 * avail):
                    results[method] = {
                        "skip": f"skipped: needs ≈ {need:.1f} GiB (extrapolated from "
                        f"the smaller n; limit {BUDGET_GIB:g} GiB, {avail:.0f} GiB available)"
                    }
                    continue
            out = tmp / f"{method}-{n}-{d}.pt"
            spec = dict(kind="nw", method=method, n=n, d=d, m=m, h=h, repeat=repeat)
            r = measure(case, method, dict(spec, out=str(out)), results, grads)
            if r is not None and method == "dense":
                dense_bytes_per_pair[d] = r["peak_mib"] * 2**20 / (n * m)
        rows += table_rows(case, results, grads, ["mean", "dy", "dq"])
        for meth, g in grads.items():
            if meth != "localbook" and "localbook" in grads:
                worst = max(
                    worst, *rel_diff(grads["localbook"], g, ["dy", "dq"]).values()
                )
        if "keops" in results and "warmup_s" in results["keops"]:
            notes_extra.append(
                f"n = {n:,}, d = {d}: {results['keops']['warmup_s']:.1f} s"
            )
    for T in T_list:
        case = f"causal sparsemax attention fwd+bwd, 1 × T = {T:,} × 16"
        results, grads = {}, {}
        for method in ["localbook", "dense"]:
            out = tmp / f"attn-{method}-{T}.pt"
            repeat = 3 if T <= T_list[0] else 1
            spec = dict(kind="attn", method=method, T=T, repeat=repeat, out=str(out))
            measure(case, method, spec, results, grads)
        results["keops"] = {"skip": "—"}
        rows += table_rows(case, results, grads, ["out", "dq", "dk", "dv"])
        if len(grads) == 2:
            worst = max(
                worst,
                *rel_diff(
                    grads["localbook"], grads["dense"], ["dq", "dk", "dv"]
                ).values(),
            )
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    assert worst < 1e-3, f"gradients disagree: max relative difference {worst:.2e}"
    minutes = (time.time() - start) / 60
    notes = (
        f"float32, {threads} threads for every method (torch threads, OMP_NUM_THREADS for "
        "KeOps' CPU loops). Times in seconds: wall clock and CPU time of the process (all its "
        "threads; less sensitive than the wall clock to other jobs on a shared machine), median "
        "of 3 runs with the best in brackets at the smaller size (n = 20,000; T = 4,000), one "
        "run at the larger (n = 200,000; T = 16,000); the first run also measures memory and "
        "follows a warm-up of the same formula on 16 queries (attention: T = 256). Peak: "
        "resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs after the "
        "warm-up) above the resident set before the call, in MiB, each method and size in a "
        "fresh process. Ratios: median wall time, median CPU time and peak over localbook's. "
        "Agreement: max |difference| / max |localbook's| of the mean and of the "
        "gradients (dy, dq; attention: out, dq, dk, dv), float32 against float32. The loss is "
        "(mean · u).sum() with a fixed Gaussian u. NW data: x, q uniform on [0, 1]^d, "
        "y = sin(6 x₁) + 0.1 noise; Gaussian kernel, h = 0.05 (d = 2) and 0.3 (d = 16). "
        "Dense: `softmax(-(‖q‖² + ‖x‖² − 2 q·x)/2h²) @ y` on the whole m × n matrix; skipped "
        f"where its peak, extrapolated from the smaller n, exceeds {BUDGET_GIB:g} GiB. "
        "KeOps: `LazyTensor` squared distances and the `sumsoftmaxweight` reduction (a "
        "max-shifted softmax-weighted sum, so no overflow), gradients by KeOps' own symbolic "
        "backward; "
        + keops
        + ". Attention: `lb.local_mean_attention(q, k, v, causal=True, "
        "weights='sparsemax')` (localbook: chunks recomputed in the backward) vs the same call "
        "with `return_weights=True` (dense: the T × T weights stay in the graph).\n\n"
        + (
            "KeOps' warm-up call (16 queries; it compiles each new formula with the system "
            "C++ compiler on first use and loads it from its cache after): "
            + "; ".join(notes_extra)
            + ".\n\n"
            if notes_extra
            else ""
        )
        + f"{engine_line()}.\n\nCommand: `python benchmarks/bench_autograd.py --threads "
        f"{threads}{' --quick' if quick else ''}` at commit {git_commit()}; "
        f"{minutes:.1f} minutes. Machine load (1, 5, 15-minute load averages; the 2 cores are "
        f"shared with other jobs): {load0} at the start, {load_avg()} at the end. Largest "
        f"gradient difference from localbook over all rows: {worst:.1e}."
    )
    write_section(
        "autograd",
        "cpu",
        "Forward + backward in bounded memory: localbook vs dense autograd vs KeOps",
        [
            "case",
            "method",
            "wall (s)",
            "CPU (s)",
            "peak MiB",
            "wall / localbook",
            "CPU / localbook",
            "peak / localbook",
            "rel. diff. vs localbook",
        ],
        rows,
        notes,
    )


def table_rows(case: str, results: dict, grads: dict, keys) -> list:
    base = results.get("localbook", {})
    rows = []
    for method, label in [
        ("localbook", "localbook"),
        ("dense", "dense PyTorch autograd"),
        ("keops", "KeOps LazyTensor"),
    ]:
        r = results.get(method)
        if r is None or r.get("skip") == "—":
            continue
        if "skip" in r:
            rows.append([case, label, "—", "—", "—", "—", "—", "—", r["skip"]])
            continue
        if method == "localbook" or "times" not in base:
            ratio_t = ratio_c = ratio_m = "1" if method == "localbook" else "—"
            agree = "—"
        else:
            ratio_t, ratio_c = ratio(r, base, "times"), ratio(r, base, "cpu")
            ratio_m = f"{r['peak_mib'] / max(base['peak_mib'], 1.0):.2f}"
            dif = rel_diff(grads["localbook"], grads[method], keys)
            agree = " / ".join(f"{dif[k]:.1e}" for k in keys)
        label = (
            label
            if method != "dense" or "attention" not in case
            else ("localbook, return_weights=True (weights kept)")
        )
        rows.append(
            [
                case,
                label,
                fmt_t(r),
                fmt_t(r, "cpu"),
                f"{r['peak_mib']:.0f}",
                ratio_t,
                ratio_c,
                ratio_m,
                agree,
            ]
        )
    return rows


if __name__ == "__main__":
    main()
