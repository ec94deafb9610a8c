"""The bad-input catalogue: every public function of ``localbook.__all__`` that takes arrays,
fed hostile inputs (issue 27).

Each entry of ``TABLE`` is a valid call (a factory of fresh keyword arguments) and the role of
each array argument. From it every bad input is derived: NaN, ±inf, empty arrays, a wrong rank,
mismatched lengths, wrong dtypes (bool, complex, int, str, Python lists, float32 beside float64
partners), non-positive or non-finite bandwidth-like numbers, out-of-range indices, and the
whole call in float16/bfloat16/float32. hypothesis draws the details (which entry is NaN, the
sign of an infinity, the bad number), derandomized by the ``ci`` profile of ``conftest.py``.

Every input must end in exactly one of

* a **correct result**: finite, the shape of the float64 result on the same values, no float64
  partner downcast, and equal to that float64 result within ``TOL_ULPS`` units of the output
  dtype's epsilon times the result's scale (``half_tol`` of the entry where an iteration or a
  solve amplifies rounding, stated in the table);
* a **clear error**: ``ValueError``/``TypeError`` whose message names the argument;
* a **documented warning with NaN**: a ``UserWarning`` and NaN in the result.

Anything else is a failure: a **silent wrong** result (a finite answer to an invalid input, a
NaN without a warning, a value or dtype off the float64 result), an error naming another
argument, or a **crash** (any other exception, e.g. a RuntimeError/IndexError from inside torch).

``LOCALBOOK_CATALOGUE_COUNTS=file.md pytest tests/test_bad_inputs.py`` writes the counts table
of ``tests/README.md``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from collections import Counter
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import localbook as lb

pytestmark = pytest.mark.faults

F64 = torch.float64
TOL_ULPS = 8  # default tolerance: 8 eps of the output dtype times the result's scale
# what an input must give: an error or warning+NaN (BAD), the float64 result or an error
# (GOOD), any finite result or an error (EITHER)
BAD, GOOD, EITHER = "bad", "good", "either"


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def pts(n=6, d=2, seed=0, scale=3.0):
    """``(n, d)`` float64 points, spread over a few units (so rounding to int keeps them apart)."""
    return scale * torch.randn(n, d, generator=_gen(seed), dtype=F64)


def vec(n=6, seed=1, scale=1.0):
    return scale * torch.randn(n, generator=_gen(seed), dtype=F64)


def lab(n=6, c=2):
    return torch.arange(n) % c


# ------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------
# Argument roles:
#   "F"  float array (points, values, images)         "F+" float array of positive entries
#   "I"  integer index array (class ids, triplets, tokens)
#   "L"  class labels (integers or strings)           "M"  boolean mask
#   "P"  bandwidth-like number (valid range in `params`) "V"  a list of float arrays (views)


@dataclasses.dataclass
class Case:
    call: Callable
    make: Callable[[], dict]
    roles: Dict[str, str]
    tied: Tuple[Tuple[str, ...], ...] = ()  # leading lengths that must agree
    cols: Tuple[Tuple[str, ...], ...] = ()  # trailing sizes that must agree
    free_rank: Tuple[str, ...] = ()  # arrays of any rank (batched)
    nan_ok: Tuple[str, ...] = ()  # NaN is a legal value (a missing entry)
    params: Dict[str, str] = dataclasses.field(
        default_factory=dict
    )  # P: "pos" "nonneg" ...
    half_tol: Optional[float] = (
        None  # tolerance in eps of the output dtype (half precision)
    )
    f32_tol: Optional[float] = None  # same, float32
    skip: Tuple[
        str, ...
    ] = ()  # mutation labels that do not apply (with a reason in a comment)
    pick: Optional[Callable] = (
        None  # the part of a result judged (e.g. without a documented inf)
    )
    scalar_ok: Tuple[str, ...] = ()  # arrays that may also be a number
    kinds: Dict[str, str] = dataclasses.field(
        default_factory=dict
    )  # label -> kind override
    no_downcast: Optional[bool] = None  # None: checked when two float arrays are passed
    aliases: Dict[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    messages: Optional[str] = (
        None  # a regex of foreign messages accepted as clear errors
    )
    examples: int = 2  # hypothesis examples; each tries every mutation of the case


def _views(n=6, seed=0):
    return [pts(n, 3, seed), pts(n, 2, seed + 1)]


# scikit-learn's own input checks (validate_data) name the estimator, not the argument
SKLEARN = (
    r"Found array with|Expected 2D array|Complex data not supported|inconsistent "
    r"numbers of samples|Input should have at least 1 dimension|Unknown label type"
)
SKLEARN_CASE = dict(
    messages=SKLEARN,
    no_downcast=False,  # float32 X is kept (preserves_dtype)
    kinds={"X:str": GOOD, "y:str": GOOD},
)  # numeric strings are converted


def _nw_est(name):
    def call(X, y):
        est = getattr(lb, name)(bandwidth=1.0)
        return est.fit(X, y).predict(X)

    return call


def _imputer(X):
    return lb.LocalMeanImputer(n_neighbors=2).fit_transform(X)


def _holes(n=6, d=4, seed=0):
    X = pts(n, d, seed)
    X[0, 1] = X[n // 2, 3] = X[n - 1, 0] = math.nan
    return X


def _sagl_out():
    views = lb.standardize_views(_views())
    torch.manual_seed(0)
    model = lb.SparseAttentionGraph([3, 2], latent_dim=4, hidden_dim=4).double()
    index = lb.view_candidates(views, 3)
    with torch.no_grad():
        return model(views, index)


def _lm():
    torch.manual_seed(0)
    return lb.DiscreteKernel(5, rank=2)


def _tokens(T=24, V=5):
    return torch.arange(T) * 7 % V


# the samplers' state follows x_init's dtype; a wrong width is reported by the denoiser
SAMPLER = dict(
    scalar_ok=("sigmas",),
    no_downcast=False,
    cols=(("x_init",),),
    aliases={"x_init": ("x_noisy",)},
)


def _dae():
    return lb.DenoisingAutoencoder(2, hidden=4, depth=1, seed=0).double()


def _query_data_bandwidth(call, **extra) -> "Case":
    """The row of ``call(x_query, x, bandwidth)``: query and data share their columns."""
    return Case(
        call,
        lambda: dict(x_query=pts(3), x=pts(), bandwidth=1.5),
        {"x_query": "F", "x": "F", "bandwidth": "P"},
        cols=(("x_query", "x"),),
        params={"bandwidth": "pos"},
        **extra,
    )


TABLE: Dict[str, Case] = {
    # ---- kernels
    "kernel_profile": Case(
        lb.kernel_profile, lambda: dict(u=vec().abs()), {"u": "F"}, free_rank=("u",)
    ),
    "kernel_matrix": _query_data_bandwidth(lb.kernel_matrix),
    "scaled_sq_dist": Case(
        lb.scaled_sq_dist,
        lambda: dict(xq=pts(3), x=pts(), h=torch.ones(2, dtype=F64)),
        {"xq": "F", "x": "F", "h": "F+"},
        cols=(("xq", "x", "h"),),
        scalar_ok=("h",),
    ),
    "knn_search": Case(
        lb.knn_search,
        lambda: dict(x_query=pts(3), x=pts(), n_neighbors=2),
        {"x_query": "F", "x": "F"},
        cols=(("x_query", "x"),),
    ),
    # ---- local means
    "nadaraya_watson": Case(
        lb.nadaraya_watson,
        lambda: dict(x_query=pts(3), x=pts(), y=vec(), bandwidth=1.5),
        {"x_query": "F", "x": "F", "y": "F", "bandwidth": "P"},
        tied=(("x", "y"),),
        cols=(("x_query", "x"),),
        params={"bandwidth": "pos"},
    ),
    "local_linear": Case(
        lb.local_linear,
        lambda: dict(x_query=pts(3), x=pts(), y=vec(), bandwidth=3.0),
        {"x_query": "F", "x": "F", "y": "F", "bandwidth": "P"},
        tied=(("x", "y"),),
        cols=(("x_query", "x"),),
        params={"bandwidth": "pos"},
        half_tol=64,
        f32_tol=64,
    ),
    "equivalent_kernel": Case(
        lb.equivalent_kernel,
        lambda: dict(x_query=pts(3), x=pts(), bandwidth=3.0),
        {"x_query": "F", "x": "F", "bandwidth": "P"},
        cols=(("x_query", "x"),),
        params={"bandwidth": "pos"},
        half_tol=64,
        f32_tol=64,
    ),
    "knn_regress": Case(
        lb.knn_regress,
        lambda: dict(x_query=pts(3), x=pts(), y=vec(), n_neighbors=2),
        {"x_query": "F", "x": "F", "y": "F"},
        tied=(("x", "y"),),
        cols=(("x_query", "x"),),
    ),
    "knn_classify": Case(
        lb.knn_classify,
        lambda: dict(x_query=pts(3), x=pts(), labels=lab(), n_neighbors=3),
        {"x_query": "F", "x": "F", "labels": "L"},
        tied=(("x", "labels"),),
        cols=(("x_query", "x"),),
    ),
    "knn_bandwidth": Case(
        lb.knn_bandwidth,
        lambda: dict(x_query=pts(3), x=pts(), n_neighbors=2),
        {"x_query": "F", "x": "F"},
        cols=(("x_query", "x"),),
    ),
    "adaptive_nadaraya_watson": Case(
        lb.adaptive_nadaraya_watson,
        lambda: dict(x_query=pts(3), x=pts(), y=vec(), n_neighbors=3, scale=1.0),
        {"x_query": "F", "x": "F", "y": "F", "scale": "P"},
        tied=(("x", "y"),),
        cols=(("x_query", "x"),),
        params={"scale": "pos"},
    ),
    "loo_cv_score": Case(
        lb.loo_cv_score,
        lambda: dict(x=pts(8, 1, scale=1.0), y=vec(8), bandwidth=1.0),
        {"x": "F", "y": "F", "bandwidth": "P"},
        tied=(("x", "y"),),
        params={"bandwidth": "pos"},
    ),
    "select_bandwidth": Case(
        lb.select_bandwidth,
        lambda: dict(
            x=pts(12, 1),
            y=torch.sin(pts(12, 1)[:, 0]),
            bandwidths=torch.tensor([0.3, 0.5, 1.0, 2.0], dtype=F64),
        ),
        {"x": "F", "y": "F", "bandwidths": "F+"},
        tied=(("x", "y"),),
        pick=lambda r: (r.bandwidth, r.grid),
        examples=1,
    ),  # scores: inf where L_ii = 1 (documented)
    # ---- denoising
    "tweedie_denoise": Case(
        lb.tweedie_denoise,
        lambda: dict(x_noisy=pts(3), x_train=pts(), sigma=1.5),
        {"x_noisy": "F", "x_train": "F", "sigma": "P"},
        cols=(("x_noisy", "x_train"),),
        params={"sigma": "pos"},
    ),
    "empirical_score": Case(
        lb.empirical_score,
        lambda: dict(x_query=pts(3), x_train=pts(), sigma=1.5),
        {"x_query": "F", "x_train": "F", "sigma": "P"},
        cols=(("x_query", "x_train"),),
        params={"sigma": "pos"},
    ),
    "empirical_denoiser": Case(
        lambda x_train: lb.empirical_denoiser(x_train)(pts(3), 1.5),
        lambda: dict(x_train=pts()),
        {"x_train": "F"},
        cols=(("x_train",),),
    ),  # the queries have 2 columns
    "gaussian_mixture_denoise": Case(
        lb.gaussian_mixture_denoise,
        lambda: dict(
            x_noisy=pts(3),
            means=pts(2, seed=5),
            stds=torch.tensor([0.5, 1.0], dtype=F64),
            sigma=1.0,
            weights=torch.tensor([0.3, 0.7], dtype=F64),
        ),
        {"x_noisy": "F", "means": "F", "stds": "F+", "sigma": "P", "weights": "F+"},
        tied=(("means", "stds", "weights"),),
        cols=(("x_noisy", "means"),),
        params={"sigma": "pos"},
        scalar_ok=("stds",),
    ),
    "annealed_langevin": Case(
        lambda x_init, sigmas: lb.annealed_langevin(
            lb.empirical_denoiser(pts()), x_init, sigmas, n_steps=2, generator=_gen(3)
        ),
        lambda: dict(x_init=pts(3), sigmas=torch.tensor([2.0, 1.0, 0.5], dtype=F64)),
        {"x_init": "F", "sigmas": "F+"},
        half_tol=256,
        f32_tol=64,
        **SAMPLER,
        examples=1,
    ),
    "probability_flow_sample": Case(
        lambda x_init, sigmas: lb.probability_flow_sample(
            lb.empirical_denoiser(pts()), x_init, sigmas
        ),
        lambda: dict(x_init=pts(3), sigmas=torch.tensor([2.0, 1.0, 0.5], dtype=F64)),
        {"x_init": "F", "sigmas": "F+"},
        half_tol=64,
        **SAMPLER,
        examples=1,
    ),
    "train_dae": Case(
        lambda x_train, sigmas: lb.train_dae(
            _dae(), x_train, sigmas, n_steps=2, batch_size=4, progress=False
        ),
        lambda: dict(x_train=pts(), sigmas=torch.tensor([1.0, 0.5], dtype=F64)),
        {"x_train": "F", "sigmas": "F+"},
        scalar_ok=("sigmas",),
        no_downcast=False,
    ),
    "DenoisingAutoencoder": Case(
        lambda x: _dae()(x, 0.5), lambda: dict(x=pts()), {"x": "F"}
    ),
    "hopfield_retrieve": Case(
        lb.hopfield_retrieve,
        lambda: dict(query=pts(3), patterns=pts(), beta=0.5),
        {"query": "F", "patterns": "F", "beta": "P"},
        cols=(("query", "patterns"),),
        params={"beta": "pos"},
    ),
    # ---- density and modes
    "kde": _query_data_bandwidth(lb.kde),
    "kde_score": _query_data_bandwidth(lb.kde_score),
    "kde_log_hessian": _query_data_bandwidth(
        lb.kde_log_hessian, half_tol=64, f32_tol=64
    ),
    "mean_shift": Case(
        lambda x, bandwidth: lb.mean_shift(x, bandwidth, max_iter=20).modes,
        lambda: dict(x=pts(), bandwidth=1.5),
        {"x": "F", "bandwidth": "P"},
        params={"bandwidth": "pos"},
        half_tol=2048,
        f32_tol=4096,
        examples=1,
    ),
    "blurring_mean_shift": Case(
        lambda x, bandwidth: lb.blurring_mean_shift(x, bandwidth, max_iter=5).modes,
        lambda: dict(x=pts(), bandwidth=1.5),
        {"x": "F", "bandwidth": "P"},
        params={"bandwidth": "pos"},
        half_tol=2048,
        f32_tol=4096,
        examples=1,
    ),
    "pc_shift": Case(
        lambda x, bandwidth: lb.pc_shift(x, bandwidth, max_iter=5).points,
        lambda: dict(x=pts(), bandwidth=2.0),
        {"x": "F", "bandwidth": "P"},
        params={"bandwidth": "pos"},
        half_tol=2048,
        f32_tol=4096,
    ),
    "medoid_shift": Case(
        lambda x, bandwidth: lb.medoid_shift(x, bandwidth).modes,
        lambda: dict(x=pts(), bandwidth=1.5),
        {"x": "F", "bandwidth": "P"},
        params={"bandwidth": "pos"},
        kinds={"x:int": EITHER, "x:bool": EITHER},
    ),  # ties among 0/1 data
    # ---- attention and language
    "temporal_kernel": Case(
        lambda decay: lb.temporal_kernel(4, causal=True, decay=decay),
        lambda: dict(decay=0.5),
        {"decay": "P"},
        params={"decay": "nonneg"},
    ),
    "local_mean_attention": Case(
        lb.local_mean_attention,
        lambda: dict(q=pts(4, 3), k=pts(4, 3, 1), v=pts(4, 2, 2)),
        {"q": "F", "k": "F", "v": "F"},
        tied=(("k", "v"),),
        cols=(("q", "k"),),
        kinds={"q:rank+1": EITHER, "k:rank+1": EITHER, "v:rank+1": EITHER},
    ),  # batched
    "LocalMeanAttention": Case(
        lambda x: (torch.manual_seed(0), lb.LocalMeanAttention(4, 2).double()(x))[1],
        lambda: dict(x=pts(5, 4)),
        {"x": "F"},  # a float64 module: x is cast to it
        kinds={"x:rank+1": EITHER},
    ),  # (1, T, d): a batch of one
    "LocalTransformer": Case(
        lambda idx: (torch.manual_seed(0), lb.LocalTransformer(5, 8, 2, 1, 8)(idx))[1],
        lambda: dict(idx=_tokens(6)),
        {"idx": "I"},
        free_rank=("idx",),
    ),
    "attention_graph": Case(
        lambda weights, groups: (
            lb.attention_graph(weights, ["a", "b", "c"], groups).weights
        ),
        lambda: dict(
            weights=torch.softmax(pts(4, 4), 1), groups=torch.tensor([0, 0, 1, 2])
        ),
        {"weights": "F", "groups": "I"},
        tied=(("weights", "groups"),),
        kinds={"weights:rank+1": EITHER},
    ),  # (H, T, T): averaged over heads
    "sample_batch": Case(
        lambda tokens: lb.sample_batch(tokens, 2, 4, _gen()),
        lambda: dict(tokens=_tokens()),
        {"tokens": "I"},
        kinds={"tokens:out-of-range": EITHER},
    ),  # no vocabulary to exceed
    "train_language_model": Case(
        lambda tokens: (
            lb.train_language_model(
                _lm(), tokens, n_steps=2, batch_size=2, context=4, progress=False
            ).train_loss
        ),
        lambda: dict(tokens=_tokens()),
        {"tokens": "I"},
    ),
    "evaluate_loss": Case(
        lambda tokens: lb.evaluate_loss(_lm(), tokens, context=4),
        lambda: dict(tokens=_tokens()),
        {"tokens": "I"},
    ),
    "DiscreteKernel": Case(
        lambda idx: _lm()(idx),
        lambda: dict(idx=_tokens(6)),
        {"idx": "I"},
        free_rank=("idx",),
    ),
    "bigram_counts": Case(
        lambda tokens: lb.bigram_counts(tokens, 5),
        lambda: dict(tokens=_tokens()),
        {"tokens": "I"},
    ),
    "bigram_kernel": Case(
        lambda tokens, smoothing: lb.bigram_kernel(tokens, 5, smoothing),
        lambda: dict(tokens=_tokens(), smoothing=1.0),
        {"tokens": "I", "smoothing": "P"},
        params={"smoothing": "nonneg"},
    ),
    # ---- memorization and features
    "min_norm_fit": Case(
        lb.min_norm_fit,
        lambda: dict(Phi=pts(3, 6), G=vec(3)),
        {"Phi": "F", "G": "F"},
        tied=(("Phi", "G"),),
        half_tol=256,
        f32_tol=256,
    ),
    "stability": Case(
        lambda Phi, G, phi_z: lb.stability(Phi, G, 1, phi_z),
        lambda: dict(Phi=pts(3, 6), G=vec(3), phi_z=vec(6, 4)),
        {"Phi": "F", "G": "F", "phi_z": "F"},
        tied=(("Phi", "G"),),
        cols=(("Phi", "phi_z"),),
        half_tol=256,
        f32_tol=256,
        kinds={"phi_z:rank+1": EITHER},
    ),  # (1, p): one query row
    "feature_alignment": Case(
        lambda Phi, phi_z: lb.feature_alignment(Phi, 1, phi_z),
        lambda: dict(Phi=pts(3, 6), phi_z=vec(6, 4)),
        {"Phi": "F", "phi_z": "F"},
        cols=(("Phi", "phi_z"),),
        half_tol=256,
        f32_tol=256,
        kinds={"phi_z:rank+1": EITHER},
    ),
    "hermite": Case(
        lambda x: lb.hermite(3, x), lambda: dict(x=vec()), {"x": "F"}, free_rank=("x",)
    ),
    "hermite_activation": Case(
        lambda coefficients: lb.hermite_activation(coefficients).fn(vec()),
        lambda: dict(coefficients=[0.0, 0.5, 0.5]),
        {"coefficients": "F"},
    ),
    "alignment_profile": Case(
        lambda rho: lb.alignment_profile("relu", rho),
        lambda: dict(rho=torch.tensor([0.1, 0.5], dtype=F64)),
        {"rho": "F"},
        scalar_ok=("rho",),
    ),
    "alignment_limit": Case(
        lambda alpha: lb.alignment_limit("relu", alpha),
        lambda: dict(alpha=torch.tensor([0.2, 0.5], dtype=F64)),
        {"alpha": "F"},
        scalar_ok=("alpha",),
    ),
    "random_features": Case(
        lb.random_features,
        lambda: dict(Z=pts(4, 3), W=pts(5, 3, 1)),
        {"Z": "F", "W": "F"},
        cols=(("Z", "W"),),
    ),
    "ntk_features": Case(
        lb.ntk_features,
        lambda: dict(Z=pts(4, 3), W=pts(5, 3, 1)),
        {"Z": "F", "W": "F"},
        cols=(("Z", "W"),),
    ),
    "ntk_kernel": Case(
        lb.ntk_kernel,
        lambda: dict(Z1=pts(4, 3), Z2=pts(2, 3, 2), W=pts(5, 3, 1)),
        {"Z1": "F", "Z2": "F", "W": "F"},
        cols=(("Z1", "Z2", "W"),),
    ),
    # ---- entmax
    "sparsemax": Case(
        lb.sparsemax, lambda: dict(z=pts(3, 4)), {"z": "F"}, free_rank=("z",)
    ),
    "entmax15": Case(
        lb.entmax15, lambda: dict(z=pts(3, 4)), {"z": "F"}, free_rank=("z",)
    ),
    "entmax_bisect": Case(
        lb.entmax_bisect,
        lambda: dict(z=pts(3, 4), alpha=1.3),
        {"z": "F", "alpha": "P"},
        free_rank=("z",),
        params={"alpha": "nonzero"},
        half_tol=16,
    ),
    "sparsemax_loss": Case(
        lb.sparsemax_loss,
        lambda: dict(X=pts(3, 4), target=lab(3, 4)),
        {"X": "F", "target": "I"},
        tied=(("X", "target"),),
    ),
    "entmax15_loss": Case(
        lb.entmax15_loss,
        lambda: dict(X=pts(3, 4), target=lab(3, 4)),
        {"X": "F", "target": "I"},
        tied=(("X", "target"),),
    ),
    "entmax_bisect_loss": Case(
        lb.entmax_bisect_loss,
        lambda: dict(X=pts(3, 4), target=lab(3, 4), alpha=1.3),
        {"X": "F", "target": "I", "alpha": "P"},
        tied=(("X", "target"),),
        params={"alpha": "pos"},
        half_tol=16,
    ),
    "tsallis_entropy": Case(
        lb.tsallis_entropy,
        lambda: dict(p=torch.softmax(pts(3, 4), 1), alpha=1.5),
        {"p": "Pr", "alpha": "P"},
        # rounded to float32/half, p no longer sums to 1 in float64
        kinds={
            "p:rank+1": EITHER,
            "p:float32": EITHER,
            "all:float16": EITHER,
            "all:bfloat16": EITHER,
            "all:float32": EITHER,
        },
        params={"alpha": "pos"},
    ),
    # ---- embeddings and triplets
    "lle_weights": Case(
        lambda x: lb.lle_weights(x, 3),
        lambda: dict(x=pts(8, 3)),
        {"x": "F"},
        half_tol=256,
        f32_tol=256,
    ),
    "lle_weight_matrix": Case(
        lb.lle_weight_matrix,
        lambda: dict(
            weights=torch.full((4, 2), 0.5, dtype=F64),
            indices=torch.tensor([[1, 2], [0, 2], [3, 1], [0, 1]]),
        ),
        {"weights": "F", "indices": "I"},
        tied=(("weights", "indices"),),
        cols=(("weights", "indices"),),
    ),
    "locally_linear_embedding": Case(
        lambda x: lb.locally_linear_embedding(x, 1, 3, eigen_solver="dense").abs(),
        lambda: dict(x=pts(8, 3)),
        {"x": "F"},
        half_tol=4096,
        f32_tol=4096,
        kinds={"x:bool": EITHER},
    ),  # 0/1 points: duplicates, a degenerate spectrum
    "classical_mds": Case(
        lambda d: lb.classical_mds(d, 1).abs(),
        lambda: dict(d=torch.cdist(pts(5), pts(5))),
        {"d": "F"},
        half_tol=256,
        f32_tol=256,
        kinds={"d:bool": EITHER},
    ),  # 0/1 distances: a degenerate spectrum
    "asymmetric_mds": Case(
        lambda d: lb.asymmetric_mds(d, 1, n_iter=5).stress,
        lambda: dict(d=torch.cdist(pts(5), pts(5)) + 0.1 * pts(5, 5)),
        {"d": "F"},
        half_tol=4096,
        f32_tol=4096,
    ),
    "trustworthiness": Case(
        lambda x, y: lb.trustworthiness(x, y, 2),
        lambda: dict(x=pts(8, 3), y=pts(8, 2, 1)),
        {"x": "F", "y": "F"},
        tied=(("x", "y"),),
    ),
    "continuity": Case(
        lambda x, y: lb.continuity(x, y, 2),
        lambda: dict(x=pts(8, 3), y=pts(8, 2, 1)),
        {"x": "F", "y": "F"},
        tied=(("x", "y"),),
    ),
    "trustworthiness_continuity": Case(
        lambda x, y: lb.trustworthiness_continuity(x, y, (1, 2)).trustworthiness,
        lambda: dict(x=pts(8, 3), y=pts(8, 2, 1)),
        {"x": "F", "y": "F"},
        tied=(("x", "y"),),
    ),
    "triplet_hyperkernel": Case(
        lb.triplet_hyperkernel,
        lambda: dict(y=pts(), triplets=torch.tensor([[0, 1, 2], [3, 4, 5]])),
        {"y": "F", "triplets": "I"},
    ),
    "triplet_loss": Case(
        lb.triplet_loss,
        lambda: dict(
            y=pts(),
            triplets=torch.tensor([[0, 1, 2], [3, 4, 5]]),
            weights=torch.tensor([1.0, 2.0], dtype=F64),
        ),
        {"y": "F", "triplets": "I", "weights": "F+"},
        tied=(("triplets", "weights"),),
    ),
    "trimap_triplets": Case(
        lambda x: lb.trimap_triplets(x, 2, 2, 1), lambda: dict(x=pts(10, 3)), {"x": "F"}
    ),
    "triplet_embedding": Case(
        lambda x: lb.triplet_embedding(x, 1, 2, 2, 1, n_iter=3),
        lambda: dict(x=pts(10, 3)),
        {"x": "F"},
        half_tol=4096,
        f32_tol=4096,
    ),
    "ordinal_embedding": Case(
        lambda triplets: lb.ordinal_embedding(triplets, 6, 1, n_iter=3, dtype=F64),
        lambda: dict(triplets=torch.tensor([[0, 1, 2], [3, 4, 5], [1, 2, 5]])),
        {"triplets": "I"},
    ),
    "triplet_accuracy": Case(
        lb.triplet_accuracy,
        lambda: dict(y=pts(), triplets=torch.tensor([[0, 1, 2], [3, 4, 5]])),
        {"y": "F", "triplets": "I"},
    ),
    # ---- metrics
    "clustering_accuracy": Case(
        lb.clustering_accuracy,
        lambda: dict(labels_true=lab(), labels_pred=lab(6, 3)),
        {"labels_true": "L", "labels_pred": "L"},
        tied=(("labels_true", "labels_pred"),),
    ),
    "nmi": Case(
        lb.nmi,
        lambda: dict(labels_true=lab(), labels_pred=lab(6, 3)),
        {"labels_true": "L", "labels_pred": "L"},
        tied=(("labels_true", "labels_pred"),),
    ),
    "ari": Case(
        lb.ari,
        lambda: dict(labels_true=lab(), labels_pred=lab(6, 3)),
        {"labels_true": "L", "labels_pred": "L"},
        tied=(("labels_true", "labels_pred"),),
    ),
    "subspace_preserving_rate": Case(
        lb.subspace_preserving_rate,
        lambda: dict(graph=torch.softmax(pts(6, 6), 1), labels=lab()),
        {"graph": "F", "labels": "L"},
        tied=(("graph", "labels"),),
    ),
    # ---- SAGL and its baselines
    "sagl_loss": Case(
        lambda views: lb.sagl_loss(_sagl_out(), views)[0],
        lambda: dict(views=lb.standardize_views(_views())),
        {"views": "V"},
    ),
    "effective_neighbours": Case(
        lb.effective_neighbours,
        lambda: dict(graph=torch.softmax(pts(6, 6), 1)),
        {"graph": "F"},
    ),
    "standardize_views": Case(
        lb.standardize_views, lambda: dict(views=_views()), {"views": "V"}
    ),
    "reduce_views": Case(
        lambda views: [v.abs() for v in lb.reduce_views(views, 1)],
        lambda: dict(views=_views()),
        {"views": "V"},
        half_tol=256,
        f32_tol=256,
    ),
    "candidate_neighbours": Case(
        lambda views: lb.candidate_neighbours(views, 2),
        lambda: dict(views=_views()),
        {"views": "V"},
    ),
    "knn_graph": Case(
        lambda views: lb.knn_graph(views, 2),
        lambda: dict(views=_views()),
        {"views": "V"},
    ),
    "fused_knn_graph": Case(
        lambda views: lb.fused_knn_graph(views, 2),
        lambda: dict(views=_views()),
        {"views": "V"},
    ),
    "dense_attention_graph": Case(
        lb.dense_attention_graph, lambda: dict(views=_views()), {"views": "V"}
    ),
    "entmax_distance_graph": Case(
        lambda views: lb.entmax_distance_graph(views, 2, 3),
        lambda: dict(views=_views()),
        {"views": "V"},
    ),
    "lsr_coefficients": Case(
        lb.lsr_coefficients,
        lambda: dict(x=pts(), lam=0.5),
        {"x": "F", "lam": "P"},
        params={"lam": "pos"},
        half_tol=256,
        f32_tol=256,
    ),
    "lsr_graph": Case(
        lb.lsr_graph,
        lambda: dict(views=_views(), lam=0.5),
        {"views": "V", "lam": "P"},
        params={"lam": "pos"},
        half_tol=256,
        f32_tol=256,
    ),
    "self_expression_graph": Case(
        lambda views: lb.self_expression_graph(views, 3, 200),
        lambda: dict(views=_views()),
        {"views": "V"},
        half_tol=4096,
        f32_tol=4096,
        examples=1,
    ),
    "spectral_readout": Case(
        lambda graph: lb.spectral_readout(graph, 2),
        lambda: dict(graph=torch.softmax(pts(6, 6), 1)),
        {"graph": "F"},
    ),
    "view_candidates": Case(
        lambda xs: lb.view_candidates(xs, 2), lambda: dict(xs=_views()), {"xs": "V"}
    ),
    "fit_sagl": Case(
        lambda views: (
            lb.fit_sagl(views, max_steps=2, latent_dim=4, hidden_dim=4, window=1).graph
        ),
        lambda: dict(views=_views()),
        {"views": "V"},
        half_tol=math.inf,
        f32_tol=math.inf,
        examples=1,
    ),  # training: finite and the right shape
    "sagl_cluster": Case(
        lambda views: (
            lb.sagl_cluster(
                views, 2, max_steps=2, latent_dim=4, hidden_dim=4, window=1
            ).labels
        ),
        lambda: dict(views=_views()),
        {"views": "V"},
        half_tol=math.inf,
        f32_tol=math.inf,
        examples=1,
    ),
    # ---- local decisions
    "local_mode_classify": Case(
        lb.local_mode_classify,
        lambda: dict(x_query=pts(3), x=pts(), labels=lab(), bandwidth=1.5),
        {"x_query": "F", "x": "F", "labels": "L", "bandwidth": "P"},
        tied=(("x", "labels"),),
        cols=(("x_query", "x"),),
        params={"bandwidth": "pos"},
    ),
    "local_quantile": Case(
        lb.local_quantile,
        lambda: dict(x_query=pts(3), x=pts(), y=vec(), bandwidth=1.5, q=0.3),
        {"x_query": "F", "x": "F", "y": "F", "bandwidth": "P", "q": "P"},
        tied=(("x", "y"),),
        cols=(("x_query", "x"),),
        params={"bandwidth": "pos", "q": "unit"},
    ),
    "pinball_loss": Case(
        lb.pinball_loss,
        lambda: dict(u=vec(), q=0.3),
        {"u": "F", "q": "P"},
        free_rank=("u",),
        params={"q": "unit"},
    ),
    "takagi_sugeno": Case(
        lb.takagi_sugeno,
        lambda: dict(
            x_query=pts(3),
            centers=pts(2, seed=4),
            bandwidth=2.0,
            coefficients=pts(2, 3, 5),
        ),
        {"x_query": "F", "centers": "F", "bandwidth": "P", "coefficients": "F"},
        tied=(("centers", "coefficients"),),
        cols=(("x_query", "centers"),),
        params={"bandwidth": "pos"},
    ),
    "rule_memberships": Case(
        lb.rule_memberships,
        lambda: dict(x_query=pts(3), centers=pts(2, seed=4), bandwidth=2.0),
        {"x_query": "F", "centers": "F", "bandwidth": "P"},
        cols=(("x_query", "centers"),),
        params={"bandwidth": "pos"},
    ),
    "fit_takagi_sugeno": Case(
        lb.fit_takagi_sugeno,
        lambda: dict(x=pts(), y=vec(), centers=pts(2, seed=4), bandwidth=3.0),
        {"x": "F", "y": "F", "centers": "F", "bandwidth": "P"},
        tied=(("x", "y"),),
        cols=(("x", "centers"),),
        params={"bandwidth": "pos"},
        half_tol=256,
        f32_tol=256,
    ),
    "bilateral_filter": Case(
        lb.bilateral_filter,
        lambda: dict(image=pts(4, 5), spatial_bandwidth=1.0, range_bandwidth=2.0),
        {"image": "F", "spatial_bandwidth": "P", "range_bandwidth": "P"},
        params={"spatial_bandwidth": "pos", "range_bandwidth": "pos"},
        kinds={"image:rank+1": EITHER},
    ),  # (1, H, W): one channel
    # ---- metric learning and adaptive densities
    "mlkr_loss": Case(
        lb.mlkr_loss,
        lambda: dict(A=torch.eye(2, dtype=F64) / 2, x=pts(), y=vec()),
        {"A": "F", "x": "F", "y": "F"},
        tied=(("x", "y"),),
        cols=(("A", "x"),),
    ),
    "fit_metric": Case(
        lambda x, y, init: lb.fit_metric(x, y, max_iter=2, init=init),
        lambda: dict(x=pts(8), y=vec(8), init=torch.eye(2, dtype=F64) / 2),
        {"x": "F", "y": "F", "init": "F"},
        tied=(("x", "y"),),
        cols=(("x", "init"),),
        half_tol=1e5,
        f32_tol=1e5,
        examples=1,
    ),
    "abramson_bandwidths": Case(
        lb.abramson_bandwidths,
        lambda: dict(x=pts(), bandwidth=1.5, pilot=vec().abs() + 0.1),
        {"x": "F", "bandwidth": "P", "pilot": "F+"},
        tied=(("x", "pilot"),),
        params={"bandwidth": "pos"},
    ),
    "sample_point_kde": _query_data_bandwidth(lb.sample_point_kde),
    "balloon_kde": Case(
        lambda x_query, x: lb.balloon_kde(x_query, x, 3),
        lambda: dict(x_query=pts(3), x=pts()),
        {"x_query": "F", "x": "F"},
        cols=(("x_query", "x"),),
    ),
    # ---- imputation
    "pixel_local_mean": Case(
        lambda X, bandwidth: lb.pixel_local_mean(X, (2, 2), bandwidth),
        lambda: dict(X=_holes(), bandwidth=1.0),
        {"X": "F", "bandwidth": "P"},
        nan_ok=("X",),
        params={"bandwidth": "pos"},
    ),
    "nan_sq_distances": Case(
        lb.nan_sq_distances,
        lambda: dict(Xq=_holes(3), X=_holes()),
        {"Xq": "F", "X": "F"},
        cols=(("Xq", "X"),),
        nan_ok=("Xq", "X"),
    ),
    "image_local_mean": Case(
        lambda Xq, X_ref, Z_ref: lb.image_local_mean(Xq, X_ref, Z_ref, 2),
        lambda: dict(Xq=_holes(3), X_ref=_holes(), Z_ref=pts(6, 4, 7)),
        {"Xq": "F", "X_ref": "F", "Z_ref": "F"},
        tied=(("X_ref", "Z_ref"),),
        cols=(("Xq", "X_ref", "Z_ref"),),
        nan_ok=("Xq", "X_ref"),
    ),
    "rmse_missing": Case(
        lb.rmse_missing,
        lambda: dict(x_imputed=pts(), x_true=pts(6, 2, 1), missing=pts(6, 2, 2) > 0),
        {"x_imputed": "F", "x_true": "F", "missing": "M"},
        tied=(("x_imputed", "x_true", "missing"),),
        cols=(("x_imputed", "x_true", "missing"),),
        # only the marked entries are read: NaN or inf elsewhere is fine
        kinds={
            f"{a}:{m}": EITHER for a in ("x_imputed", "x_true") for m in ("nan", "inf")
        },
    ),
    "LocalMeanImputer": Case(
        _imputer,
        lambda: dict(X=_holes(8).numpy()),
        {"X": "F"},
        nan_ok=("X",),
        **SKLEARN_CASE,
    ),
    # ---- datasets
    "add_noise_border": Case(
        lambda images: lb.add_noise_border(images, 1, generator=_gen()),
        lambda: dict(images=pts(2, 9).reshape(2, 3, 3)),
        {"images": "F"},  # the noise differs by dtype: judge the core
        pick=lambda r: r[:, 1:-1, 1:-1],
    ),
    "spurious_split": Case(
        lambda images: lb.spurious_split(images, 1),
        lambda: dict(images=pts(2, 16).reshape(2, 4, 4)),
        {"images": "F"},
    ),
    "holdout_mask": Case(
        lambda X: lb.holdout_mask(X, 0.3),
        lambda: dict(X=_holes()),
        {"X": "F"},
        nan_ok=("X",),
    ),
    # ---- scikit-learn estimators
    "NadarayaWatsonRegressor": Case(
        _nw_est("NadarayaWatsonRegressor"),
        lambda: dict(X=pts().numpy(), y=vec().numpy()),
        {"X": "F", "y": "F"},
        tied=(("X", "y"),),
        **SKLEARN_CASE,
    ),
    "LocalLinearRegressor": Case(
        _nw_est("LocalLinearRegressor"),
        lambda: dict(X=pts().numpy(), y=vec().numpy()),
        {"X": "F", "y": "F"},
        tied=(("X", "y"),),
        f32_tol=64,
        **SKLEARN_CASE,
    ),
    "LocalModeClassifier": Case(
        _nw_est("LocalModeClassifier"),
        lambda: dict(X=pts().numpy(), y=lab().numpy()),
        {"X": "F", "y": "L"},
        tied=(("X", "y"),),
        **SKLEARN_CASE,
    ),
}

# Public callables that take no array argument (sizes, names, paths, text, settings), or that
# are result containers: not in the catalogue, each with its reason.
EXEMPT = {
    **dict.fromkeys(
        [
            "default_device",
            "get_kernel",
            "log_kernel_constant",
            "sigma_schedule",
            "alibi_slopes",
            "relu_hermite_coefficients",
            "get_activation",
            "gaussian_weights",
            "hermite_coefficients",
            "finite_d_alignment",
            "memorization_curve",
            "spurious_gaussian_data",
            "make_digits_views",
            "make_fashion_views",
            "make_multiview_subspaces",
            "missing_at_random_mask",
            "block_mask",
            "pixel_positions",
        ],
        "numbers, sizes and names only",
    ),
    **dict.fromkeys(
        [
            "fashion_mnist_dir",
            "find_fashion_mnist_file",
            "fetch_fashion_mnist_file",
            "read_idx",
            "load_fashion_mnist",
        ],
        "file paths (tests/test_fashion_mnist.py)",
    ),
    **dict.fromkeys(["CharTokenizer", "word_groups"], "text"),
    "glue": "notebook display of a value",
    "draw_attention_graph": "draws an AttentionGraph (plotting)",
    **dict.fromkeys(
        [
            "Kernel",
            "Activation",
            "BandwidthSelection",
            "MeanShiftResult",
            "PCShiftResult",
            "AttentionGraph",
            "TrainingHistory",
            "MemorizationCurve",
            "AsymmetricMDS",
            "NeighborhoodScores",
            "SAGLResult",
            "TemporalKernel",
        ],
        "a result or settings container",
    ),
    "SparseAttentionGraph": "a module: its forward is exercised through fit_sagl/sagl_loss",
}


def public_callables():
    """Every public function or class of ``localbook.__all__``."""
    out = []
    for name in lb.__all__:
        obj = getattr(lb, name)
        if callable(obj) and not isinstance(obj, type(lb)):
            out.append(name)
    return out


def test_every_public_function_is_in_the_catalogue():
    """A new public function must join TABLE (or EXEMPT, with its reason)."""
    missing = [n for n in public_callables() if n not in TABLE and n not in EXEMPT]
    assert not missing, f"add these public names to TABLE or EXEMPT: {missing}"
    stale = [n for n in list(TABLE) + list(EXEMPT) if n not in lb.__all__]
    assert not stale, f"not public any more: {stale}"


# ------------------------------------------------------------------------------------------
# Mutations
# ------------------------------------------------------------------------------------------
FLOATS = ("F", "F+", "Pr")
INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
PARAM_OK = {
    "pos": lambda v: v > 0 and math.isfinite(v),
    "nonneg": lambda v: v >= 0 and math.isfinite(v),
    "unit": lambda v: 0 < v < 1,
    "nonzero": lambda v: v != 0 and math.isfinite(v),
}


def _is_np(v):
    return isinstance(v, np.ndarray)


def _t(v):
    """A tensor view of a valid array argument (numpy or torch)."""
    return torch.from_numpy(v) if _is_np(v) else torch.as_tensor(v)


def _back(t, like):
    """``t`` in the container of the valid argument ``like`` (numpy stays numpy)."""
    return t.numpy() if _is_np(like) else t


def _set_flat(t, pos, value):
    t = t.clone()
    flat = t.reshape(-1)
    flat[pos % flat.numel()] = value
    return t


def _strings(t):
    return np.vectorize(str)(t.numpy()) if t.ndim else np.str_(str(t.item()))


def float_mutations(a, case, v):
    """``(label, kind, draw → bad value)`` for a float array argument."""
    t = _t(v).double() if not isinstance(v, list) else torch.tensor(v, dtype=F64)
    role = case.roles[a]
    tied = any(a in g for g in case.tied)
    coltied = any(a in g for g in case.cols)
    free = a in case.free_rank
    pos = st.integers(0, 10**6)
    out = [
        (
            f"{a}:nan",
            EITHER if a in case.nan_ok else BAD,
            lambda d: _back(_set_flat(t, d.draw(pos), math.nan), v),
        ),
        (
            f"{a}:inf",
            BAD,
            lambda d: _back(
                _set_flat(
                    t, d.draw(pos), d.draw(st.sampled_from([math.inf, -math.inf]))
                ),
                v,
            ),
        ),
        (f"{a}:empty", EITHER if free else BAD, lambda d: _back(t[:0], v)),
        (f"{a}:rank+1", EITHER if free else BAD, lambda d: _back(t[None], v)),
        (
            f"{a}:0-d",
            EITHER if free or a in case.scalar_ok else BAD,
            lambda d: _back(t.reshape(-1)[0], v),
        ),
    ]
    if a not in case.nan_ok:  # NaN (a missing value) has no integer or bool form
        out += [
            (f"{a}:int", GOOD, lambda d: _back(t.round().long(), v)),
            (f"{a}:bool", GOOD, lambda d: _back(t > 0, v)),
        ]
    out += [
        (f"{a}:complex", BAD, lambda d: _back(t.to(torch.complex128), v)),
        (f"{a}:str", BAD, lambda d: _strings(t)),
        (f"{a}:list", GOOD, lambda d: t.tolist()),
        (f"{a}:float32", GOOD, lambda d: _back(t.float(), v)),
        (f"{a}:other-container", GOOD, lambda d: t.clone() if _is_np(v) else t.numpy()),
    ]
    if t.ndim >= 1 and t.shape[0] > 1:
        out.append(
            (f"{a}:drop-row", BAD if tied else EITHER, lambda d: _back(t[:-1], v))
        )
    if t.ndim == 2 and t.shape[1] > 1:
        out.append(
            (f"{a}:drop-col", BAD if coltied else EITHER, lambda d: _back(t[:, :-1], v))
        )
    if role in ("F+", "Pr"):
        out.append(
            (
                f"{a}:negative",
                BAD,
                lambda d: _back(
                    _set_flat(t, d.draw(pos), -d.draw(st.floats(1e-3, 1e3))), v
                ),
            )
        )
    if role == "Pr":
        out.append(
            (
                f"{a}:unnormalized",
                BAD,
                lambda d: _back(t * d.draw(st.sampled_from([0.5, 1.01, 3.0])), v),
            )
        )
    return out


def index_mutations(a, case, v):
    t = _t(v)
    tied = any(a in g for g in case.tied)
    free = a in case.free_rank
    pos = st.integers(0, 10**6)
    labels = case.roles[a] == "L"
    out = [
        (
            f"{a}:negative",
            EITHER if labels else BAD,
            lambda d: _back(
                _set_flat(t, d.draw(pos), -d.draw(st.integers(1, 10**6))), v
            ),
        ),
        (
            f"{a}:fraction",
            BAD,
            lambda d: _back(_set_flat(t.double(), d.draw(pos), 0.5), v),
        ),
        (
            f"{a}:nan",
            BAD,
            lambda d: _back(_set_flat(t.double(), d.draw(pos), math.nan), v),
        ),
        (
            f"{a}:whole-float",
            GOOD if labels else EITHER,
            lambda d: _back(t.double(), v),
        ),
        (f"{a}:int32", GOOD, lambda d: _back(t.int(), v)),
        (f"{a}:list", GOOD, lambda d: t.tolist()),
        (f"{a}:bool", EITHER, lambda d: _back(t > 0, v)),
        (f"{a}:complex", BAD, lambda d: _back(t.to(torch.complex128), v)),
        (f"{a}:empty", BAD if labels else EITHER, lambda d: _back(t[:0], v)),
        (f"{a}:rank+1", EITHER if free else BAD, lambda d: _back(t[None], v)),
    ]
    if labels:
        out.append(
            (f"{a}:strings", EITHER, lambda d: np.array([f"c{i}" for i in t.tolist()]))
        )
    else:
        out += [
            (
                f"{a}:out-of-range",
                BAD,
                lambda d: _back(
                    _set_flat(t, d.draw(pos), d.draw(st.integers(10**3, 10**6))), v
                ),
            ),
            (f"{a}:int16", GOOD, lambda d: _back(t.short(), v)),
            (f"{a}:uint8", GOOD, lambda d: _back(t.to(torch.uint8), v)),
            (f"{a}:str", BAD, lambda d: _strings(t)),
        ]
    if t.ndim >= 1 and t.shape[0] > 1:
        out.append(
            (f"{a}:drop-row", BAD if tied else EITHER, lambda d: _back(t[:-1], v))
        )
    return out


def mask_mutations(a, case, v):
    t = _t(v)
    tied = any(a in g for g in case.tied)
    return [
        (f"{a}:int", EITHER, lambda d: _back(t.long(), v)),
        (f"{a}:float", EITHER, lambda d: _back(t.double(), v)),
        (
            f"{a}:nan",
            BAD,
            lambda d: _back(
                _set_flat(t.double(), d.draw(st.integers(0, 99)), math.nan), v
            ),
        ),
        (f"{a}:str", BAD, lambda d: _strings(t)),
        (f"{a}:empty", BAD, lambda d: _back(t[:0], v)),
        (f"{a}:rank+1", BAD, lambda d: _back(t[None], v)),
        (f"{a}:drop-row", BAD if tied else EITHER, lambda d: _back(t[:-1], v)),
    ]


def param_mutations(a, case, v):
    ok = PARAM_OK[case.params[a]]

    def number(label, x):
        return (f"{a}:{label}", GOOD if ok(x) else BAD, lambda d: x)

    out = [
        number("zero", 0.0),
        (
            f"{a}:negative",
            GOOD if ok(-1.0) else BAD,
            lambda d: -d.draw(st.floats(1e-6, 1e6)),
        ),
        number("nan", math.nan),
        number("inf", math.inf),
        number("above-one", 1.5) if case.params[a] == "unit" else number("half", 0.5),
        (f"{a}:bool", BAD, lambda d: True),
        (f"{a}:str", BAD, lambda d: str(v)),
        (f"{a}:complex", BAD, lambda d: complex(v, 1.0)),
        (f"{a}:tensor", GOOD, lambda d: torch.tensor(float(v), dtype=F64)),
        (f"{a}:nan-tensor", BAD, lambda d: torch.tensor(math.nan, dtype=F64)),
    ]
    return out


def views_mutations(a, case, v):
    def first(fn):
        return lambda d: [fn(v[0], d)] + list(v[1:])

    pos = st.integers(0, 10**6)
    return [
        (f"{a}:nan", BAD, first(lambda t, d: _set_flat(t, d.draw(pos), math.nan))),
        (f"{a}:inf", BAD, first(lambda t, d: _set_flat(t, d.draw(pos), math.inf))),
        (f"{a}:empty-list", BAD, lambda d: []),
        (f"{a}:empty", BAD, first(lambda t, d: t[:0])),
        (f"{a}:rank+1", BAD, first(lambda t, d: t[None])),
        (f"{a}:drop-row", BAD, first(lambda t, d: t[:-1])),
        (f"{a}:int", GOOD, first(lambda t, d: t.round().long())),
        (f"{a}:complex", BAD, first(lambda t, d: t.to(torch.complex128))),
        (f"{a}:str", BAD, first(lambda t, d: _strings(t))),
        (f"{a}:list", GOOD, first(lambda t, d: t.tolist())),
        (f"{a}:numpy", GOOD, first(lambda t, d: t.numpy())),
        (f"{a}:float32", GOOD, first(lambda t, d: t.float())),
        (f"{a}:not-a-list", BAD, lambda d: "views"),
    ]


def global_mutations(case, kw):
    floats = [a for a, r in case.roles.items() if r in FLOATS + ("V",)]
    out = []
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        label = f"all:{str(dt)[6:]}"
        if label in case.skip or not floats:
            continue
        if dt == torch.bfloat16 and any(_is_np(kw[a]) for a in floats):
            continue  # numpy has no bfloat16

        def make(d, dt=dt):
            new = {}
            for a in floats:
                v = kw[a]
                if case.roles[a] == "V":
                    new[a] = [_t(x).to(dt) for x in v]
                elif _is_np(v):
                    new[a] = _t(v).to(dt).numpy()
                elif isinstance(v, list):
                    new[a] = torch.tensor(v, dtype=dt)
                else:
                    new[a] = _t(v).to(dt)
            return new

        out.append((label, GOOD, make))
    return out


def all_mutations(case, kw):
    """Every (label, kind, draw → {arg: value}) of a case."""
    out = []
    for a, role in case.roles.items():
        gen = {
            "F": float_mutations,
            "F+": float_mutations,
            "Pr": float_mutations,
            "I": index_mutations,
            "L": index_mutations,
            "M": mask_mutations,
            "P": param_mutations,
            "V": views_mutations,
        }[role]
        for label, kind, fn in gen(a, case, kw[a]):
            out.append((label, kind, lambda d, a=a, fn=fn: {a: fn(d)}))
    out += global_mutations(case, kw)
    return [
        (label, case.kinds.get(label, kind), fn)
        for label, kind, fn in out
        if label not in case.skip
    ]


# ------------------------------------------------------------------------------------------
# Running a call and judging its outcome
# ------------------------------------------------------------------------------------------
def _reference_value(v, role):
    """The float64 (int64 for integers) value of a mutated argument, same container."""
    if role == "V":
        return [_reference_value(x, "F") for x in v]
    if isinstance(v, np.ndarray) and v.dtype.kind in "US":  # numeric strings
        return v.astype(np.float64)
    if isinstance(v, (torch.Tensor, np.ndarray, list)):
        t = _t(np.asarray(v) if isinstance(v, list) else v)
        t = t.double() if (t.is_floating_point() or t.dtype == torch.bool) else t.long()
        return t.numpy() if isinstance(v, (np.ndarray, list)) else t
    return float(v) if isinstance(v, torch.Tensor) else v


def leaves(x, path="out"):
    """The numeric leaves of a result: tensors, arrays and numbers, with their paths."""
    if isinstance(x, torch.nn.Module) or x is None or isinstance(x, (str, bytes)):
        return []
    if isinstance(x, torch.Tensor):
        return [(path, x.detach())]
    if isinstance(x, np.ndarray):
        return [(path, x)] if x.dtype.kind in "biufc" else []
    if isinstance(x, (bool, int, float, np.number)):
        return [(path, x)]
    if dataclasses.is_dataclass(x):
        return [
            l
            for f in dataclasses.fields(x)
            for l in leaves(getattr(x, f.name), f"{path}.{f.name}")
        ]
    if isinstance(x, dict):
        return [l for k, v in x.items() for l in leaves(v, f"{path}[{k!r}]")]
    if isinstance(x, (list, tuple)):
        return [l for i, v in enumerate(x) for l in leaves(v, f"{path}[{i}]")]
    return []


def _as_t(x):
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(np.asarray(x))


def nonfinite(result):
    """Whether a result has a NaN or infinite entry."""
    for _, x in leaves(result):
        t = _as_t(x)
        if (t.is_floating_point() or t.is_complex()) and not bool(
            torch.isfinite(t).all()
        ):
            return True
    return False


def _float_dtypes(values):
    out = []
    for v in values:
        if isinstance(v, list) and v and isinstance(v[0], (torch.Tensor, np.ndarray)):
            out += _float_dtypes(v)
        elif isinstance(v, (torch.Tensor, np.ndarray)):
            t = (
                _t(v)
                if not (isinstance(v, np.ndarray) and v.dtype.kind in "US")
                else None
            )
            if t is not None and t.is_floating_point():
                out.append(t.dtype)
    return out


def _coarsest(dtypes):
    return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else F64


def compare(result, ref, case, inputs, no_downcast):
    """None when ``result`` matches the float64 ``ref``; else what differs. The tolerance is
    that of the coarsest float dtype among the inputs and the result (``half_tol``,
    ``f32_tol`` or ``TOL_ULPS`` eps of it, times the leaf's scale)."""
    la, lr = leaves(result), leaves(ref)
    if [p for p, _ in la] != [p for p, _ in lr]:
        return f"structure {[p for p, _ in la]} vs {[p for p, _ in lr]}"
    dt = _coarsest(_float_dtypes(inputs) + _float_dtypes([_as_t(a) for _, a in la]))
    tol = {
        torch.float16: case.half_tol,
        torch.bfloat16: case.half_tol,
        torch.float32: case.f32_tol,
    }.get(dt) or TOL_ULPS
    eps = torch.finfo(dt).eps
    for (path, a), (_, r) in zip(la, lr):
        ta, tr = _as_t(a), _as_t(r)
        if tuple(ta.shape) != tuple(tr.shape):
            return f"{path}: shape {tuple(ta.shape)}, float64 gives {tuple(tr.shape)}"
        if tr.is_floating_point():
            if no_downcast and tr.dtype == F64 and ta.dtype != F64:
                return f"{path}: dtype {ta.dtype} although a float64 argument was given"
            if not ta.is_floating_point():
                return f"{path}: dtype {ta.dtype}, float64 gives {tr.dtype}"
            if tol == math.inf or not ta.numel():
                continue
            err = float((ta.double().cpu() - tr.double().cpu()).abs().max())
            scale = max(float(tr.double().abs().max()), 1e-300)
            if not err <= tol * eps * scale:
                return f"{path}: off by {err:.3g} = {err / eps / scale:.3g} eps of {dt}"
        elif tol != math.inf and not torch.equal(ta.cpu().long(), tr.cpu().long()):
            return f"{path}: integer values differ from float64's"
    return None


def names(message, arg):
    return re.search(rf"(?<![\w.]){re.escape(arg)}(?![\w])", message) is not None


def call(case, kw):
    """``(result, exception, warnings)`` of ``case.call(**kw)``, seeded."""
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return (case.pick or (lambda r: r))(case.call(**kw)), None, caught
        except Exception as exc:  # noqa: BLE001 - judged below
            return None, exc, caught


COUNTS: Dict[Tuple[str, str, str], str] = {}
OUTCOMES = (
    "correct",
    "clear error",
    "warning + NaN",
    "silent wrong",
    "wrong argument named",
    "crash",
)


def judge(name, case, label, kind, arg_names, kw, valid):
    """The outcome of one bad input and, for a failure, what went wrong."""
    result, exc, caught = call(case, kw)
    if exc is not None:
        msg = f"{type(exc).__name__}: {exc}"
        if type(exc) in (ValueError, TypeError):
            named = [n for a in arg_names for n in (a,) + case.aliases.get(a, ())]
            if any(names(str(exc), a) for a in named) or (
                case.messages and re.search(case.messages, str(exc))
            ):
                return "clear error", None
            return "wrong argument named", msg
        return "crash", msg
    if nonfinite(result):
        if any(issubclass(w.category, UserWarning) for w in caught) and kind != GOOD:
            return "warning + NaN", None
        return "silent wrong", "non-finite result" + (
            " (with a warning)" if caught else ""
        )
    if kind == BAD:
        return "silent wrong", "a finite result for an invalid input"
    if kind == EITHER:
        return "correct", None
    ref_kw = {a: _reference_value(v, case.roles.get(a)) for a, v in kw.items()}
    ref, ref_exc, _ = call(case, {**valid, **ref_kw})
    if (
        ref_exc is not None
    ):  # the float64 call on the same values fails: judge the error
        return "crash", f"float64 reference failed: {ref_exc!r}"
    lowprec = label.startswith("all:")
    partners = sum(
        1
        for a, r in case.roles.items()
        if r in FLOATS or (r == "V" and len(kw.get(a, valid[a])) > 1)
    )
    no_downcast = partners > 1 if case.no_downcast is None else case.no_downcast
    promoted = not lowprec and no_downcast  # computed in float64: float64's tolerance
    inputs = [] if promoted else list(kw.values())
    integral = [
        isinstance(v, torch.Tensor)
        and v.dtype in INTEGRAL
        or isinstance(v, np.ndarray)
        and v.dtype.kind in "biu"
        for v in inputs
    ]
    if not promoted and any(
        integral
    ):  # integers alone are computed in the default dtype
        inputs.append(torch.zeros(0, dtype=torch.get_default_dtype()))
    diff = compare(result, ref, case, inputs, promoted)
    if diff:
        return "silent wrong", diff
    return "correct", None


def test_valid_calls_are_valid():
    """Every table entry's valid call runs and gives a finite result without warnings."""
    bad = {}
    for name, case in TABLE.items():
        result, exc, caught = call(case, case.make())
        if exc is not None or nonfinite(result) or caught:
            bad[name] = exc or (
                "non-finite" if nonfinite(result) else [str(w.message) for w in caught]
            )
    assert not bad, bad


class _Recorder:
    """hypothesis' ``data`` object, remembering what it drew (to count distinct inputs)."""

    def __init__(self, data):
        self.data, self.values = data, []

    def draw(self, strategy):
        self.values.append(self.data.draw(strategy))
        return self.values[-1]


@pytest.mark.parametrize("name", sorted(TABLE))
def test_bad_inputs(name):
    case = TABLE[name]

    # no shrinking: every mutation is tried in each example and all failures are listed
    @settings(
        max_examples=case.examples,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    @given(data=st.data())
    def run(data):
        valid = case.make()
        failures = []
        for label, kind, draw in all_mutations(case, valid):
            drawn = _Recorder(data)
            kw = {**case.make(), **draw(drawn)}
            arg = label.split(":")[0]
            args = list(case.roles) if arg == "all" else [arg]
            outcome, why = judge(name, case, label, kind, args, kw, valid)
            # one count per distinct input: the mutation and the values hypothesis drew
            COUNTS.setdefault((name, label, repr(drawn.values)), outcome)
            if why is not None or outcome not in (
                "correct",
                "clear error",
                "warning + NaN",
            ):
                failures.append(f"{label} ({kind}): {outcome}: {why}")
        assert not failures, f"{name}:\n  " + "\n  ".join(failures)

    run()


def test_zz_write_counts():
    """With LOCALBOOK_CATALOGUE_COUNTS=file, write the counts of this run (runs last)."""
    path = os.environ.get("LOCALBOOK_CATALOGUE_COUNTS")
    if not path or not COUNTS:
        pytest.skip("set LOCALBOOK_CATALOGUE_COUNTS=file.md to write the counts")
    total = Counter(COUNTS.values())
    functions = {k[0] for k in COUNTS}
    lines = [
        f"| functions | inputs tried | {' | '.join(OUTCOMES)} |",
        "|" + "---|" * (len(OUTCOMES) + 2),
        f"| {len(functions)} | {len(COUNTS)} | "
        + " | ".join(str(total.get(o, 0)) for o in OUTCOMES)
        + " |",
    ]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.write("\nPer function (failures only):\n\n")
        for fn in sorted(functions):
            c = Counter(v for k, v in COUNTS.items() if k[0] == fn)
            if any(o in c for o in OUTCOMES[3:]):
                fh.write(f"- {fn}: {dict(c)}\n")
