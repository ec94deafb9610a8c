"""Embeddings: `lb.trustworthiness` and `lb.locally_linear_embedding` vs scikit-learn.

Fashion-MNIST (5,000 seeded training images, 784 pixels in [0, 1], float64), as chapter 11:
* trustworthiness (10 neighbours) of a 2-D PCA map vs `sklearn.manifold.trustworthiness`;
  the 8-bit pixels give exactly tied distances, where localbook averages over tie orders and
  scikit-learn takes its sort's order, so a 1e-9 jitter breaks the ties first and the two
  must then agree to rounding;
* LLE (10 neighbours, 2 components, ARPACK) of the 50-component PCA of the images vs
  `sklearn.manifold.LocallyLinearEmbedding(eigen_solver="arpack")`: time, and the
  trustworthiness of both maps (eigenvectors are defined up to sign and rotation within
  degenerate pairs, so the maps are compared by their score, not coordinate by coordinate).
Both sides timed by `_common.best_time` (warm, best of k).
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, configure, parser, write_section  # noqa: E402

import localbook as lb  # noqa: E402


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    if args.device != "cpu":
        print("bench_embedding: CPU section only")
        return
    configure(args)
    from sklearn.manifold import LocallyLinearEmbedding, trustworthiness

    n = 1000 if args.quick else 5000
    images, _ = lb.load_fashion_mnist("train")
    rng = np.random.default_rng(0)
    X = images[rng.choice(len(images), n, replace=False)].reshape(n, -1) / 255.0
    X = X + 1e-9 * rng.standard_normal(X.shape)  # break exactly tied distances
    Xc = X - X.mean(0)
    U, S, _ = np.linalg.svd(Xc, full_matrices=False)
    Y2, Z50 = U[:, :2] * S[:2], U[:, :50] * S[:50]
    Xt, Yt, Zt = (torch.tensor(a) for a in (X, Y2, Z50))

    rows = []
    t_ref = best_time(lambda: trustworthiness(X, Y2, n_neighbors=10), repeat=2)
    t_ours = best_time(lambda: lb.trustworthiness(Xt, Yt, n_neighbors=10), repeat=3)
    ref = trustworthiness(X, Y2, n_neighbors=10)
    got = lb.trustworthiness(Xt, Yt, n_neighbors=10)
    assert abs(got - ref) < 1e-12, (got, ref)
    rows.append(
        [
            f"trustworthiness, n = {n:,}, 784 → 2 dims",
            f"{t_ref:.3f}",
            f"{t_ours:.3f}",
            f"**{t_ref / t_ours:.1f}×**",
            f"|diff| {abs(got - ref):.0e}",
        ]
    )

    sk = LocallyLinearEmbedding(
        n_neighbors=10, n_components=2, eigen_solver="arpack", random_state=0
    )
    t_ref = best_time(lambda: sk.fit_transform(Z50), repeat=1)
    t_ours = best_time(
        lambda: lb.locally_linear_embedding(Zt, 2, 10, eigen_solver="arpack"), repeat=2
    )
    tw_ref = trustworthiness(X, sk.fit_transform(Z50), n_neighbors=10)
    ours = lb.locally_linear_embedding(Zt, 2, 10, eigen_solver="arpack")
    ours = ours[0] if isinstance(ours, tuple) else ours
    tw_ours = lb.trustworthiness(Xt, ours, n_neighbors=10)
    assert abs(tw_ours - tw_ref) < 0.01, (tw_ours, tw_ref)
    rows.append(
        [
            f"LLE (ARPACK), n = {n:,}, 50 → 2 dims",
            f"{t_ref:.3f}",
            f"{t_ours:.3f}",
            f"**{t_ref / t_ours:.1f}×**",
            f"trustworthiness {tw_ours:.4f} vs {tw_ref:.4f}",
        ]
    )
    write_section(
        "embedding",
        "cpu",
        "Embeddings: trustworthiness and LLE vs scikit-learn",
        ["case", "scikit-learn (s)", "localbook (s)", "speed-up", "agreement"],
        rows,
        f"Float64; torch and BLAS threads: {args.threads}. Fashion-MNIST training images "
        "(seeded subset). Both sides: warm-up, then best of k (`_common.best_time`). Every "
        "row asserts the agreement shown (LLE maps compared by their trustworthiness, within "
        "0.01).",
    )


if __name__ == "__main__":
    main()
