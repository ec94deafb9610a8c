"""scikit-learn estimators over localbook's local means (``Pipeline``/``GridSearchCV`` ready).

Each estimator takes and returns numpy arrays, validates its input the scikit-learn way
(``validate_data``: ``n_features_in_``, NaN/inf and sparse input rejected with clear messages),
and calls the torch functions underneath: ``device=None`` computes on the CPU, ``device="cuda"``
on a GPU. Fitting stores the training data (a local mean is a lazy learner).

``bandwidth="loo"`` picks the bandwidth that minimizes the closed-form leave-one-out error
(chapter 2: :math:`(y_i - \\hat y_i)/(1 - L_{ii})`, no refits) over a geometric grid; the chosen
value is ``bandwidth_``.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .kernels import KERNELS
from .local_decisions import local_mode_classify
from .local_mean import local_linear, nadaraya_watson, select_bandwidth

__all__ = ["NadarayaWatsonRegressor", "LocalLinearRegressor", "LocalModeClassifier"]


def _check_params(est):
    """Hyper-parameters are checked at fit time (scikit-learn's convention), naming the parameter."""
    bw = est.bandwidth
    if isinstance(bw, str):
        if bw != "loo":
            raise ValueError(
                f"bandwidth must be a positive number, a (n_features,) array or 'loo', got {bw!r}"
            )
    elif isinstance(bw, bool) or not (isinstance(bw, numbers.Real) or np.ndim(bw) == 1):
        raise TypeError(
            f"bandwidth must be a positive number, a (n_features,) array or 'loo', got {bw!r}"
        )
    if est.kernel not in KERNELS:
        raise ValueError(
            f"unknown kernel {est.kernel!r}; expected one of {sorted(KERNELS)}"
        )


def _check_loo(X, method: str):
    """``bandwidth="loo"`` needs points to leave out: the error names X and the cause."""
    n, d = X.shape
    if n < 2:
        raise ValueError(
            f"bandwidth='loo' leaves one sample out at a time, so X needs at least 2 "
            f"samples; got {n}. Pass a number as bandwidth instead"
        )
    if method == "ll" and n <= d + 1:
        raise ValueError(
            f"bandwidth='loo' with local linear regression needs more than n_features + 1 = "
            f"{d + 1} samples in X (with n <= d + 1 the fitted plane interpolates every "
            f"sample and leave-one-out is undefined); got {n} samples of {d} features"
        )


def _tensor(X, device):
    return torch.as_tensor(np.ascontiguousarray(X), device=device)


def _numpy(t):
    return t.detach().cpu().numpy()


class _LocalSmoother(RegressorMixin, BaseEstimator):
    """Shared fit/predict of the local-mean regressors; subclasses set ``_method``."""

    _method = "nw"

    def __init__(self, bandwidth=1.0, kernel="gaussian", device=None):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.device = device

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags

    def fit(self, X, y):
        """Store the training data (and choose the bandwidth when ``bandwidth="loo"``)."""
        _check_params(self)
        X, y = validate_data(
            self,
            X,
            y,
            dtype=[np.float64, np.float32],
            multi_output=True,
            y_numeric=True,
        )
        self.X_fit_ = X
        self.y_fit_ = y.astype(X.dtype, copy=False)
        if isinstance(self.bandwidth, str):  # "loo"
            _check_loo(X, self._method)
            sel = select_bandwidth(
                _tensor(X, self.device),
                _tensor(self.y_fit_, self.device),
                kernel=self.kernel,
                method=self._method,
            )
            self.bandwidth_ = sel.bandwidth
            self.loo_grid_, self.loo_scores_ = _numpy(sel.grid), _numpy(sel.scores)
        else:
            self.bandwidth_ = self.bandwidth
        return self

    def predict(self, X):
        """The local estimate at each row of ``X``: ``(n,)`` or ``(n, n_outputs)``."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=self.X_fit_.dtype, reset=False)
        fn = nadaraya_watson if self._method == "nw" else local_linear
        bw = self.bandwidth_
        bw = bw if isinstance(bw, numbers.Real) else np.asarray(bw, dtype=X.dtype)
        out = fn(
            _tensor(X, self.device),
            _tensor(self.X_fit_, self.device),
            _tensor(self.y_fit_, self.device),
            bw,
            self.kernel,
        )
        return _numpy(out)


class NadarayaWatsonRegressor(_LocalSmoother):
    """Nadaraya–Watson regression, ``ŷ(x) = Σᵢ K(x, xᵢ) yᵢ / Σᵢ K(x, xᵢ)``.

    Parameters: ``bandwidth`` (float, ``(n_features,)`` array, or ``"loo"``), ``kernel`` (a name
    in :data:`localbook.KERNELS`), ``device`` (``None``: CPU). See
    :func:`localbook.nadaraya_watson`.
    """

    _method = "nw"


class LocalLinearRegressor(_LocalSmoother):
    """Local linear regression: a kernel-weighted least-squares line at each query.

    Same parameters as :class:`NadarayaWatsonRegressor`; see :func:`localbook.local_linear`
    (the weighted least-squares solve, with ``numpy.linalg.lstsq``'s default cutoff).
    """

    _method = "ll"


class LocalModeClassifier(ClassifierMixin, BaseEstimator):
    """The local mode: the class with the largest kernel mass around the query.

    ``predict_proba`` is the local mean of one-hot labels; ``predict`` its argmax. With a compact
    kernel a query with no training point within the bandwidth has no vote: ``predict`` raises a
    ``ValueError`` saying how many such queries there are (use a larger bandwidth or the Gaussian).
    See :func:`localbook.local_mode_classify`.
    """

    def __init__(self, bandwidth=1.0, kernel="gaussian", device=None):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.device = device

    def fit(self, X, y):
        """Store the training data and the classes."""
        _check_params(self)
        if isinstance(self.bandwidth, str):
            raise ValueError(
                "bandwidth='loo' is for the regressors; choose a classifier's "
                "bandwidth with GridSearchCV"
            )
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, self.y_codes_ = np.unique(y, return_inverse=True)
        self.X_fit_ = X
        return self

    def predict_proba(self, X):
        """Class probabilities ``(n, n_classes)`` in the order of ``classes_``."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=self.X_fit_.dtype, reset=False)
        bw = self.bandwidth
        bw = bw if isinstance(bw, numbers.Real) else np.asarray(bw, dtype=X.dtype)
        _, proba, codes = local_mode_classify(
            _tensor(X, self.device),
            _tensor(self.X_fit_, self.device),
            torch.as_tensor(self.y_codes_),
            bw,
            self.kernel,
            return_proba=True,
        )
        full = np.zeros((X.shape[0], len(self.classes_)), dtype=X.dtype)
        full[:, _numpy(codes)] = _numpy(
            proba
        )  # every class is present in the training codes
        return full

    def predict(self, X):
        """The class with the largest kernel mass (ties: the first in ``classes_``)."""
        proba = self.predict_proba(X)
        empty = np.isnan(proba).any(axis=1)
        if empty.any():
            raise ValueError(
                f"{int(empty.sum())} of {len(proba)} queries have no training point "
                f"within the bandwidth of the compact {self.kernel!r} kernel; use a "
                "larger bandwidth or a kernel with unbounded support"
            )
        return self.classes_[np.argmax(proba, axis=1)]
