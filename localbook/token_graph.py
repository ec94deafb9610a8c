"""Attention weights as a token graph: who averages over whom (chapter 7).

An edge ``t → s`` of weight :math:`w_{ts}` says that token ``t``'s local mean puts weight
:math:`w_{ts}` on token ``s``; merging positions into words averages the rows of a group and
sums its columns. Drawn by :func:`localbook.plotting.draw_attention_graph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch.nn import functional as F

from ._validate import as_tensor, check_indices, check_positive_float

__all__ = ["AttentionGraph", "attention_graph"]


@dataclass
class AttentionGraph:
    """A directed token graph: an edge ``t → s`` of weight ``w`` means token ``t`` averages over ``s``."""

    labels: List[str]
    weights: torch.Tensor  #: ``(N, N)`` node-level weights (rows: queries)
    edges: torch.Tensor  #: ``(E, 2)`` long, (query node, key node)
    edge_weights: torch.Tensor  #: ``(E,)``

    def to_networkx(self):
        """The graph as a ``networkx.DiGraph`` (needs networkx)."""
        import networkx as nx

        G = nx.DiGraph()
        for i, lab in enumerate(self.labels):
            G.add_node(i, label=lab)
        for (a, b), w in zip(self.edges.tolist(), self.edge_weights.tolist()):
            G.add_edge(a, b, weight=w)
        return G


def attention_graph(
    weights,
    labels: Sequence[str],
    groups: Optional[torch.Tensor] = None,
    threshold: float = 0.1,
    self_loops: bool = False,
) -> AttentionGraph:
    r"""Turn local-mean weights ``(T, T)`` (or ``(H, T, T)``, averaged over heads) into a token graph.

    With ``groups`` (a group id per position, e.g. from :func:`word_groups`), positions are merged:
    :math:`W_{AB} = \frac1{|A|} \sum_{t\in A} \sum_{s \in B} w_{ts}` (rows still sum to one). An edge
    ``A → B`` is kept when :math:`W_{AB} \ge` ``threshold``.
    """
    w = as_tensor(weights, "weights", ndim=(2, 3))
    if w.ndim == 3:
        w = w.mean(0)
    T = w.shape[0]
    if w.shape[1] != T:
        raise ValueError(
            f"weights must be square (self-attention), got shape {tuple(w.shape)}"
        )
    threshold = check_positive_float(threshold, "threshold", allow_zero=True)
    labels = list(labels)
    if groups is not None:
        groups = check_indices(groups, "groups", T, device=w.device, what="group ids")
        if groups.shape != (T,):
            raise ValueError(
                f"groups must have one id per position ({T},), got shape {tuple(groups.shape)}"
            )
        N = int(groups.max()) + 1
        onehot = F.one_hot(groups, N).to(w.dtype)  # (T, N)
        W = (onehot.T @ w @ onehot) / onehot.sum(0).clamp(min=1)[:, None]
    else:
        W = w
    N = W.shape[0]
    if len(labels) != N:
        raise ValueError(
            f"labels must name the {N} nodes"
            + (" (the ids 0.. of groups)" if groups is not None else "")
            + f", got {len(labels)}"
        )
    keep = W >= threshold
    if not self_loops:
        keep &= ~torch.eye(N, dtype=torch.bool, device=W.device)
    edges = keep.nonzero()
    return AttentionGraph(labels, W, edges, W[keep])
