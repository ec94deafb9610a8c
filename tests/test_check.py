"""Self-checks (localbook.check): a right answer passes, typical wrong answers fail with a
specific hint, a stub says "not implemented yet", and strict mode (book build / CI) raises."""

import pytest
import torch

import localbook as lb
from localbook.check import _common


@pytest.fixture(autouse=True)
def friendly(monkeypatch):
    """Student mode unless a test asks for strict mode."""
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "0")


# --- student answers: right ones and typical slips ------------------------------------------
def fit_right(x_star, x, y, h):
    w = torch.exp(-0.5 * ((x_star - x) / h) ** 2)
    return float((w * y).sum() / w.sum())


def fit_unnormalized(x_star, x, y, h):
    w = torch.exp(-0.5 * ((x_star - x) / h) ** 2)
    return float((w * y).sum())


def fit_no_half(x_star, x, y, h):
    w = torch.exp(-(((x_star - x) / h) ** 2))
    return float((w * y).sum() / w.sum())


def fit_tensor1(x_star, x, y, h):
    return torch.tensor([fit_right(x_star, x, y, h)])


def knn_right(x_star, x, k):
    return (x - x_star).abs().sort().values[k - 1]  # a 0-d tensor is accepted


def knn_off_by_one(x_star, x, k):
    d = (x - x_star).abs().sort().values
    return float(d[min(k, len(d) - 1)])


def knn_squared(x_star, x, k):
    return float(((x - x_star) ** 2).sort().values[k - 1])


def _smoother(x, h):
    K = torch.exp(-0.5 * ((x[:, None] - x[None, :]) / h) ** 2)
    return K / K.sum(1, keepdim=True)


def loo_right(x, y, h):
    L = _smoother(x, h)
    return (y - L @ y) / (1 - L.diagonal())


def loo_in_sample(x, y, h):
    return y - _smoother(x, h) @ y


def loo_refit(x, y, h):
    n = len(x)
    return torch.stack(
        [
            y[i]
            - lb.nadaraya_watson(
                x[i : i + 1],
                torch.cat([x[:i], x[i + 1 :]]),
                torch.cat([y[:i], y[i + 1 :]]),
                h,
            )[0]
            for i in range(n)
        ]
    )


def loo_column(x, y, h):
    return loo_right(x, y, h)[:, None]


def ek_right(x_star, x, h):
    K = torch.exp(-0.5 * ((x - x_star) / h) ** 2)
    d = x - x_star
    w = K * ((K * d * d).sum() - d * (K * d).sum())
    return w / w.sum()


def ek_nadaraya_watson(x_star, x, h):
    K = torch.exp(-0.5 * ((x - x_star) / h) ** 2)
    return K / K.sum()


def ek_unnormalized(x_star, x, h):
    K = torch.exp(-0.5 * ((x - x_star) / h) ** 2)
    d = x - x_star
    return K * ((K * d * d).sum() - d * (K * d).sum())


def ek_numpy(x_star, x, h):
    return ek_right(x_star, x, h).numpy()


def stub(*args):
    raise NotImplementedError


RIGHT = [
    (lb.check.ch01.local_constant_fit, fit_right),
    (lb.check.ch01.knn_bandwidth, knn_right),
    (lb.check.ch02.loo_shortcut, loo_right),
    (lb.check.ch02.equivalent_kernel_1d, ek_right),
    (lb.check.ch02.equivalent_kernel_1d, ek_numpy),
]

WRONG = [
    (lb.check.ch01.local_constant_fit, fit_unnormalized, "do not sum to 1"),
    (lb.check.ch01.local_constant_fit, fit_no_half, "factor 1/2"),
    (lb.check.ch01.local_constant_fit, fit_tensor1, "shape (1,)"),
    (lb.check.ch01.knn_bandwidth, knn_off_by_one, "off by one"),
    (lb.check.ch01.knn_bandwidth, knn_squared, "not its square"),
    (lb.check.ch02.loo_shortcut, loo_in_sample, "in-sample residuals"),
    (lb.check.ch02.loo_shortcut, loo_refit, "fitted the smoother"),
    (lb.check.ch02.loo_shortcut, loo_column, "shape (4, 1) returned, (4,) expected"),
    (lb.check.ch02.equivalent_kernel_1d, ek_nadaraya_watson, "Nadaraya–Watson weights"),
    (lb.check.ch02.equivalent_kernel_1d, ek_unnormalized, "weights do not sum to 1"),
]


@pytest.mark.parametrize(
    "check,answer", RIGHT, ids=lambda v: getattr(v, "__name__", "")
)
def test_right_answer_passes(check, answer, capsys):
    assert check(answer) is True
    out = capsys.readouterr().out
    assert out.startswith("✓ ") and "correct on all" in out


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(
    "check,answer", RIGHT[:4], ids=lambda v: getattr(v, "__name__", "")
)
def test_right_answer_passes_other_seeds(check, answer, seed, capsys):
    assert check(answer, seed=seed) is True


@pytest.mark.parametrize(
    "check,answer,hint",
    WRONG,
    ids=lambda v: getattr(v, "__name__", "") if callable(v) else "",
)
def test_wrong_answer_fails_with_specific_hint(check, answer, hint, capsys):
    assert check(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("✗ ") and "case 1 of" in out  # says which case
    assert hint in out
    assert "expected" in out or "fitted" in out


@pytest.mark.parametrize("check", [c for c, _ in RIGHT[:4]], ids=lambda c: c.__name__)
def test_stub_says_not_implemented(check, capsys):
    assert check(stub) is False
    assert "not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "check,answer", RIGHT[:4], ids=lambda v: getattr(v, "__name__", "")
)
def test_crash_is_reported_not_raised(check, answer, capsys):
    def crashes(*args):
        raise ZeroDivisionError("boom")

    assert check(crashes) is False
    out = capsys.readouterr().out
    assert "raised ZeroDivisionError: boom" in out and "case 1 of" in out


def test_not_a_function(capsys):
    assert lb.check.ch01.local_constant_fit(3.0) is False
    assert "pass the function without calling it" in capsys.readouterr().out


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "1")
    with pytest.raises(AssertionError, match="do not sum to 1"):
        lb.check.ch01.local_constant_fit(fit_unnormalized)
    with pytest.raises(NotImplementedError):
        lb.check.ch02.loo_shortcut(stub)
    assert lb.check.ch02.loo_shortcut(loo_right) is True


def test_strict_mode_follows_static_when_unset(monkeypatch):
    monkeypatch.delenv("LOCALBOOK_CHECK_STRICT", raising=False)
    monkeypatch.setenv("LOCALBOOK_STATIC", "1")
    assert _common.strict_mode()
    monkeypatch.setenv("LOCALBOOK_STATIC", "0")
    assert not _common.strict_mode()
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "yes")
    assert _common.strict_mode()


def test_cases_vary_between_calls_and_repeat_with_a_seed():
    seen = []
    lb.check.ch01.knn_bandwidth(
        lambda x_star, x, k: seen.append(float(x.sum())) or knn_right(x_star, x, k)
    )
    lb.check.ch01.knn_bandwidth(
        lambda x_star, x, k: seen.append(float(x.sum())) or knn_right(x_star, x, k)
    )
    assert seen[0] != seen[6]  # a fresh case each call
    a, b = [], []
    lb.check.ch01.knn_bandwidth(
        lambda x_star, x, k: a.append(float(x.sum())) or knn_right(x_star, x, k), seed=5
    )
    lb.check.ch01.knn_bandwidth(
        lambda x_star, x, k: b.append(float(x.sum())) or knn_right(x_star, x, k), seed=5
    )
    assert a == b


def test_student_cannot_corrupt_the_reference():
    def mutates(x_star, x, y, h):
        y.zero_()
        x.mul_(0)
        return 0.0

    state = torch.random.get_rng_state()
    assert lb.check.ch01.local_constant_fit(mutates) is False
    assert torch.equal(
        state, torch.random.get_rng_state()
    )  # the global RNG is left alone


def test_counting_wrapper_restores_library_functions():
    before = (lb.nadaraya_watson, lb.local_mean.nadaraya_watson, lb.local_linear)
    lb.check.ch02.loo_shortcut(loo_refit)
    assert (
        lb.nadaraya_watson,
        lb.local_mean.nadaraya_watson,
        lb.local_linear,
    ) == before


def test_never_prints_solution_code(capsys):
    import inspect

    for check, answer, _ in WRONG:
        check(answer)
    out = capsys.readouterr().out
    for src in (
        inspect.getsource(loo_right),
        inspect.getsource(ek_right),
        inspect.getsource(fit_right),
    ):
        for line in src.splitlines()[1:]:
            assert line.strip() not in out
    assert "def " not in out and "torch." not in out


# --- chapter 3 (mean-shift step) and chapter 6 (sparsemax) -----------------------------------
def step_right(q, x, h):
    logw = -0.5 * ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1) / h**2
    return torch.softmax(logw, dim=1) @ x


def step_naive(q, x, h):  # overflows to 0/0 for a far query
    w = torch.exp(-0.5 * ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1) / h**2)
    return (w @ x) / w.sum(1, keepdim=True)


def sparsemax_right(z):
    zs = torch.sort(z, descending=True).values
    k = torch.arange(1, len(z) + 1, dtype=z.dtype)
    cs = zs.cumsum(0)
    kk = int((1 + k * zs > cs).sum())
    return torch.clamp(z - (cs[kk - 1] - 1) / kk, min=0)


@pytest.mark.parametrize(
    "check, answer, hint",
    [
        (lambda f: lb.check.ch04.mean_shift_step(f), step_right, None),
        (
            lambda f: lb.check.ch04.mean_shift_step(f),
            step_naive,
            "subtract the largest exponent",
        ),
        (
            lambda f: lb.check.ch04.mean_shift_step(f),
            lambda q, x, h: step_right(q, x, h) - q,
            "you returned the shift",
        ),
        (
            lambda f: lb.check.ch04.mean_shift_step(f),
            lambda q, x, h: (step_right(q, x, h) - q) / h**2,
            "the score",
        ),
        (lambda f: lb.check.ch08.sparsemax(f), sparsemax_right, None),
        (
            lambda f: lb.check.ch08.sparsemax(f),
            lambda z: torch.softmax(z, 0),
            "this is softmax",
        ),
        (
            lambda f: lb.check.ch08.sparsemax(f),
            lambda z: z - z.mean() + 1 / len(z),
            "clip at zero",
        ),
        (
            lambda f: lb.check.ch08.sparsemax(f),
            lambda z: torch.clamp(z - z.max() + 1, min=0),
            "sum to one",
        ),
    ],
)
def test_chapter_3_and_6_checks(check, answer, hint, capsys):
    ok = check(answer)
    out = capsys.readouterr().out
    if hint is None:
        assert ok is True and out.startswith("✓")
    else:
        assert ok is False and hint in out and "def " not in out


def test_chapter_3_and_6_checks_in_strict_mode(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "1")
    with pytest.raises(AssertionError, match="mean_shift_step"):
        lb.check.ch04.mean_shift_step(step_naive)
    with pytest.raises(AssertionError, match="sparsemax"):
        lb.check.ch08.sparsemax(lambda z: torch.softmax(z, 0))
