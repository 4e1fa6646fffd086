"""Pooling attention (MViTv2) with residual scores (ReViT); global ViT attention is its unpooled case.

Queries, keys and values are projected from the block input; with pooling, each is then pooled on its (H, W)
grid by a depthwise convolution shared by the heads and normalised per head (MViTv2's ``conv`` pooling), queries
at the block's stride and keys/values at a coarser one. Every pooled query scores every pooled key; the scores
are mixed with the previous layer's (:mod:`.residual_attention`), decomposed relative positions are added, and
with residual pooling the pooled query is added back to the attention output.
"""
from typing import Callable, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .inplace import add_into
from .residual_attention import (POOLED_ALIGNERS, PooledScores, ScoreFactors, TokenGrid, _on_key_axis, _on_query_axis,
                                 _pool_and_repeat, align_pooled_by_position, mix_scores, regrid_by_position)

Pair = Tuple[int, int]


def relative_position_embeddings(table: Tensor, q_len: int, k_len: int) -> Tensor:
    """Embeddings of every query/key offset along one axis: (L, C) table -> (q_len, k_len, C).

    Offsets are counted on the finer of the two axes (the coarser one's positions are scaled by the size ratio),
    so index ``2 * max(q_len, k_len) - 2`` is the largest. A table built for other sizes (another input
    resolution) is resized linearly to that length first.
    """
    length = 2 * max(q_len, k_len) - 1
    if table.shape[0] != length:
        table = F.interpolate(table.t().unsqueeze(0), size=length, mode='linear').squeeze(0).t()
    q_ratio = max(k_len / q_len, 1.0)
    k_ratio = max(q_len / k_len, 1.0)
    offsets = (torch.arange(q_len, device=table.device)[:, None] * q_ratio -
               torch.arange(k_len, device=table.device)[None, :] * k_ratio)
    offsets += (k_len - 1) * k_ratio
    return table[offsets.long()]


def decomposed_rel_pos_terms(q: Tensor, q_size: Pair, kv_size: Pair, rel_pos_h: Tensor,
                             rel_pos_w: Tensor) -> Tuple[Tensor, Tensor]:
    """``q . R_h(dy)`` (B, heads, qh, qw, kh) and ``q . R_w(dx)`` (B, heads, qh, qw, kw), from the unscaled query."""
    B, heads, _, dim = q.shape
    (qh, qw), (kh, kw) = q_size, kv_size
    r_q = q.reshape(B, heads, qh, qw, dim)
    rel_h = torch.einsum('bnhwc,hkc->bnhwk', r_q, relative_position_embeddings(rel_pos_h, qh, kh))
    rel_w = torch.einsum('bnhwc,wkc->bnhwk', r_q, relative_position_embeddings(rel_pos_w, qw, kw))
    return rel_h, rel_w


def add_decomposed_rel_pos(scores: Tensor, q: Tensor, q_size: Pair, kv_size: Pair, rel_pos_h: Tensor,
                           rel_pos_w: Tensor) -> Tensor:
    """``scores + q . R_h(dy) + q . R_w(dx)`` (MViTv2's decomposed relative positions, with the unscaled query).

    scores: (B, heads, qh * qw, kh * kw); q: (B, heads, qh * qw, head_dim).
    """
    B = q.shape[0]
    (qh, qw), (kh, kw) = q_size, kv_size
    rel_h, rel_w = decomposed_rel_pos_terms(q, q_size, kv_size, rel_pos_h, rel_pos_w)
    scores = (scores.reshape(B, -1, qh, qw, kh, kw) + rel_h[..., :, None]).add_(rel_w[..., None, :])
    return scores.reshape(B, -1, qh * qw, kh * kw)


def _row_chunks(rows: int, row_numel: int, budget: int = 1 << 22):
    """Query-row ranges of at most ``budget`` score elements each (16 MiB in float32)."""
    step = max(1, budget // max(row_numel, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _chunked_dot(a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    """``(a * b).sum()`` of two (B, heads, N, M) tensors without materialising the score-sized product."""
    total = a.new_zeros((), dtype=dtype)
    for start, end in _row_chunks(a.shape[-2], a.shape[:-2].numel() * a.shape[-1]):
        total = total + torch.sum(a[..., start:end, :] * b[..., start:end, :], dtype=dtype)
    return total


class _ResidualGate(torch.autograd.Function):
    """Identity on the previous scores whose backward applies the residual's weight ``keep`` in the mix.

    Only used with :class:`_LeanScoreAttention`, which reports the gradient of the *unscaled* aligned residual
    (``keep`` is ``1 - alpha``, or a power of it for a stored map several layers back). The alignment between the
    two is linear, so the gradient arriving here is ``L^T(dR)`` and keep's share of the residual term,
    ``<dR, L(prev)>``, equals ``<L^T(dR), prev>``: ``prev`` is kept alive anyway (by the previous block, or as this
    block's checkpoint input), so no score-sized aligned copy has to be saved for alpha.
    """

    @staticmethod
    def forward(ctx, prev: Tensor, keep: Union[Tensor, float]) -> Tensor:
        # a tensor keep goes through save_for_backward: kept on ctx, a non-leaf one would pin its graph
        ctx.keep = None if torch.is_tensor(keep) else keep
        ctx.save_for_backward(prev, keep if torch.is_tensor(keep) else None)
        return prev.view_as(prev)

    @staticmethod
    def backward(ctx, grad: Tensor):
        prev, keep = ctx.saved_tensors
        if keep is None:
            return grad * ctx.keep, None
        d_prev = grad * keep if ctx.needs_input_grad[0] else None
        d_keep = None
        if ctx.needs_input_grad[1]:
            d_keep = _chunked_dot(grad, prev, keep.dtype).reshape(keep.shape)
        return d_prev, d_keep


class _LeanScoreAttention(torch.autograd.Function):
    """``softmax(R) @ v`` with ``R = alpha * (q_s k^T) + keep * A + rel_h + rel_w``; returns the output and R.

    Plain autograd keeps three score-sized tensors per layer for the backward (``q_s k^T`` and ``A`` for alpha's
    gradient, the softmax output) on top of the carried ``R``. Here only ``R`` is kept (it is carried to the next
    layer anyway): the backward recomputes the softmax from it row chunk by row chunk, and takes alpha's share of
    ``q_s k^T`` as ``<dR @ k, q_s>``. The largest layer's backward then holds ``R``, the incoming gradient of
    ``R`` and the aligned residual's gradient, where plain autograd adds the three saved tensors and two more
    gradients. Forward values are those of :func:`mix_scores` and :func:`add_decomposed_rel_pos`, op for op.

    ``keep`` is ``1 - alpha`` for ReViT's mix. ``aligned`` must come from ``_ResidualGate``-wrapped scores (with the
    same ``keep``): its gradient is reported unscaled, and keep's gradient is taken there.
    """

    @staticmethod
    def forward(ctx, q_s: Tensor, k: Tensor, v: Tensor, aligned: Optional[Tensor], alpha: Union[Tensor, float],
                keep: Union[Tensor, float], rel_h: Optional[Tensor], rel_w: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        B, heads, Nq, _ = q_s.shape
        Nk = k.shape[-2]
        scores = q_s @ k.transpose(-2, -1)
        ctx.s_dtype = scores.dtype
        if aligned is not None:
            if not (isinstance(alpha, float) and alpha == 1.0):  # 1.0: the queries carry their weights already
                scores = scores.mul_(alpha) if torch.result_type(scores, alpha) == scores.dtype else alpha * scores
            # chunked so the scaled residual is never a second score-sized temporary
            for a, b in _row_chunks(Nq, B * heads * Nk):
                scores[:, :, a:b].add_(keep * aligned[:, :, a:b])
        if rel_h is not None:
            qh, qw, kh, kw = rel_h.shape[2], rel_h.shape[3], rel_h.shape[4], rel_w.shape[4]
            grid = add_into(scores.view(B, heads, qh, qw, kh, kw), rel_h[..., :, None])
            scores = grid.add_(rel_w[..., None, :]).view(B, heads, Nq, Nk)
            ctx.rel_qh, ctx.rel_kw = qh, kw
        out = None
        for a, b in _row_chunks(Nq, B * heads * Nk):
            probs = scores[:, :, a:b].softmax(dim=-1)
            part = probs @ v
            if out is None:
                ctx.p_dtype, ctx.o_dtype = probs.dtype, part.dtype
                out = part.new_empty(B, heads, Nq, part.shape[-1])
            out[:, :, a:b] = part
        ctx.alpha = None if torch.is_tensor(alpha) else alpha
        ctx.mixed = aligned is not None
        ctx.aligned_meta = None if aligned is None else (aligned.shape, aligned.dtype)
        ctx.rel_meta = None if rel_h is None else (rel_h.dtype, rel_w.dtype)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q_s, k, v, scores, alpha if torch.is_tensor(alpha) else None)
        return out, scores

    @staticmethod
    def backward(ctx, d_out: Optional[Tensor], d_scores_in: Optional[Tensor]):
        q_s, k, v, scores, alpha_t = ctx.saved_tensors
        B, heads, Nq, Nk = scores.shape
        s_dtype, p_dtype, o_dtype = ctx.s_dtype, ctx.p_dtype, ctx.o_dtype
        k_mm, q_mm, v_mm = k.to(s_dtype), q_s.to(s_dtype), v.to(o_dtype)
        # fp32 accumulators: the chunks are summed here, where autograd sums inside one matmul
        acc = torch.promote_types(s_dtype, torch.float32)
        d_v = torch.zeros(v.shape, dtype=torch.promote_types(o_dtype, torch.float32), device=v.device)
        d_k = torch.zeros(k.shape, dtype=acc, device=k.device)
        g = torch.empty(q_s.shape, dtype=acc, device=q_s.device)
        d_aligned = None
        if ctx.mixed and ctx.needs_input_grad[3]:
            shape, dtype = ctx.aligned_meta
            d_aligned = torch.empty(shape, dtype=dtype, device=scores.device)
        rel = ctx.rel_meta is not None
        if rel:
            kw = ctx.rel_kw
            d_rel_h = scores.new_empty(B, heads, Nq, Nk // kw, dtype=acc)
            d_rel_w = scores.new_empty(B, heads, Nq, kw, dtype=acc)
        for a, b in _row_chunks(Nq, B * heads * Nk):
            probs = scores[:, :, a:b].softmax(dim=-1, dtype=p_dtype)
            if d_out is not None:
                d_out_c = d_out[:, :, a:b].to(o_dtype)
                d_v += probs.to(o_dtype).transpose(-2, -1) @ d_out_c
                d_probs = (d_out_c @ v_mm.transpose(-2, -1)).to(p_dtype)
                # softmax backward, in place in the chunk's own buffer
                dot = (d_probs * probs).sum(-1, keepdim=True)
                d_r = d_probs.sub_(dot).mul_(probs).to(scores.dtype)
            else:
                d_r = scores.new_zeros(B, heads, b - a, Nk)
            del probs
            if d_scores_in is not None:
                d_r = add_into(d_r, d_scores_in[:, :, a:b])
            if rel:
                grid = d_r.reshape(B, heads, b - a, Nk // kw, kw)
                d_rel_h[:, :, a:b] = grid.sum(-1, dtype=acc)
                d_rel_w[:, :, a:b] = grid.sum(-2, dtype=acc)
            d_s = d_r.to(s_dtype)
            g[:, :, a:b] = d_s @ k_mm
            d_k += d_s.transpose(-2, -1) @ q_mm[:, :, a:b]
            if d_aligned is not None:
                d_aligned[:, :, a:b] = d_r if d_aligned.shape[1] == heads else d_r.sum(1, keepdim=True)
        alpha = ctx.alpha if alpha_t is None else alpha_t
        d_alpha = None
        if ctx.mixed and alpha_t is not None and ctx.needs_input_grad[4]:
            # alpha's share of alpha * (q_s k^T): <dR, q_s k^T> = <dR @ k, q_s>
            d_alpha = torch.sum(g * q_s, dtype=alpha_t.dtype).reshape(alpha_t.shape)
        if ctx.mixed:
            g = g * alpha
            d_k = d_k * alpha
        d_rel = (None, None)
        if rel:
            qh = ctx.rel_qh
            h_dtype, w_dtype = ctx.rel_meta
            d_rel = (d_rel_h.reshape(B, heads, qh, -1, Nk // kw).to(h_dtype),
                     d_rel_w.reshape(B, heads, qh, -1, kw).to(w_dtype))
        return g.to(q_s.dtype), d_k.to(k.dtype), d_v.to(v.dtype), d_aligned, d_alpha, None, *d_rel


class _ChunkedAttention(torch.autograd.Function):
    """``softmax(q @ k^T) @ v`` in query-row chunks, keeping q, k, v, the output and the row log-sum-exp only.

    The factored residual scores make q and k wider than v, which ``scaled_dot_product_attention``'s CPU flash
    kernel does not take (it falls back to materialising and saving the whole probability map); padding v instead
    multiplies the ``@ v`` work by the same width. This is the flash-attention recurrence at 16 MiB row chunks:
    the backward recomputes each chunk's probabilities from the log-sum-exp.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        B, heads, Nq, _ = q.shape
        Nk = k.shape[-2]
        acc = torch.promote_types(q.dtype, torch.float32)
        k_t = k.transpose(-2, -1)
        out = torch.empty(B, heads, Nq, v.shape[-1], dtype=v.dtype, device=v.device)
        lse = torch.empty(B, heads, Nq, 1, dtype=acc, device=q.device)
        for a, b in _row_chunks(Nq, B * heads * Nk):
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
        for a, b in _row_chunks(Nq, B * heads * Nk):
            p = (q[:, :, a:b] @ k_t).to(acc).sub_(lse[:, :, a:b]).exp_()
            d_o = d_out[:, :, a:b]
            d_v += p.to(v.dtype).transpose(-2, -1) @ d_o
            d_s = (d_o @ v_t).to(acc).sub_(delta[:, :, a:b]).mul_(p).to(q.dtype)
            d_q[:, :, a:b] = d_s @ k
            d_k += d_s.transpose(-2, -1) @ q[:, :, a:b]
        return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype)


class ScoreHandoff(NamedTuple):
    """The part of the next block's alignment (:func:`align_pooled_by_position`) that shrinks the carried map:
    the head mean (``mean_heads``), then average pooling of the query grid by ``q_pool`` and of the key grid by
    ``kv_pool``. Done by the block that makes the map, it never has to hold the map whole. ``q_grid`` and
    ``kv_grid`` are the grids of the map handed on; what is left to the next block (repeating keys onto a finer
    grid) only enlarges."""
    mean_heads: bool
    q_size: Pair
    q_pool: Pair
    kv_size: Pair
    kv_pool: Pair
    q_grid: TokenGrid
    kv_grid: TokenGrid

    def reduce(self, scores: Tensor, grid_rows: int) -> Tensor:
        """(B, heads, grid_rows * q_width, Nk) scores of whole query-grid rows -> the rows they hand on."""
        if self.mean_heads:
            scores = scores.mean(dim=1, keepdim=True)
        if self.q_pool != (1, 1):
            scores = _on_query_axis(scores, (grid_rows, self.q_size[1]), self._pool(self.q_pool))
        if self.kv_pool != (1, 1):
            scores = _on_key_axis(scores, self.kv_size, self._pool(self.kv_pool))
        return scores

    @staticmethod
    def _pool(kernel: Pair) -> Callable[[Tensor], Tensor]:
        # regrid_by_position's pooling: a partial window at the bottom / right border averages the tokens it has
        return lambda x: F.avg_pool2d(x, kernel, kernel, ceil_mode=True)


def _pooled_grid(grid: TokenGrid, pool: Pair) -> TokenGrid:
    return TokenGrid(-(-grid.height // pool[0]), -(-grid.width // pool[1]), grid.stride_h * pool[0],
                     grid.stride_w * pool[1])


def plan_handoff(q_grid: TokenGrid, kv_grid: TokenGrid, num_heads: int,
                 next_block: Tuple[Pair, Pair, int]) -> Optional[ScoreHandoff]:
    """What this block's scores can shed before the next block (its query stride, key/value stride and heads)
    aligns them; None when nothing (the map is handed on as it is) or when the next query grid is not a pooling of
    this one."""
    stride_q, stride_kv, next_heads = next_block
    next_q, next_kv = _pooled_grid(q_grid, stride_q), _pooled_grid(q_grid, stride_kv)
    try:
        q_axes = [_pool_and_repeat(a, b) for a, b in zip((q_grid.stride_h, q_grid.stride_w),
                                                         (next_q.stride_h, next_q.stride_w))]
        kv_axes = [_pool_and_repeat(a, b) for a, b in zip((kv_grid.stride_h, kv_grid.stride_w),
                                                          (next_kv.stride_h, next_kv.stride_w))]
    except ValueError:
        return None
    if any(repeat > 1 for _, repeat in q_axes):
        return None
    q_pool, kv_pool = (q_axes[0][0], q_axes[1][0]), (kv_axes[0][0], kv_axes[1][0])
    out_q = _pooled_grid(q_grid, q_pool)
    mean_heads = num_heads not in (1, next_heads)
    if out_q.size != next_q.size or (not mean_heads and q_pool == (1, 1) and kv_pool == (1, 1)):
        return None
    return ScoreHandoff(mean_heads, q_grid.size, q_pool, kv_grid.size, kv_pool, out_q, _pooled_grid(kv_grid, kv_pool))


def _handoff_row_chunks(handoff: ScoreHandoff, row_numel: int) -> List[Tuple[int, int, int]]:
    """Token-row ranges of whole query-pooling windows (grid rows in multiples of ``q_pool[0]``), within the
    :func:`_row_chunks` budget; each with the first handed-on row it makes."""
    (qh, qw), ph = handoff.q_size, handoff.q_pool[0]
    out_w = handoff.q_grid.width
    units = -(-qh // ph)
    chunks = []
    for u0, u1 in _row_chunks(units, row_numel * qw * ph):
        r0, r1 = u0 * ph, min(u1 * ph, qh)
        chunks.append((r0 * qw, r1 * qw, u0 * out_w))
    return chunks


def _handoff_chunk(q_s: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float],
                   keep: Union[Tensor, float], rel_h: Optional[Tensor], rel_w: Optional[Tensor],
                   expand: Optional[Callable[[Tensor], Tensor]], handoff: ScoreHandoff,
                   grid_rows: int) -> Tuple[Tensor, Tensor]:
    """One chunk of query rows: the mixed scores (the ops of the lean path, in its order), ``softmax @ v`` and the
    rows handed on. ``prev`` holds the chunk's rows of the residual on this block's query grid; ``expand`` puts
    its keys onto this block's key grid."""
    scores = q_s @ k.transpose(-2, -1)
    if prev is not None:
        if not (isinstance(alpha, float) and alpha == 1.0):
            scores = alpha * scores
        scores = scores + keep * (prev if expand is None else expand(prev))
    if rel_h is not None:
        B, heads, rows, Nk = scores.shape
        kh, kw = rel_h.shape[-1], rel_w.shape[-1]
        grid = scores.view(B, heads, rows, kh, kw) + rel_h[..., :, None]
        scores = (grid + rel_w[..., None, :]).view(B, heads, rows, Nk)
    out = scores.softmax(dim=-1) @ v
    return out, handoff.reduce(scores, grid_rows)


class _HandoffScoreAttention(torch.autograd.Function):
    """:class:`_LeanScoreAttention` for a block whose scores shrink before the next block uses them
    (:class:`ScoreHandoff`): returns the attention output and the handed-on map, made row chunk by row chunk, so
    the block's own map never exists whole. Nothing score-sized is saved: the backward recomputes each chunk
    (one more ``q k^T`` than the lean path) and differentiates it with autograd, like a checkpoint per chunk.

    Autocast is recorded in the forward and restored for the recomputation, as ``torch.utils.checkpoint`` does.
    """

    @staticmethod
    def forward(ctx, handoff: ScoreHandoff, expand: Optional[Callable[[Tensor], Tensor]], q_s: Tensor, k: Tensor,
                v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float], keep: Union[Tensor, float],
                rel_h: Optional[Tensor], rel_w: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        B, heads, Nq, _ = q_s.shape
        qw = handoff.q_size[1]
        ctx.device_type = q_s.device.type
        ctx.autocast = torch.is_autocast_enabled(ctx.device_type)
        ctx.autocast_dtype = torch.get_autocast_dtype(ctx.device_type)
        rel_h, rel_w = _flat_rows(rel_h), _flat_rows(rel_w)
        chunks = _handoff_row_chunks(handoff, B * heads * k.shape[-2])
        out = handed = None
        for a, b, c in chunks:
            part, rows = _handoff_chunk(q_s[:, :, a:b], k, v, _rows(prev, a, b), alpha, keep, _rows(rel_h, a, b),
                                        _rows(rel_w, a, b), expand, handoff, (b - a) // qw)
            if out is None:
                out = part.new_empty(B, heads, Nq, part.shape[-1])
                handed = rows.new_empty(B, rows.shape[1], handoff.q_grid.num_tokens, rows.shape[-1])
            out[:, :, a:b] = part
            handed[:, :, c:c + rows.shape[2]] = rows
        ctx.handoff, ctx.expand, ctx.chunks = handoff, expand, chunks
        ctx.floats = tuple(None if torch.is_tensor(t) else t for t in (alpha, keep))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q_s, k, v, prev, *(t if torch.is_tensor(t) else None for t in (alpha, keep)),
                              rel_h, rel_w)
        return out, handed

    @staticmethod
    def backward(ctx, d_out: Optional[Tensor], d_handed: Optional[Tensor]):
        q_s, k, v, prev, alpha_t, keep_t, rel_h, rel_w = ctx.saved_tensors
        handoff, qw = ctx.handoff, ctx.handoff.q_size[1]
        wants = ctx.needs_input_grad
        leaf = lambda t, i: None if t is None else t.detach().requires_grad_(wants[i])  # noqa: E731
        k_l, v_l, alpha_l, keep_l = leaf(k, 3), leaf(v, 4), leaf(alpha_t, 6), leaf(keep_t, 7)
        alpha = ctx.floats[0] if alpha_l is None else alpha_l
        keep = ctx.floats[1] if keep_l is None else keep_l
        sliced = dict(q_s=q_s, prev=prev, rel_h=rel_h, rel_w=rel_w)  # inputs whose rows the chunks split
        grads = dict.fromkeys(sliced)
        shared = dict.fromkeys(('k', 'v', 'alpha', 'keep'))
        for a, b, c in ctx.chunks:
            with torch.enable_grad(), torch.autocast(ctx.device_type, dtype=ctx.autocast_dtype,
                                                     enabled=ctx.autocast):
                inputs = dict(q_s=leaf(q_s[:, :, a:b], 2), prev=leaf(_rows(prev, a, b), 5),
                              rel_h=leaf(_rows(rel_h, a, b), 8), rel_w=leaf(_rows(rel_w, a, b), 9))
                part, rows = _handoff_chunk(inputs['q_s'], k_l, v_l, inputs['prev'], alpha, keep, inputs['rel_h'],
                                            inputs['rel_w'], ctx.expand, handoff, (b - a) // qw)
            outputs, seeds = [], []
            if d_out is not None:
                outputs.append(part)
                seeds.append(d_out[:, :, a:b])
            if d_handed is not None:
                outputs.append(rows)
                seeds.append(d_handed[:, :, c:c + rows.shape[2]])
            targets = {n: t for n, t in {**inputs, 'k': k_l, 'v': v_l, 'alpha': alpha_l, 'keep': keep_l}.items()
                       if t is not None and t.requires_grad}
            if not outputs or not targets:
                continue
            found = torch.autograd.grad(outputs, list(targets.values()), seeds, allow_unused=True)
            for name, grad in zip(targets, found):
                if grad is None:
                    continue
                if name in shared:
                    shared[name] = grad if shared[name] is None else shared[name] + grad
                else:
                    if grads[name] is None:
                        grads[name] = sliced[name].new_zeros(sliced[name].shape)
                    grads[name][:, :, a:b] = grad
        d_rel_h, d_rel_w = (None if g is None else g.view(src.shape[:2] + (-1, qw, src.shape[-1]))
                            for g, src in ((grads['rel_h'], rel_h), (grads['rel_w'], rel_w)))
        return (None, None, grads['q_s'], shared['k'], shared['v'], grads['prev'], shared['alpha'], shared['keep'],
                d_rel_h, d_rel_w)


def _key_regrid(src: TokenGrid, dst: TokenGrid) -> Callable[[Tensor], Tensor]:
    """Rows of scores on key grid ``src`` -> the same rows on key grid ``dst`` (the aligner's key step)."""
    return lambda rows: _on_key_axis(rows, src.size, lambda m: regrid_by_position(m, src, dst))


def _flat_rows(t: Optional[Tensor]) -> Optional[Tensor]:
    """(B, heads, qh, qw, n) relative-position terms -> (B, heads, qh * qw, n): one row per query."""
    return None if t is None else t.flatten(2, 3)


def _rows(t: Optional[Tensor], a: int, b: int) -> Optional[Tensor]:
    # a residual with one head broadcasts over the heads; its rows are sliced all the same
    return None if t is None else t[:, :, a:b]


class PoolingResidualAttention(nn.Module):
    """Multi-head attention over pooled queries and keys/values whose scores are mixed with the previous layer's.

    Args:
        dim: input channels. dim_out: output channels (MViTv2 changes the width inside attention).
        num_heads: heads; the head width is ``dim_out // num_heads``.
        pool_kernel: kernel of the depthwise pooling convolutions, or None for no pooling (plain ViT).
        stride_q, stride_kv: pooling strides of queries and of keys/values.
        rel_pos_size: length of the decomposed relative-position tables (``2 * max(q, kv map side) - 1`` at the
            build resolution), or None for none.
        residual_pooling: add the pooled query to the attention output (MViTv2).
        residual_mode: how the previous layer's scores are brought onto this layer's grids, see
            :data:`~mmvisatt.models.layers.residual_attention.POOLED_ALIGNERS`.
        lean_scores: the score pipeline (mix, relative positions, softmax @ v) as one autograd function,
            :class:`_LeanScoreAttention` (default): it mixes in place, applies the softmax in row chunks and keeps
            only the carried scores for the backward, which recomputes the softmax from them: one score-sized
            tensor per layer instead of up to four, and fewer score-sized passes and allocations also in
            inference. False runs the plain autograd composition of the same ops, the reference the lean path
            is tested against, and what ``torch.compile`` traces. Forward values are bit-identical; gradients
            equal up to summation order.

    Without pooling and relative positions (plain ViT) the carried scores can instead be
    :class:`~mmvisatt.models.layers.residual_attention.ScoreFactors`: pass them as ``residual`` (empty ones in
    the first layer) and the layer scores with concatenated weighted queries and keys plus the stored map, if
    any, and returns the factors extended by its own, or folds everything into a new stored map at the end of a
    run. Without a stored map no score-sized tensor is made or kept (:class:`_ChunkedAttention`); the query/key
    width grows by ``head_dim`` per layer of the run. The values are the score path's up to rounding. With
    carried score tensors there is no fused path: they are materialised anyway.

    ``next_block`` (the next block's query stride, key/value stride and heads; set by the backbone) lets a call
    with ``handoff=True`` hand on its scores already reduced to what the next block's alignment keeps
    (:class:`ScoreHandoff`, :class:`_HandoffScoreAttention`): neither its own map nor its gradient is then ever
    whole, at the price of recomputing ``q k^T`` in the backward. Only for ``residual_mode='aligned'``; the
    values are those of the map path up to rounding.
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, qkv_bias: bool = True,
                 pool_kernel: Optional[Pair] = None, stride_q: Pair = (1, 1), stride_kv: Pair = (1, 1),
                 rel_pos_size: Optional[int] = None, residual_pooling: bool = False,
                 residual_mode: str = 'aligned', norm_eps: float = 1e-6, lean_scores: bool = True):
        super().__init__()
        if residual_mode not in POOLED_ALIGNERS:
            raise ValueError(f"residual_mode must be one of {sorted(POOLED_ALIGNERS)}, got '{residual_mode}'")
        self.num_heads = num_heads
        self.dim_out = dim_out
        head_dim = dim_out // num_heads
        self.scale = head_dim ** -0.5
        self.stride_q = tuple(stride_q)
        self.stride_kv = tuple(stride_kv)
        self.residual_pooling = residual_pooling
        self.lean_scores = lean_scores
        self.align = POOLED_ALIGNERS[residual_mode]
        self.next_block: Optional[Tuple[Pair, Pair, int]] = None
        self.qkv = nn.Linear(dim, dim_out * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim_out, dim_out)
        pooled = pool_kernel is not None
        for name, stride in (('q', self.stride_q), ('k', self.stride_kv), ('v', self.stride_kv)):
            # depthwise over head_dim channels, shared by the heads (MViTv2's 'conv' mode)
            pool = nn.Conv2d(head_dim, head_dim, pool_kernel, stride, padding=[k // 2 for k in pool_kernel],
                             groups=head_dim, bias=False) if pooled else None
            setattr(self, f'pool_{name}', pool)
            setattr(self, f'norm_{name}', nn.LayerNorm(head_dim, eps=norm_eps) if pooled else None)
        if rel_pos_size is not None:
            self.rel_pos_h = nn.Parameter(torch.zeros(rel_pos_size, head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(rel_pos_size, head_dim))
        else:
            self.rel_pos_h = self.rel_pos_w = None

    @staticmethod
    def _pool(x: Tensor, size: Pair, pool: Optional[nn.Module], norm: Optional[nn.Module]) -> Tuple[Tensor, Pair]:
        """(B, heads, H * W, head_dim) -> (B, heads, H' * W', head_dim) and (H', W')."""
        if pool is None:
            return x, size
        B, heads, _, dim = x.shape
        x = pool(x.reshape(B * heads, *size, dim).permute(0, 3, 1, 2))
        size = tuple(x.shape[-2:])
        x = x.reshape(B, heads, dim, -1).transpose(2, 3)
        return norm(x), size

    def forward(self, x: Tensor, residual: Union[PooledScores, ScoreFactors, None], alpha: Union[Tensor, float],
                handoff: bool = False) -> Tuple[Tensor, Union[PooledScores, ScoreFactors]]:
        """x: (B, H, W, dim) -> (B, H_q, W_q, dim_out), plus the mixed scores (with relative positions) to carry.

        ``residual`` holds the previous layer's scores and grids; None in the first layer. Score factors instead
        (see the class) select the factored path, which returns the factors to carry. ``handoff``: see the class.
        """
        B, H, W, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        if isinstance(residual, ScoreFactors):
            x, factors = self._factored_scores(q, k, v, residual, alpha)
            if self.residual_pooling:
                x = x + q
            return self.proj(x.transpose(1, 2).reshape(B, H, W, self.dim_out)), factors
        q, q_size = self._pool(q, (H, W), self.pool_q, self.norm_q)
        k, kv_size = self._pool(k, (H, W), self.pool_k, self.norm_k)
        v, _ = self._pool(v, (H, W), self.pool_v, self.norm_v)
        # this block's input is the previous block's query grid; strides accumulate from there
        if residual is None:
            in_h, in_w = 1, 1
        else:
            made_on = residual.made_on or residual.q_grid
            in_h, in_w = made_on.stride_h, made_on.stride_w
        q_grid = TokenGrid(*q_size, in_h * self.stride_q[0], in_w * self.stride_q[1])
        kv_grid = TokenGrid(*kv_size, in_h * self.stride_kv[0], in_w * self.stride_kv[1])

        # Compiled graphs take the plain composition (Inductor fuses it itself): the lean function's row-chunk
        # loops depend on the sizes, which Inductor's symbolic shapes cannot lower.
        plan = None
        if handoff and self.next_block is not None and self.align is align_pooled_by_position:
            plan = plan_handoff(q_grid, kv_grid, self.num_heads, self.next_block)
        carried = None
        if plan is not None and not torch.compiler.is_compiling():
            x, scores = self._handoff_scores(q, k, v, residual, alpha, q_grid, kv_grid, q_size, kv_size, plan)
            carried = PooledScores(scores, plan.q_grid, plan.kv_grid, q_grid)
        elif self.lean_scores and not torch.compiler.is_compiling():
            x, scores = self._lean_scores(q, k, v, residual, alpha, q_grid, kv_grid, q_size, kv_size)
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)
            if residual is not None:
                scores = mix_scores(scores, self.align(residual, q_grid, kv_grid, self.num_heads), None, alpha, 1)
            if self.rel_pos_h is not None:
                # After the mix, and kept in what is carried on: the official code adds them in place into the
                # tensor it stores, and the aligned mode keeps that so released weights keep their meaning.
                scores = add_decomposed_rel_pos(scores, q, q_size, kv_size, self.rel_pos_h, self.rel_pos_w)
            x = scores.softmax(dim=-1) @ v
        if self.residual_pooling:
            x = x + q
        x = x.transpose(1, 2).reshape(B, *q_size, self.dim_out)
        return self.proj(x), carried or PooledScores(scores, q_grid, kv_grid)

    def _lean_scores(self, q: Tensor, k: Tensor, v: Tensor, residual: Optional[PooledScores],
                     alpha: Union[Tensor, float], q_grid: TokenGrid, kv_grid: TokenGrid, q_size: Pair,
                     kv_size: Pair) -> Tuple[Tensor, Tensor]:
        """The forward above through :class:`_LeanScoreAttention`: the same values, one score-sized tensor."""
        aligned = None
        keep = 1 - alpha
        if residual is not None:
            gated = residual._replace(scores=_ResidualGate.apply(residual.scores, keep))
            aligned = self.align(gated, q_grid, kv_grid, self.num_heads)
        rel_h = rel_w = None
        if self.rel_pos_h is not None:
            rel_h, rel_w = decomposed_rel_pos_terms(q, q_size, kv_size, self.rel_pos_h, self.rel_pos_w)
        return _LeanScoreAttention.apply(q * self.scale, k, v, aligned, alpha, keep, rel_h, rel_w)

    def _handoff_scores(self, q: Tensor, k: Tensor, v: Tensor, residual: Optional[PooledScores],
                        alpha: Union[Tensor, float], q_grid: TokenGrid, kv_grid: TokenGrid, q_size: Pair,
                        kv_size: Pair, plan: ScoreHandoff) -> Tuple[Tensor, Tensor]:
        """The lean path's values through :class:`_HandoffScoreAttention`; returns the output and the handed-on map."""
        prev = expand = None
        if residual is not None:
            if residual.q_grid == q_grid and residual.scores.shape[1] in (1, self.num_heads):
                # handed on by the previous block: only its keys may still need repeating onto this key grid,
                # which each row chunk does for itself
                prev = residual.scores
                if residual.kv_grid != kv_grid:
                    expand = _key_regrid(residual.kv_grid, kv_grid)
            else:
                prev = self.align(residual, q_grid, kv_grid, self.num_heads)
        rel_h = rel_w = None
        if self.rel_pos_h is not None:
            rel_h, rel_w = decomposed_rel_pos_terms(q, q_size, kv_size, self.rel_pos_h, self.rel_pos_w)
        return _HandoffScoreAttention.apply(plan, expand, q * self.scale, k, v, prev, alpha, 1 - alpha, rel_h, rel_w)

    def _factored_scores(self, q: Tensor, k: Tensor, v: Tensor, residual: ScoreFactors,
                         alpha: Union[Tensor, float]) -> Tuple[Tensor, ScoreFactors]:
        """``softmax(S_l) @ v`` with ``S_l`` built from the carried factors and this layer's (see ScoreFactors)."""
        if self.pool_q is not None or self.rel_pos_h is not None:
            raise ValueError('Carried score factors need attention without pooling and relative positions (plain '
                             'ViT blocks, as in ReViT); carry the score tensors (PooledScores) for MViTv2 blocks.')
        q_s = q * self.scale
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
        if torch.is_autocast_enabled(q.device.type):
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
            gated = None if base is None else _ResidualGate.apply(base, base_keep)
            out, scores = _LeanScoreAttention.apply(q_cat, k_cat, v_in, gated, 1.0, base_keep, None, None)
            if fold:
                return out.to(v.dtype), ScoreFactors(base=scores, run=run)
        else:
            with torch.autocast(q.device.type, enabled=False):
                out = _ChunkedAttention.apply(q_cat, k_cat, v_in)
        return out.to(v.dtype), ScoreFactors(queries + (q_s, ), keys + (k, ), base, run)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints trained at another resolution carry relative-position tables of another length.
        for name in ('rel_pos_h', 'rel_pos_w'):
            own, table = getattr(self, name), state_dict.get(prefix + name)
            if own is not None and table is not None and table.dim() == 2 and table.shape[0] != own.shape[0]:
                resized = F.interpolate(table.t().unsqueeze(0).float(), size=own.shape[0], mode='linear')
                state_dict[prefix + name] = resized.squeeze(0).t().to(table.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
