"""Mean shift and KDE: localbook vs scikit-learn's MeanShift and KernelDensity, in one run.

* ``lb.mean_shift(kernel="uniform")`` vs ``sklearn.cluster.MeanShift`` on 2-D blobs, n = 2,000 and
  10,000, seeded from every point and with ``bin_seeding``: time of both, and the results must
  agree (same number of clusters, centres within 1e-3·h, identical labels).
* ``lb.kde`` vs ``sklearn.neighbors.KernelDensity`` (Gaussian, tree with ``atol = rtol = 0``) at
  n = m = 20,000, d = 2, float64: time of both, their largest relative difference, and both
  against the exact sum on 400 queries (scikit-learn's tree is off by up to ~1e-5 relative even at
  ``rtol = 0``; localbook must be within 1e-10).
* Peak extra memory of localbook's largest runs (CPU: peak RSS growth in a fresh process; CUDA:
  ``torch.cuda.max_memory_allocated``).

``--threads`` (default 1) sets torch's threads and, through threadpoolctl, the BLAS/OpenMP
threads of NumPy and scikit-learn (``_common.configure``); MeanShift's seed loop and
KernelDensity's tree are single-threaded code whatever that setting. Both sides are timed the
same way (``_common.best_time``: a warm-up call, then the best of k). Each kernel sum is also
reported as a fraction of the exp roofline (``_common.exp_throughput``: ``torch.exp`` on float64
values in cache-sized tiles, measured in the same run). ``--full`` adds scikit-learn's slowest
case (n = 10,000 seeded from every point), which takes minutes.
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    best_time,
    configure,
    engine_line,
    exp_throughput,
    parser,
    peak_rss_delta,
    pytorch_engine,
    roofline,
    roofline_interleaved,
    target_line,
    write_section,
)

import localbook as lb  # noqa: E402


def blobs(n: int):
    centers = torch.tensor(
        [[0.0, 0.0], [6.0, 1.0], [2.0, 6.0], [-5.0, 4.0], [-3.0, -5.0]],
        dtype=torch.float64,
    )
    x, _, _ = lb.datasets.make_blobs(
        n, centers=centers, std=1.0, seed=0, dtype=torch.float64
    )
    return x


def pair_count(fn) -> int:
    """Kernel evaluations of one mean-shift call: Σ over its steps of (distinct seeds × n)."""
    import localbook.modes as dens

    step, total = dens._local_step, [0]

    def counting(x, h, kern):
        side = step(x, h, kern)

        def count(q):
            total[0] += q.shape[0] * x.shape[0]
            return side(q)

        return count

    dens._local_step = counting
    try:
        fn()
    finally:
        dens._local_step = step
    return total[0]


def main():
    p = parser(__doc__)
    p.add_argument(
        "--full",
        action="store_true",
        help="also n = 10,000 seeded from every point (slow in scikit-learn)",
    )
    args = p.parse_args()
    dev = args.device
    threads = configure(args)
    from sklearn.cluster import MeanShift
    from sklearn.metrics import adjusted_rand_score
    from sklearn.neighbors import KernelDensity

    exp_rate = exp_throughput(4e7 if args.quick else 4e8, dev)
    print(f"exp roofline: {exp_rate:.3g} float64 exp/s", flush=True)
    h = 1.5
    sizes = (
        [(400, False), (400, True), (2000, True)]
        if args.quick
        else [(2000, False), (2000, True), (10_000, True)]
    )
    if args.full and not args.quick:
        sizes.append((10_000, False))
    rows, targets = [], []
    for n, bins in sizes:
        x = blobs(n)
        xd = x.to(dev)
        slow = not bins  # seeded from every point: seconds per scikit-learn call
        t_ref = best_time(
            lambda: MeanShift(bandwidth=h, bin_seeding=bins).fit(x.numpy()),
            "cpu",
            repeat=1 if slow else 3,
        )
        sk = MeanShift(bandwidth=h, bin_seeding=bins).fit(x.numpy())
        t_ours = best_time(
            lambda: lb.mean_shift(xd, h, kernel="uniform", bin_seeding=bins),
            dev,
            repeat=5,
        )
        res = lb.mean_shift(xd, h, kernel="uniform", bin_seeding=bins)
        pairs = pair_count(
            lambda: lb.mean_shift(xd, h, kernel="uniform", bin_seeding=bins)
        )
        modes, labels = res.modes.cpu().numpy(), res.labels.cpu().numpy()
        assert modes.shape == sk.cluster_centers_.shape, (
            modes.shape,
            sk.cluster_centers_.shape,
        )
        gap = float(np.abs(modes - sk.cluster_centers_).max())
        ari = adjusted_rand_score(sk.labels_, labels)
        assert gap < 1e-3 * h and ari == 1.0, (gap, ari)
        seeds = "bin seeding" if bins else "every point a seed"
        rows.append(
            [
                f"mean shift (flat), n = {n:,}, {seeds}, {len(modes)} clusters",
                f"{t_ref:.2f}",
                f"{t_ours:.3f}",
                f"**{t_ref / t_ours:.0f}×**",
                roofline(pairs, t_ours, exp_rate),
                f"centre gap {gap:.0e}, ARI {ari:.0f}",
            ]
        )
        if bins and n == (2000 if args.quick else 10_000):
            targets.append(
                target_line(
                    f"mean shift n = {n:,}, bin seeding, vs MeanShift",
                    t_ref / t_ours,
                    20,
                )
            )
        print(rows[-1], flush=True)

    m = 2000 if args.quick else 20_000
    g = torch.Generator().manual_seed(1)
    xk = torch.randn(m, 2, generator=g, dtype=torch.float64)
    qk = 1.5 * torch.randn(m, 2, generator=g, dtype=torch.float64)
    kd = KernelDensity(bandwidth=0.3, kernel="gaussian").fit(
        xk.numpy()
    )  # atol = rtol = 0: exact
    t_ref = best_time(lambda: kd.score_samples(qk.numpy()), "cpu", repeat=2)
    ref = kd.score_samples(qk.numpy())
    xkd, qkd = xk.to(dev), qk.to(dev)
    t_ours = best_time(lambda: lb.kde(qkd, xkd, 0.3, log=True), dev, repeat=5)
    got = lb.kde(qkd, xkd, 0.3, log=True).cpu().numpy()
    rel = float(np.max(np.abs(np.expm1(got - ref))))
    # both against the exact sum (differences entry by entry, logsumexp) on 400 of the queries
    sub = slice(0, 400)
    u2 = ((qk[sub, None, :] - xk[None, :, :]) ** 2).sum(2) / 0.3**2
    exact = (
        torch.logsumexp(-0.5 * u2, 1) - np.log(m) - np.log(2 * np.pi * 0.3**2)
    ).numpy()
    err_ours = float(np.max(np.abs(np.expm1(got[sub] - exact))))
    err_ref = float(np.max(np.abs(np.expm1(ref[sub] - exact))))
    assert rel < 1e-3 and err_ours < 1e-10, (
        rel,
        err_ours,
    )  # scikit-learn's tree is the less accurate one
    rows.append(
        [
            f"Gaussian KDE, n = m = {m:,}, d = 2, float64",
            f"{t_ref:.2f}",
            f"{t_ours:.3f}",
            f"**{t_ref / t_ours:.0f}×**",
            roofline(m * m, t_ours, exp_rate),
            f"max rel. difference {rel:.0e}; error vs exact sum: scikit-learn {err_ref:.0e}, localbook {err_ours:.0e}",
        ]
    )
    if dev == "cpu":  # the same sum without the compiled loop, for comparison
        with pytorch_engine():
            t_torch = best_time(lambda: lb.kde(qkd, xkd, 0.3, log=True), dev, repeat=5)
            got_t = lb.kde(qkd, xkd, 0.3, log=True).numpy()
        err_t = float(np.max(np.abs(np.expm1(got_t[sub] - exact))))
        assert err_t < 1e-10, err_t
        rows.append(
            [
                f"Gaussian KDE, n = m = {m:,}, PyTorch engine (no compiled loop)",
                f"{t_ref:.2f}",
                f"{t_torch:.3f}",
                f"**{t_ref / t_torch:.0f}×**",
                roofline(m * m, t_torch, exp_rate),
                f"error vs exact sum {err_t:.0e}",
            ]
        )
    targets.append(
        target_line(
            f"KDE n = m = {m:,} vs KernelDensity (error vs exact sum {err_ours:.0e} ≤ 1e-6)",
            t_ref / t_ours,
            30,
        )
    )
    # the roofline fraction, with exp timed in turn with the KDE (load changes hit both)
    kde_call = lambda: lb.kde(qkd, xkd, 0.3, log=True)  # noqa: E731
    t_kde, rate_kde, frac = roofline_interleaved(kde_call, m * m, dev)
    targets.append(
        target_line(
            "KDE kernel sum, fraction of the exp roofline", 100 * frac, 80, unit=" %"
        )
    )
    scaling = [
        f"Roofline fraction of the KDE timed in turn with the exp workload ({m * m:.1e} exp "
        f"calls; best of 7 each): {t_kde:.3f} s against exp at {rate_kde:.3g} /s, "
        f"{100 * frac:.0f} %."
    ]
    if dev == "cpu" and threads > 1:
        # the same at one thread: how the loop and exp each scale with the second thread
        torch.set_num_threads(1)
        t1, rate1, frac1 = roofline_interleaved(kde_call, m * m, dev)
        torch.set_num_threads(threads)
        scaling.append(
            f"At 1 thread: {t1:.3f} s against exp at {rate1:.3g} /s, {100 * frac1:.0f} %; "
            f"from 1 to {threads} threads `torch.exp` speeds up {rate_kde / rate1:.2f}× and "
            f"the KDE {t1 / t_kde:.2f}×."
        )

    # peak extra memory of the largest runs
    n_big = 2000 if args.quick else 10_000
    if dev == "cuda":
        mems = []
        for fn in (
            lambda: lb.mean_shift(blobs(n_big).to(dev), h, kernel="uniform"),
            lambda: lb.kde(qkd, xkd, 0.3),
        ):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            mems.append((torch.cuda.max_memory_allocated() - base) / 2**20)
    else:
        mems = [
            peak_rss_delta(
                "import sys, torch; sys.path.insert(0, %r)\n"
                % str(Path(__file__).resolve().parent)
                + "import localbook as lb\nfrom bench_density import blobs\n"
                f"def setup():\n    torch.set_num_threads({threads}); x = blobs({n_big}); "
                "lb.mean_shift(x[:100], 1.5, kernel='uniform'); return x\n"
                "def run(x):\n    lb.mean_shift(x, 1.5, kernel='uniform')\n"
            ),
            peak_rss_delta(
                "import torch, localbook as lb\n"
                f"def setup():\n    torch.set_num_threads({threads}); g = torch.Generator().manual_seed(1)\n"
                f"    x = torch.randn({m}, 2, generator=g, dtype=torch.float64); q = 1.5 * torch.randn({m}, 2, generator=g, "
                "dtype=torch.float64)\n    lb.kde(q[:10], x, 0.3); return q, x\n"
                "def run(s):\n    lb.kde(s[0], s[1], 0.3)\n"
            ),
        ]
    rows.append(
        [
            f"peak extra memory: mean shift n = {n_big:,} / KDE n = m = {m:,}",
            "—",
            "—",
            "—",
            "—",
            f"{mems[0]:.0f} MiB / {mems[1]:.0f} MiB",
        ]
    )
    side = (
        f"torch and BLAS threads: {threads}" if dev == "cpu" else "localbook on the GPU"
    )
    write_section(
        "density",
        dev,
        "Mean shift and KDE vs scikit-learn",
        [
            "case",
            "scikit-learn (s)",
            "localbook (s)",
            "speed-up",
            "exp roofline",
            "agreement / memory",
        ],
        rows,
        f"{side}; scikit-learn's MeanShift seed loop and KernelDensity tree run single-threaded. Mean-shift "
        f"bandwidth h = {h}, 2-D blobs (5 centres, unit variance). Times: a warm-up call, then the best of 5 "
        '(localbook), 3 (scikit-learn; 2 for KDE, 1 when seeded from every point). "exp roofline": kernel '
        f"evaluations per second (mean shift: distinct seeds × n summed over the steps) divided by the "
        f"throughput of `torch.exp` on float64 in cache-sized tiles, {exp_rate:.3g} /s in this run.\n\n"
        f"{engine_line()}. " + " ".join(scaling) + "\n\n"
        "Targets (issue 18): " + "; ".join(targets) + ".",
    )


if __name__ == "__main__":
    main()
