"""Self-check of the chapter "Local decisions beyond the mean" (localbook.check.ch03): a right
answer passes, typical wrong answers fail with a specific hint, strict mode raises."""

import pytest
import torch

import localbook as lb


@pytest.fixture(autouse=True)
def friendly(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "0")


def _w(x_star, x, h):
    return torch.exp(-0.5 * ((x - x_star) / h) ** 2)


def lq_right(x_star, x, y, h, q):
    w = _w(x_star, x, h)
    ys, order = torch.sort(y)
    cum = w[order].cumsum(0)
    return float(ys[int(torch.searchsorted(cum, q * cum[-1]))])


def lq_mean(x_star, x, y, h, q):
    w = _w(x_star, x, h)
    return float((w * y).sum() / w.sum())


def lq_unweighted(x_star, x, y, h, q):
    return float(torch.quantile(y, q, interpolation="lower"))


def lq_flipped(x_star, x, y, h, q):
    return lq_right(x_star, x, y, h, 1 - q)


def lq_tensor(x_star, x, y, h, q):
    return torch.tensor([lq_right(x_star, x, y, h, q)] * 2)


def lq_stub(x_star, x, y, h, q):
    raise NotImplementedError


def test_right_answer_passes(capsys):
    assert lb.check.ch03.local_quantile_1d(lq_right) is True
    assert "✓ local_quantile_1d" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lq_mean, "local mean"),
        (lq_unweighted, "weight each y_i"),
        (lq_flipped, "(1 − q)-quantile"),
        (lq_tensor, "scalar was expected"),
    ],
)
def test_typical_slips_fail_with_a_hint(fn, hint, capsys):
    assert lb.check.ch03.local_quantile_1d(fn) is False
    out = capsys.readouterr().out
    assert "✗ local_quantile_1d" in out and hint in out


def test_stub_says_not_implemented(capsys):
    assert lb.check.ch03.local_quantile_1d(lq_stub) is False
    assert "not implemented yet" in capsys.readouterr().out


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "1")
    with pytest.raises(AssertionError, match="local mean"):
        lb.check.ch03.local_quantile_1d(lq_mean)
    with pytest.raises(NotImplementedError):
        lb.check.ch03.local_quantile_1d(lq_stub)


def test_seeded_checks_are_reproducible(capsys):
    assert lb.check.ch03.local_quantile_1d(lq_right, seed=3)
    assert lb.check.ch03.local_quantile_1d(lq_right, seed=3)
