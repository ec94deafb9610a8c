r"""Compiled kernel sums: distance, profile and weighted sums fused in one pass (CPU, float64).

The PyTorch engine (:mod:`localbook.kernels`) makes four passes over each tile of pairs
(distance product, clamp, ``exp``, weighted sums); here one C loop over L1-sized blocks does
them all, with a ``2^y`` that vectorizes (``_c/kernel_sums.c`` states its error bound: at
most 2 ulp; the Gaussian is evaluated in base 2 from coordinates scaled by
``GAUSS_SCALE``). The source ships with the package and is built on first use with the
system's C compiler (``$CC`` or ``cc``; 3–4 s on a 2-core machine) into a cache directory
(``$LOCALBOOK_CACHE``, else ``$XDG_CACHE_HOME/localbook`` or ``~/.cache/localbook``), keyed by
the source, the compiler and the CPU. One process builds at a time (a file lock); a checksum
written after each complete build is checked before a cached library is loaded, and a damaged
or incomplete one is rebuilt. Without a compiler, or with ``LOCALBOOK_COMPILED=0`` (or
``false``, ``no``, ``off``), :func:`library` is ``None`` and every caller uses the PyTorch
engine, which gives the same sums to rounding; a build that fails says so in one warning.

A whole local mean (Nadaraya–Watson, a KDE, a mean-shift step) is one call of
:func:`local_means` on data prepared once by :func:`scale_points`: the queries are scaled,
summed and turned into means piece by piece on the OpenMP threads, so a call at n = m = 2,000
spends its time in the loop rather than in a dozen small PyTorch operations around it.

:func:`status` says which path is active and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import torch

__all__ = [
    "library",
    "status",
    "scale_points",
    "local_means",
    "midrange",
    "kernel_sums",
    "run_sums",
    "PROFILES",
    "MAX_DIM",
]

SOURCE = Path(__file__).with_name("_c") / "kernel_sums.c"
#: ``-ffast-math`` is left out on purpose: linked into a shared object it sets flush-to-zero
#: for the whole process. ``-fopenmp``: threads from the OpenMP runtime PyTorch has loaded
#: (``libgomp.so.1``); where that fails to build, ``-fopenmp-simd`` (the ``omp simd`` loops
#: only) and the rows are split over Python threads (ctypes releases the GIL).
FLAGS = [
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fopenmp",
    "-shared",
    "-fPIC",
]
#: The kernel profiles the C loop evaluates (others use the PyTorch engine).
PROFILES = {
    "gaussian": 0,
    "laplacian": 1,
    "uniform": 2,
    "epanechnikov": 3,
    "biweight": 4,
}

#: The most coordinates the C loops take (``MAX_DIM`` in ``_c/kernel_sums.c``).
MAX_DIM = 16

#: sqrt(log2(e) / 2): scaled by it, squared distances are the Gaussian's exponent in base 2.
GAUSS_SCALE = math.sqrt(0.5 / math.log(2.0))

_lock = threading.Lock()
_state: dict = {}

#: Work per compiled call, in pair-coordinates (pairs × (d + k + 1)): about 20-60 ms on one
#: core. A call into C holds off Python's signal handlers until it returns, so long sums run
#: as a sequence of calls of this size and Ctrl-C lands between two of them.
PIECE_WORK = 1 << 27


def _cache_dir() -> Path:
    root = os.environ.get("LOCALBOOK_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "localbook"


def _cpu_signature() -> str:
    """The CPU's feature flags (``-march=native`` builds for them), or the machine name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def compile_source(cc: str, out, extra_flags=()) -> str:
    """Compile :data:`SOURCE` into the shared object ``out``; the compiler's errors or ``''``.

    Without OpenMP (no ``libgomp``) the source is built again with ``-fopenmp-simd``."""
    error = ""
    for flags in (FLAGS, [f if f != "-fopenmp" else "-fopenmp-simd" for f in FLAGS]):
        run = subprocess.run(
            [cc, *flags, *extra_flags, str(SOURCE), "-o", str(out), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if run.returncode == 0:
            return ""
        # an empty stderr is still a failure (it was once cached as a success)
        error = run.stderr[-500:] or f"{cc} exited with status {run.returncode}"
    return error


def load(path) -> ctypes.CDLL:
    """Load a shared object built by :func:`compile_source` and declare its functions; an
    ``AttributeError`` if one is missing (the object is closed again, so that a rebuilt
    library at the same path is really loaded next time)."""
    lib = ctypes.CDLL(str(path))
    try:
        _declare(lib)
    except AttributeError:
        import _ctypes

        _ctypes.dlclose(lib._handle)
        raise
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    lib.kernel_sums.restype = None
    lib.kernel_sums.argtypes = (
        [ctypes.c_void_p] * 4
        + [ctypes.c_int64] * 4
        + [
            ctypes.c_int,
            ctypes.c_double,
        ]
    )
    lib.run_sums.restype = None
    lib.run_sums.argtypes = (
        [ctypes.c_void_p] * 4
        + [ctypes.c_int64] * 4
        + [ctypes.c_int, ctypes.c_double]
        + [ctypes.c_void_p] * 2
        + [ctypes.c_int64]
    )
    lib.lb_openmp.restype = ctypes.c_int
    lib.lb_openmp.argtypes = []
    lib.kernel_sums_threads.restype = None
    lib.kernel_sums_threads.argtypes = lib.kernel_sums.argtypes + [ctypes.c_int64]
    lib.run_sums_threads.restype = None
    lib.run_sums_threads.argtypes = lib.run_sums.argtypes + [ctypes.c_int64]
    lib.scale_points.restype = ctypes.c_int64
    lib.scale_points.argtypes = (
        [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 2
    ) + [ctypes.c_double, ctypes.c_void_p, ctypes.c_int64]
    lib.local_means.restype = None
    lib.local_means.argtypes = (
        [ctypes.c_void_p]
        + [ctypes.c_int64] * 3
        + [ctypes.c_void_p] * 2
        + [ctypes.c_double]
    )
    lib.local_means.argtypes += [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4
    lib.local_means.argtypes += [ctypes.c_int, ctypes.c_double, ctypes.c_double]
    lib.local_means_threads.restype = None
    lib.local_means_threads.argtypes = lib.local_means.argtypes + [ctypes.c_int64]
    lib.local_means.argtypes += [ctypes.c_void_p]
    lib.local_means_threads.argtypes += [ctypes.c_void_p]
    lib.midrange.restype = None
    lib.midrange.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p]
    lib.exp2_array.restype = None
    lib.exp2_array.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64, ctypes.c_double]


_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")


def _disabled_by_environment() -> Optional[str]:
    """The value of ``LOCALBOOK_COMPILED`` when it turns the compiled engine off (``0``,
    ``false``, ``no``, ``off``, any case), else ``None``; an unknown value warns and keeps
    the engine on."""
    value = os.environ.get("LOCALBOOK_COMPILED", "1")
    word = value.strip().lower()
    if word in _OFF:
        return value
    if word not in _ON:
        warnings.warn(
            f"LOCALBOOK_COMPILED={value!r} is not understood (use 0/false/no/off to turn "
            "the compiled engine off, 1/true/yes/on to keep it): keeping it on",
            stacklevel=3,
        )
    return None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached_ok(so: Path, stamp: Path) -> bool:
    """A cached library is used only with the checksum written after its complete build (an
    interrupted build or a full disk leaves a file that loads and then dies with SIGBUS)."""
    try:
        return so.stat().st_size > 0 and stamp.read_text().strip() == _digest(so)
    except OSError:
        return False


def _compile_into(cc: str, cache: Path, so: Path, stamp: Path) -> str:
    """Build beside the target, then rename, then write the checksum; ``''`` or the error."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        error = compile_source(cc, tmp)
        if error:
            return error
        if os.path.getsize(tmp) == 0:
            return "the compiler wrote an empty file"
        os.replace(tmp, so)
        fd, tmp_stamp = tempfile.mkstemp(suffix=".sha256", dir=cache)
        with os.fdopen(fd, "w") as f:
            f.write(_digest(so) + "\n")
        os.replace(tmp_stamp, stamp)
        return ""
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _build() -> tuple:
    """``(CDLL or None, reason)``: compile (or reuse) the shared object and load it.

    One process builds at a time (a file lock beside the library); a cached library without
    a matching checksum, or one that lacks the expected symbols, is rebuilt once."""
    off = _disabled_by_environment()
    if off is not None:
        return None, f"disabled by LOCALBOOK_COMPILED={off}"
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or platform.system() != "Linux":
        return None, "no C compiler found (or not Linux): using the PyTorch engine"
    import fcntl  # Linux only, like the compiled engine

    try:
        version = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
        src = SOURCE.read_bytes()
        key = hashlib.sha256(
            src
            + " ".join(FLAGS).encode()
            + version.encode()
            + _cpu_signature().encode()
        ).hexdigest()[:16]
        cache = _cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        so = cache / f"kernel_sums-{key}.so"
        stamp = cache / f"kernel_sums-{key}.sha256"
        with open(cache / f"kernel_sums-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second cold process waits, then reuses
            for attempt in range(2):
                fresh = not _cached_ok(so, stamp)
                if fresh:
                    error = _compile_into(cc, cache, so, stamp)
                    if error:
                        return _failed(f"compiling {SOURCE.name} failed: {error}")
                try:
                    lib = load(so)
                except (
                    OSError,
                    AttributeError,
                ) as err:  # not an ELF, or symbols missing
                    for path in (so, stamp):
                        path.unlink(missing_ok=True)
                    if fresh or attempt:
                        return _failed(f"the compiled kernels do not load: {err}")
                    continue  # a damaged cached copy: build it again
                return lib, f"compiled kernels loaded from {so}"
    except (OSError, subprocess.SubprocessError) as err:
        return _failed(f"could not build or load the compiled kernels: {err}")
    return _failed("the compiled kernels could not be built")  # pragma: no cover


def _failed(reason: str) -> tuple:
    """Fall back to the PyTorch engine, saying why once."""
    warnings.warn(
        f"{reason}; localbook uses the PyTorch engine (same results, slower)",
        RuntimeWarning,
        stacklevel=4,
    )
    return None, reason


def library() -> Optional[ctypes.CDLL]:
    """The loaded shared object, built on first call; ``None`` when unavailable."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"], _state["reason"] = _build()
    return _state["lib"]


def status() -> str:
    """Which kernel-sum engine is active, and why."""
    library()
    return _state["reason"]


def _pool(workers: int) -> ThreadPoolExecutor:
    if _state.get("workers") != workers:
        _state["pool"], _state["workers"] = ThreadPoolExecutor(workers), workers
    return _state["pool"]


def _profile(kernel) -> int:
    """The C loop's number for ``kernel``; a ``ValueError`` naming the known ones otherwise."""
    try:
        return PROFILES[kernel]
    except (KeyError, TypeError):
        raise ValueError(
            f"kernel must be one of {sorted(PROFILES)} for the compiled loop, got {kernel!r}"
        ) from None


def _check_operands(a, b, values) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.device.type != "cpu":
            raise ValueError(f"{name} must be a 2-D CPU tensor")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"a and b must have the same number of columns, got {a.shape[1]} and {b.shape[1]}"
        )
    if values is not None and (values.ndim != 2 or values.shape[0] != b.shape[0]):
        raise ValueError(
            f"values must be ({b.shape[0]}, k) like b's rows, got {tuple(values.shape)}"
        )


def _prepare(a, b, values, kernel):
    """The C loops' operands: float64 contiguous ``a (m, d)``, ``bt (d, n)``, ``vt (k, n)``,
    the number ``k`` of value columns and a zero ``(m, k + 1)`` result."""
    _check_operands(a, b, values)
    # the Gaussian in base 2: |a' - b'|^2 = u^2/2 * log2(e), so the loop's 2^(-|a' - b'|^2)
    # is exp(-u^2/2) without a multiplication per pair
    s = GAUSS_SCALE if kernel == "gaussian" else 1.0
    a = (a.to(torch.float64) * s).contiguous()
    bt = (b.to(torch.float64) * s).T.contiguous()
    if values is None:
        k, vt = 0, torch.empty(0, dtype=torch.float64)
    else:
        k, vt = values.shape[1], values.to(torch.float64).T.contiguous()
    return a, bt, vt, k, torch.zeros(a.shape[0], k + 1, dtype=torch.float64)


def _float64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64).contiguous()


def scale_points(
    t: torch.Tensor,
    center: torch.Tensor,
    h: torch.Tensor,
    scale: float,
    transpose: bool = False,
    lib: Optional[ctypes.CDLL] = None,
) -> tuple:
    """``(out, bad)``: ``out = ((t − center) / h) · scale`` as float64, ``(rows, d)`` or with
    ``transpose`` ``(d, rows)``, in one C pass over ``t`` (float32 or float64, any strides;
    the difference and quotient rounded in ``t``'s precision); ``bad`` counts the rows whose
    ``(t − center) / h`` has a squared norm that is not finite."""
    if t.dtype not in (torch.float32, torch.float64) or t.ndim != 2:
        raise ValueError(f"t must be a 2-D float32 or float64 tensor, got {t.dtype}")
    rows, d = t.shape
    c, hh = _float64(center), _float64(h)
    out = torch.empty((d, rows) if transpose else (rows, d), dtype=torch.float64)
    rs, cs = t.stride()
    bad = (lib or library()).scale_points(
        t.data_ptr(), t.dtype == torch.float32, rows, d, rs, cs,
        c.data_ptr(), hh.data_ptr(), scale, out.data_ptr(), transpose,
    )  # fmt: skip
    return out, bad


def local_means(
    xq: torch.Tensor,
    center: torch.Tensor,
    h: torch.Tensor,
    scale: float,
    bt: torch.Tensor,
    vt: Optional[torch.Tensor],
    kernel: str,
    floor: float,
    redo_below: float,
) -> tuple:
    """The dense local mean of the queries ``xq (m, d)`` (float32 or float64, any strides)
    over data already in the loop's layout (``bt (d, n)``, ``vt (k, n)`` or ``None``, from
    :func:`scale_points` with the same ``center``, ``h`` and ``scale``), in one C call: each
    piece of rows is scaled, summed and finished while in cache.

    Returns ``(sums (m, k + 1), mean (m, k), log_sum (m,), bad, n_redo)``, float64: ``bad``
    counts queries whose scaled squared norm overflowed, ``n_redo`` the rows whose total
    weight is below ``redo_below``; an empty row (total 0) has ``log_sum = -inf`` and NaN
    means.
    """
    lib = library()
    (m, d), n = xq.shape, bt.shape[1]
    if d > MAX_DIM or xq.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"xq must be float32 or float64 with d <= {MAX_DIM}")
    k = 0 if vt is None else vt.shape[0]
    sums = torch.empty(m, k + 1, dtype=torch.float64)
    mean = torch.empty(m, k, dtype=torch.float64)
    total = torch.empty(m, dtype=torch.float64)
    c, hh = _float64(center), _float64(h)
    rs, cs = xq.stride()
    f32, size = xq.dtype == torch.float32, xq.element_size()
    vp = 0 if vt is None else vt.data_ptr()
    fixed = (c.data_ptr(), hh.data_ptr(), scale, bt.data_ptr(), vp)
    profile = _profile(kernel)

    def call(entry, lo, hi, *extra):
        status = (ctypes.c_int64 * 2)()
        entry(xq.data_ptr() + lo * rs * size, f32, rs, cs, *fixed,
              sums.data_ptr() + lo * (k + 1) * 8, mean.data_ptr() + lo * k * 8,
              total.data_ptr() + lo * 8, hi - lo, n, d, k, profile, floor, redo_below,
              *extra, ctypes.addressof(status))  # fmt: skip
        return status[0], status[1]

    parts = []
    for lo, hi in _pieces(m, n * (d + k + 1)):
        if lib.lb_openmp():
            parts.append(call(lib.local_means_threads, lo, hi, torch.get_num_threads()))
        else:
            _split(
                hi - lo,
                lambda a, b, lo=lo: parts.append(call(lib.local_means, lo + a, lo + b)),
            )
    bad = sum(p[0] for p in parts)
    n_redo = sum(p[1] for p in parts)
    return sums, mean, total.log_(), bad, n_redo


def midrange(t: torch.Tensor) -> torch.Tensor:
    """``max/2 + min/2`` of each column of a 2-D float32 or float64 CPU tensor (any strides,
    at most ``MAX_DIM`` columns), in ``t``'s dtype: what ``localbook.kernels.data_center``
    computes, in one C pass over the rows."""
    if t.ndim != 2 or t.shape[1] > MAX_DIM:
        raise ValueError(f"t must be 2-D with at most {MAX_DIM} columns")
    out = torch.empty(t.shape[1], dtype=torch.float64)
    rs, cs = t.stride()
    library().midrange(
        t.data_ptr(), t.dtype == torch.float32, t.shape[0], t.shape[1], rs, cs,
        out.data_ptr(),
    )  # fmt: skip
    return out.to(t.dtype)


def _pieces(m: int, work_per_row: float):
    """Row ranges ``(lo, hi)`` covering ``[0, m)``, each about :data:`PIECE_WORK` of work."""
    rows = max(1, int(PIECE_WORK // max(work_per_row, 1.0)))
    for lo in range(0, m, rows):
        yield lo, min(m, lo + rows)


def _split(m: int, part) -> None:
    """Run ``part(lo, hi)`` over the rows ``[0, m)`` on ``torch.get_num_threads()`` threads."""
    workers = max(1, min(torch.get_num_threads(), m // 64))
    if workers == 1:
        if m:
            part(0, m)
        return
    # one piece per thread: each extra piece costs a thread wake-up (16 pieces made
    # Nadaraya–Watson at n = m = 2,000 take 2.1 ms instead of 1.6 ms on 2 threads)
    bounds = [round(m * i / workers) for i in range(workers + 1)]
    futures = [
        _pool(workers).submit(part, lo, hi)
        for lo, hi in zip(bounds, bounds[1:])
        if hi > lo
    ]
    for f in futures:
        f.result()


def kernel_sums(
    a: torch.Tensor,
    b: torch.Tensor,
    values: Optional[torch.Tensor],
    kernel: str,
    floor: float,
    lib: Optional[ctypes.CDLL] = None,
) -> torch.Tensor:
    r"""``S[q] = [Σᵢ k(|a_q − b_i|²) vᵢ, Σᵢ k(|a_q − b_i|²)]``, ``(m, k + 1)``, float64, CPU.

    ``a (m, d)`` and ``b (n, d)`` are scaled coordinates (divided by the bandwidth), ``values``
    ``(n, k)`` or ``None``; ``kernel`` is a key of ``PROFILES``. Exponential profiles are
    evaluated at ``max(log k, floor)`` (the caller redoes rows whose sum is near
    ``n·exp(floor)``). Rows are split over ``torch.get_num_threads()`` threads. Requires
    :func:`library` to be available (or ``lib``, another build of the source).
    """
    lib = lib or library()
    a, bt, vt, k, sums = _prepare(a, b, values, kernel)
    (m, d), n = a.shape, b.shape[0]
    profile = _profile(kernel)

    def part(lo: int, hi: int) -> None:
        lib.kernel_sums(a[lo].data_ptr(), bt.data_ptr(), vt.data_ptr(), sums[lo].data_ptr(),
                        hi - lo, n, d, k, profile, floor)  # fmt: skip

    for lo, hi in _pieces(m, n * (d + k + 1)):
        if lib.lb_openmp():
            lib.kernel_sums_threads(a[lo].data_ptr(), bt.data_ptr(), vt.data_ptr(),
                                    sums[lo].data_ptr(), hi - lo, n, d, k, profile, floor,
                                    torch.get_num_threads())  # fmt: skip
        else:
            _split(hi - lo, lambda x, y, lo=lo: part(lo + x, lo + y))
    return sums


def run_sums(
    a: torch.Tensor,
    b: torch.Tensor,
    values: Optional[torch.Tensor],
    kernel: str,
    floor: float,
    start: torch.Tensor,
    count: torch.Tensor,
    lib: Optional[ctypes.CDLL] = None,
) -> torch.Tensor:
    """:func:`kernel_sums` over runs of the data only: query ``q`` sees the points
    ``start[q, r] … start[q, r] + count[q, r] − 1`` for each run ``r`` (a cell list's
    neighbouring cells, the data sorted by cell). ``start``, ``count``: ``(m, runs)`` int64."""
    lib = lib or library()
    a, bt, vt, k, sums = _prepare(a, b, values, kernel)
    (m, d), n = a.shape, b.shape[0]
    if start.shape != count.shape or start.ndim != 2 or start.shape[0] != m:
        raise ValueError(
            f"start and count must both be ({m}, runs), got {tuple(start.shape)} and "
            f"{tuple(count.shape)}"
        )
    start = start.to(torch.int64).contiguous()
    count = count.to(torch.int64).contiguous()
    runs = start.shape[1]
    profile = _profile(kernel)

    def part(lo: int, hi: int) -> None:
        lib.run_sums(a[lo].data_ptr(), bt.data_ptr(), vt.data_ptr(), sums[lo].data_ptr(),
                     hi - lo, n, d, k, profile, floor, start[lo].data_ptr(),
                     count[lo].data_ptr(), runs)  # fmt: skip

    per_row = float(count.sum()) / max(m, 1) * (d + k + 1)  # the points a query visits
    for lo, hi in _pieces(m, per_row):
        if lib.lb_openmp():
            lib.run_sums_threads(a[lo].data_ptr(), bt.data_ptr(), vt.data_ptr(),
                                 sums[lo].data_ptr(), hi - lo, n, d, k, profile, floor,
                                 start[lo].data_ptr(), count[lo].data_ptr(), runs,
                                 torch.get_num_threads())  # fmt: skip
        else:
            _split(hi - lo, lambda x, y, lo=lo: part(lo + x, lo + y))
    return sums


def exp2_floored(
    y: torch.Tensor, floor2: float, lib: Optional[ctypes.CDLL] = None
) -> torch.Tensor:
    """``2^max(y, floor2)`` by the compiled loops' own ``2^y`` (float64, CPU; for tests)."""
    y = y.to(torch.float64).contiguous()
    out = torch.empty_like(y)
    (lib or library()).exp2_array(y.data_ptr(), out.data_ptr(), y.numel(), floor2)
    return out
