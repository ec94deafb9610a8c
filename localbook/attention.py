r"""Attention as a temporal self-local mean, and a small Transformer built from it.

A sequence :math:`x_1, \dots, x_T` is a sample whose points carry a *time* as well as a value.
With queries :math:`q_t = W_q^\top x_t`, keys :math:`k_s = W_k^\top x_s` and values
:math:`v_s = W_v^\top x_s`
(:math:`W_q, W_k \in \mathbb R^{D\times d}`, so the query matrix is :math:`XW_q`),
the *temporal self-local mean* with the kernel

.. math:: K(x_t, t, x_s, s) = \exp(\langle q_t, k_s\rangle \cdot c)\; \kappa(t, s)

(``c`` the scale, :math:`\kappa \ge 0` a *temporal kernel*) is

.. math:: \hat v_t = \frac{\sum_s K(x_t, t, x_s, s)\, v_s}{\sum_s K(x_t, t, x_s, s)},

which for :math:`\kappa(t, s) = 1[s \le t]` is causal softmax self-attention. Temporal kernels are
handled in log form (:math:`\log\kappa = -\infty` where a key is masked), exactly like the
localization kernels of :mod:`localbook.kernels`:

* causal mask :math:`\kappa = 1[s \le t]`;
* sliding window of width ``w``: :math:`\kappa = 1[|t - s| < w]` (local attention);
* exponential recency decay :math:`\kappa = e^{-\lambda |t - s|}` (ALiBi, Press et al. 2022).

The module holds the temporal kernels, the attention function :func:`local_mean_attention`, the
multi-head layer :class:`LocalMeanAttention` and the tiny :class:`LocalTransformer`;
:func:`attention_graph` (learned weights as a token graph) is in :mod:`localbook.token_graph`
and re-exported here. The language-model pieces of chapter 7 (tokenizer, training loop, bigram baselines) are in :mod:`localbook.language`;
the graph is drawn by :func:`localbook.plotting.draw_attention_graph`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch.nn import functional as F

from ._validate import (
    as_tensor,
    check_bool,
    check_choice,
    check_finite,
    check_positive_float,
    check_positive_int,
    warn_empty,
)
from .kernels import chunk_rows, iter_chunks

__all__ = [
    "TemporalKernel",
    "alibi_slopes",
    "temporal_kernel",
    "local_mean_attention",
]

WEIGHTS = ("softmax", "sparsemax", "entmax15", "entmax_bisect")


# --- temporal kernels --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TemporalKernel:
    r"""A temporal kernel :math:`\kappa(t, s)` on positions, in log form.

    ``log κ(t, s) = log 1[s ≤ t] (if causal) + log 1[|t − s| < window] (if window) − decay·|t − s|``.
    ``decay`` is a non-negative float or a 1-D tensor of per-head rates ``(H,)`` (then the log
    matrix has shape ``(H, T_q, T_k)`` and broadcasts against ``(..., H, T_q, T_k)`` scores).
    Query ``i`` sits at position ``i`` and key ``j`` at position ``j`` (the top-left alignment of
    :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``).
    """

    causal: bool = False
    window: Optional[int] = None
    decay: Union[float, torch.Tensor, None] = None

    def __post_init__(self):
        if not isinstance(self.causal, bool):
            raise TypeError(
                f"causal must be True or False, got {type(self.causal).__name__}"
            )
        if self.window is not None:
            object.__setattr__(
                self, "window", check_positive_int(self.window, "window")
            )
        if self.decay is not None:
            if isinstance(self.decay, torch.Tensor) and self.decay.numel() != 1:
                d = self.decay.detach()
                if (
                    d.ndim != 1
                    or not bool(torch.isfinite(d).all())
                    or bool((d < 0).any())
                ):
                    raise ValueError(
                        "decay must be a non-negative float or a 1-D tensor of non-negative per-head rates"
                    )
            else:
                object.__setattr__(
                    self,
                    "decay",
                    check_positive_float(self.decay, "decay", allow_zero=True),
                )

    @property
    def trivial(self) -> bool:
        """True when the kernel is constant (no mask, no window, no decay)."""
        return (
            not self.causal
            and self.window is None
            and (
                self.decay is None
                or (not isinstance(self.decay, torch.Tensor) and self.decay == 0)
            )
        )

    def log_matrix(self, t_q, t_k, *, dtype=None, device=None) -> torch.Tensor:
        """``log κ(t, s)`` for query positions ``t_q`` and key positions ``t_k``.

        ``t_q``/``t_k`` are integer counts (positions ``0..T-1``) or 1-D position tensors.
        Returns ``(T_q, T_k)``, or ``(H, T_q, T_k)`` for per-head decay rates.
        """
        dtype = dtype or torch.get_default_dtype()
        tq = (
            torch.arange(t_q, device=device) if isinstance(t_q, int) else t_q.to(device)
        )
        tk = (
            torch.arange(t_k, device=device) if isinstance(t_k, int) else t_k.to(device)
        )
        tq, tk = (
            tq.to(torch.int32),
            tk.to(torch.int32),
        )  # int32 lags: half the memory of int64
        shape = (tq.shape[0], tk.shape[0])
        out = torch.zeros(shape, dtype=dtype, device=device)
        keep = torch.ones(shape, dtype=torch.bool, device=device)
        if self.causal:
            keep &= tq[:, None] >= tk[None, :]
        if self.window is not None or self.decay is not None:
            lag = tq[:, None] - tk[None, :]  # t − s
        if self.window is not None:
            keep &= lag.abs() < self.window
        if self.decay is not None:
            rate = self.decay
            if isinstance(rate, torch.Tensor):
                rate = rate.to(dtype=dtype, device=device)
                if rate.ndim == 1:
                    out = -rate[:, None, None] * lag.abs().to(dtype)
                    keep = keep.expand_as(out)
                else:
                    out = -rate * lag.abs().to(dtype)
            else:
                out = -rate * lag.abs().to(dtype)
        return out.masked_fill(~keep, -math.inf)

    def matrix(self, t_q, t_k, **kw) -> torch.Tensor:
        """``κ(t, s)`` itself (zeros where masked), for figures."""
        return torch.exp(self.log_matrix(t_q, t_k, **kw))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's per-head decay rates ``2^(-8h/H)``, ``h = 1..H`` (Press et al. 2022), ``(H,)``."""
    n_heads = check_positive_int(n_heads, "n_heads")
    return torch.pow(
        2.0, -8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64) / n_heads
    ).to(torch.get_default_dtype())


def temporal_kernel(
    T: int, causal: bool = False, window: Optional[int] = None, decay=None
) -> torch.Tensor:
    """The ``(T, T)`` temporal kernel matrix ``κ(t, s)`` (see :class:`TemporalKernel`)."""
    T = check_positive_int(T, "T")
    return TemporalKernel(causal=causal, window=window, decay=decay).matrix(T, T)


# --- the local mean ----------------------------------------------------------------------------
def _check_qkv(q, k, v, check_values: bool = True):
    q = as_tensor(q, "q", finite=False)
    for name, t in (
        ("k", k),
        ("v", v),
    ):  # as torch's SDPA: no silent casts between float dtypes
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != q.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but q has dtype {q.dtype}: q, k and v must "
                f"share one floating dtype, as in scaled_dot_product_attention (cast "
                f"first, e.g. {name}.to(q.dtype))"
            )
    k = as_tensor(k, "k", like=q, finite=False)
    v = as_tensor(v, "v", like=q, finite=False)
    # one host synchronisation for the three tensors (a finite sum proves every entry finite);
    # only a non-finite sum pays for the exact check that names the argument
    if check_values and not bool(torch.isfinite(q.sum() + k.sum() + v.sum())):
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_finite(t, name)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have shape (..., T, d) with at least 2 dimensions, got shape {tuple(t.shape)}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same feature dimension d, got q: {q.shape[-1]} and k: {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length T_k (keys and values pair up), got k: {k.shape[-2]} and v: {v.shape[-2]}"
        )
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q {tuple(q.shape[:-2])}, k {tuple(k.shape[:-2])} and v {tuple(v.shape[:-2])} do not broadcast"
        ) from None
    return q, k, v, batch


def _temporal_log(temporal, causal: bool, Tq: int, Tk: int, like: torch.Tensor):
    """Combine ``causal`` and ``temporal`` into an additive log kernel (or None when constant)."""
    if temporal is None:
        temporal = TemporalKernel(causal=causal)
    if isinstance(temporal, TemporalKernel):
        if causal and not temporal.causal:
            temporal = TemporalKernel(
                causal=True, window=temporal.window, decay=temporal.decay
            )
        return temporal
    if isinstance(temporal, dict):
        return _temporal_log(TemporalKernel(**temporal), causal, Tq, Tk, like)
    if not isinstance(temporal, torch.Tensor):
        raise TypeError(
            "temporal must be None, a TemporalKernel, a dict of its fields, or a tensor (boolean mask or "
            f"log kernel) broadcastable to (..., T_q, T_k); got {type(temporal).__name__}"
        )
    if temporal.ndim < 2:
        raise ValueError(
            f"a temporal tensor must have shape (..., T_q, T_k) = (..., {Tq}, {Tk}), got shape {tuple(temporal.shape)}"
        )
    if temporal.shape[-2] not in (1, Tq) or temporal.shape[-1] not in (1, Tk):
        raise ValueError(
            f"a temporal tensor must broadcast to (..., T_q, T_k) = (..., {Tq}, {Tk}), got shape {tuple(temporal.shape)}"
        )
    t = temporal.to(like.device)
    if t.dtype == torch.bool:
        t = torch.zeros(t.shape, dtype=like.dtype, device=like.device).masked_fill(
            ~t, -math.inf
        )
    elif t.is_floating_point():
        t = t.to(like.dtype)
        if bool(torch.isnan(t).any()) or bool(torch.isposinf(t).any()):
            raise ValueError(
                "a temporal log kernel must not contain NaN or +inf (use -inf to mask a key)"
            )
    else:
        raise TypeError(
            f"a temporal tensor must be boolean (True = attend) or a floating log kernel, got dtype {t.dtype}"
        )
    if causal:
        t = t + TemporalKernel(causal=True).log_matrix(
            Tq, Tk, dtype=like.dtype, device=like.device
        )
    return t


def _chunk_log(tl, sl: slice, Tk: int, like: torch.Tensor):
    """The temporal log kernel for the query rows ``sl`` (None when constant)."""
    if tl is None:
        return None
    if isinstance(tl, TemporalKernel):
        if tl.trivial:
            return None
        pos = torch.arange(sl.start, sl.stop, device=like.device)
        return tl.log_matrix(pos, Tk, dtype=like.dtype, device=like.device)
    return tl if tl.shape[-2] == 1 else tl[..., sl, :]


def _empty_rows(tl, Tq: int, Tk: int, device):
    """Which queries have every key masked, in O(T) for a :class:`TemporalKernel` (None: none can be)."""
    if isinstance(tl, torch.Tensor):
        return torch.isneginf(tl).all(dim=-1)
    if tl.window is None:
        return None  # causal (top-left) rows always keep key 0; decay never masks
    t = torch.arange(Tq, device=device)
    lo = (t - tl.window + 1).clamp(min=0)
    hi = (t if tl.causal else t + tl.window - 1).clamp(max=Tk - 1)
    return lo > hi


def _check_alpha(alpha, weights, batch):
    """α of ``weights="entmax_bisect"``: a float > 1, or a tensor > 1 broadcastable to ``batch``."""
    if weights != "entmax_bisect":
        if alpha is not None:
            raise ValueError(
                f"alpha is used only with weights='entmax_bisect', not weights={weights!r}"
            )
        return None
    if alpha is None:
        raise ValueError(
            "weights='entmax_bisect' needs alpha: a float > 1, or a tensor of α > 1 "
            "broadcastable to the batch shape (one α per head: shape (H,))"
        )
    if isinstance(alpha, torch.Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"alpha must be a floating tensor, got dtype {alpha.dtype}")
        try:
            ok = torch.broadcast_shapes(alpha.shape, batch) == torch.Size(batch)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"alpha of shape {tuple(alpha.shape)} must broadcast to the batch shape "
                f"{tuple(batch)} of q, k, v (one α per head: shape (H,))"
            )
        with torch.no_grad():
            if not bool((torch.isfinite(alpha) & (alpha > 1)).all()):
                raise ValueError(
                    "alpha must be finite and > 1 (α → 1 is softmax: use weights='softmax')"
                )
        return alpha
    alpha = check_positive_float(alpha, "alpha")
    if not alpha > 1:
        raise ValueError(
            f"alpha must be > 1 (α → 1 is softmax: use weights='softmax'), got {alpha}"
        )
    return alpha


def _resolve_weights(weights, alpha=None) -> Callable:
    if callable(weights):
        return weights
    name = check_choice(weights, "weights", list(WEIGHTS))
    if name == "softmax":
        return lambda s: torch.softmax(s, dim=-1)
    try:
        from . import entmax as _entmax  # lazily: written in its own chapter
    except (
        ImportError
    ) as exc:  # pragma: no cover - depends on the entmax chapter being present
        raise ImportError(
            f"weights={name!r} needs localbook.entmax, which could not be imported: {exc}"
        ) from None
    if name == "entmax_bisect" and isinstance(alpha, torch.Tensor):
        # one α per batch entry (head): (..., 1, 1) against the scores (..., rows, T_k); Newton's
        # method on τ for α ≤ 2, bisection beyond (its convexity argument needs α ≤ 2)
        from .entmax_alpha import entmax_alpha_newton

        a = alpha.reshape(*alpha.shape, 1, 1)
        if bool((alpha.detach() <= 2).all()):
            return lambda s: entmax_alpha_newton(s, a, dim=-1)
        return lambda s: _entmax.entmax_bisect(s, a, dim=-1)
    if name == "entmax_bisect":
        return lambda s: _entmax.entmax_bisect(s, alpha, dim=-1)
    fn = getattr(_entmax, name)
    return lambda s: fn(s, dim=-1)


class _RecomputedAttention(torch.autograd.Function):
    """Chunked attention whose backward recomputes each chunk of query rows.

    ``chunk(q_rows, rows_slice) -> (out_rows, weights)`` is the local mean of one chunk. The
    forward runs it without a graph; the backward rebuilds one chunk's small graph at a time
    and pulls the output gradient back through it, so memory holds one ``(rows, T_k)`` chunk,
    not the whole weight matrix. For second derivatives (``create_graph=True``) the backward
    builds the graph of every chunk, as plain autograd would.
    """

    @staticmethod
    def forward(ctx, q, k, v, chunk, rows, *extras):
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        for sl in iter_chunks(q.shape[-2], rows):
            out[..., sl, :] = chunk(q[..., sl, :], sl)[0]
        ctx.chunk, ctx.rows = chunk, rows
        ctx.save_for_backward(q, k, v, *extras)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *extras = ctx.saved_tensors
        need = ctx.needs_input_grad[:3] + ctx.needs_input_grad[5:]
        create = torch.is_grad_enabled()
        total = [None] * len(need)
        for sl in iter_chunks(q.shape[-2], ctx.rows):
            with torch.enable_grad():
                q_c, k_c, v_c = (
                    t if create else t.detach().requires_grad_(w)
                    for t, w in zip((q, k, v), need)
                )
                o = ctx.chunk(q_c[..., sl, :], sl, k_c, v_c)[0]
            inputs = [q_c, k_c, v_c, *extras]
            wrt = [t for t, w in zip(inputs, need) if w]
            got = iter(
                torch.autograd.grad(
                    o, wrt, grad_out[..., sl, :], create_graph=create, allow_unused=True
                )
            )
            for i, w in enumerate(need):
                g = next(got) if w else None
                if g is None:
                    continue
                if total[i] is None:
                    total[i] = g
                elif create:
                    total[i] = total[i] + g  # out of place: stays differentiable
                else:
                    total[i] += g
        return (*total[:3], None, None, *total[3:])


def _attend(
    q,
    k,
    v,
    batch,
    causal=False,
    weights="softmax",
    scale=None,
    temporal=None,
    return_weights=False,
    fused=True,
    *,
    budget=None,
    alpha=None,
):
    """The local mean on validated tensors (no checks on values): see :func:`local_mean_attention`."""
    Tq, Tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    c = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.expand(*batch, *q.shape[-2:])
    k = k.expand(*batch, *k.shape[-2:])
    v = v.expand(*batch, *v.shape[-2:])
    tl = _temporal_log(temporal, causal, Tq, Tk, q)

    # empty neighbourhoods (every key masked for some query) → NaN rows, one warning
    empty = None
    empty_rows = _empty_rows(tl, Tq, Tk, q.device)
    if empty_rows is not None:
        if bool(empty_rows.any()):
            empty = empty_rows
            warn_empty(
                int(empty_rows.sum()),
                None,
                "have every key masked by the temporal kernel",
                what="query row(s)",
                result="their outputs are NaN",
                stacklevel=3,
            )

    if weights == "softmax" and fused and not return_weights:
        if isinstance(tl, TemporalKernel) and tl.trivial:
            out = F.scaled_dot_product_attention(q, k, v, scale=c)
        elif (
            isinstance(tl, TemporalKernel)
            and tl.causal
            and tl.window is None
            and tl.decay is None
        ):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=c)
        else:
            mask = (
                tl
                if isinstance(tl, torch.Tensor)
                else tl.log_matrix(Tq, Tk, dtype=q.dtype, device=q.device)
            )
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=c)
        if empty is not None:
            out = out.masked_fill(empty.expand(*out.shape[:-1])[..., None], math.nan)
        return out

    fn = _resolve_weights(weights, alpha)
    nontrivial = not (isinstance(tl, TemporalKernel) and tl.trivial)
    width = (
        max(1, math.prod(batch))
        * (2 if return_weights else 1)
        * (2 if nontrivial else 1)
    )
    rows = chunk_rows(Tq, Tk, width, q.element_size(), budget, q.device)
    ws = []
    # without autograd, write into one output: small per-chunk outputs kept alive between the
    # chunks' score buffers fragment the C heap, and the freed buffers are then not reused
    # (measured: peak memory T×T×4 bytes in some runs instead of a few chunks)
    # (under autograd too: the chunks are copied into it, which autograd records)
    out = torch.empty(*batch, Tq, v.shape[-1], dtype=q.dtype, device=q.device)

    def chunk(q_sl, sl, k=k, v=v):
        s = (q_sl @ k.transpose(-1, -2)) * c
        lk = _chunk_log(tl, sl, Tk, q)
        if lk is not None:
            s = s + lk
        w = fn(s)
        if not isinstance(w, torch.Tensor) or w.shape != s.shape:
            raise ValueError(
                f"weights callable must return a tensor of the score shape {tuple(s.shape)}, got "
                f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}"
            )
        return w @ v, w

    # under autograd each chunk is recomputed in the backward pass (_RecomputedAttention): the
    # graph keeps q, k, v and the output, never the Tq × Tk weights
    # (built-in weights only: a user's callable may hold parameters this node cannot see)
    if (
        torch.is_grad_enabled()
        and not return_weights
        and isinstance(weights, str)
        and any(t.requires_grad for t in (q, k, v))
    ):
        extras = [
            t
            for t in (alpha, tl, getattr(tl, "decay", None))
            if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        out = _RecomputedAttention.apply(q, k, v, chunk, rows, *extras)
        if empty is not None:
            out = out.masked_fill(empty.expand(*out.shape[:-1])[..., None], math.nan)
        return out
    for sl in iter_chunks(Tq, rows):
        o, w = chunk(q[..., sl, :], sl)
        out[..., sl, :] = o
        if return_weights:
            ws.append(w)
        del o, w  # free this chunk's buffers before the next chunk allocates its own
    if empty is not None:
        out = out.masked_fill(empty.expand(*out.shape[:-1])[..., None], math.nan)
    if return_weights:
        return out, (torch.cat(ws, dim=-2) if len(ws) > 1 else ws[0])
    return out


def local_mean_attention(
    q,
    k,
    v,
    causal: bool = False,
    weights="softmax",
    scale: Optional[float] = None,
    temporal=None,
    return_weights: bool = False,
    *,
    fused: bool = True,
    alpha=None,
    check_values: bool = True,
):
    r"""Attention as the temporal self-local mean :math:`\hat v_t = \sum_s w_{ts} v_s`.

    The weights are :math:`w_{ts} = \mathrm{norm}_s(c\, q_t \cdot k_s + \log\kappa(t, s))` with
    ``norm = softmax`` (so :math:`w_{ts} = K_{ts}/\sum_{s'} K_{ts'}` with
    :math:`K_{ts} = e^{c\, q_t\cdot k_s}\kappa(t, s)`), ``"sparsemax"``, ``"entmax15"``,
    ``"entmax_bisect"`` (α-entmax with ``alpha``: a float > 1, or a tensor of α > 1 broadcastable
    to the batch shape, e.g. ``(H,)`` for one α per head, that may require a gradient), or any
    callable mapping the score tensor ``(..., rows, T_k)`` to weights of the same shape, acting
    row-wise along the last axis.

    Shapes: ``q (..., T_q, d)``, ``k (..., T_k, d)``, ``v (..., T_k, d_v)`` with broadcastable
    batch dimensions; returns ``(..., T_q, d_v)`` and, with ``return_weights=True``, also the
    weights ``(..., T_q, T_k)``. ``scale`` defaults to :math:`c = 1/\sqrt d`. ``temporal`` is a
    :class:`TemporalKernel` (or a dict of its fields), or a tensor broadcastable to
    ``(..., T_q, T_k)``: boolean (``True`` = attend) or an additive log kernel (``-inf`` masks).
    ``causal=True`` adds the mask :math:`1[s \le t]` to any temporal kernel.

    With ``weights="softmax"`` and no weights requested this is PyTorch's fused
    :func:`~torch.nn.functional.scaled_dot_product_attention`; otherwise (or with
    ``fused=False``) the explicit local mean runs in chunks of query rows under a memory budget,
    so its forward memory grows like ``T`` (not ``T²``) when the weights are not returned.
    Rows whose keys are all masked give NaN (with a ``UserWarning``). ``q``, ``k`` and ``v`` share
    one floating dtype (a ``TypeError`` otherwise, as in PyTorch's SDPA).

    Shapes and dtypes are checked on metadata; the NaN/inf check on the values costs one host
    synchronisation per call (one reduction over ``q``, ``k``, ``v``). ``check_values=False``
    skips it — no synchronisation on a GPU's hot path; NaN/inf inputs then propagate to the
    outputs, as in SDPA.
    """
    check_bool(check_values, "check_values")
    q, k, v, batch = _check_qkv(q, k, v, check_values)
    alpha = _check_alpha(alpha, weights, batch)
    check_bool(causal, "causal")
    check_bool(return_weights, "return_weights")
    if not callable(weights):
        check_choice(weights, "weights", list(WEIGHTS))
    if scale is not None:
        scale = check_positive_float(scale, "scale")
    # the options in _attend's positional order
    return _attend(
        q,
        k,
        v,
        batch,
        causal,
        weights,
        scale,
        temporal,
        return_weights,
        fused,
        alpha=alpha,
    )
