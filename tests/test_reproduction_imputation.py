"""Chapter 12's stored run at 60,000 references (reproductions/imputation.py): it loads, it
has what the chapter reads, and a reduced rerun agrees with it in direction."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from localbook.datasets import load_stored_run

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = ("mcar50", "block12")


def _script():
    spec = importlib.util.spec_from_file_location(
        "imputation_repro", ROOT / "reproductions" / "imputation.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _means(runs):
    return runs.groupby(["pattern", "method"])["rmse"].mean()


def check_stored_imputation_run(run):
    """What chapter 12 relies on in the stored run."""
    runs, images, prov = run["runs"], run["images"], run["provenance"]
    assert set(PATTERNS) == set(runs["pattern"])
    for pat in PATTERNS:
        got = runs[runs["pattern"] == pat]
        want = {"mean", "knn", "local_mean"} | (
            {"local_mean_mcar_tuning"} if pat == "block12" else set()
        )
        assert set(got["method"]) == want
        assert got.groupby("method")["seed"].nunique().min() >= 3
    assert np.all((runs["rmse"] > 0) & (runs["rmse"] < 1))
    assert (runs["n_ref"] == 60000).all() and (runs["n_test"] >= 500).all()
    m = _means(runs)
    for pat in PATTERNS:  # mean imputation is far behind both local means
        assert m[pat, "mean"] > 1.2 * max(m[pat, "knn"], m[pat, "local_mean"])
    # per image sums of squared errors add up to the table's RMSE
    for (pat, seed), g in images.groupby(["pattern", "seed"]):
        row = runs[(runs["pattern"] == pat) & (runs["seed"] == seed)]
        for meth, r in zip(row["method"], row["rmse"]):
            got = np.sqrt(g[f"sse_{meth}"].sum() / g["n_missing"].sum())
            assert got == pytest.approx(r, rel=1e-4)
    for key in ("command", "commit", "date", "machine", "torch", "minutes", "protocol"):
        assert key in prov
    assert prov["command"].startswith("python reproductions/imputation.py")


def test_stored_imputation_run():
    """A missing file fails here on purpose: the chapter reads it."""
    check_stored_imputation_run(load_stored_run("imputation"))


def test_reduced_rerun_agrees_in_direction(tmp_path):
    mod = _script()
    mod.main(
        ["--n-ref", "1000", "--n-test", "60", "--seeds", "1", "--jobs", "1"]
        + ["--out", str(tmp_path)]
    )
    small = pd.read_csv(tmp_path / "imputation_reproduction.csv")
    stored = load_stored_run("imputation")["runs"]
    a, b = _means(small), _means(stored)
    for pat in PATTERNS:
        for m in ("knn", "local_mean"):  # both local means beat mean imputation
            assert a[pat, m] < a[pat, "mean"] and b[pat, m] < b[pat, "mean"]
    # scattered holes: the two-layer imputer ahead of KNNImputer at both scales
    assert a["mcar50", "local_mean"] < a["mcar50", "knn"]
    assert b["mcar50", "local_mean"] < b["mcar50", "knn"]
    assert (small["n_ref"] == 1000).all()


def test_knn_rule_equals_sklearn():
    from sklearn.impute import KNNImputer

    mod = _script()
    rng = np.random.default_rng(0)
    R = rng.random((300, 49)).astype(np.float32)
    R[rng.random(R.shape) < 0.5] = np.nan
    Q = rng.random((20, 49)).astype(np.float32)
    Q[rng.random(Q.shape) < 0.5] = np.nan
    mod.CANDIDATES = 8  # forces the full-row path for some pixels
    pred, n_full = mod.knn_fill(Q, R, (1, 5, 20))
    assert n_full > 0
    for j, k in enumerate((1, 5, 20)):
        want = KNNImputer(n_neighbors=k).fit(R).transform(Q)
        got = np.where(np.isnan(Q), pred[j].numpy(), Q)
        np.testing.assert_allclose(got, want, atol=2e-6)
