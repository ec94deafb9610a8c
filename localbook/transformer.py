r"""Multi-head attention layers and a tiny Transformer built from the temporal local mean.

:class:`LocalMeanAttention` runs ``H`` heads of :func:`localbook.local_mean_attention`
(softmax, sparsemax, 1.5-entmax, or α-entmax with a learnable α per head);
:class:`LocalTransformer` stacks them as a hierarchical local model over characters (chapter 7;
the training loop and baselines are in :mod:`localbook.language`).
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import nn

from ._validate import (
    as_tensor,
    check_bool,
    check_choice,
    check_positive_float,
    check_positive_int,
)
from .attention import WEIGHTS, _attend

__all__ = ["LocalMeanAttention", "LocalTransformer"]


class LocalMeanAttention(nn.Module):
    r"""Multi-head self-attention written as ``H`` temporal local means.

    Head ``h`` projects ``x (B, T, d_model)`` to :math:`q = x W_q^h`, :math:`k = x W_k^h`,
    :math:`v = x W_v^h` (``d_head = d_model / H``), takes :func:`local_mean_attention`, and the
    heads are concatenated and mixed by :math:`W_o`. Returns ``(B, T, d_model)`` (and the weights
    ``(B, H, T, T)`` with ``return_weights=True``). Unbatched ``(T, d_model)`` input works too.

    ``weights="entmax_bisect"`` is adaptively sparse attention (Correia, Niculae & Martins 2019):
    α-entmax weights with a learnable α per head, :math:`\alpha_h = 1 + \sigma(a_h) \in (1, 2)`
    (the paper's parametrization, between softmax and sparsemax), started at ``alpha`` (1.5);
    the parameter is ``alpha_logit`` ``(H,)`` and :attr:`alpha` gives the current α's.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 1,
        causal: bool = True,
        temporal=None,
        weights="softmax",
        bias: bool = True,
        alpha: float = 1.5,
    ):
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        n_heads = check_positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(
                f"d_model ({d_model}) must be divisible by n_heads ({n_heads})"
            )
        if not callable(weights):
            check_choice(weights, "weights", list(WEIGHTS))
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.causal, self.temporal, self.weights = bool(causal), temporal, weights
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        if weights == "entmax_bisect":
            alpha = check_positive_float(alpha, "alpha")
            if not 1 < alpha < 2:
                raise ValueError(
                    f"alpha (the initial α of every head) must be in (1, 2), got {alpha}"
                )
            self.alpha_logit = nn.Parameter(
                torch.full((n_heads,), math.log((alpha - 1) / (2 - alpha)))
            )

    @property
    def alpha(self) -> Optional[torch.Tensor]:
        """The α of each head, ``1 + sigmoid(alpha_logit)`` ``(H,)`` (None unless entmax_bisect)."""
        if self.weights != "entmax_bisect":
            return None
        return 1 + torch.sigmoid(self.alpha_logit)

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        """``x (B, T, d_model)`` or ``(T, d_model)``, any real dtype (computed in the
        module's dtype), finite and non-empty."""
        x = as_tensor(x, "x", like=self.qkv.weight, ndim=(2, 3))
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (B, T, {self.d_model}) or (T, {self.d_model}), got "
                f"{tuple(x.shape)}"
            )
        return self._forward(x, check_bool(return_weights, "return_weights"))

    def _forward(self, x: torch.Tensor, return_weights: bool = False):
        """:meth:`forward` on a checked tensor (the blocks of :class:`LocalTransformer`)."""
        unbatched = x.ndim == 2
        if unbatched:
            x = x[None]
        B, T, _ = x.shape
        q, k, v = (
            self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        )
        res = _attend(
            q,
            k,
            v,
            (B, self.n_heads),
            causal=self.causal,
            weights=self.weights,
            temporal=self.temporal,
            return_weights=return_weights,
            alpha=self.alpha,
        )
        o, w = res if return_weights else (res, None)
        y = self.out(o.transpose(1, 2).reshape(B, T, self.d_model))
        if unbatched:
            y, w = y[0], (w[0] if w is not None else None)
        return (y, w) if return_weights else y


class _Block(nn.Module):
    """One level of the hierarchy: ``x + LocalMean(LN(x))``, then ``x + FF(LN(x))``."""

    def __init__(self, d_model, n_heads, d_ff, causal, temporal, weights, alpha=1.5):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = LocalMeanAttention(
            d_model,
            n_heads,
            causal=causal,
            temporal=temporal,
            weights=weights,
            alpha=alpha,
        )
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)
        )

    def forward(self, x, return_weights=False):
        a = self.attn._forward(self.ln1(x), return_weights=return_weights)
        a, w = a if return_weights else (a, None)
        x = x + a
        x = x + self.ff(self.ln2(x))
        return x, w


class LocalTransformer(nn.Module):
    r"""A tiny causal Transformer as a hierarchical local model.

    token + position embedding → [``x + LocalMeanAttention(LN x)``, ``x + FF(LN x)``] × ``n_layers``
    → LN → linear readout to next-token logits. ``forward(idx (B, T) long)`` returns logits
    ``(B, T, V)``; ``T ≤ context``. ``temporal`` (e.g. ``TemporalKernel(decay=alibi_slopes(H))``)
    adds a temporal kernel to every layer; ``positional=False`` drops the learned position embedding.
    ``weights="entmax_bisect"`` learns an α per head and layer, started at ``alpha`` (see
    :class:`LocalMeanAttention`); :meth:`alphas` returns them.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        context: int = 128,
        d_ff: Optional[int] = None,
        temporal=None,
        weights="softmax",
        positional: bool = True,
        alpha: float = 1.5,
    ):
        super().__init__()
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.context = check_positive_int(context, "context")
        n_layers = check_positive_int(n_layers, "n_layers")
        d_model = check_positive_int(d_model, "d_model")
        d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
        self.tok = nn.Embedding(self.vocab_size, d_model)
        self.pos = nn.Embedding(self.context, d_model) if positional else None
        self.blocks = nn.ModuleList(
            _Block(d_model, n_heads, d_ff, True, temporal, weights, alpha)
            for _ in range(n_layers)
        )
        self.ln = nn.LayerNorm(d_model)
        self.readout = nn.Linear(d_model, self.vocab_size)

    def _check_idx(self, idx):
        if (
            not isinstance(idx, torch.Tensor)
            or idx.dtype not in (torch.int64, torch.int32)
            or idx.ndim not in (1, 2)
        ):
            raise TypeError(
                "idx must be an integer tensor of token ids, shape (B, T) or (T,)"
            )
        if idx.shape[-1] > self.context:
            raise ValueError(
                f"idx has {idx.shape[-1]} positions but the model's context is {self.context}"
            )
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.vocab_size):
            raise ValueError(
                f"idx must hold token ids in [0, {self.vocab_size}), got values in "
                f"[{int(idx.min())}, {int(idx.max())}]"
            )

    def forward(self, idx: torch.Tensor, return_weights: bool = False):
        self._check_idx(idx)
        unbatched = idx.ndim == 1
        if unbatched:
            idx = idx[None]
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        ws = []
        for blk in self.blocks:
            x, w = blk(x, return_weights)
            ws.append(w)
        logits = self.readout(self.ln(x))
        if unbatched:
            logits = logits[0]
            ws = [w[0] if w is not None else None for w in ws]
        return (logits, ws) if return_weights else logits

    @torch.no_grad()
    def alphas(self) -> Optional[torch.Tensor]:
        """The learned α of every layer and head, ``(n_layers, H)`` (None unless entmax_bisect)."""
        if self.blocks[0].attn.alpha is None:
            return None
        return torch.stack([blk.attn.alpha for blk in self.blocks])

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> List[torch.Tensor]:
        """The learned local-mean weights of every layer, a list of ``(B, H, T, T)`` (or ``(H, T, T)``)."""
        return self.forward(idx, return_weights=True)[1]

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, n_new: int, temperature: float = 1.0, seed: int = 0
    ) -> torch.Tensor:
        """Sample ``n_new`` tokens after the prompt ``idx (T,)``; returns the ``(T + n_new,)`` ids."""
        n_new = check_positive_int(n_new, "n_new", minimum=0)
        temperature = check_positive_float(temperature, "temperature")
        if not isinstance(idx, torch.Tensor) or idx.ndim != 1 or idx.numel() == 0:
            raise ValueError(
                "idx must be a non-empty 1-D tensor of token ids (the prompt)"
            )
        g = torch.Generator(device=idx.device).manual_seed(seed)
        out = idx.clone()
        for _ in range(
            n_new
        ):  # one new token per step: the loop is over time, not data points
            logits = self.forward(out[-self.context :])[-1] / temperature
            nxt = torch.multinomial(
                torch.softmax(logits.double(), -1).to(logits.dtype), 1, generator=g
            )
            out = torch.cat([out, nxt])
        return out
