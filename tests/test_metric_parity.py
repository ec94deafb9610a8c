"""MLKR parity with the `metric-learn` package (test-only oracle).

metric-learn 0.7 writes the kernel as exp(-‖L(x - x')‖²) (no 1/2) and its ``MLKR._loss``
returns the leave-one-out cost Σ_i (ŷ_{-i} - y_i)² with its gradient in L. localbook writes
exp(-‖A(x - x')‖²/2), so the two objectives agree at A = √2 L, and by the chain rule
∂cost/∂L = √2 ∂loss/∂A there. (Its ``fit`` no longer runs with scikit-learn ≥ 1.8: the
input checks pass a removed keyword, so we compare the objective the optimizer sees.)
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import localbook as lb

metric_learn = pytest.importorskip("metric_learn")


def _reference(L, X, y):
    est = metric_learn.MLKR(verbose=False)
    est.n_iter_ = 0
    cost, grad = est._loss(L.ravel(), X, y)
    return cost, grad.reshape(L.shape)


def _ours(L, X, y, budget=None):
    A = torch.tensor(math.sqrt(2.0) * L, requires_grad=True)
    loss = lb.mlkr_loss(A, torch.tensor(X), torch.tensor(y), budget=budget)
    (g,) = torch.autograd.grad(loss, A)
    return loss.item(), math.sqrt(2.0) * g.numpy()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(3, 40),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    chunked=st.booleans(),
)
def test_mlkr_loss_and_gradient_match_metric_learn(n, d, k, seed, chunked):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + 0.3 * rng.normal(size=n)
    L = rng.normal(size=(k, d)) / 2
    cost, grad = _reference(L, X, y)
    # a small budget forces several row chunks (and checkpointing in the backward pass)
    ours, g = _ours(L, X, y, budget=8 * n * 3 if chunked else None)
    # both sides sum n·n exponentials in float64: rounding scales with n and the largest term
    scale = 1e-11 * n * max(1.0, float(np.sum(y**2)))
    assert abs(ours - cost) <= scale
    np.testing.assert_allclose(g, grad, rtol=0, atol=scale * (1 + np.abs(grad).max()))


def test_mlkr_parity_detects_a_wrong_scale():
    """The √2 is needed: without it the objectives differ (the parity test can fail)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, 2))
    y = X[:, 0]
    L = np.eye(2)
    cost, _ = _reference(L, X, y)
    wrong = float(lb.mlkr_loss(torch.tensor(L), torch.tensor(X), torch.tensor(y)))
    assert abs(wrong - cost) > 1e-3 * cost
