"""The scikit-learn estimators, local decisions and learned metrics against their references.

Each row times localbook and a reference computing the same numbers, in the same run, with the
same timing method (warm, best of k; `_common.best_time`), and checks they agree:

* `NadarayaWatsonRegressor` / `LocalLinearRegressor` fit + predict (n = m = 2,000, d = 2,
  float64) vs statsmodels' `KernelReg` at the same bandwidths;
* `bandwidth="loo"` (chapter 2's closed-form leave-one-out over a grid) vs `GridSearchCV`
  with `LeaveOneOut` over the same grid (n = 100): same bandwidth chosen;
* `LocalModeClassifier` (Gaussian kernel vote) vs scikit-learn's `KNeighborsClassifier` over all
  n neighbours with the same Gaussian weight function;
* `local_quantile` vs NumPy's weighted `np.quantile(..., method="inverted_cdf")` per query;
* `bilateral_filter` (window w) vs a NumPy loop over the window's offsets;
* `mlkr_loss` and its gradient vs `metric-learn`'s `MLKR._loss` (n = 2,000, d = 10, k = 3).
"""

import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, configure, parser, write_section  # noqa: E402

import localbook as lb  # noqa: E402


def _row(case, t_ref, t_ours, agree):
    return [case, f"{t_ref:.4f}", f"{t_ours:.4f}", f"**{t_ref / t_ours:.1f}×**", agree]


def smoothers(n, rows):
    from statsmodels.nonparametric.kernel_regression import KernelReg

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, 2))
    y = np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.1 * rng.normal(size=n)
    q = rng.uniform(-1, 1, (n, 2))
    bw = np.array([0.15, 0.2])
    for est, reg_type in [
        (lb.NadarayaWatsonRegressor, "lc"),
        (lb.LocalLinearRegressor, "ll"),
    ]:
        model = est(bandwidth=bw)
        kr = KernelReg(y, x, "cc", reg_type=reg_type, bw=list(bw))
        t_ref = best_time(lambda: kr.fit(q), repeat=1, warmup=0)
        t_ours = best_time(lambda: model.fit(x, y).predict(q), repeat=5)
        ref, got = kr.fit(q)[0], model.fit(x, y).predict(q)
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert rel < 1e-8, (est.__name__, rel)
        rows.append(
            _row(
                f"`{est.__name__}` fit + predict, n = m = {n:,}, d = 2 "
                "vs statsmodels `KernelReg`",
                t_ref,
                t_ours,
                f"max rel. diff. {rel:.1e}",
            )
        )


def loo_bandwidth(n, rows):
    from sklearn.model_selection import GridSearchCV, LeaveOneOut

    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (n, 1))
    y = np.sin(2 * np.pi * x[:, 0]) + 0.3 * rng.normal(size=n)
    model = lb.NadarayaWatsonRegressor(bandwidth="loo").fit(x, y)
    grid = model.loo_grid_
    search = GridSearchCV(
        lb.NadarayaWatsonRegressor(),
        {"bandwidth": list(grid)},
        cv=LeaveOneOut(),
        scoring="neg_mean_squared_error",
    )
    t_ref = best_time(lambda: search.fit(x, y), repeat=1, warmup=0)
    t_ours = best_time(
        lambda: lb.NadarayaWatsonRegressor(bandwidth="loo").fit(x, y), repeat=5
    )
    same = np.isclose(search.best_params_["bandwidth"], model.bandwidth_, rtol=1e-12)
    assert same, (search.best_params_, model.bandwidth_)
    rows.append(
        _row(
            f'`bandwidth="loo"` ({len(grid)} bandwidths), n = {n} vs '
            "`GridSearchCV(cv=LeaveOneOut())`",
            t_ref,
            t_ours,
            f"same bandwidth ({model.bandwidth_:.4f})",
        )
    )


def local_mode(n, rows):
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(2)
    x = rng.normal(size=(n, 2))
    labels = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    q = rng.normal(size=(n, 2))
    h = 0.3
    model = lb.LocalModeClassifier(bandwidth=h)
    ref_model = KNeighborsClassifier(
        n_neighbors=n, algorithm="brute", weights=lambda d: np.exp(-0.5 * (d / h) ** 2)
    )
    t_ref = best_time(lambda: ref_model.fit(x, labels).predict_proba(q), repeat=3)
    t_ours = best_time(lambda: model.fit(x, labels).predict_proba(q), repeat=5)
    diff = float(np.abs(model.predict_proba(q) - ref_model.predict_proba(q)).max())
    assert diff < 1e-10, diff
    rows.append(
        _row(
            f"`LocalModeClassifier.predict_proba`, n = m = {n:,}, 3 classes vs "
            "`KNeighborsClassifier` (all n, Gaussian weights)",
            t_ref,
            t_ours,
            f"max diff. {diff:.1e}",
        )
    )


def quantile(n, m, rows):
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, n)
    y = np.sin(2 * np.pi * x) + rng.standard_t(3, n) * 0.3
    q = np.linspace(0, 1, m)
    h, level = 0.05, 0.9
    xt, yt, qt = (torch.tensor(a) for a in (x, y, q))

    def reference():
        w = np.exp(-0.5 * ((q[:, None] - x[None, :]) / h) ** 2)
        return np.array(
            [np.quantile(y, level, weights=wi, method="inverted_cdf") for wi in w]
        )

    t_ref = best_time(reference, repeat=1, warmup=0)
    t_ours = best_time(lambda: lb.local_quantile(qt, xt, yt, h, q=level), repeat=5)
    ok = np.array_equal(reference(), lb.local_quantile(qt, xt, yt, h, q=level).numpy())
    assert ok
    rows.append(
        _row(
            f"`local_quantile` (q = 0.9), n = {n:,}, m = {m:,} vs weighted "
            '`np.quantile(method="inverted_cdf")`',
            t_ref,
            t_ours,
            "identical",
        )
    )


def bilateral(size, w, rows):
    rng = np.random.default_rng(4)
    img = np.clip(
        np.add.outer(np.arange(size), np.arange(size)) / (2 * size)
        + 0.1 * rng.normal(size=(size, size)),
        0,
        1,
    )
    s, r = 2.0, 0.1

    def reference():
        pad = np.pad(img, w, constant_values=np.nan)
        num = np.zeros_like(img)
        den = np.zeros_like(img)
        for di in range(-w, w + 1):
            for dj in range(-w, w + 1):
                nb = pad[w + di : w + di + size, w + dj : w + dj + size]
                k = np.exp(-0.5 * ((di * di + dj * dj) / s**2 + (nb - img) ** 2 / r**2))
                k = np.where(np.isnan(nb), 0.0, k)
                num += k * np.nan_to_num(nb)
                den += k
        return num / den

    t_ref = best_time(reference, repeat=3)
    it = torch.tensor(img)
    t_ours = best_time(lambda: lb.bilateral_filter(it, s, r, window=w), repeat=5)
    diff = float(
        np.abs(lb.bilateral_filter(it, s, r, window=w).numpy() - reference()).max()
    )
    assert diff < 1e-12, diff
    rows.append(
        _row(
            f"`bilateral_filter`, {size}×{size} image, window {2 * w + 1}×{2 * w + 1} "
            "vs NumPy over the window offsets",
            t_ref,
            t_ours,
            f"max diff. {diff:.1e}",
        )
    )


def mlkr(n, d, k, rows):
    try:
        import metric_learn
    except ImportError:
        print("metric-learn is not installed: MLKR row skipped")
        return
    rng = np.random.default_rng(5)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + np.sin(X[:, 1]) + 0.1 * rng.normal(size=n)
    L = rng.normal(size=(k, d)) / np.sqrt(d)
    ref_est = metric_learn.MLKR(verbose=False)
    ref_est.n_iter_ = 0
    Xt, yt = torch.tensor(X), torch.tensor(y)

    def ours():
        A = torch.tensor(np.sqrt(2.0) * L, requires_grad=True)  # its kernel has no 1/2
        loss = lb.mlkr_loss(A, Xt, yt)
        (g,) = torch.autograd.grad(loss, A)
        return loss.item(), np.sqrt(2.0) * g.numpy()

    t_ref = best_time(lambda: ref_est._loss(L.ravel(), X, y), repeat=3)
    t_ours = best_time(ours, repeat=5)
    (c_ref, g_ref), (c, g) = ref_est._loss(L.ravel(), X, y), ours()
    rel = max(
        abs(c - c_ref) / c_ref,
        float(np.abs(g.ravel() - g_ref).max() / np.abs(g_ref).max()),
    )
    assert rel < 1e-8, rel
    rows.append(
        _row(
            f"`mlkr_loss` + gradient, n = {n:,}, d = {d}, k = {k} vs metric-learn "
            "`MLKR._loss`",
            t_ref,
            t_ours,
            f"max rel. diff. {rel:.1e}",
        )
    )


def main():
    args = parser(__doc__).parse_args()
    if args.device != "cpu":
        print("bench_estimators: CPU section only (the estimators return NumPy arrays)")
        return
    configure(args)
    warnings.filterwarnings("ignore", category=FutureWarning)
    small = args.quick
    rows = []
    smoothers(300 if small else 2000, rows)
    loo_bandwidth(40 if small else 100, rows)
    local_mode(300 if small else 2000, rows)
    quantile(500 if small else 2000, 200 if small else 1000, rows)
    bilateral(64 if small else 256, 3, rows)
    mlkr(300 if small else 2000, 10, 3, rows)
    write_section(
        "estimators",
        "cpu",
        "Estimators, local decisions and learned metrics vs their references",
        ["case", "reference (s)", "localbook (s)", "speed-up", "agreement"],
        rows,
        f"Float64; torch and BLAS threads: {args.threads}. Both sides timed by "
        "`_common.best_time` (warm, best of k; statsmodels, GridSearchCV and the per-query "
        "NumPy quantile loop once, as they take seconds). Every row asserts the agreement shown.",
    )


if __name__ == "__main__":
    main()
