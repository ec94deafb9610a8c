r"""Local decisions beyond the mean: the kernel-weighted vote (the local mode classifier).

The localization method's decision at a query ``x*`` is
:math:`\hat\theta(x^*) = \arg\min_\theta \sum_i K(x^*, x_i)\,\ell(y_i, \theta)`. Squared loss gives
the local mean (Nadaraya–Watson); the 0–1 loss on class labels gives the *local mode*: the class
with the largest kernel mass, :math:`\hat y(x^*) = \arg\max_c \sum_{i: y_i = c} K(x^*, x_i)`.
It is the plug-in Bayes classifier whose class-conditional densities are kernel density
estimates with the same kernel and bandwidth (the class priors are the class frequencies).
"""
from __future__ import annotations

import torch

from ._validate import check_bandwidth, check_labels, check_points, check_query
from .kernels import local_average

__all__ = ["local_mode_classify"]


def local_mode_classify(x_query, x, labels, bandwidth, kernel: str = "gaussian",
                        return_proba: bool = False):
    r"""The local mode: the class with the largest kernel mass around each query.

    ``x_query (m, d)``, ``x (n, d)``, ``labels (n,)`` (integers or strings), ``bandwidth`` a
    float or ``(d,)``. The class probabilities are the local mean of one-hot labels,
    :math:`p_c(x^*) = \sum_{i: y_i=c} K(x^*, x_i) / \sum_i K(x^*, x_i)`; the prediction is their
    argmax (ties go to the first class in sorted order). Returns the predicted labels ``(m,)``
    and, with ``return_proba=True``, ``(labels, proba (m, c), classes (c,))``. Under a compact
    kernel a query with no point within the bandwidth has NaN probabilities (one warning) and
    gets the first class; check ``proba`` when that matters.
    """
    x = check_points(x, "x")
    xq = check_query(x_query, x)
    h = check_bandwidth(bandwidth, x.shape[1], like=x)
    classes, codes = check_labels(labels, x.shape[0], device=x.device)
    onehot = torch.nn.functional.one_hot(codes, len(classes)).to(x.dtype)
    proba, _ = local_average(xq, x, onehot, h, kernel)
    best = torch.nan_to_num(proba, nan=-1.0).argmax(dim=1)
    pred = classes[best] if isinstance(classes, torch.Tensor) else classes[best.cpu().numpy()]
    return (pred, proba, classes) if return_proba else pred
