r"""Denoising is a local mean: Tweedie's formula, the empirical optimal denoiser, scores, samplers.

For clean data :math:`x \sim p` and a noisy observation :math:`\tilde x = x + \sigma\varepsilon`,
:math:`\varepsilon \sim N(0, I)`, Tweedie's formula :cite:`efron2011` gives the posterior mean

.. math:: D(\tilde x, \sigma) = E[x \mid \tilde x] = \tilde x + \sigma^2 \nabla \log p_\sigma(\tilde x),

with :math:`p_\sigma = p * N(0, \sigma^2 I)`. When :math:`p` is the empirical distribution of
training points :math:`x_1, \dots, x_n`, :math:`D` is the Gaussian-kernel local mean
(Nadaraya–Watson with the data as targets, one MeanShift step) with bandwidth :math:`h = \sigma`:

.. math:: D(\tilde x, \sigma) = \frac{\sum_i e^{-|\tilde x - x_i|^2/2\sigma^2} x_i}{\sum_i e^{-|\tilde x - x_i|^2/2\sigma^2}}.

The module holds that denoiser and its score, the closed-form posterior mean of an isotropic
Gaussian mixture (an independent check of Tweedie's formula), two samplers that accept *any*
denoiser ``denoiser(x, sigma) -> (m, d)`` (annealed Langevin dynamics :cite:`song2019generative`
and the deterministic DDIM sampler of Song, Meng & Ermon :cite:`song2021ddim`, i.e. Euler steps
on the probability-flow ODE :cite:`song2021sde,karras2022edm`; DDIM is a fast deterministic
sampler for the diffusion models (DDPM) of :cite:`ho2020ddpm`), a small denoising autoencoder
:cite:`vincent2011` with its training loop, and the modern Hopfield update
:cite:`ramsauer2021hopfield`, a local mean with an exponential dot-product kernel.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from ._validate import as_tensor, check_bandwidth, check_choice, check_points
from ._validate import check_positive_float, check_positive_int, check_query
from ._validate import promote_floats
from .chunks import chunk_rows, iter_chunks
from .kernels import _scaled_sq_dist
from .local_sums import local_average
from .notebook import progress_enabled

__all__ = [
    "tweedie_denoise",
    "empirical_score",
    "empirical_denoiser",
    "gaussian_mixture_denoise",
    "sigma_schedule",
    "annealed_langevin",
    "probability_flow_sample",
    "DenoisingAutoencoder",
    "train_dae",
    "hopfield_retrieve",
]

Denoiser = Callable[[torch.Tensor, float], torch.Tensor]


# --- the empirical optimal denoiser ----------------------------------------------------------
def _prepare(x_noisy, x_train, sigma, query_name="x_noisy"):
    x_noisy, x_train = promote_floats(x_noisy, x_train)
    x = check_points(x_train, "x_train")
    xq = check_query(x_noisy, x, query_name, "x_train")
    s = check_bandwidth(sigma, x.shape[1], like=x, name="sigma")
    return xq, x, s


def tweedie_denoise(x_noisy, x_train, sigma) -> torch.Tensor:
    r"""The optimal (posterior-mean) denoiser for the empirical distribution of ``x_train``.

    :math:`D(\tilde x) = E[x \mid \tilde x] = \sum_i w_i(\tilde x)\, x_i` with
    :math:`w_i \propto \exp(-\sum_j (\tilde x_j - x_{ij})^2 / 2\sigma_j^2)`: the Gaussian
    Nadaraya–Watson local mean of the data with bandwidth ``h = sigma``. Weights are normalized in
    log space (chunked), so any finite query gets a finite answer; a query far from all the data
    gets its nearest training point.

    Shapes: ``x_noisy (m, d)``, ``x_train (n, d)`` (1-D means ``d = 1``), ``sigma`` a positive
    float or ``(d,)`` (one noise std per coordinate). Returns ``(m, d)`` on ``x_train``'s
    device/dtype.
    """
    xq, x, s = _prepare(x_noisy, x_train, sigma)
    mean, _ = local_average(xq, x, x, s, "gaussian")
    return mean


def empirical_score(x_query, x_train, sigma) -> torch.Tensor:
    r"""The score :math:`\nabla \log p_\sigma(x)` of the empirical distribution blurred by ``N(0, σ²I)``, at ``x_query``.

    Closed form from the denoiser (Tweedie): :math:`\nabla \log p_\sigma(x) = (D(x) - x) / \sigma^2`,
    which is the score of the Gaussian KDE with bandwidth ``h = sigma`` (``kde_score``).
    Shapes: ``x_query (m, d)``, ``x_train (n, d)``, ``sigma`` float or ``(d,)``; returns ``(m, d)``.
    """
    xq, xt, s = _prepare(x_query, x_train, sigma, query_name="x_query")
    mean, _ = local_average(xq, xt, xt, s, "gaussian")
    return (mean - xq) / (s * s)


def empirical_denoiser(x_train) -> Denoiser:
    """The callable ``D(x, sigma) = tweedie_denoise(x, x_train, sigma)`` for the samplers.

    ``x_train`` is validated once here; the returned function accepts ``x (m, d)`` and a float
    ``sigma`` and returns ``(m, d)``.
    """
    xt = check_points(x_train, "x_train")

    def denoiser(x, sigma):
        return tweedie_denoise(x, xt, sigma)

    return denoiser


def gaussian_mixture_denoise(x_noisy, means, stds, sigma, weights=None) -> torch.Tensor:
    r"""Closed-form :math:`E[x \mid \tilde x]` for the prior :math:`\sum_k \pi_k N(\mu_k, s_k^2 I)`.

    The noisy marginal is :math:`\sum_k \pi_k N(\mu_k, (s_k^2 + \sigma^2) I)`; with its posterior
    component probabilities :math:`r_k(\tilde x)`,
    :math:`E[x \mid \tilde x] = \sum_k r_k \big(\mu_k + \tfrac{s_k^2}{s_k^2 + \sigma^2}(\tilde x - \mu_k)\big)`.
    With all ``s_k = 0`` and equal weights it is :func:`tweedie_denoise` with ``x_train = means``.

    Shapes: ``x_noisy (m, d)``, ``means (c, d)``, ``stds`` a float or ``(c,)`` (each ``≥ 0``),
    ``sigma > 0`` a float, ``weights (c,)`` positive (normalized here; default equal).
    Returns ``(m, d)``.
    """
    x_noisy, means, stds, weights = promote_floats(x_noisy, means, stds, weights)
    mu = check_points(means, "means")
    xq = check_query(x_noisy, mu, "x_noisy", "means")
    c, d = mu.shape
    sigma = check_positive_float(sigma, "sigma")
    s = as_tensor(stds, "stds", like=mu, ndim=(0, 1))
    s = s.expand(c) if s.ndim == 0 else s
    if s.shape[0] != c:
        raise ValueError(
            f"stds must be a scalar or have one value per component of means ({c}), "
            f"got shape {tuple(s.shape)}"
        )
    if bool((s < 0).any()):
        raise ValueError("stds must be non-negative")
    if weights is None:
        logw = torch.zeros(c, dtype=mu.dtype, device=mu.device)
    else:
        w = as_tensor(weights, "weights", like=mu, ndim=(1,))
        if w.shape[0] != c:
            raise ValueError(
                f"weights must have one value per component of means ({c}), got "
                f"{w.shape[0]}"
            )
        if bool((w <= 0).any()):
            raise ValueError("weights must be positive")
        logw = torch.log(w)
    var = s * s + sigma * sigma  # (c,)
    one = torch.ones(d, dtype=mu.dtype, device=mu.device)
    out = torch.empty_like(xq)
    rows = chunk_rows(xq.shape[0], c, d + 1, mu.element_size(), None, mu.device)
    center = mu.mean(0)
    for sl in iter_chunks(xq.shape[0], rows):
        u2 = _scaled_sq_dist(xq[sl], mu, one, center)  # |x̃ - μ_k|², (rows, c)
        logr = logw - 0.5 * d * torch.log(var) - 0.5 * u2 / var
        r = torch.softmax(logr, dim=1)
        shrink = (s * s) / var  # (c,)
        # Σ_k r_k (μ_k + shrink_k (x̃ - μ_k)) = Σ r_k (1 - shrink_k) μ_k + (Σ r_k shrink_k) x̃
        out[sl] = (r * (1 - shrink)) @ mu + (r @ shrink)[:, None] * xq[sl]
    return out


# --- samplers --------------------------------------------------------------------------------
def sigma_schedule(
    sigma_max: float, sigma_min: float, n_levels: int, kind: str = "geometric"
) -> torch.Tensor:
    """A decreasing noise schedule of ``n_levels`` values from ``sigma_max`` to ``sigma_min``.

    ``kind="geometric"`` (equal ratios, Song & Ermon) or ``"linear"``; float64 tensor ``(n_levels,)``.
    """
    hi = check_positive_float(sigma_max, "sigma_max")
    lo = check_positive_float(sigma_min, "sigma_min")
    n = check_positive_int(n_levels, "n_levels")
    kind = check_choice(kind, "kind", ["geometric", "linear"])
    if lo > hi:
        raise ValueError(f"sigma_min ({lo}) must not exceed sigma_max ({hi})")
    if kind == "geometric":
        return torch.logspace(math.log10(hi), math.log10(lo), n, dtype=torch.float64)
    return torch.linspace(hi, lo, n, dtype=torch.float64)


def _check_sampler_args(denoiser, x_init, sigmas):
    if not callable(denoiser):
        raise TypeError(
            f"denoiser must be a callable denoiser(x, sigma) -> (m, d), got {type(denoiser).__name__}"
        )
    x = check_points(x_init, "x_init")
    s = as_tensor(sigmas, "sigmas", ndim=(0, 1))
    s = s.reshape(-1)
    if bool((s <= 0).any()):
        raise ValueError("sigmas must be positive")
    if s.numel() > 1 and bool((s[1:] > s[:-1]).any()):
        raise ValueError(
            "sigmas must be non-increasing (from the largest noise level down)"
        )
    return x, [float(v) for v in s]


def _denoise(denoiser, x, sigma):
    out = denoiser(x, sigma)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        shape = (
            tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        )
        raise ValueError(
            f"denoiser must return a tensor of the input's shape {tuple(x.shape)}, got {shape}"
        )
    return out.to(dtype=x.dtype)


@torch.no_grad()
def annealed_langevin(
    denoiser: Denoiser,
    x_init,
    sigmas,
    n_steps: int = 20,
    step_size: float = 0.1,
    generator: Optional[torch.Generator] = None,
    final_denoise: bool = True,
) -> torch.Tensor:
    r"""Annealed Langevin dynamics (Song & Ermon, 2019) driven by a denoiser.

    For each level :math:`\sigma` of the non-increasing schedule ``sigmas``, ``n_steps`` updates
    :math:`x \leftarrow x + \tfrac{\eta}{2} s(x) + \sqrt{\eta}\, z`, with the score estimate
    :math:`s(x) = (D(x, \sigma) - x)/\sigma^2` (Tweedie; exact when ``D`` is the posterior mean),
    step :math:`\eta = \text{step\_size}\cdot\sigma^2`
    (Song & Ermon's :math:`\epsilon\,\sigma^2/\sigma_L^2` with ``step_size`` :math:`= \epsilon/\sigma_L^2`)
    and :math:`z \sim N(0, I)` drawn from ``generator``. With ``final_denoise`` (the default) one
    extra step returns :math:`D(x, \sigma_L)`, the posterior mean at the last level, which removes
    the noise left at :math:`\sigma_L`. That step is an addition: Song & Ermon's (2019) algorithm
    ends with the last Langevin update (``final_denoise=False``).

    ``denoiser(x, sigma)`` maps ``(m, d)`` to ``(m, d)`` (:func:`empirical_denoiser`, a trained
    :class:`DenoisingAutoencoder`, ...). ``x_init (m, d)`` are the starting points (typically
    ``sigmas[0] * randn``). Returns ``(m, d)``; the same ``generator`` state gives the same samples.
    """
    x, levels = _check_sampler_args(denoiser, x_init, sigmas)
    n_steps = check_positive_int(n_steps, "n_steps")
    step_size = check_positive_float(step_size, "step_size")
    x = x.clone()
    for sigma in levels:
        alpha = step_size * sigma * sigma
        for _ in range(n_steps):
            score = (_denoise(denoiser, x, sigma) - x) / (sigma * sigma)
            dev = x.device if generator is None else generator.device
            z = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=dev).to(
                x.device
            )
            x = x + 0.5 * alpha * score + math.sqrt(alpha) * z
    if final_denoise:
        x = _denoise(denoiser, x, levels[-1])
    return x


@torch.no_grad()
def probability_flow_sample(
    denoiser: Denoiser, x_init, sigmas, final_denoise: bool = True
) -> torch.Tensor:
    r"""The deterministic DDIM sampler (:math:`\eta = 0`), Song, Meng & Ermon :cite:`song2021ddim`.

    It is the Euler method on the probability-flow ODE :cite:`song2021sde`, written in the
    variance-exploding form of :cite:`karras2022edm`.

    The variance-exploding probability-flow ODE is :math:`dx/d\sigma = (x - D(x, \sigma))/\sigma`;
    one Euler step from :math:`\sigma` to :math:`\sigma'` is
    :math:`x \leftarrow D + (\sigma'/\sigma)(x - D)`: keep the denoised estimate and the
    fraction :math:`\sigma'/\sigma` of the current noise. With ``final_denoise`` the last step goes
    to :math:`\sigma' = 0`, i.e. returns :math:`D(x, \sigma_L)`.

    ``x_init (m, d)`` are the starting points (typically ``sigmas[0] * randn`` from a seeded
    generator); the map ``x_init → samples`` is deterministic. Returns ``(m, d)``.
    """
    x, levels = _check_sampler_args(denoiser, x_init, sigmas)
    x = x.clone()
    nxt = levels[1:] + ([0.0] if final_denoise else [])
    for sigma, sigma_next in zip(levels, nxt):
        d = _denoise(denoiser, x, sigma)
        x = d + (sigma_next / sigma) * (x - d)
    return x


# --- a denoising autoencoder -----------------------------------------------------------------
class DenoisingAutoencoder(nn.Module):
    r"""A small MLP denoiser :math:`D_\theta(\tilde x, \sigma)`, usable as a sampler's ``denoiser``.

    Preconditioned as in Karras et al. (2022) so one network serves many noise levels:
    :math:`D = c_\text{skip}\tilde x + c_\text{out} F_\theta(c_\text{in}\tilde x, \log\sigma)` with
    :math:`c_\text{skip} = \sigma_d^2/(\sigma^2+\sigma_d^2)`,
    :math:`c_\text{out} = \sigma\sigma_d/\sqrt{\sigma^2+\sigma_d^2}`,
    :math:`c_\text{in} = 1/\sqrt{\sigma^2+\sigma_d^2}`, where :math:`\sigma_d` is the data's
    standard deviation (set by :func:`train_dae`) and ``data_mean`` is subtracted first.
    ``F`` is an MLP with ``depth`` hidden layers of width ``hidden`` (SiLU).

    ``forward(x, sigma)``: ``x (m, dim)``, ``sigma`` a float or ``(m,)``; returns ``(m, dim)``.
    ``seed`` makes the initialization reproducible without touching the global RNG.
    """

    def __init__(
        self, dim: int, hidden: int = 128, depth: int = 2, seed: Optional[int] = None
    ):
        super().__init__()
        self.dim = check_positive_int(dim, "dim")
        hidden = check_positive_int(hidden, "hidden")
        depth = check_positive_int(depth, "depth")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            layers, width = [], self.dim + 1
            for _ in range(depth):
                layers += [nn.Linear(width, hidden), nn.SiLU()]
                width = hidden
            layers.append(nn.Linear(width, self.dim))
            self.net = nn.Sequential(*layers)
        self.register_buffer("data_mean", torch.zeros(self.dim))
        self.register_buffer("data_std", torch.ones(()))

    def forward(self, x, sigma) -> torch.Tensor:
        p = next(self.parameters())
        x = check_points(x, "x", like=p)
        if x.shape[1] != self.dim:
            raise ValueError(
                f"x has {x.shape[1]} feature(s) per point but the model expects {self.dim}"
            )
        if isinstance(sigma, torch.Tensor) and sigma.ndim > 0:
            s = sigma.to(device=p.device, dtype=p.dtype).reshape(-1)
            if s.shape[0] != x.shape[0]:
                raise ValueError(
                    f"sigma must be a float or have one value per row ({x.shape[0]}), got {s.shape[0]}"
                )
            if bool((s <= 0).any()):
                raise ValueError("sigma must be positive")
        else:
            s = torch.full(
                (x.shape[0],),
                check_positive_float(sigma, "sigma"),
                dtype=p.dtype,
                device=p.device,
            )
        sd = self.data_std
        total = torch.sqrt(s * s + sd * sd)[:, None]
        c_skip = sd * sd / (total * total)
        c_out = s[:, None] * sd / total
        c_in = 1.0 / total
        xc = x - self.data_mean
        f = self.net(torch.cat([c_in * xc, torch.log(s)[:, None]], dim=1))
        return self.data_mean + c_skip * xc + c_out * f


def train_dae(
    model: DenoisingAutoencoder,
    x_train,
    sigmas: Union[float, Sequence[float], torch.Tensor],
    n_steps: int = 2000,
    batch_size: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    progress: Optional[bool] = None,
    threads: Optional[int] = 1,
) -> torch.Tensor:
    r"""Train ``model`` to denoise: minimize :math:`E\,\lambda(\sigma)\,|D_\theta(x + \sigma\varepsilon, \sigma) - x|^2`.

    Each step draws a batch of ``x_train`` rows and, per row, a noise level uniformly from
    ``sigmas`` (one float: a single level) and :math:`\varepsilon \sim N(0, I)`, all from a
    generator seeded with ``seed``; :math:`\lambda = 1/c_\text{out}^2` weighs the levels equally.
    Adam with learning rate ``lr`` and a cosine decay. Sets ``model.data_mean``/``data_std`` from
    ``x_train`` first. A tqdm progress bar shows when interactive (``progress=None``), never when
    ``LOCALBOOK_STATIC`` is set. On the CPU the loop runs on ``threads`` threads (tiny networks
    train fastest on one, especially on a shared machine; ``None`` keeps torch's setting) and
    torch's thread count is restored afterwards. Shapes: ``x_train (n, dim)``. Returns the loss per
    step, ``(n_steps,)``.
    """
    if not isinstance(model, DenoisingAutoencoder):
        raise TypeError(
            f"model must be a DenoisingAutoencoder, got {type(model).__name__}"
        )
    p = next(model.parameters())
    x = check_points(x_train, "x_train", like=p)
    if x.shape[1] != model.dim:
        raise ValueError(
            f"x_train has {x.shape[1]} feature(s) per point but the model expects {model.dim}"
        )
    levels = as_tensor(sigmas, "sigmas", like=p, ndim=(0, 1)).reshape(-1)
    if bool((levels <= 0).any()):
        raise ValueError("sigmas must be positive")
    n_steps = check_positive_int(n_steps, "n_steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    lr = check_positive_float(lr, "lr")
    if threads is not None:
        threads = check_positive_int(threads, "threads")
    old_threads = torch.get_num_threads()
    if threads is not None and p.device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        return _train_loop(model, x, levels, n_steps, batch_size, lr, seed, progress)
    finally:
        torch.set_num_threads(old_threads)


def _train_loop(model, x, levels, n_steps, batch_size, lr, seed, progress):
    from tqdm.auto import tqdm

    p = next(model.parameters())

    with torch.no_grad():
        model.data_mean.copy_(x.mean(0))
        model.data_std.copy_(
            x.std() if x.shape[0] > 1 else torch.ones((), dtype=p.dtype)
        )
        model.data_std.clamp_(min=1e-8)
    g = torch.Generator(device=p.device).manual_seed(int(seed))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_steps)
    losses = torch.empty(n_steps, dtype=p.dtype, device=p.device)
    sd = model.data_std
    model.train()
    bar = tqdm(
        range(n_steps),
        desc="training DAE",
        disable=not progress_enabled(progress),
        leave=False,
    )
    for step in bar:
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=g, device=p.device)
        s = levels[
            torch.randint(
                0, levels.shape[0], (batch_size,), generator=g, device=p.device
            )
        ]
        eps = torch.randn(
            batch_size, x.shape[1], generator=g, device=p.device, dtype=p.dtype
        )
        clean = x[idx]
        out = model(clean + s[:, None] * eps, s)
        weight = (s * s + sd * sd) / (s * s * sd * sd)  # 1 / c_out²
        loss = (weight * ((out - clean) ** 2).mean(1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses[step] = loss.detach()
        if step % 100 == 0:
            bar.set_postfix(loss=f"{losses[step].item():.4f}")
    model.eval()
    return losses.cpu()


# --- modern Hopfield networks ----------------------------------------------------------------
def hopfield_retrieve(query, patterns, beta: float, steps: int = 1) -> torch.Tensor:
    r"""The modern Hopfield update :math:`\xi \leftarrow X^\top \mathrm{softmax}(\beta X \xi)`, ``steps`` times.

    A local mean of the stored patterns :math:`x_i` (rows of ``patterns``) with the exponential
    dot-product kernel :math:`K(\xi, x_i) = e^{\beta\langle x_i, \xi\rangle}`; for patterns of
    equal norm it is the Gaussian local mean with :math:`h^2 = 1/\beta`. Large ``beta`` retrieves
    the pattern with the largest :math:`\langle x_i, \xi\rangle` (the nearest one when norms are
    equal); small ``beta`` returns averages (metastable states). Computed in log space, chunked.

    Shapes: ``query (m, d)`` or ``(d,)`` for one state (then returns ``(d,)``), ``patterns (n, d)``
    (the (query, data) order of every local mean); ``beta > 0``; ``steps ≥ 1``. Returns ``(m, d)``
    in the input's dtype; half precision is computed in float32 (softmax in log space).
    """
    query, patterns = promote_floats(query, patterns)
    X = check_points(patterns, "patterns")
    beta = check_positive_float(beta, "beta")
    steps = check_positive_int(steps, "steps")
    q = as_tensor(query, "query", like=X, ndim=(1, 2))
    single = q.ndim == 1 and X.shape[1] > 1
    q = q[None, :] if single else q
    q = check_query(q, X, "query", "patterns")
    out_dtype = q.dtype
    if q.dtype in (torch.float16, torch.bfloat16):
        # as PyTorch's attention does: scores and sums in float32 (beta <x, xi> overflows
        # float16 at 65504, and bfloat16 keeps 8 bits), the result in the input's dtype
        q, X = q.float(), X.float()
    rows = chunk_rows(q.shape[0], X.shape[0], 1, X.element_size(), None, X.device)
    for _ in range(steps):
        new = torch.empty_like(q)
        for sl in iter_chunks(q.shape[0], rows):
            new[sl] = torch.softmax(beta * (q[sl] @ X.T), dim=1) @ X
        q = new
    q = q.to(out_dtype)
    return q[0] if single else q
