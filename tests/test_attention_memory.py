"""Explicit (chunked) attention under autograd recomputes each chunk in the backward pass: the
gradient equals the one through the full weight matrix, and memory does not grow like T²."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import localbook as lb

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("weights", ["softmax", "sparsemax", "entmax15"])
def test_chunked_gradient_equals_the_dense_one(weights, monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 37, 5, generator=g, dtype=torch.float64) for _ in range(3)
    )
    monkeypatch.setattr(lb.attention, "chunk_rows", lambda *a, **kw: 5)
    grads = []
    # recomputed chunks (the default) / the weights kept in the graph (return_weights)
    for keep in (False, True):
        a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
        out = lb.local_mean_attention(
            a, b, c, causal=True, weights=weights, return_weights=keep
        )
        out = out[0] if keep else out
        (out * torch.linspace(-1, 1, 5, dtype=torch.float64)).sum().backward()
        grads.append([out.detach(), a.grad, b.grad, c.grad])
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


MEMORY = textwrap.dedent(
    """
    import json, sys, torch, localbook as lb
    torch.set_num_threads(1)
    T = int(sys.argv[1])
    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, 16, generator=g).requires_grad_() for _ in range(3))
    base = status("VmRSS")
    lb.local_mean_attention(q, k, v, causal=True, weights="sparsemax").square().sum().backward()
    print(json.dumps({"peak_mib": status("VmHWM") - base}))
    """
)


@pytest.mark.slow
def test_causal_sparsemax_attention_memory_stays_below_the_weight_matrix():
    T = 16_000
    out = subprocess.run(
        [sys.executable, "-c", MEMORY, str(T)],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
    dense = T * T * 4 / 2**20  # one (T, T) float32 weight matrix: 977 MiB
    assert peak < 0.25 * dense, peak


def test_a_learned_alpha_and_decay_get_their_gradients_through_the_recomputed_chunks():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 6, 3, dtype=torch.float64, generator=g) for _ in range(3))
    alpha = torch.tensor([1.3, 1.7], dtype=torch.float64)
    decay = torch.tensor([0.2, 0.5], dtype=torch.float64)
    grads = []
    for keep in (False, True):
        a, b, c, al, de = (t.clone().requires_grad_() for t in (q, k, v, alpha, decay))
        out = lb.local_mean_attention(
            a,
            b,
            c,
            causal=True,
            weights="entmax_bisect",
            alpha=al,
            temporal=lb.TemporalKernel(decay=de),
            return_weights=keep,
        )
        out = out[0] if keep else out
        grads.append(torch.autograd.grad(out.square().sum(), (a, b, c, al, de)))
    for x, y in zip(*grads):
        assert torch.count_nonzero(x) > 0
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_a_callable_keeps_its_own_parameters_in_the_graph():
    scale = torch.tensor(1.5, requires_grad=True)
    q = torch.randn(1, 5, 3)
    out = lb.local_mean_attention(
        q.requires_grad_(), q, q, weights=lambda s: torch.softmax(scale * s, -1)
    )
    out.sum().backward()
    assert scale.grad is not None and torch.isfinite(scale.grad)
