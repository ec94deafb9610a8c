"""The differentiable local average: one autograd node whose backward recomputes the weights
chunk by chunk (memory bounded by the chunk budget at any size), and the full-graph version it
falls back to for second derivatives. The forward engine is passed in by
:func:`localbook.local_sums.local_average` (this module sits below it)."""

from __future__ import annotations

import math

import torch

from .chunks import chunk_rows, iter_chunks
from .kernels import Kernel, _augment_data, _exp_floor, _sq_dist_augmented


class _LocalAverage(torch.autograd.Function):
    r"""The local average as one autograd node whose backward recomputes the weights in chunks.

    Forward: ``mean (m, k)`` and ``log_sum (m,)`` from the no-graph engine (NaN means and
    ``-inf`` for empty rows). With normalized weights :math:`p_{ai} = K(q_a, x_i)/\sum_j K(q_a,
    x_j)` and upstream gradients :math:`G` (of the mean) and :math:`g` (of ``log_sum``):

    .. math:: \partial v_i = \sum_a p_{ai} G_a, \qquad
              \partial \log K(q_a, x_i) = p_{ai}\,\big(G_a\cdot(v_i - \mathrm{mean}_a) + g_a\big),

    and the second is pulled back to ``q``, ``x`` and ``h`` through the chunk's own small graph
    of :math:`\log K`. Memory: a few ``(rows, n)`` chunks under the device's budget. When a
    second derivative is asked for (``create_graph=True``) the backward builds the full graph
    instead, so higher derivatives stay exact.
    """

    @staticmethod
    def forward(ctx, xq, x, values, h, kern, budget, center, engine):
        vals = values if values.shape[1] else None
        mean, log_sum = engine(x, vals, h, kern, budget, center)(xq)
        if mean is None:
            mean = xq.new_zeros(xq.shape[0], 0)
        empty = torch.isneginf(log_sum)
        if bool(empty.any()):
            mean[empty] = math.nan
        ctx.kern, ctx.budget, ctx.center = kern, budget, center
        ctx.save_for_backward(xq, x, values, h, mean, log_sum)
        return mean, log_sum

    @staticmethod
    def backward(ctx, g_mean, g_log):
        xq, x, values, h, mean, log_sum = ctx.saved_tensors
        kern, budget, center = ctx.kern, ctx.budget, ctx.center
        need = ctx.needs_input_grad[:4]
        if (
            torch.is_grad_enabled()
        ):  # create_graph=True: the full, twice-differentiable graph
            with torch.enable_grad():
                vals = values if values.shape[1] else None
                m2, l2 = _graph_average(xq, x, vals, h, kern, center, budget)
                outs = [l2] if m2 is None else [m2, l2]
                grads = [g_log] if m2 is None else [g_mean, g_log]
                pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
                wrt = [t for t, w in zip((xq, x, values, h), need) if w]
                got = iter(
                    torch.autograd.grad(
                        [o for o, _ in pairs],
                        wrt,
                        [g for _, g in pairs],
                        create_graph=True,
                        allow_unused=True,
                    )
                    if pairs
                    else [None] * len(wrt)
                )
            full = [next(got) if w else None for w in need]
            return (*full, None, None, None, None)
        m, n, k = xq.shape[0], x.shape[0], values.shape[1]
        ok = torch.isfinite(log_sum)
        shift = torch.where(ok, log_sum, torch.zeros_like(log_sum))
        g_log = torch.where(ok, g_log, torch.zeros_like(g_log))
        if k:
            g_mean = torch.where(ok[:, None], g_mean, torch.zeros_like(g_mean))
            # G_a · mean_a, the part of G_a · (v_i − mean_a) that does not depend on i
            g_dot = (
                g_mean * torch.where(ok[:, None], mean, torch.zeros_like(mean))
            ).sum(1)
        gq, gx, gv, gh = (
            torch.zeros_like(t) if w else None for t, w in zip((xq, x, values, h), need)
        )
        rows = chunk_rows(m, n, 3, x.element_size(), budget, x.device)
        # centred, scaled coordinates: u²[a, i] = |a_a − b_i|² with a = (q − c)/h, b = (x − c)/h
        a_all = (xq.detach() - center) / h.detach()
        b = (x.detach() - center) / h.detach()
        bb = torch.cat(
            [-2.0 * b, torch.ones_like(b[:, :1]), (b * b).sum(1, keepdim=True)], 1
        )
        ga, gb = torch.zeros_like(a_all), torch.zeros_like(b)
        gh_a = (
            torch.zeros_like(a_all) if need[3] else None
        )  # Σ_i B_ai (a_a − b_i) per row
        for sl in iter_chunks(m, rows):
            a = a_all[sl]
            aa = torch.cat(
                [a, (a * a).sum(1, keepdim=True), torch.ones_like(a[:, :1])], 1
            )
            with torch.enable_grad():
                u2 = (aa @ bb.T).clamp_(min=0.0).requires_grad_()
                lw = kern.log_profile(u2)  # elementwise: its own backward is cheap
            p = torch.exp(
                lw.detach() - shift[sl, None]
            )  # normalized weights, 0 off support
            if gv is not None:
                gv += p.T @ g_mean[sl]
            if not (need[0] or need[1] or need[3]) or not lw.requires_grad:
                continue  # (a flat profile's weights do not move with the points)
            coef = g_log[sl, None].expand_as(p)
            if k:
                coef = torch.addmm(coef - g_dot[sl, None], g_mean[sl], values.T)
            # B = ∂L/∂u², then ∂u²[a, i]/∂a_a = 2(a_a − b_i) = −∂u²[a, i]/∂b_i
            (B,) = torch.autograd.grad(lw, u2, p * coef)
            B = (
                torch.nan_to_num(B, nan=0.0) if kern.compact else B
            )  # 0·∞ off the support
            row = 2.0 * (a * B.sum(1, keepdim=True) - B @ b)  # Σ_i 2 B_ai (a_a − b_i)
            ga[sl] = row
            gb -= 2.0 * (B.T @ a - b * B.sum(0)[:, None])
            if gh_a is not None:
                gh_a[sl] = row
        hd = h.detach()
        if need[0]:
            gq = ga / hd
        if need[1]:
            gx = gb / hd
        if need[3]:  # a = (q − c)/h, b = (x − c)/h: ∂/∂h_d = −(a_d ∂a_d + b_d ∂b_d)/h_d
            gh = -((gh_a * a_all).sum(0) + (gb * b).sum(0)) / hd
        return gq, gx, gv, gh, None, None, None, None


def _graph_average(xq, x, values, h, kern: Kernel, center, budget):
    """The differentiable local average: out-of-place row chunks, shifted by each row's maximum."""
    m, n = xq.shape[0], x.shape[0]
    rows = chunk_rows(m, n, 1, x.element_size(), budget, x.device)
    floor = _exp_floor(x.dtype)
    bb = _augment_data(x, h, center)
    log_sum, means = [], []
    for sl in iter_chunks(m, rows):
        lw = kern.log_profile(_sq_dist_augmented(xq[sl], bb, h, center))
        top = lw.amax(dim=1, keepdim=True).detach()
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        lw = lw - top
        e = torch.exp(lw if kern.compact else lw.clamp(min=floor))
        s = e.sum(dim=1)
        log_sum.append(
            top[:, 0] + torch.log(s)
        )  # an empty row has s = 0, log_sum = -inf
        if values is not None:
            means.append((e @ values) / s[:, None])
    return (torch.cat(means) if values is not None else None), torch.cat(log_sum)
