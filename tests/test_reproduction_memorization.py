"""The stored run of reproductions/memorization.py loads, and a reduced rerun of the script
agrees with it in the directions chapter 10 claims."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import localbook as lb

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "reproductions" / "memorization.py"
PAIRS = [("RF h1+h2", "RF h1+h4"), ("NTK σ'=h0+h1", "NTK σ'=h0+h3")]


def _run(out: Path, *extra: str) -> pd.DataFrame:
    cmd = [sys.executable, str(SCRIPT), "--small", "--threads", "1", "--out", str(out)]
    subprocess.run([*cmd, *extra], check=True, capture_output=True, timeout=300)
    return pd.read_csv(out / "memorization_curves.csv")


def _directions(df: pd.DataFrame) -> dict:
    """The signs the chapter asserts, from per-model means over trials (α = 0.5)."""
    df = df[df.alpha == 0.5]
    m = df.groupby(["model", "N"])[
        ["spurious_resample", "spurious_zero", "test_accuracy"]
    ].mean()
    out = {}
    for model in df.model.unique():
        t = m.loc[model]
        out[f"{model}: zeroed never below resampled, above at the last N"] = bool(
            (t.spurious_zero >= t.spurious_resample).all()
            and t.spurious_zero.iloc[-1] > t.spurious_resample.iloc[-1]
        )
        out[f"{model}: spurious falls"] = bool(
            t.spurious_resample.iloc[0] > t.spurious_resample.iloc[-1]
        )
        out[f"{model}: test rises"] = bool(
            t.test_accuracy.iloc[-1] > t.test_accuracy.iloc[0]
        )
    for a, b in PAIRS:
        out[f"{a} above {b}"] = bool(
            m.loc[a].spurious_resample.mean() > m.loc[b].spurious_resample.mean()
        )
    return out


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("memo")
    return _run(out), json.loads((out / "memorization_reproduction.json").read_text())


def test_stored_run_loads_with_provenance():
    run = lb.datasets.load_stored_run("memorization")
    df, prov = run["curves"], run["provenance"]
    assert {"seed", "N", "model", "spurious_resample", "spurious_zero"} <= set(df)
    for key in ["command", "commit", "date", "machine", "torch", "minutes", "protocol"]:
        assert key in prov, key
    assert df.seed.nunique() == prov["trials_done"]
    # every trial holds every model and every N of the protocol
    counts = df.groupby(["alpha", "model", "N"]).seed.nunique()
    assert (counts == prov["trials_done"]).all()
    assert sorted(df.N.unique()) == sorted(prov["protocol"]["n_grid"])
    assert (
        df[["spurious_resample", "spurious_zero", "test_accuracy"]]
        .stack()
        .between(0, 1)
        .all()
    )


def test_small_rerun_agrees_in_direction_with_stored(small):
    df, prov = small
    assert prov["protocol"]["d"] < 100 and prov["trials_done"] == 3
    stored = _directions(lb.datasets.load_stored_run("memorization")["curves"])
    rerun = _directions(df)
    assert all(stored.values()), {k: v for k, v in stored.items() if not v}
    assert rerun == stored


def test_float32_features_match_float64(monkeypatch):
    # the same weights in both precisions (drawn in float64, then rounded), so that only
    # the precision of the features differs: the kernels agree to float32 accuracy and the
    # accuracies to at most one sign flip
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("memo_repro", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    draw = mod.lb.gaussian_weights
    monkeypatch.setattr(
        mod.lb,
        "gaussian_weights",
        lambda k, d, gen, dtype=None: draw(k, d, gen, dtype=torch.float64).to(dtype),
    )
    gen = torch.Generator().manual_seed(0)
    Z = mod.lb.spurious_gaussian_data(300, 60, 0.5, gen, dtype=torch.float64)[0]
    K = {
        dt: mod.kernels(
            Z.to(dt),
            100,
            "rf",
            ["h1+h4"],
            3000,
            1000,
            torch.Generator().manual_seed(1),
            dt,
        )["h1+h4"]
        for dt in (torch.float32, torch.float64)
    }
    rel = (K[torch.float32] - K[torch.float64]).abs().max() / K[
        torch.float64
    ].abs().max()
    assert float(rel) < 1e-5
    rows = {
        dt: pd.DataFrame(mod.run_config(0.5, 0, mod.SMALL, dt))
        for dt in (torch.float32, torch.float64)
    }
    a, b = rows[torch.float32], rows[torch.float64]
    cols = ["test_accuracy", "spurious_resample", "spurious_zero"]
    diff = (a[cols] - b[cols]).abs()
    # one sign flip changes an accuracy by 1/n_test (test) or 1/N (spurious): allow one
    assert (diff.test_accuracy <= 1 / a.n_test + 1e-12).all()
    for col in cols[1:]:
        assert (diff[col] <= 1 / a.N + 1e-12).all()
