"""Shared helpers for the benchmarks: timing, peak memory, machine description, result files."""

from __future__ import annotations

import argparse
import contextlib
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
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1, like the single-threaded reference libraries)",
    )
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
    out = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def write_section(
    name: str,
    device: str,
    title: str,
    header: list[str],
    rows: list[list],
    notes: str = "",
):
    lines = [
        f"## {title} ({device})",
        "",
        f"Machine: {machine(device)}. Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    if notes:
        lines += ["", notes]
    return write_text_section(name, device, "\n".join(lines) + "\n")


def write_text_section(name: str, device: str, text: str) -> Path:
    """Write one script's section to ``results/<name>[-cuda].md`` and rebuild ``RESULTS.md`` from
    all sections (``run_all.assemble``), so one script's run updates its part of the file."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}{'-cuda' if device == 'cuda' else ''}.md"
    path.write_text(text.rstrip("\n") + "\n")
    print(text)
    from run_all import assemble

    assemble()
    return path


def exp_workload(n_values: float = 4e8, device: str = "cpu"):
    """``(run, count)``: a function applying ``torch.exp`` to ``count`` float64 values.

    ``torch.exp(src, out=dst)`` over a reused cache-sized tile (``localbook.chunks.CPU_TILE_BYTES``
    per thread on the CPU, 256 MiB on a GPU) of values in [−20, 0], repeated until about
    ``n_values`` are done. A kernel sum over ``m × n`` pairs taking ``t`` seconds runs at the
    fraction ``m·n / t`` of ``count / (time of run)`` of the exp roofline: no implementation
    that calls exp once per pair, in a separate pass, can exceed 1.
    """
    from localbook.chunks import CPU_TILE_BYTES, MEMORY_BUDGET

    size = (
        CPU_TILE_BYTES * torch.get_num_threads() if device == "cpu" else MEMORY_BUDGET
    ) // 8
    g = torch.Generator().manual_seed(0)
    src = (-20.0 * torch.rand(size, generator=g, dtype=torch.float64)).to(device)
    dst = torch.empty_like(src)
    reps = max(1, int(n_values // size))

    def run():
        for _ in range(reps):
            torch.exp(src, out=dst)

    return run, reps * size


def exp_throughput(
    n_values: float = 4e8, device: str = "cpu", repeat: int = 3
) -> float:
    """The exp roofline: ``torch.exp`` evaluations per second on float64 values, measured now
    (:func:`exp_workload`; best of ``repeat`` after a warm-up, :func:`best_time`)."""
    run, count = exp_workload(n_values, device)
    return count / best_time(run, device, repeat=repeat)


def roofline_interleaved(fn, pairs: float, device: str = "cpu", repeat: int = 7):
    """``(time of fn, exp rate, fraction)``: ``fn`` and the exp workload timed in turn
    (:func:`time_interleaved`), so that a change of machine load hits both alike; the
    workload is sized like one call of ``fn``."""
    run, count = exp_workload(pairs, device)
    t_exp, t_fn = time_interleaved([run, fn], device, repeat=repeat)
    rate = count / t_exp
    return t_fn, rate, pairs / t_fn / rate


def roofline(pairs: float, seconds: float, exp_rate: float) -> str:
    """``pairs / seconds`` as a percentage of the exp roofline, e.g. ``'47 %'``."""
    return f"{100 * pairs / seconds / exp_rate:.0f} %"


def target_line(
    name: str, value: float, goal: float, unit: str = "×", at_most: bool = False
) -> str:
    """``'name: measured 31.2× (target ≥ 30×, met)'``; ``at_most`` for upper bounds."""
    met = value <= goal if at_most else value >= goal
    sign = "≤" if at_most else "≥"
    return f"{name}: measured {value:.2f}{unit} (target {sign} {goal:g}{unit}, {'met' if met else 'NOT met'})"


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


def time_interleaved(
    fns, device: str = "cpu", repeat: int = 5, warmup: int = 1, clock: str = "wall"
) -> list[float]:
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


@contextlib.contextmanager
def pytorch_engine():
    """Run localbook's kernel sums on the PyTorch engine (as without a C compiler)."""
    import localbook.compiled as compiled

    real = compiled.library
    compiled.library = lambda: None
    try:
        yield
    finally:
        compiled.library = real


def engine_line() -> str:
    """Which kernel-sum engine localbook uses in this run (``localbook.compiled.status``)."""
    import localbook.compiled as compiled

    return "localbook's kernel-sum engine in this run: " + compiled.status()
