"""Tests of localbook.metrics: hand-made cases, permutation invariance, oracles, bad inputs."""

import itertools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from localbook.metrics import ari, clustering_accuracy, nmi, subspace_preserving_rate


def brute_force_accuracy(t, p):
    """Best accuracy over every injective renaming of predicted clusters (small k only)."""
    t, p = np.asarray(t), np.asarray(p)
    classes, clusters = np.unique(t), np.unique(p)
    best = 0
    slots = list(classes) + [None] * max(0, len(clusters) - len(classes))
    for perm in itertools.permutations(slots, len(clusters)):
        mapping = dict(zip(clusters, perm))
        best = max(best, sum(mapping[b] == a for a, b in zip(t, p)))
    return best / len(t)


labels_st = st.integers(min_value=1, max_value=30).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
    )
)


# --- hand-made cases ---------------------------------------------------------------------------
def test_accuracy_hand_cases():
    t = [0, 0, 1, 1, 2, 2]
    assert clustering_accuracy(t, [1, 1, 0, 0, 2, 2]) == 1.0  # renamed clusters
    assert clustering_accuracy(t, [0, 0, 0, 1, 1, 1]) == pytest.approx(4 / 6)
    assert (
        clustering_accuracy([0, 0, 0, 0], [0, 1, 2, 3]) == 0.25
    )  # extra clusters are errors
    assert (
        clustering_accuracy([0, 1, 2, 3], [5, 5, 5, 5]) == 0.25
    )  # one cluster matches one class
    assert (
        clustering_accuracy(["a", "a", "b"], [7, 7, 3]) == 1.0
    )  # strings and arbitrary ids


def test_identical_partitions_score_one():
    t = [2, 2, 0, 1, 1, 0, 3]
    p = [9, 9, 4, 5, 5, 4, 1]
    assert clustering_accuracy(t, p) == 1.0
    assert nmi(t, p) == pytest.approx(1.0)
    assert ari(t, p) == pytest.approx(1.0)


def test_tensor_and_integer_float_inputs():
    t = torch.tensor([0, 0, 1, 1])
    p = np.array([1.0, 1.0, 0.0, 0.0])
    assert clustering_accuracy(t, p) == 1.0
    assert isinstance(nmi(t, p), float) and isinstance(ari(t, p), float)


@settings(max_examples=25, deadline=None)
@given(labels_st)
def test_accuracy_equals_brute_force(pair):
    t, p = pair
    assert clustering_accuracy(t, p) == pytest.approx(brute_force_accuracy(t, p))


@settings(max_examples=25, deadline=None)
@given(labels_st, st.permutations([0, 1, 2, 3]))
def test_scores_ignore_cluster_names(pair, perm):
    t, p = pair
    q = [perm[c] + 10 for c in p]
    assert clustering_accuracy(t, q) == pytest.approx(clustering_accuracy(t, p))
    assert nmi(t, q) == pytest.approx(nmi(t, p))
    assert ari(t, q) == pytest.approx(ari(t, p))


@settings(max_examples=25, deadline=None)
@given(labels_st)
def test_nmi_ari_match_sklearn(pair):
    t, p = pair
    assert nmi(t, p) == pytest.approx(normalized_mutual_info_score(t, p))
    assert ari(t, p) == pytest.approx(adjusted_rand_score(t, p))


# --- subspace-preserving rate ------------------------------------------------------------------
def test_block_diagonal_graph_is_fully_preserving():
    y = [0, 0, 1, 1, 1]
    a = torch.zeros(5, 5, dtype=torch.float64)
    a[:2, :2] = 0.5
    a[2:, 2:] = 1 / 3
    assert subspace_preserving_rate(a, y) == 1.0


def test_rate_hand_case_per_row_and_abs():
    y = [0, 0, 1]
    a = torch.tensor(
        [
            [0.0, 0.5, 0.5],  # half inside
            [1.0, 0.0, 0.0],  # all inside
            [-0.2, -0.2, 0.0],
        ]
    )  # |weights| count: all outside
    rows = subspace_preserving_rate(a, y, per_row=True)
    torch.testing.assert_close(rows, torch.tensor([0.5, 1.0, 0.0]))
    assert subspace_preserving_rate(a, y) == pytest.approx(0.5)


def test_rate_equals_loop_and_ignores_label_names():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(12, 12, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (12,), generator=g)
    loop = np.mean(
        [a[i, y == y[i]].sum().item() / a[i].sum().item() for i in range(12)]
    )
    assert subspace_preserving_rate(a, y) == pytest.approx(loop)
    assert subspace_preserving_rate(a, (y + 1) * 7) == pytest.approx(loop)


def test_empty_rows_warn_and_are_left_out():
    a = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    with pytest.warns(UserWarning, match="1 of 3 graph rows"):
        rate = subspace_preserving_rate(a, [0, 0, 1])
    assert rate == pytest.approx(0.5)
    with pytest.warns(UserWarning):
        rows = subspace_preserving_rate(a, [0, 0, 1], per_row=True)
    assert torch.isnan(rows[1]) and rows[0] == 1.0


def test_rate_on_device(device):
    a = torch.eye(4, device=device)
    rows = subspace_preserving_rate(a, [0, 1, 0, 1], per_row=True)
    assert rows.device.type == device.type
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert subspace_preserving_rate(a, [0, 1, 0, 1]) == 1.0


# --- bad inputs --------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [clustering_accuracy, nmi, ari])
def test_bad_labels(fn):
    with pytest.raises(ValueError, match="labels_pred"):
        fn([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="labels_true"):
        fn([[0, 1]], [0, 1])
    with pytest.raises(ValueError, match="labels_true.*empty"):
        fn([], [])
    with pytest.raises(ValueError, match="labels_pred.*non-integer"):
        fn([0, 1], [0.5, 1.0])
    with pytest.raises(ValueError, match="labels_pred.*NaN"):
        fn([0, 1], [np.nan, 1.0])
    with pytest.raises(TypeError, match="labels_true"):
        fn(None, [0, 1])
    with pytest.raises(TypeError, match="labels_pred"):
        fn([0, 1], "01")


def test_rate_bad_inputs():
    with pytest.raises(ValueError, match="graph.*square"):
        subspace_preserving_rate(torch.ones(2, 3), [0, 1])
    with pytest.raises(ValueError, match="graph"):
        subspace_preserving_rate(torch.ones(3), [0, 1, 1])
    with pytest.raises(ValueError, match="labels has 2 entries"):
        subspace_preserving_rate(torch.ones(3, 3), [0, 1])
    with pytest.raises(ValueError, match="graph contains"):
        subspace_preserving_rate(
            torch.tensor([[0.0, float("nan")], [1.0, 0.0]]), [0, 1]
        )
    with pytest.raises(TypeError, match="graph"):
        subspace_preserving_rate("graph", [0, 1])
