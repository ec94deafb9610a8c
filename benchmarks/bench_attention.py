"""Benchmark localbook.attention against PyTorch's scaled_dot_product_attention (SDPA).

1. The softmax path of ``lb.local_mean_attention`` (validation + dispatch to SDPA) against SDPA
   itself, causal and not, at a few sequence lengths: median time ratio (target ≤ 1.5×), results
   checked to agree.
2. The explicit local-mean path (``fused=False``: query chunks under a memory budget) at a long
   sequence: its peak memory (CPU: the process's resident-set high-water mark above the baseline,
   measured in a fresh subprocess; CUDA: ``torch.cuda.max_memory_allocated``) against the size of
   the ``T × T`` weight matrix a naive implementation would hold, and agreement with SDPA.

Usage: ``python benchmarks/bench_attention.py [--device cpu|cuda] [--quick]``; writes
``benchmarks/results/attention[-cuda].md``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model  # noqa: E402
import localbook as lb  # noqa: E402

GiB = 2**30


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_pair(f, g, device, repeats):
    """Median seconds of ``f`` and of ``g``, interleaved so that load changes hit both equally."""
    for _ in range(2):  # warm-up
        f(), g()
    tf, tg = [], []
    for _ in range(repeats):
        for fn, acc in ((f, tf), (g, tg)):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            acc.append(time.perf_counter() - t0)
    return statistics.median(tf), statistics.median(tg)


def bench_speed(device, quick):
    rows = []
    sizes = [(8, 8, 256, 64), (4, 8, 1024, 64)] if quick else [(8, 8, 128, 64), (8, 8, 512, 64), (4, 8, 1024, 64)]
    for B, H, T, d in sizes:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(B, H, T, d, generator=g).to(device) for _ in range(3))
        for causal in (False, True):
            with torch.no_grad():
                ours = lb.local_mean_attention(q, k, v, causal=causal)
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
                repeats = (11 if quick else 31) if T <= 256 else (5 if quick else 9)  # many for the noisy small sizes
                t_ours, t_ref = time_pair(lambda: lb.local_mean_attention(q, k, v, causal=causal),
                                          lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                          device, repeats)
            rows.append(dict(shape=f"{B}×{H}×{T}×{d}", causal=causal, ours_ms=1e3 * t_ours, sdpa_ms=1e3 * t_ref,
                             ratio=t_ours / t_ref))
            print(f"softmax path {rows[-1]['shape']} causal={causal}: {t_ours * 1e3:.2f} ms vs SDPA "
                  f"{t_ref * 1e3:.2f} ms, ratio {t_ours / t_ref:.2f}", flush=True)
    return rows


_MEMORY_CHILD = r"""
import json, resource, sys, torch, torch.nn.functional as F
import localbook as lb
T, d, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(int(sys.argv[4]))
dev = torch.device(device)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 1, T, d, generator=g).to(dev) for _ in range(3))
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
with torch.no_grad():
    # warm the code paths on a small problem so that library initialization is in the baseline
    lb.local_mean_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], causal=True, fused=False)
    F.scaled_dot_product_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], is_causal=True)
    if dev.type == "cuda":
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    else:
        base = rss()
    out = lb.local_mean_attention(q, k, v, causal=True, fused=False)
    if dev.type == "cuda":
        torch.cuda.synchronize(); peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = rss() - base
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    err = float((out - ref).abs().max())
print(json.dumps({"peak_bytes": peak, "base_bytes": base, "max_abs_diff": err}))
"""


def bench_memory(device, quick):
    T, d = (8192, 64) if quick else (16384, 64)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(T), str(d), device.type, str(torch.get_num_threads())],
                         capture_output=True, text=True, env=env, check=True)
    r = json.loads(res.stdout.strip().splitlines()[-1])
    naive = T * T * 4  # the float32 T × T weight matrix alone
    assert r["max_abs_diff"] < 1e-5, r
    print(f"explicit path T={T}: peak {r['peak_bytes'] / GiB:.3f} GiB above baseline "
          f"(naive T×T weights alone: {naive / GiB:.2f} GiB); max |diff| vs SDPA {r['max_abs_diff']:.1e}", flush=True)
    return dict(T=T, d=d, peak=r["peak_bytes"], naive=naive, diff=r["max_abs_diff"])


def machine(device):
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    cpu = cpu_model()
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default 1: stable timings on a shared machine)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    torch.set_default_dtype(torch.float32)
    speed = bench_speed(device, args.quick)
    mem = bench_memory(device, args.quick)

    suffix = "-cuda" if device.type == "cuda" else ""
    out = HERE / "results" / f"attention{suffix}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    worst = max(r["ratio"] for r in speed)
    mem_kind = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "resident-set high-water mark (getrusage)"
    lines = [
        f"## attention ({device.type}{', quick' if args.quick else ''})",
        "",
        f"Machine: {machine(device)}. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. float32.",
        "",
        "`lb.local_mean_attention` (softmax path: validation, then PyTorch's fused SDPA) vs "
        "`torch.nn.functional.scaled_dot_product_attention`; median of interleaved repeats; outputs agree to 1e-5.",
        "",
        "| shape B×H×T×d | causal | localbook (ms) | SDPA (ms) | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {r['shape']} | {r['causal']} | {r['ours_ms']:.2f} | {r['sdpa_ms']:.2f} | {r['ratio']:.2f} |" for r in speed]
    lines += [
        "",
        f"Worst ratio {worst:.2f} (target ≤ 1.5).",
        "",
        f"Explicit local-mean path (`fused=False`, causal, chunked over queries), T = {mem['T']:,}, d = {mem['d']}: "
        f"peak memory {mem['peak'] / GiB:.3f} GiB above the inputs ({mem_kind}); the T×T float32 weight matrix "
        f"a naive implementation holds is {mem['naive'] / GiB:.2f} GiB by itself. Max |difference| from SDPA "
        f"{mem['diff']:.1e}.",
        "",
    ]
    out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
