"""Tests of localbook.memorization: leave-one-out stability and feature alignment against brute-force
refits, the min-norm interpolator against gradient descent and numpy's pseudo-inverse, Hermite
polynomials against numpy.polynomial.hermite_e, feature maps against autograd, bad inputs."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import localbook as lb
import localbook as M  # memorization, features and datasets: every name is top-level


def _problem(N=10, p=30, m=4, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    Phi = torch.randn(N, p, generator=g, dtype=torch.float64)
    G = torch.randn(N, generator=g, dtype=torch.float64)
    Q = torch.randn(m, p, generator=g, dtype=torch.float64)
    th0 = torch.randn(p, generator=g, dtype=torch.float64)
    return Phi.to(device), G.to(device), Q.to(device), th0.to(device)


def _refit(Phi, G, i, th0=None):
    keep = [j for j in range(Phi.shape[0]) if j != i]
    return M.min_norm_fit(Phi[keep], G[keep], th0)


def _refit_pinv(Phi, G, i, th0):
    """Brute-force refit with numpy's pseudo-inverse (independent of localbook's solver)."""
    P, g, t = (a.cpu().numpy() for a in (Phi, G, th0))
    keep = [j for j in range(P.shape[0]) if j != i]
    return t + np.linalg.pinv(P[keep]) @ (g[keep] - P[keep] @ t)


@pytest.mark.parametrize("i", [0, 3, 9, -1])
def test_stability_equals_brute_force_refit(i, device):
    Phi, G, Q, th0 = _problem(device=device)
    theta = M.min_norm_fit(Phi, G, th0)
    theta_i = torch.as_tensor(_refit_pinv(Phi, G, i % 10, th0), device=device)
    brute = Q @ theta - Q @ theta_i
    torch.testing.assert_close(M.stability(Phi, G, i, Q, th0), brute, rtol=0, atol=1e-8)
    # all i at once: column i is the same
    torch.testing.assert_close(
        M.stability(Phi, G, None, Q, th0)[:, i], brute, rtol=0, atol=1e-8
    )
    assert M.stability(Phi, G, i, Q[0], th0).shape == ()


def test_stability_all_i_every_column_matches_refits():
    Phi, G, Q, _ = _problem(N=8, p=25, m=3, seed=1)
    S = M.stability(Phi, G, None, Q)
    assert S.shape == (3, 8)
    theta = M.min_norm_fit(Phi, G)
    for i in range(8):
        torch.testing.assert_close(
            S[:, i], Q @ (theta - _refit(Phi, G, i)), rtol=0, atol=1e-10
        )


def test_alignment_uses_orthogonal_complement_projector(device):
    """F(z, z_i) = φ(z)ᵀ P⊥ φ(z_i) / ‖P⊥ φ(z_i)‖², P⊥ onto the complement of the others' span."""
    Phi, G, Q, _ = _problem(device=device)
    for i in [0, 4, 9]:
        keep = [j for j in range(10) if j != i]
        Pm = Phi[keep]
        P = Pm.T @ torch.linalg.solve(Pm @ Pm.T, Pm)
        Pperp = torch.eye(Phi.shape[1], dtype=Phi.dtype, device=device) - P
        u = Pperp @ Phi[i]
        torch.testing.assert_close(
            M.feature_alignment(Phi, i, Q), Q @ u / (u @ u), rtol=0, atol=1e-10
        )
        # the lemma S(z) = F(z, z_i) S(z_i), against a refit
        brute = Q @ (M.min_norm_fit(Phi, G) - _refit(Phi, G, i))
        s_self = Phi[i] @ (M.min_norm_fit(Phi, G) - _refit(Phi, G, i))
        torch.testing.assert_close(
            M.feature_alignment(Phi, i, Q) * s_self, brute, rtol=0, atol=1e-8
        )
        # the projector onto the span itself would be wrong
        assert (
            Q @ (P @ Phi[i]) / (Phi[i] @ P @ Phi[i]) * s_self - brute
        ).abs().max() > 1e-3


def test_alignment_with_itself_is_one():
    Phi, _, _, _ = _problem(N=12, p=40, seed=2)
    F = M.feature_alignment(Phi, None, Phi)
    torch.testing.assert_close(
        torch.diagonal(F), torch.ones(12, dtype=torch.float64), rtol=0, atol=1e-10
    )
    # and F(z_j, z_i) = 0 for the other training samples: removing z_i does not move them
    off = F - torch.diag(torch.diagonal(F))
    assert off.abs().max() < 1e-9
    assert float(M.feature_alignment(Phi, 5, Phi[5])) == pytest.approx(1.0, abs=1e-12)


def test_min_norm_fit_interpolates_and_is_gradient_descent_limit():
    Phi, G, _, th0 = _problem(N=6, p=15, seed=3)
    theta = M.min_norm_fit(Phi, G, th0)
    torch.testing.assert_close(Phi @ theta, G, rtol=0, atol=1e-10)
    ref = th0.numpy() + np.linalg.pinv(Phi.numpy()) @ (
        G.numpy() - Phi.numpy() @ th0.numpy()
    )
    np.testing.assert_allclose(theta.numpy(), ref, atol=1e-10)
    # gradient descent on ½‖Φθ − G‖² from θ₀ with step 1/λ_max
    lam = torch.linalg.eigvalsh(Phi @ Phi.T)
    eta = 1.0 / float(lam.max())
    t = th0.clone()
    for _ in range(int(60 * lam.max() / lam.min()) + 200):
        t = t - eta * Phi.T @ (Phi @ t - G)
    torch.testing.assert_close(t, theta, rtol=0, atol=1e-8)


def test_min_norm_fit_several_outputs_and_default_theta0():
    Phi, _, _, _ = _problem(N=5, p=12, seed=4)
    G = torch.randn(5, 3, dtype=torch.float64)
    theta = M.min_norm_fit(Phi, G)
    assert theta.shape == (12, 3)
    np.testing.assert_allclose(
        theta.numpy(), np.linalg.pinv(Phi.numpy()) @ G.numpy(), atol=1e-10
    )


@settings(max_examples=25, deadline=None)
@given(
    N=st.integers(1, 7),
    extra=st.integers(1, 12),
    m=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
def test_stability_property(N, extra, m, seed):
    Phi, G, Q, th0 = _problem(N=N, p=N + extra + 2, m=m, seed=seed)
    S = M.stability(Phi, G, None, Q, th0)
    theta = M.min_norm_fit(Phi, G, th0)
    for i in range(N):
        ref = Q.numpy() @ (theta.numpy() - _refit_pinv(Phi, G, i, th0))
        np.testing.assert_allclose(
            S[:, i].numpy(), ref, atol=1e-7 * (1 + np.abs(ref).max())
        )


def test_integer_and_float32_inputs():
    Phi = torch.randint(-3, 4, (4, 9))
    while torch.linalg.matrix_rank(Phi.double()) < 4:
        Phi = torch.randint(-3, 4, (4, 9))
    S = M.stability(Phi, [1, 2, 3, 4], 0, Phi[0])
    assert S.dtype == torch.get_default_dtype()
    F = M.feature_alignment(Phi.float(), 1, Phi[1].float())
    assert F.dtype == torch.float32 and abs(float(F) - 1) < 1e-4


# ---------------------------------------------------------------- Hermite polynomials -------


def test_hermite_matches_numpy_hermite_e():
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    for k in range(8):
        c = np.zeros(k + 1)
        c[k] = 1
        np.testing.assert_allclose(
            M.hermite(k, x).numpy(),
            np.polynomial.hermite_e.hermeval(x.numpy(), c),
            atol=1e-10,
        )
    torch.testing.assert_close(M.hermite(3, x), x**3 - 3 * x)


def test_hermite_orthonormal_under_gaussian():
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    x = torch.as_tensor(nodes)
    w = torch.as_tensor(weights / math.sqrt(2 * math.pi))
    H = torch.stack([M.hermite(k, x, normalized=True) for k in range(10)])
    gram = (H * w) @ H.T
    torch.testing.assert_close(
        gram, torch.eye(10, dtype=torch.float64), rtol=0, atol=1e-10
    )
    # unnormalized: E[He_k²] = k!
    assert float((w * M.hermite(5, x) ** 2).sum()) == pytest.approx(120.0, rel=1e-10)


def test_hermite_coefficients_of_known_activations():
    mu = M.hermite_coefficients("h1+h4", degree=6)
    torch.testing.assert_close(
        mu, torch.tensor([0, 1, 0, 0, 1, 0, 0], dtype=torch.float64), rtol=0, atol=1e-10
    )
    # x² = He_2 + 1 = √2 h_2 + h_0
    mu = M.hermite_coefficients(lambda x: x**2, degree=4)
    torch.testing.assert_close(
        mu,
        torch.tensor([1, 0, math.sqrt(2), 0, 0], dtype=torch.float64),
        rtol=0,
        atol=1e-10,
    )
    # ReLU: μ0 = 1/√(2π), μ1 = 1/2, μ_k = He_{k−2}(0)/√(2π k!) for k ≥ 2 (odd k ≥ 3 vanish)
    mu = M.hermite_coefficients(
        "relu", degree=6, n_nodes=200
    )  # closed forms, not quadrature
    s = 1 / math.sqrt(2 * math.pi)
    ref = [s, 0.5, s / math.sqrt(2), 0, -s / math.sqrt(24), 0, 3 * s / math.sqrt(720)]
    np.testing.assert_allclose(mu.numpy(), ref, rtol=1e-14, atol=1e-16)
    # Gauss–Hermite quadrature of the kink converges only like 1/n_nodes
    gh = M.hermite_coefficients(lambda x: torch.relu(x), degree=6, n_nodes=200)
    np.testing.assert_allclose(gh.numpy(), ref, atol=1.5e-3)
    assert np.abs(gh.numpy() - ref).max() > 1e-5
    # tanh is odd: its even coefficients vanish
    mu = M.hermite_coefficients("tanh", degree=6)
    assert mu[::2].abs().max() < 1e-12 and mu[1] > 0.5


def test_activation_derivatives_and_antiderivative():
    x = torch.linspace(-2.5, 2.5, 11, dtype=torch.float64, requires_grad=True)
    for name in ["h1+h2", "h0+h3", "h1+h4", "tanh", "relu"]:
        a = M.get_activation(name)
        (auto,) = torch.autograd.grad(a(x).sum(), x)
        torch.testing.assert_close(a.grad(x.detach()), auto)
    a = M.get_activation("h0+h1")
    b = a.antiderivative()
    torch.testing.assert_close(b.derivative()(x.detach()), a(x.detach()))
    assert b.coefficients == pytest.approx((0, 1, 1 / math.sqrt(2)))
    assert M.get_activation("h0+h3").antiderivative().coefficients == pytest.approx(
        (0, 1, 0, 0, 0.5)
    )


# ---------------------------------------------------------------- feature maps ---------------


def test_ntk_features_are_the_first_layer_jacobian():
    g = torch.Generator().manual_seed(0)
    d, k = 5, 7
    Z = torch.randn(4, d, generator=g, dtype=torch.float64)
    W = M.gaussian_weights(k, d, g, dtype=torch.float64)
    act = M.get_activation("tanh")
    F = M.ntk_features(Z, W, act)
    assert F.shape == (4, d * k)

    def net(Wf, z):
        return torch.tanh(Wf @ z).sum() / math.sqrt(d * k)

    J = torch.stack(
        [
            torch.autograd.functional.jacobian(lambda Wf: net(Wf, z), W).reshape(-1)
            for z in Z
        ]
    )
    torch.testing.assert_close(F @ F.T, J @ J.T)
    torch.testing.assert_close(M.ntk_kernel(Z, Z[:2], W, act), F @ F[:2].T)


def test_random_features_kernel_tends_to_mehler(device):
    g = torch.Generator().manual_seed(1)
    d, k = 30, 200_000
    Z = torch.randn(3, d, generator=g, dtype=torch.float64)
    Z = Z * math.sqrt(d) / Z.norm(dim=1, keepdim=True)
    W = M.gaussian_weights(k, d, g, dtype=torch.float64)
    F = M.random_features(Z.to(device), W.to(device), "h1+h2")
    rho = (Z @ Z.T / d).to(device)
    torch.testing.assert_close(
        F @ F.T, rho + rho**2, rtol=0, atol=0.08
    )  # Monte Carlo error ≈ 0.01


def _h(n, x):
    c = np.zeros(n + 1)
    c[n] = 1
    return np.polynomial.hermite_e.hermeval(x, c) / math.sqrt(math.factorial(n))


def test_relu_hermite_coefficients_against_adaptive_quadrature():
    """The closed forms against scipy's quad on [0, ∞), where the integrand is smooth."""
    from scipy.integrate import quad

    mu = M.relu_hermite_coefficients(14)
    step = M.relu_hermite_coefficients(14, derivative=True)
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    for n in range(15):
        val, err = quad(
            lambda x: x * _h(n, x) * pdf(x), 0, np.inf, epsabs=1e-13, epsrel=1e-13
        )
        assert abs(float(mu[n]) - val) <= 2 * err + 1e-14, n
        val, err = quad(
            lambda x: _h(n, x) * pdf(x), 0, np.inf, epsabs=1e-13, epsrel=1e-13
        )
        assert abs(float(step[n]) - val) <= 2 * err + 1e-14, n
    # σ = relu ⇒ σ' = step: h_n' = √n h_{n−1} gives μ'_{n−1} = √n μ_n
    n = torch.arange(1, 15, dtype=torch.float64)
    torch.testing.assert_close(step[:-1], n.sqrt() * mu[1:], rtol=1e-13, atol=1e-16)
    # large degrees stay finite (log-space factorials)
    big = M.relu_hermite_coefficients(400)
    assert torch.isfinite(big).all() and float(big[400].abs()) < 1e-3


def test_relu_dual_kernels():
    relu = M.get_activation("relu")
    step = relu.derivative()
    assert step.dual is not None and relu.dual is not None
    rho = torch.linspace(-0.8, 0.8, 9, dtype=torch.float64)
    # dual = Σ μ_l² ρ^l; the tail beyond degree 300 is below 0.8^300
    for act in (relu, step):
        mu = M.hermite_coefficients(act, 300)
        series = (mu**2 * rho[:, None] ** torch.arange(301, dtype=torch.float64)).sum(1)
        torch.testing.assert_close(act.dual(rho), series, rtol=0, atol=1e-12)
    # E[relu²] = 1/2 and P(u > 0) = 1/2 at ρ = 1
    one = torch.tensor(1.0, dtype=torch.float64)
    assert float(relu.dual(one)) == pytest.approx(0.5, abs=1e-15)
    assert float(step.dual(one)) == pytest.approx(0.5, abs=1e-15)
    # Monte Carlo oracle: E[relu(u) relu(v)] with corr(u, v) = ρ, error 4 standard errors
    g = torch.Generator().manual_seed(0)
    u, e = torch.randn(2, 400_000, generator=g, dtype=torch.float64)
    for r in (-0.5, 0.3, 0.9):
        v = r * u + math.sqrt(1 - r * r) * e
        prod = torch.relu(u) * torch.relu(v)
        se = float(prod.std()) / math.sqrt(len(u))
        assert abs(float(prod.mean()) - float(relu.dual(torch.tensor(r)))) < 4 * se


def test_alignment_limit_relu_is_exact():
    # NTK with σ' = step at α = 1/2: 4α(κ0(α) − 1/4) with κ0(1/2) = (π − π/3)/2π = 1/3
    assert M.alignment_limit("relu", 0.5, model="ntk") == pytest.approx(
        1 / 6, abs=1e-14
    )
    # RF: against the Hermite series with 400 exact coefficients (tail < 0.5^400)
    mu = M.relu_hermite_coefficients(400)
    for a in (0.25, 0.5, 0.75):
        l = torch.arange(2, 401, dtype=torch.float64)
        series = float((mu[2:] ** 2 * a**l).sum() / (0.25 - 1 / (2 * math.pi)))
        assert M.alignment_limit("relu", a) == pytest.approx(series, abs=1e-12)
    # the old truncated quadrature (degree 30) was visibly off for the step function
    trunc = M.alignment_limit(
        M.Activation("relu*", torch.relu, lambda x: (x > 0).double()), 0.5, model="ntk"
    )
    assert abs(trunc - 1 / 6) > 1e-2


def test_alignment_profile_and_finite_d():
    ntk4 = M.get_activation("h0+h3").antiderivative()
    rho = torch.linspace(-1, 1, 7, dtype=torch.float64)
    torch.testing.assert_close(M.alignment_profile("h1+h4", rho), rho**4)
    torch.testing.assert_close(M.alignment_profile(ntk4, rho, model="ntk"), rho**4)
    torch.testing.assert_close(M.alignment_profile("h1+h2", rho), rho**2)
    assert M.alignment_profile("h1+h2", 0.5) == M.alignment_limit("h1+h2", 0.5)
    # exact moments of ρ = α + (d_x/d) c on the sphere
    for d in (7, 30, 64):
        dx = d - min(max(1, round(0.5 * d)), d - 1)
        a = (d - dx) / d
        e4 = a**4 + 6 * a**2 * dx / d**2 + 3 * dx**3 / ((dx + 2) * d**4)
        assert M.finite_d_alignment("h1+h4", d, 0.5) == pytest.approx(e4, rel=1e-12)
        assert M.finite_d_alignment(ntk4, d, 0.5, model="ntk") == pytest.approx(
            e4, rel=1e-12
        )
        assert M.finite_d_alignment("h1+h2", d, 0.5) == pytest.approx(
            a * a + dx / d**2, rel=1e-12
        )
    # d_x = 1: c = ±1
    assert M.finite_d_alignment("h1+h2", 4, 0.75) == pytest.approx(
        (0.75 - 0.25) ** 2 / 2 + 1 / 2
    )
    # Monte Carlo oracle for ReLU with the data generator's own counterparts
    g = torch.Generator().manual_seed(3)
    Z, _, Zs = M.spurious_gaussian_data(
        20_000, 20, 0.5, g, counterpart="resample", dtype=torch.float64
    )
    vals = M.alignment_profile("relu", (Z * Zs).sum(1) / 20)
    se = float(vals.std()) / math.sqrt(len(vals))
    assert abs(float(vals.mean()) - M.finite_d_alignment("relu", 20, 0.5)) < 4 * se
    # larger than the paper's γ (Jensen), and tending to it as d grows
    gaps = [
        M.finite_d_alignment("relu", d, 0.5) - M.alignment_limit("relu", 0.5)
        for d in (16, 64, 256)
    ]
    assert gaps[0] > gaps[1] > gaps[2] > 0
    with pytest.raises(ValueError, match="rho"):
        M.alignment_profile("relu", 1.5)
    with pytest.raises(ValueError, match="alpha"):
        M.finite_d_alignment("relu", 10, 1.0)


def _sphere_moment_oracle(coeffs, d, alpha, model):
    """E[γ(ρ)] from the exact moments of ρ = a + b c, E[c^{2m}] = Π_{i<m} (2i+1)/(d_x+2i)."""
    dy = min(max(1, round(alpha * d)), d - 1)
    dx = d - dy
    a, b = dy / d, dx / d

    def e_rho(l):
        tot = 0.0
        for j in range(0, l + 1, 2):
            ec = math.prod((2 * i + 1) / (dx + 2 * i) for i in range(j // 2))
            tot += math.comb(l, j) * a ** (l - j) * b**j * ec
        return tot

    if model == "rf":
        terms = [(c * c, l) for l, c in enumerate(coeffs) if l >= 2]
    else:  # σ' has coefficients √l c_l at degree l − 1; weight ρ^{(l−1)+1}
        terms = [(l * c * c, l) for l, c in enumerate(coeffs) if l - 1 >= 1]
    den = sum(w for w, _ in terms)
    return sum(w * e_rho(l) for w, l in terms) / den


@settings(max_examples=40, deadline=None)
@given(
    coeffs=st.lists(st.floats(-2, 2), min_size=3, max_size=7),
    d=st.integers(3, 90),
    alpha=st.sampled_from([0.2, 0.25, 0.5, 0.75]),
    model=st.sampled_from(["rf", "ntk"]),
)
def test_finite_d_alignment_matches_sphere_moments(coeffs, d, alpha, model):
    # both need energy at σ-degree ≥ 2 (for NTK: σ'-degree ≥ 1)
    if sum(c * c for c in coeffs[2:]) < 1e-3:
        return
    act = M.hermite_activation(coeffs)
    got = M.finite_d_alignment(act, d, alpha, model=model)
    ref = _sphere_moment_oracle(coeffs, d, alpha, model)
    assert got == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_alignment_limit_closed_forms():
    assert M.alignment_limit("h1+h2", 0.5) == pytest.approx(0.25)
    assert M.alignment_limit("h1+h4", 0.5) == pytest.approx(0.0625)
    ntk = M.get_activation("h0+h3").antiderivative()  # σ' = h0 + h3
    assert M.alignment_limit(ntk, 0.5, model="ntk") == pytest.approx(0.5**4)
    vals = M.alignment_limit("h1+h2", [0.25, 0.5])
    torch.testing.assert_close(vals, torch.tensor([0.0625, 0.25], dtype=torch.float64))


# ---------------------------------------------------------------- data and experiments -------


def test_spurious_gaussian_data():
    g = torch.Generator().manual_seed(0)
    Z, lab, Zs = M.spurious_gaussian_data(
        50, 20, 0.25, g, counterpart="zero", dtype=torch.float64
    )
    assert Z.shape == Zs.shape == (50, 20) and lab.shape == (50,)
    torch.testing.assert_close(
        Z.norm(dim=1), torch.full((50,), math.sqrt(20.0), dtype=torch.float64)
    )
    dx = 15
    assert Zs[:, :dx].abs().max() == 0 and torch.equal(Zs[:, dx:], Z[:, dx:])
    assert torch.equal(lab, torch.where(Z[:, :dx].sum(1) >= 0, 1.0, -1.0).double())
    _, _, Zr = M.spurious_gaussian_data(
        5, 20, 0.25, torch.Generator().manual_seed(0), counterpart="resample"
    )
    torch.testing.assert_close(Zr.norm(dim=1), torch.full((5,), math.sqrt(20.0)))


def test_spurious_counterparts_resample_is_default_and_same_data():
    # Z and g do not depend on the counterpart; the default resamples the core, with the
    # core's norm √d_x, the spurious part unchanged, and a core independent of x
    Zr, gr, Sr = M.spurious_gaussian_data(
        4000, 40, 0.5, torch.Generator().manual_seed(3), dtype=torch.float64
    )
    Zz, gz, Sz = M.spurious_gaussian_data(
        4000, 40, 0.5, torch.Generator().manual_seed(3), "zero", dtype=torch.float64
    )
    assert torch.equal(Zr, Zz) and torch.equal(gr, gz)
    dx = 20
    assert torch.equal(Sr[:, dx:], Zr[:, dx:]) and torch.equal(Sz[:, dx:], Zz[:, dx:])
    torch.testing.assert_close(
        Sr[:, :dx].norm(dim=1), torch.full((4000,), math.sqrt(dx), dtype=torch.float64)
    )
    assert Sz[:, :dx].abs().max() == 0
    torch.testing.assert_close(
        Sz.norm(dim=1), torch.full((4000,), math.sqrt(20.0), dtype=torch.float64)
    )
    # independence: the cosine of x and x~ has mean 0 and E[c²] = 1/d_x (3 s.e. margin)
    c = (Zr[:, :dx] * Sr[:, :dx]).sum(1) / dx
    assert abs(float(c.mean())) < 3 * float(c.std()) / math.sqrt(4000)
    c2 = c**2
    assert abs(float(c2.mean()) - 1 / dx) < 3 * float(c2.std()) / math.sqrt(4000)
    with pytest.raises(ValueError, match="counterpart"):
        M.spurious_gaussian_data(5, 10, 0.5, counterpart="zeros")


def test_noise_border_and_split():
    img = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4) + 1
    out = M.add_noise_border(img, 2, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 7, 8)
    core, spur = M.spurious_split(out, 2)
    torch.testing.assert_close(core + spur, out)
    torch.testing.assert_close(core[:, 2:5, 2:6], img)
    assert spur[:, 2:5, 2:6].abs().max() == 0 and core[:, :2].abs().max() == 0


def test_memorization_curve_shapes_and_reproducibility():
    kw = dict(
        model="rf",
        activation="h1+h2",
        alpha=[0.3, 0.6],
        d=20,
        k=300,
        n_test=50,
        seeds=[0, 1],
    )
    c = M.memorization_curve([10, 40], **kw)
    assert c.test_accuracy.shape == c.spurious_accuracy.shape == (2, 2, 2)
    assert bool(((c.test_accuracy >= 0) & (c.test_accuracy <= 1)).all())
    c2 = M.memorization_curve([10, 40], **kw)
    assert torch.equal(c.spurious_accuracy, c2.spurious_accuracy)
    mean, std = c.summary("test")
    assert mean.shape == std.shape == (2, 2)
    assert c.counterpart == "resample" and c.spurious_accuracy_zero.shape == (2, 2, 2)
    # the zeroed counterpart of the same fit equals a run with counterpart="zero"
    z = M.memorization_curve([10, 40], counterpart="zero", **kw)
    assert torch.equal(z.test_accuracy, c.test_accuracy)
    assert torch.equal(z.spurious_accuracy, z.spurious_accuracy_zero)
    torch.testing.assert_close(
        z.spurious_accuracy, c.spurious_accuracy_zero, rtol=0, atol=0
    )
    assert c.summary("spurious_zero")[0].shape == (2, 2)
    n = M.memorization_curve(
        [30],
        model="ntk",
        activation=M.get_activation("h0+h1").antiderivative(),
        alpha=0.5,
        d=10,
        k=10,
        n_test=20,
        seeds=[0],
    )
    assert n.test_accuracy.shape == (1, 1, 1)


def test_exported():
    for name in [
        "min_norm_fit",
        "stability",
        "feature_alignment",
        "hermite",
        "random_features",
        "ntk_features",
        "relu_hermite_coefficients",
        "alignment_profile",
        "finite_d_alignment",
    ]:
        assert getattr(lb, name) is getattr(M, name)


# ---------------------------------------------------------------- bad inputs -----------------


def test_bad_inputs():
    Phi, G, Q, _ = _problem(N=5, p=8)
    with pytest.raises(ValueError, match=r"\bi\b.*between"):
        M.stability(Phi, G, 5, Q)
    with pytest.raises(ValueError, match=r"\bi\b"):
        M.feature_alignment(Phi, -6, Q)
    with pytest.raises(TypeError, match=r"\bi\b"):
        M.feature_alignment(Phi, 1.5, Q)
    with pytest.raises(ValueError, match=r"Phi.*N = 9.*p = 8.*interpolation fails"):
        M.min_norm_fit(
            torch.randn(9, 8, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
        )
    with pytest.raises(ValueError, match="N > p"):
        M.stability(
            torch.randn(9, 8, dtype=torch.float64), torch.randn(9), 0, torch.randn(8)
        )
    dup = torch.cat([Phi, Phi[:1]])
    with pytest.raises(ValueError, match="linearly dependent"):
        M.min_norm_fit(dup, torch.randn(6, dtype=torch.float64))
    # rank-deficient features that may survive rounding in the Cholesky factorization
    g = torch.Generator().manual_seed(0)
    Z, lab, _ = M.spurious_gaussian_data(40, 6, 0.5, g, dtype=torch.float64)
    P2 = M.random_features(
        Z, M.gaussian_weights(500, 6, g, dtype=torch.float64), "h1+h2"
    )
    r = int(torch.linalg.matrix_rank(P2))
    M.min_norm_fit(P2[:r], lab[:r])
    with pytest.raises(ValueError, match="linearly dependent"):
        M.min_norm_fit(P2[: r + 1], lab[: r + 1])
    with pytest.raises(ValueError, match="phi_z"):
        M.stability(Phi, G, 0, torch.randn(3, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="G"):
        M.stability(Phi, G[:4], 0, Q)
    with pytest.raises(ValueError, match="theta0"):
        M.min_norm_fit(Phi, G, torch.zeros(3))
    with pytest.raises(ValueError, match="Phi.*NaN"):
        M.min_norm_fit(torch.full((2, 3), float("nan")), [1.0, 2.0])
    with pytest.raises(ValueError, match="activation"):
        M.get_activation("sigmoid")
    with pytest.raises(TypeError, match="activation"):
        M.get_activation(3)
    with pytest.raises(ValueError, match="n_nodes"):
        M.hermite_coefficients("relu", 4, n_nodes=1000)
    with pytest.raises(ValueError, match="k must be"):
        M.hermite(-1, [0.0])
    with pytest.raises(ValueError, match="alpha"):
        M.spurious_gaussian_data(10, 10, 1.0)
    with pytest.raises(ValueError, match="model"):
        M.alignment_limit("relu", 0.5, model="cnn")
    with pytest.raises(ValueError, match="border"):
        M.spurious_split(torch.zeros(1, 4, 4), 2)
    with pytest.raises(ValueError, match="W"):
        M.random_features(torch.zeros(3, 4), torch.zeros(5, 3), "relu")
    with pytest.raises(ValueError, match="counterpart"):
        M.memorization_curve([5], d=6, k=20, n_test=5, seeds=[0], counterpart="both")
    custom = M.memorization_curve(
        [5],
        k=40,
        n_test=5,
        seeds=[0],
        sampler=lambda n, a, gen: M.spurious_gaussian_data(n, 6, a, gen),
    )
    assert custom.spurious_accuracy_zero is None
    with pytest.raises(ValueError, match="spurious_zero"):
        custom.summary("spurious_zero")
    with pytest.raises(ValueError, match="antiderivative"):
        M.get_activation("relu").antiderivative()
