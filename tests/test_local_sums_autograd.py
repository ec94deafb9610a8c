"""The differentiable local average (``local_sums._LocalAverage``): exact gradients for every
kernel and input, exact second derivatives, empty neighbourhoods, and memory that stays flat in
the number of data points under autograd (a subprocess measures its peak)."""

import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from localbook.kernels import data_center, get_kernel
from localbook.local_grad import _graph_average
from localbook.local_sums import local_average

pytestmark = pytest.mark.faults

KERNELS = ["gaussian", "laplacian", "epanechnikov", "biweight", "tricube", "uniform"]


def _inputs(seed, m=6, n=10, d=2, k=3, h=4.0):
    g = torch.Generator().manual_seed(seed)
    opts = dict(dtype=torch.float64, generator=g)
    xq = torch.randn(m, d, **opts).requires_grad_()
    x = torch.randn(n, d, **opts).requires_grad_()
    v = torch.randn(n, k, **opts).requires_grad_()
    hh = (h + torch.rand(d, **opts)).requires_grad_()
    return xq, x, v, hh


@pytest.mark.parametrize("kernel", KERNELS)
def test_gradient_equals_the_full_graph_and_finite_differences(kernel):
    xq, x, v, h = _inputs(0)
    kern = get_kernel(kernel)

    def f(a, b, c, d):
        return local_average(a, b, c, d, kern, warn_empty=False)

    if kernel != "uniform":  # the flat profile is not differentiable in the points
        assert torch.autograd.gradcheck(f, (xq, x, v, h), atol=1e-7)
    mean, lse = f(xq, x, v, h)
    ref_mean, ref_lse = _graph_average(xq, x, v, h, kern, data_center(x).detach(), None)
    torch.testing.assert_close(mean, ref_mean, rtol=0, atol=1e-13)
    g_mean, g_lse = torch.randn_like(mean), torch.randn_like(lse)
    opts = dict(allow_unused=True, materialize_grads=True)
    got = torch.autograd.grad(
        (mean * g_mean).sum() + (lse * g_lse).sum(), (xq, x, v, h), **opts
    )
    ref = torch.autograd.grad(
        (ref_mean * g_mean).sum() + (ref_lse * g_lse).sum(), (xq, x, v, h), **opts
    )
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "uniform"])
def test_second_derivatives_are_exact(kernel):
    xq, x, v, h = _inputs(1, m=4, n=7)
    assert torch.autograd.gradgradcheck(
        lambda a, b, c, d: local_average(a, b, c, d, kernel, warn_empty=False)[0],
        (xq, x, v, h),
        atol=1e-6,
    )


def test_log_sum_only_and_a_single_input_needing_grad():
    xq, x, _, h = _inputs(2)
    x, h = x.detach(), h.detach()
    assert torch.autograd.gradcheck(
        lambda a: local_average(a, x, None, h, "gaussian")[1], (xq,)
    )


def test_empty_neighbourhood_gives_nan_and_zero_gradient_elsewhere():
    xq = torch.tensor(
        [[0.0, 0.0], [100.0, 100.0]], dtype=torch.float64, requires_grad=True
    )
    x = torch.randn(
        6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    v = torch.randn(6, 1, dtype=torch.float64, requires_grad=True)
    h = torch.full((2,), 3.0, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean, lse = local_average(xq, x, v, h, "epanechnikov")
    assert len(caught) == 1 and "1 of 2" in str(caught[0].message)
    assert torch.isnan(mean[1]).all() and torch.isneginf(lse[1])
    mean[0].sum().backward()
    assert torch.isfinite(xq.grad).all() and (xq.grad[1] == 0).all()
    torch.testing.assert_close(v.grad.sum(), torch.tensor(1.0, dtype=torch.float64))


MEMORY = textwrap.dedent(
    """
    import json, resource, sys, torch, localbook as lb
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n, m = int(sys.argv[1]), int(sys.argv[2])
    x, y = torch.randn(n, 2), torch.randn(n).requires_grad_()
    q = torch.randn(m, 2).requires_grad_()
    lb.nadaraya_watson(q[:2], x[:50], y[:50], 0.3).sum().backward()  # load everything
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lb.nadaraya_watson(q, x, y, 0.3).sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"peak_mib": peak / 1024, "finite": bool(torch.isfinite(q.grad).all())}))
    """
)


@pytest.mark.slow
def test_memory_under_autograd_is_flat_in_n():
    """A graph of the weights would hold m·n floats per saved tensor (400 MB at n = 10⁵)."""
    peaks = {}
    for n in (10_000, 100_000):
        out = subprocess.run(
            [sys.executable, "-c", MEMORY, str(n), "1000"],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res["finite"]
        peaks[n] = res["peak_mib"]
    dense_mib = 1000 * 100_000 * 4 / 2**20  # one (m, n) float32 matrix
    assert peaks[100_000] < 0.25 * dense_mib, peaks
    assert peaks[100_000] < 2 * peaks[10_000] + 32, peaks
