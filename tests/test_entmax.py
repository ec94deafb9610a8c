"""Tests for localbook.entmax: values and gradients against the `entmax` package, exactness of the
certified partial sorts, simplex/exact-zero properties, extreme and masked inputs, bad inputs."""

import math

import entmax as ref
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import localbook as lb
from localbook.entmax import entmax15, entmax_bisect, sparsemax

ALPHAS = [1.1, 1.3, 1.5, 2.0, 3.0]
SHAPES_DIMS = [
    ((6, 11), -1),
    ((6, 11), 0),
    ((3, 7, 5), 1),
    ((2, 3, 9), -1),
    ((4, 1), -1),
    ((5,), 0),
]


def _ours(alpha):
    if alpha == 2.0:
        return lambda z, dim: sparsemax(z, dim=dim)
    if alpha == 1.5:
        return lambda z, dim: entmax15(z, dim=dim)
    return lambda z, dim: entmax_bisect(z, alpha, dim=dim)


def _theirs(alpha):
    if alpha == 2.0:
        return lambda z, dim: ref.sparsemax(z, dim=dim)
    if alpha == 1.5:
        return lambda z, dim: ref.entmax15(z, dim=dim)
    return lambda z, dim: ref.entmax_bisect(z, alpha, dim=dim, n_iter=100)


def _value_and_grad(f, z, g, dim):
    x = z.clone().requires_grad_(True)
    y = f(x, dim)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
def test_exact_maps_match_entmax_package(alpha, shape, dim, device):
    z = torch.randn(*shape, dtype=torch.float64, device=device) * 3
    g = torch.randn_like(z)
    p, gp = _value_and_grad(_ours(alpha), z, g, dim)
    q, gq = _value_and_grad(_theirs(alpha), z, g, dim)
    torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    torch.testing.assert_close(gp, gq, rtol=0, atol=1e-12)
    assert p.device == z.device and p.dtype == z.dtype


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS[:4])
def test_entmax_bisect_matches_entmax_package(alpha, shape, dim):
    z = torch.randn(*shape, dtype=torch.float64) * 2
    g = torch.randn_like(z)
    f = lambda x, d: entmax_bisect(x, alpha, dim=d)  # noqa: E731
    p, gp = _value_and_grad(f, z, g, dim)
    q, gq = _value_and_grad(
        lambda x, d: ref.entmax_bisect(x, alpha, dim=d, n_iter=100), z, g, dim
    )
    torch.testing.assert_close(p, q, rtol=0, atol=1e-10)
    torch.testing.assert_close(gp, gq, rtol=0, atol=1e-8)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_bisect_agrees_with_exact_maps(alpha):
    z = torch.randn(20, 40, dtype=torch.float64) * 4
    torch.testing.assert_close(
        entmax_bisect(z, alpha), _ours(alpha)(z, -1), rtol=0, atol=1e-12
    )


def test_long_rows_with_mixed_support_sizes_need_growing_k():
    # rows from nearly-uniform (support ~ n) to one-hot, constant rows, heavy masking: every branch of
    # the certified partial sort (first k, retries with larger k, full sort) is exercised
    z = (
        torch.randn(40, 700, dtype=torch.float64)
        * torch.logspace(-4, 2, 40, dtype=torch.float64)[:, None]
    )
    z[3] = 0.25
    z[5, :650] = -math.inf
    z[7, 1:] = -math.inf
    for alpha in [1.25, 1.5, 2.0, 3.0]:
        torch.testing.assert_close(
            _ours(alpha)(z, -1), _theirs(alpha)(z, -1), rtol=0, atol=1e-10
        )
    torch.testing.assert_close(
        sparsemax(z)[3], torch.full((700,), 1 / 700, dtype=torch.float64)
    )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 32),
    scale=st.sampled_from([1e-3, 0.1, 1.0, 10.0]),
    seed=st.integers(0, 2**16),
)
def test_short_rows_sorted_in_full_equal_the_partial_sort(n, scale, seed):
    # rows up to _SORT_IN_FULL entries skip the first-size sampling and sort in full: the
    # same sorted prefix, the same cumulative sums, so the same numbers to the last bit
    import localbook.entmax as em

    z = torch.randn(
        30, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    z = z * scale
    full = [sparsemax(z, dim=1), entmax15(z, dim=1)]
    saved = em._SORT_IN_FULL
    em._SORT_IN_FULL = 0  # the partial sorts of longer rows
    try:
        partial = [sparsemax(z, dim=1), entmax15(z, dim=1)]
    finally:
        em._SORT_IN_FULL = saved
    for a, b in zip(full, partial):
        assert torch.equal(a, b)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, 3.0])
def test_gradcheck(alpha):
    torch.manual_seed(3)
    z = (torch.randn(3, 6, 4, dtype=torch.float64) * 2).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: _ours(alpha)(x, 1), (z,))
    assert torch.autograd.gradcheck(lambda x: entmax_bisect(x, alpha, dim=-1), (z,))


def test_backward_formula_on_the_support():
    # ∂L/∂z = s ⊙ (g − sᵀg/Σs), s = p^{2−α} on the support: check against the dense Jacobian
    z = torch.randn(9, dtype=torch.float64) * 2
    g = torch.randn(9, dtype=torch.float64)
    for alpha in [1.3, 1.5, 2.0]:
        J = torch.autograd.functional.jacobian(lambda x: _ours(alpha)(x, -1), z)
        p = _ours(alpha)(z, -1)
        s = torch.where(p > 0, p ** (2 - alpha), torch.zeros_like(p))
        expected = torch.diag(s) - torch.outer(s, s) / s.sum()
        torch.testing.assert_close(J, expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(
            J.T @ g, s * (g - (s @ g) / s.sum()), rtol=0, atol=1e-10
        )


def test_sparsemax_is_the_euclidean_projection():
    # brute force over supports: the projection is [z - τ]_+ with the unique feasible τ
    z = torch.randn(7, dtype=torch.float64)
    best = None
    for mask in range(1, 2**7):
        S = torch.tensor([(mask >> i) & 1 for i in range(7)], dtype=torch.bool)
        tau = (z[S].sum() - 1) / S.sum()
        p = torch.where(S, z - tau, torch.zeros_like(z))
        if (p >= 0).all():
            dist = ((p - z) ** 2).sum()
            best = p if best is None or dist < ((best - z) ** 2).sum() else best
    torch.testing.assert_close(sparsemax(z), best, rtol=0, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 12)),
        elements=st.floats(-50, 50, allow_nan=False, allow_infinity=False),
    ),
    st.sampled_from(ALPHAS),
    st.sampled_from([0, 1, -1]),
)
def test_simplex_and_exact_zeros(z, alpha, dim):
    z = torch.as_tensor(z)
    p = _ours(alpha)(z, dim)
    assert (p >= 0).all()
    torch.testing.assert_close(
        p.sum(dim), torch.ones_like(p.sum(dim)), rtol=0, atol=1e-9
    )
    # threshold form: p_i = [(α-1) z_i - τ]_+^{1/(α-1)}, zeros exactly where (α-1) z_i ≤ τ,
    # and the order of the scores is kept
    zm = (alpha - 1) * (z - z.amax(dim, keepdim=True))
    on = p > 0
    tau = (zm - p ** (alpha - 1)).masked_fill(~on, math.inf).amin(dim, keepdim=True)
    assert ((zm <= tau + 1e-9) | on).all()
    assert not ((zm < tau - 1e-7) & on).any()
    big = z.argmax(dim, keepdim=True)
    assert (p.gather(dim, big) > 0).all()
    # the entmax package agrees on the same random input
    torch.testing.assert_close(p, _theirs(alpha)(z, dim), rtol=0, atol=1e-8)


@settings(max_examples=25, deadline=None)
@given(
    arrays(np.float64, st.integers(2, 10), elements=st.floats(-5, 5)),
    st.floats(-1e6, 1e6),
)
def test_shift_invariance(z, c):
    z = torch.as_tensor(z)
    for f in (sparsemax, entmax15):
        torch.testing.assert_close(f(z + c), f(z), rtol=0, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, 3.0])
def test_huge_logits(dtype, alpha, device):
    z = torch.randn(5, 8, dtype=dtype, device=device)
    f = _ours(alpha)
    for big in (z * 1e30, z + 1e30 * torch.sign(z[:, :1]), z * 1e-30):
        p = f(big, -1)
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=dtype, device=device))
    onehot = torch.nn.functional.one_hot(z.argmax(-1), 8).to(dtype)
    torch.testing.assert_close(f(z * 1e30, -1), onehot)
    torch.testing.assert_close(
        f(z * 1e-30, -1), torch.full_like(z, 1 / 8), rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, 3.0])
def test_masked_entries(alpha, device):
    z = torch.randn(6, 10, dtype=torch.float64, device=device)
    mask = torch.rand(6, 10, device=device) < 0.5
    mask[:, 0] = False  # at least one live entry per row
    zm = z.masked_fill(mask, -math.inf).requires_grad_(True)
    p = _ours(alpha)(zm, -1)
    assert (p[mask] == 0).all()
    # equal to the map over the live entries only
    for i in range(2):
        live = ~mask[i]
        torch.testing.assert_close(
            p[i, live], _ours(alpha)(z[i, live], -1), rtol=0, atol=1e-10
        )
    p.backward(torch.randn_like(p))
    assert torch.isfinite(zm.grad).all() and (zm.grad[mask] == 0).all()
    torch.testing.assert_close(
        p.detach().cpu(), _theirs(alpha)(zm.detach().cpu(), -1), rtol=0, atol=1e-10
    )


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0])
def test_all_masked_row_gives_nan_and_zero_gradient(alpha):
    z = torch.randn(3, 5, dtype=torch.float64)
    z[1] = -math.inf
    x = z.clone().requires_grad_(True)
    p = _ours(alpha)(x, -1)
    assert torch.isnan(p[1]).all()
    torch.testing.assert_close(p[[0, 2]], _ours(alpha)(z[[0, 2]], -1))
    (p.nan_to_num(0) * torch.randn_like(p)).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[1] == 0).all()


def test_single_entry_and_array_likes():
    assert sparsemax(torch.tensor([3.0])).item() == 1.0
    out = entmax15([[1, 2], [3, 4]])
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out[0], out[1])
    assert (
        lb.sparsemax is sparsemax
        and lb.entmax15 is entmax15
        and lb.entmax_bisect is entmax_bisect
    )


@pytest.mark.parametrize("alpha", [math.inf, -math.inf, math.nan])
@pytest.mark.faults
def test_non_finite_alpha_rejected(alpha):
    with pytest.raises(ValueError, match="alpha"):
        entmax_bisect(torch.randn(3, 4), alpha)


@pytest.mark.parametrize(
    "call,exc,word",
    [
        (lambda: entmax_bisect(torch.randn(3), "1.5"), TypeError, "alpha"),
        (
            lambda: entmax_bisect(torch.randn(3, 4), torch.full((3, 4), 1.5)),
            ValueError,
            "alpha",
        ),
        (
            lambda: entmax_bisect(
                torch.randn(3, 4), torch.tensor([[1.5], [1.0], [2.0]])
            ),
            ValueError,
            "alpha",
        ),
        (lambda: entmax_bisect(torch.randn(3), 1.5, n_iter=0), ValueError, "n_iter"),
        (lambda: entmax_bisect(torch.randn(3), 1.5, n_iter=2.5), TypeError, "n_iter"),
        (lambda: sparsemax(torch.randn(3, 4), dim=2), ValueError, "dim"),
        (lambda: entmax15(torch.randn(3, 4), dim=-3), ValueError, "dim"),
        (lambda: sparsemax(torch.tensor(1.0)), ValueError, "z"),
        (lambda: sparsemax(torch.zeros(3, 0)), ValueError, "z"),
        (lambda: sparsemax(torch.tensor([1.0, math.nan])), ValueError, "NaN"),
        (lambda: entmax15(torch.tensor([1.0, math.inf])), ValueError, r"\+inf"),
        (lambda: sparsemax("abc"), TypeError, "z"),
        (lambda: entmax15(torch.randn(2, 2, dtype=torch.complex64)), TypeError, "z"),
    ],
)
def test_bad_inputs(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


# --- issue 27: validation of the Tsallis entropy, the losses' targets and alpha --------------
@pytest.mark.faults
def test_tsallis_entropy_rejects_what_is_not_a_probability_vector():
    p = torch.softmax(torch.randn(4, 6, dtype=torch.float64), -1)
    ref_h = lb.tsallis_entropy(p, 1.5)
    n, eps = p.shape[1], torch.finfo(torch.float64).eps
    # sums within 2·n·eps of 1 pass (rounding), beyond that they are refused, naming p
    torch.testing.assert_close(lb.tsallis_entropy(p * (1 + 0.5 * n * eps), 1.5), ref_h)
    with pytest.raises(ValueError, match=r"\bp\b must be probabilities.*differ from 1"):
        lb.tsallis_entropy(p * (1 + 4 * n * eps), 1.5)
    with pytest.raises(ValueError, match=r"\bp\b must be probabilities.*differ from 1"):
        lb.tsallis_entropy(p * 2, 1.5)
    q = p.clone()
    q[0, :2] = torch.tensor([-0.1, q[0, 0] + q[0, 1] + 0.1])
    with pytest.raises(
        ValueError, match=r"\bp\b must be probabilities: it has negative"
    ):
        lb.tsallis_entropy(q, 1.5)
    # the tolerance scales with the dtype's eps: float32 rounding of p is accepted
    assert torch.allclose(lb.tsallis_entropy(p.float(), 1.5).double(), ref_h, atol=1e-6)
    for bad in (math.nan, 0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match=r"alpha must be positive and finite"):
            lb.tsallis_entropy(p, bad)
    with pytest.raises(ValueError, match=r"alpha must be positive and finite"):
        lb.tsallis_entropy(p, torch.tensor([[1.5], [0.0], [2.0], [1.2]], dtype=p.dtype))
    with pytest.raises(TypeError, match="alpha"):
        lb.tsallis_entropy(p, "1.5")
    with pytest.raises(ValueError, match=r"\bp\b contains 1 NaN"):
        lb.tsallis_entropy(torch.tensor([0.5, math.nan]), 1.5)


def test_tsallis_entropy_still_differentiates_in_alpha():
    p = torch.softmax(torch.randn(3, 5, dtype=torch.float64), -1)
    a = torch.full((3, 1), 1.5, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a: lb.tsallis_entropy(p, a), (a,))


@pytest.mark.parametrize(
    "loss", [lb.sparsemax_loss, lb.entmax15_loss, lb.entmax_bisect_loss]
)
@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.int16, torch.int8, torch.uint8, np.int32, list]
)
@pytest.mark.faults
def test_losses_accept_any_integer_targets(loss, dtype):
    X = torch.randn(5, 4, dtype=torch.float64)
    target = torch.tensor([0, 3, 1, 2, 3])
    ref_loss = loss(X, target)
    if dtype is list:
        t = target.tolist()
    elif isinstance(dtype, torch.dtype):
        t = target.to(dtype)
    else:
        t = target.numpy().astype(dtype)
    torch.testing.assert_close(loss(X, t), ref_loss, rtol=0, atol=0)
    # the range is checked before the cast: uint8 255 or int8 -1 is not folded into range
    with pytest.raises(
        ValueError, match=r"target holds class indices outside \[0, 3\]"
    ):
        loss(X, torch.tensor([0, 1, 2, 3, 255], dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"target holds class indices outside"):
        loss(X, torch.tensor([0, 1, 2, 3, -1], dtype=torch.int8))
    with pytest.raises(TypeError, match="target must be an array of integer"):
        loss(X, target.double())
    with pytest.raises(TypeError, match="target must be an array of integer"):
        loss(X, target > 1)


@pytest.mark.faults
def test_entmax_bisect_refuses_alpha_zero_and_keeps_negative_alpha():
    # α = 0: the Tsallis entropy is undefined; α < 0 is a dense map (a strictly concave
    # entropy, chapter 8), the maximizer of p·z + H_α(p): positive, summing to one
    z = torch.randn(3, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="alpha must be finite and nonzero"):
        entmax_bisect(z, 0.0)
    with pytest.raises(ValueError, match="alpha must be finite and nonzero"):
        entmax_bisect(z, torch.tensor([[1.5], [0.0], [2.0]], dtype=z.dtype))
    p = entmax_bisect(z, -1.0, n_iter=100)
    assert bool((p > 0).all())
    torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=z.dtype))
    # the loss needs the Tsallis entropy itself, defined here for α > 0
    for alpha in (0.0, -1.0, -0.5):
        with pytest.raises(ValueError, match="alpha must be positive"):
            lb.entmax_bisect_loss(z, torch.tensor([0, 1, 2]), alpha)
