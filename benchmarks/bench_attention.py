"""Benchmark localbook.attention against PyTorch's scaled_dot_product_attention (SDPA).

1. The softmax path of ``lb.local_mean_attention`` (validation + dispatch to SDPA) against SDPA
   itself, causal and not, at a few sequence lengths: best-of-k time ratio (target ≤ 1.1×), with
   the default value check (one host synchronisation per call) and with ``check_values=False``
   (none); results checked to agree.
2. The explicit local-mean path (``fused=False``: query chunks under a memory budget) at a long
   sequence: its peak memory (CPU: the process's resident-set high-water mark above the baseline,
   measured in a fresh subprocess; CUDA: ``torch.cuda.max_memory_allocated``) against the size of
   the ``T × T`` weight matrix a naive implementation would hold, and agreement with SDPA.

Usage: ``python benchmarks/bench_attention.py [--device cpu|cuda] [--quick] [--threads T]``; writes
``benchmarks/results/attention[-cuda].md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import configure, parser, time_interleaved, write_section  # noqa: E402
import localbook as lb  # noqa: E402

GiB = 2**30


def bench_speed(device, quick):
    rows = []
    sizes = (
        [(8, 8, 256, 64), (4, 8, 1024, 64)]
        if quick
        else [(8, 8, 128, 64), (8, 8, 512, 64), (4, 8, 1024, 64)]
    )
    for B, H, T, d in sizes:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(B, H, T, d, generator=g).to(device) for _ in range(3))
        for causal in (False, True):
            with torch.no_grad():
                ours = lb.local_mean_attention(q, k, v, causal=causal)
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
                repeats = (
                    (11 if quick else 31) if T <= 256 else (5 if quick else 9)
                )  # many for the noisy small sizes
                t_ours, t_fast, t_ref = time_interleaved(
                    [
                        lambda: lb.local_mean_attention(q, k, v, causal=causal),
                        lambda: lb.local_mean_attention(
                            q, k, v, causal=causal, check_values=False
                        ),
                        lambda: F.scaled_dot_product_attention(
                            q, k, v, is_causal=causal
                        ),
                    ],
                    device.type,
                    repeats,
                    warmup=2,
                )
            rows.append(
                dict(
                    shape=f"{B}×{H}×{T}×{d}",
                    causal=causal,
                    ours_ms=1e3 * t_ours,
                    fast_ms=1e3 * t_fast,
                    sdpa_ms=1e3 * t_ref,
                    ratio=t_ours / t_ref,
                    fast_ratio=t_fast / t_ref,
                )
            )
            print(
                f"softmax path {rows[-1]['shape']} causal={causal}: {t_ours * 1e3:.2f} ms "
                f"(unchecked {t_fast * 1e3:.2f}) vs SDPA {t_ref * 1e3:.2f} ms, ratios "
                f"{t_ours / t_ref:.2f} / {t_fast / t_ref:.2f}",
                flush=True,
            )
    return rows


_MEMORY_CHILD = r"""
import json, sys, torch, torch.nn.functional as F
import localbook as lb
T, d, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(int(sys.argv[4]))
dev = torch.device(device)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 1, T, d, generator=g).to(dev) for _ in range(3))
def status(key):  # bytes, from Linux's /proc/self/status
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
with torch.no_grad():
    # warm the code paths on a small problem so that library initialization is in the baseline
    lb.local_mean_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], causal=True, fused=False)
    F.scaled_dot_product_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], is_causal=True)
    if dev.type == "cuda":
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    else:  # reset the high-water mark so that the peak is this call's (not the warm-up's)
        open("/proc/self/clear_refs", "w").write("5"); base = status("VmRSS:")
    out = lb.local_mean_attention(q, k, v, causal=True, fused=False)
    if dev.type == "cuda":
        torch.cuda.synchronize(); peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = status("VmHWM:") - base
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    err = float((out - ref).abs().max())
print(json.dumps({"peak_bytes": peak, "base_bytes": base, "max_abs_diff": err}))
"""


def bench_memory(device, quick):
    T, d = (8192, 64) if quick else (16384, 64)
    env = dict(
        os.environ,
        PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEMORY_CHILD,
            str(T),
            str(d),
            device.type,
            str(torch.get_num_threads()),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    r = json.loads(res.stdout.strip().splitlines()[-1])
    naive = T * T * 4  # the float32 T × T weight matrix alone
    assert r["max_abs_diff"] < 1e-5, r
    print(
        f"explicit path T={T}: peak {r['peak_bytes'] / GiB:.3f} GiB above baseline "
        f"(naive T×T weights alone: {naive / GiB:.2f} GiB); max |diff| vs SDPA {r['max_abs_diff']:.1e}",
        flush=True,
    )
    return dict(T=T, d=d, peak=r["peak_bytes"], naive=naive, diff=r["max_abs_diff"])


def main(argv=None):
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    configure(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    torch.set_default_dtype(torch.float32)
    speed = bench_speed(device, args.quick)
    mem = bench_memory(device, args.quick)
    worst = max(r["ratio"] for r in speed)
    worst_fast = max(r["fast_ratio"] for r in speed)
    mem_kind = (
        "torch.cuda.max_memory_allocated"
        if device.type == "cuda"
        else "resident-set high-water mark, reset before the call"
    )
    rows = [
        [
            r["shape"],
            r["causal"],
            f"{r['ours_ms']:.2f}",
            f"{r['fast_ms']:.2f}",
            f"{r['sdpa_ms']:.2f}",
            f"{r['ratio']:.2f}",
            f"{r['fast_ratio']:.2f}",
        ]
        for r in speed
    ]
    write_section(
        "attention",
        device.type,
        "attention: `local_mean_attention` vs SDPA",
        [
            "shape B×H×T×d",
            "causal",
            "localbook (ms)",
            "localbook, check_values=False (ms)",
            "SDPA (ms)",
            "ratio",
            "ratio unchecked",
        ],
        rows,
        f"float32, torch threads: {args.threads}{'; quick sizes' if args.quick else ''}. "
        "`lb.local_mean_attention` (softmax path: checks on metadata, one NaN/inf reduction over "
        "q, k, v — one host synchronisation — then PyTorch's fused SDPA; `check_values=False` "
        "skips the reduction) vs `torch.nn.functional.scaled_dot_product_attention`; best of "
        "interleaved repeats (`_common.time_interleaved`); outputs agree to 1e-5. "
        f"Worst ratio {worst:.2f} with the value check, {worst_fast:.2f} without "
        "(target ≤ 1.1).\n\n"
        f"Explicit local-mean path (`fused=False`, causal, chunked over queries), T = {mem['T']:,}, "
        f"d = {mem['d']}: peak memory {mem['peak'] / GiB:.3f} GiB above the inputs ({mem_kind}); the "
        f"T×T float32 weight matrix a naive implementation holds is {mem['naive'] / GiB:.2f} GiB by "
        f"itself. Max |difference| from SDPA {mem['diff']:.1e}.",
    )


if __name__ == "__main__":
    main()
