"""Shared helpers for the benchmarks: timing, peak memory, machine description, result files."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1, like the single-threaded reference libraries)")
    return p


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str) -> str:
    cpu = cpu_model()
    desc = f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__}, Python {platform.python_version()}"
    if device == "cuda":
        desc += f", GPU {torch.cuda.get_device_name(0)}"
    return desc


def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def best_time(fn, device: str = "cpu", repeat: int = 3, warmup: int = 1) -> float:
    """Best wall-clock time of ``repeat`` calls (after ``warmup`` calls), in seconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return min(times)


def peak_rss_delta(code: str) -> float:
    """Run ``code`` in a fresh Python process; return the extra peak RSS ``run`` needed, in MiB.

    The snippet must define ``setup()`` (imports, data) and ``run(state)``. After ``setup`` the
    kernel's high-water mark is reset (``/proc/self/clear_refs``), so the number is the peak
    resident memory during ``run`` minus the resident memory before it.
    """
    prog = (
        "import json\n" + code + "\n"
        "def _status(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key): return int(line.split()[1])\n"
        "state = setup()\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "before = _status('VmRSS:')\n"
        "run(state)\n"
        "print(json.dumps((_status('VmHWM:') - before) / 1024))\n"
    )
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def write_section(name: str, device: str, title: str, header: list[str], rows: list[list], notes: str = ""):
    RESULTS.mkdir(exist_ok=True)
    suffix = "-cuda" if device == "cuda" else ""
    lines = [f"## {title} ({device})", "", f"Machine: {machine(device)}. Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    if notes:
        lines += ["", notes]
    path = RESULTS / f"{name}{suffix}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path


def configure(args) -> int:
    """Apply ``--threads`` to every library in the run: torch's intra-op pool and the BLAS/OpenMP
    pools NumPy, SciPy and scikit-learn use (threadpoolctl), so both sides get the same cores."""
    n = max(1, int(args.threads))
    torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits

        configure._limits = threadpool_limits(n)  # kept alive for the whole run
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        pass
    return n


def time_interleaved(fns, device: str = "cpu", repeat: int = 5, warmup: int = 1,
                     clock: str = "wall") -> list[float]:
    """Best time of each function in ``fns``, in seconds: warm-up calls, then ``repeat`` rounds
    that call every function once in turn (so load changes hit all sides alike), keeping each
    one's minimum — the same method as :func:`best_time`. ``clock="cpu"`` measures the process's
    CPU time instead of the wall clock (immune to other processes on a shared CPU machine)."""
    tick = time.process_time if clock == "cpu" else time.perf_counter
    for _ in range(warmup):
        for f in fns:
            f()
    sync(device)
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, f in enumerate(fns):
            sync(device)
            t = tick()
            f()
            sync(device)
            best[i] = min(best[i], tick() - t)
    return best
