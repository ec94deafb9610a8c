"""localbook.denoise: the empirical denoiser against NW, autograd, closed forms; samplers; DAE; Hopfield."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import localbook as lb

scipy_special = pytest.importorskip("scipy.special")


def _data(n=60, d=2, m=25, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    q = 2.0 * torch.randn(m, d, generator=g, dtype=torch.float64)
    return x, q


def _log_p_sigma(q, x, sigma):
    """log of the blurred empirical density (up to a constant), a differentiable brute force."""
    return torch.logsumexp(
        -((q[:, None, :] - x[None, :, :]) ** 2).sum(-1) / (2 * sigma**2), dim=1
    )


# --- the denoiser is a local mean = x̃ + σ² · score ------------------------------------------
@pytest.mark.parametrize("d", [1, 2, 5])
@pytest.mark.parametrize("sigma", [0.1, 0.5, 2.0])
def test_denoiser_is_nadaraya_watson_and_tweedie(d, sigma):
    x, q = _data(d=d, seed=d)
    den = lb.tweedie_denoise(q, x, sigma)
    # the Gaussian NW local mean of the data themselves, h = σ
    torch.testing.assert_close(
        den, lb.nadaraya_watson(q, x, x, sigma), rtol=0, atol=1e-10
    )
    # Tweedie: x̃ + σ² ∇ log p_σ(x̃), the gradient by autograd of a brute-force log density
    qq = q.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_log_p_sigma(qq, x, sigma).sum(), qq)
    torch.testing.assert_close(den, q + sigma**2 * grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(
        lb.empirical_score(q, x, sigma), grad, rtol=0, atol=1e-10 / sigma**2
    )


def test_denoiser_is_bayes_posterior_mean_numpy():
    """Brute force in numpy/scipy: posterior weights ∝ N(x̃; xᵢ, σ²I) under a uniform prior on the data."""
    x, q = _data(n=40, d=3, m=10)
    sigma = 0.7
    xn, qn = x.numpy(), q.numpy()
    logpdf = -((qn[:, None, :] - xn[None]) ** 2).sum(-1) / (2 * sigma**2)
    post = np.exp(logpdf - scipy_special.logsumexp(logpdf, axis=1, keepdims=True))
    np.testing.assert_allclose(
        lb.tweedie_denoise(q, x, sigma).numpy(), post @ xn, rtol=0, atol=1e-10
    )


def test_empirical_score_equals_kde_score():
    density = pytest.importorskip("localbook.density")
    x, q = _data(d=3)
    for sigma in (0.3, 1.0, torch.tensor([0.3, 0.5, 0.8], dtype=torch.float64)):
        torch.testing.assert_close(
            lb.empirical_score(q, x, sigma),
            density.kde_score(q, x, sigma),
            rtol=0,
            atol=1e-10,
        )


def test_per_coordinate_sigma():
    """Diagonal noise: weights use Σⱼ (x̃ⱼ − xᵢⱼ)²/2σⱼ², the score divides by σⱼ² coordinate-wise."""
    x, q = _data(d=2)
    s = torch.tensor([0.3, 1.2], dtype=torch.float64)
    qq = q.clone().requires_grad_(True)
    logp = torch.logsumexp(-(((qq[:, None, :] - x[None]) / s) ** 2).sum(-1) / 2, dim=1)
    (grad,) = torch.autograd.grad(logp.sum(), qq)
    torch.testing.assert_close(
        lb.tweedie_denoise(q, x, s), q + s**2 * grad, rtol=0, atol=1e-10
    )


# --- Tweedie against a Gaussian-mixture closed form --------------------------------------------
@pytest.mark.parametrize("sigma", [0.2, 1.0])
def test_gaussian_mixture_closed_form_matches_tweedie(sigma):
    g = torch.Generator().manual_seed(3)
    mu = 3 * torch.randn(4, 2, generator=g, dtype=torch.float64)
    s = torch.tensor([0.5, 0.2, 1.0, 0.0], dtype=torch.float64)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = 3 * torch.randn(30, 2, generator=g, dtype=torch.float64)
    var = s**2 + sigma**2
    qq = q.clone().requires_grad_(True)
    logp = torch.logsumexp(
        torch.log(w)
        - torch.log(2 * math.pi * var)
        - ((qq[:, None, :] - mu[None]) ** 2).sum(-1) / (2 * var),
        dim=1,
    )
    (grad,) = torch.autograd.grad(logp.sum(), qq)
    torch.testing.assert_close(
        lb.gaussian_mixture_denoise(q, mu, s, sigma, w),
        q + sigma**2 * grad,
        rtol=0,
        atol=1e-10,
    )


def test_gaussian_mixture_with_point_masses_is_the_empirical_denoiser():
    x, q = _data()
    torch.testing.assert_close(
        lb.gaussian_mixture_denoise(q, x, 0.0, 0.4),
        lb.tweedie_denoise(q, x, 0.4),
        rtol=0,
        atol=1e-12,
    )
    # one Gaussian component: linear shrinkage μ + s²/(s²+σ²)(x̃ − μ)
    mu = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    out = lb.gaussian_mixture_denoise(q, mu, 2.0, 1.0)
    torch.testing.assert_close(out, mu + 4 / 5 * (q - mu), rtol=0, atol=1e-12)


# --- finite, chunked, device/dtype ------------------------------------------------------------
def test_far_query_gets_nearest_training_point():
    x, _ = _data(d=3)
    far = torch.tensor([[1e5, -3e5, 2e5]], dtype=torch.float64)
    nearest = x[torch.cdist(far, x).argmin()]
    out = lb.tweedie_denoise(far, x, 0.05)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], nearest)
    assert torch.isfinite(lb.empirical_score(far, x, 0.05)).all()


def test_chunking_does_not_change_the_result(monkeypatch):
    x, q = _data(n=200, d=3, m=50)
    full = lb.tweedie_denoise(q, x, 0.5)
    from localbook.local_sums import local_average

    # a budget of 7 rows per chunk
    monkeypatch.setattr(
        "localbook.denoise.local_average",
        lambda *a, **k: local_average(*a, budget=4 * 200 * 8 * 7, **k),
    )
    torch.testing.assert_close(lb.tweedie_denoise(q, x, 0.5), full, rtol=0, atol=1e-12)


def test_outputs_follow_device_and_dtype(device):
    x, q = _data()
    for dtype in (torch.float32, torch.float64):
        xt, qt = x.to(device, dtype), q.to(device, dtype)
        for f in (lb.tweedie_denoise, lb.empirical_score):
            out = f(qt, xt, 0.5)
            assert (
                out.device.type == device.type
                and out.dtype == dtype
                and out.shape == q.shape
            )
        out = lb.hopfield_retrieve(qt, xt, 2.0)
        assert (
            out.device.type == device.type
            and out.dtype == dtype
            and out.shape == q.shape
        )
    ref = lb.tweedie_denoise(q, x, 0.5)
    torch.testing.assert_close(
        lb.tweedie_denoise(q.to(device), x.to(device), 0.5).cpu(),
        ref,
        rtol=0,
        atol=1e-10,
    )
    out = lb.tweedie_denoise(
        [[0, 1]], [[0, 0], [1, 2]], 1.0
    )  # integers → default float dtype
    assert out.dtype == torch.get_default_dtype()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 30),
    d=st.integers(1, 4),
    sigma=st.floats(1e-2, 1e2),
    seed=st.integers(0, 2**16),
)
def test_denoiser_is_a_convex_combination_of_the_data(n, d, sigma, seed):
    x, q = _data(n=n, d=d, m=7, seed=seed)
    out = lb.tweedie_denoise(q, x, sigma)
    assert torch.isfinite(out).all()
    # inside the bounding box of the data; translation-equivariant
    assert bool((out >= x.min(0).values - 1e-9).all()) and bool(
        (out <= x.max(0).values + 1e-9).all()
    )
    shift = torch.linspace(-3, 3, d, dtype=torch.float64)
    torch.testing.assert_close(
        lb.tweedie_denoise(q + shift, x + shift, sigma),
        out + shift,
        rtol=1e-9,
        atol=1e-9,
    )


# --- samplers ---------------------------------------------------------------------------------
def test_sigma_schedule():
    s = lb.sigma_schedule(10.0, 0.01, 4)
    torch.testing.assert_close(
        s, torch.tensor([10.0, 1.0, 0.1, 0.01], dtype=torch.float64)
    )
    lin = lb.sigma_schedule(1.0, 0.5, 3, kind="linear")
    torch.testing.assert_close(lin, torch.tensor([1.0, 0.75, 0.5], dtype=torch.float64))


def test_samplers_are_deterministic_and_shape_correct():
    x, _ = _data(n=30, d=2)
    den = lb.empirical_denoiser(x)
    sig = lb.sigma_schedule(3.0, 0.02, 12)
    x0 = 3.0 * torch.randn(
        17, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    a = lb.annealed_langevin(
        den, x0, sig, n_steps=5, generator=torch.Generator().manual_seed(7)
    )
    b = lb.annealed_langevin(
        den, x0, sig, n_steps=5, generator=torch.Generator().manual_seed(7)
    )
    c = lb.annealed_langevin(
        den, x0, sig, n_steps=5, generator=torch.Generator().manual_seed(8)
    )
    assert a.shape == (17, 2) and torch.equal(a, b) and not torch.equal(a, c)
    p = lb.probability_flow_sample(den, x0, sig)
    assert p.shape == (17, 2) and torch.equal(
        p, lb.probability_flow_sample(den, x0, sig)
    )
    assert torch.equal(
        x0,
        3.0
        * torch.randn(
            17, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64
        ),
    )


def test_empirical_samplers_reproduce_training_points():
    """With the exact empirical denoiser, sampling ends on training points (memorization)."""
    x, _ = _data(n=20, d=2)
    den = lb.empirical_denoiser(x)
    sig = lb.sigma_schedule(4.0, 0.01, 40)
    x0 = 4.0 * torch.randn(
        50, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    for out in (
        lb.probability_flow_sample(den, x0, sig),
        lb.annealed_langevin(
            den, x0, sig, n_steps=3, generator=torch.Generator().manual_seed(0)
        ),
    ):
        assert float(torch.cdist(out, x).min(1).values.max()) < 1e-6


def test_probability_flow_step_formula():
    """One step without the final denoise: x' = D + (σ'/σ)(x − D)."""
    x, q = _data()
    den = lb.empirical_denoiser(x)
    out = lb.probability_flow_sample(den, q, [2.0, 0.5], final_denoise=False)
    d = lb.tweedie_denoise(q, x, 2.0)
    torch.testing.assert_close(out, d + 0.25 * (q - d), rtol=0, atol=1e-12)


def test_probability_flow_is_ddim_with_eta_zero():
    """Oracle: DDIM (Song, Meng & Ermon 2021, eq. 12 with σ_t = 0) in its own variance-preserving
    coordinates, x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε, run step by step and mapped back by
    x_VE = x_VP / √ᾱ, σ = √((1 − ᾱ)/ᾱ), gives the probability-flow sampler's trajectory."""
    x, q = _data(n=40, d=3, m=30, seed=4)
    den = lb.empirical_denoiser(x)
    sigmas = lb.sigma_schedule(5.0, 0.05, 12)
    abar = 1.0 / (1.0 + sigmas**2)  # σ² = (1 − ᾱ)/ᾱ
    xt = q * abar[0].sqrt()  # the same starting point, in VP coordinates
    for a, a_next, s in zip(abar[:-1], abar[1:], sigmas[:-1]):
        x0_hat = den(xt / a.sqrt(), float(s))  # the denoiser sees the VE point x_t/√ᾱ_t
        eps_hat = (xt - a.sqrt() * x0_hat) / (1 - a).sqrt()
        xt = a_next.sqrt() * x0_hat + (1 - a_next).sqrt() * eps_hat
    out = lb.probability_flow_sample(den, q, sigmas, final_denoise=False)
    # rounding: a dozen steps of O(n)-term weighted sums of O(1) values, in float64
    tol = (
        12 * 40 * torch.finfo(torch.float64).eps * float(q.abs().max() + x.abs().max())
    )
    torch.testing.assert_close(out, xt / abar[-1].sqrt(), rtol=0, atol=tol)


def test_langevin_single_step_formula():
    x, q = _data()
    den = lb.empirical_denoiser(x)
    out = lb.annealed_langevin(
        den,
        q,
        [0.5],
        n_steps=1,
        step_size=0.2,
        generator=torch.Generator().manual_seed(3),
        final_denoise=False,
    )
    z = torch.randn(
        q.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    alpha = 0.2 * 0.25
    ref = q + 0.5 * alpha * lb.empirical_score(q, x, 0.5) + math.sqrt(alpha) * z
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_langevin_final_denoise_is_one_extra_denoising_step():
    """final_denoise=True = the plain Song & Ermon chain, then D(x, sigma_L) once."""
    x, q = _data()
    den = lb.empirical_denoiser(x)
    sigmas = lb.sigma_schedule(2.0, 0.1, 4)
    kw = dict(n_steps=3, step_size=0.1)
    plain = lb.annealed_langevin(
        den,
        q,
        sigmas,
        generator=torch.Generator().manual_seed(4),
        final_denoise=False,
        **kw,
    )
    final = lb.annealed_langevin(
        den, q, sigmas, generator=torch.Generator().manual_seed(4), **kw
    )
    # the extra step, computed independently: x + sigma_L^2 * autograd score of log p_sigma_L
    s_l = float(sigmas[-1])
    z = plain.clone().requires_grad_(True)
    (score,) = torch.autograd.grad(_log_p_sigma(z, x, s_l).sum(), z)
    tol = 60 * torch.finfo(torch.float64).eps * float(plain.abs().max() + x.abs().max())
    torch.testing.assert_close(final, plain + s_l**2 * score, rtol=0, atol=tol)
    # and the step moves the samples: without it they are not the posterior means
    assert float((final - plain).abs().max()) > 1e3 * tol


# --- the denoising autoencoder ----------------------------------------------------------------
def test_dae_training_is_seeded_and_learns():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=g) * torch.tensor([2.0, 0.3])
    runs = []
    for _ in range(2):
        model = lb.DenoisingAutoencoder(2, hidden=32, depth=2, seed=1)
        losses = lb.train_dae(
            model,
            x,
            [0.1, 0.5, 1.0],
            n_steps=150,
            batch_size=64,
            seed=4,
            progress=False,
        )
        runs.append((model, losses))
    assert runs[0][1].shape == (150,)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=0, atol=0)
    assert float(runs[0][1][-30:].mean()) < float(runs[0][1][:30].mean())
    model = runs[0][0]
    out = model(x[:5], 0.5)
    assert out.shape == (5, 2) and out.dtype == x.dtype
    assert model(x[:5], torch.full((5,), 0.5)).shape == (5, 2)
    # usable as a sampler's denoiser
    samples = lb.probability_flow_sample(
        model, torch.randn(8, 2, generator=g), lb.sigma_schedule(1.0, 0.1, 5)
    )
    assert samples.shape == (8, 2) and torch.isfinite(samples).all()


def test_dae_and_samplers_on_device(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g, dtype=torch.float32).to(device)
    model = lb.DenoisingAutoencoder(3, hidden=16, depth=1, seed=0).to(device)
    losses = lb.train_dae(
        model, x, [0.2, 1.0], n_steps=20, batch_size=16, seed=0, progress=False
    )
    assert losses.shape == (20,) and torch.isfinite(losses).all()
    x0 = torch.randn(5, 3, generator=g, dtype=torch.float32).to(device)
    sig = lb.sigma_schedule(1.0, 0.1, 4)
    for den in (model, lb.empirical_denoiser(x)):
        for out in (
            lb.probability_flow_sample(den, x0, sig),
            lb.annealed_langevin(
                den, x0, sig, n_steps=2, generator=torch.Generator().manual_seed(1)
            ),
        ):
            assert (
                out.device.type == device.type
                and out.shape == (5, 3)
                and torch.isfinite(out).all()
            )


def test_dae_restores_thread_count():
    before = torch.get_num_threads()
    model = lb.DenoisingAutoencoder(2, hidden=8, depth=1, seed=0)
    lb.train_dae(model, torch.randn(20, 2), 0.3, n_steps=3, progress=False)
    assert torch.get_num_threads() == before


# --- modern Hopfield networks -----------------------------------------------------------------
def test_hopfield_large_beta_returns_nearest_pattern():
    g = torch.Generator().manual_seed(5)
    P = torch.nn.functional.normalize(
        torch.randn(30, 16, generator=g, dtype=torch.float64), dim=1
    )
    q = P + 0.2 * torch.randn(30, 16, generator=g, dtype=torch.float64)
    nearest = torch.cdist(q, P).argmin(1)
    out = lb.hopfield_retrieve(q, P, beta=1e4)
    torch.testing.assert_close(out, P[nearest], rtol=0, atol=1e-10)
    one = lb.hopfield_retrieve(q[3], P, beta=1e4)  # a single (d,) state
    assert one.shape == (16,)
    torch.testing.assert_close(one, P[nearest[3]], rtol=0, atol=1e-10)


def test_hopfield_is_a_local_mean():
    x, q = _data(n=40, d=4)
    beta = 0.7
    ref = torch.softmax(beta * q @ x.T, dim=1) @ x
    torch.testing.assert_close(
        lb.hopfield_retrieve(q, x, beta), ref, rtol=0, atol=1e-12
    )
    two = lb.hopfield_retrieve(q, x, beta, steps=2)
    torch.testing.assert_close(
        two, lb.hopfield_retrieve(ref, x, beta), rtol=0, atol=1e-12
    )
    # equal-norm patterns: the Gaussian local mean with h² = 1/β
    P = torch.nn.functional.normalize(x, dim=1)
    torch.testing.assert_close(
        lb.hopfield_retrieve(q, P, beta),
        lb.nadaraya_watson(q, P, P, 1 / math.sqrt(beta)),
        rtol=0,
        atol=1e-10,
    )
    # β → 0: the mean of all patterns
    torch.testing.assert_close(
        lb.hopfield_retrieve(q, x, 1e-12), x.mean(0).expand_as(q), rtol=0, atol=1e-9
    )


# --- bad inputs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, exc, name",
    [
        (lambda x, q: lb.tweedie_denoise(q, x, 0.0), ValueError, "sigma"),
        (lambda x, q: lb.tweedie_denoise(q, x, -1.0), ValueError, "sigma"),
        (lambda x, q: lb.tweedie_denoise(q, x, math.nan), ValueError, "sigma"),
        (lambda x, q: lb.tweedie_denoise(q, x, [0.1, 0.2, 0.3]), ValueError, "sigma"),
        (lambda x, q: lb.tweedie_denoise(q[:, :1], x, 0.5), ValueError, "x_noisy"),
        (lambda x, q: lb.tweedie_denoise(q, x[:0], 0.5), ValueError, "x_train"),
        (
            lambda x, q: lb.tweedie_denoise(q, torch.full_like(x, math.nan), 0.5),
            ValueError,
            "x_train",
        ),
        (
            lambda x, q: lb.tweedie_denoise(torch.full_like(q, math.inf), x, 0.5),
            ValueError,
            "x_noisy",
        ),
        (lambda x, q: lb.tweedie_denoise("abc", x, 0.5), TypeError, "x_noisy"),
        (lambda x, q: lb.empirical_score(q, x, True), TypeError, "sigma"),
        (lambda x, q: lb.empirical_score(q[:, :1], x, 0.5), ValueError, "x"),
        (lambda x, q: lb.gaussian_mixture_denoise(q, x, -1.0, 0.5), ValueError, "stds"),
        (
            lambda x, q: lb.gaussian_mixture_denoise(q, x, [1.0, 2.0], 0.5),
            ValueError,
            "stds",
        ),
        (
            lambda x, q: lb.gaussian_mixture_denoise(
                q, x, 0.1, 0.5, weights=-torch.ones(len(x))
            ),
            ValueError,
            "weights",
        ),
        (lambda x, q: lb.gaussian_mixture_denoise(q, x, 0.1, 0.0), ValueError, "sigma"),
        (lambda x, q: lb.sigma_schedule(0.1, 1.0, 5), ValueError, "sigma_min"),
        (lambda x, q: lb.sigma_schedule(1.0, 0.1, 0), ValueError, "n_levels"),
        (
            lambda x, q: lb.sigma_schedule(1.0, 0.1, 3, kind="cosine"),
            ValueError,
            "kind",
        ),
        (
            lambda x, q: lb.probability_flow_sample("no", q, [1.0]),
            TypeError,
            "denoiser",
        ),
        (
            lambda x, q: lb.probability_flow_sample(
                lb.empirical_denoiser(x), q, [0.1, 1.0]
            ),
            ValueError,
            "sigmas",
        ),
        (
            lambda x, q: lb.probability_flow_sample(
                lb.empirical_denoiser(x), q, [1.0, 0.0]
            ),
            ValueError,
            "sigmas",
        ),
        (
            lambda x, q: lb.probability_flow_sample(lambda a, s: a[:, :1], q, [1.0]),
            ValueError,
            "denoiser",
        ),
        (
            lambda x, q: lb.annealed_langevin(
                lb.empirical_denoiser(x), q, [1.0], n_steps=0
            ),
            ValueError,
            "n_steps",
        ),
        (
            lambda x, q: lb.annealed_langevin(
                lb.empirical_denoiser(x), q, [1.0], step_size=-1
            ),
            ValueError,
            "step_size",
        ),
        (
            lambda x, q: lb.annealed_langevin(lb.empirical_denoiser(x), q[:0], [1.0]),
            ValueError,
            "x_init",
        ),
        (lambda x, q: lb.hopfield_retrieve(q, x, 0.0), ValueError, "beta"),
        (lambda x, q: lb.hopfield_retrieve(q, x, 1.0, steps=0), ValueError, "steps"),
        (lambda x, q: lb.hopfield_retrieve(q[:, :1], x, 1.0), ValueError, "query"),
        (lambda x, q: lb.hopfield_retrieve(q, x[:0], 1.0), ValueError, "patterns"),
        (lambda x, q: lb.DenoisingAutoencoder(0), ValueError, "dim"),
        (
            lambda x, q: lb.DenoisingAutoencoder(2)(q[:, :1], 0.5),
            ValueError,
            "model expects",
        ),
        (lambda x, q: lb.DenoisingAutoencoder(2)(q.float(), -0.5), ValueError, "sigma"),
        (lambda x, q: lb.train_dae(torch.nn.Linear(2, 2), x, 0.5), TypeError, "model"),
        (
            lambda x, q: lb.train_dae(lb.DenoisingAutoencoder(3), x.float(), 0.5),
            ValueError,
            "x_train",
        ),
        (
            lambda x, q: lb.train_dae(
                lb.DenoisingAutoencoder(2), x.float(), [0.5, -1.0]
            ),
            ValueError,
            "sigmas",
        ),
        (
            lambda x, q: lb.train_dae(
                lb.DenoisingAutoencoder(2), x.float(), 0.5, n_steps=0
            ),
            ValueError,
            "n_steps",
        ),
    ],
)
def test_bad_inputs_raise_naming_the_argument(call, exc, name):
    x, q = _data()
    with pytest.raises(exc, match=name):
        call(x, q)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.faults
def test_hopfield_retrieve_half_precision_is_the_float64_result_rounded(dtype):
    # beta <x, xi> ~ 10^4 overflows float16 (65504 after exp long before): computed in
    # float32, the result equals the float64 update on the same rounded inputs, rounded
    g = torch.Generator().manual_seed(0)
    X = (30 * torch.randn(50, 16, generator=g)).to(dtype)
    q = (30 * torch.randn(5, 16, generator=g)).to(dtype)
    out = lb.hopfield_retrieve(q, X, 8.0, steps=2)
    ref = lb.hopfield_retrieve(q.double(), X.double(), 8.0, steps=2)
    assert out.dtype == dtype and not torch.isnan(out).any()
    ulp = torch.finfo(dtype).eps * ref.abs().clamp_min(1.0)
    assert bool(((out.double() - ref).abs() <= 2 * ulp).all())
