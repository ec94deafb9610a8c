r"""Language modelling for chapter 7: characters, next-token training, and discrete kernels.

A character-level :class:`CharTokenizer` turns text into token ids; :func:`train_language_model`
fits any model that maps ``(B, T)`` ids to ``(B, T, V)`` logits (a
:class:`~localbook.LocalTransformer` or a :class:`DiscreteKernel`) by next-token cross-entropy, and
:func:`evaluate_loss` scores it on held-out text. The baselines are local means on a *discrete*
space: the bigram model :math:`p(b \mid a) = K(a, b) / \sum_{b'} K(a, b')` with the count kernel
(:func:`bigram_kernel`) or a learned one (:class:`DiscreteKernel`). :func:`word_groups` groups the
characters of a passage into words, for :func:`~localbook.attention_graph`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from ._validate import check_indices, check_positive_float, check_positive_int
from .notebook import progress_enabled

__all__ = [
    "CharTokenizer",
    "sample_batch",
    "train_language_model",
    "TrainingHistory",
    "evaluate_loss",
    "bigram_counts",
    "bigram_kernel",
    "DiscreteKernel",
    "word_groups",
]


# --- text --------------------------------------------------------------------------------------
class CharTokenizer:
    """A character-level tokenizer: the vocabulary is the sorted set of characters of ``text``.

    ``encode(str) → (n,) long tensor``, ``decode(ids) → str``; ``len(tok)`` is ``|V|``.
    """

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("text is empty; a tokenizer needs at least one character")
        self.chars: List[str] = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(|V| = {len(self)})"

    def encode(self, text: str) -> torch.Tensor:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(
                f"text contains {len(unknown)} character(s) not in the vocabulary: {''.join(unknown)!r}"
            )
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        ids = torch.as_tensor(ids)
        if ids.is_floating_point() or ids.dtype == torch.bool or ids.ndim > 1:
            raise TypeError("ids must be a 1-D sequence of integer token ids")
        ids = ids.reshape(-1).tolist()
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self)}), got {bad[:5]}")
        return "".join(self.chars[i] for i in ids)


def _check_tokens(
    tokens, name="tokens", vocab_size=None, min_len: int = 2
) -> torch.Tensor:
    """A 1-D sequence of token ids (any integer dtype) as a long tensor on its device: ids
    ``≥ 0``, below ``vocab_size`` when given, at least ``min_len`` of them."""
    t = check_indices(tokens, name, vocab_size, ndim=(1,), what="token ids")
    if t.numel() < min_len:
        raise ValueError(
            f"{name} must hold at least {min_len} token ids (an input and its next "
            f"token), got {t.numel()}"
        )
    if vocab_size is None and int(t.min()) < 0:
        raise ValueError(f"{name} must hold token ids >= 0, got {int(t.min())}")
    return t


def _vocab(model) -> Optional[int]:
    v = getattr(model, "vocab_size", None)
    return v if isinstance(v, int) else None


def sample_batch(
    tokens: torch.Tensor,
    batch_size: int,
    context: int,
    generator: Optional[torch.Generator] = None,
):
    """``batch_size`` random windows of ``tokens``: inputs ``x (B, T)`` and next tokens ``y (B, T)``."""
    tokens = _check_tokens(tokens)
    batch_size = check_positive_int(batch_size, "batch_size")
    context = check_positive_int(context, "context", maximum=max(1, tokens.numel() - 1))
    start = torch.randint(
        0, tokens.numel() - context, (batch_size,), generator=generator
    )
    idx = start[:, None] + torch.arange(context)
    idx = idx.to(tokens.device)
    return tokens[idx], tokens[idx + 1]


@dataclass
class TrainingHistory:
    """Losses (mean cross-entropy, nats per token) of :func:`train_language_model`."""

    steps: List[int] = field(default_factory=list)
    train_loss: List[float] = field(default_factory=list)
    seconds: float = 0.0


def train_language_model(
    model: nn.Module,
    tokens: torch.Tensor,
    *,
    n_steps: int = 300,
    batch_size: int = 32,
    context: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: Optional[bool] = None,
    log_every: int = 10,
    callback: Optional[Callable[[int, nn.Module], None]] = None,
) -> TrainingHistory:
    r"""Next-token training with AdamW: minimize :math:`-\frac1{BT}\sum \log p(x_{t+1} \mid x_{\le t})`.

    ``model`` maps ``(B, T)`` token ids to ``(B, T, V)`` logits (a :class:`LocalTransformer` or a
    :class:`DiscreteKernel`). Batches are random windows drawn with a generator seeded by ``seed``
    (so two runs from the same initial weights give the same history). A tqdm progress bar shows when
    interactive (``progress=None``), never when ``LOCALBOOK_STATIC`` is set (the conventions of
    :func:`~localbook.train_dae`: ``n_steps``, ``seed``, ``progress``). ``callback(step, model)``,
    if given, is called at every logged step after the update (e.g. to record learned α's).
    """
    import time

    from tqdm.auto import tqdm

    tokens = _check_tokens(tokens, vocab_size=_vocab(model))
    n_steps = check_positive_int(n_steps, "n_steps")
    lr = check_positive_float(lr, "lr")
    log_every = check_positive_int(log_every, "log_every")
    if callback is not None and not callable(callback):
        raise TypeError(
            f"callback must be callable as callback(step, model), got {type(callback).__name__}"
        )
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=n_steps, eta_min=lr / 10
    )
    hist = TrainingHistory()
    bar = tqdm(
        range(n_steps),
        disable=not progress_enabled(progress),
        desc="training",
        leave=False,
    )
    model.train()
    t0 = time.perf_counter()
    for step in bar:
        x, y = sample_batch(tokens, batch_size, context, g)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % log_every == 0 or step == n_steps - 1:
            hist.steps.append(step)
            hist.train_loss.append(float(loss.detach()))
            bar.set_postfix(loss=f"{hist.train_loss[-1]:.3f}")
            if callback is not None:
                callback(step, model)
    hist.seconds = time.perf_counter() - t0
    model.eval()
    return hist


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    context: int = 64,
    max_windows: int = 256,
    reduction: str = "mean",
):
    """Mean next-token cross-entropy (nats) over consecutive non-overlapping windows of ``tokens``.

    ``reduction="none"`` returns the loss of every predicted token instead, a float64 tensor
    ``(n_windows, context)`` (for paired comparisons of two models on the same positions).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    tokens = _check_tokens(tokens, vocab_size=_vocab(model))
    context = check_positive_int(context, "context", maximum=max(1, tokens.numel() - 1))
    max_windows = check_positive_int(max_windows, "max_windows")
    n = min(max_windows, (tokens.numel() - 1) // context)
    x = tokens[: n * context].view(n, context)
    y = tokens[1 : n * context + 1].view(n, context)
    was = model.training
    model.eval()
    logits = model(x)
    model.train(was)
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).double(),
        y.reshape(-1),
        reduction=reduction,
    )
    return loss.view(n, context) if reduction == "none" else float(loss)


# --- discrete kernels ----------------------------------------------------------------------------
def bigram_counts(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``C[a, b] = #{t : x_t = a, x_{t+1} = b}``, ``(V, V)`` in the default float dtype."""
    V = check_positive_int(vocab_size, "vocab_size")
    tokens = _check_tokens(tokens, vocab_size=V)
    flat = tokens[:-1] * V + tokens[1:]
    return (
        torch.bincount(flat, minlength=V * V).view(V, V).to(torch.get_default_dtype())
    )


def bigram_kernel(
    tokens: torch.Tensor, vocab_size: int, smoothing: float = 1.0
) -> torch.Tensor:
    r"""The bigram local mean :math:`p(b \mid a) = (C_{ab} + \alpha) / \sum_{b'} (C_{ab'} + \alpha)`, ``(V, V)``.

    It is the maximum-likelihood :class:`DiscreteKernel` (row-normalized) when ``smoothing = 0``.
    """
    smoothing = check_positive_float(smoothing, "smoothing", allow_zero=True)
    C = bigram_counts(tokens, vocab_size) + smoothing
    tot = C.sum(1, keepdim=True)
    return C / torch.where(tot > 0, tot, torch.ones_like(tot))


class DiscreteKernel(nn.Module):
    r"""A learnable kernel on a discrete space: the next-token local mean with kernel matrix ``K``.

    The prediction after token ``a`` is the local mean of the one-hot next tokens ``e_b`` with
    weights ``K(a, b)``: :math:`p(b \mid a) = K(a, b) / \sum_{b'} K(a, b')`, ``K = exp(L)``.
    ``rank=None`` learns the full ``(V, V)`` log kernel ``L``; ``rank = r`` factorizes it as
    :math:`L = U W^\top/\sqrt r + \mathbf 1 \beta^\top` (``U = query (V, r)`` embeds the current
    token, ``W = key (V, r)`` the next one, ``β = bias`` is a per-next-token bias). This has
    the bilinear form of a query–key score, but it compares the current token with the *next* one: it is a factorized
    (log-bilinear) output layer, not attention, whose query–key kernel compares the current token
    with the earlier ones. ``forward(idx (..., T))`` returns logits ``(..., T, V)``.
    """

    def __init__(self, vocab_size: int, rank: Optional[int] = None, seed: int = 0):
        super().__init__()
        self.vocab_size = V = check_positive_int(vocab_size, "vocab_size")
        self.rank = (
            None if rank is None else check_positive_int(rank, "rank", maximum=V)
        )
        g = torch.Generator().manual_seed(seed)
        if self.rank is None:
            self.log_kernel = nn.Parameter(torch.zeros(V, V))
        else:
            self.query = nn.Parameter(0.1 * torch.randn(V, self.rank, generator=g))
            self.key = nn.Parameter(0.1 * torch.randn(V, self.rank, generator=g))
            self.bias = nn.Parameter(torch.zeros(V))

    def log_matrix(self) -> torch.Tensor:
        """The log kernel ``L (V, V)``."""
        if self.rank is None:
            return self.log_kernel
        return self.query @ self.key.T / math.sqrt(self.rank) + self.bias

    def kernel(self) -> torch.Tensor:
        """The row-normalized kernel ``p(b | a)``, ``(V, V)``."""
        return torch.softmax(self.log_matrix(), dim=-1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        idx = check_indices(idx, "idx", self.vocab_size, what="token ids")
        return self.log_matrix()[idx]


def word_groups(text: str) -> Tuple[torch.Tensor, List[str]]:
    """Group the characters of ``text`` into words: ``group (len(text),)`` ids and the word labels.

    Runs of letters, digits and apostrophes form a word; every other non-space character is its
    own group; whitespace joins the group before it (the first group, at the start of the text).
    """
    import re

    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be a str with at least one non-space character")
    group = [-1] * len(text)
    labels: List[str] = []
    for m in re.finditer(r"[\w'’]+|[^\w\s]", text):
        group[m.start() : m.end()] = [len(labels)] * (m.end() - m.start())
        labels.append(m.group())
    prev = next(g for g in group if g >= 0)
    for i, g in enumerate(
        group
    ):  # fill whitespace forward: a loop over one short passage
        if g < 0:
            group[i] = prev
        else:
            prev = g
    return torch.tensor(group, dtype=torch.long), labels
