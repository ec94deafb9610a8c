"""Self-checks of the chapter "Learning the kernel": right answers pass, slips fail with a hint."""

import math

import pytest
import torch

import localbook as lb
from localbook.check import ch06 as check_ch06


@pytest.fixture(autouse=True)
def friendly(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "0")


def loss_right(A, x, y):
    z = x @ A.T
    logw = -0.5 * torch.cdist(z, z) ** 2
    logw.fill_diagonal_(-math.inf)
    return float(((y - torch.softmax(logw, 1) @ y) ** 2).sum())


def loss_self(A, x, y):
    z = x @ A.T
    return float(((y - torch.softmax(-0.5 * torch.cdist(z, z) ** 2, 1) @ y) ** 2).sum())


def loss_mean(A, x, y):
    return loss_right(A, x, y) / len(x)


def ab_right(x, h):
    p = lb.kde(x, x, h)
    return h * (p / torch.exp(torch.log(p).mean())) ** -0.5


def ab_power_one(x, h):
    p = lb.kde(x, x, h)
    return h * (p / torch.exp(torch.log(p).mean())) ** -1.0


def ab_stub(x, h):
    raise NotImplementedError


def test_right_answers_pass(capsys):
    assert check_ch06.loo_loss(loss_right)
    assert check_ch06.abramson(ab_right)
    assert "✓" in capsys.readouterr().out
    assert check_ch06.loo_loss(lb.mlkr_loss)  # the library's own answer (a 0-d tensor)


@pytest.mark.parametrize(
    "fn,hint", [(loss_self, "weight 0"), (loss_mean, "sum the squared")]
)
def test_loss_slips_get_hints(fn, hint, capsys):
    assert not check_ch06.loo_loss(fn)
    assert hint in capsys.readouterr().out


def test_abramson_slip_and_stub(capsys):
    assert not check_ch06.abramson(ab_power_one)
    assert "square root" in capsys.readouterr().out
    assert not check_ch06.abramson(ab_stub)
    assert "not implemented" in capsys.readouterr().out


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("LOCALBOOK_CHECK_STRICT", "1")
    with pytest.raises(AssertionError, match="MLKR"):
        check_ch06.loo_loss(loss_self)
    with pytest.raises(NotImplementedError):
        check_ch06.abramson(ab_stub)
