"""Parity with the ``entmax`` package: every α it accepts, a learnable α, and the Fenchel–Young
losses (values and gradients), modelled on the package's own test_root_finding / test_losses."""

import math

import entmax as ref
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb
from localbook import entmax_bisect, entmax15_loss, entmax_bisect_loss, sparsemax_loss

EPS = torch.finfo(torch.float64).eps


def _z(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("alpha", [0.25, 0.5, 0.9, 1.1, 1.5, 2.0, 2.5, 4.0])
def test_every_alpha_the_package_accepts(alpha):
    z = _z((6, 9))
    ours = entmax_bisect(z, alpha)
    theirs = ref.entmax_bisect(z, alpha=alpha, n_iter=100)
    # both stop bisecting at a τ within a few ulps; p = (X − τ)^{1/(α−1)} magnifies that by
    # p^{2−α}/(α−1) ≤ max(1, 1/(α−1)) times the row's scale
    scale = float(z.abs().max()) * max(1.0, abs(alpha - 1))
    torch.testing.assert_close(
        ours, theirs, rtol=0, atol=1e3 * EPS * scale / min(1.0, abs(alpha - 1))
    )
    torch.testing.assert_close(
        ours.sum(-1), torch.ones(6, dtype=torch.float64), rtol=0, atol=20 * EPS
    )


def test_alpha_one_is_softmax_and_below_one_is_dense():
    z = _z((4, 7))
    torch.testing.assert_close(
        entmax_bisect(z, 1.0), torch.softmax(z, -1), rtol=0, atol=0
    )
    assert bool((entmax_bisect(z, 0.5) > 0).all())
    # α-entmax → softmax as α → 1 from either side, at first order in |α − 1|
    for a in (1 - 1e-4, 1 + 1e-4):
        assert float((entmax_bisect(z, a) - torch.softmax(z, -1)).abs().max()) < 1e-3


@pytest.mark.parametrize("alpha_shape", [(5, 1), (1, 1), ()])
def test_learnable_alpha_values_and_gradients_match_the_package(alpha_shape):
    z = _z((5, 6)).requires_grad_()
    alpha = torch.full(alpha_shape, 1.4, dtype=torch.float64)
    if alpha_shape == (5, 1):
        alpha = alpha + 0.2 * torch.arange(5, dtype=torch.float64)[:, None]  # 1.4 … 2.2
    alpha.requires_grad_()
    g = _z((5, 6), seed=1)
    p = entmax_bisect(z, alpha, n_iter=100)
    gz, ga = torch.autograd.grad((p * g).sum(), (z, alpha))
    alpha_ref = alpha.detach().clone().requires_grad_()
    z_ref = z.detach().clone().requires_grad_()
    q = ref.entmax_bisect(
        z_ref,
        alpha_ref.expand(5, 1) if alpha_shape != (5, 1) else alpha_ref,
        n_iter=100,
    )
    gz_ref, ga_ref = torch.autograd.grad((q * g).sum(), (z_ref, alpha_ref))
    torch.testing.assert_close(p, q, rtol=0, atol=1e3 * EPS)
    torch.testing.assert_close(gz, gz_ref, rtol=0, atol=1e4 * EPS)
    torch.testing.assert_close(ga, ga_ref, rtol=0, atol=1e4 * EPS)
    assert ga.shape == alpha.shape


def test_alpha_gradient_by_gradcheck_per_head():
    """(batch, heads, T, T) scores and one α per head, as in adaptively sparse transformers."""
    z = _z((2, 3, 4, 5)).requires_grad_()
    alpha = (
        torch.tensor([1.2, 1.6, 2.3], dtype=torch.float64)
        .view(1, 3, 1, 1)
        .requires_grad_()
    )
    assert torch.autograd.gradcheck(
        lambda z, a: entmax_bisect(z, a, n_iter=200), (z, alpha)
    )


@pytest.mark.parametrize(
    "alphas", [(1.2, 1.6, 2.0), (1.5, 1.5, 1.5), (0.5, 0.8, 3.0)], ids=str
)
def test_tensor_alpha_paths_pass_gradcheck(alphas):
    """α all in (1, 2] (α = 2 included): Newton's method on τ; otherwise bisection. Both
    share one backward, whose masks of 0^(2 − α) apply from α ≥ 2 on."""
    from localbook import entmax_alpha as module

    z = _z((2, 3, 4, 6)).requires_grad_()
    alpha = torch.tensor(alphas, dtype=torch.float64).view(1, 3, 1, 1).requires_grad_()
    newton = all(1 < a <= 2 for a in alphas)
    called = []
    real = module._EntmaxAlphaNewtonFunction.apply
    module._EntmaxAlphaNewtonFunction.apply = lambda *a: called.append(1) or real(*a)
    try:
        entmax_bisect(z, alpha)
    finally:
        module._EntmaxAlphaNewtonFunction.apply = real
    assert bool(called) == newton
    assert torch.autograd.gradcheck(
        lambda z, a: entmax_bisect(z, a, n_iter=200), (z, alpha)
    )
    if alphas == (1.5, 1.5, 1.5):  # the tensor path agrees with the float one
        torch.testing.assert_close(
            entmax_bisect(z, alpha), entmax_bisect(z, 1.5), rtol=0, atol=1e3 * EPS
        )


def test_learnable_alpha_is_learned():
    """Fitting α by gradient descent recovers the α that produced a target distribution."""
    z = _z((8, 10))
    target = entmax_bisect(z, 1.7)
    raw = torch.zeros(
        (), dtype=torch.float64, requires_grad=True
    )  # α = 1 + softplus(raw)
    opt = torch.optim.Adam([raw], lr=0.1)
    for _ in range(300):
        opt.zero_grad()
        alpha = 1 + torch.nn.functional.softplus(raw)
        loss = ((entmax_bisect(z, alpha.view(1, 1)) - target) ** 2).sum()
        loss.backward()
        opt.step()
    assert abs(float(1 + torch.nn.functional.softplus(raw)) - 1.7) < 1e-3


@pytest.mark.parametrize(
    "ours,theirs,alpha",
    [
        (sparsemax_loss, ref.sparsemax_loss, 2.0),
        (entmax15_loss, ref.entmax15_loss, 1.5),
        (
            lambda X, t: entmax_bisect_loss(X, t, 1.3),
            lambda X, t: ref.entmax_bisect_loss(X, t, 1.3),
            1.3,
        ),
        (
            lambda X, t: entmax_bisect_loss(X, t, 0.7),
            lambda X, t: ref.entmax_bisect_loss(X, t, 0.7),
            0.7,
        ),
    ],
)
def test_fenchel_young_losses_match_the_package(ours, theirs, alpha):
    X = _z((7, 6)).requires_grad_()
    t = torch.arange(7) % 6
    a, b = ours(X, t), theirs(X, t)
    (ga,) = torch.autograd.grad(a.sum(), X)
    (gb,) = torch.autograd.grad(b.sum(), X)
    torch.testing.assert_close(a, b, rtol=0, atol=1e3 * EPS)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e3 * EPS)
    # gradient = p − e_y (the Fenchel–Young identity)
    p = entmax_bisect(X.detach(), alpha)
    torch.testing.assert_close(
        ga, p - torch.nn.functional.one_hot(t, 6).double(), rtol=0, atol=1e3 * EPS
    )


@settings(max_examples=30)
@given(st.integers(0, 10_000), st.sampled_from([1.2, 1.5, 2.0, 3.0]))
def test_losses_are_non_negative_and_zero_on_a_confident_correct_score(seed, alpha):
    X = _z((5, 4), seed=seed)
    t = torch.randint(0, 4, (5,), generator=torch.Generator().manual_seed(seed))
    loss = entmax_bisect_loss(X, t, alpha)
    assert bool((loss >= -1e3 * EPS).all())
    X_conf = X.clone()
    X_conf[torch.arange(5), t] += 50.0  # p = e_y exactly for α > 1
    torch.testing.assert_close(
        entmax_bisect_loss(X_conf, t, alpha),
        torch.zeros(5, dtype=torch.float64),
        rtol=0,
        atol=1e3 * EPS * 50,
    )


def test_alpha_one_loss_is_cross_entropy_and_alpha_gradient_by_gradcheck():
    X = _z((6, 5)).requires_grad_()
    t = torch.arange(6) % 5
    ce = torch.nn.functional.cross_entropy(X, t, reduction="none")
    torch.testing.assert_close(
        entmax_bisect_loss(X, t, 1.0), ce, rtol=0, atol=1e2 * EPS
    )
    alpha = torch.full((6, 1), 1.4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, a: entmax_bisect_loss(x, t, a, n_iter=200), (X, alpha)
    )


def test_tsallis_entropy_limits():
    p = torch.softmax(_z((3, 5)), -1)
    shannon = -(p * p.log()).sum(-1)
    torch.testing.assert_close(lb.tsallis_entropy(p, 1.0), shannon)
    torch.testing.assert_close(
        lb.tsallis_entropy(p, 1 + 1e-6), shannon, rtol=1e-5, atol=0
    )
    torch.testing.assert_close(lb.tsallis_entropy(p, 2.0), (1 - (p**2).sum(-1)) / 2)


@pytest.mark.parametrize(
    "call,exc,word",
    [
        (
            lambda: sparsemax_loss(torch.randn(3, 4), torch.tensor([0, 1, 4])),
            ValueError,
            "target",
        ),
        (
            lambda: sparsemax_loss(torch.randn(3, 4), torch.tensor([0.0, 1.0, 2.0])),
            TypeError,
            "target",
        ),
        (
            lambda: entmax15_loss(torch.randn(3, 4), torch.tensor([0, 1])),
            ValueError,
            "target",
        ),
        (lambda: entmax15_loss(torch.randn(4), torch.tensor([0])), ValueError, "X"),
        (
            lambda: entmax_bisect_loss(
                torch.randn(3, 4), torch.tensor([0, 1, 2]), math.nan
            ),
            ValueError,
            "alpha",
        ),
    ],
)
def test_loss_bad_inputs(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_newton_forward_for_attention_matches_the_package(dtype):
    """The Newton forward used by α-entmax attention (1 < α ≤ 2): values and gradients (to the
    scores and to α) equal the package's bisection, masked (-inf) entries and a dead row included."""
    from localbook.entmax_alpha import entmax_alpha_newton

    z = _z((4, 3, 6, 6)).to(dtype)
    z = z.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf) * 3
    alpha = (
        torch.tensor([1.01, 1.5, 2.0], dtype=dtype).view(1, 3, 1, 1).requires_grad_()
    )
    zg = z.clone().requires_grad_()
    g = _z((4, 3, 6, 6), seed=2).to(dtype)
    p = entmax_alpha_newton(zg, alpha)
    gz, ga = torch.autograd.grad((p * g).sum(), (zg, alpha))
    z64, a64 = z.double().requires_grad_(), alpha.detach().double().requires_grad_()
    q = ref.entmax_bisect(z64, a64.expand(4, 3, 6, 1), n_iter=200)
    gz_ref, ga_ref = torch.autograd.grad((q * g.double()).sum(), (z64, a64))
    eps = torch.finfo(
        dtype
    ).eps  # p = x^r with r ≤ 100: an ulp in τ moves p by ≤ 100 ulps
    torch.testing.assert_close(p.double(), q, rtol=0, atol=200 * eps)
    torch.testing.assert_close(
        gz.double(), gz_ref, rtol=0, atol=1e3 * eps * float(g.abs().max())
    )
    torch.testing.assert_close(
        ga.double(), ga_ref, rtol=0, atol=1e5 * eps * float(ga_ref.abs().max())
    )
    dead = entmax_alpha_newton(
        torch.full((2, 3), -math.inf, dtype=dtype), torch.tensor([[1.5]], dtype=dtype)
    )
    assert bool(torch.isnan(dead).all())
