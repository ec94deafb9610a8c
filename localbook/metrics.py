r"""Scores for clusterings and for the graphs behind them.

Label-only scores compare a predicted partition with the true one and do not care how the
clusters are numbered:

- :func:`clustering_accuracy` — the share of points whose predicted cluster, after the best
  one-to-one renaming of clusters (the Hungarian algorithm on the contingency table), equals the
  true class: :math:`\mathrm{ACC} = \max_{\pi} \frac1n \sum_i 1[\pi(\hat y_i) = y_i]`.
- :func:`nmi` — normalized mutual information :math:`I(y;\hat y)/\tfrac12(H(y)+H(\hat y))`
  (scikit-learn, arithmetic normalization).
- :func:`ari` — the adjusted Rand index (scikit-learn): pair agreement corrected for chance.

One score reads a graph: :func:`subspace_preserving_rate`, the share of each row's weight that
stays inside the row's own class (its subspace), :math:`\rho_i = \sum_{j: y_j = y_i} |A_{ij}|
/ \sum_j |A_{ij}|`, averaged over rows. A block-diagonal graph scores 1.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ._validate import as_tensor

__all__ = ["clustering_accuracy", "nmi", "ari", "subspace_preserving_rate"]


def _labels(labels, name: str, n: int | None = None) -> np.ndarray:
    """A 1-D array of class labels (ints, bools or strings; floats only when integer-valued)."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    if labels is None or isinstance(labels, (str, bytes)):
        raise TypeError(
            f"{name} must be a 1-D array of labels, got {type(labels).__name__}"
        )
    try:
        arr = np.asarray(labels)
    except Exception as exc:  # ragged lists
        raise TypeError(f"{name} must be a 1-D array of labels: {exc}") from None
    if arr.dtype == object or arr.dtype.kind not in "biufUS":
        raise TypeError(
            f"{name} must be a 1-D array of labels (ints or strings), got dtype {arr.dtype}"
        )
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; at least one label is needed")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or infinite values")
        if not (arr == np.round(arr)).all():
            raise ValueError(f"{name} must hold class labels; got non-integer floats")
        arr = arr.astype(np.int64)
    if n is not None and arr.shape[0] != n:
        raise ValueError(
            f"{name} has {arr.shape[0]} labels but labels_true has {n}; they must match"
        )
    return arr


def _pair(labels_true, labels_pred):
    t = _labels(labels_true, "labels_true")
    p = _labels(labels_pred, "labels_pred", t.shape[0])
    return t, p


def clustering_accuracy(labels_true, labels_pred) -> float:
    r"""Clustering accuracy under the best matching of predicted clusters to classes.

    ``ACC = max_π (1/n) Σᵢ 1[π(ŷᵢ) = yᵢ]`` over one-to-one maps π from predicted clusters to
    classes, found by the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) on the
    ``(k_pred, k_true)`` contingency table. With more clusters than classes the extra clusters
    match nothing and count as errors. Inputs: two ``(n,)`` label arrays; returns a float in [0, 1].
    """
    from scipy.optimize import linear_sum_assignment

    t, p = _pair(labels_true, labels_pred)
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    table = np.zeros((pi.max() + 1, ti.max() + 1), dtype=np.int64)
    np.add.at(table, (pi, ti), 1)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum()) / t.shape[0]


def nmi(labels_true, labels_pred) -> float:
    """Normalized mutual information ``I(y; ŷ) / mean(H(y), H(ŷ))`` (scikit-learn); ``(n,)`` labels → float."""
    from sklearn.metrics import normalized_mutual_info_score

    t, p = _pair(labels_true, labels_pred)
    return float(normalized_mutual_info_score(t, p))


def ari(labels_true, labels_pred) -> float:
    """Adjusted Rand index (scikit-learn): 1 for identical partitions, ≈ 0 for chance; ``(n,)`` labels → float."""
    from sklearn.metrics import adjusted_rand_score

    t, p = _pair(labels_true, labels_pred)
    return float(adjusted_rand_score(t, p))


def subspace_preserving_rate(graph, labels, per_row: bool = False):
    r"""Share of each row's weight that stays inside the row's own subspace.

    ``ρᵢ = Σ_{j: yⱼ = yᵢ} |Aᵢⱼ| / Σⱼ |Aᵢⱼ|`` for a graph ``A (n, n)`` (any real weights; their
    absolute values count) and the true labels ``y (n,)``. Returns the mean of ``ρᵢ`` over rows as a
    float, or the ``(n,)`` tensor of ``ρᵢ`` with ``per_row=True``. A row with no weight at all
    has no rate: it gets NaN, is left out of the mean, and one ``UserWarning`` gives their number.
    """
    a = as_tensor(graph, "graph", ndim=(2,))
    if a.shape[0] != a.shape[1]:
        raise ValueError(
            f"graph must be a square (n, n) matrix, got shape {tuple(a.shape)}"
        )
    y = _labels(labels, "labels")
    if y.shape[0] != a.shape[0]:
        raise ValueError(
            f"labels has {y.shape[0]} entries but graph has {a.shape[0]} rows; they must match"
        )
    _, yi = np.unique(y, return_inverse=True)
    yt = torch.as_tensor(yi, device=a.device)
    same = yt[:, None] == yt[None, :]
    w = a.detach().abs()
    total = w.sum(1)
    inside = torch.where(same, w, torch.zeros_like(w)).sum(1)
    empty = total == 0
    rate = inside / torch.where(empty, torch.ones_like(total), total)
    if bool(empty.any()):
        n_empty = int(empty.sum())
        warnings.warn(
            f"{n_empty} of {a.shape[0]} graph rows have no weight; their rate is NaN and is "
            "left out of the mean",
            UserWarning,
            stacklevel=2,
        )
        rate = torch.where(empty, torch.full_like(rate, float("nan")), rate)
    if per_row:
        return rate
    if bool(empty.all()):
        return float("nan")
    return float(rate[~empty].mean())
