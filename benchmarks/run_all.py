"""Run every benchmark (``bench_*.py``) in one go and assemble ``benchmarks/RESULTS.md``.

usage: python benchmarks/run_all.py [--device cpu|cuda] [--quick] [--threads T] [--only NAME ...]
       python benchmarks/run_all.py --assemble      (only rebuild RESULTS.md from results/*.md)
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def assemble():
    parts = sorted((HERE / "results").glob("*.md"))
    head = [
        "# Benchmark results",
        "",
        "Each section below was written by one run of the named script (`python benchmarks/bench_<name>.py`,",
        "or all of them with `make bench`), timing localbook against the reference library on the same",
        "machine in the same run; speed-ups are ratios of the best of several timings. Sections marked",
        "`(cuda)` come from a run on a GPU machine (an NVIDIA H200 lent for a few minutes) and compare",
        "with the CPU reference where one exists; `make bench` reruns the CPU sections only",
        "(`python benchmarks/run_all.py --device cuda` the GPU ones).",
        "",
        "The targets set in the issues, and where each section stands against them, are stated in the",
        "sections themselves; every number below was printed by the run that wrote its section.",
        "",
        "The *exp roofline* of a kernel sum is its kernel evaluations per second over the throughput",
        "of `torch.exp` on float64 values in cache-sized tiles, measured in the same run: a sum that",
        "called `torch.exp` once per pair, in its own pass, could not exceed 100 %. The compiled loop",
        "(`localbook/_c/kernel_sums.c`) can: its own 2^y (on AVX-512 a 16-entry table and a degree-6",
        "polynomial, 12 instructions per 8 values) costs less per value than `torch.exp`, so distances,",
        "exponential and sums in one pass take less time than the exponentials alone in PyTorch.",
        "",
    ]
    body = [p.read_text().strip() + "\n" for p in parts]
    (HERE / "RESULTS.md").write_text("\n".join(head) + "\n" + "\n".join(body))
    print(f"wrote {HERE / 'RESULTS.md'} from {len(parts)} section(s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--threads", type=int, default=1, help="CPU threads for both sides (passed on)"
    )
    ap.add_argument("--assemble", action="store_true")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    if not a.assemble:
        failed = []
        for script in sorted(HERE.glob("bench_*.py")):
            name = script.stem.removeprefix("bench_")
            if a.only and name not in a.only:
                continue
            cmd = [sys.executable, str(script), "--device", a.device]
            cmd += ["--threads", str(a.threads)] + (["--quick"] if a.quick else [])
            print(f"=== {script.name} ({a.device})", flush=True)
            t = time.time()
            if subprocess.run(cmd).returncode != 0:
                failed.append(script.name)
            print(f"=== {script.name}: {time.time() - t:.0f} s", flush=True)
        if failed:
            print("FAILED:", ", ".join(failed))
    assemble()


if __name__ == "__main__":
    main()
