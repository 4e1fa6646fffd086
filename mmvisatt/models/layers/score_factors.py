"""Carried score factors (ReViT's memory-saving path, ``carry_factors``): the residual scores of plain ViT blocks
as per-block weighted queries and keys instead of one N x N map per block.

A plain ViT scores the same token pairs with the same heads in every block, so the carried scores unroll to a
weighted sum of the blocks' ``q k^T``: a product of concatenated weighted queries and concatenated keys. Every
``run`` blocks one block folds them into a stored map (through the lean score path); blocks without a stored map
attend in row chunks from the factors alone (:class:`ChunkedAttention`, a flash-style backward from the row
log-sum-exp), so no score-sized tensor is made or kept. Values equal the map path's to rounding.
"""
import contextlib
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import lean_scores
from .lean_scores import LeanScoreAttention, ResidualGate
from .residual_attention import ScoreFactors


class ChunkedAttention(torch.autograd.Function):
    """``softmax(q @ k^T) @ v`` in query-row chunks, keeping q, k, v, the output and the row log-sum-exp only.

    The factored residual scores make q and k wider than v, which ``scaled_dot_product_attention``'s CPU flash
    kernel does not take (it falls back to materialising and saving the whole probability map); padding v instead
    multiplies the ``@ v`` work by the same width. This is the flash-attention recurrence at row chunks of
    ``budget`` score elements (None: the device's default, :func:`~.lean_scores.default_chunk_numel`): the backward
    recomputes each chunk's probabilities from the log-sum-exp.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, budget: Optional[int] = None) -> Tensor:
        B, heads, Nq, _ = q.shape
        Nk = k.shape[-2]
        budget = ctx.budget = lean_scores.chunk_numel(budget, q.device)
        acc = torch.promote_types(q.dtype, torch.float32)
        k_t = k.transpose(-2, -1)
        out = torch.empty(B, heads, Nq, v.shape[-1], dtype=v.dtype, device=v.device)
        lse = torch.empty(B, heads, Nq, 1, dtype=acc, device=q.device)
        for a, b in lean_scores.row_chunks(Nq, B * heads * Nk, ctx.budget):
            s = (q[:, :, a:b] @ k_t).to(acc)
            top = s.amax(-1, keepdim=True)
            p = s.sub_(top).exp_()
            total = p.sum(-1, keepdim=True)
            out[:, :, a:b] = (p.to(v.dtype) @ v).div_(total)
            lse[:, :, a:b] = top + total.log()
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        B, heads, Nq, _ = q.shape
        Nk = k.shape[-2]
        acc = lse.dtype
        d_out = d_out.to(v.dtype)
        # softmax backward: dS = P * (dP - rowsum(dP * P)), and rowsum(dP * P) = rowsum(d_out * out)
        delta = (d_out.to(acc) * out.to(acc)).sum(-1, keepdim=True)
        k_t, v_t = k.transpose(-2, -1), v.transpose(-2, -1)
        d_q = torch.empty(q.shape, dtype=acc, device=q.device)
        d_k = torch.zeros(k.shape, dtype=acc, device=k.device)
        d_v = torch.zeros(v.shape, dtype=acc, device=v.device)
        for a, b in lean_scores.row_chunks(Nq, B * heads * Nk, ctx.budget):
            p = (q[:, :, a:b] @ k_t).to(acc).sub_(lse[:, :, a:b]).exp_()
            d_o = d_out[:, :, a:b]
            d_v += p.to(v.dtype).transpose(-2, -1) @ d_o
            d_s = (d_o @ v_t).to(acc).sub_(delta[:, :, a:b]).mul_(p).to(q.dtype)
            d_q[:, :, a:b] = d_s @ k
            d_k += d_s.transpose(-2, -1) @ q[:, :, a:b]
        return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype), None


def factored_attention(attn, q: Tensor, k: Tensor, v: Tensor, residual: ScoreFactors,
                       alpha: Union[Tensor, float]) -> Tuple[Tensor, ScoreFactors]:
    """``softmax(S_l) @ v`` of ``attn`` (a ``PoolingResidualAttention``) with ``S_l`` built from the carried
    factors and this layer's (see the module docstring)."""
    if attn.pool_q is not None or attn.rel_pos_h is not None:
        raise ValueError('Carried score factors need attention without pooling and relative positions (plain '
                         'ViT blocks, as in ReViT); carry the score tensors (PooledScores) for MViTv2 blocks.')
    q_s = q * attn.scale
    queries, keys, base, run = residual
    depth = len(queries)
    keep = 1 - alpha
    # the unrolled moving average: factor j weighs (1 - alpha)^(depth - j) times alpha, except the network's
    # first layer (no base), which had no residual to mix with
    weighted = [pq * (keep ** (depth - j) if j == 0 and base is None else alpha * keep ** (depth - j))
                for j, pq in enumerate(queries)]
    own = q_s if depth == 0 and base is None else alpha * q_s
    q_cat = torch.cat([*weighted, own], dim=-1) if weighted else own
    k_cat = torch.cat([*keys, k], dim=-1) if keys else k
    dtype = q_cat.dtype
    if torch.amp.is_autocast_available(q.device.type) and torch.is_autocast_enabled(q.device.type):
        # alpha (float32) promoted the weighted queries; attend at the precision autocast asks for
        dtype = torch.get_autocast_dtype(q.device.type)
    q_cat, k_cat, v_in = q_cat.to(dtype), k_cat.to(dtype), v.to(dtype)
    fold = run is not None and depth + 1 >= run
    base_keep = None if base is None else keep ** (depth + 1)
    if torch.compiler.is_compiling():
        # the row-chunk loops depend on sizes Inductor cannot lower; it fuses the plain composition itself
        scores = q_cat @ k_cat.transpose(-2, -1)
        if base is not None:
            scores = scores + base_keep * base
        out = scores.softmax(dim=-1) @ v_in
        if fold:
            return out.to(v.dtype), ScoreFactors(base=scores, run=run)
    elif base is not None or fold:
        # A stored map to mix in, or this layer's scores to store: the lean score path, whose alpha is 1
        # (the queries carry their weights) and whose residual weight is the base's.
        gated = None if base is None else ResidualGate.apply(base, base_keep, attn.chunk_numel)
        out, scores = LeanScoreAttention.apply(q_cat, k_cat, v_in, gated, 1.0, base_keep, None, None,
                                               attn.chunk_numel)
        if fold:
            return out.to(v.dtype), ScoreFactors(base=scores, run=run)
    else:
        # devices without autocast (the meta device) have none to turn off
        off = (torch.autocast(q.device.type, enabled=False) if torch.amp.is_autocast_available(q.device.type)
               else contextlib.nullcontext())
        with off:
            out = ChunkedAttention.apply(q_cat, k_cat, v_in, attn.chunk_numel)
    return out.to(v.dtype), ScoreFactors(queries + (q_s, ), keys + (k, ), base, run)
