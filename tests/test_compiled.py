"""The compiled kernel sums (localbook.compiled) against dense PyTorch references."""

import contextlib
import math
import os
import platform
import shutil
import warnings
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import localbook.compiled as compiled
import localbook.kernels as kernels
import localbook.local_sums as local_sums
from localbook.kernels import KERNELS, _exp_floor
from localbook.local_sums import local_average

pytestmark = pytest.mark.skipif(
    compiled.library() is None, reason="no C compiler: " + compiled.status()
)
FLOOR = _exp_floor(torch.float64)


@contextlib.contextmanager
def _quiet():  # empty neighbourhoods of compact kernels warn; not the point here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _dense(a, b, values, name, error_scale=False):
    """The sums by dense PyTorch ops; ``error_scale``: the scale of their rounding error."""
    u2 = ((a[:, None] - b[None]) ** 2).sum(-1)
    lw = KERNELS[name].log_profile(u2)
    w = torch.exp(lw.clamp(min=FLOOR) if name in ("gaussian", "laplacian") else lw)
    if error_scale:
        # rounding of u2 (relative eps) moves exp(-u2/2) by eps·u2 relative and 1 - u2 by
        # eps absolute: sum |v| times those sensitivities
        w = w * (1 + u2) + (u2 <= 1).to(w.dtype) * (
            name in ("epanechnikov", "biweight")
        )
        values = None if values is None else values.abs()
    ones = torch.ones(b.shape[0], 1, dtype=torch.float64)
    v1 = ones if values is None else torch.cat([values, ones], 1)
    return w @ v1


FLOOR2 = FLOOR / math.log(2.0)


BUILDS = {
    "native": None,
    "avx2": ["-mno-avx512f"],  # the 4-lane vector loops
    "portable": ["-mno-avx512f", "-mno-avx2", "-mno-fma"],  # the plain C loops
}


@pytest.fixture(scope="module", params=list(BUILDS))
def lib(request, tmp_path_factory):
    """The cached native build, and the same source built without AVX-512 and without any
    vector extension: loops this machine would otherwise never run."""
    if BUILDS[request.param] is None:
        return compiled.library()
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 build flags")
    out = tmp_path_factory.mktemp(request.param) / "kernel_sums.so"
    error = compiled.compile_source(shutil.which("cc"), out, BUILDS[request.param])
    if error:
        pytest.skip(f"cannot build {request.param}: {error}")
    return compiled.load(out)


def test_exp2_within_two_ulp_of_torch(lib):
    y = torch.linspace(FLOOR2, 0.0, 1_000_001, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    y = torch.cat([y, -torch.rand(10_001, dtype=torch.float64, generator=g)])
    got, ref = compiled.exp2_floored(y, FLOOR2, lib), torch.exp2(y)
    ulp = (got - ref).abs() / (ref * torch.finfo(torch.float64).eps)
    assert float(ulp.max()) <= 2.0
    assert float(ulp.mean()) < 0.5  # mostly exact: a systematic error would show here


def test_exp2_is_floored(lib):
    y = torch.tensor([-1e4, -1100.0, FLOOR2 - 1.0, FLOOR2, 0.0], dtype=torch.float64)
    got = compiled.exp2_floored(y, FLOOR2, lib)
    assert torch.equal(got[:3], torch.full((3,), got[3].item(), dtype=torch.float64))
    assert got[3] == pytest.approx(math.exp(FLOOR), rel=1e-14)
    assert got[4] == 1.0
    assert bool((got >= torch.finfo(torch.float64).tiny).all())  # normal, never 0


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10**6),
    st.sampled_from(list(compiled.PROFILES)),
    st.integers(1, 6),
    st.integers(0, 10),  # above 8 value columns: the portable loop (no AVX-512 pass)
    st.integers(1, 300),
    st.integers(1, 700),
)
def test_kernel_sums_equal_the_dense_sums(seed, name, d, k, m, n):
    _check_sums(compiled.library(), seed, name, d, k, m, n)


@pytest.mark.parametrize("name", list(compiled.PROFILES))
@pytest.mark.parametrize("k", [0, 1, 3, 9])
def test_both_builds_equal_the_dense_sums(lib, name, k):
    for seed, (d, m, n) in enumerate([(1, 37, 517), (2, 100, 1000), (5, 20, 33)]):
        _check_sums(lib, seed, name, d, k, m, n)


def _check_sums(lib, seed, name, d, k, m, n):
    g = torch.Generator().manual_seed(seed)
    a = 2 * torch.randn(m, d, generator=g, dtype=torch.float64)
    b = 2 * torch.randn(n, d, generator=g, dtype=torch.float64)
    values = None if k == 0 else torch.randn(n, k, generator=g, dtype=torch.float64)
    sums = compiled.kernel_sums(a, b, values, name, FLOOR, lib)
    ref = _dense(a, b, values, name)
    scale = _dense(a, b, values, name, error_scale=True)
    # both sides sum n terms: rounding error at most ~n·eps times the sum of |terms|
    assert bool(((sums - ref).abs() <= 8 * n * 2**-52 * scale + 1e-300).all())


def test_rows_split_over_threads_add_up():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(1001, 2, generator=g, dtype=torch.float64)
    b = torch.randn(999, 2, generator=g, dtype=torch.float64)
    v = torch.randn(999, 3, generator=g, dtype=torch.float64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compiled.kernel_sums(a, b, v, "gaussian", FLOOR)
        torch.set_num_threads(3)
        three = compiled.kernel_sums(a, b, v, "gaussian", FLOOR)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)  # rows are independent: the split changes nothing


@pytest.mark.parametrize("name", list(compiled.PROFILES))
def test_local_average_same_on_both_engines(monkeypatch, name):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(800, 2, generator=g, dtype=torch.float64)
    q = 1.5 * torch.randn(300, 2, generator=g, dtype=torch.float64)
    v = torch.randn(800, 2, generator=g, dtype=torch.float64)
    h = torch.tensor([0.4, 0.7], dtype=torch.float64)
    used = []
    real = compiled.local_means
    monkeypatch.setattr(compiled, "local_means", lambda *a: used.append(1) or real(*a))
    monkeypatch.setattr(local_sums, "GRID_MAX_DIM", 0)  # dense pairs on both sides
    with _quiet():
        mean_c, lse_c = local_average(q, x, v, h, name)
    assert used, "the compiled engine did not run"
    monkeypatch.setattr(compiled, "library", lambda: None)
    with _quiet():
        mean_t, lse_t = local_average(q, x, v, h, name)
    ok = torch.isfinite(lse_t)
    assert torch.equal(torch.isfinite(lse_c), ok)
    torch.testing.assert_close(lse_c[ok], lse_t[ok], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean_c[ok], mean_t[ok], rtol=1e-10, atol=1e-10)


def test_far_queries_are_redone_exactly():
    # every weight of the far query is below the floor: its row is redone with the shift
    x = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    q = torch.tensor([[0.2], [100.0]], dtype=torch.float64)
    v = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    mean, lse = local_average(
        q, x, v, torch.tensor([0.1], dtype=torch.float64), "gaussian"
    )
    assert mean[1, 0] == pytest.approx(3.0)  # the nearest point's value, not a 0/0
    assert lse[1] == pytest.approx(-0.5 * 990.0**2)


def _status_in_a_new_process(**env) -> str:
    code = "import localbook.compiled as c; print(c.library() is not None, c.status())"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.faults
def test_disabled_by_environment(tmp_path):
    out = _status_in_a_new_process(
        LOCALBOOK_COMPILED="0", LOCALBOOK_CACHE=str(tmp_path)
    )
    assert out.startswith("False disabled by LOCALBOOK_COMPILED=0")


def test_builds_into_an_empty_cache(built_elsewhere):
    cache, out = built_elsewhere
    assert out.startswith("True compiled kernels loaded from " + str(cache))
    assert len(list(cache.glob("kernel_sums-*.so"))) == 1  # no temporary left behind


@pytest.mark.parametrize("name", ["uniform", "epanechnikov", "biweight"])
@pytest.mark.parametrize("k", [0, 2, 9])
def test_run_sums_over_a_cell_list_equal_the_dense_sums(lib, name, k):
    g = torch.Generator().manual_seed(11)
    for d in (1, 2, 3):
        x = 4 * torch.rand(700, d, generator=g, dtype=torch.float64)
        q = torch.cat(
            [5 * torch.rand(90, d, generator=g, dtype=torch.float64) - 0.5, x[:5]]
        )
        h = torch.full((d,), 0.45, dtype=torch.float64)
        v = None if k == 0 else torch.randn(700, k, generator=g, dtype=torch.float64)
        center = kernels.data_center(x)
        grid = local_sums._Grid.build(x, v, h, center, force=True)
        qs = (q - center) / h
        start, count = grid.candidates(qs)
        vs = None if k == 0 else grid.v1_o[:, :-1]
        sums = compiled.run_sums(qs, grid.xs_o, vs, name, 0.0, start, count, lib)
        ref = _dense(qs, (x - center) / h, v, name)
        scale = _dense(qs, (x - center) / h, v, name, error_scale=True)
        assert bool(((sums - ref).abs() <= 8 * 700 * 2**-52 * scale).all())
        assert int(count.sum()) < q.shape[0] * x.shape[0] / 2  # the runs skipped pairs


@pytest.mark.parametrize("name", ["uniform", "epanechnikov", "biweight", "tricube"])
def test_local_average_cell_list_same_on_both_engines(monkeypatch, name):
    g = torch.Generator().manual_seed(8)
    x = 10 * torch.rand(3000, 2, generator=g, dtype=torch.float64)
    q = 10 * torch.rand(200, 2, generator=g, dtype=torch.float64)
    v = torch.randn(3000, 3, generator=g, dtype=torch.float64)
    h = torch.tensor([0.3, 0.2], dtype=torch.float64)
    with _quiet():
        mean_c, lse_c = local_average(q, x, v, h, name)
        monkeypatch.setattr(compiled, "library", lambda: None)
        mean_t, lse_t = local_average(q, x, v, h, name)
    ok = torch.isfinite(lse_t)
    assert torch.equal(torch.isfinite(lse_c), ok)
    torch.testing.assert_close(lse_c[ok], lse_t[ok], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean_c[ok], mean_t[ok], rtol=1e-10, atol=1e-10)


def test_python_threads_where_openmp_is_missing(monkeypatch):
    # built without OpenMP, the rows are split over Python threads: same sums
    g = torch.Generator().manual_seed(4)
    a = torch.randn(700, 2, generator=g, dtype=torch.float64)
    b = torch.randn(900, 2, generator=g, dtype=torch.float64)
    v = torch.randn(900, 2, generator=g, dtype=torch.float64)
    lib = compiled.library()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with_omp = compiled.kernel_sums(a, b, v, "gaussian", FLOOR)
        monkeypatch.setattr(lib, "lb_openmp", lambda: 0)
        with_pool = compiled.kernel_sums(a, b, v, "gaussian", FLOOR)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(with_omp, with_pool)


def test_bad_operands_are_named():
    a = torch.zeros(3, 2, dtype=torch.float64)
    b = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="kernel must be one of"):
        compiled.kernel_sums(a, b, None, "tricube", FLOOR)
    with pytest.raises(ValueError, match="same number of columns"):
        compiled.kernel_sums(a, b[:, :1], None, "gaussian", FLOOR)
    with pytest.raises(ValueError, match="values must be"):
        compiled.kernel_sums(a, b, torch.zeros(3, 1), "gaussian", FLOOR)
    with pytest.raises(ValueError, match="a must be a 2-D CPU tensor"):
        compiled.kernel_sums(a[0], b, None, "gaussian", FLOOR)
    runs = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="start and count"):
        compiled.run_sums(a, b, None, "uniform", 0.0, runs, runs[:, :1], None)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("transpose", [False, True])
def test_scale_points_equal_the_pytorch_expression(dtype, transpose):
    g = torch.Generator().manual_seed(12)
    t = (100 * torch.randn(9, 70, generator=g, dtype=torch.float64)).to(dtype).T[::2]
    center = 3 * torch.randn(9, generator=g, dtype=torch.float64).to(dtype)
    h = torch.rand(9, generator=g, dtype=torch.float64).to(dtype) + 0.1
    out, bad = compiled.scale_points(t, center, h, 0.75, transpose)  # strided input
    ref = ((t - center) / h).to(torch.float64) * 0.75
    assert bad == 0 and out.dtype == torch.float64
    assert torch.equal(out, ref.T if transpose else ref)  # the same roundings


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scale_points_count_overflowing_rows(dtype):
    big = torch.finfo(dtype).max
    t = torch.tensor(
        [[0.0, 1.0], [big / 2, -big / 2], [1.0, 2.0], [0.0, big]], dtype=dtype
    )
    h = torch.tensor([1e-3, 1.0], dtype=dtype)
    _, bad = compiled.scale_points(t, torch.zeros(2, dtype=dtype), h, 1.0)
    assert bad == 2  # rows 1 and 3: (t - c) / h squared is not finite


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_local_means_equal_kernel_sums_then_division(dtype, k, monkeypatch):
    g = torch.Generator().manual_seed(13)
    x = torch.randn(300, 3, generator=g, dtype=torch.float64).to(dtype)
    q = (
        torch.randn(7, 101, generator=g, dtype=torch.float64).to(dtype).T[:, 2:5]
    )  # strided
    q[5] = 40.0  # a far query: its total is below the threshold
    v = None if k == 0 else torch.randn(k, 300, generator=g, dtype=torch.float64)
    center, h = kernels.data_center(x), torch.tensor([0.5, 0.7, 0.9], dtype=dtype)
    bt, bad = compiled.scale_points(x, center, h, compiled.GAUSS_SCALE, True)
    a, _ = compiled.scale_points(q, center, h, 1.0)
    ref = compiled.kernel_sums(a, bt.T / compiled.GAUSS_SCALE, v.T if k else None,
                               "gaussian", FLOOR)  # fmt: skip
    threads = torch.get_num_threads()
    for omp in (1, 0):  # OpenMP threads, and Python's where OpenMP is missing
        if not omp:
            monkeypatch.setattr(compiled.library(), "lb_openmp", lambda: 0)
        try:
            torch.set_num_threads(3)
            sums, mean, log_sum, bad, n_redo = compiled.local_means(
                q, center, h, compiled.GAUSS_SCALE, bt, v, "gaussian", FLOOR, 1e-200
            )
        finally:
            torch.set_num_threads(threads)
        torch.testing.assert_close(sums, ref, rtol=1e-13, atol=0)
        torch.testing.assert_close(mean, ref[:, :-1] / ref[:, -1:], rtol=1e-13, atol=0)
        torch.testing.assert_close(log_sum, ref[:, -1].log(), rtol=1e-13, atol=0)
        assert bad == 0 and n_redo == 1


def test_local_means_count_overflowing_queries():
    x = torch.randn(50, 2, dtype=torch.float64)
    q = torch.tensor([[0.0, 0.0], [1e200, 0.0], [0.0, -1e200]], dtype=torch.float64)
    center, h = kernels.data_center(x), torch.ones(2, dtype=torch.float64)
    bt, _ = compiled.scale_points(x, center, h, 1.0, True)
    *_, bad, _ = compiled.local_means(
        q, center, h, 1.0, bt, None, "epanechnikov", 0.0, 0.0
    )
    assert bad == 2


def test_local_average_float32_same_on_both_engines(monkeypatch):
    g = torch.Generator().manual_seed(14)
    x = torch.randn(900, 3, generator=g)
    q = torch.randn(200, 3, generator=g)
    v = torch.randn(900, 2, generator=g)
    h = torch.tensor([0.5, 0.6, 0.7])
    mean_c, lse_c = local_average(q, x, v, h, "gaussian")
    monkeypatch.setattr(compiled, "library", lambda: None)
    mean_t, lse_t = local_average(q, x, v, h, "gaussian")
    assert mean_c.dtype == lse_c.dtype == torch.float32
    torch.testing.assert_close(lse_c, lse_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean_c, mean_t, rtol=1e-4, atol=1e-4)


def test_floored_terms_flush_to_zero_only_inside_the_loop(monkeypatch):
    # h = 0.01 on the unit square: most pairs sit at the exp floor (~e * 2^-1022), and their
    # products with values of either sign are subnormal; the loop flushes those (its speed),
    # the results stay those of the PyTorch engine, and the caller's float mode is untouched
    g = torch.Generator().manual_seed(15)
    x = torch.rand(3000, 2, generator=g, dtype=torch.float64)
    v = torch.sin(6 * x[:, :1]) * 1e-3
    q = torch.rand(500, 2, generator=g, dtype=torch.float64)
    h = torch.full((2,), 0.01, dtype=torch.float64)
    mean_c, lse_c = local_average(q, x, v, h, "gaussian")
    tiny = 2.0**-1070  # subnormal
    assert torch.tensor(tiny, dtype=torch.float64) * 2 == 2 * tiny  # not flushed here
    assert math.ldexp(1.0, -1070) * 2 > 0
    monkeypatch.setattr(compiled, "library", lambda: None)
    mean_t, lse_t = local_average(q, x, v, h, "gaussian")
    torch.testing.assert_close(lse_c, lse_t, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean_c, mean_t, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_midrange_equals_the_pytorch_reductions(dtype):
    g = torch.Generator().manual_seed(16)
    x = (1e6 * torch.randn(5, 801, generator=g, dtype=torch.float64)).to(dtype).T[::3]
    got = kernels.data_center(x)  # the C pass (CPU, float32/64)
    lo, hi = torch.aminmax(x, dim=0)
    assert got.dtype == dtype and torch.equal(got, torch.add(hi * 0.5, lo, alpha=0.5))
    big = torch.tensor(
        [[torch.finfo(dtype).max], [torch.finfo(dtype).max]], dtype=dtype
    )
    assert torch.isfinite(kernels.data_center(big)).all()  # no overflow
    with pytest.raises(ValueError, match="at most 16 columns"):
        compiled.midrange(torch.zeros(3, 17, dtype=dtype))


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "no", "Off", " off "])
@pytest.mark.faults
def test_environment_switch_accepts_the_usual_spellings_of_off(value, monkeypatch):
    monkeypatch.setenv("LOCALBOOK_COMPILED", value)
    lib, reason = compiled._build()
    assert lib is None and "disabled by LOCALBOOK_COMPILED" in reason


@pytest.mark.parametrize("value", ["1", "true", "Yes", "on", ""])
@pytest.mark.faults
def test_environment_switch_on_spellings_do_not_disable(value, monkeypatch):
    monkeypatch.setenv("LOCALBOOK_COMPILED", value)
    assert compiled._disabled_by_environment() is None


@pytest.mark.faults
def test_environment_switch_unknown_value_warns_and_stays_on(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_COMPILED", "maybe")
    with pytest.warns(UserWarning, match="not understood"):
        assert compiled._disabled_by_environment() is None


@pytest.fixture(scope="module")
def built_elsewhere(tmp_path_factory):
    """An empty cache after another process built into it, and what that process said (a
    library this process has loaded must not be damaged under it: its mapped pages would
    fault). One build serves the test of a cold build and the damaged-cache tests."""
    cache = tmp_path_factory.mktemp("built_elsewhere")
    return cache, _status_in_a_new_process(LOCALBOOK_CACHE=str(cache))


def _build_elsewhere(tmp_path, monkeypatch, built):
    """A copy of that complete build (new files, never loaded here) in ``tmp_path``, and this
    process pointed there."""
    for f in built.glob("kernel_sums-*"):
        if f.suffix in (".so", ".sha256"):
            shutil.copyfile(f, tmp_path / f.name)
    monkeypatch.setenv("LOCALBOOK_CACHE", str(tmp_path))
    monkeypatch.setenv("LOCALBOOK_COMPILED", "1")
    (so,) = tmp_path.glob("kernel_sums-*.so")
    return so, so.with_suffix(".sha256")


@pytest.mark.skipif(
    platform.system() != "Linux" or not shutil.which("cc"), reason="no cc"
)
@pytest.mark.faults
def test_a_truncated_cached_library_is_rebuilt_not_loaded(
    tmp_path, monkeypatch, built_elsewhere
):
    """An interrupted build left half a library: loading it gave SIGBUS in every later
    process. The checksum written after a complete build catches it; it is rebuilt."""
    so, stamp = _build_elsewhere(tmp_path, monkeypatch, built_elsewhere[0])
    assert stamp.read_text().strip() == compiled._digest(so)
    whole = so.read_bytes()
    so.write_bytes(whole[: len(whole) // 2])  # as a cut-short write leaves it
    lib, reason = compiled._build()
    assert lib is not None and "loaded from" in reason
    assert compiled._cached_ok(so, stamp) and so.stat().st_size == len(whole)


@pytest.mark.skipif(
    platform.system() != "Linux" or not shutil.which("cc"), reason="no cc"
)
@pytest.mark.faults
def test_a_library_without_its_checksum_is_rebuilt(
    tmp_path, monkeypatch, built_elsewhere
):
    so, stamp = _build_elsewhere(tmp_path, monkeypatch, built_elsewhere[0])
    stamp.unlink()  # an older build, or one cut short before its checksum
    lib, _ = compiled._build()
    assert lib is not None and compiled._cached_ok(so, stamp)


@pytest.mark.skipif(
    platform.system() != "Linux" or not shutil.which("cc"), reason="no cc"
)
@pytest.mark.faults
def test_a_library_without_the_symbols_is_rebuilt(
    tmp_path, monkeypatch, built_elsewhere
):
    """A valid ELF file without the expected functions raised an uncaught AttributeError."""
    so, stamp = _build_elsewhere(tmp_path, monkeypatch, built_elsewhere[0])
    empty_c = tmp_path / "empty.c"
    empty_c.write_text("int nothing_here(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(empty_c), "-o", str(so)], check=True)
    stamp.write_text(compiled._digest(so) + "\n")  # checksum fine, symbols missing
    lib, reason = compiled._build()
    assert lib is not None and hasattr(lib, "local_means"), reason


@pytest.mark.faults
def test_a_failed_compile_with_empty_stderr_is_a_failure(monkeypatch):
    class Done:
        returncode, stderr = 1, ""

    monkeypatch.setattr(compiled.subprocess, "run", lambda *a, **k: Done())
    error = compiled.compile_source("cc", "/nonexistent/out.so")
    assert "exited with status 1" in error


@pytest.mark.faults
@pytest.mark.skipif(
    platform.system() != "Linux" or not shutil.which("cc"), reason="no cc"
)
def test_a_silent_failed_compile_caches_nothing_and_falls_back_once(
    tmp_path, monkeypatch
):
    """The compiler exits with status 1 and writes nothing to stderr (a killed build, a
    full disk): no library and no checksum is left in the cache for a later process to
    load, and this one falls back to the PyTorch engine with one warning."""
    monkeypatch.setenv("LOCALBOOK_CACHE", str(tmp_path))
    monkeypatch.setenv("LOCALBOOK_COMPILED", "1")
    real_run = compiled.subprocess.run

    class Silent:
        returncode, stdout, stderr = 1, "", ""

    # `cc --version` answers; every compile fails silently
    def run(cmd, *args, **kwargs):
        return real_run(cmd, *args, **kwargs) if "--version" in cmd else Silent()

    monkeypatch.setattr(compiled.subprocess, "run", run)
    with pytest.warns(RuntimeWarning, match="exited with status 1") as record:
        lib, reason = compiled._build()
    assert lib is None and "exited with status 1" in reason and len(record) == 1
    left = sorted(p.name for p in tmp_path.iterdir())
    assert all(name.endswith(".lock") for name in left), left


@pytest.mark.faults
def test_a_compile_failure_falls_back_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CACHE", str(tmp_path))
    monkeypatch.setenv("LOCALBOOK_COMPILED", "1")
    monkeypatch.setattr(compiled, "compile_source", lambda cc, out: "no luck")
    if platform.system() != "Linux" or not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no compiler: the build is not attempted")
    with pytest.warns(RuntimeWarning, match="PyTorch engine") as record:
        lib, reason = compiled._build()
    assert lib is None and "no luck" in reason and len(record) == 1
    assert not list(tmp_path.glob("kernel_sums-*.so"))  # nothing cached as built


@pytest.mark.skipif(
    platform.system() != "Linux" or not shutil.which("cc"), reason="no cc"
)
@pytest.mark.faults
def test_two_cold_processes_build_once_and_both_load(tmp_path):
    """Two processes starting with an empty cache: the lock lets one compile while the
    other waits and then reuses its library (no half-written file is ever loaded)."""
    code = "import localbook.compiled as c; print(c.library() is not None, c.status())"
    env = dict(os.environ, LOCALBOOK_CACHE=str(tmp_path), LOCALBOOK_COMPILED="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(o.startswith("True compiled kernels loaded") for o in outs), outs
    assert len(list(tmp_path.glob("kernel_sums-*.so"))) == 1
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("tmp*"))
